"""`corpus audit` on hostile input (issue 18): options that can never fail, output paths that would destroy an
input, traffic with no readable rows, and the traffic reader taking exactly the rows the plain audit takes."""

from __future__ import annotations

import html
import json
import os
import shutil
import stat
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np
import orjson
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from corpus_builder.audit.frames import row_facts
from corpus_builder.audit.inputs import traffic_units
from corpus_builder.audit.profile import read_profile
from corpus_builder.errors import CorpusError, Skipped
from corpus_builder.layout import MANIFEST
from corpus_builder.records import Conversation
from corpus_builder.rows import conversations_to_batch
from corpus_builder.sources import iter_file, raw
from corpus_builder.stats.facts import ASSISTANT_TURNS, THINKING, TOOL_USE
from tests.support.fuzz import fuzz_settings

from .fixtures import known_traffic, write_jsonl


def corpus_cli(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd)


@pytest.mark.parametrize("option", ["--min-thinking-share", "--max-divergence"])
@pytest.mark.parametrize("value", ["nan", "NaN", "-nan"])
def test_a_share_option_of_nan_is_refused(tmp_path: Path, option: str, value: str) -> None:
    """nan passes every range check and fails no comparison: as a limit it could never fail."""
    completed = corpus_cli("audit", tmp_path / "corpus", "--against", tmp_path / "traffic.jsonl", option, value)
    assert completed.returncode == 2, completed.stderr
    assert option in completed.stderr and "not a number from 0 to 1" in completed.stderr
    assert "Traceback" not in completed.stderr


@pytest.fixture
def own_corpus(corpus: Path, tmp_path: Path) -> Path:
    """A copy of the session's corpus: a test that fails may write into it."""
    return Path(shutil.copytree(corpus, tmp_path / "corpus"))


def own_tokenizer(tiny_model_dir: Path, directory: Path) -> Path:
    directory.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny_model_dir / name, directory / name)
    return directory


def snapshot(*paths: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for root in paths for path in ([root] if root.is_file() else root.rglob("*"))
            if path.is_file()}


@pytest.mark.parametrize("target", ["manifest", "inside-corpus", "traffic", "traffic-glob", "recipe-source",
                                    "tokenizer-file", "inside-tokenizer", "fifo", "directory", "empty"])
def test_html_that_would_destroy_an_input_is_refused_before_the_audit(own_corpus: Path, tiny_model_dir: Path,
                                                                      tmp_path: Path, target: str) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    traffic = write_jsonl(logs / "day-1.jsonl", known_traffic())
    against = str(traffic)
    tokenizer = own_tokenizer(tiny_model_dir, tmp_path / "tokenizer")
    if target == "traffic-glob":
        against = str(logs / "day-*.jsonl")
    if target == "recipe-source":
        against = str(tmp_path / "serving.yaml")
        Path(against).write_text("name: serving\ntarget: {model: tiny/target}\nsources:\n"
                                 "  - {name: app, kind: replay, path: logs/day-1.jsonl, task: chat}\n"
                                 "output: {dir: unused}\n", encoding="utf-8")
    html = {"manifest": own_corpus / MANIFEST, "inside-corpus": own_corpus / "report.html", "traffic": traffic,
            "traffic-glob": traffic, "recipe-source": traffic, "tokenizer-file": tokenizer / "tokenizer.json",
            "inside-tokenizer": tokenizer / "report.html", "fifo": tmp_path / "fifo", "directory": tmp_path / "out",
            "empty": ""}[target]
    if target == "fifo":
        os.mkfifo(html)
    if target == "directory":
        Path(html).mkdir()
    before = snapshot(own_corpus, logs, tokenizer)
    completed = corpus_cli("audit", own_corpus, "--against", against, "--tokenizer", tokenizer, "--html", html)
    assert completed.returncode == 2, completed.stderr
    named = f"error: {html}: --html: " if html else "error: --html: the output path is empty"
    assert completed.stderr.startswith(named)
    assert "Traceback" not in completed.stderr and completed.stdout == ""  # refused before the audit ran
    assert snapshot(own_corpus, logs, tokenizer) == before
    if target == "fifo":
        assert stat.S_ISFIFO(os.stat(html).st_mode)
    assert not list(tmp_path.rglob("*.partial"))


