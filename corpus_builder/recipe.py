"""Load a recipe: safe YAML with positions, JSON-Schema validation, defaults, semantic checks, typed Recipe.

The recipe's shape lives in one place, schemas/recipe.schema.json. This module reads YAML into plain
JSON-like data while remembering where every key and value sits in the file, validates it against the
schema, fills the schema's defaults, runs the cross-field checks the schema cannot express, and maps the
result onto the dataclasses of recipe_types. Every problem found is reported at once, each with file,
line, column and key path, so a user fixes a recipe in one round.

Importing this module stays cheap (no jsonschema until a recipe is validated; nothing heavy at all):
`corpus --help` and `corpus validate` depend on it.
"""

from __future__ import annotations

import copy
import difflib
import glob
import hashlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from corpus_builder.errors import CorpusError
from corpus_builder.recipe_types import (
    Checks,
    ExportSpec,
    GenerationSettings,
    HubRef,
    LaunchSpec,
    Mapping,
    OutputSpec,
    Recipe,
    SourceSpec,
    SplitSpec,
    Take,
    Target,
)

SCHEMA_PATH = Path(__file__).parent / "schemas" / "recipe.schema.json"

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


# --------------------------------------------------------------------------------------------------
# Public API


def check_recipe(path: Path) -> tuple[Recipe | None, list[Problem]]:
    """Read, validate and type a recipe. Returns (recipe, []) or (None, every problem found)."""
    path = Path(path)
    file = str(path)
    text, problems = _read_text(path, file)
    if text is None:
        return None, problems
    parsed = _parse_yaml(text, file)
    if parsed.data is None:
        return None, parsed.problems
    base_dir = path.resolve().parent
    # Derived defaults need the plain ones first; the second pass puts them in the schema's key order.
    document = fill_defaults(_fill_derived(fill_defaults(parsed.data, recipe_schema())), recipe_schema())
    found = parsed.problems + _schema_problems(parsed) + _semantic_problems(document, base_dir, parsed)
    problems = sorted(dict.fromkeys(found), key=lambda p: (p.line or 0, p.column or 0, p.path))
    if problems:
        return None, problems
    return _to_recipe(document, base_dir, path.resolve()), []


def load_recipe(path: Path) -> Recipe:
    """The typed recipe, or CorpusError listing every problem (the CLI turns it into exit code 2)."""
    recipe, problems = check_recipe(path)
    if recipe is None:
        raise CorpusError("recipe is invalid", file=str(path), details=[str(p) for p in problems])
    return recipe


def resolved_yaml(recipe: Recipe) -> str:
    """The validated document with every default filled, as YAML; paths stay as written."""
    return yaml.safe_dump(recipe.document, sort_keys=False, allow_unicode=True, width=100)


