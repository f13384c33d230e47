"""The acceptance eval as a section of the HTML report: a run's page, two runs side by side, the audit's page of
a corpus with saved runs, and the pages opened in a real headless Chromium; every number shown is the run's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from corpus_builder import build_corpus, load_recipe
from corpus_builder.eval import compare, load_run, read_pack
from corpus_builder.eval.html import write_run_page
from corpus_builder.eval.report import save_run

from ..audit.browser import DRAWN, PLOTS, chromium, require_chromium, visit
from .conftest import chat_rows, write_jsonl
from .runs import HEADS, check_comparison, check_figures, check_ratios, pack_of, page_tables, synthetic_run
from .test_eval_faults import corpus_cli, speculating
from .test_pack import fake_corpus

RUN_PARTS = ["acceptance-figures", "acceptance-ratios", "acceptance-lengths", "acceptance-winners",
             "acceptance-groups"]
PLOT_DIV = 'class="plotly-graph-div"'


def parts(page: Path) -> list[str]:
    return [kind for kind, _ in page_tables(page.read_text(encoding="utf-8")) if kind]


def test_a_run_page_shows_the_figures_positions_ratios_and_groups(tmp_path: Path) -> None:
    run = synthetic_run()
    page = tmp_path / "run.html"
    write_run_page(page, run, "runs/run.json", "corpus eval pack.jsonl")
    text = page.read_text(encoding="utf-8")
    tables = dict(page_tables(text))
    assert parts(page) == RUN_PARTS
    assert check_figures(tables["acceptance-figures"], run) == 2 * 2  # heads x modes, over the whole pack
    assert {row[2] for row in tables["acceptance-figures"][1:]} == {"all"}
    assert check_ratios(tables["acceptance-ratios"], run) == 2 * 7  # B / A per mode: all, 3 sources, 2 tasks, turn 1
    assert check_figures(tables["acceptance-groups"], run) == 2 * 2 * 6
    assert text.count(PLOT_DIV) == 2  # acceptance by draft position; B / A with its interval
    assert "<h2>Acceptance</h2><h3>run runs/run.json</h3>" in text
    assert "temperature 0 (--temperature)" in text and "note: a synthetic run" in text


def test_one_head_has_no_ratio_and_names_from_the_run_are_escaped(tmp_path: Path) -> None:
    hostile = "<script>alert(1)</script>"
    run = synthetic_run(pack_of([(hostile, None), ("chat", hostile)]), {"A": HEADS["A"]}, modes=["thinking"])
    page = tmp_path / "run.html"
    write_run_page(page, run, hostile, hostile)
    text = page.read_text(encoding="utf-8")
    assert parts(page) == ["acceptance-figures", "acceptance-lengths", "acceptance-groups"]
    assert text.count(PLOT_DIV) == 1
    assert hostile not in text and f"source:{hostile.replace('<', '&lt;').replace('>', '&gt;')}" in text


def test_compare_html_puts_run_b_beside_run_a_then_each_run(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first, second = save_run(synthetic_run(), runs), save_run(synthetic_run(shift=-0.2), runs)
    page = tmp_path / "compare.html"
    done = corpus_cli("eval", "--compare", str(first), str(second), "--html", str(page))
    assert done.returncode == 0, done.stderr
    assert f"wrote {page}" in done.stderr and "B / A paired" in done.stdout
    tables = [table for kind, table in page_tables(page.read_text(encoding="utf-8")) if kind]
    assert parts(page) == ["acceptance-comparison", *RUN_PARTS, *RUN_PARTS]
    comparison = compare(first, second)
    assert check_comparison(tables[0], comparison) == len(comparison.rows) == 2 * 2 * 7
    assert check_figures(tables[1], load_run(first)) == check_figures(tables[6], load_run(second)) == 4
    assert page.read_text(encoding="utf-8").count(PLOT_DIV) == 2 + 2 * 2
    before = first.read_bytes()
    refused = corpus_cli("eval", "--compare", str(first), str(second), "--html", str(first))
    assert refused.returncode == 2 and "--html: this run reads" in refused.stderr
    assert first.read_bytes() == before


def test_the_eval_writes_the_runs_page_and_checks_its_path_before_any_request(tmp_path: Path) -> None:
    pack = write_jsonl(tmp_path / "pack" / "pack.jsonl", chat_rows(2, source="code", task="coding"))
    page = tmp_path / "run.html"
    with speculating() as server:
        done = corpus_cli("eval", str(pack), "--endpoint", server.base_url, "--temperature", "0", "--mode",
                          "thinking", "--save-dir", str(tmp_path / "runs"), "--html", str(page))
    assert done.returncode == 0, done.stderr
    saved = next((tmp_path / "runs").glob("*.json"))
    assert f"wrote {page}" in done.stderr and str(saved) in page.read_text(encoding="utf-8")
    assert check_figures(dict(page_tables(page.read_text(encoding="utf-8")))["acceptance-figures"],
                         load_run(saved)) == 1
    corpus = fake_corpus(tmp_path / "corpus")
    with speculating() as server:
        refused = corpus_cli("eval", str(pack), "--endpoint", server.base_url, "--save-dir", str(tmp_path / "runs"),
                             "--html", str(corpus / "run.html"))
    assert refused.returncode == 2 and "--html: inside the built corpus" in refused.stderr
    assert server.requests == [] and not (corpus / "run.html").exists()


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A built corpus with an eval pack of its own (``eval/``), whose runs are saved beside it."""
    write_jsonl(tmp_path / "src" / "chats.jsonl", chat_rows(8))
    (tmp_path / "src" / "recipe.yaml").write_text("name: acceptance\ntarget: {model: m/t}\nsources:\n"
                                                  "  - {name: chats, kind: replay, path: chats.jsonl, task: chat}\n"
                                                  f"output: {{dir: {tmp_path / 'corpus'}}}\n")
    root = build_corpus(load_recipe(tmp_path / "src" / "recipe.yaml")).out_dir
    write_jsonl(root / "eval" / "pack.jsonl", chat_rows(2, source="code", task="coding") + chat_rows(1, source="chat"))
    return root


