"""The traffic audit's promises end to end: on the mixed corpus a real build writes, through the CLI, and on the
recipe diff applied and rebuilt (tests/audit/test_traffic_promises.py holds those that need no build)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import yaml

from corpus_builder import build_corpus, load_recipe
from corpus_builder.audit import AuditOptions, CorpusFiles, audit_against
from corpus_builder.audit.traffic import (
    FACT_DIMENSIONS,
    THINKING_TOLERANCE,
    TOKEN_DIMENSIONS,
    TURN_BUCKETS,
    _plan,
    _recipe_diff,
    _token_suggestions,
    divergence_problems,
)
from corpus_builder.layout import LEDGER, Corpus
from tests.audit.test_traffic_promises import (
    _patched_file,
    _planned,
    corpus_cli,
)

from .fixtures import (
    PLAIN,
    PLAIN_DUPLICATES,
    REASONED_FRACTION,
    TURN_EDGES,
    chat_row,
    dialogue_row,
    mixed_sources,
    mixed_traffic,
    write_jsonl,
)


def test_turn_counts_on_the_edges_are_counted_on_their_side(mixed_corpus: Path, tmp_path: Path) -> None:
    report = audit_against(mixed_corpus, str(write_jsonl(tmp_path / "traffic.jsonl", mixed_traffic())))
    expected: dict[str, int] = {}
    for row in mixed_traffic():
        bucket = dict(TURN_EDGES).get(sum(m["role"] == "assistant" for m in row["messages"]), "1")
        expected[bucket] = expected.get(bucket, 0) + 1
    assert report["traffic"]["counts"]["turns"] == {bucket: expected[bucket] for bucket in TURN_BUCKETS
                                                    if bucket in expected}
    assert report["corpus"]["counts"]["turns"].keys() == {"1", "2", "3"}  # the dialogues of 2 and 3 turns


def test_the_cli_passes_a_divergence_exactly_at_the_limit(corpus: Path, traffic: Path) -> None:
    """The known traffic's largest TVD is 0.8 (thinking): --max-divergence 0.8 passes, just under it fails."""
    report = audit_against(corpus, str(traffic))
    assert report["max_divergence"] == {"dimension": "thinking", "tvd": 0.8}
    at = corpus_cli("audit", corpus, "--against", traffic, "--max-divergence", "0.8")
    assert at.returncode == 0, at.stderr
    assert divergence_problems(report, 0.7999)[0] == (
        "thinking: total variation distance 0.800 exceeds --max-divergence 0.7999")


def test_the_mixed_corpus_plan_moves_thinking_between_the_sources_of_a_task(mixed_corpus: Path,
                                                                          tmp_path: Path) -> None:
    report = audit_against(mixed_corpus, str(write_jsonl(tmp_path / "traffic.jsonl", mixed_traffic())))
    plan = _planned(report)
    chat = {name: entry for name, entry in plan.items() if entry["task"] == "chat"}
    assert chat.keys() == {"plain", "reasoned", "halfway"}
    total = report["corpus"]["conversations"]
    wanted = round(total * 0.6)  # the traffic is 60% chat, half of it thinking
    have = sum(entry["rows"] for entry in chat.values())
    # halfway (neither the least nor the most thinking) keeps its share of the task; the move is plain -> reasoned.
    assert chat["halfway"]["target_rows"] == round(wanted * chat["halfway"]["rows"] / have)
    moved = chat["reasoned"]["target_rows"] - round(wanted * chat["reasoned"]["rows"] / have)
    assert moved > 0 and abs(round(wanted * chat["plain"]["rows"] / have) - chat["plain"]["target_rows"] - moved) <= 1
    reached = sum(entry["target_rows"] * entry["thinking_share"] for entry in chat.values()) / wanted
    assert reached == pytest.approx(0.5, abs=THINKING_TOLERANCE)
    suggestions = "\n".join(report["suggestions"])
    assert "task code: 10.0% of the traffic (0% thinking) and no corpus source: add a source with `task: code` " \
           f"(~{round(total * 0.1):,} rows at the corpus's size)" in suggestions
    assert "task summarization: the traffic is 100% thinking" in suggestions
    assert "task chat: the traffic" not in suggestions  # reached by the move


