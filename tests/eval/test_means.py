"""Both means, named: pooled over every verify step (vLLM's counters) and per request (each request's own, then
their mean), on fault servers whose answers differ a hundredfold in length, so the two means differ and order two
heads the other way round."""

from __future__ import annotations

from pathlib import Path

import pytest

from corpus_builder.eval import evaluate, format_run, load_run
from corpus_builder.eval.html import write_run_page
from corpus_builder.testing.fault_server import FaultServer, Scripted

from .conftest import write_jsonl
from .runs import check_figures, check_ratios, page_tables

K = 3
SHORT = "a b c d e f g"  # 7 words and the end of the turn: 8 tokens
LONG = " ".join(f"w{i}" for i in range(199))  # 200 tokens, none repeated (no loop)


def steps_and_accepted(tokens: int, accepting: int) -> tuple[int, int]:
    """What the fault server counts for an answer of ``tokens``: verify steps of ``accepting`` + 1 tokens."""
    steps = -(-tokens // (accepting + 1))
    return steps, steps * accepting


# head A drafts the short answers perfectly and the long ones not at all; head B accepts one token a step on both
HEADS = {"A": {"short": 3, "long": 0}, "B": {"short": 1, "long": 1}}
PROMPTS = [("short", f"short question {i}") for i in range(6)] + [("long", f"long question {i}") for i in range(6)]


def scripted(head: str) -> dict[str, Scripted]:
    return {text: Scripted(SHORT if kind == "short" else LONG, HEADS[head][kind]) for kind, text in PROMPTS}


def positions(head: str) -> dict[str, tuple[float, ...]]:
    """Acceptance by position pooled over every verify step and per request: a head that accepts j tokens a step
    accepts each of the first j positions on every step and none after."""
    own = [(steps_and_accepted(8 if kind == "short" else 200, HEADS[head][kind])[0],
            tuple(float(i < HEADS[head][kind]) for i in range(K))) for kind, _ in PROMPTS]
    steps = sum(s for s, _ in own)
    return {"pooled": tuple(sum(s * marginal[i] for s, marginal in own) / steps for i in range(K)),
            "per_request": tuple(sum(marginal[i] for _, marginal in own) / len(own) for i in range(K))}


def expected(head: str) -> dict[str, float]:
    """Each mean as named, from the answers' lengths and each head's acceptance."""
    own = [steps_and_accepted(8 if kind == "short" else 200, HEADS[head][kind]) for kind, _ in PROMPTS]
    steps, accepted = sum(s for s, _ in own), sum(a for _, a in own)
    return {"mean_acceptance_length_pooled": 1 + accepted / steps,
            "acceptance_rate_pooled": accepted / (K * steps),
            "mean_acceptance_length_per_request": sum(1 + a / s for s, a in own) / len(own),
            "acceptance_rate_per_request": sum(a / (K * s) for s, a in own) / len(own)}


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "pack" / "pack.jsonl", [
        {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "x"}], "source": kind}
        for kind, text in PROMPTS])


