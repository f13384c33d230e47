"""The select stage of a build's plan: the keys of the rows that pass the checks, the prompt sources' rounds, and
the report of a declared corpus.

What the take reads of each kept row is kept in memory as integers (``MixtureKeys``): its source, split (decided by
its id), reasoning and priority; the engine holds the rows themselves (the local engine spools them per source).
Prompt sources are generated in priority order, round after round, each round asking for what the previous ones
fell short by (``mixture.next_round``), until every source has its rows or its pool is exhausted; every round goes
through the journal like any generation, so a rebuild asks for nothing new.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..draws import mixture_priority
from ..errors import CorpusError, Skipped
from ..recipe.model import Mixture
from ..records import Conversation
from ..rows import batch_to_conversations
from ..screen.dedup import Dedup, Evicted, dedup_key
from ..screen.near_dedup import Duplicate
from ..screen.screened import Verdict
from .mixture import Available, RowBounds, Selection, SelectStage, certain_shortfalls, next_round, resolve_counts
from .prompt_stage import GenerationSession
from .split import Splitter

# What the take reads of each kept row, where the rows are (``TakeRule.keys_table``).
KEYS = pa.schema([("source", pa.string()), ("split", pa.string()), ("thinking", pa.bool_()),
                  ("row_priority", pa.uint64())])


class MixtureShort(CorpusError):
    """The declared corpus cannot be met: the report says what was reached and what is missing."""

    exit_code = 1


class MixtureKeys:
    """What the mixture's take reads of the rows that passed every check, per source: each row's split (decided by
    its id), reasoning and priority; and the kept rows evicted since."""

    def __init__(self, select: SelectStage) -> None:
        self.select = select
        self.splitter = select.splitter
        self.seed = select.mixture.seed
        self.available = {spec.name: Available() for spec in select.sources}
        self.evictions = Evictions()
        self.rule = TakeRule(select.splitter, self.seed, self.evictions)

    def add_keys(self, source: str, row_id: str, thinking: bool) -> str:
        """A kept row's keys; returns its split."""
        split = self.splitter.assign_id(row_id)
        self.available[source].add(split, thinking, mixture_priority(self.seed, row_id))
        return split

    def evict(self, evicted: Evicted) -> None:
        """A kept row a later row of a higher-priority source duplicates: out of the selection, into the ledger
        when the selection is read."""
        row_priority = mixture_priority(self.seed, evicted.id)
        self.available[evicted.source].discard(self.splitter.assign_id(evicted.id), evicted.thinking, row_priority)
        self.evictions.add(evicted)

    def add_table(self, keys: pa.Table) -> None:
        """Kept rows' keys, as ``TakeRule.keys_table`` gives them where the rows are."""
        for source, split, thinking, row_priority in zip(*(keys.column(name).to_pylist() for name in KEYS.names),
                                                         strict=True):
            self.available[source].add(split, thinking, row_priority)

    def judge_generated(self, judge: Dedup | None, rows: list[tuple[int, str, str, bool]],
                        heads: dict[int, Duplicate], final_ids: dict[int, str], evict: Callable[[Evicted], None],
                        *, keep: bool) -> dict[int, Verdict | None]:
        """Generated rows, each ``(priority, own id, source, reasoning)``, in priority order, judged against the
        head each duplicates (what the local engine's index answers for it, found by a group-by) as the local
        engine's stream judges them: a row that outranks the row of its head evicts it and is kept (``evict``),
        one that does not is dropped as its duplicate. Returns the verdicts of the rows with a head (None: kept);
        ``keep``: the rows kept join the take's keys, one at a time (a row kept may be evicted by the next)."""
        verdicts: dict[int, Verdict | None] = {}
        for priority, raw_id, source, thinking in rows:
            row_id = final_ids.get(priority, raw_id)
            head = heads.get(priority)
            verdict = None
            if judge is not None and head is not None:
                [verdict] = judge.judge([dedup_key(thinking, source, row_id)], [head], evict)
                verdicts[priority] = verdict
            if verdict is None and keep:
                self.add_keys(source, row_id, thinking)
        return verdicts