def recipe_sha256(recipe: Recipe) -> str:
    """Hash of the canonical resolved document: key order, layout and implicit defaults do not change it."""
    canonical = json.dumps(recipe.document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@cache
def recipe_schema() -> dict[str, Any]:
    """The recipe's JSON Schema, the single definition of its shape."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def match_source_pattern(base_dir: Path, pattern: str) -> list[Path]:
    """Files a source's path pattern names (a path or a glob, `**` allowed), relative to base_dir.

    One rule for the recipe check and the readers, so a recipe that validates reads the same files.
    """
    # The recipe's own directory may contain glob characters: only the pattern may expand.
    full = pattern if os.path.isabs(pattern) else os.path.join(glob.escape(str(base_dir)), pattern)
    return sorted(Path(p) for p in glob.glob(full, recursive=True) if os.path.isfile(p))


def fill_defaults(value: Any, schema: dict[str, Any], root: dict[str, Any] | None = None) -> Any:
    """A copy of value with the schema's `default`s filled in, recursively (through $ref and array items).

    Keys come out in the schema's order, so the resolved document reads like the reference. Integers
    where the schema asks for a number become floats, so 1 and 1.0 resolve (and hash) alike. Values
    of the wrong type are passed through untouched: validation reports them.
    """
    root = schema if root is None else root
    schema = deref(schema, root)
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        filled: dict[str, Any] = {}
        for key, sub in properties.items():
            sub = deref(sub, root)
            if key in value:
                filled[key] = fill_defaults(value[key], sub, root)
            elif "default" in sub:
                filled[key] = fill_defaults(copy.deepcopy(sub["default"]), sub, root)
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key not in properties:
                filled[key] = fill_defaults(item, extra, root) if isinstance(extra, dict) else item
        return filled
    if isinstance(value, list):
        items = schema.get("items")
        return [fill_defaults(item, items, root) if isinstance(items, dict) else item for item in value]
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


# --------------------------------------------------------------------------------------------------
# Reading the file


def _read_text(path: Path, file: str) -> tuple[str | None, list[Problem]]:
    def fail(message: str, line: int | None = None, column: int | None = None) -> tuple[None, list[Problem]]:
        return None, [Problem(file, line, column, "", message)]

    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return fail("file not found")
    except IsADirectoryError:
        return fail("is a directory, not a recipe file")
    except OSError as error:
        return fail(f"cannot read the file: {error.strerror or error}")
    if len(raw) > MAX_RECIPE_BYTES:
        return fail(f"file is {len(raw):,} bytes; a recipe is at most {MAX_RECIPE_BYTES:,} bytes")
    try:
        return raw.decode("utf-8-sig"), []
    except UnicodeDecodeError as error:
        line_start = raw.rfind(b"\n", 0, error.start) + 1
        return fail(
            f"not valid UTF-8 (byte 0x{raw[error.start]:02x}); save the recipe as UTF-8",
            raw.count(b"\n", 0, error.start) + 1,
            error.start - line_start + 1,
        )


@dataclass
class _Parsed:
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


def _parse_yaml(text: str, file: str) -> _Parsed:
    """YAML -> plain data with positions. data is None when nothing usable came out (problems say why)."""
    parsed = _Parsed(None, [], file)
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


def _show_tag(tag: str) -> str:
    return "!!" + tag[len(_YAML_TAG):] if tag.startswith(_YAML_TAG) else tag


class _YamlBuilder:
    """Builds plain data straight from the parser's events, so nothing YAML can express beyond JSON gets
    in: aliases never expand (no alias bombs), anchors and foreign tags (!!python/object ...) are refused,
    duplicate keys are reported instead of silently overwritten, and every value keeps its position."""

    def __init__(self, loader: Any, parsed: _Parsed) -> None:
        self.loader = loader
        self.parsed = parsed

    def refuse(self, path: KeyPath, event: yaml.Event, message: str, poison: bool = True) -> None:
        mark = event.start_mark
        self.parsed.problems.append(
            Problem(self.parsed.file, mark.line + 1, mark.column + 1, format_key_path(path), message)
        )
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
        self.parsed.value_marks[path] = (event.start_mark.line + 1, event.start_mark.column + 1)
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
            mark = (key_event.start_mark.line + 1, key_event.start_mark.column + 1)
            if key in result:
                first_line = self.parsed.key_marks[child][0]
                self.refuse(child, key_event, f"duplicate key '{key}' (first given on line {first_line}); "
                                              "YAML would silently keep only the last one", poison=False)
                self.skip(depth=0)
                continue
            self.parsed.key_marks[child] = mark
            result[key] = self.node(child, depth + 1)
        self.loader.get_event()
        return result

    def scalar(self, path: KeyPath, event: yaml.ScalarEvent) -> Any:
        tag = event.tag
        if tag in (None, _NON_SPECIFIC_TAG):
            tag = self.loader.resolve(yaml.ScalarNode, event.value, event.implicit)
        if tag == _TIMESTAMP_TAG:
            return event.value  # no setting is a date: a date-like value stays the text it was
        node = yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style)
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


# --------------------------------------------------------------------------------------------------
# Schema validation


@cache
def _validator() -> Any:
    # jsonschema costs ~150 ms to import: only pay for it when a recipe is actually validated.
    from jsonschema import Draft202012Validator

    return Draft202012Validator(recipe_schema())


def _schema_problems(parsed: _Parsed) -> list[Problem]:
    problems = []
    for error in _validator().iter_errors(parsed.data):
        for path, message, at_key in _describe(error):
            if not parsed.is_poisoned(path):
                problems.append(parsed.problem(path, message, at_key))
    return problems


_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list",
    "object": "a mapping",
    "null": "null",
}


def _show(value: Any) -> str:
    """A value as the user wrote it, short."""
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    return json.dumps(value)


def _expected(schema: dict[str, Any]) -> str:
    """What a (sub)schema accepts, in words: "a string", "a list of strings", "an integer or null"."""
    types = schema.get("type")
    if types is None and "enum" in schema:
        return "one of " + ", ".join(str(v) for v in schema["enum"])
    words = []
    for name in [types] if isinstance(types, str) else types or []:
        items = schema.get("items")
        if name == "array" and isinstance(items, dict) and isinstance(items.get("type"), str):
            words.append(f"a list of {items['type']}s")
        else:
            words.append(_TYPE_WORDS.get(name, name))
    return " or ".join(words) or "a valid value"


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _nested_keys(schema: dict[str, Any], root: dict[str, Any], prefix: str = "",
                 depth: int = 0) -> Iterator[str]:
    """Relative key paths below an object schema: generation.temperature, launch.model_dir, ..."""
    if depth > 4:
        return
    schema = deref(schema, root)
    if schema.get("type") == "array" and isinstance(schema.get("items"), dict):
        yield from _nested_keys(schema["items"], root, prefix + "[]", depth + 1)
        return
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        if depth > 0:
            yield path
        yield from _nested_keys(sub, root, path, depth + 1)


def _unknown_key_message(key: str, schema: dict[str, Any]) -> str:
    root = recipe_schema()
    allowed = list(schema.get("properties", {}))
    message = f"unknown key '{key}'"
    suggestion = _did_you_mean(key, allowed)
    if not suggestion:
        # The key may be right but misplaced (tokenizer at the top level instead of under target).
        nested = list(_nested_keys(schema, root))
        homes = [p for p in nested if p.rsplit(".", 1)[-1] == key]
        if not homes:
            leaf_names = [p.rsplit(".", 1)[-1] for p in nested]
            homes = [p for p, leaf in zip(nested, leaf_names, strict=True)
                     if leaf in difflib.get_close_matches(key, leaf_names, n=1, cutoff=0.75)]
        if homes:
            suggestion = "; did you mean " + " or ".join(f"'{h}'" for h in homes[:3]) + "?"
    if not suggestion and allowed:
        suggestion = "; allowed here: " + ", ".join(allowed)
    return message + suggestion


def _describe(error: Any) -> Iterator[tuple[KeyPath, str, bool]]:
    """Turn one jsonschema error into (key path, message, locate-at-key) items a user can act on."""
    path: KeyPath = tuple(error.absolute_path)
    instance, kind, expected = error.instance, error.validator, error.validator_value
    if kind == "additionalProperties" and isinstance(instance, dict):
        for key in instance:
            if key not in error.schema.get("properties", {}):
                yield (*path, key), _unknown_key_message(key, error.schema), True
    elif kind == "required" and isinstance(instance, dict):
        for key in expected:
            if key not in instance:
                yield path, f"missing required key '{key}'", True
    elif kind == "type":
        message = f"expected {_expected(error.schema)}, got {_show(instance)}"
        if "string" in ([expected] if isinstance(expected, str) else expected) and not isinstance(
            instance, dict | list
        ):
            message += " (put it in quotes to keep it as text)"
        yield path, message, False
    elif kind == "enum":
        choices = ", ".join(str(v) for v in expected)
        yield path, (f"{_show(instance)} is not one of: {choices}"
                     + _did_you_mean(str(instance), [str(v) for v in expected])), False
    elif kind == "oneOf":
        yield from _describe_one_of(error, path)
    elif kind == "minItems":
        yield path, f"needs at least {expected} item{'s' if expected != 1 else ''}", False
    elif kind == "uniqueItems":
        yield path, "lists the same item more than once", False
    elif kind == "pattern":
        yield path, f"{_show(instance)} does not match the pattern {expected}", False
    elif kind == "not" and isinstance(instance, str) and "enum" in expected:  # propertyNames: reserved keys
        yield (*path, instance), (f"'{instance}' cannot be set here: it has its own setting or is a request "
                                  "field corpus-builder sends itself"), True
    else:
        yield path, error.message, False


def _describe_one_of(error: Any, path: KeyPath) -> Iterator[tuple[KeyPath, str, bool]]:
    from jsonschema.exceptions import best_match

    alternatives = error.validator_value
    instance = error.instance
    exclusive_keys = [alt["required"] for alt in alternatives if set(alt) == {"required"}]
    if len(exclusive_keys) == len(alternatives) and isinstance(instance, dict):
        # {"oneOf": [{"required": [a]}, {"required": [b]}]}: exactly one of these keys.
        keys = [key for group in exclusive_keys for key in group]
        given = [key for key in keys if key in instance]
        names = " or ".join(f"'{k}'" for k in keys)
        if given:
            yield path, f"give only one of {names} (found {', '.join(repr(k) for k in given)})", True
        else:
            yield path, f"needs {names}", True
        return
    # Alternatives by type (a string or a list of strings): if the value has the right type for one of
    # them, what is wrong is inside it; otherwise the type itself is wrong.
    inner = [e for e in error.context if e.validator != "type" or len(e.absolute_path) > len(path)]
    if inner:
        yield from _describe(best_match(inner))
    else:
        expected = " or ".join(_expected(alt) for alt in alternatives)
        yield path, f"expected {expected}, got {_show(instance)}", False


# --------------------------------------------------------------------------------------------------
# Defaults and checks the schema cannot express


def deref(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """Follow a local $ref ("#/$defs/source"); sibling keywords are kept alongside the target's."""
    while "$ref" in schema:
        target: Any = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def _section(document: Any, *keys: str) -> dict[str, Any]:
    """document[k1][k2]... when each step is a mapping, else {}: checks must survive invalid documents,
    since the schema's own problems are reported alongside theirs."""
    for key in keys:
        document = document.get(key) if isinstance(document, dict) else None
    return document if isinstance(document, dict) else {}


def _fill_derived(document: dict[str, Any]) -> dict[str, Any]:
    """Defaults computed from other settings (the schema's descriptions state them)."""
    generation = _section(document, "target", "generation")
    max_tokens = generation.get("max_tokens")
    if generation.get("on_length") == "retry" and "retry_max_tokens" not in generation and isinstance(
        max_tokens, int
    ):
        generation["retry_max_tokens"] = 2 * max_tokens
    return document


def _local_path(base_dir: Path, written: str) -> Path:
    """A path setting as the tools use it: relative to the recipe's directory unless absolute."""
    return base_dir / written


def _semantic_problems(document: dict[str, Any], base_dir: Path, parsed: _Parsed) -> list[Problem]:
    problems: list[Problem] = []

    def report(path: KeyPath, message: str, at_key: bool = False) -> None:
        problems.append(parsed.problem(path, message, at_key))

    target = _section(document, "target")
    sources = document.get("sources") if isinstance(document.get("sources"), list) else []

    first_use: dict[str, int] = {}
    for index, source in enumerate(sources):
        if not isinstance(source, dict):
            continue
        name = source.get("name")
        if isinstance(name, str):
            if name in first_use:
                report(("sources", index, "name"), f"source name '{name}' is already used by "
                                                   f"sources[{first_use[name]}]; names must be unique")
            else:
                first_use[name] = index
        written = source.get("path")
        if isinstance(written, str):
            patterns = [(("sources", index, "path"), written)]
        elif isinstance(written, list):
            patterns = [(("sources", index, "path", i), pattern)
                        for i, pattern in enumerate(written) if isinstance(pattern, str)]
        else:
            patterns = []
        for key_path, pattern in patterns:
            if not match_source_pattern(base_dir, pattern):
                report(key_path, f"no file matches '{pattern}' (looked in {base_dir})")
        mapping = _section(source, "mapping")
        if mapping.get("style") == "field" and "field" not in mapping:
            report(("sources", index, "mapping"), "mapping style 'field' needs mapping.field "
                                                  "(the field that holds the prompt text)", at_key=True)

    tokenizer = target.get("tokenizer")
    if isinstance(tokenizer, str):
        directory = _local_path(base_dir, tokenizer)
        if not directory.is_dir():
            report(("target", "tokenizer"), f"tokenizer directory not found: {directory}")
        elif not (directory / "tokenizer.json").is_file():
            report(("target", "tokenizer"), f"tokenizer directory has no tokenizer.json: {directory}")
    if "max_seq_len" in _section(document, "checks") and tokenizer is None:
        report(("checks", "max_seq_len"), "max_seq_len counts tokens in the target's tokenizer: "
                                          "set target.tokenizer")
    exports = _section(document, "output").get("exports")
    for index, export in enumerate(exports if isinstance(exports, list) else []):
        if isinstance(export, dict) and export.get("format") == "speculators-tokens" and tokenizer is None:
            report(("output", "exports", index, "format"), "speculators-tokens rows are in the target's tokens: "
                                                             "set target.tokenizer")

    launch = _section(target, "launch")
    model_dir = launch.get("model_dir")
    if isinstance(model_dir, str) and not _local_path(base_dir, model_dir).is_dir():
        report(("target", "launch", "model_dir"),
               f"model directory not found: {_local_path(base_dir, model_dir)}")

    prompt_sources = [s.get("name") for s in sources if isinstance(s, dict) and s.get("kind") == "prompts"]
    if prompt_sources and not (target.get("endpoints") or launch or target.get("backend") == "engine"):
        names = ", ".join(f"'{n}'" for n in prompt_sources)
        report(("target",), f"prompts source(s) {names} need the target to generate: set target.endpoints, "
                            "target.launch, or target.backend: engine", at_key=True)

    generation = _section(target, "generation")
    retry_budget, budget = generation.get("retry_max_tokens"), generation.get("max_tokens")
    if (generation.get("on_length") == "retry" and isinstance(retry_budget, int)
            and isinstance(budget, int) and retry_budget <= budget):
        report(("target", "generation", "retry_max_tokens"),
               f"retry_max_tokens ({retry_budget}) must be larger than max_tokens ({budget}): "
               "the retry exists to give a truncated generation more room")
    return problems


# --------------------------------------------------------------------------------------------------
# Typed view


def _to_recipe(document: dict[str, Any], base_dir: Path, path: Path) -> Recipe:
    target_doc = document["target"]
    launch_doc = target_doc.get("launch")
    tokenizer = target_doc.get("tokenizer")
    target = Target(
        model=target_doc["model"],
        revision=target_doc.get("revision"),
        tokenizer=_local_path(base_dir, tokenizer) if tokenizer is not None else None,
        trust_remote_code=target_doc["trust_remote_code"],
        endpoints=tuple(target_doc["endpoints"]),
        launch=LaunchSpec(**{
            **launch_doc,
            "model_dir": _local_path(base_dir, launch_doc["model_dir"]),
            "args": tuple(launch_doc["args"]),
        }) if launch_doc is not None else None,
        backend=target_doc["backend"],
        generation=GenerationSettings(**target_doc["generation"]),
    )
    sources = tuple(_to_source(source) for source in document["sources"])
    output = document["output"]
    return Recipe(
        name=document["name"],
        description=document.get("description"),
        target=target,
        sources=sources,
        output=OutputSpec(dir=_local_path(base_dir, output["dir"]), rows_per_shard=output["rows_per_shard"],
                          exports=tuple(ExportSpec(**spec) for spec in output["exports"])),
        checks=Checks(**document["checks"]),
        split=SplitSpec(**document["split"]),
        base_dir=base_dir,
        path=path,
        document=document,
    )


def _to_source(source: dict[str, Any]) -> SourceSpec:
    written = source.get("path")
    plain = {k: v for k, v in source.items() if k not in ("path", "hub", "mapping", "take")}
    return SourceSpec(
        **plain,
        paths=(written,) if isinstance(written, str) else tuple(written or ()),
        hub=HubRef(**source["hub"]) if "hub" in source else None,
        mapping=Mapping(**source["mapping"]),
        take=Take(**source["take"]) if "take" in source else None,
    )
