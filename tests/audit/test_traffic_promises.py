"""The traffic audit's promises, held where a slip would break them: bucket edges, the TVD, the biggest gaps,
``--max-divergence`` at its limit, the plan and the recipe diff's arithmetic (issue 19).

The arithmetic is checked as properties on the functions alone, and on profiles read from files; the tests that
build the mixed corpus (``fixtures.build_mixed_corpus``: several sources per task, drops, several turns and takes
of every kind) are in test_traffic_built.py, apart, so that a mutation run of the comparison needs no build.
"""

from __future__ import annotations

import copy
import math
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import polars as pl
import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from corpus_builder.audit import AuditOptions, CorpusFiles
from corpus_builder.audit.frames import NO_TASK
from corpus_builder.audit.inputs import traffic_units
from corpus_builder.audit.profile import (
    COPY_BUCKETS,
    GROUP_KEYS,
    LENGTH_BUCKETS,
    LENGTH_EDGES,
    Profile,
    TokenTables,
    read_profile,
)
from corpus_builder.audit.token_pass import Measured, TokenMeter
from corpus_builder.audit.traffic import (
    COVERAGE_POINTS,
    FACT_DIMENSIONS,
    GAPS_SHOWN,
    THINKING_TOLERANCE,
    TOKEN_DIMENSIONS,
    TURN_BUCKETS,
    _divergence,
    _frequency_tvd,
    _plan,
    _points,
    _recipe_diff,
    _split_rows,
    _token_suggestions,
    _turn_bucket,
    _vocab,
    _vocab_alone,
    as_shares,
    compare,
    divergence_problems,
    total_variation,
)
from corpus_builder.errors import DropCounts
from corpus_builder.stats.facts import THINKING_MODE
from corpus_builder.tokens import TemplateRenderer
from tests.support.fuzz import fuzz_settings

from .fixtures import (
    chat_row,
    mixed_traffic,
    summary_row,
    write_jsonl,
)

BUCKET_NAMES = st.sampled_from("abcdef")
COUNTS = st.dictionaries(BUCKET_NAMES, st.integers(0, 50), min_size=1).filter(lambda c: sum(c.values()) > 0)


def corpus_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *map(str, args)], capture_output=True, text=True)


# --- the TVD and the biggest gaps -------------------------------------------------------------------------


@given(corpus=COUNTS, traffic=COUNTS)
@fuzz_settings(200)
def test_every_tvd_lies_in_0_1_is_symmetric_and_is_the_mass_to_move(corpus: dict[str, int],
                                                                    traffic: dict[str, int]) -> None:
    mine, theirs = as_shares(corpus), as_shares(traffic)
    distance = total_variation(mine, theirs)
    assert 0 <= distance <= 1 + 1e-12
    assert distance == pytest.approx(total_variation(theirs, mine), abs=1e-12)
    assert total_variation(mine, mine) == 0
    # The share of mass that must move: what the traffic has more of, or (the same) what the corpus has more of.
    keys = set(mine) | set(theirs)
    more = sum(max(0.0, theirs.get(k, 0.0) - mine.get(k, 0.0)) for k in keys)
    assert distance == pytest.approx(more, abs=1e-12)
    assert _divergence(mine, theirs)["tvd"] == round(distance, 6)
    if not {k for k, v in corpus.items() if v} & {k for k, v in traffic.items() if v}:
        assert distance == pytest.approx(1.0)  # no bucket in common: everything moves
    # The token frequencies' TVD is the same distance over token ids.
    ids = sorted(keys)
    as_array = [np.array([side.get(k, 0) for k in ids], dtype=np.int64) for side in (corpus, traffic)]
    frequencies = _frequency_tvd(*as_array)
    assert frequencies == round(distance, 6) == _frequency_tvd(*reversed(as_array))


def test_a_side_without_supervised_tokens_has_no_frequency_tvd() -> None:
    some, none = np.array([3, 0, 1]), np.zeros(3, dtype=np.int64)
    assert _frequency_tvd(some, none) is None and _frequency_tvd(none, some) is None
    assert _frequency_tvd(some, np.array([0, 4, 0])) == 1.0


@given(corpus=COUNTS, traffic=COUNTS)
@fuzz_settings(200)
def test_the_biggest_gaps_are_the_largest_nonzero_in_order(corpus: dict[str, int], traffic: dict[str, int]) -> None:
    """At most GAPS_SHOWN, none zero, by size of the gap (ties: by bucket name); none left out is bigger."""
    mine, theirs = as_shares(corpus), as_shares(traffic)
    gaps = _divergence(mine, theirs)["gaps"]
    every = {k: round(theirs.get(k, 0.0) - mine.get(k, 0.0), 6) for k in set(mine) | set(theirs)}
    assert len(gaps) <= GAPS_SHOWN
    for gap in gaps:
        assert gap == {"bucket": gap["bucket"], "corpus": round(mine.get(gap["bucket"], 0.0), 6),
                       "traffic": round(theirs.get(gap["bucket"], 0.0), 6), "gap": every[gap["bucket"]]}
        assert gap["gap"] != 0
    assert [(-abs(g["gap"]), g["bucket"]) for g in gaps] == sorted((-abs(g["gap"]), g["bucket"]) for g in gaps)
    shown = {g["bucket"] for g in gaps}
    for bucket, size in every.items():
        if bucket in shown or not size:
            continue
        assert len(gaps) == GAPS_SHOWN  # a nonzero gap is left out only when the list is full
        assert (-abs(size), bucket) > (-abs(gaps[-1]["gap"]), gaps[-1]["bucket"])


