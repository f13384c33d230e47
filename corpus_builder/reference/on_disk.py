"""The corpus layout reference: every entry of a corpus directory (``layout.LAYOUT``), the manifest's fields
(``layout.Manifest``), a ledger record (``errors.Skipped``) and a row's fields (schemas/conversation.schema.json)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ..errors import Skipped
from ..layout import LAYOUT, MANIFEST
from .markdown import cell, table

ROW_SCHEMA = Path(__file__).resolve().parents[1] / "schemas" / "conversation.schema.json"


def render_on_disk() -> str:
    schema: dict[str, Any] = json.loads(ROW_SCHEMA.read_text(encoding="utf-8"))
    tree = "\n".join(f"  {path:<50} {_first_clause(what)}" for path, what in LAYOUT)
    parts = [
        "# The corpus on disk",
        "A built corpus is a directory. `corpus build` stages it beside its final place and moves it in when it is "
        f"complete, `{MANIFEST}` last; audit, export, vocab, eval and publish read these files, never the build's "
        "memory.",
        f"```\nOUT/\n{tree}\n```",
        table(("entry", "what it holds"), [(f"`{path}`", cell(what)) for path, what in LAYOUT]),
        "## A row",
        cell(schema.get("description", "")),
        table(("field", "type", "description"), _schema_rows(schema, "")),
        "## A ledger record",
        "One line of `ledger.jsonl.zst` (the reasons are listed in [Skip reasons and flags](skip-reasons.md)):",
        table(("field", "type"), [(f"`{field.name}`", f"`{field.type}`") for field in dataclasses.fields(Skipped)]),
    ]
    return "\n\n".join(parts) + "\n"


def _first_clause(text: str) -> str:
    return text.split(" (")[0].split(": ")[0].split(", ")[0]


def _schema_rows(schema: dict[str, Any], prefix: str) -> list[tuple[str, str, str]]:
    """A row per property, nested objects' and lists of objects' properties after their own."""
    rows = []
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        rows.append((f"`{path}`", cell(_type(sub)), cell(sub.get("description", ""))))
        if "properties" in sub:
            rows += _schema_rows(sub, f"{path}.")
        items = sub.get("items")
        if isinstance(items, dict) and "properties" in items:
            rows += _schema_rows(items, f"{path}[].")
    return rows


def _type(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return " | ".join(f"`{value}`" for value in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type", "any")
    names = [kind] if isinstance(kind, str) else list(kind)
    words = {"array": "list", "object": "object", "string": "string", "integer": "integer", "boolean": "boolean",
             "null": "null", "number": "number"}
    return " or ".join(words.get(name, name) for name in names)
