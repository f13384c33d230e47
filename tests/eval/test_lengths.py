"""The accepted-length histogram and acceptance per position, marginal and conditional; each request's verify steps
kept where a server gives them (``--per-request-spec-decode-metrics detailed``), and what a server that gives less
leaves missing named."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from corpus_builder.eval import evaluate, format_run
from corpus_builder.eval.html import write_run_page
from corpus_builder.testing.fault_server import FaultServer, Scripted

from .conftest import write_jsonl
from .runs import page_tables

K = 3
ACCEPTING = [0, 1, 3, 1, 2]  # each prompt's verify steps accept this many drafted tokens
ANSWER = " ".join(f"w{i}" for i in range(23))  # 24 tokens
# each prompt's steps all accept alike (24 tokens fill whole steps), so each request's histogram is one length:
# 0 once, 1 twice, 2 once, 3 once of the five
PER_REQUEST_HISTOGRAM = (1 / 5, 2 / 5, 1 / 5, 1 / 5)


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "pack" / "pack.jsonl", [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "x"}]}
        for i in range(len(ACCEPTING))])


def server(**options: object) -> FaultServer:
    answers = {f"q{i}": Scripted(ANSWER, accepting) for i, accepting in enumerate(ACCEPTING)}
    return FaultServer(speculative_tokens=K, answers=answers, **options)  # type: ignore[arg-type]


def test_the_histogram_and_both_kinds_of_acceptance_by_position(pack: Path, tmp_path: Path) -> None:
    with server(per_request_metrics=True, detailed=True) as detailed, server(per_request_metrics=True) as summary, \
            server() as paged:
        result = evaluate(pack, [detailed.base_url, summary.base_url, paged.base_url], temperature=0,
                          modes=["non-thinking"], save_dir=tmp_path / "runs")
    run = result.run
    steps = [step for w in run.windows if w.endpoint == "A" for step in w.answers[0].per_step_accepted or ()]
    assert len(steps) == sum(-(-24 // (accepting + 1)) for accepting in ACCEPTING)  # every verify step, kept
    assert all(w.answers[0].per_step_accepted is None for w in run.windows if w.endpoint != "A")
    counted = Counter(steps)
    histogram = tuple(counted[j] / len(steps) for j in range(K + 1))
    marginal = tuple(sum(counted[j] for j in range(i + 1, K + 1)) / len(steps) for i in range(K))
    conditional = (marginal[0], marginal[1] / marginal[0], marginal[2] / marginal[1])
    for figure in (f for f in run.figures if f.group == "all"):
        # the same from each server: the pooled counters by position are the histogram's survival function
        assert figure.accepted_histogram == pytest.approx(histogram), figure.endpoint
        assert figure.acceptance_by_position == pytest.approx(marginal), figure.endpoint
        assert figure.conditional_by_position == pytest.approx(conditional), figure.endpoint
        assert figure.mean_acceptance_length_pooled == pytest.approx(1 + sum(marginal))  # ModelOpt's consistency
        # each request's own (every step of a prompt accepts alike here: one length each), then their mean
        assert figure.accepted_histogram_per_request == pytest.approx(PER_REQUEST_HISTOGRAM), figure.endpoint
    assert [m.split(":")[0] for m in run.missing] == ["per-step counts of B", "per-step counts of C"]
    assert "summary gives each request's totals" in run.missing[0] and "counted by /metrics" in run.missing[1]
    text = format_run(run).splitlines()
    row = next(line for line in text if line.replace(" ", "").startswith(f"|non-thinking|A|all|{len(steps)}|"))
    shown = [f"{share:.2f}" for share in histogram]
    assert " ".join(shown) in row and " ".join(f"{value:.2f}" for value in conditional) in row
    page = tmp_path / "run.html"
    write_run_page(page, run, "run", "eval")
    lengths = dict(page_tables(page.read_text()))["acceptance-lengths"]
    assert lengths[0][3:6] == ["verify steps", "accepted 0..k (pooled: share of steps)",
                               "accepted 0..k (per request: each one's shares, then their mean)"]
    assert [row[5] for row in lengths[1:]] == [" ".join(f"{share:.2f}" for share in PER_REQUEST_HISTOGRAM)] * 3
    assert [row[4] for row in lengths[1:]] == [" ".join(shown)] * 3


def test_a_phase_gives_each_requests_accepted_lengths_from_its_summary_counts(pack: Path, tmp_path: Path) -> None:
    """At concurrency > 1 a phase holds several requests: ``summary`` counts (each response's histogram) give each
    one's accepted lengths and acceptance by position, the same as one request at a time; /metrics gives none."""
    with server(per_request_metrics=True) as summary, server() as paged:
        run = evaluate(pack, [summary.base_url, paged.base_url], temperature=0, modes=["non-thinking"],
                       concurrency=2, save_dir=tmp_path / "runs").run
    figures = {f.endpoint: f for f in run.figures}
    assert figures["A"].accepted_histogram_per_request == pytest.approx(PER_REQUEST_HISTOGRAM)
    own = [tuple(float(accepting > i) for i in range(K)) for accepting in ACCEPTING]  # each request's marginal
    assert figures["A"].acceptance_by_position_per_request == pytest.approx(
        tuple(sum(column) / len(own) for column in zip(*own, strict=True)))
    assert figures["B"].accepted_histogram_per_request is None
    assert figures["B"].acceptance_by_position_per_request is None
    assert any(m.startswith("per-request acceptance by position and accepted lengths: ") for m in run.missing)
    row = next(line for line in format_run(run).splitlines() if line.replace(" ", "").startswith("|non-thinking|B|all|")
               and "n/a" in line)
    assert row
