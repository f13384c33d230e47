"""Benchmark: `corpus build` of a replay-only corpus from a ShareGPT-style JSONL file.

Reports conversations/s end to end (process start to exit), the CPU seconds of the build and its forked readers
(user and system: on a machine others load, what their load moves least) and the peak memory of the build process
and its readers (``Memory``: RSS and PSS summed, and the largest process's RSS) at 20k and 200k conversations,
alternating sizes across repetitions so machine noise hits both alike.

    python benchmarks/bench_build_replay.py [--sizes 20000 200000] [--repeats 3] [--workdir DIR]
        [--compare-with TREE]   # also build with another checkout's code (e.g. `git worktree add TREE REV`),
                                # alternated run by run, for before/after figures from one session
        [--variants plain tokens columnar columnar-1 columnar-2 rows]  # tokens: the recipe names
                                   # target.tokenizer and checks.max_seq_len, so every row is measured in the
                                   # target's tokens (lengths, budget, token statistics); columnar: the plain recipe
                                   # with CORPUS_COLUMNAR=1 (the columnar replay path, its blocks on its default
                                   # readers), columnar-1 and columnar-2: the same on one reader or two
                                   # (CORPUS_WORKERS), rows: the plain recipe with CORPUS_COLUMNAR=0 (the row path),
                                   # each the others' side in the same run
        [--tokenizer DIR] [--max-seq-len 4096]  # the tokens variant's tokenizer (default: the tiny model's)
        [--anchors]             # also, on the same file: the raw `encode_batch` floor (each conversation
                                # rendered once by transformers' apply_chat_template, untimed; `tokenizers`'
                                # encode_batch timed, on every core) and the naive transformers loop
                                # (apply_chat_template(tokenize=False) per conversation, then one batch call),
                                # both 10,000 conversations a batch call
        [--peers]               # also the raw copies of the same file the columnar tools make, alternated with
                                # the builds: polars (read_ndjson, write_parquet zstd) and `datasets`
                                # (load_dataset json, to_parquet); each in a process of its own, timed start to
                                # exit like the build. They do none of the build's work: floors it can approach

Token rates are conversation tokens per second: the build's are audit.json's `tokens.tokens` (every conversation's
length as served) over the build's time, the anchors' the ids they encoded over their time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import psutil

REPO = Path(__file__).resolve().parents[1]
ROLES = {"human": "user", "gpt": "assistant"}

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


def write_recipe(path: Path, data: Path, out: Path, tokenizer: Path | None = None, max_seq_len: int = 4096) -> None:
    """The replay recipe; with ``tokenizer``, measured in the target's tokens (``checks.max_seq_len``)."""
    target = f"{{model: bench/target, tokenizer: {tokenizer}}}" if tokenizer is not None else "{model: bench/target}"
    budget = f", max_seq_len: {max_seq_len}" if tokenizer is not None else ""
    path.write_text(
        "name: bench-replay\n"
        f"target: {target}\n"
        f"sources:\n  - name: workload\n    kind: replay\n    path: {data}\n    mapping: {{style: sharegpt}}\n"
        f"checks: {{dedup: exact{budget}}}\n"
        "split: {validation_fraction: 0.02, seed: 0}\n"
        f"output: {{dir: {out}, rows_per_shard: 50000}}\n",
        encoding="utf-8",
    )


# The environment each variant's build adds (the plain and tokens variants: the defaults)
VARIANT_ENV = {"plain": {}, "tokens": {}, "columnar": {"CORPUS_COLUMNAR": "1"},
               "columnar-1": {"CORPUS_COLUMNAR": "1", "CORPUS_WORKERS": "1"},
               "columnar-2": {"CORPUS_COLUMNAR": "1", "CORPUS_WORKERS": "2"}, "rows": {"CORPUS_COLUMNAR": "0"}}


def run_build(recipe: Path, out: Path, workers: int | None, code: Path | None = None, *, variant: str = "plain"
              ) -> tuple[float, Memory, float]:
    """(seconds, peak memory, CPU seconds) of one `corpus build` process and its worker processes
    (``peak_memory``; the CPU time, user and system, of the process and its children: on a machine others load,
    the figure their load moves least). ``code``: a checkout whose corpus_builder is imported instead of this one."""
    env = dict(os.environ)
    if workers is not None:
        env["CORPUS_WORKERS"] = str(workers)
    env.update(VARIANT_ENV[variant])
    # `python -m` puts its working directory first on the path: run where no checkout is, import through PYTHONPATH
    env["PYTHONPATH"] = str(code if code is not None else REPO)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "corpus_builder", "build", str(recipe), "--out", str(out)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=recipe.parent)
    peak = peak_memory(process)
    seconds = time.perf_counter() - start
    if process.returncode != 0:
        raise SystemExit(f"build failed: {process.stderr.read().decode()[-2000:]}")
    done = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = done.ru_utime - used.ru_utime + done.ru_stime - used.ru_stime
    return seconds, peak, cpu


