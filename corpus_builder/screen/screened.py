"""A batch of records as the screen leaves it and the keyed stages decide on it: the unit every engine moves.

The records are consecutive, in priority order: the rows that passed the row checks (a row truncated to the budget
in its new form) and, in their place, the skip records of the rows that did not (rows the eval pack holds out are
not among them). Of the rows, in order, the batch keeps what the keyed stages compare (the dedup signatures) and
what the writer adds up (the token facts, where a row was measured whole); the keyed stages then give each row the
id it is written under (``ids``) and, to a duplicate, its verdict (``dedup``). ``outcomes`` is the batch as the
writer takes it: kept rows under their ids, a duplicate as its skip record, under its own id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import Skipped
from ..records import Conversation, row_location

if TYPE_CHECKING:
    from ..tokens import TokenFacts
    from .dedup import Verdict
    from .near_dedup import Signatures


@dataclass(slots=True)
class Screened:
    """Consecutive records after the screen, with what the keyed stages decided of its rows (see the module)."""

    records: list[Conversation | Skipped]
    signatures: Signatures | None = None  # of the rows, in order; None without dedup
    facts: list[TokenFacts | None] | None = None  # of the rows: measured whole (None: not measured, or truncated)
    ids: list[str] | None = None  # of the rows: the ids they are written under (None: not decided yet)
    verdicts: list[Verdict | None] | None = None  # of the rows: why each is a duplicate (None: kept)
    rows: list[Conversation] = field(init=False)

    def __post_init__(self) -> None:
        self.rows = [record for record in self.records if isinstance(record, Conversation)]

    def outcomes(self) -> list[Conversation | Skipped]:
        """The records in order: each kept row under its id, each duplicate as its skip record."""
        if self.ids is None and self.verdicts is None:
            return self.records
        ids, verdicts = self.ids, self.verdicts
        outcomes: list[Conversation | Skipped] = []
        row = 0
        for record in self.records:
            if isinstance(record, Skipped):
                outcomes.append(record)
                continue
            verdict = verdicts[row] if verdicts is not None else None
            if verdict is not None:
                outcomes.append(Skipped(record.source, verdict.reason, row_location(record), verdict.detail,
                                        id=record.id))
            else:
                if ids is not None:
                    record.id = ids[row]
                outcomes.append(record)
            row += 1
        return outcomes

    def kept_facts(self) -> list[tuple[str, TokenFacts]]:
        """The token facts of the rows kept, by the id each is written under."""
        if self.facts is None:
            return []
        ids, verdicts = self.ids, self.verdicts
        return [(ids[index] if ids is not None else row.id, facts)
                for index, (row, facts) in enumerate(zip(self.rows, self.facts, strict=True))
                if facts is not None and (verdicts is None or verdicts[index] is None)]
