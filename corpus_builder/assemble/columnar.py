"""The columnar replay path (issue 42): replayed rows that need no repair go from the file's bytes to the shards as
Arrow batches, never as ``Conversation`` objects.

The path is on by default (``CORPUS_COLUMNAR=0`` turns it off, see ``SWITCH``). A build whose plan it covers
(``uncovered`` says why not, else None: a replay of .jsonl files of turn lists, with the exact dedup at most; the
build's docs page lists what it does not cover) reads each replay source's files, cut into parts as the row path
cuts them, in blocks of whole lines. In a block, the lines a kernel can take are parsed and mapped by the sources'
kernels (``sources.columnar``, which also says which lines it leaves), then checked, identified, deduplicated, split
and written with pyarrow compute kernels and numpy over the buffers; per row Python runs only where no kernel exists
and it is cheap (hashlib over bytes a kernel built, the hashes of the ids). Every other line drops to the row path
(``sources.source``'s normaliser of the same file part, in order), and its rows join the block's in their place: the
corpus, the ledger and audit.json are byte for byte the row path's.

A row drops when its turns need what only the row path does: a speaker that is not system, user or assistant (tool
traffic), a turn with a field beside the speaker and the text (an assistant turn's reasoning text apart), a text
that is not a string, an empty turn, an unclosed think block, a role order to repair, ``tools``, an id that is not a
string or an integer, or a control character the row's JSON key would escape as ``\\uXXXX``. Think blocks and
reasoning fields are split and read by kernels. The rows through each path are counted in the build's progress
lines.

With several readers (``sources.parallel.worker_count``: two on two cores, one per core but one beyond; or
``CORPUS_WORKERS``), the blocks of every part, one stream, are read on forked processes by turns
(``sources.parallel.on_turns``): block n on reader n mod the readers', taken in order by the build, which judges and
writes them. A reader walks the blocks of the others too: it counts their lines, and reads them by the row path while
no row has fixed the part's layout, as a read of every block does. A reader (the build's process itself, with one)
works on three threads (``PartReader.blocks``, ``sources.parallel.on_thread``): one reads and parses the next block,
one maps its rows by the kernels, and the reader's own finishes it; pyarrow's parser and compute kernels, numpy and
hashlib release the GIL, so on two cores they overlap.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TextIO

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import Skipped
from ..layout import ShardInfo
from ..progress import ProgressLine
from ..recipe.model import SourceSpec
from ..records import Conversation
from ..rows import ARROW_SCHEMA, MESSAGE_TYPE, TOOL_CALL_TYPE, conversations_to_batch
from ..screen.checks import Checker
from ..screen.dedup import Dedup, dedup_key
from ..screen.ids import UniqueIds
from ..screen.near_dedup import Signatures
from ..screen.normalise import NormalisedChunk, arrow_chunks, normalise_arrow_texts
from ..screen.screened import RULE_REASONS, Verdict
from ..sources.columnar import (
    ROLE_ASSISTANT,
    ROLES,
    Lines,
    ParsedBlock,
    RowPath,
    content_keys,
    hashed_ids,
    holds_unicode_escaped,
    json_string,
    listed,
    mapped_turns,
    parsed_block,
    part_blocks,
    per_row,
    role_order_ok,
)
from ..sources.formats import JsonLines, format_of
from ..sources.mappings import TURN_KEYS
from ..sources.parallel import Turns, on_thread, on_turns, worker_count
from ..sources.readers import LineRange
from ..sources.source import file_unit, logged_file, resolve_paths, source_label
from ..stats.corpus import CorpusStats
from .plan import Plan
from .shards import LedgerWriter, ShardWriter

# On by default, CORPUS_COLUMNAR=0 turns it off: on a quiet 2-core machine it built the 200k bench file 1.59x sooner
# than the row path, in 0.66x its CPU and 1.3x its memory (BENCHMARKS.md), so the default follows the measurement.
SWITCH = "CORPUS_COLUMNAR"
# Blocks a reader runs ahead of the block being written: a block is a few MB of rows.
BLOCK_QUEUE_DEPTH = 2
# Blocks parsed ahead of the one being mapped, and mapped ahead of the one being joined (``PartReader.blocks``).
PARSED_QUEUE_DEPTH = 1
MAPPED_QUEUE_DEPTH = 1


def uncovered(plan: Plan, in_tokens: bool, has_pack: bool) -> str | None:
    """Why the columnar path does not run this plan (it then runs on the row path), or None when it does."""
    checks = plan.screen.checks
    reasons = [
        (os.environ.get(SWITCH, "1") == "0", f"{SWITCH} is 0"),
        (plan.takes, "a declared mixture or prompt sources"),
        (in_tokens or checks.max_seq_len is not None, "the target's tokens"),
        (checks.near_duplicates is not None, "near duplicates"),
        (checks.dedup == "prompt", "dedup on prompts"),
        (plan.screen.contamination is not None, "decontamination"),
        (plan.read.redact, "redaction"),
        (has_pack, "an eval pack"),
    ]
    for spec in plan.read.sources:
        reasons += [(spec.hub is not None, f"source {spec.name}: a Hub dataset"),
                    (spec.take is not None, f"source {spec.name}: a take"),
                    (spec.mapping.style not in (*TURN_KEYS, "auto"),
                     f"source {spec.name}: mapping style {spec.mapping.style}")]
        if spec.hub is None and not any(applies for applies, _ in reasons):
            paths = resolve_paths(spec, plan.read.base_dir)
            reasons += [(not isinstance(format_of(path, spec.format), JsonLines),
                         f"source {spec.name}: {path.name} is not .jsonl") for path in paths]
            # a source whose first file is a serving log is folded by chat (``sources.fold``)
            reasons.append((spec.fold.enabled and bool(paths) and logged_file(
                spec, paths[0], source_label(paths[0], plan.read.base_dir)), f"source {spec.name}: a serving log"))
    return next((reason for applies, reason in reasons if applies), None)


# --- a block ---------------------------------------------------------------------------------------------------


@dataclass
class Block:
    """A block's outcome in priority order: the kept rows (``rows``, the row form without ids' copies numbered nor
    a split), each row's line and signatures, and the skip records with their places."""

    rows: pa.RecordBatch
    lines: npt.NDArray[np.int64]
    signatures: Signatures | None
    skips: list[tuple[int, Skipped]] = field(default_factory=list)  # (place, record), places sorted
    places: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    fast: int = 0  # rows the kernels took

    def holds_records(self) -> bool:
        """Whether a line of the block made a row or a skip record (every row a kernel or the row path made is in
        ``rows`` or ``skips``: the exact dedup, which drops rows, judges them later)."""
        return bool(self.rows.num_rows or self.skips)


