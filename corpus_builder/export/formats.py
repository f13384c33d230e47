"""`corpus export`: a built corpus in the formats the trainers read, one file per split.

Layout: ``OUT/{split}.{jsonl|jsonl.zst|parquet}`` (train, validation). The split was decided per
conversation at build time and every row of a conversation goes to its conversation's file, so the
per-turn fan-out of `speculators-tokens` never puts one conversation on both sides.

Formats (reasoning always travels in its own field, except in sharegpt, which has none):

* ``speculators``: ``{id, conversations: [{role, content, reasoning_content, tool_calls, tool_call_id}],
  tools}``, one row per conversation; speculators' ``prepare-data`` renders it through a vLLM server
  (``--render-endpoint``, with the row's ``tools``) and fans it out per assistant turn. Earlier reasoning
  stays in the history, as a Nanbeige-style template renders it.
* ``speculators-tokens``: ``{id, input_ids, loss_mask}``, one row per assistant turn (id
  ``{conversation id}/{message index}``), built by corpus_builder.tokens: served ids for generated turns,
  the rendered template for replayed ones; the mask covers the turn's tokens through its end-of-turn token
  (a turn's tool calls included; tool results are never supervised).
* ``specforge``: ``{id, conversations}`` as speculators, checked against SpecForge's rules
  (``specforge_problems``); a conversation that breaks them is left out and counted, and so is one with tool
  traffic (SpecForge's rows, as its validators state them, hold no tool turns or tools).
* ``messages``: OpenAI chat style ``{id, source, messages: [{role, content, reasoning_content, tool_calls,
  tool_call_id}], tools}`` (``reasoning_content`` is the field chat templates read, so rows feed
  ``apply_chat_template`` as they are, with ``tools=json.loads(row["tools"])``; a call's arguments are the
  model's text, as OpenAI writes them, where vLLM decodes them to an object before its template renders them:
  a template that prints a string verbatim then shows the model's own spacing).
* ``sharegpt``: ``{id, conversations: [{from: system|human|gpt|function_call|observation, value}], tools}``;
  ShareGPT has no reasoning field, so an assistant turn's reasoning is written back as a leading
  ``<think>\\n...\\n</think>\\n\\n`` block (the form corpus-builder's readers split out again). Tool traffic
  takes the glaive/LLaMA-Factory form: a ``function_call`` turn whose value is the call's JSON (a list for
  parallel calls; an assistant turn's text or reasoning before its calls is a ``gpt`` turn of its own, which
  the readers merge back), one ``observation`` turn per result (one holding the JSON list of the results
  after parallel calls).

Tool calls are OpenAI's ``{id, type: "function", function: {name, arguments}}`` with the arguments' text,
and ``tools`` is the row's function schemas as a JSON string (null without tools), as the Hermes and glaive
function-calling datasets store them and speculators reads them: free-form JSON Schema has no one column type.
Every turn carries ``reasoning_content``, ``tool_calls`` and ``tool_call_id`` (null where a turn has none):
with a key missing from some turns, ``datasets``' JSON loader types the turns as opaque ``Json`` instead of
``List({role, content, ...})``. Memory is flat: batches stream from the shards to the files.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import orjson
import pyarrow as pa

from ..errors import CorpusError
from ..layout import Corpus
from ..outputs import made_directory, staged
from ..progress import ProgressLine
from ..recipe.model import Recipe
from ..records import THINK_CLOSE, THINK_OPEN, Conversation, Message, ToolCall
from ..rows import batch_to_conversations, tools_json
from ..tokens import TokenRows
from ..trainer_formats import EXPORT_FORMATS, FILE_FORMATS

EXPORTS_DIR = "exports"  # a build's recipe exports: OUT/exports/{format}/

_TOOL_CALL = pa.struct([("id", pa.string()), ("type", pa.string()),
                        ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
_PLAIN_TURN = pa.struct([("role", pa.string()), ("content", pa.string()), ("reasoning_content", pa.string())])
_TURN = pa.struct([*_PLAIN_TURN, ("tool_calls", pa.list_(_TOOL_CALL)), ("tool_call_id", pa.string())])
_SHAREGPT_TURN = pa.struct([("from", pa.string()), ("value", pa.string())])
SCHEMAS = {
    "speculators": pa.schema([("id", pa.string()), ("conversations", pa.list_(_TURN)), ("tools", pa.string())]),
    "specforge": pa.schema([("id", pa.string()), ("conversations", pa.list_(_PLAIN_TURN))]),
    "messages": pa.schema([("id", pa.string()), ("source", pa.string()), ("messages", pa.list_(_TURN)),
                           ("tools", pa.string())]),
    "sharegpt": pa.schema([("id", pa.string()), ("conversations", pa.list_(_SHAREGPT_TURN)), ("tools", pa.string())]),
    "speculators-tokens": pa.schema([("id", pa.string()), ("input_ids", pa.list_(pa.int32())),
                                     ("loss_mask", pa.list_(pa.int32()))]),
}
SHAREGPT_ROLES = {"system": "system", "user": "human", "assistant": "gpt", "tool": "observation"}
SHAREGPT_CALL = "function_call"
SPECFORGE_NO_TOOLS = "tool calls or tools (SpecForge's conversations hold no tool turns)"


def _turns(conversation: Conversation) -> list[dict[str, Any]]:
    return [{"role": m.role, "content": m.content, "reasoning_content": m.reasoning,
             "tool_calls": [call.to_openai() for call in m.tool_calls] or None, "tool_call_id": m.tool_call_id}
            for m in conversation.messages]


def specforge_problems(row: dict[str, Any]) -> list[str]:
    """SpecForge's rules for a ``{id, conversations}`` row: roles alternate user/assistant after an optional
    leading system turn, every content is a non-empty string, no think markers are left in the content,
    and ``reasoning_content`` (a string) appears on assistant turns only."""
    problems = []
    if not isinstance(row.get("id"), str) or not row["id"]:
        problems.append("id is not a non-empty string")
    turns = row.get("conversations")
    if not isinstance(turns, list) or not turns:
        return [*problems, "conversations is not a non-empty list"]
    start = 1 if isinstance(turns[0], dict) and turns[0].get("role") == "system" else 0
    if len(turns) == start:
        problems.append("no user turn")
    for index, turn in enumerate(turns):
        if not isinstance(turn, dict):
            problems.append(f"turn {index} is not an object")
            continue
        expected = "system" if index < start else ("user", "assistant")[(index - start) % 2]
        if turn.get("role") != expected:
            problems.append(f"turn {index} has role {turn.get('role')!r}, expected {expected!r}")
        content = turn.get("content")
        if not isinstance(content, str) or not content.strip():
            problems.append(f"turn {index} has empty or non-string content")
        elif THINK_OPEN in content or THINK_CLOSE in content:
            problems.append(f"turn {index} content holds a think marker")
        reasoning = turn.get("reasoning_content")
        if reasoning is not None and (turn.get("role") != "assistant" or not isinstance(reasoning, str)):
            problems.append(f"turn {index} has reasoning_content but is not an assistant turn with a string")
    return problems


def inline_reasoning(message: Message) -> str:
    """A turn's text for a form with no reasoning field (sharegpt, vLLM's multi-turn benchmark): an assistant
    turn's reasoning written back as a leading think block, as the target generated it."""
    if message.role == "assistant" and message.reasoning:
        return f"{THINK_OPEN}\n{message.reasoning}\n{THINK_CLOSE}\n\n{message.content}"
    return message.content


