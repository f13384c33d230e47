"""`corpus export`: a built corpus in the formats the trainers read, one file per split.

Layout: ``OUT/{split}.{jsonl|jsonl.zst|parquet}`` (train, validation). The split was decided per
conversation at build time and every row of a conversation goes to its conversation's file, so the
per-turn fan-out of `speculators-tokens` never puts one conversation on both sides.

Each format's rows, Arrow schema and converter are its record in ``formats.TRAINER_FORMATS``. Memory is flat:
batches stream from the shards to the files.
"""

from __future__ import annotations

from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO

import orjson
import pyarrow as pa

from ..errors import CorpusError
from ..layout import Corpus
from ..outputs import check_output_path, made_directory, staged
from ..progress import ProgressLine
from ..recipe.model import Recipe
from ..rows import batch_to_conversations
from ..tokens import TokenRows
from ..trainer_formats import FILE_FORMATS
from .formats import TOKEN_FORMAT, ExportRow, trainer_format
from .token_rows import corpus_token_rows

EXPORTS_DIR = "exports"  # a build's recipe exports: OUT/exports/{format}/


class _JsonlSink:
    def __init__(self, path: Path, compressed: bool) -> None:
        self._file = path.open("wb")
        self._stream: BinaryIO = self._file
        if compressed:
            import zstandard

            self._stream = zstandard.ZstdCompressor(level=3).stream_writer(self._file)

    def write(self, rows: list[ExportRow]) -> None:
        self._stream.write(b"".join(orjson.dumps(row) + b"\n" for row in rows))

    def close(self) -> None:
        self._stream.close()  # closes the file too
        self._file.close()


class _ParquetSink:
    def __init__(self, path: Path, schema: pa.Schema) -> None:
        import pyarrow.parquet as pq

        self._schema = schema
        self._writer = pq.ParquetWriter(path, schema, compression="zstd")

    def write(self, rows: list[ExportRow]) -> None:
        self._writer.write_table(pa.Table.from_pylist(rows, schema=self._schema))

    def close(self) -> None:
        self._writer.close()


@dataclass(frozen=True)
class ExportedFile:
    """One split's file of an export: where, its rows, the conversations they came from and those left out."""

    path: Path
    rows: int
    conversations: int
    left_out: int


@dataclass
class ExportReport:
    format: str
    file_format: str
    out_dir: Path
    files: dict[str, ExportedFile] = field(default_factory=dict)  # by split
    skipped: dict[str, int] = field(default_factory=dict)
    # Natural-language formats only: generated turns whose re-render is not the token ids the target served
    # (from the build's served-ids check), of how many; a trainer that re-renders the text trains on those.
    re_rendered: tuple[int, int] | None = None

    def describe(self) -> str:
        lines = [f"{self.format} ({self.file_format}) -> {self.out_dir}"]
        for split, info in self.files.items():
            lines.append(f"  {split:<11} {info.rows:>9,} rows from {info.conversations:,} conversations  {info.path}")
        for reason, count in sorted(self.skipped.items()):
            lines.append(f"  left out: {reason}: {count:,} conversations")
        if self.re_rendered is not None and self.re_rendered[0]:
            differ, checked = self.re_rendered
            lines.append(f"  note: {differ:,} of {checked:,} generated turns re-render differently from the tokens "
                         "the target served (a trainer that re-renders this text trains on tokens the target did "
                         f"not produce); the {TOKEN_FORMAT} export keeps them token-exact")
        return "\n".join(lines)


def _re_rendered_turns(corpus: Corpus) -> tuple[int, int] | None:
    """(generated turns whose re-render differs from their served ids, generated turns checked), from the
    build's served-ids check in audit.json; None when the build had no target tokenizer to check with."""
    mismatches = ((corpus.audit() or {}).get("tokens") or {}).get("mismatches")
    if not isinstance(mismatches, dict):
        return None
    return int(mismatches.get("count", 0)), int(mismatches.get("checked_turns", 0))


def split_files(corpus: Corpus, out_dir: Path, file_format: str) -> dict[str, Path]:
    """The file each split of ``corpus`` is exported to: ``out_dir``/{split}.{file_format}."""
    return {split: out_dir / f"{split}.{file_format}" for split in sorted(corpus.manifest.splits)}


