"""The names of the trainer formats a built corpus is exported in, and the file formats of an export: for the
recipe's typed exports and the CLI's choices (a test ties the recipe schema's enums to them; every other fact of a
format is its record in ``export.formats.TRAINER_FORMATS``, which a test holds to these names); and the benchmark
format an eval pack is exported in. A leaf with no imports of its own, so ``corpus --help`` lists the choices without
loading the export stage."""

from __future__ import annotations

from typing import Final, Literal, get_args

ExportFormat = Literal["speculators", "speculators-tokens", "specforge", "messages", "sharegpt"]
FileFormat = Literal["jsonl", "jsonl.zst", "parquet"]

EXPORT_FORMATS: Final[tuple[ExportFormat, ...]] = get_args(ExportFormat)
# The formats whose rows are in the target's tokens: a recipe that asks for one needs target.tokenizer, and their
# rows cannot re-render differently from what the target served.
IN_TARGET_TOKENS: Final[frozenset[ExportFormat]] = frozenset({"speculators-tokens"})
FILE_FORMATS: Final[tuple[FileFormat, ...]] = get_args(FileFormat)

# An eval pack (any conversations file, or a built corpus's eval/) as vLLM's benchmark clients read it, replayed
# one request per conversation or turn by turn (eval.bench). `corpus export` only: a recipe's exports write the
# corpus, which holds no pack.
BENCH_FORMAT: Final = "vllm-bench"
BenchTurns = Literal["single", "multi"]
BENCH_TURNS: Final[tuple[BenchTurns, ...]] = get_args(BenchTurns)
