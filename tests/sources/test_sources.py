"""Sources: every format, mapping, reasoning representation, bad row and whole-file error, take, the
Hub (through a local mirror) and real conversations from offline PyPI datasets."""

from __future__ import annotations

import itertools
import random
import re
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from corpus_builder.errors import REASONS, CorpusError, Skipped
from corpus_builder.recipe import HubRef, Mapping, SourceSpec, Take
from corpus_builder.records import FLAG_UNCLOSED_THINK, Conversation, RepairRules, conversation_id
from corpus_builder.sources import iter_file, iter_source, resolve_paths
from corpus_builder.sources.hub import MIRROR_ENV
from tests.support.real_data import sharegpt_records, write_chitchat, write_gsm8k, write_rows, write_sharegpt


def turns(*pairs: tuple[str, str], keys: tuple[str, str] = ("role", "content")) -> list[dict[str, str]]:
    return [{keys[0]: role, keys[1]: content} for role, content in pairs]


CHAT_ROWS = [
    {"id": f"r{i}", "messages": turns(("user", f"question {i}"), ("assistant", f"answer {i}"))}
    for i in range(5)
]


def split(items: list[Conversation | Skipped]) -> tuple[list[Conversation], list[Skipped]]:
    kept = [item for item in items if isinstance(item, Conversation)]
    return kept, [item for item in items if isinstance(item, Skipped)]


def read(path: Path, **kwargs: Any) -> tuple[list[Conversation], list[Skipped]]:
    return split(list(iter_file(path, **kwargs)))


def write_lines(path: Path, lines: list[bytes | str | dict[str, Any]]) -> Path:
    encoded = [line if isinstance(line, bytes) else
               line.encode() if isinstance(line, str) else orjson.dumps(line) for line in lines]
    path.write_bytes(b"\n".join(encoded) + b"\n")
    return path


def spec(name: str = "src", kind: str = "replay", paths: tuple[str, ...] = (), **kwargs: Any) -> SourceSpec:
    return SourceSpec(name=name, kind=kind, paths=paths, **kwargs)


