"""`corpus build --engine ray`: the build's plan (``plan``) on a Ray cluster, through Ray Data.

Imported only when a build asks for the Ray engine (``import corpus_builder`` and the local engine never import
Ray). The engine runs the plan's stages; it holds none of their logic. Between tasks, rows travel as Arrow record
batches of the corpus's row form with the build's side columns (``Screened.to_arrow``: the records, skip records
among them, their priority, token facts and dedup signatures), never as Python objects.

1. **read + screen** (per batch): ``map_batches`` over the replay sources' parts (``ReadStage.parts``: byte ranges
   of large .jsonl files, else whole files, the cut the local engine's worker processes read); each task reads its
   parts with the sources' own readers and repairs and runs the screen (``ScreenStage.checker``: the target's
   tokenizer loaded once per worker process, the eval pack indexed again from its written shards). Every record
   gets its read priority, (part << 32) | position, the order the local engine meets it in. The parts are a
   dataset of their own rather than ``ray.data.read_json``/``read_parquet`` of the files: a row's repairs, skips,
   position in its file and id must be what the local readers give, for every format they read. A plan the
   columnar path covers (``columnar.uncovered``, the local engine's rule) is read as that path reads it: each
   file part in blocks (``columnar.PartReader``), its rows never ``Conversation``s but those the kernels leave to
   the row path, each block in the same Arrow form (``_block_records``); the build prints the local engine's count
   of the rows the kernels took.
2. **keyed stages**: each stage's entries (``entries_of``: the ids' ``(priority, raw_id)``, the dedup's bucket
   entries) are hash-partitioned by the stage's key, one shuffle each in plain tasks (``_entry_pieces``: a task a
   CPU cuts a run of blocks' entries, a task judges a partition), so a partition holds whole groups, which the
   stage's grouped form judges (``numbered_copies``, ``Dedup.bucket_verdicts``). The copies' ids come to the driver
   (a suffixed id that is another row's own id fails the build: the local engine would give it another suffix);
   the duplicates' verdicts, each row's least kept, stay in the object store sorted by priority, and each task that
   reads rows fetches the blocks its rows' priorities span (the rows are not shuffled to meet them).
3. **take** (a declared corpus): each kept row's keys (``MixtureKeys``) stream to the driver, which plans the take
   as the local engine does (``mixture.plan_selection``); the rows are materialized in the object store meanwhile.
4. **write**: each task sorts its block by priority and runs the write stage on it (the duplicates' records,
   ``Verdict.skipped``; the take's ``TakeRule.taken_rows``, the split) into shards of its own
   (``ShardWriter.write_table``), with their statistics. The rows stay in the Arrow form the screen gave them: only
   the dropped ones become ``Conversation``s for their records (and the rows written, for the token statistics,
   when the recipe names the target's tokenizer); a round trip through ``Conversation`` cost more than the screen's
   own conversion (``bench_ray.py``, 1M rows: 71 s of write tasks, half of it converting). The dropped rows'
   records, each with its place in the ledger, go to a file in the task's directory, sorted by place. It sends the
   driver typed results (``_WRITTEN``: the shards, the statistics as JSON, that file); the driver names the shards,
   merges the statistics and writes the ledger in the local engine's order (the evicted rows last, as the local
   engine reads its kept rows), a k-way merge of the tasks' files: its memory does not grow with the dropped rows.

A task that dies is retried by Ray; its first attempt's shards are in a directory no result names, and are
removed: every row is written once. The corpus directory, and the target's tokenizer, must be on storage every
node sees (one machine, or a shared filesystem).

**Prompt sources** are generated on the driver (``prompt_stage``, ``collect.generate_in_rounds``: the endpoints or
the server it launches, the journal, the rounds of a declared corpus); each round's rows and skips are written to
the staging directory in the record form and screened as a part numbered after every earlier one: the priority the
local engine's order gives them. When the kept rows are counted or written, the keyed stages run again over every
row screened so far (the replayed rows' answers do not change: every generated row ranks after them). The one rule
the group-bys do not give is the eviction: the driver judges each generated row's answer (the head it duplicates,
as the local index has it) in order with the take's ``MixtureKeys.judge_generated``, and the writing tasks apply its
verdicts.
"""

from __future__ import annotations

import heapq
import shutil
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from functools import cache, partial
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import ray
import ray.data
from ray import ObjectRef
from ray.data._internal.arrow_ops.transform_pyarrow import hash_partition  # ray is pinned (pyproject)