def test_the_default_tokenizer_of_the_corpus_is_an_input_too(own_corpus: Path, tiny_model_dir: Path,
                                                              tmp_path: Path) -> None:
    """The corpus recipe's tokenizer (read when no --tokenizer is given) is as much an input as a given one."""
    tokenizer = own_tokenizer(tiny_model_dir, tmp_path / "tokenizer")
    for name in ("audit.json", "recipe.yaml"):  # the copy's tokenizer is a copy too: a failing test writes there
        recorded = own_corpus / name
        recorded.write_text(recorded.read_text().replace(str(tiny_model_dir.resolve()), str(tokenizer))
                            .replace(str(tiny_model_dir), str(tokenizer)))
    before = snapshot(tokenizer)
    completed = corpus_cli("audit", own_corpus, "--html", tokenizer / "tokenizer.json")
    assert completed.returncode == 2, completed.stderr
    assert f"--html: this run reads {tokenizer}; writing there would overwrite its input" in completed.stderr
    assert snapshot(tokenizer) == before


def test_an_html_path_that_fails_at_write_time_exits_2_and_leaves_no_partial(corpus: Path, tmp_path: Path) -> None:
    """A place the guard cannot tell is unwritable (/proc takes no new files, even from root) fails when the
    page is written: a message naming the path, exit 2, no partial file."""
    completed = corpus_cli("audit", corpus, "--html", "/proc/report.html")
    assert completed.returncode == 2, completed.stderr
    assert "error: /proc/report.html: cannot write: " in completed.stderr
    assert "Traceback" not in completed.stderr


def test_the_html_writer_turns_a_write_error_into_a_corpus_error_and_removes_its_partial(tmp_path: Path) -> None:
    from corpus_builder.audit import write_html_report

    report = {"corpus": {"label": "c", "conversations": 0, "thinking_share": 0.0, "reasoning_share": 0.0,
                         "by_source": {}, "skipped": {}}}
    target = tmp_path / "taken"
    target.mkdir()
    with pytest.raises(CorpusError) as caught:
        write_html_report(target, report, {}, "title")
    assert str(caught.value).startswith(f"{target}: cannot write: ")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["taken"]


# --- the traffic reader takes exactly the rows the plain audit's readers take -------------------------------

WORDS = st.sampled_from(["hi", "Hello there, how are you?", "你好，世界", "Привет", "x" * 300, "two\nlines"]) \
    | st.text(min_size=1, max_size=12)
EDGES = st.sampled_from(["", " ", "\x1c", "\u3000 ", "<think>why</think>so", "<think> </think>", "a</think>b",
                         "<think>open", "see <tool_call>{}</tool_call>"])
TEXTS = st.one_of(WORDS, WORDS, WORDS, WORDS, WORDS, EDGES)  # mostly text, often what a turn's checks look at
ODD = st.none() | st.integers() | st.floats(allow_nan=True) | st.just([{"type": "text", "text": "hi"}]) | st.just({})
ROLES = st.sampled_from(["user", "assistant", "system", "human", "gpt", "model", "tool", "function_call",
                         "observation", "bogus", ""]) | ODD