# --- formats -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", ["jsonl", "jsonl.zst", "json", "parquet"])
def test_every_format_gives_the_same_conversations(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"chat.{suffix}"
    write_rows(path, CHAT_ROWS)
    kept, skipped = read(path)
    assert skipped == []
    assert [c.provenance.source_id for c in kept] == [f"r{i}" for i in range(5)]
    assert [c.messages[1].content for c in kept] == [f"answer {i}" for i in range(5)]
    expected_ids = [conversation_id("chat." + suffix, c.messages) for c in kept]
    assert [c.id for c in kept] == expected_ids
    first = kept[0]
    assert first.origin == "replay" and first.source == path.name
    assert first.provenance.source_file == path.name
    if suffix.startswith("jsonl"):
        assert [c.provenance.source_line for c in kept] == [1, 2, 3, 4, 5]
    else:
        assert [c.provenance.source_row for c in kept] == [0, 1, 2, 3, 4]


def test_json_object_with_rows_under_data(tmp_path: Path) -> None:
    path = tmp_path / "wrapped.json"
    path.write_bytes(orjson.dumps({"version": 2, "data": CHAT_ROWS}))
    kept, _ = read(path)
    assert len(kept) == 5


def test_format_given_explicitly_overrides_the_suffix(tmp_path: Path) -> None:
    path = tmp_path / "chat.txt"
    write_rows(tmp_path / "chat.jsonl", CHAT_ROWS)
    (tmp_path / "chat.jsonl").rename(path)
    kept, _ = read(path, fmt="jsonl")
    assert len(kept) == 5
    with pytest.raises(CorpusError, match="cannot tell the format"):
        list(iter_file(path))


def test_zstd_with_several_frames(tmp_path: Path) -> None:
    path = tmp_path / "frames.jsonl.zst"
    frames = [zstandard.ZstdCompressor().compress(orjson.dumps(row) + b"\n") for row in CHAT_ROWS]
    path.write_bytes(b"".join(frames))
    kept, _ = read(path)
    assert len(kept) == 5


def test_blank_lines_and_crlf_are_not_rows(tmp_path: Path) -> None:
    path = tmp_path / "blank.jsonl"
    lines = [orjson.dumps(row) + b"\r" for row in CHAT_ROWS[:2]]
    path.write_bytes(b"\n\n".join(lines) + b"\n\n  \n")
    kept, skipped = read(path)
    assert (len(kept), skipped) == (2, [])
    assert [c.provenance.source_line for c in kept] == [1, 3]


def test_parquet_turns_with_a_reasoning_column(tmp_path: Path) -> None:
    path = tmp_path / "reasoning.parquet"
    rows = [{"messages": [{"role": "user", "content": "2+2?", "reasoning_content": None},
                          {"role": "assistant", "content": "4", "reasoning_content": "two and two"}]},
            {"messages": [{"role": "user", "content": "hi", "reasoning_content": None},
                          {"role": "assistant", "content": "hello", "reasoning_content": None}]}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    kept, _ = read(path)
    assert kept[0].messages[1].reasoning == "two and two" and kept[0].thinking
    assert kept[1].messages[1].reasoning is None and not kept[1].thinking


# --- mappings ----------------------------------------------------------------------------------------

def test_sharegpt_roles_and_aliases(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "sg.jsonl", [
        {"id": "a", "conversations": turns(("system", "be brief"), ("human", "hi"), ("gpt", "hello"),
                                           ("user", "again"), ("chatgpt", "yes"), keys=("from", "value"))},
        {"id": "b", "conversations": turns(("human", "q"), ("bard", "a1"), ("human", "q2"), ("bing", "a2"),
                                           ("human", "q3"), ("model", "a3"), keys=("from", "value"))},
    ])
    kept, skipped = read(path, mapping=Mapping(style="sharegpt"))
    assert skipped == []
    assert [m.role for m in kept[0].messages] == ["system", "user", "assistant", "user", "assistant"]
    assert [m.content for m in kept[1].messages][-1] == "a3"
    assert read(path)[0][0].id == kept[0].id  # auto detects sharegpt


def test_messages_style_in_a_conversations_field(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "conv.jsonl",
                       [{"conversations": turns(("user", "q"), ("assistant", "a"))}])
    for style in ("messages", "auto"):
        kept, _ = read(path, mapping=Mapping(style=style))
        assert [(m.role, m.content) for m in kept[0].messages] == [("user", "q"), ("assistant", "a")]


def test_mapping_field_names_the_turns_and_id_field_the_id(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "custom.jsonl", [
        {"uid": 7, "dialogue": turns(("human", "q"), ("gpt", "a"), keys=("from", "value")),
         "messages": "not the turns"}])
    for style in ("sharegpt", "auto"):
        kept, skipped = read(path, mapping=Mapping(style=style, field="dialogue", id_field="uid"))
        assert skipped == []
        assert kept[0].provenance.source_id == "7"
        assert kept[0].messages[1].content == "a"


def test_gsm8k_replay_and_prompts(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "gsm.jsonl", [{"question": "1+1?", "answer": "1+1=2\n#### 2"}])
    kept, _ = read(path)
    assert [(m.role, m.content) for m in kept[0].messages] == [("user", "1+1?"), ("assistant", "1+1=2\n#### 2")]
    kept, _ = read(path, kind="prompts", mapping=Mapping(style="gsm8k"))
    assert [m.role for m in kept[0].messages] == ["user"]
    assert kept[0].origin == "prompt"
    assert kept[0].provenance.reference_answer == "1+1=2\n#### 2"


def test_field_style_reads_one_prompt_column(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "prompts.jsonl", [{"text": "Write a haiku.", "id": "p1"}])
    kept, _ = read(path, kind="prompts", mapping=Mapping(style="field", field="text"))
    assert [(m.role, m.content) for m in kept[0].messages] == [("user", "Write a haiku.")]
    assert kept[0].provenance.source_id == "p1"
    # auto recognises a plain `prompt` column
    auto = write_lines(tmp_path / "auto.jsonl", [{"prompt": "Explain tides."}])
    assert read(auto, kind="prompts")[0][0].messages[0].content == "Explain tides."


def test_auto_detects_once_per_file_after_unrecognised_rows(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "mixed.jsonl", [
        {"meta": 1},
        {"messages": turns(("user", "q"), ("assistant", "a"))},
        {"question": "not read as gsm8k: the file is messages style"},
    ])
    kept, skipped = read(path)
    assert len(kept) == 1
    assert [(s.reason, s.location) for s in skipped] == [("missing_messages", "mixed.jsonl:1"),
                                                          ("missing_messages", "mixed.jsonl:3")]


# --- prompts sources ---------------------------------------------------------------------------------

def test_prompts_keep_system_and_user_turns_and_add_the_system_prompt(tmp_path: Path) -> None:
    write_lines(tmp_path / "p.jsonl", [
        {"messages": turns(("user", "q1"), ("assistant", "a1"), ("user", "q2"))},
        {"messages": turns(("system", "own system"), ("user", "q"), ("assistant", "a <think>open"))},
        {"messages": turns(("system", "only a system turn"))},
    ])
    source = spec(kind="prompts", paths=("p.jsonl",), system_prompt="You are helpful.", task="chat")
    kept, skipped = split(list(iter_source(source, tmp_path)))
    assert [(m.role, m.content) for m in kept[0].messages] == [
        ("system", "You are helpful."), ("user", "q1"), ("user", "q2")]
    assert [m.content for m in kept[1].messages] == ["own system", "q"]
    assert kept[1].flags == []  # the open think block was in a discarded assistant turn
    assert all(c.origin == "prompt" and c.task == "chat" for c in kept)
    assert kept[0].id == conversation_id("src", kept[0].messages)
    assert [s.reason for s in skipped] == ["wrong_role_order"]


def test_prompts_check_role_order_before_dropping_assistant_turns(tmp_path: Path) -> None:
    write_lines(tmp_path / "p.jsonl", [{"messages": turns(("user", "q"), ("user", "q2"))}])
    strict = spec(kind="prompts", paths=("p.jsonl",), repair=RepairRules(consecutive_turns="skip"))
    _, skipped = split(list(iter_source(strict, tmp_path)))
    assert [s.reason for s in skipped] == ["wrong_role_order"]
    kept, _ = split(list(iter_source(spec(kind="prompts", paths=("p.jsonl",)), tmp_path)))  # repaired by default
    assert [(m.role, m.content) for m in kept[0].messages] == [("user", "q\n\nq2")]


# --- reasoning ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["reasoning", "reasoning_content", "thinking"])
def test_reasoning_fields(tmp_path: Path, key: str) -> None:
    path = write_lines(tmp_path / "r.jsonl", [{"messages": [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "a", key: "  because  "}]}])
    kept, _ = read(path)
    assert (kept[0].messages[1].content, kept[0].messages[1].reasoning) == ("a", "because")


def test_reasoning_on_sharegpt_turns(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "r.jsonl", [{"conversations": [
        {"from": "human", "value": "q"}, {"from": "gpt", "value": "a", "thinking": "hmm"}]}])
    assert read(path)[0][0].messages[1].reasoning == "hmm"


@pytest.mark.parametrize(("content", "answer", "reasoning"), [
    ("<think>\nstep one\n</think>\n\nThe answer is 4.", "The answer is 4.", "step one"),
    ("step one\n</think>\nThe answer is 4.", "The answer is 4.", "step one"),  # template opened the block
    ("<think></think>The answer is 4.", "The answer is 4.", None),
])
def test_think_blocks_move_out_of_the_content(tmp_path: Path, content: str, answer: str,
                                              reasoning: str | None) -> None:
    path = write_lines(tmp_path / "t.jsonl", [{"messages": turns(("user", "q"), ("assistant", content))}])
    kept, _ = read(path)
    message = kept[0].messages[1]
    assert (message.content, message.reasoning) == (answer, reasoning)
    assert kept[0].flags == []


def test_unclosed_think_is_flagged_not_dropped(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "u.jsonl", [
        {"messages": turns(("user", "q"), ("assistant", "<think>I keep thinking and never stop"))}])
    kept, skipped = read(path)
    assert skipped == []
    assert kept[0].flags == [FLAG_UNCLOSED_THINK]
    assert kept[0].messages[1].reasoning == "I keep thinking and never stop"


def test_user_think_tags_are_left_alone(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "u.jsonl", [
        {"messages": turns(("user", "what does <think> do?"), ("assistant", "It opens reasoning."))}])
    kept, _ = read(path)
    assert kept[0].messages[0].content == "what does <think> do?" and kept[0].flags == []


# --- bad rows ----------------------------------------------------------------------------------------

GOOD = {"messages": turns(("user", "q"), ("assistant", "a"))}
BAD_ROWS: list[tuple[str, bytes | str | dict[str, Any]]] = [
    ("invalid_json", '{"messages": [}'),
    ("invalid_utf8", b'{"messages": [{"role": "user", "content": "caf\xe9"}]}'),
    ("not_an_object", "[1, 2, 3]"),
    ("missing_messages", {"text": "no turns here"}),
    ("bad_messages", {"messages": []}),
    ("bad_messages", {"messages": "user: hi"}),
    ("bad_messages", {"messages": ["hi", "hello"]}),
    ("unknown_role", {"messages": turns(("user", "q"), ("narrator", "once upon a time"))}),
    ("unknown_role", {"messages": [{"role": ["user"], "content": "q"}]}),
    ("null_content", {"messages": [{"role": "user", "content": None}, {"role": "assistant", "content": "a"}]}),
    ("null_content", {"messages": [{"role": "user"}, {"role": "assistant", "content": "a"}]}),
    ("non_string_content", {"messages": [{"role": "user", "content": [{"type": "text"}]},
                                         {"role": "assistant", "content": "a"}]}),
    ("non_string_content", {"messages": [{"role": "user", "content": "q"},
                                         {"role": "assistant", "content": "a", "reasoning": 3}]}),
    ("empty_content", {"messages": turns(("user", "  \n"), ("assistant", "a"))}),
    ("empty_content", {"messages": turns(("user", "q"), ("assistant", ""))}),
    # rows the repairs cannot save (tests/sources/test_repairs.py has those they can)
    ("wrong_role_order", {"messages": turns(("assistant", "a reply to nothing"))}),
    ("wrong_role_order", {"messages": turns(("assistant", "a"), ("user", "q"))}),
    ("no_assistant_turn", {"messages": turns(("system", "s"), ("user", "q"))}),
]


def test_every_bad_row_reason_is_reported_with_its_line(tmp_path: Path) -> None:
    lines = [GOOD]
    for _, row in BAD_ROWS:
        lines += [row, GOOD]
    path = write_lines(tmp_path / "bad.jsonl", lines)
    kept, skipped = read(path, source="mixed")
    assert len(kept) == len(BAD_ROWS) + 1
    assert [s.reason for s in skipped] == [reason for reason, _ in BAD_ROWS]
    assert [s.location for s in skipped] == [f"bad.jsonl:{2 * i + 2}" for i in range(len(BAD_ROWS))]
    assert all(s.source == "mixed" and s.reason in REASONS and s.detail for s in skipped)
    assert len({c.provenance.source_line for c in kept}) == len(kept)


def test_bad_rows_in_a_json_array_are_located_by_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(orjson.dumps([GOOD, 42, GOOD]))
    _, skipped = read(path)
    assert [(s.reason, s.location) for s in skipped] == [("not_an_object", "bad.json#1")]


def test_a_reasoning_only_answer_is_kept(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "r.jsonl", [
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "reasoning": "r"}]}])
    kept, skipped = read(path)
    assert (len(kept), skipped) == (1, [])


