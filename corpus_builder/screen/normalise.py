"""The text dedup and decontamination compare, normalised the same way for both, and the hashes of its word runs.

**Normalised text** (:func:`normalise_text`): Unicode NFKC; lowercase; sentence punctuation, quotes and
brackets become spaces: the ASCII characters ``! " ' ( ) , . : ; ? [ ] ` { }`` and every non-ASCII
punctuation character (Unicode category P*), except dashes, which become ``-``; every run of whitespace
becomes one space, with none at either end. Letters, digits, symbols and the ASCII operators
``# $ % & * + - / < = > @ \\ ^ _ | ~`` stay, so "What is 2+2?" and "what is 2+2" are the same text while
"2+2" and "2-2" are not.

Texts are normalised a chunk at a time (``normalised_chunks``) into one byte buffer per chunk, and
``WordRuns`` hashes every run of n consecutive words of it with a few array operations, whatever n: the
shingles of the near-duplicate rule and the n-grams of decontamination.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import pairwise
from typing import Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ..records import Conversation
from ..rows import string_buffers

ConversationText = Literal["all", "prompt"]

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

# Rows are normalised and hashed a chunk of about this many bytes of text at a time: big enough that numpy's
# per-call cost is small, small enough that the chunk's temporary arrays (8 bytes per byte of text, several
# of them) stay in cache and a few MB (measured: 256-512 kB is faster than 2 MB, and ~100 MiB less RSS).
CHUNK_BYTES = 1 << 19

_DROPPED_ASCII = "!\"'(),.:;?[]`{}"
# Lowercase ASCII letters; ASCII whitespace, control characters, NUL and the dropped punctuation become
# spaces (so NUL can separate texts in a batch); bytes >= 128 (UTF-8 sequences) stay as they are.
_ASCII_TABLE = bytes(
    (i + 32 if 65 <= i <= 90 else 32 if i < 32 or i == 127 or chr(i) in _DROPPED_ASCII else i) for i in range(256)
)
_ASCII_LOOKUP = np.frombuffer(_ASCII_TABLE, dtype=np.uint8)
_SPACE, _SEPARATOR = 32, 0


def conversation_text(conversation: Conversation, turns: ConversationText = "all") -> str:
    """The text that dedup compares. ``"all"``: every turn's content, an assistant turn's reasoning before its
    content and its tool calls (name and arguments) after it (the order the target produced them);
    ``"prompt"``: the turns a prompt source sends, every turn but the assistant's (system, user and tool
    results), for dedup before generation. The row's tool schemas are left out: agent traffic shares one
    tool list, which would make unrelated conversations look alike."""
    parts: list[str] = []
    for message in conversation.messages:
        if message.role == "assistant":
            if turns == "prompt":
                continue
            if message.reasoning:
                parts.append(message.reasoning)
            parts.append(message.content)
            parts.extend(f"{call.name} {call.arguments}" for call in message.tool_calls)
        else:
            parts.append(message.content)
    return "\n".join(parts)


@cache
def _non_ascii_punctuation() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(non-ASCII punctuation but dashes, or whitespace; non-ASCII dashes), built on first use (~0.2 s)."""
    gaps: list[str] = []
    dashes: list[str] = []
    for code in range(128, sys.maxunicode + 1):
        category = unicodedata.category(chr(code))
        if category == "Pd":
            dashes.append(chr(code))
        elif category.startswith("P"):
            gaps.append(chr(code))
    return (re.compile("[\\s" + re.escape("".join(gaps)) + "]"), re.compile("[" + re.escape("".join(dashes)) + "]"))


def _mapped_bytes(text: str) -> bytes:
    """A text's UTF-8 bytes with every per-character rule applied (whitespace runs are collapsed later, for a
    whole batch at once)."""
    if not text.isascii():
        gaps, dashes = _non_ascii_punctuation()
        text = dashes.sub("-", gaps.sub(" ", unicodedata.normalize("NFKC", text).lower()))
    return text.encode().translate(_ASCII_TABLE)


@dataclass(frozen=True, slots=True)
class NormalisedTexts:
    """A batch of normalised texts as one byte buffer: text i is ``data[starts[i]:ends[i]]``, texts separated
    by a NUL byte."""

    data: npt.NDArray[np.uint8]
    starts: I64
    ends: I64

    def __len__(self) -> int:
        return len(self.starts)

    def text(self, index: int) -> bytes:
        return self.data[self.starts[index]:self.ends[index]].tobytes()