@dataclass
class MappedBlock:
    """A block as the kernels left it: their rows (``batches``, from the lines ``fast_places``), the row path's records
    so far (each with its line, ``item_places``) and the lines read (``fast``: by the kernels or the row path)."""

    first_line: int
    lines: Lines
    fast: npt.NDArray[np.bool_]
    batches: list[pa.RecordBatch] = field(default_factory=list)
    fast_places: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    items: list[Conversation | Skipped] = field(default_factory=list)
    item_places: list[int] = field(default_factory=list)


@dataclass
class PartEnd:
    """The end of a file part, in the stream of its blocks."""


@dataclass(frozen=True)
class FilePart:
    """A replay source's file part: the bytes ``span`` of ``path`` (and its first line's number); ``whole``: the file
    is one part."""

    spec: SourceSpec
    path: Path
    span: LineRange
    label: str
    whole: bool

    def check_rows(self, any_record: bool) -> None:
        """A file read as one part without a row (``any_record``: its blocks held none) is the error the row path
        gives, raised by its reader."""
        if self.whole and not any_record:
            for _ in format_of(self.path, self.spec.format).read(self.path, self.label):
                pass


class PartReader:
    """One file part of a replay source, read block by block (see the module)."""

    def __init__(self, part: FilePart, checker: Checker) -> None:
        self.spec = part.spec
        self.path, self.span = part.path, part.span
        self.checker = checker
        self.row_path = RowPath(part.spec, file_unit(part.path, format_of(part.path, part.spec.format), part.label))
        self.label_json = json_string(pa.array([part.label])).to_pylist()[0]
        self.escapes_control = True  # the block's (``Lines.escapes_control``)

    def blocks(self, turns: Turns) -> Iterator[Block]:
        """The part's blocks whose turn is this process's (``turns``), read and parsed here; of the others, only
        the lines are counted, and read by the row path while no row has fixed the part's layout (as a read of
        every block fixes it). Three stages, each on a thread of its own and a block or two ahead of the next at most:
        blocks read and parsed, their rows mapped by the kernels, and (on the caller's thread) the rows the kernels
        leave read by the row path, screened and joined with theirs, with their dedup signatures."""
        for mapped in on_thread(self._mapped_blocks(turns), MAPPED_QUEUE_DEPTH):
            for index in np.flatnonzero(~mapped.fast).tolist():
                self._row_path(mapped.first_line, mapped.lines, index, mapped.items, mapped.item_places)
            yield self._joined(mapped)

    def _mapped_blocks(self, turns: Turns) -> Generator[MappedBlock, None, None]:
        """The blocks of this process's turns as the kernels map them."""
        for first_line, data, parsed in on_thread(self._parsed(turns), PARSED_QUEUE_DEPTH):
            if parsed is not None:
                yield self._mapped_block(*parsed)
            elif self.row_path.normalise.layout is None:
                self._layout_fixed(first_line, Lines.of(data), [], [])

    def _parsed(self, turns: Turns) -> Generator[tuple[int, bytes, ParsedBlock | None], None, None]:
        """The part's blocks as read (their first line, their bytes), those whose turn is this process's parsed."""
        for first_line, data in part_blocks(self.path, self.span):
            yield first_line, data, parsed_block(first_line, data) if turns.mine() else None

    def _layout_fixed(self, first_line: int, lines: Lines, items: list[Conversation | Skipped],
                      item_places: list[int]) -> int:
        """The block's lines read by the row path until a row fixes the part's layout; how many were read.

        Only here, before the layout is fixed, does the mapping's thread read rows by the row path; after it, only
        the caller's thread does (``blocks``): the row path reads the part's rows in their order."""
        read = 0
        while self.row_path.normalise.layout is None and read < len(lines.starts):
            self._row_path(first_line, lines, read, items, item_places)
            read += 1
        return read

    def _mapped_block(self, first_line: int, lines: Lines, runs: list[tuple[npt.NDArray[np.int64], pa.Table]]
                      ) -> MappedBlock:
        mapped = MappedBlock(first_line, lines, np.zeros(len(lines.starts), dtype=bool))
        self.escapes_control = lines.escapes_control
        prefix = self._layout_fixed(first_line, lines, mapped.items, mapped.item_places)
        layout = self.row_path.normalise.layout
        # a part whose layout is another than the turn lists' (a log's, gsm8k's, a field's) takes the row path
        for run, table in runs if layout is not None and layout.style in TURN_KEYS else ():
            assert layout is not None
            if run[0] < prefix:  # the lines that fixed the layout took the row path
                after = run >= prefix
                run, table = run[after], table.filter(pa.array(after))
            if not len(run):
                continue
            batch, taken = self._mapped(table, run + first_line, layout.style, layout.field)
            if batch is not None:
                mapped.batches.append(batch)
                mapped.fast[run[taken]] = True
        mapped.fast_places = np.flatnonzero(mapped.fast)
        mapped.fast[:prefix] = True  # read already
        return mapped

    def _row_path(self, first_line: int, lines: Lines, index: int, items: list[Conversation | Skipped],
                  places: list[int]) -> None:
        made = self.row_path.rows(first_line + index, lines.line(index))
        items += made
        places += [index] * len(made)

    def _joined(self, mapped: MappedBlock) -> Block:
        """The kernels' rows and the row path's records of a block, screened, in line order."""
        batches, fast_places, first_line = mapped.batches, mapped.fast_places, mapped.first_line
        items, item_places = mapped.items, mapped.item_places
        screened_records: list[Conversation | Skipped] = []
        fallback_signatures = None
        rows_of_items = [item for item in items if isinstance(item, Conversation)]
        if items:
            screened = self.checker.screened(items, self.checker.measure(rows_of_items))
            screened_records, fallback_signatures = screened.records, screened.signatures
        kept = [record for record in screened_records if isinstance(record, Conversation)]
        # a record's place: its line, then its order among the line's records
        sub = np.zeros(len(item_places), dtype=np.int64)
        for index in range(1, len(item_places)):
            if item_places[index] == item_places[index - 1]:
                sub[index] = sub[index - 1] + 1
        record_places = np.asarray(item_places, dtype=np.int64) * 1024 + sub
        skips = [(int(place), record) for place, record in zip(record_places.tolist(), screened_records, strict=True)
                 if isinstance(record, Skipped)]
        kept_places = np.asarray([place for place, record in zip(record_places.tolist(), screened_records,
                                                                  strict=True) if isinstance(record, Conversation)],
                                 dtype=np.int64)
        parts = []
        places = []
        lines = []
        signatures = []
        fast_rows = 0
        if batches:
            batch = pa.Table.from_batches(batches).combine_chunks().to_batches()[0] if len(batches) > 1 else batches[0]
            fast_rows = batch.num_rows
            parts.append(batch)
            places.append(fast_places * 1024)
            lines.append(fast_places + first_line)
            if self.checker.dedup is not None:
                signatures.append(self._signatures(batch))
        if kept:
            parts.append(conversations_to_batch(kept))
            places.append(kept_places)
            lines.append(np.asarray([row.provenance.position or 0 for row in kept], dtype=np.int64))
            if fallback_signatures is not None:
                signatures.append(fallback_signatures)
        if not parts:
            return Block(pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA), np.zeros(0, dtype=np.int64), None,
                         skips)
        all_places = np.concatenate(places)
        order = np.argsort(all_places, kind="stable")
        if len(parts) == 1:  # the kernels' rows alone, or the row path's: in order already
            joined = parts[0]
        else:
            joined = pa.Table.from_batches(parts).take(pa.array(order)).combine_chunks().to_batches()[0]
        joined_signatures = Signatures.concat(signatures).rows(order.tolist()) if signatures else None
        return Block(joined, np.concatenate(lines)[order], joined_signatures, skips, all_places[order], fast_rows)

    def _signatures(self, batch: pa.RecordBatch) -> Signatures:
        """The dedup signatures of the kernels' rows (``conversation_text`` of rows without tool traffic)."""
        assert self.checker.dedup is not None
        messages = batch.column("messages")
        turns = messages.flatten()
        content = pc.struct_field(turns, [1])
        reasoning = pc.struct_field(turns, [2])
        # a turn's reasoning (an assistant's alone has one) before its content, in one copy of the texts
        texts = pc.binary_join_element_wise(reasoning, content, "\n", null_handling="skip")
        offsets = messages.offsets.to_numpy().astype(np.int64)
        joined = pc.binary_join(listed(offsets - offsets[0], texts), "\n")
        return Signatures.concat([self.checker.dedup.chunk_signatures(NormalisedChunk(normalise_arrow_texts(chunk)))
                                  for chunk in arrow_chunks(joined)])

    def _mapped(self, table: pa.Table, line_numbers: npt.NDArray[np.int64], style: str, turns_field: str
                ) -> tuple[pa.RecordBatch | None, npt.NDArray[np.int64]]:
        """The rows of ``table`` the kernels take, in the row form, and which they are."""
        rows = table.num_rows
        nothing = np.zeros(0, dtype=np.int64)
        if turns_field not in table.column_names:
            return None, nothing
        lists = table.column(turns_field).chunk(0) if table.column(turns_field).num_chunks else None
        if lists is None:
            return None, nothing
        role_key, content_key = TURN_KEYS[style]
        turns = mapped_turns(lists, role_key, content_key, self.escapes_control)
        if turns is None:
            return None, nothing
        lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        eligible = pc.is_valid(lists).to_numpy(zero_copy_only=False) & (lengths > 0)
        eligible &= ~per_row(turns.bad, turns.parents, rows)
        eligible &= role_order_ok(turns.roles, turns.parents, offsets)
        if "tools" in table.column_names:
            eligible &= pc.is_null(table.column("tools")).to_numpy(zero_copy_only=False)
        source_ids = self._source_ids(table, eligible)
        taken = np.flatnonzero(eligible)
        if not len(taken):
            return None, taken
        turn_taken = eligible[turns.parents]
        mask = pa.array(turn_taken)
        roles = turns.roles[turn_taken]
        role_names = pa.array(ROLES).take(pa.array(roles))
        content, reasoning = turns.content, turns.reasoning
        if not turn_taken.all():  # a filter copies every text, even when it keeps them all
            content, reasoning = pc.filter(content, mask), pc.filter(reasoning, mask)
        kept_offsets = np.concatenate(([0], np.cumsum(lengths[taken]))).astype(np.int64)
        messages = pa.ListArray.from_arrays(pa.array(kept_offsets.astype(np.int32)), pa.StructArray.from_arrays(
            [role_names, content, reasoning, pa.nulls(len(roles), pa.list_(TOOL_CALL_TYPE)),
             pa.nulls(len(roles), pa.string())], fields=list(MESSAGE_TYPE)), type=ARROW_SCHEMA.field("messages").type)
        keys = content_keys(role_names, content, reasoning, kept_offsets)
        ids = hashed_ids(keys, self.spec.name)
        thinking = per_row((roles == ROLE_ASSISTANT) & pc.is_valid(reasoning).to_numpy(zero_copy_only=False),
                           np.repeat(np.arange(len(taken)), lengths[taken]), len(taken))
        count = len(taken)
        spec = self.spec
        provenance = pc.binary_join_element_wise(
            '{"source_file":', self.label_json, ',"source_line":', pc.cast(pa.array(line_numbers[taken]), pa.string()),
            pc.if_else(pc.is_valid(source_ids.take(pa.array(taken))),
                       pc.binary_join_element_wise(',"source_id":', json_string(pc.fill_null(
                           source_ids.take(pa.array(taken)), "")), ""), ""), "}", "")
        columns = [pa.array(ids, pa.string()), pa.array([spec.name] * count, pa.string()),
                   pa.array(["replay"] * count, pa.string()), pa.array([spec.task] * count, pa.string()),
                   pa.array([spec.license] * count, pa.string()), messages, pa.nulls(count, pa.string()),
                   pa.array(thinking), listed(np.zeros(count + 1, dtype=np.int64), pa.array([], pa.string())),
                   pa.nulls(count, pa.string()), provenance]
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA), taken

    def _source_ids(self, table: pa.Table, eligible: npt.NDArray[np.bool_]) -> pa.Array:
        """Each row's own id as text (``str`` of a string or an integer); a row with an id of another type, or one
        its JSON would escape as \\uXXXX, is left out of ``eligible``."""
        name = self.spec.mapping.id_field or "id"
        if name not in table.column_names:
            return pa.nulls(table.num_rows, pa.string())
        column = table.column(name).chunk(0)
        if pa.types.is_integer(column.type) or pa.types.is_null(column.type):
            return pc.cast(column, pa.string())
        if column.type != pa.string():
            eligible &= pc.is_null(column).to_numpy(zero_copy_only=False)
            return pa.nulls(table.num_rows, pa.string())
        if self.escapes_control:
            eligible &= ~holds_unicode_escaped(pc.fill_null(column, ""))
        return column


