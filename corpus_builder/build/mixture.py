"""The declared corpus: per-source targets and a thinking share, met after every drop, or a report of why not.

A recipe declares what the corpus must hold (``sources[].target``: a row count or a share of the corpus;
``mixture.thinking_share``: a target with a tolerance, optionally for each split). The build collects the rows
that pass every check into per-source spools, with each row's priority (a seeded hash of its id), split and
thinking flag; ``plan_selection`` then decides how many rows of each (source, split, thinking) cell to take,
and rows are taken by priority within their cell: the same recipe and journal always take the same rows.
Prompt sources are generated in priority order and topped up from their remaining pool while they fall short
(``next_round``), so a drop costs about one more request, not a re-run by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..recipe.model import Recipe
from ..sources.take import seeded_hash
from .split import TRAIN, VALIDATION

SPLITS = (TRAIN, VALIDATION)


def priority(seed: int, row_id: str) -> int:
    """The order rows of a source are taken and prompts generated in: seeded, by the row's own id."""
    return seeded_hash(b"corpus-mixture", seed, row_id)


@dataclass
class Cell:
    """The rows available in one (source, split, thinking) cell, by priority (ints, never the rows)."""

    priorities: list[int] = field(default_factory=list)

    def take(self, count: int) -> int | None:
        """The priority threshold under which ``count`` rows of the cell are taken (None: none)."""
        if count <= 0:
            return None
        ordered = self.ordered()
        return ordered[min(count, len(ordered)) - 1]

    def ordered(self) -> list[int]:
        """The priorities, best first: sorted in place, so sorting them again is one pass."""
        self.priorities.sort()
        return self.priorities


@dataclass
class Available:
    """What one source has to offer after the checks: kept rows per (split, thinking)."""

    cells: dict[tuple[str, bool], Cell] = field(default_factory=dict)

    def add(self, split: str, thinking: bool, row_priority: int) -> None:
        self.cells.setdefault((split, thinking), Cell()).priorities.append(row_priority)

    def discard(self, split: str, thinking: bool, row_priority: int) -> None:
        """A kept row evicted by a duplicate of higher priority (rare: a linear search is fine)."""
        self.cells[(split, thinking)].priorities.remove(row_priority)

    def count(self, split: str | None = None, thinking: bool | None = None) -> int:
        return sum(len(cell.priorities) for (s, t), cell in self.cells.items()
                   if (split is None or s == split) and (thinking is None or t == thinking))


@dataclass
class SourceOutcome:
    """Declared vs reached, for the audit and for the report of a corpus that cannot be met."""

    declared: int | None  # rows; None: every kept row
    declared_share: float | None
    available: int
    reached: int = 0
    thinking: int = 0
    generated_requests: int = 0  # prompts sources: rows asked for over every round

    def to_dict(self) -> dict[str, Any]:
        return {"declared": self.declared, "declared_share": self.declared_share, "available": self.available,
                "reached": self.reached, "thinking": self.thinking, "generated_rows": self.generated_requests}


@dataclass
class Selection:
    """Which rows to take: a priority threshold per (source, split, thinking) cell, and the outcome."""

    thresholds: dict[tuple[str, str, bool], int | None]
    sources: dict[str, SourceOutcome]
    thinking_share: float
    thinking_by_split: dict[str, float]
    shortfalls: list[str]

    def takes(self, source: str, split: str, thinking: bool, row_priority: int) -> bool:
        threshold = self.thresholds.get((source, split, thinking))
        return threshold is not None and row_priority <= threshold

    def report(self, recipe: Recipe) -> dict[str, Any]:
        mixture = recipe.mixture
        thinking = mixture.thinking_share
        return {
            "sources": {name: outcome.to_dict() for name, outcome in self.sources.items()},
            "thinking_share": {"target": thinking.target if thinking else None,
                               "tolerance": thinking.tolerance if thinking else None,
                               "reached": round(self.thinking_share, 6),
                               "by_split": {k: round(v, 6) for k, v in self.thinking_by_split.items()}},
            "shortfalls": self.shortfalls,
        }


def resolve_counts(recipe: Recipe, sizes: dict[str, int]) -> dict[str, int | None]:
    """Rows each source must contribute: a declared count, a share of the total, or None (every kept row;
    ``sizes`` says how many that is). Without ``mixture.total`` the total is what the sources with a count and
    those with no target make up, over the share left for the others."""
    counts: dict[str, int | None] = {}
    shares = {spec.name: spec.target.share for spec in recipe.sources if spec.target and spec.target.share}
    fixed = 0
    for spec in recipe.sources:
        if spec.target is not None and spec.target.count is not None:
            counts[spec.name] = spec.target.count
            fixed += spec.target.count
        elif spec.name not in shares:
            counts[spec.name] = None
            fixed += sizes.get(spec.name, 0)
    total = recipe.mixture.total
    if total is None and shares:
        total = round(fixed / (1 - sum(shares.values())))
    for name, share in shares.items():
        counts[name] = round(share * (total or 0))
    return counts


def next_round(declared: int, kept: int, generated: int, pool_left: int) -> int:
    """Prompt rows to generate next for a source that has ``kept`` of its ``declared`` rows after
    ``generated``: the declared count first, then the shortfall over the keep rate seen so far (each drop
    replaced about once, no more), at least one, at most what the pool has left."""
    missing = declared - kept
    if missing <= 0 or pool_left <= 0:
        return 0
    keep_rate = max(kept, 1) / generated if generated else 1.0
    return min(pool_left, max(1, math.ceil(missing / keep_rate)))