def text_chunks(texts: Sequence[str]) -> Iterator[slice]:
    """Consecutive slices of ``texts`` of about CHUNK_BYTES characters each (at least one text each)."""
    start = 0
    while start < len(texts):
        end, size = start, 0
        while end < len(texts) and (end == start or size < CHUNK_BYTES):
            size += len(texts[end])
            end += 1
        yield slice(start, end)
        start = end


def arrow_chunks(texts: pa.Array) -> Iterator[pa.Array]:
    """Consecutive slices of a string array of about ``CHUNK_BYTES`` each (``text_chunks`` of an Arrow array)."""
    offsets, _ = string_buffers(texts)
    cuts = np.searchsorted(offsets, np.arange(offsets[0], offsets[-1], CHUNK_BYTES)[1:])
    bounds = [0, *np.unique(cuts).tolist(), len(texts)]
    for start, end in pairwise(bounds):
        if end > start:
            yield texts.slice(start, end - start)


def normalise_texts(texts: Sequence[str]) -> NormalisedTexts:
    """Normalise a batch (the rules are in the module docstring)."""
    if not texts:
        return _no_texts()
    return _collapsed(b"\0".join(_mapped_bytes(text) for text in texts))


def normalise_arrow_texts(texts: pa.Array) -> NormalisedTexts:
    """``normalise_texts`` of a string array (no nulls): the array's buffer mapped by one ``bytes.translate`` (a
    third of a numpy table lookup's time) and cut into its texts, those that are not ASCII (Unicode's rules) mapped
    one by one."""
    if not len(texts):
        return _no_texts()
    offsets, data = string_buffers(texts)
    flat = bytes(memoryview(data)[offsets[0]:offsets[-1]]) if data is not None else b""
    mapped = flat.translate(_ASCII_TABLE)
    bounds = pairwise((offsets - offsets[0]).tolist())
    if flat.isascii():  # the common case, in one pass over the buffer
        pieces = [mapped[start:end] for start, end in bounds]
    else:
        ascii_rows = pc.string_is_ascii(texts).to_numpy(zero_copy_only=False).tolist()
        pieces = [mapped[start:end] if plain else _mapped_bytes(texts[index].as_py())
                  for index, ((start, end), plain) in enumerate(zip(bounds, ascii_rows, strict=True))]
    return _collapsed(b"\0".join(pieces))


def _no_texts() -> NormalisedTexts:
    nothing = np.zeros(0, dtype=np.int64)
    return NormalisedTexts(np.zeros(0, dtype=np.uint8), nothing, nothing)


def _collapsed(joined: bytes) -> NormalisedTexts:
    """Texts mapped character by character and joined by NUL, with their runs of whitespace collapsed."""
    raw = np.frombuffer(joined, dtype=np.uint8)
    # Each copy only where the texts need it: texts without a run of spaces (a chat's single lines) and without a
    # space at either end are cut as they are. A mask of neighbouring bytes finds the runs (a twentieth of the time
    # of a bytes search for two spaces, which stops at every space), and one compress pass keeps the last space of
    # each (2.3x faster than locating each run).
    space = raw == _SPACE
    repeated = np.zeros(len(raw), dtype=bool)
    np.logical_and(space[:-1], space[1:], out=repeated[:-1])
    if repeated.any():
        raw = raw[~repeated]
    separators = np.flatnonzero(raw == _SEPARATOR)
    # the spaces left at either end of a text, beside a separator or the buffer's ends (two a text at most)
    beside = np.concatenate(([0], separators - 1, separators + 1, [len(raw) - 1]))
    beside = beside[(beside >= 0) & (beside < len(raw))]
    at_end = np.unique(beside[raw[beside] == _SPACE])
    data = np.delete(raw, at_end) if len(at_end) else raw
    bounds = separators - np.searchsorted(at_end, separators)  # each separator moved back past the spaces dropped
    starts = np.concatenate(([0], bounds + 1)).astype(np.int64)
    ends = np.concatenate((bounds, [len(data)])).astype(np.int64)
    return NormalisedTexts(data, starts, ends)


def normalise_text(text: str) -> str:
    """One text, normalised (the rules are in the module docstring)."""
    return normalise_texts([text]).text(0).decode()


def mix64(values: U64) -> U64:
    """splitmix64's finaliser: every output bit depends on every input bit (MinHash buckets read a few)."""
    values = values ^ (values >> np.uint64(30))
    values = values * np.uint64(0xBF58476D1CE4E5B9)
    values = values ^ (values >> np.uint64(27))
    values = values * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


