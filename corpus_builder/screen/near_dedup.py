"""Duplicate conversations across sources: exact on normalised text, and near duplicates by MinHash/LSH.

Both indexes stream: ``offer(keys, texts)`` decides a batch of rows offered in priority order (the caller
orders rows by source priority, then the order they are read in) and remembers them. Every decision depends
only on the set of rows and their priorities, never on which rows were kept before: deciding a batch of one
row at a time or of a million, or the rows partitioned any way and grouped by hash (``dedup.Dedup``'s grouped
form, which the Ray engine runs), gives the same answers.

Both compare the normalised text of ``normalise`` (:func:`~corpus_builder.screen.normalise.normalise_text`).

**Exact rule** (:class:`ExactDuplicates`): a row is dropped when a row of higher priority has the same
normalised text (its 64-bit XXH3 digest, ``xxhash``: eight times BLAKE2b's speed for a hash that never leaves the
build; two different texts collide with probability about rows / 2^64): the first row of each text is kept.

**Near rule** (:class:`NearDuplicates`, which applies the exact rule first): MinHash signatures of the set
of word n-gram shingles (``shingle`` words, default 5; a text with fewer words is one shingle) of the
normalised text (``num_perm`` values, default 64), of which ``bands`` bands of ``rows_per_band`` values
are the LSH index: rows sharing a band hash (its high 32 bits, ``band_key``) are one bucket, and a bucket's
**head** is its first row by priority. A row is dropped as a near duplicate of the first head, another row,
of a bucket it is in that it is confirmed against: enough of the pair's other MinHash values agree in their
low 4 bits (b-bit minwise hashing: a 32-byte sketch per row), which removes most of the pairs that LSH alone
lets through below the threshold. The head may itself be dropped (a near duplicate of another head): the
rule is then still one answer however the rows are cut into batches or tasks, where "a near duplicate of an
earlier *kept* row" (the rule before issue 25) depended on every decision before it. Measured on the
project's fixtures (BENCHMARKS.md, "the order-free near rule"), the two rules keep the same rows on real
chats and differ on a few percent of the near copies of chained drifting texts. The band layout is derived
from ``threshold``: the most rows per band (the steepest curve) for which a pair of shingle-set Jaccard
similarity ``threshold`` is still a candidate with probability >= 0.95; the confirmation keeps 99% of such
pairs. With the defaults (0.8, 64 permutations: 10 bands of 6) a pair is flagged with probability about
0.99 at similarity 0.85, 0.94 at 0.8, 0.80 at 0.75, 0.53 at 0.7, 0.07 at 0.6 and 0.002 at 0.5. Low
thresholds need more permutations: a layout of few rows per band makes unrelated rows candidates too, and a
corpus of millions gives them many chances.

The signatures come from ``rensa`` (R-MinHash in Rust; its batch API takes a whole chunk's pre-hashed
shingles and returns one matrix), deterministic for a seed. ``datasketch``, the other well-kept library,
hashes every shingle and builds one object per document in Python: about 2,500 conversations/s here
against more than 20,000 (``benchmarks/bench_dedup.py``). Shingles are hashed here, with numpy, because
word n-grams of a whole chunk cost a few array operations that way where a Python list of shingle
strings would cost more than everything else.

**Memory** grows by bytes per row offered, never Python objects: in sorted numpy runs, the exact rule's 64-bit
hash and 32-bit row number (12 bytes) and each band's hash, 32 bits of it packed with the row number (8
bytes; a band hash a row of higher priority already holds is not stored again); in pages of their own, the
32-byte sketch: about 112 bytes a row with the default bands, 12 with the exact rule alone. The rows' keys, read
back only to name the row a duplicate duplicates, and where each ends are in temporary files.
"""

from __future__ import annotations

import math
import mmap
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal, TypeVar

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from ..recipe.model import band_layout
from .normalise import I64, U64, NormalisedChunk, mix64, normalised_chunks

Rule = Literal["exact", "near"]

# The largest run of a hash table (32 MB of packed entries): a merge needs as much memory again while it
# runs, and the table of every band's hashes is ~150 MB at 2M rows.
RUN_ENTRIES = 1 << 22
# Bits kept of each MinHash value to confirm candidates, and the share of pairs at the threshold they confirm.
SKETCH_BITS = 4
CONFIRM_AT_THRESHOLD = 0.99


