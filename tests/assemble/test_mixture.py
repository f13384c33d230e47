"""The recipe declares the corpus and the build meets it: per-source targets after every drop (top-ups from a
prompt pool, fewer or more replay rows), a thinking share within its tolerance, or a report before writing."""

from __future__ import annotations

import io
import itertools
import json
import math
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from corpus_builder.assemble import build_corpus, plan_build
from corpus_builder.assemble.collect import MixtureShort
from corpus_builder.assemble.mixture import (
    Available,
    RowBounds,
    Selection,
    SelectStage,
    apportion,
    certain_shortfalls,
    next_round,
    plan_selection,
    resolve_counts,
)
from corpus_builder.assemble.split import Splitter
from corpus_builder.draws import mixture_priority
from corpus_builder.errors import CorpusError
from corpus_builder.layout import Corpus
from corpus_builder.recipe import load_recipe
from corpus_builder.recipe.model import Mixture, OutputSpec, Recipe, SourceSpec, SourceTarget, Target, ThinkingShare
from corpus_builder.testing.fault_server import Fault, FaultServer
from tests.support.fuzz import fuzz_settings
from tests.support.real_data import write_rows
from tests.support.trials import shard_hashes

MODEL = "tiny-target"


def write_sources(root: Path, *, prompts: int = 60, replay_thinking: int = 40, replay_plain: int = 60) -> None:
    write_rows(root / "prompts.jsonl", [{"messages": [{"role": "user", "content": f"question {i}?"}]}
                                        for i in range(prompts)])
    rows = [{"messages": [{"role": "user", "content": f"log {i}"},
                          {"role": "assistant", "content": f"<think>why {i}</think>answer {i}"}]}
            for i in range(replay_thinking)]
    rows += [{"messages": [{"role": "user", "content": f"chat {i}"}, {"role": "assistant", "content": f"reply {i}"}]}
             for i in range(replay_plain)]
    write_rows(root / "replay.jsonl", rows)


def write_recipe(root: Path, endpoint: str, *, prompts_target: str = "{count: 20}", replay_target: str = "",
                 mixture: str = "{}", thinking_off: float = 0.0) -> Path:
    replay = f", target: {replay_target}" if replay_target else ""
    (root / "recipe.yaml").write_text(f"""\
name: declared
target:
  model: {MODEL}
  endpoints: [{endpoint}]
  generation: {{max_tokens: 16, timeout_s: 5, max_retries: 1}}
sources:
  - {{name: replay, kind: replay, path: replay.jsonl{replay}}}
  - {{name: asks, kind: prompts, path: prompts.jsonl, target: {prompts_target}, thinking_off_share: {thinking_off}}}
mixture: {mixture}
split: {{validation_fraction: 0.2, seed: 0}}
output: {{dir: out}}
""", encoding="utf-8")
    return root / "recipe.yaml"


def unclosed_every(step: int, count: int) -> dict[str, Fault]:
    """Prompts whose answer never leaves its think block: the default check drops those rows."""
    return {f"question {i}?": Fault("unclosed", times=100) for i in range(0, count, step)}


def test_drops_are_topped_up_from_the_pool_and_a_rerun_asks_for_nothing(tmp_path: Path) -> None:
    write_sources(tmp_path)
    with FaultServer(model=MODEL, by_prompt=unclosed_every(4, 60)) as server:  # a quarter of the pool is dropped
        recipe = load_recipe(write_recipe(tmp_path, server.base_url))
        result = build_corpus(recipe, progress=io.StringIO())
        asked = len(server.chat_requests)
        again = build_corpus(recipe, progress=io.StringIO())
        assert len(server.chat_requests) == asked  # every round is in the journal
    rows = list(Corpus.open(result.out_dir).iter_conversations())
    generated = [row for row in rows if row.source == "asks"]
    assert len(generated) == 20  # the declared count, after the drops
    dropped = Counter(r["reason"] for r in _ledger(result.out_dir) if r["source"] == "asks")
    assert dropped["unclosed_think"] == asked - 20  # every extra request replaced a drop, none wasted
    # Independent of the run: the faults drop 15 of the 60 prompts, so a top-up that knew the rate would ask
    # 20 * 15/45 more on average; the rounds may overshoot that by 10%.
    drop_rate = len(unclosed_every(4, 60)) / 60
    assert asked <= 20 + math.ceil(1.1 * 20 * drop_rate / (1 - drop_rate))
    declared = result.manifest.section("mixture")["sources"]["asks"]
    assert (declared["declared"], declared["reached"], declared["generated_rows"]) == (20, 20, asked)
    assert result.manifest.section("mixture")["sources"]["replay"]["reached"] == 100  # no target: every kept row
    assert shard_hashes(again.out_dir) == shard_hashes(result.out_dir)  # same recipe and journal: the same bytes


def test_a_top_up_with_several_samples_per_prompt_counts_the_keep_rate_in_rows(tmp_path: Path) -> None:
    """2 samples per prompt, one request in four dropped, two rounds at most: the first asks the 20 declared rows
    (10 prompts) and keeps 15; the top-up asks the 5 missing over the 15 of 20 kept, 7 rows, so 4 prompts, and
    keeps 6 of their 8 rows. A keep rate of rows over prompts would ask too few and fall short."""
    write_sources(tmp_path)
    with FaultServer(model=MODEL, by_index={i: Fault("unclosed") for i in range(0, 400, 4)}) as server:
        recipe_path = write_recipe(tmp_path, server.base_url, mixture="{max_rounds: 2}")
        # the fault server answers both samples of a prompt alike: no dedup, or one of each pair is a duplicate
        recipe_path.write_text(recipe_path.read_text().replace("max_retries: 1}", "max_retries: 1, n: 2}")
                               + "checks: {dedup: none}\n")
        result = build_corpus(load_recipe(recipe_path), progress=io.StringIO())
        asked = len(server.chat_requests)
    assert asked == 20 + 8 and result.manifest.section("short") is None
    assert Counter(row.source for row in Corpus.open(result.out_dir).iter_conversations())["asks"] == 20
    assert result.manifest.section("mixture")["sources"]["asks"]["generated_rows"] == asked
    assert Counter(r["source"] for r in _ledger(result.out_dir))["asks"] == 7


