"""Runs saved by earlier evals (tests/eval/data/runs-v1/, format corpus-eval/1) still load, print and compare; the
run is a typed record that writes its JSON and reads it back."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.eval import RUN_FORMAT, Run, compare, format_comparison, format_run, load_run
from corpus_builder.eval.report import save_run

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
    assert again["figures"] == saved["figures"] and again["ratios"] == saved["ratios"]
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
    assert Run.from_json(orjson.loads(orjson.dumps(run.to_json())), "again.json") == run


def test_a_file_of_another_format_is_refused_naming_the_formats(tmp_path: Path) -> None:
    document = synthetic_run().to_json() | {"format": "corpus-eval/9"}
    path = tmp_path / "run.json"
    path.write_bytes(orjson.dumps(document))
    with pytest.raises(CorpusError, match=r"not a saved eval run \(format corpus-eval/2 or corpus-eval/1\)"):
        load_run(path)
