"""Figures from measurement windows, and the paired bootstrap ratio of two heads (seeded)."""

from __future__ import annotations

import random

import pytest

from corpus_builder.eval.figures import Sums, Window, figure_ratios, paired_ratios
from corpus_builder.eval.metrics import Counters


def window(accepted: float, draft_tokens: float, drafts: float, tokens: int = 40, seconds: float = 1.0,
           positions: tuple[float, ...] = (), prompt: int = 0, endpoint: str = "A") -> Window:
    return Window(endpoint, "thinking", prompt, 1, tokens, seconds,
                  Counters(True, drafts, draft_tokens, accepted, positions, 1, tokens, 0.01 * tokens, 1))


def test_figures_are_ratios_of_sums() -> None:
    windows = [window(30, 30, 10, tokens=40, seconds=2.0, positions=(10, 10, 10)),
               window(0, 30, 10, tokens=10, seconds=0.5, positions=(0, 0, 0))]
    figures = Sums.of(windows).figures()
    assert figures["acceptance_rate"] == 0.5  # 30 / 60, not the mean of 1.0 and 0.0 weighted alike by chance
    assert figures["mean_acceptance_length"] == 1 + 30 / 20
    assert figures["acceptance_by_position"] == [0.5, 0.5, 0.5]
    assert figures["output_tokens_per_s"] == 50 / 2.5
    assert figures["tpot_ms"] == pytest.approx(1000 * 0.5 / 2)
    assert figures["requests"] == 2 and figures["output_tokens"] == 50


def test_figures_without_drafts_are_undefined_not_zero() -> None:
    figures = Sums.of([window(0, 0, 0)]).figures()
    assert figures["acceptance_rate"] is None and figures["mean_acceptance_length"] is None
    assert figures["acceptance_by_position"] == []
    assert Sums.of([]).figures()["output_tokens_per_s"] is None


def test_a_window_survives_its_saved_form() -> None:
    original = window(5, 9, 3, positions=(3, 2, 0), prompt=7, endpoint="B")
    assert Window.from_dict(original.to_dict()).to_dict() == original.to_dict()


def test_the_same_head_twice_gives_one_with_a_point_interval() -> None:
    a = [window(i % 4, 3 * (i % 5 + 1), i % 5 + 1, prompt=i) for i in range(30)]
    ratios = paired_ratios(a, a)
    assert ratios["acceptance_rate"] == {"ratio": 1.0, "low": 1.0, "high": 1.0, "pairs": 30}
    assert ratios["mean_acceptance_length"]["low"] == ratios["mean_acceptance_length"]["high"] == 1.0


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
    small, large = paired_ratios(*few)["acceptance_rate"], paired_ratios(*many)["acceptance_rate"]
    for ratio in (small, large):
        assert ratio["low"] < 0.5 < ratio["high"]
        assert ratio["low"] < ratio["ratio"] < ratio["high"]
    assert large["high"] - large["low"] < small["high"] - small["low"]
    assert paired_ratios(*few) == paired_ratios(*few)
    assert paired_ratios(*few, seed=1)["acceptance_rate"] != small


def test_a_head_a_without_drafts_has_no_ratio() -> None:
    a = [window(0, 0, 0, prompt=i) for i in range(5)]
    b = [window(3, 6, 2, prompt=i) for i in range(5)]
    ratios = paired_ratios(a, b)
    assert ratios["acceptance_rate"]["ratio"] is None and ratios["acceptance_rate"]["low"] is None
    assert ratios["output_tokens_per_s"]["ratio"] == 1.0  # the speed is still compared
    assert paired_ratios([], [])["acceptance_rate"] == {"ratio": None, "low": None, "high": None, "pairs": 0}
    with pytest.raises(ValueError, match="pairs"):
        paired_ratios(a, b[:2])


def test_unpaired_ratios_have_no_interval() -> None:
    a, b = Sums.of([window(10, 20, 5)]).figures(), Sums.of([window(5, 20, 5)]).figures()
    ratios = figure_ratios(a, b)
    assert ratios["acceptance_rate"] == {"ratio": 0.5, "low": None, "high": None, "pairs": None}
    assert figure_ratios(Sums.of([window(0, 0, 0)]).figures(), b)["acceptance_rate"]["ratio"] is None
