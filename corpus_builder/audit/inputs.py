"""What the audit reads, as a stream of bounded chunks: a built corpus's shards, or serving traffic (a file,
a glob of daily logs, a recipe's sources, a Hub dataset or its local mirror).

A chunk is a polars frame of rows plus a way to get the chunk's rows at given indices as normalised
``Conversation``s (the source readers' ``RowNormaliser``, or the corpus's own row form): the facts of every
row come from the frame, the token measures of the sampled rows from the conversations, in one read.

Traffic is read by the readers' rules, so the audit of a log counts and skips exactly the rows ``corpus audit
FILE`` does, for the same reasons: every line is decoded by the readers' decoder (orjson; pyarrow's parser
takes lines orjson refuses, such as ``NaN``, two objects on one line or a bare ``null``, and crashes on a block
of ``null`` lines), one ``RowNormaliser`` per file fixes the layout, and only the rows it would take exactly
as they are (``frames.plain_rows``, most rows of a log) keep their facts in the parsed frame. Every other row
goes through the normaliser, and the facts of the conversations it makes are read in the corpus's row form
(``Chunk.normalised``), as a corpus's are.

Why chunks and not ``pl.scan_ndjson``: polars' NDJSON scan maps the whole file (peak RSS grew from 0.9 to
4.0 GB between a 0.8 and a 4 GB log here), stops at the first line that is not JSON, and infers its schema
from the first rows (a field first seen later is dropped without a word). Lines are read here in blocks of
``CHUNK_BYTES`` with ordinary reads (zstd decompressed block by block by the readers' own checked
decompressor), and the block's object rows parsed against ``frames.RAW_SCHEMA`` by pyarrow (a block it
refuses, for a value of another type, is the normaliser's); so memory is one block whatever the log's size.
Parquet, corpus shards included, comes in record batches. The next block or batch is read and decoded on a
thread while the current one is judged.
"""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np
import orjson
import polars as pl

from ..errors import BadRow, CorpusError, Skipped
from ..layout import Corpus
from ..recipe.model import Fold, HubRef, Mapping
from ..records import Conversation, Provenance, RepairRules
from ..rows import batch_to_conversations, conversations_to_batch
from ..screen.normalise import mix64
from ..sources.fold import Held, PrefixFold, carry
from ..sources.logs import read_exchange
from ..sources.mappings import TURN_KEYS, Layout, NormalisedRow, RowNormaliser, detect_layout
from ..sources.readers import (
    UTF8_BOM,
    check_text_start,
    decode_lines,
    detect_format,
    first_objects,
    iter_rows,
    zstd_chunks,
)
from .frames import RAW_SCHEMA, plain_rows

CHUNK_BYTES = 32 << 20  # one block of log lines: large enough for the parser's threads, small next to memory
ARROW_BLOCK_BYTES = 4 << 20  # pyarrow parses a block's pieces of this size on its threads
PARQUET_BATCH_ROWS = 16_384
DICT_BATCH_ROWS = 8_192  # rows of a .json document or a Hub split, re-encoded as lines per chunk
TRAFFIC_SOURCE = "traffic"
Item = TypeVar("Item")
_BLANK = object()

# The chunk's rows at these indices, normalised: (which of the indices, a conversation of that row or why it
# has none). A row the readers' repairs split gives several conversations.
RowsAt = Callable[[np.ndarray], list[tuple[int, Conversation | Skipped]]]


@dataclass
class Chunk:
    # Rows whose facts are read from them: a corpus's rows, or the traffic rows the readers take as they are
    # (frames.RAW_SCHEMA for line formats, the file's own columns for parquet).
    frame: pl.DataFrame
    conversations: RowsAt  # of the frame's rows, then the normalised ones
    skipped: Counter[str] = field(default_factory=Counter)  # rows the readers skip, by reason
    bytes: int = 0  # bytes of the lines read (0 for record batches), to estimate a log's rows
    turns_field: str | None = None  # the frame's field with the turns (None: conversations or messages)
    normalised: pl.DataFrame | None = None  # the other traffic rows' conversations, in the row form
    folded: int = 0  # logged requests folded into a later request of their conversation (sources.fold)
    models: Counter[str] = field(default_factory=Counter)  # logged requests by the model that served them

    @property
    def rows(self) -> int:
        """Rows whose facts the chunk gives: the frame's, then the normalised ones."""
        return self.frame.height + (self.normalised.height if self.normalised is not None else 0)


