"""The screen and the keyed stages over a stream of rows offered in priority order: how the local engine runs them.

Rows come in the order their priority gives (sources in dedup order, each in the order read; generated rows after
every replayed one), so a keyed stage needs no shuffle here: it judges each batch as it comes against the rows
before it (``UniqueIds``, ``Dedup``: the first row of a group is the first one offered). Rows measured where they
were read (``MeasuredRows``: the replay readers') come with their measurement; the others are measured here, in
batches. The prompt screen and the audit of a raw file run the same stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from ..errors import Skipped
from ..records import Conversation
from ..sources import MeasuredRows
from .checks import Checker
from .row_checks import BatchStats
from .screened import Screened

# A keyed stage's judge of a batch, given every batch of the stream in priority order (it decides in place).
StreamJudge = Callable[[Screened], None]
BATCH_ROWS = 512


def screened_in_order(items: Iterable[Conversation | Skipped | MeasuredRows[BatchStats]], checker: Checker,
                      judges: Sequence[StreamJudge], batch_rows: int = BATCH_ROWS) -> Iterator[Screened]:
    """Every record of ``items`` screened and judged by ``judges`` in turn, in order, a batch at a time."""
    batch: list[Conversation] = []

    def judged(screened: Screened) -> Screened:
        for judge in judges:
            judge(screened)
        return screened

    for item in items:
        if isinstance(item, Conversation):
            batch.append(item)
            if len(batch) >= batch_rows:
                yield judged(checker.screened(batch, checker.measure(batch)))
                batch = []
            continue
        if batch:
            yield judged(checker.screened(batch, checker.measure(batch)))
            batch = []
        if isinstance(item, Skipped):
            yield Screened([item])
        else:
            yield judged(checker.screened(item.items, item.measurement))
    if batch:
        yield judged(checker.screened(batch, checker.measure(batch)))


def outcomes(batches: Iterable[Screened]) -> Iterator[Conversation | Skipped]:
    """The records of judged batches as the writer takes them: kept rows under their ids, duplicates skipped."""
    for batch in batches:
        yield from batch.outcomes()
