"""`corpus audit CORPUS --against TRAFFIC`: how far a built corpus is from the traffic the target serves,
dimension by dimension, and what to change in the recipe to close the gap.

Both sides are read once into count tables (``profile``), by the same code, so the same rows give the same
numbers and a traffic log identical to the corpus is at distance 0. Each dimension is a distribution over
buckets; its divergence is the total variation distance (half the L1 distance: the share of mass that must
move), with the buckets whose shares differ most. Dimensions:

* ``thinking`` (mode: as served where the traffic records ``enable_thinking``, else reasoning present),
  ``task``, ``task_thinking`` (task and mode together), ``turns`` (assistant turns per conversation),
  ``tool_calls``, ``script`` (of the first user turn);
* in the target's tokens, on a seeded sample of each side: ``prompt_tokens``, ``response_tokens``,
  ``reasoning_tokens`` (turns with reasoning), ``conversation_tokens``, ``copy_share`` (per turn, the share of
  response tokens inside spans of at least N tokens found verbatim earlier in the context) and
  ``token_frequencies`` (the supervised tokens, the loss mask's); plus the coverage of the traffic's
  supervised tokens by the top-k draft vocabulary chosen from the corpus as ``corpus vocab`` chooses it.

The suggestions turn the gaps into rows to add or drop: per task (when the traffic says its task) and
thinking mode, the rows each corpus source should contribute for the corpus, at its size, to follow the
traffic, written as a diff of the corpus's resolved recipe (``take`` counts) the user can paste; plus what
a recipe cannot say (lengths, copy-heavy tasks better served by prompt lookup, the vocabulary's coverage).
"""

from __future__ import annotations

import copy
import difflib
import math
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import numpy as np
import polars as pl

from ..errors import CorpusError
from ..layout import Corpus
from ..stats import nearest_rank
from ..stats.facts import ASSISTANT_TURNS, SERVED, THINKING, THINKING_MODE, TOOL_USE
from ..stats.vocab import coverage, top_k
from .comparison import (
    Comparison,
    Copies,
    CopyFigures,
    Divergence,
    Gap,
    GroupCopies,
    GroupShares,
    LengthRow,
    PlanEntry,
    Readable,
    Side,
    Vocab,
)
from .files import CorpusFiles, is_hub_path, opened_corpus
from .frames import NO_TASK
from .inputs import corpus_units, traffic_units
from .options import AuditOptions, check_ray_engine
from .profile import COPY_BUCKETS, LENGTH_BUCKETS, LENGTH_MEASURES, Profile, read_profile
from .token_pass import TokenMeter

GAPS_SHOWN: Final = 3
TURN_BUCKETS: Final = ("0", "1", "2", "3", "4-5", "6-10", "11+")
COVERAGE_POINTS: Final = (1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000)
COPY_HEAVY_SHARE: Final = 0.30  # a task this copy-heavy is prompt lookup's traffic
THINKING_TOLERANCE: Final = 0.02  # a task's thinking share this close to the traffic's needs no move
PERCENTILES: Final = (50, 90, 99)
FACT_DIMENSIONS: Final = ("thinking", "task", "task_thinking", "turns", "tool_calls", "script")
TOKEN_DIMENSIONS: Final = (*LENGTH_MEASURES, "copy_share", "token_frequencies")


@contextmanager
def _compared_corpus(corpus: str | Path | CorpusFiles, endpoint: str | None) -> Iterator[CorpusFiles]:
    """The corpus to compare: as the caller opened it (``audit.audited``: its files read once for both), else
    its directory, or ``hf://datasets/ORG/NAME`` downloaded for the duration."""
    if isinstance(corpus, CorpusFiles):
        yield corpus
        return
    text = str(corpus)
    if not is_hub_path(text) and not Path(text).is_dir():
        raise CorpusError("--against and --html compare a built corpus: give its directory", file=text)
    with opened_corpus(text, endpoint) as opened:
        yield CorpusFiles(opened)


def _meter(files: CorpusFiles, options: AuditOptions) -> TokenMeter | None:
    renderer = files.renderer_for(options.tokenizer)
    return TokenMeter(renderer, options.span_tokens) if renderer is not None else None


def profile_corpus(corpus: Corpus | CorpusFiles, options: AuditOptions) -> tuple[Profile, TokenMeter | None]:
    files = corpus if isinstance(corpus, CorpusFiles) else CorpusFiles(corpus)
    meter = _meter(files, options)
    profile = read_profile(str(files.corpus.root), corpus_units(files.corpus), meter,
                           token_sample=options.token_sample, seed=options.seed)
    profile.skipped.update(files.drops.by_reason)
    return profile, meter


