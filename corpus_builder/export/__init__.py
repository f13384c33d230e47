"""The export stage: a built corpus in the formats the trainers read (each format one record in
``formats.TRAINER_FORMATS``), and the draft vocabulary's token frequencies (``vocab``). Both read the written corpus,
never the pipeline's memory."""

from __future__ import annotations

from ..trainer_formats import EXPORT_FORMATS, FILE_FORMATS
from .formats import TRAINER_FORMATS, TrainerFormat
from .token_rows import CorpusTokenRows, corpus_token_rows
from .vocab import VocabReport, draft_vocab
from .write import EXPORTS_DIR, ExportedFile, ExportReport, export_corpus, run_recipe_exports, split_files, write_export

__all__ = ["EXPORTS_DIR", "EXPORT_FORMATS", "FILE_FORMATS", "TRAINER_FORMATS", "CorpusTokenRows", "ExportReport",
           "ExportedFile", "TrainerFormat", "VocabReport", "corpus_token_rows", "draft_vocab", "export_corpus",
           "run_recipe_exports", "split_files", "write_export"]
