"""Benchmark: reading .jsonl.zst files whose rows are kilobytes, hundreds of kilobytes or megabytes long.

The zstd reader decompresses 1 kB of input per step and cuts the output into lines; zstd hands out whole
blocks, so a step's output is a 128 kB block of text (or nothing, until a block is complete). A line that
spans many steps is where cutting costs: this times the reader of the working tree against the one of a git
revision (``--baseline``, default HEAD), loaded side by side in one process and run in alternating order,
on four files of about 40 MB each (decompressed):

* ``normal``: 20,000 rows of ~2 kB (a user turn, an assistant turn with reasoning);
* ``long-200k``: 200 rows whose reasoning is 200 kB;
* ``long-5m``: 8 rows whose reasoning is 5 MB;
* ``long-20m``: 2 rows whose reasoning is 20 MB.

Text is drawn from a 5,000-word vocabulary, so it compresses about as much as real text (~3x). Two
timings per file: ``lines`` (decompression and line cutting alone) and ``rows`` (``zstd_rows``: lines
decoded to JSON). The medians of ``--repeats`` runs are printed, with the ratio baseline / working tree.
The files are written once into ``--data`` (default ``.cache/bench-zstd-lines``).

    python benchmarks/bench_zstd_lines.py [--repeats 5] [--baseline HEAD] [--data DIR] [--files normal ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from itertools import accumulate
from pathlib import Path
from types import ModuleType

import orjson
import zstandard

from corpus_builder.sources import readers

READERS_PATH = "corpus_builder/sources/readers.py"
# name -> (rows, bytes of reasoning per row)
SHAPES = {"normal": (20_000, 1_000), "long-200k": (200, 200_000), "long-5m": (8, 5_000_000),
          "long-20m": (2, 20_000_000)}


def words_text(rng: random.Random, vocabulary: list[str], cum_weights: list[float], size: int) -> str:
    """``size`` bytes of words from ``vocabulary`` drawn with ``cum_weights``."""
    count = size // 6 + 1  # words average about 5 letters and a space
    return " ".join(rng.choices(vocabulary, cum_weights=cum_weights, k=count))[:size]


def write_file(path: Path, rows: int, reasoning_bytes: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    vocabulary = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(5_000)]
    cum_weights = list(accumulate(1 / rank for rank in range(1, len(vocabulary) + 1)))  # Zipf-like
    compressor = zstandard.ZstdCompressor(level=3)
    with path.open("wb") as handle, compressor.stream_writer(handle) as writer:
        for index in range(rows):
            row = {"id": f"r{index}", "messages": [
                {"role": "user", "content": words_text(rng, vocabulary, cum_weights, 500)},
                {"role": "assistant", "content": words_text(rng, vocabulary, cum_weights, 500),
                 "reasoning_content": words_text(rng, vocabulary, cum_weights, reasoning_bytes)}]}
            writer.write(orjson.dumps(row) + b"\n")


def data_files(directory: Path) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, (rows, reasoning_bytes) in SHAPES.items():
        path = directory / f"{name}.jsonl.zst"
        if not path.exists():
            partial = path.with_suffix(".partial")
            write_file(partial, rows, reasoning_bytes)
            partial.rename(path)
        files[name] = path
    return files


def baseline_readers(revision: str, scratch: Path) -> ModuleType:
    """``readers.py`` as it is at ``revision``, imported inside ``corpus_builder.sources`` (its relative
    imports resolve to the working tree's modules, which it only takes errors from)."""
    source = subprocess.run(["git", "show", f"{revision}:{READERS_PATH}"], capture_output=True, check=True).stdout
    path = scratch / "baseline_readers.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("corpus_builder.sources._baseline_readers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def time_lines(module: ModuleType, path: Path) -> float:
    start = time.perf_counter()
    for _ in module._zstd_lines(path, path.name):
        pass
    return time.perf_counter() - start


def zstd_rows(module: ModuleType, path: Path) -> Iterator[tuple[int, object]]:
    """The rows of a .jsonl.zst file by ``module``'s reader: ``zstd_rows`` (``iter_rows`` at revisions before the
    formats' registry)."""
    if hasattr(module, "zstd_rows"):
        return iter(module.zstd_rows(path, path.name, None))
    return iter(module.iter_rows(path, "jsonl.zst", path.name))


def time_rows(module: ModuleType, path: Path) -> float:
    start = time.perf_counter()
    for _ in zstd_rows(module, path):
        pass
    return time.perf_counter() - start


def check_same_rows(baseline: ModuleType, path: Path) -> None:
    """Both readers give the same rows (compared by their JSON, a row at a time)."""
    ours = zstd_rows(readers, path)
    theirs = zstd_rows(baseline, path)
    for (our_position, our_row), (their_position, their_row) in zip(ours, theirs, strict=True):
        assert our_position == their_position and orjson.dumps(our_row) == orjson.dumps(their_row), path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline", default="HEAD", help="git revision of the reader to compare against")
    parser.add_argument("--data", type=Path, default=Path(".cache/bench-zstd-lines"))
    parser.add_argument("--files", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    args = parser.parse_args()
    files = {name: path for name, path in data_files(args.data).items() if name in args.files}
    timers: dict[str, Callable[[ModuleType, Path], float]] = {"lines": time_lines, "rows": time_rows}
    with tempfile.TemporaryDirectory() as scratch:
        baseline = baseline_readers(args.baseline, Path(scratch))
        contenders = {"baseline": baseline, "working": readers}
        print(f"baseline = {args.baseline}:{READERS_PATH}, working = the working tree; medians of {args.repeats}")
        print(f"{'file':<10} {'MB':>5} {'step':<5} {'baseline s':>10} {'working s':>10} {'ratio':>7}")
        for name, path in files.items():
            check_same_rows(baseline, path)
            megabytes = sum(len(line) + 1 for line in readers._zstd_lines(path, name)) / 1e6
            for step, timer in timers.items():
                times: dict[str, list[float]] = {contender: [] for contender in contenders}
                for repeat in range(args.repeats):
                    # alternate which reader goes first, so a drift in machine load falls on both
                    order = list(contenders) if repeat % 2 == 0 else list(reversed(contenders))
                    for contender in order:
                        times[contender].append(timer(contenders[contender], path))
                old, new = (statistics.median(times[contender]) for contender in contenders)
                print(f"{name:<10} {megabytes:>5.0f} {step:<5} {old:>10.3f} {new:>10.3f} {old / new:>6.2f}x",
                      flush=True)


if __name__ == "__main__":
    main()