def test_the_mixed_corpus_diff_scales_counts_by_rows_read_over_rows_kept(mixed_corpus: Path, tmp_path: Path) -> None:
    report = audit_against(mixed_corpus, str(write_jsonl(tmp_path / "traffic.jsonl", mixed_traffic())))
    plan = _planned(report)
    dropped = {source: sum(reasons.values()) for source, reasons in Corpus.open(mixed_corpus).ledger_drops()
               .by_source.items()}
    assert dropped["plain"] == PLAIN_DUPLICATES and plan["plain"]["rows"] == PLAIN and dropped["docs"] > 0
    takes = {spec["name"]: spec.get("take") for spec in _patched_file(mixed_corpus, report["recipe_diff"])["sources"]}
    for name in ("plain", "halfway", "docs"):  # a count: the target's rows read at the drop rate of last time
        entry = plan[name]
        assert entry["change"] != 0
        read = entry["rows"] + dropped.get(name, 0)
        assert takes[name] == {"count": math.ceil(entry["target_rows"] * read / entry["rows"]),
                               "seed": 3 if name == "docs" else 0}
    reasoned = plan["reasoned"]
    assert takes["reasoned"] == {"fraction": round(REASONED_FRACTION * reasoned["target_rows"] / reasoned["rows"], 6),
                                 "seed": 0}


def test_without_a_ledger_the_counts_are_not_scaled(mixed_corpus: Path, tmp_path: Path) -> None:
    """A published copy (audit.json, no ledger): its drops stand in elsewhere, never in the rows read."""
    copy = tmp_path / "published"
    shutil.copytree(mixed_corpus, copy)
    (copy / LEDGER).unlink()
    report = audit_against(copy, str(write_jsonl(tmp_path / "traffic.jsonl", mixed_traffic())))
    assert report["corpus"]["skipped"]  # audit.json still counts the drops
    plan = _planned(report)
    takes = {spec["name"]: spec.get("take") for spec in _patched_file(copy, report["recipe_diff"])["sources"]}
    assert takes["plain"] == {"count": plan["plain"]["target_rows"], "seed": 0}


def test_the_recipe_diff_applied_moves_the_audit_towards_the_traffic(mixed_corpus: Path, tmp_path: Path) -> None:
    traffic = write_jsonl(tmp_path / "traffic.jsonl", mixed_traffic())
    before = audit_against(mixed_corpus, str(traffic))
    again = tmp_path / "again"
    again.mkdir()
    for name, rows in mixed_sources().items():
        write_jsonl(again / f"{name}.jsonl", rows)
    yaml_text = yaml.safe_dump(_patched_file(mixed_corpus, before["recipe_diff"]), sort_keys=False)
    (again / "recipe.yaml").write_text(yaml_text, encoding="utf-8")
    rebuilt = build_corpus(load_recipe(again / "recipe.yaml")).out_dir
    after = audit_against(rebuilt, str(traffic))
    for name in ("thinking", "task", "task_thinking"):
        assert after["divergence"][name]["tvd"] < before["divergence"][name]["tvd"], name
    assert after["corpus"]["by_task"]["chat"]["thinking_share"] == pytest.approx(0.5, abs=0.05)


