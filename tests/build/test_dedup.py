"""Dedup across sources (exact on normalised text, near by MinHash/LSH) by a stated source priority, before
generation on prompts and after it on every row; decontamination against evaluation sets, of prompts before
generation and of responses after. Planted pairs with known ids; expectations written by hand."""

from __future__ import annotations

import io
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from corpus_builder.audit import audit_corpus, format_report
from corpus_builder.build import build_corpus
from corpus_builder.build.dedup import Dedup, read_eval_sets
from corpus_builder.errors import CorpusError
from corpus_builder.layout import Corpus, iter_ledger
from corpus_builder.publish.card import render_card
from corpus_builder.publish.gate import CorpusDocuments
from corpus_builder.recipe import Checks, Decontamination, EvalSet, HubRef, NearDuplicateSettings, load_recipe
from corpus_builder.sources.hub import MIRROR_ENV
from corpus_builder.testing.fault_server import FaultServer
from tests.support.real_data import write_rows

MODEL = "tiny-target"
WORDS = ["river", "mountain", "lantern", "copper", "meadow", "violet", "harbor", "engine", "pencil", "thunder",
         "garden", "silver", "window", "falcon", "marble", "orchard", "canyon", "ribbon", "tunnel", "glacier",
         "beacon", "saddle", "cobalt", "prairie", "whistle"]


def prose(seed: int, words: int = 120) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randrange(50)) for _ in range(words))


def edited(text: str, share: float, seed: int) -> str:
    """The text with ``share`` of its words replaced."""
    rng = random.Random(seed)
    words = text.split()
    for index in rng.sample(range(len(words)), int(len(words) * share)):
        words[index] = f"edit{index}"
    return " ".join(words)


def chat(user: str, answer: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}


# The loopback server answers prompt P with reasoning "Let me think about P[:60]." and "Answer to P[:60]."
def served(prompt: str) -> dict[str, Any]:
    return chat(prompt, f"<think>Let me think about {prompt[:60]}.</think>Answer to {prompt[:60]}.")


EVICTED_PROMPT = "Which harbor lies past the copper canyon?"
GSM_QUESTION = ("A baker sells 48 loaves on Monday and twice as many on Tuesday; how many loaves does the "
                "baker sell over both days together")
RESPONSE_PROMPT = "Tell me about violet orchards under thunder"
MT_TURN = f"Let me think about {RESPONSE_PROMPT}."  # what the server's reasoning will say, word for word


def write_sources(root: Path) -> None:
    original, long_a = prose(1), prose(2)
    write_rows(root / "logs-a.jsonl", [
        chat("Summarise this, please: " + original, "It is about rivers."),  # exact copy in logs-b wins (priority)
        chat("Review: " + long_a, "Fine."),  # near copy in logs-b
        chat("Related: " + prose(3), "Kept."),  # and a related row, 40% edited, that must stay
        served(EVICTED_PROMPT),  # the generated row of asks-1 outranks it
        chat("Check my sums: " + GSM_QUESTION + "?", "96 and 48."),  # contaminated (gsm)
        chat("unique a", "alone"),
    ])
    write_rows(root / "logs-b.jsonl", [
        chat("SUMMARISE this,   please:  " + original.upper(), "It is about RIVERS!"),
        chat("Review: " + edited(long_a, 0.02, 7), "Fine."),
        chat("Related: " + edited(prose(3), 0.4, 8), "Kept."),
        chat("unique b", "alone"),
    ])
    write_rows(root / "asks-1.jsonl", [
        {"messages": [{"role": "user", "content": EVICTED_PROMPT}]},
        {"messages": [{"role": "user", "content": "What is a marble lantern?"}]},
        {"messages": [{"role": "user", "content": f"Solve: {GSM_QUESTION}."}]},  # contaminated before generation
        {"messages": [{"role": "user", "content": RESPONSE_PROMPT}]},  # its response is contaminated (mt-bench)
    ])
    write_rows(root / "asks-2.jsonl", [
        {"messages": [{"role": "user", "content": "what is a MARBLE lantern"}]},  # duplicate prompt of asks-1
        {"messages": [{"role": "user", "content": "Where do falcons nest?"}]},
    ])
    write_rows(root / "gsm-test.jsonl", [{"question": GSM_QUESTION + "?", "answer": "48 + 96 = 144 #### 144"}])
    write_rows(root / "mt-bench.jsonl", [{"category": "writing", "turns": [MT_TURN, "Rewrite it."]}])


