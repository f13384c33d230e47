"""One recipe source -> a stream of ``Conversation`` (kept rows) and ``Skipped`` (bad rows).

A source is read unit by unit (each file its globs match, or one hub split). Each unit gets its own
``RowNormaliser``, so the mapping is detected once per file. Provenance names files relative to the
recipe (it may be published), and locations read ``file:line`` (jsonl) or ``file#row`` (json,
parquet, hub).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Literal

from ..collector import rare_collections
from ..draws import take_priority
from ..errors import BadRow, CorpusError, Skipped
from ..recipe import match_source_pattern
from ..recipe.model import Mapping, Recipe, SourceKind, SourceSpec
from ..records import Conversation, Origin, Provenance, conversation_id
from ..secrets import redact_conversations
from .fold import Held, PrefixFold, folded_skip, let_out
from .formats import AUTO, Format, LineFormat, SplittableFormat, format_of
from .hub import hub_label, hub_provenance, iter_hub_rows
from .logs import LoggedExchange, ScannedExchange, read_exchange, scan_line
from .mappings import (
    TOOL_CHOICE_UNDEFINED,
    Layout,
    NormalisedRow,
    RowNormaliser,
    check_mapping,
    detect_layout,
    first_layout,
    row_object,
)
from .readers import PositionFilter, scanned_blocks
from .take import CountSelection, fraction_filter

ORIGIN: dict[str, Origin] = {"replay": "replay", "prompts": "prompt"}
_LOGGED = Layout("log", "")  # the layout of a file whose first row the fold's scan read (a logged request)
DEFAULT_MAPPING = Mapping()
_ITEM = itemgetter(1)  # a folded stream's item, without its place


@dataclass(frozen=True, slots=True)
class FileUnit:
    """One file or hub split of a source: how to read it and how to name its rows."""

    label: str
    rows: Callable[[PositionFilter | None], Iterator[tuple[int, object]]]
    separator: str  # ":" before a line number, "#" before a row index
    position_key: str  # provenance key of the position
    provenance: Provenance  # what every row of the unit records
    # its lines as the fold reads them (scan_line), a block at a time
    scanned: Callable[[], Iterator[list[tuple[int, object]]]] | None = None


def resolve_paths(spec: SourceSpec, base_dir: Path) -> list[Path]:
    """The files of a source: each path or glob resolved against ``base_dir`` and sorted; a file named twice
    (by two patterns, or through a symlink) is read once, where it first appears, as the recipe check counts it."""
    resolved: list[Path] = []
    seen: set[str] = set()
    for pattern in spec.paths:
        matches = match_source_pattern(base_dir, pattern)  # the rule `corpus validate` checks with
        if not matches:
            raise CorpusError(f"source '{spec.name}': path '{pattern}' matches no file "
                              f"(resolved against {base_dir})")
        for path in matches:
            real = os.path.realpath(path)
            if real not in seen:
                seen.add(real)
                resolved.append(path)
    return resolved


def iter_source(spec: SourceSpec, base_dir: Path) -> Iterator[Conversation | Skipped]:
    """Every row of one recipe source, normalised, with the source's take applied."""
    check_mapping(spec.mapping, spec.name)
    if spec.hub is not None:
        ref = spec.hub
        units = [FileUnit(hub_label(ref), lambda keep: iter_hub_rows(ref, spec.name, keep), "#", "source_row",
                       Provenance(hub=hub_provenance(ref)))]
    else:
        units = [file_unit(path, format_of(path, spec.format), source_label(path, base_dir))
                 for path in resolve_paths(spec, base_dir)]
    rows = _select(spec, units)
    return rows if spec.tool_choice_function is None else _tool_choice_defined(spec, rows)


def _tool_choice_defined(spec: SourceSpec, rows: Iterator[Conversation | Skipped]) -> Iterator[Conversation | Skipped]:
    """The rows, and at their end an error when the function the source's tool_choice names is defined by no
    row's tools, though rows have tools: a misspelt name, or the wrong source (the rows it lacks from are skipped
    as they come, ``tool_choice_undefined``; the build reads its prompt sources whole before the first request)."""
    defined = undefined = 0
    for row in rows:
        if isinstance(row, Skipped):
            undefined += row.reason == TOOL_CHOICE_UNDEFINED
        elif row.tools:
            defined += 1
        yield row
    if undefined and not defined:
        raise CorpusError(f"source '{spec.name}': tool_choice names the function '{spec.tool_choice_function}', "
                          f"which no row's tools define (rows with tools: {undefined:,}): the server would refuse "
                          "every request; name a function the rows' tools define, or remove tool_choice")


