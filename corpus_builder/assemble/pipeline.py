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
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from .._version import __version__
from ..errors import REASONS, CorpusError, DropCounts
from ..export import EXPORTS_DIR, ExportReport, run_recipe_exports
from ..generate import GenerationIncomplete
from ..generate.journal import LOCK_NAME as JOURNAL_LOCK
from ..generate.journal import SEGMENT_GLOB
from ..generate.scheduler import UNFINISHED
from ..layout import (
    AUDIT,
    BUILD_LOCK,
    CORPUS_FILES,
    DATA,
    EVAL,
    JOURNAL,
    LEDGER,
    MANIFEST,
    RECIPE,
    Manifest,
    ShardInfo,
    SplitCount,
    build_lock,
    write_json,
)
from ..outputs import check_output_path
from ..ray_extra import named_cluster, ray_engine
from ..recipe import recipe_sha256, resolved_yaml
from ..recipe.crosscheck import match_source_pattern
from ..recipe.model import Engine as EngineName
from ..recipe.model import Recipe
from ..screen.dedup import EvalSets, describe_screening, read_eval_sets
from ..sources.formats import check_source_formats
from ..stats.corpus import AuditReport, CorpusStats, corpus_problems, generation_targets
from ..stats.pack import pack_mix
from .collect import declared_mixture, generate_in_rounds
from .eval_pack import EvalPack, cut_eval_pack
from .local import LocalEngine
from .mixture import plan_selection
from .plan import Engine, Plan, TargetTokens
from .prompt_stage import GenerationSession
from .shards import LedgerWriter
from .split import split_balance

STAGING_PREFIX = ".staging-"


class EmptyCorpus(CorpusError):
    """Every row was dropped (or the sources gave none): nothing is written unless the user asks for an empty
    corpus, so no empty directory looks like a finished corpus."""

    exit_code = 1

    @classmethod
    def from_audit(cls, audit: AuditReport, recipe_path: Path | None) -> EmptyCorpus:
        skipped = audit["skipped"]
        found = f"all {sum(skipped.values()):,} rows were dropped or skipped" if skipped else "the sources gave no rows"
        reasons = [f"{reason}: {count:,} rows ({REASONS.get(reason, reason)})"
                   for reason, count in sorted(skipped.items(), key=lambda item: -item[1])]
        return cls(f"the corpus would be empty: {found}; nothing was written (--allow-empty writes an empty corpus "
                   "anyway)", file=str(recipe_path) if recipe_path is not None else None, details=reasons)


@dataclass
class BuildResult:
    out_dir: Path
    manifest: Manifest
    audit: AuditReport
    problems: list[str] = field(default_factory=list)  # corpus-level check failures
    exports: list[ExportReport] = field(default_factory=list)  # the recipe's output.exports, written

    @property
    def passed(self) -> bool:
        return not self.problems


def recipe_inputs(recipe: Recipe) -> list[Path | None]:
    """What a build of the recipe reads from disk: the recipe, the sources' files, the evaluation sets, the
    tokenizer and the model directory it launches (None where the recipe names none)."""
    launch = recipe.target.launch
    return [recipe.path, recipe.target.tokenizer, launch.model_dir if launch is not None else None,
            *(path for spec in recipe.sources for pattern in spec.paths
              for path in match_source_pattern(recipe.base_dir, pattern)),
            *(spec.path for spec in (recipe.decontamination.eval_sets if recipe.decontamination else ()))]


def check_output_dir(recipe: Recipe, out_dir: Path, what: str) -> None:
    """Refuse, before anything is touched, a path that cannot be the recipe's corpus directory: the output guard
    (a directory or nothing yet, not an input nor inside one, not inside a corpus but the one it rebuilds),
    then a directory that holds files of its own (the corpus would be mixed into them)."""
    check_output_path(out_dir, what=what, inputs=recipe_inputs(recipe), directory=True, rebuilds_corpus=True)
    ours = (*CORPUS_FILES, JOURNAL, EXPORTS_DIR, BUILD_LOCK)
    foreign = sorted(p.name for p in out_dir.iterdir() if p.name not in ours
                     and not p.name.startswith(STAGING_PREFIX)) if out_dir.is_dir() else []
    if foreign:
        raise CorpusError(f"{what}: the directory holds files that are not part of a corpus "
                          f"({', '.join(foreign[:5])}); choose an empty or corpus directory", file=str(out_dir))


@contextmanager
def filesystem_errors(out_dir: Path) -> Iterator[None]:
    """A full disk, an unwritable or vanished path: a user-fixable error naming the file, not a traceback."""
    try:
        yield
    except OSError as error:
        where = error.filename or out_dir
        raise CorpusError(f"cannot write the corpus: {error.strerror or error}; the journal keeps every finished "
                          "generation and an earlier corpus in this directory is intact: fix this and rerun",
                          file=str(where)) from error


def clear_staging(out_dir: Path) -> None:
    """Remove the staging left by killed builds (safe: the output lock is held)."""
    for stale in out_dir.glob(f"{STAGING_PREFIX}*"):
        shutil.rmtree(stale, ignore_errors=True)