def audit_against(corpus: str | Path | CorpusFiles, traffic: str, options: AuditOptions | None = None
                  ) -> Comparison:
    """The corpus and the traffic side by side: every dimension's divergence, gaps, suggestions and the
    recipe diff (see the module docstring)."""
    options = options or AuditOptions()
    with _compared_corpus(corpus, options.endpoint) as files:
        corpus_profile, meter = profile_corpus(files, options)
        traffic_profile = read_traffic(traffic, meter, options)
        _require_readable(traffic_profile)
        if not options.allow_other_models:
            _require_same_target(files, traffic_profile)
        return compare(files, corpus_profile, traffic_profile, options, meter)


def read_traffic(traffic: str, meter: TokenMeter | None, options: AuditOptions) -> Profile:
    """The traffic's profile, read here or on a Ray cluster (``options.engine``): the same counts."""
    if options.engine == "ray":
        check_ray_engine()
        from .ray_data import read_traffic_on_ray

        return read_traffic_on_ray(traffic, meter, token_sample=options.token_sample, seed=options.seed,
                                   address=options.address)
    return read_profile(traffic, traffic_units(traffic), meter, token_sample=options.token_sample, seed=options.seed)


def target_names(files: CorpusFiles) -> set[str]:
    """The names the corpus's target goes by: the recipe's ``target.model`` and what the servers that generated
    its rows called it (served name, model id, model path)."""
    names: set[str] = set()
    recipe = files.recipe
    target = recipe.get("target") if isinstance(recipe, dict) else None
    if isinstance(target, dict) and isinstance(target.get("model"), str):
        names.add(target["model"])
    audit = files.corpus.audit()
    for setting in audit.get("generation") or ():
        names.update(value for key in ("model", "served_model", "model_root")
                     if isinstance(value := setting.get(key), str) and value)
    names.update((audit.get("served") or {}).get("models") or ())  # the models its replayed logs were served by
    return names


def _same_model(name: str, names: set[str]) -> bool:
    """A served name matches one of the target's, or names the same model directory (``ORG/NAME`` or a path
    ending in NAME)."""
    return name in names or name.rstrip("/").rsplit("/", 1)[-1] in {known.rstrip("/").rsplit("/", 1)[-1]
                                                                      for known in names}


def _require_same_target(files: CorpusFiles, profile: Profile) -> None:
    """Traffic served by another model than the corpus's target is not the traffic its draft will see: refused."""
    names = target_names(files)
    if not names or not profile.models:
        return
    others = {model: count for model, count in profile.models.items() if not _same_model(model, names)}
    if others:
        listed = ", ".join(f"{model} ({count:,} requests)" for model, count in sorted(others.items()))
        raise CorpusError(f"the traffic was served by another model than the corpus's target "
                          f"({', '.join(sorted(names))}): {listed}; compare the target's own traffic, or pass "
                          "--allow-other-models", file=profile.label)


def _require_readable(profile: Profile) -> None:
    """Traffic with no row the readers take has nothing to compare: an error, not a report of a distance to nothing."""
    if profile.rows_read:
        return
    skipped = sum(profile.skipped.values())
    reasons = ", ".join(f"{reason} {count:,}" for reason, count in sorted(profile.skipped.items()) if count)
    raise CorpusError("no readable traffic rows: " + (f"all {skipped:,} skipped ({reasons})" if skipped
                                                       else "it holds no rows"), file=profile.label)


def describe_corpus(corpus: str | Path | CorpusFiles, options: AuditOptions | None = None) -> Comparison:
    """One side only: the sections of the comparison for the corpus (what the HTML report plots without
    ``--against``)."""
    options = options or AuditOptions()
    with _compared_corpus(corpus, options.endpoint) as files:
        profile, meter = profile_corpus(files, options)
        report: Comparison = {"corpus": describe(profile)}
        if profile.tokens is not None:
            report["vocab"] = _vocab_alone(profile.tokens.frequencies, options.draft_vocab_size)
        _note_tokens(report, meter)
        return report


def _note_tokens(report: Comparison, meter: TokenMeter | None) -> None:
    report["tokenizer"] = str(meter.renderer.tokenizer_dir) if meter is not None else None
    if meter is None:
        report.setdefault("notes", []).append(
            "token dimensions left out: no target tokenizer found for the corpus (give --tokenizer DIR)")


# --- one side ------------------------------------------------------------------------------------------


def as_shares(counts: dict[str, int]) -> dict[str, float]:
    """The counts as shares, in the counts' own order (bucket order, or sorted names)."""
    total = sum(counts.values())
    return {key: count / total for key, count in counts.items()} if total else {}


