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

import orjson
import pytest

from corpus_builder.assemble import build_corpus
from corpus_builder.assemble.plan import Plan
from corpus_builder.assemble.split import Splitter
from corpus_builder.audit import audit_corpus, format_report
from corpus_builder.errors import CorpusError
from corpus_builder.layout import Corpus, iter_ledger
from corpus_builder.publish.card import render_card
from corpus_builder.publish.gate import CorpusDocuments
from corpus_builder.recipe import Checks, Decontamination, EvalSet, HubRef, NearDuplicateSettings, load_recipe
from corpus_builder.records import Conversation, Message, ToolCall
from corpus_builder.screen.decontaminate import EvalSetSummary
from corpus_builder.screen.dedup import (
    Dedup,
    EvalSetRead,
    Evicted,
    Verdict,
    describe_screening,
    read_eval_sets,
)
from corpus_builder.screen.normalise import conversation_text
from corpus_builder.sources.hub import MIRROR_ENV
from corpus_builder.testing.fault_server import FaultServer
from tests.support.chats import served
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


def test_an_evicted_row_leaves_the_split_it_was_kept_in(tmp_path: Path) -> None:
    """Half the rows in validation: the evicted thinking row of logs-a is the only one of its source's
    (validation, thinking) cell, which the eviction empties; the build counts each split as written."""
    write_sources(tmp_path)
    with FaultServer(model=MODEL) as server:
        recipe = write_recipe(tmp_path, server.base_url)
        recipe.write_text(recipe.read_text().replace("validation_fraction: 0.0", "validation_fraction: 0.5"))
        out = build_corpus(load_recipe(recipe), progress=io.StringIO()).out_dir
    [evicted] = [r for r in iter_ledger(out / "ledger.jsonl.zst") if r["location"].endswith("logs-a.jsonl:4")]
    assert Splitter(0.5, 0).assign_id(evicted["id"]) == "validation"
    rows = list(Corpus.open(out).iter_conversations())
    kept_instead = next(r for r in rows if r.messages[0].content == EVICTED_PROMPT)
    assert evicted["detail"] == f"duplicate of {kept_instead.id} (source asks-1)"
    assert not any(r.source == "logs-a" and r.split == "validation" and r.thinking for r in rows)
    assert {split: counts.rows for split, counts in Corpus.open(out).manifest.splits.items()} == Counter(
        r.split for r in rows)


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


def test_repeated_source_ids_are_counted_across_batches_and_within_one() -> None:
    from corpus_builder.audit.run import audit_conversations
    from corpus_builder.records import Provenance

    def row(index: int, source: str, source_id: str | int | None) -> Conversation:
        return Conversation(f"r{index}", source, "replay", [Message("user", f"question {index}")],
                            provenance=Provenance(source_id=source_id))

    ids = [("a", "x"), ("a", "y"), ("a", "x"), ("a", "x"), ("b", "x"), ("a", None), ("a", None), ("a", "y"),
           ("b", 7), ("b", 7)]
    rows = [row(index, source, source_id) for index, (source, source_id) in enumerate(ids)]
    for batch_size in (1, 2, 3, 4096):  # the copies in one batch, across batches, both
        assert audit_conversations(rows, batch_size=batch_size)["flags"] == {"repeated_source_id": 4}
    assert audit_conversations(rows[:2], batch_size=2)["flags"] == {}

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


def row(source: str, text: str, *, thinking: bool = False) -> Conversation:
    return Conversation(f"{source}-row", source, "replay", [
        Message("user", text), Message("assistant", "Sure.", "Let me see." if thinking else None)])


