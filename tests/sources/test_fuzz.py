"""Trial 4, source files: bad bytes at every place a dump can have them. Every line of a line format is a
kept row or a counted skip with its line number; a file that cannot be read as a whole is a CorpusError
naming it; nothing else escapes (no other exception, no hang, no memory growth beyond one bounded line).
Through the real CLI the same inputs end in exit 0 or 1 (a report) or 2 (a message), never a traceback.
See tests/support/fuzz.py for the long variant.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tracemalloc
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from corpus_builder.errors import CorpusError, Skipped
from corpus_builder.records import Conversation
from corpus_builder.sources import iter_file, readers
from tests.support.fuzz import Outcomes, fuzz_settings

OUTCOMES = Outcomes("trial 4, source files")
BOM = b"\xef\xbb\xbf"

SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(10 ** 30), max_value=10 ** 30)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30))
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=10)
ROLES = st.sampled_from(["user", "assistant", "system", "human", "gpt", "tool", "", "USER"]) | JSON_VALUES
TURN = st.fixed_dictionaries(
    {"role": ROLES, "content": st.text(max_size=40) | JSON_VALUES},
    optional={"reasoning": JSON_VALUES, "reasoning_content": st.text(max_size=20), "from": ROLES,
              "value": st.text(max_size=20) | JSON_VALUES})
TURNS = st.lists(TURN, max_size=5) | JSON_VALUES
ROW = st.one_of(
    st.fixed_dictionaries({"messages": TURNS}, optional={"id": JSON_VALUES, "extra": JSON_VALUES}),
    st.fixed_dictionaries({"conversations": TURNS}, optional={"id": JSON_VALUES}),
    st.fixed_dictionaries({"question": JSON_VALUES}, optional={"answer": JSON_VALUES}),
    st.fixed_dictionaries({"prompt": JSON_VALUES}),
    JSON_VALUES,
)
GOOD_ROW = {"id": "r", "messages": [{"role": "user", "content": "2+2?"},
                                    {"role": "assistant", "content": "<think>add</think>4"}]}
SPECIAL_LINES = [b"", b"   ", b"\t\r", BOM, b"\0", b"\xff\xfe", b"NaN", b"[" * 5000 + b"]" * 5000, b"1" * 400,
                 b'{"messages": "\xed\xa0\x80"}', b'{"messages": [' + b'{"role": "user"},' * 200 + b"]}",
                 b'"\\ud800"', b"{}" * 3, orjson.dumps(GOOD_ROW)[:-5]]


# Rows a dump really has, so that kept rows and skips mix in one file.
PLAIN_ROW = st.lists(st.text(min_size=1, max_size=20), min_size=2, max_size=4).map(
    lambda texts: {"messages": [{"role": ("user", "assistant")[i % 2], "content": text}
                                for i, text in enumerate(texts)]})


def _encode(row: Any) -> bytes:
    # Python's json writes what orjson refuses (NaN, Infinity, integers past 64 bits): those are bad lines too.
    return json.dumps(row, allow_nan=True).encode()


TRUNCATED_ROW = st.tuples(ROW.map(_encode), st.integers(min_value=0)).map(
    lambda cut: cut[0][:cut[1] % (len(cut[0]) + 1)])
LINE = st.one_of(PLAIN_ROW.map(_encode), ROW.map(_encode), st.binary(max_size=120), st.sampled_from(SPECIAL_LINES),
                 TRUNCATED_ROW)


@pytest.fixture(scope="module", autouse=True)
def print_outcomes() -> Iterator[None]:
    yield
    print("\n" + OUTCOMES.report())


def _not_json(line: bytes) -> bool:
    try:
        orjson.loads(line)
    except orjson.JSONDecodeError:
        return True
    return False


def _positions(items: list[Conversation | Skipped]) -> set[int]:
    """The line numbers a reader reported, kept or skipped."""
    found = set()
    for item in items:
        if isinstance(item, Conversation):
            found.add(item.provenance.source_line)
        else:
            assert isinstance(item, Skipped) and item.reason, item
            found.add(int(item.location.rsplit(":", 1)[1]))
    return found


def _content_lines(content: bytes) -> set[int]:
    """Line numbers that hold anything but whitespace after a byte order mark, counted here from the bytes (not by
    the reader)."""
    lines = content.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return {number for number, line in enumerate(lines, 1) if line.removeprefix(BOM).strip()}


def _read(path: Path, prop: str) -> list[Conversation | Skipped] | CorpusError:
    try:
        items = list(iter_file(path))
    except CorpusError as error:
        assert path.name in str(error)
        OUTCOMES.record(prop, "CorpusError naming the file")
        return error
    kept = sum(isinstance(item, Conversation) for item in items)
    OUTCOMES.record(prop, "rows kept and skips counted" if kept else "every row a counted skip")
    return items


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.zst"])
@fuzz_settings(60)
@given(lines=st.lists(LINE, max_size=12), bom=st.booleans())
def test_every_line_is_a_row_or_a_counted_skip(tmp_path: Path, fmt: str, lines: list[bytes], bom: bool) -> None:
    content = (BOM if bom else b"") + b"\n".join(lines) + b"\n"
    path = tmp_path / f"dump.{fmt}"
    path.write_bytes(zstandard.ZstdCompressor().compress(content) if fmt == "jsonl.zst" else content)
    items = _read(path, f"{fmt} lines")
    expected = _content_lines(content)
    if isinstance(items, CorpusError):
        # a file with no row at all, or one whose first line is no JSON and shows the file is something else
        # (compressed, an archive, UTF-16): an error
        first = content.split(b"\n", 1)[0].removeprefix(BOM)
        assert not expected or ("not UTF-8 JSON" in str(items) and _not_json(first))
    else:
        assert _positions(items) == expected


@fuzz_settings(60)
@given(rows=st.lists(PLAIN_ROW | ROW, max_size=10), wrap=st.booleans())
def test_every_row_of_a_json_document_is_a_row_or_a_counted_skip(tmp_path: Path, rows: list[Any],
                                                                 wrap: bool) -> None:
    path = tmp_path / "dump.json"
    path.write_bytes(_encode({"data": rows} if wrap else rows))
    items = _read(path, "json rows")
    if not isinstance(items, CorpusError):
        reported = {item.provenance.source_row if isinstance(item, Conversation)
                    else int(item.location.rsplit("#", 1)[1]) for item in items}
        assert reported == set(range(len(rows)))


def _valid_file(tmp_path: Path, fmt: str) -> bytes:
    rows = [{**GOOD_ROW, "id": f"r{i}"} for i in range(300)]
    path = tmp_path / f"whole.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=50)
    elif fmt == "jsonl.zst":
        path.write_bytes(zstandard.ZstdCompressor().compress(b"".join(orjson.dumps(r) + b"\n" for r in rows)))
    else:
        path.write_bytes(orjson.dumps(rows))
    return path.read_bytes()


class _ValidFiles(dict[str, bytes]):
    def __repr__(self) -> str:  # hypothesis prints a failing example's arguments: not kilobytes of rows
        return f"valid files ({', '.join(self)})"


@pytest.fixture(scope="module")
def valid_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    directory = tmp_path_factory.mktemp("valid")
    return _ValidFiles({fmt: _valid_file(directory, fmt) for fmt in ("parquet", "jsonl.zst", "json")})


FLIPS = st.lists(st.tuples(st.floats(0, 1), st.integers(1, 255)), max_size=3)  # (where, xor mask)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl.zst", "json"])
@fuzz_settings(60)
@given(cut=st.just(1.0) | st.floats(min_value=0, max_value=1), flips=FLIPS)
def test_a_truncated_or_damaged_file_is_an_error_naming_it_or_counted_rows(
        tmp_path: Path, valid_files: dict[str, bytes], fmt: str, cut: float, flips: list[tuple[float, int]]) -> None:
    data = bytearray(valid_files[fmt][:int(len(valid_files[fmt]) * cut)])
    for where, mask in flips:
        if data:
            data[int(where * (len(data) - 1))] ^= mask
    path = tmp_path / f"damaged.{fmt}"
    path.write_bytes(bytes(data))
    _read(path, f"damaged {fmt}")


@pytest.mark.parametrize("where", ["footer", "data page"])
def test_parquet_with_bytes_that_are_not_utf8_is_an_error_naming_it(tmp_path: Path, valid_files: dict[str, bytes],
                                                                     where: str) -> None:
    data = bytearray(valid_files["parquet"])
    # The column names in the footer (its length sits before the closing magic), or a string value in the
    # first data page: both were found by the fuzz test above.
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    # 0xF4 is the lead byte of a four-byte sequence; followed by ASCII it is never valid UTF-8.
    if where == "footer":
        for found in re.finditer(b"messages", data[footer:]):
            data[footer + found.start()] = 0xF4
    else:
        data[data.find(b"2+2?")] = 0xF4
    path = tmp_path / "damaged.parquet"
    path.write_bytes(bytes(data))
    with pytest.raises(CorpusError, match=re.escape("damaged.parquet: cannot read parquet")):
        list(iter_file(path))


def test_a_zstd_bomb_is_one_skipped_line_in_bounded_memory(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readers, "MAX_LINE_BYTES", 4 << 20)
    path = tmp_path / "bomb.jsonl.zst"
    compressor = zstandard.ZstdCompressor(level=19)
    path.write_bytes(compressor.compress(orjson.dumps(GOOD_ROW) + b"\n" + b"A" * (400 << 20) + b"\n"
                                         + orjson.dumps(GOOD_ROW) + b"\n"))
    assert path.stat().st_size < 64 << 10  # 400 MB of one line in a few kB
    tracemalloc.start()
    try:
        items = list(iter_file(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [getattr(item, "reason", "kept") for item in items] == ["kept", "line_too_long", "kept"]
    assert _positions(items) == {1, 2, 3}
    assert peak < 80 << 20, f"peak {peak / 2 ** 20:.0f} MiB"


@given(stream=st.binary(max_size=200).map(lambda data: data.replace(b"\0", b"\n")),
       cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=20))
@fuzz_settings(300)
def test_zstd_lines_do_not_depend_on_where_the_decompressed_chunks_end(stream: bytes, cuts: list[int]) -> None:
    bounds = sorted({0, len(stream), *(cut for cut in cuts if cut < len(stream))})
    chunks = [stream[start:end] for start, end in pairwise(bounds)]  # never empty, as zstd_chunks gives them
    lines = stream.split(b"\n")
    expected = lines[:-1] + ([lines[-1]] if lines[-1] else [])
    assert list(_zstd_lines_of(chunks, max_line_bytes=readers.MAX_LINE_BYTES)) == expected


@given(stream=st.lists(st.binary(max_size=12).map(lambda data: data.replace(b"\n", b"")), max_size=8).map(
    b"\n".join), max_line_bytes=st.integers(min_value=0, max_value=10))
@fuzz_settings(300)
def test_zstd_lines_longer_than_the_cap_become_one_marker_each(stream: bytes, max_line_bytes: int) -> None:
    # A chunk a byte: every line over the cap is seen to grow past it before its newline.
    chunks = [stream[index:index + 1] for index in range(len(stream))]
    lines = stream.split(b"\n")
    lines = lines[:-1] + ([lines[-1]] if lines[-1] else [])
    expected = ["too long" if len(line) > max_line_bytes else line for line in lines]
    got = ["too long" if line is readers._OVERLONG_LINE else line
           for line in _zstd_lines_of(chunks, max_line_bytes=max_line_bytes)]
    assert got == expected


def _zstd_lines_of(chunks: list[bytes], *, max_line_bytes: int) -> list[bytes]:
    """``readers._zstd_lines`` over decompressed ``chunks`` given as they are (pytest's monkeypatch would last
    across hypothesis's examples, so the module is patched and restored by hand)."""
    chunks_of, cap = readers.zstd_chunks, readers.MAX_LINE_BYTES
    readers.zstd_chunks = lambda path, label: iter(chunks)
    readers.MAX_LINE_BYTES = max_line_bytes
    try:
        return list(readers._zstd_lines(Path("chunks.jsonl.zst"), "chunks"))
    finally:
        readers.zstd_chunks, readers.MAX_LINE_BYTES = chunks_of, cap


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *args], capture_output=True, text=True,
                          timeout=120)


def test_bad_files_through_the_cli_end_in_a_report_or_exit_2(tmp_path: Path,
                                                             valid_files: dict[str, bytes]) -> None:
    files = {
        "garbage.jsonl": b"\n".join([b"\xff\xfe\0", b"[" * 5000, b"NaN", b'{"messages": 3}']) + b"\n",
        "empty.jsonl": b"",
        "cut.jsonl.zst": valid_files["jsonl.zst"][:-9],
        "cut.parquet": valid_files["parquet"][: len(valid_files["parquet"]) // 2],
        "cut.json": valid_files["json"][:-3],
        "noise.parquet": bytes(range(256)) * 8,
    }
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
        completed = _cli("audit", str(tmp_path / name))
        assert "Traceback" not in completed.stderr, (name, completed.stderr)
        if name == "garbage.jsonl":
            assert completed.returncode == 0 and "invalid_json" in completed.stdout, completed.stderr
        else:
            assert completed.returncode == 2 and name in completed.stderr, (name, completed.stderr)
