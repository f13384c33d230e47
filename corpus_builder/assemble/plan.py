"""The build as one plan of stages, and the small protocol an engine implements to run it.

**Stages.** ``Plan.of`` makes the plan of a recipe once; each stage holds the settings it needs, not the recipe:

======== ============ ====================================================================================
stage    kind         what it does (where its logic lives)
======== ============ ====================================================================================
read     per batch    the replay sources' parts, in dedup order: read, normalised and repaired by the
                      sources' readers (``sources``)
screen   per batch    measure each row (its length in the target's tokens, dedup signatures, evaluation sets)
                      and apply the checks that judge a row on its own (``screen.checks.Checker``); gives a
                      ``screen.screened.Screened`` batch
ids      keyed        by a row's own id: the k-th row of an id by priority is written as ID-k (``screen.ids``)
dedup    keyed        by every bucket of a row (its exact text, each LSH band): a row is dropped when it
                      duplicates the first row of a bucket, another row (``screen.dedup``, ``near_dedup``)
select   take         a declared corpus: every kept row's keys (source, split, reasoning, seeded priority),
                      then a take by priority per cell (``mixture``); prompt sources topped up in rounds and
                      the kept rows a generated one outranks evicted (``collect``)
split    per row      train or validation by the row's id and the seed alone (``split``)
write    per batch    parquet shards of a bounded size, the statistics of the rows written, the ledger
                      (``shards``, ``stats``)
======== ============ ====================================================================================

Before them, the eval pack (``eval_pack.PackStage``) is cut on the machine that runs the build from the rows as
the sources give them, and the screen holds its rows out; the prompt sources' rows are screened before generation
(``Plan.prompt_screen``: their ids and dedup on their prompts, in the order read).

A row's **priority** is the order the local engine meets it in: the sources in dedup order, each in the order it
is read (its parts in order), then the generated rows of each round. The keyed stages judge each member of a group
against the group's first member by priority (the ids' numbering, the duplicates' heads), which makes their answer
a function of the rows and their priorities alone, however the rows are cut.

**The protocol** (``Engine``): ``screen`` runs the read and screen stages over the replay sources, batch by batch;
``group`` runs a keyed stage over every row screened; ``take`` gives the select stage every kept row's keys and
holds the rows until ``write``, which splits them, takes those the selection takes and writes the shards;
``extend`` runs a round of generated rows through the same stages, after every row before it (the prompt sources
are generated on the machine that runs the build, by ``prompt_stage``, whichever engine checks their rows).

**The local engine** (``local.LocalEngine``) streams: the readers give batches in priority order (on forked
workers where that pays, ``sources.parallel``), so a keyed stage needs no shuffle there: it judges each batch
against the rows before it as it comes (a first-seen index: ``UniqueIds``, ``Dedup``), and a build that takes
every row writes each batch as it is judged, its memory flat. A take spools the kept rows per source in the row
form, their keys in memory, and reads the spools back once the selection is known.

**The Ray engine** (``ray_data.RayEngine``) runs the per-batch stages as Ray Data tasks over parts of the sources;
between tasks, rows travel as Arrow record batches of the corpus's row form with the build's side columns
(``Screened.to_arrow``: skip records, priority, token facts, dedup signatures). A keyed stage's entries are
hash-partitioned by its key (one shuffle each: a block holds whole groups) and its grouped form judges each block
(sorted by key, then priority: each group's first entry is its head); the tasks that write read each row's verdict.
The take streams the kept rows' keys to the driver, which plans it as the local engine does.

The engines share every stage; neither holds stage logic. A stage's batch is ``Screened``: its records as
``Conversation`` objects where the screen made them; the Ray engine's writing tasks write the rows in the Arrow form
the screen gave them (only dropped rows become records again, for the ledger), and the local engine takes the
columnar path (``columnar``: the stages' kernels over Arrow batches) for a plain .jsonl replay when asked to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar, Protocol

import pyarrow as pa

from ..errors import Skipped
from ..layout import ShardInfo
from ..recipe.model import Checks, Recipe, SourceSpec
from ..records import Conversation
from ..screen.checks import Checker
from ..screen.decontaminate import Contamination
from ..screen.dedup import Dedup, Evicted
from ..screen.ids import UniqueIds, id_entries, numbered_copies
from ..screen.pack import PackScreen
from ..screen.stream import StreamJudge, outcomes, screened_in_order
from ..sources.parallel import Part, replay_parts
from ..stats.corpus import CorpusStats
from ..stats.tokens import TokenStats
from ..tokens import TemplateRenderer, TokenFacts, TokenRows, TokenSettings
from .eval_pack import PackStage
from .mixture import Available, Selection, SelectStage
from .split import Splitter


@dataclass(frozen=True)
class TargetTokens:
    """The target's tokenizer and template, loaded once per build (None parts when the recipe names none), and
    the token statistics' figures of rows measured where they were read, by id, until they are written."""

    settings: TokenSettings | None
    rows: TokenRows | None
    measured: dict[str, TokenFacts] = field(default_factory=dict)

    @classmethod
    def for_recipe(cls, recipe: Recipe) -> TargetTokens:
        settings = TokenSettings.from_recipe(recipe)
        return cls(settings, TokenRows(settings.renderer()) if settings is not None else None)

    @property
    def renderer(self) -> TemplateRenderer | None:
        """The target's template renderer, for the checks and the prompt stage."""
        return self.rows.renderer if self.rows is not None else None

    def auditor(self) -> CorpusStats:
        """An empty accumulator of the statistics of the rows written (audit.json), with the token statistics
        when the recipe names the target's tokenizer; rows measured upstream come with their figures by id."""
        return CorpusStats(tokens=TokenStats(self.settings, self.rows.turns, self.measured)
                           if self.settings is not None and self.rows is not None else None)