# --- the build ------------------------------------------------------------------------------------------------------


def file_parts(plan: Plan, workers: int) -> list[FilePart]:
    """The replay sources' file parts in priority order, cut for ``workers`` as the row path cuts them
    (``sources.source_parts``)."""
    parts = []
    for spec in plan.read.sources:
        for path in resolve_paths(spec, plan.read.base_dir):
            label = source_label(path, plan.read.base_dir)
            fmt = format_of(path, spec.format)
            assert isinstance(fmt, JsonLines)
            ranges = fmt.ranges(path, workers, label)
            if len(ranges) <= 1:
                parts.append(FilePart(spec, path, LineRange(0, path.stat().st_size, 1), label, True))
            else:
                parts += [FilePart(spec, path, span, label, False) for span in ranges]
    return parts


def _read_blocks(parts: list[FilePart], checker: Checker, turns: Turns) -> Iterator[Block | PartEnd]:
    """The blocks of every part in order, those of this process's turns read, each part followed by its end (a
    turn too)."""
    for part in parts:
        yield from PartReader(part, checker).blocks(turns)
        if turns.mine():
            yield PartEnd()


@dataclass
class StreamedPart:
    """A file part as the build sees it: its blocks, read on the readers' processes, from the stream of them all."""

    part: FilePart
    stream: Iterator[Block | PartEnd]

    @property
    def label(self) -> str:
        return self.part.label

    @property
    def spec(self) -> SourceSpec:
        return self.part.spec

    def blocks(self) -> Iterator[Block]:
        """The part's blocks; a file read as one part without a row is the error the row path gives."""
        any_row = False
        for item in self.stream:
            if isinstance(item, PartEnd):
                break
            any_row = any_row or item.holds_records()
            yield item
        self.part.check_rows(any_row)


