"""The columnar replay path (assemble/columnar.py) writes what the row path writes, byte for byte, and leaves the rows
its kernels do not cover to the row path."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest
import zstandard
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from corpus_builder.assemble import build_corpus
from corpus_builder.assemble.columnar import SWITCH
from corpus_builder.errors import CorpusError
from corpus_builder.recipe import load_recipe
from corpus_builder.sources.columnar import WHITESPACE
from corpus_builder.sources.readers import line_ranges

SPEAKERS = ["human", "user", "gpt", "assistant", "system", "tool", "observation", "function_call", "bard", "robot"]
# Pieces of text that reach every branch of the kernels: think tags in every order, Python's whitespace, JSON's
# escapes, control characters, non-ASCII letters and punctuation, the disputed literals.
PIECES = ["<think>", "</think>", " ", "\n", "\t", "\u3000", "\x1c", "\x85", '"', "\\", "\x01", "\x7f", "é", "ＡＢ",
          "\u201cq\u201d", "NaN", "Infinity", "\U0001f600", "word", "Word", "2+2", "x"]
# The kernels' fast paths: blocks of ASCII texts alone (normalised in one pass), of texts without a think tag or a
# run of whitespace (nothing to split or collapse).
ASCII_PIECES = [piece for piece in PIECES if piece.isascii()]
PLAIN_PIECES = ["word", "Word", "2+2", "x", "-y", "\u201cq\u201d", "é"]


def texts(pieces: list[str]) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(pieces), max_size=6).map("".join)


def turns(pieces: list[str]) -> st.SearchStrategy[object]:
    reasoning = st.none() | texts(pieces) | st.integers(0, 1)
    extra = {"weight": st.none() | st.integers(0, 1), "reasoning": reasoning, "reasoning_content": reasoning,
             "thinking": reasoning}
    sharegpt = st.fixed_dictionaries({"from": st.sampled_from(SPEAKERS), "value": texts(pieces)}, optional=extra)
    messages = st.fixed_dictionaries({"role": st.sampled_from(SPEAKERS), "content": texts(pieces)}, optional=extra)
    return st.lists(sharegpt, max_size=5) | st.lists(messages, max_size=3) | st.none() | st.just("not a list")


def rows(pieces: list[str]) -> st.SearchStrategy[bytes]:
    row = st.fixed_dictionaries({"conversations": turns(pieces)},
                                optional={"id": st.none() | st.integers(-5, 5) | texts(pieces) | st.booleans(),
                                          "tools": st.none() | st.just([{"name": "f"}])})
    escaped_pair = b'{"conversations": [{"from": "human", "value": "\\ud83d\\ude00"}, {"from": "gpt", "value": "a"}]}'
    return row.map(orjson.dumps) | st.sampled_from([b"", b"  ", b"[1]", b"null", b"{oops", b"{\"a\": NaN}",
                                                     b"\xef\xbb\xbf{}", b"{\"conversations\": \"\xff\"}", escaped_pair])


def plain_exchange(index: int) -> bytes:
    return orjson.dumps({"id": f"r{index}", "conversations": [
        {"from": "human", "value": f"question {index % 7}"},
        {"from": "gpt", "value": f"<think>\nwhy {index}\n</think>\n\nanswer {index % 5}" if index % 3 else "yes"}]})


def several_readers(monkeypatch: pytest.MonkeyPatch, readers: int, block_bytes: int = 256) -> None:
    """The columnar path's blocks on ``readers`` processes, a block a line or a few (so every reader has blocks)."""
    monkeypatch.setenv("CORPUS_WORKERS", str(readers))
    monkeypatch.setattr("corpus_builder.sources.columnar.BLOCK_BYTES", block_bytes)


