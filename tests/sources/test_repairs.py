"""Repairs instead of drops: each rule on a row of its shape (exact turns kept, flag, count), each rule
switched off (the row is skipped as before), prompts, the recipe setting, the audit's counts by source, and
a real ShareGPT dump of 3,000 conversations whose shapes the test counts itself."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from corpus_builder.assemble import build_corpus
from corpus_builder.audit import audit_corpus
from corpus_builder.errors import REASONS, CorpusError, Skipped
from corpus_builder.recipe import load_recipe
from corpus_builder.records import FLAG_UNCLOSED_THINK, Conversation, RepairRules
from corpus_builder.sources import iter_source
from tests.sources.test_sources import spec, split, turns, write_lines
from tests.support.real_data import sharegpt_records, write_rows

REPO = Path(__file__).resolve().parents[2]
LEADING = "repaired:leading_assistant:drop"
MERGED = "repaired:consecutive_turns:merge"
SPLIT = "repaired:consecutive_turns:split"
TRIMMED = "repaired:trailing_user:trim"
EMPTY = "repaired:empty_turns:drop"
MID_KEPT, MID_MOVED, MID_DROPPED = "repaired:mid_system:keep", "repaired:mid_system:move", "repaired:mid_system:drop"

Turns = list[tuple[str, str]]


def read_one(tmp_path: Path, row_turns: Turns, kind: str = "replay",
             **rules: str) -> tuple[list[Conversation], list[Skipped]]:
    write_lines(tmp_path / "rows.jsonl", [{"id": "row-1", "messages": turns(*row_turns)}])
    source = spec(kind=kind, paths=("rows.jsonl",), repair=RepairRules(**rules))
    return split(list(iter_source(source, tmp_path)))


def roles_and_texts(conversation: Conversation) -> Turns:
    return [(m.role, m.content) for m in conversation.messages]


# --- each rule on its shape, with its default policy ---------------------------------------------------

# (name, the row's turns, the turns kept, the flags)
SHAPES: list[tuple[str, Turns, Turns, list[str]]] = [
    ("leading assistant (a chunk of a longer chat)",
     [("assistant", "...the end of an earlier answer."), ("user", "q1"), ("assistant", "a1")],
     [("user", "q1"), ("assistant", "a1")], [LEADING]),
    ("several leading assistant turns after the system turn",
     [("system", "s"), ("assistant", "x"), ("assistant", "y"), ("user", "q"), ("assistant", "a")],
     [("system", "s"), ("user", "q"), ("assistant", "a")], [LEADING]),
    ("two user turns in a row",
     [("user", "q1"), ("user", "q1 again"), ("assistant", "a1")],
     [("user", "q1\n\nq1 again"), ("assistant", "a1")], [MERGED]),
    ("three assistant turns in a row",
     [("user", "q"), ("assistant", "a1"), ("assistant", "a2"), ("assistant", "a3"), ("user", "q2"),
      ("assistant", "b")],
     [("user", "q"), ("assistant", "a1\n\na2\n\na3"), ("user", "q2"), ("assistant", "b")], [MERGED]),
    ("a trailing user turn",
     [("user", "q1"), ("assistant", "a1"), ("user", "unanswered")],
     [("user", "q1"), ("assistant", "a1")], [TRIMMED]),
    ("an empty system turn",
     [("system", " "), ("user", "q"), ("assistant", "a")],
     [("user", "q"), ("assistant", "a")], [EMPTY]),
    ("an empty answer between two questions",
     [("user", "q1"), ("assistant", ""), ("user", "q2"), ("assistant", "a2")],
     [("user", "q1\n\nq2"), ("assistant", "a2")], [EMPTY, MERGED]),
    ("a system turn in the middle",
     [("user", "q1"), ("assistant", "a1"), ("system", "now answer in French"), ("user", "q2"),
      ("assistant", "r2")],
     [("user", "q1"), ("assistant", "a1"), ("system", "now answer in French"), ("user", "q2"),
      ("assistant", "r2")], [MID_KEPT]),
    ("two system turns first",
     [("system", "s1"), ("system", "s2"), ("user", "q"), ("assistant", "a")],
     [("system", "s1"), ("system", "s2"), ("user", "q"), ("assistant", "a")], [MID_KEPT]),
    ("a system turn between two user turns (they are consecutive)",
     [("user", "q1"), ("system", "s"), ("user", "q2"), ("assistant", "a")],
     [("system", "s"), ("user", "q1\n\nq2"), ("assistant", "a")], [MERGED]),
    ("every shape at once",
     [("assistant", "tail"), ("user", "q1"), ("user", ""), ("user", "q1b"), ("assistant", "a1"),
      ("system", "s"), ("user", "q2"), ("assistant", "a2"), ("user", "left")],
     [("user", "q1\n\nq1b"), ("assistant", "a1"), ("system", "s"), ("user", "q2"), ("assistant", "a2")],
     [EMPTY, LEADING, TRIMMED, MERGED, MID_KEPT]),
]


@pytest.mark.parametrize(("row_turns", "kept_turns", "flags"), [shape[1:] for shape in SHAPES],
                         ids=[shape[0] for shape in SHAPES])
def test_each_shape_is_repaired_and_flagged(tmp_path: Path, row_turns: Turns, kept_turns: Turns,
                                            flags: list[str]) -> None:
    kept, skipped = read_one(tmp_path, row_turns)
    assert skipped == []
    assert [roles_and_texts(c) for c in kept] == [kept_turns]
    assert kept[0].flags == flags
    assert kept[0].provenance.to_json() == {"source_file": "rows.jsonl", "source_line": 1, "source_id": "row-1"}


def test_a_valid_row_is_not_touched(tmp_path: Path) -> None:
    row = [("system", "s"), ("user", "q"), ("assistant", "a"), ("user", "q2"), ("assistant", "a2")]
    kept, _ = read_one(tmp_path, row)
    assert roles_and_texts(kept[0]) == row and kept[0].flags == []


def test_merged_turns_keep_their_reasoning(tmp_path: Path) -> None:
    write_lines(tmp_path / "rows.jsonl", [{"messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>first</think>part one"},
        {"role": "assistant", "content": "part two", "reasoning_content": "second"}]}])
    kept, _ = split(list(iter_source(spec(paths=("rows.jsonl",)), tmp_path)))
    answer = kept[0].messages[1]
    assert (answer.content, answer.reasoning) == ("part one\n\npart two", "first\n\nsecond")
    assert kept[0].thinking and kept[0].flags == [MERGED]


def test_a_reasoning_only_answer_is_not_an_empty_turn(tmp_path: Path) -> None:
    write_lines(tmp_path / "rows.jsonl", [{"messages": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "", "reasoning": "r"}]}])
    kept, _ = split(list(iter_source(spec(paths=("rows.jsonl",)), tmp_path)))
    assert [m.reasoning for m in kept[0].messages] == [None, "r"] and kept[0].flags == []


def test_an_unclosed_think_block_in_a_dropped_empty_turn_is_no_flag(tmp_path: Path) -> None:
    kept, _ = read_one(tmp_path, [("user", "q"), ("assistant", "a"), ("user", "q2"), ("assistant", "<think>"),
                                  ("assistant", "b")])
    assert roles_and_texts(kept[0]) == [("user", "q"), ("assistant", "a"), ("user", "q2"), ("assistant", "b")]
    assert kept[0].flags == [EMPTY]


def test_an_unclosed_think_block_stays_a_fact_of_the_row(tmp_path: Path) -> None:
    kept, _ = read_one(tmp_path, [("user", "q"), ("assistant", "<think>never closed"), ("assistant", "more")])
    assert kept[0].flags == [FLAG_UNCLOSED_THINK, MERGED]


# --- the other policies ---------------------------------------------------------------------------------

def test_split_cuts_the_row_into_conversations_of_their_own(tmp_path: Path) -> None:
    row = [("user", "q1"), ("assistant", "a1"), ("assistant", "chunk two starts"), ("user", "q2"),
           ("assistant", "a2"), ("user", "q3"), ("system", "s"), ("user", "q4"), ("assistant", "a4")]
    kept, skipped = read_one(tmp_path, row, consecutive_turns="split")
    assert skipped == []
    assert [roles_and_texts(c) for c in kept] == [
        [("user", "q1"), ("assistant", "a1")],
        [("user", "q2"), ("assistant", "a2")],  # the part starts with an assistant turn, then a lone user turn
        [("system", "s"), ("user", "q4"), ("assistant", "a4")],  # the system turn opens the part it preceded
    ]
    assert [c.flags for c in kept] == [[SPLIT], [SPLIT, LEADING, TRIMMED], [SPLIT]]
    assert [c.provenance.source_part for c in kept] == [0, 1, 2]
    assert {c.provenance.source_line for c in kept} == {1}
    assert len({c.id for c in kept}) == 3


def test_split_leaves_out_a_part_with_no_exchange(tmp_path: Path) -> None:
    kept, _ = read_one(tmp_path, [("user", "q1"), ("user", "q2"), ("assistant", "a2")], consecutive_turns="split")
    assert [roles_and_texts(c) for c in kept] == [[("user", "q2"), ("assistant", "a2")]]
    assert kept[0].provenance.source_part == 0 and kept[0].flags == [SPLIT]


MID_ROW = [("system", "be brief"), ("user", "q1"), ("assistant", "a1"), ("system", "now in French"),
           ("user", "q2"), ("assistant", "r2")]


@pytest.mark.parametrize(("policy", "kept_turns", "flags"), [
    ("keep", MID_ROW, [MID_KEPT]),
    ("move", [("system", "be brief\n\nnow in French"), *MID_ROW[1:3], *MID_ROW[4:]], [MID_MOVED]),
    ("drop", [*MID_ROW[:3], *MID_ROW[4:]], [MID_DROPPED]),
])
def test_mid_system_policies(tmp_path: Path, policy: str, kept_turns: Turns, flags: list[str]) -> None:
    kept, _ = read_one(tmp_path, MID_ROW, mid_system=policy)
    assert roles_and_texts(kept[0]) == kept_turns and kept[0].flags == flags


def test_move_makes_a_leading_system_turn_when_there_is_none(tmp_path: Path) -> None:
    kept, _ = read_one(tmp_path, MID_ROW[1:], mid_system="move")
    assert roles_and_texts(kept[0]) == [("system", "now in French"), *MID_ROW[1:3], *MID_ROW[4:]]


@pytest.mark.parametrize("leading", [[("system", "s0")], []], ids=["with-a-leading-system-turn", "without"])
def test_move_joins_the_system_turns_in_the_order_they_came(tmp_path: Path, leading: Turns) -> None:
    row = [*leading, ("user", "q1"), ("assistant", "a1"), ("system", "s1"), ("user", "q2"), ("assistant", "a2"),
           ("system", "s2"), ("system", "s3"), ("user", "q3"), ("assistant", "a3")]
    kept, _ = read_one(tmp_path, row, mid_system="move")
    said = [text for _, text in leading]
    assert roles_and_texts(kept[0]) == [("system", "\n\n".join([*said, "s1", "s2", "s3"])), ("user", "q1"),
                                        ("assistant", "a1"), ("user", "q2"), ("assistant", "a2"), ("user", "q3"),
                                        ("assistant", "a3")]
    assert kept[0].flags == [MID_MOVED]


@pytest.mark.parametrize(("row_turns", "detail"), [
    ([("user", "q"), ("user", " "), ("assistant", ""), ("user", "")], "turn 1 (user) is empty"),
    ([("system", "s"), ("user", "q"), ("assistant", "\n"), ("user", "q2"), ("assistant", " ")],
     "turn 2 (assistant) is empty"),
], ids=["after-a-kept-turn", "after-a-system-turn"])
@pytest.mark.parametrize("policy", ["drop", "skip"])
def test_a_skip_for_empty_turns_names_the_first_empty_turn_at_its_place_in_the_row(
        tmp_path: Path, row_turns: Turns, detail: str, policy: str) -> None:
    """Dropped, the empty turns leave no exchange, or the rule skips the row at once: either way the skip names the
    row's first empty turn, numbered as in the row (a system turn before it counted)."""
    kept, skipped = read_one(tmp_path, row_turns, empty_turns=policy)
    assert kept == [] and [(s.reason, s.detail) for s in skipped] == [("empty_content", detail)]


