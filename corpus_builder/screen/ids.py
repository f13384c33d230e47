"""The ids rows are written under: unique, the first row of an id keeping it and each later copy a suffix.

Ids are content keys (``records.conversation_id``), so identical rows of one source share one. Every row that
passed the row checks holds its id, kept by dedup or not: the k-th row of an id, by priority (the order rows are
read in), is written under ``ID-k``: a keyed stage of the build's plan (``assemble/plan.py``), in two forms of the
one rule. ``UniqueIds`` numbers the rows of a stream offered in priority order (the local engine);
``numbered_copies`` numbers a block of whole id groups in any order (an engine that shuffles the ids by key). A
suffixed id can be another row's own id: the stream gives that copy the next free suffix, the grouped form cannot
see it (the engine refuses such a build).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .near_dedup import FirstSeen
from .screened import Screened

# What the grouped form reads of each row (``id_entries``) and gives for each copy (``numbered_copies``).
ID_ENTRIES = pa.schema([("priority", pa.int64()), ("raw_id", pa.string())])
NUMBERED = pa.schema([("priority", pa.int64()), ("id", pa.string())])
_HASH_BITS = (1 << 64) - 1  # a hash as the set holds it: its 64 bits, unsigned
SUFFIX_LOOKAHEAD = 8  # suffixes looked up at once for a copy whose first ones are taken


class UniqueIds:
    """The ids of a stream of rows offered in priority order: a later copy of an id gets the first free suffix.

    The ids given are kept as their 64-bit hashes (Python's ``hash``) in a numpy set (``FirstSeen``: 8 bytes an id,
    never a Python object), looked up a batch at a time. Two different ids of one hash would make the second look
    like a copy of the first (written as ``ID-1``): with n ids, a chance of about n^2 / 2^65, 1e-7 at 2M rows."""

    def __init__(self) -> None:
        self._seen = FirstSeen(whole_hashes=True, rows=False)

    def assign_all(self, row_ids: list[str]) -> list[str]:
        """The id each row is written under, the rows in priority order."""
        keys = np.fromiter(map(hash, row_ids), dtype=np.int64, count=len(row_ids)).view(np.uint64)
        seen = self._seen.find(keys) >= 0
        if not seen.any() and len(np.unique(keys)) == len(keys):  # the common batch: every id new
            self._seen.add_absent(keys)
            return row_ids
        # Which suffixed ids the set holds, looked up a batch of names at a time (one lookup costs tens of
        # microseconds, whatever its size): first the first SUFFIX_LOOKAHEAD suffixes of every row that may need one
        # (a known id, or one repeated in the batch), then, for a copy that needs more, its next ones at once.
        held = dict(zip(keys.tolist(), seen.tolist(), strict=True))
        repeated = np.ones(len(keys), dtype=bool)
        repeated[np.unique(keys, return_index=True)[1]] = False
        copies = [row_ids[index] for index in np.flatnonzero(seen | repeated).tolist()]
        self._look_up(copies, 1, SUFFIX_LOOKAHEAD, held)
        given: dict[int, None] = {}  # the hashes of the ids this batch gives, in a copy's search for a free suffix
        assigned = []
        for row_id, key in zip(row_ids, keys.tolist(), strict=True):
            new_id, copy = row_id, 0
            while held[key] or key in given:
                copy += 1
                new_id = f"{row_id}-{copy}"
                key = hash(new_id) & _HASH_BITS
                if key not in held:
                    self._look_up([row_id], copy, SUFFIX_LOOKAHEAD, held)
            given[key] = None
            assigned.append(new_id)
        self._seen.add_absent(np.fromiter(given, dtype=np.uint64, count=len(given)))
        return assigned

    def _look_up(self, row_ids: list[str], first: int, count: int, held: dict[int, bool]) -> None:
        """Whether the set holds each of ``row_ids`` suffixed ``-first`` to ``-(first + count - 1)``, into ``held``
        (by hash)."""
        names = [f"{row_id}-{copy}" for row_id in row_ids for copy in range(first, first + count)]
        keys = np.fromiter(map(hash, names), dtype=np.int64, count=len(names)).view(np.uint64)
        held.update(zip(keys.tolist(), (self._seen.find(keys) >= 0).tolist(), strict=True))

    def judge(self, batch: Screened) -> None:
        """The ids of a batch's rows, the batches offered in priority order."""
        batch.ids = self.assign_all([row.id for row in batch.rows])


def id_entries(rows: pa.Table) -> pa.Table:
    """Each row's entry (``ID_ENTRIES``) of a batch's rows in their Arrow form (``Screened.to_arrow``)."""
    return pa.table({"priority": rows.column("priority"), "raw_id": rows.column("id")}, schema=ID_ENTRIES)


def numbered_copies(entries: pa.Table) -> pa.Table:
    """The ids of the copies in a block of whole id groups (``ID_ENTRIES``, any order): each group's k-th entry by
    priority gets ``ID-k`` (k >= 1); the first keeps its id and is not listed (``NUMBERED``)."""
    if not len(entries):  # an empty partition (its block may have no columns)
        return NUMBERED.empty_table()
    counts = pc.value_counts(entries.column("raw_id"))
    repeated = counts.field("values").filter(pc.greater(counts.field("counts"), 1))
    copies = entries.filter(pc.is_in(entries.column("raw_id"), value_set=repeated)).sort_by(
        [("raw_id", "ascending"), ("priority", "ascending")])
    raw_ids = copies.column("raw_id").to_pylist()
    ranks = np.zeros(len(raw_ids), dtype=np.int64)
    for index in range(1, len(raw_ids)):
        ranks[index] = ranks[index - 1] + 1 if raw_ids[index] == raw_ids[index - 1] else 0
    later = np.flatnonzero(ranks)
    return pa.table({"priority": copies.column("priority").take(pa.array(later)),
                     "id": pa.array([f"{raw_ids[i]}-{ranks[i]}" for i in later.tolist()], pa.string())},
                    schema=NUMBERED)