def _turn_bucket(turns: int) -> str:
    if turns <= 3:
        return str(turns)
    return "4-5" if turns <= 5 else "6-10" if turns <= 10 else "11+"


def _mode(thinking: bool | None) -> str:
    return "thinking" if thinking else "non-thinking"


def _counts(frame: pl.DataFrame, key: pl.Expr) -> dict[str, int]:
    if frame.is_empty():
        return {}
    grouped = frame.group_by(key.alias("key")).agg(pl.col("count").sum()).sort("key")
    return {str(k): int(v) for k, v in grouped.iter_rows()}


def _by(frame: pl.DataFrame, name: str) -> dict[str, GroupShares]:
    """Conversations, thinking (mode) and reasoning shares per value of ``name``."""
    if frame.is_empty():
        return {}
    grouped = frame.group_by(pl.col(name).fill_null("").alias("key")).agg(
        conversations=pl.col("count").sum(),
        thinking=pl.col("count").filter(pl.col(THINKING_MODE)).sum(),
        reasoning=pl.col("count").filter(pl.col(THINKING)).sum(),
        task=pl.col("task").sort_by("count", descending=True).first()).sort("key")
    shares: dict[str, GroupShares] = {}
    for key, n, t, r, task in grouped.iter_rows():
        shares[key] = {"conversations": int(n), "thinking_share": round(t / n, 6) if n else 0.0,
                       "reasoning_share": round(r / n, 6) if n else 0.0}
        if name == "source":
            shares[key]["task"] = task
    return shares


def fact_counts(profile: Profile) -> dict[str, dict[str, int]]:
    """Each fact dimension's counts over its buckets."""
    facts = profile.facts.frame()
    if facts.is_empty():
        return {name: {} for name in FACT_DIMENSIONS}
    turns: Counter[str] = Counter()
    for value, count in _counts(facts, pl.col(ASSISTANT_TURNS)).items():
        turns[_turn_bucket(int(value))] += count
    mode = pl.when(pl.col(THINKING_MODE)).then(pl.lit("thinking")).otherwise(pl.lit("non-thinking"))
    return {
        "thinking": _counts(facts, mode),
        "task": _counts(facts, pl.col("task")),
        "task_thinking": _counts(facts, pl.concat_str(pl.col("task"), pl.lit(" / "), mode)),
        "turns": {bucket: turns[bucket] for bucket in TURN_BUCKETS if bucket in turns},
        "tool_calls": _counts(facts, pl.when(pl.col(TOOL_USE)).then(pl.lit("with tool calls"))
                              .otherwise(pl.lit("without"))),
        "script": _counts(facts, pl.col("script")),
    }


def token_counts(profile: Profile) -> dict[str, dict[str, int]]:
    """Each token dimension's counts over its buckets (frequencies apart)."""
    tokens = profile.tokens
    if tokens is None:
        return {}
    buckets = tokens.buckets.frame()
    out: dict[str, dict[str, int]] = {}
    for measure in LENGTH_MEASURES:
        mine = buckets.filter(pl.col("measure") == measure) if not buckets.is_empty() else buckets
        counts = _counts(mine, pl.col("bucket"))
        out[measure] = {bucket: counts[bucket] for bucket in LENGTH_BUCKETS if bucket in counts}
    copies = tokens.copies.frame()
    out["copy_share"] = _bucket_turns(copies) if not copies.is_empty() else {}
    return out


def _percentiles(profile: Profile) -> dict[str, dict[str, int | float]]:
    tokens = profile.tokens
    exact = tokens.exact.frame() if tokens is not None else pl.DataFrame()
    out: dict[str, dict[str, int | float]] = {}
    for measure in LENGTH_MEASURES:
        mine = exact.filter(pl.col("measure") == measure).sort("tokens") if not exact.is_empty() else exact
        if mine.is_empty():
            continue
        values = mine.get_column("tokens").to_numpy()
        counts = mine.get_column("count").to_numpy().astype(np.int64)
        total = int(counts.sum())
        section: dict[str, int | float] = {"count": total, "mean": round(float((values * counts).sum() / total), 1)}
        for share in PERCENTILES:
            section[f"p{share}"] = nearest_rank(values, counts, share)
        section["max"] = int(values[-1])
        out[measure] = section
    return out


