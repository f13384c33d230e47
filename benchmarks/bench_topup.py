"""Top-up cost: a declared prompts source whose generated rows the checks drop at a given rate.

    python benchmarks/bench_topup.py [--rows 1000] [--drop 0.2] [--seeds 5]

A loopback OpenAI-compatible server answers every request at once; a seeded share ``--drop`` of the answers
never leave their think block, which the default check drops. The recipe declares ``--rows`` rows from a pool
four times that size. Reported per seed: requests sent, rows dropped, extra requests beyond the declared
count, and the goal's bound: extra <= ceil(1.1 x rows dropped), i.e. every dropped row replaced once and at
most 10% generated on top. Exit 1 when a seed misses the declared count or the bound.
"""

from __future__ import annotations

import argparse
import io
import math
import sys
import tempfile
from pathlib import Path

import orjson

from corpus_builder.assemble import build_corpus
from corpus_builder.layout import iter_ledger
from corpus_builder.recipe import load_recipe
from corpus_builder.testing.fault_server import FaultServer


def run(work: Path, rows: int, drop: float, seed: int) -> tuple[int, int, int, int]:
    """(requests, rows dropped, rows reached, rounds) of one build."""
    pool = 4 * rows
    (work / "prompts.jsonl").write_bytes(b"".join(
        orjson.dumps({"messages": [{"role": "user", "content": f"seed {seed} question {i}?"}]}) + b"\n"
        for i in range(pool)))
    with FaultServer(model="bench-target", fault_mix={"unclosed": drop}, seed=seed) as server:
        (work / "recipe.yaml").write_text(f"""\
name: topup
target:
  model: bench-target
  endpoints: [{server.base_url}]
  generation: {{max_tokens: 16, concurrency: 32, timeout_s: 10, max_retries: 1}}
sources:
  - {{name: asks, kind: prompts, path: prompts.jsonl, target: {{count: {rows}}}}}
mixture: {{seed: {seed}}}
split: {{validation_fraction: 0.0}}
output: {{dir: out-{seed}}}
""", encoding="utf-8")
        progress = io.StringIO()
        result = build_corpus(load_recipe(work / "recipe.yaml"), progress=progress)
        requests = len(server.chat_requests)
    dropped = sum(record["reason"] == "unclosed_think" for record in iter_ledger(result.out_dir / "ledger.jsonl.zst"))
    rounds = sum(line.startswith("generate ") and "(100.0%)" in line for line in progress.getvalue().splitlines())
    return requests, dropped, result.manifest.section("mixture")["sources"]["asks"]["reached"], rounds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--drop", type=float, default=0.2)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    failed = False
    with tempfile.TemporaryDirectory(prefix="bench-topup-") as scratch:
        for seed in range(args.seeds):
            requests, dropped, reached, rounds = run(Path(scratch), args.rows, args.drop, seed)
            extra = requests - args.rows
            bound = math.ceil(1.1 * dropped)
            ok = reached == args.rows and extra <= bound
            failed |= not ok
            print(f"seed {seed}: {requests:,} requests in {rounds} rounds, {dropped:,} dropped "
                  f"({dropped / requests:.1%}), reached {reached:,}/{args.rows:,}, extra {extra:,} "
                  f"<= ceil(1.1 x {dropped:,}) = {bound:,}: {'yes' if ok else 'NO'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
