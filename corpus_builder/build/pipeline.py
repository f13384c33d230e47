"""`corpus build`: recipe -> sources -> (generation) -> checks -> split -> shards -> audit, atomically.

The corpus is staged in ``OUT/.staging-PID`` and moved into place only when complete; ``manifest.json``
moves last, so an interrupted or failed build never leaves a directory that looks like a finished corpus,
and an earlier corpus in OUT stays intact until the new one is ready. The generation journal lives in
``OUT/journal`` and survives every build: it is what makes re-running a build cheap and safe.

The build is the one place that decides what runs. It loads the target's renderer once and shares it
with the checks, the token statistics and the exports; the prompt stage reads the prompt sources once
and decides once between a journal-only rebuild and preflight-then-backend.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from .. import __version__
from ..errors import CorpusError, Skipped
from ..export import EXPORTS_DIR, ExportReport, run_recipe_exports
from ..layout import AUDIT, CORPUS_FILES, DATA, FORMAT_VERSION, JOURNAL, LEDGER, MANIFEST, RECIPE, write_json
from ..progress import ProgressLine
from ..recipe import recipe_sha256, resolved_yaml
from ..recipe.model import Recipe
from ..records import Conversation
from ..sources import MeasuredRows, replay_stream
from ..tokens import TokenRows, TokenSettings
from .checks import Checker, RowStats
from .prompt_stage import generated_rows
from .shards import LedgerWriter, ShardWriter
from .split import Splitter
from .stats import CorpusStats, corpus_problems
from .token_stats import TokenStats

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


@dataclass(frozen=True)
class TargetTokens:
    """The target's tokenizer and template, loaded once per build (None parts when the recipe names none)."""

    settings: TokenSettings | None
    rows: TokenRows | None

    @classmethod
    def for_recipe(cls, recipe: Recipe) -> TargetTokens:
        settings = TokenSettings.from_recipe(recipe)
        return cls(settings, TokenRows(settings.renderer()) if settings is not None else None)


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


def _replay_rows(recipe: Recipe, checker: Checker, stream: TextIO
                 ) -> Iterator[Conversation | Skipped | MeasuredRows[RowStats]]:
    if not any(spec.kind == "replay" for spec in recipe.sources):
        return
    progress = ProgressLine("read replay", stream=stream)
    for measured in replay_stream(recipe, checker.measure):
        progress.advance(len(measured.items))
        yield measured
    progress.finish()


def write_corpus(items: Iterable[Conversation | Skipped | MeasuredRows[RowStats]], recipe: Recipe, staging: Path,
                 ledger: LedgerWriter, checker: Checker, tokens: TargetTokens) -> BuildResult:
    """Checks, split and writing of one stream into ``staging``; returns the staged manifest and audit."""
    splitter = Splitter(recipe.split.validation_fraction, recipe.split.seed)
    # Sees exactly the rows written; `corpus audit` recomputes the same from the files.
    auditor = CorpusStats(tokens=TokenStats(tokens.settings, tokens.rows)
                      if tokens.settings is not None and tokens.rows is not None else None)
    shards = ShardWriter(staging, recipe.output.rows_per_shard, observe=auditor.add_rows)
    try:
        for item in checker.run(items):
            if isinstance(item, Skipped):
                ledger.write(item)
            else:
                item.split = splitter.assign(item)
                shards.write(item)
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
    problems = list(corpus_problems(audit, recipe.checks.min_thinking_share))
    checks = {"min_thinking_share": recipe.checks.min_thinking_share, "passed": not problems, "problems": problems}
    audit["checks"] = checks
    manifest["thinking_conversations"] = audit["thinking_conversations"]
    manifest["checks"] = checks
    write_json(staging / AUDIT, audit)
    write_json(staging / MANIFEST, manifest)
    return BuildResult(staging, manifest, audit, problems)


def build(recipe: Recipe, out: Path | None = None, *, progress: TextIO | None = None) -> BuildResult:
    """Build the corpus a recipe describes into ``out`` (default: the recipe's output.dir).

    ``progress`` is where phase lines, the preflight and server notes go (default: standard error)."""
    stream = progress if progress is not None else sys.stderr
    out_dir = out if out is not None else recipe.output.dir
    created = not out_dir.exists()
    prepare_output(out_dir)
    staging = out_dir / f"{STAGING_PREFIX}{os.getpid()}"
    staging.mkdir()
    try:
        tokens = TargetTokens.for_recipe(recipe)
        renderer = tokens.rows.renderer if tokens.rows is not None else None
        checker = Checker(recipe.checks, renderer)
        ledger = LedgerWriter(staging / LEDGER)
        with ExitStack() as stack:
            stack.callback(ledger.close)
            generated: Iterable[Conversation | Skipped] = ()
            if recipe.has_prompts:
                generated = stack.enter_context(
                    generated_rows(recipe, out_dir / JOURNAL, staging, ledger, renderer, stream))
            replay = _replay_rows(recipe, checker, stream)
            result = write_corpus(_chain(replay, generated), recipe, staging, ledger, checker, tokens)
        _commit(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()  # a failed first build leaves nothing behind
    result.out_dir = out_dir
    shutil.rmtree(out_dir / EXPORTS_DIR, ignore_errors=True)  # exports of an earlier build are stale now
    result.exports = run_recipe_exports(recipe, out_dir, tokens.rows, stream)
    return result


def _chain(replay: Iterator[Conversation | Skipped | MeasuredRows[RowStats]],
           generated: Iterable[Conversation | Skipped]) -> Iterator[Conversation | Skipped | MeasuredRows[RowStats]]:
    """Replay rows, then generated ones (the split is stratified per source, so the order across sources
    changes no row's split)."""
    yield from replay
    yield from generated
