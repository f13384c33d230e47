"""What an eval measured, as figures: measurement windows, their sums, and the paired ratio of two heads.

A window is one stretch of a server's counters the eval alone moved: one request at concurrency 1, one phase
(the whole pack in one mode) otherwise. Acceptance is given two ways, named, since they differ and can order two
heads differently (vLLM #42508): POOLED, a ratio of sums over every window (vLLM's counters: a long answer weighs
as many verify steps as it has), and PER REQUEST, each request's own figure, then their mean (SpecForge's and
AIPerf's: every request weighs alike):

  acceptance rate         pooled: accepted / draft tokens; per request: the mean of each request's own
  mean acceptance length  pooled: 1 + accepted / drafts (tokens per target step: the accepted drafts and the
                          target's own); per request: the mean of each request's own (requests that drafted)
  acceptance by position  pooled: accepted at position i / drafts (the chance the first i+1 drafted tokens all
                          survive a verify step); per request: each request's own, then their mean (a request's
                          own needs its window alone, or its verify steps: ``detailed`` counts)
  output tok/s            pooled: output tokens / seconds the requests took (a phase's wall time at concurrency
                          > 1); per request: each request's own, then their mean (concurrency 1 only: a request in
                          a phase has no time of its own); n/a when a response told no output tokens (no ``usage``)
  TPOT                    the server's own time per output token, averaged over the finished requests

The ratio of head B to head A is taken over the same prompts (paired); its interval is a percentile bootstrap
over the prompts, seeded, so a rerun of the same measurements gives the same interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from .metrics import COUNTERS, Counters, made_counters

if TYPE_CHECKING:
    from numpy import float64
    from numpy.typing import NDArray

    from .json_values import JsonObject

RATIO_FIGURES = ("acceptance_rate_pooled", "acceptance_rate_per_request", "mean_acceptance_length_pooled",
                 "mean_acceptance_length_per_request", "output_tokens_per_s", "output_tokens_per_s_per_request")
MIN_INTERVAL_PAIRS = 10  # fewer prompts give no interval: a bootstrap over a handful of pairs says little
RESAMPLES = 2000
CONFIDENCE = 0.95
BOOTSTRAP_SEED = 0
_Item = TypeVar("_Item")


@dataclass(frozen=True, slots=True)
class Answer:
    """One answer of a window: its prompt (pack index), its own counts where the response carried them
    (``--per-request-spec-decode-metrics``; None otherwise), and its repetition (``loops.repetition``)."""

    prompt: int
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    repetition: float | None = None
    input_tokens: int | None = None  # the prompt's length in target tokens, as the server counted it
    per_step_accepted: tuple[int, ...] | None = None  # each verify step's accepted drafted tokens (``detailed``)
    # the verify steps that accepted more than i drafted tokens, at each position i (its own histogram's survival:
    # ``summary`` and ``detailed`` both give it; None in a run saved before it was recorded)
    accepted_by_position: tuple[float, ...] | None = None

    def counts(self) -> tuple[float, float, float] | None:
        if self.drafts is None or self.draft_tokens is None or self.accepted is None:
            return None
        return self.drafts, self.draft_tokens, self.accepted

    def position_counts(self, width: int) -> tuple[tuple[float, ...], float] | None:
        """(the steps that accepted more than i drafted tokens at each position i, its verify steps): from its own
        counts by position, else from its verify steps (``width`` positions); None when neither is known."""
        if self.accepted_by_position is not None and self.drafts is not None:
            return self.accepted_by_position, self.drafts
        if self.per_step_accepted is not None:
            steps = self.per_step_accepted
            return tuple(float(sum(accepted > i for accepted in steps)) for i in range(width)), float(len(steps))
        return None

    def counters(self) -> Counters | None:
        """Its own counts as the counters of a window of one request (no time: a request in a phase has none of its
        own); None when the response carried none."""
        counts = self.counts()
        if counts is None:
            return None
        drafts, draft_tokens, accepted = counts
        return made_counters(True, self.accepted_by_position or (), {
            "drafts": drafts, "draft_tokens": draft_tokens, "accepted": accepted, "finished_requests": 1.0})


@dataclass(frozen=True, slots=True)
class Window:
    """What one measurement saw on one endpoint (its label) in one mode: ``prompt`` is the pack index at
    concurrency 1, None for a phase; ``output_tokens`` None when a response told none."""

    endpoint: str
    mode: str
    prompt: int | None
    requests: int
    output_tokens: int | None
    seconds: float
    counters: Counters
    answers: tuple[Answer, ...] = ()  # one per request (none in a run saved before answers were recorded)

    def to_dict(self) -> JsonObject:
        saved = {c.name: value for c in COUNTERS if c.saved for value in [getattr(self.counters, c.name)]}
        answers = [{name: list(value) if isinstance(value, tuple) else value for name in Answer.__slots__
                    for value in [getattr(answer, name)]} for answer in self.answers]
        return {"endpoint": self.endpoint, "mode": self.mode, "prompt": self.prompt, "requests": self.requests,
                "output_tokens": self.output_tokens, "seconds": self.seconds, **saved,
                "accepted_by_position": list(self.counters.accepted_by_position), "answers": answers}

    def request_counts(self) -> list[tuple[float, float, float]] | None:
        """(drafts, draft tokens, accepted) of each of its requests: the window's own for a window of one request,
        else its answers' own counts; None when they are not known (a phase counted by /metrics)."""
        if self.requests == 1:
            return [(self.counters.drafts, self.counters.draft_tokens, self.counters.accepted)]
        counts = [answer.counts() for answer in self.answers]
        if len(counts) != self.requests or None in counts:
            return None
        return [count for count in counts if count is not None]

    def _request_position_counts(self) -> list[tuple[tuple[float, ...], float]] | None:
        """Each of its requests' (steps that accepted more than i drafted tokens at each position i, verify steps):
        the window's own for a window of one request, else its answers' own; None when they are not known."""
        c = self.counters
        if self.requests == 1:
            return [(c.accepted_by_position, c.drafts)]
        own = [answer.position_counts(len(c.accepted_by_position)) for answer in self.answers]
        if len(own) != self.requests or None in own:
            return None
        return [counts for counts in own if counts is not None]

    def request_positions(self) -> list[tuple[float, ...]] | None:
        """Each of its requests' own acceptance by position (the first i+1 drafted tokens all accepted, per verify
        step), those that drafted; None when they are not known."""
        counts = self._request_position_counts()
        return None if counts is None else [tuple(value / steps for value in by) for by, steps in counts if steps]

    def request_histograms(self) -> list[tuple[float, ...]] | None:
        """Each of its requests' own accepted-length histogram (the share of its verify steps that accepted exactly j
        drafted tokens), those that drafted; None when they are not known."""
        counts = self._request_position_counts()
        return None if counts is None else [_histogram(steps, by) for by, steps in counts if steps and by]

    def by_answer(self) -> list[Window]:
        """A phase's answers that carry their own counts, each as a window of one request (no time, no output tokens:
        a request in a phase has neither of its own)."""
        return [Window(self.endpoint, self.mode, answer.prompt, 1, None, 0.0, counters, (answer,))
                for answer in self.answers if (counters := answer.counters()) is not None]

    def request_speeds(self) -> list[float] | None:
        """Each of its requests' own output tok/s: a window of one request only (a request in a phase has no time of
        its own); None when not known."""
        if self.requests != 1 or self.output_tokens is None:
            return None
        return [self.output_tokens / self.seconds] if self.seconds > 0 else []

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Window:
        """A window as a run saved it (checked against the run's shape first)."""
        # the requests and tokens a window checks are the window's own, not a saved counter
        counted = {"finished_requests": doc["requests"], "generation_tokens": doc["output_tokens"] or 0}
        counters = made_counters(True, tuple(doc["accepted_by_position"]),
                                 {c.name: doc[c.name] if c.saved else counted[c.name] for c in COUNTERS})
        return cls(doc["endpoint"], doc["mode"], doc["prompt"], doc["requests"], doc["output_tokens"],
                   doc["seconds"], counters, tuple(_answer(answer) for answer in doc.get("answers", ())))


