"""Figures from measurement windows, and the paired bootstrap ratio of two heads (seeded)."""

from __future__ import annotations

import random
import warnings
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

import pytest

from corpus_builder.eval import figures as measured_figures
from corpus_builder.eval.figures import Answer, Measures, Ratio, Sums, Window
from corpus_builder.eval.metrics import Counters


def window(accepted: float, draft_tokens: float, drafts: float, tokens: int = 40, seconds: float = 1.0,
           positions: tuple[float, ...] = (), prompt: int = 0, endpoint: str = "A") -> Window:
    return Window(endpoint, "thinking", prompt, 1, tokens, seconds,
                  Counters(True, drafts, draft_tokens, accepted, positions, 1, tokens, 0.01 * tokens, 1))



def by_figure(ratios: list[Ratio]) -> dict[str, dict[str, Any]]:
    return {r.figure: {"ratio": r.ratio, "low": r.low, "high": r.high, "pairs": r.pairs} for r in ratios}


def paired_ratios(a: Sequence[Window], b: Sequence[Window], **options: Any) -> dict[str, dict[str, Any]]:
    """The bootstrap itself, on however few pairs (the floor is tested on its own)."""
    return by_figure(measured_figures.paired_ratios(a, b, **{"min_pairs": 1, **options}))


def figure_ratios(a: Measures, b: Measures) -> dict[str, dict[str, Any]]:
    return by_figure(measured_figures.figure_ratios(a, b))

def test_figures_are_ratios_of_sums() -> None:
    windows = [window(30, 30, 10, tokens=40, seconds=2.0, positions=(10, 10, 10)),
               window(0, 30, 10, tokens=10, seconds=0.5, positions=(0, 0, 0))]
    figures = Sums.of(windows).figures()
    assert figures.acceptance_rate_pooled == 0.5  # 30 / 60, not the mean of 1.0 and 0.0 weighted alike by chance
    assert figures.mean_acceptance_length_pooled == 1 + 30 / 20
    assert figures.acceptance_by_position == (0.5, 0.5, 0.5)
    assert figures.output_tokens_per_s == 50 / 2.5
    assert figures.tpot_ms == pytest.approx(1000 * 0.5 / 2)
    assert figures.requests == 2 and figures.output_tokens == 50


def test_figures_without_drafts_are_undefined_not_zero() -> None:
    figures = Sums.of([window(0, 0, 0)]).figures()
    assert figures.acceptance_rate_pooled is None and figures.mean_acceptance_length_pooled is None
    assert figures.acceptance_by_position == ()
    assert Sums.of([window(0, 0, 0, positions=(0, 0, 0))]).figures().acceptance_by_position == ()
    assert Sums.of([]) == Sums() and Sums.of([]).figures().output_tokens_per_s is None
    assert Sums.of([window(6, 12, 4, tokens=30, seconds=0.5)]).figures().output_tokens_per_s == 60.0


def test_a_window_survives_its_saved_form() -> None:
    original = window(5, 9, 3, positions=(3, 2, 0), prompt=7, endpoint="B")
    assert Window.from_dict(original.to_dict()).to_dict() == original.to_dict()


def test_the_same_head_twice_gives_one_with_a_point_interval() -> None:
    a = [window(i % 4, 3 * (i % 5 + 1), i % 5 + 1, prompt=i) for i in range(30)]
    ratios = paired_ratios(a, a)
    assert ratios["acceptance_rate_pooled"] == {"ratio": 1.0, "low": 1.0, "high": 1.0, "pairs": 30}
    assert ratios["mean_acceptance_length_pooled"]["low"] == ratios["mean_acceptance_length_pooled"]["high"] == 1.0


