"""What the audit reads, as a stream of bounded chunks: a built corpus's shards, or serving traffic (a file,
a glob of daily logs, a recipe's sources, a Hub dataset or its local mirror).

A chunk is a polars frame of raw rows plus a way to get the chunk's rows at given indices as normalised
``Conversation``s (the source readers' ``RowNormaliser``, or the corpus's own row form): the facts of every
row come from the frame, the token measures of the sampled rows from the conversations, in one read.

Why chunks and not ``pl.scan_ndjson``: polars' NDJSON scan maps the whole file (peak RSS grew from 0.9 to
4.0 GB between a 0.8 and a 4 GB log here), stops at the first line that is not JSON, and infers its schema
from the first rows (a field first seen later is dropped without a word). Lines are read here in blocks of
``CHUNK_BYTES`` with ordinary reads (zstd decompressed block by block by the readers' own checked
decompressor), parsed against ``frames.RAW_SCHEMA`` by pyarrow (or polars, for a block pyarrow refuses), and
a block both refuse is parsed line by line, its bad lines skipped and counted by the readers' reasons; so
memory is one block whatever the log's size. Parquet, corpus shards included, comes in record batches. The
next block or batch is read and decoded on a thread while the current one is judged.
"""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import orjson
import polars as pl

from ..errors import BadRow, CorpusError, Skipped
from ..layout import Corpus
from ..recipe.model import HubRef, Mapping
from ..records import Conversation, RepairRules
from ..rows import batch_to_conversations
from ..sources.mappings import RowNormaliser
from ..sources.readers import UTF8_BOM, detect_format, iter_rows, zstd_chunks
from .frames import RAW_SCHEMA

CHUNK_BYTES = 32 << 20  # one block of log lines: large enough for the parser's threads, small next to memory
ARROW_BLOCK_BYTES = 4 << 20  # pyarrow parses a block's pieces of this size on its threads
PARQUET_BATCH_ROWS = 16_384
DICT_BATCH_ROWS = 8_192  # rows of a .json document or a Hub split, re-encoded as lines per chunk
TRAFFIC_SOURCE = "traffic"
Item = TypeVar("Item")
_WHITESPACE = np.frombuffer(b" \t\r\x0b\x0c", dtype=np.uint8)

# The chunk's rows at these indices, normalised: (which of the indices, a conversation of that row or why it
# has none). A row the readers' repairs split gives several conversations.
RowsAt = Callable[[np.ndarray], list[tuple[int, Conversation | Skipped]]]


@dataclass
class Chunk:
    frame: pl.DataFrame  # raw rows: frames.RAW_SCHEMA for line formats, the file's own columns for parquet
    conversations: RowsAt
    skipped: Counter[str] = field(default_factory=Counter)  # lines that never reached the frame, by reason
    bytes: int = 0  # bytes of the lines read (0 for record batches), to estimate a log's rows


@dataclass(frozen=True)
class Unit:
    """One file, shard set or Hub split: how its rows are named and read."""

    label: str  # the file or Hub split, as messages name it
    source: str | None  # the rows' source name; None: the frame's own ``source`` column (a corpus)
    task: str | None  # task tag of rows without a ``task`` field (a recipe source's tag)
    turns_field: str | None  # the field with the turns when a recipe's mapping names one
    chunks: Callable[[], Iterator[Chunk]]
    rows: int | None = None  # known row count (parquet metadata, a corpus manifest)
    size: int = 0  # bytes on disk, to estimate the rows of a log before reading it


def corpus_units(corpus: Corpus) -> list[Unit]:
    """A built corpus: its shards as one unit (rows in their own row form, no normalising needed)."""
    def chunks() -> Iterator[Chunk]:
        batches = corpus.iter_batches(batch_size=PARQUET_BATCH_ROWS)
        for batch in _read_ahead(lambda: next(batches, None)):
            yield Chunk(pl.from_arrow(batch), _corpus_rows(batch))  # type: ignore[arg-type]
    return [Unit(str(corpus.root), None, None, None, chunks, rows=int(corpus.manifest["conversations"]))]


def _corpus_rows(batch: Any) -> RowsAt:
    def rows_at(indices: np.ndarray) -> list[tuple[int, Conversation | Skipped]]:
        return list(enumerate(batch_to_conversations(batch.take(indices))))
    return rows_at