def _answer(saved: Mapping[str, Any]) -> Answer:
    steps, positions = saved.get("per_step_accepted"), saved.get("accepted_by_position")
    return Answer(**{**saved, "per_step_accepted": None if steps is None else tuple(steps),
                     "accepted_by_position": None if positions is None else tuple(positions)})


@dataclass(frozen=True, slots=True)
class Measures:
    """What a set of windows measures (None where undefined: no drafts, no time)."""

    requests: int
    output_tokens: int | None
    drafts: float
    draft_tokens: float
    accepted: float
    acceptance_rate_pooled: float | None  # over every verify step (vLLM's counters)
    acceptance_rate_per_request: float | None  # each request's own, then their mean
    mean_acceptance_length_pooled: float | None
    mean_acceptance_length_per_request: float | None
    acceptance_by_position: tuple[float, ...]  # marginal: the first i+1 drafted tokens all accepted, per step
    acceptance_by_position_per_request: tuple[float, ...] | None  # each request's own marginal, then their mean
    conditional_by_position: tuple[float, ...]  # position i accepted when every one before it was
    accepted_histogram: tuple[float, ...]  # the share of verify steps that accepted exactly j tokens, j = 0..k
    accepted_histogram_per_request: tuple[float, ...] | None  # each request's own shares, then their mean
    output_tokens_per_s: float | None  # pooled: every request's output tokens over the time they took
    output_tokens_per_s_per_request: float | None  # each request's own, then their mean
    tpot_ms: float | None


