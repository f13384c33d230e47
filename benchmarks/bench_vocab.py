"""Benchmark: `corpus vocab` on a speculators-tokens export of 1M turn rows, against numpy.bincount over the same ids.

The export is synthetic but shaped as `corpus export --format speculators-tokens --file-format parquet` writes it
(``{id, input_ids: list<int32>, loss_mask: list<int32>}``, zstd, a row group per few thousand rows): each row a
prompt of 20-500 tokens (unsupervised) and an answer of 10-300 (supervised), ids drawn Zipf-like from a 166,144
vocabulary (the real target's config size). It is written once into ``--data`` (default ``.cache/bench-vocab``),
with the first tenth of its rows as a second, smaller file for the memory check.

Each measurement is a fresh process, its peak RSS read from the kernel (``wait4``); medians of ``--repeats``:

* ``floor``: ``numpy.bincount`` over the supervised ids, already in memory as one int64 array (the floor);
* ``read``: the two columns decoded batch by batch as ``count`` reads them, to numpy, nothing counted (what getting
  the ids out of the file costs);
* ``read+floor``: ``numpy.bincount`` after reading both columns whole with ``pyarrow.parquet.read_table`` and
  masking them (the plain way, with every id in memory);
* ``corpus vocab``: the command itself, ``corpus vocab EXPORT --out counts.npy`` (start-up included), on the 1M
  file and on the 100k file (flat memory: the same peak on both);
* ``count``: ``count_token_export`` alone, in a process that has imported it (the command minus start-up).

    python benchmarks/bench_vocab.py [--rows 1000000] [--repeats 3] [--data DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
VOCAB = 166_144
ROW_GROUP = 4096


def write_export(path: Path, rows: int, seed: int = 0) -> None:
    """The synthetic export: ids from a pool drawn once (Zipf-like over VOCAB), sliced per row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
    pool = rng.choice(VOCAB, size=1 << 24, p=weights / weights.sum()).astype(np.int32)
    schema = pa.schema([("id", pa.string()), ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int32()))])
    partial = path.with_name(f".{path.name}.partial")
    with pq.ParquetWriter(partial, schema, compression="zstd") as writer:
        for first in range(0, rows, ROW_GROUP):
            count = min(ROW_GROUP, rows - first)
            prompt, answer = rng.integers(20, 500, count), rng.integers(10, 300, count)
            lengths = prompt + answer
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            start = int(rng.integers(0, len(pool) - offsets[-1]))
            ids = pool[start:start + offsets[-1]]
            spans = np.empty(2 * count, np.int64)
            spans[0::2], spans[1::2] = prompt, answer
            mask = np.repeat(np.tile(np.array([0, 1], np.int32), count), spans)
            table = pa.table({"id": pa.array([f"c{first + i:08d}/1" for i in range(count)]),
                              "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)),
                              "loss_mask": pa.ListArray.from_arrays(pa.array(offsets), pa.array(mask))}, schema=schema)
            writer.write_table(table)
    partial.rename(path)


def files(data: Path, rows: int) -> tuple[Path, Path]:
    data.mkdir(parents=True, exist_ok=True)
    big, small = data / f"train-{rows}.parquet", data / f"train-{rows // 10}.parquet"
    for path, count in ((big, rows), (small, rows // 10)):
        if not path.exists():
            started = time.perf_counter()
            write_export(path, count)
            print(f"wrote {path} ({path.stat().st_size / 1e6:,.0f} MB) in {time.perf_counter() - started:.0f} s",
                  file=sys.stderr)
    return big, small


def inner(kind: str, path: Path) -> None:
    """One measurement in this process: prints its seconds (what it times) on stdout."""
    if kind == "count":
        from corpus_builder.export.token_counts import count_token_export

        started = time.perf_counter()
        counts = count_token_export([path])
    elif kind == "read":
        import pyarrow.parquet as pq

        started, supervised_total = time.perf_counter(), 0
        for batch in pq.ParquetFile(path, pre_buffer=False).iter_batches(batch_size=8192,
                                                                         columns=["input_ids", "loss_mask"]):
            ids, mask = batch.column(0).flatten().to_numpy(), batch.column(1).flatten().to_numpy()
            supervised_total += int(np.count_nonzero(mask)) if len(ids) == len(mask) else 0
        print(f"{time.perf_counter() - started:.4f} {supervised_total}")
        return
    else:
        import pyarrow.parquet as pq

        read_started = time.perf_counter()
        table = pq.read_table(path, columns=["input_ids", "loss_mask"])
        ids = table.column("input_ids").combine_chunks().flatten().to_numpy()
        mask = table.column("loss_mask").combine_chunks().flatten().to_numpy()
        supervised = ids[mask != 0].astype(np.int64)
        started = read_started if kind == "read+floor" else time.perf_counter()
        counts = np.bincount(supervised, minlength=VOCAB)
    print(f"{time.perf_counter() - started:.4f} {int(counts.sum())}")


def measure(command: list[str]) -> tuple[float, float, int]:
    """(wall seconds, peak RSS MiB, the supervised total it printed) of one fresh process."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert process.stdout is not None
    output = process.stdout.read().decode()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    assert os.waitstatus_to_exitcode(status) == 0, output
    peak = usage.ru_maxrss / 1024
    if output.startswith("{"):  # `corpus vocab --json`: timed from outside, start-up included
        return wall, peak, int(json.loads(output)["supervised_tokens"])
    seconds, total = output.split()  # an inner measurement times itself
    return float(seconds), peak, int(total)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", type=Path, default=REPO / ".cache" / "bench-vocab")
    parser.add_argument("--inner", nargs=2, metavar=("KIND", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(args.inner[0], Path(args.inner[1]))
        return
    big, small = files(args.data, args.rows)
    out = args.data / "counts.npy"
    cases = {
        "floor": [sys.executable, __file__, "--inner", "floor", str(big)],
        "read": [sys.executable, __file__, "--inner", "read", str(big)],
        "read+floor": [sys.executable, __file__, "--inner", "read+floor", str(big)],
        "count": [sys.executable, __file__, "--inner", "count", str(big)],
        "corpus vocab": [sys.executable, "-m", "corpus_builder", "vocab", str(big), "--out", str(out), "--json"],
        "corpus vocab (1/10)": [sys.executable, "-m", "corpus_builder", "vocab", str(small), "--out", str(out),
                                "--json"],
    }
    results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, command in cases.items():  # alternated within each repeat
            results[name].append(measure(command))
    totals = {total for name, runs in results.items() if "1/10" not in name for _, _, total in runs}
    assert len(totals) == 1, f"the measurements counted different totals: {totals}"
    floor = statistics.median(seconds for seconds, _, _ in results["floor"])
    print(f"{args.rows:,} rows, {totals.pop():,} supervised ids ({big.stat().st_size / 1e6:,.0f} MB)")
    print(f"{'':<20} {'runs (s)':<26} {'median':>8} {'floor/this':>10} {'peak RSS MiB':>14}")
    for name, runs in results.items():
        median = statistics.median(seconds for seconds, _, _ in runs)
        print(f"{name:<20} {', '.join(f'{s:.2f}' for s, _, _ in runs):<26} {median:>8.2f} {floor / median:>10.2f} "
              f"{max(rss for _, rss, _ in runs):>14,.0f}")


if __name__ == "__main__":
    main()
