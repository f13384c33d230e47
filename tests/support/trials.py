"""Reliability trials: a build killed at random moments, and a build through a storm of faults.

Each trial returns an outcome that says what happened and checks what must hold whatever happened: every
row arrives exactly once, or the build fails loudly and a rerun completes it. The fast variants run in CI
(tests/assemble/test_trials.py); ``scripts/trials.py`` runs the long ones and prints the counts that
RELIABILITY.md records.
"""

from __future__ import annotations

import io
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from corpus_builder.generate import GenerationIncomplete
from corpus_builder.layout import Corpus, iter_ledger
from corpus_builder.testing.fault_server import FaultServer
from corpus_builder.testing.processes import watched
from corpus_builder.testing.tiny_model import SERVER_ARGS

# Every way the fault server fails a request, each for this share of the requests.
FAULT_MIX = {kind: 0.1 for kind in ("429", "500", "503", "reset", "stall", "truncated")}
MODEL = "tiny-target"


def write_prompts(path: Path, count: int) -> None:
    """Two-turn prompts: the second turn is generated on the regenerated first one."""
    rows = [{"messages": [{"role": "user", "content": f"question {i}: what is {i} plus {i}?"},
                          {"role": "assistant", "content": "(regenerated)"},
                          {"role": "user", "content": f"and {i} times {i}?"}]} for i in range(count)]
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))


def write_recipe(path: Path, *, prompts: Path, endpoints: list[str] | None = None, launch: Path | None = None,
                 tokenizer: Path | None = None, out: Path, max_retries: int = 8, timeout_s: float = 2.0,
                 max_outage_s: float = 30.0, concurrency: int = 8, max_tokens: int = 48) -> Path:
    target = [f"  model: {MODEL}"]
    if tokenizer is not None:
        target.append(f"  tokenizer: {tokenizer}")
    if endpoints:
        target.append(f"  endpoints: {orjson.dumps(endpoints).decode()}")
    if launch is not None:
        target.append(f"  launch: {{model_dir: {launch}, args: {orjson.dumps(SERVER_ARGS).decode()}}}")
    target.append(f"  generation: {{max_tokens: {max_tokens}, concurrency: {concurrency}, on_length: keep, "
                  f"timeout_s: {timeout_s}, max_retries: {max_retries}, max_outage_s: {max_outage_s}}}")
    path.write_text("name: trial\ntarget:\n" + "\n".join(target) + f"""
sources:
  - {{name: asks, kind: prompts, path: {prompts}, task: chat}}
split: {{validation_fraction: 0.2, seed: 0}}
output: {{dir: {out}}}
""", encoding="utf-8")
    return path


def corpus_rows(out: Path) -> list[tuple[str, str | None, list[tuple[str, str, str | None]]]]:
    return [(c.id, c.split, [(m.role, m.content, m.reasoning) for m in c.messages])
            for c in Corpus.open(out).iter_conversations()]


def shard_hashes(out: Path) -> dict[str, str]:
    return {f.path: f.sha256 for f in Corpus.open(out).manifest.files}


def run_build(recipe: Path, *, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe)], capture_output=True,
                          text=True, env={**os.environ, **(env or {})})


