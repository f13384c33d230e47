"""Every example in examples/ run as a user runs it, on the embedded default, so none of them rots: the recipes
built (the replay ones by the CLI, the prompts ones against the suite's vLLM servers, the tiny model's and the real
model's, the Ray one on a local cluster), the scripts run in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from corpus_builder.assemble import build_corpus
from corpus_builder.generate.launcher import launched_server
from corpus_builder.layout import Corpus
from corpus_builder.recipe import LaunchSpec, load_recipe
from corpus_builder.testing.tiny_model import SERVER_ARGS

from ..conftest import REAL_SERVED_MODEL, SERVED_MODEL, ServedModel
from ..support.ray_cluster import local_cluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def corpus_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=600)


def test_every_example_is_run_by_a_test_here() -> None:
    source = Path(__file__).read_text(encoding="utf-8")
    examples = sorted(path.name for path in EXAMPLES.iterdir() if path.suffix in (".yaml", ".py"))
    assert examples, "examples/ is empty"
    assert [name for name in examples if f'"{name}"' not in source] == []


def test_the_replay_only_recipe_builds_with_its_token_export(tmp_path: Path) -> None:
    built = corpus_cli("build", str(EXAMPLES / "replay_only.yaml"), "--out", str(tmp_path / "corpus"))
    assert built.returncode == 0, built.stderr
    corpus = Corpus.open(tmp_path / "corpus")
    sources = Counter(conversation.source for conversation in corpus.iter_conversations())
    assert set(sources) == {"workload-chat", "traffic"}
    assert all(conversation.origin == "replay" for conversation in corpus.iter_conversations())
    drops = corpus.ledger_drops().by_reason
    assert drops["folded_prefix"] > 0 and drops["duplicate"] > 0  # the log's chats folded; its copies of the dump
    exported = (tmp_path / "corpus" / "exports" / "speculators-tokens" / "train.jsonl").read_text().splitlines()
    assert exported and {"input_ids", "loss_mask"} <= set(json.loads(exported[0]))


def test_the_serving_logs_recipe_folds_each_chat_and_holds_out_its_eval_pack(tmp_path: Path) -> None:
    audited = corpus_cli("audit", str(EXAMPLES / "data" / "serving-log.jsonl"), "--json")
    assert audited.returncode == 0, audited.stderr
    raw = json.loads(audited.stdout)
    built = corpus_cli("build", str(EXAMPLES / "serving_logs.yaml"), "--out", str(tmp_path / "corpus"))
    assert built.returncode == 0, built.stderr
    corpus = Corpus.open(tmp_path / "corpus")
    pack = list(corpus.pack_conversations())
    assert len(pack) == 6
    assert raw["conversations"] == corpus.manifest.conversations + len(pack)  # one conversation per chat, each once
    assert corpus.ledger_drops().by_reason["folded_prefix"] == raw["skipped"]["folded_prefix"] > 0
    assert {row.id for row in pack}.isdisjoint(row.id for row in corpus.iter_conversations())


def test_the_api_script_runs_end_to_end_in_an_empty_directory(tmp_path: Path) -> None:
    ran = subprocess.run([sys.executable, str(EXAMPLES / "api_end_to_end.py"), str(tmp_path)], capture_output=True,
                         text=True, cwd=REPO, timeout=300, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0] == "built 20 conversations, 50% thinking, into out/api-example"
    assert "checks: all passed" in lines
    read_back = [line.split() for line in lines if line.endswith("'assistant']")]
    assert len(read_back) == 20 and Counter(words[1] for words in read_back) == {"True": 10, "False": 10}
    assert (tmp_path / "out" / "speculators" / "train.jsonl").exists()


@pytest.mark.vllm
def test_the_prompts_recipe_regenerates_on_the_target_with_a_share_thinking_off(vllm_server: ServedModel,
                                                                                 tmp_path: Path) -> None:
    """The recipe as shipped, its target pointed at the suite's server instead of a server of its own (launch is the
    quickstart's, tested there)."""
    recipe = yaml.safe_load((EXAMPLES / "regenerate_prompts.yaml").read_text())
    assert recipe["target"]["model"] == SERVED_MODEL
    del recipe["target"]["launch"]
    recipe["target"]["endpoints"] = [vllm_server.base_url]
    recipe["target"]["tokenizer"] = str((EXAMPLES / recipe["target"]["tokenizer"]).resolve())
    for source in recipe["sources"]:  # the copy lives elsewhere: its paths made absolute
        source["path"] = str((EXAMPLES / source["path"]).resolve())
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    result = build_corpus(load_recipe(tmp_path / "recipe.yaml"), tmp_path / "corpus")
    rows = list(Corpus.open(result.out_dir).iter_conversations())
    assert rows and all(row.origin == "generated" for row in rows)
    modes = Counter((row.source, row.provenance["generation"]["enable_thinking"]) for row in rows)
    assert modes[("gsm8k", False)] > 0 and modes[("gsm8k", True)] > 0  # thinking_off_share: 0.25
    assert modes[("chat-prompts", False)] == 0


