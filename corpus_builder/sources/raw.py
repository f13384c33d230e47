"""A file's rows in bounded raw batches: each batch its rows as the readers decode them and, beside them, its object
rows parsed into an Arrow table, for a reader that takes its facts from columns (``corpus audit --against``).

Why batches and not ``pl.scan_ndjson``: polars' NDJSON scan maps the whole file (peak RSS grew from 0.9 to 4.0 GB
between a 0.8 and a 4 GB log here), stops at the first line that is not JSON, and infers its schema from the first
rows (a field first seen later is dropped without a word). Lines are read here in blocks of ``CHUNK_BYTES`` with
ordinary reads (zstd decompressed block by block by the readers' own checked decompressor), every line decoded by
the readers' decoder (orjson; pyarrow's parser takes lines orjson refuses, such as ``NaN``, two objects on one line
or a bare ``null``, and crashes on a block of ``null`` lines), and the block's object rows parsed against the
caller's schema by pyarrow (a block it refuses, for a value of another type, has no table: its rows are the
caller's to judge one by one); so memory is one block whatever the file's size. Parquet comes in record batches.
The next block or batch is read and decoded on a thread while the current one is judged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypeVar

import numpy as np
import orjson

from .readers import UTF8_BOM, check_text_start, decode_lines

if TYPE_CHECKING:
    import pyarrow

CHUNK_BYTES = 32 << 20  # one block of lines: large enough for the parser's threads, small next to memory
ARROW_BLOCK_BYTES = 4 << 20  # pyarrow parses a block's pieces of this size on its threads
PARQUET_BATCH_ROWS = 16_384
VALUE_BATCH_ROWS = 8_192  # decoded rows (a .json document, a Hub split) re-encoded as lines per batch
Item = TypeVar("Item")
_BLANK = object()

# The rows of a batch at given indices, each as the readers decode it: a value, or a ``BadRow``.
RowsAt = Callable[[list[int]], list[object]]


@dataclass(frozen=True)
class RawBatch:
    """``count`` consecutive rows of a file: ``rows_at`` gives them as the readers decode them, ``table`` (an Arrow
    table or record batch; None when no parser took them) holds the rows ``framed`` (their indices) as columns."""

    count: int
    rows_at: RowsAt
    table: pyarrow.Table | None
    framed: np.ndarray
    size: int = 0  # bytes of the lines read (0 for record batches), to estimate a file's rows


def read_ahead(produce: Callable[[], Item | None]) -> Iterator[Item]:
    """What ``produce`` returns until it returns None, the next one produced on a thread while the caller works
    on the current one: file reads and pyarrow's decoding release the GIL, so they overlap the caller's work."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="read") as reader:
        ahead = reader.submit(produce)
        while (item := ahead.result()) is not None:
            ahead = reader.submit(produce)
            yield item


def file_blocks(path: Path) -> Iterator[bytes]:
    """The file's blocks of CHUNK_BYTES, each read ahead of the parse."""
    with path.open("rb") as handle:
        yield from read_ahead(lambda: handle.read(CHUNK_BYTES) or None)


def line_batches(blocks: Iterable[bytes], file: str | None, schema: pyarrow.Schema) -> Iterator[RawBatch]:
    """Blocks of bytes -> batches of whole lines, each line decoded on the read-ahead thread (orjson holds the
    lock per line only, so it runs while pyarrow and the caller work on the block before). ``file``: the label
    of the file the blocks start (checked as the readers check its start), None for a range after its start."""
    decoded = map(DecodedLines.of, _whole_lines(blocks, file))
    for lines in read_ahead(lambda: next(decoded, None)):
        yield lines.batch(schema)


def _whole_lines(blocks: Iterable[bytes], file: str | None) -> Iterator[bytes]:
    """Blocks of bytes -> blocks of whole lines (a line cut by a block's end waits for the next block). When the
    blocks start the ``file`` (its label), its start is checked as the readers check it (``check_text_start``) and
    the byte order mark an editor may put before its first line is not part of it."""
    pending = b""
    first = file is not None
    for block in blocks:
        if first and file is not None:
            check_text_start(block, file)
            block, first = block.removeprefix(UTF8_BOM), False
        cut = block.rfind(b"\n") + 1
        if cut:
            yield pending + block[:cut] if pending else block[:cut]
            pending = block[cut:]
        else:
            pending += block
    if pending.strip():
        yield pending + b"\n"