# --- each rule switched off: skipped as before --------------------------------------------------------

@pytest.mark.parametrize(("rule", "row_turns", "reason"), [
    ("leading_assistant", [("assistant", "x"), ("user", "q"), ("assistant", "a")], "wrong_role_order"),
    ("consecutive_turns", [("user", "q"), ("user", "q2"), ("assistant", "a")], "wrong_role_order"),
    ("trailing_user", [("user", "q"), ("assistant", "a"), ("user", "q2")], "wrong_role_order"),
    ("empty_turns", [("user", "q"), ("assistant", "a"), ("user", " "), ("assistant", "b")], "empty_content"),
    ("mid_system", MID_ROW, "wrong_role_order"),
])
def test_a_rule_set_to_skip_skips_the_row_as_before(tmp_path: Path, rule: str, row_turns: Turns,
                                                    reason: str) -> None:
    kept, skipped = read_one(tmp_path, row_turns, **{rule: "skip"})
    assert kept == [] and [(s.reason, s.location) for s in skipped] == [(reason, "rows.jsonl:1")]
    repaired, _ = read_one(tmp_path, row_turns)  # and the default repairs it
    assert len(repaired) == 1


def test_every_rule_off_skips_what_the_strict_order_skipped(tmp_path: Path) -> None:
    off = {rule: "skip" for rule in ("leading_assistant", "consecutive_turns", "trailing_user", "empty_turns",
                                     "mid_system")}
    for _, row_turns, _, _ in SHAPES:
        kept, skipped = read_one(tmp_path, row_turns, **off)
        assert kept == [] and len(skipped) == 1, row_turns