def _copies(profile: Profile) -> Copies | None:
    tokens = profile.tokens
    if tokens is None:
        return None
    copies = tokens.copies.frame()

    def section(frame: pl.DataFrame) -> CopyFigures:
        response = int(frame.get_column("response_tokens").sum()) if not frame.is_empty() else 0
        copied = int(frame.get_column("copied_tokens").sum()) if not frame.is_empty() else 0
        return {"turns": int(frame.get_column("turns").sum()) if not frame.is_empty() else 0,
                "response_tokens": response, "copied_tokens": copied,
                "share": round(copied / response, 6) if response else 0.0,
                "longest": int(frame.get_column("longest_copy").to_numpy().max()) if not frame.is_empty() else 0}

    def grouped(name: str) -> dict[str, GroupCopies]:
        if copies.is_empty():
            return {}
        return {str(key): {**section(part), "buckets": _bucket_turns(part)}
                for (key,), part in copies.group_by(name, maintain_order=True)}

    return {"span_tokens": tokens.span_tokens, **section(copies), "by_task": dict(sorted(grouped("task").items())),
            "by_source": dict(sorted(grouped("source").items()))}


def _bucket_turns(frame: pl.DataFrame) -> dict[str, int]:
    counts = {str(k): int(v) for k, v in frame.group_by("copy_bucket").agg(pl.col("turns").sum()).iter_rows()}
    return {bucket: counts[bucket] for bucket in COPY_BUCKETS if bucket in counts}


def _length_table(profile: Profile) -> list[LengthRow]:
    """Length buckets by source and thinking mode (what the report's histograms plot)."""
    tokens = profile.tokens
    buckets = tokens.buckets.frame() if tokens is not None else pl.DataFrame()
    if buckets.is_empty():
        return []
    grouped = buckets.group_by("source", THINKING_MODE, "measure", "bucket").agg(pl.col("count").sum())
    order = {bucket: index for index, bucket in enumerate(LENGTH_BUCKETS)}
    rows: list[LengthRow] = [
        {"source": source, "thinking": _mode(thinking), "measure": measure, "bucket": bucket, "count": int(n)}
            for source, thinking, measure, bucket, n in grouped.iter_rows()]
    return sorted(rows, key=lambda r: (r["measure"], r["source"], r["thinking"], order[r["bucket"]]))


def describe(profile: Profile) -> Side:
    """One side's report: counts, shares per dimension, cross-tabs, lengths, copy-spans."""
    facts = profile.facts.frame()
    conversations = int(facts.get_column("count").sum()) if not facts.is_empty() else 0
    counts = fact_counts(profile)
    thinking = counts["thinking"].get("thinking", 0)
    reasoning = int(facts.filter(pl.col(THINKING)).get_column("count").sum()) if conversations else 0
    side: Side = {
        "label": profile.label,
        "conversations": conversations,
        "skipped": dict(sorted((k, v) for k, v in profile.skipped.items() if v)),
        "folded_prefix": profile.folded,
        "thinking_share": round(thinking / conversations, 6) if conversations else 0.0,
        "reasoning_share": round(reasoning / conversations, 6) if conversations else 0.0,
        "served": _counts(facts, pl.col(SERVED)),
        "by_task": _by(facts, "task"),
        "by_source": _by(facts, "source"),
        "by_split": _by(facts.filter(pl.col("split").is_not_null()), "split") if conversations else {},
        "counts": {**counts, **token_counts(profile)},
    }
    tokens = profile.tokens
    if tokens is not None:
        side["token_sample"] = {"conversations": tokens.conversations, "of": conversations,
                                "unmeasured_turns": tokens.unmeasured_turns,
                                "skipped": dict(sorted(tokens.skipped.items())),
                                "supervised_tokens": int(tokens.frequencies.sum())}
        side["lengths"] = _percentiles(profile)
        side["length_buckets"] = _length_table(profile)
        side["copies"] = _copies(profile)
    side["shares"] = {name: as_shares(bucket_counts) for name, bucket_counts in side["counts"].items()}
    return side


# --- two sides -----------------------------------------------------------------------------------------


def total_variation(corpus: dict[str, float], traffic: dict[str, float]) -> float:
    """Half the L1 distance between two distributions over buckets: the share of mass that must move."""
    keys = set(corpus) | set(traffic)
    return 0.5 * sum(abs(corpus.get(k, 0.0) - traffic.get(k, 0.0)) for k in keys)


def _divergence(corpus: dict[str, float], traffic: dict[str, float]) -> Divergence:
    keys = sorted(set(corpus) | set(traffic))
    gaps: list[Gap] = sorted(
        ({"bucket": k, "corpus": round(corpus.get(k, 0.0), 6), "traffic": round(traffic.get(k, 0.0), 6),
          "gap": round(traffic.get(k, 0.0) - corpus.get(k, 0.0), 6)} for k in keys),
        key=lambda gap: -abs(gap["gap"]))
    return {"tvd": round(total_variation(corpus, traffic), 6), "gaps": [g for g in gaps[:GAPS_SHOWN] if g["gap"]]}


