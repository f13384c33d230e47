"""The declared corpus: per-source targets and a thinking share, met after every drop, or a report of why not.

A recipe declares what the corpus must hold (``sources[].target``: a row count or a share of the corpus;
``mixture.thinking_share``: a target with a tolerance, optionally for each split). The build collects the rows
that pass every check into per-source spools, with each row's priority (a seeded hash of its id), split and
thinking flag; ``plan_selection`` then decides how many rows of each (source, split, thinking) cell to take,
and rows are taken by priority within their cell: the same recipe and journal always take the same rows.
Prompt sources are generated in priority order and topped up from their remaining pool while they fall short
(``next_round``), so a drop costs about one more request, not a re-run by hand. What the rows at hand certainly
cannot meet (``certain_shortfalls``) is known before the first request, and reported then.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..recipe.model import Mixture, Recipe, SourceSpec, ThinkingShare
from .split import TRAIN, VALIDATION, Splitter

SPLITS = (TRAIN, VALIDATION)
K = TypeVar("K")


@dataclass(frozen=True)
class SelectStage:
    """The take of a build's plan (``plan``): what the recipe declares of its corpus (the mixture, the sources'
    targets, in recipe order), the split the take's keys are read with, and the samples each prompt gives."""

    mixture: Mixture
    sources: tuple[SourceSpec, ...]
    splitter: Splitter
    samples: int  # target.generation.n

    @classmethod
    def of(cls, recipe: Recipe) -> SelectStage:
        return cls(recipe.mixture, recipe.sources, Splitter.of(recipe.split), recipe.target.generation.n)

    @property
    def declared(self) -> bool:
        return self.mixture.declared(self.sources)


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

    def best(self, rows: int, thinking: bool | None = None) -> dict[tuple[str, bool], int]:
        """How many of the source's ``rows`` best-priority rows (of one kind, or of both) each cell holds: what
        taking by priority alone gives."""
        cells = {key: cell.ordered() for key, cell in self.cells.items() if thinking is None or key[1] == thinking}
        if rows >= sum(len(priorities) for priorities in cells.values()):  # every row (a source with no target)
            return {key: len(priorities) for key, priorities in cells.items()}
        if rows <= 0:
            return dict.fromkeys(cells, 0)
        last = next(itertools.islice(heapq.merge(*cells.values()), rows - 1, None))
        return {key: bisect.bisect_right(priorities, last) for key, priorities in cells.items()}


@dataclass
class SourceOutcome:
    """Declared vs reached, for the audit and for the report of a corpus that cannot be met."""

    declared: int | None  # rows; None: every kept row
    declared_share: float | None
    available: int
    reached: int = 0
    thinking: int = 0
    generated_requests: int = 0  # prompts sources: rows asked for over every round
    reached_share: float | None = None  # of the rows written, for a source with a share

    def to_dict(self) -> dict[str, Any]:
        return {"declared": self.declared, "declared_share": self.declared_share, "available": self.available,
                "reached": self.reached, "reached_share": self.reached_share, "thinking": self.thinking,
                "generated_rows": self.generated_requests}


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

    def report(self, mixture: Mixture) -> dict[str, Any]:
        thinking = mixture.thinking_share
        return {
            "sources": {name: outcome.to_dict() for name, outcome in self.sources.items()},
            "thinking_share": {"target": thinking.target if thinking else None,
                               "tolerance": thinking.tolerance if thinking else None,
                               "reached": round(self.thinking_share, 6),
                               "by_split": {k: round(v, 6) for k, v in self.thinking_by_split.items()}},
            "shortfalls": self.shortfalls,
        }


def resolve_counts(select: SelectStage, sizes: dict[str, int]) -> dict[str, int | None]:
    """Rows each source must contribute: a declared count; a share of the total (the shares' rows allotted by
    largest remainders, so that the parts add up to the total); for a source with no target every kept row
    (None; ``sizes`` says how many that is), or with ``mixture.total`` its part of the rows the targets leave,
    in proportion to ``sizes``. Without ``mixture.total`` the total is what the sources with a count and those
    with no target make up, over the share left for the others."""
    counts: dict[str, int | None] = {}
    shares: dict[str, float] = {}
    open_sizes: dict[str, int] = {}  # the sources with no target
    for spec in select.sources:
        if spec.target is not None and spec.target.count is not None:
            counts[spec.name] = spec.target.count
        elif spec.target is not None and spec.target.share is not None:
            shares[spec.name] = spec.target.share
        else:
            open_sizes[spec.name] = sizes.get(spec.name, 0)
    fixed = sum(count for count in counts.values() if count is not None)
    total = select.mixture.total
    if total is None:
        fixed += sum(open_sizes.values())
        total = round(fixed / (1 - sum(shares.values()))) if shares else fixed
        parts = _largest_remainder(total - fixed, [share * total for share in shares.values()])
        return counts | dict.fromkeys(open_sizes) | dict(zip(shares, parts, strict=True))
    quotas = [share * total for share in shares.values()]
    if open_sizes:  # they fill what the counts and shares leave
        quotas.append(max(0.0, total - fixed - sum(quotas)))
    parts = _largest_remainder(max(0, total - fixed), quotas)
    counts |= dict(zip(shares, parts[:len(shares)], strict=True))
    return counts | (apportion(parts[-1], open_sizes) if open_sizes else {})