def test_the_gaps_tie_by_bucket_name_and_skip_zero_gaps() -> None:
    corpus = {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4}
    traffic = {"a": 0.2, "b": 0.1, "c": 0.3, "e": 0.4}
    assert [(g["bucket"], g["gap"]) for g in _divergence(corpus, traffic)["gaps"]] == [
        ("d", -0.4), ("e", 0.4), ("a", 0.1)]
    assert _divergence({"a": 0.5, "b": 0.5}, {"a": 0.6, "b": 0.4})["gaps"] == [
        {"bucket": "a", "corpus": 0.5, "traffic": 0.6, "gap": 0.1},
        {"bucket": "b", "corpus": 0.5, "traffic": 0.4, "gap": -0.1}]


# --- bucket edges ---------------------------------------------------------------------------------------


def _turn_range(bucket: str) -> tuple[int, float]:
    """A turn bucket's ends, both inclusive ("4-5": 4 and 5; "11+": 11 on)."""
    if bucket.endswith("+"):
        return int(bucket[:-1]), math.inf
    low, _, high = bucket.partition("-")
    return int(low), int(high or low)


@given(turns=st.one_of(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 10, 11]), st.integers(0, 500)))
@fuzz_settings(100)
def test_a_turn_count_on_a_bucket_edge_lands_in_the_bucket_that_names_it(turns: int) -> None:
    bucket = _turn_bucket(turns)
    assert bucket in TURN_BUCKETS
    low, high = _turn_range(bucket)
    assert low <= turns <= high


def _tokens(label: str) -> float:
    return int(label[:-1]) * 1024 if label.endswith("k") else int(label)


def _length_range(bucket: str) -> tuple[float, float]:
    """A length bucket's [low, high) ends."""
    if bucket.startswith("<"):
        return 0, _tokens(bucket[1:])
    if bucket.endswith("+"):
        return _tokens(bucket[:-1]), math.inf
    low, high = bucket.split("-")
    return _tokens(low), _tokens(high)


def _copy_range(bucket: str) -> tuple[float, float]:
    """A copy-share bucket's (low, high] ends ("0": nothing copied)."""
    if bucket == "0":
        return 0, 0
    low, high = bucket.rstrip("%").split("-")
    return int(low) / 100, int(high) / 100


def _measured_turn(prompt: int, response: int, copied: int) -> TokenTables:
    """The token tables of one conversation of one turn measured so."""
    tables = TokenTables(8, np.zeros(4, dtype=np.int64))
    keys = pl.DataFrame({"source": ["log"], "split": [None], "task": ["chat"], THINKING_MODE: [False]},
                        schema={"source": pl.String, "split": pl.String, "task": pl.String, THINKING_MODE: pl.Boolean})
    assert tuple(keys.columns) == GROUP_KEYS
    one = np.array
    tables.add(keys, Measured(turn_conversation=one([0]), turn_prompt=one([prompt]), turn_response=one([response]),
                              turn_reasoning=one([0]), turn_copied=one([copied]), turn_longest_copy=one([copied]),
                              conversation_tokens=one([prompt + response]), supervised_ids=one([], dtype=np.int64),
                              unmeasured_turns=0))
    return tables


EDGE_LENGTHS = st.sampled_from(LENGTH_EDGES).flatmap(lambda edge: st.sampled_from([edge - 1, edge, edge + 1]))


@given(prompt=st.one_of(EDGE_LENGTHS, st.integers(1, 70_000)), response=st.integers(1, 40))
@fuzz_settings(100)
def test_a_length_on_a_bucket_edge_lands_in_the_bucket_it_opens(prompt: int, response: int) -> None:
    """Length buckets are [low, high): 128 tokens is "128-256", 127 is "<128"."""
    buckets = _measured_turn(prompt, response, 0).buckets.frame()
    found = dict(zip(buckets.get_column("measure"), buckets.get_column("bucket"), strict=True))
    for measure, tokens in (("prompt_tokens", prompt), ("response_tokens", response),
                            ("conversation_tokens", prompt + response)):
        assert found[measure] in LENGTH_BUCKETS
        low, high = _length_range(found[measure])
        assert low <= tokens < high, (measure, tokens, found[measure])
    assert "reasoning_tokens" not in found  # a turn without reasoning has no reasoning length


@given(shares=st.one_of(st.sampled_from([(0, 10), (1, 10), (10, 100), (25, 100), (50, 100), (75, 100), (1, 1),
                                          (3, 30), (26, 100), (11, 100)]),
                        st.integers(1, 400).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n)))))
@fuzz_settings(100)
def test_a_copy_share_on_a_bucket_edge_lands_in_the_bucket_it_closes(shares: tuple[int, int]) -> None:
    """Copy-share buckets are (low, high]: 10% copied is "0-10%", nothing copied is "0"."""
    copied, response = shares
    bucket = _measured_turn(20, response, copied).copies.frame().get_column("copy_bucket").to_list()
    assert len(bucket) == 1 and bucket[0] in COPY_BUCKETS
    low, high = _copy_range(bucket[0])
    share = copied / response
    assert (copied == 0) if bucket[0] == "0" else low < share <= high