def _frequency_tvd(corpus: np.ndarray, traffic: np.ndarray) -> float | None:
    if not corpus.sum() or not traffic.sum():
        return None
    return round(0.5 * float(np.abs(corpus / corpus.sum() - traffic / traffic.sum()).sum()), 6)


def _curve(order: np.ndarray, counts: np.ndarray, points: list[int]) -> list[float | None]:
    total = int(counts.sum())
    if not total:
        return [None for _ in points]
    cumulative = np.cumsum(counts[order])
    return [round(float(cumulative[min(k, len(order)) - 1]) / total, 6) for k in points]


def _points(size: int, draft: int) -> list[int]:
    return sorted({*(k for k in COVERAGE_POINTS if k < size), min(draft, size), size})


def _vocab_alone(counts: np.ndarray, draft: int) -> Vocab:
    size = len(counts)
    points = _points(size, draft)
    order = top_k(counts, size)
    return {"draft_vocab_size": min(draft, size), "target_vocab_size": size,
            "curve": [{"k": k, "corpus": c} for k, c in zip(points, _curve(order, counts, points), strict=True)]}


def _vocab(corpus: np.ndarray, traffic: np.ndarray, draft: int) -> Vocab:
    """The coverage of the traffic's supervised tokens by the corpus's top-k (``corpus vocab``'s choice), next
    to the corpus's own coverage and the best any top-k could do on the traffic (its own top-k)."""
    size = len(corpus)
    points = _points(size, draft)
    by_corpus = top_k(corpus, size)
    by_traffic = top_k(traffic, size)
    chosen = by_corpus[:draft]
    total = int(traffic.sum())
    covered = int(traffic[chosen].sum())
    curves = zip(points, _curve(by_corpus, corpus, points), _curve(by_corpus, traffic, points),
                 _curve(by_traffic, traffic, points), strict=True)
    return {
        "draft_vocab_size": min(draft, size), "target_vocab_size": size,
        "traffic_coverage": coverage(traffic, chosen),
        "traffic_outside": round(1 - covered / total, 6) if total else None,
        "traffic_oracle_coverage": coverage(traffic, by_traffic[:draft]),
        "corpus_coverage": coverage(corpus, chosen),
        "traffic_tokens_unseen_in_corpus": round(int(traffic[corpus == 0].sum()) / total, 6) if total else None,
        "curve": [{"k": k, "corpus": c, "traffic": t, "traffic_own": o} for k, c, t, o in curves],
    }


def _too_many_skipped(readable: Readable) -> str:
    return (f"{readable['skipped']:,} of the traffic's {readable['rows'] + readable['skipped']:,} rows "
            f"({readable['skipped_share']:.1%}) were skipped, more than --max-skipped-share "
            f"{readable['max_skipped_share']:g}")


def _readable(side: Side, limit: float) -> Readable:
    """How much of the traffic the figures describe: rows read (conversations) and rows skipped."""
    read, skipped = side["conversations"], sum(side["skipped"].values())
    share = round(skipped / (read + skipped), 6) if read + skipped else 0.0
    return {"rows": read, "skipped": skipped, "skipped_share": share, "max_skipped_share": limit,
            "partial": share > limit, "folded_prefix": side["folded_prefix"]}


def compare(files: CorpusFiles, corpus_profile: Profile, traffic_profile: Profile, options: AuditOptions,
            meter: TokenMeter | None) -> Comparison:
    corpus_side = describe(corpus_profile)
    traffic_side = describe(traffic_profile)
    readable = _readable(traffic_side, options.max_skipped_share)
    divergence: dict[str, Divergence] = {}
    report: Comparison = {"corpus": corpus_side, "traffic": traffic_side, "readable": readable,
                          "divergence": divergence}
    if readable["partial"]:
        readable["note"] = f"{_too_many_skipped(readable)}: every figure describes the {readable['rows']:,} " \
                           "readable rows only"
        report["notes"] = [readable["note"]]
    _note_tokens(report, meter)
    for name in (*FACT_DIMENSIONS, *TOKEN_DIMENSIONS):
        mine, theirs = corpus_side["shares"].get(name), traffic_side["shares"].get(name)
        if mine and theirs:
            report["divergence"][name] = _divergence(mine, theirs)
    if set(traffic_side["counts"]["task"]) == {NO_TASK}:
        report["divergence"].pop("task", None)
        report["divergence"].pop("task_thinking", None)
        report.setdefault("notes", []).append(
            "task mix left out: the traffic's rows name no task (a `task` field, or --against a recipe whose "
            "sources carry task tags)")
    if corpus_profile.tokens is not None and traffic_profile.tokens is not None:
        frequencies = _frequency_tvd(corpus_profile.tokens.frequencies, traffic_profile.tokens.frequencies)
        if frequencies is not None:
            report["divergence"]["token_frequencies"] = {"tvd": frequencies, "gaps": []}
            report["vocab"] = _vocab(corpus_profile.tokens.frequencies, traffic_profile.tokens.frequencies,
                                     options.draft_vocab_size)
    worst = max(report["divergence"].items(), key=lambda item: item[1]["tvd"], default=None)
    report["max_divergence"] = {"dimension": worst[0], "tvd": worst[1]["tvd"]} if worst else None
    plan, notes = _plan(corpus_side, traffic_side)
    report["plan"] = plan
    report["recipe_diff"], exhausted = _recipe_diff(files, plan)
    report["suggestions"] = notes + exhausted + _token_suggestions(report, files)
    return report


