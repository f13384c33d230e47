"""`corpus build`: recipe -> sources -> (generation) -> checks -> split -> shards -> audit, atomically.

The corpus is staged in ``OUT/.staging-PID`` and moved into place only when complete; ``manifest.json``
moves last, so an interrupted or failed build never leaves a directory that looks like a finished corpus,
and an earlier corpus in OUT stays intact until the new one is ready. The generation journal lives in
``OUT/journal`` and survives every build: it is what makes re-running a build cheap and safe.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from . import __version__
from .audit import Auditor, iter_report_problems
from .checks import Checker, make_renderer
from .corpus import AUDIT, CORPUS_FILES, DATA, FORMAT_VERSION, JOURNAL, LEDGER, MANIFEST, RECIPE
from .errors import CorpusError, Skipped
from .export import EXPORTS_DIR, ExportReport, run_recipe_exports
from .parallel import PreparedBatch, replay_stream
from .recipe import recipe_sha256, resolved_yaml
from .recipe_types import Recipe
from .records import Conversation
from .split import Splitter
from .write import LedgerWriter, ShardWriter

STAGING_PREFIX = ".staging-"


@dataclass
class BuildResult:
    out_dir: Path
    manifest: dict[str, Any]
    audit: dict[str, Any]
    problems: list[str] = field(default_factory=list)  # corpus-level check failures
    exports: list[ExportReport] = field(default_factory=list)  # the recipe's output.exports, written

    @property
    def passed(self) -> bool:
        return not self.problems


def prepare_output(out_dir: Path) -> None:
    """Refuse to write into a directory that is not ours; clear staging left by killed builds."""
    if out_dir.exists():
        if not out_dir.is_dir():
            raise CorpusError("output path exists and is not a directory", file=str(out_dir))
        ours = (*CORPUS_FILES, JOURNAL, EXPORTS_DIR)
        foreign = sorted(p.name for p in out_dir.iterdir()
                         if p.name not in ours and not p.name.startswith(STAGING_PREFIX))
        if foreign:
            raise CorpusError(f"output directory holds files that are not part of a corpus ({', '.join(foreign[:5])});"
                              " choose an empty or corpus directory with --out", file=str(out_dir))
        for stale in out_dir.glob(f"{STAGING_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)


def _commit(staging: Path, out_dir: Path) -> None:
    (out_dir / MANIFEST).unlink(missing_ok=True)  # from here the old corpus no longer looks complete
    for name in (DATA, AUDIT, RECIPE, LEDGER):
        destination = out_dir / name
        if destination.is_dir():
            shutil.rmtree(destination)
        os.replace(staging / name, destination)
    os.replace(staging / MANIFEST, out_dir / MANIFEST)
    shutil.rmtree(staging)


def _write_json(path: Path, value: Any) -> None:
    path.write_bytes(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")


def write_corpus(items: Iterable[Conversation | Skipped], recipe: Recipe, staging: Path) -> BuildResult:
    """Checks, split and writing of one stream into ``staging``; returns the staged manifest and audit."""
    from .tokens import TokenAuditor, TokenSettings

    checker = Checker(recipe.checks, make_renderer(recipe))
    splitter = Splitter(recipe.split.validation_fraction, recipe.split.seed)
    token_settings = TokenSettings.from_recipe(recipe)
    # Sees exactly the batches written; `corpus audit` recomputes them from the files.
    auditor = Auditor(tokens=TokenAuditor(token_settings) if token_settings is not None else None)
    shards = ShardWriter(staging, recipe.output.rows_per_shard, observe=auditor.add_batch)
    ledger = LedgerWriter(staging / LEDGER)
    try:
        for item in checker.run(items):
            if isinstance(item, Skipped):
                ledger.write(item)
            elif isinstance(item, Conversation):
                item.split = splitter.assign(item)
                shards.write(item)
            else:
                shards.write_batch(_with_splits(item, splitter))
    except BaseException:
        shards.abort()
        raise
    finally:
        ledger.close()
    shard_infos = shards.close()
    (staging / RECIPE).write_text(resolved_yaml(recipe), encoding="utf-8")
    splits: dict[str, dict[str, int]] = {}
    for info in shard_infos:
        split = splits.setdefault(info.split, {"rows": 0, "shards": 0})
        split["rows"] += info.rows
        split["shards"] += 1
    manifest: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "tool": {"name": "corpus-builder", "version": __version__},
        "name": recipe.name,
        "recipe_sha256": recipe_sha256(recipe),
        "conversations": sum(info.rows for info in shard_infos),
        "splits": splits,
        "files": [info.to_dict() for info in shard_infos],
    }
    auditor.add_skipped(ledger.counts)
    audit = auditor.report()
    problems = list(iter_report_problems(audit, recipe.checks.min_thinking_share))
    checks = {"min_thinking_share": recipe.checks.min_thinking_share, "passed": not problems, "problems": problems}
    audit["checks"] = checks
    manifest["thinking_conversations"] = audit["thinking_conversations"]
    manifest["checks"] = checks
    _write_json(staging / AUDIT, audit)
    _write_json(staging / MANIFEST, manifest)
    return BuildResult(staging, manifest, audit, problems)


def _with_splits(batch: pa.RecordBatch, splitter: Splitter) -> pa.RecordBatch:
    splits = [splitter.assign_key(source, thinking) for source, thinking
              in zip(batch.column("source").to_pylist(), batch.column("thinking").to_pylist(), strict=True)]
    index = batch.schema.get_field_index("split")
    return batch.set_column(index, batch.schema.field(index), pa.array(splits, pa.string()))


def iter_sources(recipe: Recipe, generated: Iterator[Conversation | Skipped] | None = None
                 ) -> Iterator[Conversation | Skipped | PreparedBatch]:
    """Replay sources in recipe order (parsed on every core), then the generated stream (the split is
    stratified per source, so the order across sources does not change any row's split)."""
    measure = Checker(recipe.checks, make_renderer(recipe)).measure
    return chain(replay_stream(recipe, measure), generated or ())


def iter_prompts(recipe: Recipe) -> Iterator[Conversation | Skipped]:
    from .sources import iter_source

    prompts = chain.from_iterable(iter_source(spec, recipe.base_dir) for spec in recipe.sources
                                  if spec.kind == "prompts")
    if recipe.checks.redact_secrets:  # before the target ever sees them
        from .publish.secrets import redact_conversations

        return redact_conversations(prompts)
    return prompts


def build(recipe: Recipe, out: Path | None = None) -> BuildResult:
    """Build the corpus a recipe describes into ``out`` (default: the recipe's output.dir)."""
    out_dir = out if out is not None else recipe.output.dir
    created = not out_dir.exists()
    prepare_output(out_dir)
    staging = out_dir / f"{STAGING_PREFIX}{os.getpid()}"
    staging.mkdir()
    try:
        with ExitStack() as stack:
            generated = None
            if recipe.has_prompts:
                from .generation import generated_stream

                generated = stack.enter_context(
                    generated_stream(recipe, lambda: iter_prompts(recipe), out_dir / JOURNAL))
            result = write_corpus(iter_sources(recipe, generated), recipe, staging)
        _commit(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()  # a failed first build leaves nothing behind
    result.out_dir = out_dir
    shutil.rmtree(out_dir / EXPORTS_DIR, ignore_errors=True)  # exports of an earlier build are stale now
    result.exports = run_recipe_exports(recipe, out_dir)
    return result
