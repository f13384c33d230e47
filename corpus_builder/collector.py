"""The cyclic garbage collector's pace while rows stream through a stage."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# Allocations the collector lets pass before it looks for cycles: more than the tracked objects a batch
# of replay rows (parallel.PREPARED_ROWS conversations: one per turn and a few per row) or a window of
# generation rows keeps alive, so that a collection rarely runs in the middle of one.
STREAM_GC_THRESHOLD = 100_000

_holders = 0  # streams inside rare_collections; the first in saves the thresholds, the last out restores
_saved: tuple[int, ...] = ()
_lock = threading.Lock()  # an abandoned generator is closed by whichever thread collects it


@contextmanager
def rare_collections() -> Iterator[None]:
    """Raise the collector's first threshold while rows stream, and restore it after.

    Rows and in-flight requests stay alive for a while, so with the default threshold (700) the collector
    runs every few dozen rows (or requests), finds no garbage (they hold no cycles, refcounting frees them)
    and moves them to older generations whose full collections then walk every live object of the
    program again: about a tenth of the CPU of a replay build, and as much of a generation run's. Garbage
    cycles are still collected, only after more allocations. Streams may overlap (generators run
    interleaved): the thresholds come back when the last one ends."""
    global _holders, _saved
    with _lock:
        if _holders == 0:
            _saved = gc.get_threshold()
            gc.set_threshold(max(_saved[0], STREAM_GC_THRESHOLD), *_saved[1:])
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                gc.set_threshold(*_saved)