# --- suggestions ---------------------------------------------------------------------------------------


def _dropped_by_source(files: CorpusFiles) -> dict[str, int]:
    """Rows the ledger dropped, per source; none without a ledger (a published copy's audit.json counts, which
    stand in for its drops elsewhere, never counted here)."""
    if not files.has_ledger:
        return {}
    return {source: sum(reasons.values()) for source, reasons in files.drops.by_source.items()}


def _recipe(files: CorpusFiles) -> dict[str, Any] | None:
    document = files.recipe
    return document if isinstance(document, dict) else None


def _plan(corpus_side: Side, traffic_side: Side) -> tuple[list[PlanEntry], list[str]]:
    """Rows per corpus source for the corpus, at its size, to follow the traffic's task mix and each task's
    thinking share: a task's rows are shared among its sources as now, then moved from the least to the
    most thinking source until the task's share matches (as far as its sources allow)."""
    total = corpus_side["conversations"]
    sources = corpus_side["by_source"]
    traffic_tasks = traffic_side["by_task"]
    by_task = bool(traffic_tasks) and set(traffic_tasks) != {NO_TASK}
    groups: dict[str, list[str]] = {}
    for name, section in sources.items():
        groups.setdefault(section["task"] if by_task else "(all)", []).append(name)
    targets = ({task: (section["conversations"] / traffic_side["conversations"], section["thinking_share"])
                for task, section in traffic_tasks.items()} if by_task
               else {"(all)": (1.0, traffic_side["thinking_share"])})
    notes: list[str] = []
    plan: list[PlanEntry] = []
    for task in sorted(set(groups) | set(targets)):
        share, thinking = targets.get(task, (0.0, 0.0))
        members = groups.get(task, [])
        wanted = round(total * share)
        if not members:
            notes.append(f"task {task}: {share:.1%} of the traffic ({thinking:.0%} thinking) and no corpus source: "
                         f"add a source with `task: {task}` (~{wanted:,} rows at the corpus's size)")
            continue
        if not wanted:
            notes.append(f"task {task}: none of the traffic; the diff removes its sources ({', '.join(members)}): "
                         "keep them if the draft should keep that coverage")
        rows = _split_rows(wanted, thinking, {name: sources[name] for name in members})
        reached = sum(rows[name] * sources[name]["thinking_share"] for name in members) / wanted if wanted else 0.0
        if wanted and abs(reached - thinking) > THINKING_TOLERANCE:
            mode = "on" if thinking > reached else "off"
            notes.append(f"task {task}: the traffic is {thinking:.0%} thinking, its sources reach {reached:.0%} at "
                         f"most: add a prompts source for it generated with thinking {mode} "
                         f"(target.generation.enable_thinking: {str(mode == 'on').lower()})")
        for name in members:
            have = sources[name]["conversations"]
            plan.append({"source": name, "task": task, "rows": have, "target_rows": rows[name],
                         "change": rows[name] - have, "thinking_share": sources[name]["thinking_share"]})
    return plan, notes


def _split_rows(wanted: int, thinking: float, sources: dict[str, GroupShares]) -> dict[str, int]:
    have = sum(section["conversations"] for section in sources.values())
    weights = {name: wanted * section["conversations"] / have for name, section in sources.items()}
    shares = {name: section["thinking_share"] for name, section in sources.items()}
    high = max(shares, key=lambda name: shares[name])
    low = min(shares, key=lambda name: shares[name])
    reached = sum(weights[name] * shares[name] for name in weights) / wanted if wanted else thinking
    if high != low and abs(reached - thinking) > THINKING_TOLERANCE:
        move = (thinking - reached) * wanted / (shares[high] - shares[low])  # rows from low to high (or back)
        move = min(move, weights[low]) if move > 0 else max(move, -weights[high])
        weights[low] -= move
        weights[high] += move
    return {name: round(weight) for name, weight in weights.items()}