class Memory(NamedTuple):
    """Peaks in MiB over a process and its children: RSS summed (a page the processes share counts once per
    process: forked workers share the interpreter's pages), PSS summed (a shared page split among them: the
    memory the tree holds) and the largest one process's RSS (what ``/usr/bin/time`` reports)."""

    rss: float
    pss: float
    largest: float


def peak_memory(process: subprocess.Popen[bytes]) -> Memory:
    """Wait for ``process``; its tree's peak summed RSS (sampled every 20 ms) and PSS (every 0.5 s: reading a
    process's PSS walks its page tables, and sampled as often as RSS it took a third of a core from the build)."""
    tree = psutil.Process(process.pid)
    peak_rss = peak_pss = largest = 0
    pss_due = 0.0
    while process.poll() is None:
        try:
            members = [tree, *tree.children(recursive=True)]
            sizes = [member.memory_info().rss for member in members]
            peak_rss, largest = max(peak_rss, sum(sizes)), max(largest, *sizes)
            if time.monotonic() >= pss_due:
                peak_pss = max(peak_pss, sum(member.memory_full_info().pss for member in members))
                pss_due = time.monotonic() + 0.5
        except psutil.Error:
            pass
        time.sleep(0.02)
    return Memory(peak_rss / 2**20, peak_pss / 2**20, largest / 2**20)


def peak_rss(process: subprocess.Popen[bytes]) -> int:
    """Wait for ``process``; its peak RSS in bytes, summed with its children's."""
    return int(peak_memory(process).rss * 2**20)


def template_messages(path: Path) -> list[list[dict[str, str]]]:
    """The benchmark file's conversations as chat-template input, as a user would map them."""
    with path.open("rb") as handle:
        return [[{"role": ROLES[turn["from"]], "content": turn["value"]}
                 for turn in orjson.loads(line)["conversations"]] for line in handle]


ANCHOR_BATCH = 10_000  # conversations per encode_batch call: the encodings of 200k would take ~15 GB


