"""One measurement for the rows, the build's statistics and the audit (``tokens.measure``): each view rendered and
encoded once, cut per turn, and every row still the row transformers' own ``apply_chat_template`` gives, on messy
held-out-style conversations (real ShareGPT and chit-chat dumps, template tokens inside turns, tool calls and
results), whatever the template (one that renders earlier turns differently once a later user turn follows) or
the tokenizer (one where cutting a render is not known to be exact); and a build measures each row once, where
it is read."""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

from corpus_builder.assemble import build_corpus
from corpus_builder.audit import audit_corpus
from corpus_builder.errors import CorpusError
from corpus_builder.recipe import load_recipe
from corpus_builder.records import THINK_CLOSE, THINK_OPEN, Conversation
from corpus_builder.sources import iter_file, parallel
from corpus_builder.tokens import TemplateRenderer, TokenRows, TurnTokens
from tests.support.chats import synthetic_chats
from tests.support.hf_template import mask_start, through_end_of_turn
from tests.support.real_data import write_chitchat, write_sharegpt
from tests.support.tool_chats import glaive_rows, log_rows


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def read(path: Path, rows: Sequence[dict[str, Any]] | None = None) -> list[Conversation]:
    if rows is not None:
        path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return [row for row in iter_file(path) if isinstance(row, Conversation)]


@pytest.fixture(scope="module")
def messy(tmp_path_factory: pytest.TempPathFactory) -> list[Conversation]:
    """Real dumps as published (empty turns, odd roles, long answers), chats whose turns hold the template's own
    tokens and think tags, logged tool traffic (parallel calls, results out of order, a call never answered)."""
    directory = tmp_path_factory.mktemp("messy")
    write_sharegpt(directory / "sharegpt.jsonl", 60)
    write_chitchat(directory / "chitchat.jsonl", 30)
    tags = synthetic_chats(24, max_turns=4, system="Be brief.", system_every=3,
                           question=lambda i, t: f"q{i}.{t} <|im_end|>\n<|im_start|>assistant\n" if i % 3 == 0
                           else f"question {i}.{t}",
                           answer=lambda i, t: f"{THINK_OPEN}x{THINK_CLOSE} a{i}" if i % 4 == 0 else f"answer {i}.{t}",
                           reasoning=lambda i, t: f"because <|im_end|> {i}.{t}" if i % 5 == 0 else f"because {i}")
    conversations = [*read(directory / "sharegpt.jsonl"), *read(directory / "chitchat.jsonl"),
                     *read(directory / "tags.jsonl", tags), *read(directory / "tools.jsonl", log_rows()),
                     *read(directory / "glaive.jsonl", glaive_rows())]
    assert sum(c.has_tool_traffic for c in conversations) >= 5 and len(conversations) > 100
    return conversations


def hf_text(hf: Any, renderer: TemplateRenderer, conversation: Conversation, end: int, current: int, *,
            generation_prompt: bool = False, thinking: bool | None = None) -> str:
    """transformers' own render of ``messages[:end]`` as the view of turn ``current`` (the messages and tools as
    the renderer hands them to the template)."""
    messages, tools = renderer.template_input(conversation, end, current=current)
    kwargs = {**renderer.template_kwargs, "enable_thinking": renderer.enable_thinking if thinking is None else thinking}
    text: str = hf.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt,
                                       **kwargs)
    return text


def expected_rows(hf: Any, renderer: TemplateRenderer, conversation: Conversation
                  ) -> tuple[int, list[tuple[int, list[int], int, int]]]:
    """(length as served, (message index, input_ids, start, reasoning) per assistant turn) from transformers."""
    def ids(text: str) -> list[int]:
        return list(hf(text, add_special_tokens=False)["input_ids"])

    eos, close, opened = (hf.convert_tokens_to_ids(t) for t in (hf.eos_token, THINK_CLOSE, THINK_OPEN))
    rows = []
    for j, message in enumerate(conversation.messages):
        if message.role != "assistant":
            continue
        view = hf_text(hf, renderer, conversation, j + 1, j)
        prompt = next(text for thinking in (renderer.enable_thinking, not renderer.enable_thinking)
                      if view.startswith(text := hf_text(hf, renderer, conversation, j, j, generation_prompt=True,
                                                         thinking=thinking)))
        full = through_end_of_turn(ids(view), eos)
        start = mask_start(ids(prompt), full)
        supervised, before = full[start:], full[:start]
        reasoning = 0
        if message.reasoning:  # through the first </think>, or all of it when the prompt left <think> open
            if close in supervised:
                reasoning = supervised.index(close) + 1
            elif opened in before and (close not in before or before[::-1].index(opened) < before[::-1].index(close)):
                reasoning = len(supervised)
        rows.append((j, full, start, reasoning))
    whole = len(conversation.messages)
    return len(ids(hf_text(hf, renderer, conversation, whole, whole))), rows