def _recipe_diff(files: CorpusFiles, plan: list[PlanEntry]) -> tuple[str | None, list[str]]:
    """The corpus's resolved recipe with each source's ``take`` set to give its target rows (scaled by the
    share of the source's rows that survived the checks last time), as a unified diff; and the sources that
    cannot give more rows (every row already read)."""
    import yaml

    document = _recipe(files)
    notes: list[str] = []
    if document is None or not plan:
        return None, notes
    dropped = _dropped_by_source(files)
    edited = copy.deepcopy(document)
    specs = {spec.get("name"): spec for spec in edited.get("sources") or [] if isinstance(spec, dict)}
    for entry in plan:
        spec = specs.get(entry["source"])
        if spec is None or entry["change"] == 0:
            continue
        if entry["target_rows"] == 0:  # the traffic has none of its task: the source goes
            edited["sources"].remove(spec)
            continue
        kept = entry["rows"]
        read = kept + dropped.get(entry["source"], 0)
        take = dict(spec.get("take") or {})
        whole = (take.get("count") is None and take.get("fraction", 1) >= 1) or read < (take.get("count") or 0)
        if entry["change"] > 0 and whole:
            notes.append(f"source {entry['source']}: all {read:,} of its rows are read already: find "
                         f"{entry['change']:,} more rows of task {entry['task']} (or a prompts source to "
                         "generate them)")
        if take.get("fraction") is not None:
            take["fraction"] = round(min(1.0, take["fraction"] * entry["target_rows"] / kept), 6)
        else:
            take.pop("fraction", None)
            take["count"] = math.ceil(entry["target_rows"] * read / kept)
        take.setdefault("seed", 0)
        spec["take"] = take
    # unchanged when every source to grow takes all of its rows already (the notes say so)
    if edited == document or not edited.get("sources"):
        return None, notes

    def dump(value: object) -> list[str]:
        text: str = yaml.safe_dump(value, sort_keys=False, allow_unicode=True, width=100)
        return text.splitlines(keepends=True)

    return "".join(difflib.unified_diff(dump(document), dump(edited), "recipe.yaml",
                                        "recipe.yaml (matched to the traffic)")), notes


def _token_suggestions(report: Comparison, files: CorpusFiles) -> list[str]:
    notes: list[str] = []
    corpus_side, traffic_side = report["corpus"], report["traffic"]
    divergence = report["divergence"]
    total = corpus_side["conversations"]
    for measure in ("conversation_tokens", "prompt_tokens"):
        section = divergence.get(measure)
        for gap in section["gaps"] if section is not None else ():
            if gap["gap"] >= 0.05:
                notes.append(f"{measure.replace('_', ' ')} {gap['bucket']}: traffic {gap['traffic']:.1%}, corpus "
                             f"{gap['corpus']:.1%}: add about {round(gap['gap'] * total):,} such rows")
            elif gap["gap"] <= -0.05:
                notes.append(f"{measure.replace('_', ' ')} {gap['bucket']}: traffic {gap['traffic']:.1%}, corpus "
                             f"{gap['corpus']:.1%}: about {round(-gap['gap'] * total):,} such rows more than the "
                             "traffic has")
    budget = ((_recipe(files) or {}).get("checks") or {}).get("max_seq_len")
    lengths = (traffic_side.get("lengths") or {}).get("conversation_tokens")
    if budget and lengths and lengths["p99"] > budget:
        notes.append(f"1% of the traffic's conversations are longer than {lengths['p99']:,} tokens, past "
                     f"checks.max_seq_len {budget:,}: the draft never trains on that length")
    copies = traffic_side.get("copies")
    for task, heavy in (copies["by_task"] if copies is not None else {}).items():
        if copies is not None and heavy["share"] >= COPY_HEAVY_SHARE:
            notes.append(f"task {task}: {heavy['share']:.0%} of the traffic's response tokens lie in spans of "
                         f"{copies['span_tokens']}+ tokens copied from the prompt (longest {heavy['longest']:,}): "
                         "prompt-lookup (n-gram) speculation suits it better than a learned draft; consider "
                         "serving it that way and giving the draft's corpus to the rest")
    vocab = report.get("vocab")
    if vocab and vocab["traffic_outside"] is not None:
        notes.append(f"the top {vocab['draft_vocab_size']:,} draft vocabulary chosen from the corpus covers "
                     f"{vocab['traffic_coverage']:.1%} of the traffic's supervised tokens "
                     f"({vocab['traffic_outside']:.1%} fall outside; the traffic's own top "
                     f"{vocab['draft_vocab_size']:,} would cover "
                     f"{vocab['traffic_oracle_coverage']:.1%})")
    return notes