def write_recipe(tmp: Path, lines: list[bytes], *, rows_per_shard: int = 7, style: str = "sharegpt",
                 more: list[bytes] | None = None) -> Path:
    """A recipe replaying ``lines`` (rows.jsonl; and ``more``, more.jsonl, a second source after it)."""
    (tmp / "rows.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    sources = ("  - {name: chats, kind: replay, path: rows.jsonl, "
               f"mapping: {{style: {style}}}, task: chat}}\n")
    if more is not None:
        (tmp / "more.jsonl").write_bytes(b"\n".join(more) + b"\n")
        sources += "  - {name: more, kind: replay, path: more.jsonl, task: chat}\n"
    recipe = tmp / "recipe.yaml"
    recipe.write_text(
        f"name: columnar\ntarget: {{model: m/t}}\nsources:\n{sources}"
        "checks: {dedup: exact}\nsplit: {validation_fraction: 0.3, "
        f"seed: 3}}\noutput: {{dir: out, rows_per_shard: {rows_per_shard}}}\n", encoding="utf-8")
    return recipe


def build(tmp: Path, lines: list[bytes], row_path: bool, monkeypatch: pytest.MonkeyPatch, *,
          rows_per_shard: int = 7, style: str = "sharegpt", more: list[bytes] | None = None
          ) -> tuple[dict[str, bytes], str]:
    """Every file of a build of ``lines`` (on the row path, or not), and its progress lines."""
    write_recipe(tmp, lines, rows_per_shard=rows_per_shard, style=style, more=more)
    out = tmp / ("row" if row_path else "columnar")
    monkeypatch.setenv(SWITCH, "0" if row_path else "1")
    progress = io.StringIO()
    build_corpus(load_recipe(tmp / "recipe.yaml"), out, progress=progress, allow_empty=True)
    files = {str(path.relative_to(out)): path.read_bytes() for path in sorted(out.rglob("*"))
             if path.is_file() and path.name != ".build.lock"}
    return files, progress.getvalue()


def test_whitespace_is_what_python_strips() -> None:
    assert set(WHITESPACE) == {chr(code) for code in range(sys.maxunicode + 1) if chr(code).isspace()}


def test_the_rows_the_kernels_do_not_cover_take_the_row_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows that need a repair or a rule only the row path has drop to it, counted; the corpus is the row path's."""
    good = [plain_exchange(index) for index in range(40)]
    needing_rows = [
        orjson.dumps({"conversations": [{"from": "gpt", "value": "hello"}, {"from": "human", "value": "hi"},
                                        {"from": "gpt", "value": "ok"}]}),  # leading assistant: repaired
        orjson.dumps({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "<think>open"}]}),
        orjson.dumps({"conversations": [{"from": "human", "value": "q"}, {"from": "tool", "value": "r"}]}),
        b"{not json",
    ]
    lines = [*good[:20], *needing_rows, *good[20:], good[3]]  # and a duplicate
    columnar, said = build(tmp_path, lines, False, monkeypatch)
    row_path, _ = build(tmp_path, lines, True, monkeypatch)
    assert columnar == row_path
    assert "columnar path: 40 rows by the kernels, 5 by the row path" in said  # the duplicate is a kernel's too


def test_reasoning_fields_are_the_kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An assistant turn's reasoning field (the first of ``reasoning``, ``reasoning_content``, ``thinking`` that is
    not null) is read by the kernels, over a think block unless it is empty; the corpus is the row path's."""
    def chat(**answer: object) -> bytes:
        return orjson.dumps({"messages": [{"role": "user", "content": "q"},
                                          {"role": "assistant", "content": "a", **answer}]})

    taken = [chat(reasoning_content=" why \n"), chat(reasoning=None, thinking="how"), chat(reasoning="  "),
             chat(reasoning_content="", content="<think>inner</think> a"),
             chat(reasoning="r", content="<think>i</think>"), chat(thinking="t", content=""),
             chat(reasoning_content=None)]
    left = [chat(reasoning=1), orjson.dumps({"messages": [{"role": "user", "content": "q", "reasoning": "r"},
                                                          {"role": "assistant", "content": "a"}]})]
    lines = [chat(), *taken, *left]  # the first row fixes the file's layout, on the row path
    columnar, said = build(tmp_path, lines, False, monkeypatch, style="messages")
    row_path, _ = build(tmp_path, lines, True, monkeypatch, style="messages")
    assert columnar == row_path
    assert f"columnar path: {len(taken)} rows by the kernels, {len(left) + 1} by the row path" in said


@pytest.mark.parametrize("readers", [1, 2])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([PIECES, ASCII_PIECES, PLAIN_PIECES]).flatmap(
    lambda pieces: st.lists(rows(pieces), min_size=1, max_size=40)), st.integers(1, 9),
       st.sampled_from(["sharegpt", "auto"]))
@example([plain_exchange(0), b'{"id": 1.5, "conversations": []}', plain_exchange(0)], 2, "sharegpt")
@example([orjson.dumps({"id": "i", "conversations": [{"from": "human", "value": "a\x01b \\ \"q\""},
                                                     {"from": "gpt", "value": "\x85 c </think> \u3000d"}]})], 1,
         "sharegpt")
@example([orjson.dumps({"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": '"'}]})],
         1, "sharegpt")  # a call speaker's value that is not JSON: the row path's skip
