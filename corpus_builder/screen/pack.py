"""The eval pack as the row checks see it: which rows it holds out, and the index that keeps the corpus apart
from it.

A pack row is never in train or validation (``holds``: the build's cut, decided by the row's source, task,
thinking and id before any check), and neither is a training row that is a copy or a near copy of one: the
pack's rows are indexed once, before the corpus is read, and every row the checks keep is looked up in that
index (``copies``), which no training row joins. The rule is the near-duplicate rule of the recipe's
``checks.near_duplicates`` (its defaults when the recipe declares none: the pack is kept apart by near
copies whatever the corpus's own dedup is), on the whole conversation's text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..recipe.model import Checks, NearDuplicateSettings
from ..records import Conversation
from .dedup import Dedup
from .near_dedup import NearDuplicates, Signatures
from .normalise import ConversationText, conversation_text

EVAL_PACK_COPY = "eval_pack_copy"
PACK_TEXT: ConversationText = "all"
_SEPARATOR = "\x1f"


class PackScreen:
    """The pack's rows, indexed; ``holds`` tells a pack row from a training one."""

    def __init__(self, checks: Checks, holds: Callable[[Conversation], bool]) -> None:
        near = checks.near_duplicates or NearDuplicateSettings()
        self.index = NearDuplicates(near.threshold, num_perm=near.num_perm, shingle=near.shingle)
        self.holds = holds

    def add(self, rows: Sequence[Conversation]) -> None:
        """Index rows of the pack (a pack row that copies an earlier one adds nothing the earlier does not)."""
        self.index.decide([_SEPARATOR.join((row.source, row.id)) for row in rows], self.signatures(rows))

    def signatures(self, rows: Sequence[Conversation]) -> Signatures:
        return self.index.signatures([conversation_text(row, PACK_TEXT) for row in rows])

    def shares_signatures(self, dedup: Dedup | None) -> bool:
        """Whether the corpus's dedup computes the very signatures the pack's index compares."""
        index = dedup.index if dedup is not None else None
        return (dedup is not None and dedup.turns == PACK_TEXT and isinstance(index, NearDuplicates)
                and (index.threshold, index.num_perm, index.shingle, index.seed)
                == (self.index.threshold, self.index.num_perm, self.index.shingle, self.index.seed))

    def copies(self, signatures: Signatures) -> list[str | None]:
        """For each row, the pack row it copies (a ledger detail), or None."""
        details: list[str | None] = []
        for found in self.index.lookup(signatures):
            if found is None:
                details.append(None)
                continue
            source, row_id = found.of.split(_SEPARATOR, 1)
            copy = "copy" if found.rule == "exact" else "near copy"
            details.append(f"{copy} of eval pack row {row_id} (source {source})")
        return details
