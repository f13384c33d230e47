"""Packs written the ways an eval meets them: conversations files, prompt files, a corpus's eval/ directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from corpus_builder.records import Conversation, Message


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def chat_rows(count: int, *, source: str | None = None, task: str | None = None) -> list[dict[str, Any]]:
    """Answered single-turn conversations, each its own prompt."""
    rows = [{"messages": [{"role": "user", "content": f"question {i}: import os and print the path"},
                          {"role": "assistant", "content": f"answer {i}"}]} for i in range(count)]
    for row in rows:
        row |= {"source": source} if source else {}
        row |= {"task": task} if task else {}
    return rows


def conversations(count: int, source: str, task: str | None) -> list[Conversation]:
    return [Conversation(id=f"{source}-{i}", source=source, origin="replay", task=task,
                         messages=[Message("user", f"{source} question {i}"),
                                   Message("assistant", f"answer {i}", reasoning=f"thought {i}")])
            for i in range(count)]