@dataclass(frozen=True, slots=True)
class Duplicate:
    """Why a row is not kept: the key of the row of higher priority it duplicates, and by which rule."""

    of: str
    rule: Rule


@dataclass(frozen=True, slots=True)
class Signatures:
    """The hashes of a batch of texts, one row each: column 0 the exact rule's, then one per LSH band;
    which of them a text has; its sketch (no columns for the exact rule alone). Plain arrays: they pickle
    small, to cross from the processes that read rows."""

    hashes: U64
    present: npt.NDArray[np.bool_]
    sketches: U64

    @classmethod
    def empty(cls, columns: int, sketch_words: int) -> Signatures:
        return cls(np.zeros((0, columns), dtype=np.uint64), np.zeros((0, columns), dtype=bool),
                   np.zeros((0, sketch_words), dtype=np.uint64))

    @classmethod
    def concat(cls, parts: Sequence[Signatures]) -> Signatures:
        return cls(np.concatenate([p.hashes for p in parts]), np.concatenate([p.present for p in parts]),
                   np.concatenate([p.sketches for p in parts]))

    def __len__(self) -> int:
        return len(self.hashes)

    def rows(self, indices: Sequence[int]) -> Signatures:
        """The signatures of the given rows, in that order."""
        picked = np.asarray(indices, dtype=np.int64)
        return Signatures(self.hashes[picked], self.present[picked], self.sketches[picked])

    def to_arrow(self, places: npt.NDArray[np.int64], length: int) -> dict[str, pa.Array]:
        """The signatures as typed columns of ``length`` records, row i at record ``places[i]`` (null elsewhere):
        ``hashes`` and ``present`` (a fixed-size list of each row's columns), ``sketch`` (of its words; no column
        for the exact rule, which has none)."""
        mask = np.ones(length, dtype=bool)
        mask[places] = False
        arrow_mask = pa.array(mask)

        def column(values: npt.NDArray[Any]) -> pa.Array:
            spread = np.zeros((length, values.shape[1]), dtype=values.dtype)
            spread[places] = values
            return pa.FixedSizeListArray.from_arrays(pa.array(spread.reshape(-1)), values.shape[1], mask=arrow_mask)

        columns = {"hashes": column(self.hashes), "present": column(self.present)}
        if self.sketches.shape[1]:
            columns["sketch"] = column(self.sketches)
        return columns

    @classmethod
    def from_arrow(cls, table: pa.Table) -> Signatures:
        """The signatures of every record of ``table`` (``to_arrow``'s columns; no record null)."""
        def values(name: str, dtype: type[np.generic]) -> npt.NDArray[Any]:
            if name not in table.column_names:
                return np.zeros((len(table), 0), dtype=dtype)
            width = table.schema.field(name).type.list_size
            flat = pc.list_flatten(table.column(name)).to_numpy(zero_copy_only=False)
            return np.asarray(flat, dtype=dtype).reshape(len(table), width)

        return cls(values("hashes", np.uint64), values("present", np.bool_), values("sketch", np.uint64))

    def replaced(self, indices: Sequence[int], other: Signatures) -> Signatures:
        """A copy with rows ``indices`` replaced by the rows of ``other``, in order."""
        picked = np.asarray(indices, dtype=np.int64)
        hashes, present, sketches = self.hashes.copy(), self.present.copy(), self.sketches.copy()
        hashes[picked], present[picked], sketches[picked] = other.hashes, other.present, other.sketches
        return Signatures(hashes, present, sketches)


_HIGH = np.uint64(0xFFFFFFFF00000000)


def band_key(hashes: U64) -> U64:
    """What a band bucket is keyed by: the band hash's high 32 bits (the tables pack them with a row number).
    Two band hashes alike there share a bucket; the sketches confirm or reject the pair as for any other."""
    keyed: U64 = hashes >> np.uint64(32)
    return keyed

_LOW = np.uint64(0xFFFFFFFF)
_Entry = TypeVar("_Entry", np.uint64, np.uint32)
_OWN_PAGES_FROM = 1 << 20  # bytes: smaller runs merge again soon, malloc serves them well
# sorted entries; the row of each when kept beside them (None: packed in them, or a set's)
_Run = tuple[U64, npt.NDArray[np.uint32] | None]