def test_an_eviction_names_the_kept_row_with_its_thinking_flag_and_the_row_kept_instead() -> None:
    """Ranks: top 0, high 1, low 2. The kept row's id and thinking flag are what the build discards from its
    split and cell; a chain of evictions follows the row kept last. Prompts compared: the rows' reasoning
    differs."""
    evicted: list[Evicted] = []

    def decide(source: str, row_id: str, thinking: bool) -> Verdict | None:
        conversation = row(source, "The same question, again", thinking=thinking)
        [verdict] = dedup.decide([conversation], [row_id], dedup.signatures([conversation]), evicted.append)
        return verdict

    for thinking in (False, True):
        evicted.clear()
        dedup = Dedup(Checks(), {"top": 0, "high": 1, "low": 2}, turns="prompt")
        assert decide("low", "l1", thinking) is None
        assert decide("high", "h1", not thinking) is None  # outranks the kept row: kept, and that one evicted
        assert evicted == [Evicted("low", "l1", thinking, of="h1", of_source="high", rule="exact")]
        assert decide("low", "l2", thinking) == Verdict("h1", "high", "exact")  # the row kept now
        assert decide("high", "h2", thinking) == Verdict("h1", "high", "exact")  # the same rank: first kept stays
        assert decide("top", "t1", thinking) is None
        assert evicted[1:] == [Evicted("high", "h1", not thinking, of="t1", of_source="top", rule="exact")]
        assert decide("unranked", "u1", thinking) == Verdict("t1", "top", "exact")  # rank 0 ties with top
    evicted.clear()
    for (first, first_id), (second, second_id), callback, expected in [
            (("high", "h3"), ("top", "t3"), None, Verdict("h3", "high", "exact")),  # no eviction without evict
            (("unranked", "u4"), ("top", "t4"), evicted.append, Verdict("u4", "unranked", "exact")),  # a tie at 0
            (("high", "h5"), ("unranked", "u5"), evicted.append, None)]:  # an unranked source ranks 0
        rows = [row(first, f"A question for {first_id}"), row(second, f"a question for {first_id}")]
        assert [dedup.decide([r], [i], dedup.signatures([r]), callback)[0]
                for r, i in zip(rows, [first_id, second_id], strict=True)] == [None, expected]
    assert evicted == [Evicted("high", "h5", False, of="u5", of_source="unranked", rule="exact")]


def test_an_eviction_by_a_near_duplicate_names_its_rule() -> None:
    text = prose(9)
    dedup = Dedup(Checks(near_duplicates=NearDuplicateSettings()), {"high": 0, "low": 1})
    evicted: list[Evicted] = []
    rows = [row("low", text), row("high", edited(text, 0.02, 3))]
    verdicts = dedup.decide(rows, ["l1", "h1"], dedup.signatures(rows), evicted.append)
    assert verdicts == [None, None]
    assert evicted == [Evicted("low", "l1", False, of="h1", of_source="high", rule="near")]
    assert Verdict("h1", "high", "near").detail == "near duplicate of h1 (source high)"
    assert (Verdict("h1", "high", "near").reason, Verdict("h1", "high", "exact").reason) == (
        "near_duplicate", "duplicate")


def calling(arguments: str, *, tools: list[dict[str, Any]] | None = None, result: str = "12 degrees") -> Conversation:
    return Conversation("c", "agent", "replay", [
        Message("user", "What is the weather in Oslo and in Bergen?"),
        Message("assistant", "Checking.", "Two cities: two calls.", (
            ToolCall("call-1", "weather", arguments), ToolCall("call-2", "weather", '{"city": "Bergen"}'))),
        Message("tool", result, tool_call_id="call-1"), Message("tool", "9 degrees", tool_call_id="call-2"),
        Message("assistant", "Oslo is warmer.")], tools=tools)


def test_tool_calls_are_part_of_the_dedup_text_and_tool_schemas_are_not() -> None:
    """Every call's name and arguments follow the turn's content; tool results are prompt turns; the schemas
    the row was served with are left out."""
    oslo = calling('{"city": "Oslo"}')
    assert conversation_text(oslo) == ("What is the weather in Oslo and in Bergen?\nTwo cities: two calls.\n"
                                       'Checking.\nweather {"city": "Oslo"}\nweather {"city": "Bergen"}\n'
                                       "12 degrees\n9 degrees\nOslo is warmer.")
    assert conversation_text(oslo, "prompt") == "What is the weather in Oslo and in Bergen?\n12 degrees\n9 degrees"
    schema = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    rows = [oslo, calling('{"city": "Trondheim"}'), calling('{"city": "Oslo"}', tools=schema),
            calling('{"city": "Trondheim"}', result="3 degrees")]
    verdicts = [Dedup(Checks(), turns=turns).decide(rows, ["a", "b", "c", "d"],
                                                    Dedup(Checks(), turns=turns).signatures(rows), None)
                for turns in ("all", "prompt")]
    assert verdicts[0] == [None, None, Verdict("a", "agent", "exact"), None]  # other arguments: other rows
    assert verdicts[1] == [None, Verdict("a", "agent", "exact"), Verdict("a", "agent", "exact"), None]


