"""The positioned, safe YAML reader of recipes: plain JSON-like data, and where each key and value was written.

Nothing YAML can express beyond JSON gets in (no aliases, anchors, foreign tags or duplicate keys), and
every problem keeps its file, line, column and key path, so a user fixes a recipe in one round.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import CorpusError
from ..secrets import scrub_message

# A recipe is a page of settings; anything far bigger is a wrong file (or an attempt to exhaust memory).
MAX_RECIPE_BYTES = 1 << 20
# Nesting deeper than this has no meaning in a recipe and would only feed recursion.
MAX_DEPTH = 32

KeyPath = tuple[str | int, ...]
Mark = tuple[int, int]  # 1-based line and column

_YAML_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = frozenset(_YAML_TAG + name for name in ("str", "int", "float", "bool", "null"))
_COLLECTION_TAGS = frozenset({_YAML_TAG + "map", _YAML_TAG + "seq"})
_TIMESTAMP_TAG = _YAML_TAG + "timestamp"
_NON_SPECIFIC_TAG = "!"
_NO_ANCHORS = "recipes use no anchors or aliases"

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a recipe, located as precisely as the file allows."""

    file: str
    line: int | None
    column: int | None
    path: str  # key path such as sources[1].take.count; "" for the file as a whole
    message: str

    def __post_init__(self) -> None:
        # A problem quotes what the recipe says (a path that matches no file, a value the schema refuses, an
        # unknown key): a credential written there is removed here, so no way of showing a problem shows it.
        for name in ("file", "path", "message"):
            object.__setattr__(self, name, scrub_message(getattr(self, name)))

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


