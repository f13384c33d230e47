"""The trainer exports `corpus publish` uploads beside the corpus, so a published corpus is a training input as it is.

Each is written from the gated corpus into a scratch directory (never into the corpus) and uploaded in the same
commit at ``exports/{format}/{split}.{file_format}``, the layout of a build's own exports; the card names every file
with the command that trains on it (``training_commands``). Which exports: the recipe's ``publish.exports``, or
``corpus publish --export FORMAT[:FILE_FORMAT]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from ..errors import CorpusError
from ..export.formats import EXPORTS_DIR
from ..layout import RECIPE, Corpus
from ..recipe.model import ExportSpec
from ..trainer_formats import EXPORT_FORMATS, FILE_FORMATS, ExportFormat, FileFormat
from .gate import CorpusDocuments
from .upload import UploadFile

EXPORTS_PREFIX = f"{EXPORTS_DIR}/"


def parse_export(text: str) -> ExportSpec:
    """``FORMAT`` or ``FORMAT:FILE_FORMAT`` (``--export speculators-tokens:parquet``); jsonl by default."""
    fmt, _, file_format = text.partition(":")
    return _spec(fmt, file_format or "jsonl", f"--export {text}")


def _spec(fmt: Any, file_format: Any, where: str) -> ExportSpec:
    if fmt not in get_args(ExportFormat):
        raise CorpusError(f"{where}: unknown export format {fmt!r} (one of {', '.join(EXPORT_FORMATS)})")
    if file_format not in get_args(FileFormat):
        raise CorpusError(f"{where}: unknown file format {file_format!r} (one of {', '.join(FILE_FORMATS)})")
    return ExportSpec(fmt, file_format)


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

    format: str
    file_format: str
    uploads: tuple[UploadFile, ...]
    files: dict[str, tuple[str, int]]  # split -> (path in the repository, rows)
    left_out: dict[str, int]  # reason -> conversations the format could not hold


def write_exports(docs: CorpusDocuments, specs: tuple[ExportSpec, ...], scratch: Path,
                  tokenizer: Path | None) -> list[PublishedExport]:
    """Write each export of ``specs`` from the corpus into ``scratch`` (one directory per format, as in the
    repository), ready to upload."""
    from ..export import export_corpus

    corpus = Corpus(docs.root, docs.manifest)
    published = []
    for spec in dict.fromkeys(specs):  # an export asked for twice is written once
        report = export_corpus(corpus, spec.format, scratch / spec.format, file_format=spec.file_format,
                               tokenizer=tokenizer)
        files = {split: (f"{EXPORTS_PREFIX}{spec.format}/{split}.{spec.file_format}", int(info["rows"]))
                 for split, info in report.files.items()}
        uploads = tuple(UploadFile.from_path(files[split][0], Path(info["path"]))
                        for split, info in report.files.items())
        published.append(PublishedExport(spec.format, spec.file_format, uploads, files, dict(report.skipped)))
    return published


def _hub_path(repo_id: str, path_in_repo: str) -> str:
    return f"hf://datasets/{repo_id}/{path_in_repo}"


def training_commands(export: PublishedExport, repo_id: str, target: str) -> list[str]:
    """The commands that train on ``export`` straight from the repository ``repo_id`` (its train split), as shell
    lines; none for a form no trainer here reads (sharegpt, or a file a trainer cannot take from the Hub)."""
    if "train" not in export.files:
        return []
    path = export.files["train"][0]
    download = f"hf download {repo_id} {path} --repo-type dataset --local-dir ."
    if export.format in ("speculators", "speculators-tokens") and export.file_format == "jsonl":
        render = " --render-endpoint http://localhost:8000" if export.format == "speculators" else ""
        commands = [f"speculators prepare-data --model {target} --data {_hub_path(repo_id, path)} --output ./data "
                    f"--seq-length 8192{render}"]
        if export.format == "speculators-tokens":  # SpecForge takes the same rows as they are
            commands += [download, f"specforge train -c CONFIG.yaml model.target_model_path={target} "
                                   f"data.prompts_path={path}"]
        return commands
    if export.format == "specforge" and export.file_format == "jsonl":
        return [download, f"specforge train -c CONFIG.yaml model.target_model_path={target} "
                          f"data.train_data_path={path} data.chat_template=TEMPLATE"]
    if export.format == "messages" and export.file_format == "jsonl":
        return [f"python examples/speculative_decoding/main.py --config general/speculative_decoding/eagle3 "
                f"model.model_name_or_path={target} data.data_path={_hub_path(repo_id, path)} "
                "training.output_dir=ckpts/eagle3"]
    return []
