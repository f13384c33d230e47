"""The recipe reference, generated from schemas/recipe.schema.json so that no copy drifts from it: the documentation
site's page (``render_page``, written with the other references by ``python -m corpus_builder.reference``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from .schema import deref

_HEADER = "| Key | Type | Default | Allowed values | Description |\n|---|---|---|---|---|\n"


def render_reference(schema: dict[str, Any]) -> str:
    """Markdown: top-level settings, then one table per section (target, sources, checks, ...)."""
    required = set(schema.get("required", []))
    top_rows: list[str] = []
    sections: list[str] = []
    for key, sub in schema["properties"].items():
        sub = deref(sub, schema)
        item = deref(sub["items"], schema) if sub.get("type") == "array" and "items" in sub else None
        is_section = sub.get("type") == "object" or (item is not None and item.get("type") == "object")
        if not is_section:
            top_rows.append(_row(key, sub, key in required, schema))
            continue
        intro = [sub.get("description", "")]
        if key in required:
            intro.append("Required.")
        if item is not None:
            plural = "s" if sub.get("minItems") != 1 else ""
            intro.append(f"A list of mappings ({_at_least(sub)}item{plural}), each with the keys below.")
            if "description" in item:
                intro.append(item["description"])
        body = item if item is not None else sub
        rows = "".join(_rows(f"{key}[]" if item is not None else key, body, schema))
        sections.append(f"### `{key}`\n\n{' '.join(t for t in intro if t)}\n\n{_HEADER}{rows}")
    top = f"### Top level\n\n{_HEADER}{''.join(top_rows)}"
    return "\n".join([top, *sections])


def render_page(schema: dict[str, Any]) -> str:
    """The documentation site's recipe reference page: a title, where it comes from, then ``render_reference``."""
    intro = ("A recipe is one YAML file: the target, the sources, the checks, the corpus it must reach and where it is "
             "written. This page is generated from `schemas/recipe.schema.json`, the single definition of a recipe's "
             "shape; `corpus validate RECIPE` checks a recipe against it (and the cross-field rules), naming every "
             "problem as `file:line:col: key.path: problem`.")
    return f"# Recipe reference\n\n{intro}\n\n{_demote(render_reference(schema))}"


def _demote(markdown: str) -> str:
    """The reference's ``###`` sections as a page's ``##``."""
    return "\n".join(line[1:] if line.startswith("### ") else line for line in markdown.split("\n"))


# --------------------------------------------------------------------------------------------------


def _rows(prefix: str, schema: dict[str, Any], root: dict[str, Any]) -> Iterator[str]:
    """One row per key below an object schema, nested objects right after their own row."""
    required = set(schema.get("required", []))
    for key, sub in schema.get("properties", {}).items():
        sub = deref(sub, root)
        path = f"{prefix}.{key}"
        yield _row(path, sub, key in required, root)
        if sub.get("type") == "object" and "properties" in sub:
            yield from _rows(path, sub, root)
        items = deref(sub["items"], root) if sub.get("type") == "array" and isinstance(sub.get("items"), dict) else {}
        if "properties" in items:  # a list of mappings: each item's keys
            yield from _rows(f"{path}[]", items, root)


def _row(path: str, schema: dict[str, Any], required: bool, root: dict[str, Any]) -> str:
    kind = _type_text(schema, root) + (", **required**" if required else "")
    default = f"`{_yaml_value(schema['default'])}`" if "default" in schema else ""
    cells = [f"`{path}`", kind, default, _allowed_text(schema), schema.get("description", "")]
    return "| " + " | ".join(table_cell(c) for c in cells) + " |\n"


def _yaml_value(value: Any) -> str:
    """A value as a recipe would spell it: auto, true, null, [] ..."""
    return value if isinstance(value, str) else json.dumps(value)


def table_cell(text: str) -> str:
    """One line, pipes escaped: a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _type_text(schema: dict[str, Any], root: dict[str, Any]) -> str:
    if "oneOf" in schema and all("type" in alt for alt in schema["oneOf"]):
        return " or ".join(_type_text(alt, root) for alt in schema["oneOf"])
    types = schema.get("type")
    if types is None and "enum" in schema:
        types = "string" if all(isinstance(v, str) for v in schema["enum"]) else None
    names = [types] if isinstance(types, str) else list(types or [])
    words = []
    for name in names:
        if name == "array":
            items = deref(schema.get("items", {}), root)
            item_type = items.get("type")
            words.append(f"list of {item_type}s" if isinstance(item_type, str) and item_type != "object"
                         else "list")
        elif name == "object":
            words.append("mapping")
        else:
            words.append(name)
    return " or ".join(words) or "any"


def _at_least(schema: dict[str, Any]) -> str:
    return f"at least {schema['minItems']} " if schema.get("minItems") else ""


def _allowed_text(schema: dict[str, Any]) -> str:
    parts = []
    if "enum" in schema:
        parts.append(", ".join(f"`{v}`" for v in schema["enum"]))
    for keyword, symbol in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"),
                            ("exclusiveMaximum", "<")):
        if keyword in schema:
            parts.append(f"{symbol} {schema[keyword]}")
    if schema.get("minLength"):
        parts.append("non-empty")
    if "pattern" in schema:
        parts.append(f"pattern `{schema['pattern']}`")
    items = schema.get("items")
    if isinstance(items, dict) and "pattern" in items:
        parts.append(f"each: pattern `{items['pattern']}`")
    if schema.get("minItems"):
        parts.append(f"{_at_least(schema)}item{'s' if schema['minItems'] != 1 else ''}")
    if schema.get("uniqueItems"):
        parts.append("no repeats")
    groups = schema.get("oneOf", [])
    if groups and all(set(alt) == {"required"} for alt in groups):
        parts.append("exactly one of " + ", ".join(f"`{k}`" for alt in groups for k in alt["required"]))
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and "type" in extra:
        parts.append(f"values: {extra['type']}")
    return "; ".join(parts)