def test_an_exhausted_pool_fails_before_writing_unless_short_is_allowed(tmp_path: Path) -> None:
    write_sources(tmp_path, prompts=30)
    with FaultServer(model=MODEL, by_prompt=unclosed_every(3, 30)) as server:
        recipe_path = write_recipe(tmp_path, server.base_url, prompts_target="{count: 25}")
        with pytest.raises(MixtureShort) as short:
            build_corpus(load_recipe(recipe_path), progress=io.StringIO())
        message = str(short.value)
        assert "source 'asks': 20 rows pass every check, 25 declared (30 generated, the pool is exhausted)" in message
        assert "asks: 20 rows reached of 25 declared" in message
        assert not (tmp_path / "out" / "manifest.json").exists()
        completed = subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe_path)],
                                   capture_output=True, text=True)
        assert completed.returncode == 1 and "cannot be met" in completed.stderr  # exit 1: the corpus falls short
        assert "Traceback" not in completed.stderr
        written = subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe_path), "--allow-short"],
                                 capture_output=True, text=True)
        assert written.returncode == 0, written.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["short"] == ["source 'asks': 20 rows pass every check, 25 declared (30 generated, the pool "
                                 "is exhausted)"]
    assert manifest["mixture"]["sources"]["asks"]["reached"] == 20


@pytest.mark.parametrize("per_split", [False, True])
def test_a_thinking_share_is_met_with_thinking_off_prompts_in_the_mix(tmp_path: Path, per_split: bool) -> None:
    """Replay has 40% thinking rows, the prompts a third thinking off: the build takes the replay rows that
    bring the whole (and, per split, each split) within 45% +- 2%."""
    write_sources(tmp_path, prompts=90, replay_thinking=120, replay_plain=180)
    mixture = f"{{thinking_share: {{target: 0.45, tolerance: 0.02, per_split: {str(per_split).lower()}}}, seed: 2}}"
    with FaultServer(model=MODEL) as server:
        result = build_corpus(load_recipe(write_recipe(tmp_path, server.base_url, prompts_target="{count: 60}",
                                                       replay_target="{count: 140}", mixture=mixture,
                                                       thinking_off=0.33)),
                              progress=io.StringIO())
    rows = list(Corpus.open(result.out_dir).iter_conversations())
    assert len(rows) == 200 and Counter(row.source for row in rows) == {"replay": 140, "asks": 60}
    share = sum(row.thinking for row in rows) / len(rows)
    assert abs(share - 0.45) <= 0.02
    assert abs(result.audit["thinking_share"] - share) < 1e-9
    off = sum(not row.provenance.generation.enable_thinking for row in rows if row.source == "asks")
    assert 10 <= off <= 30  # thinking off rows are in the mix, and counted as such
    if per_split:
        for split in ("train", "validation"):
            in_split = [row for row in rows if row.split == split]
            assert abs(sum(row.thinking for row in in_split) / len(in_split) - 0.45) <= 0.02, split
    assert result.manifest.section("mixture")["thinking_share"]["reached"] == pytest.approx(share, abs=1e-6)


def test_shares_of_the_final_corpus(tmp_path: Path) -> None:
    write_sources(tmp_path, prompts=40)
    with FaultServer(model=MODEL) as server:
        result = build_corpus(load_recipe(write_recipe(tmp_path, server.base_url, prompts_target="{share: 0.25}",
                                                       replay_target="{share: 0.75}", mixture="{total: 80}")),
                              progress=io.StringIO())
        assert len(server.chat_requests) == 20  # no more asked than the share needs
    assert Counter(row.source for row in Corpus.open(result.out_dir).iter_conversations()) == {"replay": 60,
                                                                                                "asks": 20}


def test_a_top_up_moves_no_other_row_across_the_split(tmp_path: Path) -> None:
    write_sources(tmp_path)
    with FaultServer(model=MODEL) as server:
        first = build_corpus(load_recipe(write_recipe(tmp_path, server.base_url)), progress=io.StringIO())
        before = {row.id: row.split for row in Corpus.open(first.out_dir).iter_conversations()}
        more = build_corpus(load_recipe(write_recipe(tmp_path, server.base_url, prompts_target="{count: 25}")),
                            progress=io.StringIO())
    after = {row.id: row.split for row in Corpus.open(more.out_dir).iter_conversations()}
    assert set(before) < set(after) and all(after[row_id] == split for row_id, split in before.items())


def _ledger(out: Path) -> list[dict]:
    from corpus_builder.layout import iter_ledger

    return list(iter_ledger(out / "ledger.jsonl.zst"))




@pytest.mark.parametrize(("edit", "problem"), [
    (", take: {count: 5}", "remove take"),
    (", thinking_off_share: 0.2", "only prompts sources are generated"),
])
def test_a_declared_corpus_that_cannot_be_computed_is_refused_by_validate(tmp_path: Path, edit: str,
                                                                          problem: str) -> None:
    write_sources(tmp_path)
    recipe = write_recipe(tmp_path, "http://127.0.0.1:9/v1", replay_target="{count: 10}")
    recipe.write_text(recipe.read_text().replace("replay.jsonl, target: {count: 10}",
                                                 f"replay.jsonl, target: {{count: 10}}{edit}"))
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "validate", str(recipe)],
                               capture_output=True, text=True)
    assert completed.returncode == 2 and problem in completed.stderr


def test_shares_without_room_are_refused(tmp_path: Path) -> None:
    write_sources(tmp_path)
    recipe = write_recipe(tmp_path, "http://127.0.0.1:9/v1", prompts_target="{share: 0.5}",
                          replay_target="{share: 0.5}")
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "validate", str(recipe)],
                               capture_output=True, text=True)
    assert completed.returncode == 2 and "set mixture.total" in completed.stderr


@pytest.mark.parametrize(("targets", "total", "problem"), [
    (("{count: 20}", "{count: 50}"), 60, "the sources' counts add up to 70, more than mixture.total (60)"),
    (("{count: 20}", "{count: 50}"), 100, "every source has a target and they add up to 70.0 rows, not "
                                          "mixture.total (100)"),
    (("{share: 0.5}", "{count: 60}"), 100, "the sources' counts (60 rows) and shares (0.5 of 100: 50.0 rows) add "
                                           "up to more than mixture.total (100)"),
])
def test_a_total_the_targets_contradict_is_refused_by_validate_where_written(
        tmp_path: Path, targets: tuple[str, str], total: int, problem: str) -> None:
    write_sources(tmp_path)
    recipe = write_recipe(tmp_path, "http://127.0.0.1:9/v1", prompts_target=targets[0], replay_target=targets[1],
                          mixture=f"{{total: {total}}}")
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "validate", str(recipe)],
                               capture_output=True, text=True)
    lines = recipe.read_text().splitlines()
    line = next(number for number, text in enumerate(lines, 1) if text.startswith("mixture:"))
    column = lines[line - 1].index(str(total)) + 1
    assert completed.returncode == 2 and f"{recipe}:{line}:{column}: mixture.total: {problem}" in completed.stderr