@pytest.mark.parametrize(("row_turns", "reason"), [
    ([("assistant", "only an answer")], "wrong_role_order"),
    ([("assistant", "a"), ("user", "q")], "wrong_role_order"),
    ([("system", "s"), ("user", "q")], "no_assistant_turn"),
    ([("user", "q"), ("assistant", " ")], "empty_content"),
    ([("system", "s"), ("assistant", "a"), ("assistant", "b")], "wrong_role_order"),
])
def test_a_row_with_no_exchange_left_is_skipped_with_its_own_reason(tmp_path: Path, row_turns: Turns,
                                                                    reason: str) -> None:
    kept, skipped = read_one(tmp_path, row_turns)
    assert kept == [] and [s.reason for s in skipped] == [reason]
    assert reason in REASONS


# --- prompts sources ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("row_turns", "prompt_turns", "flags"), [
    ([("assistant", "x"), ("user", "q1"), ("assistant", "a1"), ("user", "q2")],
     [("user", "q1"), ("user", "q2")], [LEADING]),
    ([("user", "q1"), ("user", "more of q1"), ("assistant", "a")], [("user", "q1\n\nmore of q1")], [MERGED]),
    ([("system", ""), ("user", "q")], [("user", "q")], [EMPTY]),
    ([("user", "q1"), ("assistant", "a1"), ("system", "s"), ("user", "q2")],
     [("user", "q1"), ("system", "s"), ("user", "q2")], [MID_KEPT]),
    # the last user turn is what the target answers: not trimmed, and a valid prompt as it is
    ([("user", "q1"), ("assistant", "a1"), ("user", "q2")], [("user", "q1"), ("user", "q2")], []),
])
def test_prompts_get_every_rule_but_the_trailing_trim(tmp_path: Path, row_turns: Turns, prompt_turns: Turns,
                                                      flags: list[str]) -> None:
    kept, skipped = read_one(tmp_path, row_turns, kind="prompts")
    assert skipped == []
    assert roles_and_texts(kept[0]) == prompt_turns and kept[0].flags == flags


