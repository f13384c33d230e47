"""`corpus build --engine ray`: a build on a Ray cluster, through Ray Data.

Imported only when a build asks for the Ray engine (``import corpus_builder`` and the local engine never import
Ray). The stages are the local engine's functions, run as Ray Data operators, and give the same corpus:

1. **read + screen** (``map_batches`` over the replay sources' parts, ``sources.parallel.replay_parts``: byte
   ranges of large .jsonl files, else whole files, the cut the local engine's worker processes read): each
   task reads its parts with the sources' own readers and repairs, measures them (``Checker.measure``: with
   the target's tokenizer, loaded once per worker process, each row's length against ``checks.max_seq_len``
   and its token facts, ``tokens.TokenFacts``) and applies the checks that judge a row on its own, the token
   budget among them, and the decontamination (``Checker.screen``). Every row gets its read priority,
   (part << 32) | position, the order the local engine meets it in. The parts are a dataset of their own rather
   than ``ray.data.read_json``/``read_parquet`` of the files: a row's repairs, skips, position in its file (its
   provenance and ledger location) and id must be what the local readers give, and every format they read
   (globs, .jsonl.zst, .json arrays, parquet, Hub snapshots) comes along.
2. **ids**: the checked rows' ids, hash-partitioned by id (each block every row of its ids), give the ids
   several rows carry; the k-th of them by priority gets suffix k, as ``screen.ids.UniqueIds`` gives it (a
   suffixed id that is another row's own id fails the build: the local engine would give it another suffix).
3. **dedup**: every bucket of every checked row (``NearDuplicates.bucket_entries``: the exact text's hash and
   each LSH band's), with the row's priority, sketch and name, hash-partitioned by bucket (one shuffle: each
   partition a block of whole buckets, what Ray Data's ``map_groups`` stands on); in each block, vectorised, a
   bucket's head is its entry of least priority, and a row is dropped when it is confirmed
   (``NearDuplicates.confirmed``) against a head that is another row, of the first such head: the order-free
   rule of ``screen/near_dedup.py``, the local engine's. The verdicts, sorted by priority, stay in the object
   store; each task that reads rows fetches the verdict blocks its rows' priorities span and takes each row's
   least (a row's buckets are in several partitions; the rows, ~3 kB each, are not shuffled to meet them).
4. **mixture** (a declared corpus): each kept row's keys, what ``collect.MixtureKeys`` holds of it (source,
   split, reasoning, mixture priority), stream to the driver, which plans the take with the local engine's
   ``plan_selection`` (and stops a corpus that falls short, ``collect.declared_mixture``); the rows are
   materialized in the object store meanwhile, to be read once more by the writing tasks.
5. **write**: each task sorts its block by priority, splits the rows it keeps (by their ids, as the local
   engine), of them those the mixture's selection takes, and writes them to parquet shards of its own
   (``ShardWriter``) with their statistics (``CorpusStats``; the token statistics add the facts the rows
   brought from the screen, and measure the rows truncated to the budget, as the local writer does); the driver
   names the shards, merges the statistics (the token statistics' as ``TokenFigures``), writes the ledger in
   priority order (the evicted rows last, as the local engine reads its kept rows) and the manifest and audit
   with the local engine's ``finish_corpus``.

A task that dies is retried by Ray; its first attempt's shards are in a directory no result names, and are
removed: every row is written once. The corpus directory, and the target's tokenizer, must be on storage every
node sees (one machine, or a shared filesystem).

The eval pack is cut and written on the driver, before the cluster reads anything, by the local engine's
``cut_eval_pack`` (two reads of the replay sources there); each screen task indexes it again from its written
shards (``read_pack_screen``) and holds its rows out, and its copies, as the local checks do.

**Prompt sources** are generated on the driver, by the local engine's own ``GenerationSession`` and
``generate_in_rounds``: the prompts read, screened and spooled once, the endpoints (or the server the build
launches) and their preflight, the journal (a rebuild asks for nothing new), the rounds of a declared corpus.
Generation is the driver's already (one session, one journal, requests bounded by the endpoints, not by the
cluster); what scales with the rows is what the cluster does. Each round's rows join the cluster's as a part of
their own, numbered after every replay part: the priority the local engine's order gives them (every replayed
row, then the rounds in order), so the screen, the ids, the dedup group-bys, the take and the writing tasks are
the replayed rows' own (``_CorpusRows``). The one rule the order-free group-bys do not give is the eviction: in
the local engine a generated row that outranks (by source) the row its index answers with keeps its place and
evicts that row. The group-bys find that answer for every generated row (the head it duplicates, as the local
index has it: the rows before it); the driver judges the answers in order with the local ``Dedup.judge`` and
the writing tasks apply its verdicts, so a rebuild by either engine writes the same rows, ledger, audit and
manifest.
"""

from __future__ import annotations

import pickle
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import ray
import ray.data