def prompt_stream(recipe: Recipe) -> Iterator[Conversation | Skipped]:
    """Every prompts source of a recipe, in dedup order (the prompt kept of duplicates is the first read);
    secrets redacted before the target sees them when the recipe asks for it."""
    prompts = chain.from_iterable(iter_source(spec, recipe.base_dir)
                                  for spec in recipe.sources_in_dedup_order("prompts"))
    return redact_conversations(prompts) if recipe.checks.redact_secrets else prompts


def source_parts(spec: SourceSpec, base_dir: Path, parts: int) -> list[Callable[[], Iterator[Conversation | Skipped]]]:
    """The source as consecutive parts that can be read in separate processes: reading the parts in
    order yields exactly what ``iter_source`` yields. Large plain .jsonl files are split into byte
    ranges; each other file is one part; a source with ``take.count`` (which ranks the whole source) or
    a hub source is a single part."""
    if spec.hub is not None or (spec.take is not None and spec.take.count is not None):
        return [lambda: iter_source(spec, base_dir)]
    check_mapping(spec.mapping, spec.name)
    paths = resolve_paths(spec, base_dir)
    if spec.fold.enabled and paths and logged_file(spec, paths[0], source_label(paths[0], base_dir)):
        return [lambda: iter_source(spec, base_dir)]  # the fold follows a chat across the source: one part
    thunks: list[Callable[[], Iterator[Conversation | Skipped]]] = []
    for path in paths:
        label = source_label(path, base_dir)
        fmt = format_of(path, spec.format)
        unit = file_unit(path, fmt, label)
        if not isinstance(fmt, SplittableFormat) or len(ranges := fmt.ranges(path, parts, label)) <= 1:
            thunks.append(partial(_select, spec, [unit]))
            continue
        for span in ranges:
            part = FileUnit(label, partial(fmt.range_rows, path, span), unit.separator, unit.position_key,
                            unit.provenance)
            thunks.append(partial(_select, spec, [part]))
    return thunks


@dataclass(frozen=True, slots=True)
class PackSpec(SourceSpec):
    """An eval pack's file (no recipe names one): read as replay, except that a row needs no assistant turn, since
    it may end with the question the target answers."""


def normaliser_for(spec: SourceSpec) -> RowNormaliser:
    kind = "pack" if isinstance(spec, PackSpec) else spec.kind
    return RowNormaliser(spec.mapping, kind, spec.system_prompt, spec.repair, spec.tool_choice_function)


def iter_file(path: Path, *, source: str | None = None, kind: SourceKind | Literal["pack"] = "replay",
              fmt: str = AUTO, mapping: Mapping = DEFAULT_MAPPING) -> Iterator[Conversation | Skipped]:
    """One raw file, as ``corpus audit FILE`` reads it; rows are named by the file's name. ``fmt``: a registered
    format's name, or ``auto`` (the file name's suffix tells)."""
    path = Path(path)
    paths = (str(path),)
    name = source or path.name
    spec = (PackSpec(name=name, kind="replay", paths=paths, mapping=mapping) if kind == "pack"
            else SourceSpec(name=name, kind=kind, paths=paths, mapping=mapping))
    check_mapping(mapping, spec.name)
    return _select(spec, [file_unit(path, format_of(path, fmt), path.name)])


def source_label(path: Path, base_dir: Path) -> str:
    """The path as the recipe gives it (relative); a file outside the recipe's tree by its name only,
    so provenance never carries an absolute local path."""
    try:
        return path.relative_to(base_dir).as_posix()
    except ValueError:
        return path.name


def file_unit(path: Path, fmt: Format, label: str) -> FileUnit:
    scanned = (partial(scanned_blocks, path, label, partial(fmt.lines, path, label), scan_line)
               if isinstance(fmt, LineFormat) else None)
    return FileUnit(label, partial(fmt.read, path, label), fmt.separator, fmt.position_key,
                    Provenance(source_file=label), scanned)


def _select(spec: SourceSpec, units: list[FileUnit]) -> Iterator[Conversation | Skipped]:
    if spec.fold.enabled and _may_be_logged(spec.mapping) and units:
        return _select_detected(spec, units)
    return _select_rows(spec, units)


def _select_rows(spec: SourceSpec, units: list[FileUnit]) -> Iterator[Conversation | Skipped]:
    take = spec.take
    if take is not None and take.count is not None:
        return _take_count(spec, units, take.count, take.seed)
    # chain hands the rows on in C (no generator frame per row); the units are opened one after the other.
    return chain.from_iterable(_normalise(spec, unit, fraction_filter(take, spec.name, unit.label))
                               for unit in units)