def export_corpus(corpus: Corpus | Path | str, fmt: str, out_dir: Path | str, *, file_format: str = "jsonl",
                  tokenizer: Path | None = None) -> ExportReport:
    """Write a built corpus as ``fmt`` into ``out_dir``/{split}.{file_format} (one file per split; every row
    of a conversation in its conversation's split). ``out_dir`` and every file written in it are checked first:
    none may be the corpus, the tokenizer or inside a built corpus."""
    opened = corpus if isinstance(corpus, Corpus) else Corpus.open(Path(corpus))
    token_rows = corpus_token_rows(opened, tokenizer) if trainer_format(fmt).in_target_tokens else None
    inputs = [opened.root, token_rows.renderer.tokenizer_dir if token_rows is not None else tokenizer]
    out = check_output_path(out_dir, what="--out", inputs=inputs, directory=True)
    if out.is_dir():  # files in a directory yet to be made cannot be anything the run reads
        for path in split_files(opened, out, file_format).values():
            check_output_path(path, what="--out", inputs=inputs)
    return write_export(opened, fmt, out, file_format=file_format, token_rows=token_rows)


def write_export(corpus: Corpus, fmt: str, out_dir: Path, *, file_format: str = "jsonl",
                 token_rows: TokenRows | None = None, batch_size: int = 512,
                 progress: ProgressLine | None = None, allow_empty: bool = False) -> ExportReport:
    """Write ``corpus`` as ``fmt`` into ``out_dir``/{split}.{file_format}; the files appear complete or not at
    all (each written under a temporary name, every one renamed once all are done; on an error the temporary
    files, and the directories made for them, are removed). An export without rows (an empty corpus, or every
    conversation left out by the format) is refused, nothing written, unless ``allow_empty``."""
    trainer = trainer_format(fmt)
    if file_format not in FILE_FORMATS:
        raise CorpusError(f"unknown file format {file_format!r} (one of {', '.join(FILE_FORMATS)})")
    if not corpus.manifest.conversations and not allow_empty:
        raise CorpusError("the corpus holds no conversations: there is nothing to export", file=str(corpus.root))
    convert = trainer.convert(token_rows)
    report = ExportReport(fmt, file_format, out_dir,
                          re_rendered=None if trainer.in_target_tokens else _re_rendered_turns(corpus))
    skipped: Counter[str] = Counter()
    with made_directory(out_dir), ExitStack() as files:
        for split, path in split_files(corpus, out_dir, file_format).items():
            partial = files.enter_context(staged(path))
            sink = (_ParquetSink(partial, trainer.schema) if file_format == "parquet"
                    else _JsonlSink(partial, file_format == "jsonl.zst"))
            rows = conversations = 0
            left_out = sum(skipped.values())
            try:
                for batch in corpus.iter_batches(split=split, batch_size=batch_size):
                    converted = list(convert(batch_to_conversations(batch), skipped))
                    conversations += batch.num_rows
                    rows += len(converted)
                    if converted:
                        sink.write(converted)
                    if progress is not None:
                        progress.advance(batch.num_rows)
            finally:
                sink.close()
            report.files[split] = ExportedFile(path, rows, conversations, sum(skipped.values()) - left_out)
        if not any(info.rows for info in report.files.values()) and not allow_empty:
            reasons = "; ".join(f"{reason}: {count:,}" for reason, count in sorted(skipped.items()))
            raise CorpusError(f"the {fmt} export would hold no rows: every conversation was left out ({reasons}); "
                              "nothing was written", file=str(out_dir))
    report.skipped = dict(skipped)
    if progress is not None:
        progress.finish()
    return report


def run_recipe_exports(recipe: Recipe, corpus_dir: Path, token_rows: TokenRows | None,
                       stream: TextIO | None = None, allow_empty: bool = False) -> list[ExportReport]:
    """The exports a recipe's output asks for, into ``corpus_dir``/exports/{format}/ (``token_rows``: the
    build's own, on its one renderer), each with a progress line on ``stream``; ``allow_empty``: the build
    was asked for an empty corpus, so its exports may be empty too."""
    if not recipe.output.exports:
        return []
    corpus = Corpus.open(corpus_dir)
    total = corpus.manifest.conversations
    return [write_export(corpus, spec.format, corpus_dir / EXPORTS_DIR / spec.format, file_format=spec.file_format,
                         token_rows=token_rows, allow_empty=allow_empty,
                         progress=ProgressLine(f"export {spec.format}", total=total, unit="conversations",
                                               stream=stream))
            for spec in recipe.output.exports]