from ..draws import mixture_priority
from ..errors import CorpusError, Skipped
from ..layout import DATA, ShardInfo
from ..recipe.model import Checks, Recipe
from ..records import Conversation, row_location
from ..screen.checks import BatchStats
from ..screen.dedup import Dedup, Verdict, dedup_key, parse_dedup_key
from ..screen.near_dedup import Duplicate, ExactDuplicates, NearDuplicates, Signatures
from ..sources.parallel import Part, measured_rows
from ..stats.corpus import CorpusStats
from ..stats.tokens import TokenFigures, TokenStats
from ..tokens import TemplateRenderer, TokenFacts, TokenSettings, TurnTokens
from .collect import Evictions, MixtureKeys
from .eval_pack import EvalPack, PackCut, read_pack_screen
from .mixture import Available, Selection
from .plan import KeyedStage, Plan, ScreenStage, SelectStage
from .shards import LedgerWriter, ShardWriter
from .split import Splitter

# Read priority: the part in the high bits, the row's position in its part in the low ones.
PART_SHIFT = 32
# Parts per CPU of the cluster: enough for the tasks to balance, few enough that each reads a good run.
PARTS_PER_CPU = 4
# Rows per partition of a shuffle (aggregates, joins) and per task that writes shards: what bounds a task's
# memory as the input grows.
ROWS_PER_PARTITION = 50_000
ROWS_PER_WRITE = 10_000
# Input a shuffle's map task partitions at once. Ray Data's default (1 GiB) gathers the blocks until that much has
# come, so below it a map task holds every row of the input: a worker grew with the input (the bucket entries' and
# the rows' joins; 1.6 GiB at 200k rows).
SHUFFLE_INPUT_BYTES = 64 * 2**20
# A row's verdict: the row, and its head's rank and name (``_tag``).
_VERDICTS = pa.schema([("priority", pa.int64()), ("verdict", pa.binary())])
# A near verdict ranks after any exact one (a row's exact head, if another row, is its verdict).
_NEAR_RANK = 1 << 62
RAY_DIRECTORY = ".ray-"
# Where the driver writes each round's generated rows, in the staging directory, for the tasks that screen them.
GENERATED = "generated"


def connect(address: str | None) -> None:
    """Join the cluster at ``address`` (None: RAY_ADDRESS, else a cluster on this machine), unless this process
    is connected already."""
    if not ray.is_initialized():
        try:
            ray.init(address=address, log_to_driver=False)
        except ConnectionError as error:
            raise CorpusError(f"--address: cannot join the Ray cluster at {address}: {error}") from None
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the build prints its own lines
    context.enable_operator_progress_bars = False
    context.shuffle_input_batch_bytes = SHUFFLE_INPUT_BYTES


class RayEngine:
    """The plan on a Ray cluster (see the module): the screen, ids and dedup of ``_CorpusRows``, the writing tasks of
    ``_write_rows``."""

    def __init__(self, plan: Plan, recipe: Recipe, staging: Path, ledger: LedgerWriter, auditor: CorpusStats,
                 pack: EvalPack | None, address: str | None) -> None:
        connect(address)
        self.plan = plan
        self.recipe = recipe
        self.staging = staging
        self.ledger = ledger
        self.auditor = auditor
        self.settings = auditor.tokens.settings if auditor.tokens is not None else None
        self.cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))  # type: ignore[no-untyped-call]
        self.keys = MixtureKeys(recipe, plan.write.splitter)
        self.screen_parts = partial(_screen_parts, screen=plan.screen, checks=recipe.checks, settings=self.settings,
                                    pack_cut=pack.cut if pack is not None else None,
                                    pack_files=[staging / info.path for info in pack.files] if pack is not None else [])
        self._declared = False
        self._rows: _CorpusRows | None = None

    def screen(self) -> None:
        parts = self.plan.read.parts(PARTS_PER_CPU * self.cpus)
        if len(parts) + self.recipe.mixture.max_rounds >= 1 << (63 - PART_SHIFT):
            raise CorpusError(f"the replay sources make {len(parts):,} parts, more than the Ray engine numbers")
        self._rows = _CorpusRows(self.recipe, _screened(dict(enumerate(parts)), self.screen_parts), self.screen_parts,
                                 len(parts), self.staging, self.cpus, self.keys, declared=self.plan.select.declared)

    def group(self, stage: KeyedStage) -> None:
        """The ids and the dedup are ``_CorpusRows``' shuffles."""

    def take(self, select: SelectStage) -> None:
        self._declared = select.declared

    def available(self) -> dict[str, Available]:
        assert self._rows is not None
        return self._rows.available()

    def extend(self, rows: Iterator[Conversation | Skipped]) -> None:
        assert self._rows is not None
        self._rows.absorb(rows)

    def write(self, selection: Selection | None) -> list[ShardInfo]:
        assert self._rows is not None
        everything = self._rows.everything()
        written = everything.map_batches(
            partial(_write_rows, recipe=self.recipe, staging=self.staging, final_ids=self._rows.final_ids,
                    settings=self.settings, selection=selection, judged=self._rows.judged,
                    evictions=self.keys.evictions),
            batch_size=ROWS_PER_WRITE, batch_format="pyarrow").take_all() if everything is not None else []
        return _assemble(self.staging, written, self.ledger, self.auditor)