def traffic_units(where: str) -> list[Unit]:
    """Serving traffic: ``hf://datasets/ORG/NAME[/SPLIT]`` (streamed by ``datasets``, or read from
    ``CORPUS_HUB_MIRROR``, as a hub source is), a recipe (``.yaml``: its sources, their task tags, mappings
    and repairs), or a file or glob of files (.jsonl, .jsonl.zst, .json, .parquet)."""
    if where.startswith("hf://"):
        return [_hub_unit(_hub_ref(where), TRAFFIC_SOURCE, None, Mapping(), RepairRules())]
    if where.endswith((".yaml", ".yml")):
        return _recipe_units(Path(where))
    from ..recipe import match_source_pattern

    paths = match_source_pattern(Path.cwd(), where)
    if not paths:
        raise CorpusError("matches no file", file=where)
    return [_file_unit(path, path.name, TRAFFIC_SOURCE, None, Mapping(), RepairRules()) for path in paths]


def traffic_inputs(where: str) -> list[str | Path]:
    """The local paths reading ``where`` reads: a recipe and its sources' files, or the file or glob itself."""
    if where.startswith("hf://") or not where.endswith((".yaml", ".yml")):
        return [where]
    from ..recipe import load_recipe
    from ..sources import resolve_paths

    recipe = load_recipe(Path(where))
    files = [path for spec in recipe.sources if spec.hub is None for path in resolve_paths(spec, recipe.base_dir)]
    return [where, *files]


def _hub_ref(where: str) -> HubRef:
    parts = where.removeprefix("hf://").removeprefix("datasets/").strip("/").split("/")
    if len(parts) not in (2, 3) or not all(parts):
        raise CorpusError("a Hub traffic dataset is hf://datasets/ORG/NAME or hf://datasets/ORG/NAME/SPLIT",
                          file=where)
    return HubRef(id="/".join(parts[:2]), split=parts[2] if len(parts) == 3 else "train")


def _recipe_units(path: Path) -> list[Unit]:
    from ..recipe import load_recipe
    from ..sources import resolve_paths

    recipe = load_recipe(path)
    units: list[Unit] = []
    for spec in recipe.sources:
        if spec.hub is not None:
            units.append(_hub_unit(spec.hub, spec.name, spec.task, spec.mapping, spec.repair))
            continue
        for file in resolve_paths(spec, recipe.base_dir):
            units.append(_file_unit(file, file.name, spec.name, spec.task, spec.mapping, spec.repair, spec.format))
    return units


def _file_unit(path: Path, label: str, source: str, task: str | None, mapping: Mapping, repair: RepairRules,
               fmt: str = "auto") -> Unit:
    fmt = detect_format(path, fmt)
    if not path.is_file():
        raise CorpusError("file not found", file=str(path))
    size = path.stat().st_size
    field_name = mapping.field if mapping.style != "field" else None
    if fmt == "parquet":
        return Unit(label, source, task, field_name, lambda: _parquet_chunks(path, label, mapping, repair),
                    rows=_parquet_rows(path, label), size=size)
    if fmt == "jsonl":
        blocks: Callable[[], Iterable[bytes]] = lambda: _file_blocks(path)  # noqa: E731
    elif fmt == "jsonl.zst":
        blocks = lambda: zstd_chunks(path, label)  # noqa: E731
        size = _zstd_content_size(path) or size
    else:  # a .json document: its rows, decoded by the readers, as lines
        return Unit(label, source, task, field_name,
                    lambda: _dict_chunks((row for _, row in iter_rows(path, fmt, label)), mapping, repair),
                    size=size)
    return Unit(label, source, task, field_name, lambda: _line_chunks(blocks(), mapping, repair), size=size)


def _zstd_content_size(path: Path) -> int:
    """The decompressed size a zstd file's (first) frame header records, or 0 when it records none."""
    import zstandard

    with path.open("rb") as handle:
        header = handle.read(18)  # the longest frame header
    try:
        size = zstandard.frame_content_size(header)
    except zstandard.ZstdError:
        return 0
    return max(size, 0)


def _hub_unit(ref: HubRef, source: str, task: str | None, mapping: Mapping, repair: RepairRules) -> Unit:
    from ..sources.hub import hub_label, iter_hub_rows

    label = hub_label(ref)
    return Unit(label, source, task, mapping.field if mapping.style != "field" else None,
                lambda: _dict_chunks((row for _, row in iter_hub_rows(ref, source)), mapping, repair))


def _read_ahead(produce: Callable[[], Item | None]) -> Iterator[Item]:
    """What ``produce`` returns until it returns None, the next one produced on a thread while the caller works
    on the current one: file reads and pyarrow's decoding release the GIL, so they overlap the polars work."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="read") as reader:
        ahead = reader.submit(produce)
        while (item := ahead.result()) is not None:
            ahead = reader.submit(produce)
            yield item


def _file_blocks(path: Path) -> Iterator[bytes]:
    """The file's blocks, each read ahead of the parse."""
    with path.open("rb") as handle:
        yield from _read_ahead(lambda: handle.read(CHUNK_BYTES) or None)