@example([orjson.dumps({"id": "i\x1f", "conversations": [{"from": "human", "value": "a"},
                                                        {"from": "gpt", "value": "b"}]})], 1, "auto")
def test_hostile_rows_give_the_row_paths_bytes(tmp_path_factory: pytest.TempPathFactory,
                                               monkeypatch: pytest.MonkeyPatch, readers: int,
                                               hostile: list[bytes], rows_per_shard: int, style: str) -> None:
    """Any mix of rows, plain ones among them, read in blocks of a few lines by one reader or two: every shard,
    the ledger, audit.json and the manifest are the row path's."""
    several_readers(monkeypatch, readers)
    tmp = tmp_path_factory.mktemp("hostile")
    lines = [line for index, row in enumerate(hostile) for line in (plain_exchange(index), row)]
    lines[::3] = [line + b"\r" for line in lines[::3]]  # line ends written on Windows
    columnar, _ = build(tmp, lines, False, monkeypatch, rows_per_shard=rows_per_shard, style=style)
    row_path, _ = build(tmp, lines, True, monkeypatch, rows_per_shard=rows_per_shard, style=style)
    assert columnar == row_path


def exchanges(pieces: list[str]) -> st.SearchStrategy[bytes]:
    """A well-formed chat of texts from ``pieces``: one the kernels take (unless a text is empty)."""
    return st.lists(texts(pieces), min_size=1, max_size=3).map(lambda values: orjson.dumps({"conversations": [
        {"from": speaker, "value": value} for value in values for speaker, value in (("human", value),
                                                                                      ("gpt", value + " ok"))]}))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([ASCII_PIECES, PLAIN_PIECES, [piece for piece in ASCII_PIECES if "think" not in piece]]).flatmap(
    lambda pieces: st.lists(exchanges(pieces), min_size=1, max_size=30)))
def test_blocks_on_the_kernels_fast_paths_give_the_row_paths_bytes(tmp_path_factory: pytest.TempPathFactory,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   lines: list[bytes]) -> None:
    """Blocks of ASCII texts alone, of texts without a think tag, a run of whitespace or an end space: the row
    path's corpus."""
    tmp = tmp_path_factory.mktemp("fast")
    columnar, _ = build(tmp, lines, False, monkeypatch)
    row_path, _ = build(tmp, lines, True, monkeypatch)
    assert columnar == row_path


def test_a_file_cut_into_parts_reads_as_the_row_paths_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file cut into byte ranges (several readers): each part has its own normaliser and the file's own line
    numbers, as on the row path's forked readers."""
    monkeypatch.setattr("corpus_builder.sources.readers.MIN_RANGE_BYTES", 1500)
    monkeypatch.setenv("CORPUS_WORKERS", "3")
    lines = [plain_exchange(index % 45) for index in range(60)]  # duplicates across the parts
    lines[31] = b"{broken"
    columnar, said = build(tmp_path, lines, False, monkeypatch)
    row_path, _ = build(tmp_path, lines, True, monkeypatch)
    assert columnar == row_path
    assert "by the kernels, 4 by the row path" in said  # each part's first row fixes its layout, and the bad line


@pytest.mark.parametrize("row_path", [True, False])
def test_a_file_cut_into_parts_numbers_its_lines_as_a_whole_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  row_path: bool) -> None:
    """Each part of a file cut into several numbers its lines from the file's start (its first line counted where
    the file is cut): the ledger's lines (a bad line's, blank lines between) are those of the file read as one part,
    on both paths."""
    lines = [plain_exchange(index % 45) if index % 11 else b"" for index in range(90)]
    lines[31] = lines[67] = b"{broken"
    whole, _ = build(tmp_path, lines, row_path, monkeypatch)
    monkeypatch.setattr("corpus_builder.sources.readers.MIN_RANGE_BYTES", 1500)
    monkeypatch.setenv("CORPUS_WORKERS", "3")
    cut, _ = build(tmp_path, lines, row_path, monkeypatch)
    assert len(line_ranges(tmp_path / "rows.jsonl", 3, "rows.jsonl")) == 3
    assert cut == whole
    ledger = zstandard.ZstdDecompressor().decompressobj().decompress(whole["ledger.jsonl.zst"])
    assert b'"reason":"invalid_json","location":"rows.jsonl:68"' in ledger


