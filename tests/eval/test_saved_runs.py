"""Runs saved by earlier evals (tests/eval/data/runs-v1/, format corpus-eval/1) still load, print and compare; the
run is a typed record that writes its JSON and reads it back."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.eval import RUN_FORMAT, Run, compare, format_comparison, format_run, load_run
from corpus_builder.eval.report import save_run, with_figures

from .runs import synthetic_run

OLD = Path(__file__).parent / "data" / "runs-v1"
OLD_RUNS = sorted(OLD.glob("*.json"))


@pytest.mark.parametrize("path", OLD_RUNS, ids=lambda path: path.stem)
def test_a_run_saved_by_an_earlier_eval_loads_and_prints_the_figures_it_saved(path: Path) -> None:
    saved = orjson.loads(path.read_bytes())
    run = load_run(path)
    assert saved["format"] == "corpus-eval/1" and run.format == "corpus-eval/1"
    # its figures and ratios are computed again from its windows: the same as the eval that saved it computed
    again = run.to_json()
    renamed = {"acceptance_rate": "acceptance_rate_pooled", "mean_acceptance_length": "mean_acceptance_length_pooled"}
    new = ("loops", "conditional_by_position", "accepted_histogram")
    pooled = [{key: value for key, value in figure.items() if not key.endswith("_per_request") and key not in new}
              for figure in again["figures"]]
    assert [{renamed.get(key, key): value for key, value in figure.items()} for figure in saved["figures"]] == pooled
    # 7 prompts are too few for an interval now (MIN_INTERVAL_PAIRS): the ratio stays, its interval goes
    assert [ratio | {"figure": renamed.get(ratio["figure"], ratio["figure"])}
            | ({"low": None, "high": None} if ratio["pairs"] is not None and ratio["pairs"] < 10 else {})
            for ratio in saved["ratios"]] == [
        ratio for ratio in again["ratios"] if not ratio["figure"].endswith("_per_request")]
    assert again["format"] == RUN_FORMAT != saved["format"]
    text = format_run(run)
    assert text.startswith(f"eval of {run.pack.path} ({run.pack.prompts} prompts")


def test_runs_saved_by_an_earlier_eval_compare_paired_on_one_pack(tmp_path: Path) -> None:
    comparison = compare(OLD / "two-heads-c1.json", OLD / "vllm-self-draft-c1.json", html=tmp_path / "page.html")
    assert comparison.paired is True
    assert {(row.mode, row.endpoint) for row in comparison.rows} == {("thinking", "A"), ("non-thinking", "A")}
    assert format_comparison(comparison, ("a", "b")).startswith("run A a:")
    assert (tmp_path / "page.html").stat().st_size > 0


def test_a_run_reads_back_what_it_wrote(tmp_path: Path) -> None:
    run = synthetic_run()
    path = save_run(run, tmp_path)
    assert orjson.loads(path.read_bytes())["format"] == RUN_FORMAT
    again = load_run(path)
    assert again == run and again.to_json() == run.to_json()
    assert with_figures(Run.from_json(orjson.loads(orjson.dumps(run.to_json())), "again.json")) == run


def test_a_file_of_another_format_is_refused_naming_the_formats(tmp_path: Path) -> None:
    document = synthetic_run().to_json() | {"format": "corpus-eval/9"}
    path = tmp_path / "run.json"
    path.write_bytes(orjson.dumps(document))
    with pytest.raises(CorpusError, match=r"not a saved eval run \(format corpus-eval/2 or corpus-eval/1\)"):
        load_run(path)


def test_an_earlier_run_gives_what_its_windows_allow_and_names_what_they_do_not() -> None:
    """At concurrency 1 a window is one request, so its per-request means follow from an earlier run's windows;
    phases counted by /metrics hold no request's own counts: named missing, n/a in the tables."""
    paired = load_run(OLD / "two-heads-c1.json")
    # nor were the answers' repetition, the prompts' lengths in tokens and their turns
    assert [missing.split(":")[0] for missing in paired.missing] == [
        "loops", "per-step counts of A", "per-step counts of B", "input-length slices", "turn slices"]
    assert not any(f.group.startswith(("length:", "turn:")) for f in paired.figures)
    assert {f.loops for f in paired.figures} == {None} and paired.loop_gaps == ()
    assert all(f.mean_acceptance_length_per_request is not None for f in paired.figures if f.drafts)
    phases = load_run(OLD / "two-heads-c2.json")
    assert [missing.split(":")[0] for missing in phases.missing] == [
        "per-request acceptance", "per-request acceptance by position and accepted lengths",
        "per-request output tok/s", "loops", "per-step counts of A", "per-step counts of B"]
    assert all(f.mean_acceptance_length_per_request is None for f in phases.figures)
    assert f"missing: {phases.missing[0]}" in format_run(phases).splitlines()
    comparison = compare(OLD / "two-heads-c2.json", OLD / "two-heads-c2.json")
    assert f"  missing: {phases.missing[0]}" in format_comparison(comparison, ("a", "b")).splitlines()
