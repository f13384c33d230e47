"""Seeded draws: every seeded choice of the pipeline is a 64-bit hash of the seed and a row's identity, under a
purpose of its own, so that draws for different purposes are independent even from the same key, and each
purpose is written once, here. A source's ``take`` draws by where a row sits (its file and position), the
mixture and the split by the row's own id, so none of them depends on the order rows are read in."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

SPAN = 1 << 64  # the draws' range
SPLIT_PURPOSE = b"corpus-split"


def seeded_hash(purpose: bytes, seed: int, part: str | int, *parts: str | int) -> int:
    """A 64-bit hash of (seed, parts), their text joined by \\x1f, for one ``purpose`` (BLAKE2b's
    personalisation, at most 16 bytes)."""
    return int.from_bytes(_digests(purpose, seed)("\x1f".join(map(str, (part, *parts)))), "big")


def seeded_hashes(purpose: bytes, seed: int, keys: list[str]) -> npt.NDArray[np.uint64]:
    """``seeded_hash(purpose, seed, key)`` of each key (one part each), in one loop."""
    digest = _digests(purpose, seed)
    return np.frombuffer(b"".join([digest(key) for key in keys]), dtype=">u8").astype(np.uint64)


def _digests(purpose: bytes, seed: int) -> Callable[[str], bytes]:
    """The 8-byte digest of a key under (purpose, seed): the one spelling of the hashed bytes. The seed's prefix is
    hashed once and the state copied for each key (a third less time than hashing it again for a batch)."""
    started = hashlib.blake2b(f"{seed}\x1f".encode(), digest_size=8, person=purpose).copy

    def digest(key: str) -> bytes:
        hasher = started()
        hasher.update(key.encode())
        return hasher.digest()

    return digest


def take_priority(seed: int, source: str, label: str, position: int) -> int:
    """The order a source's ``take`` keeps rows in: by the row's file and position in it."""
    return seeded_hash(b"corpus-take", seed, source, label, position)


def mixture_priority(seed: int, row_id: str) -> int:
    """The order rows of a source are taken and prompts generated in by a declared mixture: by the row's id."""
    return seeded_hash(b"corpus-mixture", seed, row_id)


def split_draw(seed: int, row_id: str) -> float:
    """Where a conversation falls in [0, 1) for the train/validation split: by its id."""
    return seeded_hash(SPLIT_PURPOSE, seed, row_id) / SPAN


def split_draws(seed: int, row_ids: list[str]) -> npt.NDArray[np.float64]:
    """``split_draw`` of each id (the same floats: a 64-bit integer rounded to a double, then scaled exactly)."""
    return seeded_hashes(SPLIT_PURPOSE, seed, row_ids).astype(np.float64) / float(SPAN)


def pack_priority(seed: int, row_id: str) -> int:
    """The order conversations of a stratum are held out in the eval pack: by the row's id."""
    return seeded_hash(b"corpus-evalpack", seed, row_id)