def _take_count(spec: SourceSpec, units: list[FileUnit], count: int,
                seed: int) -> Iterator[Conversation | Skipped]:
    """Exactly min(count, valid rows) rows, chosen by seeded priority among the valid ones (a row that
    ``consecutive_turns: split`` cut counts once and gives all its parts).

    Pass one reports bad rows and keeps the ``count`` best priorities (integers, not rows); pass two
    decodes only the chosen positions and yields them in file order.
    """
    selection = CountSelection(count)
    for index, unit in enumerate(units):
        for position, item in _checked_rows(spec, unit, None):
            if isinstance(item, Skipped):
                yield item
            else:
                selection.offer(take_priority(seed, spec.name, unit.label, position), index, position)
    for index, positions in sorted(selection.chosen().items()):
        yield from _normalise(spec, units[index], positions.__contains__)


def _checked_rows(spec: SourceSpec, unit: FileUnit,
                  keep: PositionFilter | None) -> Iterator[tuple[int, list[NormalisedRow] | Skipped]]:
    """Each row's conversations (several when a repair split it), or why it was skipped."""
    normalise = normaliser_for(spec)
    name, label, separator = spec.name, unit.label, unit.separator
    for position, row in unit.rows(keep):
        checked: list[NormalisedRow] | Skipped
        try:
            if isinstance(row, BadRow):
                raise row
            checked = normalise(row)
        except BadRow as bad:
            checked = Skipped(name, bad.reason, f"{label}{separator}{position}", bad.detail)
        yield position, checked


def _normalise(spec: SourceSpec, unit: FileUnit, keep: PositionFilter | None) -> Iterator[Conversation | Skipped]:
    for position, rows in _checked_rows(spec, unit, keep):
        if isinstance(rows, Skipped):
            yield rows
            continue
        for row in rows:
            yield conversation_of(spec, unit, position, row)


def conversation_of(spec: SourceSpec, unit: FileUnit, position: int, row: NormalisedRow,
                  folded_requests: int | None = None) -> Conversation:
    line, index = (position, None) if unit.position_key == "source_line" else (None, position)
    provenance = replace(unit.provenance, source_line=line, source_row=index, source_part=row.part,
                         source_id=row.source_id, reference_answer=row.reference_answer, served=row.served,
                         folded_requests=folded_requests)
    return Conversation(
        id=conversation_id(spec.name, row.messages, tools=row.tools),
        source=spec.name,
        origin=ORIGIN[spec.kind],
        messages=row.messages,
        task=spec.task,
        license=spec.license,
        flags=row.flags,
        provenance=provenance,
        tools=row.tools,
    )


def _may_be_logged(mapping: Mapping) -> bool:
    """Whether a source's rows may be logged exchanges: its mapping names the log style, or detects the layout."""
    return mapping.style == "log" or (mapping.style == "auto" and not mapping.field)


def logged_file(spec: SourceSpec, path: Path, label: str) -> bool:
    """Whether a source's first file is logged exchanges (``_peek`` tells the same as the source is read)."""
    if not _may_be_logged(spec.mapping):
        return False
    if spec.mapping.style == "log":
        return True
    layout = first_layout(format_of(path, spec.format).objects(path, label), spec.mapping)
    return layout is not None and layout.style == "log"


class _Gate:
    """A position filter that keeps every row until it is given the filter to apply (``keep``): the first file is
    opened once, its first rows read to tell its layout, and the take's filter applies from then on."""

    def __init__(self) -> None:
        self.keep: PositionFilter | None = None

    def __call__(self, position: int) -> bool:
        return self.keep is None or self.keep(position)


def _peek(spec: SourceSpec, unit: FileUnit) -> tuple[bool, FileUnit]:
    """Whether the source is logged exchanges (the mapping says so, or the first row of its first file that shows a
    layout is one), and the unit to read that file through: its first read goes on from the rows read to tell."""
    gate = _Gate()
    rows = unit.rows(gate)
    peeked: list[tuple[int, object]] = []
    logged = spec.mapping.style == "log"
    if not logged:
        for position, row in rows:
            peeked.append((position, row))
            if isinstance(row, dict) and (layout := detect_layout(row, spec.mapping)) is not None:
                logged = layout.style == "log"
                break
    opened = [True]

    def resumed(keep: PositionFilter | None) -> Iterator[tuple[int, object]]:
        if not opened:
            return unit.rows(keep)  # a second read (a count take's second pass): the file again
        opened.clear()
        gate.keep = keep
        return chain((item for item in peeked if keep is None or keep(item[0])), rows)
    return logged, replace(unit, rows=resumed)


