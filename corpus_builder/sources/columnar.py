"""The columnar replay path's reading and mapping kernels (issue 42): a .jsonl file part's lines in blocks, parsed by
pyarrow, and their turn lists mapped, think blocks split and the row's canonical key written as Arrow arrays, with
the rules of the row path (``sources.mappings``, ``records``) in vectorised form; the lines and rows they do not take
are read by the row path (``RowPath``), in their place. ``assemble.columnar`` drives them (see its module).

A line is the row path's when it holds a byte below 0x20 (JSON allows none in a string unescaped), does not start
with ``{`` or end with ``}``, or holds ``NaN`` or ``Infinity`` where its block parses to a floating point field
(pyarrow reads those literals, orjson refuses them); lines pyarrow refuses together (a field of two types, a key
twice, bytes that are not UTF-8, a lone surrogate) are halved until the line it refuses is alone.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from ..errors import BadRow, Skipped
from ..recipe.model import SourceSpec
from ..records import REASONING_KEYS, THINK_CLOSE, THINK_OPEN, Conversation
from ..rows import string_buffers
from .mappings import CALL_SPEAKERS, ROLE_ALIASES, RowNormaliser
from .readers import LineRange, decode_lines
from .source import FileUnit, conversation_of, normaliser_for

# Lines read and parsed at once: a couple of thousand rows. A reader's three threads hold a few blocks each (the
# bytes, the parsed table, the mapped rows): at 8 MB its peak RSS was 1.35x the one thread's, at 4 MB 1.05x, for the
# same CPU (200k rows, BENCHMARKS.md).
BLOCK_BYTES = 4 << 20
_REFUSED_RUN = 1  # lines the parser refuses together are halved down to this many, then read by the row path
# What str.isspace() and str.strip() call whitespace (tests/assemble/test_columnar.py checks it against Python).
WHITESPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
              "\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
ROLES = ("system", "user", "assistant")
# a call speaker's value is the JSON of tool calls (``mappings.CALL_SPEAKERS``): the row path's
_SPEAKERS = [speaker for speaker, role in ROLE_ALIASES.items() if role in ROLES and speaker not in CALL_SPEAKERS]
_SPEAKER_ROLES = np.array([ROLES.index(ROLE_ALIASES[speaker]) for speaker in _SPEAKERS], dtype=np.int8)
ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT = 0, 1, 2
# What pyarrow reads as a number and orjson refuses (a lone surrogate both refuse): looked for in a block whose
# parsed table holds a floating point field.
_NON_FINITE = (b"NaN", b"Infinity")
# The characters orjson escapes with a backslash (the kernels escape them), and those it writes as \\uXXXX (the row
# path's).
_JSON_ESCAPES = (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"), ("\b", "\\b"),
                 ("\f", "\\f"))
# How JSON escapes a control character (\\u000X, \\u001X): one scan of a block, a third of the time of a substring
# test for each.
_CONTROL_ESCAPE = re.compile(rb"\\u00[01]")
_UNICODE_ESCAPED = np.zeros(256, dtype=bool)
_UNICODE_ESCAPED[[*range(0x00, 0x08), 0x0b, *range(0x0e, 0x20)]] = True
# The bytes that start a character str.strip() keeps, by themselves: every ASCII byte but whitespace.
_SOLID = np.zeros(256, dtype=bool)
_SOLID[:0x80] = True
_SOLID[[ord(char) for char in WHITESPACE if char.isascii()]] = False


# --- reading: blocks of whole lines of one file part ---------------------------------------------------------------


def part_blocks(path: Path, span: LineRange) -> Iterator[tuple[int, bytes]]:
    """The lines of a range of a file in blocks of whole lines, each with its first line's number in the file."""
    with path.open("rb") as handle:
        handle.seek(span.start)
        line = span.first_line
        pending = b""
        left = span.end - span.start
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
        return cls(data, starts, ends, disputed, _CONTROL_ESCAPE.search(data) is not None)

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


# A block's first line, its lines, and the runs of them pyarrow parsed (``parsed_block``).
ParsedBlock = tuple[int, Lines, list[tuple[npt.NDArray[np.int64], pa.Table]]]


def parsed_block(first_line: int, data: bytes) -> ParsedBlock:
    """A block's lines, and the runs of them pyarrow parsed (``Lines.parsed``)."""
    lines = Lines.of(data)
    candidates = np.flatnonzero(~lines.disputed)
    return first_line, lines, list(lines.parsed(candidates)) if len(candidates) else []


# --- the row path, for the rows a kernel does not take ----------------------------------------------------------