def test_pooled_and_per_request_means_differ_and_each_is_computed_as_named(pack: Path, tmp_path: Path) -> None:
    # A counts each request in its response; B only on /metrics, around each request (concurrency 1)
    with FaultServer(speculative_tokens=K, per_request_metrics=True, answers=scripted("A")) as a, \
            FaultServer(speculative_tokens=K, answers=scripted("B")) as b:
        result = evaluate(pack, [a.base_url, b.base_url], temperature=0, modes=["non-thinking"],
                          save_dir=tmp_path / "runs")
    run = result.run.to_json()
    every = {f["endpoint"]: f for f in run["figures"] if f["group"] == "all"}
    for head in HEADS:
        for name, value in expected(head).items():
            assert every[head][name] == pytest.approx(value), (head, name)
    a, b = expected("A"), expected("B")
    # the long answers dominate the pooled means; each request weighs alike in the other
    assert a["mean_acceptance_length_pooled"] < 1.1 < 2.4 < a["mean_acceptance_length_per_request"]
    # and the two means order the heads the other way round: B / A above 1 pooled, below 1 per request
    ratios = {r["figure"]: r for r in run["ratios"] if r["group"] == "all"}
    for name in expected("A"):
        assert ratios[name]["ratio"] == pytest.approx(b[name] / a[name]), name
        assert ratios[name]["pairs"] == len(PROMPTS) and ratios[name]["low"] <= ratios[name]["high"], name
    assert ratios["mean_acceptance_length_pooled"]["ratio"] > 1 > ratios["mean_acceptance_length_per_request"]["ratio"]
    # acceptance by position too: A's long answers (no draft accepted) weigh 100 times its short ones' steps pooled
    for head in HEADS:
        figure = every[head]
        assert figure["acceptance_by_position"] == pytest.approx(positions(head)["pooled"])
        assert figure["acceptance_by_position_per_request"] == pytest.approx(positions(head)["per_request"])
    assert every["A"]["acceptance_by_position_per_request"][0] == pytest.approx(0.5)
    assert every["A"]["acceptance_by_position"][0] < 0.01
    # and output tok/s, each request's own (its window alone) then their mean, with B / A's interval
    for head in HEADS:
        speeds = [w["output_tokens"] / w["seconds"] for w in run["windows"] if w["endpoint"] == head]
        assert len(speeds) == len(PROMPTS)
        assert every[head]["output_tokens_per_s_per_request"] == pytest.approx(sum(speeds) / len(speeds))
        tokens, seconds = (sum(w[key] for w in run["windows"] if w["endpoint"] == head)
                           for key in ("output_tokens", "seconds"))
        assert every[head]["output_tokens_per_s"] == pytest.approx(tokens / seconds)
    speed = ratios["output_tokens_per_s_per_request"]
    assert speed["ratio"] == pytest.approx(every["B"]["output_tokens_per_s_per_request"]
                                           / every["A"]["output_tokens_per_s_per_request"])
    assert speed["pairs"] == len(PROMPTS) and speed["low"] <= speed["high"]
    # A's own counts are totals (summary), B's the page's: neither gives a verify step's
    assert [m.split(":")[0] for m in run["missing"]] == ["per-step counts of A", "per-step counts of B"]

    # named in the text, and the page shows the numbers the run holds, each mean under its own name
    text = format_run(result.run)
    assert "| acceptance rate (pooled) | acceptance rate (per request) | mean acceptance length (pooled) | mean " \
           "acceptance length (per request) |" in " ".join(text.split())
    assert "| acceptance by position (pooled) | acceptance by position (per request) | output tok/s (pooled) | " \
           "output tok/s (per request) |" in " ".join(text.split())
    page = tmp_path / "run.html"
    write_run_page(page, load_run(result.saved), str(result.saved), "eval")
    tables = dict(page_tables(page.read_text()))
    assert "mean acceptance length (per request)" in tables["acceptance-figures"][0]
    assert {"acceptance by position (per request)", "output tok/s (per request)"} <= set(
        tables["acceptance-figures"][0])
    assert check_figures(tables["acceptance-figures"], result.run) == 2
    assert "mean acceptance length (pooled)" in tables["acceptance-ratios"][0]
    assert check_ratios(tables["acceptance-ratios"], result.run) == 5  # all, 2 sources, length:<512, turn:1


def test_a_phase_counted_by_metrics_names_its_per_request_means_missing(pack: Path, tmp_path: Path) -> None:
    with FaultServer(speculative_tokens=K, answers=scripted("A")) as server:
        run = evaluate(pack, [server.base_url], temperature=0, modes=["non-thinking"], concurrency=2,
                       save_dir=tmp_path / "runs").run
    [figures] = [f for f in run.figures if f.group == "all"]
    assert figures.mean_acceptance_length_pooled == pytest.approx(expected("A")["mean_acceptance_length_pooled"])
    assert figures.mean_acceptance_length_per_request is None and figures.acceptance_rate_per_request is None
    assert figures.acceptance_by_position_per_request is None and figures.output_tokens_per_s_per_request is None
    assert [m.split(":")[0] for m in run.missing] == [
        "per-request acceptance", "per-request acceptance by position and accepted lengths", "per-request output tok/s",
        "per-step counts of A"]
    assert f"missing: {run.missing[0]}" in format_run(run).splitlines()
    # with each request's own counts, a phase gives them
    with FaultServer(speculative_tokens=K, per_request_metrics=True, detailed=True, answers=scripted("A")) as server:
        own = evaluate(pack, [server.base_url], temperature=0, modes=["non-thinking"], concurrency=2,
                       save_dir=tmp_path / "runs").run
    [figures] = [f for f in own.figures if f.group == "all"]
    assert figures.mean_acceptance_length_per_request == pytest.approx(
        expected("A")["mean_acceptance_length_per_request"])
    assert figures.acceptance_by_position_per_request == pytest.approx(positions("A")["per_request"])
    # a request in a phase has no time of its own
    assert figures.output_tokens_per_s_per_request is None
    assert [m.split(":")[0] for m in own.missing] == ["per-request output tok/s"]