def write_recipe(root: Path, endpoint: str, checks: str = "") -> Path:
    (root / "recipe.yaml").write_text(f"""\
name: dedup
target:
  model: {MODEL}
  endpoints: [{endpoint}]
  generation: {{max_tokens: 64, timeout_s: 5, max_retries: 1}}
sources:
  - {{name: logs-a, kind: replay, path: logs-a.jsonl}}
  - {{name: logs-b, kind: replay, path: logs-b.jsonl}}
  - {{name: asks-1, kind: prompts, path: asks-1.jsonl}}
  - {{name: asks-2, kind: prompts, path: asks-2.jsonl}}
checks:
  near_duplicates: {{threshold: 0.8}}
  dedup_priority: [asks-1, logs-b]
{checks}decontamination:
  eval_sets:
    - {{name: gsm-test, path: gsm-test.jsonl}}
    - {{name: mt-bench, path: mt-bench.jsonl, fields: [turns]}}
split: {{validation_fraction: 0.0}}
output: {{dir: out}}
""", encoding="utf-8")
    return root / "recipe.yaml"


@pytest.fixture()
def built(tmp_path: Path) -> tuple[Path, list[str]]:
    write_sources(tmp_path)
    with FaultServer(model=MODEL) as server:
        build_corpus(load_recipe(write_recipe(tmp_path, server.base_url)), progress=io.StringIO())
        prompts = [request.body["messages"][-1]["content"] for request in server.chat_requests]
    return tmp_path / "out", prompts


def by_text(out: Path) -> dict[str, tuple[str, str]]:
    """(source, id) of every written row by its first user turn."""
    return {row.messages[0].content: (row.source, row.id) for row in Corpus.open(out).iter_conversations()}


def test_duplicates_across_sources_keep_the_row_of_the_source_first_in_priority(built: tuple[Path, list[str]]) -> None:
    out, _ = built
    rows = by_text(out)
    ledger = [r for r in iter_ledger(out / "ledger.jsonl.zst") if r["reason"] in ("duplicate", "near_duplicate")]
    kept_exact = next(v for k, v in rows.items() if k.startswith("SUMMARISE"))
    kept_near = next(v for k, v in rows.items() if k.startswith("Review: ") and v[0] == "logs-b")
    assert not any(k.startswith("Summarise this") for k in rows)  # logs-a's copy is gone, logs-b's stays
    assert sum(k.startswith("Review: ") for k in rows) == 1
    assert sum(k.startswith("Related: ") for k in rows) == 2  # 40% edited: not a duplicate
    from_logs_b = {(r["reason"], r["detail"]): r["location"] for r in ledger if r["detail"].endswith("(source logs-b)")}
    assert from_logs_b == {("duplicate", f"duplicate of {kept_exact[1]} (source logs-b)"): "logs-a.jsonl:1",
                           ("near_duplicate", f"near duplicate of {kept_near[1]} (source logs-b)"): "logs-a.jsonl:2"}


def test_prompts_are_deduplicated_and_decontaminated_before_any_request(built: tuple[Path, list[str]]) -> None:
    out, prompts = built
    assert sorted(prompts) == sorted([EVICTED_PROMPT, "What is a marble lantern?", RESPONSE_PROMPT,
                                      "Where do falcons nest?"])  # no duplicate, no contaminated prompt asked
    ledger = list(iter_ledger(out / "ledger.jsonl.zst"))
    [duplicate] = [r for r in ledger if r["source"] == "asks-2"]
    assert duplicate["reason"] == "duplicate" and duplicate["location"].endswith("asks-2.jsonl:1")
    assert duplicate["detail"].startswith("duplicate of ") and duplicate["detail"].endswith("(source asks-1)")
    assert {(r["location"], r["detail"]) for r in ledger if r["source"] == "asks-1"} >= {
        ("asks-1.jsonl:3", "eval sets: gsm-test")}


