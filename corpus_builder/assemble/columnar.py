"""The columnar replay path (issue 42): replayed rows that need no repair go from the file's bytes to the shards as
Arrow batches, never as ``Conversation`` objects.

A build whose plan this path covers (``uncovered`` says why not, else None: a replay of .jsonl files of turn
lists, with the exact dedup at most; the build's docs page lists what it does not cover) reads each replay source's
files, cut into parts as the row path cuts them, in blocks of whole lines. In a block, the lines a kernel can take
are parsed by pyarrow's JSON reader and mapped, checked, identified, deduplicated, split and written with pyarrow
compute kernels and numpy over the buffers; per row Python runs only where no kernel exists and it is cheap
(hashlib over bytes a kernel built, a dict of the ids seen). Every other line drops to the row path
(``sources.source``'s normaliser of the same file part, in order), and its rows join the block's in their place:
the corpus, the ledger and audit.json are byte for byte the row path's.

A line drops to the row path when it holds a byte below 0x20 (JSON allows none in a string unescaped), does not
start with ``{`` or end with ``}``, or holds ``NaN`` or ``Infinity`` where its block parses to a floating point
field (pyarrow reads those literals, orjson refuses them); lines pyarrow refuses together (a field of two types, a
key twice, bytes that are not UTF-8, a lone surrogate) are halved until the line it refuses is alone, and that line
drops. A row drops when its turns need what only the row path does: a speaker that is not system, user or
assistant (tool traffic), a turn with a field beside the speaker and the text, a text that is not a string, an empty
turn, an unclosed think block, a role order to repair, ``tools``, an id that is not a string or an integer, or a
control character the row's JSON key would escape as ``\\uXXXX``. Think blocks are split by kernels. The rows
through each path are counted in the build's progress lines.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TextIO

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from ..errors import BadRow, Skipped
from ..layout import ShardInfo
from ..progress import ProgressLine
from ..recipe.model import SourceSpec
from ..records import THINK_CLOSE, THINK_OPEN, Conversation
from ..rows import ARROW_SCHEMA, MESSAGE_TYPE, TOOL_CALL_TYPE, conversations_to_batch
from ..screen.checks import Checker
from ..screen.dedup import Dedup, dedup_key
from ..screen.ids import UniqueIds
from ..screen.near_dedup import Signatures
from ..screen.normalise import CHUNK_BYTES, NormalisedChunk, normalise_arrow_texts
from ..screen.screened import RULE_REASONS, Verdict
from ..sources.formats import JsonLines, format_of
from ..sources.mappings import ROLE_ALIASES, TURN_KEYS, RowNormaliser
from ..sources.parallel import worker_count
from ..sources.readers import decode_lines
from ..sources.source import _conversation, _file_unit, _logged_file, _normaliser, _Unit, resolve_paths
from ..stats.corpus import CorpusStats
from .plan import Plan
from .shards import LedgerWriter, ShardWriter

# CORPUS_COLUMNAR=0 sends every row down the row path (the benchmarks' and the tests' other side).
SWITCH = "CORPUS_COLUMNAR"
BLOCK_BYTES = 8 << 20  # lines read and parsed at once: a few thousand rows
_REFUSED_RUN = 1  # lines the parser refuses together are halved down to this many, then read by the row path
# What str.isspace() and str.strip() call whitespace (tests/assemble/test_columnar.py checks it against Python).
WHITESPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
              "\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
ROLES = ("system", "user", "assistant")
_SPEAKERS = [speaker for speaker, role in ROLE_ALIASES.items() if role in ROLES]
_SPEAKER_ROLES = np.array([ROLES.index(ROLE_ALIASES[speaker]) for speaker in _SPEAKERS], dtype=np.int8)
_SYSTEM, _USER, _ASSISTANT = 0, 1, 2
# What pyarrow reads as a number and orjson refuses (a lone surrogate both refuse): looked for in a block whose
# parsed table holds a floating point field.
_NON_FINITE = (b"NaN", b"Infinity")
# The characters orjson escapes with a backslash (the kernels escape them), and those it writes as \\uXXXX (the row
# path's).
_JSON_ESCAPES = (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"), ("\b", "\\b"),
                 ("\f", "\\f"))
_ESCAPED = np.zeros(256, dtype=bool)
_ESCAPED[[ord(plain) for plain, _ in _JSON_ESCAPES]] = True
_UNICODE_ESCAPED = np.zeros(256, dtype=bool)
_UNICODE_ESCAPED[[*range(0x00, 0x08), 0x0b, *range(0x0e, 0x20)]] = True


def uncovered(plan: Plan, in_tokens: bool, has_pack: bool) -> str | None:
    """Why the columnar path does not run this plan (it then runs on the row path), or None when it does."""
    checks = plan.screen.checks
    reasons = [
        (os.environ.get(SWITCH, "1") == "0", f"{SWITCH}=0"),
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
            reasons.append((spec.fold.enabled and bool(paths) and _logged_file(
                spec, paths[0], _label(paths[0], plan.read.base_dir)), f"source {spec.name}: a serving log"))
    return next((reason for applies, reason in reasons if applies), None)


# --- reading: blocks of whole lines of one file part ---------------------------------------------------------------


def part_blocks(path: Path, start: int, end: int, first_line: int) -> Iterator[tuple[int, bytes]]:
    """The lines of bytes ``start`` to ``end`` of a file (its line ``first_line`` first) in blocks of whole lines,
    each with its first line's number in the file."""
    with path.open("rb") as handle:
        handle.seek(start)
        line = first_line
        pending = b""
        left = end - start
        while left > 0:
            block = handle.read(min(left, BLOCK_BYTES))
            if not block:
                break
            left -= len(block)
            cut = block.rfind(b"\n") + 1
            if not cut:
                pending += block
                continue
            whole, pending = pending + block[:cut], block[cut:]
            yield line, whole
            line += whole.count(b"\n")
        if pending:
            yield line, pending + b"\n"


