"""The draft vocabulary's choice from token frequencies, shared by ``corpus vocab`` (``export.vocab``) and the audit's
comparison with traffic (``audit.traffic``), so that both choose the same ids: the k most frequent, and the share of
the tokens a choice covers."""

from __future__ import annotations

import numpy as np


def top_k(counts: np.ndarray, k: int) -> np.ndarray:
    """The k most frequent ids, ties to the lower id (speculators' order)."""
    order: np.ndarray = np.lexsort((np.arange(len(counts)), -counts))
    return order[:k]


def coverage(counts: np.ndarray, chosen: np.ndarray) -> float | None:
    """The share of the tokens counted by ``counts`` whose id is ``chosen`` (None: no token counted)."""
    total = int(counts.sum())
    return round(int(counts[chosen].sum()) / total, 6) if total else None
