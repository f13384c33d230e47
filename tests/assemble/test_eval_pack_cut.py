"""The eval pack's cut on its own, without building a corpus: how many rows each stratum holds (largest remainders,
ties to the stratum first by source, task, then without thinking before with it), which rows (the lowest draws on
their ids, copies sharing a draw), what it writes, indexes and records. Every figure here is worked out by hand
from the draws, so a slip in the cut shows as a wrong count or a wrong row, not only as a broken order."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from corpus_builder.assemble.eval_pack import EvalPack, PackCut, PackStage, cut_eval_pack, plan_cut, read_pack_screen
from corpus_builder.assemble.plan import Plan
from corpus_builder.draws import pack_priority
from corpus_builder.layout import EVAL
from corpus_builder.recipe import load_recipe
from corpus_builder.recipe.model import PackShare, Recipe
from corpus_builder.records import Conversation, Message
from corpus_builder.rows import batch_to_conversations


def rows(source: str, task: str | None, thinking: bool, count: int, start: int = 0) -> list[Conversation]:
    answer = Message("assistant", "an answer", reasoning="a thought" if thinking else None)
    return [Conversation(f"{source}-{task}-{thinking}-{i}", source, "replay", [Message("user", f"q {i}"), answer],
                         task=task) for i in range(start, start + count)]


def cut_pack(recipe: Recipe, staging: Path, progress: io.StringIO) -> EvalPack:
    """The recipe's pack cut as a build cuts it: from its plan's stage and replay parts."""
    plan = Plan.of(recipe, None)
    assert plan.pack is not None
    return cut_eval_pack(plan.pack, plan.read.parts, plan.write.rows_per_shard, staging, progress)


def lowest(conversations: list[Conversation], count: int, seed: int = 0) -> set[str]:
    """The ids of the ``count`` rows with the lowest draws."""
    return {row.id for row in sorted(conversations, key=lambda row: pack_priority(seed, row.id))[:count]}


def test_the_cut_holds_the_lowest_draws_of_each_stratum_in_proportion() -> None:
    plain, thinking = rows("a", "t", False, 6), rows("a", "t", True, 4)
    cut = plan_cut({"a": PackShare(rows=5)}, 0, iter(plain + thinking))
    # 5 of 10: 3 of the 6 plain rows, 2 of the 4 with reasoning
    assert cut.strata == {("a", "t", False): (6, 3), ("a", "t", True): (4, 2)}
    held = {row.id for row in plain + thinking if cut.holds(row)}
    assert held == lowest(plain, 3) | lowest(thinking, 2)
    assert cut.cutoffs[("a", "t", False)] == max(pack_priority(0, row_id) for row_id in lowest(plain, 3))
    assert cut.seed == 0


def test_a_tie_in_the_remainders_goes_to_the_stratum_first_in_order() -> None:
    """Two rows from three equal strata: the remainders tie, and the first strata by (task, thinking) take them,
    however the rows came."""
    strata = [rows("a", "z", True, 2), rows("a", "y", True, 2), rows("a", "y", False, 2)]
    cut = plan_cut({"a": PackShare(rows=2)}, 0, iter([row for part in strata for row in part]))
    assert cut.strata == {("a", "y", False): (2, 1), ("a", "y", True): (2, 1), ("a", "z", True): (2, 0)}
    assert ("a", "z", True) not in cut.cutoffs
    no_task = plan_cut({"a": PackShare(rows=1)}, 0,
                       iter(rows("a", "Alpha", False, 2) + rows("a", None, True, 2)))
    assert no_task.strata == {("a", None, True): (2, 1), ("a", "Alpha", False): (2, 0)}  # no task sorts first


def test_each_source_is_cut_on_its_own_share_and_sources_without_one_are_left_whole() -> None:
    a, b, c = rows("a", None, False, 10), rows("b", None, True, 7), rows("c", None, False, 3)
    cut = plan_cut({"a": PackShare(fraction=0.25), "b": PackShare(rows=9)}, 5, iter(a + b + c))
    assert cut.strata == {("a", None, False): (10, 3), ("b", None, True): (7, 7)}  # 2.5 rounds half up; b all
    assert {row.id for row in a + b + c if cut.holds(row)} == lowest(a, 3, seed=5) | {row.id for row in b}
    assert not any(cut.holds(row) for row in c)
    other_seed = plan_cut({"a": PackShare(fraction=0.25)}, 6, iter(a))
    assert {row.id for row in a if other_seed.holds(row)} == lowest(a, 3, seed=6)


def test_a_share_of_no_row_holds_nothing() -> None:
    a = rows("a", None, False, 4)
    cut = plan_cut({"a": PackShare(fraction=0.1)}, 0, iter(a))
    assert cut.strata == {("a", None, False): (4, 0)} and cut.cutoffs == {} and not any(map(cut.holds, a))


def test_copies_share_a_draw_so_a_stratum_may_hold_more_than_its_quota() -> None:
    a = rows("a", None, False, 3)
    copies = [*a, a[0], a[0]]
    cut = plan_cut({"a": PackShare(rows=1)}, 0, iter(copies))
    first = min(a, key=lambda row: pack_priority(0, row.id))
    assert cut.strata == {("a", None, False): (5, 1)}
    assert sum(map(cut.holds, copies)) == 1 + 2 * (first is a[0])


def write_source(path: Path, count: int, *, thinking_every: int = 2, prefix: str = "", broken: int = 0) -> None:
    """``count`` answered questions (every ``thinking_every``-th with reasoning), then ``broken`` lines that are
    not JSON."""
    lines = [b"{not json"] * broken
    for i in range(count):
        answer: dict[str, Any] = {"role": "assistant", "content": f"answer {i}"}
        if i % thinking_every == 0:
            answer["reasoning_content"] = f"thought {i}"
        lines.append(orjson.dumps({"messages": [{"role": "user", "content": f"{prefix}question {i}"}, answer]}))
    path.write_bytes(b"\n".join(lines) + b"\n")


@pytest.fixture
def two_sources(tmp_path: Path) -> Recipe:
    write_source(tmp_path / "chat.jsonl", 10, broken=2)  # rows a source skips are in no stratum
    write_source(tmp_path / "code.jsonl", 6, thinking_every=3, prefix="code ")
    write_source(tmp_path / "other.jsonl", 2, prefix="other ")
    (tmp_path / "recipe.yaml").write_text("""\