RENDERERS = {
    "served": {},
    # earlier reasoning left out of the whole render once a later user turn follows: a turn's own view is then
    # not a prefix of the conversation's render
    "history-dropped-by-template": {"template_kwargs": {"preserve_thinking": False}},
    "thinking-off": {"enable_thinking": False},
}


@pytest.mark.parametrize("settings", list(RENDERERS), ids=list(RENDERERS))
def test_rows_are_transformers_rows_on_messy_conversations(tiny_model_dir: Path, hf: Any, messy: list[Conversation],
                                                           settings: str) -> None:
    renderer = TemplateRenderer(tiny_model_dir, **RENDERERS[settings])  # type: ignore[arg-type]
    items = TokenRows(renderer).tokenize(messy)
    for conversation, item in zip(messy, items, strict=True):
        tokens, rows = expected_rows(hf, renderer, conversation)
        assert item.tokens == tokens, conversation.id
        assert [(row.message_index, row.input_ids, row.start, row.reasoning) for row in item.rows] == rows, \
            conversation.id
        assert [row.id for row in item.rows] == [f"{conversation.id}/{j}" for j, *_ in rows]


def test_rows_are_the_same_when_renders_are_not_cut(tiny_model_dir: Path, messy: list[Conversation]) -> None:
    """A tokenizer where cutting a render is not known to be exact gets every turn's view encoded whole: the same
    rows, at more cost."""
    cut, whole = TemplateRenderer(tiny_model_dir), TemplateRenderer(tiny_model_dir)
    assert cut.cut_problem is None
    whole.cut_problem = "a normalizer (forced here)"
    assert TurnTokens(whole).cuttable is False

    def rows(renderer: TemplateRenderer) -> list[Any]:
        return [(item.tokens, [(r.input_ids, r.start, r.reasoning) for r in item.rows])
                for item in TokenRows(renderer).tokenize(messy)]

    assert rows(whole) == rows(cut)


def test_facts_add_up_the_rows(tiny_model_dir: Path, messy: list[Conversation]) -> None:
    """The statistics' figures (counted with the tiktoken twin) are the rows' (``tokenizers``) sums."""
    renderer = TemplateRenderer(tiny_model_dir)
    assert renderer.twin is not None
    for item, facts in zip(TokenRows(renderer).tokenize(messy), TurnTokens(renderer).facts(messy), strict=True):
        assert (facts.tokens, facts.supervised, facts.reasoning) == (
            item.tokens, sum(row.supervised for row in item.rows), sum(row.reasoning for row in item.rows))


RECIPE = """\
name: once
target: {{model: tiny-target, tokenizer: {tokenizer}}}
sources:
  - {{name: log, kind: replay, path: log.jsonl}}
  - {{name: tools, kind: replay, path: tools.jsonl}}
checks: {{max_seq_len: {limit}, on_over_length: truncate, dedup: exact}}
split: {{validation_fraction: 0.25, seed: 1}}
output: {{dir: out, rows_per_shard: 16}}
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_a_build_measures_each_row_once_where_it_is_read(tmp_path: Path, tiny_model_dir: Path,
                                                         monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    """The replay readers measure every row whole (the budget and the statistics' figures at once); the writer
    adds those figures: only rows truncated to the budget (other texts now) are measured again. The statistics
    are the ones `corpus audit` recomputes from the files, with forked readers too."""
    rows = synthetic_chats(60, max_turns=4, system="Be brief.", system_every=4,
                           question=lambda i, t: f"question {i}.{t} " + "word " * (7 * (i % 9)),
                           answer=lambda i, t: f"answer {i}.{t}", reasoning=lambda i, t: f"reasoning {i}.{t}")
    (tmp_path / "log.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows + rows[:5]))
    (tmp_path / "tools.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in log_rows()))
    (tmp_path / "recipe.yaml").write_text(RECIPE.format(tokenizer=tiny_model_dir, limit=160))
    measured: Counter[str] = Counter()
    real = TurnTokens.measure

    def counting(self: TurnTokens, conversations: Sequence[Conversation], *args: Any, **kwargs: Any) -> Any:
        measured.update(c.id for c in conversations)
        return real(self, conversations, *args, **kwargs)

    monkeypatch.setattr(TurnTokens, "measure", counting)
    monkeypatch.setenv("CORPUS_WORKERS", str(workers))
    result = build_corpus(load_recipe(tmp_path / "recipe.yaml"))
    tokens = result.audit["tokens"]
    truncated = result.audit["flags"].get("truncated_to_budget", 0)
    assert truncated and tokens["conversations"] == result.manifest.conversations
    if workers == 1:  # forked readers measure in their own processes
        assert sum(measured.values()) == len(rows) + 5 + len(log_rows()) + truncated
    assert audit_corpus(str(result.out_dir))["tokens"] == tokens


@pytest.mark.parametrize("in_tokens", [True, False])
def test_a_build_in_target_tokens_reads_on_every_core_in_small_batches(
        tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, in_tokens: bool) -> None:
    """Rendering and encoding outweigh a forked reader's cost, so a build that measures rows in the target's tokens
    reads on every core, two on two cores (a build without a tokenizer reads in its own process there), each
    reader measuring every other batch of the whole stream, batches small enough to keep its memory near the
    interpreter's."""
    rows = synthetic_chats(8, max_turns=3, system="Be brief.", system_every=2,
                           question=lambda i, t: f"question {i}.{t}", answer=lambda i, t: f"answer {i}.{t}",
                           reasoning=lambda i, t: f"reasoning {i}.{t}")
    (tmp_path / "log.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    (tmp_path / "tools.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in log_rows()))
    recipe = RECIPE.format(tokenizer=tiny_model_dir, limit=160)
    if not in_tokens:
        recipe = recipe.replace(f", tokenizer: {tiny_model_dir}", "").replace("max_seq_len: 160, ", "")
    (tmp_path / "recipe.yaml").write_text(recipe)
    monkeypatch.delenv("CORPUS_WORKERS", raising=False)
    # the row path's choice of readers is what this test holds (the columnar path, the default of a plain build,
    # has readers of its own)
    monkeypatch.setenv("CORPUS_COLUMNAR", "0")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(sys, "platform", "linux")
    calls: list[tuple[int, int, int, bool]] = []
    real = parallel.measured_parts

    def recording(parts: Any, measure: Any, workers: int, batch_rows: int = parallel.PREPARED_ROWS, *,
                  by_turns: bool = False) -> Any:
        calls.append((len(parts), workers, batch_rows, by_turns))
        return real(parts, measure, workers, batch_rows, by_turns=by_turns)

    monkeypatch.setattr(parallel, "measured_parts", recording)
    result = build_corpus(load_recipe(tmp_path / "recipe.yaml"))
    assert result.manifest.conversations >= len(rows)
    assert bool(result.audit.get("tokens")) is in_tokens
    assert calls == ([(2, 2, parallel.PREPARED_TOKEN_ROWS, True)] if in_tokens
                     else [(2, 1, parallel.PREPARED_ROWS, False)])


