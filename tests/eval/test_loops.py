"""Loops set apart: each answer's repetition measured, looping answers counted, every figure also given without
them, and two heads flagged when their loop shares differ beyond their interval (fault servers whose scripted
answers loop)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.eval import compare, evaluate, format_comparison, format_run
from corpus_builder.eval.html import write_run_page
from corpus_builder.eval.loops import repetition
from corpus_builder.testing.fault_server import FaultServer, Scripted

from .conftest import write_jsonl
from .runs import check_figures, page_tables

K = 3
PROSE = " ".join(f"w{i}" for i in range(59))  # 60 tokens, none repeated
LOOP = " ".join(["go", "round"] * 50)  # 101 tokens: "go round" over and over
PROMPTS = [f"question {i}" for i in range(12)]
LOOPING = {0, 1, 3, 4, 6, 7, 9, 10}  # the prompts head B's target loops on


def test_repetition_is_the_share_of_tokens_inside_an_ngram_seen_earlier() -> None:
    assert repetition([1, 2, 3, 1, 2], n=2) == 2 / 5  # (1, 2) again at 3: tokens 3 and 4
    assert repetition([1, 2, 3, 4, 5, 6], n=2) == 0.0
    assert repetition([7] * 20, n=8) == 19 / 20  # every token but the first lies in an 8-gram seen before
    assert repetition([1, 2, 1], n=8) == 0.0  # shorter than an n-gram
    assert repetition([*LOOP.split(), "</s>"]) == pytest.approx(98 / 101)
    assert repetition(PROSE.split()) == 0.0


def server(loops: bool, *, per_request: bool = True) -> FaultServer:
    """Accepts 1 of 3 drafted tokens a step on prose and all 3 on a loop (a loop is drafted almost perfectly)."""
    answers = {text: Scripted(LOOP, 3) if loops and index in LOOPING else Scripted(PROSE, 1)
               for index, text in enumerate(PROMPTS)}
    return FaultServer(speculative_tokens=K, per_request_metrics=per_request, detailed=per_request, answers=answers)


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "pack" / "pack.jsonl", [
        {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "x"}], "source": "chat"}
        for text in PROMPTS])


def test_loops_are_counted_set_apart_and_a_head_whose_target_loops_more_is_flagged(pack: Path,
                                                                                    tmp_path: Path) -> None:
    with server(False) as a, server(True, per_request=False) as b:
        result = evaluate(pack, [a.base_url, b.base_url, a.base_url], temperature=0, modes=["non-thinking"],
                          save_dir=tmp_path / "runs")
    run = result.run
    shares = {(w.endpoint, w.prompt): w.answers[0].repetition for w in run.windows}
    assert shares["B", 0] == pytest.approx(98 / 101) and shares["B", 2] == 0.0 and shares["A", 0] == 0.0
    figures = {(f.endpoint, f.group): f for f in run.figures}
    assert [f.group for f in run.figures if f.endpoint == "A"] == [
        "all", "all without loops", "source:chat", "source:chat without loops", "length:<512",
        "length:<512 without loops", "turn:1", "turn:1 without loops"]
    assert (figures["A", "all"].loops, figures["B", "all"].loops) == (0, len(LOOPING))
    # with the loops: B looks better than it is (a loop is drafted whole); without them: the same as A
    assert figures["B", "all"].mean_acceptance_length_pooled > 3
    for head in "ABC":
        without = figures[head, "all without loops"]
        assert (without.requests, without.loops) == (len(PROMPTS) - len(LOOPING), 0)  # every head, same prompts
        assert without.mean_acceptance_length_pooled == without.mean_acceptance_length_per_request == 2.0
    ratios = {(r.b, r.group, r.value.figure): r.value for r in run.ratios}
    assert ratios["B", "all", "mean_acceptance_length_pooled"].ratio > 1.5
    assert ratios["B", "all without loops", "mean_acceptance_length_pooled"].ratio == 1.0
    gaps = {(g.b, g.group): g.value for g in run.loop_gaps}
    assert set(gaps) == {(head, group) for head in "BC" for group in ("all", "source:chat", "length:<512", "turn:1")}
    differ = gaps["B", "all"]
    assert (differ.share_a, differ.share_b, differ.pairs) == (0.0, len(LOOPING) / len(PROMPTS), len(PROMPTS))
    assert 0 < differ.low <= differ.high and differ.flagged
    alike = gaps["C", "all"]  # head A's server again: the same answers
    assert (alike.difference, alike.low, alike.high, alike.flagged) == (0.0, 0.0, 0.0, False)

    text = format_run(run).splitlines()
    loop_rows = text[next(i for i, line in enumerate(text) if line.startswith("loop share: answers")) + 3:]
    assert loop_rows[0].startswith("| non-thinking | B / A | all ") and "| +0.667 [" in loop_rows[0]
    assert loop_rows[0].rstrip(" |").endswith("DIFFER: compare without loops")
    assert loop_rows[1].startswith("| non-thinking | C / A | all ") and loop_rows[1].rstrip(" |").endswith("alike")
    page = tmp_path / "run.html"
    write_run_page(page, run, "run", "eval")
    tables = dict(page_tables(page.read_text()))
    assert check_figures(tables["acceptance-figures"], run) == 6  # all and all without loops, three heads
    assert tables["acceptance-loops"][1][:3] == ["non-thinking", "B / A", "all"]
    assert tables["acceptance-loops"][1][-1] == "DIFFER: compare without loops"

    # two saved runs compared: the loop shares beside each other too
    with server(False) as a:
        first = evaluate(pack, [a.base_url], temperature=0, modes=["non-thinking"], save_dir=tmp_path / "runs")
    with server(True) as b:
        second = evaluate(pack, [b.base_url], temperature=0, modes=["non-thinking"], save_dir=tmp_path / "runs")
    comparison = compare(first.saved, second.saved)
    row = next(r for r in comparison.rows if r.group == "all")
    assert row.loops is not None and row.loops.flagged and row.loops.share_b == len(LOOPING) / len(PROMPTS)
    without = next(r for r in comparison.rows if r.group == "all without loops")
    assert without.ratio("mean_acceptance_length_pooled").ratio == 1.0 and without.loops is None
    assert "DIFFER: compare without loops" in format_comparison(comparison, ("a", "b"))


def test_the_threshold_decides_what_loops(pack: Path, tmp_path: Path) -> None:
    with server(True) as b:
        run = evaluate(pack, [b.base_url], temperature=0, modes=["non-thinking"], loop_threshold=0.99,
                       save_dir=tmp_path / "runs").run
    # 98/101 is under 0.99
    assert [(f.group, f.loops) for f in run.figures] == [("all", 0), ("source:chat", 0), ("length:<512", 0),
                                                         ("turn:1", 0)]
    assert run.settings.loop_threshold == 0.99 and run.missing == ()
    with pytest.raises(CorpusError, match="--loop-threshold 0: a share above 0, at most 1"):
        evaluate(pack, ["http://127.0.0.1:9/v1"], loop_threshold=0)


def test_a_phase_gives_the_figures_without_loops_from_its_answers_own_counts(pack: Path, tmp_path: Path) -> None:
    """At concurrency > 1 a phase is one window, but each answer's own counts (per-request metrics) give its
    figures without the looping answers; its time is the phase's, so tok/s without loops is named missing."""
    with server(False) as a, server(True) as b:
        run = evaluate(pack, [a.base_url, b.base_url], temperature=0, modes=["non-thinking"], concurrency=3,
                       save_dir=tmp_path / "runs").run
    figures = {(f.endpoint, f.group): f for f in run.figures}
    assert [(f.endpoint, f.group, f.loops) for f in run.figures] == [
        ("A", "all", 0), ("B", "all", len(LOOPING)), ("A", "all without loops", 0), ("B", "all without loops", 0)]
    kept = len(PROMPTS) - len(LOOPING)
    for label in "AB":  # prose alone: 1 of 3 drafted tokens accepted a step, on both heads
        without = figures[label, "all without loops"]
        assert without.requests == kept and without.mean_acceptance_length_pooled == 2.0
        assert without.acceptance_rate_per_request == pytest.approx(1 / 3)
        assert without.output_tokens_per_s is None and without.tpot_ms is None
    assert figures["B", "all"].mean_acceptance_length_pooled > 2.0  # the loops drafted almost perfectly
    ratio = next(r.value for r in run.ratios if r.group == "all without loops" and
                 r.value.figure == "mean_acceptance_length_pooled")
    assert ratio.ratio == 1.0 and ratio.pairs is None  # a phase is not paired prompt by prompt
    assert [missing.split(":")[0] for missing in run.missing] == ["per-request output tok/s",
                                                                  "output tok/s and TPOT without loops"]


def test_a_phase_counted_by_metrics_names_the_figures_without_loops_missing(pack: Path, tmp_path: Path) -> None:
    with server(True, per_request=False) as b:
        run = evaluate(pack, [b.base_url], temperature=0, modes=["non-thinking"], concurrency=3,
                       save_dir=tmp_path / "runs").run
    assert [(f.group, f.loops) for f in run.figures] == [("all", len(LOOPING))]
    assert "figures without loops" in [missing.split(":")[0] for missing in run.missing]