@dataclass
class KillOutcome:
    seed: int
    killed_after_s: float
    finished_before_kill: bool = False
    journaled_before_kill: int = 0
    orphans: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def kill_and_resume(recipe: Path, out: Path, *, seed: int, expected_ids: set[str], horizon_s: float,
                    scratch: Path) -> KillOutcome:
    """Start `corpus build`, SIGKILL it at a seeded random moment within ``horizon_s``, then rerun it. Must hold:
    a killed build never looks complete, no server outlives it, the rerun accounts for exactly ``expected_ids``
    (the id of every row the prompts make), each once, written or in the ledger, and its shards are byte for
    byte what a journal-only rebuild of the same journal writes elsewhere."""
    moment = random.Random(seed).uniform(0.05, horizon_s)
    outcome = KillOutcome(seed, round(moment, 3))
    process = subprocess.Popen([sys.executable, "-m", "corpus_builder", "build", str(recipe)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    with watched(process) as tree:
        try:
            process.wait(timeout=moment)
            outcome.finished_before_kill = True
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGSTOP)  # frozen, it starts nothing between the last look and the kill
            tree.sample()
            process.send_signal(signal.SIGKILL)
            process.wait()
            if (out / "manifest.json").exists() and Corpus.open(out).verify_files():
                outcome.problems.append("a killed build left a manifest that does not match its files")
    journal = out / "journal"
    outcome.journaled_before_kill = _journal_records(journal)
    # A launched server gets SIGTERM when the build dies; give it its stop grace.
    outcome.orphans = [orphan.pid for orphan in tree.wait_gone(60)]
    resumed = run_build(recipe)
    if resumed.returncode != 0:
        outcome.problems.append(f"the rerun failed: {resumed.stderr[-1500:]}")
        return outcome
    # Every row is accounted for exactly once: written, or dropped with its reason in the ledger (which rows a
    # check drops depends on what the target sampled).
    ids = [row_id for row_id, _, _ in corpus_rows(out)]
    ids += [record["id"] for record in iter_ledger(out / "ledger.jsonl.zst") if record["id"] is not None]
    if len(ids) != len(set(ids)):
        outcome.problems.append("a row is duplicated")
    if set(ids) != expected_ids:
        outcome.problems.append(f"rows lost or foreign: {len(expected_ids - set(ids))} missing, "
                                f"{len(set(ids) - expected_ids)} unexpected")
    rebuild = scratch / f"rebuild-{seed}"
    shutil.rmtree(rebuild, ignore_errors=True)
    rebuild.mkdir(parents=True)
    shutil.copytree(journal, rebuild / "journal", ignore=shutil.ignore_patterns("lock", "*.log"))
    offline = subprocess.run([sys.executable, "-m", "corpus_builder", "build", str(recipe), "--out", str(rebuild)],
                             capture_output=True, text=True)
    if offline.returncode != 0:
        outcome.problems.append(f"the journal-only rebuild failed: {offline.stderr[-1500:]}")
    elif shard_hashes(rebuild) != shard_hashes(out):
        outcome.problems.append("the resumed corpus is not what its journal rebuilds to")
    return outcome


def _journal_records(journal: Path) -> int:
    if not journal.is_dir():
        return 0
    from corpus_builder.generate import Journal

    with Journal(journal) as opened:
        return len(opened)


@dataclass
class FaultOutcome:
    seed: int
    completed_first_time: bool = False
    failed_loudly: str = ""  # the error of a run that did not complete
    unfinished_rows: int = 0
    max_attempts: int = 0  # most attempts any one request took, over both endpoints
    restarted_served: int = 0  # requests the killed-and-restarted endpoint answered after it came back
    problems: list[str] = field(default_factory=list)


def fault_storm(workdir: Path, *, seed: int, prompts: int, max_retries: int = 8) -> FaultOutcome:
    """A build over two endpoints that each fail 10% of requests in every way (429 with Retry-After, 500, 503,
    reset, a stall past the timeout, a truncated body); one endpoint is killed mid-run and restarted. Must hold:
    every row arrives (identical to a fault-free build) or the build fails loudly naming the unfinished rows and
    a rerun completes it; no request takes more attempts than its retries allow; the restarted endpoint serves."""
    workdir.mkdir(parents=True, exist_ok=True)
    write_prompts(workdir / "prompts.jsonl", prompts)
    outcome = FaultOutcome(seed)
    from corpus_builder.assemble import build_corpus
    from corpus_builder.recipe import load_recipe

    with FaultServer(model=MODEL) as clean:
        reference = build_corpus(load_recipe(write_recipe(workdir / "reference.yaml", prompts=workdir / "prompts.jsonl",
                                                          endpoints=[clean.base_url], out=workdir / "reference")),
                                 progress=io.StringIO())
    with FaultServer(model=MODEL, fault_mix=FAULT_MIX, seed=seed, stall_s=3.0) as a, \
            FaultServer(model=MODEL, fault_mix=FAULT_MIX, seed=seed + 1000, stall_s=3.0) as b:
        recipe = load_recipe(write_recipe(workdir / "storm.yaml", prompts=workdir / "prompts.jsonl",
                                          endpoints=[a.base_url, b.base_url], out=workdir / "storm",
                                          max_retries=max_retries, timeout_s=1.0))
        revived_at = {"requests": -1}
        killer = threading.Thread(target=_kill_and_restart, args=(a, prompts // 2, revived_at), daemon=True)
        killer.start()
        try:
            build_corpus(recipe, progress=io.StringIO())
            outcome.completed_first_time = True
        except GenerationIncomplete as error:
            outcome.failed_loudly = str(error).splitlines()[0]
            outcome.unfinished_rows = error.unfinished_rows or 0
        killer.join(timeout=60)
        outcome.max_attempts = max(_attempts(a, b).values(), default=0)
        if revived_at["requests"] >= 0:
            outcome.restarted_served = len(a.chat_requests) - revived_at["requests"]
        if not outcome.completed_first_time:
            a.fault_mix.clear()
            b.fault_mix.clear()
            build_corpus(recipe, progress=io.StringIO())  # the rerun after a loud failure
    if corpus_rows(workdir / "storm") != corpus_rows(reference.out_dir):
        outcome.problems.append("the rows differ from a fault-free build")
    if outcome.max_attempts > max_retries + 1:
        outcome.problems.append(f"a request took {outcome.max_attempts} attempts (retries allow {max_retries + 1})")
    if revived_at["requests"] < 0:
        outcome.problems.append("the endpoint was never killed (the run ended first)")
    elif outcome.restarted_served == 0:
        outcome.problems.append("the restarted endpoint never served again")
    return outcome


def _kill_and_restart(server: FaultServer, after_requests: int, revived_at: dict[str, int]) -> None:
    deadline = time.monotonic() + 120
    while len(server.chat_requests) < after_requests and time.monotonic() < deadline:
        time.sleep(0.01)
    server.die()
    time.sleep(1.5)
    server.revive()
    revived_at["requests"] = len(server.chat_requests)


def _attempts(*servers: FaultServer) -> dict[bytes, int]:
    """Attempts per distinct request body, over every endpoint (a retry repeats the body exactly)."""
    counts: dict[bytes, int] = {}
    for server in servers:
        for request in server.chat_requests:
            key = orjson.dumps(request.body, option=orjson.OPT_SORT_KEYS)
            counts[key] = counts.get(key, 0) + 1
    return counts


def prompt_row_ids(recipe: Path) -> set[str]:
    """The id of every row the recipe's prompts make (one per prompt and sample), whatever is generated."""
    from corpus_builder.recipe import load_recipe
    from corpus_builder.records import Conversation, conversation_id
    from corpus_builder.sources import prompt_stream

    loaded = load_recipe(recipe)
    return {conversation_id(item.source, item.messages) for item in prompt_stream(loaded)
            if isinstance(item, Conversation)}
