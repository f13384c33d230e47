"""Writing a corpus: parquet shards per split and the ledger of dropped rows.

Shards are written to a staging directory with provisional names and renamed to
``{split}-{i:05d}-of-{n:05d}.parquet`` once the shard count is known.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import zstandard

from ..errors import DropCounts, Skipped
from ..layout import DATA, ShardInfo, file_sha256
from ..records import Conversation
from ..rows import ARROW_SCHEMA, conversations_to_batch

# Sees every row group as it is handed to the writer: the conversations and their Arrow form.
RowGroupObserver = Callable[[list[Conversation], pa.RecordBatch], None]
# Sees every row group of rows written as Arrow batches (``write_batch``), on the I/O thread, in order.
BatchObserver = Callable[[pa.RecordBatch], None]


class ShardWriter:
    """Streams conversations into size-bounded parquet shards, one open file per split.

    Rows are converted to Arrow one row group at a time on the caller's thread; encoding, compression and
    file writes run on one background thread (pyarrow releases the GIL there), so they overlap with reading
    the next rows. At most two row groups wait for that thread, which keeps memory flat.

    Rows come as conversations (``write``) or as Arrow batches of the row form (``write_batch``: the columnar
    path, observed by ``observe_batch`` on the I/O thread, in order), not both: either way the row groups, and so
    the shards, are the same.
    """

    def __init__(self, corpus_dir: Path, rows_per_shard: int, row_group_size: int = 8192,
                 observe: RowGroupObserver | None = None, directory: str = DATA,
                 observe_batch: BatchObserver | None = None) -> None:
        self.directory = directory
        self.data_dir = corpus_dir / directory
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.rows_per_shard = rows_per_shard
        self.row_group_size = min(row_group_size, rows_per_shard)
        self.observe = observe
        self.observe_batch = observe_batch
        self._buffered: dict[str, list[Conversation]] = {}
        self._batches: dict[str, list[pa.RecordBatch]] = {}  # write_batch's rows, per split
        self._batched_rows: dict[str, int] = {}
        self._writers: dict[str, pq.ParquetWriter] = {}  # touched only on the I/O thread
        self._rows_in_shard: dict[str, int] = {}
        # buffered rows that make a split's next row group: min(row_group_size, room left in its shard), which
        # changes only when a group is flushed (absent: a split's first shard, so row_group_size)
        self._flush_at: dict[str, int] = {}
        self._shards: dict[str, list[tuple[Path, int]]] = {}
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-writer")
        self._in_flight: deque[Future[None]] = deque()

    def write(self, conversation: Conversation) -> None:
        split = conversation.split or "train"
        buffered = self._buffered.setdefault(split, [])
        buffered.append(conversation)
        if len(buffered) >= self._flush_at.get(split, self.row_group_size):
            self._flush(split)

    def write_table(self, rows: pa.Table) -> None:
        """Rows already in the row form with the build's side columns, in order (the Ray engine's writing tasks):
        written as they are, never converted."""
        for batch in rows.select(ARROW_SCHEMA.names).cast(ARROW_SCHEMA).to_batches():
            self.write_batch(batch)

    def write_batch(self, batch: pa.RecordBatch) -> None:
        """Rows in the row form, each with its split (a row without one is the train split's)."""
        splits = pc.fill_null(batch.column("split"), "train")
        names = pc.unique(splits).to_pylist()
        for split in names:
            rows = batch.filter(pc.equal(splits, split)) if len(names) > 1 else batch
            self._batches.setdefault(split, []).append(rows)
            self._batched_rows[split] = self._batched_rows.get(split, 0) + rows.num_rows
            while self._batched_rows[split] >= self._flush_at.get(split, self.row_group_size):
                self._flush_batches(split)

    def _flush_batches(self, split: str) -> None:
        """``_flush`` of the rows of ``write_batch``."""
        table = pa.Table.from_batches(self._batches[split], schema=ARROW_SCHEMA)
        self._start_shard(split)
        # the rows ``write`` would have buffered when it flushed: a row group of the same size
        size = min(self._flush_at.get(split, self.row_group_size), self._room(split), table.num_rows)
        group = table.slice(0, size).combine_chunks().to_batches()
        batch = group[0] if group else pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
        rest = table.slice(size)
        self._batches[split] = rest.to_batches() if rest.num_rows else []
        self._batched_rows[split] = rest.num_rows
        self._hand_over(split, batch)

    def _room(self, split: str) -> int:
        rows = self._rows_in_shard.get(split, 0)
        return self.rows_per_shard if rows in (0, self.rows_per_shard) else self.rows_per_shard - rows

    def _flush(self, split: str) -> None:
        """Hand one row group, never past the shard's end, to the I/O thread."""
        buffered = self._buffered[split]
        self._start_shard(split)
        group = buffered[:self._room(split)]
        del buffered[:len(group)]
        batch = conversations_to_batch(group)
        if self.observe is not None:
            self.observe(group, batch)
        self._hand_over(split, batch)

    def _start_shard(self, split: str) -> None:
        """A new shard of the split, when none is open or the open one is full."""
        if self._rows_in_shard.get(split, 0) in (0, self.rows_per_shard):
            index = len(self._shards.setdefault(split, []))
            self._shards[split].append((self.data_dir / f".{split}-{index:05d}.parquet.partial", 0))
            self._rows_in_shard[split] = 0

    def _hand_over(self, split: str, batch: pa.RecordBatch) -> None:
        """A row group to the I/O thread, the split's shard and next row group's size counted."""
        path, _ = self._shards[split][-1]
        self._rows_in_shard[split] += batch.num_rows
        self._shards[split][-1] = (path, self._rows_in_shard[split])
        full = self._rows_in_shard[split] >= self.rows_per_shard
        self._flush_at[split] = min(self.row_group_size, self._room(split))
        self._submit(self._write_batch, split, path, batch, full)

    def _submit(self, *call: Any) -> None:
        while len(self._in_flight) >= 2:
            self._in_flight.popleft().result()  # re-raises a write error here, on the caller's thread
        self._in_flight.append(self._io.submit(*call))

    def _write_batch(self, split: str, path: Path, batch: pa.RecordBatch, close: bool) -> None:
        if self.observe_batch is not None:  # here, on the I/O thread: off the thread that makes the rows
            self.observe_batch(batch)
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
            for split, buffered in self._buffered.items():
                while buffered:
                    self._flush(split)
            for split in self._batches:
                while self._batched_rows[split]:
                    self._flush_batches(split)
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
                infos.append(ShardInfo(f"{self.directory}/{final.name}", split, rows, final.stat().st_size,
                                       file_sha256(final)))
        return infos


class LedgerWriter:
    """Every dropped or skipped row, one JSON line each, zstd-compressed."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("wb")
        self._stream = zstandard.ZstdCompressor(level=3).stream_writer(self._file)
        self.drops = DropCounts()

    def write(self, skipped: Skipped) -> None:
        self.drops.add(skipped.source, skipped.reason, skipped.detail)
        record = {"source": skipped.source, "reason": skipped.reason, "location": skipped.location,
                  "detail": skipped.detail, "id": skipped.id}
        self._stream.write(orjson.dumps(record) + b"\n")

    def close(self) -> None:
        if not self._stream.closed:  # write_corpus closes it, and the build again when it ends
            # also closes the file; zstandard's stub leaves close() untyped
            self._stream.close()  # type: ignore[no-untyped-call]