class FirstSeen:
    """A map from 64-bit hashes to the first row offered that had them, or a set of hashes, as a few sorted numpy
    runs.

    A new batch of hashes is a new run; runs merge while the one before is no bigger than twice the newest and
    the merged run stays within RUN_ENTRIES, so there are about entries / RUN_ENTRIES + log2(RUN_ENTRIES /
    batch) runs, each entry is rewritten up to log2 times, a lookup is one ``searchsorted`` per run, and a
    merge's temporary memory stays a few dozen MB however big the table grows. Hashes are unique across
    runs: a row's hashes are added only when absent.

    ``whole_hashes`` keeps every hash beside a 32-bit row number (12 bytes an entry: the exact rule, whose
    matches are final), or alone with ``rows=False`` (8 bytes: a set, ``screen.ids``); otherwise an entry is the
    hash's high 32 bits and the row number in one 64-bit word (8 bytes: the bands, whose matches the sketches
    confirm, so that two hashes agreeing in their high bits, with probability about entries / 2^32 per lookup,
    cost one confirmation and nothing else)."""

    def __init__(self, *, whole_hashes: bool, rows: bool = True) -> None:
        self._whole = whole_hashes
        self._rows = rows or not whole_hashes  # the packed entries hold their rows
        self._runs: list[_Run] = []

    @property
    def nbytes(self) -> int:
        return sum(entries.nbytes + (rows.nbytes if rows is not None else 0) for entries, rows in self._runs)

    def find(self, queries: U64) -> I64:
        """The row of each hash (0 for a hash of a set), -1 when absent."""
        found = np.full(len(queries), -1, dtype=np.int64)
        if not self._runs or not len(queries):
            return found
        keys = queries if self._whole else band_key(queries) << np.uint64(32)
        order = np.argsort(keys)  # sorted queries walk each run in order, far fewer cache misses
        ordered = keys[order]
        rows_of_ordered = np.full(len(queries), -1, dtype=np.int64)
        for entries, rows in self._runs:
            positions = np.minimum(np.searchsorted(entries, ordered), len(entries) - 1)
            if self._whole:
                hit = entries[positions] == ordered
                rows_of_ordered[hit] = rows[positions[hit]] if rows is not None else 0
            else:
                hit = (entries[positions] & _HIGH) == ordered
                rows_of_ordered[hit] = entries[positions[hit]] & _LOW
        found[order] = rows_of_ordered
        return found

    def add_first(self, hashes: U64, rows: npt.NDArray[np.uint32]) -> None:
        """Record the row of each hash no row has yet. Rows come in priority order, so a hash's row is the first
        that had it (in one call, the first listed): its head."""
        keys = hashes if self._whole else band_key(hashes)
        new = self.find(hashes) < 0
        _, first = np.unique(keys[new], return_index=True)
        self.add_absent(hashes[new][first], rows[new][first])

    def add_absent(self, hashes: U64, rows: npt.NDArray[np.uint32] | None = None) -> None:
        """Record hashes none of which is held yet, each once (and the row of each, unless a set)."""
        if not len(hashes):
            return
        if not self._whole:
            assert rows is not None
            self._runs.append((np.sort(band_key(hashes) << np.uint64(32) | rows.astype(np.uint64)), None))
        elif self._rows:
            assert rows is not None
            order = np.argsort(hashes)
            self._runs.append((hashes[order], rows[order]))
        else:
            self._runs.append((np.sort(hashes), None))
        while (len(self._runs) >= 2 and len(self._runs[-2][0]) <= 2 * len(self._runs[-1][0])
               and len(self._runs[-2][0]) + len(self._runs[-1][0]) <= RUN_ENTRIES):
            newer = self._runs.pop()
            self._runs[-1] = _merge(self._runs[-1], newer)