def write_replay_recipe(root: Path, targets: dict[str, str], mixture: str) -> Path:
    """Replay sources alone (no server): 'logs', 100 rows of which 40 reason, and 'chats', 300 plain rows."""
    write_sources(root, prompts=0)
    write_rows(root / "chats.jsonl", [{"messages": [{"role": "user", "content": f"hello {i}"},
                                                    {"role": "assistant", "content": f"hi {i}"}]} for i in range(300)])
    sources = "".join(f"  - {{name: {name}, kind: replay, path: {path}"
                      + (f", target: {targets[name]}}}\n" if name in targets else "}\n")
                      for name, path in (("logs", "replay.jsonl"), ("chats", "chats.jsonl")))
    (root / "recipe.yaml").write_text(f"name: totals\ntarget: {{model: {MODEL}}}\nsources:\n{sources}mixture: "
                                      f"{mixture}\nsplit: {{validation_fraction: 0.1}}\noutput: {{dir: out}}\n",
                                      encoding="utf-8")
    return root / "recipe.yaml"


@pytest.mark.parametrize(("targets", "total", "written"), [
    ({"logs": "{share: 0.25}"}, 200, {"logs": 50, "chats": 150}),  # the source with no target fills the rest
    ({}, 120, {"logs": 30, "chats": 90}),  # no target at all: in proportion to their rows
    ({"chats": "{count: 100}"}, 150, {"logs": 50, "chats": 100}),
])
def test_the_total_is_met_by_the_sources_with_no_target(tmp_path: Path, targets: dict[str, str], total: int,
                                                         written: dict[str, int]) -> None:
    result = build_corpus(load_recipe(write_replay_recipe(tmp_path, targets, f"{{total: {total}}}")),
                          progress=io.StringIO())
    assert Counter(row.source for row in Corpus.open(result.out_dir).iter_conversations()) == written
    assert result.manifest.conversations == total and result.manifest.section("short") is None
    for name, target in targets.items():
        if "share" in target:
            assert result.manifest.section("mixture")["sources"][name]["reached_share"] == float(target[8:-1])


def test_a_share_is_of_the_rows_written_and_reported_short_when_it_is_not(tmp_path: Path) -> None:
    """'logs' holds 100 rows of the 150 it declares: the corpus has 250 rows, of which the 150 'chats' declared
    as half are 60%; the share is not reported met."""
    recipe = load_recipe(write_replay_recipe(tmp_path, {"logs": "{count: 150}", "chats": "{share: 0.5}"},
                                             "{total: 300}"))
    with pytest.raises(MixtureShort):
        build_corpus(recipe, progress=io.StringIO())
    result = build_corpus(recipe, progress=io.StringIO(), allow_short=True)
    assert result.manifest.section("short") == ["source 'logs': 100 rows pass every check, 150 declared",
                                        "source 'chats': 150 rows, 60.0% of the 250 written, 50.0% declared",
                                        "corpus: 250 rows reached, mixture.total declares 300"]
    assert result.manifest.section("mixture")["sources"]["chats"]["reached_share"] == 0.6


def test_a_thinking_share_the_kept_rows_miss_fails_the_build_unless_short_is_allowed(tmp_path: Path) -> None:
    """Every 'logs' row (40 of its 100 reason) and 20 'chats' rows are declared: at least 33.3% reason, 10% +- 2%
    declared. Replay rows are known only after the checks: the corpus is found short, nothing is written."""
    recipe = load_recipe(write_replay_recipe(tmp_path, {"logs": "{count: 100}", "chats": "{count: 20}"},
                                             "{thinking_share: {target: 0.1}}"))
    problem = ("thinking share overall 33.3% (40 of 120 rows), declared 10.0% +- 2.0%: the sources do not hold "
               "enough rows of the kind needed")
    with pytest.raises(MixtureShort) as short:
        build_corpus(recipe, progress=io.StringIO())
    assert problem in str(short.value) and not (tmp_path / "out" / "manifest.json").exists()
    result = build_corpus(recipe, progress=io.StringIO(), allow_short=True)
    assert result.manifest.section("short") == [problem]
    rows = list(Corpus.open(result.out_dir).iter_conversations())
    by_split = {split: [row.thinking for row in rows if row.split == split] for split in ("train", "validation")}
    assert result.manifest.section("mixture")["thinking_share"] == {
        "target": 0.1, "tolerance": 0.02, "reached": round(40 / 120, 6),
        "by_split": {split: round(sum(flags) / len(flags), 6) for split, flags in by_split.items()}}


def test_a_pool_too_small_for_its_target_fails_before_any_request_and_in_the_dry_run(tmp_path: Path) -> None:
    """30 prompts x 1 sample cannot give 100 rows: known before generating, so the dry run says so and the
    build stops before the server is asked anything (exit 2); --allow-short builds it, marked short."""
    write_sources(tmp_path, prompts=30)
    problem = "source 'asks': at most 30 rows (a pool of 30 prompts x 1 sample), 100 declared"
    with FaultServer(model=MODEL) as server:
        recipe = write_recipe(tmp_path, server.base_url, prompts_target="{count: 100}")
        dry = subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe), "--dry-run"],
                             capture_output=True, text=True)
        assert dry.returncode == 2 and f"declared corpus: {problem}" in dry.stdout
        server.requests.clear()  # the dry run probes the endpoint; the build must not even do that
        failed = subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe)],
                                capture_output=True, text=True)
        assert failed.returncode == 2 and problem in failed.stderr and "Traceback" not in failed.stderr
        assert server.requests == [] and not (tmp_path / "out").exists()
        allowed = subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe), "--dry-run",
                                  "--allow-short"], capture_output=True, text=True)
        assert allowed.returncode == 0 and problem in allowed.stdout
        result = build_corpus(load_recipe(recipe), progress=io.StringIO(), allow_short=True)
    assert result.manifest.section("short") == [
        "source 'asks': 30 rows pass every check, 100 declared (30 generated, the pool is exhausted)"]