def _line_chunks(blocks: Iterable[bytes], mapping: Mapping, repair: RepairRules) -> Iterator[Chunk]:
    """Blocks of bytes -> chunks of whole lines (a line cut by a block's end waits for the next block); the
    byte order mark an editor may put before the first line is not part of it."""
    pending = b""
    first = True
    for block in blocks:
        if first:
            block, first = block.removeprefix(UTF8_BOM), False
        cut = block.rfind(b"\n") + 1
        if cut:
            yield _lines_chunk(pending + block[:cut] if pending else block[:cut], mapping, repair)
            pending = block[cut:]
        else:
            pending += block
    if pending.strip():
        yield _lines_chunk(pending + b"\n", mapping, repair)


def _lines_chunk(data: bytes, mapping: Mapping, repair: RepairRules) -> Chunk:
    """Whole lines (each ending in a newline) as a frame: row i is the i-th line that is not blank.

    pyarrow's JSON reader parses a block against the schema 1.5-4x faster than polars' (the same frame); a
    block it refuses (a value of another type, bad UTF-8, a line that is not an object) goes to polars, which
    casts what it can, and a block polars refuses too is parsed line by line."""
    frame = _arrow_lines(data)
    if frame is not None:
        return Chunk(frame, _raw_rows(_line_at(data), mapping, repair), bytes=len(data))
    try:
        return Chunk(pl.read_ndjson(data, schema=RAW_SCHEMA, ignore_errors=True),
                     _raw_rows(_line_at(data), mapping, repair), bytes=len(data))
    except pl.exceptions.PolarsError:  # some line is not a JSON object: find them, keep the rest
        lines, skipped = _json_objects(line for line in data.split(b"\n") if line.strip())
        frame = pl.read_ndjson(b"\n".join(lines), schema=RAW_SCHEMA, ignore_errors=True) if lines \
            else pl.DataFrame(schema=RAW_SCHEMA)
        return Chunk(frame, _raw_rows(lambda index: orjson.loads(lines[index]), mapping, repair), skipped,
                     len(data))


def _arrow_lines(data: bytes) -> pl.DataFrame | None:
    """The block parsed by pyarrow against ``RAW_SCHEMA`` (other fields ignored), or None when it refuses the
    block or a string in it is not UTF-8 (its reader does not check; polars would panic on the frame)."""
    import pyarrow
    import pyarrow.json

    read = pyarrow.json.ReadOptions(block_size=ARROW_BLOCK_BYTES)
    parse = pyarrow.json.ParseOptions(explicit_schema=_arrow_schema(), unexpected_field_behavior="ignore")
    try:
        table = pyarrow.json.read_json(pyarrow.BufferReader(data), read_options=read, parse_options=parse)
        table.validate(full=True)
    except pyarrow.ArrowException:
        return None
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


@functools.cache
def _arrow_schema() -> Any:
    import pyarrow

    def arrow_type(dtype: object) -> Any:  # a polars type or type class (a list's inner type may be either)
        if isinstance(dtype, pl.List):
            return pyarrow.list_(arrow_type(dtype.inner))
        if isinstance(dtype, pl.Struct):
            return pyarrow.struct([(part.name, arrow_type(part.dtype)) for part in dtype.fields])
        if dtype == pl.Boolean:
            return pyarrow.bool_()
        assert dtype == pl.String, dtype
        return pyarrow.string()
    return pyarrow.schema([(name, arrow_type(dtype)) for name, dtype in RAW_SCHEMA.items()])


def _line_at(data: bytes) -> Callable[[int], Any]:
    """The decoded i-th non-blank line; the line bounds are found the first time a row is asked for (only
    the token sample needs them)."""
    bounds: list[np.ndarray] = []

    def line_at(index: int) -> Any:
        if not bounds:
            raw = np.frombuffer(data, dtype=np.uint8)
            ends = np.flatnonzero(raw == ord("\n"))
            starts = np.concatenate(([0], ends[:-1] + 1))
            filled = ends > starts
            # A line that starts with whitespace may be blank (polars skips it); only those are looked at.
            for line in np.flatnonzero(filled & np.isin(raw[np.minimum(starts, len(raw) - 1)], _WHITESPACE)):
                filled[line] = bool(data[starts[line]:ends[line]].strip())
            bounds.append(np.stack((starts[filled], ends[filled]), axis=1))
        start, end = bounds[0][index]
        return orjson.loads(data[start:end])
    return line_at


def _json_objects(lines: Iterable[bytes]) -> tuple[list[bytes], Counter[str]]:
    """The lines that hold a JSON object, and the others counted by the readers' reasons."""
    kept: list[bytes] = []
    skipped: Counter[str] = Counter()
    for line in lines:
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                skipped["invalid_utf8"] += 1
            else:
                skipped["invalid_json"] += 1
            continue
        if isinstance(value, dict):
            kept.append(line)
        else:
            skipped["not_an_object"] += 1
    return kept, skipped