CALLS = st.sampled_from([[], "x", [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                         [{"function": {}}], [{"name": "f", "arguments": {"q": 1}}]]) | ODD
TURN = st.fixed_dictionaries({"role": ROLES, "content": TEXTS | ODD}, optional={
    "reasoning_content": TEXTS | ODD, "reasoning": TEXTS | ODD, "thinking": TEXTS, "tool_calls": CALLS,
    "function_call": CALLS, "tool_call_id": st.sampled_from(["c1", "c2", ""]) | ODD, "from": ROLES,
    "value": TEXTS | ODD, "name": TEXTS})
ROW_FIELDS = st.one_of(st.just({}), st.just({}), st.just({}), st.fixed_dictionaries({}, optional={
    "id": st.text(max_size=5) | ODD, "task": st.sampled_from(["chat", "", "math"]) | ODD,
    "chat_template_kwargs": st.sampled_from([{"enable_thinking": True}, {"enable_thinking": False},
                                             {"enable_thinking": "yes"}, "x"]),
    "enable_thinking": st.booleans() | ODD,
    "tools": st.sampled_from([[], "", "  ", "[]", "x", [{"type": "function", "function": {"name": "f"}}],
                              [{"name": "f", "parameters": {}}], [{"type": "function"}], [5]]) | ODD}))


@st.composite
def orderly_turns(draw: st.DrawFn, keys: tuple[str, str], speakers: tuple[str, str, str],
                  clean: bool = False) -> list[dict[str, Any]]:
    """The strict order with text (``clean``: nothing else, a row the readers take as it is), or mostly so,
    sometimes with a field more or a turn of anything: rows on both sides of plain."""
    texts = WORDS if clean else TEXTS
    count = draw(st.sampled_from([2, 2, 4, 6] if clean else [2, 2, 4, 6, 1, 3]))  # or a row ending on the user
    turns = [{keys[0]: speakers[0], keys[1]: draw(texts)}] if draw(st.booleans()) else []
    turns += [{keys[0]: speakers[1 + i % 2], keys[1]: draw(texts)} for i in range(count)]
    if clean:
        return turns
    for turn in turns:
        if draw(st.integers(min_value=0, max_value=11)) == 0:
            turn |= draw(st.dictionaries(st.sampled_from(["reasoning_content", "reasoning", "tool_calls",
                                                          "function_call", "name", "from", "value", "content",
                                                          "role"]), TEXTS | CALLS, max_size=2))
    if draw(st.integers(min_value=0, max_value=7)) == 0:
        turns[draw(st.integers(min_value=0, max_value=len(turns) - 1))] = draw(TURN)
    return turns


MESSAGES = st.builds(lambda turns, extra: {"messages": turns, **extra},
                     orderly_turns(("role", "content"), ("system", "user", "assistant")), ROW_FIELDS)
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
# One thing that may make a plain row not plain, at one of its turns: each condition of frames.plain_rows.
TWISTS: dict[str, Any] = {
    "reversed": lambda turns, i: turns.reverse(), "alias": lambda turns, i: turns[i].update(role="human"),
    "unknown": lambda turns, i: turns[i].update(role="bogus"), "tool": lambda turns, i: turns[i].update(role="tool"),
    "system": lambda turns, i: turns.insert(i, {"role": "system", "content": "be brief"}),
    "user": lambda turns, i: turns.insert(i, {"role": "user", "content": "and?"}),
    "blank": lambda turns, i: turns[i].update(content="\x1c "), "empty": lambda turns, i: turns[i].update(content=""),
    "think": lambda turns, i: turns[i].update(content="<think>hm</think>" + turns[i]["content"]),
    "preopened": lambda turns, i: turns[i].update(content="hm</think>"),
    "reasoning": lambda turns, i: turns[i].update(reasoning_content="why"),
    "blank-reasoning": lambda turns, i: turns[i].update(reasoning="\u3000", reasoning_content="why"),
    "calls": lambda turns, i: turns[i].update(tool_calls=[CALL]),
    "no-calls": lambda turns, i: turns[i].update(tool_calls=[]),
    "function-call": lambda turns, i: turns[i].update(function_call={"name": "f", "arguments": "{}"}),
    "sharegpt-keys": lambda turns, i: turns[i].update(value="other", **{"from": "gpt"}),
    "null-content": lambda turns, i: turns[i].update(content=None),
}


@st.composite
def twisted_rows(draw: st.DrawFn) -> dict[str, Any]:
    """A plain row, or one twist away from plain, maybe with tools (well formed or not: the readers' to judge)."""
    turns = draw(orderly_turns(("role", "content"), ("system", "user", "assistant"), clean=True))
    twist = draw(st.sampled_from([None, None, *TWISTS]))
    if twist is not None:
        TWISTS[twist](turns, draw(st.integers(min_value=0, max_value=len(turns) - 1)))
    tools = draw(st.sampled_from([{}, {}, {}, {"tools": []}, {"tools": [{"type": "function"}]},
                                  {"tools": [{"type": "function", "function": {"name": "f"}}]}]))
    return {"messages": turns, **tools}


CLEAN = twisted_rows()
ROWS = st.one_of(
    CLEAN, MESSAGES, MESSAGES, MESSAGES,
    st.builds(lambda turns, extra: {"conversations": turns, **extra},
              orderly_turns(("from", "value"), ("system", "human", "gpt")), ROW_FIELDS),
    st.fixed_dictionaries({"messages": st.lists(TURN, max_size=4) | ODD}, optional={"tools": CALLS}),
    st.fixed_dictionaries({"question": TEXTS | ODD}, optional={"answer": TEXTS | ODD}),
    st.fixed_dictionaries({"prompt": TEXTS | ODD}),
)
GOOD_LINE = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}'
# Lines pyarrow's parser takes (or crashes on) where the readers' decoder refuses them, and other bad lines.
SPECIAL_LINES = [b"", b"   ", b"\x0c", b"null", b"NaN", b"[1]", b'"text"', b"{bad", b"\xff", b"{}",
                 GOOD_LINE + b" " + GOOD_LINE, GOOD_LINE[:-1] + b', "x": NaN}', GOOD_LINE[:-1] + b', "x": -Infinity}',
                 GOOD_LINE[:-1] + b', "x": "\xff"}', GOOD_LINE[:-1] + b', "x": ' + b"[" * 1100 + b"]" * 1100 + b"}",
                 b"\xef\xbb\xbf" + GOOD_LINE, GOOD_LINE[:-1] + b', "messages": 5}', GOOD_LINE + b"\r",
                 b'{"messages": [{"role": "user", "content": "\\ud800"}]}']
