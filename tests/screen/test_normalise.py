"""The normalised text dedup, near dedup and decontamination share, and the hashes of its word runs, against slow
references written from the module's docstrings: the rules one character at a time, the run hash as its sum."""

from __future__ import annotations

import unicodedata

import numpy as np
import pyarrow as pa
from hypothesis import example, given
from hypothesis import strategies as st

from corpus_builder.screen import normalise
from corpus_builder.screen.normalise import WordRuns, mix64, normalise_arrow_texts, normalise_text, normalise_texts
from tests.support.fuzz import fuzz_settings

MASK = (1 << 64) - 1
DROPPED_ASCII = set("!\"'(),.:;?[]`{}")
# Characters each rule reads (ASCII edges, NUL, controls, Unicode spaces, dashes, other punctuation, NFKC
# forms, case), then any character at all.
EDGES = [" ", "\t", "\n", "\x00", "\x1f", "\x7f", "a", "Z", "7", "+", "-", "#", "_", "~", "!", ".", "'", "`",
         "{", "\u00a0", "\u2028", "\u3000", "\u0085", "\u2014", "\u2013", "\u201c", "\u3002", "\u00bf", "Ｆ", "ﬁ",
         "\u00c9", "\u0130", "ß", "\u2460"]
CHARACTERS = st.one_of(st.sampled_from(EDGES), st.characters(blacklist_categories=("Cs",)))
TEXTS = st.lists(st.text(CHARACTERS, max_size=12), max_size=6)
# ASCII alone: a batch the arrays' fast path maps in one pass
ASCII_TEXTS = st.lists(st.text(st.sampled_from([char for char in EDGES if char.isascii()]), max_size=12), max_size=6)


def reference_normalised(text: str) -> str:
    """The module docstring's rules, one character at a time."""
    mapped: list[str] = []
    for char in unicodedata.normalize("NFKC", text).lower():
        category = unicodedata.category(char)
        if ord(char) < 128:
            gap = ord(char) <= 32 or ord(char) == 127 or char in DROPPED_ASCII
            mapped.append(" " if gap else char)
        elif category == "Pd":
            mapped.append("-")
        else:
            mapped.append(" " if char.isspace() or category.startswith("P") else char)
    return " ".join(word for word in "".join(mapped).split(" ") if word)


def reference_mix(value: int) -> int:
    """splitmix64's finaliser on Python integers."""
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & MASK
    return value ^ (value >> 31)


def reference_run_hashes(text: str, n: int, whole_if_shorter: bool) -> list[int]:
    """The hash of each run of ``n`` words of a normalised text: its bytes' polynomial sum, mixed."""
    words = text.encode().split(b" ") if text else []
    runs = [b" ".join(words[i:i + n]) for i in range(len(words) - n + 1)]
    if whole_if_shorter and 0 < len(words) < n:
        runs = [b" ".join(words)]
    base = normalise._Powers.BASE
    return [reference_mix(sum(byte * pow(base, k, 1 << 64) for k, byte in enumerate(run)) & MASK) for run in runs]


@given(texts=TEXTS)
@example(texts=["", " abc"])  # a space run right after an empty text's separator
@example(texts=["a ", ""])  # a space run right before an empty last text's separator
@example(texts=["", "", " ", " x ", ""])
@example(texts=["   a \t\n b  ", "\n\n", "x\x00\x00 ", "  y"])  # runs of several spaces at a text's ends and inside
@fuzz_settings(200)
def test_a_batch_normalises_each_text_by_the_documented_rules(texts: list[str]) -> None:
    batch = normalise_texts(texts)
    assert len(batch) == len(texts)
    assert [batch.text(i).decode() for i in range(len(texts))] == [reference_normalised(text) for text in texts]


@given(texts=TEXTS | ASCII_TEXTS, skip=st.integers(0, 2))
@example(texts=["  a  ", "", " "], skip=1)
@example(texts=["a b", "c", ""], skip=0)  # nothing to collapse: cut as they are
@example(texts=[" a", "b c "], skip=0)  # spaces at the ends alone
@fuzz_settings(200)
def test_an_arrow_batch_normalises_as_a_list_of_texts(texts: list[str], skip: int) -> None:
    """Whether every text is ASCII or not, and in an array sliced from a bigger one."""
    array = pa.array(["Skipped!"] * skip + texts + ["after"], pa.string()).slice(skip, len(texts))
    batch = normalise_arrow_texts(array)
    assert [batch.text(i).decode() for i in range(len(batch))] == [reference_normalised(text) for text in texts]


@given(text=st.text(CHARACTERS, max_size=30))
@fuzz_settings(100)
def test_normalised_text_is_a_normal_form(text: str) -> None:
    once = normalise_text(text)
    assert normalise_text(once) == once


def test_no_texts_make_an_empty_batch_of_the_arrays_any_batch_has() -> None:
    empty, some = normalise_texts([]), normalise_texts(["a b"])
    assert len(empty) == 0 and empty.data.tobytes() == b""
    for name in ("data", "starts", "ends"):
        array, other = getattr(empty, name), getattr(some, name)
        assert array.shape == (0,) and array.dtype == other.dtype, name
    runs = WordRuns(empty)
    hashes, offsets = runs.hashes(3, whole_if_shorter=True)
    assert len(hashes) == 0 and offsets.tolist() == [0] and runs.words_per_text.tolist() == []


def test_mix64_is_splitmix64s_finaliser() -> None:
    """The published splitmix64 sequence from seed 0 is the finaliser of multiples of its increment."""
    gamma = 0x9E3779B97F4A7C15
    published = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F, 0xF88BB8A8724C81EC]
    assert [reference_mix((k * gamma) & MASK) for k in range(1, 5)] == published
    states = np.array([(k * gamma) & MASK for k in range(1, 5)], dtype=np.uint64)
    assert mix64(states).tolist() == published


@given(values=st.lists(st.integers(0, MASK), min_size=1, max_size=20))
@fuzz_settings(100)
def test_mix64_agrees_with_the_reference(values: list[int]) -> None:
    assert mix64(np.array(values, dtype=np.uint64)).tolist() == [reference_mix(value) for value in values]


@given(texts=TEXTS, n=st.integers(1, 4), whole_if_shorter=st.booleans())
@example(texts=["a b c", "a b", "", "d"], n=3, whole_if_shorter=True)  # exactly n words: one run, not two
@fuzz_settings(150)
def test_word_run_hashes_agree_with_the_reference(texts: list[str], n: int, whole_if_shorter: bool) -> None:
    hashes, offsets = WordRuns(normalise_texts(texts)).hashes(n, whole_if_shorter=whole_if_shorter)
    assert len(offsets) == len(texts) + 1
    found = [hashes[offsets[i]:offsets[i + 1]].tolist() for i in range(len(texts))]
    assert found == [reference_run_hashes(reference_normalised(text), n, whole_if_shorter) for text in texts]