@pytest.mark.vllm
def test_the_real_model_recipe_answers_every_user_turn_without_thinking(real_vllm_server: ServedModel,
                                                                       tmp_path: Path) -> None:
    """examples/regenerate_real.yaml, its target pointed at the suite's real-model server: every conversation of the
    chat prompts kept, each user turn answered by the model (thinking off: it has no thinking mode), in the order
    the conversation had them, and the token export written from the served ids."""
    recipe = yaml.safe_load((EXAMPLES / "regenerate_real.yaml").read_text())
    assert recipe["target"]["model"] == REAL_SERVED_MODEL
    assert recipe["target"]["generation"]["enable_thinking"] is False
    del recipe["target"]["launch"]
    recipe["target"]["endpoints"] = [real_vllm_server.base_url]
    recipe["target"]["tokenizer"] = str(real_vllm_server.model_dir)
    for source in recipe["sources"]:
        source["path"] = str((EXAMPLES / source["path"]).resolve())
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    result = build_corpus(load_recipe(tmp_path / "recipe.yaml"), tmp_path / "corpus")
    rows = list(Corpus.open(result.out_dir).iter_conversations())
    prompts = [json.loads(line) for line in (REPO / "recipes" / "data" / "chat-prompts.jsonl").read_text().splitlines()]
    user_turns = {row["id"]: sum(m["role"] == "user" for m in row["messages"]) for row in prompts}
    assert sorted(row.provenance["source_id"] for row in rows) == sorted(user_turns)
    for row in rows:
        turns = user_turns[row.provenance["source_id"]]
        assert row.origin == "generated" and row.provenance["generation"]["enable_thinking"] is False
        assert [m.role for m in row.messages] == ["user", "assistant"] * turns
        assert not any(m.reasoning for m in row.messages)
        assert len(row.provenance["generation"]["turns"]) == turns
    exported = (result.out_dir / "exports" / "speculators-tokens" / "train.jsonl").read_text().splitlines()
    assert len(exported) == sum(user_turns.values())  # one row per answer: a turn's served ids


@pytest.fixture(scope="module")
def speculating_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The tiny target drafting for itself, with per-request counts: a head whose every drafted token is accepted."""
    speculative = {"method": "draft_model", "model": str(tiny_model_dir), "num_speculative_tokens": 3}
    spec = LaunchSpec(model_dir=tiny_model_dir, startup_timeout_s=600.0, env={"VLLM_CPU_KVCACHE_SPACE": "1"},
                      args=(*SERVER_ARGS, "--speculative-config", json.dumps(speculative),
                            "--per-request-spec-decode-metrics", "summary"))
    with launched_server(spec, SERVED_MODEL, log_path=tmp_path_factory.mktemp("spec") / "server.log") as server:
        yield server.url


@pytest.mark.vllm
def test_the_eval_script_compares_two_heads_on_the_serving_logs_pack(speculating_server: str, tmp_path: Path) -> None:
    """One speculating server given as both heads (the machine serves one at a time): B / A about 1 at temperature
    0 (vllm-cpu's draft and verify passes are not bit-identical, so a near-tie may flip one token), over the pack's 6
    prompts: too few for an interval, which the script says."""
    built = corpus_cli("build", str(EXAMPLES / "serving_logs.yaml"), "--out", str(tmp_path / "corpus"))
    assert built.returncode == 0, built.stderr
    ran = subprocess.run([sys.executable, str(EXAMPLES / "eval_two_heads.py"), str(tmp_path / "corpus"),
                          speculating_server, speculating_server, "--save-dir", str(tmp_path / "runs"),
                          "--max-tokens", "16"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert ran.returncode == 0, ran.stderr
    summaries = [line.split(" ") for line in ran.stdout.splitlines() if "head B / head A acceptance rate" in line]
    assert [words[0] for words in summaries] == ["thinking:", "non-thinking:"]
    for words in summaries:
        assert " ".join(words[1:9]) == "head B / head A acceptance rate (pooled)"
        assert 0.9 <= float(words[9]) <= 1 / 0.9
        assert " ".join(words[10:]) == "(no interval, 6 prompts)"
    assert len(list((tmp_path / "runs").glob("*.json"))) == 1


def test_the_ray_recipe_builds_the_corpus_the_local_engine_builds(tmp_path: Path) -> None:
    """examples/ray_build.yaml on a local cluster against examples/replay_only.yaml (the same sources and checks) on
    this machine: the same rows in the same splits, the same drops."""
    with local_cluster():
        on_ray = build_corpus(load_recipe(EXAMPLES / "ray_build.yaml"), tmp_path / "ray")
    local = build_corpus(load_recipe(EXAMPLES / "replay_only.yaml"), tmp_path / "local")
    assert on_ray.manifest.splits == local.manifest.splits

    def rows(out: Path) -> set[tuple[str, str]]:
        return {(row.id, row.split) for row in Corpus.open(out).iter_conversations()}

    assert rows(on_ray.out_dir) == rows(local.out_dir)
    assert Corpus.open(on_ray.out_dir).ledger_drops().by_reason == Corpus.open(local.out_dir).ledger_drops().by_reason