ROW_LINES = ROWS.map(lambda row: json.dumps(row, allow_nan=True).encode())  # NaN too: a line the readers refuse
# A log of messages rows, mostly: the first row the readers recognise fixes the layout of the whole file.
MESSAGE_LINES = MESSAGES.map(json.dumps).map(str.encode)
LINES = st.builds(lambda first, rest: [first, *rest], st.one_of(MESSAGE_LINES, ROW_LINES),
                  st.lists(st.one_of(ROW_LINES, MESSAGE_LINES, st.sampled_from(SPECIAL_LINES)), max_size=12))


def readers_side(path: Path) -> tuple[int, Counter[str], Counter[tuple[Any, ...]], pl.DataFrame | None]:
    """What `corpus audit FILE` reads in a file: conversations, skips by reason, the conversations and their facts."""
    conversations: list[Conversation] = []
    skipped: Counter[str] = Counter()
    for item in iter_file(path):
        if isinstance(item, Skipped):
            skipped[item.reason] += 1
        else:
            conversations.append(item)
    facts = row_facts(pl.from_arrow(conversations_to_batch(conversations)), source="traffic") \
        if conversations else None  # type: ignore[arg-type]
    return len(conversations), skipped, Counter(map(shape, conversations)), facts


def traffic_side(path: Path) -> tuple[int, Counter[str], Counter[tuple[Any, ...]], pl.DataFrame]:
    """What the traffic audit reads in it: the same, from its own chunks and profile."""
    units = traffic_units(str(path))
    profile = read_profile(str(path), units, None, token_sample=0)
    made: Counter[tuple[Any, ...]] = Counter()
    for unit in units:
        for chunk in unit.chunks():
            rows = chunk.frame.height + (chunk.normalised.height if chunk.normalised is not None else 0)
            made.update(shape(item) for _, item in chunk.conversations(np.arange(rows))
                        if isinstance(item, Conversation))
    facts = profile.facts.frame()
    return int(facts.get_column("count").sum()) if facts.height else 0, profile.skipped, made, facts