# --- whole-file errors -------------------------------------------------------------------------------

def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="file not found"):
        list(iter_file(tmp_path / "nope.jsonl"))


def test_a_path_or_glob_that_matches_nothing_names_source_and_pattern(tmp_path: Path) -> None:
    for pattern in ("missing.jsonl", "shards/*.parquet"):
        with pytest.raises(CorpusError, match=re.escape(f"source 'web': path '{pattern}' matches no file")):
            iter_source(spec(name="web", paths=(pattern,)), tmp_path)


@pytest.mark.parametrize("suffix", ["jsonl", "jsonl.zst", "json", "parquet"])
def test_empty_file_is_an_error(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"empty.{suffix}"
    if suffix == "parquet":
        pq.write_table(pa.table({"messages": pa.array([], pa.string())}), path)
    elif suffix == "json":
        path.write_bytes(b"[]")
    elif suffix == "jsonl.zst":
        path.write_bytes(zstandard.ZstdCompressor().compress(b"\n\n"))
    else:
        path.write_bytes(b"")
    with pytest.raises(CorpusError, match=re.escape(f"empty.{suffix}: file has no rows")):
        list(iter_file(path))


def test_truncated_zstd_stream_is_an_error_not_short_data(tmp_path: Path) -> None:
    path = tmp_path / "cut.jsonl.zst"
    write_rows(path, CHAT_ROWS * 400)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 7])
    with pytest.raises(CorpusError, match="truncated zstd stream"):
        list(iter_file(path))


