"""A corpus built from serving traffic as it is captured: one row per chat (its requests folded, each folded one in
the ledger), answers served cut at max_tokens handled as generated ones are, the served mode in each row's
provenance, in the audit beside reasoning present, and what the eval pack is stratified by."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from corpus_builder.assemble import build_corpus
from corpus_builder.audit import audit_corpus, format_report
from corpus_builder.layout import Corpus, iter_ledger
from corpus_builder.recipe import load_recipe
from corpus_builder.records import FLAG_TRUNCATED
from corpus_builder.sources.fold import FOLDED_PREFIX
from corpus_builder.stats.facts import thinking_mode_of
from tests.sources.test_sources import write_lines
from tests.support.serving_logs import exchanges, log_row, logged_conversation

CHATS = 30  # chats 0-19 served with thinking on and their answers reasoned; 20-29 served off, no reasoning


def chat(i: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for turn in range(1 + i % 3):
        answer: dict[str, Any] = {"role": "assistant", "content": f"chat {i} answers {turn} in full"}
        if i < 20 and i % 5:  # served with thinking on: most answers reason; every fifth one's reasoning is empty
            answer["reasoning_content"] = f"chat {i} thinks about {turn}"
        messages += [{"role": "user", "content": f"chat {i} asks question number {turn}"}, answer]
    return messages


def traffic(*, cut: bool = True) -> list[dict[str, Any]]:
    """The chats logged request by request, then (``cut``) one answer served cut inside its reasoning."""
    rows = []
    for i in range(CHATS):
        rows += logged_conversation("nested", {"messages": chat(i)}, session=f"s{i}", thinking=i < 20)
    if cut:
        answer = {"role": "assistant", "content": None, "reasoning_content": "cut inside its reasoning"}
        rows.append(log_row("nested", [{"role": "user", "content": "a question answered too long"}], answer,
                            finish_reason="length"))
    return rows


def build(root: Path, extra: str = "") -> Corpus:
    write_lines(root / "traffic.jsonl", traffic())
    (root / "recipe.yaml").write_text(f"""\
name: logged
target: {{model: tiny/target{extra}}}
sources:
  - {{name: served, kind: replay, path: traffic.jsonl, task: chat}}
split: {{validation_fraction: 0.2}}
output: {{dir: out}}
""", encoding="utf-8")
    build_corpus(load_recipe(root / "recipe.yaml"), progress=io.StringIO())
    return Corpus.open(root / "out")


@pytest.fixture()
def corpus(tmp_path: Path) -> Corpus:
    return build(tmp_path)


def test_each_chat_is_one_row_and_each_folded_request_is_in_the_ledger(corpus: Corpus) -> None:
    rows = list(corpus.iter_conversations())
    assert len(rows) == CHATS
    assert sorted(len(row.messages) for row in rows) == sorted(len(chat(i)) for i in range(CHATS))
    ledger = Counter(record["reason"] for record in iter_ledger(corpus.root / "ledger.jsonl.zst"))
    requests = sum(len(exchanges(chat(i))) for i in range(CHATS))
    assert ledger[FOLDED_PREFIX] == requests - CHATS
    audit = corpus.audit()
    assert audit["skipped"][FOLDED_PREFIX] == requests - CHATS


def test_an_answer_served_cut_is_dropped_as_a_truncated_generation(corpus: Corpus, tmp_path: Path) -> None:
    ledger = [record for record in iter_ledger(corpus.root / "ledger.jsonl.zst")
              if record["reason"] == "truncated_generation"]
    assert [record["location"] for record in ledger] == [f"traffic.jsonl:{len(traffic())}"]
    (tmp_path / "keep").mkdir()
    kept = build(tmp_path / "keep", ", generation: {on_length: keep}")
    flagged = [row for row in kept.iter_conversations() if FLAG_TRUNCATED in row.flags]
    assert len(flagged) == 1 and flagged[0].messages[-1].reasoning == "cut inside its reasoning"


def test_the_served_mode_is_kept_and_audited_beside_reasoning_present(corpus: Corpus) -> None:
    rows = list(corpus.iter_conversations())
    served = Counter((row.provenance.served.enable_thinking, row.thinking) for row in rows)
    # served on: chats 0-19, of which 0, 5, 10 and 15 never reason; served off: 20-29
    assert served == {(True, True): 16, (True, False): 4, (False, False): 10}
    assert all(row.provenance.served.model == "tiny/target" for row in rows)
    section = audit_corpus(corpus.root)["served"]
    assert section["by_source"]["served"] == {"on": 20, "off": 10, "unrecorded": 0, "on_with_reasoning": 16,
                                              "off_with_reasoning": 0}
    assert section["models"] == {"tiny/target": CHATS}
    assert corpus.audit()["served"] == section  # the build's audit.json, the same from the files
    text = format_report(audit_corpus(corpus.root))
    assert "replayed rows by thinking as served" in text and "served by: tiny/target 30" in text


def test_the_eval_pack_is_stratified_by_the_mode_as_served(tmp_path: Path) -> None:
    write_lines(tmp_path / "traffic.jsonl", traffic(cut=False))
    (tmp_path / "recipe.yaml").write_text("""\
name: logged
target: {model: tiny/target}
sources:
  - {name: served, kind: replay, path: traffic.jsonl, task: chat}
eval: {rows: 6, seed: 1}
output: {dir: out}
""", encoding="utf-8")
    build_corpus(load_recipe(tmp_path / "recipe.yaml"), progress=io.StringIO())
    corpus = Corpus.open(tmp_path / "out")
    strata = {entry["thinking"]: (entry["read"], entry["held"])
              for entry in corpus.manifest.section("eval")["sources"]["served"]["strata"]}
    # by the mode served, not by reasoning present: 20 chats served on (4 of them without reasoning), 10 off
    assert strata == {True: (20, 4), False: (10, 2)}
    assert Counter(map(thinking_mode_of, corpus.pack_conversations())) == {True: 4, False: 2}