@dataclass
class Lines:
    """A block's lines: line i is ``data[starts[i]:ends[i]]`` (without its newline); ``disputed``: the lines a
    kernel does not take."""

    data: bytes
    starts: npt.NDArray[np.int64]
    ends: npt.NDArray[np.int64]
    disputed: npt.NDArray[np.bool_]
    escapes_control: bool  # the JSON escapes a control character somewhere (``\\u000X``, ``\\u001X``)

    @classmethod
    def of(cls, data: bytes) -> Lines:
        buffer = np.frombuffer(data, dtype=np.uint8)
        low = np.flatnonzero(buffer < 0x20)  # the newlines, and the control bytes no line should hold
        newline = buffer[low] == ord("\n")
        ends = low[newline].astype(np.int64)
        starts = np.concatenate(([0], ends[:-1] + 1)).astype(np.int64)
        # a line may end in a carriage return (a file written on Windows): JSON's whitespace, not the row's
        returns = np.zeros(len(ends), dtype=bool)
        returns[ends > starts] = buffer[ends[ends > starts] - 1] == ord("\r")
        last = ends - returns
        disputed = last <= starts  # an empty line is no row
        nonempty = ~disputed
        disputed[nonempty] = (buffer[starts[nonempty]] != ord("{")) | (buffer[last[nonempty] - 1] != ord("}"))
        control = low[~newline]
        control = control[~np.isin(control, ends[returns] - 1)]
        disputed[np.searchsorted(ends, control)] = True
        return cls(data, starts, ends, disputed, b"\\u000" in data or b"\\u001" in data)

    def non_finite(self, indices: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Which of the lines ``indices`` hold ``NaN`` or ``Infinity`` (in a string or not)."""
        held = np.zeros(len(self.starts), dtype=bool)
        for pattern in _NON_FINITE:
            found = self.data.find(pattern)
            while found >= 0:
                line = int(np.searchsorted(self.ends, found))
                held[line] = True
                found = self.data.find(pattern, int(self.ends[line]))
        return held[indices]

    def line(self, index: int) -> bytes:
        return self.data[self.starts[index]:self.ends[index]]

    def parsed(self, indices: npt.NDArray[np.int64]) -> Iterator[tuple[npt.NDArray[np.int64], pa.Table]]:
        """The lines ``indices`` parsed by pyarrow (one row each), in runs of consecutive lines: lines it refuses
        together are halved until the refused run is a few lines, which go to the row path."""
        table = self._parse(indices)
        if table is not None and any(_floating(field.type) for field in table.schema):
            finite = ~self.non_finite(indices)  # the lines orjson refuses go to the row path
            if not finite.all():
                yield from self.parsed(indices[finite])
                return
        if table is not None:
            yield indices, table
        elif len(indices) > _REFUSED_RUN:
            half = len(indices) // 2
            yield from self.parsed(indices[:half])
            yield from self.parsed(indices[half:])

    def _parse(self, indices: npt.NDArray[np.int64]) -> pa.Table | None:
        if len(indices) == len(self.starts):
            data = self.data
        else:
            data = b"".join(self.data[start:end + 1] for start, end in zip(self.starts[indices].tolist(),
                                                                            self.ends[indices].tolist(), strict=True))
        try:
            # one thread, one block: on two busy cores pyarrow's threads cost more than they give (measured)
            table = pa_json.read_json(pa.BufferReader(data), read_options=pa_json.ReadOptions(
                use_threads=False, block_size=len(data) + 1))
            table.validate(full=True)  # strings that are not UTF-8 (the reader does not check)
        except pa.ArrowException:
            return None
        return table.combine_chunks() if table.num_rows == len(indices) else None


def _floating(kind: pa.DataType) -> bool:
    """Whether a type is, or holds, a floating point type."""
    if pa.types.is_floating(kind):
        return True
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _floating(kind.value_type)
    if pa.types.is_struct(kind):
        return any(_floating(kind.field(index).type) for index in range(kind.num_fields))
    return False


def parsed_block(first_line: int, data: bytes) -> tuple[int, Lines, list[tuple[npt.NDArray[np.int64], pa.Table]]]:
    """A block's lines, and the runs of them pyarrow parsed (``Lines.parsed``)."""
    lines = Lines.of(data)
    candidates = np.flatnonzero(~lines.disputed)
    return first_line, lines, list(lines.parsed(candidates)) if len(candidates) else []


# --- the row path, for the rows a kernel does not take ----------------------------------------------------------


class RowPath:
    """One file part's rows on the row path, in order, by the part's own normaliser (its layout is fixed by the
    first row that shows one, whichever path that row takes)."""

    def __init__(self, spec: SourceSpec, unit: _Unit) -> None:
        self.spec = spec
        self.unit = unit
        self.normalise: RowNormaliser = _normaliser(spec)

    def rows(self, position: int, line: bytes) -> list[Conversation | Skipped]:
        """What the row path makes of one line (nothing for a blank line)."""
        spec, unit = self.spec, self.unit
        made: list[Conversation | Skipped] = []
        for row in decode_lines([line]):
            try:
                if isinstance(row, BadRow):
                    raise row
                made += [_conversation(spec, unit, position, part) for part in self.normalise(row)]
            except BadRow as bad:
                made.append(Skipped(spec.name, bad.reason, f"{unit.label}{unit.separator}{position}", bad.detail))
        return made


# --- the kernels --------------------------------------------------------------------------------------------------


def json_escaped(texts: pa.Array) -> pa.Array:
    """Each text (no nulls) as orjson writes it inside a JSON string's quotes (texts holding a character it writes
    as ``\\uXXXX`` are the row path's): the texts that hold a character to escape, found by one lookup over the
    buffer, are escaped by pyarrow's replacements, the others kept as they are."""
    offsets = np.frombuffer(texts.buffers()[1], dtype=np.int32)[texts.offset:texts.offset + len(texts) + 1]
    data = texts.buffers()[2]
    if data is None or not len(texts):
        return texts
    found = np.flatnonzero(_ESCAPED[np.frombuffer(data, dtype=np.uint8)[offsets[0]:offsets[-1]]])
    if not len(found):
        return texts
    held = np.zeros(len(texts), dtype=bool)
    held[np.searchsorted(offsets, found + offsets[0], side="right") - 1] = True
    mask = pa.array(held)
    chosen = pc.filter(texts, mask)
    for plain, escaped in _JSON_ESCAPES:
        chosen = pc.replace_substring(chosen, plain, escaped)
    return pc.replace_with_mask(texts, mask, chosen)


def json_string(texts: pa.Array) -> pa.Array:
    """Each text as orjson writes it in a JSON document, quotes included."""
    return pc.binary_join_element_wise('"', json_escaped(texts), '"', "")


def joined_pieces(pieces: list[pa.Array], offsets: npt.NDArray[np.int64]) -> pa.Array:
    """Per row, its items' pieces end to end: item i's ``pieces[0][i]``, ``pieces[1][i]``... (``offsets``: each row's
    items). Three copies at memcpy's pace: a join of many arrays element-wise costs several times more."""
    count = len(pieces[0])
    order = (np.arange(len(pieces), dtype=np.int64)[None, :] * count
             + np.arange(count, dtype=np.int64)[:, None]).reshape(-1)
    interleaved = pa.concat_arrays(pieces).take(pa.array(order))
    return pc.binary_join(listed(offsets * len(pieces), interleaved), "")


def content_keys(roles: pa.Array, content: pa.Array, reasoning: pa.Array, offsets: npt.NDArray[np.int64]
                 ) -> pa.Array:
    """Each row's ``records.content_key`` of turns without tool traffic: the turns ``[role, content, reasoning]`` as
    orjson writes them, in brackets (``offsets``: each row's turns, at least one)."""
    first = np.zeros(len(roles), dtype=bool)
    first[offsets[:-1]] = True
    last = np.zeros(len(roles), dtype=bool)
    last[offsets[1:] - 1] = True
    opened = pc.binary_join_element_wise(pc.if_else(pa.array(first), "[", ","), '["', roles, '","', "")
    reasoned = pc.is_valid(reasoning)
    closed = pc.binary_join_element_wise(pc.if_else(reasoned, '"]', "]"), pc.if_else(pa.array(last), "]", ""), "")
    return joined_pieces([opened, json_escaped(content), pc.if_else(reasoned, '","', '",null'),
                          json_escaped(pc.fill_null(reasoning, "")), closed], offsets)


def holds_unicode_escaped(texts: pa.Array) -> npt.NDArray[np.bool_]:
    """Whether each text (no nulls) holds a character orjson writes as ``\\uXXXX``: one lookup over the buffer."""
    offsets = np.frombuffer(texts.buffers()[1], dtype=np.int32)[texts.offset:texts.offset + len(texts) + 1]
    data = texts.buffers()[2]
    if data is None:
        return np.zeros(len(texts), dtype=bool)
    found = np.flatnonzero(_UNICODE_ESCAPED[np.frombuffer(data, dtype=np.uint8)[offsets[0]:offsets[-1]]])
    held = np.zeros(len(texts), dtype=bool)
    held[np.searchsorted(offsets, found + offsets[0], side="right") - 1] = True
    return held


def trimmed(texts: pa.Array) -> pa.Array:
    """``str.strip()`` of each text."""
    return pc.utf8_trim(texts, characters=WHITESPACE)


def per_row(values: npt.NDArray[np.bool_], parents: npt.NDArray[np.int64], rows: int) -> npt.NDArray[np.bool_]:
    """Whether any of a row's turns is flagged in ``values``."""
    return np.bincount(parents[values], minlength=rows) > 0


@dataclass
class Turns:
    """The turns of a block's rows, flat, mapped: role codes, texts and reasoning, each turn's row."""

    roles: npt.NDArray[np.int8]
    content: pa.Array
    reasoning: pa.Array
    parents: npt.NDArray[np.int64]
    bad: npt.NDArray[np.bool_]  # a turn only the row path reads


def mapped_turns(lists: pa.ListArray, role_key: str, content_key: str, escapes_control: bool = True) -> Turns | None:
    """The turns of a block's turn lists, speakers mapped to roles and think blocks split out; None when their type
    is not a list of objects with string speakers and texts. ``escapes_control``: whether the block's JSON may
    escape a control character (``\\u000X``, ``\\u001X``), the only way a text holds one (raw, its line is the row
    path's)."""
    kind = lists.type
    if not pa.types.is_list(kind) or not pa.types.is_struct(kind.value_type):
        return None
    struct = kind.value_type
    names = [struct.field(index).name for index in range(struct.num_fields)]
    if role_key not in names or content_key not in names or any(
            struct.field(name).type != pa.string() for name in (role_key, content_key)):
        return None
    turns = lists.flatten()
    parents = pc.list_parent_indices(lists).to_numpy().astype(np.int64)
    speakers = pc.struct_field(turns, [names.index(role_key)])
    content = pc.struct_field(turns, [names.index(content_key)])
    codes = pc.index_in(speakers, value_set=pa.array(_SPEAKERS)).to_numpy(zero_copy_only=False)
    bad = np.isnan(codes) if codes.dtype.kind == "f" else np.zeros(len(codes), dtype=bool)
    codes = np.nan_to_num(codes, nan=0).astype(np.int64)
    roles = _SPEAKER_ROLES[codes]
    bad |= pc.is_null(content).to_numpy(zero_copy_only=False)
    for index, name in enumerate(names):
        if name not in (role_key, content_key):
            bad |= pc.is_valid(pc.struct_field(turns, [index])).to_numpy(zero_copy_only=False)
    content = pc.fill_null(content, "")
    if escapes_control:
        bad |= holds_unicode_escaped(content)
    assistant = roles == _ASSISTANT
    # the tags looked for in the assistant texts that hold "think>" (one pass over every text, then a few)
    tagged = np.flatnonzero(assistant & pc.match_substring(content, "think>").to_numpy(zero_copy_only=False))
    closes, opens = np.zeros(len(content), dtype=bool), np.zeros(len(content), dtype=bool)
    if len(tagged):
        candidates = content.take(pa.array(tagged))
        closes[tagged] = pc.greater_equal(pc.find_substring(candidates, THINK_CLOSE), 0).to_numpy(zero_copy_only=False)
        opens[tagged] = pc.greater_equal(pc.find_substring(candidates, THINK_OPEN), 0).to_numpy(zero_copy_only=False)
    bad |= assistant & opens & ~closes  # unclosed: the check decides on the row path
    split = assistant & closes
    reasoning = pa.nulls(len(content), pa.string())
    if split.any():
        content, reasoning = _split_think(content, split)
    present = pc.greater(pc.binary_length(trimmed(content)), 0).to_numpy(zero_copy_only=False)
    bad |= ~present & ~(assistant & pc.is_valid(reasoning).to_numpy(zero_copy_only=False))
    return Turns(roles.astype(np.int8), content, reasoning, parents, bad)


def _split_think(content: pa.Array, split: npt.NDArray[np.bool_]) -> tuple[pa.Array, pa.Array]:
    """``records.split_think`` of the texts ``split`` (each holds a closing tag): the text before the first closing
    tag is the reasoning (after the first opening tag, when one comes before it), the rest the content."""
    mask = pa.array(split)
    chosen = pc.filter(content, mask)
    halves = pc.split_pattern(chosen, THINK_CLOSE, max_splits=1)
    before_close, after_close = pc.list_element(halves, 0), pc.list_element(halves, 1)
    opened = pc.split_pattern(before_close, THINK_OPEN, max_splits=1)
    has_open = pc.equal(pc.list_value_length(opened), 2)
    before = pc.if_else(has_open, pc.list_element(opened, 0), "")
    # after the opening tag where there is one, else from the start
    inside = pc.replace_with_mask(pc.list_element(opened, 0), has_open, pc.list_flatten(pc.list_slice(opened, 1, 2)))
    new_content = trimmed(pc.binary_join_element_wise(before, after_close, ""))
    reasoning = trimmed(inside)
    reasoning = pc.if_else(pc.greater(pc.binary_length(reasoning), 0), reasoning, pa.scalar(None, pa.string()))
    return (pc.replace_with_mask(content, mask, new_content),
            pc.replace_with_mask(pa.nulls(len(content), pa.string()), mask, reasoning))


def role_order_ok(roles: npt.NDArray[np.int8], parents: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64]
                  ) -> npt.NDArray[np.bool_]:
    """Per row: [system] user assistant user assistant ... ending on an assistant turn (``check_role_order`` of a
    row without tool traffic)."""
    rows = len(offsets) - 1
    lengths = np.diff(offsets)
    first = np.where(lengths > 0, roles[np.minimum(offsets[:-1], max(len(roles) - 1, 0))] if len(roles) else 0, -1)
    leading_system = first == _SYSTEM
    place = np.arange(len(roles), dtype=np.int64) - offsets[:-1][parents] - leading_system[parents]
    expected = np.where(place % 2 == 0, _USER, _ASSISTANT)
    wrong = (roles != expected) & (place >= 0)
    ok = ~per_row(wrong, parents, rows)
    last = np.where(lengths > 0, roles[np.maximum(offsets[1:] - 1, 0)] if len(roles) else 0, -1)
    ended: npt.NDArray[np.bool_] = ok & (last == _ASSISTANT) & (lengths - leading_system >= 2)
    return ended