def replay_parts(plan: Plan, checker: Checker) -> Generator[StreamedPart, None, None]:
    """The replay sources' file parts in priority order (cut as the row path cuts them, so the corpus is its), their
    blocks read on ``worker_count()`` processes (in this one, for one): block n of the stream of every
    part's blocks on reader n mod the readers', taken in order."""
    parts = file_parts(plan, worker_count())
    stream = on_turns(partial(_read_blocks, parts, checker), worker_count(), BLOCK_QUEUE_DEPTH)
    try:
        for part in parts:
            yield StreamedPart(part, stream)
    finally:
        stream.close()  # the readers ended now, whether the build got to the end or failed


def write_columnar(plan: Plan, checker: Checker, staging: Path, ledger: LedgerWriter, auditor: CorpusStats,
                   stream: TextIO) -> list[ShardInfo]:
    """The plan's replay rows read, screened, judged, split and written as Arrow batches (see the module)."""
    write = plan.write
    ids = UniqueIds()
    dedup: Dedup | None = checker.dedup
    shards = ShardWriter(staging, write.rows_per_shard, observe_batch=auditor.add_batch)
    progress = ProgressLine("read replay", stream=stream)
    fast = total = 0
    parts = replay_parts(plan, checker)
    try:
        for part in parts:
            label = part.label
            for block in part.blocks():
                rows = block.rows
                raw_ids = rows.column("id").to_pylist()
                assigned = ids.assign_all(raw_ids)
                verdicts: list[Verdict | None] = [None] * len(assigned)
                if dedup is not None and block.signatures is not None and rows.num_rows:
                    thinking = rows.column("thinking").to_pylist()
                    sources = rows.column("source").to_pylist()
                    keys = [dedup_key(flag, source, row_id)
                            for flag, source, row_id in zip(thinking, sources, assigned, strict=True)]
                    verdicts = dedup.judge(keys, dedup.index.decide(keys, block.signatures), None)
                skips = list(block.skips)
                keep = np.ones(rows.num_rows, dtype=bool)
                for index, verdict in enumerate(verdicts):
                    if verdict is not None:
                        keep[index] = False
                        skips.append((int(block.places[index]), Skipped(
                            part.spec.name,
                            RULE_REASONS[verdict.rule], f"{label}:{block.lines[index]}", verdict.detail,
                            id=raw_ids[index])))
                for _, skipped in sorted(skips, key=lambda item: item[0]):
                    ledger.write(skipped)
                kept_ids = [row_id for row_id, kept in zip(assigned, keep.tolist(), strict=True) if kept]
                kept = rows.filter(pa.array(keep)) if not keep.all() else rows
                splits = write.splitter.assign_ids(kept_ids)
                kept = kept.set_column(0, "id", pa.array(kept_ids, pa.string())).set_column(
                    ARROW_SCHEMA.get_field_index("split"), "split", splits)
                shards.write_batch(kept)
                fast += block.fast
                total += rows.num_rows + len(block.skips)
                progress.advance(rows.num_rows + len(block.skips))
    except BaseException:
        shards.abort()
        raise
    finally:
        parts.close()  # the readers ended
        ledger.close()
    progress.finish()
    print_paths(fast, total, stream)
    return shards.close()


def print_paths(kernel_rows: int, records: int, stream: TextIO) -> None:
    """The build's line of how many of its ``records`` (rows and skips) the kernels made, and the row path the rest
    (either engine prints it)."""
    print(f"columnar path: {kernel_rows:,} rows by the kernels, {records - kernel_rows:,} by the row path",
          file=stream)