def _sharegpt_turns(conversation: Conversation) -> list[dict[str, str]]:
    turns: list[dict[str, str]] = []
    results: list[str] = []  # the tool turns in a row, written as one observation when there are several

    def flush() -> None:
        if results:
            turns.append({"from": SHAREGPT_ROLES["tool"],
                          "value": results[0] if len(results) == 1 else orjson.dumps(results).decode()})
            results.clear()

    for message in conversation.messages:
        if message.role == "tool":
            results.append(message.content)
            continue
        flush()
        if not message.tool_calls or message.content or message.reasoning:
            turns.append({"from": SHAREGPT_ROLES[message.role], "value": inline_reasoning(message)})
        if message.tool_calls:
            calls = [_sharegpt_call(call) for call in message.tool_calls]
            value = calls[0] if len(calls) == 1 else calls
            turns.append({"from": SHAREGPT_CALL, "value": orjson.dumps(value).decode()})
    flush()
    return turns


def _sharegpt_call(call: ToolCall) -> dict[str, Any]:
    """glaive/LLaMA-Factory's call: the arguments as an object (their text when it is not one)."""
    arguments = call.arguments_object()
    return {"name": call.name, "arguments": call.arguments if arguments is None else arguments}


# A converter turns a batch of conversations into output rows and counts what it leaves out.
Converter = Callable[[list[Conversation], Counter[str]], Iterator[dict[str, Any]]]