def _remove_first_build(out_dir: Path) -> None:
    """What a failed first build leaves: nothing, except a server log an error message names."""
    journal = out_dir / JOURNAL
    if journal.is_dir() and not any(journal.glob(SEGMENT_GLOB)):
        (journal / JOURNAL_LOCK).unlink(missing_ok=True)
        with suppress(OSError):
            journal.rmdir()
    shutil.rmtree(out_dir / EXPORTS_DIR, ignore_errors=True)
    if {p.name for p in out_dir.iterdir()} <= {BUILD_LOCK}:
        (out_dir / BUILD_LOCK).unlink(missing_ok=True)
        with suppress(OSError):
            out_dir.rmdir()


def _commit(staging: Path, out_dir: Path) -> None:
    (out_dir / MANIFEST).unlink(missing_ok=True)  # from here the old corpus no longer looks complete
    for name in (DATA, AUDIT, RECIPE, LEDGER, EVAL):
        destination = out_dir / name
        if destination.is_dir():
            shutil.rmtree(destination)
        if name != EVAL or (staging / name).exists():  # a build without an eval pack leaves none behind
            os.replace(staging / name, destination)
    os.replace(staging / MANIFEST, out_dir / MANIFEST)
    shutil.rmtree(staging)


def unfinished_rows(drops: DropCounts, allow_partial: bool) -> int:
    """The generated rows left unfinished (requests out of retries), by the ledger's counts; GenerationIncomplete,
    before the corpus is finished, when there are any and not ``allow_partial``."""
    unfinished = drops.by_reason[UNFINISHED]
    if unfinished and not allow_partial:
        raise GenerationIncomplete(
            f"{unfinished:,} generated rows are unfinished (their requests ran out of retries on transient "
            "faults): nothing was written; rerun to resume (every finished turn is journaled), or accept a "
            "partial corpus with --allow-partial (target.generation.allow_partial)", unfinished_rows=unfinished)
    return unfinished


def finish_corpus(recipe: Recipe, staging: Path, shard_infos: list[ShardInfo], auditor: CorpusStats,
                  drops: DropCounts, *, unfinished: int = 0, mixture: dict[str, Any] | None = None,
                  screening: dict[str, Any] | None = None, pack: EvalPack | None = None) -> BuildResult:
    """The staged corpus's recipe, audit and manifest, from its written shards, the statistics of the rows in
    them and the ledger's counts: what either engine (local, Ray) writes last."""
    (staging / RECIPE).write_text(resolved_yaml(recipe), encoding="utf-8")
    splits: dict[str, SplitCount] = {}
    for info in shard_infos:
        split = splits.get(info.split, SplitCount(0, 0))
        splits[info.split] = SplitCount(split.rows + info.rows, split.shards + 1)
    auditor.add_skipped(drops)
    audit = auditor.report()
    problems = list(corpus_problems(audit, recipe.checks.min_thinking_share))
    checks: dict[str, Any] = {
        "min_thinking_share": recipe.checks.min_thinking_share, "passed": not problems, "problems": problems,
        "split_outside_tolerance": split_balance(audit["strata"], recipe.split.validation_fraction)}
    audit["checks"] = checks
    if pack is not None:
        audit["eval_pack"] = pack_mix({stratum: held for stratum, (_, held) in pack.cut.strata.items() if held}, audit)
    sections: dict[str, Any] = {}
    if unfinished:
        sections["partial"] = {"unfinished_rows": unfinished}
    targets = generation_targets(audit)
    if targets:
        sections["targets"] = targets
    if screening is not None:
        sections.update(screening)
    if pack is not None:
        sections["eval"] = pack.describe()
    if mixture is not None:
        checks["mixture"] = sections["mixture"] = mixture
        if mixture["shortfalls"]:
            sections["short"] = mixture["shortfalls"]
    manifest = Manifest(name=recipe.name, recipe_sha256=recipe_sha256(recipe),
                        conversations=sum(info.rows for info in shard_infos),
                        thinking_conversations=audit["thinking_conversations"], splits=splits, files=shard_infos,
                        checks=checks, tool={"name": "corpus-builder", "version": __version__}, sections=sections,
                        pack_files=pack.files if pack is not None else [])
    write_json(staging / AUDIT, audit)
    write_json(staging / MANIFEST, manifest.to_json())
    return BuildResult(staging, manifest, audit, problems)