@dataclass(frozen=True)
class ReadStage:
    """The replay sources, in dedup order, as parts read one after the other (secrets redacted first when the
    recipe asks)."""

    sources: tuple[SourceSpec, ...]
    base_dir: Path
    redact: bool

    def parts(self, count: int) -> list[Part]:
        """About ``count`` parts per source file worth cutting, in priority order."""
        return replay_parts(self.sources, self.base_dir, count, redact=self.redact)


@dataclass(frozen=True)
class ScreenStage:
    """The screen's settings: the checks, the dedup signatures, the evaluation sets, a served answer cut at
    max_tokens kept or not; ``checker`` makes the stage where it runs (a renderer and an eval pack index cannot
    travel)."""

    checks: Checks
    dedup: DedupStage | None
    contamination: Contamination | None
    keep_truncated: bool

    def checker(self, renderer: TemplateRenderer | None, pack: PackScreen | None = None, *,
                facts: bool = False) -> Checker:
        """The screen with the target's ``renderer`` (None: none named), the eval ``pack``'s index (None: no
        pack); ``facts``: each row measured whole, its token facts brought to the writer."""
        return Checker(self.checks, renderer, dedup=self.dedup.index() if self.dedup is not None else None,
                       contamination=self.contamination, pack=pack, facts=facts, keep_truncated=self.keep_truncated)


class KeyedStage(Protocol):
    """A stage that needs every row's keys: each member of a key group judged against its first by priority, in two
    forms of one rule. The stream form judges batches offered in priority order (the local engine); the grouped form
    gives each row's entries (``group_by`` their key columns) and judges a block of whole groups in any order (an
    engine that shuffles the entries by key)."""

    group_by: ClassVar[tuple[str, ...]]

    def stream_judge(self, evict: Callable[[Evicted], None] | None) -> StreamJudge:
        """The judge of a stream offered in priority order (``evict``: where a row that outranks the kept row it
        duplicates sends that row, when later rows may outrank earlier ones)."""
        ...

    def entries(self, rows: pa.Table, ids: Sequence[str]) -> pa.Table:
        """The entries of a batch's rows in their Arrow form (``Screened.to_arrow``; ``ids``: the ids they are
        written under, the ids stage's answer)."""
        ...

    def judge_groups(self, entries: pa.Table) -> pa.Table:
        """The answers of a block of whole groups of entries, by the rows' priorities."""
        ...


@dataclass(frozen=True)
class IdsStage:
    """The ids rows are written under (``screen.ids``): the answers are the copies' ids."""

    group_by: ClassVar[tuple[str, ...]] = ("raw_id",)

    def stream_judge(self, evict: Callable[[Evicted], None] | None) -> StreamJudge:
        return UniqueIds().judge

    def entries(self, rows: pa.Table, ids: Sequence[str]) -> pa.Table:
        return id_entries(rows)

    def judge_groups(self, entries: pa.Table) -> pa.Table:
        return numbered_copies(entries)