def _merge(older: _Run, newer: _Run) -> _Run:
    """Two sorted runs as one, in linear time, in memory pages of their own (``_own_pages``)."""
    size = len(older[0]) + len(newer[0])
    entries = _own_pages(size, np.uint64)
    if older[1] is None or newer[1] is None:
        # Timsort finds the two runs and merges them: under half the time of the scatter below, and no
        # temporary but its merge buffer.
        np.concatenate((older[0], newer[0]), out=entries)
        entries.sort(kind="stable")
        return entries, None
    landing = np.searchsorted(older[0], newer[0]) + np.arange(len(newer[0]))  # where each newer entry goes
    from_older = np.ones(size, dtype=bool)
    from_older[landing] = False
    entries[landing], entries[from_older] = newer[0], older[0]
    rows = _own_pages(size, np.uint32)
    rows[landing], rows[from_older] = newer[1], older[1]
    return entries, rows


def _own_pages(size: int, dtype: type[_Entry]) -> npt.NDArray[_Entry]:
    """An array of ``size`` values in memory pages of its own (an anonymous mmap, unmapped when the array goes): a
    merged run lives long, and in malloc's heap it would pin the heap's top above the batches' short-lived arrays,
    whose freed pages then stay with the process (the ids' set and the exact rule alone, 2M rows: 78 MiB held for
    53 MiB of runs in the heap, 64 MiB in pages of their own)."""
    nbytes = size * np.dtype(dtype).itemsize
    if nbytes < _OWN_PAGES_FROM:
        return np.empty(size, dtype=dtype)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(pages, dtype=dtype, count=size)