def test_the_recipe_chooses_what_dedup_compares(tmp_path: Path) -> None:
    """checks.dedup: none builds no index; prompt compares the prompts (the same question with other answers
    is a duplicate), exact every turn; a caller may ask for the prompts of an exact-dedup recipe."""
    write_rows(tmp_path / "logs.jsonl", [chat("q", "a")])
    recipes = {}
    for mode in ("none", "prompt", "exact"):
        (tmp_path / f"{mode}.yaml").write_text(f"""\
name: modes
target: {{model: m}}
sources: [{{name: logs, kind: replay, path: logs.jsonl}}]
checks: {{dedup: {mode}}}
output: {{dir: out}}
""", encoding="utf-8")
        recipes[mode] = load_recipe(tmp_path / f"{mode}.yaml")
    plans = {mode: Plan.of(recipe, None) for mode, recipe in recipes.items()}
    assert plans["none"].dedup is None
    rows = [row("logs", "How far is the moon?"), row("logs", "how far is the moon")]
    rows[1].messages[1].content = "Far."

    def verdicts(dedup: Dedup) -> list[Verdict | None]:
        return dedup.decide(rows, ["a", "b"], dedup.signatures(rows), None)

    def index(mode: str) -> Dedup:
        stage = plans[mode].dedup
        assert stage is not None
        return stage.index()

    duplicate = [None, Verdict("a", "logs", "exact")]
    assert verdicts(index("prompt")) == duplicate
    assert verdicts(index("exact")) == [None, None]
    assert verdicts(Dedup.for_checks(recipes["exact"].checks, {}, "prompt")) == duplicate


def test_the_shingle_length_of_the_near_rule_is_the_recipe_s() -> None:
    """One-word shingles make a text with its words reordered a near duplicate; five-word ones do not."""
    words = prose(10, words=80).split()
    rows = [row("logs", " ".join(words)), row("logs", " ".join(words[1::2] + words[::2]))]
    for shingle, expected in ((1, [None, Verdict("a", "logs", "near")]), (5, [None, None])):
        dedup = Dedup(Checks(near_duplicates=NearDuplicateSettings(shingle=shingle)))
        assert dedup.decide(rows, ["a", "b"], dedup.signatures(rows), None) == expected


def test_decide_needs_one_id_per_row() -> None:
    dedup = Dedup(Checks())
    rows = [row("logs", "one")]
    with pytest.raises(ValueError):
        dedup.decide(rows, ["a", "b"], dedup.signatures(rows), None)


def test_sources_and_ids_of_any_characters_come_back_whole_in_an_eviction() -> None:
    """The index's key joins the thinking flag, the source and the id with a control character: whitespace,
    and that character itself, in a source or an id stay where they are."""
    dedup = Dedup(Checks(), {"top source": 0, "logs b": 1}, turns="prompt")
    evicted: list[Evicted] = []
    for source, row_id in (("logs b", "id 1\x1fpart two"), ("top source", "id\x1f2")):
        conversation = row(source, "The same question", thinking=True)
        dedup.decide([conversation], [row_id], dedup.signatures([conversation]), evicted.append)
    assert evicted == [Evicted("logs b", "id 1\x1fpart two", True, of="id\x1f2", of_source="top source",
                               rule="exact")]


def test_an_eval_set_is_reported_when_more_than_half_of_its_rows_are_skipped() -> None:
    spec = EvalSet("probe", path=Path("probe.jsonl"))
    assert EvalSetRead(spec, rows=4, skipped=Counter(invalid_json=2)).warning() is None  # half: not more
    assert EvalSetRead(spec, rows=4, skipped=Counter(invalid_json=3)).warning() == (
        "eval set 'probe' (probe.jsonl): 3 of 4 rows skipped (invalid_json 3); is this the right file and fields?")
    assert EvalSetRead(spec, rows=0).warning() is None
    assert EvalSetRead(spec, rows=4).describe_skipped() == ""