def _dict_chunks(rows: Iterable[Any], mapping: Mapping, repair: RepairRules) -> Iterator[Chunk]:
    """Decoded rows (a .json document, a Hub split) as line chunks; bad rows are counted as they come."""
    lines: list[bytes] = []
    skipped: Counter[str] = Counter()
    for row in rows:
        if isinstance(row, BadRow):
            skipped[row.reason] += 1
        elif not isinstance(row, dict):
            skipped["not_an_object"] += 1
        else:
            lines.append(orjson.dumps(row, option=orjson.OPT_NON_STR_KEYS))
        if len(lines) >= DICT_BATCH_ROWS:
            yield _counted(_lines_chunk(b"\n".join(lines) + b"\n", mapping, repair), skipped)
            lines, skipped = [], Counter()
    if lines or skipped:
        yield _counted(_lines_chunk(b"\n".join(lines) + b"\n" if lines else b"", mapping, repair), skipped)


def _counted(chunk: Chunk, skipped: Counter[str]) -> Chunk:
    chunk.skipped.update(skipped)
    return chunk


def _parquet_rows(path: Path, label: str) -> int:
    import pyarrow
    import pyarrow.parquet as pq

    try:
        return int(pq.ParquetFile(path).metadata.num_rows)
    except (pyarrow.ArrowException, OSError) as error:
        raise CorpusError(f"cannot read parquet: {error}", file=label) from None


def _parquet_chunks(path: Path, label: str, mapping: Mapping, repair: RepairRules) -> Iterator[Chunk]:
    """Record batches, each decoded ahead of the facts; without pre-buffering: a pre-buffering reader keeps
    what it read of every row group until it is closed (RSS grew by ~60 MB a row group, to 9.7 GB over a
    10M-row log; flat without)."""
    import pyarrow
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(path, pre_buffer=False).iter_batches(batch_size=PARQUET_BATCH_ROWS)
        for batch in _read_ahead(lambda: next(batches, None)):
            yield Chunk(pl.from_arrow(batch),  # type: ignore[arg-type]
                        _raw_rows(_batch_row(batch), mapping, repair))
    except (pyarrow.ArrowException, OSError) as error:
        raise CorpusError(f"cannot read parquet: {error}", file=label) from None


def _batch_row(batch: Any) -> Callable[[int], Any]:
    return lambda index: batch.slice(index, 1).to_pylist()[0]


def _raw_rows(row_at: Callable[[int], Any], mapping: Mapping, repair: RepairRules) -> RowsAt:
    """Normalise the chunk's rows at given indices with the readers' ``RowNormaliser`` and repairs (one per
    chunk: it fixes the layout from the first row it recognises, as the readers do per file)."""
    normalise = RowNormaliser(mapping, "replay", repair=repair)

    def rows_at(indices: np.ndarray) -> list[tuple[int, Conversation | Skipped]]:
        out: list[tuple[int, Conversation | Skipped]] = []
        for position, index in enumerate(indices.tolist()):
            try:
                parts = normalise(row_at(index))
            except BadRow as bad:
                out.append((position, Skipped(TRAFFIC_SOURCE, bad.reason, f"row {index}", bad.detail)))
                continue
            out += [(position, Conversation(id=f"{index}/{number}", source=TRAFFIC_SOURCE, origin="replay",
                                            messages=part.messages, flags=part.flags, tools=part.tools))
                    for number, part in enumerate(parts)]
        return out
    return rows_at


def sample_mask(label: str, first_row: int, count: int, share: float, seed: int) -> np.ndarray:
    """Which of rows ``first_row .. first_row + count`` of a unit the token pass measures: a seeded hash of
    (unit, row index) under ``share`` of the range, so the sample depends on neither chunking nor order."""
    if share >= 1:
        return np.ones(count, dtype=bool)
    salt = int.from_bytes(hashlib.blake2b(f"{seed}\x1f{label}".encode(), digest_size=8).digest(), "big")
    with np.errstate(over="ignore"):
        x = np.arange(first_row, first_row + count, dtype=np.uint64) + np.uint64(salt)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)  # splitmix64's finaliser
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    threshold: np.ndarray = x < np.uint64(int(share * float(1 << 64)) if share > 0 else 0)
    return threshold


def estimated_rows(units: Sequence[Unit], first_chunk_rows: int, first_chunk_bytes: int) -> int:
    """Rows of the units: exact where known, else their bytes at the density of the first chunk read."""
    density = first_chunk_rows / first_chunk_bytes if first_chunk_bytes else 0.0
    return sum(unit.rows if unit.rows is not None else round(unit.size * density) for unit in units)