@dataclass(frozen=True, slots=True)
class Sums:
    """What a set of windows sums to: their requests, output tokens and seconds, their counters, and each
    request's own (drafts, draft tokens, accepted), None when not known."""

    requests: int = 0
    output_tokens: int | None = 0  # None when a window's are not known
    seconds: float = 0.0
    counters: Counters = field(default_factory=Counters)
    per_request: tuple[tuple[float, float, float], ...] | None = ()
    positions_per_request: tuple[tuple[float, ...], ...] | None = ()  # each request's own acceptance by position
    speeds_per_request: tuple[float, ...] | None = ()  # each request's own output tok/s
    histograms_per_request: tuple[tuple[float, ...], ...] | None = ()  # each request's own accepted lengths

    @classmethod
    def of(cls, windows: Sequence[Window]) -> Sums:
        tokens = [w.output_tokens for w in windows]
        return cls(sum(w.requests for w in windows),
                   None if None in tokens else sum(count for count in tokens if count is not None),
                   sum(w.seconds for w in windows), sum((w.counters for w in windows), Counters()),
                   _joined([w.request_counts() for w in windows]), _joined([w.request_positions() for w in windows]),
                   _joined([w.request_speeds() for w in windows]), _joined([w.request_histograms() for w in windows]))

    def figures(self) -> Measures:
        """The figures (None where the denominator is 0: no drafts, no time)."""
        c = self.counters
        drafts = c.drafts
        own = self.per_request or ()
        rates = [accepted / tokens for _, tokens, accepted in own if tokens]
        lengths = [1 + accepted / steps for steps, _, accepted in own if steps]
        positions, speeds = self.positions_per_request, self.speeds_per_request
        return Measures(
            requests=self.requests, output_tokens=self.output_tokens, drafts=drafts, draft_tokens=c.draft_tokens,
            accepted=c.accepted,
            acceptance_rate_pooled=c.accepted / c.draft_tokens if c.draft_tokens else None,
            acceptance_rate_per_request=sum(rates) / len(rates) if rates else None,
            mean_acceptance_length_pooled=1 + c.accepted / drafts if drafts else None,
            mean_acceptance_length_per_request=sum(lengths) / len(lengths) if lengths else None,
            acceptance_by_position=tuple(value / drafts for value in c.accepted_by_position) if drafts else (),
            acceptance_by_position_per_request=None if positions is None else _mean_by_position(positions),
            conditional_by_position=_conditional(drafts, c.accepted_by_position),
            accepted_histogram=_histogram(drafts, c.accepted_by_position),
            accepted_histogram_per_request=None if self.histograms_per_request is None
            else _mean_by_position(self.histograms_per_request),
            output_tokens_per_s=self.output_tokens / self.seconds
            if self.output_tokens is not None and self.seconds > 0 else None,
            output_tokens_per_s_per_request=sum(speeds) / len(speeds) if speeds else None,
            tpot_ms=1000 * c.tpot_sum / c.tpot_count if c.tpot_count else None)


