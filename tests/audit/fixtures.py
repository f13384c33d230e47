"""A built corpus and traffic logs whose mix is known by construction, for the traffic-audit tests.

The corpus (recipe tasks): 60 one-turn chats without reasoning (``chats``, task chat) and 40 summaries
(``docs``, task summarization) whose answer is a long verbatim stretch of the document, every other one with
reasoning. So it is 20% thinking, 60/40 chat/summarization, every chat under 128 target tokens and every
summary between 512 and 1k, every chat turn without a copy-span and every summary turn copied throughout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from corpus_builder import build_corpus, load_recipe

CHATS, DOCS = 60, 40


def chat_row(i: int, *, thinking: bool, served: bool = False) -> dict[str, Any]:
    answer: dict[str, Any] = {"role": "assistant", "content": f"I am fine, thanks for asking about {i}."}
    if thinking:
        answer["reasoning_content"] = f"The user greets me with {i}. I should reply kindly."
    row: dict[str, Any] = {"task": "chat", "messages": [
        {"role": "user", "content": f"hello number {i}, how are you doing today?"}, answer]}
    if served:
        row["chat_template_kwargs"] = {"enable_thinking": thinking}
    return row


def summary_row(i: int, *, thinking: bool) -> dict[str, Any]:
    document = " ".join(f"sentence {j} of document {1000 + i} says the value is {j * (i + 7)}." for j in range(36))
    answer: dict[str, Any] = {"role": "assistant", "content": document[:320].rsplit(" ", 1)[0]}
    if thinking:
        answer["reasoning_content"] = "I copy the key sentences."
    return {"task": "summarization", "messages": [{"role": "user", "content": "Summarize this: " + document}, answer]}


def write_jsonl(path: Path, rows: list[dict[str, Any]], *, extra: bytes = b"") -> Path:
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows) + extra)
    return path


def corpus_rows() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return ([chat_row(i, thinking=False) for i in range(CHATS)],
            [summary_row(i, thinking=i % 2 == 0) for i in range(DOCS)])


def build_traffic_corpus(root: Path, tokenizer: Path) -> Path:
    chats, docs = corpus_rows()
    write_jsonl(root / "chat.jsonl", chats)
    write_jsonl(root / "docs.jsonl", docs)
    (root / "recipe.yaml").write_text(f"""
name: traffic-audit
target: {{model: tiny/target, tokenizer: {tokenizer}}}
sources:
  - {{name: chats, kind: replay, path: chat.jsonl, task: chat, license: MIT}}
  - {{name: docs, kind: replay, path: docs.jsonl, task: summarization, license: MIT}}
split: {{validation_fraction: 0.1}}
output: {{dir: out}}
""", encoding="utf-8")
    return build_corpus(load_recipe(root / "recipe.yaml")).out_dir


def known_traffic() -> list[dict[str, Any]]:
    """80 chats and 20 summaries, all served with thinking on: 100% thinking, 80/20 chat/summarization."""
    return ([chat_row(100 + i, thinking=True, served=True) for i in range(80)]
            + [summary_row(100 + i, thinking=True) for i in range(20)])