def _speculators(conversations: list[Conversation], skipped: Counter[str]) -> Iterator[dict[str, Any]]:
    for c in conversations:
        yield {"id": c.id, "conversations": _turns(c), "tools": tools_json(c)}


def _specforge(conversations: list[Conversation], skipped: Counter[str]) -> Iterator[dict[str, Any]]:
    for c in conversations:
        if c.has_tool_traffic:
            skipped[SPECFORGE_NO_TOOLS] += 1
            continue
        row = {"id": c.id, "conversations": [{"role": m.role, "content": m.content, "reasoning_content": m.reasoning}
                                             for m in c.messages]}
        problems = specforge_problems(row)
        if problems:
            skipped[re.sub(r"^turn \d+ ", "", problems[0])] += 1  # counted by kind, not by turn
            continue
        yield row


def _messages(conversations: list[Conversation], skipped: Counter[str]) -> Iterator[dict[str, Any]]:
    for c in conversations:
        yield {"id": c.id, "source": c.source, "messages": _turns(c), "tools": tools_json(c)}


def _sharegpt(conversations: list[Conversation], skipped: Counter[str]) -> Iterator[dict[str, Any]]:
    for c in conversations:
        yield {"id": c.id, "conversations": _sharegpt_turns(c), "tools": tools_json(c)}


class _TokenConverter:
    def __init__(self, rows: TokenRows) -> None:
        self.rows = rows

    def __call__(self, conversations: list[Conversation], skipped: Counter[str]) -> Iterator[dict[str, Any]]:
        for item in self.rows.tokenize(conversations):
            for row in item.rows:
                yield {"id": row.id, "input_ids": row.input_ids, "loss_mask": row.loss_mask}


class _JsonlSink:
    def __init__(self, path: Path, compressed: bool) -> None:
        self._file = path.open("wb")
        self._stream: Any = self._file
        if compressed:
            import zstandard

            self._stream = zstandard.ZstdCompressor(level=3).stream_writer(self._file)

    def write(self, rows: list[dict[str, Any]]) -> None:
        self._stream.write(b"".join(orjson.dumps(row) + b"\n" for row in rows))

    def close(self) -> None:
        self._stream.close()  # closes the file too
        self._file.close()


class _ParquetSink:
    def __init__(self, path: Path, schema: pa.Schema) -> None:
        import pyarrow.parquet as pq

        self._schema = schema
        self._writer = pq.ParquetWriter(path, schema, compression="zstd")

    def write(self, rows: list[dict[str, Any]]) -> None:
        self._writer.write_table(pa.Table.from_pylist(rows, schema=self._schema))

    def close(self) -> None:
        self._writer.close()


@dataclass
class ExportReport:
    format: str
    file_format: str
    out_dir: Path
    # split -> {path, rows, conversations, left_out}
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    # Natural-language formats only: generated turns whose re-render is not the token ids the target served
    # (from the build's served-ids check), of how many; a trainer that re-renders the text trains on those.
    re_rendered: tuple[int, int] | None = None

    def describe(self) -> str:
        lines = [f"{self.format} ({self.file_format}) -> {self.out_dir}"]
        for split, info in self.files.items():
            lines.append(f"  {split:<11} {info['rows']:>9,} rows from {info['conversations']:,} conversations  "
                         f"{info['path']}")
        for reason, count in sorted(self.skipped.items()):
            lines.append(f"  left out: {reason}: {count:,} conversations")
        if self.re_rendered is not None and self.re_rendered[0]:
            differ, checked = self.re_rendered
            lines.append(f"  note: {differ:,} of {checked:,} generated turns re-render differently from the tokens "
                         "the target served (a trainer that re-renders this text trains on tokens the target did "
                         "not produce); the speculators-tokens export keeps them token-exact")
        return "\n".join(lines)


def _re_rendered_turns(corpus: Corpus) -> tuple[int, int] | None:
    """(generated turns whose re-render differs from their served ids, generated turns checked), from the
    build's served-ids check in audit.json; None when the build had no target tokenizer to check with."""
    mismatches = ((corpus.audit() or {}).get("tokens") or {}).get("mismatches")
    if not isinstance(mismatches, dict):
        return None
    return int(mismatches.get("count", 0)), int(mismatches.get("checked_turns", 0))