@dataclass(frozen=True)
class DedupStage:
    """Exact and near duplicates across sources, by source rank (``screen.dedup``): the answers are the verdicts
    of the rows that duplicate the head of one of their buckets (each row's least, when several blocks judge it)."""

    checks: Checks
    ranks: dict[str, int]
    group_by: ClassVar[tuple[str, ...]] = ("kind", "key")

    def index(self) -> Dedup:
        """An empty index of these settings (for the signatures it computes, or the judge it is)."""
        return Dedup.for_checks(self.checks, self.ranks)

    def stream_judge(self, evict: Callable[[Evicted], None] | None) -> StreamJudge:
        index = self.index()
        return lambda batch: index.judge_batch(batch, evict)

    def entries(self, rows: pa.Table, ids: Sequence[str]) -> pa.Table:
        return self.index().bucket_entries(rows, ids)

    def judge_groups(self, entries: pa.Table) -> pa.Table:
        return self.index().bucket_verdicts(entries)


@dataclass(frozen=True)
class WriteStage:
    """The split and the shards: rows per shard, the split of each row by its id."""

    rows_per_shard: int
    splitter: Splitter


@dataclass(frozen=True)
class Plan:
    """The stages of one build (see the module)."""

    read: ReadStage
    screen: ScreenStage
    ids: IdsStage
    dedup: DedupStage | None
    select: SelectStage
    write: WriteStage
    pack: PackStage | None  # the eval pack cut before anything else decides on the rows (None: none)
    generates: bool  # prompt sources: their rows are generated in rounds and join after the replayed ones

    @classmethod
    def of(cls, recipe: Recipe, contamination: Contamination | None) -> Plan:
        checks = recipe.checks
        dedup = DedupStage(checks, recipe.dedup_ranks()) if checks.dedup != "none" else None
        select = SelectStage.of(recipe)
        return cls(ReadStage(tuple(recipe.sources_in_dedup_order("replay")), recipe.base_dir, checks.redact_secrets),
                   ScreenStage(checks, dedup, contamination, recipe.target.generation.on_length == "keep"),
                   IdsStage(), dedup, select, WriteStage(recipe.output.rows_per_shard, select.splitter),
                   PackStage.of(recipe), recipe.has_prompts)

    def prompt_screen(self) -> Callable[[Iterable[Conversation | Skipped]], Iterator[Conversation | Skipped]]:
        """The checks a prompt source's rows pass before generation, in the order read: dedup on their prompts (no
        request for a duplicate), contamination; the budget and the think blocks are the generated rows'."""
        checks = replace(self.screen.checks, max_seq_len=None, on_unclosed_think="keep")
        dedup = Dedup.for_checks(checks, self.dedup.ranks, "prompt") if self.dedup is not None else None
        checker = Checker(checks, None, dedup=dedup, contamination=self.screen.contamination)
        judges: list[StreamJudge] = [UniqueIds().judge]
        if dedup is not None:
            judges.append(dedup.judge_batch)
        return lambda rows: outcomes(screened_in_order(rows, checker, judges))

    @property
    def keyed(self) -> list[KeyedStage]:
        """The keyed stages in the order they run: the ids first (dedup names a row by the id it is written
        under)."""
        return [self.ids] if self.dedup is None else [self.ids, self.dedup]

    @property
    def takes(self) -> bool:
        """Whether every row must be judged before any is written: prompt sources (generated rows may evict
        replayed ones) or a declared corpus."""
        return self.generates or self.select.declared


class Engine(Protocol):
    """What runs a plan (see the module): the local engine, or the Ray engine."""

    def screen(self) -> None:
        """Read the replay sources and screen them, batch by batch."""
        ...

    def group(self, stage: KeyedStage) -> None:
        """Judge every row screened (and every row added later) by a keyed stage."""
        ...

    def take(self, select: SelectStage) -> None:
        """Every kept row's keys to the select stage; the rows held until they are written."""
        ...

    def available(self) -> dict[str, Available]:
        """What each source has kept so far (every row offered judged): what the take plans with."""
        ...

    def extend(self, rows: Iterator[Conversation | Skipped]) -> None:
        """A round of generated rows, screened, judged and taken after every row before it."""
        ...

    def write(self, selection: Selection | None) -> list[ShardInfo]:
        """The rows kept (of them those ``selection`` takes), split and written to shards; the dropped rows into
        the ledger, in the local engine's order."""
        ...