def test_a_prompt_with_no_user_turn_left_is_skipped(tmp_path: Path) -> None:
    _, skipped = read_one(tmp_path, [("system", "s"), ("assistant", "a")], kind="prompts")
    assert [s.reason for s in skipped] == ["wrong_role_order"]


# --- the recipe setting, the row schema, the audit ------------------------------------------------------

def test_the_recipe_sets_the_rules_and_refuses_unknown_policies(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    write_rows(tmp_path / "rows.jsonl", [{"messages": turns(("user", "q"), ("assistant", "a"))}])
    base = ("name: r\ntarget: {model: m}\noutput: {dir: out}\nsources:\n"
            "  - {name: dump, kind: replay, path: rows.jsonl%s}\n")
    recipe.write_text(base % "", encoding="utf-8")
    assert load_recipe(recipe).sources[0].repair == RepairRules()
    recipe.write_text(base % ", repair: {consecutive_turns: split, mid_system: move, empty_turns: skip}",
                      encoding="utf-8")
    assert load_recipe(recipe).sources[0].repair == RepairRules(consecutive_turns="split", mid_system="move",
                                                                empty_turns="skip")
    recipe.write_text(base % ", repair: {leading_assistant: off, trailing: trim}", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"sources\[0\]\.repair") as refused:
        load_recipe(recipe)
    assert "leading_assistant" in str(refused.value) and "trailing" in str(refused.value)


def test_the_row_schema_knows_every_repair_flag() -> None:
    recipe_schema = json.loads((REPO / "schemas" / "recipe.schema.json").read_text())
    rules = recipe_schema["$defs"]["source"]["properties"]["repair"]["properties"]
    assert set(rules) == set(RepairRules.__dataclass_fields__)
    produced = {f"repaired:{rule}:{policy}" for rule, setting in rules.items() for policy in setting["enum"]
                if policy != "skip"}
    row_schema = json.loads((REPO / "schemas" / "conversation.schema.json").read_text())
    assert produced <= set(row_schema["properties"]["flags"]["items"]["enum"])
    assert {rule: setting["default"] for rule, setting in rules.items()} == {
        rule: getattr(RepairRules(), rule) for rule in rules}


def test_the_build_counts_repairs_by_source(tmp_path: Path) -> None:
    shapes = [row_turns for _, row_turns, _, _ in SHAPES]
    write_lines(tmp_path / "dump.jsonl", [{"messages": turns(*row_turns)} for row_turns in shapes])
    write_lines(tmp_path / "clean.jsonl", [{"messages": turns(("user", "hi"), ("assistant", "hello"))}])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("""\
name: r
target: {model: m}
sources:
  - {name: dump, kind: replay, path: dump.jsonl, repair: {mid_system: drop}}
  - {name: clean, kind: replay, path: clean.jsonl}
checks: {dedup: none}  # some shapes repair to the same turns
split: {validation_fraction: 0}
output: {dir: out}
""", encoding="utf-8")
    result = build_corpus(load_recipe(recipe))
    expected = Counter(flag for _, _, _, flags in SHAPES for flag in flags)
    expected[MID_DROPPED] = expected.pop(MID_KEPT)
    report = json.loads((result.out_dir / "audit.json").read_text())
    assert report["by_source"]["dump"]["flags"] == dict(sorted(expected.items()))
    assert report["by_source"]["clean"]["flags"] == {}
    assert report["flags"] == report["by_source"]["dump"]["flags"]
    assert report["by_source"]["dump"]["conversations"] == len(SHAPES)
    assert audit_corpus(result.out_dir, secrets=False)["by_source"] == report["by_source"]


# --- the messy real dump ------------------------------------------------------------------------------

DUMP_ROWS = 3000
SPEAKERS = {"human": "user", "gpt": "assistant", "bing": "assistant", "chatgpt": "assistant",
            "bard": "assistant", "system": "system"}


def expected_repairs(row: dict[str, Any]) -> tuple[bool, set[str]]:
    """Whether a ShareGPT row holds a user -> assistant exchange once repaired, and the rules that had to act,
    worked out from the row's shape alone (every speaker known, no system turn after the first turn: the
    test checks both of the dump)."""
    rows_turns = row["conversations"]
    if not isinstance(rows_turns, list) or not rows_turns:
        return False, set()
    said = [(SPEAKERS[turn["from"]], turn["value"]) for turn in rows_turns]
    speakers = "".join("u" if role == "user" else "a" for role, text in said if role != "system" and text.strip())
    rules = {EMPTY} if any(not text.strip() for _, text in said) else set()
    first_user, last_answer = speakers.find("u"), speakers.rfind("a")
    if first_user < 0 or last_answer < first_user:
        return False, set()
    if first_user > 0:
        rules.add(LEADING)
    if last_answer < len(speakers) - 1:
        rules.add(TRIMMED)
    if "uu" in speakers[first_user:last_answer + 1] or "aa" in speakers[first_user:last_answer + 1]:
        rules.add(MERGED)
    return True, rules


def test_a_messy_real_sharegpt_dump_keeps_every_row_with_an_exchange(tmp_path: Path) -> None:
    rows = list(itertools.islice(sharegpt_records(), DUMP_ROWS))
    path = tmp_path / "sharegpt.jsonl"
    write_rows(path, rows)

    # the dump's shapes, counted from the raw rows
    listed = [row["conversations"] for row in rows if row["conversations"]]
    speakers = [[turn["from"] for turn in conversation] for conversation in listed]
    shapes = {
        "empty conversation": len(rows) - len(listed),
        "starts with the assistant": sum(s[0] == "gpt" for s in speakers),
        "two turns of one speaker in a row": sum(any(a == b for a, b in itertools.pairwise(s)) for s in speakers),
        "an empty turn": sum(any(not t["value"].strip() for t in c) for c in listed),
        "a system turn after the first": sum("system" in s[1:] for s in speakers),
        "ends with the user": sum(s[-1] == "human" for s in speakers),
    }
    assert shapes == {"empty conversation": 21, "starts with the assistant": 1179,
                      "two turns of one speaker in a row": 43, "an empty turn": 44,
                      "a system turn after the first": 0, "ends with the user": 3}
    assert {turn["from"] for c in listed for turn in c} <= set(SPEAKERS)
    raw_ids = Counter(row["id"] for row in rows)
    raw_conversations = Counter(orjson.dumps(conversation) for conversation in listed)
    # Duplicates are a whole-stream question, left to the build's checks (dedup), not to the readers.
    assert sum(n - 1 for n in raw_ids.values()) == 20
    assert sum(n - 1 for n in raw_conversations.values()) == 21

    expected = [expected_repairs(row) for row in rows]
    kept_rows = [row for row, (kept, _) in zip(rows, expected, strict=True) if kept]
    expected_flags = Counter(flag for kept, rules in expected if kept for flag in rules)
    assert len(kept_rows) == 2948 and sum(bool(rules) for kept, rules in expected if kept) == 1160
    assert expected_flags == {LEADING: 1155, EMPTY: 43, MERGED: 12, TRIMMED: 2}

    kept, skipped = split(list(iter_source(spec(name="sharegpt", paths=("sharegpt.jsonl",)), tmp_path)))
    assert [c.provenance.source_id for c in kept] == [row["id"] for row in kept_rows]
    assert Counter(flag for c in kept for flag in c.flags) == expected_flags
    for conversation, row in zip(kept, kept_rows, strict=True):
        _, rules = expected_repairs(row)
        assert set(conversation.flags) == rules
        texts = [turn["value"] for turn in row["conversations"]]
        if not rules:
            assert [m.content for m in conversation.messages] == texts
        elif rules == {LEADING}:  # exactly the assistant turns before the first user turn are gone
            first_user = next(i for i, turn in enumerate(row["conversations"]) if turn["from"] == "human")
            assert [m.content for m in conversation.messages] == texts[first_user:]
    assert len(skipped) == DUMP_ROWS - 2948
    assert Counter(s.reason for s in skipped) == {"wrong_role_order": 29, "bad_messages": 21,
                                                  "empty_content": 1, "no_assistant_turn": 1}

    # every rule off: what the strict order kept before repairs existed (measured with that code)
    off = RepairRules(**{rule: "skip" for rule in RepairRules.__dataclass_fields__})
    strict_kept, strict_skipped = split(list(iter_source(spec(paths=("sharegpt.jsonl",), repair=off), tmp_path)))
    assert len(strict_kept) == 1788 and all(c.flags == [] for c in strict_kept)
    assert Counter(s.reason for s in strict_skipped) == {"wrong_role_order": 1146, "empty_content": 44,
                                                         "bad_messages": 21, "no_assistant_turn": 1}

    # `corpus audit FILE` shows the same before any build, after the build's default checks: copies of a kept
    # conversation (its words, whatever the case, punctuation and spacing) are counted as duplicates (the first
    # one stays)
    report = audit_corpus(path, secrets=False)
    firsts: dict[str, Conversation] = {}
    for conversation in kept:
        firsts.setdefault(_words(conversation), conversation)
    assert report["conversations"] == len(firsts) == 2948 - (len(kept) - len(firsts))
    first_flags = Counter(flag for c in firsts.values() for flag in c.flags)
    assert report["by_source"]["sharegpt.jsonl"]["flags"] == dict(sorted(first_flags.items()))
    expected_skips = Counter(s.reason for s in skipped) + Counter({"duplicate": len(kept) - len(firsts)})
    assert report["skipped"] == dict(sorted(expected_skips.items()))


def _words(conversation: Conversation) -> str:
    """What exact dedup compares, written independently: every turn's reasoning and text, lowercased, with
    sentence punctuation, quotes and brackets as spaces, whitespace collapsed."""
    parts = [part for m in conversation.messages for part in (m.reasoning, m.content) if part]
    return " ".join(re.sub(r"[!\"'(),.:;?\[\]`{}\u2018\u2019\u201c\u201d\u2026]", " ", " ".join(parts).lower()).split())
