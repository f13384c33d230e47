"""Markdown pieces the reference pages share: a table and its cells (the recipe reference's own cell rule)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..recipe.reference import table_cell as cell

__all__ = ["cell", "table"]


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
