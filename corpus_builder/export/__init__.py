"""The export stage: a built corpus in the formats the trainers read, and the draft vocabulary's token
frequencies (``vocab``). Both read the written corpus, never the pipeline's memory."""

from __future__ import annotations

from pathlib import Path

from ..layout import Corpus
from ..outputs import check_output_path
from ..tokens import TokenRows, TokenSettings
from .formats import EXPORTS_DIR, FILE_FORMATS, FORMATS, ExportReport, export_corpus, run_recipe_exports, split_files

__all__ = ["EXPORTS_DIR", "FILE_FORMATS", "FORMATS", "ExportReport", "corpus_token_rows", "export", "export_corpus",
           "run_recipe_exports"]


def corpus_token_rows(corpus: Corpus, tokenizer: Path | None = None) -> TokenRows | None:
    """Token rows on the tokenizer a built corpus's recipe names (``tokenizer`` overrides); None when no
    such tokenizer is found here."""
    settings = TokenSettings.from_corpus(corpus, tokenizer)
    return TokenRows(settings.renderer()) if settings is not None else None


def export(corpus: Corpus | Path | str, fmt: str, out_dir: Path | str, *, file_format: str = "jsonl",
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
    return export_corpus(opened, fmt, out, file_format=file_format, token_rows=token_rows)