def test_traffic_without_tasks_or_reasoning_leaves_out_what_it_cannot_say(mixed_corpus: Path, tmp_path: Path,
                                                                         tiny_model_dir: Path) -> None:
    """No task in the traffic: no task dimensions (a note says why) and one plan for the whole corpus; no
    reasoning in it: no reasoning-length dimension (the corpus has one); the worst dimension is the largest."""
    rows = [{"messages": dialogue_row(i, turns=1 + i % 3, thinking=False)["messages"]} for i in range(40)]
    options = AuditOptions(draft_vocab_size=500)
    report = audit_against(mixed_corpus, str(write_jsonl(tmp_path / "untasked.jsonl", rows)), options)
    assert report["readable"] == {"rows": 40, "skipped": 0, "skipped_share": 0.0, "max_skipped_share": 0.05,
                                  "partial": False, "folded_prefix": 0}
    assert report["notes"] == [
        "task mix left out: the traffic's rows name no task (a `task` field, or --against a recipe whose sources "
        "carry task tags)"]
    assert report["corpus"]["shares"]["reasoning_tokens"] and not report["traffic"]["shares"]["reasoning_tokens"]
    assert set(report["divergence"]) == {*FACT_DIMENSIONS, *TOKEN_DIMENSIONS} - {"task", "task_thinking",
                                                                               "reasoning_tokens"}
    worst = max(report["divergence"], key=lambda name: report["divergence"][name]["tvd"])
    assert report["max_divergence"] == {"dimension": worst, "tvd": report["divergence"][worst]["tvd"]}
    assert report["divergence"]["thinking"]["tvd"] > 0 and report["vocab"]["draft_vocab_size"] == 500
    assert Path(report["tokenizer"]).resolve() == tiny_model_dir.resolve()
    assert {entry["task"] for entry in report["plan"]} == {"(all)"}
    assert sum(entry["target_rows"] for entry in report["plan"]) == pytest.approx(
        report["corpus"]["conversations"], abs=len(report["plan"]) / 2)
    # The suggestions: the plan's, then the sources that cannot give more, then what a recipe cannot say.
    files = CorpusFiles(Corpus.open(mixed_corpus))
    plan, notes = _plan(report["corpus"], report["traffic"])
    diff, exhausted = _recipe_diff(files, plan)
    assert (report["plan"], report["recipe_diff"]) == (plan, diff)
    assert report["suggestions"] == notes + exhausted + _token_suggestions(report, files)
    assert exhausted and report["suggestions"][len(notes):len(notes) + len(exhausted)] == exhausted


def test_mostly_skipped_traffic_is_noted_in_the_report(mixed_corpus: Path, tmp_path: Path) -> None:
    traffic = write_jsonl(tmp_path / "partial.jsonl", mixed_traffic(), extra=b"{not json\n" * 6)
    report = audit_against(mixed_corpus, str(traffic))
    note = ("6 of the traffic's 106 rows (5.7%) were skipped, more than --max-skipped-share 0.05: every figure "
            "describes the 100 readable rows only")
    assert report["readable"] == {"rows": 100, "skipped": 6, "skipped_share": round(6 / 106, 6),
                                  "max_skipped_share": 0.05, "partial": True, "note": note, "folded_prefix": 0}
    assert report["notes"] == [note]
    allowed = audit_against(mixed_corpus, str(traffic), AuditOptions(max_skipped_share=0.06))
    assert "notes" not in allowed and not allowed["readable"]["partial"]


def test_an_empty_corpus_has_no_divergence_and_every_traffic_task_to_add(tmp_path: Path,
                                                                       tiny_model_dir: Path) -> None:
    """A corpus built with --allow-empty: nothing to compare (no worst dimension), a source to add per task."""
    write_jsonl(tmp_path / "none.jsonl", [chat_row(i, thinking=False) for i in range(3)])  # each past max_seq_len
    (tmp_path / "recipe.yaml").write_text(f"""
name: empty
target: {{model: tiny/target, tokenizer: {tiny_model_dir}}}
sources:
  - {{name: none, kind: replay, path: none.jsonl, task: chat, license: MIT}}
checks: {{max_seq_len: 8}}
output: {{dir: out}}
""", encoding="utf-8")
    empty = build_corpus(load_recipe(tmp_path / "recipe.yaml"), allow_empty=True).out_dir
    report = audit_against(empty, str(write_jsonl(tmp_path / "traffic.jsonl", mixed_traffic())))
    assert report["corpus"]["conversations"] == 0
    assert report["divergence"] == {} and report["max_divergence"] is None
    assert report["plan"] == [] and report["recipe_diff"] is None
    assert [note.split(":")[0] for note in report["suggestions"][:3]] == ["task chat", "task code",
                                                                          "task summarization"]
