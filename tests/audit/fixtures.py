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


def dialogue_row(i: int, *, turns: int, thinking: bool, served: bool = False, task: str = "chat") -> dict[str, Any]:
    """A conversation of ``turns`` assistant turns, each with reasoning when ``thinking``."""
    messages: list[dict[str, Any]] = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn} of dialogue {i}: what comes next?"})
        answer: dict[str, Any] = {"role": "assistant", "content": f"step {turn} of dialogue {i} comes next."}
        if thinking:
            answer["reasoning_content"] = f"Dialogue {i} is at step {turn}."
        messages.append(answer)
    row: dict[str, Any] = {"task": task, "messages": messages}
    if served:
        row["chat_template_kwargs"] = {"enable_thinking": thinking}
    return row


# The mixed corpus's sources: (name, task, rows written, take) and how their rows are made.
PLAIN, REASONED, HALFWAY, SUMMARIES = 60, 40, 20, 30
PLAIN_DUPLICATES = 12  # the first rows of plain again: dropped as exact duplicates (its read rows are 72)
REASONED_FRACTION = 0.5
SUMMARIES_COUNT = 40  # of the 60 rows of docs (every summary twice): the duplicates among those taken are dropped


def mixed_sources() -> dict[str, list[dict[str, Any]]]:
    plain = [chat_row(i, thinking=False) for i in range(PLAIN)]
    summaries = [summary_row(i, thinking=i % 2 == 0) for i in range(SUMMARIES)]
    return {"plain": plain + plain[:PLAIN_DUPLICATES],
            "reasoned": [dialogue_row(i, turns=2 + i % 2, thinking=True) for i in range(REASONED)],
            "halfway": [dialogue_row(100 + i, turns=2, thinking=i % 2 == 0) for i in range(HALFWAY)],
            "docs": summaries + summaries}


MIXED_RECIPE = """
name: mixed-audit
target: {{model: tiny/target, tokenizer: {tokenizer}}}
sources:
  - {{name: plain, kind: replay, path: plain.jsonl, task: chat, license: MIT}}
  - {{name: reasoned, kind: replay, path: reasoned.jsonl, task: chat, license: MIT, take: {{fraction: {fraction}}}}}
  - {{name: halfway, kind: replay, path: halfway.jsonl, task: chat, license: MIT}}
  - {{name: docs, kind: replay, path: docs.jsonl, task: summarization, license: MIT, take: {{count: {count}, seed: 3}}}}
split: {{validation_fraction: 0.1}}
output: {{dir: out}}
"""


def build_mixed_corpus(root: Path, tokenizer: Path) -> Path:
    """Several sources per task (chat: one never thinking, one always, one half), drops (exact duplicates),
    several turns, and takes of every kind: none (plain, halfway), a fraction (reasoned), a count (docs)."""
    for name, rows in mixed_sources().items():
        write_jsonl(root / f"{name}.jsonl", rows)
    (root / "recipe.yaml").write_text(MIXED_RECIPE.format(tokenizer=tokenizer, fraction=REASONED_FRACTION,
                                                          count=SUMMARIES_COUNT), encoding="utf-8")
    return build_corpus(load_recipe(root / "recipe.yaml")).out_dir


# Turn counts on the turn buckets' edges: (assistant turns, its bucket), the bucket's ends inclusive.
TURN_EDGES = ((1, "1"), (3, "3"), (4, "4-5"), (5, "4-5"), (6, "6-10"), (10, "6-10"), (11, "11+"))


def mixed_traffic() -> list[dict[str, Any]]:
    """60 chats (half served thinking, 14 of them with turns on the turn buckets' edges), 30 summaries all
    thinking, 10 rows of a task no corpus source has."""
    edges = [dialogue_row(200 + i, turns=turns, thinking=i % 2 == 0, served=True)
             for i, (turns, _) in enumerate(TURN_EDGES * 2)]
    chats = [chat_row(300 + i, thinking=i % 2 == 0, served=True) for i in range(60 - len(edges))]
    return (edges + chats + [summary_row(400 + i, thinking=True) for i in range(30)]
            + [dialogue_row(500 + i, turns=1, thinking=False, task="code") for i in range(10)])
