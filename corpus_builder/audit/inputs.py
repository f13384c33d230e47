"""What the audit reads, as a stream of bounded chunks: a built corpus's shards, or serving traffic (a file,
a glob of daily logs, a recipe's sources, a Hub dataset or its local mirror).

A chunk is a polars frame of rows plus a way to get the chunk's rows at given indices as normalised
``Conversation``s (the source readers' ``RowNormaliser``, or the corpus's own row form): the facts of every
row come from the frame, the token measures of the sampled rows from the conversations, in one read.

Traffic is read through the source formats' registry (``sources.formats``), so the audit of a log counts and skips
exactly the rows ``corpus audit FILE`` does, for the same reasons: a format gives a file as raw batches
(``sources.raw``: every row as the readers decode it, the object rows parsed against ``frames.RAW_SCHEMA`` in Arrow,
a parquet file's own columns), one ``RowNormaliser`` per file fixes the layout, and only the rows it would take
exactly as they are (``frames.plain_rows``, most rows of a log) keep their facts in the parsed frame. Every other
row goes through the normaliser, and the facts of the conversations it makes are read in the corpus's row form
(``Chunk.normalised``), as a corpus's are.
"""

from __future__ import annotations

import functools
import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from ..errors import CorpusError, Skipped
from ..layout import Corpus
from ..recipe.model import Fold, HubRef, Mapping
from ..records import Conversation, RepairRules
from ..rows import batch_to_conversations, conversations_to_batch
from ..screen.normalise import mix64
from ..sources import (
    AUTO,
    PARQUET_BATCH_ROWS,
    TURN_KEYS,
    BatchNormaliser,
    Format,
    Layout,
    Normalised,
    RawBatch,
    SharedFold,
    SplittableFormat,
    first_layout,
    format_of,
    hub_label,
    iter_hub_rows,
    read_ahead,
    value_batches,
)
from .frames import RAW_SCHEMA, plain_rows

if TYPE_CHECKING:
    import pyarrow

TRAFFIC_SOURCE = "traffic"

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
    fold: SharedFold | None = None  # the fold its source's files share
    logged: Callable[[], bool] | None = None  # whether its rows are logged requests (None: never)
    ranges: Callable[[int], list[Unit]] | None = None  # the file as up to N ranges read apart (``_range_units``)
    # The place of its first row among its file's rows (a range's; the token sample is keyed by it). None: a range
    # after its file's first, placed once the ranges before it are counted.
    first_row: int | None = 0


def corpus_units(corpus: Corpus) -> list[Unit]:
    """A built corpus: its shards as one unit (rows in their own row form, no normalising needed)."""
    def chunks() -> Iterator[Chunk]:
        batches = corpus.iter_batches(batch_size=PARQUET_BATCH_ROWS)
        for batch in read_ahead(lambda: next(batches, None)):
            yield Chunk(pl.from_arrow(batch), _corpus_rows(batch))  # type: ignore[arg-type]
    return [Unit(str(corpus.root), None, None, chunks, rows=corpus.manifest.conversations)]


def _corpus_rows(batch: pyarrow.RecordBatch) -> RowsAt:
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
    fold = SharedFold(Fold(), len(paths))
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
    from ..sources.formats import check_source_formats

    recipe = load_recipe(path)
    check_source_formats(recipe)
    units: list[Unit] = []
    for spec in recipe.sources:
        if spec.hub is not None:
            units.append(_hub_unit(spec.hub, spec.name, spec.task, spec.mapping, spec.repair, spec.fold))
            continue
        files = resolve_paths(spec, recipe.base_dir)
        fold = SharedFold(spec.fold, len(files))
        units += [_file_unit(file, file.name, spec.name, spec.task, spec.mapping, spec.repair, spec.format, fold)
                  for file in files]
    return units


def _file_unit(path: Path, label: str, source: str, task: str | None, mapping: Mapping, repair: RepairRules,
               declared: str = AUTO, fold: SharedFold | None = None) -> Unit:
    fmt = format_of(path, declared)
    if not path.is_file():
        raise CorpusError("file not found", file=str(path))

    def chunks() -> Iterator[Chunk]:
        return _chunks(fmt.raw_batches(path, label, _arrow_schema()), TrafficRows(label, mapping, repair, fold=fold))

    ranges = (functools.partial(_range_units, fmt, path, label, source, task, mapping, repair)
              if isinstance(fmt, SplittableFormat) else None)
    return Unit(label, source, task, chunks, rows=fmt.row_count(path, label), size=fmt.content_size(path), fold=fold,
                logged=functools.partial(_logged_file, fmt, path, label, mapping), ranges=ranges)


