"""The decoders of the built-in formats (``sources.formats`` registers them): files -> raw rows, streamed.

A reader yields ``(position, row)`` pairs. ``position`` is the 1-based line for the line formats
(jsonl, jsonl.zst) and the 0-based row index for json and parquet; ``row`` is the decoded value, or a
``BadRow`` when one line cannot be decoded (invalid UTF-8 or invalid JSON), so one bad line never stops
a file. Problems with a whole file (missing, empty, truncated, unparsable) raise ``CorpusError``.

Memory stays flat whatever the number of rows: lines are decoded one at a time, zstd is decompressed
in small chunks and parquet is read one record batch at a time. A ``.json`` file is one JSON document,
so it is parsed whole.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, islice, pairwise
from pathlib import Path
from typing import IO, TYPE_CHECKING

import numpy as np
import orjson

from ..errors import BadRow, CorpusError
from ..layout import open_parquet

if TYPE_CHECKING:
    import pyarrow.parquet

# A .json document that is an object keeps its rows in a list under one of these keys.
JSON_ROW_KEYS = ("data", "rows")

# Compressed bytes per step: zstd hands out whole blocks (up to 128 kB of text each), so one step's output is
# the blocks this much input completes, at most about 32 MB (zstd's largest ratio, a run of one byte): even a
# zstd bomb decompresses in small steps. Smaller steps cost nothing measurable (the decompressor's speed is
# the same from 1 kB to 16 kB).
_ZSTD_READ_SIZE = 1 << 10
# A decompressed line longer than this is skipped (line_too_long) without being held: rows are kilobytes,
# the largest real ones tens of megabytes, and a small .zst file can expand to any size.
MAX_LINE_BYTES = 256 << 20
_PARQUET_BATCH_ROWS = 1024
_READ_BUFFER = 1 << 20  # conversation lines are often several kB: fewer, larger reads
_COUNT_BYTES = 4 << 20  # bytes a line count reads at once (``_newlines_until``)
_NEWLINE = ord("\n")
SCAN_BLOCK_LINES = 256  # lines the fold's scan hands on at once (``scanned_blocks``)
_DETAIL_CHARS = 200
# Smaller files are not worth splitting across processes.
MIN_RANGE_BYTES = 8 << 20
# Editors on Windows start UTF-8 files with a byte order mark; JSON parsers refuse it.
UTF8_BOM = b"\xef\xbb\xbf"
# What a file named as JSON may be instead, by its first bytes (none of which starts a UTF-8 JSON line): read as
# lines, every row of it would be skipped and a run would succeed with none. (magic, what it is, what to do).
_NOT_TEXT = (
    (b"\x1f\x8b", "gzip-compressed", "decompress it (gunzip), or recompress JSON lines as .jsonl.zst"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "decompress it (zstd -d), or name it .jsonl.zst if it holds JSON lines"),
    (b"\xfd7zXZ\x00", "xz-compressed", "decompress it (xz -d)"),
    (b"PK\x03\x04", "a zip archive", "extract it"),
    (b"PAR1", "a parquet file", "name it .parquet"),
)
_BZIP2 = re.compile(rb"BZh[1-9]1AY&SY")  # its magic, the block size, then the first block's magic
# UTF-16 and UTF-32 (with a byte order mark or without): JSON whose first character reads as "{" or "[" in them.
_WIDE_TEXT = (("UTF-32", "utf-32-le", 4), ("UTF-32", "utf-32-be", 4), ("UTF-16", "utf-16-le", 2),
              ("UTF-16", "utf-16-be", 2))
_HEAD_BYTES = 64  # what the checks look at

# Keeps or drops a row by its position before it is decoded (used by take.fraction).
PositionFilter = Callable[[int], bool]
# A format reader yields the kept (position, row) pairs and returns whether the file had any row at all,
# kept or not, so that an empty file is told apart from a file whose rows were all filtered out.
RowReader = Generator[tuple[int, object], None, bool]


def check_text_start(head: bytes, label: str) -> None:
    """Refuse a file named as JSON whose first bytes (``head``) show it is something else: compressed under a plain
    name, a zip archive or a parquet file, or JSON in UTF-16 or UTF-32. A line of other bytes is a bad row, no more.
    """
    for magic, what, remedy in _NOT_TEXT:
        if head.startswith(magic):
            raise CorpusError(f"not UTF-8 JSON: the file is {what} (it starts with bytes {magic.hex(' ')}); {remedy}",
                              file=label)
    if _BZIP2.match(head):
        raise CorpusError("not UTF-8 JSON: the file is bzip2-compressed (it starts with BZh); decompress it (bunzip2)",
                          file=label)
    if b"\0" in head:  # UTF-8 JSON holds no NUL byte; every wide encoding of "{" does
        head = head[:_HEAD_BYTES]
        for name, encoding, width in _WIDE_TEXT:
            text = head[:len(head) - len(head) % width].decode(encoding, errors="replace")
            if text.lstrip("\ufeff \t\r\n")[:1] in ("{", "["):
                raise CorpusError(f"not UTF-8 JSON: the file is {name} text ({encoding.upper()}); the readers take "
                                  f"UTF-8: convert it (iconv -f {encoding.upper()} -t UTF-8)", file=label)


def jsonl_rows(path: Path, label: str, keep: PositionFilter | None) -> RowReader:
    """The rows of a .jsonl file; the file object hands its lines straight to the decoder: the hot path has no
    layer between."""
    with path.open("rb", buffering=_READ_BUFFER) as handle:
        check_text_start(handle.read(_HEAD_BYTES), label)
        handle.seek(0)  # within the buffer the read filled: nothing is read again
        return (yield from _decode_lines(handle, keep))


def zstd_rows(path: Path, label: str, keep: PositionFilter | None) -> RowReader:
    """The rows of a .jsonl.zst file, decompressed in small steps."""
    return (yield from _decode_lines(_checked_start(_zstd_lines(path, label), label), keep))


@dataclass(frozen=True, slots=True)
class LineRange:
    """Bytes ``start`` to ``end`` of a file, cut on line boundaries; ``first_line``: the file's number of the range's
    first line (1-based, as a whole read numbers it)."""

    start: int
    end: int
    first_line: int


def line_ranges(path: Path, parts: int, label: str) -> list[LineRange]:
    """Split a plain .jsonl file into up to ``parts`` byte ranges that start and end on line boundaries,
    each at least MIN_RANGE_BYTES long, so several processes can parse one large file; one that is not UTF-8 text
    is refused here (``check_text_start``), before the processes read it. Each range's first line is counted in the
    one pass that finds the cuts (the file read once up to its last cut), so no reader counts its range's prefix."""
    size = path.stat().st_size
    parts = max(1, min(parts, size // MIN_RANGE_BYTES))
    bounds = [(0, 1)]  # (offset, its line's number)
    with path.open("rb", buffering=_READ_BUFFER) as handle:
        check_text_start(handle.read(_HEAD_BYTES), label)
        handle.seek(0)
        line = 1
        for index in range(1, parts):
            line += _newlines_until(handle, size * index // parts)
            line += handle.readline().count(b"\n")  # move to the start of the next line
            bounds.append((handle.tell(), line))
    bounds.append((size, line))
    return [LineRange(start, end, first_line) for (start, first_line), (end, _) in pairwise(bounds) if end > start]


def iter_line_range(path: Path, span: LineRange, keep: PositionFilter | None = None
                    ) -> Iterator[tuple[int, object]]:
    """``jsonl_rows`` for one range of a plain .jsonl file, with the file's own line numbers."""
    with path.open("rb", buffering=_READ_BUFFER) as handle:
        handle.seek(span.start)
        yield from _decode_lines(_lines_until(handle, span.end - span.start), keep, span.first_line)


def _newlines_until(handle: IO[bytes], offset: int) -> int:
    """The newlines from where an open file is to byte ``offset``, where it is left (none read if it is past);
    counted by numpy (twice the speed of ``bytes.count``: this pass reads most of the file before a build starts)."""
    newlines = 0
    while (remaining := offset - handle.tell()) > 0:
        chunk = handle.read(min(remaining, _COUNT_BYTES))
        if not chunk:
            break
        newlines += int(np.count_nonzero(np.frombuffer(chunk, dtype=np.uint8) == _NEWLINE))
    return newlines


def _lines_until(handle: IO[bytes], length: int) -> Iterator[bytes]:
    while length > 0:
        line = handle.readline()
        if not line:
            return
        length -= len(line)
        yield line


# Stands for a line over MAX_LINE_BYTES; never valid JSON, so only the decoder's error path looks for it.
_OVERLONG_LINE = b"\0 line over MAX_LINE_BYTES"


def _zstd_lines(path: Path, label: str) -> Iterator[bytes]:
    return block_lines(zstd_chunks(path, label))


def block_lines(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of a text given in blocks of bytes (a line may be cut between two), without their newlines; a line
    over MAX_LINE_BYTES is one ``_OVERLONG_LINE``, its bytes never held."""
    # The unfinished line is kept as the chunks it came in and joined once, when its newline arrives:
    # joining it to every chunk would copy a line spanning k chunks k times (quadratic in its length).
    pending: list[bytes] = []
    pending_bytes = 0
    overlong = False  # the current line went over MAX_LINE_BYTES: its bytes are dropped until its end
    for chunk in blocks:
        if b"\n" not in chunk:
            pending.append(chunk)
            pending_bytes += len(chunk)
        else:
            lines = chunk.split(b"\n")
            if overlong:
                lines[0], overlong = _OVERLONG_LINE, False
            elif pending:
                pending.append(lines[0])
                lines[0] = b"".join(pending)
            pending = [lines.pop()]  # no other name holds it, so a reset below frees it at once
            pending_bytes = len(pending[0])
            yield from lines
        if pending_bytes > MAX_LINE_BYTES:
            pending, pending_bytes, overlong = [], 0, True
    if overlong:
        yield _OVERLONG_LINE
    elif pending_bytes:
        yield b"".join(pending)


def zstd_chunks(path: Path, label: str) -> Iterator[bytes]:
    """Decompress frame after frame, and fail on a frame that ends early.

    zstandard's stream_reader returns short data without complaint when the input stops in the middle
    of a frame (a truncated download), so frames are driven by hand and checked for their end.
    """
    import zstandard

    decompressor = zstandard.ZstdDecompressor()
    frame = decompressor.decompressobj()
    frame_started = False
    with path.open("rb") as handle:
        while data := handle.read(_ZSTD_READ_SIZE):
            while data:
                frame_started = True
                try:
                    out = frame.decompress(data)
                except zstandard.ZstdError as error:
                    raise CorpusError(f"corrupt zstd stream: {error}", file=label) from None
                if out:
                    yield out
                if not frame.eof:
                    break
                data = frame.unused_data
                frame = decompressor.decompressobj()
                frame_started = False
    if frame_started:
        raise CorpusError("truncated zstd stream: the last frame ends early (incomplete download?)",
                          file=label)


def _checked_start(lines: Iterable[bytes], label: str) -> Iterator[bytes]:
    """The lines of a file once its first shows it is UTF-8 text (``check_text_start``); ``chain`` hands the rest
    on in C, so the per-line path gains no layer."""
    remaining = iter(lines)
    first = next(remaining, None)
    if first is None:
        return remaining
    check_text_start(first, label)
    return chain((first,), remaining)


def file_lines(path: Path) -> Iterator[bytes]:
    """A plain file's lines, read through one buffer."""
    with path.open("rb", buffering=_READ_BUFFER) as handle:
        yield from handle


def scanned_blocks(path: Path, label: str, lines: Callable[[], Iterable[bytes]],
                   scan: Callable[[bytes], object]) -> Iterator[list[tuple[int, object]]]:
    """The rows of a file of a line format (``lines``: its lines) as its format reads them, each line decoded by
    ``scan`` (the fold's native scan, ``logs.scan_line``: it raises orjson's error on a line that is not JSON), in
    blocks of lines: a block's lines are scanned in one C loop (``map``), and only a block holding a line ``scan``
    refuses (blank, or not JSON) is read line by line again as ``jsonl_rows`` reads it. A block, not a line, goes
    through each generator: the fold's pass is per-request Python."""
    if not path.is_file():
        raise CorpusError("file not found" if not path.exists() else "not a file", file=label)
    remaining = _checked_start(lines(), label)
    number, any_row = 1, False
    failure: Exception | None = None
    while failure is None:
        block: list[bytes] = []
        try:
            block.extend(islice(remaining, SCAN_BLOCK_LINES))  # it keeps what it took before the lines failed
        except Exception as error:  # a cut file: its rows before the failure come first, as line by line
            failure = error
        if not block:
            break
        try:
            rows = list(enumerate(map(scan, block), number))
        except orjson.JSONDecodeError:
            rows = list(_decode_lines(block, None, number, decode=scan))
        number += len(block)
        if rows:
            any_row = True
            yield rows
    if failure is not None:
        raise failure
    if not any_row:
        raise CorpusError("file has no rows", file=label)


def _decode_lines(lines: Iterable[bytes], keep: PositionFilter | None, first_line: int = 1,
                  decode: Callable[[bytes], object] = orjson.loads) -> RowReader:
    loads = decode
    any_row = False
    for number, line in enumerate(lines, first_line):
        if keep is not None and not keep(number):
            if line and not line.isspace():
                any_row = True
            continue
        try:
            row = loads(line)
        except orjson.JSONDecodeError as error:
            row = _refused_line(line, error)
            if row is _BLANK:
                continue  # blank lines separate nothing and are not rows
        any_row = True
        yield number, row
    return any_row


def decode_lines(lines: Iterable[bytes]) -> Iterator[object]:
    """The rows of ``lines`` as ``jsonl_rows`` decodes a line format's (a value, or a ``BadRow``; a blank line is
    no row), for a reader that cuts the lines itself."""
    return (row for _, row in _decode_lines(lines, None))


# A refused line that holds no row (blank, or a byte order mark alone).
_BLANK = object()


def _refused_line(line: bytes, error: orjson.JSONDecodeError) -> object:
    """What a line the decoder refused holds: the row behind a byte order mark (a file's first line, or the first
    line of each file of several concatenated into one: ``cat`` keeps their marks), nothing (``_BLANK``) when it is
    blank, else a ``BadRow``. Only refused lines are looked at: the per-line path gains nothing."""
    if line.startswith(UTF8_BOM):
        line = line[len(UTF8_BOM):]
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError as behind:
            error = behind
    if not line.strip():
        return _BLANK
    return _undecodable(line, error)


def _undecodable(line: bytes, error: orjson.JSONDecodeError) -> BadRow:
    if line is _OVERLONG_LINE:
        return BadRow("line_too_long", f"more than {MAX_LINE_BYTES:,} bytes")
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as bad:
        return BadRow("invalid_utf8", f"byte {bad.start}")
    return BadRow("invalid_json", str(error)[:_DETAIL_CHARS])


def _json_document_rows(path: Path, label: str) -> list[object]:
    content = path.read_bytes()
    try:
        document = orjson.loads(content.removeprefix(UTF8_BOM))
    except orjson.JSONDecodeError as error:
        check_text_start(content[:_HEAD_BYTES], label)  # what the file is instead, when its start says
        raise CorpusError(f"not valid JSON: {error.msg}", file=label, line=error.lineno) from None
    if isinstance(document, list):
        return document
    if isinstance(document, dict):
        for key in JSON_ROW_KEYS:
            rows = document.get(key)
            if isinstance(rows, list):
                return rows
    raise CorpusError(
        "a .json source must be an array of rows or an object with the rows in a list under "
        + " or ".join(f"'{key}'" for key in JSON_ROW_KEYS) + " (use .jsonl for one row per line)",
        file=label)


def json_rows(path: Path, label: str, keep: PositionFilter | None) -> RowReader:
    """The rows of a .json document (parsed whole: it is one JSON document)."""
    rows = _json_document_rows(path, label)
    for index, row in enumerate(rows):
        if keep is None or keep(index):
            yield index, row
    return bool(rows)


def checked_parquet(path: Path, label: str) -> pyarrow.parquet.ParquetFile:
    """The parquet file opened to be streamed, or a located error when it cannot be."""
    import pyarrow

    try:
        return open_parquet(path)
    except (pyarrow.ArrowException, OSError, ValueError) as error:  # ValueError: a column name not UTF-8
        raise CorpusError(f"cannot read parquet: {error}", file=label) from None


def parquet_rows(path: Path, label: str, keep: PositionFilter | None) -> RowReader:
    """The rows of a parquet file, one record batch at a time, each row a dict of its columns."""
    import pyarrow

    parquet = checked_parquet(path, label)
    index = 0
    try:
        for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS):
            for row in batch.to_pylist():
                if keep is None or keep(index):
                    yield index, row
                index += 1
    except (pyarrow.ArrowException, OSError, ValueError) as error:
        # ValueError: a damaged string fails to decode (UnicodeDecodeError) when a batch becomes rows.
        raise CorpusError(f"cannot read parquet after row {index}: {error}", file=label) from None
    return index > 0
