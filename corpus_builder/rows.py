"""The Arrow row form of a ``Conversation``: the on-disk schema and the one place the two forms convert.

A row is a ``Conversation`` in the pipeline and an Arrow record (``ARROW_SCHEMA``) in shards and files;
``conversations_to_batch`` and ``batch_to_conversations`` are the only conversions between them.

Between a build's tasks a batch is *records*: its rows and, in their place, the skip records of the rows that did
not make it (``errors.Skipped``), in ``RECORD_SCHEMA``: the row form and three skip columns (``skip_reason`` set on
a skip record only, which keeps its source and id in the row columns and leaves the others null);
``records_to_batch`` and ``batch_to_records`` convert. A stage adds its own typed columns beside them.

Tool traffic: a turn's ``tool_calls`` are a list of ``{id, name, arguments}`` structs (every call has exactly
these three strings, so polars and pyarrow count and read calls without parsing JSON; ``arguments`` stays the
model's own text), and a tool turn's ``tool_call_id`` is a string. The row's ``tools`` are a JSON string, as
``provenance`` is: function schemas are free-form JSON Schema, which no fixed Arrow type holds. All three are
null on rows and turns without tool traffic.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from .errors import Skipped
from .records import Conversation, Message, Provenance, ToolCall

TOOL_CALL_TYPE = pa.struct([("id", pa.string()), ("name", pa.string()), ("arguments", pa.string())])
MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string()), ("reasoning", pa.string()),
                          ("tool_calls", pa.list_(TOOL_CALL_TYPE)), ("tool_call_id", pa.string())])
ARROW_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("source", pa.string()),
    ("origin", pa.string()),
    ("task", pa.string()),
    ("license", pa.string()),
    ("messages", pa.list_(MESSAGE_TYPE)),
    ("tools", pa.string()),  # JSON-encoded list of OpenAI function schemas, or null
    ("thinking", pa.bool_()),
    ("flags", pa.list_(pa.string())),
    ("split", pa.string()),
    ("provenance", pa.string()),  # JSON-encoded object: its keys differ between replayed and generated rows
])
SKIP_FIELDS = (pa.field("skip_reason", pa.string()), pa.field("skip_location", pa.string()),
               pa.field("skip_detail", pa.string()))
RECORD_SCHEMA = pa.schema([*ARROW_SCHEMA, *SKIP_FIELDS])
SPOOL_BATCH = 2048  # rows per batch of a RowSpool


def spool_writer(sink: pa.NativeFile, schema: pa.Schema = ARROW_SCHEMA) -> pa.RecordBatchStreamWriter:
    """An Arrow stream of rows in the row form (or records, ``RECORD_SCHEMA``), zstd-compressed: a build's spools
    hold every row it keeps (or prompts), which for text is several times smaller compressed, at little CPU."""
    return pa.ipc.new_stream(sink, schema, options=pa.ipc.IpcWriteOptions(compression="zstd"))


class RowSpool:
    """Rows spooled to one file in the row form (``spool_writer``), ``SPOOL_BATCH`` rows a batch: appended,
    closed, then read back as often as needed. As a context manager it is closed on leaving; after an error
    only its file is closed, the rows not yet written are dropped (the staging it lives in is discarded)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._sink = pa.OSFile(str(path), "wb")
        self._writer = spool_writer(self._sink)
        self._pending: list[Conversation] = []

    def append(self, conversation: Conversation) -> None:
        self._pending.append(conversation)
        if len(self._pending) >= SPOOL_BATCH:
            self._write_pending()

    def _write_pending(self) -> None:
        if self._pending:
            self._writer.write_batch(conversations_to_batch(self._pending))
            self._pending = []

    def close(self) -> None:
        self._write_pending()
        self._close_file()

    def _close_file(self) -> None:
        self._writer.close()
        self._sink.close()

    def __enter__(self) -> RowSpool:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:
            self._close_file()

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The spooled rows as written, batch by batch (for a filter on columns before any conversion)."""
        with pa.OSFile(str(self.path), "rb") as source, pa.ipc.open_stream(source) as reader:
            yield from reader

    def __iter__(self) -> Iterator[Conversation]:
        for batch in self.batches():
            yield from batch_to_conversations(batch)


def conversations_to_batch(conversations: list[Conversation]) -> pa.RecordBatch:
    """Column-wise conversion with flat message arrays: far cheaper than a dict per row or per turn.

    ``thinking`` is computed on the turn arrays in one vectorised pass, not by a generator per conversation.
    """
    messages = [message for conversation in conversations for message in conversation.messages]
    offsets = np.zeros(len(conversations) + 1, dtype=np.int32)
    np.cumsum([len(conversation.messages) for conversation in conversations], dtype=np.int32, out=offsets[1:])
    roles = pa.array([m.role for m in messages], pa.string())
    reasonings = pa.array([m.reasoning for m in messages], pa.string())
    turns = pa.StructArray.from_arrays(
        [roles, pa.array([m.content for m in messages], pa.string()), reasonings, _tool_calls(messages),
         pa.array([m.tool_call_id for m in messages], pa.string())],
        fields=list(MESSAGE_TYPE))
    columns = [
        pa.array([c.id for c in conversations], pa.string()),
        pa.array([c.source for c in conversations], pa.string()),
        pa.array([c.origin for c in conversations], pa.string()),
        pa.array([c.task for c in conversations], pa.string()),
        pa.array([c.license for c in conversations], pa.string()),
        pa.ListArray.from_arrays(pa.array(offsets), turns, type=ARROW_SCHEMA.field("messages").type),
        pa.array([tools_json(c) for c in conversations], pa.string()),
        pa.array(_thinking(offsets, roles, reasonings), pa.bool_()),
        pa.array([c.flags for c in conversations], pa.list_(pa.string())),
        pa.array([c.split for c in conversations], pa.string()),
        pa.array([orjson.dumps(c.provenance.to_json()).decode() for c in conversations], pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def tools_json(conversation: Conversation) -> str | None:
    """The row's tools as the JSON text the row form and the exports hold; null for a row without tools."""
    return orjson.dumps(conversation.tools).decode() if conversation.tools else None