@pytest.mark.parametrize(("replay_thinking", "share", "problem"), [
    (0, 0.5, "thinking share: at most 16.7% of the rows can reason (every generated row counted as reasoning), "
             "declared 50.0% +- 2.0%"),
    (90, 0.5, "thinking share: at least 75.0% of the rows reason (no generated row counted as reasoning), "
              "declared 50.0% +- 2.0%"),
])
def test_a_thinking_share_no_mix_reaches_fails_before_any_request(tmp_path: Path, replay_thinking: int, share: float,
                                                                  problem: str) -> None:
    """100 replay rows and 20 generated rows: with no replay row reasoning at most 16.7% can reason, even if every
    generated row does; with 90 of them, at least 75% reason, even if no generated row does."""
    write_sources(tmp_path, replay_thinking=replay_thinking, replay_plain=100 - replay_thinking)
    with FaultServer(model=MODEL) as server:
        recipe = load_recipe(write_recipe(tmp_path, server.base_url, replay_target="{count: 100}",
                                          mixture=f"{{thinking_share: {{target: {share}}}}}"))
        assert f"declared corpus: {problem}" in plan_build(recipe).problems
        server.requests.clear()
        with pytest.raises(CorpusError) as stopped:
            build_corpus(recipe, progress=io.StringIO())
        assert not isinstance(stopped.value, MixtureShort)  # exit 2, not the exit 1 of a corpus found short
        assert stopped.value.details == [problem]
        assert server.requests == []


def test_the_card_shows_declared_vs_reached_and_marks_a_short_corpus(tmp_path: Path) -> None:
    from corpus_builder.publish import CorpusDocuments, render_card

    write_sources(tmp_path, prompts=30)
    with FaultServer(model=MODEL, by_prompt=unclosed_every(3, 30)) as server:
        result = build_corpus(load_recipe(write_recipe(tmp_path, server.base_url, prompts_target="{count: 25}")),
                              progress=io.StringIO(), allow_short=True)
    card = render_card(CorpusDocuments.load(result.out_dir))
    assert "> **Short of its recipe**" in card and "25 declared (30 generated, the pool is exhausted)" in card
    assert "## Declared and reached" in card and "| asks | 25 | 20 | 20 | 30 |" in card


# --------------------------------------------------------------------------------------------------
# The selection's arithmetic, on rows that passed the checks (no build): each source its count, never more than
# it holds; a thinking share reached whenever any choice of the rows reaches it, overall and per split, the
# nearest one reported short when none does.

CELL_KINDS = (("train", True), ("train", False), ("validation", True), ("validation", False))
Sources = list[tuple[tuple[int, ...], int | None]]  # per source: rows per cell in CELL_KINDS order, count or None


def _recipe(sources: Sources, share: float, tolerance: float, per_split: bool) -> Recipe:
    return Recipe("property", Target(model="m"), tuple(
        SourceSpec(f"s{index}", "replay", target=SourceTarget(count=count) if count is not None else None)
        for index, (_, count) in enumerate(sources)), OutputSpec(Path("out")),
        mixture=Mixture(thinking_share=ThinkingShare(share, tolerance, per_split)))


def _selection(sources: Sources, share: float, tolerance: float, per_split: bool,
               priorities: Iterable[int]) -> tuple[Selection, list[list[int]]]:
    """The plan, and the rows taken from each cell of each source; the rows a cell gives are its best (lowest)
    priorities."""
    recipe = _recipe(sources, share, tolerance, per_split)
    available, rows = {}, {}
    drawn = iter(priorities)
    for index, (cells, _) in enumerate(sources):
        have = available[f"s{index}"] = Available()
        for kind, count in zip(CELL_KINDS, cells, strict=True):
            rows[(f"s{index}", kind)] = [next(drawn) for _ in range(count)]
            for row_priority in rows[(f"s{index}", kind)]:
                have.add(*kind, row_priority)
    selection = plan_selection(SelectStage.of(recipe), available, {})
    taken = []
    for name in available:
        taken.append([])
        for kind in CELL_KINDS:
            took = sorted(row for row in rows[(name, kind)] if selection.takes(name, *kind, row))
            assert took == sorted(rows[(name, kind)])[:len(took)], (name, kind)  # by priority within the cell
            taken[-1].append(len(took))
    return selection, taken


def _choices(wants: list[tuple[tuple[int, ...], int]]) -> set[tuple[int, ...]]:
    """Rows per cell (CELL_KINDS order) of every choice of rows: each source its count, each cell at most what
    it holds."""
    totals = {(0, 0, 0, 0)}
    for cells, count in wants:
        choices = [c for c in itertools.product(*(range(n + 1) for n in cells)) if sum(c) == count]
        totals = {tuple(a + b for a, b in zip(total, choice, strict=True)) for total in totals for choice in choices}
    return totals


def _within(thinking: int, rows: int, share: float, tolerance: float) -> bool:
    return abs(thinking / rows - share) <= tolerance + 1e-9


def _meets(cells: tuple[int, ...] | list[int], held: list[bool], share: float, tolerance: float,
           per_split: bool) -> bool:
    """Whether rows per cell meet the share: overall, or in every split the sources hold rows of (such a split
    may not be left empty)."""
    if not per_split:
        return _within(cells[0] + cells[2], sum(cells), share, tolerance)
    splits = [(cells[0], cells[0] + cells[1]), (cells[2], cells[2] + cells[3])]
    return all(_within(*split, share, tolerance) if split[1] else not needed
               for split, needed in zip(splits, held, strict=True))


@st.composite
def _declared_sources(draw: st.DrawFn) -> Sources:
    sources = []
    for _ in range(draw(st.integers(1, 3))):
        cells = tuple(draw(st.integers(0, 4)) for _ in CELL_KINDS)
        assume(sum(cells) > 0)
        sources.append((cells, draw(st.none() | st.integers(1, sum(cells) + 2))))  # a count may exceed the rows
    return sources


@given(sources=_declared_sources(), share=st.integers(0, 20).map(lambda n: n / 20),
       tolerance=st.integers(0, 25).map(lambda n: n / 100), per_split=st.booleans(), seed=st.integers(0, 2**32))
# one row for the two declared: the share was judged before any request as if the missing row reasoned
@example(sources=[((0, 0, 0, 1), 2)], share=0.0, tolerance=0.0, per_split=False, seed=0)
# rows moved across the splits along paths through several sources, by as many as every step allows
@example(sources=[((0, 4, 1, 0), 1), ((1, 0, 0, 2), 3), ((6, 0, 4, 4), 2)], share=0.6, tolerance=0.15, per_split=True,
         seed=871)
@example(sources=[((0, 5, 2, 1), 4), ((2, 3, 4, 2), None), ((4, 4, 1, 2), 7)], share=0.65, tolerance=0.1,
         per_split=True, seed=913)
@example(sources=[((2, 1, 1, 5), None), ((5, 1, 4, 0), 7), ((1, 2, 1, 1), 1)], share=0.6, tolerance=0.07,
         per_split=True, seed=35)