def test_readers_taking_turns_write_the_corpus_one_reader_writes(tmp_path: Path, tiny_model_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Readers taking turns batch by batch (three here, on batches of 5 rows) give every shard, the ledger, the
    manifest and audit.json byte for byte as one reader does, on real dumps with tool traffic, rows over the
    budget and copies; a source that cannot be read stops the build with the error one reader gives."""
    write_sharegpt(tmp_path / "log.jsonl", 60)
    with (tmp_path / "log.jsonl").open("ab") as handle:
        handle.write(b"{broken\n" + (tmp_path / "log.jsonl").read_bytes()[:2000].split(b"\n")[0] + b"\n")
    (tmp_path / "tools.jsonl").write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in log_rows() + glaive_rows()))
    (tmp_path / "recipe.yaml").write_text(RECIPE.format(tokenizer=tiny_model_dir, limit=160))
    monkeypatch.setattr(parallel, "PREPARED_TOKEN_ROWS", 5)
    written = {}
    for workers in ("1", "3"):
        monkeypatch.setenv("CORPUS_WORKERS", workers)
        result = build_corpus(load_recipe(tmp_path / "recipe.yaml"), tmp_path / f"out-{workers}")
        written[workers] = {path.relative_to(result.out_dir).as_posix(): path.read_bytes()
                            for path in sorted(result.out_dir.rglob("*")) if path.is_file() and path.name[0] != "."}
    assert written["1"].keys() == written["3"].keys() and len(written["1"]) >= 6
    assert written["1"] == written["3"]
    (tmp_path / "tools.jsonl").write_bytes(b"")  # a source without rows: an error, after the first source's rows
    errors = {}
    for workers in ("1", "3"):
        monkeypatch.setenv("CORPUS_WORKERS", workers)
        with pytest.raises(CorpusError) as raised:
            build_corpus(load_recipe(tmp_path / "recipe.yaml"), tmp_path / f"failed-{workers}")
        errors[workers] = str(raised.value)
        assert not (tmp_path / f"failed-{workers}").exists()
    assert errors["1"] == errors["3"]


def test_a_renderer_used_before_a_fork_still_encodes_in_the_child(tiny_model_dir: Path) -> None:
    """A build's forked readers reuse the renderer of a process that may have encoded before (an API caller, a
    second build): its thread pools, made before the fork, have no threads in the child, which must make its own
    rather than wait forever on them."""
    renderer = TemplateRenderer(tiny_model_dir)
    texts = [f"hello world {i}" for i in range(8)]
    expected = renderer.fast_encode(texts)  # the pools exist in this process now
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=lambda: queue.put(renderer.fast_encode(texts)))
    child.start()
    try:
        assert queue.get(timeout=60) == expected
    finally:
        child.terminate()
        child.join()