class RowPath:
    """One file part's rows on the row path, in order, by the part's own normaliser (its layout is fixed by the
    first row that shows one, whichever path that row takes)."""

    def __init__(self, spec: SourceSpec, unit: FileUnit) -> None:
        self.spec = spec
        self.unit = unit
        self.normalise: RowNormaliser = normaliser_for(spec)

    def rows(self, position: int, line: bytes) -> list[Conversation | Skipped]:
        """What the row path makes of one line (nothing for a blank line)."""
        spec, unit = self.spec, self.unit
        made: list[Conversation | Skipped] = []
        for row in decode_lines([line]):
            try:
                if isinstance(row, BadRow):
                    raise row
                made += [conversation_of(spec, unit, position, part) for part in self.normalise(row)]
            except BadRow as bad:
                made.append(Skipped(spec.name, bad.reason, f"{unit.label}{unit.separator}{position}", bad.detail))
        return made


# --- the kernels --------------------------------------------------------------------------------------------------


def json_escaped(texts: pa.Array) -> pa.Array:
    """Each text (no nulls) as orjson writes it inside a JSON string's quotes (texts holding a character it writes
    as ``\\uXXXX`` are the row path's): the texts that hold a character to escape, found by one pass over the
    buffer, are escaped by pyarrow's replacements, the others kept as they are."""
    offsets, data = string_buffers(texts)
    if data is None or not len(texts):
        return texts
    raw = np.frombuffer(data, dtype=np.uint8)[offsets[0]:offsets[-1]]
    # every control byte, not only those escaped with a backslash (replacing nothing in a text costs nothing): three
    # comparisons cost a sixth of a table lookup per byte
    to_escape = raw < 0x20
    to_escape |= raw == ord('"')
    to_escape |= raw == ord("\\")
    found = np.flatnonzero(to_escape)
    if not len(found):
        return texts
    mask = pa.array(_holding(offsets, found))
    chosen = pc.filter(texts, mask)
    for plain, escaped in _JSON_ESCAPES:
        chosen = pc.replace_substring(chosen, plain, escaped)
    return pc.replace_with_mask(texts, mask, chosen)


def json_string(texts: pa.Array) -> pa.Array:
    """Each text as orjson writes it in a JSON document, quotes included."""
    return pc.binary_join_element_wise('"', json_escaped(texts), '"', "")


def joined_pieces(pieces: list[pa.Array], offsets: npt.NDArray[np.int64]) -> pa.Array:
    """Per row, its items' pieces end to end: item i's ``pieces[0][i]``, ``pieces[1][i]``... (``offsets``: each row's
    items). Two copies: each item's pieces joined element-wise, then each row's items (measured with pyarrow 26: 2.4x
    faster than interleaving the pieces by a concatenation and a take before one join)."""
    return pc.binary_join(listed(offsets, pc.binary_join_element_wise(*pieces, "")), "")


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
    offsets, data = string_buffers(texts)
    if data is None:
        return np.zeros(len(texts), dtype=bool)
    raw = np.frombuffer(data, dtype=np.uint8)[offsets[0]:offsets[-1]]
    control = np.flatnonzero(raw < 0x20)  # few: the table looked up for them alone, not for every byte
    return _holding(offsets, control[_UNICODE_ESCAPED[raw[control]]])