def test_a_response_matching_an_eval_set_is_dropped_after_generation(built: tuple[Path, list[str]]) -> None:
    out, _ = built
    rows = by_text(out)
    assert RESPONSE_PROMPT not in rows
    contaminated = Counter((r["source"], r["detail"]) for r in iter_ledger(out / "ledger.jsonl.zst")
                           if r["reason"] == "contaminated")
    assert contaminated == {("asks-1", "eval sets: gsm-test"): 1, ("asks-1", "eval sets: mt-bench"): 1,
                            ("logs-a", "eval sets: gsm-test"): 1}


def test_a_generated_row_evicts_the_replayed_duplicate_of_a_lower_priority_source(
        built: tuple[Path, list[str]]) -> None:
    out, _ = built
    rows = by_text(out)
    source, row_id = rows[EVICTED_PROMPT]
    assert source == "asks-1"
    [evicted] = [r for r in iter_ledger(out / "ledger.jsonl.zst") if r["source"] == "logs-a"
                 and r["detail"] == f"duplicate of {row_id} (source asks-1)"]
    assert evicted["reason"] == "duplicate" and evicted["location"].endswith("logs-a.jsonl:4")
    assert Corpus.open(out).manifest.conversations == len(rows) == 9


def test_the_audit_manifest_and_card_count_by_source_rule_and_eval_set(built: tuple[Path, list[str]]) -> None:
    out, _ = built
    corpus = Corpus.open(out)
    report = corpus.audit()
    assert report["skipped_by_source"]["logs-a"] == {"contaminated": 1, "duplicate": 2, "near_duplicate": 1}
    assert report["skipped_by_source"]["asks-2"] == {"duplicate": 1}
    assert report["contaminated_by_eval_set"] == {"gsm-test": 2, "mt-bench": 1}
    assert audit_corpus(out, secrets=False)["skipped_by_source"] == report["skipped_by_source"]  # from the files
    manifest = corpus.manifest
    assert manifest.section("dedup") == {
        "rule": "exact", "near_duplicates": {"threshold": 0.8, "num_perm": 64, "shingle": 5},
        "priority": ["asks-1", "logs-b", "logs-a", "asks-2"]}
    assert [(s["name"], s["texts"]) for s in manifest.section("decontamination")["eval_sets"]] == [
        ("gsm-test", 2), ("mt-bench", 2)]
    card = render_card(CorpusDocuments.load(out), repo_id="me/dedup")
    assert "gsm-test" in card and "mt-bench" in card and "13-word" in card
    assert "near duplicates (MinHash/LSH, threshold 0.8, 5-word shingles)" in card


def test_same_recipe_and_journal_give_the_same_bytes(tmp_path: Path) -> None:
    write_sources(tmp_path)
    with FaultServer(model=MODEL) as server:
        recipe = load_recipe(write_recipe(tmp_path, server.base_url))
        first = build_corpus(recipe, progress=io.StringIO())
        shards = {f.path: f.sha256 for f in first.manifest.files}
        asked = len(server.chat_requests)
        again = build_corpus(recipe, progress=io.StringIO())
        assert len(server.chat_requests) == asked
    assert {f.path: f.sha256 for f in again.manifest.files} == shards


def test_a_raw_file_audit_counts_exact_and_near_duplicates(tmp_path: Path) -> None:
    text = prose(4)
    rows = [chat("Q: " + text, "a"), chat("q:  " + text.upper() + "!", "A"), chat("Q: " + edited(text, 0.02, 1), "a"),
            chat("other", "b"), chat("other, continued", "c")]
    for row, row_id in zip(rows, ["x1", "x2", "x3", "x4", "x4"], strict=True):
        row["id"] = row_id  # the last row repeats its id: a chat cut into chunks
    write_rows(tmp_path / "dump.jsonl", rows)
    report = audit_corpus(tmp_path / "dump.jsonl", secrets=False)
    assert report["conversations"] == 4 and report["skipped"] == {"duplicate": 1}
    assert report["flags"] == {"repeated_source_id": 1}
    assert report["near_duplicates"] == {"threshold": 0.8, "rows": 1, "by_source": {"dump.jsonl": 1}}


