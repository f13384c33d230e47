"""The reliability trials' fast variants (scripts/trials.py runs the long ones; RELIABILITY.md has the counts)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from corpus_builder.testing.processes import ProcessTree, kill_all
from tests.support import trials


def test_a_fault_storm_loses_nothing_and_keeps_retries_in_bounds(tmp_path: Path) -> None:
    outcome = trials.fault_storm(tmp_path, seed=1, prompts=20)
    assert outcome.problems == []
    assert outcome.completed_first_time or outcome.failed_loudly
    assert outcome.restarted_served > 0 and outcome.max_attempts <= 9


@pytest.mark.vllm
def test_a_build_killed_at_random_moments_resumes_exactly(tmp_path: Path, vllm_server, tiny_model_dir: Path) -> None:
    trials.write_prompts(tmp_path / "prompts.jsonl", 24)
    recipe = trials.write_recipe(tmp_path / "recipe.yaml", prompts=tmp_path / "prompts.jsonl",
                                 endpoints=[vllm_server.base_url], tokenizer=tiny_model_dir, out=tmp_path / "out",
                                 timeout_s=120, concurrency=4)
    expected = trials.prompt_row_ids(recipe)
    for seed in (3, 4):
        outcome = trials.kill_and_resume(recipe, tmp_path / "out", seed=seed, expected_ids=expected, horizon_s=4.0,
                                         scratch=tmp_path / "scratch")
        assert outcome.problems == [] and outcome.orphans == []


@pytest.mark.vllm
def test_a_launched_server_killed_mid_build_stops_it_at_once(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The build notices the server is gone at the first failed request (not after every row's retries), says
    so with the server log's tail, writes nothing, and a rerun completes from the journal."""
    trials.write_prompts(tmp_path / "prompts.jsonl", 40)
    recipe = trials.write_recipe(tmp_path / "recipe.yaml", prompts=tmp_path / "prompts.jsonl",
                                 launch=tiny_model_dir, out=tmp_path / "out", timeout_s=120, max_retries=6,
                                 max_outage_s=600, concurrency=2, max_tokens=96)
    process = subprocess.Popen([sys.executable, "-m", "corpus_builder", "build", str(recipe)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    journal = tmp_path / "out" / "journal"
    deadline = time.monotonic() + 300
    while not list(journal.glob("segment-*.zst")) and time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        time.sleep(0.2)
    tree = ProcessTree(process.pid)
    tree.sample()
    servers = tree.alive()  # the server and its engine core
    assert any("vllm" in " ".join(server.cmdline()) for server in servers), "no launched server found"
    killed_at = time.monotonic()
    kill_all(servers)
    stderr = process.communicate(timeout=120)[1]
    assert time.monotonic() - killed_at < 30
    assert process.returncode == 3, stderr[-3000:]
    assert "the vLLM server exited" in stderr and "rerun to resume" in stderr and "Traceback" not in stderr
    assert not (tmp_path / "out" / "manifest.json").exists()
    rerun = trials.run_build(recipe)
    assert rerun.returncode == 0, rerun.stderr[-3000:]

