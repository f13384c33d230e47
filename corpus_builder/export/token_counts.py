"""A `speculators-tokens` export counted as it is: how often each id is under the loss mask.

The export's files (``{split}.parquet``, ``.jsonl`` or ``.jsonl.zst``: ``{id, input_ids, loss_mask}`` rows) are
read as Arrow record batches and counted with numpy over the list columns' flat value buffers: no row becomes a
Python object, and only one batch is in memory at a time, so memory stays flat however large the export is.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa

from ..errors import CorpusError
from ..layout import open_parquet
from ..trainer_formats import FILE_FORMATS
from .formats import TOKEN_COLUMNS, TOKEN_FORMAT

_JSON_SCHEMA = pa.schema([(name, pa.list_(pa.int64())) for name in TOKEN_COLUMNS])
_JSON_BLOCK_BYTES = 16 << 20  # the JSON reader's block: a batch of rows (a row must fit in one)
_PARQUET_BATCH_ROWS = 8192
# Supervised ids counted without a known vocabulary stay under this: no tokenizer has as many entries (the largest
# have about a million), and counts of this length take 128 MB. Past it an id is a damaged row, not a token.
MAX_UNKNOWN_VOCABULARY = 1 << 24

_Item = TypeVar("_Item")


@dataclass(frozen=True)
class Vocabulary:
    """The ids a count may hold (0 to ``size`` - 1) and where that size comes from, for messages."""

    size: int
    source: str  # e.g. "the tokenizer DIR", "--target-vocab-size"


def _file_format(path: Path) -> str | None:
    return next((fmt for fmt in FILE_FORMATS if path.name.endswith(f".{fmt}")), None)


def token_export_files(path: Path) -> list[Path]:
    """The files of a speculators-tokens export: ``path`` itself, or every export file in the directory
    ``path`` (an export's ``{split}.{file format}`` files), in name order."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and _file_format(p) is not None)
        if not files:
            raise CorpusError(f"manifest.json is missing (interrupted or failed build?), and no {TOKEN_FORMAT} "
                              f"export file ({', '.join(f'*.{fmt}' for fmt in FILE_FORMATS)}) is there either",
                              file=str(path))
        return files
    if not path.is_file():
        raise CorpusError("no such file or directory", file=str(path))
    if _file_format(path) is None:
        raise CorpusError(f"not a {TOKEN_FORMAT} export file: the name must end in "
                          f"{', '.join(f'.{fmt}' for fmt in FILE_FORMATS)}", file=str(path))
    return [path]


def _batches(path: Path) -> Iterator[pa.RecordBatch]:
    """The file's (input_ids, loss_mask) columns, batch by batch."""
    if _file_format(path) == "parquet":
        parquet = open_parquet(path)
        schema = parquet.schema_arrow
        missing = [name for name in TOKEN_COLUMNS if name not in schema.names]
        if missing:
            raise CorpusError(f"not a {TOKEN_FORMAT} export: no {' or '.join(missing)} column", file=str(path))
        for name in TOKEN_COLUMNS:
            kind = schema.field(name).type
            if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(kind.value_type):
                raise CorpusError(f"column {name} is {kind}, not a list of integers", file=str(path))
        yield from parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=list(TOKEN_COLUMNS))
        return
    import pyarrow.json as pa_json

    compression = "zstd" if path.name.endswith(".zst") else None
    with pa.input_stream(str(path), compression=compression) as stream:
        yield from pa_json.open_json(
            stream, read_options=pa_json.ReadOptions(block_size=_JSON_BLOCK_BYTES),
            parse_options=pa_json.ParseOptions(explicit_schema=_JSON_SCHEMA, unexpected_field_behavior="ignore"))


def _read_ahead(items: Iterator[_Item]) -> Iterator[_Item]:
    """``items``, the next one read on a thread while the caller works on this one: Arrow decodes without the
    GIL, so decoding the next batch overlaps counting this one."""
    with ThreadPoolExecutor(1) as reader:
        pending = reader.submit(next, items, None)
        while (item := pending.result()) is not None:
            pending = reader.submit(next, items, None)
            yield item


