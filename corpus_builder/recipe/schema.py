"""The recipe's JSON Schema (the single definition of its shape): defaults, and validation worded for people.

jsonschema costs ~150 ms to import, so it is imported only when a recipe is actually validated.
"""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .model import AUTO_FORMAT
from .yaml_reader import KeyPath, Parsed, Problem

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "recipe.schema.json"


@cache
def recipe_schema() -> dict[str, Any]:
    """The recipe's JSON Schema, the single definition of its shape."""
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return schema



def deref(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """Follow a local $ref ("#/$defs/source"); sibling keywords are kept alongside the target's."""
    while "$ref" in schema:
        target: Any = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema



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



@cache
def _validator() -> Validator:
    # jsonschema costs ~150 ms to import: only pay for it when a recipe is actually validated.
    from jsonschema import Draft202012Validator

    return Draft202012Validator(recipe_schema())


def schema_problems(parsed: Parsed) -> list[Problem]:
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


def _show(value: object) -> str:
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


def source_format_problems(document: Mapping[str, object], parsed: Parsed,
                           registered: Callable[[], Sequence[str]]) -> list[Problem]:
    """Each source whose ``format`` names no registered format. The schema takes any name there: the formats' registry
    sits above the recipe, and ``registered`` gives its names (asked only when a source names a format)."""
    sources = document.get("sources")
    named = [(index, source["format"]) for index, source in enumerate(sources if isinstance(sources, list) else [])
             if isinstance(source, dict) and isinstance(source.get("format"), str) and source["format"] != AUTO_FORMAT]
    if not named:
        return []
    known = [AUTO_FORMAT, *registered()]
    return [parsed.problem(("sources", index, "format"), not_one_of(name, known, "registered source formats"))
            for index, name in named if name not in known]


def not_one_of(value: object, choices: Sequence[str], kind: str = "") -> str:
    """A value that is none of the ``choices`` (of a ``kind``, named when given), the closest one suggested."""
    return (f"{_show(value)} is not one of{f' the {kind}' if kind else ''}: {', '.join(choices)}"
            + _did_you_mean(str(value), list(choices)))


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
            # Once per key, not once per nested key: a recipe with thousands of unknown keys took minutes.
            close = difflib.get_close_matches(key, leaf_names, n=1, cutoff=0.75)
            homes = [p for p, leaf in zip(nested, leaf_names, strict=True) if leaf in close]
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
        yield path, not_one_of(instance, [str(v) for v in expected]), False
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


def _wrong_type(error: Any, path: KeyPath) -> bool:
    """An alternative that fails on the value's type itself: a ``type`` error, or an ``enum`` with no value of the
    value's type (a mapping given where the alternatives are some words or a mapping is no misspelt word)."""
    if len(error.absolute_path) > len(path):
        return False
    return error.validator == "type" or (error.validator == "enum" and not any(
        type(allowed) is type(error.instance) for allowed in error.validator_value))


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
    inner = [e for e in error.context if not _wrong_type(e, path)]
    if inner:
        yield from _describe(best_match(inner))
    else:
        expected = " or ".join(_expected(alt) for alt in alternatives)
        yield path, f"expected {expected}, got {_show(instance)}", False

