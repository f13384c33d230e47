"""The columnar path's kernels (sources/columnar.py) against the Python they stand for, on texts built to reach
their fast paths and the cases beside them: arrays sliced out of a bigger one, empty texts, texts across which a
pattern would straddle, multi-byte characters."""

from __future__ import annotations

import orjson
import pyarrow as pa
from hypothesis import example, given, settings
from hypothesis import strategies as st

from corpus_builder.records import THINK_CLOSE, THINK_OPEN
from corpus_builder.sources.columnar import (
    WHITESPACE,
    Lines,
    holds_tags,
    holds_text,
    holds_unicode_escaped,
    json_escaped,
)

PIECES = ["<think>", "</think>", "think>", "<", "/", ">", "thin", "k>", "</", " ", "\n", "é", "\u3000", "x"]
# no deadline: a shared machine's load is no defect of the kernels
UNTIMED = settings(deadline=None)
TEXTS = st.lists(st.lists(st.sampled_from(PIECES), max_size=5).map("".join), max_size=12)


def sliced(texts: list[str], skip: int) -> pa.Array:
    """``texts`` as a string array that is a slice of a bigger one (its offsets do not start at 0)."""
    return pa.array(["<think>x</think>"] * skip + texts + ["</think>"], pa.string()).slice(skip, len(texts))


@UNTIMED
@given(texts=TEXTS, skip=st.integers(0, 2))
@example(texts=["</thi", "nk>", "<think", ">"], skip=0)
def test_holds_tags_is_a_substring_test(texts: list[str], skip: int) -> None:
    tags = (THINK_CLOSE, THINK_OPEN, ">")
    assert [held.tolist() for held in holds_tags(sliced(texts, skip), tags)] == [
        [tag in text for text in texts] for tag in tags]


@UNTIMED
@given(pieces=st.lists(st.sampled_from([b"\\u000", b"\\u001", b"\\u002", b"\\u00", b"0", b"1", b"\\", b"u", b"{}\n"])))
def test_a_block_escapes_control_when_its_json_holds_u000x_or_u001x(pieces: list[bytes]) -> None:
    data = b"".join(pieces) + b"\n"
    assert Lines.of(data).escapes_control == (b"\\u000" in data or b"\\u001" in data)


# what orjson escapes with a backslash, writes as \\uXXXX, and leaves as it is
ESCAPING = ["\\", '"', "\n", "\r", "\t", "\b", "\f", "\x01", "\x0b", "\x1f", "\x7f", "é", "q", " "]


@UNTIMED
@given(texts=st.lists(st.lists(st.sampled_from(ESCAPING), max_size=4).map("".join), max_size=10),
       skip=st.integers(0, 2))
def test_json_escaped_is_what_orjson_writes_and_the_rest_is_the_row_paths(texts: list[str], skip: int) -> None:
    array = sliced(texts, skip)
    written = [orjson.dumps(text).decode()[1:-1] for text in texts]
    assert holds_unicode_escaped(array).tolist() == ["\\u" in text for text in written]
    escaped = json_escaped(array).to_pylist()
    assert [text for text, own in zip(escaped, written, strict=True) if "\\u" not in own] == [
        own for own in written if "\\u" not in own]


@UNTIMED
@given(texts=st.lists(st.lists(st.sampled_from([*WHITESPACE[:12], "a", "é", "\u3000x", "\x00", "\x7f"]),
                               max_size=4).map("".join), max_size=10), skip=st.integers(0, 2))
@example(texts=["", " ", "\u3000", "\x85a", " a", "a "], skip=1)
def test_holds_text_is_what_strip_keeps(texts: list[str], skip: int) -> None:
    assert holds_text(sliced(texts, skip)).tolist() == [bool(text.strip()) for text in texts]
