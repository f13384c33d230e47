"""The real consumer: SpecForge 0.2.0's own data preparation (in .venv-specforge, scripts/specforge_env.sh) on our
exports. ``prepare_prompt_tasks`` is what its training assembly calls for ``data.train_data_path`` (raw
conversations, through ``build_eagle3_dataset`` and its chat-template parser) and ``data.prompts_path``
(pre-tokenized rows); it runs here as SpecForge ships it, the tokenizer loaded as its assembly loads the target's.

The corpus is replayed (no generated turn), so each of our speculators-tokens rows is the template's render: the
loss masks SpecForge computes from the `specforge` export are compared with ours turn by turn.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from corpus_builder.export import export_corpus
from corpus_builder.layout import Corpus
from tests.export.test_export import corpus  # noqa: F401  (the module-scoped built corpus fixture)
from tests.support.trainers import specforge_python

# Run by SpecForge's environment: its prompt preparation on each (name, file, chat template), payloads dumped.
PREPARE = """\
import json, sys
from transformers import AutoTokenizer
from specforge.data.prompt_builder import prepare_prompt_tasks

model, out, jobs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
tokenizer = AutoTokenizer.from_pretrained(model)  # as specforge.training.assembly loads the target's
result = {}
for name, path, template in jobs:
    tasks = prepare_prompt_tasks(path, tokenizer, chat_template=template, max_length=4096, is_preformatted=False,
                                 train_only_last_turn=False, cache_dir=None, cache_key=None, num_proc=1)
    result[name] = [task["payload"] for task in tasks]
json.dump(result, open(out, "w"))
"""


Row = dict[str, Any]  # a speculators-tokens row: id, input_ids, loss_mask


@pytest.fixture(scope="module")
def prepared(corpus: Corpus, tiny_model_dir: Path,  # noqa: F811
             tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, list[Row]], list[Row]]:
    """(SpecForge's rows by job, our speculators-tokens rows of the train split)."""
    python = specforge_python()
    directory = tmp_path_factory.mktemp("specforge")
    export_corpus(corpus, "specforge", directory / "specforge")
    export_corpus(corpus, "speculators-tokens", directory / "tokens")
    conversations, tokens = directory / "specforge" / "train.jsonl", directory / "tokens" / "train.jsonl"
    jobs = [["next-thinking", str(conversations), "qwen3-next-thinking"],
            ["thinking", str(conversations), "qwen3-thinking"], ["tokens", str(tokens), "qwen3-next-thinking"]]
    completed = subprocess.run([str(python), "-c", PREPARE, str(tiny_model_dir), str(directory / "out.json"),
                                orjson.dumps(jobs).decode()], capture_output=True, text=True, timeout=600,
                               env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                                    "HF_HOME": str(directory / "hf-home"), "TOKENIZERS_PARALLELISM": "false"})
    assert completed.returncode == 0, completed.stderr[-4000:]
    ours = [orjson.loads(line) for line in tokens.read_bytes().splitlines()]
    return orjson.loads((directory / "out.json").read_bytes()), ours


def expected_rows(ours: list[Row], newline: int, first_supervised: Callable[[list[int], int], int]
                  ) -> Counter[tuple[tuple[int, ...], tuple[int, ...]]]:
    """SpecForge's row for each conversation as our rows predict it: the render of the whole conversation (our
    last turn's ids, plus the "\\n" ChatML writes after its <|im_end|>) with every assistant turn supervised from
    ``first_supervised(ids, our first supervised position)`` through its <|im_end|> and that "\\n" (its regex runs
    to the end-of-turn string "<|im_end|>\\n")."""
    by_conversation: dict[str, list[Row]] = {}
    for row in ours:
        by_conversation.setdefault(row["id"].rsplit("/", 1)[0], []).append(row)
    expected: Counter[tuple[tuple[int, ...], tuple[int, ...]]] = Counter()
    for rows in by_conversation.values():
        rows.sort(key=lambda row: int(row["id"].rsplit("/", 1)[1]))
        ids = [*rows[-1]["input_ids"], newline]
        mask = [0] * len(ids)
        for row in rows:
            assert ids[:len(row["input_ids"])] == row["input_ids"]  # each turn's row is a prefix of the whole
            for position in range(first_supervised(ids, row["loss_mask"].index(1)), len(row["input_ids"]) + 1):
                mask[position] = 1
        expected[(tuple(ids), tuple(mask))] += 1
    return expected


def token_ids(tiny_model_dir: Path, *texts: str) -> list[int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    ids = [tokenizer.encode(text, add_special_tokens=False).ids for text in texts]
    assert all(len(found) == 1 for found in ids), ids
    return [found[0] for found in ids]


def rows_of(payloads: list[Row]) -> Counter[tuple[tuple[int, ...], tuple[int, ...]]]:
    return Counter((tuple(row["input_ids"]), tuple(row["loss_mask"])) for row in payloads)


def test_specforge_masks_the_export_as_our_token_rows(prepared: tuple[dict[str, list[Row]], list[Row]],
                                                      tiny_model_dir: Path) -> None:
    """With the template whose assistant header ends where the target's generation prompt does
    (qwen3-next-thinking: "<|im_start|>assistant\\n<think>\\n"), SpecForge supervises our tokens of every replayed
    turn plus the template's "\\n" after each <|im_end|> (never generated), but for one token: in a turn without
    reasoning the empty think block's first token "\\n\\n" straddles the header's last character, and SpecForge,
    which counts the header's tokens by tokenizing the text before the turn, leaves it out."""
    newline, blank, think = token_ids(tiny_model_dir, "\n", "\n\n", "<think>")
    theirs, ours = prepared

    def after_a_straddle(ids: list[int], start: int) -> int:
        return start + (ids[start] == blank and ids[start - 1] == think)

    assert rows_of(theirs["next-thinking"]) == expected_rows(ours, newline, after_a_straddle)
    straddled = sum(row["input_ids"][row["loss_mask"].index(1)] == blank for row in ours)
    assert 0 < straddled < len(ours)  # turns with reasoning and without it were both compared


def test_specforge_qwen3_thinking_also_supervises_the_prompts_think_opener(
        prepared: tuple[dict[str, list[Row]], list[Row]], tiny_model_dir: Path) -> None:
    """With qwen3-thinking (assistant header "<|im_start|>assistant\\n"), SpecForge also supervises the "<think>"
    that opens every turn in the target's generation prompt, and what follows it."""
    newline, think = token_ids(tiny_model_dir, "\n", "<think>")
    theirs, ours = prepared

    def from_the_opener(ids: list[int], start: int) -> int:
        return max(position for position in range(start) if ids[position] == think)

    assert rows_of(theirs["thinking"]) == expected_rows(ours, newline, from_the_opener)


def test_specforge_takes_the_token_rows_as_they_are(prepared: tuple[dict[str, list[Row]], list[Row]]) -> None:
    """`data.prompts_path` with our speculators-tokens file: SpecForge keeps every row unchanged."""
    theirs, ours = prepared
    assert rows_of(theirs["tokens"]) == rows_of(ours)