def _select_detected(spec: SourceSpec, units: list[FileUnit]) -> Iterator[Conversation | Skipped]:
    """The source read as logged exchanges or as rows, as its first file tells (opened when the stream starts)."""
    logged, first = _peek(spec, units[0])
    units = [first, *units[1:]]
    yield from _select_logged(spec, units) if logged else _select_rows(spec, units)


def _select_logged(spec: SourceSpec, units: list[FileUnit]) -> Iterator[Conversation | Skipped]:
    """A logged source's conversations, each chat's requests folded into one (``sources.fold``); the take then
    chooses among conversations by the position of the request that ends each."""
    take = spec.take
    if take is not None and take.count is not None:
        selection = CountSelection(take.count)
        for (index, position), item in _folded(spec, units):
            if isinstance(item, Skipped):
                yield item
            else:
                selection.offer(take_priority(take.seed, spec.name, units[index].label, position), index, position)
        chosen = selection.chosen()
        yield from (item for (index, position), item in _folded(spec, units)
                    if isinstance(item, Conversation) and position in chosen.get(index, ()))
        return
    filters = [fraction_filter(take, spec.name, unit.label) for unit in units]
    if not any(filters):  # every conversation kept: handed on in C
        yield from map(_ITEM, _folded(spec, units))
        return
    for (index, position), item in _folded(spec, units):
        keep = filters[index]
        if keep is None or isinstance(item, Skipped) or keep(position):
            yield item


def _folded(spec: SourceSpec, units: list[FileUnit]) -> Iterator[tuple[tuple[int, int], Conversation | Skipped]]:
    """Every row of the source in order, each with (its unit, its position), the requests of each logged chat
    folded into its last one; a request folded into a later one is never normalised. The collector runs rarely
    meanwhile: the open chats' rows are many live objects that a collection would walk again and again."""
    with rare_collections():
        yield from _folded_rows(spec, units)


def _folded_rows(spec: SourceSpec, units: list[FileUnit]) -> Iterator[tuple[tuple[int, int], Conversation | Skipped]]:
    fold: PrefixFold[tuple[int, int]] = PrefixFold(spec.fold.max_open)
    normalisers = [normaliser_for(spec) for _ in units]
    prefixes = [f"{unit.label}{unit.separator}" for unit in units]  # a location is its unit's prefix and position

    def location(tag: tuple[int, int]) -> str:
        return f"{prefixes[tag[0]]}{tag[1]}"

    def conversations(held: Held[tuple[int, int]]) -> Iterator[tuple[tuple[int, int], Conversation | Skipped]]:
        index, position = held.tag
        try:
            rows = let_out(normalisers[index], held)
        except BadRow as bad:
            yield held.tag, Skipped(spec.name, bad.reason, location(held.tag), bad.detail)
            return
        for row in rows:
            yield held.tag, conversation_of(spec, units[index], position, row,
                                          held.requests if held.requests > 1 else None)

    name = spec.name
    for index, unit in enumerate(units):
        normalise = normalisers[index]
        prefix = prefixes[index]
        for block in unit.scanned() if unit.scanned is not None else map(_alone, unit.rows(None)):
            for position, row in block:
                tag = (index, position)
                logged: LoggedExchange | ScannedExchange
                if type(row) is ScannedExchange and (normalise.layout is _LOGGED or normalise.layout is None):
                    normalise.layout, logged = _LOGGED, row  # a logged request, as the file's first row showed
                else:
                    try:
                        row = row.row() if isinstance(row, ScannedExchange) else row
                        if isinstance(row, BadRow):
                            raise row
                        if normalise.layout_of(row).style != "log":  # another file of the source: read as it is
                            yield from ((tag, conversation_of(spec, unit, position, part)) for part in normalise(row))
                            continue
                        logged = read_exchange(row_object(row))
                    except BadRow as bad:
                        yield tag, Skipped(name, bad.reason, f"{prefix}{position}", bad.detail)
                        continue
                for held, folded in fold.add(logged, tag):
                    if folded:
                        yield held.tag, folded_skip(name, location(held.tag), f"{prefix}{position}")
                    else:
                        yield from conversations(held)
    for held in fold.close():
        yield from conversations(held)


def _alone(item: tuple[int, object]) -> list[tuple[int, object]]:
    """A row of a unit the fold reads row by row, as a block of its own."""
    return [item]
