"""Real dumps with what makes a build's checks work: the suite's ShareGPT and chit-chat, a mirror source of exact
copies (of chit-chat and of its own rows), near copies of ShareGPT, broken rows and a row far over any token budget
by its characters alone, an evaluation set that holds chit-chat rows, and real grade-school math with reasoning (two
rows in three) or without. The Ray engine's tests and ``scripts/snapshot.py`` build from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .real_data import write_chitchat, write_gsm8k, write_rows, write_sharegpt


def edited(text: str) -> str:
    """A near copy: one word of a long text changed."""
    words = text.split(" ")
    words[len(words) // 2] = "changed"
    return " ".join(words)


def write_messy(root: Path) -> None:
    """sharegpt.jsonl (300 records), chitchat.jsonl (200), mirror.jsonl, eval.jsonl (its ``question`` field),
    gsm8k.jsonl and reasoning.jsonl (90 each) in ``root``."""
    sharegpt = write_sharegpt(root / "sharegpt.jsonl", 300)
    chats = write_chitchat(root / "chitchat.jsonl", 200)
    long_chats = [row for row in sharegpt if sum(len(str(turn.get("value", ""))) for turn in row["conversations"])
                  > 2000][:30]
    mirror: list[dict[str, Any]] = []
    for copy in range(2):  # the second copy of a text in one source has the first's id (ids are content keys)
        mirror += [{"id": f"exact-{copy}-{index}", "messages": row["messages"]} for index, row in enumerate(chats[:25])]
    for index, row in enumerate(long_chats):
        turns = [{"role": "user" if turn["from"] == "human" else "assistant", "content": edited(turn["value"])}
                 for turn in row["conversations"] if turn["from"] in ("human", "gpt") and turn["value"]]
        mirror.append({"id": f"near-{index}", "messages": turns})
    mirror += [{"id": "broken", "messages": "not a list"}, {"id": "empty", "messages": []},
               {"id": "endless", "messages": [{"role": "user", "content": "word " * 50_000},
                                              {"role": "assistant", "content": "noted"}]}]
    write_rows(root / "mirror.jsonl", mirror)
    write_rows(root / "eval.jsonl", [{"question": " ".join(turn["content"] for turn in row["messages"])}
                                     for row in chats[150:160]])
    problems = write_gsm8k(root / "gsm8k.jsonl", 90)
    write_rows(root / "reasoning.jsonl", [
        {"messages": [{"role": "user", "content": problem["question"]},
                      {"role": "assistant", "content": f"<think>{problem['answer']}</think>Solved."
                       if index % 3 else problem["answer"]}]} for index, problem in enumerate(problems)])
