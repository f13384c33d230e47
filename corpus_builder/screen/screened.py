"""A batch of records as the screen leaves it and the keyed stages decide on it: the unit every engine moves.

The records are consecutive, in priority order: the rows that passed the row checks (a row truncated to the budget
in its new form) and, in their place, the skip records of the rows that did not (rows the eval pack holds out are
not among them). Of the rows, in order, the batch keeps what the keyed stages compare (the dedup signatures) and
what the writer adds up (the token facts, where a row was measured whole); the keyed stages then give each row the
id it is written under (``ids``) and, to a duplicate, its verdict (``dedup``). ``outcomes`` is the batch as the
writer takes it: kept rows under their ids, a duplicate as its skip record, under its own id.

Between a cluster's tasks a batch is its Arrow form (``to_arrow``): the records in ``rows.RECORD_SCHEMA`` and the
typed side columns, ``priority`` (each record's place in the read order), ``facts`` (``tokens.FACTS_TYPE``) and the
dedup signatures (``Signatures.to_arrow``: ``hashes``, ``present``, ``sketch``), null on skip records. A stage that
works on Arrow batches reads and adds columns there; ``from_arrow`` gives the records back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import Skipped
from ..records import Conversation, row_location
from ..rows import batch_to_records, records_to_batch
from ..tokens.measure import facts_from_arrow, facts_to_arrow

if TYPE_CHECKING:
    from ..tokens import TokenFacts
    from .near_dedup import Rule, Signatures


DUPLICATE = "duplicate"
NEAR_DUPLICATE = "near_duplicate"
RULE_REASONS: dict[Rule, str] = {"exact": DUPLICATE, "near": NEAR_DUPLICATE}


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why a row is dropped as a duplicate: the kept row it duplicates, and by which rule."""

    of: str
    of_source: str
    rule: Rule

    @property
    def reason(self) -> str:
        return RULE_REASONS[self.rule]

    @property
    def detail(self) -> str:
        return f"{'' if self.rule == 'exact' else 'near '}duplicate of {self.of} (source {self.of_source})"

    def skipped(self, row: Conversation) -> Skipped:
        """The ledger's record of ``row``, dropped by this verdict, under the row's id."""
        return Skipped(row.source, self.reason, row_location(row), self.detail, id=row.id)


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
                outcomes.append(verdict.skipped(record))
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

    def to_arrow(self, priorities: npt.NDArray[np.int64]) -> pa.Table:
        """The batch's Arrow form (see the module), each record with its ``priorities`` entry."""
        table = pa.Table.from_batches([records_to_batch(self.records)]).append_column(
            "priority", pa.array(priorities, pa.int64()))
        places = np.asarray([place for place, record in enumerate(self.records) if isinstance(record, Conversation)],
                            dtype=np.int64)
        if self.facts is not None:
            spread: list[TokenFacts | None] = [None] * len(self.records)
            for place, facts in zip(places.tolist(), self.facts, strict=True):
                spread[place] = facts
            table = table.append_column("facts", facts_to_arrow(spread))
        if self.signatures is not None:
            for name, column in self.signatures.to_arrow(places, len(self.records)).items():
                table = table.append_column(name, column)
        return table

    @classmethod
    def from_arrow(cls, table: pa.Table) -> Screened:
        """The records of a batch's Arrow form and their token facts (the signatures stay in the table: a keyed
        stage reads them there)."""
        facts = None
        if "facts" in table.column_names:
            facts = facts_from_arrow(table.filter(pc.is_null(table.column("skip_reason"))).column("facts"))
        return cls(batch_to_records(table), facts=facts)
