"""Runs saved by earlier evals (tests/eval/data/runs-v1/) still load, print and compare."""

from __future__ import annotations

from pathlib import Path

import pytest

from corpus_builder.eval import compare, format_comparison, format_run, load_run

OLD = Path(__file__).parent / "data" / "runs-v1"
OLD_RUNS = sorted(OLD.glob("*.json"))


@pytest.mark.parametrize("path", OLD_RUNS, ids=lambda path: path.stem)
def test_a_run_saved_by_an_earlier_eval_loads_and_prints(path: Path) -> None:
    run = load_run(path)
    text = format_run(run)
    assert text.startswith(f"eval of {run['pack']['path']} ({run['pack']['prompts']} prompts")


def test_runs_saved_by_an_earlier_eval_compare_paired_on_one_pack(tmp_path: Path) -> None:
    comparison = compare(OLD / "two-heads-c1.json", OLD / "vllm-self-draft-c1.json", html=tmp_path / "page.html")
    assert comparison["paired"] is True
    assert {(row["mode"], row["endpoint"]) for row in comparison["rows"]} == {("thinking", "A"), ("non-thinking", "A")}
    assert format_comparison(comparison, ("a", "b")).startswith("run A a:")
    assert (tmp_path / "page.html").stat().st_size > 0