# the cells' totals for a validation size: bounds met in integers, the shares nearest the target
@example(sources=[((2, 4, 0, 0), 4), ((1, 1, 3, 1), 3)], share=0.4, tolerance=0.24, per_split=True, seed=265)
@example(sources=[((6, 2, 0, 1), None), ((0, 1, 1, 0), 1)], share=0.6, tolerance=0.15, per_split=True, seed=584)
@example(sources=[((0, 1, 2, 1), None), ((1, 0, 1, 1), 2), ((0, 0, 3, 1), None)], share=0.55, tolerance=0.1,
         per_split=True, seed=91)
@example(sources=[((5, 0, 4, 1), None), ((2, 1, 2, 3), 3)], share=0.8, tolerance=0.09, per_split=True, seed=58)
# the validation sizes tried: validation keeps a row when it holds one, train too, up to every row but one
@example(sources=[((0, 1, 0, 0), None), ((0, 1, 0, 1), 1)], share=0.0, tolerance=0.0, per_split=True, seed=0)
@example(sources=[((0, 0, 0, 1), None), ((1, 1, 0, 2), 1)], share=0.0, tolerance=0.0, per_split=True, seed=0)
# the thinking rows a split may hold, bounded in integers (a bound divided by its coefficient is floored)
@example(sources=[((0, 2, 0, 1), 2), ((2, 0, 2, 3), None)], share=0.55, tolerance=0.15, per_split=True, seed=0)
# steering towards the share: what a source moves is taken off what is still needed
@example(sources=[((0, 0, 1, 1), 1), ((0, 1, 1, 0), 1)], share=0.3, tolerance=0.2, per_split=False, seed=0)
# no targeted rows and none with reasoning among the rest: no share to bound, nothing certain
@example(sources=[((0, 0, 0, 1), None)], share=0.0, tolerance=0.0, per_split=False, seed=0)
@fuzz_settings(300)
def test_a_reachable_thinking_share_is_reached_and_an_unreachable_one_reported(
        sources: Sources, share: float, tolerance: float, per_split: bool, seed: int) -> None:
    priorities = random.Random(seed).sample(range(10**9), 100)
    selection, taken = _selection(sources, share, tolerance, per_split, priorities)
    wants = [(cells, sum(cells) if count is None else min(count, sum(cells))) for cells, count in sources]
    # each source its count, or every row it holds when it holds fewer (reported): no cell gives more than it has
    assert [sum(cells) for cells in taken] == [want for _, want in wants]
    assert all(took <= held for cells, (held_cells, _) in zip(taken, sources, strict=True)
               for took, held in zip(cells, held_cells, strict=True))
    assert [line for line in selection.shortfalls if line.startswith("source")] == [
        f"source 's{index}': {sum(cells)} rows pass every check, {count} declared"
        for index, (cells, count) in enumerate(sources) if count is not None and count > sum(cells)]
    held = [any(cells[0] + cells[1] for cells, _ in sources), any(cells[2] + cells[3] for cells, _ in sources)]
    choices = _choices(wants)
    reachable = any(_meets(choice, held, share, tolerance, per_split) for choice in choices)
    reported = [line for line in selection.shortfalls if line.startswith("thinking share")]
    assert (not reported) == reachable, (reported, reachable)
    in_all = [sum(cells[i] for cells in taken) for i in range(4)]
    rows, thinking = sum(in_all), in_all[0] + in_all[2]
    assert selection.thinking_share == thinking / rows
    assert selection.thinking_by_split == {"train": in_all[0] / (in_all[0] + in_all[1]) if in_all[0] + in_all[1]
                                           else 0.0,
                                           "validation": in_all[2] / (in_all[2] + in_all[3]) if in_all[2] + in_all[3]
                                           else 0.0}
    if not per_split:  # steered to the nearest share any choice gives: met, or missed by as little as can be
        assert abs(thinking - share * rows) <= min(abs(c[0] + c[2] - share * rows) for c in choices) + 1e-9
    elif reachable:
        assert _meets(in_all, held, share, tolerance, True)
        _, whole = _selection(sources, share, tolerance, False, priorities)
        planned = [sum(cells[i] for cells in whole) for i in range(4)]
        if _meets(planned, held, share, tolerance, True):  # the plan for the whole meets every split: kept
            assert taken == whole
        else:  # moved across the splits: the validation size nearest the plan's, then the shares nearest the target
            feasible = [c for c in choices if _meets(c, held, share, tolerance, True)]
            validation = in_all[2] + in_all[3]
            assert abs(validation - planned[2] - planned[3]) == min(abs(c[2] + c[3] - planned[2] - planned[3])
                                                                    for c in feasible)
            sized = [c for c in feasible if c[2] + c[3] == validation]
            assert abs(in_all[2] - share * validation) <= min(abs(c[2] - share * validation) for c in sized) + 1e-9
            train = rows - validation
            alike = [c for c in sized if c[2] == in_all[2]]
            assert abs(in_all[0] - share * train) <= min(abs(c[0] - share * train) for c in alike) + 1e-9
    # what is reported before any request, from the rows each source holds, is certain: the plan falls short too;
    # with every source a count it holds and one share for the whole, it is exact
    certain = certain_shortfalls(SelectStage.of(_recipe(sources, share, tolerance, per_split)), {
        f"s{index}": RowBounds.of_rows(sum(cells), cells[0] + cells[2], "rows") for index, (cells, _) in
        enumerate(sources)})
    assert [line for line in certain if line.startswith("source")] == [
        f"source 's{index}': at most {sum(cells)} rows ({sum(cells)} rows), {count} declared"
        for index, (cells, count) in enumerate(sources) if count is not None and count > sum(cells)]
    certain_share = [line for line in certain if line.startswith("thinking share")]
    assert not certain_share or not reachable, certain
    if all(count is not None for _, count in sources):  # the rows are known: every share outside the range is
        shares = [(c[0] + c[2]) / rows for c in choices]
        below, above = max(shares) < share - tolerance - 1e-9, min(shares) > share + tolerance + 1e-9
        assert [line.split(" ")[2:4] for line in certain_share] == [["at", "most"]] * below + [["at", "least"]] * above
        for line, nearest in zip(certain_share, [max(shares)] * below + [min(shares)] * above, strict=True):
            assert f"{nearest:.1%} of the rows" in line, line


@pytest.mark.parametrize("per_split", [False, True])
def test_every_reasoning_row_wanted_with_a_validation_split(per_split: bool) -> None:
    """All 100 reasoning rows wanted and 100 exist, some of them in validation: met, overall and per split
    (it was reported impossible whenever validation_fraction > 0: the split was apportioned first)."""
    selection, taken = _selection([((92, 280, 8, 20), 100)], 1.0, 0.0, per_split, itertools.count())
    assert selection.shortfalls == [] and selection.thinking_share == 1.0
    assert taken == [[92, 0, 8, 0]]