class _Powers:
    """P^k and P^-k modulo 2^64 for k < length, kept between batches (rebuilding them per batch would cost
    more than hashing it) up to a few chunks' length; a longer text gets tables of its own."""

    BASE = 0x9E3779B97F4A7C15  # odd, so it has an inverse modulo 2^64
    KEPT = 4 * CHUNK_BYTES

    def __init__(self) -> None:
        self._forward: U64 = np.ones(1, dtype=np.uint64)
        self._inverse: U64 = np.ones(1, dtype=np.uint64)

    def tables(self, length: int) -> tuple[U64, U64]:
        """(P^k, P^-k) for k < at least ``length``."""
        if length <= len(self._forward):
            return self._forward, self._inverse
        size = max(length, min(2 * len(self._forward), self.KEPT))
        forward, inverse = _powers_of(self.BASE, size), _powers_of(pow(self.BASE, -1, 1 << 64), size)
        if size <= self.KEPT:
            self._forward, self._inverse = forward, inverse
        return forward, inverse


def _powers_of(base: int, size: int) -> U64:
    """base^0 .. base^(size-1) modulo 2^64 (numpy's unsigned products wrap)."""
    powers = np.ones(size, dtype=np.uint64)
    np.cumprod(np.full(size - 1, base, dtype=np.uint64), out=powers[1:])
    return powers


_POWERS = _Powers()


class WordRuns:
    """Hashes of runs of consecutive words of a batch of normalised texts, for any run length.

    A run's hash is a polynomial hash of its bytes modulo 2^64 taken from prefix sums, then mixed: every run
    costs a few array operations whatever its length, and equal word runs hash alike wherever they occur.
    The prefix sums and word boundaries are computed once per batch, for every length asked."""

    def __init__(self, batch: NormalisedTexts) -> None:
        data = batch.data
        forward, self._inverse = _POWERS.tables(len(data) + 1)
        self._prefix = np.zeros(len(data) + 1, dtype=np.uint64)
        np.cumsum(data.astype(np.uint64) * forward[:len(data)], out=self._prefix[1:])
        word = (data != _SPACE) & (data != _SEPARATOR)
        edges = np.diff(word.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
        self._word_starts = np.flatnonzero(edges == 1)
        self._word_ends = np.flatnonzero(edges == -1)
        self._text_of_word = np.searchsorted(batch.ends, self._word_starts)
        self.words_per_text: I64 = np.bincount(self._text_of_word, minlength=len(batch))
        self._first_word = np.concatenate(([0], np.cumsum(self.words_per_text)))[:-1]

    def hashes(self, n: int, *, whole_if_shorter: bool) -> tuple[U64, I64]:
        """Hashes of every run of ``n`` consecutive words of each text, grouped by text: text i's are
        ``hashes[offsets[i]:offsets[i + 1]]``. A text of fewer than ``n`` words (but at least one) gives one
        hash, of all its words, when ``whole_if_shorter``, and none otherwise."""
        last_word = np.arange(len(self._word_starts)) + (n - 1)
        runs = np.flatnonzero(last_word < len(self._word_starts))
        runs = runs[self._text_of_word[runs] == self._text_of_word[last_word[runs]]]  # within one text
        run_ends = self._word_ends[last_word[runs]]
        if whole_if_shorter:
            short = np.flatnonzero((self.words_per_text > 0) & (self.words_per_text < n))
            runs = np.concatenate((runs, self._first_word[short]))
            last_of_short = self._first_word[short] + self.words_per_text[short] - 1
            run_ends = np.concatenate((run_ends, self._word_ends[last_of_short]))
            order = np.argsort(runs, kind="stable")
            runs, run_ends = runs[order], run_ends[order]
        run_starts = self._word_starts[runs]
        hashes = mix64((self._prefix[run_ends] - self._prefix[run_starts]) * self._inverse[run_starts])
        per_text = np.bincount(self._text_of_word[runs], minlength=len(self.words_per_text))
        offsets: I64 = np.concatenate(([0], np.cumsum(per_text))).astype(np.int64)
        return hashes, offsets


class NormalisedChunk:
    """A chunk of texts normalised, and its word runs, built on first use: dedup and decontamination of the
    same texts read one chunk, as normalising and the runs' prefix sums are most of what either costs."""

    __slots__ = ("_runs", "texts")

    def __init__(self, texts: NormalisedTexts) -> None:
        self.texts = texts
        self._runs: WordRuns | None = None

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def runs(self) -> WordRuns:
        if self._runs is None:
            self._runs = WordRuns(self.texts)
        return self._runs


def normalised_chunks(texts: Sequence[str]) -> Iterator[NormalisedChunk]:
    """``texts`` normalised a chunk at a time (``text_chunks``): a caller holds one chunk's arrays at once."""
    for chunk in text_chunks(texts):
        yield NormalisedChunk(normalise_texts(texts[chunk]))
