"""The local engine: the plan's stages over a stream of rows in priority order, on this machine (``plan``).

A build the columnar path covers (``columnar``: a plain replay of JSON lines) reads, judges and writes its rows as
Arrow batches. Otherwise the replay sources are read, normalised and measured on forked workers where that pays
(``sources.parallel``), in order; the screen and the keyed stages judge each batch as it comes
(``screen.stream``). A build that takes every row writes each batch as it is judged: memory stays flat. A take
(prompt sources, a declared corpus) spools the kept rows per source (``KeptRows``), keeps their keys in memory and
writes the rows the selection takes, source by source in recipe order, once the selection is known.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

from ..errors import Skipped
from ..layout import ShardInfo
from ..progress import ProgressLine
from ..records import Conversation
from ..rows import RowSpool
from ..screen.checks import Checker
from ..screen.pack import PackScreen
from ..screen.row_checks import BatchStats
from ..screen.screened import Screened
from ..screen.stream import StreamJudge, screened_in_order
from ..sources import MeasuredRows, replay_stream
from ..stats.corpus import CorpusStats
from ..tokens import TokenFacts
from .collect import MixtureKeys
from .columnar import uncovered, write_columnar
from .mixture import Available, Selection, SelectStage
from .plan import KeyedStage, Plan, TargetTokens
from .shards import LedgerWriter, ShardWriter
from .split import Splitter


class KeptRows(MixtureKeys):
    """The rows that passed every check, spooled per source, with their selection keys in memory."""

    def __init__(self, select: SelectStage, staging: Path) -> None:
        super().__init__(select)
        self.directory = staging / "kept"
        self.directory.mkdir()
        self._spools: dict[str, RowSpool] = {}  # only sources that kept a row have one

    def add(self, conversation: Conversation) -> None:
        conversation.split = self.add_keys(conversation.source, conversation.id, conversation.thinking)
        spool = self._spools.get(conversation.source)
        if spool is None:
            spool = self._spools[conversation.source] = RowSpool(self.directory / f"{len(self._spools):04d}.arrow")
        spool.append(conversation)

    def close(self) -> None:
        for spool in self._spools.values():
            spool.close()

    def selected(self, selection: Selection | None) -> Iterator[Conversation | Skipped]:
        """The rows the selection takes (None: every row): source by source in recipe order, each in the order it
        was kept; and the evicted rows, as the ledger's records."""
        self.close()
        for spec in self.select.sources:
            spool = self._spools.get(spec.name)
            if spool is None:
                continue
            for row in spool:
                taken = self.rule.taken(row, selection)
                if taken is not None:
                    yield taken


def handed_over(batches: Iterable[Screened], measured: dict[str, TokenFacts]) -> Iterator[Conversation | Skipped]:
    """The judged batches' records as the writer takes them (``Screened.outcomes``), each kept row's token facts
    left in ``measured`` under the id it is written under, for the writer's token statistics."""
    for batch in batches:
        outcomes = batch.outcomes()
        measured.update(batch.kept_facts())
        yield from outcomes


def write_rows(items: Iterable[Conversation | Skipped], staging: Path, rows_per_shard: int, splitter: Splitter,
               ledger: LedgerWriter, auditor: CorpusStats) -> list[ShardInfo]:
    """The write stage on one stream: each row split (a taken row was split when it was kept) and written to the
    shards, whose statistics ``auditor`` adds; each skip record into the ledger, which is closed at the end."""
    shards = ShardWriter(staging, rows_per_shard, observe=auditor.add_rows)
    try:
        for item in items:
            if isinstance(item, Skipped):
                ledger.write(item)
            else:
                if item.split is None:
                    item.split = splitter.assign(item)
                shards.write(item)
    except BaseException:
        shards.abort()
        raise
    finally:
        ledger.close()
    return shards.close()


class LocalEngine:
    """The plan on this machine (see the module). ``tokens``: the target's renderer and the token facts handed to
    the writer; ``pack``: the eval pack's index (None: no pack); ``auditor``: the statistics of the rows written."""

    def __init__(self, plan: Plan, staging: Path, ledger: LedgerWriter, tokens: TargetTokens, auditor: CorpusStats,
                 stream: TextIO, pack: PackScreen | None) -> None:
        self.plan = plan
        self.staging = staging
        self.ledger = ledger
        self.tokens = tokens
        self.auditor = auditor
        self.stream = stream
        # Facts measured where rows are read go with a streamed row to the writer; a taken row is spooled without
        # them, and measured when written.
        self.checker: Checker = plan.screen.checker(tokens.renderer, pack,
                                                    facts=tokens.settings is not None and not plan.takes)
        self._keyed: list[KeyedStage] = []
        self._judges: list[StreamJudge] = []
        self._kept: KeptRows | None = None
        in_tokens = self.checker.in_tokens or tokens.settings is not None
        self._columnar = uncovered(plan, in_tokens, pack is not None) is None

    def screen(self) -> None:
        """Nothing runs yet: the rows stream when they are taken or written."""

    def group(self, stage: KeyedStage) -> None:
        self._keyed.append(stage)

    def take(self, select: SelectStage) -> None:
        kept = self._kept = KeptRows(select, self.staging)
        self._judges = [stage.stream_judge(kept.evict) for stage in self._keyed]
        self._absorb(self._replay())

    def available(self) -> dict[str, Available]:
        assert self._kept is not None
        return self._kept.available

    def extend(self, rows: Iterator[Conversation | Skipped]) -> None:
        self._absorb(rows)

    def write(self, selection: Selection | None) -> list[ShardInfo]:
        write = self.plan.write
        if self._kept is not None:
            items = self._kept.selected(selection)
        elif self._columnar:  # the columnar path: Arrow batches from the files to the shards
            return write_columnar(self.plan, self.checker, self.staging, self.ledger, self.auditor, self.stream)
        else:  # rows stream from the sources to the shards, measured once
            self._judges = [stage.stream_judge(None) for stage in self._keyed]
            items = handed_over(screened_in_order(self._replay(), self.checker, self._judges), self.tokens.measured)
        return write_rows(items, self.staging, write.rows_per_shard, write.splitter, self.ledger, self.auditor)

    def _replay(self) -> Iterator[MeasuredRows[BatchStats]]:
        if not self.plan.read.sources:
            return
        progress = ProgressLine("read replay", stream=self.stream)
        for measured in replay_stream(self.plan.read.parts, self.checker.measure, in_tokens=self.checker.in_tokens):
            progress.advance(len(measured.items))
            yield measured
        progress.finish()

    def _absorb(self, items: Iterable[Conversation | Skipped | MeasuredRows[BatchStats]]) -> None:
        """Rows screened and judged into the spool; the skip records into the ledger, as they are decided."""
        assert self._kept is not None
        for batch in screened_in_order(items, self.checker, self._judges):
            for item in batch.outcomes():
                if isinstance(item, Skipped):
                    self.ledger.write(item)
                else:
                    self._kept.add(item)