@pytest.mark.parametrize("readers", [1, 2])
def test_a_layout_fixed_late_is_fixed_for_every_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       readers: int) -> None:
    """The row that fixes a part's layout comes after blocks of rows that show none: the readers that skip its
    block fix the same layout (``messages`` here, so the ShareGPT rows after it are the row path's skips). On one
    reader, the rows before it are read by the row path on the mapping's thread, those after on the reader's own."""
    several_readers(monkeypatch, readers)
    no_layout = [b'{"conversations": []}', b'{"note": "no turns"}', b"", b"{broken", b'{"messages": "text"}'] * 4
    messages = orjson.dumps({"id": "m", "messages": [{"role": "user", "content": "hi"},
                                                     {"role": "assistant", "content": "hello"}]})
    lines = [*no_layout, messages, *[plain_exchange(index) for index in range(12)], messages]
    columnar, said = build(tmp_path, lines, False, monkeypatch, style="auto")
    row_path, _ = build(tmp_path, lines, True, monkeypatch, style="auto")
    assert columnar == row_path
    assert "columnar path: 1 rows by the kernels, 29 by the row path" in said


def test_parts_without_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file cut into parts, one of them blank lines only, reads as the row path's parts on two readers."""
    several_readers(monkeypatch, 2)
    monkeypatch.setattr("corpus_builder.sources.readers.MIN_RANGE_BYTES", 1500)
    lines = [*[plain_exchange(index) for index in range(20)], *[b" " * 90] * 40,
             *[plain_exchange(index) for index in range(20, 40)]]
    columnar, said = build(tmp_path, lines, False, monkeypatch)
    row_path, _ = build(tmp_path, lines, True, monkeypatch)
    assert columnar == row_path
    assert "columnar path: 38 rows by the kernels, 2 by the row path" in said  # each part's first row


@pytest.mark.parametrize("row_path", [True, False])
def test_a_file_without_rows_is_an_error_on_both_readers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          row_path: bool) -> None:
    """A source file of blank lines after one with rows: the row path's error, once its blocks are read."""
    several_readers(monkeypatch, 2)
    with pytest.raises(CorpusError, match=r"^more\.jsonl: file has no rows$"):
        build(tmp_path, [plain_exchange(index) for index in range(30)], row_path, monkeypatch,
              more=[b"", b"  ", b"\t"] * 50)
    assert not (tmp_path / ("row" if row_path else "columnar")).exists()


FAILING_READER = """
import sys
from corpus_builder.cli import main
from corpus_builder.errors import CorpusError
from corpus_builder.sources import columnar
real = columnar.RowPath.rows
def failing(self, position, line):
    if line.startswith(b"{broken"):
        raise CorpusError("cannot read this row", file=self.unit.label, line=position)
    return real(self, position, line)
columnar.RowPath.rows = failing
columnar.BLOCK_BYTES = 256
sys.argv = ["corpus", "build", "recipe.yaml", "--out", "out"]
main()
"""


def test_a_reader_that_fails_mid_file_fails_the_build(tmp_path: Path) -> None:
    """A reader whose block fails (a row the row path cannot read, as a fault put in its reading) fails the build
    with its message, naming the file and line, exit code 2, and nothing written."""
    lines = [plain_exchange(index) for index in range(30)]
    lines[23] = b"{broken"
    write_recipe(tmp_path, lines)
    failed = subprocess.run([sys.executable, "-c", FAILING_READER], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, SWITCH: "1", "CORPUS_WORKERS": "2"})
    assert failed.returncode == 2, failed.stderr
    assert "rows.jsonl:24: cannot read this row" in failed.stderr and "Traceback" not in failed.stderr
    assert not (tmp_path / "out").exists()


def test_a_bug_on_a_readers_thread_fails_the_build_and_ends_its_threads(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """One reader (the build's process): a bug on the kernels' thread is raised in the build as it is, and the
    reader's threads (and the shard writer's) end."""
    several_readers(monkeypatch, 1)

    def broken(*_: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr("corpus_builder.assemble.columnar.mapped_turns", broken)
    threads = threading.active_count()
    with pytest.raises(ZeroDivisionError, match="a bug"):
        build(tmp_path, [plain_exchange(index) for index in range(30)], False, monkeypatch)
    assert threading.active_count() == threads
    assert not (tmp_path / "columnar").exists()


def test_a_readers_bug_fails_the_build_with_its_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    several_readers(monkeypatch, 2)

    def broken(*_: object) -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr("corpus_builder.assemble.columnar.mapped_turns", broken)
    with pytest.raises(RuntimeError, match=r"(?s)a source worker failed:.*ZeroDivisionError: a bug"):
        build(tmp_path, [plain_exchange(index) for index in range(30)], False, monkeypatch)
    assert not (tmp_path / "columnar").exists()