def test_the_interval_holds_the_true_ratio_and_is_seeded() -> None:
    """B accepts each prompt's drafts with half A's chance, plus noise: the interval holds 0.5 and shrinks with
    more prompts; the same seed gives the same interval, another seed another."""
    rng = random.Random(1)

    def pairs(n: int) -> tuple[list[Window], list[Window]]:
        a, b = [], []
        for i in range(n):
            draft_tokens = 3 * rng.randint(5, 30)
            a.append(window(sum(rng.random() < 0.6 for _ in range(draft_tokens)), draft_tokens, draft_tokens / 3,
                            prompt=i))
            b.append(window(sum(rng.random() < 0.3 for _ in range(draft_tokens)), draft_tokens, draft_tokens / 3,
                            prompt=i, endpoint="B"))
        return a, b

    few, many = pairs(20), pairs(400)
    small, large = paired_ratios(*few)["acceptance_rate_pooled"], paired_ratios(*many)["acceptance_rate_pooled"]
    for ratio in (small, large):
        assert ratio["low"] < 0.5 < ratio["high"]
        assert ratio["low"] < ratio["ratio"] < ratio["high"]
    assert large["high"] - large["low"] < small["high"] - small["low"]
    assert paired_ratios(*few) == paired_ratios(*few)
    assert paired_ratios(*few, seed=1)["acceptance_rate_pooled"] != small