# --- text ---------------------------------------------------------------------------------------------


def format_comparison(report: Comparison) -> str:
    """The comparison as people read it (``--json`` gives the machine form)."""
    corpus, traffic = report["corpus"], report["traffic"]
    readable = report["readable"]
    lines = [f"corpus   {corpus['label']}: {corpus['conversations']:,} conversations, "
             f"{corpus['thinking_share']:.1%} thinking",
             f"traffic  {traffic['label']}: {traffic['conversations']:,} conversations, "
             f"{traffic['thinking_share']:.1%} thinking (served: " +
             ", ".join(f"{k} {v:,}" for k, v in sorted(traffic["served"].items())) + ")",
             f"  traffic rows: {readable['rows']:,} readable, {readable['skipped']:,} skipped "
             f"({readable['skipped_share']:.1%})" + (": every figure below describes the readable rows only"
                                                     if readable["partial"] else "")]
    if readable["folded_prefix"]:
        lines.append(f"  traffic: {readable['folded_prefix']:,} logged requests folded into a later request of their "
                     "conversation (folded_prefix): each chat counts once")
    for side in (corpus, traffic):
        sample = side.get("token_sample")
        if sample and sample["conversations"] < sample["of"]:
            lines.append(f"  {side['label']}: token dimensions on a sample of {sample['conversations']:,} of "
                         f"{sample['of']:,} conversations")
    if traffic["skipped"]:
        lines.append("  traffic rows skipped: " + ", ".join(f"{k} {v:,}" for k, v in traffic["skipped"].items()))
    lines += ["", f"{'dimension':<20} {'TVD':>7}  biggest gaps (bucket: corpus -> traffic)"]
    for name, section in report["divergence"].items():
        gaps = "; ".join(f"{g['bucket']}: {g['corpus']:.1%} -> {g['traffic']:.1%}" for g in section["gaps"])
        lines.append(f"{name:<20} {section['tvd']:>7.3f}  {gaps}")
    by_task = traffic["by_task"]
    if by_task and set(by_task) != {NO_TASK}:
        lines += ["", f"{'task':<20} {'corpus rows':>11} {'thinking':>9}   {'traffic rows':>12} {'thinking':>9}"]
        for task in sorted(set(by_task) | set(corpus["by_task"])):
            mine, theirs = corpus["by_task"].get(task), by_task.get(task)
            lines.append(f"{task:<20} {mine['conversations'] if mine else 0:>11,} "
                         f"{(mine['thinking_share'] if mine else 0):>9.1%}   "
                         f"{theirs['conversations'] if theirs else 0:>12,} "
                         f"{(theirs['thinking_share'] if theirs else 0):>9.1%}")
    for side in (corpus, traffic):
        copies = side.get("copies")
        if copies:
            lines.append(f"copy-spans ({copies['span_tokens']}+ tokens) {side['label']}: {copies['share']:.1%} of "
                         f"response tokens, longest {copies['longest']:,}")
    if report.get("plan"):
        lines += ["", f"{'source':<24} {'task':<16} {'rows':>8} {'target':>8} {'change':>8}"]
        for entry in report["plan"]:
            lines.append(f"{entry['source']:<24} {entry['task']:<16} {entry['rows']:>8,} {entry['target_rows']:>8,} "
                         f"{entry['change']:>+8,}")
    if report.get("suggestions"):
        lines += ["", "suggestions:"] + [f"  - {note}" for note in report["suggestions"]]
    for note in report.get("notes") or ():
        lines.append(f"note: {note}")
    diff = report.get("recipe_diff")
    if diff:
        lines += ["", diff.rstrip("\n")]
    return "\n".join(lines)


def divergence_problems(report: Comparison, limit: float | None, *, allow_skipped: bool = False) -> list[str]:
    """The dimensions whose divergence exceeds ``--max-divergence``, and a traffic whose skipped share is past
    ``max_skipped_share`` (its divergences describe only its readable part) unless ``allow_skipped``."""
    if limit is None:
        return []
    problems = [f"{name}: total variation distance {section['tvd']:.3f} exceeds --max-divergence {limit:g}"
                for name, section in report["divergence"].items() if section["tvd"] > limit]
    readable = report.get("readable")
    if readable and readable["partial"] and not allow_skipped:
        problems.append(f"{_too_many_skipped(readable)}: the divergences describe the readable rows only "
                        "(--allow-skipped accepts that)")
    return problems