@dataclass(frozen=True)
class Unit:
    """One file, shard set or Hub split: how its rows are named and read."""

    label: str  # the file or Hub split, as messages name it
    source: str | None  # the rows' source name; None: the frame's own ``source`` column (a corpus)
    task: str | None  # task tag of rows without a ``task`` field (a recipe source's tag)
    chunks: Callable[[], Iterator[Chunk]]
    rows: int | None = None  # known row count (parquet metadata, a corpus manifest)
    size: int = 0  # bytes on disk, to estimate the rows of a log before reading it
    fold: SourceFold | None = None  # the fold its source's files share
    logged: Callable[[], bool] | None = None  # whether its rows are logged requests (None: never)
    ranges: Callable[[int], list[Unit]] | None = None  # the file as up to N ranges read apart (``_range_units``)
    # The place of its first row among its file's rows (a range's; the token sample is keyed by it). None: a range
    # after its file's first, placed once the ranges before it are counted.
    first_row: int | None = 0


def corpus_units(corpus: Corpus) -> list[Unit]:
    """A built corpus: its shards as one unit (rows in their own row form, no normalising needed)."""
    def chunks() -> Iterator[Chunk]:
        batches = corpus.iter_batches(batch_size=PARQUET_BATCH_ROWS)
        for batch in _read_ahead(lambda: next(batches, None)):
            yield Chunk(pl.from_arrow(batch), _corpus_rows(batch))  # type: ignore[arg-type]
    return [Unit(str(corpus.root), None, None, chunks, rows=corpus.manifest.conversations)]


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
    fold = SourceFold(Fold(), len(paths))
    return [_file_unit(path, path.name, TRAFFIC_SOURCE, None, Mapping(), RepairRules(), fold=fold) for path in paths]


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
            units.append(_hub_unit(spec.hub, spec.name, spec.task, spec.mapping, spec.repair, spec.fold))
            continue
        files = resolve_paths(spec, recipe.base_dir)
        fold = SourceFold(spec.fold, len(files))
        units += [_file_unit(file, file.name, spec.name, spec.task, spec.mapping, spec.repair, spec.format, fold)
                  for file in files]
    return units


def _file_unit(path: Path, label: str, source: str, task: str | None, mapping: Mapping, repair: RepairRules,
               fmt: str = "auto", fold: SourceFold | None = None) -> Unit:
    fmt = detect_format(path, fmt)
    if not path.is_file():
        raise CorpusError("file not found", file=str(path))
    size = path.stat().st_size
    def rows() -> TrafficRows:
        return TrafficRows(label, mapping, repair, fold=fold)

    logged = functools.partial(_logged_file, path, fmt, label, mapping)
    if fmt == "parquet":
        return Unit(label, source, task, lambda: _parquet_chunks(path, rows()), rows=_parquet_rows(path, label),
                    size=size, fold=fold, logged=logged)
    if fmt == "jsonl":
        return Unit(label, source, task, lambda: _line_chunks(_file_blocks(path), rows()), size=size, fold=fold,
                    logged=logged, ranges=functools.partial(_range_units, path, label, source, task, mapping, repair))
    if fmt == "jsonl.zst":
        return Unit(label, source, task, lambda: _line_chunks(zstd_chunks(path, label), rows()),
                    size=_zstd_content_size(path) or size, fold=fold, logged=logged)
    # a .json document: its rows, decoded by the readers
    return Unit(label, source, task, lambda: _dict_chunks((row for _, row in iter_rows(path, fmt, label)), rows()),
                size=size, fold=fold, logged=logged)


def _logged_file(path: Path, fmt: str, label: str, mapping: Mapping) -> bool:
    """Whether a file's rows may be logged requests: its layout (``_file_layout``) is the log's. A file whose start
    cannot be read may be: read with its source's other files in order, its problem is met where a reading of
    them all meets it."""
    try:
        layout = _file_layout(path, fmt, label, mapping)
    except CorpusError:
        return True
    return layout is not None and layout.style == "log"


def _file_layout(path: Path, fmt: str, label: str, mapping: Mapping) -> Layout | None:
    """A file's layout, fixed by the first row that shows one (as ``RowNormaliser`` fixes it), read from the file's
    start until such a row; None when no row shows one."""
    return next((layout for row in first_objects(path, fmt, label)
                 if (layout := detect_layout(row, mapping)) is not None), None)