@dataclass
class DecodedLines:
    """Whole lines (each ending in a newline), each decoded by the readers' decoder. Lines are views of the
    block and the decoded objects are not kept (memory, and the garbage collector's work): a row the caller
    must judge is decoded again, and those are few."""

    data: bytes
    lines: list[memoryview]  # the lines that are rows (a blank line is none)
    objects: list[int]  # which of them hold an object
    others: dict[int, object]  # the rows not parsed as objects from their line: a BadRow, another value, a marked row

    @classmethod
    def of(cls, data: bytes) -> DecodedLines:
        ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == ord("\n"))
        view = memoryview(data)
        decoded = cls(data, [], [], {})
        start = 0
        for end in ends.tolist():
            line, start = view[start:end], end + 1
            value: object
            try:
                value, parsed = orjson.loads(line), True
            except orjson.JSONDecodeError:  # the readers' verdict: a BadRow, a row behind a mark, or none (blank)
                value, parsed = next(decode_lines([bytes(line)]), _BLANK), False
                if value is _BLANK:
                    continue
            if parsed and isinstance(value, dict):  # a row behind a mark is kept as read: its line is not JSON
                decoded.objects.append(len(decoded.lines))
            else:
                decoded.others[len(decoded.lines)] = value
            decoded.lines.append(line)
        return decoded

    def rows_at(self, indices: list[int]) -> list[object]:
        return [self.others[index] if index in self.others else orjson.loads(self.lines[index]) for index in indices]

    def batch(self, schema: pyarrow.Schema) -> RawBatch:
        """The lines that hold an object parsed by pyarrow (1.5-4x faster than polars' parser, the same table)."""
        objects = self.objects
        if len(objects) == self.data.count(b"\n"):  # every line an object: the block as it is
            table = arrow_lines(self.data, schema)
        else:
            table = arrow_lines(b"".join(bytes(self.lines[index]) + b"\n" for index in objects),
                                schema) if objects else None
        if table is not None and table.num_rows != len(objects):
            table = None
        return RawBatch(len(self.lines), self.rows_at, table, np.array(objects, dtype=np.int64), len(self.data))


def arrow_lines(data: bytes, schema: pyarrow.Schema) -> pyarrow.Table | None:
    """JSON lines parsed by pyarrow against ``schema`` (other fields ignored), or None when it refuses the block or
    a string in it is not UTF-8 (its reader does not check; a frame made of it would not hold)."""
    import pyarrow
    import pyarrow.json

    read = pyarrow.json.ReadOptions(block_size=ARROW_BLOCK_BYTES)
    parse = pyarrow.json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    try:
        table = pyarrow.json.read_json(pyarrow.BufferReader(data), read_options=read, parse_options=parse)
        table.validate(full=True)
    except pyarrow.ArrowException:
        return None
    return table


def value_batches(values: Iterable[object], schema: pyarrow.Schema) -> Iterator[RawBatch]:
    """Decoded rows (a .json document, a Hub split) in batches; the objects that are JSON (a Hub row may hold
    bytes or dates) are parsed by pyarrow as lines, and every row is given as it came."""
    batch: list[object] = []
    for value in values:
        batch.append(value)
        if len(batch) >= VALUE_BATCH_ROWS:
            yield _values_batch(batch, schema)
            batch = []
    if batch:
        yield _values_batch(batch, schema)


def _values_batch(values: list[object], schema: pyarrow.Schema) -> RawBatch:
    lines: list[bytes] = []
    framed: list[int] = []
    for index, value in enumerate(values):
        if isinstance(value, dict):
            try:
                lines.append(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS) + b"\n")
            except orjson.JSONEncodeError:
                continue
            framed.append(index)
    data = b"".join(lines)
    table = arrow_lines(data, schema) if lines else None
    if table is not None and table.num_rows != len(framed):
        table = None
    return RawBatch(len(values), lambda indices: [values[index] for index in indices], table,
                    np.array(framed, dtype=np.int64), len(data))


def block_bounds(path: Path) -> list[int]:
    """Where the batches of a plain line file read whole (``line_batches`` of ``file_blocks``) begin and end:
    after the last newline of each block of CHUNK_BYTES from the start (a block without one joins the next), and
    the end of the file (the last line, when it has no newline)."""
    size = path.stat().st_size
    bounds = [0]
    with path.open("rb") as handle:
        for block_end in range(CHUNK_BYTES, size + CHUNK_BYTES, CHUNK_BYTES):
            cut = _after_last_newline(handle, bounds[-1], min(block_end, size))
            if cut > bounds[-1]:
                bounds.append(cut)
    if bounds[-1] < size:
        bounds.append(size)
    return bounds


def _after_last_newline(handle: BinaryIO, start: int, end: int) -> int:
    """The position after the last newline in bytes ``start`` to ``end`` of a file, else ``start``."""
    window = 1 << 20
    while end > start:
        begin = max(start, end - window)
        handle.seek(begin)
        found = handle.read(end - begin).rfind(b"\n")
        if found >= 0:
            return begin + found + 1
        end = begin
    return start


def bounded_blocks(path: Path, bounds: list[int]) -> Iterator[bytes]:
    """The blocks between ``bounds`` of a file (``block_bounds``), each read ahead of the parse."""
    sizes = iter([end - start for start, end in pairwise(bounds)])
    with path.open("rb") as handle:
        handle.seek(bounds[0])
        yield from read_ahead(lambda: handle.read(next(sizes, 0)) or None)