def floor(data: Path, tokenizer_dir: Path) -> dict[str, Any]:
    """The raw `encode_batch` floor: every conversation rendered once by transformers (not timed), then
    `tokenizers`' own encode_batch over the texts, ``ANCHOR_BATCH`` at a time (timed; it runs on every core)."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tokenizer_dir)
    start = time.perf_counter()
    texts = [hf.apply_chat_template(messages, tokenize=False) for messages in template_messages(data)]
    rendering = time.perf_counter() - start
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tokens = 0
    start = time.perf_counter()
    for first in range(0, len(texts), ANCHOR_BATCH):
        tokens += sum(len(e.ids) for e in tokenizer.encode_batch(texts[first:first + ANCHOR_BATCH],
                                                                 add_special_tokens=False))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "rendering": rendering, "tokens": tokens, "conversations": len(texts)}


def naive(data: Path, tokenizer_dir: Path) -> dict[str, Any]:
    """The naive transformers loop, timed whole: read the file, apply_chat_template(tokenize=False) per
    conversation, then one batch call of the tokenizer (per ``ANCHOR_BATCH`` conversations, for memory)."""
    from transformers import AutoTokenizer

    start = time.perf_counter()
    hf = AutoTokenizer.from_pretrained(tokenizer_dir)
    conversations = template_messages(data)
    tokens = 0
    rendering = 0.0
    for first in range(0, len(conversations), ANCHOR_BATCH):
        rendered = time.perf_counter()
        texts = [hf.apply_chat_template(messages, tokenize=False)
                 for messages in conversations[first:first + ANCHOR_BATCH]]
        rendering += time.perf_counter() - rendered
        tokens += sum(len(ids) for ids in hf(texts, add_special_tokens=False)["input_ids"])
    return {"seconds": time.perf_counter() - start, "rendering": rendering, "tokens": tokens,
            "conversations": len(conversations)}


ANCHORS = {"floor": floor, "naive": naive}


def polars_copy(data: Path, out: Path) -> None:
    import polars as pl

    pl.read_ndjson(data).write_parquet(out / "copy.parquet", compression="zstd")


def datasets_copy(data: Path, out: Path) -> None:
    import datasets

    datasets.disable_progress_bars()
    loaded = datasets.load_dataset("json", data_files=str(data), split="train", cache_dir=str(out / "cache"))
    loaded.to_parquet(str(out / "copy.parquet"))


PEERS = {"polars": polars_copy, "datasets": datasets_copy}


def run_peer(name: str, data: Path, out: Path) -> tuple[float, float]:
    """(seconds start to exit, peak RSS MiB) of one raw copy in a process of its own, as a build is timed."""
    out.mkdir(parents=True)
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, __file__, "--peer", name, "--data", str(data), "--out", str(out)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = peak_rss(process)
    seconds = time.perf_counter() - start
    if process.returncode != 0:
        raise SystemExit(f"{name} copy failed: {process.stderr.read().decode()[-2000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return seconds, peak / 2**20


def run_anchor(name: str, data: Path, tokenizer: Path) -> tuple[dict[str, Any], float]:
    """(the anchor's figures, peak RSS MiB) of one anchor run in a process of its own."""
    process = subprocess.Popen([sys.executable, __file__, "--child", name, "--data", str(data), "--tokenizer",
                                str(tokenizer)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = peak_rss(process)
    if process.returncode != 0:
        raise SystemExit(f"{name} failed: {process.stderr.read().decode()[-2000:]}")
    return json.loads(process.stdout.read()), peak / 2**20


def audit_tokens(out: Path) -> int:
    """The built corpus's conversation tokens (audit.json), 0 for a build without a tokenizer."""
    tokens: int = (json.loads((out / "audit.json").read_text()).get("tokens") or {}).get("tokens", 0)
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 200_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--workers", type=int, help="CORPUS_WORKERS for the build (default: one per core)")
    parser.add_argument("--compare-with", type=Path, metavar="TREE", help="another checkout to build with too")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANT_ENV), default=["plain"])
    parser.add_argument("--tokenizer", type=Path, default=REPO / ".cache" / "tiny-model")
    parser.add_argument("--max-seq-len", type=int, default=4096)
    parser.add_argument("--anchors", action="store_true")
    parser.add_argument("--peers", action="store_true")
    parser.add_argument("--child", choices=list(ANCHORS), help=argparse.SUPPRESS)
    parser.add_argument("--peer", choices=list(PEERS), help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        PEERS[args.peer](args.data, args.out)
        return
    if args.child:
        print(json.dumps(ANCHORS[args.child](args.data, args.tokenizer.resolve())))
        return
    codes: dict[str, Path | None] = {"this": None}
    if args.compare_with is not None:
        codes = {"other": args.compare_with.resolve(), "this": None}
    tokenizer = args.tokenizer.resolve()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        recipes = {}
        for size in args.sizes:
            data = work / f"sharegpt-{size}.jsonl"
            write_sharegpt(data, size)
            for variant in args.variants:
                recipes[(variant, size)] = work / f"recipe-{variant}-{size}.yaml"
                write_recipe(recipes[(variant, size)], data, work / f"out-{size}",
                             tokenizer if variant == "tokens" else None, args.max_seq_len)
        runs = [(name, variant, size) for name in codes for variant in args.variants for size in args.sizes]
        results: dict[tuple[str, str, int], list[tuple[float, Memory, int, float]]] = {run: [] for run in runs}
        anchors: dict[tuple[str, int], list[tuple[dict[str, Any], float]]] = {}
        peers: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for repeat in range(args.repeats):
            for peer in PEERS if args.peers else ():
                for size in args.sizes:
                    seconds, rss = run_peer(peer, work / f"sharegpt-{size}.jsonl", work / f"copy-{peer}-{size}")
                    peers.setdefault((peer, size), []).append((seconds, rss))
                    print(f"run {repeat} {peer:<8} copy size {size:>7}: {seconds:7.2f} s  {size / seconds:9,.0f} "
                          f"conv/s  peak RSS {rss:7.1f} MiB", flush=True)
            for name, variant, size in runs:
                out = work / f"out-{name}-{variant}-{size}-{repeat}"
                seconds, memory, cpu = run_build(recipes[(variant, size)], out, args.workers, codes[name],
                                                 variant=variant)
                tokens = audit_tokens(out)
                results[(name, variant, size)].append((seconds, memory, tokens, cpu))
                rate = f"{tokens / seconds:11,.0f} tok/s" if tokens else ""
                print(f"run {repeat} {name:<5} {variant:<6} size {size:>7}: {seconds:7.2f} s  {size / seconds:9,.0f} "
                      f"conv/s  CPU {cpu:7.2f} s  peak RSS {memory.rss:7.1f} MiB  PSS {memory.pss:7.1f} MiB  "
                      f"largest {memory.largest:7.1f} MiB  {rate}", flush=True)
                shutil.rmtree(out, ignore_errors=True)  # 200k corpora add up
            for anchor in ANCHORS if args.anchors else ():
                for size in args.sizes:
                    figures, rss = run_anchor(anchor, work / f"sharegpt-{size}.jsonl", tokenizer)
                    anchors.setdefault((anchor, size), []).append((figures, rss))
                    print(f"run {repeat} {anchor:<12} size {size:>7}: {figures['seconds']:7.2f} s  "
                          f"{figures['tokens'] / figures['seconds']:11,.0f} tok/s  peak RSS {rss:7.1f} MiB  "
                          f"(rendering {figures['rendering']:.2f} s{' untimed' if anchor == 'floor' else ''})",
                          flush=True)
        report(args.sizes, codes, args.variants, results, anchors)
        report_peers(args.sizes, args.variants, results, peers)


def report_peers(sizes: list[int], variants: list[str],
                 results: dict[tuple[str, str, int], list[tuple[float, Memory, int, float]]],
                 peers: dict[tuple[str, int], list[tuple[float, float]]]) -> None:
    """Each build's speed as a share of each raw copy's (median times; above 1 the build is faster)."""
    for (peer, size), runs in sorted(peers.items()):
        seconds = statistics.median(r[0] for r in runs)
        line = (f"{peer:<8} copy {size:>7}: {seconds:7.2f} s  {size / seconds:9,.0f} conv/s  peak RSS "
                f"{statistics.median(r[1] for r in runs):7.1f} MiB")
        for variant in variants:
            built = statistics.median(r[0] for r in results[("this", variant, size)])
            line += f"; {variant} build at {seconds / built:.2f}x its speed"
        print(line)


def report(sizes: list[int], codes: dict[str, Path | None], variants: list[str],
           results: dict[tuple[str, str, int], list[tuple[float, Memory, int, float]]],
           anchors: dict[tuple[str, int], list[tuple[dict[str, Any], float]]]) -> None:
    """Medians per code, variant and size; the tokens variant against the plain build and the anchors."""
    medians: dict[tuple[str, str, int], tuple[float, float, float, float, float]] = {}
    for name in codes:
        print(f"\nmedians ({name} code)")
        for variant in variants:
            for size in sizes:
                runs = results[(name, variant, size)]
                seconds = statistics.median(r[0] for r in runs)
                rss = statistics.median(r[1].rss for r in runs)
                pss = statistics.median(r[1].pss for r in runs)
                largest = statistics.median(r[1].largest for r in runs)
                rate = statistics.median(r[2] / r[0] for r in runs)
                cpu = statistics.median(r[3] for r in runs)
                medians[(name, variant, size)] = (seconds, rss, rate, pss, largest)
                tokens = f"  {rate:11,.0f} tok/s" if rate else ""
                print(f"  {variant:<6} {size:>7} conversations: {seconds:7.2f} s  {size / seconds:9,.0f} conv/s  "
                      f"CPU {cpu:7.2f} s  peak RSS {rss:7.1f} MiB  PSS {pss:7.1f} MiB  largest {largest:7.1f} MiB"
                      f"{tokens}")
            if len(sizes) >= 2:
                small, large = min(sizes), max(sizes)
                print(f"  {variant:<6} peak RSS ratio {large} / {small}: "
                      f"{medians[(name, variant, large)][1] / medians[(name, variant, small)][1]:.2f}x")
        for size in sizes if {"plain", "tokens"} <= set(variants) else ():
            plain, measured = medians[(name, "plain", size)], medians[(name, "tokens", size)]
            line = (f"  {size:>7}: tokens / plain: time {measured[0] / plain[0]:.2f}x, "
                    f"RSS {measured[1] / plain[1]:.2f}x, PSS {measured[3] / plain[3]:.2f}x, "
                    f"largest process {measured[4] / plain[4]:.2f}x")
            for anchor in ANCHORS:
                if (anchor, size) in anchors:
                    rate = statistics.median(f["tokens"] / f["seconds"] for f, _ in anchors[(anchor, size)])
                    line += f"; tokens build / {anchor} {measured[2] / rate:.2f}x tok/s"
            print(line)
    for (anchor, size), anchor_runs in sorted(anchors.items()):
        rate = statistics.median(f["tokens"] / f["seconds"] for f, _ in anchor_runs)
        seconds = statistics.median(f["seconds"] for f, _ in anchor_runs)
        print(f"{anchor:<6} {size:>7}: {seconds:7.2f} s  {rate:11,.0f} tok/s  peak RSS "
              f"{statistics.median(r for _, r in anchor_runs):7.1f} MiB  tokens {anchor_runs[0][0]['tokens']:,}")


if __name__ == "__main__":
    main()