# --- --max-divergence at its limit ----------------------------------------------------------------------


@given(tvds=st.lists(st.integers(0, 20).map(lambda n: n / 20), min_size=1, max_size=4),
       limit=st.integers(0, 20).map(lambda n: n / 20))
@fuzz_settings(100)
def test_a_divergence_equal_to_the_limit_passes_and_one_past_it_fails(tvds: list[float], limit: float) -> None:
    report = {"divergence": {f"dim{i}": {"tvd": tvd, "gaps": []} for i, tvd in enumerate(tvds)},
              "readable": {"partial": False}}
    problems = divergence_problems(report, limit)
    assert problems == [f"dim{i}: total variation distance {tvd:.3f} exceeds --max-divergence {limit:g}"
                        for i, tvd in enumerate(tvds) if tvd > limit]
    assert divergence_problems(report, None) == []


def test_partial_traffic_fails_the_limit_unless_allowed() -> None:
    readable = {"partial": True, "rows": 90, "skipped": 10, "skipped_share": 0.1, "max_skipped_share": 0.05}
    report = {"divergence": {"thinking": {"tvd": 0.0, "gaps": []}}, "readable": readable}
    assert divergence_problems(report, 0.5) == [
        "10 of the traffic's 100 rows (10.0%) were skipped, more than --max-skipped-share 0.05: the divergences "
        "describe the readable rows only (--allow-skipped accepts that)"]
    assert divergence_problems(report, 0.5, allow_skipped=True) == []
    assert divergence_problems(report, None) == []
    assert divergence_problems({"divergence": {}}, 0.5) == []  # a report without its readable section


# --- the plan: rows per source to follow the traffic -------------------------------------------------------


@st.composite
def _task_sources(draw: st.DrawFn) -> dict[str, dict[str, Any]]:
    """1-4 sources of one task: conversations, and the thinking share as the audit rounds it."""
    sizes = draw(st.lists(st.integers(1, 200), min_size=1, max_size=4))
    return {f"s{i}": {"conversations": n, "thinking_share": round(draw(st.integers(0, n)) / n, 6)}
            for i, n in enumerate(sizes)}


def _reached(rows: dict[str, int | float], sources: dict[str, dict[str, Any]]) -> float:
    total = sum(rows.values())
    return sum(rows[name] * sources[name]["thinking_share"] for name in rows) / total if total else 0.0


@given(sources=_task_sources(), wanted=st.integers(0, 500), thinking=st.integers(0, 100).map(lambda n: n / 100))
@fuzz_settings(300)
def test_a_tasks_rows_are_shared_as_now_then_moved_from_the_least_to_the_most_thinking_source(
        sources: dict[str, dict[str, Any]], wanted: int, thinking: float) -> None:
    rows = _split_rows(wanted, thinking, sources)
    have = sum(section["conversations"] for section in sources.values())
    now = {name: wanted * section["conversations"] / have for name, section in sources.items()}
    assert rows.keys() == sources.keys() and all(n >= 0 for n in rows.values())
    assert abs(sum(rows.values()) - wanted) <= len(sources) / 2  # each source's count rounded, no more
    shares = [section["thinking_share"] for section in sources.values()]
    moved = {name for name in rows if rows[name] != round(now[name])}
    assert len(moved) <= 2 and all(sources[name]["thinking_share"] in (min(shares), max(shares)) for name in moved)
    if not wanted:
        return
    before = _reached(now, sources)
    slack = len(sources) / 2 / wanted  # the rounding of each source's rows
    if abs(before - thinking) <= THINKING_TOLERANCE or max(shares) == min(shares):
        assert not moved  # close enough (or nothing to move between): shared as now
        return
    # What the move can reach: every row of the least thinking source moved, or every row of the most.
    spread = max(shares) - min(shares)
    low = min(sources, key=lambda name: sources[name]["thinking_share"])
    high = max(sources, key=lambda name: sources[name]["thinking_share"])
    reachable = (before - now[high] * spread / wanted, before + now[low] * spread / wanted)
    expected = min(max(thinking, reachable[0]), reachable[1])
    assert _reached(rows, sources) == pytest.approx(expected, abs=slack + 1e-9)


