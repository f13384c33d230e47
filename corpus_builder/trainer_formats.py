"""The trainer formats a built corpus is exported in, and the file formats of an export: named once, for the
recipe's typed exports, the export stage and the CLI's choices (a test ties the recipe schema's enums to them).
A leaf with no imports of its own, so ``corpus --help`` lists the choices without loading the export stage."""

from __future__ import annotations

from typing import Final, Literal, get_args

ExportFormat = Literal["speculators", "speculators-tokens", "specforge", "messages", "sharegpt"]
FileFormat = Literal["jsonl", "jsonl.zst", "parquet"]

EXPORT_FORMATS: Final[tuple[ExportFormat, ...]] = get_args(ExportFormat)
FILE_FORMATS: Final[tuple[FileFormat, ...]] = get_args(FileFormat)