@pytest.mark.parametrize(("sources", "share", "per_split", "shortfalls"), [
    # too few reasoning rows: 3 of the 10 rows reason, whatever is taken
    ([((2, 6, 1, 1), None)], 0.6, False, ["thinking share overall 30.0% (3 of 10 rows), declared 60.0% +- 5.0%"]),
    # too many: 8 of the 10 rows that must be taken reason
    ([((6, 1, 2, 1), 10), ((0, 0, 0, 1), None)], 0.2, False,
     ["thinking share overall 72.7% (8 of 11 rows), declared 20.0% +- 5.0%"]),
    # the whole is met, but train holds only plain rows and validation only reasoning ones
    ([((0, 5, 5, 0), None)], 0.5, True, ["thinking share of train 0.0% (0 of 5 rows), declared 50.0% +- 5.0%",
                                         "thinking share of validation 100.0% (5 of 5 rows), declared 50.0% +- "
                                         "5.0%"]),
    # validation is met only when left empty, but the source holds rows there: it may not be
    ([((1, 1, 0, 1), 2)], 0.5, True, ["thinking share of validation 0.0% (0 of 0 rows), declared 50.0% +- 5.0%"]),
])
def test_a_thinking_share_outside_its_tolerance_fails_too_low_too_high_and_per_split(
        sources: Sources, share: float, per_split: bool, shortfalls: list[str]) -> None:
    selection, _ = _selection(sources, share, 0.05, per_split, itertools.count())
    because = ": the sources do not hold enough rows of the kind needed"
    assert selection.shortfalls == [line + because for line in shortfalls]
    if per_split:  # the same rows with one share for the whole corpus: met
        assert _selection(sources, share, 0.05, False, itertools.count())[0].shortfalls == []


@given(declared=st.integers(0, 400), so_far=st.integers(0, 800).flatmap(lambda n: st.tuples(st.integers(0, n),
                                                                                         st.just(n))),
       pool_left=st.integers(0, 800))
@example(declared=28, so_far=(7, 10), pool_left=100)  # 21 / 0.7 is 30.000000000000004 in floats: 31 were asked
@example(declared=1, so_far=(0, 0), pool_left=5)  # one row missing, nothing asked yet: one row
@example(declared=10, so_far=(9, 10), pool_left=1)  # the last prompt of the pool is asked for
@example(declared=10, so_far=(1, 3), pool_left=100)  # one row kept of three: nine missing ask for 27
@fuzz_settings(200)
def test_a_top_up_asks_for_the_shortfall_over_the_keep_rate_and_no_more(declared: int, so_far: tuple[int, int],
                                                                       pool_left: int) -> None:
    """A round asks for what is missing over the rate rows were kept at so far (each drop replaced once), at
    least one row, at most the pool; nothing once the source has its rows or the pool is empty."""
    kept, generated = so_far
    asked = next_round(declared, kept, generated, pool_left)
    missing = declared - kept
    if missing <= 0 or pool_left == 0:
        assert asked == 0
        return
    assert 1 <= asked <= pool_left
    kept_of, generated_of = (max(kept, 1), generated) if generated else (1, 1)  # nothing asked yet: all kept
    if asked < pool_left:  # kept at the rate so far, the rows asked make up the shortfall; one fewer would not
        assert asked * kept_of >= missing * generated_of > (asked - 1) * kept_of, (asked, missing)


@st.composite
def _declared_targets(draw: st.DrawFn) -> tuple[list[tuple[str, float | None, int]], int | None]:
    """Sources as (kind: count | share | none, its count or share, the rows it holds) that the recipe's checks
    accept, and mixture.total (or None)."""
    total = draw(st.none() | st.integers(1, 400))
    sources: list[tuple[str, float | None, int]] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["count", "share", "none"]))
        value = (draw(st.integers(1, 200)) if kind == "count" else draw(st.integers(1, 19)) / 20 if kind == "share"
                 else None)
        sources.append((kind, value, draw(st.integers(0, 300))))
    counted = sum(value for kind, value, _ in sources if kind == "count" and value is not None)
    shares = sum(value for kind, value, _ in sources if kind == "share" and value is not None)
    if total is None:
        assume(shares < 1 and any(kind != "share" for kind, _, _ in sources))
    else:
        left = total - counted - shares * total
        assume(counted <= total and left > -1 + 1e-9 and (left < 1 - 1e-9 or any(k == "none" for k, _, _ in sources)))
    return sources, total


def test_rows_are_apportioned_by_size_and_none_go_to_sizes_that_are_all_zero() -> None:
    """The sources with no target share what is left by their sizes; when none holds a row, none is given."""
    assert apportion(10, {"a": 1, "b": 4}) == {"a": 2, "b": 8}
    assert apportion(3, {"a": 1, "b": 1, "c": 1}) == {"a": 1, "b": 1, "c": 1}
    assert apportion(5, {"a": 0, "b": 0}) == {"a": 0, "b": 0}