def _holding(offsets: npt.NDArray[np.int32], found: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Which texts (``offsets``: a string array's) hold one of the bytes ``found`` (places from its first text's
    start)."""
    held = np.zeros(len(offsets) - 1, dtype=bool)
    held[np.searchsorted(offsets, found + offsets[0], side="right") - 1] = True
    return held


def holds_tags(texts: pa.Array, tags: tuple[str, ...]) -> list[npt.NDArray[np.bool_]]:
    """Whether each text holds each of ``tags`` (ASCII, all ending in one byte, e.g. ``>``): that byte found in the
    buffer in one pass and the bytes before it compared, a few times cheaper than a substring search per tag over
    every text."""
    offsets, data = string_buffers(texts)
    held = [np.zeros(len(texts), dtype=bool) for _ in tags]
    if data is None or not len(texts):
        return held
    raw = np.frombuffer(data, dtype=np.uint8)[:offsets[-1]]
    patterns = [np.frombuffer(tag.encode(), dtype=np.uint8) for tag in tags]
    last = np.flatnonzero(raw[offsets[0]:] == patterns[0][-1]) + offsets[0]
    text_of_last = np.searchsorted(offsets, last, side="right") - 1
    for pattern, flags in zip(patterns, held, strict=True):
        first = last - (len(pattern) - 1)
        inside = first >= offsets[text_of_last]  # room for the whole tag in the text
        first, text = first[inside], text_of_last[inside]
        found = np.ones(len(first), dtype=bool)
        for place, byte in enumerate(pattern[:-1].tolist()):
            found &= raw[first + place] == byte
        flags[text[found]] = True
    return held


def holds_text(texts: pa.Array) -> npt.NDArray[np.bool_]:
    """Whether each text (no nulls) keeps a character through ``str.strip()``: one whose first byte is ASCII and not
    whitespace does (most texts, told by a lookup of their first bytes), the others are trimmed to tell (trimming
    every text copies them all)."""
    offsets, data = string_buffers(texts)
    held = np.zeros(len(texts), dtype=bool)
    if data is None:
        return held
    starts = offsets[:-1]
    nonempty = np.flatnonzero(offsets[1:] > starts)
    held[nonempty] = _SOLID[np.frombuffer(data, dtype=np.uint8)[starts[nonempty]]]
    others = nonempty[~held[nonempty]]
    if len(others):
        held[others] = pc.greater(pc.binary_length(trimmed(texts.take(pa.array(others)))), 0).to_numpy(
            zero_copy_only=False)
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
    """The turns of a block's turn lists, speakers mapped to roles, an assistant turn's reasoning from its reasoning
    field (``reasoning``, ``reasoning_content`` or ``thinking``) or its think block; None when their type is not a
    list of objects with string speakers and texts. ``escapes_control``: whether the block's JSON may
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
    # a turn's own reasoning: the first of its reasoning fields that is not null (``mappings._turn_reasoning``)
    given = pa.nulls(len(turns), pa.string())
    for index, name in enumerate(names):
        field = pc.struct_field(turns, [index])
        if name in REASONING_KEYS and field.type in (pa.string(), pa.null()):
            given = pc.coalesce(given, field.cast(pa.string()))
        elif name not in (role_key, content_key):  # another field, or reasoning that is not text: the row path's
            bad |= pc.is_valid(field).to_numpy(zero_copy_only=False)
    content = pc.fill_null(content, "")
    if escapes_control:
        bad |= holds_unicode_escaped(content) | holds_unicode_escaped(pc.fill_null(given, ""))
    assistant = roles == ROLE_ASSISTANT
    closes, opens = (assistant & held for held in holds_tags(content, (THINK_CLOSE, THINK_OPEN)))
    bad |= assistant & opens & ~closes  # unclosed: the check decides on the row path
    split = assistant & closes
    reasoning = pa.nulls(len(content), pa.string())
    if split.any():
        content, reasoning = _split_think(content, split)
    # reasoning on another role's turn is kept by the row path, but dedup's text leaves it out: the row path's
    bad |= ~assistant & pc.is_valid(given).to_numpy(zero_copy_only=False)
    if given.null_count < len(given):
        # ``records.make_message``: a reasoning field that is not empty wins over the think block, stripped (to
        # none when nothing is left); an empty one leaves the think block's
        stated = pc.greater(pc.binary_length(given), 0)
        own = trimmed(given)
        own = pc.if_else(pc.greater(pc.binary_length(own), 0), own, pa.scalar(None, pa.string()))
        reasoning = pc.if_else(pc.fill_null(stated, False), own, reasoning)
    present = holds_text(content)
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
    up_to_open = pc.list_element(opened, 0)  # the whole text before the closing tag where no opening tag is
    before = pc.if_else(has_open, up_to_open, "")
    # after the opening tag where there is one, else from the start
    inside = pc.replace_with_mask(up_to_open, has_open, pc.list_flatten(pc.list_slice(opened, 1, 2)))
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
    leading_system = first == ROLE_SYSTEM
    place = np.arange(len(roles), dtype=np.int64) - offsets[:-1][parents] - leading_system[parents]
    expected = np.where(place % 2 == 0, ROLE_USER, ROLE_ASSISTANT)
    wrong = (roles != expected) & (place >= 0)
    ok = ~per_row(wrong, parents, rows)
    last = np.where(lengths > 0, roles[np.maximum(offsets[1:] - 1, 0)] if len(roles) else 0, -1)
    ended: npt.NDArray[np.bool_] = ok & (last == ROLE_ASSISTANT) & (lengths - leading_system >= 2)
    return ended


def hashed_ids(keys: pa.Array, source: str) -> list[str]:
    """``records.conversation_id`` of each row's canonical turns ``keys`` (what ``content_key`` writes)."""
    offsets, data = string_buffers(keys)
    view = memoryview(data) if data is not None else memoryview(b"")
    sha256 = hashlib.sha256
    prefix = b"corpus-conv\0%s\0\0" % source.encode()
    return [sha256(prefix + sha256(view[start:end]).digest()).hexdigest()[:20]
            for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]


def listed(offsets: npt.NDArray[np.int64], values: pa.Array) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)