def _joined(each: Sequence[list[_Item] | None]) -> tuple[_Item, ...] | None:
    """The items of every window's list, or None when a window's are not known."""
    return None if None in each else tuple(item for items in each if items is not None for item in items)


def _mean_by_position(positions: Sequence[tuple[float, ...]]) -> tuple[float, ...]:
    """The mean over requests of each one's own acceptance at every position (0 at a position a request's drafts did
    not reach, as the pooled counters count it); () when none drafted."""
    width = max((len(own) for own in positions), default=0)
    padded = [(*own, *[0.0] * (width - len(own))) for own in positions]
    return tuple(sum(column) / len(padded) for column in zip(*padded, strict=True)) if padded else ()


def _conditional(drafts: float, by_position: tuple[float, ...]) -> tuple[float, ...]:
    """The chance a drafted token at position i is accepted when every one before it was: accepted at i over
    accepted at i - 1 (over the drafts at 0); 0 where no step reached it."""
    if not drafts or not by_position:
        return ()
    reached = (drafts, *by_position[:-1])
    return tuple(here / before if before else 0.0 for here, before in zip(by_position, reached, strict=True))


def _histogram(drafts: float, by_position: tuple[float, ...]) -> tuple[float, ...]:
    """The share of verify steps that accepted exactly j drafted tokens, j = 0..k. A step accepts a prefix of its
    draft, so the steps that accepted at position i are those that accepted more than i tokens: the counts by
    position are the histogram's survival function, and vLLM's pooled counters give the histogram exactly."""
    if not drafts or not by_position:
        return ()
    survived = (drafts, *by_position, 0.0)
    return tuple((survived[j] - survived[j + 1]) / drafts for j in range(len(by_position) + 1))


# Each figure as a function of the column sums (accepted, draft tokens, drafts, output tokens, seconds; a pair's
# own rate where it drafted, and whether it did; its own acceptance length where it drafted, and whether it did;
# its own output tok/s where it is known, and whether it is).
_FIGURE_OF_SUMS: dict[str, Callable[[NDArray[float64]], NDArray[float64]]] = {
    "acceptance_rate_pooled": lambda s: s[..., 0] / s[..., 1],
    "acceptance_rate_per_request": lambda s: s[..., 5] / s[..., 6],
    "mean_acceptance_length_pooled": lambda s: 1 + s[..., 0] / s[..., 2],
    "mean_acceptance_length_per_request": lambda s: s[..., 7] / s[..., 8],
    "output_tokens_per_s": lambda s: s[..., 3] / s[..., 4],
    "output_tokens_per_s_per_request": lambda s: s[..., 9] / s[..., 10],
}


def _columns(window: Window) -> list[float]:
    """A window's columns for ``_FIGURE_OF_SUMS`` (a paired window holds one request: its counts are its own)."""
    c = window.counters
    drafted, stepped = c.draft_tokens > 0, c.drafts > 0
    speed = window.request_speeds()
    return [c.accepted, c.draft_tokens, c.drafts, math.nan if window.output_tokens is None else window.output_tokens,
            window.seconds, c.accepted / c.draft_tokens if drafted else 0.0, float(drafted),
            1 + c.accepted / c.drafts if stepped else 0.0, float(stepped),
            speed[0] if speed else 0.0, float(bool(speed))]


@dataclass(frozen=True, slots=True)
class Ratio:
    """B over A for one figure, with its bootstrap interval where the measurements pair up (None where undefined)."""

    figure: str
    ratio: float | None
    low: float | None = None
    high: float | None = None
    pairs: int | None = None  # the prompts paired (None: not paired)


