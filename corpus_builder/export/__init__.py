"""The export stage: a built corpus in the formats the trainers read, and the draft vocabulary's token
frequencies (``vocab``). Both read the written corpus, never the pipeline's memory."""

from __future__ import annotations

from pathlib import Path

from ..layout import Corpus
from ..outputs import check_output_path
from ..trainer_formats import EXPORT_FORMATS, FILE_FORMATS
from .formats import EXPORTS_DIR, ExportReport, run_recipe_exports, split_files, write_export
from .token_rows import CorpusTokenRows, corpus_token_rows
from .vocab import VocabReport, draft_vocab

__all__ = ["EXPORTS_DIR", "EXPORT_FORMATS", "FILE_FORMATS", "CorpusTokenRows", "ExportReport", "VocabReport",
           "corpus_token_rows", "draft_vocab", "export_corpus", "run_recipe_exports", "write_export"]


def export_corpus(corpus: Corpus | Path | str, fmt: str, out_dir: Path | str, *, file_format: str = "jsonl",
                  tokenizer: Path | None = None) -> ExportReport:
    """Write a built corpus as ``fmt`` into ``out_dir``/{split}.{file_format} (one file per split; every row
    of a conversation in its conversation's split). ``out_dir`` and every file written in it are checked first:
    none may be the corpus, the tokenizer or inside a built corpus."""
    opened = corpus if isinstance(corpus, Corpus) else Corpus.open(Path(corpus))
    token_rows = corpus_token_rows(opened, tokenizer) if fmt == "speculators-tokens" else None
    inputs = [opened.root, token_rows.renderer.tokenizer_dir if token_rows is not None else tokenizer]
    out = check_output_path(out_dir, what="--out", inputs=inputs, directory=True)
    if out.is_dir():  # files in a directory yet to be made cannot be anything the run reads
        for path in split_files(opened, out, file_format).values():
            check_output_path(path, what="--out", inputs=inputs)
    return write_export(opened, fmt, out, file_format=file_format, token_rows=token_rows)
