"""The ids rows are written under: unique, the first row of an id keeping it and each later copy a suffix.

Ids are content keys (``records.conversation_id``), so identical rows of one source share one. Every row that
passed the row checks holds its id, kept by dedup or not: the k-th row of an id, by priority (the order rows are
read in), is written under ``ID-k``: a keyed stage of the build's plan (``build/plan.py``). ``UniqueIds`` numbers
the rows of a stream offered in priority order (the local engine); a suffixed id that is another row's own id
gives that copy the next free suffix.
"""

from __future__ import annotations

from .screened import Screened


class UniqueIds:
    """The ids of a stream of rows offered in priority order: a later copy of an id gets the first free suffix."""

    def __init__(self) -> None:
        # Hashes of the ids given: a dict used as a set because a dict holding only ints is not tracked by the
        # garbage collector, while a set always is (each full collection would walk every hash).
        self._seen: dict[int, None] = {}

    def assign(self, row_id: str) -> str:
        new_id, copy = row_id, 0
        while hash(new_id) in self._seen:
            copy += 1
            new_id = f"{row_id}-{copy}"
        self._seen[hash(new_id)] = None
        return new_id

    def judge(self, batch: Screened) -> None:
        """The ids of a batch's rows, the batches offered in priority order."""
        batch.ids = [self.assign(row.id) for row in batch.rows]
