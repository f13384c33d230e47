"""The eval pack a recipe holds out: cut from the replay sources before the checks, dedup, the mixture and the
split, stratified by source, task and thinking, seeded; never in train or validation, and no training row a
copy or a near copy of one of its rows; recorded in the manifest, the audit and the card, read by `corpus eval`."""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corpus_builder.assemble import build_corpus
from corpus_builder.assemble.eval_pack import plan_cut
from corpus_builder.audit import audit_corpus, format_report
from corpus_builder.eval import read_pack
from corpus_builder.layout import EVAL, Corpus, iter_ledger
from corpus_builder.publish.card import render_card
from corpus_builder.publish.gate import CorpusDocuments, check_corpus
from corpus_builder.recipe import load_recipe
from corpus_builder.recipe.model import PackShare
from corpus_builder.records import Conversation, Message
from corpus_builder.screen.pack import EVAL_PACK_COPY
from tests.support.real_data import write_rows

WORDS = ["river", "mountain", "lantern", "copper", "meadow", "violet", "harbor", "engine", "pencil", "thunder",
         "garden", "silver", "window", "falcon", "marble", "orchard", "canyon", "ribbon", "tunnel", "glacier"]


def prose(seed: int, words: int = 60) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randrange(50)) for _ in range(words))


def chat(user: str, answer: str, reasoning: str | None = None) -> dict[str, Any]:
    turn: dict[str, Any] = {"role": "assistant", "content": answer}
    if reasoning is not None:
        turn["reasoning_content"] = reasoning
    return {"messages": [{"role": "user", "content": user}, turn]}


def write_recipe(root: Path, body: str, sources: str) -> Path:
    (root / "recipe.yaml").write_text(f"""\
name: pack
target: {{model: tiny/target}}
sources:
{sources}
{body}
split: {{validation_fraction: 0.2}}
output: {{dir: out}}
""", encoding="utf-8")
    return root / "recipe.yaml"


def write_traffic(root: Path) -> None:
    """chat: 60 rows with reasoning, 40 without; code: 50 rows, 10 with reasoning."""
    write_rows(root / "chat.jsonl", [chat(f"chat question {i}: " + prose(i), f"answer {i}",
                                          f"thinking {i}" if i < 60 else None) for i in range(100)])
    write_rows(root / "code.jsonl", [chat(f"code question {i}: " + prose(1000 + i), f"code {i}",
                                          f"plan {i}" if i < 10 else None) for i in range(50)])


SOURCES = """\
  - {name: chat, kind: replay, path: chat.jsonl, task: chat}
  - {name: code, kind: replay, path: code.jsonl, task: code, eval: {fraction: 0.2}}"""


def build(recipe: Path) -> Corpus:
    build_corpus(load_recipe(recipe), progress=io.StringIO())
    return Corpus.open(recipe.parent / "out")


@pytest.fixture()
def packed(tmp_path: Path) -> Corpus:
    write_traffic(tmp_path)
    return build(write_recipe(tmp_path, "eval: {rows: 10, seed: 3}", SOURCES))


def test_each_source_gives_its_share_stratified_by_task_and_thinking(packed: Corpus) -> None:
    pack = list(packed.pack_conversations())
    strata = Counter((row.source, row.thinking) for row in pack)
    # chat: 10 of 100 rows, 6 of its 60 with reasoning and 4 of its 40 without; code: 20% of 50, 2 of 10 and 8 of 40
    assert strata == {("chat", True): 6, ("chat", False): 4, ("code", True): 2, ("code", False): 8}
    assert {row.split for row in pack} == {EVAL}
    section = packed.manifest.section("eval")
    assert section["conversations"] == 20 and section["seed"] == 3
    assert {name: (entry["read"], entry["held"]) for name, entry in section["sources"].items()} == {
        "chat": (100, 10), "code": (50, 10)}
    assert section["sources"]["code"]["fraction"] == 0.2 and section["sources"]["chat"]["rows"] == 10


def test_pack_rows_are_in_neither_split_and_the_corpus_keeps_every_other_row(packed: Corpus) -> None:
    corpus_ids = {row.id for row in packed.iter_conversations()}
    pack_ids = {row.id for row in packed.pack_conversations()}
    assert len(pack_ids) == 20 and not corpus_ids & pack_ids
    assert len(corpus_ids) == packed.manifest.conversations == 150 - 20
    assert {split for split in packed.manifest.splits} == {"train", "validation"}
    assert not any(record["reason"] == EVAL_PACK_COPY for record in iter_ledger(packed.root / "ledger.jsonl.zst"))
    assert packed.verify_files() == []