def _logged_file(fmt: Format, path: Path, label: str, mapping: Mapping) -> bool:
    """Whether a file's rows may be logged requests: its layout (``first_layout``) is the log's. A file whose start
    cannot be read may be: read with its source's other files in order, its problem is met where a reading of
    them all meets it."""
    try:
        layout = first_layout(fmt.objects(path, label), mapping)
    except CorpusError:
        return True
    return layout is not None and layout.style == "log"


def _range_units(fmt: SplittableFormat, path: Path, label: str, source: str, task: str | None, mapping: Mapping,
                 repair: RepairRules, parts: int) -> list[Unit]:
    """A file of plain lines as up to ``parts`` units of consecutive chunks, read apart; none when it is one chunk,
    its rows are logged requests (they fold across the file) or no row shows a layout (an unreadable or empty
    file, read whole: its problem is met where a whole reading meets it). The chunks are those of a reading of the
    whole file (``batch_bounds``), so every chunk has the same rows in the same order and the rows the same places
    in the file; the ranges after the first start with the layout the file's first rows fix, as the readers fix it
    for the whole file. A range has no fold of its source's (it folds nothing) and never finds the file empty."""
    bounds = fmt.batch_bounds(path)
    chunks = len(bounds) - 1
    count = min(parts, chunks)
    if count < 2:
        return []
    try:
        layout = first_layout(fmt.objects(path, label), mapping)
    except CorpusError:
        return []
    if layout is None or layout.style == "log":
        return []
    edges = [chunks * number // count for number in range(count + 1)]  # chunk indices: about as many per range
    return [Unit(label, source, task, functools.partial(_range_chunks, fmt, path, bounds[first:last + 1], label,
                                                         mapping, repair, layout if first else None),
                 size=bounds[last] - bounds[first], first_row=0 if first == 0 else None)
            for first, last in pairwise(edges)]


def _range_chunks(fmt: SplittableFormat, path: Path, bounds: list[int], label: str, mapping: Mapping,
                  repair: RepairRules, layout: Layout | None) -> Iterator[Chunk]:
    """The chunks between ``bounds`` of a file of plain lines, each read as a block of its own."""
    rows = TrafficRows(label, mapping, repair, required=False, layout=layout)
    return _chunks(fmt.range_batches(path, bounds, label, _arrow_schema()), rows)


def read_parts(units: Sequence[Unit], cut: int = 0) -> list[list[Unit]]:
    """The units in parts that can be read apart (each by its own ``TrafficRows``, on a cluster by separate tasks)
    and give what one reading in order gives: each unit alone, but the files of a source that folds logged
    requests across its files (a chat may go on in the next day's log: ``SharedFold``) together, in order, when
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


def _hub_unit(ref: HubRef, source: str, task: str | None, mapping: Mapping, repair: RepairRules,
              fold: Fold | None = None) -> Unit:
    label = hub_label(ref)
    return Unit(label, source, task, lambda: _chunks(
        value_batches((row for _, row in iter_hub_rows(ref, source)), _arrow_schema()),
        TrafficRows(label, mapping, repair, required=False, fold=SharedFold(fold or Fold(), 1))))


class TrafficRows:
    """One traffic unit's rows, chunk after chunk: the rows the readers would take exactly as they are
    (``frames.plain_rows``) keep their facts in the parsed frame; every other row is normalised by the unit's
    ``BatchNormaliser`` (the readers' rules: a file's layout, repairs, the fold of logged requests), skipped or turned
    into conversations whose facts are read in the row form. A chunk holds the conversations that closed while it
    was read, and the last file's final chunk those still open."""

    def __init__(self, label: str, mapping: Mapping, repair: RepairRules, *, required: bool = True,
                 fold: SharedFold | None = None, layout: Layout | None = None) -> None:
        self.rows = BatchNormaliser(label, TRAFFIC_SOURCE, mapping, repair, required=required, fold=fold,
                                    layout=layout)

    def chunk(self, batch: RawBatch) -> Chunk:
        """The chunk of a raw batch's rows, of which the rows ``framed`` are parsed in its table (None: no parser
        took them)."""
        count, rows_at, framed, size = batch.count, batch.rows_at, batch.framed, batch.size
        frame = _frame(batch.table)
        rows = self.rows
        rows.seen |= count > 0
        out = Normalised()
        done = 0
        while rows.layout is None and done < count:  # the rows that fix the layout: the readers'
            rows.normalise([done], rows_at, out)
            done += 1
        plain = np.zeros(count, dtype=bool)
        layout = rows.layout
        if frame is not None and layout is not None and layout.style in TURN_KEYS:
            plain[framed] = plain_rows(frame, layout.style, layout.field)
            plain[:done] = False
        rows.normalise((np.flatnonzero(~plain[done:]) + done).tolist(), rows_at, out)
        del out.models[""]
        taken = np.flatnonzero(plain)
        kept = frame.filter(pl.Series(plain[framed])) if frame is not None else pl.DataFrame(schema=RAW_SCHEMA)
        made = out.made

        def conversations(indices: np.ndarray) -> list[tuple[int, Conversation | Skipped]]:
            found: list[tuple[int, Conversation | Skipped]] = []
            wanted = indices.tolist()
            plain_dicts = iter(rows_at(taken[[index for index in wanted if index < len(taken)]].tolist()))
            for position, index in enumerate(wanted):
                if index >= len(taken):
                    found.append((position, made[index - len(taken)][1]))
                    continue
                items = rows.conversations(int(taken[index]), next(plain_dicts))
                found += [(position, item) for item in ([items] if isinstance(items, Skipped) else items)]
            return found
        return Chunk(kept, conversations, out.skipped, size, layout.field if layout is not None else None,
                     _row_form(made) if made else None, out.folded, out.models)

    def finish(self) -> Chunk | None:
        """After the unit's last chunk: the error of a file without rows, and when it is its source's last file,
        the chunk of the conversations still open."""
        closed = self.rows.finish()
        if closed is None:
            return None
        made = closed.made
        return Chunk(pl.DataFrame(schema=RAW_SCHEMA), lambda indices: [(position, made[index][1]) for position, index
                                                                        in enumerate(indices.tolist())],
                     closed.skipped, normalised=_row_form(made) if made else None)


def _row_form(made: list[tuple[bool | None, Conversation]]) -> pl.DataFrame:
    """Conversations in the corpus's row form, with the mode their rows were served in, as ``frames`` reads it."""
    frame = pl.from_arrow(conversations_to_batch([conversation for _, conversation in made]))
    assert isinstance(frame, pl.DataFrame)
    return frame.with_columns(enable_thinking=pl.Series([served for served, _ in made], dtype=pl.Boolean))


def _chunks(batches: Iterable[RawBatch], rows: TrafficRows) -> Iterator[Chunk]:
    """A unit's raw batches as chunks, then (``TrafficRows.finish``) the file's error or its source's last chunk."""
    for batch in batches:
        yield rows.chunk(batch)
    final = rows.finish()
    if final is not None:
        yield final


def _frame(table: pyarrow.Table | None) -> pl.DataFrame | None:
    if table is None:
        return None
    frame = pl.from_arrow(table)
    assert isinstance(frame, pl.DataFrame)
    return frame


@functools.cache
def _arrow_schema() -> pyarrow.Schema:
    """``frames.RAW_SCHEMA`` in Arrow's types: what the raw batches of a line format are parsed against."""
    import pyarrow

    def arrow_type(dtype: object) -> pyarrow.DataType:  # a polars type or type class (a list's may be either)
        if isinstance(dtype, pl.List):
            return pyarrow.list_(arrow_type(dtype.inner))
        if isinstance(dtype, pl.Struct):
            return pyarrow.struct([(part.name, arrow_type(part.dtype)) for part in dtype.fields])
        if dtype == pl.Boolean:
            return pyarrow.bool_()
        assert dtype == pl.String, dtype
        return pyarrow.string()
    return pyarrow.schema([(name, arrow_type(dtype)) for name, dtype in RAW_SCHEMA.items()])


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