def _tool_calls(messages: list[Message]) -> pa.Array:
    """The turns' calls as one list array: null for a turn without calls (most turns: built without a dict)."""
    if not any(m.tool_calls for m in messages):
        return pa.nulls(len(messages), pa.list_(TOOL_CALL_TYPE))
    return pa.array([[call.to_dict() for call in m.tool_calls] if m.tool_calls else None for m in messages],
                    pa.list_(TOOL_CALL_TYPE))


def _thinking(offsets: np.ndarray, roles: pa.Array, reasonings: pa.Array) -> np.ndarray:
    """Conversation.thinking for every conversation: some assistant turn has a non-empty reasoning."""
    reasoned = pc.and_(pc.equal(roles, "assistant"), pc.greater(pc.binary_length(reasonings), 0))
    running = np.zeros(len(roles) + 1, dtype=np.int64)
    np.cumsum(pc.fill_null(reasoned, False).to_numpy(zero_copy_only=False), out=running[1:])
    thinking: np.ndarray = running[offsets[1:]] > running[offsets[:-1]]
    return thinking


def batch_to_conversations(batch: pa.RecordBatch | pa.Table) -> list[Conversation]:
    """The rows of a batch (a shard's, or a raw file's converted batch) as conversations; a shard written
    before tool traffic existed (no tool columns) reads as rows without it."""
    conversations = []
    for row in batch.to_pylist():
        provenance = row.get("provenance") or {}
        if isinstance(provenance, str):
            provenance = orjson.loads(provenance)
        conversations.append(Conversation(
            id=row["id"], source=row["source"], origin=row["origin"],
            messages=[_message(m) for m in row["messages"]],
            task=row.get("task"), license=row.get("license"), flags=list(row.get("flags") or []),
            provenance=Provenance.from_json(provenance), split=row.get("split"), tools=_tools(row.get("tools"))))
    return conversations


def _message(turn: dict[str, Any]) -> Message:
    calls = turn.get("tool_calls")
    return Message(turn["role"], turn["content"], turn.get("reasoning"),
                   tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in calls) if calls else (),
                   turn.get("tool_call_id"))


def _tools(value: Any) -> list[dict[str, Any]] | None:
    if isinstance(value, str):
        value = orjson.loads(value)
    return value or None


def records_to_batch(records: Sequence[Conversation | Skipped]) -> pa.RecordBatch:
    """Rows and skip records, in order, as one batch of ``RECORD_SCHEMA``."""
    rows: list[Conversation] = []
    skips: list[Skipped] = []
    places: tuple[list[int], list[int]] = ([], [])  # where each row, and each skip record, is among the records
    for place, record in enumerate(records):
        if isinstance(record, Conversation):
            rows.append(record)
            places[0].append(place)
        else:
            skips.append(record)
            places[1].append(place)
    converted = conversations_to_batch(rows)
    kept = pa.RecordBatch.from_arrays([*converted.columns, *(pa.nulls(len(rows), field.type) for field in SKIP_FIELDS)],
                                      schema=RECORD_SCHEMA)
    if not skips:
        return kept
    given = {"id": pa.array([skip.id for skip in skips], pa.string()),
             "source": pa.array([skip.source for skip in skips], pa.string()),
             "skip_reason": pa.array([skip.reason for skip in skips], pa.string()),
             "skip_location": pa.array([skip.location for skip in skips], pa.string()),
             "skip_detail": pa.array([skip.detail for skip in skips], pa.string())}
    dropped = pa.RecordBatch.from_arrays([given.get(field.name, pa.nulls(len(skips), field.type))
                                          for field in RECORD_SCHEMA], schema=RECORD_SCHEMA)
    order = np.argsort(np.asarray(places[0] + places[1], dtype=np.int64), kind="stable")
    return pa.Table.from_batches([kept, dropped]).take(pa.array(order)).combine_chunks().to_batches()[0]


def batch_to_records(batch: pa.RecordBatch | pa.Table) -> list[Conversation | Skipped]:
    """The rows and skip records of a batch of ``RECORD_SCHEMA`` (a stage's own columns beside them left out), in
    order."""
    batch = batch.select(RECORD_SCHEMA.names)
    is_skip = pc.is_valid(batch.column("skip_reason"))
    rows = iter(batch_to_conversations(batch.filter(pc.invert(is_skip))))
    skips = batch.filter(is_skip)
    skipped = iter([Skipped(source, reason, location, detail, id=row_id) for source, reason, location, detail, row_id
                    in zip(*(skips.column(name).to_pylist() for name in (
                        "source", "skip_reason", "skip_location", "skip_detail", "id")), strict=True)])
    return [next(skipped) if skip else next(rows) for skip in is_skip.to_pylist()]


def string_buffers(texts: pa.Array) -> tuple[npt.NDArray[np.int32], pa.Buffer | None]:
    """A string array's offsets into its data (one more than its rows, the array's own slice of them) and its data
    buffer (None when every text is empty): what the columnar kernels read its texts' bytes through."""
    offsets = np.frombuffer(texts.buffers()[1], dtype=np.int32)[texts.offset:texts.offset + len(texts) + 1]
    return offsets, texts.buffers()[2]

