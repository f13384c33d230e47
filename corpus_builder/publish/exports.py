"""The trainer exports `corpus publish` uploads beside the corpus, so a published corpus is a training input as it is.

Each is written from the gated corpus into a scratch directory (never into the corpus) and uploaded in the same
commit at ``exports/{format}/{split}.{file_format}``, the layout of a build's own exports; the card names every file
with the commands that train on it (its format's record in ``export.formats.TRAINER_FORMATS``). Which exports: the
recipe's ``publish.exports``, or ``corpus publish --export FORMAT[:FILE_FORMAT]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import CorpusError
from ..export.formats import TRAINER_FORMATS, TrainingFile, trainer_format
from ..export.write import EXPORTS_DIR, export_corpus
from ..layout import RECIPE, Corpus
from ..recipe.model import ExportSpec
from ..trainer_formats import FILE_FORMATS, ExportFormat, FileFormat
from .gate import CorpusDocuments
from .upload import UploadFile

EXPORTS_PREFIX = f"{EXPORTS_DIR}/"


def parse_export(text: str) -> ExportSpec:
    """``FORMAT`` or ``FORMAT:FILE_FORMAT`` (``--export speculators-tokens:parquet``); jsonl by default."""
    fmt, _, file_format = text.partition(":")
    return _spec(fmt, file_format or "jsonl", f"--export {text}")


def _spec(fmt: object, file_format: object, where: str) -> ExportSpec:
    trainer = trainer_format(fmt, where)
    chosen = next((name for name in FILE_FORMATS if name == file_format), None)
    if chosen is None:
        raise CorpusError(f"{where}: unknown file format {file_format!r} (one of {', '.join(FILE_FORMATS)})")
    return ExportSpec(trainer.name, chosen)


def recipe_exports(docs: CorpusDocuments) -> tuple[ExportSpec, ...]:
    """The corpus recipe's ``publish.exports`` (validated when the corpus was built, but the file may have been
    edited since: a malformed entry is named, not guessed at)."""
    written = docs.setting("publish", "exports")
    if written is None:
        return ()
    where = f"{docs.root / RECIPE}: publish.exports"
    if not isinstance(written, list) or not all(isinstance(entry, dict) for entry in written):
        raise CorpusError(f"{where} is not a list of {{format, file_format}} mappings")
    return tuple(_spec(entry.get("format"), entry.get("file_format", "jsonl"), f"{where}[{index}]")
                 for index, entry in enumerate(written))


@dataclass(frozen=True)
class PublishedExport:
    """One export as uploaded: its files, and each split's path in the repository with its row count."""

    format: ExportFormat
    file_format: FileFormat
    uploads: tuple[UploadFile, ...]
    files: dict[str, tuple[str, int]]  # split -> (path in the repository, rows)
    left_out: dict[str, int]  # reason -> conversations the format could not hold

    def training_commands(self, repo_id: str, target: str) -> list[str]:
        """The commands that train on this export straight from the repository ``repo_id`` (its train split), as
        shell lines; none for a form no trainer here reads (sharegpt, or a file a trainer cannot take from the
        Hub)."""
        if "train" not in self.files:
            return []
        return TRAINER_FORMATS[self.format].commands(self.file_format,
                                                     TrainingFile(repo_id, self.files["train"][0], target))


def write_exports(docs: CorpusDocuments, specs: tuple[ExportSpec, ...], scratch: Path,
                  tokenizer: Path | None) -> list[PublishedExport]:
    """Write each export of ``specs`` from the corpus into ``scratch`` (one directory per format, as in the
    repository), ready to upload."""
    corpus = Corpus(docs.root, docs.manifest)
    published = []
    for spec in dict.fromkeys(specs):  # an export asked for twice is written once
        report = export_corpus(corpus, spec.format, scratch / spec.format, file_format=spec.file_format,
                               tokenizer=tokenizer)
        files = {split: (f"{EXPORTS_PREFIX}{spec.format}/{split}.{spec.file_format}", info.rows)
                 for split, info in report.files.items()}
        uploads = tuple(UploadFile.from_path(files[split][0], info.path) for split, info in report.files.items())
        published.append(PublishedExport(spec.format, spec.file_format, uploads, files, dict(report.skipped)))
    return published