def _largest_remainder(rows: int, quotas: list[float]) -> list[int]:
    """``rows`` in parts near ``quotas``: their floors, and one more for the largest remainders while rows are
    left (in order on ties). When the quotas add up to ``rows`` within one, each part is within one of its
    quota and the parts add up to ``rows``."""
    parts = [math.floor(quota) for quota in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda i: quotas[i] - parts[i], reverse=True)
    for i in by_remainder[:max(0, rows - sum(parts))]:
        parts[i] += 1
    return parts


def apportion(rows: int, sizes: dict[K, int]) -> dict[K, int]:
    """``rows`` in proportion to ``sizes`` (none when every size is zero)."""
    total = sum(sizes.values())
    parts = _largest_remainder(rows, [rows * size / total for size in sizes.values()]) if total else [0] * len(sizes)
    return dict(zip(sizes, parts, strict=True))


@dataclass(frozen=True)
class RowBounds:
    """The most rows one source can give the corpus, known before any request, and of them the most with and
    the most without reasoning (a prompts source's generated rows may go either way)."""

    rows: int
    thinking: int
    plain: int
    counted: str  # what the bound is, for the report: "100 rows read", "a pool of 50 prompts x 1 sample"

    @classmethod
    def of_prompts(cls, prompts: int, samples: int) -> RowBounds:
        rows = prompts * samples
        return cls(rows, rows, rows, f"a pool of {prompts:,} prompts x {samples} sample{'s' * (samples != 1)}")

    @classmethod
    def of_rows(cls, rows: int, thinking: int, counted: str) -> RowBounds:
        return cls(rows, thinking, rows - thinking, f"{rows:,} {counted}")


def certain_shortfalls(select: SelectStage, bounds: dict[str, RowBounds]) -> list[str]:
    """What the declared corpus certainly misses, known from the most each source can give before any request:
    a target above it, the rows ``mixture.total`` leaves to the sources with no target above theirs, or a
    thinking share outside what any mix of the rows reaches, every generated row counted as reasoning (or as
    not). A share of a total that the rows of the sources with no target make up is not judged: those rows
    are known only after the checks."""
    if not select.declared:
        return []
    counts = resolve_counts(select, {name: bound.rows for name, bound in bounds.items()})
    total = select.mixture.total
    open_sources = [spec.name for spec in select.sources if spec.target is None]
    # a share of a total that the rows of the sources with no target make up: known only after the checks
    shares_unknown = total is None and bool(open_sources) and any(
        spec.target is not None and spec.target.share is not None for spec in select.sources)
    shortfalls = []
    wants: list[tuple[int, RowBounds]] = []  # the rows each target takes, with what its source can give
    for spec in select.sources:
        want = counts[spec.name]
        if spec.target is None or want is None or (spec.target.share is not None and shares_unknown):
            continue
        bound = bounds[spec.name]
        wants.append((want, bound))
        if bound.rows < want:
            shortfalls.append(f"source '{spec.name}': at most {bound.rows:,} rows ({bound.counted}), {want:,} "
                              "declared")
    open_bounds = [bounds[name] for name in open_sources]
    untargeted = RowBounds(sum(b.rows for b in open_bounds), sum(b.thinking for b in open_bounds),
                          sum(b.plain for b in open_bounds), "")
    if total is not None and open_sources:
        rest = total - sum(want for want, _ in wants)
        wants.append((rest, untargeted))
        if untargeted.rows < rest:
            names = ", ".join(f"'{name}'" for name in open_sources)
            shortfalls.append(f"the sources with no target ({names}): at most {untargeted.rows:,} rows, {rest:,} "
                              f"left to them by mixture.total ({total:,})")
    target = select.mixture.thinking_share
    if target is None or shares_unknown:
        return shortfalls
    # a target above what its source can give takes every row it has (reported above): of those, not of rows
    # that do not exist, is the share
    takes = [(min(want, bound.rows), bound) for want, bound in wants]
    rows = sum(take for take, _ in takes)
    most = sum(min(take, bound.thinking) for take, bound in takes)
    least = sum(max(0, take - bound.plain) for take, bound in takes)
    # Without a total, the sources with no target give every kept row, from none to all they hold: the
    # extremes take all their thinking rows and none of the others, or the reverse.
    kept = untargeted if total is None else RowBounds(0, 0, 0, "")
    highest = max((t / n for t, n in ((most, rows), (most + kept.thinking, rows + kept.thinking)) if n), default=None)
    lowest = min((t / n for t, n in ((least, rows), (least, rows + kept.plain)) if n), default=None)
    declared = f"declared {target.target:.1%} +- {target.tolerance:.1%}"
    if highest is not None and highest < target.target - target.tolerance - 1e-9:
        shortfalls.append(f"thinking share: at most {highest:.1%} of the rows can reason (every generated row "
                          f"counted as reasoning), {declared}")
    if lowest is not None and lowest > target.target + target.tolerance + 1e-9:
        shortfalls.append(f"thinking share: at least {lowest:.1%} of the rows reason (no generated row counted as "
                          f"reasoning), {declared}")
    return shortfalls


