"""The orchestrator decides once: prompt sources are read once per build, the target's renderer is loaded
once per build, a complete journal rebuilds with no backend, and every long phase shows progress."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from corpus_builder.assemble import build_corpus, plan_build
from corpus_builder.layout import Corpus
from corpus_builder.recipe import load_recipe
from corpus_builder.sources.formats import Format
from corpus_builder.testing.fault_server import FaultServer
from corpus_builder.tokens import template
from tests.support.real_data import write_chitchat, write_rows
from tests.support.trials import shard_hashes

MODEL = "tiny-target"


@pytest.fixture()
def server() -> FaultServer:
    with FaultServer(model=MODEL) as running:
        yield running


def write_recipe(root: Path, endpoint: str, tokenizer: Path) -> Path:
    write_chitchat(root / "replay.jsonl", 30)
    write_rows(root / "prompts.jsonl", [{"messages": [{"role": "user", "content": f"question {i}?"},
                                                      {"role": "assistant", "content": "old answer"},
                                                      {"role": "user", "content": f"and then {i}?"}]}
                                        for i in range(12)])
    path = root / "recipe.yaml"
    path.write_text(f"""\
name: once
target:
  model: {MODEL}
  tokenizer: {tokenizer}
  endpoints: [{endpoint}]
  generation: {{max_tokens: 32, concurrency: 4, timeout_s: 10, max_retries: 1, on_length: keep}}
sources:
  - {{name: replay, kind: replay, path: replay.jsonl}}
  - {{name: prompts, kind: prompts, path: prompts.jsonl}}
checks: {{max_seq_len: 4096}}
split: {{validation_fraction: 0.2, seed: 0}}
output:
  dir: out
  exports: [{{format: speculators-tokens}}, {{format: messages}}]
""", encoding="utf-8")
    return path


@pytest.fixture()
def counted(monkeypatch: pytest.MonkeyPatch) -> tuple[Counter[str], Counter[str]]:
    """Files opened by the readers (by name) and renderers constructed (by tokenizer directory)."""
    opened: Counter[str] = Counter()
    renderers: Counter[str] = Counter()
    real_rows, real_init = Format.read, template.TemplateRenderer.__init__

    def rows(self, path, *args, **kwargs):  # type: ignore[no-untyped-def]
        opened[Path(path).name] += 1
        return real_rows(self, path, *args, **kwargs)

    def init(self, tokenizer_dir, *args, **kwargs):  # type: ignore[no-untyped-def]
        renderers[str(tokenizer_dir)] += 1
        real_init(self, tokenizer_dir, *args, **kwargs)

    monkeypatch.setattr(Format, "read", rows)
    monkeypatch.setattr(template.TemplateRenderer, "__init__", init)
    # The rows read in this process, where the spies count them (a tokenized build forks a reader per core).
    monkeypatch.setenv("CORPUS_WORKERS", "1")
    return opened, renderers


def test_a_build_reads_prompts_once_and_loads_the_renderer_once(tmp_path: Path, tiny_model_dir: Path,
                                                                 server: FaultServer, counted) -> None:
    opened, renderers = counted
    recipe = load_recipe(write_recipe(tmp_path, server.base_url, tiny_model_dir))
    stream = io.StringIO()
    result = build_corpus(recipe, progress=stream)
    assert opened == {"replay.jsonl": 1, "prompts.jsonl": 1}
    assert sum(renderers.values()) == 1  # checks, token statistics and the speculators-tokens export share it
    assert len(server.chat_requests) == 24  # two user turns per prompt, each answered once
    assert result.manifest.conversations > 0 and [e.format for e in result.exports] == ["speculators-tokens",
                                                                                            "messages"]
    lines = stream.getvalue().splitlines()
    assert any(line.startswith("read replay 30 rows") for line in lines)
    assert any(line.startswith("generate 12/12 rows (100.0%)") for line in lines)
    kept = result.manifest.conversations
    assert any(line.startswith(f"export speculators-tokens {kept}/{kept} conversations (100.0%)") for line in lines)
    assert any(line.startswith("endpoint ") and "healthy" in line for line in lines)  # the preflight ran


def test_a_rebuild_from_a_complete_journal_sends_nothing_and_still_reads_once(
        tmp_path: Path, tiny_model_dir: Path, server: FaultServer, counted) -> None:
    opened, renderers = counted
    recipe = load_recipe(write_recipe(tmp_path, server.base_url, tiny_model_dir))
    first = build_corpus(recipe, progress=io.StringIO())
    shards = {f.path: f.sha256 for f in first.manifest.files}
    requests, health = len(server.chat_requests), len(server.requests)
    opened.clear()
    renderers.clear()
    server.dead = True  # a rebuild needs no server: none is probed, none is asked
    stream = io.StringIO()
    again = build_corpus(recipe, progress=stream)
    assert opened == {"replay.jsonl": 1, "prompts.jsonl": 1} and sum(renderers.values()) == 1
    assert len(server.chat_requests) == requests and len(server.requests) == health
    assert {f.path: f.sha256 for f in again.manifest.files} == shards
    assert "endpoint " not in stream.getvalue()  # no preflight: the journal answered everything
    assert Corpus.open(again.out_dir).verify_files() == []


def test_the_dry_run_reads_every_source_once(tmp_path: Path, tiny_model_dir: Path, server: FaultServer,
                                              counted) -> None:
    opened, renderers = counted
    recipe = load_recipe(write_recipe(tmp_path, server.base_url, tiny_model_dir))
    build_corpus(recipe, progress=io.StringIO())
    opened.clear()
    renderers.clear()
    plan = plan_build(recipe)
    assert opened == {"replay.jsonl": 1, "prompts.jsonl": 1} and sum(renderers.values()) == 1
    assert plan.journal_cached_rows == 12 and plan.requests == 24
    assert [s.name for s in plan.sources] == ["replay", "prompts"]
    assert not server.chat_requests[24:]  # the dry run asked nothing
    assert plan.prompts_measured == 12 and plan.prompts_over_context == 0


def build_in_process(recipe: Path, out: Path, hash_seed: str) -> dict[str, str]:
    """Shard sha256s of `corpus build` in a process of its own with the given PYTHONHASHSEED."""
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe), "--out", str(out)],
                               capture_output=True, text=True, env=env)
    assert completed.returncode == 0, completed.stderr[-2000:]
    return shard_hashes(out)


def test_rebuilds_are_byte_identical_across_processes_and_from_the_journal(tmp_path: Path, tiny_model_dir: Path,
                                                                          server: FaultServer) -> None:
    """Nothing may depend on the process: a split or an order seeded from Python's hash() would differ here."""
    recipe = write_recipe(tmp_path, server.base_url, tiny_model_dir)
    first = build_in_process(recipe, tmp_path / "out", "1")
    requests = len(server.chat_requests)
    server.die()  # the second build has only the journal
    rebuilt = build_in_process(recipe, tmp_path / "out", "2")
    assert rebuilt == first and len(server.chat_requests) == requests
    (tmp_path / "second").mkdir()
    shutil.copytree(tmp_path / "out" / "journal", tmp_path / "second" / "journal")
    assert build_in_process(recipe, tmp_path / "second", "3") == first  # another directory, the same journal