def test_corrupt_zstd_stream_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl.zst"
    path.write_bytes(b'{"messages": []}\n')  # plain text under a .zst name
    with pytest.raises(CorpusError, match=re.escape("bad.jsonl.zst: corrupt zstd stream")):
        list(iter_file(path))


def test_json_that_does_not_parse_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_bytes(b'[\n{"messages": []},\n{"messages": \n')
    with pytest.raises(CorpusError, match=r"broken.json:\d+: not valid JSON"):
        list(iter_file(path))


def test_json_document_without_rows_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "single.json"
    path.write_bytes(orjson.dumps(GOOD))
    with pytest.raises(CorpusError, match="array of rows"):
        list(iter_file(path))


def test_unreadable_parquet_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "fake.parquet"
    path.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(CorpusError, match=re.escape("fake.parquet: cannot read parquet")):
        list(iter_file(path))


# --- resolving paths, provenance, counts -------------------------------------------------------------

def test_globs_are_sorted_deduplicated_and_named_relative_to_the_recipe(tmp_path: Path) -> None:
    shards = tmp_path / "data"
    shards.mkdir()
    for name in ("b.jsonl", "a.jsonl", "c.parquet"):
        write_rows(shards / name, CHAT_ROWS[:2])
    source = spec(paths=("data/*.jsonl", "data/a.jsonl", "data/c.parquet"))
    assert [p.name for p in resolve_paths(source, tmp_path)] == ["a.jsonl", "b.jsonl", "c.parquet"]
    kept = [c for c in iter_source(source, tmp_path) if isinstance(c, Conversation)]
    assert [c.provenance.source_file for c in kept] == ["data/a.jsonl"] * 2 + ["data/b.jsonl"] * 2 + \
        ["data/c.parquet"] * 2