def _converter(fmt: str, token_rows: TokenRows | None) -> Converter:
    if fmt == "speculators-tokens":
        if token_rows is None:
            raise CorpusError("speculators-tokens needs the target's tokenizer: the corpus recipe has no "
                              "target.tokenizer that can be found here (give --tokenizer DIR)")
        return _TokenConverter(token_rows)
    return {"speculators": _speculators, "specforge": _specforge, "messages": _messages,
            "sharegpt": _sharegpt}[fmt]


def split_files(corpus: Corpus, out_dir: Path, file_format: str) -> dict[str, Path]:
    """The file each split of ``corpus`` is exported to: ``out_dir``/{split}.{file_format}."""
    return {split: out_dir / f"{split}.{file_format}" for split in sorted(corpus.manifest.splits)}


def write_export(corpus: Corpus, fmt: str, out_dir: Path, *, file_format: str = "jsonl",
                 token_rows: TokenRows | None = None, batch_size: int = 512,
                 progress: ProgressLine | None = None, allow_empty: bool = False) -> ExportReport:
    """Write ``corpus`` as ``fmt`` into ``out_dir``/{split}.{file_format}; the files appear complete or not at
    all (each written under a temporary name, every one renamed once all are done; on an error the temporary
    files, and the directories made for them, are removed). An export without rows (an empty corpus, or every
    conversation left out by the format) is refused, nothing written, unless ``allow_empty``."""
    if fmt not in EXPORT_FORMATS:
        raise CorpusError(f"unknown export format {fmt!r} (one of {', '.join(EXPORT_FORMATS)})")
    if file_format not in FILE_FORMATS:
        raise CorpusError(f"unknown file format {file_format!r} (one of {', '.join(FILE_FORMATS)})")
    if not corpus.manifest.conversations and not allow_empty:
        raise CorpusError("the corpus holds no conversations: there is nothing to export", file=str(corpus.root))
    convert = _converter(fmt, token_rows)
    report = ExportReport(fmt, file_format, out_dir, re_rendered=None if fmt == "speculators-tokens"
                          else _re_rendered_turns(corpus))
    skipped: Counter[str] = Counter()
    with made_directory(out_dir), ExitStack() as files:
        for split, path in split_files(corpus, out_dir, file_format).items():
            partial = files.enter_context(staged(path))
            sink = (_ParquetSink(partial, SCHEMAS[fmt]) if file_format == "parquet"
                    else _JsonlSink(partial, file_format == "jsonl.zst"))
            rows = conversations = 0
            left_out = sum(skipped.values())
            try:
                for batch in corpus.iter_batches(split=split, batch_size=batch_size):
                    converted = list(convert(batch_to_conversations(batch), skipped))
                    conversations += batch.num_rows
                    rows += len(converted)
                    if converted:
                        sink.write(converted)
                    if progress is not None:
                        progress.advance(batch.num_rows)
            finally:
                sink.close()
            report.files[split] = {"path": str(path), "rows": rows, "conversations": conversations,
                                   "left_out": sum(skipped.values()) - left_out}
        if not any(info["rows"] for info in report.files.values()) and not allow_empty:
            reasons = "; ".join(f"{reason}: {count:,}" for reason, count in sorted(skipped.items()))
            raise CorpusError(f"the {fmt} export would hold no rows: every conversation was left out ({reasons}); "
                              "nothing was written", file=str(out_dir))
    report.skipped = dict(skipped)
    if progress is not None:
        progress.finish()
    return report


def run_recipe_exports(recipe: Recipe, corpus_dir: Path, token_rows: TokenRows | None,
                       stream: TextIO | None = None, allow_empty: bool = False) -> list[ExportReport]:
    """The exports a recipe's output asks for, into ``corpus_dir``/exports/{format}/ (``token_rows``: the
    build's own, on its one renderer), each with a progress line on ``stream``; ``allow_empty``: the build
    was asked for an empty corpus, so its exports may be empty too."""
    if not recipe.output.exports:
        return []
    corpus = Corpus.open(corpus_dir)
    total = corpus.manifest.conversations
    return [write_export(corpus, spec.format, corpus_dir / EXPORTS_DIR / spec.format, file_format=spec.file_format,
                         token_rows=token_rows, allow_empty=allow_empty,
                         progress=ProgressLine(f"export {spec.format}", total=total, unit="conversations",
                                               stream=stream))
            for spec in recipe.output.exports]