@given(declared=_declared_targets())
@example(declared=([("count", 10, 5), ("none", None, 20)], 10))  # the counts make up the total: none is left
@example(declared=([("none", None, 1), ("share", 0.4, 0), ("share", 0.05, 0)], None))  # shares of what is left
@fuzz_settings(200)
def test_the_declared_counts_add_up_to_the_total_and_no_source_is_given_more_than_it_holds(
        declared: tuple[list[tuple[str, float | None, int]], int | None]) -> None:
    """Counts as declared; shares' rows within one of their part of the corpus; the sources with no target every
    kept row, or with mixture.total what the targets leave, in proportion to their rows (never more than they
    hold when they hold enough), so that the parts make up the total exactly."""
    sources, total = declared
    recipe = Recipe("counts", Target(model="m"), tuple(
        SourceSpec(f"s{index}", "replay", target=None if value is None else SourceTarget(count=int(value))
                   if kind == "count" else SourceTarget(share=value))
        for index, (kind, value, _) in enumerate(sources)), OutputSpec(Path("out")), mixture=Mixture(total=total))
    counts = resolve_counts(SelectStage.of(recipe), {f"s{index}": held for index, (_, _, held) in enumerate(sources)})
    names = [f"s{index}" for index in range(len(sources))]
    assert set(counts) == set(names)
    assert all(counts[name] == value for name, (kind, value, _) in zip(names, sources, strict=True) if kind == "count")
    open_sources = [(name, held) for name, (kind, _, held) in zip(names, sources, strict=True) if kind == "none"]
    share_parts = [(counts[name], value) for name, (kind, value, _) in zip(names, sources, strict=True)
                   if kind == "share"]
    if total is None:
        assert all(counts[name] is None for name, _ in open_sources)  # every kept row
        corpus = sum(value or 0 for kind, value, _ in sources if kind == "count") + sum(h for _, h in open_sources)
        corpus += sum(part or 0 for part, _ in share_parts)
    else:
        corpus = total
        assert sum(counts[name] or 0 for name in names) == total or (
            open_sources and not sum(held for _, held in open_sources))  # nothing to fill the rest with
        rest = sum(counts[name] or 0 for name, _ in open_sources)
        held_open = sum(held for _, held in open_sources)
        for name, held in open_sources:
            part = counts[name]
            assert part is not None and abs(part - (rest * held / held_open if held_open else 0)) < 1
            assert part <= held or rest > held_open, (part, held)
    for part, share in share_parts:
        assert part is not None and abs(part - (share or 0) * corpus) < 1 + 1e-9, (part, share, corpus)
    quotas = [(share or 0) * corpus for _, share in share_parts]
    parts = [part or 0 for part, _ in share_parts]
    if total is not None and open_sources and held_open:  # what the targets leave is one more quota among them
        counted = sum(value or 0 for kind, value, _ in sources if kind == "count")
        quotas.append(max(0.0, total - counted - sum(quotas)))
        parts.append(rest)
        _by_largest_remainders([counts[name] or 0 for name, _ in open_sources],
                               [rest * held / held_open for _, held in open_sources])
    _by_largest_remainders(parts, quotas)


def _by_largest_remainders(parts: list[int], quotas: list[float]) -> None:
    """Each part is its quota's floor, or one more for the largest remainders (the first in order on ties)."""
    remainders = [quota - math.floor(quota) for quota in quotas]
    up = [i for i, (part, quota) in enumerate(zip(parts, quotas, strict=True)) if part > math.floor(quota)]
    assert all(parts[i] == math.floor(quotas[i]) + (i in up) for i in range(len(parts))), (parts, quotas)
    assert all((remainders[i], -i) > (remainders[j], -j) for i in up for j in range(len(parts)) if j not in up), (
        parts, quotas)


def test_the_rows_mixture_total_leaves_to_the_sources_with_no_target_are_judged_before_any_request() -> None:
    recipe = Recipe("bounds", Target(model="m"), (
        SourceSpec("logs", "replay", target=SourceTarget(count=50)), SourceSpec("asks", "prompts"),
        SourceSpec("chats", "replay")), OutputSpec(Path("out")), mixture=Mixture(total=200))
    bounds = {"logs": RowBounds.of_rows(60, 10, "rows read"), "asks": RowBounds.of_prompts(40, 2),
              "chats": RowBounds.of_rows(30, 0, "rows read")}
    assert certain_shortfalls(SelectStage.of(recipe), bounds) == [
        "the sources with no target ('asks', 'chats'): at most 110 rows, 150 left to them by mixture.total (200)"]
    assert bounds["asks"].counted == "a pool of 40 prompts x 2 samples"
    with_share = Recipe("bounds", Target(model="m"), recipe.sources, OutputSpec(Path("out")),
                        mixture=Mixture(total=200, thinking_share=ThinkingShare(0.9)))
    # 50 rows of 'logs' and the 110 the others can give
    assert certain_shortfalls(SelectStage.of(with_share), bounds)[1:] == [
        "thinking share: at most 56.2% of the rows can reason (every generated row counted as reasoning), declared "
        "90.0% +- 2.0%"]
    reasoning = dict(bounds, logs=RowBounds.of_rows(60, 55, "rows read"))  # 'logs' gives at least 45 reasoning rows
    low_share = Recipe("bounds", Target(model="m"), recipe.sources, OutputSpec(Path("out")),
                       mixture=Mixture(total=200, thinking_share=ThinkingShare(0.1)))
    assert certain_shortfalls(SelectStage.of(low_share), reasoning)[1:] == [
        "thinking share: at least 28.1% of the rows reason (no generated row counted as reasoning), declared 10.0% "
        "+- 2.0%"]
    # a share of a known total is judged as a count
    shared = Recipe("bounds", Target(model="m"), (SourceSpec("logs", "replay", target=SourceTarget(share=0.5)),
                                                   SourceSpec("chats", "replay")), OutputSpec(Path("out")),
                    mixture=Mixture(total=100))
    assert certain_shortfalls(SelectStage.of(shared), dict(bounds, logs=RowBounds.of_rows(40, 0, "rows read"))) == [
        "source 'logs': at most 40 rows (40 rows read), 50 declared",
        "the sources with no target ('chats'): at most 30 rows, 50 left to them by mixture.total (100)"]
    bounds["asks"] = RowBounds.of_prompts(120, 1)
    assert certain_shortfalls(SelectStage.of(recipe), bounds) == []
    assert bounds["asks"].counted == "a pool of 120 prompts x 1 sample"
    # a share of a total the sources with no target make up is not judged: their rows are known after the checks
    shared = Recipe("bounds", Target(model="m"), (
        SourceSpec("logs", "replay", target=SourceTarget(share=0.5)), SourceSpec("chats", "replay")),
        OutputSpec(Path("out")), mixture=Mixture(thinking_share=ThinkingShare(0.9)))
    assert certain_shortfalls(SelectStage.of(shared), {"logs": RowBounds.of_rows(10, 0, "rows read"),
                                       "chats": RowBounds.of_rows(30, 0, "rows read")}) == []
    # no declared corpus: nothing to judge
    assert certain_shortfalls(SelectStage.of(Recipe("none", Target(model="m"), (SourceSpec("chats", "replay"),),
                                                    OutputSpec(Path("out")))),
                              {"chats": RowBounds.of_rows(0, 0, "rows read")}) == []


def test_a_row_evicted_after_it_was_kept_is_no_longer_available() -> None:
    have = Available()
    for row_priority, (split, thinking) in enumerate(CELL_KINDS * 2):
        have.add(split, thinking, row_priority)
    have.discard("validation", True, 2)
    assert have.count() == 7 and have.count(split="validation", thinking=True) == 1
    assert (have.count(split="train"), have.count(thinking=False), have.count(split="validation")) == (4, 4, 3)
    assert have.best(3) == {("train", True): 1, ("train", False): 1, ("validation", True): 0,
                            ("validation", False): 1}
    assert have.best(2, thinking=True) == {("train", True): 2, ("validation", True): 0}


