"""EAGLE-3 measured like any other speculator: a random Eagle3 head built by speculators (0.9.0, in its own venv)
for the tiny model, served by a real vLLM (CPU) server, and `corpus eval` run against it at T=0.

One server for the module (about 40 s and 3 GB), with /server_info open (VLLM_SERVER_DEV_MODE=1) so it names its
speculator. Needs speculators: ``scripts/speculators_env.sh`` (``SPECULATORS_PYTHON`` points elsewhere); without it
the test is skipped, in CI it fails.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from corpus_builder.generate.launcher import launched_server
from corpus_builder.recipe import LaunchSpec
from corpus_builder.testing.eagle3_head import SPECULATIVE_TOKENS, build_eagle3_head
from corpus_builder.testing.tiny_model import SERVER_ARGS

from ..conftest import SERVED_MODEL
from ..support.trainers import speculators_python
from .conftest import chat_rows, write_jsonl

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def eagle3_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    speculators_python()
    head = build_eagle3_head(tiny_model_dir, tmp_path_factory.mktemp("eagle3") / "head")
    speculative = {"method": "eagle3", "model": str(head), "num_speculative_tokens": SPECULATIVE_TOKENS}
    spec = LaunchSpec(model_dir=tiny_model_dir, args=(*SERVER_ARGS, "--speculative-config", json.dumps(speculative)),
                      env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1"}, startup_timeout_s=600.0)
    log_path = tmp_path_factory.mktemp("eagle3-server") / "server.log"
    with launched_server(spec, SERVED_MODEL, log_path=log_path) as server:
        yield server.url


def test_an_eagle3_head_is_measured_like_any_other_speculator(eagle3_server: str, tmp_path: Path) -> None:
    pack = write_jsonl(tmp_path / "pack.jsonl",
                       chat_rows(3, source="code", task="coding") + chat_rows(2, source="chat"))
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "eval", str(pack), "--endpoint", eagle3_server,
                                "--temperature", "0", "--max-tokens", "48", "--save-dir", str(tmp_path / "runs"),
                                "--json"], capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stderr
    run = json.loads(completed.stdout)
    assert run["endpoints"][0]["speculator"] == {"told_by": "/server_info", "method": "eagle3",
                                                 "model": run["endpoints"][0]["speculator"]["model"],
                                                 "num_speculative_tokens": SPECULATIVE_TOKENS}
    assert run["endpoints"][0]["speculator"]["model"].endswith("head")
    for mode in ("thinking", "non-thinking"):
        for group in ("all", "source:code", "task:coding", "source:chat"):
            measured = next(f for f in run["figures"] if (f["mode"], f["group"]) == (mode, group))
            assert measured["method"] == "eagle3"
            assert measured["draft_tokens"] > 0, measured
            assert 0.0 <= measured["acceptance_rate_pooled"] <= 1.0
            positions = measured["acceptance_by_position"]
            assert len(positions) == SPECULATIVE_TOKENS
            assert all(later <= earlier for earlier, later in itertools.pairwise(positions)), positions
        print(mode, {k: measured[k] for k in ("acceptance_rate_pooled", "mean_acceptance_length_pooled",
                                              "acceptance_by_position", "draft_tokens", "output_tokens_per_s")})
    assert len(list((tmp_path / "runs").glob("*.json"))) == 1
