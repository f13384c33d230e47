"""The source formats: one registry of the file formats rows are read from, each format one object.

A format reads a file as positioned raw rows (``rows``: the build, ``corpus audit FILE``, the eval pack and the
decontamination references read them, normalised by ``sources.source``) and as raw batches whose object rows are
parsed into Arrow columns (``raw_batches``: ``corpus audit --against`` reads its facts from them). Positions are
1-based lines for a line format (``file:line``, provenance ``source_line``) and 0-based row indices for the others
(``file#row``, ``source_row``). A format whose rows are plain lines of bytes can also be cut into byte ranges read
apart (``SplittableFormat``: on several processes, or as several audit parts).

Which format a file is, is decided here only (``format_of``): the one a source declares (``format``), else the one
the file name's suffix names; a file no registered format names, or a declared name no format has, is a located
``CorpusError`` (exit 2), never a guess. A file that is something else than its format says is refused by its reader
(``readers.check_text_start``, parquet's own check). Adding a format is one entry: a ``Format`` subclass that
implements ``rows``, given to ``register``; every reader then takes it (``raw_batches`` re-encodes its object rows as
JSON lines unless the format reads columns itself), and a recipe may name it in a source's ``format``. The recipe
sits below this registry and takes any name there, checked against ``format_names``: by ``corpus validate`` with the
recipe's other problems, and by the commands that read a recipe's sources before anything else
(``check_source_formats``), each where the recipe writes it, with the names registered.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ..errors import CorpusError
from ..recipe.model import AUTO_FORMAT, Recipe
from ..recipe.schema import source_format_problems
from ..recipe.yaml_reader import Parsed
from .raw import (
    PARQUET_BATCH_ROWS,
    RawBatch,
    block_bounds,
    bounded_blocks,
    file_blocks,
    line_batches,
    read_ahead,
    value_batches,
)
from .readers import (
    LineRange,
    PositionFilter,
    RowReader,
    block_lines,
    checked_parquet,
    file_lines,
    iter_line_range,
    json_rows,
    jsonl_rows,
    line_ranges,
    parquet_rows,
    zstd_chunks,
    zstd_rows,
)

if TYPE_CHECKING:
    import pyarrow

AUTO = AUTO_FORMAT  # a source's ``format`` when the file name tells it


class Format(ABC):
    """One file format: its name, the suffixes that name a file of it, how its rows are numbered, its readers."""

    name: ClassVar[str]
    suffixes: ClassVar[tuple[str, ...]]  # lower case, with the dot
    by_line: ClassVar[bool] = False  # positions are 1-based lines, else 0-based row indices

    @property
    def separator(self) -> str:
        """What stands between a file and a row's position in a location: ``file:line`` or ``file#row``."""
        return ":" if self.by_line else "#"

    @property
    def position_key(self) -> str:
        """The provenance key that holds a row's position."""
        return "source_line" if self.by_line else "source_row"

    @abstractmethod
    def rows(self, path: Path, label: str, keep: PositionFilter | None) -> RowReader:
        """Yield the kept ``(position, row)`` pairs of an existing file (``keep`` drops rows by position before they
        are decoded), a row the decoded value or a ``BadRow`` (one bad row never stops a file); return whether the
        file had any row at all, kept or not. A problem with the whole file raises ``CorpusError`` naming ``label``.
        """

    def read(self, path: Path, label: str, keep: PositionFilter | None = None) -> Iterator[tuple[int, object]]:
        """``rows``, and an error for a missing file or a file with no rows at all (before ``keep``): it is almost
        always a wrong path or a failed download."""
        return _checked_rows(self, path, label, keep)

    def objects(self, path: Path, label: str) -> Iterator[dict[str, object]]:
        """The file's object rows from its start, for a caller that stops at the first one that tells it what it
        needs (a file's layout): not a read of the file, one block of it."""
        return (row for _, row in _checked_rows(self, path, label, None) if isinstance(row, dict))

    def raw_batches(self, path: Path, label: str, schema: pyarrow.Schema) -> Iterator[RawBatch]:
        """The file's rows in bounded batches, the object rows of each parsed against ``schema``. By default the
        rows ``read`` gives, re-encoded as JSON lines: a format that reads columns (or lines) itself does better.
        The audit reads its facts from these columns; they are also where a columnar read would start, the rows that
        need no repair going to the corpus's row schema without becoming Python objects."""
        return value_batches((row for _, row in self.read(path, label)), schema)

    def row_count(self, path: Path, label: str) -> int | None:
        """The file's rows when the file records them without being read (None: unknown until read)."""
        return None

    def content_size(self, path: Path) -> int:
        """The bytes of the file's content (decompressed), as far as known before reading it, to estimate rows."""
        return path.stat().st_size