def _screened(parts: Mapping[int, Part], screen: Callable[..., Iterator[pa.Table]]) -> ray.data.Dataset | None:
    """The parts read and screened (``_screen_parts``), one task a part, materialized: every later stage reads
    them, some twice; None when there is no part."""
    if not parts:
        return None
    screened: ray.data.Dataset = ray.data.from_items(
        [{"part": index} for index in parts], override_num_blocks=len(parts)).map_batches(
        partial(screen, parts=parts), batch_size=1, batch_format="numpy").materialize()
    return screened


def _partitions(rows: ray.data.Dataset, cpus: int) -> int:
    """Partitions of a shuffle (aggregates, joins) of a bounded size, so that a task's memory does not grow with
    the input."""
    count: int = rows.count()
    return max(cpus, -(-count // ROWS_PER_PARTITION))


class _CorpusRows:
    """Every row screened on the cluster, with its id and its verdict: the replayed rows', then those of each round
    of the prompt sources' generation, as the local engine runs it (``generate_in_rounds``: the driver's session,
    journal and rounds).

    Each round's rows (and the generation's skips) are written to a file of the staging directory in the order the
    session gives them, a part numbered after every replay part and every earlier round's: the priority the local
    engine's order gives them, after every replayed row. The part is screened like a replay part. When the kept
    rows are counted (a declared corpus, before each round is planned) or written, the ids and the bucket heads are
    found over every row screened so far (the replayed rows' own do not change: every generated row ranks after
    them). A generated row's head is what the local engine's index answers for it; the driver judges those
    answers with the local ``Dedup.judge``, in the local order: a generated row of a higher-priority source than
    the row it duplicates is kept and that row evicted, or it is dropped as a duplicate of the row kept. Cost: a
    declared corpus finds the ids and the heads of the replayed rows again for every round, one that declares
    nothing once."""

    def __init__(self, recipe: Recipe, replay: ray.data.Dataset | None, screen: Callable[..., Iterator[pa.Table]],
                 first_part: int, staging: Path, cpus: int, keys: MixtureKeys, *, declared: bool) -> None:
        self.recipe = recipe
        self.keys = keys  # kept up to date only for a declared corpus, the only one whose take reads them
        # its index stays empty: the heads are found on the cluster
        self.judge = Dedup.for_checks(recipe.checks, recipe.dedup_ranks()) if recipe.checks.dedup != "none" else None
        self.judged: dict[int, Verdict | None] = {}  # generated rows whose head the judge overrules (None: kept)
        self.final_ids: dict[int, str] = {}
        self._declared = declared
        self._evict = keys.evict if declared else keys.evictions.add
        self._verdicts: ray.data.Dataset | None = None
        self._screen = screen
        self._replay = replay
        self._parts = [] if replay is None else [replay]
        self._unjudged: list[ray.data.Dataset] = []  # rounds screened, their rows not judged yet
        self._found = False  # the ids and verdicts of every part found
        self._replayed: ray.data.Dataset | None = None  # the replayed rows with their verdicts, once their keys read
        self._next_part = first_part
        self._generated_from = first_part << PART_SHIFT  # the least priority of a generated row
        self._directory = staging / GENERATED
        self._cpus = cpus

    def available(self) -> dict[str, Available]:
        """What each source has kept, every round absorbed judged: the declared mixture's keys."""
        self._judge()
        return self.keys.available

    def everything(self) -> ray.data.Dataset | None:
        """Every row screened, replayed and generated, each with its verdict; None when there is none."""
        self._judge()
        if len(self._parts) == 1 and self._replayed is not None:
            return self._replayed
        return self._joined(self._union()) if self._parts else None

    def absorb(self, items: Iterator[Conversation | Skipped]) -> None:
        """Write and screen a round's rows, to be judged when the kept rows are next counted or written."""
        part = self._next_part
        self._next_part += 1
        self._directory.mkdir(exist_ok=True)
        path = self._directory / f"{part:010d}.pickle"
        with path.open("wb") as file:
            for item in items:  # the session generates as it is read: the round's requests are sent here
                pickle.dump(item, file, protocol=pickle.HIGHEST_PROTOCOL)
        round_rows = _screened({part: partial(_read_generated, path)}, self._screen)
        assert round_rows is not None
        self._parts.append(round_rows)
        self._unjudged.append(round_rows)

    def _judge(self) -> None:
        """The ids and verdicts of every row found (again, when a round came since), the replayed rows' keys read
        (a declared corpus, the first time), then the rows of every round not judged yet, round by round."""
        if not self._parts or (self._found and not self._unjudged):
            return
        self.final_ids, self._verdicts = self._ids_and_verdicts(self._union())
        self._found = True
        if self._declared and self._replay is not None and self._replayed is None:
            self._replayed = self._joined(self._replay).materialize()  # read again by the writing tasks
            _add_kept(self._replayed, self.recipe, self.final_ids, self.keys)
        for round_rows in self._unjudged:
            self._judge_round(round_rows)
        self._unjudged = []

    def _judge_round(self, round_rows: ray.data.Dataset) -> None:
        """Judge a round's checked rows in order; a declared corpus's keys take those kept."""
        fields = ["priority", "raw_id", "source", "thinking"]  # a few of each row, on the driver as the local engine's
        checked = sorted(tuple(row[name] for name in fields) for row in round_rows.map_batches(
            lambda table: _checked(table).select(fields), batch_format="pyarrow").take_all())
        heads = self._heads({priority for priority, _, _, _ in checked})
        for priority, raw_id, source, thinking in checked:
            row_id = self.final_ids.get(priority, raw_id)
            head = heads.get(priority)
            verdict = None
            if self.judge is not None and head is not None:
                # one row at a time: a row kept joins the keys before the next may evict it
                [verdict] = self.judge.judge([dedup_key(thinking, source, row_id)], [head], self._evict)
                self.judged[priority] = verdict
            if verdict is None and self._declared:
                self.keys.add_keys(source, row_id, thinking)

    def _union(self) -> ray.data.Dataset:
        return self._parts[0].union(*self._parts[1:]) if len(self._parts) > 1 else self._parts[0]

    def _ids_and_verdicts(self, rows: ray.data.Dataset) -> tuple[dict[int, str], ray.data.Dataset | None]:
        """The ids of the checked rows whose own id an earlier one carries (``_unique_ids``), and the verdicts of
        those that duplicate the head of a bucket (``_verdicts``), materialized; None without dedup."""
        partitions = _partitions(rows, self._cpus)
        final_ids = _unique_ids(rows, partitions=partitions)
        if self.judge is None:
            return final_ids, None
        return final_ids, _verdicts(rows, self.recipe, final_ids, partitions=partitions).materialize()

    def _joined(self, rows: ray.data.Dataset) -> ray.data.Dataset:
        """The rows, each with its verdict (null: no row of higher priority it duplicates). The verdicts go to the
        rows rather than the rows to them (a join would move every row, ~3 kB, once more): sorted by priority, in
        blocks each task fetches when its rows' priorities fall in theirs."""
        if self._verdicts is None:
            return rows
        return rows.map_batches(partial(_with_verdicts, blocks=_priority_blocks(self._verdicts)),
                                batch_format="pyarrow")

    def _heads(self, asking: set[int]) -> dict[int, Duplicate]:
        """What the local engine's index answers for each of the ``asking`` rows that duplicates the head of a
        bucket, by priority; the replayed heads among them that are duplicates themselves marked dropped in the
        judge, as the local engine's index has them when a generated row meets them."""
        if self._verdicts is None or self.judge is None or not asking:
            return {}
        given = self._verdicts.map_batches(_having("priority", asking), batch_format="pyarrow").take_all()
        least = _least_verdicts(pa.Table.from_pylist(given, schema=_VERDICTS))
        found = {priority: _found(verdict) for priority, verdict in zip(
            least.column("priority").to_pylist(), least.column("verdict").to_pylist(), strict=True)}
        replayed = {head.priority: head.duplicate.of for head in found.values() if head.priority < self._generated_from}
        if replayed:
            dropped = self._verdicts.map_batches(_having("priority", set(replayed)), batch_format="pyarrow")
            self.judge.mark_dropped(replayed[row["priority"]] for row in dropped.take_all())
        return {priority: head.duplicate for priority, head in found.items()}


def _priority_blocks(verdicts: ray.data.Dataset) -> list[tuple[int, int, Any]]:
    """The verdicts sorted by priority, as blocks in the object store: (least priority, greatest, the block)."""
    if not verdicts.count():
        return []
    refs = verdicts.sort("priority").materialize().to_arrow_refs()
    bounds = ray.get([_bounds.remote(ref) for ref in refs])
    return [(first, last, ref) for (first, last), ref in zip(bounds, refs, strict=True)
            if first is not None and last is not None]


@ray.remote
def _bounds(block: pa.Table) -> tuple[int | None, int | None]:
    """A sorted block's least and greatest priority (None: an empty block)."""
    if not len(block):
        return None, None
    priorities = block.column("priority")
    return priorities[0].as_py(), priorities[-1].as_py()


def _with_verdicts(table: pa.Table, *, blocks: list[tuple[int, int, Any]]) -> pa.Table:
    """The rows with their verdict tags (``verdict``, null where none), from the verdict blocks their priorities
    span."""
    priorities = table.column("priority")
    wanted = []
    if len(table):
        low, high = pc.min(priorities).as_py(), pc.max(priorities).as_py()
        wanted = [block for first, last, block in blocks if first <= high and last >= low]
    if not wanted:
        return table.append_column("verdict", pa.nulls(len(table), pa.binary()))
    verdicts = _least_verdicts(pa.concat_tables(ray.get(wanted)))
    at = pc.index_in(priorities, value_set=verdicts.column("priority").combine_chunks())
    return table.append_column("verdict", verdicts.column("verdict").combine_chunks().take(at))


def _read_generated(path: Path) -> Iterator[Conversation | Skipped]:
    """A round's generated rows and skips, as the driver wrote them (pickled one after another)."""
    with path.open("rb") as file:
        while True:
            try:
                yield pickle.load(file)
            except EOFError:
                return


@cache
def _renderer(settings: TokenSettings) -> TemplateRenderer:
    """The target's renderer, loaded once per worker process: every task the process runs after the first
    reuses it."""
    return settings.renderer()


def _screen_parts(batch: dict[str, np.ndarray], *, parts: Mapping[int, Part], screen: ScreenStage, checks: Checks,
                  settings: TokenSettings | None, pack_cut: PackCut | None, pack_files: list[Path]
                  ) -> Iterator[pa.Table]:
    """Read, measure and screen parts: one record per row, checked (a dedup candidate) or skipped (a copy of the
    eval pack among them), with its token facts when the target's tokenizer measured it whole (a row truncated
    to the budget is another text: the writing task measures it, as the local writer does); the rows the eval
    pack holds are left out. A table per batch the local engine measures at once, so that a task's memory does
    not grow with its part."""
    checker = screen.checker(_renderer(settings) if settings is not None else None,
                             read_pack_screen(checks, pack_cut, pack_files) if pack_cut is not None else None,
                             facts=settings is not None)
    names = ("priority", "item", "checked", "raw_id", "source", "thinking", "facts")
    types = {"priority": pa.int64(), "item": pa.binary(), "checked": pa.bool_(), "raw_id": pa.string(),
             "source": pa.string(), "thinking": pa.bool_(), "facts": pa.binary()}
    columns: dict[str, list[Any]] = {name: [] for name in names}
    signed: list[int] = []  # each record's row of the batch's signatures, -1 for none

    def add(priority: int, item: Conversation | Skipped, row: int, facts: TokenFacts | None = None) -> None:
        checked = isinstance(item, Conversation)
        columns["priority"].append(priority)
        columns["item"].append(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))
        columns["facts"].append(pickle.dumps(facts, protocol=pickle.HIGHEST_PROTOCOL) if facts is not None else b"")
        columns["checked"].append(checked)
        columns["raw_id"].append(item.id if checked else None)
        columns["source"].append(item.source)
        columns["thinking"].append(isinstance(item, Conversation) and item.thinking)
        signed.append(row if checked else -1)

    for part in batch["part"].tolist():
        position = 0
        for measured in measured_rows(parts[part](), checker.measure):
            rows = [item for item in measured.items if isinstance(item, Conversation)]
            stats: BatchStats = measured.measurement
            outcomes, signatures = checker.screen(rows, stats)
            decided = iter(enumerate(outcomes))
            for item in measured.items:
                priority = (part << PART_SHIFT) | position
                position += 1
                if isinstance(item, Skipped):
                    add(priority, item, -1)
                    continue
                row, outcome = next(decided)
                facts = stats.token_facts[row] if stats.token_facts is not None and outcome is item else None
                if outcome is not None:  # None: held out by the eval pack
                    add(priority, outcome, row, facts)
            yield pa.table({**{name: pa.array(values, types[name]) for name, values in columns.items()},
                            **_signature_columns(signatures, np.asarray(signed, dtype=np.int64))})
            columns = {name: [] for name in names}
            signed = []


def _signature_columns(signatures: Signatures | None, rows: npt.NDArray[np.int64]) -> dict[str, pa.Array]:
    """Each record's hashes, which of them it has, and its sketch, as bytes (empty for a record without
    signatures: not checked, or no dedup)."""
    if signatures is None:
        return {name: pa.array([b""] * len(rows), pa.binary()) for name in ("hashes", "present", "sketch")}
    return {"hashes": _packed(signatures.hashes, rows), "present": _packed(signatures.present, rows),
            "sketch": _packed(signatures.sketches, rows)}


def _packed(values: npt.NDArray[Any], rows: npt.NDArray[np.int64]) -> pa.Array:
    """A binary column, each record the bytes of its row of ``values`` (empty where its row is -1), packed in
    numpy rather than a bytes object a record."""
    width = values.shape[1] * values.itemsize
    taken = rows >= 0
    data = np.ascontiguousarray(values[rows[taken]]).view(np.uint8).reshape(-1)
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(np.where(taken, width, 0), out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), len(rows), [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _checked(table: pa.Table) -> pa.Table:
    return table.filter(table.column("checked"))


def _having(column: str, values: set[str] | set[int]) -> Callable[[pa.Table], pa.Table]:
    """A batch filter: the rows whose ``column`` (ids, or priorities) is one of ``values``."""
    wanted = pa.array(sorted(values), pa.string() if any(isinstance(value, str) for value in values) else pa.int64())
    return lambda table: table.filter(pc.is_in(table.column(column), value_set=wanted))


def _unique_ids(screened: ray.data.Dataset, *, partitions: int) -> dict[int, str]:
    """The id of each checked row whose own id an earlier checked row carries (priority -> id with its suffix),
    as ``screen.ids.UniqueIds`` gives them; a suffixed id that is another row's own id is a CorpusError. The rows'
    ids are read once (a few bytes a row, kept for the clash check), hash-partitioned by id: each block holds
    every row of its ids (``_repeated_ids``)."""
    ids = screened.map_batches(lambda table: _checked(table).select(["priority", "raw_id"]),
                               batch_format="pyarrow").materialize()
    rows = sorted((row["priority"], row["raw_id"]) for row in ids.repartition(partitions, keys=["raw_id"]).map_batches(
        _repeated_ids, batch_size=None, batch_format="pyarrow").take_all())
    if not rows:
        return {}
    copies: dict[str, int] = {}
    final: dict[int, str] = {}
    for priority, raw_id in rows:
        copy = copies.get(raw_id, -1) + 1
        copies[raw_id] = copy
        if copy:
            final[priority] = f"{raw_id}-{copy}"
    clashes = ids.map_batches(_having("raw_id", set(final.values())), batch_format="pyarrow").take(3)
    if clashes:
        names = ", ".join(sorted(row["raw_id"] for row in clashes))
        raise CorpusError(f"the Ray engine cannot number repeated ids: {names} is both a row's own id and the "
                          "suffixed id of a copy (build with --engine local, which numbers them in order)")
    return final


def _repeated_ids(table: pa.Table) -> pa.Table:
    """The rows of a block of whole ids whose id more than one row carries."""
    if not len(table):  # an empty partition (its block may have no columns)
        return pa.table({"priority": pa.array([], pa.int64()), "raw_id": pa.array([], pa.string())})
    counts = pc.value_counts(table.column("raw_id"))
    repeated = counts.field("values").filter(pc.greater(counts.field("counts"), 1))
    return table.filter(pc.is_in(table.column("raw_id"), value_set=repeated))


def _words(column: pa.ChunkedArray | pa.Array, width: int) -> np.ndarray:
    """A column of packed rows of ``width`` 64-bit words as one (rows x width) array."""
    if not width:
        return np.zeros((len(column), 0), dtype=np.uint64)
    return np.frombuffer(b"".join(column.to_pylist()), dtype=np.uint64).reshape(-1, width)


def _tag(rank: int, key: bytes) -> bytes:
    """A verdict: a fixed-width big-endian rank first, so that a row's least verdict is the one of least rank (an
    exact head, then the head of least priority); the head's ``dedup_key`` last (what the local engine's index
    keeps of it)."""
    return rank.to_bytes(8, "big") + key


@dataclass(frozen=True, slots=True)
class _Head:
    """A verdict's head: its priority, and what the local engine's index answers for the row (``Duplicate``)."""

    priority: int
    duplicate: Duplicate


def _found(tag: bytes) -> _Head:
    """The head a verdict's tag names."""
    rank, key = int.from_bytes(tag[:8], "big"), tag[8:].decode()
    return _Head(rank & ~_NEAR_RANK, Duplicate(key, "near" if rank & _NEAR_RANK else "exact"))


def _verdict(duplicate: Duplicate) -> Verdict:
    """Why a row is dropped: the row of its index answer."""
    _, source, row_id = parse_dedup_key(duplicate.of)
    return Verdict(row_id, source, duplicate.rule)


def _index(recipe: Recipe) -> ExactDuplicates:
    """A fresh index of the recipe's dedup settings, for its layout and sketches (an index holds memory maps:
    each task makes its own rather than receive one)."""
    return Dedup.for_checks(recipe.checks, recipe.dedup_ranks()).index


def _bucket_entries(table: pa.Table, *, recipe: Recipe, final_ids: dict[int, str]) -> pa.Table:
    """One record per bucket of each checked row: the bucket (kind, key), the row's priority, the band, its sketch
    and its name (``dedup_key``, what a verdict against it names)."""
    checked = _checked(table)
    index = _index(recipe)
    present = np.frombuffer(b"".join(checked.column("present").to_pylist()), dtype=bool).reshape(-1, index.columns)
    signatures = Signatures(_words(checked.column("hashes"), index.columns), present,
                            _words(checked.column("sketch"), index.sketch_words))
    if isinstance(index, NearDuplicates):
        rows, kinds, keys, bands = index.bucket_entries(signatures)
    else:  # the exact rule alone: one bucket per row, its text's hash
        rows = np.arange(len(checked), dtype=np.int64)
        kinds, keys, bands = np.zeros(len(rows), np.uint8), signatures.hashes[:, 0], np.full(len(rows), -1)
    priorities = checked.column("priority").to_pylist()
    names = [dedup_key(thinking, source, final_ids.get(priority, raw_id)).encode()
             for priority, source, raw_id, thinking in zip(
                 priorities, checked.column("source").to_pylist(), checked.column("raw_id").to_pylist(),
                 checked.column("thinking").to_pylist(), strict=True)]
    return pa.table({"kind": kinds, "key": keys, "priority": np.asarray(priorities, dtype=np.int64)[rows],
                     "band": bands, "sketch": checked.column("sketch").take(rows),
                     "name": pa.array(names, pa.binary()).take(rows)})


def _verdicts(screened: ray.data.Dataset, recipe: Recipe, final_ids: dict[int, str], *, partitions: int
              ) -> ray.data.Dataset:
    """(priority, verdict) of the checked rows that duplicate the head of a bucket (another row): the bucket
    entries hash-partitioned by bucket, whole buckets to a block (``_bucket_verdicts``). A row has a verdict from
    each block holding a bucket it duplicates in: its own is the least (``_least_verdicts``)."""
    entries = screened.map_batches(partial(_bucket_entries, recipe=recipe, final_ids=final_ids),
                                   batch_format="pyarrow")
    return entries.repartition(partitions, keys=["kind", "key"]).map_batches(
        partial(_bucket_verdicts, recipe=recipe), batch_size=None, batch_format="pyarrow")


def _bucket_verdicts(table: pa.Table, *, recipe: Recipe) -> pa.Table:
    """The verdicts a block of whole buckets gives: a bucket's head is its entry of least priority, every other
    entry a candidate against it, which holds when the bucket is the exact rule's or the sketches confirm it; each
    row's least verdict of the block (an exact one ranks first, then the head of least priority)."""
    if not len(table):  # an empty partition (its block may have no columns)
        return _VERDICTS.empty_table()
    kinds, keys = np.asarray(table.column("kind")), np.asarray(table.column("key"))
    priorities = np.asarray(table.column("priority"))
    order = np.lexsort((priorities, keys, kinds))  # each bucket's head first
    kinds, keys, priorities = kinds[order], keys[order], priorities[order]
    # each entry's bucket's head: the last bucket start at or before it
    heads = np.maximum.accumulate(np.where(_run_starts(kinds, keys), np.arange(len(order)), 0))
    candidate = priorities != priorities[heads]
    exact = kinds == 0
    holds = candidate & exact
    near = np.flatnonzero(candidate & ~exact)
    index = _index(recipe)
    if len(near) and isinstance(index, NearDuplicates):
        sketches = _words(table.column("sketch"), index.sketch_words)[order]
        holds[near] = index.confirmed(sketches[near], sketches[heads[near]],
                                      np.asarray(table.column("band"))[order][near])
    rows = np.flatnonzero(holds)
    ranks = priorities[heads[rows]] | np.where(exact[rows], 0, _NEAR_RANK)
    names = table.column("name").take(pa.array(order[heads[rows]])).to_pylist()
    return _least_verdicts(pa.table({
        "priority": priorities[rows],
        "verdict": [_tag(rank, name) for rank, name in zip(ranks.tolist(), names, strict=True)]}, schema=_VERDICTS))


def _least_verdicts(verdicts: pa.Table) -> pa.Table:
    """Each row's least verdict of those given (by priority, sorted)."""
    ordered = verdicts.sort_by([("priority", "ascending"), ("verdict", "ascending")])
    return ordered.filter(pa.array(_run_starts(np.asarray(ordered.column("priority")))))


def _run_starts(*columns: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    """Of sorted ``columns``, whether each record starts a run of equal values (its group's first)."""
    starts = np.zeros(len(columns[0]), dtype=bool)
    starts[:1] = True
    for column in columns:
        starts[1:] |= column[1:] != column[:-1]
    return starts


def _verdict_tags(table: pa.Table) -> pa.ChunkedArray | pa.Array:
    """Each row's verdict tag, null when it duplicates no row of higher priority (a block without the column: dedup
    is off, or no row it joined has one)."""
    if "verdict" in table.column_names:
        return table.column("verdict")
    return pa.nulls(len(table), pa.binary())


def _kept(table: pa.Table) -> pa.Table:
    """The rows that passed every check and dedup."""
    checked = _checked(table)
    return checked.filter(pc.is_null(_verdict_tags(checked)))


def _candidates(table: pa.Table, *, recipe: Recipe, final_ids: dict[int, str]) -> pa.Table:
    """What the mixture's take reads of each kept row (``KeptRows.add``'s keys): its source, split (by the id it
    is written under), reasoning and mixture priority."""
    kept = _kept(table)
    splitter = Splitter(recipe.split.validation_fraction, recipe.split.seed)
    ids = [final_ids.get(priority, raw_id) for priority, raw_id in zip(
        kept.column("priority").to_pylist(), kept.column("raw_id").to_pylist(), strict=True)]
    return pa.table({"source": kept.column("source"), "split": pa.array([splitter.assign_id(i) for i in ids]),
                     "thinking": kept.column("thinking"),
                     "row_priority": pa.array([mixture_priority(recipe.mixture.seed, i) for i in ids], pa.uint64())})


def _add_kept(rows: ray.data.Dataset, recipe: Recipe, final_ids: dict[int, str], keys: MixtureKeys) -> None:
    """Every kept row's keys into ``keys``, what the declared mixture's take (the local engine's
    ``plan_selection``) reads, streamed to the driver (a few integers a row, what the local engine holds too)."""
    candidates = rows.map_batches(partial(_candidates, recipe=recipe, final_ids=final_ids),
                                  batch_format="pyarrow")
    for batch in candidates.iter_batches(batch_format="pyarrow"):
        assert isinstance(batch, pa.Table)  # what batch_format="pyarrow" gives
        for source, split, thinking, row_priority in zip(*(batch.column(name).to_pylist() for name in (
                "source", "split", "thinking", "row_priority")), strict=True):
            keys.available[source].add(split, thinking, row_priority)


def _write_rows(table: pa.Table, *, recipe: Recipe, staging: Path, final_ids: dict[int, str],
                settings: TokenSettings | None, selection: Selection | None, judged: dict[int, Verdict | None],
                evictions: Evictions) -> pa.Table:
    """Split and write a block's kept rows (those the declared mixture's ``selection`` takes, when there is one)
    into shards of its own; the dropped rows for the ledger, each with its place in it: by priority, then the
    evicted rows, by source in recipe order and priority, as the local engine reads its kept rows (a row the
    mixture does not take is not dropped, as the local engine's); the rows' statistics, the token statistics'
    figures apart (a TokenStats holds the tokenizer). ``judged``: the generated rows whose head the driver's judge
    overruled (None: kept). The directory is this attempt's alone: a retried task's first attempt leaves nothing
    it names."""
    table = table.sort_by("priority")
    directory = f"{DATA}/{RAY_DIRECTORY}{uuid.uuid4().hex}"
    splitter = Splitter(recipe.split.validation_fraction, recipe.split.seed)
    measured: dict[str, TokenFacts] = {}  # the screen's facts by the id a row is written under, until it is
    tokens = TokenStats(settings, TurnTokens(_renderer(settings)), measured) if settings is not None else None
    stats = CorpusStats(tokens=tokens)
    shards = ShardWriter(staging, recipe.output.rows_per_shard, observe=stats.add_rows, directory=directory)
    dropped: list[tuple[tuple[int, ...], Skipped]] = []
    source_order = {spec.name: index for index, spec in enumerate(recipe.sources)}
    verdicts = _verdict_tags(table).to_pylist()
    priorities = table.column("priority").to_pylist()
    facts = table.column("facts").to_pylist()
    try:
        for position, item_bytes in enumerate(table.column("item").to_pylist()):
            priority = priorities[position]
            item = pickle.loads(item_bytes)
            tag = verdicts[position]
            verdict = judged[priority] if priority in judged else _verdict(_found(tag).duplicate) if tag else None
            if isinstance(item, Skipped):
                dropped.append(((0, priority), item))
            elif verdict is not None:
                dropped.append(((0, priority), Skipped(item.source, verdict.reason, row_location(item), verdict.detail,
                                                  id=item.id)))
            else:
                item.id = final_ids.get(priority, item.id)
                evicted = evictions.skipped(item)
                if evicted is not None:
                    dropped.append(((1, source_order[item.source], priority), evicted))
                    continue
                item.split = splitter.assign(item)
                if selection is not None and not selection.takes(
                        item.source, item.split, item.thinking, mixture_priority(recipe.mixture.seed, item.id)):
                    continue
                if facts[position]:
                    measured[item.id] = pickle.loads(facts[position])
                shards.write(item)
    except BaseException:
        shards.abort()
        raise
    infos = shards.close()
    stats.tokens = None
    return pa.table({"first": [priorities[0] if priorities else -1], "directory": [directory],
                     "shards": [pickle.dumps(infos)], "stats": [pickle.dumps(stats)],
                     "tokens": [pickle.dumps(tokens.figures if tokens is not None else None)],
                     "dropped": [pickle.dumps(dropped)]})


def _assemble(staging: Path, written: list[dict[str, Any]], ledger: LedgerWriter, stats: CorpusStats
              ) -> list[ShardInfo]:
    """The tasks' shards under their final names, their statistics merged into ``stats``, the ledger in the local
    engine's order; the directories of attempts no result names (a retried task's) removed."""
    data = staging / DATA
    data.mkdir(parents=True, exist_ok=True)
    by_split: dict[str, list[ShardInfo]] = {}
    dropped: list[tuple[tuple[int, ...], Skipped]] = []
    for result in sorted(written, key=lambda result: result["first"]):  # shards numbered in read order
        stats.merge(pickle.loads(result["stats"]))
        figures: TokenFigures | None = pickle.loads(result["tokens"])
        if stats.tokens is not None and figures is not None:
            stats.tokens.figures.merge(figures)
        dropped.extend(pickle.loads(result["dropped"]))
        for info in pickle.loads(result["shards"]):
            by_split.setdefault(info.split, []).append(info)
    infos: list[ShardInfo] = []
    for split in sorted(by_split):
        shards = by_split[split]
        for index, info in enumerate(shards):
            name = f"{split}-{index:05d}-of-{len(shards):05d}.parquet"
            (staging / info.path).rename(data / name)
            infos.append(ShardInfo(f"{DATA}/{name}", split, info.rows, info.bytes, info.sha256))
    for directory in data.glob(f"{RAY_DIRECTORY}*"):
        shutil.rmtree(directory, ignore_errors=True)
    try:
        for _, skipped in sorted(dropped, key=lambda pair: pair[0]):
            ledger.write(skipped)
    finally:
        ledger.close()
    return infos