def test_the_order_rows_are_taken_in_is_seeded_by_the_row_id_and_not_the_split() -> None:
    """A row's priority depends on the mixture seed and its id alone, and not as the split's draw does: the
    best rows of a source are not its validation rows."""
    ids = [f"{index:016x}" for index in range(2000)]
    assert [mixture_priority(3, row_id) for row_id in ids] == [mixture_priority(3, row_id) for row_id in ids]
    assert len({mixture_priority(3, row_id) for row_id in ids}) == len(ids)
    first = sorted(ids, key=lambda row_id: mixture_priority(3, row_id))
    assert first != sorted(ids, key=lambda row_id: mixture_priority(4, row_id))
    splitter = Splitter(0.2, seed=3)
    best = [splitter.assign_id(row_id) for row_id in first[:500]]
    assert 0.1 < best.count("validation") / len(best) < 0.3


def test_a_source_with_no_target_short_of_its_part_of_the_total_is_named() -> None:
    recipe = Recipe("short", Target(model="m"), (SourceSpec("logs", "replay", target=SourceTarget(share=0.5)),
                                                  SourceSpec("chats", "replay")), OutputSpec(Path("out")),
                    mixture=Mixture(total=20))
    available = {"logs": Available(), "chats": Available()}
    for row_priority in range(12):
        available["logs"].add("train", row_priority % 3 == 0, row_priority)
    for row_priority in range(4):
        available["chats"].add("validation", False, 100 + row_priority)
    selection = plan_selection(SelectStage.of(recipe), available, {})
    assert selection.shortfalls == ["source 'chats': 4 rows pass every check, 10 declared (its part of "
                                    "mixture.total)", "source 'logs': 10 rows, 71.4% of the 14 written, 50.0% declared",
                                    "corpus: 14 rows reached, mixture.total declares 20"]
    assert selection.report(recipe.mixture) == {
        "sources": {"logs": {"declared": 10, "declared_share": 0.5, "available": 12, "reached": 10,
                             "reached_share": round(10 / 14, 6), "thinking": 4, "generated_rows": 0},
                    "chats": {"declared": 10, "declared_share": None, "available": 4, "reached": 4,
                              "reached_share": None, "thinking": 0, "generated_rows": 0}},
        "thinking_share": {"target": None, "tolerance": None, "reached": round(4 / 14, 6),
                           "by_split": {"train": 0.4, "validation": 0.0}},
        "shortfalls": selection.shortfalls}


@pytest.mark.parametrize(("logs_thinking", "chats_thinking", "problem"), [
    (0, 0, "thinking share: at most 0.0% of the rows can reason (every generated row counted as reasoning), "
           "declared 50.0% +- 2.0%"),
    (100, 30, "thinking share: at least 100.0% of the rows reason (no generated row counted as reasoning), "
              "declared 50.0% +- 2.0%"),
    (40, 30, None),  # 40 of 100 reason, or with every 'chats' row kept 70 of 130: 50% is between
])
def test_a_thinking_share_is_judged_before_any_request_with_sources_that_give_every_kept_row(
        logs_thinking: int, chats_thinking: int, problem: str | None) -> None:
    """'chats' has no target and no total bounds it: it gives from none to all of its rows, whichever the checks
    keep; the share is missed for certain only when neither extreme reaches it (it was not judged at all)."""
    recipe = Recipe("open", Target(model="m"), (SourceSpec("logs", "replay", target=SourceTarget(count=100)),
                                                 SourceSpec("chats", "replay")), OutputSpec(Path("out")),
                    mixture=Mixture(thinking_share=ThinkingShare(0.5)))
    bounds = {"logs": RowBounds.of_rows(100, logs_thinking, "rows read"),
              "chats": RowBounds.of_rows(30, chats_thinking, "rows read")}
    assert certain_shortfalls(SelectStage.of(recipe), bounds) == ([problem] if problem else [])
    # a share of a total those rows make up is not judged
    shared = Recipe("open", Target(model="m"), (SourceSpec("logs", "replay", target=SourceTarget(share=0.5)),
                                                 SourceSpec("chats", "replay")), OutputSpec(Path("out")),
                    mixture=Mixture(thinking_share=ThinkingShare(0.5)))
    assert certain_shortfalls(SelectStage.of(shared), bounds) == []


def _plan(targets: dict[str, SourceTarget | None], rows: dict[str, int], mixture: Mixture) -> Selection:
    """The plan for replay sources holding ``rows`` plain train rows each."""
    recipe = Recipe("plan", Target(model="m"), tuple(SourceSpec(name, "replay", target=target)
                                                      for name, target in targets.items()), OutputSpec(Path("out")),
                    mixture=mixture)
    available = {name: Available() for name in targets}
    for offset, (name, count) in enumerate(rows.items()):
        for row_priority in range(count):
            available[name].add("train", False, 1000 * offset + row_priority)
    return plan_selection(SelectStage.of(recipe), available, {})


@pytest.mark.parametrize(("held", "shortfalls"), [
    # 'logs' has its 10 rows, but 'chats' only 8 of its 10: 'logs' is one row over half of the 18 written
    ({"logs": 10, "chats": 8}, ["source 'chats': 8 rows pass every check, 10 declared (its part of mixture.total)",
                                "source 'logs': 10 rows, 55.6% of the 18 written, 50.0% declared",
                                "corpus: 18 rows reached, mixture.total declares 20"]),
    # 'logs' is short itself: its own shortfall says so, not its share of the rows written again
    ({"logs": 4, "chats": 30}, ["source 'logs': 4 rows pass every check, 10 declared",
                                "corpus: 14 rows reached, mixture.total declares 20"]),
    ({"logs": 10, "chats": 9}, ["source 'chats': 9 rows pass every check, 10 declared (its part of mixture.total)",
                                "corpus: 19 rows reached, mixture.total declares 20"]),  # 10 is half of 19 within a row
])
def test_a_share_one_row_off_its_part_of_the_rows_written_is_short(held: dict[str, int],
                                                                   shortfalls: list[str]) -> None:
    selection = _plan({"logs": SourceTarget(share=0.5), "chats": None}, held, Mixture(total=20))
    assert selection.shortfalls == shortfalls


def test_a_corpus_with_no_rows_names_its_sources_short_and_no_share() -> None:
    selection = _plan({"logs": SourceTarget(count=5)}, {"logs": 0}, Mixture(thinking_share=ThinkingShare(0.5)))
    assert selection.shortfalls == ["source 'logs': 0 rows pass every check, 5 declared"]
    assert (selection.thinking_share, selection.thinking_by_split) == (0.0, {"train": 0.0, "validation": 0.0})