def test_the_cut_is_seeded_and_the_same_on_a_rebuild_and_with_several_workers(tmp_path: Path) -> None:
    write_traffic(tmp_path)
    recipe = write_recipe(tmp_path, "eval: {rows: 10, seed: 3}", SOURCES)
    first = {row.id for row in build(recipe).pack_conversations()}
    shard = (tmp_path / "out" / EVAL).glob("*.parquet").__next__().read_bytes()
    again = build(recipe)
    assert {row.id for row in again.pack_conversations()} == first
    assert next((tmp_path / "out" / EVAL).glob("*.parquet")).read_bytes() == shard
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe), "--out",
                                str(tmp_path / "two")], capture_output=True, text=True,
                               env={**os.environ, "CORPUS_WORKERS": "2"})
    assert completed.returncode == 0, completed.stderr
    assert {row.id for row in Corpus.open(tmp_path / "two").pack_conversations()} == first
    other = build(write_recipe(tmp_path, "eval: {rows: 10, seed: 4}", SOURCES))
    assert {row.id for row in other.pack_conversations()} != first


def test_copies_and_near_copies_of_pack_rows_are_dropped_whatever_the_dedup(tmp_path: Path) -> None:
    held = [prose(7, 200), prose(8, 200)]
    write_rows(tmp_path / "small.jsonl", [chat("Summarise: " + text, "Done.") for text in held])
    near = held[1].split()
    near[3] = "edited"
    write_rows(tmp_path / "big.jsonl", [
        chat("SUMMARISE:   " + held[0].upper(), "Done!"),  # the same normalised text
        chat("Summarise: " + " ".join(near), "Done."),  # one word in sixty changed
        chat("Summarise: " + prose(9), "Done."),  # another text
    ])
    recipe = write_recipe(tmp_path, "checks: {dedup: none}\neval: {rows: 0}", """\
  - {name: small, kind: replay, path: small.jsonl, eval: {rows: 2}}
  - {name: big, kind: replay, path: big.jsonl}""")
    corpus = build(recipe)
    assert [row.messages[0].content for row in corpus.iter_conversations()] == ["Summarise: " + prose(9)]
    copies = [record for record in iter_ledger(corpus.root / "ledger.jsonl.zst") if record["reason"] == EVAL_PACK_COPY]
    pack_ids = {row.id for row in corpus.pack_conversations()}
    assert len(copies) == 2 and {record["source"] for record in copies} == {"big"}
    assert sorted(record["detail"].split(" of ")[0] for record in copies) == ["copy", "near copy"]
    assert all(record["detail"].split("eval pack row ")[1].split(" ")[0] in pack_ids for record in copies)
    report = audit_corpus(corpus.root)
    assert report["skipped"][EVAL_PACK_COPY] == 2
    assert "eval_pack_copy" in format_report(report)


def test_the_audit_shows_the_pack_mix_beside_the_corpus_and_agrees_with_the_build(packed: Corpus) -> None:
    report = audit_corpus(packed.root)
    mix = report["eval_pack"]
    assert mix == packed.audit()["eval_pack"]
    assert mix["conversations"] == 20 and mix["thinking_conversations"] == 8
    assert mix["by_source"]["chat"]["conversations"] == 10 and mix["by_source"]["chat"]["share"] == 0.5
    assert mix["by_source"]["chat"]["corpus_conversations"] == 90
    assert mix["by_source"]["chat"]["thinking_share"] == 0.6 and mix["by_source"]["chat"]["corpus_thinking_share"] \
        == round(54 / 90, 6)
    assert mix["by_task"]["code"]["corpus_share"] == round(40 / 130, 6)
    text = format_report(report)
    assert "eval pack (held out of the corpus): 20 conversations, 40.0% thinking" in text


def test_corpus_eval_reads_the_pack_the_build_wrote(packed: Corpus) -> None:
    pack = read_pack(packed.root)
    written = {row.id: row for row in packed.pack_conversations()}
    assert {prompt.id for prompt in pack.prompts} == set(written)
    for prompt in pack.prompts:
        row = written[prompt.id]
        assert (prompt.source, prompt.task) == (row.source, row.task)
        assert [m["content"] for m in prompt.messages] == [row.messages[0].content]  # sent up to the answer
    assert read_pack(packed.root / EVAL).sha256 == pack.sha256


def test_the_card_names_the_pack_and_the_gate_checks_its_files(packed: Corpus) -> None:
    card = render_card(CorpusDocuments.load(packed.root))
    assert "## Eval pack" in card and "20 conversations were held out" in card
    assert check_corpus(packed.root).failures == []
    shard = next((packed.root / EVAL).glob("*.parquet"))
    shard.write_bytes(shard.read_bytes()[:-10] + b"x" * 10)
    assert any("sha256 does not match" in problem for problem in check_corpus(packed.root).failures)


def test_a_rebuild_without_a_pack_leaves_none_behind(tmp_path: Path) -> None:
    write_traffic(tmp_path)
    build(write_recipe(tmp_path, "eval: {rows: 10}", SOURCES))
    corpus = build(write_recipe(tmp_path, "", SOURCES.replace(", eval: {fraction: 0.2}", "")))
    assert not (corpus.root / EVAL).exists() and corpus.manifest.section("eval") is None
    assert corpus.manifest.conversations == 150