def paired_ratios(a: Sequence[Window], b: Sequence[Window], *, resamples: int = RESAMPLES,
                  confidence: float = CONFIDENCE, seed: int = BOOTSTRAP_SEED,
                  min_pairs: int = MIN_INTERVAL_PAIRS) -> list[Ratio]:
    """Head B over head A for each of RATIO_FIGURES, with a bootstrap interval over the pairs (none under
    ``min_pairs``): ``a[i]`` and ``b[i]`` measured the same prompt. None where undefined (a figure of A is 0 or has
    no denominator, in the measurement or in every resample)."""
    import numpy as np

    if len(a) != len(b):
        raise ValueError("paired windows must come in pairs")
    pairs = len(a)
    if not pairs:
        return [Ratio(figure, None, pairs=0) for figure in RATIO_FIGURES]
    columns = np.array([[_columns(w) for w in side] for side in (a, b)], dtype=np.float64)
    # resample i takes pair j weights[i, j] times: the column sums of every resample in one product
    weights = np.random.default_rng(seed).multinomial(pairs, [1 / pairs] * pairs, size=resamples).astype(np.float64)
    tail = 100 * (1 - confidence) / 2
    ratios: list[Ratio] = []
    resampled_a, resampled_b = weights @ columns[0], weights @ columns[1]  # every resample's column sums, once
    with np.errstate(divide="ignore", invalid="ignore"):
        for figure in RATIO_FIGURES:
            of = _FIGURE_OF_SUMS[figure]
            ratio = float(of(columns[1].sum(axis=0)) / of(columns[0].sum(axis=0)))
            resampled = of(resampled_b) / of(resampled_a)
            resampled = resampled[np.isfinite(resampled)]
            if not np.isfinite(ratio) or not resampled.size:
                ratios.append(Ratio(figure, None, pairs=pairs))
                continue
            if pairs < min_pairs:
                ratios.append(Ratio(figure, ratio, pairs=pairs))
                continue
            low, high = np.percentile(resampled, [tail, 100 - tail])
            ratios.append(Ratio(figure, ratio, float(low), float(high), pairs))
    return ratios


@dataclass(frozen=True, slots=True)
class LoopGap:
    """The share of answers that loop under head A and under head B over the same prompts, B - A with its
    bootstrap interval; ``flagged`` when the interval excludes 0 (the heads' targets looped differently)."""

    share_a: float
    share_b: float
    difference: float
    low: float | None  # None: too few pairs for an interval (MIN_INTERVAL_PAIRS)
    high: float | None
    pairs: int
    flagged: bool


def loop_gap(a: Sequence[bool], b: Sequence[bool], *, resamples: int = RESAMPLES, confidence: float = CONFIDENCE,
             seed: int = BOOTSTRAP_SEED) -> LoopGap | None:
    """B's share of looping answers minus A's, paired prompt by prompt (``a[i]``, ``b[i]``: whether each head's
    answer to prompt i loops); None without pairs."""
    import numpy as np

    if len(a) != len(b):
        raise ValueError("paired answers must come in pairs")
    pairs = len(a)
    if not pairs:
        return None
    share_a, share_b = sum(a) / pairs, sum(b) / pairs
    if pairs < MIN_INTERVAL_PAIRS:
        return LoopGap(share_a, share_b, share_b - share_a, None, None, pairs, False)
    gaps = np.array(b, dtype=np.float64) - np.array(a, dtype=np.float64)
    weights = np.random.default_rng(seed).multinomial(pairs, [1 / pairs] * pairs, size=resamples)
    tail = 100 * (1 - confidence) / 2
    low, high = (float(value) for value in np.percentile(weights @ gaps / pairs, [tail, 100 - tail]))
    return LoopGap(share_a, share_b, share_b - share_a, low, high, pairs, low > 0 or high < 0)


def figure_ratios(a: Measures, b: Measures) -> list[Ratio]:
    """B over A for each of RATIO_FIGURES from two sets of figures, without an interval: for measurements that are
    not paired prompt by prompt."""
    ratios = []
    for figure in RATIO_FIGURES:
        value_a, value_b = getattr(a, figure), getattr(b, figure)
        ratios.append(Ratio(figure, value_b / value_a if value_a and value_b is not None else None))
    return ratios