name: cut
target: {model: m}
sources:
  - {name: chat, kind: replay, path: chat.jsonl, task: chat, eval: {rows: 4}}
  - {name: code, kind: replay, path: code.jsonl, task: code, eval: {fraction: 0.5}}
  - {name: other, kind: replay, path: other.jsonl}
eval: {rows: 0, seed: 2}
output: {dir: out, rows_per_shard: 3}
""")
    return load_recipe(tmp_path / "recipe.yaml")


def test_the_cut_writes_the_rows_it_holds_indexes_them_and_records_each_stratum(two_sources: Recipe,
                                                                               tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    progress = io.StringIO()
    pack = cut_pack(two_sources, staging, progress)
    assert isinstance(pack, EvalPack)
    written = [row for info in pack.files for row in batch_to_conversations(pq.read_table(staging / info.path)
                                                                            .to_batches()[0])]
    # chat: 4 of 10 (5 with reasoning, 5 without: 2 and 2); code: 3 of 6 (2 with reasoning: 1; 4 without: 2)
    assert [(info.path.split("/")[0], info.split, info.rows) for info in pack.files] == [
        (EVAL, EVAL, 3), (EVAL, EVAL, 3), (EVAL, EVAL, 1)]
    assert {row.split for row in written} == {EVAL} and len({row.id for row in written}) == 7
    assert pack.cut.strata == {("chat", "chat", False): (5, 2), ("chat", "chat", True): (5, 2),
                               ("code", "code", False): (4, 2), ("code", "code", True): (2, 1)}  # other: no share
    assert all(pack.cut.holds(row) for row in written)
    described = pack.describe()
    assert described == {
        "seed": 2, "conversations": 7, "files": [info.to_dict() for info in pack.files],
        "sources": {
            "chat": {"rows": 4, "fraction": None, "read": 10, "held": 4, "strata": [
                {"task": "chat", "thinking": False, "read": 5, "held": 2},
                {"task": "chat", "thinking": True, "read": 5, "held": 2}]},
            "code": {"rows": None, "fraction": 0.5, "read": 6, "held": 3, "strata": [
                {"task": "code", "thinking": False, "read": 4, "held": 2},
                {"task": "code", "thinking": True, "read": 2, "held": 1}]}}}
    # the index knows every row held, and a process that did not cut the pack indexes the same from the shards
    shards = [staging / info.path for info in pack.files]
    for screen in (pack.screen, read_pack_screen(two_sources.checks, pack.cut, shards)):
        found = screen.copies(screen.signatures(written))
        assert [detail is not None and detail.startswith("copy of eval pack row ") for detail in found] == [True] * 7
        assert all(map(screen.holds, written)) and not any(map(screen.holds, rows("chat", "chat", True, 3, 50)))
    draw, write = progress.getvalue().splitlines()  # every row of the replay sources, read twice
    assert draw.startswith("eval pack: draw 20 rows | ") and write.startswith("eval pack: write 20 rows | ")


def test_a_cut_that_holds_no_row_writes_no_directory(two_sources: Recipe, tmp_path: Path) -> None:
    text = (tmp_path / "recipe.yaml").read_text().replace("eval: {rows: 4}", "eval: {rows: 0}").replace(
        "eval: {fraction: 0.5}", "eval: {fraction: 0.01}")
    (tmp_path / "recipe.yaml").write_text(text)
    pack = cut_pack(load_recipe(tmp_path / "recipe.yaml"), tmp_path / "staging", io.StringIO())
    assert pack.files == [] and pack.describe()["conversations"] == 0
    assert not (tmp_path / "staging" / EVAL).exists()
    assert pack.cut.strata[("code", "code", False)] == (4, 0)


def test_a_recipe_without_a_pack_plans_no_cut_and_a_share_without_an_eval_section_draws_with_seed_0(
        tmp_path: Path) -> None:
    write_source(tmp_path / "chat.jsonl", 3)
    (tmp_path / "recipe.yaml").write_text("name: cut\ntarget: {model: m}\nsources:\n"
                                          "  - {name: chat, kind: replay, path: chat.jsonl}\noutput: {dir: out}\n")
    assert Plan.of(load_recipe(tmp_path / "recipe.yaml"), None).pack is None
    (tmp_path / "recipe.yaml").write_text("name: cut\ntarget: {model: m}\nsources:\n"
                                          "  - {name: chat, kind: replay, path: chat.jsonl, eval: {rows: 1}}\n"
                                          "output: {dir: out}\n")
    stage = PackStage.of(load_recipe(tmp_path / "recipe.yaml"))
    assert stage is not None and stage.seed == 0 and stage.shares == {"chat": PackShare(rows=1)}


def test_a_failed_write_leaves_no_shard(two_sources: Recipe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from corpus_builder.screen.pack import PackScreen

    def failing(self: PackScreen, rows: list[Conversation]) -> None:
        raise OSError("the index failed")

    monkeypatch.setattr(PackScreen, "add", failing)
    staging = tmp_path / "staging"
    with pytest.raises(OSError, match="the index failed"):
        cut_pack(two_sources, staging, io.StringIO())
    assert not list(staging.rglob("*.parquet"))


def test_the_cut_holds_only_by_its_cutoffs() -> None:
    a = rows("a", None, False, 4)
    draws = sorted(pack_priority(3, row.id) for row in a)
    cut = PackCut(3, {("a", None, False): draws[1]}, {("a", None, False): (4, 2)})
    assert sum(map(cut.holds, a)) == 2
    assert not any(map(PackCut(3, {}, {}).holds, a))


def test_the_strata_are_described_in_order_whatever_their_tasks() -> None:
    a = rows("a", "named", True, 2) + rows("a", None, False, 2)
    cut = plan_cut({"a": PackShare(rows=2)}, 0, iter(a))
    pack = EvalPack(cut, None, [], {"a": PackShare(rows=2)})  # type: ignore[arg-type]
    assert [(entry["task"], entry["thinking"]) for entry in pack.describe()["sources"]["a"]["strata"]] == [
        (None, False), ("named", True)]


def test_a_pack_of_more_rows_than_one_index_batch_holds_exactly_its_share(tmp_path: Path) -> None:
    write_source(tmp_path / "big.jsonl", 2300, thinking_every=1)
    (tmp_path / "recipe.yaml").write_text("name: big\ntarget: {model: m}\nsources:\n"
                                          "  - {name: big, kind: replay, path: big.jsonl, eval: {rows: 1100}}\n"
                                          "output: {dir: out, rows_per_shard: 5000}\n")
    big = load_recipe(tmp_path / "recipe.yaml")
    pack = cut_pack(big, tmp_path / "staging", io.StringIO())
    assert [info.rows for info in pack.files] == [1100]
    written = batch_to_conversations(pq.read_table(tmp_path / "staging" / pack.files[0].path).to_batches()[0])
    from corpus_builder.sources import iter_file

    every = [row for row in iter_file(tmp_path / "big.jsonl", source="big") if isinstance(row, Conversation)]
    assert {row.id for row in written} == lowest(every, 1100)
    found = pack.screen.copies(pack.screen.signatures(written[-3:]))  # the last batch indexed too
    assert all(detail is not None for detail in found)


def test_the_cutoff_is_exactly_the_quota_th_lowest_draw() -> None:
    """A stratum large enough that numpy's partition leaves other draws than the quota-th lowest just past the
    position it places (found by search: 500 rows, seed 1, 352 held)."""
    a = rows("a", None, True, 500)
    cut = plan_cut({"a": PackShare(rows=352)}, 1, iter(a))
    assert {row.id for row in a if cut.holds(row)} == lowest(a, 352, seed=1)
    assert cut.cutoffs[("a", None, True)] == sorted(pack_priority(1, row.id) for row in a)[351]