def test_a_declared_mixture_is_met_from_the_rows_the_pack_leaves(tmp_path: Path) -> None:
    write_traffic(tmp_path)
    sources = SOURCES.replace("task: chat}", "task: chat, target: {count: 80}}")
    corpus = build(write_recipe(tmp_path, "eval: {rows: 10}\nmixture: {seed: 1}", sources))
    counts = Counter(row.source for row in corpus.iter_conversations())
    assert counts == {"chat": 80, "code": 40}
    assert not {row.id for row in corpus.iter_conversations()} & {row.id for row in corpus.pack_conversations()}


@pytest.mark.parametrize(("body", "sources", "problem"), [
    ("", SOURCES + "\n  - {name: asks, kind: prompts, path: chat.jsonl, eval: {rows: 3}}",
     "sources[2].eval: only replay sources are held out in the eval pack"),
    ("eval: {rows: 3, fraction: 0.1}", SOURCES, "eval"),
])
def test_a_pack_the_recipe_cannot_cut_is_refused_naming_the_key(tmp_path: Path, body: str, sources: str,
                                                                 problem: str) -> None:
    write_traffic(tmp_path)
    recipe = write_recipe(tmp_path, body, sources)
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "validate", str(recipe)], capture_output=True,
                               text=True)
    assert completed.returncode == 2
    assert problem in completed.stderr + completed.stdout
    assert not (tmp_path / "out").exists()


def _rows(strata: dict[tuple[str, str | None, bool], int]) -> list[Conversation]:
    return [Conversation(f"{source}-{task}-{thinking}-{i}", source, "replay",
                         [Message("user", "q"), Message("assistant", "a", reasoning="r" if thinking else None)],
                         task=task)
            for (source, task, thinking), count in strata.items() for i in range(count)]


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=2, max_size=4), rows=st.integers(0, 60),
       fraction=st.floats(0, 0.99), seed=st.integers(0, 3))
def test_the_cut_holds_exactly_each_share_apportioned_over_the_strata(sizes: list[int], rows: int, fraction: float,
                                                                     seed: int) -> None:
    strata = {("a", f"t{i // 2}", i % 2 == 0): size for i, size in enumerate(sizes)}
    strata[("b", None, True)] = sizes[0]
    shares = {"a": PackShare(rows=rows), "b": PackShare(fraction=fraction)}
    conversations = _rows(strata)
    cut = plan_cut(shares, seed, iter(conversations))
    held = Counter((row.source, row.task, row.thinking) for row in conversations if cut.holds(row))
    for source, share in shares.items():
        sizes_of = {stratum: count for stratum, count in strata.items() if stratum[0] == source}
        total = sum(sizes_of.values())
        wanted = share.held(total)
        assert sum(held[stratum] for stratum in sizes_of) == wanted
        for stratum, size in sizes_of.items():
            assert held[stratum] <= size
            assert abs(held[stratum] - wanted * size / total) < 1 if total else held[stratum] == 0
            assert cut.strata.get(stratum) == ((size, held[stratum]) if size else None)


def test_the_manifest_refuses_a_hand_edited_pack_entry(packed: Corpus) -> None:
    manifest = orjson.loads((packed.root / "manifest.json").read_bytes())
    manifest["eval"]["files"][0]["rows"] = "many"
    (packed.root / "manifest.json").write_bytes(orjson.dumps(manifest))
    from corpus_builder.errors import CorpusError

    with pytest.raises(CorpusError, match=r"eval\.files\[0\]\.rows is not a count"):
        Corpus.open(packed.root)


def test_the_dry_run_says_what_the_pack_holds_out_and_counts_without_it(tmp_path: Path) -> None:
    from corpus_builder.assemble.dry_run import format_plan, plan_build

    write_traffic(tmp_path)
    sources = SOURCES.replace("task: chat}", "task: chat, target: {count: 95}}")
    plan = plan_build(load_recipe(write_recipe(tmp_path, "eval: {rows: 10}", sources)))
    assert "eval pack: conversations held out of chat 10 of 100, code 10 of 50" in format_plan(plan)
    # 100 rows less the pack's 10 cannot give 95
    assert any("chat" in problem and "95" in problem for problem in plan.problems), plan.problems


def test_a_share_that_rounds_to_no_row_leaves_no_empty_pack_and_the_eval_says_why(tmp_path: Path) -> None:
    write_traffic(tmp_path)
    corpus = build(write_recipe(tmp_path, "eval: {fraction: 0.001}", SOURCES.replace(", eval: {fraction: 0.2}", "")))
    assert not (corpus.root / EVAL).exists()
    section = corpus.manifest.section("eval")
    assert section["conversations"] == 0 and section["files"] == []
    assert {name: (entry["read"], entry["held"]) for name, entry in section["sources"].items()} == {
        "chat": (100, 0), "code": (50, 0)}
    assert corpus.manifest.conversations == 150 and corpus.verify_files() == []
    from corpus_builder.errors import CorpusError

    with pytest.raises(CorpusError) as refused:
        read_pack(corpus.root)
    assert str(refused.value) == (
        f"{corpus.root}: the corpus's eval pack holds no conversation: the recipe's eval share held none of the rows "
        "its replay sources gave (chat 0 of 100, code 0 of 50; a fraction that rounds to 0 rows holds none): "
        "rebuild with a larger eval.rows or eval.fraction, or give a conversations file instead")
