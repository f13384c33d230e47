"""Benchmark: the columnar replay path's blocks on one reader process or several, and where its time goes.

Builds the same replay file on the columnar path (CORPUS_COLUMNAR=1) with each CORPUS_WORKERS given, alternated run
by run, each build in a process of its own, and reports medians of: wall time; the CPU seconds of the build's main
thread (the keyed stages, the hand-over of the blocks to it, the start and the finish: the serial share that bounds
any number of readers), of its whole process (the main thread and the parquet writer's thread) and of its reader
processes; and what one reader spends walking the blocks that are not its own (reading them and counting their
lines: the cost each added reader pays). From these, a projection of the wall time on more cores, one reader per
core but one as by default (Amdahl: the readers' work split among them, the main thread's and the writer's not).

    python benchmarks/bench_columnar_readers.py RECIPE [--readers 1 2] [--repeats 3] [--project 8 16]

RECIPE: a replay recipe the columnar path covers (e.g. the plain recipe of bench_build_replay.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]

# The build in a process of its own: the CPU of its main thread, its process and its children (the readers).
CHILD = """
import json, resource, sys, time
from pathlib import Path
from corpus_builder.assemble import build_corpus
from corpus_builder.recipe import load_recipe
start = time.perf_counter()
build_corpus(load_recipe(Path(sys.argv[1])), Path(sys.argv[2]), progress=open("/dev/null", "w"))
wall = time.perf_counter() - start
own, readers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall": wall, "main_thread": time.thread_time(), "process": own.ru_utime + own.ru_stime,
                  "readers": readers.ru_utime + readers.ru_stime}))
"""

# What a reader does with the blocks that are not its own: read them, their lines counted (the layout fixed).
SKIP = """
import json, sys, time
from pathlib import Path
from corpus_builder.sources.columnar import part_blocks
from corpus_builder.sources.readers import LineRange
path = Path(sys.argv[1])
start = time.process_time()
for _ in part_blocks(path, LineRange(0, path.stat().st_size, 1)):
    pass
print(json.dumps({"skip": time.process_time() - start}))
"""


class Run(NamedTuple):
    wall: float
    main_thread: float
    process: float
    readers: float


def child(script: str, args: list[str], env: dict[str, str]) -> dict[str, float]:
    completed = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env,
                               check=False)
    if completed.returncode != 0:
        raise SystemExit(f"failed: {completed.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(completed.stdout.strip().splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", type=Path)
    parser.add_argument("--readers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--project", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--data", type=Path, help="the recipe's replay file, for the cost of a skipped block")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO), "CORPUS_COLUMNAR": "1"}
    runs: dict[int, list[Run]] = {readers: [] for readers in args.readers}
    skips: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for readers in args.readers:
                out = Path(tmp) / f"out-{readers}-{repeat}"
                figures = child(CHILD, [str(args.recipe.resolve()), str(out)],
                                {**env, "CORPUS_WORKERS": str(readers)})
                run = Run(figures["wall"], figures["main_thread"], figures["process"], figures["readers"])
                runs[readers].append(run)
                print(f"run {repeat} readers {readers}: wall {run.wall:6.2f} s  main thread {run.main_thread:6.2f} s  "
                      f"process {run.process:6.2f} s  readers {run.readers:6.2f} s  (CPU)", flush=True)
                shutil.rmtree(out, ignore_errors=True)
            if args.data is not None:
                skips.append(child(SKIP, [str(args.data)], env)["skip"])
    medians = {readers: Run(*(statistics.median(getattr(r, name) for r in rs) for name in Run._fields))
               for readers, rs in runs.items()}
    print("\nmedians")
    for readers, run in medians.items():
        print(f"  readers {readers}: wall {run.wall:6.2f} s  main thread {run.main_thread:6.2f} s  process "
              f"{run.process:6.2f} s  (writer and pyarrow threads {run.process - run.main_thread:5.2f} s)  readers "
              f"{run.readers:6.2f} s  total CPU {run.process + run.readers:6.2f} s")
    several = [readers for readers in medians if readers > 1]
    if not several or not skips:
        return
    readers = max(several)
    run = medians[readers]
    skip = statistics.median(skips)
    # the readers' own work: their CPU but what each spends on the blocks of the others (about (W-1)/W of a walk)
    work = run.readers - readers * skip * (readers - 1) / readers
    writer = run.process - run.main_thread
    print(f"\none reader's walk over every block (read, lines counted): {skip:.2f} s; the readers' own work "
          f"{work:.2f} s, the main thread's {run.main_thread:.2f} s, the writer's {writer:.2f} s")
    for cores in args.project:  # the default: one reader per core but one, the main thread and the writer beside
        count = cores - 1
        walks = skip * (count - 1)  # every reader walks the others' blocks
        share = (work + walks) / count
        total = (run.main_thread + writer + work + walks) / cores
        projected = max(run.main_thread, writer, share, total)
        print(f"  {cores:>2} cores, {count} readers: wall >= {projected:.2f} s (the largest of: the main thread "
              f"{run.main_thread:.2f}, the writer {writer:.2f}, a reader's share {share:.2f}, all the CPU over the "
              f"cores {total:.2f})")

if __name__ == "__main__":
    main()
