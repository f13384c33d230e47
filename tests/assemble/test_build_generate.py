"""`corpus build` with prompt sources against a real vLLM server: the embedded launch, a build killed with
SIGKILL and resumed, a rebuild from the journal with no server, and the dry run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from corpus_builder.recipe import load_recipe
from corpus_builder.records import conversation_id
from corpus_builder.sources import iter_source
from corpus_builder.testing.processes import kill_all, watched
from tests.support.real_data import write_chitchat, write_gsm8k, write_rows

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]


def corpus(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", *args], capture_output=True, text=True)


def served_requests(base_url: str) -> float:
    """Finished requests so far, from the server's own Prometheus counter."""
    root = base_url.removesuffix("/v1")
    text = urllib.request.urlopen(f"{root}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def rows_of(out: Path) -> list[dict]:
    rows: list[dict] = []
    for path in sorted((out / "data").glob("*.parquet")):
        rows.extend(pq.read_table(path).to_pylist())
    return rows


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prompts")
    write_gsm8k(root / "gsm8k.parquet", 48, seed=3)
    chats = write_chitchat(root / "chat-all.jsonl", 12)
    # two user turns each: the second assistant turn is generated on the regenerated first one
    write_rows(root / "chat.jsonl", [{"id": c["id"], "messages": c["messages"][:3]} for c in chats])
    write_chitchat(root / "replay.jsonl.zst", 20)
    return root


def write_recipe(path: Path, data: Path, endpoints: list[str], tokenizer: Path, *, concurrency: int = 8,
                 max_tokens: int = 96, validation_fraction: float = 0.1, out: str = "out") -> Path:
    path.write_text(f"""\
name: gen-test
target:
  model: tiny-target
  tokenizer: {tokenizer}
  endpoints: {json.dumps(endpoints)}
  generation: {{max_tokens: {max_tokens}, concurrency: {concurrency}, on_length: keep, timeout_s: 120, max_retries: 2}}
sources:
  - {{name: replay, kind: replay, path: {data}/replay.jsonl.zst, license: MIT}}
  - {{name: gsm8k, kind: prompts, path: {data}/gsm8k.parquet, system_prompt: Think step by step., task: math}}
  - {{name: chat, kind: prompts, path: {data}/chat.jsonl, task: chat}}
checks: {{dedup: exact, on_unclosed_think: keep}}  # every prompt gives its row: none is dropped by chance
split: {{validation_fraction: {validation_fraction}, seed: 1}}
output: {{dir: {out}}}
""", encoding="utf-8")
    return path


def expected_generation(recipe_path: Path) -> tuple[set[str], int]:
    """The ids the generated rows must have, and the number of assistant turns to generate."""
    recipe = load_recipe(recipe_path)
    ids, turns = set(), 0
    for spec in recipe.sources:
        if spec.kind == "prompts":
            for prompt in iter_source(spec, recipe.base_dir):
                ids.add(conversation_id(prompt.source, prompt.messages))
                turns += sum(m.role == "user" for m in prompt.messages)
    return ids, turns


def test_build_killed_mid_generation_resumes_without_loss_or_duplicates(
        tmp_path: Path, prompt_files: Path, vllm_server, tiny_model_dir: Path) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", prompt_files, [vllm_server.base_url], tiny_model_dir,
                          concurrency=2)
    out = tmp_path / "out"
    journal = out / "journal"
    process = subprocess.Popen([sys.executable, "-m", "corpus_builder", "build", str(recipe)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        segments = list(journal.glob("segment-*.zst")) if journal.exists() else []
        if segments and sum(p.stat().st_size for p in segments) > 4096:
            break
        assert process.poll() is None, process.stderr.read().decode()[-3000:]
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (out / "manifest.json").exists()

    before = served_requests(vllm_server.base_url)
    resumed = corpus("build", str(recipe))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    requests_on_rerun = served_requests(vllm_server.base_url) - before
    rows = rows_of(out)
    generated = [row for row in rows if row["origin"] == "generated"]
    ids = [row["id"] for row in generated]
    assert len(ids) == len(set(ids))
    expected_ids, total_turns = expected_generation(recipe)
    assert set(ids) == expected_ids
    assert 0 < requests_on_rerun < total_turns  # the journal kept what finished before the kill
    for row in generated:
        generation = json.loads(row["provenance"])["generation"]
        assert generation["enable_thinking"] is True and generation["sampling"]["top_k"] == 20
        assert generation["engine_version"]
        for turn in generation["turns"]:
            assert turn["token_ids"] and turn["prompt_token_ids"]
            assert turn["endpoint"] == vllm_server.base_url
    for row in generated:  # every user turn got its regenerated answer, in order
        roles = [m["role"] for m in row["messages"] if m["role"] != "system"]
        assert roles == ["user", "assistant"] * (len(roles) // 2) and roles
    assert any(len(row["messages"]) == 4 for row in generated if row["source"] == "chat")

    # Changing only the split (or checks, or output) rebuilds from the journal: the endpoint is dead and
    # nothing is asked.
    offline = write_recipe(tmp_path / "offline.yaml", prompt_files, ["http://127.0.0.1:9/v1"], tiny_model_dir,
                           validation_fraction=0.3, out=str(out))
    rebuilt = corpus("build", str(offline))
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    again = {row["id"]: row["messages"] for row in rows_of(out) if row["origin"] == "generated"}
    assert again == {row["id"]: row["messages"] for row in generated}


def test_dry_run_probes_endpoints_and_estimates(tmp_path: Path, prompt_files: Path, vllm_server,
                                                 tiny_model_dir: Path) -> None:
    recipe = write_recipe(tmp_path / "recipe.yaml", prompt_files, [vllm_server.base_url], tiny_model_dir)
    before = served_requests(vllm_server.base_url)
    completed = corpus("build", str(recipe), "--dry-run")
    assert completed.returncode == 0, completed.stderr
    _, turns = expected_generation(recipe)
    assert f"{turns} requests" in completed.stdout
    assert f"endpoint {vllm_server.base_url}: healthy" in completed.stdout
    assert re.search(r"max_model_len 2048", completed.stdout)
    assert served_requests(vllm_server.base_url) == before
    assert not (tmp_path / "out" / "manifest.json").exists()
    dead = write_recipe(tmp_path / "dead.yaml", prompt_files, ["http://127.0.0.1:9/v1"], tiny_model_dir)
    refused = corpus("build", str(dead), "--dry-run")
    assert refused.returncode == 2 and "127.0.0.1:9" in refused.stdout
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(recipe.read_text().replace("model: tiny-target", "model: someone/else"))
    refused = corpus("build", str(wrong))
    assert refused.returncode == 2 and "does not serve model 'someone/else'" in refused.stderr


def test_embedded_launch_builds_the_quickstart_and_stops_the_server(tmp_path: Path, tiny_model_dir: Path) -> None:
    assert tiny_model_dir == REPO / ".cache" / "tiny-model" or os.environ.get("CORPUS_TEST_CACHE")
    out = tmp_path / "quickstart"
    quickstart = REPO / "recipes" / "quickstart.yaml"
    build = subprocess.Popen([sys.executable, "-m", "corpus_builder", "build", str(quickstart), "--out", str(out)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # Another program's vLLM-like server, started while the build runs, is none of the build's business.
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)",
                              "vllm.entrypoints.openai.api_server", "--model", str(tiny_model_dir)])
    try:
        with watched(build) as tree:
            stderr = build.communicate(timeout=900)[1]
        # Every process the build started (the API server and its engine core) is gone once it has exited.
        leftovers = {process.pid: tree.seen[process] for process in tree.alive()}
        assert decoy.poll() is None  # it ran throughout, looking like a server started after the build began
    finally:
        for process in (build, decoy):
            process.kill()
            process.wait()
        kill_all(tree.alive())
    assert build.returncode == 0, stderr[-3000:]
    assert "starting a local vLLM server" in stderr
    assert any("vllm.entrypoints.openai.api_server" in command for command in tree.seen.values())
    assert leftovers == {}
    audit = json.loads((out / "audit.json").read_text())
    assert audit["by_origin"]["generated"]["conversations"] > 20
    assert audit["thinking_share"] >= 0.2
    assert audit["by_split"]["validation"]["thinking_conversations"] > 0
    assert "Application startup complete" in (out / "journal" / "vllm-server.log").read_text()  # one ran
