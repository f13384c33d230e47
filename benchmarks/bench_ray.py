"""Benchmark: the Ray engine (`corpus build --engine ray`) against the local engine on one machine.

The data is ``bench_dedup``'s generator (realistic conversation shapes over a Zipf vocabulary, with 8% near
copies, 2% normalisation copies and 2% related rows planted), written as a messages-style JSONL file; the recipe
deduplicates exactly and near (threshold 0.8) and splits 2% to validation. ``--dedup exact``: the exact dedup alone, a
plan the columnar path covers, and each answer's reasoning written as a think block before its text (a turn with a
``reasoning_content`` field beside its text is the row path's): both engines read the rows by the columnar path's
kernels. Each build runs in a process of its
own, alternated engine by engine per repetition; the parent samples RSS every 50 ms (psutil): the driver's and,
for Ray, the largest of its worker processes (also its USS and heap every 5 s, ``SMAPS_EVERY``: RSS counts the object
store's shared pages a worker reads blocks from) (``ray::*``, children of the cluster the child starts as the engine
starts its own, ``ray_cluster.start_cluster(num_cpus=W)``: on loopback, never an existing cluster). Reported per size:

* wall seconds and conversations/s of the local engine and of Ray with 1 and 2 worker processes, the ratio
  Ray(2) / local (the goal: <= 1.5 on one machine); the CPU seconds of the build's process and every process under
  it (the cluster's too; its start included);
* the largest worker's peak RSS, USS and heap (its private pages outside the object store's shared-memory file:
  what the worker itself holds, flat as the input grows, or not: compare the sizes);
* shuffle bytes per row: what each shuffle moves per input row (the dedup's bucket entries, the ids' count, the
  verdicts' sort; the rows themselves do not move), measured on the file's first 20,000 rows with the engine's
  own stage functions.

Also ``--rule-change``: the near-dedup rule before issue 25 (``git show BASE:corpus_builder/screen/near_dedup.py``,
the first kept row of a bucket) against the order-free one (the first row of a bucket), on the same rows: the
generated ones above, and chains of drifting texts (each row a 4% edit of the one before, ten to a chain), where
the rules can differ: rows dropped by each and by one only.

    python benchmarks/bench_ray.py [--sizes 20000 200000] [--workers 1 2] [--repeats 1] [--engines local ray]
                                    [--rule-change BASE] [--rows JSONL] [--dedup near|exact]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dedup import Generator

from corpus_builder.records import Conversation

REPO = Path(__file__).resolve().parents[1]
BATCH = 10_000


def write_rows(path: Path, size: int, seed: int = 0, *, think_tags: bool = False) -> None:
    """The generator's rows; ``think_tags``: an answer's reasoning as a think block before its text, not a field."""
    generator = Generator(seed)
    with path.open("wb") as handle:
        for start in range(0, size, BATCH):
            for conversation in generator.batch(start, min(BATCH, size - start)).conversations:
                messages = [{"role": m.role, "content": f"<think>\n{m.reasoning}\n</think>\n\n{m.content}"}
                            if think_tags and m.reasoning else
                            {"role": m.role, "content": m.content,
                             **({"reasoning_content": m.reasoning} if m.reasoning else {})}
                            for m in conversation.messages]
                handle.write(orjson.dumps({"id": conversation.id, "messages": messages}) + b"\n")


def write_recipe(path: Path, data: Path, dedup: str = "near") -> None:
    checks = "{near_duplicates: {threshold: 0.8}}" if dedup == "near" else "{dedup: exact}"
    path.write_text("name: bench-ray\ntarget: {model: tiny/target}\n"
                    f"sources:\n  - {{name: workload, kind: replay, path: {data}}}\n"
                    f"checks: {checks}\nsplit: {{validation_fraction: 0.02, seed: 1}}\n"
                    "output: {dir: out, rows_per_shard: 50000}\n", encoding="utf-8")


CHILD = """
import os, sys, time
from pathlib import Path
engine, workers, recipe, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
from corpus_builder.assemble import build_corpus
from corpus_builder.recipe import load_recipe
if engine == "ray":
    from corpus_builder.ray_extra import ray_engine
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray_engine("corpus_builder.ray_cluster", "build").start_cluster(num_cpus=workers)  # on loopback
began = time.perf_counter()
result = build_corpus(load_recipe(recipe), out, engine=engine, progress=open(os.devnull, "w"))
print(time.perf_counter() - began, result.manifest.conversations, flush=True)
"""


# Samples (of 50 ms) between reads of a worker's smaps (its USS and heap): a worker maps GBs of the object store, and
# each read costs the kernel time the build's two cores need; read every 0.5 s, they slowed Ray's 1M build ~10%.
SMAPS_EVERY = 100


def private_outside_object_store(pid: int) -> int:
    """A process's private pages (bytes) outside the object store's shared-memory file: its own heap, what a
    worker holds apart from the blocks it maps (USS counts the store's pages a worker alone has touched)."""
    total = 0
    in_store = False
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                fields = line.split()
                in_store = len(fields) > 5 and ("plasma" in fields[5] or fields[5].startswith("/dev/shm"))
            elif not in_store and line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total


def run_build(engine: str, workers: int, recipe: Path, out: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the local engine as configured by default
    process = subprocess.Popen([sys.executable, "-c", CHILD, engine, str(workers), str(recipe), str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    peaks = {"driver": 0, "worker": 0, "worker_uss": 0, "worker_heap": 0}
    cpu: dict[int, float] = {}  # user + system seconds of the child and each process under it, as last seen
    done = threading.Event()

    def sample() -> None:
        parent = psutil.Process(process.pid)
        ticks = 0
        while not done.is_set():
            try:
                peaks["driver"] = max(peaks["driver"], parent.memory_info().rss)
                times = parent.cpu_times()
                cpu[parent.pid] = times.user + times.system
                for child in parent.children(recursive=True):
                    try:
                        times = child.cpu_times()
                        cpu[child.pid] = times.user + times.system
                        if child.name().startswith("ray::"):
                            peaks["worker"] = max(peaks["worker"], child.memory_info().rss)
                            if not ticks % SMAPS_EVERY:
                                peaks["worker_uss"] = max(peaks["worker_uss"], child.memory_full_info().uss)
                                peaks["worker_heap"] = max(peaks["worker_heap"],
                                                           private_outside_object_store(child.pid))
                    except (psutil.Error, OSError):  # a worker gone between the listing and its smaps
                        continue
            except psutil.Error:
                pass
            ticks += 1
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, _ = process.communicate()
    done.set()
    sampler.join()
    if process.returncode:
        raise RuntimeError(f"{engine} build failed ({process.returncode})")
    # the child's figures are its last line: a Ray worker's log lines forwarded to the driver may come before it
    seconds, rows = stdout.splitlines()[-1].split()
    # CPU seconds of the child and every process it started, sampled every 50 ms (a process's last 50 ms missed)
    return {"engine": engine, "workers": workers, "seconds": float(seconds), "rows": int(rows),
            "cpu_seconds": sum(cpu.values()),
            "driver_rss_mib": peaks["driver"] / 2**20, "worker_rss_mib": peaks["worker"] / 2**20,
            "worker_uss_mib": peaks["worker_uss"] / 2**20, "worker_heap_mib": peaks["worker_heap"] / 2**20}


def shuffle_bytes_per_row(recipe_path: Path, sample: int = 20_000) -> dict[str, float]:
    """Bytes per input row each shuffle of the Ray engine moves, from the plan's own stages, on the file's first
    ``sample`` rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from corpus_builder.assemble.plan import Plan
    from corpus_builder.recipe import load_recipe
    from corpus_builder.sources.parallel import measured_rows

    plan = Plan.of(load_recipe(recipe_path), None)
    assert plan.dedup is not None
    checker = plan.screen.checker(None)
    taken: list[pa.Table] = []
    rows_read = 0
    for measured in measured_rows(plan.read.parts(1)[0](), checker.measure):
        screened = checker.screened(measured.items, measured.measurement)
        taken.append(screened.to_arrow(np.arange(rows_read, rows_read + len(screened.records))))
        rows_read += len(screened.records)
        if rows_read >= sample:  # not the whole file
            break
    screened_rows = pa.concat_tables(taken).slice(0, sample)
    rows = screened_rows.filter(pc.is_null(screened_rows.column("skip_reason")))
    ids = rows.column("id").to_pylist()
    entries = plan.dedup.entries(rows, ids)
    verdicts = plan.dedup.judge_groups(entries)
    count = len(screened_rows)
    return {"bucket_entries": entries.nbytes / count, "ids_aggregate": plan.ids.entries(rows, ids).nbytes / count,
            "verdicts_sorted": verdicts.nbytes / count}


def load_rule_before(base: str) -> Any:
    """near_dedup.py as it was at ``base`` (the first-kept rule), as a module beside today's."""
    source = subprocess.run(["git", "show", f"{base}:corpus_builder/screen/near_dedup.py"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout
    spec = importlib.util.spec_from_loader("corpus_builder.screen.near_dedup_before", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "corpus_builder.screen"
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    exec(compile(source, "near_dedup_before.py", "exec"), module.__dict__)
    return module


def drifting(size: int, chain: int = 10, share: float = 0.04) -> Iterator[list[Conversation]]:
    """Batches of chains of drifting texts: each row an edit of ``share`` of the words of the one before it,
    a fresh text every ``chain`` rows (rows far along a chain are no longer near its start)."""
    generator = Generator(1)
    previous: Conversation | None = None
    for start in range(0, size, BATCH):
        batch = []
        for index in range(start, min(start + BATCH, size)):
            previous = (generator.fresh(index) if previous is None or index % chain == 0
                        else generator.edited(previous, index, share))
            batch.append(previous)
        yield batch


def rule_change(base: str, size: int, rows: str) -> dict[str, Any]:
    from corpus_builder.screen.near_dedup import NearDuplicates
    from corpus_builder.screen.normalise import conversation_text

    before, after = load_rule_before(base).NearDuplicates(), NearDuplicates()
    generator = Generator(0)
    batches = (drifting(size) if rows == "drifting" else
               (generator.batch(start, min(BATCH, size - start)).conversations for start in range(0, size, BATCH)))
    dropped_before: set[str] = set()
    dropped_after: set[str] = set()
    for conversations in batches:
        keys = [conversation.id for conversation in conversations]
        texts = [conversation_text(c) for c in conversations]
        for key, old, new in zip(keys, before.offer(keys, texts), after.offer(keys, texts), strict=True):
            if old is not None:
                dropped_before.add(key)
            if new is not None:
                dropped_after.add(key)
    return {"rows": size, "kind": rows, "dropped_before": len(dropped_before), "dropped_after": len(dropped_after),
            "dropped_only_after": len(dropped_after - dropped_before),
            "dropped_only_before": len(dropped_before - dropped_after)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--engines", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    parser.add_argument("--rule-change", metavar="BASE", help="also compare the near rule of git revision BASE")
    parser.add_argument("--rows", type=Path, metavar="JSONL",
                        help="build this rows file (one --sizes, its row count) rather than generating one: a 10M "
                             "file takes 23 minutes to generate in one process, and can be made in chunks beforehand")
    parser.add_argument("--dedup", choices=["near", "exact"], default="near",
                        help="exact: the exact dedup alone, the rows' reasoning in think blocks (the columnar path)")
    args = parser.parse_args()
    if args.rows is not None and len(args.sizes) != 1:
        parser.error("--rows is one file: give its row count as the one --sizes")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for size in args.sizes:
            data, recipe = args.rows or root / f"rows-{size}.jsonl", root / f"recipe-{size}.yaml"
            if args.rows is None:
                write_rows(data, size, think_tags=args.dedup == "exact")
            write_recipe(recipe, data, args.dedup)
            runs = ([("local", 1)] if "local" in args.engines else []) + (
                [("ray", workers) for workers in args.workers] if "ray" in args.engines else [])
            for repeat in range(args.repeats):
                for engine, workers in runs if repeat % 2 == 0 else runs[::-1]:
                    result = run_build(engine, workers, recipe, root / f"out-{engine}-{workers}")
                    result.update(size=size, per_second=size / result["seconds"])
                    print(json.dumps(result), flush=True)
            print(json.dumps({"size": size, "shuffle_bytes_per_row": shuffle_bytes_per_row(recipe)}), flush=True)
        if args.rule_change:
            for rows in ("planted", "drifting"):
                for size in args.sizes:
                    print(json.dumps({"rule_change": rule_change(args.rule_change, size, rows)}), flush=True)


if __name__ == "__main__":
    main()