def _checked_rows(fmt: Format, path: Path, label: str, keep: PositionFilter | None) -> Iterator[tuple[int, object]]:
    if not path.is_file():
        raise CorpusError("file not found" if not path.exists() else "not a file", file=label)
    if not (yield from fmt.rows(path, label, keep)):
        raise CorpusError("file has no rows", file=label)


class SplittableFormat(Format):
    """A format whose rows are plain lines of bytes: a byte range that starts and ends on line boundaries is read
    apart and gives the rows (and the line numbers) a whole read gives there."""

    @abstractmethod
    def ranges(self, path: Path, parts: int, label: str) -> list[LineRange]:
        """Up to ``parts`` consecutive byte ranges of the file, each worth reading apart (one: not worth cutting),
        each with its first line's number in the file."""

    @abstractmethod
    def range_rows(self, path: Path, span: LineRange, keep: PositionFilter | None) -> Iterator[tuple[int, object]]:
        """``rows`` of one range, with the file's own positions."""

    @abstractmethod
    def batch_bounds(self, path: Path) -> list[int]:
        """Where the raw batches of a whole read begin and end (byte offsets, the file's end last)."""

    @abstractmethod
    def range_batches(self, path: Path, bounds: list[int], label: str,
                      schema: pyarrow.Schema) -> Iterator[RawBatch]:
        """The raw batches between ``bounds`` (some of ``batch_bounds``), each the batch a whole read gives."""


class LineFormat(Format):
    """JSON lines, one row a line, from blocks of bytes (``blocks``: the file's, or decompressed)."""

    by_line = True

    @abstractmethod
    def blocks(self, path: Path, label: str) -> Iterator[bytes]:
        """The file's text in blocks of bytes, in order (a line may be cut between two)."""

    def raw_batches(self, path: Path, label: str, schema: pyarrow.Schema) -> Iterator[RawBatch]:
        return line_batches(self.blocks(path, label), label, schema)

    def lines(self, path: Path, label: str) -> Iterator[bytes]:
        """The file's lines, in order (the fold's scan reads them: ``readers.scanned_blocks``)."""
        return block_lines(self.blocks(path, label))


class JsonLines(LineFormat, SplittableFormat):
    """JSON lines: one row a line, read as it is; a large file is cut into byte ranges read apart."""

    name = "jsonl"
    suffixes = (".jsonl",)

    def rows(self, path: Path, label: str, keep: PositionFilter | None) -> RowReader:
        return jsonl_rows(path, label, keep)

    def blocks(self, path: Path, label: str) -> Iterator[bytes]:
        return file_blocks(path)

    def lines(self, path: Path, label: str) -> Iterator[bytes]:
        return file_lines(path)

    def ranges(self, path: Path, parts: int, label: str) -> list[LineRange]:
        return line_ranges(path, parts, label)

    def range_rows(self, path: Path, span: LineRange, keep: PositionFilter | None) -> Iterator[tuple[int, object]]:
        return iter_line_range(path, span, keep)

    def batch_bounds(self, path: Path) -> list[int]:
        return block_bounds(path)

    def range_batches(self, path: Path, bounds: list[int], label: str,
                      schema: pyarrow.Schema) -> Iterator[RawBatch]:
        return line_batches(bounded_blocks(path, bounds), label if bounds[0] == 0 else None, schema)


class ZstdJsonLines(LineFormat):
    """JSON lines compressed with zstd (one or more frames), decompressed in small steps."""

    name = "jsonl.zst"
    suffixes = (".jsonl.zst",)

    def rows(self, path: Path, label: str, keep: PositionFilter | None) -> RowReader:
        return zstd_rows(path, label, keep)

    def blocks(self, path: Path, label: str) -> Iterator[bytes]:
        return zstd_chunks(path, label)

    def content_size(self, path: Path) -> int:
        """The decompressed size the (first) frame header records, else the file's size."""
        import zstandard

        with path.open("rb") as handle:
            header = handle.read(18)  # the longest frame header
        try:
            size = zstandard.frame_content_size(header)
        except zstandard.ZstdError:
            size = 0
        return max(size, 0) or path.stat().st_size


