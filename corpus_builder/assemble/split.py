"""Train/validation split decided per conversation, by its own identity and the seed alone.

A conversation goes to validation when a hash of (seed, its id) falls under the validation fraction. Nothing
else is looked at: a row added by a top-up, or one a check drops, never moves another conversation across
the split, and a rebuild with more or fewer rows keeps every surviving row where it was. Ids are content keys
(a generated row's comes from its prompt), so the split does not depend on input order either.

Stratification by (source, thinking) holds statistically rather than exactly: each stratum's validation share
is the fraction within binomial noise. ``STRATUM_TOLERANCE_SIGMAS`` states the tolerance the audit checks
(``split_balance``): within 3 standard deviations plus one row, e.g. 2% +- 1.3% for a stratum of 1,000 rows.
"""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.compute as pc

from ..draws import split_draw, split_draws
from ..recipe.model import SplitSpec
from ..records import Conversation

TRAIN = "train"
VALIDATION = "validation"
STRATUM_TOLERANCE_SIGMAS = 3.0


class Splitter:
    def __init__(self, validation_fraction: float, seed: int) -> None:
        self.fraction = validation_fraction
        self.seed = seed

    @classmethod
    def of(cls, split: SplitSpec) -> Splitter:
        return cls(split.validation_fraction, split.seed)

    def assign(self, conversation: Conversation) -> str:
        return self.assign_id(conversation.id)

    def assign_id(self, row_id: str) -> str:
        if self.fraction <= 0:
            return TRAIN
        return VALIDATION if split_draw(self.seed, row_id) < self.fraction else TRAIN

    def assign_ids(self, row_ids: list[str]) -> pa.StringArray:
        """``assign_id`` of each id, as one string array (the corpus's split column)."""
        if self.fraction <= 0:
            return pa.array([TRAIN] * len(row_ids), pa.string())
        validation = pa.array(split_draws(self.seed, row_ids) < self.fraction)
        return pc.if_else(validation, VALIDATION, TRAIN)


def within_tolerance(rows: int, validation: int, fraction: float) -> bool:
    """Whether a stratum's validation count is what the fraction gives, within the stated tolerance."""
    expected = rows * fraction
    return abs(validation - expected) <= STRATUM_TOLERANCE_SIGMAS * math.sqrt(expected * (1 - fraction)) + 1


def split_balance(strata: dict[str, dict[str, dict[str, int]]], fraction: float) -> list[str]:
    """The strata whose validation share is outside the split's stated tolerance."""
    outside = []
    for source, by_thinking in strata.items():
        for thinking, splits in by_thinking.items():
            rows, validation = sum(splits.values()), splits.get(VALIDATION, 0)
            if not within_tolerance(rows, validation, fraction):
                outside.append(f"{source} ({thinking}): {validation:,} of {rows:,} rows in validation, "
                               f"expected {rows * fraction:,.1f}")
    return outside
