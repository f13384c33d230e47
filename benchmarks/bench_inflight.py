"""How busy each client keeps one vLLM server: the requests it has in flight over time, and how long a
freed slot waits for its next request, for corpus-builder's generation and the bare aiohttp client.

bench_saturation.py compares tokens/s, which the server's own run-to-run spread (5-13 %) dominates. This
one looks at the client side of that figure directly: a client that keeps ``concurrency`` requests in
flight all the time leaves the server nothing to wait for, whatever its tokens/s in a given run. Each
client records, through an aiohttp ``TraceConfig`` added to every session it opens, when each chat
request starts and when its response arrives; the clients themselves are the unchanged runners of
bench_generate.py (fresh process per run, order alternated per round).

Reported per run: output tokens/s, the time-weighted mean of requests in flight between the first
request and the last answer, the refill gap (the k-th answer to the (k + concurrency)-th request start:
median and 90th percentile) and the client's CPU seconds.

    python benchmarks/bench_inflight.py [--prompts 256] [--max-tokens 128] [--concurrency 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_generate import Workload, rounds, run_bare, run_corpus, write_prompts
from bench_saturation import SERVED_MODEL, served_tiny_model

CLIENTS = ("corpus", "bare")


def traced_client_main(argv: list[str]) -> None:
    """``bench_inflight.py client NAME OUT.json URL PROMPTS CONCURRENCY MAX_TOKENS``."""
    import aiohttp

    name, out, url, prompts, concurrency, max_tokens = argv
    events: list[tuple[str, float]] = []

    async def on_start(_session: Any, _context: Any, params: Any) -> None:
        if params.url.path.endswith("/chat/completions"):
            events.append(("start", time.perf_counter()))

    async def on_end(_session: Any, _context: Any, params: Any) -> None:
        if params.url.path.endswith("/chat/completions"):
            events.append(("end", time.perf_counter()))

    trace = aiohttp.TraceConfig()
    trace.on_request_start.append(on_start)
    trace.on_request_end.append(on_end)
    # The clients open their own sessions; adding the trace there observes them without changing them.
    open_session = aiohttp.ClientSession.__init__

    def traced_session(self: aiohttp.ClientSession, *args: Any, **kwargs: Any) -> None:
        open_session(self, *args, trace_configs=[trace], **kwargs)

    aiohttp.ClientSession.__init__ = traced_session  # type: ignore[method-assign]
    work = Workload(url, SERVED_MODEL, Path(prompts), int(concurrency), int(max_tokens), ignore_eos=True)
    measured = run_corpus(work) if name == "corpus" else run_bare(work, uvloop=False)
    Path(out).write_text(json.dumps({"measured": measured.__dict__, "events": events}))


def describe(name: str, traced: dict[str, Any], concurrency: int) -> str:
    starts = sorted(t for kind, t in traced["events"] if kind == "start")
    ends = sorted(t for kind, t in traced["events"] if kind == "end")
    first, last = starts[0], ends[-1]
    in_flight, previous, area = 0, first, 0.0
    for moment, change in sorted([(t, 1) for t in starts] + [(t, -1) for t in ends]):
        area += in_flight * (moment - previous)
        in_flight += change
        previous = moment
    gaps = sorted(start - end for start, end in zip(starts[concurrency:], ends, strict=False))
    measured = traced["measured"]
    return (f"{name} {measured['output_tokens'] / measured['wall_s']:,.0f} tok/s, "
            f"in flight {area / (last - first):.1f}, refill gap {statistics.median(gaps) * 1000:.1f} ms "
            f"(p90 {gaps[int(len(gaps) * 0.9)] * 1000:.1f}), CPU {measured['cpu_s']:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-inflight-") as scratch_dir, \
            served_tiny_model(Path(scratch_dir)) as url:
        scratch = Path(scratch_dir)
        prompts = scratch / "prompts.jsonl"
        write_prompts(prompts, args.prompts, turns=1)
        print(f"{args.prompts} single-turn prompts, {args.max_tokens} tokens each (ignore_eos), "
              f"concurrency {args.concurrency}", flush=True)
        for index, order in rounds(CLIENTS, args.rounds):
            line = []
            for name in order:
                out = scratch / f"{name}.json"
                command = [sys.executable, __file__, "client", name, str(out), url, str(prompts),
                           str(args.concurrency), str(args.max_tokens)]
                subprocess.run(command, check=True, cwd=scratch, capture_output=True)
                line.append(describe(name, json.loads(out.read_text()), args.concurrency))
            print(f"  round {index + 1}: " + "   ".join(line), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        traced_client_main(sys.argv[2:])
    else:
        main()