@dataclass(frozen=True)
class TakeRule:
    """What the take decides of a row where the row is (a writing task's, too: it carries no key of the others):
    its keys, and whether it is written."""

    splitter: Splitter
    seed: int  # mixture.seed
    evictions: Evictions

    def keys_table(self, sources: pa.Array | pa.ChunkedArray, ids: list[str],
                   thinking: pa.Array | pa.ChunkedArray) -> pa.Table:
        """What the take reads of kept rows (``KEYS``), where they are: their source, split (by the id each is
        written under), reasoning and priority; ``add_table`` adds them."""
        return pa.table({"source": sources, "split": pa.array([self.splitter.assign_id(i) for i in ids], pa.string()),
                         "thinking": thinking,
                         "row_priority": pa.array([mixture_priority(self.seed, i) for i in ids],
                                                  pa.uint64())}, schema=KEYS)

    def taken(self, row: Conversation, selection: Selection | None) -> Conversation | Skipped | None:
        """A kept row as the take writes it: its record when it was evicted, else the row, split, when the
        ``selection`` takes it (None: every row), else None."""
        evicted = self.evictions.skipped(row)
        if evicted is not None:
            return evicted
        if row.split is None:
            row.split = self.splitter.assign(row)
        if selection is None or selection.takes(row.source, row.split, row.thinking,
                                                mixture_priority(self.seed, row.id)):
            return row
        return None

    def taken_rows(self, rows: pa.Table, selection: Selection | None) -> tuple[pa.Table, list[tuple[int, Skipped]]]:
        """``taken`` of kept rows in the row form, under the ids they are written under (a writing task's rows,
        never converted but the evicted ones): those the ``selection`` takes, split; the evicted rows' records, each
        with its place among ``rows``."""
        evicted = self.evictions.skipped_rows(rows)
        ids = rows.column("id").to_pylist()
        splits = [split if split is not None else self.splitter.assign_id(row_id)
                  for split, row_id in zip(rows.column("split").to_pylist(), ids, strict=True)]
        taken = [place not in evicted and (selection is None or selection.takes(
            source, split, thinking, mixture_priority(self.seed, row_id))) for place, (source, split, thinking, row_id)
            in enumerate(zip(rows.column("source").to_pylist(), splits, rows.column("thinking").to_pylist(), ids,
                             strict=True))]
        split_rows = rows.set_column(rows.schema.get_field_index("split"), "split", pa.array(splits, pa.string()))
        return split_rows.filter(pa.array(taken, pa.bool_())), sorted(evicted.items())


class Evictions:
    """The kept rows evicted by a duplicate of higher priority, by source and id (a handful)."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], Evicted] = {}

    def add(self, evicted: Evicted) -> None:
        self._rows[(evicted.source, evicted.id)] = evicted

    def skipped(self, row: Conversation) -> Skipped | None:
        """The ledger's record of a kept row (under the id it is written under) when it was evicted, else None."""
        evicted = self._rows.get((row.source, row.id))
        if evicted is None:
            return None
        return Verdict(evicted.of, evicted.of_source, evicted.rule).skipped(row)

    def skipped_rows(self, rows: pa.Table) -> dict[int, Skipped]:
        """``skipped`` of rows in the row form: the records of those evicted, by their place among ``rows`` (only
        they are converted)."""
        places = [place for place, key in enumerate(zip(rows.column("source").to_pylist(),
                                                        rows.column("id").to_pylist(), strict=True))
                  if key in self._rows]
        if not places:
            return {}
        found: dict[int, Skipped] = {}
        for place, row in zip(places, batch_to_conversations(rows.take(places)), strict=True):
            record = self.skipped(row)
            assert record is not None  # every one of them was evicted
            found[place] = record
        return found


def declared_mixture(mixture: Mixture, selection: Selection, allow_short: bool) -> dict[str, Any]:
    """The manifest's report of the declared corpus the selection takes; MixtureShort, before anything is
    written, when it falls short and not ``allow_short``."""
    report = selection.report(mixture)
    if selection.shortfalls and not allow_short:
        raise MixtureShort("the corpus the recipe declares cannot be met: nothing was written (--allow-short "
                           "writes it anyway, marked in the manifest and the card)",
                           details=[*selection.shortfalls, *_reached(report)])
    return report


def _reached(report: dict[str, Any]) -> list[str]:
    lines = [f"{name}: {s['reached']:,} rows reached of {s['declared'] if s['declared'] is not None else 'all'} "
             f"declared ({s['available']:,} passed the checks, {s['thinking']:,} with reasoning)"
             for name, s in report["sources"].items()]
    share = report["thinking_share"]
    return [*lines, f"thinking share reached {share['reached']:.1%}"]


