"""Writing a corpus: parquet shards per split, the ledger of dropped rows, and the Arrow schema.

Shards are written to a staging directory with provisional names and renamed to
``{split}-{i:05d}-of-{n:05d}.parquet`` once the shard count is known.
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import zstandard

from .errors import Skipped
from .records import Conversation

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string()), ("reasoning", pa.string())])
ARROW_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("source", pa.string()),
    ("origin", pa.string()),
    ("task", pa.string()),
    ("license", pa.string()),
    ("messages", pa.list_(MESSAGE_TYPE)),
    ("thinking", pa.bool_()),
    ("flags", pa.list_(pa.string())),
    ("split", pa.string()),
    ("provenance", pa.string()),  # JSON-encoded object: its keys differ between replayed and generated rows
])


def conversations_to_batch(conversations: list[Conversation]) -> pa.RecordBatch:
    """Column-wise conversion with flat message arrays: far cheaper than a dict per row or per turn.

    ``thinking`` is computed on the turn arrays in one vectorised pass, not by a generator per conversation.
    """
    messages = [message for conversation in conversations for message in conversation.messages]
    offsets = np.zeros(len(conversations) + 1, dtype=np.int32)
    np.cumsum([len(conversation.messages) for conversation in conversations], dtype=np.int32, out=offsets[1:])
    roles = pa.array([m.role for m in messages], pa.string())
    reasonings = pa.array([m.reasoning for m in messages], pa.string())
    turns = pa.StructArray.from_arrays([roles, pa.array([m.content for m in messages], pa.string()), reasonings],
                                       fields=list(MESSAGE_TYPE))
    columns = [
        pa.array([c.id for c in conversations], pa.string()),
        pa.array([c.source for c in conversations], pa.string()),
        pa.array([c.origin for c in conversations], pa.string()),
        pa.array([c.task for c in conversations], pa.string()),
        pa.array([c.license for c in conversations], pa.string()),
        pa.ListArray.from_arrays(pa.array(offsets), turns, type=ARROW_SCHEMA.field("messages").type),
        pa.array(_thinking(offsets, roles, reasonings), pa.bool_()),
        pa.array([c.flags for c in conversations], pa.list_(pa.string())),
        pa.array([c.split for c in conversations], pa.string()),
        pa.array([orjson.dumps(c.provenance).decode() for c in conversations], pa.string()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


def _thinking(offsets: np.ndarray, roles: pa.Array, reasonings: pa.Array) -> np.ndarray:
    """Conversation.thinking for every conversation: some assistant turn has a non-empty reasoning."""
    reasoned = pc.and_(pc.equal(roles, "assistant"), pc.greater(pc.binary_length(reasonings), 0))
    running = np.zeros(len(roles) + 1, dtype=np.int64)
    np.cumsum(pc.fill_null(reasoned, False).to_numpy(zero_copy_only=False), out=running[1:])
    return running[offsets[1:]] > running[offsets[:-1]]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class ShardInfo:
    path: str  # relative to the corpus directory, e.g. data/train-00000-of-00002.parquet
    split: str
    rows: int
    bytes: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "split": self.split, "rows": self.rows, "bytes": self.bytes,
                "sha256": self.sha256}


class ShardWriter:
    """Streams conversations into size-bounded parquet shards, one open file per split.

    Arrow conversion happens on the caller's thread; encoding, compression and file writes run on one
    background thread (pyarrow releases the GIL there), so they overlap with reading the next rows. At
    most two batches wait for that thread, which keeps memory flat.
    """

    def __init__(self, corpus_dir: Path, rows_per_shard: int, row_group_size: int = 8192,
                 observe: Callable[[pa.RecordBatch], None] | None = None) -> None:
        self.data_dir = corpus_dir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.rows_per_shard = rows_per_shard
        self.row_group_size = min(row_group_size, rows_per_shard)
        self.observe = observe
        self._buffered: dict[str, list[Conversation]] = {}  # rows not yet converted to Arrow
        self._pending: dict[str, list[pa.RecordBatch]] = {}  # Arrow rows not yet handed to the I/O thread
        self._writers: dict[str, pq.ParquetWriter] = {}  # touched only on the I/O thread
        self._rows_in_shard: dict[str, int] = {}
        self._shards: dict[str, list[tuple[Path, int]]] = {}
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-writer")
        self._in_flight: deque[Future[None]] = deque()

    def write(self, conversation: Conversation) -> None:
        split = conversation.split or "train"
        buffered = self._buffered.setdefault(split, [])
        buffered.append(conversation)
        if len(buffered) >= self.row_group_size:
            self._convert(split)

    def write_batch(self, batch: pa.RecordBatch) -> None:
        """Rows already in Arrow form with their split set (the parallel replay path)."""
        splits = batch.column("split")
        for split in pc.unique(splits).to_pylist():
            self._convert(split)  # rows written one by one before this batch keep their place
            self._add(split, batch.filter(pc.equal(splits, split)))

    def _convert(self, split: str) -> None:
        buffered = self._buffered.get(split)
        if buffered:
            self._add(split, conversations_to_batch(buffered))
            buffered.clear()

    def _add(self, split: str, batch: pa.RecordBatch) -> None:
        pending = self._pending.setdefault(split, [])
        pending.append(batch)
        while sum(b.num_rows for b in pending) >= min(self.row_group_size, self._room(split)):
            self._flush(split)

    def _room(self, split: str) -> int:
        rows = self._rows_in_shard.get(split, 0)
        return self.rows_per_shard if rows in (0, self.rows_per_shard) else self.rows_per_shard - rows

    def _flush(self, split: str) -> None:
        """Hand at most one row group, never past the shard's end, to the I/O thread."""
        pending = self._pending.get(split)
        if not pending:
            return
        if self._rows_in_shard.get(split, 0) in (0, self.rows_per_shard):
            index = len(self._shards.setdefault(split, []))
            self._shards[split].append((self.data_dir / f".{split}-{index:05d}.parquet.partial", 0))
            self._rows_in_shard[split] = 0
        table = pa.Table.from_batches(pending, schema=ARROW_SCHEMA)
        take = min(table.num_rows, self.row_group_size, self.rows_per_shard - self._rows_in_shard[split])
        batch = table.slice(0, take).combine_chunks().to_batches()[0]
        pending[:] = [rest for rest in table.slice(take).to_batches() if rest.num_rows]
        if self.observe is not None:
            self.observe(batch)
        path, _ = self._shards[split][-1]
        self._rows_in_shard[split] += batch.num_rows
        self._shards[split][-1] = (path, self._rows_in_shard[split])
        full = self._rows_in_shard[split] >= self.rows_per_shard
        self._submit(self._write_batch, split, path, batch, full)

    def _submit(self, *call: Any) -> None:
        while len(self._in_flight) >= 2:
            self._in_flight.popleft().result()  # re-raises a write error here, on the caller's thread
        self._in_flight.append(self._io.submit(*call))

    def _write_batch(self, split: str, path: Path, batch: pa.RecordBatch, close: bool) -> None:
        writer = self._writers.get(split)
        if writer is None:
            writer = self._writers[split] = pq.ParquetWriter(path, ARROW_SCHEMA, compression="zstd")
        writer.write_batch(batch)
        if close:
            self._writers.pop(split).close()

    def _close_all(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def abort(self) -> None:
        """Stop after a failure: wait for the I/O thread and close open files (the staging is discarded)."""
        self._io.submit(self._close_all)
        self._io.shutdown(wait=True)

    def close(self) -> list[ShardInfo]:
        """Flush, close and rename every shard to its final name; returns them in split, index order."""
        try:
            for split in list(self._buffered):
                self._convert(split)
            for split in list(self._pending):
                while self._pending[split]:
                    self._flush(split)
            self._submit(self._close_all)
            while self._in_flight:
                self._in_flight.popleft().result()
        finally:
            self._io.shutdown(wait=True)
        infos: list[ShardInfo] = []
        for split in sorted(self._shards):
            shards = self._shards[split]
            for index, (partial, rows) in enumerate(shards):
                final = self.data_dir / f"{split}-{index:05d}-of-{len(shards):05d}.parquet"
                os.replace(partial, final)
                infos.append(ShardInfo(f"data/{final.name}", split, rows, final.stat().st_size,
                                       file_sha256(final)))
        return infos


class LedgerWriter:
    """Every dropped or skipped row, one JSON line each, zstd-compressed."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("wb")
        self._stream = zstandard.ZstdCompressor(level=3).stream_writer(self._file)
        self.counts: dict[str, int] = {}

    def write(self, skipped: Skipped) -> None:
        self.counts[skipped.reason] = self.counts.get(skipped.reason, 0) + 1
        record = {"source": skipped.source, "reason": skipped.reason, "location": skipped.location,
                  "detail": skipped.detail, "id": skipped.id}
        self._stream.write(orjson.dumps(record) + b"\n")

    def close(self) -> None:
        self._stream.close()  # also closes the file


def iter_ledger(path: Path) -> Iterable[dict[str, Any]]:
    with path.open("rb") as handle, zstandard.ZstdDecompressor().stream_reader(handle) as reader:
        buffer = b""
        while chunk := reader.read(1 << 16):
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if line:
                    yield orjson.loads(line)