def build_corpus(recipe: Recipe, out: Path | None = None, *, progress: TextIO | None = None,
                 allow_partial: bool | None = None, allow_short: bool | None = None, allow_empty: bool = False,
                 engine: EngineName | None = None, address: str | None = None) -> BuildResult:
    """Build the corpus a recipe describes into ``out`` (default: the recipe's output.dir).

    ``progress`` is where phase lines, the preflight and server notes go (default: standard error);
    ``allow_partial`` overrides ``target.generation.allow_partial``, ``allow_short`` ``mixture.allow_short``;
    a corpus without rows fails with EmptyCorpus, nothing written, unless ``allow_empty``. ``engine`` overrides
    the recipe's: ``ray`` runs the build on the Ray cluster at ``address`` (``assemble/ray_data.py``), the same
    corpus."""
    check_source_formats(recipe)
    on_ray = (engine or recipe.engine) == "ray"
    if on_ray:
        check_ray_engine(address)
    out_dir = out if out is not None else recipe.output.dir
    with filesystem_errors(out_dir):  # a directory that cannot be listed
        check_output_dir(recipe, out_dir, "--out" if out is not None else "output.dir")
    stream = progress if progress is not None else sys.stderr
    eval_sets = read_eval_sets(recipe.decontamination)  # a set that would check nothing stops the build here
    for warning in eval_sets.warnings() if eval_sets is not None else ():
        print(f"warning: {warning}", file=stream)
    created = not out_dir.exists()
    with filesystem_errors(out_dir), build_lock(out_dir):
        try:
            return _build_locked(recipe, out_dir, eval_sets, stream,
                                 recipe.target.generation.allow_partial if allow_partial is None else allow_partial,
                                 recipe.mixture.allow_short if allow_short is None else allow_short, allow_empty,
                                 RayCluster(address) if on_ray else None)
        except BaseException:
            if created:
                _remove_first_build(out_dir)
            raise


def check_ray_engine(address: str | None) -> None:
    """Refuse, before anything is touched, a Ray build without Ray installed (a CorpusError that says how to
    install it) or on a cluster named by what is not an address (``address``, else RAY_ADDRESS)."""
    ray_engine("corpus_builder.assemble.ray_data", "build")
    named_cluster(address)


@dataclass(frozen=True)
class RayCluster:
    """Where a Ray build runs: the cluster's address (None: RAY_ADDRESS, else one started on this machine)."""

    address: str | None


def _build_locked(recipe: Recipe, out_dir: Path, eval_sets: EvalSets | None, stream: TextIO, allow_partial: bool,
                  allow_short: bool, allow_empty: bool, cluster: RayCluster | None) -> BuildResult:
    clear_staging(out_dir)
    staging = out_dir / f"{STAGING_PREFIX}{os.getpid()}"
    staging.mkdir()
    try:
        tokens = TargetTokens.for_recipe(recipe)
        contamination = eval_sets.index if eval_sets is not None else None
        plan = Plan.of(recipe, contamination)
        screening = describe_screening(recipe, eval_sets)
        pack = (cut_eval_pack(plan.pack, plan.read.parts, plan.write.rows_per_shard, staging, stream)
                if plan.pack is not None else None)
        ledger = LedgerWriter(staging / LEDGER)
        with ExitStack() as stack:
            stack.callback(ledger.close)  # the write closes it too, but a build can fail before that
            session = (GenerationSession(recipe, out_dir / JOURNAL, staging, ledger, tokens.renderer, stream, stack,
                                         screen=plan.prompt_screen())
                       if plan.generates else None)
            auditor = tokens.auditor()
            engine = _engine(cluster, plan, staging, ledger, tokens, auditor, stream, pack)
            shard_infos, mixture = run_plan(plan, engine, session, allow_short)
            result = finish_corpus(recipe, staging, shard_infos, auditor, ledger.drops,
                                   unfinished=unfinished_rows(ledger.drops, allow_partial), mixture=mixture,
                                   screening=screening, pack=pack)
        if not result.manifest.conversations and not allow_empty:
            raise EmptyCorpus.from_audit(result.audit, recipe.path)
        _commit(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    result.out_dir = out_dir
    shutil.rmtree(out_dir / EXPORTS_DIR, ignore_errors=True)  # exports of an earlier build are stale now
    result.exports = run_recipe_exports(recipe, out_dir, tokens.rows, stream, allow_empty=allow_empty)
    return result


def _engine(cluster: RayCluster | None, plan: Plan, staging: Path, ledger: LedgerWriter, tokens: TargetTokens,
            auditor: CorpusStats, stream: TextIO, pack: EvalPack | None) -> Engine:
    """The engine the build runs on: the Ray cluster's, else this machine's."""
    if cluster is not None:
        from .ray_data import RayEngine

        return RayEngine(plan, staging, ledger, auditor, pack, cluster.address, stream)
    return LocalEngine(plan, staging, ledger, tokens, auditor, stream, pack.screen if pack is not None else None)


def run_plan(plan: Plan, engine: Engine, session: GenerationSession | None, allow_short: bool
             ) -> tuple[list[ShardInfo], dict[str, Any] | None]:
    """The plan's stages on ``engine``: the screen, the keyed stages, the take (prompt sources generated in rounds,
    a declared corpus planned: one that cannot be met stops here, before anything is written, unless
    ``allow_short``), the write. Returns the shards and the declared corpus's report (None: nothing declared)."""
    engine.screen()
    for stage in plan.keyed:
        engine.group(stage)
    selection = mixture = None
    if plan.takes:
        engine.take(plan.select)
        generated = (generate_in_rounds(plan.select, session, engine.available, engine.extend, allow_short)
                     if session is not None else {})
        if plan.select.declared:
            selection = plan_selection(plan.select, engine.available(), generated)
            mixture = declared_mixture(plan.select.mixture, selection, allow_short)
    return engine.write(selection), mixture