def generate_in_rounds(select: SelectStage, session: GenerationSession, kept: Callable[[], dict[str, Available]],
                       absorb: Callable[[Iterator[Conversation | Skipped]], None], allow_short: bool) -> dict[str, int]:
    """Generate the prompt sources in rounds; ``absorb`` checks each round's rows and keeps some, ``kept()`` is what
    every source has kept so far (the replayed rows first), read before each round is planned. A corpus that
    declares nothing asks every prompt once and reads no count. Returns the rows asked for per prompts source,
    over every round."""
    samples = select.samples
    pools = _prompt_pools(select, session)
    counts: dict[str, int | None] = dict.fromkeys(pools)  # no count declared: every prompt, once
    if select.declared:
        counts = _declared_counts(select, session, kept(), pools, allow_short)
    asked = dict.fromkeys(pools, 0)  # prompts asked for so far, per source
    for _ in range(select.mixture.max_rounds):
        batch: dict[str, tuple[int, int]] = {}  # source -> [first, last) ranks of its pool to ask this round
        for name, pool in pools.items():
            declared = counts[name]
            left = len(pool) - asked[name]
            if declared is None:  # no target: every prompt, once
                prompts = left
            else:
                prompts = math.ceil(next_round(declared, kept()[name].count(), asked[name] * samples,
                                               left * samples) / samples)
            if prompts > 0:
                batch[name] = (asked[name], asked[name] + prompts)
                asked[name] += prompts
        if not batch:
            break
        bounds = {name: (pools[name][first], pools[name][last - 1]) for name, (first, last) in batch.items()}

        def this_round(bounds: dict[str, tuple[int, int]] = bounds) -> Iterator[Conversation]:
            # the round's prompts picked on the id and source columns: only those become conversations
            for batch in session.spool.batches():
                in_round = [index for index, (source, row_id) in enumerate(_sources_and_ids(batch))
                            if source in bounds
                            and bounds[source][0] <= mixture_priority(select.mixture.seed, row_id) <= bounds[source][1]]
                if in_round:
                    yield from batch_to_conversations(batch.take(in_round))

        absorb(session.rows(this_round, sum(last - first for first, last in batch.values())))
    return {name: count * samples for name, count in asked.items()}


def _declared_counts(select: SelectStage, session: GenerationSession, kept: dict[str, Available],
                     pools: dict[str, list[int]], allow_short: bool) -> dict[str, int | None]:
    """The rows each source must contribute to the declared corpus, known from the rows kept and the prompt pools
    before any request; a CorpusError when they certainly cannot meet it, unless ``allow_short``."""
    samples = select.samples
    at_most = ({name: RowBounds.of_rows(have.count(), have.count(thinking=True), "rows pass every check")
                for name, have in kept.items()}
               | {name: RowBounds.of_prompts(len(pool), samples) for name, pool in pools.items()})
    short = certain_shortfalls(select, at_most)
    if short and not allow_short:
        raise CorpusError("the corpus the recipe declares cannot be met, as the rows at hand show before any "
                          "request: nothing was generated or written (--allow-short builds it anyway, marked "
                          "short in the manifest and the card)", details=short)
    for line in short:
        print(f"declared corpus: {line} (--allow-short: building it short)", file=session.stream)
    return resolve_counts(select, {name: bound.rows for name, bound in at_most.items()})


def _prompt_pools(select: SelectStage, session: GenerationSession) -> dict[str, list[int]]:
    """Each prompts source's prompts as sorted priorities: the order they are generated in."""
    pools: dict[str, list[int]] = {spec.name: [] for spec in select.sources if spec.kind == "prompts"}
    for batch in session.spool.batches():
        for source, row_id in _sources_and_ids(batch):
            pools[source].append(mixture_priority(select.mixture.seed, row_id))
    for pool in pools.values():
        pool.sort()
    return pools


def _sources_and_ids(batch: pa.RecordBatch) -> Iterator[tuple[str, str]]:
    """Each spooled row's source and id, read from their columns alone."""
    return zip(batch.column("source").to_pylist(), batch.column("id").to_pylist(), strict=True)