def test_eval_sets_are_read_from_local_files_and_hub_mirrors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "mirror" / "acme" / "gsm" / "data"
    data.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{"question": GSM_QUESTION, "answer": "144"}]), data / "test-00000.parquet")
    monkeypatch.setenv(MIRROR_ENV, str(tmp_path / "mirror"))
    write_rows(tmp_path / "mt.jsonl", [{"turns": [MT_TURN, "Rewrite your previous response in one sentence."]},
                                       "not a row", {"turns": None}])
    screen = Decontamination((EvalSet("gsm", hub=HubRef("acme/gsm", split="test")),
                              EvalSet("mt", path=tmp_path / "mt.jsonl", fields=("turns",))))
    eval_sets = read_eval_sets(screen)
    index = eval_sets.index if eval_sets is not None else None
    assert index is not None and [(s.name, s.texts) for s in index.eval_sets] == [("gsm", 2), ("mt", 2)]
    assert index.matches([f"Please solve: {GSM_QUESTION.upper()}!", MT_TURN, "Rewrite your previous response"]) \
        == [("gsm",), ("mt",), ()]


def test_a_near_duplicate_threshold_with_no_band_layout_is_a_clear_error() -> None:
    with pytest.raises(CorpusError, match=r"checks\.near_duplicates: "):
        Dedup(Checks(near_duplicates=NearDuplicateSettings(threshold=0.05, num_perm=8)))


def test_the_audit_table_shows_drops_by_source_and_rule(built: tuple[Path, list[str]], tmp_path: Path) -> None:
    out, _ = built
    text = format_report(Corpus.open(out).audit())
    assert re.search(r"^logs-a\s+2\s+1\s+1$", text, re.MULTILINE)  # duplicate, near dup, contaminated
    assert re.search(r"^asks-1\s+0\s+0\s+2$", text, re.MULTILINE)
    assert "contaminated rows by eval set: gsm-test 2, mt-bench 1" in text
    write_rows(tmp_path / "dump.jsonl", [chat("Q: " + prose(5), "a"), chat("Q: " + edited(prose(5), 0.02, 2), "a")])
    assert re.search(r"^near duplicates\s+1\s+\(similarity >= 0.8",
                     format_report(audit_corpus(tmp_path / "dump.jsonl")), re.MULTILINE)


def test_a_replay_only_build_keeps_the_row_of_the_source_first_in_priority(tmp_path: Path) -> None:
    """Rows stream to the shards here (no spool): the sources are read in priority order instead."""
    text = prose(6)
    write_rows(tmp_path / "logs-a.jsonl", [chat("Q: " + text, "a"), chat("only in a", "a")])
    write_rows(tmp_path / "logs-b.jsonl", [chat("q " + text.upper(), "A!"), chat("only in b", "b")])
    (tmp_path / "recipe.yaml").write_text("""\
name: replay-dedup
target: {model: m}
sources:
  - {name: logs-a, kind: replay, path: logs-a.jsonl}
  - {name: logs-b, kind: replay, path: logs-b.jsonl}
checks: {dedup_priority: [logs-b]}
split: {validation_fraction: 0.0}
output: {dir: out}
""", encoding="utf-8")
    result = build_corpus(load_recipe(tmp_path / "recipe.yaml"), progress=io.StringIO())
    rows = by_text(result.out_dir)
    assert sorted(rows) == ["only in a", "only in b", "q " + text.upper()]
    [dropped] = iter_ledger(result.out_dir / "ledger.jsonl.zst")
    assert (dropped["source"], dropped["reason"], dropped["location"]) == ("logs-a", "duplicate", "logs-a.jsonl:1")
    assert dropped["detail"] == f"duplicate of {rows['q ' + text.upper()][1]} (source logs-b)"