def _sides(sources: dict[str, tuple[str, int, float]], traffic: dict[str, tuple[int, float]]
           ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The corpus and traffic sections ``_plan`` reads: sources (task, rows, thinking), traffic tasks (rows,
    thinking)."""
    by_source = {name: {"task": task, "conversations": n, "thinking_share": share}
                 for name, (task, n, share) in sources.items()}
    conversations = sum(n for n, _ in traffic.values())
    by_task = {task: {"conversations": n, "thinking_share": share} for task, (n, share) in traffic.items()}
    thinking = round(sum(n * share for n, share in traffic.values()) / conversations, 6)
    return ({"conversations": sum(n for _, n, _ in sources.values()), "by_source": by_source},
            {"conversations": conversations, "by_task": by_task, "thinking_share": thinking})


SHARES = st.integers(0, 10).map(lambda n: n / 10)


@given(sources=st.dictionaries(st.sampled_from(["a", "b", "c", "d", "e"]),
                               st.tuples(st.sampled_from(["chat", "code", "math"]), st.integers(1, 300), SHARES),
                               min_size=1),
       traffic=st.dictionaries(st.sampled_from(["chat", "code", "math", "law"]),
                               st.tuples(st.integers(1, 300), SHARES), min_size=1))
@fuzz_settings(300)
def test_the_plan_follows_the_traffic_task_mix_at_the_corpus_size(sources: dict[str, tuple[str, int, float]],
                                                                  traffic: dict[str, tuple[int, float]]) -> None:
    corpus_side, traffic_side = _sides(sources, traffic)
    plan, notes = _plan(corpus_side, traffic_side)
    total, served = corpus_side["conversations"], traffic_side["conversations"]
    assert sorted(entry["source"] for entry in plan) == sorted(sources)  # every corpus source, once
    for entry in plan:
        task, have, share = sources[entry["source"]]
        assert entry == {"source": entry["source"], "task": task, "rows": have, "target_rows": entry["target_rows"],
                         "change": entry["target_rows"] - have, "thinking_share": share}
    for task in sorted({task for task, _, _ in sources.values()} | set(traffic)):
        members = [entry for entry in plan if entry["task"] == task]
        n, thinking = traffic.get(task, (0, 0.0))
        wanted = round(total * n / served)
        if not members:
            assert any(note.startswith(f"task {task}: {n / served:.1%} of the traffic") and "no corpus source" in note
                       and f"~{wanted:,} rows" in note for note in notes)
            continue
        assert abs(sum(entry["target_rows"] for entry in members) - wanted) <= len(members) / 2
        removal = (f"task {task}: none of the traffic; the diff removes its sources "
                   f"({', '.join(entry['source'] for entry in members)}): keep them if the draft should keep that "
                   "coverage")
        assert (removal in notes) == (wanted == 0)
        told = any(note.startswith(f"task {task}: the traffic is") for note in notes)
        if wanted == 0:
            assert all(entry["target_rows"] == 0 for entry in members) and not told
            continue
        target = {entry["source"]: entry["target_rows"] for entry in members}
        reached = sum(target[name] * sources[name][2] for name in target) / wanted
        assert told == (abs(reached - thinking) > THINKING_TOLERANCE)
        # The plan moves each task's thinking share towards the traffic's, never past it (rounding apart).
        now = {entry["source"]: entry["rows"] for entry in members}
        slack = 2 * len(members) / wanted
        assert abs(_reached(target, {k: {"thinking_share": sources[k][2]} for k in target}) - thinking) <= (
            abs(_reached(now, {k: {"thinking_share": sources[k][2]} for k in now}) - thinking) + slack)
    # And the task mix towards the traffic's (exactly, up to a row per source).
    traffic_shares = as_shares({task: n for task, (n, _) in traffic.items()})
    planned = {task: sum(e["target_rows"] for e in plan if e["task"] == task) for task in traffic_shares}
    current = as_shares({task: sum(e["rows"] for e in plan if e["task"] == task) for task in {*traffic_shares}
                         | {e["task"] for e in plan}})
    if sum(planned.values()):
        assert total_variation(as_shares(planned), traffic_shares) <= total_variation(current, traffic_shares) + (
            len(sources) / sum(planned.values()))


def test_a_thinking_share_exactly_the_tolerance_away_needs_no_move() -> None:
    """0.02 thinking where the traffic has none: within THINKING_TOLERANCE (0.02), so nothing moves or is said."""
    assert THINKING_TOLERANCE == 0.02
    sources = {"some": {"conversations": 50, "thinking_share": 0.04}, "none": {"conversations": 50,
                                                                           "thinking_share": 0.0}}
    assert _split_rows(100, 0.0, sources) == {"some": 50, "none": 50}
    assert _split_rows(100, 0.0, {"some": {"conversations": 50, "thinking_share": 0.06}, "none": sources["none"]}
                       ) == {"some": 0, "none": 100}  # 0.03 away: moved all the way to the traffic's share
    corpus_side, traffic_side = _sides({"few": ("chat", 50, 0.02)}, {"chat": (10, 0.0)})
    assert _plan(corpus_side, traffic_side)[1] == []
    corpus_side, traffic_side = _sides({"few": ("chat", 50, 0.04)}, {"chat": (10, 0.0)})
    assert _plan(corpus_side, traffic_side)[1] == [
        "task chat: the traffic is 0% thinking, its sources reach 4% at most: add a prompts source for it "
        "generated with thinking off (target.generation.enable_thinking: false)"]


def test_a_move_never_takes_more_rows_than_the_least_thinking_source_gives() -> None:
    """Of 2 rows wanted all thinking, the never-thinking source's 0.2 is all that moves (not the 0.7 the gap
    asks), even where that is under a row."""
    sources = {"never": {"conversations": 1, "thinking_share": 0.0},
               "half": {"conversations": 5, "thinking_share": 0.5},
               "always": {"conversations": 4, "thinking_share": 1.0}}
    assert _split_rows(2, 1.0, sources) == {"never": 0, "half": 1, "always": 1}
    assert _split_rows(20, 1.0, sources) == {"never": 0, "half": 10, "always": 10}
    assert _split_rows(20, 0.0, sources) == {"never": 10, "half": 10, "always": 0}


def test_traffic_without_tasks_plans_the_whole_corpus_on_its_thinking_share() -> None:
    corpus_side, traffic_side = _sides({"never": ("chat", 60, 0.0), "always": ("code", 40, 1.0)},
                                       {NO_TASK: (100, 0.7)})
    plan, notes = _plan(corpus_side, traffic_side)
    assert {entry["source"]: (entry["task"], entry["target_rows"]) for entry in plan} == {
        "never": ("(all)", 30), "always": ("(all)", 70)}
    assert notes == []
    traffic_side["by_task"] = {}  # no task dimension at all: the same
    assert _plan(corpus_side, traffic_side) == (plan, notes)


def test_an_unreachable_thinking_share_is_reported_in_the_mode_to_add() -> None:
    corpus_side, traffic_side = _sides({"some": ("chat", 50, 0.5), "none": ("code", 50, 0.0)},
                                       {"chat": (50, 1.0), "code": (50, 0.0)})
    assert _plan(corpus_side, traffic_side)[1] == [
        "task chat: the traffic is 100% thinking, its sources reach 50% at most: add a prompts source for it "
        "generated with thinking on (target.generation.enable_thinking: true)"]
    corpus_side, traffic_side = _sides({"all": ("chat", 50, 1.0)}, {"chat": (50, 0.25)})
    assert _plan(corpus_side, traffic_side)[1] == [
        "task chat: the traffic is 25% thinking, its sources reach 100% at most: add a prompts source for it "
        "generated with thinking off (target.generation.enable_thinking: false)"]


# --- the recipe diff: take counts scaled by rows read over rows kept ---------------------------------------


@dataclass
class _Files:
    """What ``_recipe_diff`` and ``_token_suggestions`` read of a corpus: its recipe and its drops."""

    recipe: Any
    has_ledger: bool = True
    drops: DropCounts = field(default_factory=DropCounts)


def _applied(text: str, diff: str) -> str:
    """``text`` with a unified diff applied as ``patch`` applies it: every hunk's context and removed lines must
    be where the hunk says."""
    lines, out, at = text.splitlines(keepends=True), [], 0
    hunks = re.split(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@.*\n", diff, flags=re.MULTILINE)
    for start, body in zip(hunks[1::2], hunks[2::2], strict=True):
        first = int(start) - 1
        out += lines[at:first]
        at = first
        for line in body.splitlines(keepends=True):
            if line[0] in " -":
                assert lines[at] == line[1:], (lines[at], line)
                at += 1
            if line[0] in " +":
                out.append(line[1:])
    return "".join(out + lines[at:])


def _patched(document: Any, diff: str) -> Any:
    """The recipe, as the build writes it (``recipe.load.resolved_yaml``), with the diff applied."""
    text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)
    return yaml.safe_load(_applied(text, diff))


@st.composite
def _diffed_source(draw: st.DrawFn) -> tuple[dict[str, Any] | None, int, int, int]:
    """A source's take (none, a count, a fraction; a seed or not), rows kept and dropped, and its target rows:
    the counts and targets drawn near their edges (a count of the rows read, a change of one row, a target of 0
    or 1) as often as anywhere."""
    kept, dropped = draw(st.integers(1, 300)), draw(st.integers(0, 50))
    seed = draw(st.sampled_from([{}, {"seed": 7}]))
    take = draw(st.one_of(
        st.none(),
        st.builds(lambda count, spare: {"count": count, **seed, **spare}, st.one_of(
            st.integers(1, 400), st.sampled_from([kept + dropped - 1, kept + dropped, kept + dropped + 1]).filter(
                lambda count: count >= 1)), st.sampled_from([{}, {"fraction": None}])),  # a count's fraction gives way
        st.builds(lambda share: {"fraction": share / 20, **seed}, st.integers(1, 20))))
    target = draw(st.one_of(st.integers(0, 400), st.sampled_from([0, 1, kept - 1, kept, kept + 1])))
    return take, kept, dropped, max(target, 0)


# Non-ASCII and a long line, so that the diff is of the recipe as the build writes it (recipe.load.resolved_yaml).
LONG_LINE = " ".join(f"word{i}" for i in range(29))


@given(sources=st.lists(_diffed_source(), min_size=1, max_size=4), ledger=st.booleans())
# a source asked for more than it has, whose take is all of it already: nothing to change, no diff (not an empty one)
@example(sources=[({"fraction": 1.0, "seed": 7}, 37, 44, 177)], ledger=False)
@fuzz_settings(80)
def test_the_recipe_diff_sets_each_take_to_give_the_target_rows(
        sources: list[tuple[dict[str, Any] | None, int, int, int]], ledger: bool) -> None:
    """A count is the target scaled by rows read over rows kept (the ledger's drops; none without a ledger), a
    fraction the target over rows kept (at most 1), a target of 0 removes the source; the seed is kept (0 when
    none)."""
    specs = [{"name": f"s{i}", "kind": "replay", "note": f"récit {LONG_LINE}", **({"take": take} if take else {})}
             for i, (take, _, _, _) in enumerate(sources)]
    document = {"name": "traffic", "sources": specs}
    drops = DropCounts()
    for i, (_, _, dropped, _) in enumerate(sources):
        for _ in range(dropped):
            drops.add(f"s{i}", "duplicate")
    plan = [{"source": f"s{i}", "task": "chat", "rows": kept, "target_rows": target, "change": target - kept}
            for i, (_, kept, _, target) in enumerate(sources)]
    original = copy.deepcopy(document)
    diff, notes = _recipe_diff(cast(CorpusFiles, _Files(document, has_ledger=ledger, drops=drops)), plan)
    assert document == original  # the corpus's recipe itself untouched
    remaining = [(spec, entry, dropped) for spec, entry, (_, _, dropped, _) in zip(specs, plan, sources, strict=True)
                 if entry["target_rows"] or not entry["change"]]
    if all(not entry["change"] for entry in plan) or not remaining:
        assert diff is None
        return
    # no diff only when no take changes (checked below, take by take)
    assert diff is None or diff.startswith("--- recipe.yaml\n+++ recipe.yaml (matched to the traffic)\n")
    edited = {spec["name"]: spec for spec in (document if diff is None else _patched(document, diff))["sources"]}
    assert list(edited) == [spec["name"] for spec, _, _ in remaining]
    expected_notes = []
    for spec, entry, dropped in remaining:
        take = spec.get("take") or {}
        if not entry["change"]:
            assert edited[spec["name"]] == spec
            continue
        kept, target = entry["rows"], entry["target_rows"]
        read = kept + (dropped if ledger else 0)
        if take.get("fraction") is not None:
            assert edited[spec["name"]]["take"] == {"fraction": round(min(1.0, take["fraction"] * target / kept), 6),
                                                    "seed": take.get("seed", 0)}
        else:
            assert edited[spec["name"]]["take"] == {"count": math.ceil(target * read / kept),
                                                    "seed": take.get("seed", 0)}
        whole = ("count" not in take and take.get("fraction", 1) >= 1) or read < take.get("count", 0)
        if entry["change"] > 0 and whole:
            expected_notes.append(f"source {spec['name']}: all {read:,} of its rows are read already: find "
                                  f"{entry['change']:,} more rows of task chat (or a prompts source to generate them)")
    assert notes == expected_notes


def test_a_count_of_exactly_the_rows_read_is_not_all_of_the_source() -> None:
    """Rows read (10 kept, 2 dropped) equal to the count asked: the source may have more; fewer read than asked:
    every row is read already, and the note says so."""
    plan = [{"source": "s", "task": "chat", "rows": 10, "target_rows": 20, "change": 10}]
    drops = DropCounts()
    drops.add("s", "duplicate")
    drops.add("s", "empty_turn")
    for count, whole in ((12, False), (13, True)):
        files = _Files({"sources": [{"name": "s", "take": {"count": count}}]}, drops=drops)
        diff, notes = _recipe_diff(cast(CorpusFiles, files), plan)
        assert notes == (["source s: all 12 of its rows are read already: find 10 more rows of task chat (or a "
                          "prompts source to generate them)"] if whole else [])
        assert diff is not None and _patched(files.recipe, diff)["sources"][0]["take"] == {"count": 24, "seed": 0}


def test_a_recipe_diff_needs_a_recipe_and_a_plan() -> None:
    plan = [{"source": "s", "task": "chat", "rows": 10, "target_rows": 20, "change": 10}]
    for recipe in (None, ["not", "a", "mapping"], "text"):
        assert _recipe_diff(cast(CorpusFiles, _Files(recipe)), plan) == (None, [])
    assert _recipe_diff(cast(CorpusFiles, _Files({"sources": [{"name": "s"}]})), []) == (None, [])
    assert _recipe_diff(cast(CorpusFiles, _Files({"name": "no sources"})), plan) == (None, [])
    # A plan entry of a source the recipe does not list (or lists without a name) changes nothing.
    assert _recipe_diff(cast(CorpusFiles, _Files({"sources": [{"name": "t"}, "odd"]})), plan) == (None, [])


def _patched_file(corpus: Path, diff: str) -> Any:
    """The corpus's recipe.yaml, as written, with the diff applied."""
    return yaml.safe_load(_applied((corpus / "recipe.yaml").read_text(encoding="utf-8"), diff))


def _planned(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["source"]: entry for entry in report["plan"]}


# --- suggestions past the recipe ------------------------------------------------------------------------


def _report(gaps: list[float], *, p99: int = 100, copy_share: float = 0.0) -> dict[str, Any]:
    divergence = {measure: {"tvd": 0.1, "gaps": [{"bucket": f"b{i}", "corpus": 0.5, "traffic": 0.5 + gap, "gap": gap}
                                                 for i, gap in enumerate(gaps)]}
                  for measure in ("conversation_tokens", "prompt_tokens", "response_tokens")}
    traffic = {"lengths": {"conversation_tokens": {"p99": p99}},
               "copies": {"span_tokens": 8, "by_task": {"chat": {"share": copy_share, "longest": 40}}}}
    return {"corpus": {"conversations": 200}, "traffic": traffic, "divergence": divergence}


def test_length_gaps_of_5_percent_or_more_are_suggested_both_ways() -> None:
    files = cast(CorpusFiles, _Files({"checks": {"max_seq_len": 100}}))
    notes = _token_suggestions(_report([0.05, -0.05, 0.049999, -0.049999, 0.0]), files)
    for measure in ("conversation tokens", "prompt tokens"):  # not the response lengths: a recipe cannot say
        assert f"{measure} b0: traffic 55.0%, corpus 50.0%: add about 10 such rows" in notes
        assert f"{measure} b1: traffic 45.0%, corpus 50.0%: about 10 such rows more than the traffic has" in notes
    assert len(notes) == 4


def test_traffic_past_max_seq_len_and_copy_heavy_tasks_are_suggested_from_their_edges() -> None:
    files = cast(CorpusFiles, _Files({"checks": {"max_seq_len": 100}}))
    assert _token_suggestions(_report([], p99=100, copy_share=0.299999), files) == []
    notes = _token_suggestions(_report([], p99=101, copy_share=0.30), files)
    assert notes == [
        "1% of the traffic's conversations are longer than 101 tokens, past checks.max_seq_len 100: the draft "
        "never trains on that length",
        "task chat: 30% of the traffic's response tokens lie in spans of 8+ tokens copied from the prompt (longest "
        "40): prompt-lookup (n-gram) speculation suits it better than a learned draft; consider serving it that way "
        "and giving the draft's corpus to the rest"]
    for recipe in (None, {"checks": None}, {"checks": {}}):  # no budget: nothing to say about it
        assert _token_suggestions(_report([], p99=10_000), cast(CorpusFiles, _Files(recipe))) == []


def test_the_vocabulary_suggestion_names_its_coverage() -> None:
    report = _report([])
    report["vocab"] = {"draft_vocab_size": 2000, "traffic_coverage": 0.9, "traffic_outside": 0.1,
                       "traffic_oracle_coverage": 0.95}
    files = cast(CorpusFiles, _Files(None))
    assert _token_suggestions(report, files) == [
        "the top 2,000 draft vocabulary chosen from the corpus covers 90.0% of the traffic's supervised tokens "
        "(10.0% fall outside; the traffic's own top 2,000 would cover 95.0%)"]
    report["vocab"]["traffic_outside"] = None  # traffic without supervised tokens
    assert _token_suggestions(report, files) == []


# --- the draft vocabulary's coverage ----------------------------------------------------------------------


def test_coverage_points_are_the_standard_ones_below_the_vocabulary_and_the_draft_size() -> None:
    assert _points(50_000, 32_000) == [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 50_000]
    assert _points(5_000, 3_000) == [1_000, 2_000, 3_000, 4_000, 5_000]
    assert _points(4_000, 32_000) == [1_000, 2_000, 4_000]  # a draft past the vocabulary is all of it
    assert _points(10, 4) == [4, 10]
    assert _points(COVERAGE_POINTS[-1] * 2, 100) == [100, *COVERAGE_POINTS, COVERAGE_POINTS[-1] * 2]


def test_the_vocabulary_coverage_is_of_the_corpus_top_k_on_the_traffic() -> None:
    corpus = np.array([0, 5, 3, 3, 0, 1], dtype=np.int64)  # top ids: 1, 2, 3 (ties to the lower id), 5
    traffic = np.array([4, 2, 0, 1, 0, 2], dtype=np.int64)  # top ids: 0, 1, 5; thirds and ninths (6 digits kept)
    vocab = _vocab(corpus, traffic, 3)
    assert vocab == {
        "draft_vocab_size": 3, "target_vocab_size": 6,
        "traffic_coverage": round(3 / 9, 6), "traffic_outside": round(6 / 9, 6),
        "traffic_oracle_coverage": round(8 / 9, 6), "corpus_coverage": round(11 / 12, 6),
        "traffic_tokens_unseen_in_corpus": round(4 / 9, 6),
        "curve": [{"k": 3, "corpus": round(11 / 12, 6), "traffic": round(3 / 9, 6), "traffic_own": round(8 / 9, 6)},
                  {"k": 6, "corpus": 1.0, "traffic": 1.0, "traffic_own": 1.0}]}
    assert _vocab(corpus, np.zeros(6, dtype=np.int64), 3)["traffic_coverage"] is None
    nothing = _vocab(np.zeros(6, dtype=np.int64), traffic, 3)
    assert nothing["corpus_coverage"] is None and nothing["curve"][0]["corpus"] is None
    assert nothing["traffic_tokens_unseen_in_corpus"] == 1.0 and nothing["traffic_coverage"] == round(6 / 9, 6)
    assert _vocab_alone(corpus, 3) == {"draft_vocab_size": 3, "target_vocab_size": 6, "curve": [
        {"k": 3, "corpus": round(11 / 12, 6)}, {"k": 6, "corpus": 1.0}]}
    assert _vocab_alone(corpus, 10)["draft_vocab_size"] == 6


@given(counts=st.lists(st.integers(0, 30), min_size=2, max_size=40), draft=st.integers(1, 60))
@fuzz_settings(100)
def test_the_coverage_curve_rises_to_all_of_the_tokens(counts: list[int], draft: int) -> None:
    curve = _vocab_alone(np.array(counts, dtype=np.int64), draft)["curve"]
    ks = [point["k"] for point in curve]
    assert ks == sorted(set(ks)) and ks[-1] == len(counts) and min(draft, len(counts)) in ks
    ordered = sorted(counts, reverse=True)
    for point in curve:
        assert point["corpus"] == (round(sum(ordered[:point["k"]]) / sum(counts), 6) if sum(counts) else None)


# --- the comparison as a whole ----------------------------------------------------------------------------


def _profile(path: Path, rows: list[dict[str, Any]], meter: TokenMeter | None = None) -> Profile:
    write_jsonl(path, rows)
    return read_profile(str(path), traffic_units(str(path)), meter, token_sample=0)


@pytest.mark.parametrize("measured", [False, True])
def test_compare_puts_the_sides_their_divergences_and_the_plan_together(tmp_path: Path, tiny_model_dir: Path,
                                                                        measured: bool) -> None:
    """``compare`` on two profiles read from files (no build): what it reports, from the parts it is made of."""
    meter = TokenMeter(TemplateRenderer(tiny_model_dir)) if measured else None
    mine = _profile(tmp_path / "mine.jsonl", [chat_row(i, thinking=False) for i in range(30)]
                    + [summary_row(i, thinking=True) for i in range(10)], meter)
    theirs = _profile(tmp_path / "theirs.jsonl", mixed_traffic(), meter)
    files = cast(CorpusFiles, _Files(None))
    report = compare(files, mine, theirs, AuditOptions(draft_vocab_size=100), meter)
    assert set(report) == {"corpus", "traffic", "readable", "divergence", "notes" if not measured else "vocab",
                           "tokenizer", "max_divergence", "plan", "recipe_diff", "suggestions"}
    corpus_side, traffic_side = report["corpus"], report["traffic"]
    assert (corpus_side["conversations"], traffic_side["conversations"]) == (40, 100)
    expected = [*FACT_DIMENSIONS, *(TOKEN_DIMENSIONS if measured else ())]
    assert list(report["divergence"]) == expected
    for name in expected[:-1] if measured else expected:
        assert report["divergence"][name] == _divergence(corpus_side["shares"][name], traffic_side["shares"][name])
    if measured:
        assert report["divergence"]["token_frequencies"] == {"tvd": _frequency_tvd(
            mine.tokens.frequencies, theirs.tokens.frequencies), "gaps": []}  # type: ignore[union-attr]
        assert report["vocab"] == _vocab(mine.tokens.frequencies, theirs.tokens.frequencies, 100)  # type: ignore
        assert report["tokenizer"] == str(meter.renderer.tokenizer_dir)  # type: ignore[union-attr]
    else:
        assert report["tokenizer"] is None and report["notes"] == [
            "token dimensions left out: no target tokenizer found for the corpus (give --tokenizer DIR)"]
    worst = max(report["divergence"], key=lambda name: report["divergence"][name]["tvd"])
    assert report["max_divergence"] == {"dimension": worst, "tvd": report["divergence"][worst]["tvd"]}
    plan, notes = _plan(corpus_side, traffic_side)
    assert report["plan"] == plan and report["recipe_diff"] is None  # no recipe to edit
    assert report["suggestions"] == notes + _token_suggestions(report, files)
    recipe = _Files({"sources": [{"name": name} for name in corpus_side["by_source"]]})
    edited = compare(cast(CorpusFiles, recipe), mine, theirs, AuditOptions(draft_vocab_size=100), meter)
    assert edited["recipe_diff"] is not None and edited["recipe_diff"] == _recipe_diff(cast(CorpusFiles, recipe),
                                                                                       plan)[0]
    # Partial traffic: said first; traffic naming no task: no task dimensions, and said.
    task_note = ("task mix left out: the traffic's rows name no task (a `task` field, or --against a recipe whose "
                 "sources carry task tags)")
    untasked = _profile(tmp_path / "untasked.jsonl", [{"messages": row["messages"]} for row in mixed_traffic()],
                        meter)
    if measured:
        alone = compare(files, mine, untasked, AuditOptions(), meter)
        assert alone["notes"] == [task_note] and not {"task", "task_thinking"} & set(alone["divergence"])
        return
    untasked.skipped["invalid_json"] += 10
    partial = compare(files, mine, untasked, AuditOptions(), None)
    note = ("10 of the traffic's 110 rows (9.1%) were skipped, more than --max-skipped-share 0.05: every figure "
            "describes the 100 readable rows only")
    assert partial["readable"]["partial"] and partial["readable"]["note"] == note
    assert partial["notes"] == [note, "token dimensions left out: no target tokenizer found for the corpus (give "
                                "--tokenizer DIR)", task_note]
    assert "task" not in partial["divergence"] and "task_thinking" not in partial["divergence"]
    # A corpus without a row: nothing to compare, no worst dimension.
    empty = compare(files, read_profile("empty", [], None, token_sample=0), untasked, AuditOptions(), None)
    assert empty["divergence"] == {} and empty["max_divergence"] is None and task_note in empty["notes"]


def test_a_side_measured_against_one_not_measured_compares_no_tokens(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Token figures need both sides' tokens: with one side's only, the facts are compared and the tokens left out."""
    meter = TokenMeter(TemplateRenderer(tiny_model_dir))
    rows = [chat_row(i, thinking=False) for i in range(30)] + [summary_row(i, thinking=True) for i in range(10)]
    for corpus_measured in (True, False):
        mine = _profile(tmp_path / "mine.jsonl", rows, meter if corpus_measured else None)
        theirs = _profile(tmp_path / "theirs.jsonl", mixed_traffic(), None if corpus_measured else meter)
        report = compare(cast(CorpusFiles, _Files(None)), mine, theirs, AuditOptions(draft_vocab_size=100), meter)
        assert list(report["divergence"]) == list(FACT_DIMENSIONS) and "vocab" not in report