def shape(conversation: Conversation) -> tuple[Any, ...]:
    return (tuple((m.role, m.content, m.reasoning, tuple(map(str, m.tool_calls)), m.tool_call_id)
                  for m in conversation.messages), tuple(conversation.flags), str(conversation.tools))


TURN_FACTS = [THINKING, ASSISTANT_TURNS, TOOL_USE, "script"]  # the facts of the turns, not of the row's fields


def turn_facts(facts: pl.DataFrame | None, counted: bool) -> dict[tuple[Any, ...], int]:
    if facts is None or facts.is_empty():
        return {}
    grouped = facts.group_by(TURN_FACTS).agg((pl.col("count").sum() if counted else pl.len()).alias("n"))
    return {tuple(row[:-1]): int(row[-1]) for row in grouped.iter_rows()}


@fuzz_settings(150)
@given(lines=LINES, trailing_newline=st.booleans(), block=st.sampled_from([64, 600, 1 << 20]))
def test_the_traffic_audit_reads_messy_rows_as_the_plain_audit_does(tmp_path_factory: pytest.TempPathFactory,
                                                                    lines: list[bytes], trailing_newline: bool,
                                                                    block: int) -> None:
    """For any mix of rows and bad lines, in any block size: the same conversations (turn for turn), the same
    skips by reason and the same facts of their turns as the readers of `corpus audit FILE`, or the same error."""
    path = tmp_path_factory.mktemp("messy") / "traffic.jsonl"
    path.write_bytes(b"\n".join(lines) + (b"\n" if trailing_newline else b""))
    try:
        expected = readers_side(path)
    except CorpusError as error:
        with pytest.raises(CorpusError) as caught:
            traffic_side(path)
        assert str(caught.value) == str(error)
        return
    with patch.object(raw, "CHUNK_BYTES", block):
        read, skipped, made, facts = traffic_side(path)
    assert (read, dict(skipped)) == (expected[0], dict(expected[1]))
    assert made == expected[2]
    assert turn_facts(facts, counted=True) == turn_facts(expected[3], counted=False)