def hashed_ids(keys: pa.Array, source: str) -> list[str]:
    """``records.conversation_id`` of each row's canonical turns ``keys`` (what ``content_key`` writes)."""
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int32)[keys.offset:keys.offset + len(keys) + 1]
    data = keys.buffers()[2]
    view = memoryview(data) if data is not None else memoryview(b"")
    sha256 = hashlib.sha256
    prefix = b"corpus-conv\0%s\0\0" % source.encode()
    return [sha256(prefix + sha256(view[start:end]).digest()).hexdigest()[:20]
            for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]


def arrow_chunks(texts: pa.Array) -> Iterator[pa.Array]:
    """Consecutive slices of a string array of about ``CHUNK_BYTES`` each (``normalise.text_chunks``)."""
    offsets = np.frombuffer(texts.buffers()[1], dtype=np.int32)[texts.offset:texts.offset + len(texts) + 1]
    cuts = np.searchsorted(offsets, np.arange(offsets[0], offsets[-1], CHUNK_BYTES)[1:])
    bounds = [0, *np.unique(cuts).tolist(), len(texts)]
    for start, end in pairwise(bounds):
        if end > start:
            yield texts.slice(start, end - start)


def listed(offsets: npt.NDArray[np.int64], values: pa.Array) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)


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


class PartReader:
    """One file part of a replay source, read block by block (see the module)."""

    def __init__(self, spec: SourceSpec, path: Path, start: int, end: int, label: str, checker: Checker,
                 first_line: int = 1) -> None:
        self.spec = spec
        self.path, self.start, self.end = path, start, end
        self.next_line = first_line  # the part's first line; once read, the next part's
        self.label = label
        self.checker = checker
        self.row_path = RowPath(spec, _file_unit(path, format_of(path, spec.format), label))
        self.label_json = json_string(pa.array([label])).to_pylist()[0]
        self.any_row = False
        self.escapes_control = True  # the block's (``Lines.escapes_control``)

    def blocks(self) -> Iterator[Block]:
        """The part's blocks, read and parsed in this thread: on two busy cores a read-ahead thread cost more in
        hand-overs than it gained (BENCHMARKS.md)."""
        read = (parsed_block(first_line, data)
                for first_line, data in part_blocks(self.path, self.start, self.end, self.next_line))
        for first_line, lines, runs in read:
            yield self.block(first_line, lines, runs)
            self.next_line = first_line + len(lines.starts)

    def block(self, first_line: int, lines: Lines, runs: list[tuple[npt.NDArray[np.int64], pa.Table]]) -> Block:
        count = len(lines.starts)
        self.escapes_control = lines.escapes_control
        fast = np.zeros(count, dtype=bool)
        normaliser = self.row_path.normalise
        items: list[Conversation | Skipped] = []
        item_places: list[int] = []
        prefix = 0
        while normaliser.layout is None and prefix < count:  # the row path until a row fixes the part's layout
            self._row_path(first_line, lines, prefix, items, item_places)
            prefix += 1
        batches = []
        layout = normaliser.layout
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
                batches.append(batch)
                fast[run[taken]] = True
        self.any_row = self.any_row or bool(fast.any())
        fast[:prefix] = True  # read already
        for index in np.flatnonzero(~fast).tolist():
            self._row_path(first_line, lines, index, items, item_places)
        fast[:prefix] = False
        return self._joined(batches, np.flatnonzero(fast), items, item_places, first_line)

    def _row_path(self, first_line: int, lines: Lines, index: int, items: list[Conversation | Skipped],
                  places: list[int]) -> None:
        made = self.row_path.rows(first_line + index, lines.line(index))
        self.any_row = self.any_row or bool(made)
        items += made
        places += [index] * len(made)

    def _joined(self, batches: list[pa.RecordBatch], fast_places: npt.NDArray[np.int64],
                items: list[Conversation | Skipped], item_places: list[int], first_line: int) -> Block:
        """The kernels' rows and the row path's records of a block, screened, in line order."""
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
        roles = pc.struct_field(turns, [0])
        content = pc.struct_field(turns, [1])
        reasoning = pc.struct_field(turns, [2])
        with_reasoning = pc.and_(pc.equal(roles, "assistant"), pc.is_valid(reasoning))
        texts = pc.if_else(with_reasoning, pc.binary_join_element_wise(reasoning, content, "\n"), content)
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
        content = pc.filter(turns.content, mask)
        reasoning = pc.filter(turns.reasoning, mask)
        kept_offsets = np.concatenate(([0], np.cumsum(lengths[taken]))).astype(np.int64)
        messages = pa.ListArray.from_arrays(pa.array(kept_offsets.astype(np.int32)), pa.StructArray.from_arrays(
            [role_names, content, reasoning, pa.nulls(len(roles), pa.list_(TOOL_CALL_TYPE)),
             pa.nulls(len(roles), pa.string())], fields=list(MESSAGE_TYPE)), type=ARROW_SCHEMA.field("messages").type)
        keys = content_keys(role_names, content, reasoning, kept_offsets)
        ids = hashed_ids(keys, self.spec.name)
        thinking = per_row((roles == _ASSISTANT) & pc.is_valid(reasoning).to_numpy(zero_copy_only=False),
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


def replay_parts(plan: Plan, checker: Checker) -> Iterator[PartReader]:
    """The replay sources' file parts in priority order, as the row path cuts them (``sources.source_parts``)."""
    workers = worker_count()
    for spec in plan.read.sources:
        for path in resolve_paths(spec, plan.read.base_dir):
            label = _label(path, plan.read.base_dir)
            fmt = format_of(path, spec.format)
            assert isinstance(fmt, JsonLines)
            ranges = fmt.ranges(path, workers, label)
            if len(ranges) <= 1:
                yield WholeFile(spec, path, 0, path.stat().st_size, label, checker)
                continue
            first_line = 1
            for start, end in ranges:  # in order: a part starts at the line after the one before it
                part = PartReader(spec, path, start, end, label, checker, first_line)
                yield part
                first_line = part.next_line


class WholeFile(PartReader):
    """A file read as one part: a file without a row is the error the row path gives."""

    def blocks(self) -> Iterator[Block]:
        yield from super().blocks()
        if not self.any_row:
            for _ in format_of(self.path, self.spec.format).read(self.path, self.label):
                pass


def _label(path: Path, base_dir: Path) -> str:
    try:
        return path.relative_to(base_dir).as_posix()
    except ValueError:
        return path.name


def write_columnar(plan: Plan, checker: Checker, staging: Path, ledger: LedgerWriter, auditor: CorpusStats,
                   stream: TextIO) -> list[ShardInfo]:
    """The plan's replay rows read, screened, judged, split and written as Arrow batches (see the module)."""
    write = plan.write
    ids = UniqueIds()
    dedup: Dedup | None = checker.dedup
    shards = ShardWriter(staging, write.rows_per_shard, observe_batch=auditor.add_batch)
    progress = ProgressLine("read replay", stream=stream)
    fast = total = 0
    try:
        for part in replay_parts(plan, checker):
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
                    ARROW_SCHEMA.get_field_index("split"), "split", pa.array(splits, pa.string()))
                shards.write_batch(kept)
                fast += block.fast
                total += rows.num_rows + len(block.skips)
                progress.advance(rows.num_rows + len(block.skips))
    except BaseException:
        shards.abort()
        raise
    finally:
        ledger.close()
    progress.finish()
    print(f"columnar path: {fast:,} rows by the kernels, {total - fast:,} by the row path", file=stream)
    return shards.close()