def test_a_head_a_without_drafts_has_no_ratio_and_no_warning() -> None:
    a = [window(0, 0, 0, prompt=i) for i in range(5)]
    b = [window(3, 6, 2, prompt=i) for i in range(5)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's division by zero is no message of the eval's
        ratios = paired_ratios(a, b)
        rejected = paired_ratios([window(0, 6, 2, prompt=i) for i in range(5)], b)  # drafted, none accepted
    assert rejected["acceptance_rate_pooled"] == {"ratio": None, "low": None, "high": None, "pairs": 5}
    assert rejected["mean_acceptance_length_pooled"]["ratio"] == 2.5
    assert ratios["acceptance_rate_pooled"]["ratio"] is None and ratios["acceptance_rate_pooled"]["low"] is None
    assert ratios["output_tokens_per_s"]["ratio"] == 1.0  # the speed is still compared
    assert paired_ratios([], [])["acceptance_rate_pooled"] == {"ratio": None, "low": None, "high": None, "pairs": 0}
    with pytest.raises(ValueError, match=r"^paired windows must come in pairs$"):
        paired_ratios(a, b[:2])


def test_unpaired_ratios_have_no_interval() -> None:
    a, b = Sums.of([window(10, 20, 5)]).figures(), Sums.of([window(5, 20, 5)]).figures()
    ratios = figure_ratios(a, b)
    assert ratios["acceptance_rate_pooled"] == {"ratio": 0.5, "low": None, "high": None, "pairs": None}
    assert figure_ratios(Sums.of([window(0, 0, 0)]).figures(), b)["acceptance_rate_pooled"]["ratio"] is None


def bootstrap_by_hand(a: list[Window], b: list[Window], figure: str, resamples: int = 2000, seed: int = 0,
                      confidence: float = 0.95) -> tuple[float, float]:
    """The percentile bootstrap over pairs as its definition says, one resample at a time: resample i takes pair j
    as many times as the seeded multinomial draw says, and B / A is the figure of its column sums."""
    import numpy as np

    def of(windows: list[Window], weights: np.ndarray) -> float:
        sums = {name: sum(weight * value for weight, value in zip(weights, column, strict=True)) for name, column in (
            ("accepted", [w.counters.accepted for w in windows]),
            ("draft_tokens", [w.counters.draft_tokens for w in windows]),
            ("drafts", [w.counters.drafts for w in windows]),
            ("tokens", [w.output_tokens for w in windows]), ("seconds", [w.seconds for w in windows]))}
        return {"acceptance_rate_pooled": sums["accepted"] / sums["draft_tokens"],
                "mean_acceptance_length_pooled": 1 + sums["accepted"] / sums["drafts"],
                "output_tokens_per_s": sums["tokens"] / sums["seconds"]}[figure]

    draws = np.random.default_rng(seed).multinomial(len(a), [1 / len(a)] * len(a), size=resamples)
    ratios = [of(b, weights) / of(a, weights) for weights in draws]
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


def pairs_of(count: int) -> tuple[list[Window], list[Window]]:
    """Head B accepts a different share of each prompt's drafts than head A, and runs at another speed."""
    a = [window(3 + i % 4, 12, 4, tokens=20 + 3 * i, seconds=1.0 + 0.1 * i, prompt=i) for i in range(count)]
    b = [window(1 + (i * 5) % 7, 12, 4 + i % 2, tokens=25 + i, seconds=0.8 + 0.05 * (i % 3), prompt=i, endpoint="B")
         for i in range(count)]
    return a, b


@pytest.mark.parametrize("figure", ["acceptance_rate_pooled", "mean_acceptance_length_pooled", "output_tokens_per_s"])
def test_the_interval_is_the_percentile_bootstrap_over_the_pairs(figure: str) -> None:
    a, b = pairs_of(12)
    measured = paired_ratios(a, b)[figure]
    sums_a, sums_b = Sums.of(a).figures(), Sums.of(b).figures()
    assert measured["ratio"] == pytest.approx(getattr(sums_b, figure) / getattr(sums_a, figure), rel=1e-12)
    assert (measured["low"], measured["high"]) == pytest.approx(bootstrap_by_hand(a, b, figure), rel=1e-12)
    assert measured["pairs"] == 12
    narrow = paired_ratios(a, b, resamples=300, confidence=0.5, seed=7)[figure]
    assert (narrow["low"], narrow["high"]) == pytest.approx(
        bootstrap_by_hand(a, b, figure, resamples=300, seed=7, confidence=0.5), rel=1e-12)
    assert measured["low"] < narrow["low"] < narrow["high"] < measured["high"]


def test_resamples_where_head_a_has_no_drafts_are_left_out_of_the_interval() -> None:
    """Head A drafted in one prompt only: a resample without that prompt has no figure for A and is dropped; the
    interval comes from the others."""
    import numpy as np

    a = [window(6 if i == 0 else 0, 12 if i == 0 else 0, 4 if i == 0 else 0, prompt=i) for i in range(3)]
    b = [window(3, 12, 4, prompt=i, endpoint="B") for i in range(3)]
    measured = paired_ratios(a, b)["acceptance_rate_pooled"]
    assert measured["ratio"] == pytest.approx((9 / 36) / (6 / 12))
    draws = np.random.default_rng(0).multinomial(3, [1 / 3] * 3, size=2000)
    kept = [(3 * sum(w) / (12 * sum(w))) / (6 * w[0] / (12 * w[0])) for w in draws if w[0]]
    assert len(kept) < 2000 and (measured["low"], measured["high"]) == pytest.approx(
        tuple(np.percentile(kept, [2.5, 97.5])), rel=1e-12)


def test_figures_of_windows_without_tokens_or_time() -> None:
    untold = Window("A", "thinking", 0, 1, None, 2.0, Counters(True, 4, 12, 6, (3, 2, 1), 1, 0, 0.3, 1))
    figures = Sums.of([untold, window(6, 12, 4, tokens=30)]).figures()
    assert (figures.output_tokens, figures.output_tokens_per_s) == (None, None)
    assert (figures.requests, figures.drafts, figures.accepted) == (2, 8, 12)
    assert figures.tpot_ms == pytest.approx(1000 * (0.3 + 0.3) / 2)
    timeless = Sums.of([window(6, 12, 4, tokens=30, seconds=0.0)]).figures()
    assert timeless.output_tokens_per_s is None and timeless.output_tokens == 30
    assert Window.from_dict(untold.to_dict()) == untold
    ratio = paired_ratios([untold], [untold])
    assert ratio["output_tokens_per_s"] == {"ratio": None, "low": None, "high": None, "pairs": 1}
    assert ratio["acceptance_rate_pooled"] == {"ratio": 1.0, "low": 1.0, "high": 1.0, "pairs": 1}


def test_the_saved_form_of_a_window_holds_every_count() -> None:
    original = Window("B", "non-thinking", 4, 2, 57, 1.5, Counters(True, 9, 27, 13, (7, 4, 2), 2, 57, 0.125, 2))
    assert original.to_dict() == {
        "endpoint": "B", "mode": "non-thinking", "prompt": 4, "requests": 2, "output_tokens": 57, "seconds": 1.5,
        "drafts": 9, "draft_tokens": 27, "accepted": 13, "accepted_by_position": [7, 4, 2], "tpot_sum": 0.125,
        "tpot_count": 2, "answers": []}
    assert Window.from_dict(original.to_dict()) == original
    answered = replace(original, answers=(Answer(4, 5, 15, 8, 0.25, per_step_accepted=(3, 1, 0, 2, 2),
                                                 accepted_by_position=(4, 3, 1)), Answer(7)))
    assert answered.to_dict()["answers"] == [
        {"prompt": 4, "drafts": 5, "draft_tokens": 15, "accepted": 8, "repetition": 0.25, "input_tokens": None,
         "per_step_accepted": [3, 1, 0, 2, 2], "accepted_by_position": [4, 3, 1]},
        {"prompt": 7, "drafts": None, "draft_tokens": None, "accepted": None, "repetition": None,
         "input_tokens": None, "per_step_accepted": None, "accepted_by_position": None}]
    assert Window.from_dict(answered.to_dict()) == answered


def test_sums_add_every_position_and_every_count() -> None:
    sums = Sums.of([window(5, 12, 4, tokens=20, seconds=1.0, positions=(3, 2)),
                    window(6, 9, 3, tokens=10, seconds=0.25, positions=(3, 2, 1))])
    assert sums == Sums(2, 30, 1.25, Counters(True, 7, 21, 11, (6, 4, 1), 2, 30, 0.01 * 20 + 0.01 * 10, 2),
                        ((4, 12, 5), (3, 9, 6)), ((3 / 4, 2 / 4), (3 / 3, 2 / 3, 1 / 3)), (20.0, 40.0),
                        ((1 / 4, 1 / 4, 2 / 4), (0.0, 1 / 3, 1 / 3, 1 / 3)))
    assert asdict(sums.figures()) == {
        "requests": 2, "output_tokens": 30, "drafts": 7, "draft_tokens": 21, "accepted": 11,
        "acceptance_rate_pooled": 11 / 21, "mean_acceptance_length_pooled": 1 + 11 / 7,
        # each request's own (5 of 12 in 4 steps, 6 of 9 in 3), then their mean: not the pooled 11 / 21
        "acceptance_rate_per_request": pytest.approx((5 / 12 + 6 / 9) / 2),
        "mean_acceptance_length_per_request": pytest.approx((1 + 5 / 4 + 1 + 6 / 3) / 2),
        "acceptance_by_position": (6 / 7, 4 / 7, 1 / 7),
        # each request's own by position (the first reached two positions: 0 at the third), then their mean
        "acceptance_by_position_per_request": pytest.approx(((3 / 4 + 1) / 2, (2 / 4 + 2 / 3) / 2, (0 + 1 / 3) / 2)),
        # 30 tokens in 1.25 s pooled; 20 tok/s and 40 tok/s each
        "output_tokens_per_s": 24.0, "output_tokens_per_s_per_request": 30.0,
        # of 7 steps: 1 accepted none, 2 one, 3 two, 1 three; position i given every one before it
        "accepted_histogram": (1 / 7, 2 / 7, 3 / 7, 1 / 7), "conditional_by_position": (6 / 7, 4 / 6, 1 / 4),
        # each request's own shares (1, 1, 2 of 4 steps; 0, 1, 1, 1 of 3), then their mean
        "accepted_histogram_per_request": pytest.approx((1 / 8, (1 / 4 + 1 / 3) / 2, (2 / 4 + 1 / 3) / 2, 1 / 6)),
        "tpot_ms": pytest.approx(1000 * 0.3 / 2)}


def test_per_request_positions_from_verify_steps_and_speeds_only_alone() -> None:
    """A phase of several requests gives each one's acceptance by position from its verify steps (``detailed``),
    and none without them; no request of a phase has an output tok/s of its own."""
    counters = Counters(True, 5, 10, 4, (3, 1), 2, 30, 0.3, 2)
    steps = (Answer(0, 3, 6, 3, per_step_accepted=(2, 1, 0)), Answer(1, 2, 4, 1, per_step_accepted=(1, 0)))
    phase = Window("A", "thinking", None, 2, 30, 1.0, counters, steps)
    assert phase.request_positions() == [(2 / 3, 1 / 3), (1 / 2, 0.0)]
    assert phase.request_speeds() is None
    figures = Sums.of([phase]).figures()
    assert figures.acceptance_by_position_per_request == pytest.approx(((2 / 3 + 1 / 2) / 2, (1 / 3) / 2))
    assert figures.acceptance_by_position == (3 / 5, 1 / 5)  # pooled: 3 and 1 of 5 steps
    assert figures.output_tokens_per_s_per_request is None and figures.output_tokens_per_s == 30.0
    summary_only = replace(phase, answers=tuple(replace(answer, per_step_accepted=None) for answer in steps))
    assert summary_only.request_positions() is None
    assert Sums.of([summary_only]).figures().acceptance_by_position_per_request is None


def test_unpaired_ratios_of_every_figure() -> None:
    nothing = Sums().figures()  # every figure undefined
    a = replace(nothing, acceptance_rate_pooled=0.5, mean_acceptance_length_pooled=2.0, output_tokens_per_s=40.0)
    b = replace(nothing, acceptance_rate_pooled=0.25, mean_acceptance_length_pooled=3.0, output_tokens_per_s=None)
    assert figure_ratios(a, b) == {
        "acceptance_rate_pooled": {"ratio": 0.5, "low": None, "high": None, "pairs": None},
        "mean_acceptance_length_pooled": {"ratio": 1.5, "low": None, "high": None, "pairs": None},
        "acceptance_rate_per_request": {"ratio": None, "low": None, "high": None, "pairs": None},
        "mean_acceptance_length_per_request": {"ratio": None, "low": None, "high": None, "pairs": None},
        "output_tokens_per_s": {"ratio": None, "low": None, "high": None, "pairs": None},
        "output_tokens_per_s_per_request": {"ratio": None, "low": None, "high": None, "pairs": None}}
    zero = figure_ratios(replace(a, acceptance_rate_pooled=0.0), b)["acceptance_rate_pooled"]
    assert zero["ratio"] is None


def test_too_few_pairs_give_the_ratio_without_an_interval() -> None:
    a = [window(2, 6, 2, prompt=i) for i in range(measured_figures.MIN_INTERVAL_PAIRS)]
    b = [window(i % 3, 6, 2, prompt=i) for i in range(measured_figures.MIN_INTERVAL_PAIRS)]
    few = by_figure(measured_figures.paired_ratios(a[:-1], b[:-1]))["acceptance_rate_pooled"]
    assert few["ratio"] == pytest.approx(sum(i % 3 for i in range(9)) / 18)
    assert (few["low"], few["high"], few["pairs"]) == (None, None, 9)
    enough = by_figure(measured_figures.paired_ratios(a, b))["acceptance_rate_pooled"]
    assert enough["low"] is not None and enough["low"] <= enough["high"] and enough["pairs"] == 10
    assert measured_figures.loop_gap([False] * 9, [True] * 9) == measured_figures.LoopGap(
        0.0, 1.0, 1.0, None, None, 9, False)
    assert measured_figures.loop_gap([False] * 10, [True] * 10) == measured_figures.LoopGap(
        0.0, 1.0, 1.0, 1.0, 1.0, 10, True)