MESSY_ROWS = [  # the file: the plain audit counts 4 conversations, the traffic audit counted 10
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
    {"messages": [{"role": "user", "content": None}, {"role": "assistant", "content": "x"}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                  {"role": "assistant", "content": "y"}]},
    {"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "z"}]},
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": None}]},
    {"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "q"}]},
    {"messages": [{"role": "assistant", "content": "first"}, {"role": "user", "content": "u"}]},
    {"messages": [{"role": "user", "content": "a"}, {"role": "bogus", "content": "x"}]},
    {"messages": [{"role": "user", "content": "a"}]},
    {"messages": [{"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}], "tools": "nope"},
    {"messages": ["str", {"role": "assistant", "content": "c"}]},
    {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},
    {"question": "2+2?", "answer": "4"},
]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet-of-json", "json"])
def test_null_part_list_and_numeric_content_are_skipped_as_the_plain_audit_skips_them(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / ("traffic.json" if fmt == "json" else "traffic.jsonl")
    if fmt == "json":
        path.write_bytes(orjson.dumps(MESSY_ROWS))
    else:
        write_jsonl(path, MESSY_ROWS)
    if fmt == "parquet-of-json":  # the same rows, each row's JSON text in one column of a parquet file
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "traffic.parquet"
        pq.write_table(pa.table({"messages": [json.dumps(row.get("messages")) for row in MESSY_ROWS]}), path)
    expected, got = readers_side(path), traffic_side(path)
    assert got[:3] == expected[:3]
    assert turn_facts(got[3], counted=True) == turn_facts(expected[3], counted=False)
    if fmt != "parquet-of-json":  # the rows the traffic audit used to count: null, part-list and numeric content
        assert expected[1]["null_content"] == 2 and expected[1]["non_string_content"] == 2


@pytest.mark.parametrize("line", [b"null", b"NaN", b"[1, 2]", GOOD_LINE + b" " + GOOD_LINE,
                                  GOOD_LINE[:-1] + b', "x": NaN}', GOOD_LINE[:-1] + b', "x": "\xff"}',
                                  GOOD_LINE[:-1] + b', "x": ' + b"[" * 1100 + b"]" * 1100 + b"}"],
                         ids=["null", "nan", "array", "two-objects", "nan-field", "bad-utf8-field", "deep"])
@pytest.mark.parametrize("alone", [True, False], ids=["alone", "among-rows"])
def test_lines_pyarrow_takes_but_the_readers_refuse_are_skipped_never_read(tmp_path: Path, line: bytes,
                                                                           alone: bool) -> None:
    """pyarrow's JSON reader takes NaN, two objects on a line, a bare null (and crashes on a block of them),
    any nesting depth and bad UTF-8 outside the fields it parses: the readers' decoder judges every line."""
    path = tmp_path / "traffic.jsonl"
    path.write_bytes(b"\n".join([line] * 3 if alone else [GOOD_LINE, line, GOOD_LINE, line]) + b"\n")
    expected, got = readers_side(path), traffic_side(path)
    assert got[:3] == expected[:3]


def test_the_cli_counts_the_traffic_as_the_plain_audit_does(corpus: Path, tmp_path: Path) -> None:
    """`corpus audit FILE` and `corpus audit CORPUS --against FILE` read the same conversations of a messy log
    and skip the same rows for the same reasons (the traffic audit counted every row with a turns list)."""
    path = tmp_path / "traffic.jsonl"
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in MESSY_ROWS) + b"null\nNaN\n" + GOOD_LINE + b"\n")
    plain = corpus_cli("audit", path, "--json", "--no-secrets")
    against = corpus_cli("audit", corpus, "--against", path, "--json")
    assert plain.returncode == 0 and against.returncode == 0, plain.stderr + against.stderr
    plain_report, traffic = json.loads(plain.stdout), json.loads(against.stdout)["traffic"]
    assert "duplicate" not in plain_report["skipped"]  # the build's checks, which the traffic is not put through
    assert (traffic["conversations"], traffic["skipped"]) == (plain_report["conversations"], plain_report["skipped"])


# --- traffic with no readable rows, or too few --------------------------------------------------------------


def unreadable(kind: str, directory: Path) -> tuple[Path, str]:
    """Traffic of which no row is readable, and the skip reason the error names."""
    if kind == "garbage":
        path = directory / "garbage.jsonl"
        path.write_bytes(bytes(range(128, 256)) * 20 + b"\n" + b"\xff\xfe{" * 50 + b"\n")
        return path, "invalid_utf8 2"
    if kind == "nulls":  # a block of them crashed pyarrow's reader
        path = directory / "nulls.jsonl"
        path.write_bytes(b"null\n" * 3)
        return path, "not_an_object 3"
    if kind == "null-content":
        return write_jsonl(directory / "null-content.jsonl", MESSY_ROWS[1:2] * 4), "null_content 4"
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = directory / "other-schema.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]}), path)
    return path, "missing_messages 3"


@pytest.mark.parametrize("kind", ["garbage", "nulls", "null-content", "other-schema"])
def test_traffic_without_a_readable_row_is_an_error(corpus: Path, tmp_path: Path, kind: str) -> None:
    """Not a report that passes --max-divergence and plans to delete a source: exit 2, the file and why."""
    path, reasons = unreadable(kind, tmp_path)
    completed = corpus_cli("audit", corpus, "--against", path, "--max-divergence", "0.01")
    assert completed.returncode == 2, completed.stderr
    assert f"error: {path}: no readable traffic rows: all " in completed.stderr and reasons in completed.stderr
    assert completed.stdout == "" and "Traceback" not in completed.stderr


def test_an_empty_traffic_file_is_an_error_as_for_the_readers(corpus: Path, tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_bytes(b"\n  \n")
    completed = corpus_cli("audit", corpus, "--against", tmp_path / "empty.jsonl")
    assert completed.returncode == 2 and "empty.jsonl: file has no rows" in completed.stderr


@pytest.fixture
def partly_readable(tmp_path: Path) -> Path:
    """100 readable rows and 10 unreadable ones: 9.1% skipped, past the default 5%."""
    return write_jsonl(tmp_path / "partial.jsonl", known_traffic(), extra=b"{not json\n" * 10)


def test_traffic_mostly_skipped_is_said_to_be_described_in_part_everywhere(corpus: Path, partly_readable: Path,
                                                                           tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    text = corpus_cli("audit", corpus, "--against", partly_readable, "--html", page)
    assert text.returncode == 0, text.stderr  # without --max-divergence nothing fails: it is said
    assert "traffic rows: 100 readable, 10 skipped (9.1%): every figure below describes the readable rows only" \
        in text.stdout
    note = "10 of the traffic's 110 rows (9.1%) were skipped, more than --max-skipped-share 0.05: every figure " \
           "describes the 100 readable rows only"
    assert f"note: {note}" in text.stdout
    assert f"<p><strong>{html.escape(note)}</strong></p>" in page.read_text(encoding="utf-8")
    report = json.loads(corpus_cli("audit", corpus, "--against", partly_readable, "--json").stdout)
    assert report["readable"] == {"rows": 100, "skipped": 10, "skipped_share": round(10 / 110, 6),
                                  "max_skipped_share": 0.05, "partial": True, "note": note,
                                  "folded_prefix": 0}
    assert note in report["notes"]


def test_max_divergence_fails_on_mostly_skipped_traffic_unless_allowed(corpus: Path, partly_readable: Path) -> None:
    failed = corpus_cli("audit", corpus, "--against", partly_readable, "--max-divergence", "0.99")
    assert failed.returncode == 1, failed.stderr
    assert ("check failed: 10 of the traffic's 110 rows (9.1%) were skipped, more than --max-skipped-share 0.05: "
            "the divergences describe the readable rows only (--allow-skipped accepts that)") in failed.stderr
    allowed = corpus_cli("audit", corpus, "--against", partly_readable, "--max-divergence", "0.99", "--allow-skipped")
    assert allowed.returncode == 0, allowed.stderr
    wider = corpus_cli("audit", corpus, "--against", partly_readable, "--max-divergence", "0.99",
                       "--max-skipped-share", "0.1", "--json")
    assert wider.returncode == 0, wider.stderr
    assert json.loads(wider.stdout)["readable"]["partial"] is False
    assert corpus_cli("audit", corpus, "--against", partly_readable, "--max-skipped-share", "nan").returncode == 2


def test_the_skipped_share_limit_is_a_share() -> None:
    from corpus_builder.audit import AuditOptions

    for bad in (float("nan"), -0.1, 1.5):
        with pytest.raises(CorpusError, match="max_skipped_share must be a share from 0 to 1"):
            AuditOptions(max_skipped_share=bad)


@pytest.mark.parametrize("suffix", ["jsonl", "jsonl.zst"])
def test_traffic_that_is_not_utf8_text_is_named_as_the_readers_name_it(corpus: Path, tmp_path: Path,
                                                                       suffix: str) -> None:
    """A gzip download named .jsonl, a UTF-16 export: the traffic audit refuses it as `corpus audit FILE` does (it
    used to count every line unreadable), with the same message."""
    import gzip

    import zstandard

    text = b"".join(orjson.dumps(row) + b"\n" for row in known_traffic()[:20])
    for content in (gzip.compress(text), text.decode().encode("utf-16")):
        path = tmp_path / f"traffic.{suffix}"
        path.write_bytes(zstandard.ZstdCompressor().compress(content) if suffix == "jsonl.zst" else content)
        with pytest.raises(CorpusError) as plain:
            list(iter_file(path))
        completed = corpus_cli("audit", corpus, "--against", path)
        assert completed.returncode == 2 and completed.stderr == f"error: {plain.value}\n", completed.stderr
        assert "not UTF-8 JSON" in completed.stderr
