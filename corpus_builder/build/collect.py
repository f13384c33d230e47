"""Collecting a declared corpus: every source's rows that pass the checks, spooled, then the rows the mixture
takes, in recipe order.

Rows that pass the checks are spooled per source in the staging directory (the Arrow row form), with their
split (decided by their id) and what selection needs kept in memory as integers: priority, split and
thinking, per row. Prompt sources are generated in priority order, round after round, each round asking for
what the previous ones fell short by (``mixture.next_round``), until every source has its rows or its pool
is exhausted; every round goes through the journal like any generation, so a rebuild asks for nothing new.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa

from ..errors import CorpusError, Skipped
from ..recipe.model import Recipe
from ..records import Conversation
from ..rows import batch_to_conversations, conversations_to_batch, spool_writer
from ..sources import MeasuredRows
from .checks import BatchStats, Checker, row_location
from .dedup import Evicted, Verdict
from .mixture import Available, Selection, next_round, plan_selection, priority, resolve_counts
from .prompt_stage import GenerationSession
from .shards import LedgerWriter
from .split import Splitter

SPOOL_BATCH = 2048


class MixtureShort(CorpusError):
    """The declared corpus cannot be met: the report says what was reached and what is missing."""

    exit_code = 1


class KeptRows:
    """The rows that passed every check, spooled per source, with their selection keys in memory."""

    def __init__(self, recipe: Recipe, staging: Path, splitter: Splitter) -> None:
        self.recipe = recipe
        self.directory = staging / "kept"
        self.directory.mkdir()
        self.splitter = splitter
        self.available = {spec.name: Available() for spec in recipe.sources}
        self._writers: dict[str, tuple[pa.OSFile, pa.RecordBatchStreamWriter]] = {}
        self._pending: dict[str, list[Conversation]] = {}
        self._evicted: dict[str, dict[int, Evicted]] = {}  # source -> row priority -> why it is dropped

    def add(self, conversation: Conversation) -> None:
        conversation.split = self.splitter.assign(conversation)
        row_priority = priority(self.recipe.mixture.seed, conversation.id)
        self.available[conversation.source].add(conversation.split, conversation.thinking, row_priority)
        pending = self._pending.setdefault(conversation.source, [])
        pending.append(conversation)
        if len(pending) >= SPOOL_BATCH:
            self._write(conversation.source)

    def evict(self, evicted: Evicted) -> None:
        """A kept row a later row of a higher-priority source duplicates: out of the selection, into the ledger
        when the selection is read."""
        row_priority = priority(self.recipe.mixture.seed, evicted.id)
        self.available[evicted.source].discard(self.splitter.assign_id(evicted.id), evicted.thinking, row_priority)
        self._evicted.setdefault(evicted.source, {})[row_priority] = evicted

    def kept(self, source: str) -> int:
        return self.available[source].count()

    def _write(self, source: str) -> None:
        pending = self._pending.get(source)
        if not pending:
            return
        if source not in self._writers:
            sink = pa.OSFile(str(self.directory / f"{len(self._writers):04d}.arrow"), "wb")
            self._writers[source] = (sink, spool_writer(sink))
        self._writers[source][1].write_batch(conversations_to_batch(pending))
        pending.clear()

    def close(self) -> None:
        for source in list(self._pending):
            self._write(source)
        for sink, writer in self._writers.values():
            writer.close()
            sink.close()

    def selected(self, selection: Selection) -> Iterator[Conversation | Skipped]:
        """The rows the selection takes: source by source in recipe order, each in the order it was kept; and
        the evicted rows, as the ledger's records."""
        files = {source: index for index, source in enumerate(self._writers)}
        for spec in self.recipe.sources:
            if spec.name not in files:
                continue
            evicted = self._evicted.get(spec.name, {})
            path = self.directory / f"{files[spec.name]:04d}.arrow"
            with pa.OSFile(str(path), "rb") as source, pa.ipc.open_stream(source) as reader:
                for batch in reader:
                    for row in batch_to_conversations(batch):
                        assert row.split is not None
                        row_priority = priority(self.recipe.mixture.seed, row.id)
                        dropped = evicted.get(row_priority)
                        if dropped is not None:
                            verdict = Verdict(dropped.of, dropped.of_source, dropped.rule)
                            yield Skipped(row.source, verdict.reason, row_location(row), verdict.detail, id=row.id)
                        elif selection.takes(row.source, row.split, row.thinking, row_priority):
                            yield row


def collect(recipe: Recipe, checker: Checker, kept: KeptRows, ledger: LedgerWriter,
            replay: Iterable[Conversation | Skipped | MeasuredRows[BatchStats]],
            session: GenerationSession | None) -> Selection:
    """Check every replay row and generate prompt sources in rounds until the declared corpus is met (or
    cannot be); returns the selection of rows to write. Dropped rows go to the ledger as they are decided."""
    _absorb(checker.run(replay), kept, ledger)
    generated: dict[str, int] = {}
    if session is not None:
        generated = _generate_in_rounds(recipe, checker, kept, ledger, session)
    kept.close()
    return plan_selection(recipe, kept.available, generated)


def _absorb(items: Iterator[Conversation | Skipped], kept: KeptRows, ledger: LedgerWriter) -> None:
    for item in items:
        if isinstance(item, Skipped):
            ledger.write(item)
        else:
            kept.add(item)


def _generate_in_rounds(recipe: Recipe, checker: Checker, kept: KeptRows, ledger: LedgerWriter,
                        session: GenerationSession) -> dict[str, int]:
    """Rows asked for per prompts source, over every round."""
    samples = recipe.target.generation.n
    pools = _prompt_pools(recipe, session)
    sizes = {name: kept.kept(name) for name in kept.available} | {name: len(pool) * samples
                                                                  for name, pool in pools.items()}
    counts = resolve_counts(recipe, sizes)
    asked = dict.fromkeys(pools, 0)  # prompts asked for so far, per source
    for _ in range(recipe.mixture.max_rounds):
        batch: dict[str, tuple[int, int]] = {}  # source -> [first, last) ranks of its pool to ask this round
        for name, pool in pools.items():
            declared = counts[name]
            left = len(pool) - asked[name]
            if declared is None:  # no target: every prompt, once
                prompts = left
            else:
                prompts = math.ceil(next_round(declared, kept.kept(name), asked[name] * samples, left * samples)
                                    / samples)
            if prompts > 0:
                batch[name] = (asked[name], asked[name] + prompts)
                asked[name] += prompts
        if not batch:
            break
        bounds = {name: (pools[name][first], pools[name][last - 1]) for name, (first, last) in batch.items()}

        def this_round(bounds: dict[str, tuple[int, int]] = bounds) -> Iterator[Conversation]:
            for prompt in session.spool:
                low_high = bounds.get(prompt.source)
                if low_high is not None and low_high[0] <= priority(recipe.mixture.seed, prompt.id) <= low_high[1]:
                    yield prompt

        rows = session.rows(this_round, sum(last - first for first, last in batch.values()))
        _absorb(checker.run(rows), kept, ledger)
    return {name: count * samples for name, count in asked.items()}


def _prompt_pools(recipe: Recipe, session: GenerationSession) -> dict[str, list[int]]:
    """Each prompts source's prompts as sorted priorities: the order they are generated in."""
    pools: dict[str, list[int]] = {spec.name: [] for spec in recipe.sources if spec.kind == "prompts"}
    for prompt in session.spool:
        pools[prompt.source].append(priority(recipe.mixture.seed, prompt.id))
    for pool in pools.values():
        pool.sort()
    return pools