class JsonDocument(Format):
    """One JSON document: an array of rows, or an object with its rows in a list under ``data`` or ``rows``."""

    name = "json"
    suffixes = (".json",)

    def rows(self, path: Path, label: str, keep: PositionFilter | None) -> RowReader:
        return json_rows(path, label, keep)


class Parquet(Format):
    """Parquet: one row a record, read one record batch at a time."""

    name = "parquet"
    suffixes = (".parquet",)

    def rows(self, path: Path, label: str, keep: PositionFilter | None) -> RowReader:
        return parquet_rows(path, label, keep)

    def raw_batches(self, path: Path, label: str, schema: pyarrow.Schema) -> Iterator[RawBatch]:
        """The file's record batches as they are (its own columns, ``schema`` aside), each read ahead."""
        import pyarrow

        try:
            batches = checked_parquet(path, label).iter_batches(batch_size=PARQUET_BATCH_ROWS)
            for batch in read_ahead(lambda: next(batches, None)):
                yield RawBatch(batch.num_rows, _BatchRows(batch, label), batch, np.arange(batch.num_rows))
        except (pyarrow.ArrowException, OSError, ValueError) as error:  # ValueError: a string that is not UTF-8
            raise CorpusError(f"cannot read parquet: {error}", file=label) from None

    def row_count(self, path: Path, label: str) -> int:
        import pyarrow

        try:
            return int(checked_parquet(path, label).metadata.num_rows)
        except (pyarrow.ArrowException, OSError) as error:
            raise CorpusError(f"cannot read parquet: {error}", file=label) from None


class _BatchRows:
    """A record batch's rows at given indices as dicts, as ``Parquet.rows`` reads them."""

    def __init__(self, batch: pyarrow.RecordBatch, label: str) -> None:
        self.batch = batch
        self.label = label

    def __call__(self, indices: list[int]) -> list[object]:
        import pyarrow

        try:
            rows: list[object] = self.batch.take(pyarrow.array(indices, pyarrow.int64())).to_pylist()
        except (pyarrow.ArrowException, ValueError) as error:  # ValueError: a string that is not UTF-8
            raise CorpusError(f"cannot read parquet: {error}", file=self.label) from None
        return rows


REGISTRY: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Add a format to the registry: from then on every reader takes a file its name or a suffix of it names."""
    if fmt.name == AUTO or fmt.name in REGISTRY:
        raise ValueError(f"a format named {fmt.name!r} is already registered")
    claimed = {suffix for known in REGISTRY.values() for suffix in known.suffixes}
    if taken := claimed.intersection(fmt.suffixes):
        raise ValueError(f"format {fmt.name!r}: suffix {sorted(taken)[0]} is another format's")
    REGISTRY[fmt.name] = fmt
    return fmt


for _builtin in (JsonLines(), ZstdJsonLines(), JsonDocument(), Parquet()):
    register(_builtin)


def format_names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def check_source_formats(recipe: Recipe) -> None:
    """Refuse a recipe whose sources name a format no entry has, as ``load_recipe`` refuses its other problems (exit
    2, each where the recipe writes it, with the names registered), before a command reads its sources."""
    written = recipe.written if recipe.written is not None else Parsed(None, [], str(recipe.path or "recipe"))
    if problems := source_format_problems(recipe.document, written, format_names):
        raise CorpusError("recipe is invalid", file=written.file, details=[str(problem) for problem in problems])


def format_suffixes() -> tuple[str, ...]:
    """Every suffix that names a registered format, in the registry's order."""
    return tuple(suffix for fmt in REGISTRY.values() for suffix in fmt.suffixes)


def format_of(path: Path, declared: str = AUTO) -> Format:
    """The format a file is read as: the one ``declared`` names, else the one whose suffix ends the file's name
    (the longest that does); a name or a file no registered format answers to is refused, naming the file."""
    if declared != AUTO:
        fmt = REGISTRY.get(declared)
        if fmt is None:
            raise CorpusError(f"unknown format '{declared}' (expected one of {', '.join(REGISTRY)})", file=str(path))
        return fmt
    name = path.name.lower()
    named = [(len(suffix), fmt) for fmt in REGISTRY.values() for suffix in fmt.suffixes if name.endswith(suffix)]
    if not named:
        *others, last = format_suffixes()
        raise CorpusError(f"cannot tell the format from the file name; use {', '.join(others)} or {last}, "
                          "or set the source's `format`", file=str(path))
    return max(named, key=lambda match: match[0])[1]