def plan_selection(recipe: Recipe, available: dict[str, Available], generated: dict[str, int]) -> Selection:
    """Decide how many rows of each (source, split, thinking) cell to take.

    Each source's count is split across train and validation as its kept rows are (their split follows from
    their ids); within a split, thinking rows are taken in the proportion their priorities give, unless a
    thinking-share target asks otherwise: then the cells with room on the needed side give more (in recipe
    order), within what each source has. Anything unmet is a shortfall, named."""
    counts = resolve_counts(recipe, {name: have.count() for name, have in available.items()})
    target = recipe.mixture.thinking_share
    thresholds: dict[tuple[str, str, bool], int | None] = {}
    outcomes: dict[str, SourceOutcome] = {}
    shortfalls: list[str] = []
    plan: dict[tuple[str, str], list[int]] = {}  # (source, split) -> [thinking rows, plain rows]
    for spec in recipe.sources:
        have = available[spec.name]
        declared = counts[spec.name]
        want = have.count() if declared is None else declared
        outcome = SourceOutcome(counts[spec.name], spec.target.share if spec.target else None, have.count(),
                                generated_requests=generated.get(spec.name, 0))
        outcomes[spec.name] = outcome
        if have.count() < want:
            shortfalls.append(f"source '{spec.name}': {have.count():,} rows pass every check, {want:,} declared"
                              + (f" ({generated[spec.name]:,} generated, the pool is exhausted)"
                                 if spec.name in generated else ""))
            want = have.count()
        for split, split_rows in _apportion(want, {s: have.count(split=s) for s in SPLITS}).items():
            natural = _natural_thinking(have, split, split_rows)
            plan[(spec.name, split)] = [natural, split_rows - natural]
    if target is not None:
        if target.per_split:
            for split in SPLITS:
                _steer(plan, available, [key for key in plan if key[1] == split], target.target)
        else:
            _steer(plan, available, list(plan), target.target)
    for (source, split), (thinking_rows, plain_rows) in plan.items():
        have = available[source]
        thresholds[(source, split, True)] = have.cells.get((split, True), Cell()).take(thinking_rows)
        thresholds[(source, split, False)] = have.cells.get((split, False), Cell()).take(plain_rows)
        outcomes[source].reached += thinking_rows + plain_rows
        outcomes[source].thinking += thinking_rows
    total = sum(o.reached for o in outcomes.values())
    share = sum(o.thinking for o in outcomes.values()) / total if total else 0.0
    by_split = {}
    for split in SPLITS:
        rows = sum(sum(cells) for (_, s), cells in plan.items() if s == split)
        by_split[split] = sum(cells[0] for (_, s), cells in plan.items() if s == split) / rows if rows else 0.0
    if target is not None:
        checked = {"all": share, **(by_split if target.per_split else {})}
        for name, reached in checked.items():
            rows = total if name == "all" else sum(sum(c) for (_, s), c in plan.items() if s == name)
            if rows and abs(reached - target.target) > target.tolerance:
                shortfalls.append(f"thinking share {'overall' if name == 'all' else f'of {name}'} "
                                  f"{reached:.1%}, declared {target.target:.1%} +- {target.tolerance:.1%}: the sources "
                                  "do not hold enough rows of the kind needed")
    return Selection(thresholds, outcomes, share, by_split, shortfalls)


def _apportion(rows: int, weights: dict[str, int]) -> dict[str, int]:
    """``rows`` split in proportion to ``weights`` (largest remainders), never more than a weight."""
    total = sum(weights.values())
    if not total:
        return dict.fromkeys(weights, 0)
    exact = {k: rows * w / total for k, w in weights.items()}
    shares = {k: min(weights[k], math.floor(v)) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: exact[k] - math.floor(exact[k]), reverse=True):
        if sum(shares.values()) >= rows:
            break
        if shares[k] < weights[k]:
            shares[k] += 1
    return shares


def _natural_thinking(have: Available, split: str, rows: int) -> int:
    """How many of the ``rows`` best-priority rows of a split carry reasoning (what taking by priority gives)."""
    thinking = have.cells.get((split, True), Cell()).ordered()
    plain = have.cells.get((split, False), Cell()).ordered()
    i = j = 0
    while i + j < rows:
        if j >= len(plain) or (i < len(thinking) and thinking[i] < plain[j]):
            i += 1
        else:
            j += 1
    return i


def _steer(plan: dict[tuple[str, str], list[int]], available: dict[str, Available],
           keys: list[tuple[str, str]], share: float) -> None:
    """Move rows between the thinking and plain sides of the given cells, keeping each (source, split) count,
    until the thinking share is as close to ``share`` as the sources allow."""
    rows = sum(sum(plan[key]) for key in keys)
    need = round(share * rows) - sum(plan[key][0] for key in keys)
    for key in keys:
        if need == 0:
            return
        source, split = key
        thinking_rows, plain_rows = plan[key]
        have_thinking = available[source].count(split=split, thinking=True)
        have_plain = available[source].count(split=split, thinking=False)
        if need > 0:
            move = min(need, plain_rows, have_thinking - thinking_rows)
        else:
            move = -min(-need, thinking_rows, have_plain - plain_rows)
        plan[key] = [thinking_rows + move, plain_rows - move]
        need -= move