def next_round(declared: int, kept: int, generated: int, pool_left: int) -> int:
    """Prompt rows to generate next for a source that has ``kept`` of its ``declared`` rows after
    ``generated``: the declared count first, then the shortfall over the keep rate seen so far (each drop
    replaced about once, no more), at least one, at most what the pool has left."""
    missing = declared - kept
    if missing <= 0 or pool_left <= 0:
        return 0
    if not generated:
        return min(pool_left, missing)
    # missing over the keep rate max(kept, 1) / generated, rounded up in integers: the float quotient of an exact
    # multiple can land just above it (21 / 0.7 is 30.000000000000004) and ask one row more
    return min(pool_left, -(-missing * generated // max(kept, 1)))


def plan_selection(select: SelectStage, available: dict[str, Available], generated: dict[str, int]) -> Selection:
    """Decide how many rows of each (source, split, thinking) cell to take.

    Each source's rows are taken by priority: its thinking and plain rows in the proportion that gives, each
    kind split across train and validation as its best rows fall (so every (source, thinking) stratum is split
    as its rows are). A thinking-share target moves rows between the kinds of the sources with room (in recipe
    order) to the share, within what each source has; per split, when a split then misses it, rows also move
    between the splits, the split sizes nearest these first, whenever any choice of the rows reaches every
    split. Anything unmet is a shortfall, named."""
    counts = resolve_counts(select, {name: have.count() for name, have in available.items()})
    target = select.mixture.thinking_share
    outcomes: dict[str, SourceOutcome] = {}
    shortfalls: list[str] = []
    wants: dict[str, int] = {}
    for spec in select.sources:
        have = available[spec.name]
        declared = counts[spec.name]
        want = have.count() if declared is None else declared
        outcomes[spec.name] = SourceOutcome(declared, spec.target.share if spec.target else None, have.count(),
                                            generated_requests=generated.get(spec.name, 0))
        if have.count() < want:
            shortfalls.append(f"source '{spec.name}': {have.count():,} rows pass every check, {want:,} declared"
                              + (" (its part of mixture.total)" if spec.target is None else "")
                              + (f" ({generated[spec.name]:,} generated, the pool is exhausted)"
                                 if spec.name in generated else ""))
            want = have.count()
        wants[spec.name] = want
    thinking = {name: sum(rows for (_, kind), rows in available[name].best(want).items() if kind)
                for name, want in wants.items()}
    if target is not None:
        _steer(thinking, available, wants, target.target)
    plan = {name: _cells(available[name], thinking[name], want) for name, want in wants.items()}
    held = {split: any(available[name].count(split=split) for name, want in wants.items() if want)
            for split in SPLITS}  # the splits the sources hold rows of
    # Per split, rows move between splits when a split misses the share; the steering above is exact for the
    # whole, so a whole that misses it means no split arrangement can meet every split.
    if (target is not None and target.per_split and not _misses(sum(thinking.values()), sum(wants.values()), False,
                                                                target)
            and any(_misses(*rows, held[split], target) for split, rows in _by_split(plan).items())):
        _meet_each_split(plan, available, wants, held, target)
    thresholds: dict[tuple[str, str, bool], int | None] = {}
    for name, cells in plan.items():
        for (split, kind), rows in zip(CELLS, cells, strict=True):
            thresholds[(name, split, kind)] = available[name].cells.get((split, kind), Cell()).take(rows)
            outcomes[name].reached += rows
            outcomes[name].thinking += rows if kind else 0
    total = sum(o.reached for o in outcomes.values())
    for name, outcome in outcomes.items():  # a share is of the rows written, whatever else fell short
        if outcome.declared_share is not None and total:
            outcome.reached_share = round(outcome.reached / total, 6)
            short = outcome.available < (outcome.declared or 0)  # its own shortfall says so already
            if abs(outcome.reached - outcome.declared_share * total) >= 1 and not short:
                shortfalls.append(f"source '{name}': {outcome.reached:,} rows, {outcome.reached / total:.1%} of the "
                                  f"{total:,} written, {outcome.declared_share:.1%} declared")
    if select.mixture.total is not None and total != select.mixture.total:
        shortfalls.append(f"corpus: {total:,} rows reached, mixture.total declares {select.mixture.total:,}")
    thinking_total = sum(o.thinking for o in outcomes.values())
    share = thinking_total / total if total else 0.0
    splits = _by_split(plan)
    by_split = {split: thinking_rows / rows if rows else 0.0 for split, (thinking_rows, rows) in splits.items()}
    if target is not None:
        checked = {"overall": (thinking_total, total, False),
                   **({f"of {split}": (*rows, held[split]) for split, rows in splits.items()} if target.per_split
                      else {})}
        shortfalls += [f"thinking share {where} {thinking_rows / rows if rows else 0:.1%} ({thinking_rows:,} of "
                       f"{rows:,} rows), declared {target.target:.1%} +- {target.tolerance:.1%}: the sources do not "
                       "hold enough rows of the kind needed"
                       for where, (thinking_rows, rows, needed) in checked.items()
                       if _misses(thinking_rows, rows, needed, target)]
    return Selection(thresholds, outcomes, share, by_split, shortfalls)


# A source's plan: rows per (split, thinking) cell, in this order.
CELLS = tuple((split, kind) for split in SPLITS for kind in (True, False))


def _cells(have: Available, thinking: int, rows: int) -> list[int]:
    """The source's ``thinking`` best thinking rows and ``rows - thinking`` best plain rows, per cell."""
    best = have.best(thinking, True) | have.best(rows - thinking, False)
    return [best.get(cell, 0) for cell in CELLS]


def _by_split(plan: dict[str, list[int]]) -> dict[str, tuple[int, int]]:
    """Per split: (thinking rows, rows)."""
    counts = {}
    for split in SPLITS:
        thinking, plain = CELLS.index((split, True)), CELLS.index((split, False))
        counts[split] = (sum(cells[thinking] for cells in plan.values()),
                         sum(cells[thinking] + cells[plain] for cells in plan.values()))
    return counts


def _misses(thinking: int, rows: int, needed: bool, target: ThinkingShare) -> bool:
    """Whether ``thinking`` of ``rows`` misses the share: outside the tolerance, or no rows at all where rows
    are ``needed`` (a split the sources hold rows of)."""
    low, high = _share_range(rows, target)
    return (needed and not rows) or not low <= thinking <= high


def _share_range(rows: int, target: ThinkingShare) -> tuple[int, int]:
    """The thinking rows of ``rows`` within the target's tolerance, as (lowest, highest); none when lowest >
    highest. One rule for steering and for the report."""
    slack = target.tolerance + 1e-9  # the share is a float: a bound met exactly is met
    return (max(0, math.ceil((target.target - slack) * rows)), min(rows, math.floor((target.target + slack) * rows)))


def _steer(thinking: dict[str, int], available: dict[str, Available], wants: dict[str, int], share: float) -> None:
    """Move rows of each source between its thinking and plain rows, keeping its count, until the thinking
    share is as close to ``share`` as the sources allow (the nearest reachable count: exact)."""
    need = round(share * sum(wants.values())) - sum(thinking.values())
    for name, rows in thinking.items():
        have = available[name]
        least, most = max(0, wants[name] - have.count(thinking=False)), min(have.count(thinking=True), wants[name])
        thinking[name] = min(max(rows + need, least), most)
        need -= thinking[name] - rows


def _meet_each_split(plan: dict[str, list[int]], available: dict[str, Available], wants: dict[str, int],
                     held: dict[str, bool], target: ThinkingShare) -> None:
    """Rows moved between the cells of the sources (each source's count kept) until every split is within the
    tolerance, when any choice of the rows gets there: the validation sizes nearest the plan's first.

    Which totals per cell the sources can give together is the transport bound: a demand is feasible when no
    set of cells is asked for more than the sources can put in it, ``most[set]`` (each source gives a set at
    most its count, at most what it holds there). Two splits and two kinds make that four cells, 15 sets."""
    caps = {name: [available[name].count(split=split, thinking=kind) for split, kind in CELLS] for name in plan}
    most = [sum(min(wants[name], sum(cap[cell] for cell in range(4) if subset >> cell & 1))
                for name, cap in caps.items()) for subset in range(16)]
    rows = sum(wants.values())
    train_set, validation_set = 0b0011, 0b1100  # CELLS: train thinking, train plain, validation thinking, ...
    planned = _by_split(plan)[VALIDATION][1]
    lowest = max(rows - most[train_set], 1 if held[VALIDATION] else 0)
    highest = min(most[validation_set], rows - (1 if held[TRAIN] else 0))
    for validation in sorted(range(lowest, highest + 1), key=lambda size: abs(size - planned)):
        demand = _split_demand(most, rows, validation, target)
        if demand is not None:
            _transport(plan, caps, demand)
            return


def _split_demand(most: list[int], rows: int, validation: int, target: ThinkingShare) -> list[int] | None:
    """Rows per cell (CELLS order) with ``validation`` rows in validation, each split within the tolerance and
    within the transport bound, the shares nearest the target; None when there are none.

    With the split sizes fixed, the cells are two unknowns, A (train thinking) and V (validation thinking), and
    each set of cells a bound a*A + v*V <= r with a and v in {-1, 0, 1}: eliminating A (its bounds pairwise)
    leaves bounds on V alone, exact in integers as every coefficient of A is one."""
    train = rows - validation
    low_a, high_a = _share_range(train, target)
    low_v, high_v = _share_range(validation, target)
    bounds = [(-1, 0, -low_a), (1, 0, high_a), (0, -1, -low_v), (0, 1, high_v)]  # (a, v, r): a*A + v*V <= r
    for subset in range(1, 16):
        a, train_rows = _pair_terms(subset & 0b11, train)
        v, validation_rows = _pair_terms(subset >> 2, validation)
        bounds.append((a, v, most[subset] - train_rows - validation_rows))
    lower = [(v, r) for a, v, r in bounds if a == -1]  # A >= v*V - r
    upper = [(v, r) for a, v, r in bounds if a == 1]  # A <= r - v*V
    least, greatest = 0, validation
    for v, r in [(v, r) for a, v, r in bounds if a == 0] + [(v1 + v2, r1 + r2) for v1, r1 in lower for v2, r2 in upper]:
        if v > 0:
            greatest = min(greatest, r // v)
        elif v < 0:
            least = max(least, -(-r // v))
        elif r < 0:
            return None
    if least > greatest:
        return None
    thinking_v = min(max(round(target.target * validation), least), greatest)
    thinking_a = min(max(round(target.target * train), max(v * thinking_v - r for v, r in lower)),
                     min(r - v * thinking_v for v, r in upper))
    return [thinking_a, train - thinking_a, thinking_v, validation - thinking_v]


def _pair_terms(cells: int, size: int) -> tuple[int, int]:
    """The rows a set of one split's cells holds, as the coefficient of the split's thinking rows and a
    constant: bit 0 is its thinking cell, bit 1 its plain cell (``size`` minus the thinking rows)."""
    return (cells & 1) - (cells >> 1 & 1), size if cells & 2 else 0


def _transport(plan: dict[str, list[int]], caps: dict[str, list[int]], demand: list[int]) -> None:
    """Rows moved between the cells of each source (its count kept, within what each cell holds) until the
    cells hold ``demand`` in all: along paths from a cell with too many rows, through sources with a row there
    and room in the next cell, to one with too few (a demand within the transport bound always has one)."""
    while True:
        held = [sum(cells[cell] for cells in plan.values()) for cell in range(4)]
        over = [cell for cell in range(4) if held[cell] > demand[cell]]
        if not over:
            return
        came_from: dict[int, tuple[int, str] | None] = dict.fromkeys(over)
        queue, end = deque(over), None
        while queue and end is None:
            cell = queue.popleft()
            for name, cells in plan.items():
                for other in range(4):
                    if cells[cell] and other not in came_from and cells[other] < caps[name][other]:
                        came_from[other] = (cell, name)
                        queue.append(other)
                        if held[other] < demand[other]:
                            end = other
                            break
                if end is not None:
                    break
        assert end is not None, "a demand within the transport bound has a path"
        steps, cell = [], end
        while (step := came_from[cell]) is not None:
            steps.append((step[0], step[1], cell))
            cell = step[0]
        amount = min(held[cell] - demand[cell], demand[end] - held[end],
                     *(min(plan[name][source], caps[name][into] - plan[name][into]) for source, name, into in steps))
        for source, name, into in steps:
            plan[name][source] -= amount
            plan[name][into] += amount