def probe_lines(path: Path, lines: list[bytes | dict[str, Any] | list[Any] | str]) -> Path:
    """An eval set's .jsonl file, line by line: rows (dumped), or bytes as they are."""
    path.write_bytes(b"".join((line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n" for line in lines))
    return path


def test_an_eval_set_is_indexed_at_the_recipes_run_length_and_min_words(tmp_path: Path) -> None:
    ten, five, three = (" ".join(WORDS[start:start + size]) for start, size in ((0, 10), (10, 5), (15, 3)))
    probe = probe_lines(tmp_path / "probe.jsonl", [{"text": ten}, {"text": five}, {"text": three}])
    eval_sets = read_eval_sets(Decontamination((EvalSet("probe", path=probe),), ngram=6, min_words=5))
    assert eval_sets is not None and eval_sets.index.eval_sets == (EvalSetSummary("probe", 3, 1),)  # 3 words: short
    assert eval_sets.index.matches([
        f"so {' '.join(WORDS[2:8])} and more",  # a run of 6 words of the text of 10
        f"so {' '.join(WORDS[2:7])} and more",  # 5 of them only
        f"and {five} too",  # the text of 5 words whole: it is shorter than the runs, and of min_words words
        f"and {three} too"]) == [("probe",), (), ("probe",), ()]


def test_an_eval_set_gives_every_string_of_its_fields_through_lists_and_mappings(tmp_path: Path) -> None:
    texts = [prose(seed, 20) for seed in range(4)]
    probe = probe_lines(tmp_path / "probe.jsonl", [
        {"turns": [texts[0], [texts[1]], {"reference": {"answer": texts[2]}, "score": 3}], "id": texts[3]}])
    eval_sets = read_eval_sets(Decontamination((EvalSet("probe", path=probe, fields=("turns",)),)))
    assert eval_sets is not None and eval_sets.index.eval_sets == (EvalSetSummary("probe", 3, 0),)
    assert eval_sets.index.matches(texts) == [("probe",), ("probe",), ("probe",), ()]  # not the id: not a field


def test_the_rows_an_eval_set_skips_are_counted_by_reason_and_the_rows_after_them_read(tmp_path: Path) -> None:
    texts = [prose(seed, 20) for seed in range(3)]
    probe = probe_lines(tmp_path / "probe.jsonl", [
        {"turns": [texts[0]]}, {"question": "no turns"}, b"{broken", {"question": "none again"}, [1, 2], "a string",
        b"{broken too", {"turns": [texts[1]]}, {"other": 1}, {"turns": [texts[2]]}])
    eval_sets = read_eval_sets(Decontamination((EvalSet("probe", path=probe, fields=("turns",)),)))
    assert eval_sets is not None and eval_sets.index.eval_sets == (EvalSetSummary("probe", 3, 0),)
    [read] = eval_sets.reads
    assert (read.rows, read.skipped) == (10, Counter(fields_absent=3, invalid_json=2, not_an_object=2))
    assert eval_sets.warnings() == [f"eval set 'probe' ({probe}): 7 of 10 rows skipped (fields_absent 3, "
                                    "invalid_json 2, not_an_object 2); is this the right file and fields?"]


@pytest.mark.parametrize(("rows", "keys"), [
    ([{"question": GSM_QUESTION, "answer": "144"}, {"question": GSM_QUESTION, "id": 2}], "question, answer"),
    ([{}, {}], "no key")])
def test_an_eval_set_without_its_fields_names_the_keys_its_rows_have(tmp_path: Path, rows: list[dict[str, Any]],
                                                                     keys: str) -> None:
    probe = probe_lines(tmp_path / "probe.jsonl", [b"{broken", [1], *rows])  # rows that do not decode come first
    screen = Decontamination((EvalSet("probe", path=probe, fields=("prompt", "turns")),))
    with pytest.raises(CorpusError) as caught:
        read_eval_sets(screen)
    assert str(caught.value) == (f"{probe}: decontamination: eval set 'probe': none of its rows has the fields "
                                 f"prompt, turns (its rows have {keys}); it would check nothing (fix its path or "
                                 "fields, or remove it)")


def test_an_eval_set_that_cannot_be_read_is_named_with_its_file_and_line(tmp_path: Path) -> None:
    probe = tmp_path / "probe.json"
    probe.write_text(f'[\n  {{"turns": ["{GSM_QUESTION}"]}},\n  {{"turns": oops}}\n]\n', encoding="utf-8")
    with pytest.raises(CorpusError) as caught:
        read_eval_sets(Decontamination((EvalSet("probe", path=probe),)))
    assert str(caught.value).startswith(f"{probe}:3: decontamination: eval set 'probe': not valid JSON")


def test_an_eval_set_missing_from_the_hub_mirror_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mirror").mkdir()
    monkeypatch.setenv(MIRROR_ENV, str(tmp_path / "mirror"))
    with pytest.raises(CorpusError) as caught:
        read_eval_sets(Decontamination((EvalSet("gsm", hub=HubRef("acme/gsm", split="test")),)))
    assert str(caught.value).startswith(
        "decontamination: eval set 'gsm': source 'eval set gsm': hub dataset acme/gsm is not in the mirror")


def test_eval_sets_the_index_refuses_are_a_corpus_error(tmp_path: Path) -> None:
    """The recipe's checks refuse both first; read_eval_sets still says what is wrong to a caller that skips them."""
    probe = probe_lines(tmp_path / "probe.jsonl", [{"turns": [GSM_QUESTION]}])
    twice = (EvalSet("probe", path=probe), EvalSet("probe", path=probe))
    for screen, problem in ((Decontamination(twice), "evaluation set 'probe' is listed twice"),
                            (Decontamination(twice[:1], ngram=5, min_words=8),
                             "need 1 <= min_words <= n, not min_words=8, n=5")):
        with pytest.raises(CorpusError) as caught:
            read_eval_sets(screen)
        assert str(caught.value) == f"decontamination: {problem}"


def test_the_screening_names_local_and_hub_eval_sets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "mirror" / "acme" / "gsm" / "data"
    data.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{"question": GSM_QUESTION, "answer": "144"}]), data / "test-00000.parquet")
    monkeypatch.setenv(MIRROR_ENV, str(tmp_path / "mirror"))
    write_rows(tmp_path / "logs.jsonl", [chat("q", "a")])
    write_rows(tmp_path / "mt.jsonl", [{"turns": [MT_TURN, "Rewrite it."]}])
    (tmp_path / "recipe.yaml").write_text("""\
name: screened
target: {model: m}
sources: [{name: logs, kind: replay, path: logs.jsonl}]
decontamination:
  ngram: 12
  min_words: 6
  eval_sets:
    - {name: gsm, hub: {id: acme/gsm, split: test}}
    - {name: mt, path: mt.jsonl, fields: [turns]}
output: {dir: out}
""", encoding="utf-8")
    recipe = load_recipe(tmp_path / "recipe.yaml")
    eval_sets = read_eval_sets(recipe.decontamination)
    assert eval_sets is not None
    screening = describe_screening(recipe, eval_sets)
    assert screening["decontamination"] == {"ngram": 12, "min_words": 6, "eval_sets": [
        {"name": "gsm", "from": "hf://datasets/acme/gsm/test", "texts": 2, "too_short": 1, "skipped_rows": {}},
        {"name": "mt", "from": "mt.jsonl", "texts": 2, "too_short": 1, "skipped_rows": {}}]}
    assert "decontamination" not in describe_screening(recipe, None)  # nothing read: nothing to describe


def test_a_row_that_outranks_a_dropped_head_evicts_nothing() -> None:
    """l1 is dropped (a near copy of l0) but stays the first row of its own text; h1, of that text and of a source
    that outranks it, is kept and evicts nothing: l1 is out already (the build's spool no longer holds it)."""
    text = prose(9)
    dedup = Dedup(Checks(near_duplicates=NearDuplicateSettings()), {"high": 0, "low": 1})
    evicted: list[Evicted] = []
    rows = [row("low", text), row("low", edited(text, 0.02, 3))]
    assert dedup.decide(rows, ["l0", "l1"], dedup.signatures(rows), evicted.append) == [
        None, Verdict("l0", "low", "near")]
    copy = row("high", edited(text, 0.02, 3))
    assert dedup.decide([copy], ["h1"], dedup.signatures([copy]), evicted.append) == [None]
    assert evicted == []
