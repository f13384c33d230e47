"""Seeded row selection (a source's ``take``) that never holds rows in memory.

Every row gets a 64-bit priority from a hash of (seed, source name, file, position). ``fraction`` keeps
the rows whose priority falls under ``fraction`` of the range, deciding as it streams; ``count`` keeps
the ``count`` smallest priorities among the valid rows, found with a bounded heap in a first pass.
Both depend only on the seed and where a row sits, never on the order in which files are read.
"""

from __future__ import annotations

import heapq

from ..draws import SPAN, take_priority
from ..recipe.model import Take
from .readers import PositionFilter


def fraction_filter(take: Take | None, source: str, label: str) -> PositionFilter | None:
    """A streaming Bernoulli filter for one file, or None when every row is kept."""
    if take is None or take.fraction is None or take.fraction >= 1:
        return None
    threshold = int(take.fraction * SPAN)
    seed = take.seed
    return lambda position: take_priority(seed, source, label, position) < threshold


class CountSelection:
    """The ``count`` rows with the smallest priorities seen so far; memory O(count) integers."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._heap: list[tuple[int, int, int]] = []  # (-priority, unit, position): a max-heap

    def offer(self, row_priority: int, unit: int, position: int) -> None:
        if self.count <= 0:
            return
        entry = (-row_priority, unit, position)
        if len(self._heap) < self.count:
            heapq.heappush(self._heap, entry)
        elif entry > self._heap[0]:
            heapq.heapreplace(self._heap, entry)

    def chosen(self) -> dict[int, frozenset[int]]:
        """Positions chosen in each unit (file or hub split), by unit index."""
        by_unit: dict[int, set[int]] = {}
        for _, unit, position in self._heap:
            by_unit.setdefault(unit, set()).add(position)
        return {unit: frozenset(positions) for unit, positions in by_unit.items()}