from ..errors import CorpusError, Skipped
from ..layout import DATA, ShardInfo
from ..ray_cluster import PARTS_PER_CPU, connect
from ..records import Conversation
from ..rows import (
    ARROW_SCHEMA,
    RECORD_SCHEMA,
    SKIP_FIELDS,
    batch_to_conversations,
    batch_to_records,
    records_to_batch,
    spool_writer,
)
from ..screen.checks import Checker
from ..screen.dedup import BUCKET_VERDICTS, heads_of, least_verdicts
from ..screen.near_dedup import Duplicate
from ..screen.screened import Verdict
from ..sources.parallel import Part, Turns, measured_rows
from ..stats.corpus import CorpusStats
from ..stats.tokens import TokenFigures, TokenStats
from ..tokens import TemplateRenderer, TokenSettings, TurnTokens
from ..tokens.measure import facts_from_arrow
from .collect import MixtureKeys, TakeRule
from .columnar import Block, FilePart, PartReader, file_parts, print_paths, uncovered
from .eval_pack import EvalPack, PackCut, read_pack_screen
from .mixture import Available, Selection, SelectStage
from .plan import KeyedStage, Plan, ScreenStage
from .shards import LedgerWriter, ShardWriter

# Read priority: the part in the high bits, the row's position in its part in the low ones.
PART_SHIFT = 32
# Rows per partition of a shuffle and per task that writes shards: what bounds a task's memory as the input grows.
ROWS_PER_PARTITION = 50_000
ROWS_PER_WRITE = 10_000
RAY_DIRECTORY = ".ray-"
# The columns of a screened batch that only the writing tasks read.
TEXT_COLUMNS = ("messages", "tools", "provenance", "facts")
# A side column of the columnar path's screened batches: on a block's first record, how many of the block's rows
# the kernels took (0 on the others), what the build's count of them adds up.
KERNEL_ROWS = "kernel_rows"
# Where the driver writes each round's generated rows, in the staging directory, for the tasks that screen them.
GENERATED = "generated"
# What a task that writes rows sends the driver: its first row's priority (the shards are numbered in read order),
# its directory, its shards, the statistics of its rows (JSON: ``CorpusStats.to_json``, the token statistics'
# ``TokenFigures.to_json`` apart), the file of the records of the rows it dropped (``DROPPED``, in its directory;
# null: none), how many records it read and how many of their rows the kernels took.
_SHARD = pa.struct([("path", pa.string()), ("split", pa.string()), ("rows", pa.int64()), ("bytes", pa.int64()),
                    ("sha256", pa.string())])
_WRITTEN = pa.schema([("first", pa.int64()), ("directory", pa.string()), ("shards", pa.list_(_SHARD)),
                      ("stats", pa.string()), ("tokens", pa.string()), ("dropped", pa.string()),
                      ("records", pa.int64()), (KERNEL_ROWS, pa.int64())])
# A writing task's dropped rows' records, a JSON line each ``[place, source, reason, location, detail, id]``, sorted by
# place (``[0, priority]``, an evicted row's ``[1, source order, priority]``); the driver merges the tasks' files, at
# most MERGED_AT_ONCE open at once (more are merged in rounds).
DROPPED = "dropped.jsonl"
MERGED_AT_ONCE = 64