class _Pages:
    """An append-only buffer in memory pages of its own (an anonymous mmap grown with mremap).

    Growing it copies nothing, and keeps a long-lived buffer that grows with the rows out of malloc's heap,
    where every realloc between the short-lived arrays of a batch can leave a hole behind."""

    def __init__(self) -> None:
        # Private: a shared anonymous map (mmap's default) cannot grow past its first size (SIGBUS).
        self._map = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.size = 0

    def extend(self, data: bytes) -> None:
        end = self.size + len(data)
        if end > len(self._map):
            self._map.resize(max(end, 2 * len(self._map)))
        self._map[self.size:end] = data
        self.size = end

    def __getitem__(self, part: slice) -> bytes:
        return self._map[part]

    def gather(self, width: int, rows: I64) -> U64:
        """Rows ``rows`` of the buffer read as (rows x width) 64-bit words; the view ends with the call, as it
        must: a buffer with a live view cannot grow."""
        view = np.frombuffer(self._map, dtype="<u8", count=self.size // (8 * width) * width).reshape(-1, width)
        picked: U64 = view[rows]
        del view
        return picked


class _Keys:
    """The keys of the rows offered, in order: their UTF-8 bytes end to end in a temporary file, and where each ends
    (8 bytes a key) in another. A key is read back only for a duplicate's verdict, so both stay in the page cache
    (or on disk) and out of the process: the index holds nothing a row for its keys, however many it indexes."""

    def __init__(self) -> None:
        # opened with the first key: many indexes stay empty
        self._data: BinaryIO | None = None
        self._ends: BinaryIO | None = None
        self._size = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def extend(self, keys: list[str]) -> None:
        data = "".join(keys).encode()
        lengths = [len(key) for key in keys] if data.isascii() else [len(key.encode()) for key in keys]
        ends = self._size + np.cumsum(lengths, dtype=np.uint64)
        if self._data is None or self._ends is None:
            self._data, self._ends = _temporary(), _temporary()
        _append(self._data, data)
        _append(self._ends, ends.astype("<u8").tobytes())
        self._size += len(data)
        self._count += len(keys)

    def __getitem__(self, index: int) -> str:
        assert self._data is not None and self._ends is not None
        # the key's end, and the one before it (its start) unless it is the first
        ends = os.pread(self._ends.fileno(), 16 if index else 8, 8 * (index - 1) if index else 0)
        start = int.from_bytes(ends[:8], "little") if index else 0
        end = int.from_bytes(ends[-8:], "little")
        return os.pread(self._data.fileno(), end - start, start).decode()


def _temporary() -> BinaryIO:
    """A temporary file open as long as the index lives, removed when it is closed."""
    return tempfile.TemporaryFile()


def _append(file: BinaryIO, data: bytes) -> None:
    """``data`` at the end of ``file``, flushed: it is read back by the descriptor."""
    try:
        file.write(data)
        file.flush()
    except OSError as error:  # the file has no name: the error names its directory, TMPDIR (a full disk)
        raise OSError(error.errno, error.strerror, tempfile.gettempdir()) from error


class _Sketches:
    """The low SKETCH_BITS bits of every MinHash value of each row, packed in 64-bit words: what confirms that a
    row sharing a band with a bucket's head is as similar as the threshold says (b-bit minwise hashing).

    Two values are equal with probability J + (1 - J) / 2^bits for shingle-set similarity J; the values of the
    band that made the pair a candidate are left out, they are equal by construction. A pair is confirmed when
    at least ``cut`` of the others are equal: the least count that a pair at the threshold still reaches with
    probability >= CONFIRM_AT_THRESHOLD."""

    def __init__(self, fields: int, bands: int, rows_per_band: int, threshold: float) -> None:
        self.rows_per_band = rows_per_band
        self.fields = fields
        per_word = 64 // SKETCH_BITS
        self.words = -(-self.fields // per_word)
        self._shifts = (SKETCH_BITS * np.arange(per_word)).astype(np.uint64)
        # Per band: the lowest bit of every field outside that band (and inside the signature).
        outside = np.ones((bands, self.words * per_word), dtype=np.uint64)
        outside[:, self.fields:] = 0
        for band in range(bands):
            outside[band, band * rows_per_band:(band + 1) * rows_per_band] = 0
        self._outside = self._pack(outside)
        compared = self.fields - rows_per_band
        equal = threshold + (1.0 - threshold) / 2**SKETCH_BITS
        self.cut = max(m for m in range(compared + 1) if _binomial_tail(compared, equal, m) >= CONFIRM_AT_THRESHOLD)
        self._store = _Pages()

    @property
    def nbytes(self) -> int:
        return self._store.size

    def sketch(self, signatures: U64) -> U64:
        """(rows x words) sketches of (rows x fields) MinHash values."""
        return self._pack(signatures & np.uint64((1 << SKETCH_BITS) - 1))

    def _pack(self, fields: U64) -> U64:
        padded = np.zeros((len(fields), self.words * len(self._shifts)), dtype=np.uint64)
        padded[:, :fields.shape[1]] = fields
        packed: U64 = np.bitwise_or.reduce(padded.reshape(len(fields), self.words, -1) << self._shifts, axis=2)
        return packed

    def stored(self, ordinals: I64) -> U64:
        return self._store.gather(self.words, ordinals)

    def append(self, sketches: U64) -> None:
        self._store.extend(np.ascontiguousarray(sketches, dtype="<u8").tobytes())

    def similar(self, first: U64, second: U64, bands: I64) -> npt.NDArray[np.bool_]:
        """Whether each pair of sketches, a candidate through ``bands``, is confirmed."""
        different = first ^ second
        folded = different
        for shift in range(1, SKETCH_BITS):
            folded = folded | (different >> np.uint64(shift))
        unequal = np.bitwise_count(folded & self._outside[bands]).sum(axis=1)
        equal: npt.NDArray[np.bool_] = (self.fields - self.rows_per_band - unequal) >= self.cut
        return equal


def _binomial_tail(trials: int, probability: float, at_least: int) -> float:
    return sum(math.comb(trials, k) * probability**k * (1.0 - probability) ** (trials - k)
               for k in range(at_least, trials + 1))


class ExactDuplicates:
    """Exact duplicates on normalised text, the first row offered of each text wins (see the module docstring)."""

    def __init__(self) -> None:
        self._keys = _Keys()
        # Each table and the hash columns it holds: the exact rule's whole hashes; NearDuplicates adds one
        # table for every band (their hashes differ by band), so a batch is one lookup per table.
        self._tables: list[tuple[FirstSeen, slice]] = [(FirstSeen(whole_hashes=True), slice(0, 1))]
        self._sketches: _Sketches | None = None
        self._columns, self._sketch_words = 1, 0

    @property
    def columns(self) -> int:
        """Hashes per row: the exact rule's, then one per band."""
        return self._columns

    @property
    def sketch_words(self) -> int:
        """64-bit words of a row's sketch."""
        return self._sketch_words

    def __len__(self) -> int:
        """Rows offered so far."""
        return len(self._keys)

    @property
    def nbytes(self) -> int:
        """Bytes of memory held for the rows offered (their keys are in files)."""
        sketches = self._sketches.nbytes if self._sketches is not None else 0
        return sum(table.nbytes for table, _ in self._tables) + sketches

    def offer(self, keys: Sequence[str], texts: Sequence[str]) -> list[Duplicate | None]:
        """Decide each row, the rows offered in priority order: the row of higher priority it duplicates, or
        None (kept).

        Texts are hashed a chunk at a time, and the rows offered before are looked up once per call: offer
        thousands of rows at a time (a lookup of a few hundred hashes in millions costs about as much as of ten
        thousand)."""
        return self.decide(keys, self.signatures(texts))

    def signatures(self, texts: Sequence[str]) -> Signatures:
        """What ``decide`` compares, for each text: computed apart (e.g. in the processes that read the rows),
        as it holds no state of the index."""
        if not texts:
            return Signatures.empty(self._columns, self._sketch_words)
        return Signatures.concat([self.chunk_signatures(chunk) for chunk in normalised_chunks(texts)])

    def chunk_signatures(self, chunk: NormalisedChunk) -> Signatures:
        """``signatures`` of one chunk already normalised (e.g. shared with the decontamination of the same
        texts)."""
        return Signatures(*self._hashes(chunk))

    def decide(self, keys: Sequence[str], signatures: Signatures) -> list[Duplicate | None]:
        """``offer`` for texts already hashed by ``signatures`` (of an index with the same settings)."""
        if len(keys) != len(signatures):
            raise ValueError(f"{len(keys)} keys for {len(signatures)} texts")
        if not keys:
            return []
        ordinals = np.arange(len(self._keys), len(self._keys) + len(keys), dtype=np.int64)
        self._keys.extend(list(keys))
        if self._sketches is not None:
            self._sketches.append(signatures.sketches)
        for table, columns in self._tables:
            rows, column = np.nonzero(signatures.present[:, columns])
            table.add_first(signatures.hashes[rows, column + columns.start], ordinals[rows].astype(np.uint32))
        return self._verdicts(signatures, ordinals)

    def _hashes(self, chunk: NormalisedChunk) -> tuple[U64, npt.NDArray[np.bool_], U64]:
        """(rows x columns) hashes, column 0 the exact rule's, and which of them a row has; (rows x words)
        sketches (no words for the exact rule alone)."""
        texts = chunk.texts
        # sliced as a memoryview, in a list: a numpy slice per text, a copy of the buffer or a generator cost more
        data = texts.data.data
        digest = xxhash.xxh3_64_intdigest
        exact = np.array([digest(data[start:end]) for start, end in zip(texts.starts.tolist(), texts.ends.tolist(),
                                                                        strict=True)],
                         dtype=np.uint64).reshape(-1, 1)
        return exact, np.ones(exact.shape, dtype=bool), np.zeros((len(texts), 0), dtype=np.uint64)

    def lookup(self, signatures: Signatures) -> list[Duplicate | None]:
        """The row indexed each text duplicates (exactly, else the first head it near-duplicates), or None; adds
        none of them: an index of rows to keep others apart from (an eval pack) stays as it was built."""
        if not len(signatures):
            return []
        return self._verdicts(signatures, np.full(len(signatures), -1, dtype=np.int64))

    def heads(self, signatures: Signatures) -> I64:
        """The head (ordinal) of each hash of each row: the first row offered with it, -1 for a hash a row has
        not. Band hashes are compared by their high 32 bits (``band_key``)."""
        found = np.full(signatures.hashes.shape, -1, dtype=np.int64)
        for table, columns in self._tables:
            rows, column = np.nonzero(signatures.present[:, columns])
            column += columns.start
            found[rows, column] = table.find(signatures.hashes[rows, column])
        return found

    def bucket_entries(self, signatures: Signatures) -> tuple[I64, npt.NDArray[np.uint8], U64, I64]:
        """Every bucket each row is in, as the tables key them: (row, kind, key, band) per hash a row has; kind 0
        is the exact rule's (its whole hash, band -1), kind 1 a band's (``band_key`` of its hash). A bucket's
        head is its entry of the least priority: what a group-by on (kind, key) finds, however rows are cut."""
        rows, column = np.nonzero(signatures.present)
        values = signatures.hashes[rows, column]
        kinds = (column > 0).astype(np.uint8)
        keys = np.where(column > 0, band_key(values), values)
        return rows.astype(np.int64), kinds, keys, column.astype(np.int64) - 1

    def confirmed(self, sketches: U64, head_sketches: U64, bands: I64) -> npt.NDArray[np.bool_]:
        """Whether each row's sketch is confirmed against its candidate head's, through ``bands``."""
        if self._sketches is None:
            raise ValueError("the exact rule has no sketches to confirm against")
        return self._sketches.similar(sketches, head_sketches, bands)

    def _verdicts(self, signatures: Signatures, ordinals: I64) -> list[Duplicate | None]:
        """Each row's verdict against the heads of its hashes, the row itself (``ordinals``) left out."""
        heads = self.heads(signatures)
        decisions: list[Duplicate | None] = [None] * len(heads)
        exact = (heads[:, 0] >= 0) & (heads[:, 0] != ordinals)
        for row in np.flatnonzero(exact).tolist():
            decisions[row] = Duplicate(self._keys[int(heads[row, 0])], "exact")
        rows, bands = np.nonzero((heads[:, 1:] >= 0) & (heads[:, 1:] != ordinals[:, None]) & ~exact[:, None])
        if not len(rows):
            return decisions
        assert self._sketches is not None
        candidates = heads[rows, bands + 1]
        confirmed = self.confirmed(signatures.sketches[rows], self._sketches.stored(candidates), bands)
        best = np.full(len(decisions), np.iinfo(np.int64).max)
        np.minimum.at(best, rows[confirmed], candidates[confirmed])
        for row in np.unique(rows[confirmed]).tolist():
            decisions[row] = Duplicate(self._keys[int(best[row])], "near")
        return decisions


class NearDuplicates(ExactDuplicates):
    """Exact and near duplicates, against the head of each bucket (see the module docstring)."""

    def __init__(self, threshold: float = 0.8, *, num_perm: int = 64, shingle: int = 5, seed: int = 0) -> None:
        import rensa  # type: ignore[import-untyped]  # imported where used: `corpus --help` stays light

        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], not {threshold}")
        if shingle < 1:
            raise ValueError(f"shingle must be at least one word, not {shingle}")
        self.threshold = threshold
        self.num_perm = num_perm
        self.shingle = shingle
        self.seed = seed
        self.bands, self.rows_per_band = band_layout(threshold, num_perm)
        self._minhash = rensa.RMinHash
        # Fixed odd multipliers that fold a band's values into one 64-bit hash.
        halves = np.random.default_rng(0x6E656172).integers(0, 1 << 63, size=self.rows_per_band, dtype=np.uint64)
        self._fold = halves * np.uint64(2) + np.uint64(1)
        # Distinct per band, so that one table holds every band's hashes.
        self._band_salts = np.arange(1, self.bands + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        super().__init__()
        self._tables.append((FirstSeen(whole_hashes=False), slice(1, 1 + self.bands)))
        self._sketches = _Sketches(num_perm, self.bands, self.rows_per_band, threshold)
        self._columns, self._sketch_words = 1 + self.bands, self._sketches.words

    def _hashes(self, chunk: NormalisedChunk) -> tuple[U64, npt.NDArray[np.bool_], U64]:
        assert self._sketches is not None
        exact, _, _ = super()._hashes(chunk)
        shingles, offsets = chunk.runs.hashes(self.shingle, whole_if_shorter=True)
        matrix = self._minhash.digest_matrix_from_flat_token_hashes(shingles, offsets.astype(np.uint64),
                                                                     self.num_perm, self.seed)
        signatures = np.array(matrix.to_rows(), dtype=np.uint64).reshape(len(chunk), self.num_perm)
        banded = signatures[:, :self.bands * self.rows_per_band].reshape(len(chunk), self.bands, self.rows_per_band)
        bands = mix64((banded * self._fold).sum(axis=2, dtype=np.uint64) + self._band_salts)
        present = np.ones((len(chunk), 1 + self.bands), dtype=bool)
        present[:, 1:] = (np.diff(offsets) > 0)[:, None]  # a text with no words has no signature
        return np.concatenate((exact, bands), axis=1), present, self._sketches.sketch(signatures)