def test_files_outside_the_recipe_tree_are_named_by_file_name_only(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    write_rows(outside / "chat.jsonl", CHAT_ROWS[:1])
    recipe_dir = tmp_path / "recipe"
    recipe_dir.mkdir()
    source = spec(paths=(str(outside / "chat.jsonl"),))
    kept = list(iter_source(source, recipe_dir))
    assert kept[0].provenance.source_file == "chat.jsonl"


# --- take --------------------------------------------------------------------------------------------

def take_ids(tmp_path: Path, take: Take) -> list[str]:
    source = spec(paths=("*.jsonl",), take=take)
    return [c.id for c in iter_source(source, tmp_path) if isinstance(c, Conversation)]


@pytest.fixture
def hundred_rows(tmp_path: Path) -> Path:
    rows = [{"messages": turns(("user", f"q{i}"), ("assistant", f"a{i}"))} for i in range(100)]
    write_rows(tmp_path / "a.jsonl", rows[:60])
    write_lines(tmp_path / "b.jsonl", [*rows[60:], "not json", {"messages": []}])
    return tmp_path


def test_take_count_is_exact_seeded_and_in_file_order(hundred_rows: Path) -> None:
    first = take_ids(hundred_rows, Take(count=10, seed=1))
    assert len(first) == 10 and len(set(first)) == 10
    assert take_ids(hundred_rows, Take(count=10, seed=1)) == first
    assert take_ids(hundred_rows, Take(count=10, seed=2)) != first
    everything = take_ids(hundred_rows, Take(count=1000))
    assert len(everything) == 100  # min(count, valid rows): the two bad rows do not count
    order = {conversation_id: index for index, conversation_id in enumerate(everything)}
    assert [order[i] for i in first] == sorted(order[i] for i in first)
    assert take_ids(hundred_rows, Take(count=0)) == []


def test_take_count_reports_bad_rows_once(hundred_rows: Path) -> None:
    items = list(iter_source(spec(paths=("*.jsonl",), take=Take(count=5)), hundred_rows))
    assert sorted(s.reason for s in items if isinstance(s, Skipped)) == ["bad_messages", "invalid_json"]
    assert sum(isinstance(c, Conversation) for c in items) == 5


def test_take_fraction_is_seeded(hundred_rows: Path) -> None:
    half = take_ids(hundred_rows, Take(fraction=0.5, seed=3))
    assert 30 <= len(half) <= 70
    assert take_ids(hundred_rows, Take(fraction=0.5, seed=3)) == half
    assert take_ids(hundred_rows, Take(fraction=0.5, seed=4)) != half
    assert len(take_ids(hundred_rows, Take(fraction=1.0))) == 100
    assert take_ids(hundred_rows, Take(fraction=0.0)) == []


def test_take_fraction_of_zero_still_sees_an_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(CorpusError, match="no rows"):
        take_ids(tmp_path, Take(fraction=0.0))


# --- streaming ---------------------------------------------------------------------------------------

def noise_text(seed: int) -> str:
    """400 characters that do not compress like a run of one letter (which zstd shrinks 1000-fold)."""
    return random.Random(seed).randbytes(200).hex()


@pytest.mark.parametrize("suffix", ["jsonl.zst", "parquet"])
def test_memory_does_not_grow_with_rows(tmp_path: Path, suffix: str) -> None:
    def peak_bytes(rows: int) -> int:
        path = tmp_path / f"{rows}.{suffix}"
        write_rows(path, [{"messages": turns(("user", f"question {i}"), ("assistant", noise_text(i)))}
                          for i in range(rows)])
        tracemalloc.start()
        try:
            assert sum(1 for _ in iter_file(path)) == rows
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak_bytes(1_500), peak_bytes(6_000)
    assert large < small * 1.5, (small, large)


# --- the Hub, through a local mirror -----------------------------------------------------------------

@pytest.fixture
def hub_mirror(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    mirror = tmp_path / "mirror"
    data = mirror / "acme" / "chats" / "data"
    data.mkdir(parents=True)
    rows = [*CHAT_ROWS, {"messages": turns(("assistant", "a"))}]
    pq.write_table(pa.Table.from_pylist(rows), data / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(CHAT_ROWS[:2]), data / "test-00000-of-00001.parquet")
    monkeypatch.setenv(MIRROR_ENV, str(mirror))
    return mirror


def test_hub_source_reads_a_local_mirror(hub_mirror: Path) -> None:
    source = spec(name="acme", hub=HubRef(id="acme/chats", split="train", revision="abc123"))
    kept, skipped = split(list(iter_source(source, hub_mirror)))
    assert len(kept) == 5
    assert kept[0].provenance.to_json() == {"hub": {"id": "acme/chats", "config": None, "split": "train",
                                          "revision": "abc123"}, "source_row": 0, "source_id": "r0"}
    assert [(s.reason, s.location) for s in skipped] == [("wrong_role_order", "acme/chats/train#5")]
    test_split = list(iter_source(spec(hub=HubRef(id="acme/chats", split="test")), hub_mirror))
    assert len(test_split) == 2
    with pytest.raises(CorpusError, match="cannot read hub dataset acme/chats/validation"):
        list(iter_source(spec(hub=HubRef(id="acme/chats", split="validation")), hub_mirror))
    with pytest.raises(CorpusError, match="acme/other is not in the mirror"):
        list(iter_source(spec(hub=HubRef(id="acme/other")), hub_mirror))


def test_hub_source_without_datasets_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(CorpusError, match=re.escape("pip install 'corpus-builder[hub]'")):
        list(iter_source(spec(name="web", hub=HubRef(id="acme/chats")), tmp_path))


# --- real conversations from offline PyPI datasets ---------------------------------------------------

def test_real_chitchat_as_messages_jsonl_zst(tmp_path: Path) -> None:
    path = tmp_path / "chitchat.jsonl.zst"
    rows = write_chitchat(path, 200)
    kept, skipped = read(path, source="chitchat")
    assert (len(kept), skipped) == (200, [])
    assert [c.provenance.source_id for c in kept] == [row["id"] for row in rows]
    assert all(c.messages[-1].role == "assistant" for c in kept)
    assert len({c.id for c in kept}) == 200


def test_real_sharegpt_records_as_sharegpt_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "sharegpt.jsonl"
    rows = write_sharegpt(path, 400)
    kept, skipped = read(path, source="sharegpt")
    assert len(kept) + len(skipped) == 400
    reasons = Counter(s.reason for s in skipped)
    assert set(reasons) <= set(REASONS)
    # real ShareGPT splits start some parts with a gpt turn: that turn is dropped, not the conversation
    assert any("repaired:leading_assistant:drop" in c.flags for c in kept)
    by_id = {row["id"]: row for row in rows}
    sample = kept[0]
    original = by_id[sample.provenance.source_id]["conversations"]
    assert [m.content for m in sample.messages] == [turn["value"] for turn in original]


def test_real_sharegpt_records_are_recovered_in_order() -> None:
    records = list(itertools.islice(sharegpt_records(), 3))
    assert [r["id"] for r in records] == ["QWJhYvA_0", "i6IyJda_0", "A5AbcES_0"]
    assert all(set(r) == {"id", "conversations"} and r["conversations"] for r in records)


def test_real_gsm8k_problems_as_prompts_parquet(tmp_path: Path) -> None:
    path = tmp_path / "gsm8k.parquet"
    rows = write_gsm8k(path, 30, seed=5)
    source = spec(name="math", kind="prompts", paths=("gsm8k.parquet",), take=Take(count=10, seed=5),
                  system_prompt="Reason step by step.", task="math")
    kept, skipped = split(list(iter_source(source, tmp_path)))
    assert (len(kept), skipped) == (10, [])
    by_id = {row["id"]: row for row in rows}
    for conversation in kept:
        row = by_id[conversation.provenance.source_id]
        assert [m.role for m in conversation.messages] == ["system", "user"]
        assert conversation.messages[1].content == row["question"]
        assert conversation.provenance.reference_answer == row["answer"]
        assert "####" in row["answer"]
    assert write_gsm8k(tmp_path / "again.parquet", 30, seed=5) == rows