def format_key_path(parts: KeyPath) -> str:
    """("sources", 1, "take", "count") -> "sources[1].take.count"."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part.isidentifier():
            text += f".{part}" if text else part
        else:
            text += f"[{json.dumps(part)}]"
    return text




def read_recipe_text(path: Path, file: str) -> tuple[str | None, list[Problem]]:
    def fail(message: str, line: int | None = None, column: int | None = None) -> tuple[None, list[Problem]]:
        return None, [Problem(file, line, column, "", message)]

    try:
        with path.open("rb") as handle:  # one byte past the bound tells a huge file without reading it whole
            raw = handle.read(MAX_RECIPE_BYTES + 1)
    except FileNotFoundError:
        return fail("file not found")
    except IsADirectoryError:
        return fail("is a directory, not a recipe file")
    except OSError as error:
        return fail(f"cannot read the file: {error.strerror or error}")
    if len(raw) > MAX_RECIPE_BYTES:
        return fail(f"file is over {MAX_RECIPE_BYTES:,} bytes; a recipe is at most {MAX_RECIPE_BYTES:,} bytes")
    try:
        return raw.decode("utf-8-sig"), []
    except UnicodeDecodeError as error:
        line_start = raw.rfind(b"\n", 0, error.start) + 1
        return fail(
            f"not valid UTF-8 (byte 0x{raw[error.start]:02x}); save the recipe as UTF-8",
            raw.count(b"\n", 0, error.start) + 1,
            error.start - line_start + 1,
        )


def read_corpus_recipe_file(path: Path) -> tuple[str, dict[str, Any]]:
    """A built corpus's recipe.yaml, by the recipes' own reader: a corpus may come from anywhere (a download, a
    hand edit), and its recipe must not expand aliases, build Python objects or be read whole when it is huge.
    Its text and mapping, or a ``CorpusError`` naming the file with every problem."""
    text, problems = read_recipe_text(path, str(path))
    parsed = parse_yaml(text, str(path)) if text is not None else None
    if text is None or parsed is None or parsed.data is None or parsed.problems:
        raise CorpusError("the corpus recipe cannot be read as a plain YAML mapping", file=str(path),
                          details=[str(problem) for problem in (parsed.problems if parsed else problems)])
    return text, parsed.data


@dataclass
class Parsed:
    """Plain data from the YAML, and where each part of it was written."""

    data: Any
    problems: list[Problem]
    file: str
    value_marks: dict[KeyPath, Mark] = field(default_factory=dict)
    key_marks: dict[KeyPath, Mark] = field(default_factory=dict)
    # Values replaced or distrusted because of a YAML-level problem (alias, foreign tag): schema errors
    # inside them would only repeat that problem in a confusing way.
    poisoned: set[KeyPath] = field(default_factory=set)

    def locate(self, path: KeyPath, at_key: bool = False) -> Mark | tuple[None, None]:
        """Where path was written: its key when at_key (or for a mapping missing a key), else its value;
        the nearest written ancestor when the path itself was not written (e.g. a filled default)."""
        if at_key and path in self.key_marks:
            return self.key_marks[path]
        for depth in range(len(path), -1, -1):
            mark = self.value_marks.get(path[:depth])
            if mark is not None:
                return mark
        return None, None

    def problem(self, path: KeyPath, message: str, at_key: bool = False) -> Problem:
        line, column = self.locate(path, at_key)
        return Problem(self.file, line, column, format_key_path(path), message)

    def is_poisoned(self, path: KeyPath) -> bool:
        return any(path[: len(bad)] == bad for bad in self.poisoned)


def parse_yaml(text: str, file: str) -> Parsed:
    """YAML -> plain data with positions. data is None when nothing usable came out (problems say why)."""
    parsed = Parsed(None, [], file)
    loader = _Loader(text)
    try:
        data = _YamlBuilder(loader, parsed).document()
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        detail = error.problem or "invalid YAML"
        if error.context:
            detail += f" ({error.context})"
        parsed.problems.append(
            Problem(file, mark.line + 1 if mark else None, mark.column + 1 if mark else None, "",
                    f"YAML syntax error: {detail}")
        )
        return parsed
    except yaml.reader.ReaderError as error:
        line = text.count("\n", 0, error.position) + 1
        column = error.position - (text.rfind("\n", 0, error.position) + 1) + 1
        parsed.problems.append(Problem(file, line, column, "", f"YAML cannot read this file: {error.reason}"))
        return parsed
    finally:
        loader.dispose()
    if data is None:
        parsed.problems.append(Problem(file, None, None, "", "the recipe is empty"))
    elif not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else "a single value"
        parsed.problems.append(
            parsed.problem((), f"the top level must be a mapping of settings (name, target, sources, "
                               f"output), not {kind}")
        )
        data = None
    parsed.data = data
    return parsed


def _position(event: yaml.Event) -> Mark:
    """1-based line and column of an event (the parser, C or Python, marks every event it emits)."""
    mark = event.start_mark
    assert mark is not None
    return mark.line + 1, mark.column + 1


def _show_tag(tag: str) -> str:
    return "!!" + tag[len(_YAML_TAG):] if tag.startswith(_YAML_TAG) else tag


class _YamlBuilder:
    """Builds plain data straight from the parser's events, so nothing YAML can express beyond JSON gets
    in: aliases never expand (no alias bombs), anchors and foreign tags (!!python/object ...) are refused,
    duplicate keys are reported instead of silently overwritten, and every value keeps its position."""

    def __init__(self, loader: Any, parsed: Parsed) -> None:
        self.loader = loader
        self.parsed = parsed

    def refuse(self, path: KeyPath, event: yaml.Event, message: str, poison: bool = True) -> None:
        line, column = _position(event)
        self.parsed.problems.append(Problem(self.parsed.file, line, column, format_key_path(path), message))
        if poison:
            self.parsed.poisoned.add(path)

    def document(self) -> Any:
        self.loader.get_event()  # stream start
        if self.loader.check_event(yaml.StreamEndEvent):
            return None
        self.loader.get_event()  # document start
        data = self.node((), 0)
        self.loader.get_event()  # document end
        if not self.loader.check_event(yaml.StreamEndEvent):
            self.refuse((), self.loader.peek_event(),
                        "the file holds more than one YAML document ('---'); a recipe is one document",
                        poison=False)
        return data

    def node(self, path: KeyPath, depth: int) -> Any:
        event = self.loader.get_event()
        self.parsed.value_marks[path] = _position(event)
        if isinstance(event, yaml.AliasEvent):
            self.refuse(path, event, f"alias *{event.anchor} is not allowed: {_NO_ANCHORS}")
            return None
        if event.anchor is not None:
            self.refuse(path, event, f"anchor &{event.anchor} is not allowed: {_NO_ANCHORS}", poison=False)
        allowed = _SCALAR_TAGS if isinstance(event, yaml.ScalarEvent) else _COLLECTION_TAGS
        if event.tag not in (None, _NON_SPECIFIC_TAG) and event.tag not in allowed:
            self.refuse(path, event, f"tag {_show_tag(event.tag)} is not allowed: recipes are plain YAML")
            if isinstance(event, yaml.ScalarEvent):
                return event.value
        if isinstance(event, yaml.ScalarEvent):
            return self.scalar(path, event)
        if depth >= MAX_DEPTH:
            self.refuse(path, event, f"nested more than {MAX_DEPTH} levels deep")
            self.skip(depth=1)
            return None
        if isinstance(event, yaml.SequenceStartEvent):
            items: list[Any] = []
            while not self.loader.check_event(yaml.SequenceEndEvent):
                items.append(self.node((*path, len(items)), depth + 1))
            self.loader.get_event()
            return items
        return self.mapping(path, depth)

    def mapping(self, path: KeyPath, depth: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        while not self.loader.check_event(yaml.MappingEndEvent):
            key_event = self.loader.peek_event()
            is_plain_key = (isinstance(key_event, yaml.ScalarEvent) and key_event.anchor is None
                            and key_event.tag in (None, _NON_SPECIFIC_TAG, _YAML_TAG + "str"))
            if not is_plain_key:
                self.refuse(path, key_event,
                            "a key must be plain text (no list, mapping, alias, anchor or tag)", poison=False)
                self.skip(depth=0)  # the key
                self.skip(depth=0)  # its value
                continue
            self.loader.get_event()
            # Keys are taken as written: `on:` or `1:` stay the text "on" and "1" (YAML 1.1 would turn
            # them into true and 1, and the user would then read a baffling error).
            key = key_event.value
            child = (*path, key)
            if key in result:
                first_line = self.parsed.key_marks[child][0]
                self.refuse(child, key_event, f"duplicate key '{key}' (first given on line {first_line}); "
                                              "YAML would silently keep only the last one", poison=False)
                self.skip(depth=0)
                continue
            self.parsed.key_marks[child] = _position(key_event)
            result[key] = self.node(child, depth + 1)
        self.loader.get_event()
        return result

    def scalar(self, path: KeyPath, event: yaml.ScalarEvent) -> Any:
        tag = event.tag
        if tag in (None, _NON_SPECIFIC_TAG):
            tag = self.loader.resolve(yaml.ScalarNode, event.value, event.implicit)
        if tag == _TIMESTAMP_TAG:
            return event.value  # no setting is a date: a date-like value stays the text it was
        node = yaml.ScalarNode(tag, event.value, style=event.style)
        try:
            value = self.loader.yaml_constructors[tag](self.loader, node)
        except (ValueError, KeyError, TypeError, yaml.YAMLError):
            self.refuse(path, event, f"'{event.value}' cannot be read as {_show_tag(tag)}")
            return event.value
        if isinstance(value, float) and not math.isfinite(value):
            self.refuse(path, event, f"'{event.value}' is not a finite number")
        return value

    def skip(self, depth: int) -> None:
        """Consume one node's events; depth is 1 when its start event was already consumed."""
        while True:
            event = self.loader.get_event()
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
            if depth <= 0:
                return