class RayEngine:
    """The plan on a Ray cluster (see the module): every screened part a materialized dataset of record batches; the
    keyed stages' answers found over every part (again when a round of generated rows came since)."""

    def __init__(self, plan: Plan, staging: Path, ledger: LedgerWriter, auditor: CorpusStats, pack: EvalPack | None,
                 address: str | None, stream: TextIO) -> None:
        connect(address)
        self.plan = plan
        self.staging = staging
        self.ledger = ledger
        self.auditor = auditor
        self.stream = stream
        self.settings = auditor.tokens.settings if auditor.tokens is not None else None
        # the replay sources read by the columnar path's blocks where it covers the plan, as the local engine reads
        # them (its rule: ``columnar.uncovered``)
        self.columnar = uncovered(plan, self.settings is not None, pack is not None) is None
        self.cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))  # type: ignore[no-untyped-call]
        self.screen_parts = partial(_screen_parts, screen=plan.screen, settings=self.settings,
                                    pack_cut=pack.cut if pack is not None else None,
                                    pack_files=[staging / info.path for info in pack.files] if pack is not None else [])
        self.keys = MixtureKeys(plan.select)  # read only by a take
        self._keyed: list[KeyedStage] = []
        self._taking = False
        self._parts: list[ray.data.Dataset] = []  # every part screened: the replayed rows', then each round's
        self._replay: ray.data.Dataset | None = None
        self._replayed: ray.data.Dataset | None = None  # the replayed rows with their verdicts, once their keys read
        self._unjudged: list[ray.data.Dataset] = []  # rounds screened, their rows not judged yet
        self._found = False  # the keyed stages' answers of every part found
        self._next_part = 0
        self._generated_from = 0  # the least priority of a generated row
        self.final_ids: dict[int, str] = {}  # the copies' ids, by priority
        self._verdicts: ray.data.Dataset | None = None
        self._judge = plan.dedup.index() if plan.dedup is not None else None  # its index stays empty
        self.judged: dict[int, Verdict | None] = {}  # generated rows whose head the driver's judge overruled

    def screen(self) -> None:
        cut = PARTS_PER_CPU * self.cpus
        parts: Sequence[Part | FilePart] = file_parts(self.plan, cut) if self.columnar else self.plan.read.parts(cut)
        if len(parts) + self.plan.select.mixture.max_rounds >= 1 << (63 - PART_SHIFT):
            raise CorpusError(f"the replay sources make {len(parts):,} parts, more than the Ray engine numbers")
        self._next_part = len(parts)
        self._generated_from = len(parts) << PART_SHIFT
        self._replay = _screened(dict(enumerate(parts)), self.screen_parts)
        self._parts = [] if self._replay is None else [self._replay]

    def group(self, stage: KeyedStage) -> None:
        self._keyed.append(stage)

    def take(self, select: SelectStage) -> None:
        self._taking = select.declared  # a take of every row (prompt sources alone) reads no key

    def available(self) -> dict[str, Available]:
        self._judge_all()
        return self.keys.available

    def extend(self, rows: Iterator[Conversation | Skipped]) -> None:
        part = self._next_part
        self._next_part += 1
        directory = self.staging / GENERATED
        directory.mkdir(exist_ok=True)
        path = directory / f"{part:010d}.arrow"
        with pa.OSFile(str(path), "wb") as sink, spool_writer(sink, RECORD_SCHEMA) as writer:
            batch: list[Conversation | Skipped] = []
            for item in rows:  # the session generates as it is read: the round's requests are sent here
                batch.append(item)
                if len(batch) >= ROWS_PER_WRITE:
                    writer.write_batch(records_to_batch(batch))
                    batch = []
            writer.write_batch(records_to_batch(batch))
        round_rows = _screened({part: partial(_read_generated, path)}, self.screen_parts)
        assert round_rows is not None
        self._parts.append(round_rows)
        self._unjudged.append(round_rows)

    def write(self, selection: Selection | None) -> list[ShardInfo]:
        self._judge_all()
        everything = self._everything()
        write = self.plan.write
        order = {spec.name: index for index, spec in enumerate(self.plan.select.sources)}
        written = everything.map_batches(
            partial(_write_rows, staging=self.staging, rows_per_shard=write.rows_per_shard, rule=self.keys.rule,
                    selection=selection, final_ids=self.final_ids, judged=self.judged, settings=self.settings,
                    source_order=order), batch_size=ROWS_PER_WRITE, batch_format="pyarrow").take_all() \
            if everything is not None else []
        if self.columnar:  # the local engine's line
            kernels, records = (sum(result[name] for result in written) for name in (KERNEL_ROWS, "records"))
            print_paths(kernels, records, self.stream)
        return _assemble(self.staging, written, self.ledger, self.auditor)

    def _everything(self) -> ray.data.Dataset | None:
        """Every row screened, replayed and generated, each with its verdict; None when there is none."""
        if len(self._parts) == 1 and self._replayed is not None:
            return self._replayed
        return self._joined(self._union()) if self._parts else None

    def _union(self) -> ray.data.Dataset:
        return self._parts[0].union(*self._parts[1:]) if len(self._parts) > 1 else self._parts[0]

    def _judge_all(self) -> None:
        """The keyed stages' answers over every row (again, when a round came since), the replayed rows' keys read
        (a declared take, the first time), then the rows of every round not judged yet, round by round."""
        if not self._parts or (self._found and not self._unjudged):
            return
        rows = self._union()
        partitions = max(self.cpus, -(-rows.count() // ROWS_PER_PARTITION))
        self.final_ids = {}
        self._verdicts = None
        for stage in self._keyed:  # the ids first: the entries of the next name a row by the id it is written under
            pieces = _entry_pieces(rows, stage, self.final_ids, partitions, self.cpus)
            answers = [_judged.remote(stage, *partition) for partition in pieces]
            if stage is self.plan.ids:
                self.final_ids = _copies(answers, pieces)
            else:
                self._verdicts = ray.data.from_arrow_refs(answers)
        self._found = True
        if self._taking and self._replay is not None and self._replayed is None:
            self._replayed = self._joined(self._replay).materialize()  # read again by the writing tasks
            self._add_kept(self._replayed)
        for round_rows in self._unjudged:
            self._judge_round(round_rows)
        self._unjudged = []

    def _joined(self, rows: ray.data.Dataset) -> ray.data.Dataset:
        """The rows, each with its verdict (null: none). The verdicts go to the rows rather than the rows to them (a
        join would move every row, ~3 kB, once more): sorted by priority, in blocks each task fetches when its rows'
        priorities fall in theirs."""
        if self._verdicts is None:
            return rows
        return rows.map_batches(partial(_with_verdicts, blocks=_priority_blocks(self._verdicts)),
                                batch_format="pyarrow")

    def _add_kept(self, rows: ray.data.Dataset) -> None:
        """Every kept row's keys, what the take plans with, streamed to the driver (a few integers a row)."""
        keys = rows.map_batches(partial(_kept_keys, rule=self.keys.rule, final_ids=self.final_ids),
                                batch_format="pyarrow")
        for batch in keys.iter_batches(batch_format="pyarrow"):
            assert isinstance(batch, pa.Table)  # what batch_format="pyarrow" gives
            self.keys.add_table(batch)

    def _judge_round(self, round_rows: ray.data.Dataset) -> None:
        """Judge a round's rows in order on the driver (a few fields of each), the take's keys given those kept."""
        fields = ["priority", "id", "source", "thinking"]
        checked = sorted(tuple(row[name] for name in fields) for row in round_rows.map_batches(
            lambda table: _rows_only(table).select(fields), batch_format="pyarrow").take_all())
        heads = self._heads({priority for priority, _, _, _ in checked})
        evict = self.keys.evict if self._taking else self.keys.evictions.add
        self.judged.update(self.keys.judge_generated(self._judge, checked, heads, self.final_ids, evict,
                                                     keep=self._taking))

    def _heads(self, asking: set[int]) -> dict[int, Duplicate]:
        """What the local engine's index answers for each of the ``asking`` rows that duplicates the head of a
        bucket, by priority; the replayed heads among them that are duplicates themselves marked dropped in the
        judge, as the local engine's index has them when a generated row meets them."""
        if self._verdicts is None or self._judge is None or not asking:
            return {}
        given = self._verdicts.map_batches(_having(asking), batch_format="pyarrow").take_all()
        least = least_verdicts(pa.Table.from_pylist(given, schema=BUCKET_VERDICTS))
        found = {priority: head for priority, head in zip(
            least.column("priority").to_pylist(), heads_of(least.column("rank"), least.column("head")), strict=True)
            if head is not None}
        replayed = {head.priority: head.duplicate.of for head in found.values() if head.priority < self._generated_from}
        if replayed:
            dropped = self._verdicts.map_batches(_having(set(replayed)), batch_format="pyarrow")
            self._judge.mark_dropped(replayed[row["priority"]] for row in dropped.take_all())
        return {priority: head.duplicate for priority, head in found.items()}


def _screened(parts: Mapping[int, Part | FilePart], screen: Callable[..., Iterator[pa.Table]]
              ) -> ray.data.Dataset | None:
    """The parts read and screened (``_screen_parts``), one task a part, materialized: every later stage reads
    them, some twice; None when there is no part."""
    if not parts:
        return None
    screened: ray.data.Dataset = ray.data.from_items(
        [{"part": index} for index in parts], override_num_blocks=len(parts)).map_batches(
        partial(screen, parts=parts), batch_size=1, batch_format="numpy").materialize()
    return screened


@cache
def _renderer(settings: TokenSettings) -> TemplateRenderer:
    """The target's renderer, loaded once per worker process: every task the process runs after the first
    reuses it."""
    return settings.renderer()


def _screen_parts(batch: dict[str, np.ndarray], *, parts: Mapping[int, Part | FilePart], screen: ScreenStage,
                  settings: TokenSettings | None, pack_cut: PackCut | None, pack_files: list[Path]
                  ) -> Iterator[pa.Table]:
    """Read and screen parts: a table of records per batch the local engine measures at once, or per block of the
    columnar path (a ``FilePart``) (so that a task's memory does not grow with its part), each record with its
    priority, (part << 32) | its place among the part's records (the rows the eval pack holds are left out). A row
    truncated to the budget is another text: the writing task measures it, as the local writer does."""
    checker = screen.checker(_renderer(settings) if settings is not None else None,
                             read_pack_screen(screen.checks, pack_cut, pack_files) if pack_cut is not None else None,
                             facts=settings is not None)
    for part in batch["part"].tolist():
        read = parts[part]
        yield from (_file_part_records(read, checker, part << PART_SHIFT) if isinstance(read, FilePart)
                    else _part_records(read, checker, part << PART_SHIFT))


def _part_records(part: Part, checker: Checker, first: int) -> Iterator[pa.Table]:
    """A part read by the row path and screened, its records' priorities from ``first`` on."""
    position = first
    for measured in measured_rows(part(), checker.measure):
        screened = checker.screened(measured.items, measured.measurement)
        yield screened.to_arrow(np.arange(position, position + len(screened.records), dtype=np.int64))
        position += len(screened.records)


def _file_part_records(part: FilePart, checker: Checker, first: int) -> Iterator[pa.Table]:
    """A file part read by the columnar path's blocks (``PartReader``: a part that starts within its file numbers its
    lines from the file's start, and its first row fixes its layout, as the row path's part does), its records'
    priorities from ``first`` on; a file read as one part without a row is the row path's error."""
    reader = PartReader(part, checker)
    position = first
    any_record = False
    for block in reader.blocks(Turns(0, 1)):
        any_record = any_record or block.holds_records()
        records = _block_records(block, checker, position)
        position += len(records)
        yield records
    part.check_rows(any_record)


def _block_records(block: Block, checker: Checker, first: int) -> pa.Table:
    """A block of the columnar path in the screened Arrow form (``Screened.to_arrow``'s): its rows and skip records
    in their places, with priorities from ``first`` on and the rows' dedup signatures; and ``KERNEL_ROWS``."""
    rows = pa.RecordBatch.from_arrays([*block.rows.columns, *(pa.nulls(block.rows.num_rows, field.type)
                                                              for field in SKIP_FIELDS)], schema=RECORD_SCHEMA)
    skips = records_to_batch([record for _, record in block.skips])
    places = np.concatenate([block.places, np.asarray([place for place, _ in block.skips], dtype=np.int64)])
    order = np.argsort(places, kind="stable")
    count = len(order)
    table = pa.Table.from_batches([rows, skips])
    if block.skips:  # a take copies every text: without skip records the rows are in order (their places sorted)
        table = table.take(pa.array(order))
    table = table.append_column("priority", pa.array(np.arange(first, first + count, dtype=np.int64)))
    if checker.dedup is not None:
        row_places = np.empty(count, dtype=np.int64)
        row_places[order] = np.arange(count, dtype=np.int64)  # each record's place among the block's records
        signatures = block.signatures if block.signatures is not None else checker.dedup.signatures([])
        for name, column in signatures.to_arrow(row_places[:block.rows.num_rows], count).items():
            table = table.append_column(name, column)
    kernel_rows = np.zeros(count, dtype=np.int64)
    kernel_rows[:1] = block.fast
    return table.append_column(KERNEL_ROWS, pa.array(kernel_rows))


def _read_generated(path: Path) -> Iterator[Conversation | Skipped]:
    """A round's generated rows and skips, as the driver wrote them."""
    with pa.OSFile(str(path), "rb") as source, pa.ipc.open_stream(source) as reader:
        for batch in reader:
            yield from batch_to_records(batch)


def _rows_only(table: pa.Table) -> pa.Table:
    """The records that are rows (not skip records), without the columns no keyed stage or take reads (their texts,
    token facts: most of a row's bytes, which a filter would copy)."""
    return table.drop_columns([name for name in TEXT_COLUMNS if name in table.column_names]).filter(
        pc.is_null(table.column("skip_reason")))


def _having(priorities: set[int]) -> Callable[[pa.Table], pa.Table]:
    """A batch filter: the rows whose priority is one of ``priorities``."""
    wanted = pa.array(sorted(priorities), pa.int64())
    return lambda table: table.filter(pc.is_in(table.column("priority"), value_set=wanted))


def _entries(table: pa.Table, *, stage: KeyedStage, final_ids: dict[int, str]) -> pa.Table:
    """A keyed stage's entries of a block's rows, named by the ids they are written under."""
    rows = _rows_only(table)
    ids = [final_ids.get(priority, row_id) for priority, row_id in zip(
        rows.column("priority").to_pylist(), rows.column("id").to_pylist(), strict=True)]
    return stage.entries(rows, ids)


def _entry_pieces(rows: ray.data.Dataset, stage: KeyedStage, final_ids: dict[int, str], partitions: int,
                  tasks: int) -> list[list[ObjectRef[pa.Table]]]:
    """A keyed stage's entries of every row, hash-partitioned by the stage's key (so a partition holds whole groups):
    for each partition, its piece from each of ``tasks`` plain tasks, each reading a run of the rows' blocks. Not Ray
    Data's repartition, whose map coalesces up to 1 GiB of blocks into one task (one CPU) in workers of a runtime
    environment of its own, started for it (~3 s more a shuffle of 1M rows' entries). A task per CPU rather than per
    block: a piece under 100 kB is returned inline to its owner, the driver, which would hold every entry then."""
    named = ray.put(final_ids)
    split = _split_entries.options(num_returns=partitions)
    blocks = rows.to_arrow_refs()
    runs = [blocks[index * len(blocks) // tasks:(index + 1) * len(blocks) // tasks] for index in range(tasks)]
    by_task: list[Any] = [split.remote(stage, named, partitions, *run) for run in runs if run]
    return [[refs[index] if partitions > 1 else refs for refs in by_task] for index in range(partitions)]


@ray.remote
def _split_entries(stage: KeyedStage, final_ids: dict[int, str], partitions: int, *tables: pa.Table
                   ) -> pa.Table | tuple[pa.Table, ...]:
    """Blocks of rows' entries (``_entries``) cut into ``partitions`` by the hash of the stage's key (Ray Data's own
    ``hash_partition``, what its shuffle cuts by); an empty piece has no columns."""
    entries = _joined_pieces([_entries(table, stage=stage, final_ids=final_ids) for table in tables if len(table)])
    cut = hash_partition(entries, hash_cols=list(stage.group_by), num_partitions=partitions)
    pieces = tuple(cut.get(index, pa.table({})) for index in range(partitions))
    return pieces if partitions > 1 else pieces[0]


@ray.remote
def _judged(stage: KeyedStage, *pieces: pa.Table) -> pa.Table:
    """A keyed stage's answers of one partition of its entries (whole groups)."""
    return stage.judge_groups(_joined_pieces(pieces))


def _joined_pieces(pieces: Sequence[pa.Table]) -> pa.Table:
    """Pieces of entries as one table (none: a table without columns, as an empty partition is)."""
    filled = [piece for piece in pieces if len(piece)]
    return pa.concat_tables(filled) if filled else pa.table({})


def _copies(numbered: list[ObjectRef[pa.Table]], pieces: list[list[ObjectRef[pa.Table]]]) -> dict[int, str]:
    """The ids stage's answers on the driver, by priority (the copies: a few); a suffixed id that is another row's
    own id (among the ids' entries, ``pieces``) is a CorpusError."""
    final = {priority: row_id for table in ray.get(numbered) if len(table) for priority, row_id in zip(
        table.column("priority").to_pylist(), table.column("id").to_pylist(), strict=True)}
    if final:
        suffixed = pa.array(sorted(set(final.values())), pa.string())
        clashes = [name for names in ray.get([_clashing_ids.remote(suffixed, *partition) for partition in pieces])
                   for name in names][:3]
        if clashes:
            names = ", ".join(sorted(clashes))
            raise CorpusError(f"the Ray engine cannot number repeated ids: {names} is both a row's own id and the "
                              "suffixed id of a copy (build with --engine local, which numbers them in order)")
    return final


@ray.remote
def _clashing_ids(suffixed: pa.Array, *pieces: pa.Table) -> list[str]:
    """The own ids of a partition of the ids' entries that are among the ``suffixed`` ids of copies, three at most."""
    entries = _joined_pieces(pieces)
    if not len(entries):
        return []
    raw_ids = entries.column("raw_id")
    clashing: list[str] = raw_ids.filter(pc.is_in(raw_ids, value_set=suffixed)).to_pylist()
    return clashing[:3]


def _priority_blocks(verdicts: ray.data.Dataset) -> list[tuple[int, int, Any]]:
    """The verdicts (materialized) sorted by priority, as blocks in the object store: (least priority, greatest, the
    block). As many as a partition holds are sorted into one block by one task: Ray Data's sort (a sample, then a
    shuffle) costs seconds whatever its size (4.6 s of a 1M-row build with 20k duplicates)."""
    count = verdicts.count()
    if not count:
        return []
    refs = ([_sorted_block.remote(*verdicts.to_arrow_refs())] if count <= ROWS_PER_PARTITION
            else verdicts.sort("priority").materialize().to_arrow_refs())
    bounds = ray.get([_bounds.remote(ref) for ref in refs])
    return [(first, last, ref) for (first, last), ref in zip(bounds, refs, strict=True)
            if first is not None and last is not None]


@ray.remote
def _sorted_block(*blocks: pa.Table) -> pa.Table:
    """Blocks of verdicts as one, sorted by priority."""
    return _joined_pieces(blocks).sort_by("priority")


@ray.remote
def _bounds(block: pa.Table) -> tuple[int | None, int | None]:
    """A sorted block's least and greatest priority (None: an empty block)."""
    if not len(block):
        return None, None
    priorities = block.column("priority")
    return priorities[0].as_py(), priorities[-1].as_py()


def _with_verdicts(table: pa.Table, *, blocks: list[tuple[int, int, Any]]) -> pa.Table:
    """The records with their verdict (``rank``, ``head``: null where none), from the verdict blocks their
    priorities span."""
    priorities = table.column("priority")
    wanted = []
    if len(table):
        low, high = pc.min(priorities).as_py(), pc.max(priorities).as_py()
        wanted = [block for first, last, block in blocks if first <= high and last >= low]
    if not wanted:
        return table.append_column("rank", pa.nulls(len(table), pa.int64())).append_column(
            "head", pa.nulls(len(table), pa.string()))
    verdicts = least_verdicts(pa.concat_tables(ray.get(wanted)))
    at = pc.index_in(priorities, value_set=verdicts.column("priority").combine_chunks())
    return table.append_column("rank", verdicts.column("rank").combine_chunks().take(at)).append_column(
        "head", verdicts.column("head").combine_chunks().take(at))


def _kept_keys(table: pa.Table, *, rule: TakeRule, final_ids: dict[int, str]) -> pa.Table:
    """What the take reads of each kept row (``TakeRule.keys_table``), by the id it is written under."""
    rows = _rows_only(table)
    if "rank" in rows.column_names:  # the duplicates are not kept
        rows = rows.filter(pc.is_null(rows.column("rank")))
    ids = [final_ids.get(priority, row_id) for priority, row_id in zip(
        rows.column("priority").to_pylist(), rows.column("id").to_pylist(), strict=True)]
    return rule.keys_table(rows.column("source"), ids, rows.column("thinking"))


def _write_rows(table: pa.Table, *, staging: Path, rows_per_shard: int, rule: TakeRule,
                selection: Selection | None, final_ids: dict[int, str], judged: dict[int, Verdict | None],
                settings: TokenSettings | None, source_order: dict[str, int]) -> pa.Table:
    """The write stage on a block, in priority order, into shards of its own: the kept rows under their ids, split,
    those the take takes (every one without a declared corpus); the dropped rows' records, each with its place in
    the ledger (by priority, then the evicted rows by source in recipe order and priority, as the local engine reads
    its kept rows); the rows' statistics. ``judged``: the generated rows whose head the driver's judge overruled
    (None: kept). The rows are written in the Arrow form the screen gave them: only the dropped rows become
    ``Conversation``s (their records name their place), and the rows written when the token statistics read them (a
    target's tokenizer named). The directory is this attempt's alone: a retried task's first attempt leaves nothing
    it names."""
    table = table.sort_by("priority")
    is_skip = pc.is_valid(table.column("skip_reason"))
    rows = table.filter(pc.invert(is_skip))
    row_priorities = rows.column("priority").to_pylist()
    ids = [final_ids.get(priority, row_id)
           for priority, row_id in zip(row_priorities, rows.column("id").to_pylist(), strict=True)]
    verdicts = [judged.get(priority, verdict)
                for priority, verdict in zip(row_priorities, _verdicts_of(rows), strict=True)]
    dropped: list[tuple[list[int], Skipped]] = []

    def drop(place: list[int], skipped: Skipped) -> None:
        dropped.append((place, skipped))

    skips = table.filter(is_skip)
    for priority, record in zip(skips.column("priority").to_pylist(), batch_to_records(skips), strict=True):
        assert isinstance(record, Skipped)  # every one a skip record
        drop([0, priority], record)
    duplicates = [place for place, verdict in enumerate(verdicts) if verdict is not None]
    for place, row in zip(duplicates, batch_to_conversations(rows.take(pa.array(duplicates, pa.int64()))),
                          strict=True):
        verdict = verdicts[place]
        assert verdict is not None  # a duplicate's
        drop([0, row_priorities[place]], verdict.skipped(row))
    places = pa.array([place for place, verdict in enumerate(verdicts) if verdict is None], pa.int64())
    kept = rows.take(places)
    kept = kept.set_column(kept.schema.get_field_index("id"), "id", pa.array(ids, pa.string()).take(places))
    taken, evicted = rule.taken_rows(kept, selection)
    kept_priorities = kept.column("priority").to_pylist()
    for place, record in evicted:
        drop([1, source_order[record.source], kept_priorities[place]], record)
    tokens = None
    if settings is not None:  # the screen's facts, by the id a row is written under, until it is
        measured = {row_id: facts for row_id, facts in zip(
            kept.column("id").to_pylist(), facts_from_arrow(kept.column("facts")), strict=True) if facts is not None}
        tokens = TokenStats(settings, TurnTokens(_renderer(settings)), measured)
    stats = CorpusStats(tokens=tokens)
    directory = f"{DATA}/{RAY_DIRECTORY}{uuid.uuid4().hex}"
    shards = ShardWriter(staging, rows_per_shard, directory=directory)
    try:
        shards.write_table(taken)
    except BaseException:
        shards.abort()
        raise
    infos = shards.close()
    dropped_file = None
    if dropped:
        dropped_file = f"{directory}/{DROPPED}"
        (staging / directory).mkdir(parents=True, exist_ok=True)
        with (staging / dropped_file).open("wb") as handle:
            handle.writelines(orjson.dumps([place, record.source, record.reason, record.location, record.detail,
                                            record.id]) + b"\n"
                              for place, record in sorted(dropped, key=lambda pair: pair[0]))
    for batch in taken.select(ARROW_SCHEMA.names).cast(ARROW_SCHEMA).combine_chunks().to_batches():
        stats.add_rows(batch_to_conversations(batch) if tokens is not None else [], batch)
    return pa.table({"first": [table.column("priority")[0].as_py() if len(table) else -1],
                     "directory": [directory], "shards": [[info.to_dict() for info in infos]],
                     "stats": [orjson.dumps(stats.to_json()).decode()],
                     "tokens": [orjson.dumps(tokens.figures.to_json()).decode() if tokens is not None else None],
                     "dropped": [dropped_file], "records": [len(table)],
                     KERNEL_ROWS: [pc.sum(table.column(KERNEL_ROWS)).as_py() or 0
                                   if KERNEL_ROWS in table.column_names else 0]}, schema=_WRITTEN)


def _verdicts_of(rows: pa.Table) -> list[Verdict | None]:
    """Each row's verdict from its ``rank`` and ``head`` columns (None: none, or no column: no dedup)."""
    if "rank" not in rows.column_names:
        return [None] * len(rows)
    return [head.verdict if head is not None else None for head in heads_of(rows.column("rank"), rows.column("head"))]


def _assemble(staging: Path, written: list[dict[str, Any]], ledger: LedgerWriter, stats: CorpusStats
              ) -> list[ShardInfo]:
    """The tasks' shards under their final names, their statistics merged into ``stats``, the ledger in the local
    engine's order; the directories of attempts no result names (a retried task's) removed."""
    data = staging / DATA
    data.mkdir(parents=True, exist_ok=True)
    by_split: dict[str, list[ShardInfo]] = {}
    dropped: list[Path] = []
    for result in sorted(written, key=lambda result: result["first"]):  # shards numbered in read order
        stats.merge(CorpusStats.from_json(orjson.loads(result["stats"])))
        if stats.tokens is not None and result["tokens"] is not None:
            stats.tokens.figures.merge(TokenFigures.from_json(orjson.loads(result["tokens"])))
        if result["dropped"] is not None:
            dropped.append(staging / result["dropped"])
        for info in result["shards"]:
            by_split.setdefault(info["split"], []).append(ShardInfo(**info))
    infos: list[ShardInfo] = []
    for split in sorted(by_split):
        shards = by_split[split]
        for index, info in enumerate(shards):
            name = f"{split}-{index:05d}-of-{len(shards):05d}.parquet"
            (staging / info.path).rename(data / name)
            infos.append(ShardInfo(f"{DATA}/{name}", split, info.rows, info.bytes, info.sha256))
    try:
        for source, reason, location, detail, row_id in merged_dropped(dropped, data / f"{RAY_DIRECTORY}merge"):
            ledger.write(Skipped(source, reason, location, detail, id=row_id))
    finally:
        ledger.close()
        for directory in data.glob(f"{RAY_DIRECTORY}*"):
            shutil.rmtree(directory, ignore_errors=True)
    return infos


def merged_dropped(files: list[Path], scratch: Path) -> Iterator[list[str]]:
    """The records of the writing tasks' files of dropped rows (``DROPPED``), merged by place, each without its place;
    at most MERGED_AT_ONCE files open at once: more are merged in rounds into files of ``scratch`` first."""
    merged_round = 0
    while len(files) > MERGED_AT_ONCE:
        scratch.mkdir(parents=True, exist_ok=True)
        merged: list[Path] = []
        for start in range(0, len(files), MERGED_AT_ONCE):
            path = scratch / f"{merged_round}-{start}.jsonl"
            with ExitStack() as stack, path.open("wb") as handle:
                handle.writelines(orjson.dumps(record) + b"\n" for record in heapq.merge(
                    *(_dropped_records(stack, file) for file in files[start:start + MERGED_AT_ONCE]),
                    key=lambda record: record[0]))
            merged.append(path)
        files = merged
        merged_round += 1
    with ExitStack() as stack:
        for record in heapq.merge(*(_dropped_records(stack, file) for file in files), key=lambda record: record[0]):
            yield record[1:]


def _dropped_records(stack: ExitStack, path: Path) -> Iterator[list[Any]]:
    """A file of dropped rows' records, read a line at a time (open until ``stack`` closes)."""
    return (orjson.loads(line) for line in stack.enter_context(path.open("rb")))