def _line(path: Path, row: int) -> int:
    """The line of a JSON-lines file that holds its ``row``-th row (0-based; Arrow's reader skips blank lines)."""
    import zstandard

    with path.open("rb") as raw:
        lines = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw)) if path.name.endswith(".zst") \
            else raw
        rows_so_far = accumulate(bool(line.strip()) for line in lines)
        return next(number for number, rows in enumerate(rows_so_far, 1) if rows == row + 1)


def _row_error(path: Path, row: int, problem: str) -> CorpusError:
    """``problem`` of the file's ``row``-th row (0-based), located: by its line in a JSON-lines file, by its row in
    a parquet file."""
    if _file_format(path) == "parquet":
        return CorpusError(f"row {row}: {problem}", file=str(path))
    return CorpusError(problem, file=str(path), line=_line(path, row))


def _masked_ids(batch: pa.RecordBatch, path: Path, first_row: int) -> np.ndarray:
    """The ids of one batch under its loss mask; a row without both lists, or with lists of two lengths, is
    named by its place in the file."""
    import pyarrow.compute as pc

    ids, mask = batch.column(0), batch.column(1)
    if ids.null_count or mask.null_count:
        missing = pc.or_(ids.is_null(), mask.is_null()).to_numpy(zero_copy_only=False)
        raise _row_error(path, first_row + int(np.flatnonzero(missing)[0]), "no input_ids or no loss_mask list")
    lengths = pc.list_value_length(ids).to_numpy(), pc.list_value_length(mask).to_numpy()
    if not np.array_equal(*lengths):
        row = first_row + int(np.flatnonzero(lengths[0] != lengths[1])[0])
        raise _row_error(path, row, "input_ids and loss_mask differ in length")
    values, weights = ids.flatten(), mask.flatten()
    if values.null_count or weights.null_count:
        raise CorpusError(f"a null in the input_ids or loss_mask of rows {first_row}-{first_row + len(batch) - 1}",
                          file=str(path))
    supervised: np.ndarray = values.to_numpy()[weights.to_numpy() != 0]  # speculators counts every non-zero mask
    return supervised


def _outside(batch: pa.RecordBatch, path: Path, first_row: int, vocabulary: Vocabulary | None) -> CorpusError:
    """The error of the batch's first row with a supervised id outside ``vocabulary`` (None: unknown, so past
    MAX_UNKNOWN_VOCABULARY), naming the row, the id and the vocabulary."""
    bound = vocabulary.size if vocabulary is not None else MAX_UNKNOWN_VOCABULARY
    index, token = next((index, token) for index, row in enumerate(batch.to_pylist())
                        for token, mask in zip(row["input_ids"], row["loss_mask"], strict=True)
                        if mask and not 0 <= token < bound)
    if token < 0:
        problem = f"token id {token:,} is negative"
    elif vocabulary is not None:
        problem = f"token id {token:,} is supervised but the vocabulary has {bound:,} tokens ({vocabulary.source})"
    else:
        problem = (f"token id {token:,} is supervised: no tokenizer has that many entries (counted without a "
                   f"vocabulary, ids stay under {bound:,}); give --tokenizer DIR, the target's")
    return _row_error(path, first_row + index, problem)


def count_token_export(files: list[Path], vocabulary: Vocabulary | None) -> np.ndarray:
    """How often each id is supervised in the export ``files``: a dense int64 array, index = token id, as long as
    ``vocabulary`` (None: unknown, as long as the largest id counted plus one). A supervised id outside it (or,
    unknown, past MAX_UNKNOWN_VOCABULARY), or negative, is an error naming its row, the id and the vocabulary:
    counts as long as such an id would not fit in memory."""
    bound = vocabulary.size if vocabulary is not None else MAX_UNKNOWN_VOCABULARY
    counts = np.zeros(vocabulary.size if vocabulary is not None else 0, np.int64)
    for path in files:
        row = 0
        try:
            for batch in _read_ahead(_batches(path)):
                supervised = _masked_ids(batch, path, row)
                if supervised.size and (supervised.min() < 0 or supervised.max() >= bound):
                    raise _outside(batch, path, row, vocabulary)
                row += batch.num_rows
                found = np.bincount(supervised, minlength=len(counts))
                if len(found) > len(counts):
                    counts = np.concatenate([counts, np.zeros(len(found) - len(counts), np.int64)])
                counts += found
        except (pa.ArrowException, OSError) as error:
            raise CorpusError(f"cannot read the {TOKEN_FORMAT} export: {error}", file=str(path)) from error
    return counts
