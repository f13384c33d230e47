"""Train/validation split decided per conversation, stratified by (source, thinking).

Each stratum carries an error-diffusion accumulator with a seeded phase: exactly ``fraction`` of every
stratum (within one row) goes to validation, so the validation split carries thinking traces whenever the
train split does. It only depends on the order of rows inside a source, which the pipeline keeps fixed.
"""

from __future__ import annotations

import hashlib

from ..records import Conversation

TRAIN = "train"
VALIDATION = "validation"


class Splitter:
    def __init__(self, validation_fraction: float, seed: int) -> None:
        self.fraction = validation_fraction
        self.seed = seed
        self._accumulators: dict[tuple[str, bool], float] = {}

    def _phase(self, stratum: tuple[str, bool]) -> float:
        digest = hashlib.blake2b(f"{self.seed}\0{stratum[0]}\0{stratum[1]}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64

    def assign(self, conversation: Conversation) -> str:
        if self.fraction <= 0:
            return TRAIN
        stratum = (conversation.source, conversation.thinking)
        accumulator = self._accumulators.get(stratum)
        if accumulator is None:
            accumulator = self._phase(stratum)
        accumulator += self.fraction
        if accumulator >= 1.0:
            self._accumulators[stratum] = accumulator - 1.0
            return VALIDATION
        self._accumulators[stratum] = accumulator
        return TRAIN
