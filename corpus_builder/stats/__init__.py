"""Corpus statistics (``corpus``: what the rows hold and what was dropped, audit.json) and the same in the target's
tokens (``tokens``): a leaf the build, the audit and the publish gate share, computed from Arrow batches as the
rows are written or read back. ``nearest_rank`` is the one percentile of them all."""

from __future__ import annotations

import math

import numpy as np


def nearest_rank(values: np.ndarray, counts: np.ndarray, share: float) -> int:
    """The nearest-rank ``share`` percentile of a histogram: ``values`` ascending, ``counts`` the times each
    occurs (at least one value counted)."""
    cumulative = np.cumsum(counts)
    rank = max(1, math.ceil(int(cumulative[-1]) * share / 100))
    return int(values[np.searchsorted(cumulative, rank)])
