"""Benchmark: `corpus build` of a replay-only corpus from a ShareGPT-style JSONL file.

Reports conversations/s end to end (process start to exit) and peak RSS of the build process at 20k and
200k conversations, alternating sizes across repetitions so machine noise hits both alike.

    python benchmarks/bench_build_replay.py [--sizes 20000 200000] [--repeats 3] [--workdir DIR]
        [--compare-with TREE]   # also build with another checkout's code (e.g. `git worktree add TREE REV`),
                                # alternated run by run, for before/after figures from one session
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import psutil

WORDS = [
    "the",
    "model",
    "drafts",
    "tokens",
    "and",
    "the",
    "target",
    "verifies",
    "them",
    "in",
    "one",
    "forward",
    "pass",
    "so",
    "acceptance",
    "depends",
    "on",
    "how",
    "close",
    "the",
    "draft",
    "distribution",
    "is",
    "to",
    "the",
    "target",
    "distribution",
    "on",
    "real",
    "traffic",
]


def _sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def write_sharegpt(path: Path, count: int, seed: int = 0) -> None:
    """Realistic shapes: 1-4 exchanges, a third of the answers with a <think> block."""
    rng = random.Random(seed)
    with path.open("wb") as handle:
        for index in range(count):
            turns = []
            for _ in range(rng.randint(1, 4)):
                turns.append({"from": "human", "value": _sentence(rng, 8, 60)})
                answer = _sentence(rng, 20, 120)
                if rng.random() < 0.33:
                    answer = f"<think>\n{_sentence(rng, 20, 80)}\n</think>\n\n{answer}"
                turns.append({"from": "gpt", "value": answer})
            handle.write(orjson.dumps({"id": f"conv-{index}", "conversations": turns}) + b"\n")


def write_recipe(path: Path, data: Path, out: Path) -> None:
    path.write_text(
        "name: bench-replay\n"
        "target: {model: bench/target}\n"
        f"sources:\n  - name: workload\n    kind: replay\n    path: {data}\n    mapping: {{style: sharegpt}}\n"
        "checks: {dedup: exact}\n"
        "split: {validation_fraction: 0.02, seed: 0}\n"
        f"output: {{dir: {out}, rows_per_shard: 50000}}\n",
        encoding="utf-8",
    )


def run_build(recipe: Path, out: Path, workers: int | None, code: Path | None = None) -> tuple[float, float]:
    """(seconds, peak RSS MiB) of one `corpus build` process, RSS summed over it and its worker processes
    (sampled every 20 ms). ``code``: a checkout whose corpus_builder is imported instead of this one."""
    env = dict(os.environ)
    if workers is not None:
        env["CORPUS_WORKERS"] = str(workers)
    if code is not None:
        env["PYTHONPATH"] = str(code)
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "corpus_builder", "build", str(recipe), "--out", str(out)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    peak = peak_rss(process)
    seconds = time.perf_counter() - start
    if process.returncode != 0:
        raise SystemExit(f"build failed: {process.stderr.read().decode()[-2000:]}")
    return seconds, peak / 2**20


def peak_rss(process: subprocess.Popen[bytes]) -> int:
    """Wait for ``process``; its peak RSS in bytes, summed with its children's, sampled every 20 ms."""
    tree = psutil.Process(process.pid)
    peak = 0
    while process.poll() is None:
        try:
            rss = tree.memory_info().rss + sum(child.memory_info().rss for child in tree.children(recursive=True))
        except psutil.Error:
            rss = 0
        peak = max(peak, rss)
        time.sleep(0.02)
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--workers", type=int, help="CORPUS_WORKERS for the build (default: one per core)")
    parser.add_argument("--compare-with", type=Path, metavar="TREE", help="another checkout to build with too")
    args = parser.parse_args()
    codes: dict[str, Path | None] = {"this": None}
    if args.compare_with is not None:
        codes = {"other": args.compare_with.resolve(), "this": None}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        recipes = {}
        for size in args.sizes:
            data = work / f"sharegpt-{size}.jsonl"
            write_sharegpt(data, size)
            recipes[size] = work / f"recipe-{size}.yaml"
            write_recipe(recipes[size], data, work / f"out-{size}")
        results: dict[tuple[str, int], list[tuple[float, float]]] = {
            (name, size): [] for name in codes for size in args.sizes}
        for repeat in range(args.repeats):
            for name, code in codes.items():
                for size in args.sizes:
                    seconds, rss = run_build(recipes[size], work / f"out-{name}-{size}-{repeat}", args.workers, code)
                    results[(name, size)].append((seconds, rss))
                    print(f"run {repeat} {name:<5} size {size:>7}: {seconds:6.2f} s  {size / seconds:9,.0f} conv/s  "
                          f"peak RSS {rss:7.1f} MiB", flush=True)
        for name in codes:
            print(f"\nmedians ({name} code)")
            medians = {}
            for size in args.sizes:
                runs = results[(name, size)]
                seconds = statistics.median(r[0] for r in runs)
                medians[size] = statistics.median(r[1] for r in runs)
                print(f"  {size:>7} conversations: {size / seconds:9,.0f} conv/s  peak RSS {medians[size]:7.1f} MiB")
            if len(args.sizes) >= 2:
                small, large = min(args.sizes), max(args.sizes)
                print(f"  peak RSS ratio {large} / {small}: {medians[large] / medians[small]:.2f}x")


if __name__ == "__main__":
    main()