def test_the_audit_page_has_the_acceptance_of_the_runs_saved_of_its_pack(corpus: Path, tmp_path: Path) -> None:
    pack = read_pack(corpus)
    results = pack.default_results_dir()
    older = save_run(replace(synthetic_run(pack), created="2000-01-01T00:00:00Z"), results)
    newer = save_run(synthetic_run(pack, shift=-0.2), results)
    another = save_run(synthetic_run(pack_of()), results)  # a neighbouring corpus's pack: left out
    (results / "notes.json").write_bytes(orjson.dumps({"not": "a run"}))
    page = tmp_path / "audit.html"
    done = corpus_cli("audit", str(corpus), "--html", str(page))
    assert done.returncode == 0, done.stderr
    text = page.read_text(encoding="utf-8")
    tables = [table for kind, table in page_tables(text) if kind]
    assert parts(page) == RUN_PARTS * 2
    assert check_figures(tables[0], load_run(newer)) == check_figures(tables[5], load_run(older)) == 4  # newest first
    assert text.index("<h2>Plots</h2>") < text.index("<h2>Acceptance</h2>") < text.index(f"run {newer}") \
        < text.index(f"run {older}")
    assert another.name not in text
    assert f"1 run(s) in {results} replayed another pack: left out" in text
    assert f"left out: {results / 'notes.json'}: not a saved eval run" in text
    before = newer.read_bytes()
    refused = corpus_cli("audit", str(corpus), "--html", str(newer))
    assert refused.returncode == 2 and "--html: this run reads" in refused.stderr and newer.read_bytes() == before


def test_an_audit_page_without_saved_runs_has_no_acceptance_section(corpus: Path, tmp_path: Path) -> None:
    page = tmp_path / "audit.html"
    assert corpus_cli("audit", str(corpus), "--html", str(page)).returncode == 0
    assert "<h2>Plots</h2>" in page.read_text(encoding="utf-8")
    assert "Acceptance" not in page.read_text(encoding="utf-8")


TABLES = ("[...document.querySelectorAll('div[class^=\"acceptance-\"]')].map(d => [d.className, "
          "[...d.querySelector('table').rows].map(r => [...r.cells].map(c => c.textContent))])")


def test_the_pages_open_offline_and_show_the_runs_numbers(tmp_path: Path) -> None:
    require_chromium()
    runs = tmp_path / "runs"
    first, second = save_run(synthetic_run(), runs), save_run(synthetic_run(shift=-0.2), runs)
    single, both = tmp_path / "run.html", tmp_path / "compare.html"
    write_run_page(single, load_run(first), str(first), "corpus eval pack.jsonl")
    comparison = compare(first, second, html=both)
    with chromium() as tools:
        shown: dict[Path, tuple[Any, int]] = {}
        for page in (single, both):
            tools.events.clear()
            url = page.resolve().as_uri()
            seen = visit(tools, url, f"document.readyState === 'complete' && {DRAWN}")
            assert seen.requests == [url]  # the page itself, nothing else: plotly.js and the data are inline
            assert seen.console_errors == [] and seen.exceptions == []
            shown[page] = (tools.evaluate(TABLES), tools.evaluate(f"document.querySelectorAll('{PLOTS}').length"))
    tables, plots = shown[single]
    assert [kind for kind, _ in tables] == RUN_PARTS and plots == 2
    assert check_figures(tables[0][1], load_run(first)) == 4 and check_ratios(tables[1][1], load_run(first)) == 14
    assert check_figures(tables[4][1], load_run(first)) == 24
    tables, plots = shown[both]
    assert [kind for kind, _ in tables] == ["acceptance-comparison", *RUN_PARTS, *RUN_PARTS] and plots == 6
    assert check_comparison(tables[0][1], comparison) == 28
    assert check_figures(tables[6][1], load_run(second)) == 4
