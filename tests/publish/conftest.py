"""The publish tests' corpus (built once by `corpus build`, copied per test) and loopback Hub."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus_builder.assemble import build_corpus
from corpus_builder.hub import RetryPolicy
from corpus_builder.recipe import load_recipe
from corpus_builder.testing.hub_server import HubServer

TOKEN = "hf_PublishTestTokenDoNotLeak0123456789xyz"
FAST = RetryPolicy(attempts=3, base_delay_s=0.01, max_delay_s=0.02)
RECIPE = """
name: tiny-mix
description: A tiny mixture for publish tests.
target: {model: Org/Model-1B, revision: abc123}
sources:
  - {name: math, kind: replay, path: math.jsonl, license: Apache-2.0, task: math}
  - {name: chat, kind: replay, path: chat.jsonl, license: MIT}
checks: {min_thinking_share: 0.3}
split: {validation_fraction: 0.2}
output: {dir: out, rows_per_shard: 20}
"""


@pytest.fixture(scope="module")
def built_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A corpus written by `corpus build` (replay sources only): 60 conversations, a third thinking."""
    root = tmp_path_factory.mktemp("recipe")
    math = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"},
                          {"role": "assistant", "content": str(2 * i),
                           **({"reasoning": f"Add {i} to itself."} if i % 2 == 0 else {})}]} for i in range(40)]
    chat = [{"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": f"hello {i}"}]}
            for i in range(20)]
    (root / "math.jsonl").write_text("".join(json.dumps(r) + "\n" for r in math))
    (root / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    (root / "recipe.yaml").write_text(RECIPE)
    result = build_corpus(load_recipe(root / "recipe.yaml"))
    assert result.passed
    return result.out_dir


@pytest.fixture(scope="module")
def packed_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A built corpus that holds out an eval pack of 5 conversations."""
    root = tmp_path_factory.mktemp("packed")
    rows = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"},
                          {"role": "assistant", "content": str(2 * i)}]} for i in range(30)]
    (root / "math.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "recipe.yaml").write_text(
        "name: packed\ntarget: {model: Org/Model-1B}\n"
        "sources:\n  - {name: math, kind: replay, path: math.jsonl, license: MIT, task: math}\n"
        "eval: {rows: 5}\nsplit: {validation_fraction: 0.2}\noutput: {dir: out, rows_per_shard: 20}\n")
    return build_corpus(load_recipe(root / "recipe.yaml")).out_dir


@pytest.fixture
def corpus(built_corpus: Path, tmp_path: Path) -> Path:
    """A private copy each test may tamper with."""
    return Path(shutil.copytree(built_corpus, tmp_path / "corpus"))


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubServer]:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no token file of the machine's user
    with HubServer(token=TOKEN) as server:
        yield server


def edit_json(corpus: Path, name: str, edit: Callable[[dict[str, Any]], Any]) -> None:
    """Change one of the corpus's JSON files (manifest.json, audit.json) in place."""
    document = json.loads((corpus / name).read_text())
    edit(document)
    (corpus / name).write_text(json.dumps(document))


def seal_shard(corpus: Path, path: str) -> None:
    """Record a shard's present size and sha256 in the manifest, as whoever tampered with it would."""
    shard = corpus / path

    def update(manifest: dict[str, Any]) -> None:
        for entry in manifest["files"]:
            if entry["path"] == path:
                entry.update(bytes=shard.stat().st_size, sha256=hashlib.sha256(shard.read_bytes()).hexdigest())

    edit_json(corpus, "manifest.json", update)


def rewrite_shard(corpus: Path, path: str, mutate: Callable[[list[dict[str, Any]]], None], *,
                  keep_schema: bool = True) -> None:
    """Change rows of a shard and update the manifest, so only the row-level check can object; with
    keep_schema=False the columns are whatever the changed rows hold (an added column stays)."""
    table = pq.read_table(corpus / path)
    rows = table.to_pylist()
    mutate(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema if keep_schema else None), corpus / path)
    seal_shard(corpus, path)