def _range_units(path: Path, label: str, source: str, task: str | None, mapping: Mapping, repair: RepairRules,
                 parts: int) -> list[Unit]:
    """A plain .jsonl file as up to ``parts`` units of consecutive chunks, read apart; none when it is one chunk,
    its rows are logged requests (they fold across the file) or no row shows a layout (an unreadable or empty
    file, read whole: its problem is met where a whole reading meets it). The chunks are those of a reading of the
    whole file (``_chunk_bounds``), so every chunk has the same rows in the same order and the rows the same places
    in the file; the ranges after the first start with the layout the file's first rows fix, as the readers fix it
    for the whole file. A range has no fold of its source's (it folds nothing) and never finds the file empty."""
    bounds = _chunk_bounds(path)
    chunks = len(bounds) - 1
    count = min(parts, chunks)
    if count < 2:
        return []
    try:
        layout = _file_layout(path, "jsonl", label, mapping)
    except CorpusError:
        return []
    if layout is None or layout.style == "log":
        return []
    edges = [chunks * number // count for number in range(count + 1)]  # chunk indices: about as many per range
    return [Unit(label, source, task, functools.partial(_range_chunks, path, bounds[first:last + 1], label, mapping,
                                                         repair, layout if first else None),
                 size=bounds[last] - bounds[first], first_row=0 if first == 0 else None)
            for first, last in pairwise(edges)]


def _chunk_bounds(path: Path) -> list[int]:
    """Where the chunks of a plain .jsonl file read whole (``_line_chunks`` of ``_file_blocks``) begin and end:
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


def _range_chunks(path: Path, bounds: list[int], label: str, mapping: Mapping, repair: RepairRules,
                  layout: Layout | None) -> Iterator[Chunk]:
    """The chunks between ``bounds`` of a plain .jsonl file, each read as a block of its own."""
    def blocks() -> Iterator[bytes]:
        sizes = iter([end - start for start, end in pairwise(bounds)])
        with path.open("rb") as handle:
            handle.seek(bounds[0])
            yield from _read_ahead(lambda: handle.read(next(sizes, 0)) or None)

    rows = TrafficRows(label, mapping, repair, required=False, layout=layout)
    return _line_chunks(blocks(), rows, starts_file=bounds[0] == 0)


def read_parts(units: Sequence[Unit], cut: int = 0) -> list[list[Unit]]:
    """The units in parts that can be read apart (each by its own ``TrafficRows``, on a cluster by separate tasks)
    and give what one reading in order gives: each unit alone, but the files of a source that folds logged
    requests across its files (a chat may go on in the next day's log: ``SourceFold``) together, in order, when
    one of them is logged requests. Files whose rows are not logged requests fold nothing: alone, they are read
    as they would be among the others. With ``cut``, a unit alone that can be is cut into up to ``cut`` ranges
    (``Unit.ranges``), a part each."""
    parts: list[list[Unit]] = []
    for unit in units:
        fold = unit.fold
        if parts and fold is not None and parts[-1][0].fold is fold:
            parts[-1].append(unit)  # the source's files, split below unless the fold joins them
        else:
            parts.append([unit])
    split: list[list[Unit]] = []
    for part in parts:
        fold = part[0].fold
        joined = len(part) > 1 and fold is not None and fold.fold is not None and any(
            unit.logged is not None and unit.logged() for unit in part)
        split += [part] if joined else [[unit] for unit in part]
    if cut < 2:
        return split
    ranged: list[list[Unit]] = []
    for part in split:
        pieces = part[0].ranges(cut) if len(part) == 1 and part[0].ranges is not None else []
        ranged += [[piece] for piece in pieces] if pieces else [part]
    return ranged


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


def _hub_unit(ref: HubRef, source: str, task: str | None, mapping: Mapping, repair: RepairRules,
              fold: Fold | None = None) -> Unit:
    from ..sources.hub import hub_label, iter_hub_rows

    label = hub_label(ref)
    return Unit(label, source, task, lambda: _dict_chunks(
        (row for _, row in iter_hub_rows(ref, source)),
        TrafficRows(label, mapping, repair, required=False, fold=SourceFold(fold or Fold(), 1))))


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


class SourceFold:
    """The fold of one traffic source's logged requests (``sources.fold``), shared by its files as the build's is
    (a chat may go on in the next day's log), and closed with the last of them."""

    def __init__(self, fold: Fold, files: int) -> None:
        self.fold: PrefixFold[int] | None = PrefixFold(fold.max_open) if fold.enabled else None
        self.files_left = files


class TrafficRows:
    """One traffic unit's rows as the source readers take them, chunk after chunk: one ``RowNormaliser`` for the
    unit (its layout fixed by the first row it recognises, as the readers fix it per file). The rows it would
    take exactly as they are (``frames.plain_rows``) keep their facts in the parsed frame; every other row is
    normalised here, skipped or turned into conversations whose facts are read in the row form. Logged requests
    are folded into one conversation per chat (``fold``), as the readers fold them: a chunk holds the
    conversations that closed while it was read, and the last file's final chunk those still open."""

    def __init__(self, label: str, mapping: Mapping, repair: RepairRules, *, required: bool = True,
                 fold: SourceFold | None = None, layout: Layout | None = None) -> None:
        self.label = label
        self.normalise = RowNormaliser(mapping, "replay", repair=repair)
        self.normalise.layout = layout  # a range after its file's first: the layout the file's first rows fixed
        self.required = required  # a file without any row is an error, as for the readers
        self.seen = False
        self.fold = fold if fold is not None else SourceFold(Fold(), 1)

    def chunk(self, count: int, rows_at: Callable[[list[int]], list[Any]], frame: pl.DataFrame | None,
              framed: np.ndarray, size: int = 0) -> Chunk:
        """The chunk of ``count`` rows (``rows_at``: those at given indices, each as the readers decode it, a value
        or a ``BadRow``), of which the rows ``framed`` are parsed in ``frame`` (None: no parser took them)."""
        self.seen |= count > 0
        skipped: Counter[str] = Counter()
        made: list[tuple[bool | None, Conversation]] = []  # the mode each was served in, and the conversation

        folded = 0
        models: Counter[str] = Counter()

        def normalise(indices: list[int]) -> None:
            nonlocal folded
            for index, row in zip(indices, rows_at(indices) if indices else [], strict=True):
                if self.fold.fold is not None and self._logged(row):
                    try:
                        exchange = read_exchange(row)
                    except BadRow as bad:
                        skipped[bad.reason] += 1
                        continue
                    models[exchange.model() or ""] += 1
                    for held, was_folded in self.fold.fold.add(exchange, index):
                        folded += was_folded
                        if not was_folded:
                            self._let_out(held, made, skipped)
                    continue
                conversations = self._conversations(index, row)
                if isinstance(conversations, Skipped):
                    skipped[conversations.reason] += 1
                else:
                    made.extend((_served(row, conversation), conversation) for conversation in conversations)

        done = 0
        while self.normalise.layout is None and done < count:  # the rows that fix the layout: the readers'
            normalise([done])
            done += 1
        plain = np.zeros(count, dtype=bool)
        layout = self.normalise.layout
        if frame is not None and layout is not None and layout.style in TURN_KEYS:
            plain[framed] = plain_rows(frame, layout.style, layout.field)
            plain[:done] = False
        normalise((np.flatnonzero(~plain[done:]) + done).tolist())
        del models[""]
        taken = np.flatnonzero(plain)
        kept = frame.filter(pl.Series(plain[framed])) if frame is not None else pl.DataFrame(schema=RAW_SCHEMA)

        def conversations(indices: np.ndarray) -> list[tuple[int, Conversation | Skipped]]:
            out: list[tuple[int, Conversation | Skipped]] = []
            wanted = indices.tolist()
            plain_dicts = iter(rows_at(taken[[index for index in wanted if index < len(taken)]].tolist()))
            for position, index in enumerate(wanted):
                if index >= len(taken):
                    out.append((position, made[index - len(taken)][1]))
                    continue
                items = self._conversations(int(taken[index]), next(plain_dicts))
                out += [(position, item) for item in ([items] if isinstance(items, Skipped) else items)]
            return out
        return Chunk(kept, conversations, skipped, size, layout.field if layout is not None else None,
                     _row_form(made) if made else None, folded, models)

    def _logged(self, row: Any) -> bool:
        """Whether a row is a logged request, for the fold (a row the layout cannot be told of is not)."""
        try:
            return self.normalise.layout_of(row).style == "log"
        except BadRow:
            return False

    def _let_out(self, held: Held[int], made: list[tuple[bool | None, Conversation]], skipped: Counter[str]) -> None:
        """A chat's last request, let out by the fold: its conversations, with what the folded requests left."""
        try:
            parts = self.normalise.logged(held.exchange)
        except BadRow as bad:
            skipped[bad.reason] += 1
            return
        for number, part in enumerate(parts):
            carry(part.messages, part.flags, held)
            conversation = self._conversation(f"{held.tag}/{number}", held.exchange.row, part)
            made.append((_served(held.exchange.row, conversation), conversation))

    def finish(self) -> Chunk | None:
        """After the unit's last chunk: the error of a file without rows, and when it is its source's last file,
        the chunk of the conversations still open."""
        if self.required and not self.seen:
            raise CorpusError("file has no rows", file=self.label)
        self.fold.files_left -= 1
        fold = self.fold.fold
        if self.fold.files_left or fold is None:
            return None
        made: list[tuple[bool | None, Conversation]] = []
        skipped: Counter[str] = Counter()
        for held in fold.close():
            self._let_out(held, made, skipped)
        if not made and not skipped:
            return None
        return Chunk(pl.DataFrame(schema=RAW_SCHEMA), lambda indices: [(position, made[index][1]) for position, index
                                                                        in enumerate(indices.tolist())],
                     skipped, normalised=_row_form(made) if made else None)

    def _conversations(self, index: int, row: Any) -> list[Conversation] | Skipped:
        """The row's conversations as the readers make them (several when a repair splits it), or why it has none."""
        try:
            if isinstance(row, BadRow):
                raise row
            parts = self.normalise(row)
        except BadRow as bad:
            return Skipped(TRAFFIC_SOURCE, bad.reason, f"row {index}", bad.detail)
        return [self._conversation(f"{index}/{number}", row, part) for number, part in enumerate(parts)]

    @staticmethod
    def _conversation(row_id: str, row: dict[str, Any], part: NormalisedRow) -> Conversation:
        task = row.get("task")
        return Conversation(id=row_id, source=TRAFFIC_SOURCE, origin="replay", messages=part.messages,
                            task=task if isinstance(task, str) else None, flags=part.flags, tools=part.tools,
                            provenance=Provenance(served=part.served))


def _served(row: dict[str, Any], conversation: Conversation) -> bool | None:
    """The mode a request says it was served in: a logged request's (``sources.logs``), else
    ``chat_template_kwargs.enable_thinking``, else a top-level ``enable_thinking`` (what ``frames`` reads from a
    raw frame)."""
    served = conversation.provenance.served
    if served is not None:
        return served.enable_thinking
    kwargs = row.get("chat_template_kwargs")
    for value in (kwargs.get("enable_thinking") if isinstance(kwargs, dict) else None, row.get("enable_thinking")):
        if isinstance(value, bool):
            return value
    return None


def _row_form(made: list[tuple[bool | None, Conversation]]) -> pl.DataFrame:
    """Conversations in the corpus's row form, with the mode their rows were served in, as ``frames`` reads it."""
    frame = pl.from_arrow(conversations_to_batch([conversation for _, conversation in made]))
    assert isinstance(frame, pl.DataFrame)
    return frame.with_columns(enable_thinking=pl.Series([served for served, _ in made], dtype=pl.Boolean))


def _line_chunks(blocks: Iterable[bytes], rows: TrafficRows, *, starts_file: bool = True) -> Iterator[Chunk]:
    """Blocks of bytes -> chunks of whole lines, each line decoded on the read-ahead thread (orjson holds the
    lock per line only, so it runs while pyarrow and polars work on the block before)."""
    decoded = map(DecodedLines.of, _whole_lines(blocks, rows.label if starts_file else None))
    for lines in _read_ahead(lambda: next(decoded, None)):
        yield _lines_chunk(lines, rows)
    yield from _last(rows)


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
    block and the decoded objects are not kept (memory, and the garbage collector's work): a row the readers
    must judge is decoded again, and those are few."""

    data: bytes
    lines: list[memoryview]  # the lines that are rows (a blank line is none)
    objects: list[int]  # which of them hold an object
    others: dict[int, Any]  # the rows not parsed as objects from their line: a BadRow, another value, a marked row

    @classmethod
    def of(cls, data: bytes) -> DecodedLines:
        ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == ord("\n"))
        view = memoryview(data)
        decoded = cls(data, [], [], {})
        start = 0
        for end in ends.tolist():
            line, start = view[start:end], end + 1
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

    def rows_at(self, indices: list[int]) -> list[Any]:
        return [self.others[index] if index in self.others else orjson.loads(self.lines[index]) for index in indices]


def _lines_chunk(decoded: DecodedLines, rows: TrafficRows) -> Chunk:
    """The lines that hold an object parsed by pyarrow (1.5-4x faster than polars' parser, the same frame) for
    the facts of the rows the readers take as they are."""
    objects = decoded.objects
    if len(objects) == decoded.data.count(b"\n"):  # every line an object: the block as it is
        frame = _arrow_lines(decoded.data)
    else:
        frame = _arrow_lines(b"".join(bytes(decoded.lines[index]) + b"\n" for index in objects)) if objects else None
    if frame is not None and frame.height != len(objects):
        frame = None
    return rows.chunk(len(decoded.lines), decoded.rows_at, frame, np.array(objects, dtype=np.int64),
                      len(decoded.data))


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


def _dict_chunks(values: Iterable[Any], rows: TrafficRows) -> Iterator[Chunk]:
    """Decoded rows (a .json document, a Hub split) in chunks; the objects that are JSON (a Hub row may hold
    bytes or dates) are parsed by pyarrow for the facts as lines, and every row is the readers' as it came."""
    batch: list[Any] = []
    for value in values:
        batch.append(value)
        if len(batch) >= DICT_BATCH_ROWS:
            yield _values_chunk(batch, rows)
            batch = []
    if batch:
        yield _values_chunk(batch, rows)
    yield from _last(rows)


def _values_chunk(values: list[Any], rows: TrafficRows) -> Chunk:
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
    frame = _arrow_lines(data) if lines else None
    if frame is not None and frame.height != len(framed):
        frame = None
    return rows.chunk(len(values), lambda indices: [values[index] for index in indices], frame,
                      np.array(framed, dtype=np.int64), len(data))


def _parquet_rows(path: Path, label: str) -> int:
    import pyarrow
    import pyarrow.parquet as pq

    try:
        return int(pq.ParquetFile(path).metadata.num_rows)
    except (pyarrow.ArrowException, OSError) as error:
        raise CorpusError(f"cannot read parquet: {error}", file=label) from None


def _parquet_chunks(path: Path, rows: TrafficRows) -> Iterator[Chunk]:
    """Record batches, each decoded ahead of the facts; without pre-buffering: a pre-buffering reader keeps
    what it read of every row group until it is closed (RSS grew by ~60 MB a row group, to 9.7 GB over a
    10M-row log; flat without). A row the readers judge is the batch's row as a dict, as they read it."""
    import pyarrow
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(path, pre_buffer=False).iter_batches(batch_size=PARQUET_BATCH_ROWS)
        for batch in _read_ahead(lambda: next(batches, None)):
            frame = pl.from_arrow(batch)
            assert isinstance(frame, pl.DataFrame)
            yield rows.chunk(batch.num_rows, functools.partial(_batch_rows, batch), frame, np.arange(batch.num_rows))
    except (pyarrow.ArrowException, OSError, ValueError) as error:  # ValueError: a string that is not UTF-8
        raise CorpusError(f"cannot read parquet: {error}", file=rows.label) from None
    yield from _last(rows)


def _last(rows: TrafficRows) -> Iterator[Chunk]:
    final = rows.finish()
    if final is not None:
        yield final


def _batch_rows(batch: Any, indices: list[int]) -> list[Any]:
    """A record batch's rows at these indices as dicts, as the readers read a parquet file's rows."""
    import pyarrow

    rows: list[Any] = batch.take(pyarrow.array(indices, pyarrow.int64())).to_pylist()
    return rows


def sample_mask(label: str, first_row: int, count: int, share: float, seed: int) -> np.ndarray:
    """Which of rows ``first_row .. first_row + count`` of a unit the token pass measures: a seeded hash of
    (unit, row index) under ``share`` of the range, so the sample depends on neither chunking nor order."""
    if share >= 1:
        return np.ones(count, dtype=bool)
    salt = int.from_bytes(hashlib.blake2b(f"{seed}\x1f{label}".encode(), digest_size=8).digest(), "big")
    with np.errstate(over="ignore"):
        x = mix64(np.arange(first_row, first_row + count, dtype=np.uint64) + np.uint64(salt))
    threshold: np.ndarray = x < np.uint64(int(share * float(1 << 64)) if share > 0 else 0)
    return threshold
