"""The long variants of the reliability trials (RELIABILITY.md records their counts).

    python scripts/trials.py kill [--runs 20] [--prompts 40] [--launch] [--seed 0]
        SIGKILL `corpus build` at seeded random moments against a real vLLM server on the tiny model, rerun,
        check every row is accounted for once, no orphan server, the output is what its journal rebuilds to.
        --launch: the recipe launches its own server (each run starts one), else one server for all runs.
    python scripts/trials.py faults [--runs 10] [--prompts 60] [--seed 0]
        builds through two fault-injecting endpoints (10% of requests fail in each of six ways, one endpoint
        killed and restarted mid-run).

Exit 1 when any run breaks a promise. Run from the repository root with the project's venv.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the trials live with the tests (tests/support), not in the package

from corpus_builder.testing.tiny_model import SERVER_ARGS, ensure_tiny_model  # noqa: E402
from tests.support import trials  # noqa: E402

MODEL_DIR = REPO / ".cache" / "tiny-model"


def kill_trials(runs: int, prompts: int, launch: bool, seed: int, work: Path) -> bool:
    from corpus_builder.generate.launcher import launched_server
    from corpus_builder.recipe import LaunchSpec

    ensure_tiny_model(MODEL_DIR)
    trials.write_prompts(work / "prompts.jsonl", prompts)
    counts: Counter[str] = Counter()
    broken = False
    with ExitStack() as stack:
        endpoints = None
        if not launch:
            spec = LaunchSpec(model_dir=MODEL_DIR, args=SERVER_ARGS)
            server = stack.enter_context(launched_server(spec, trials.MODEL, log_path=work / "server.log"))
            endpoints = [server.url]
        for run in range(runs):
            out = work / f"out-{run}"
            recipe = trials.write_recipe(work / f"recipe-{run}.yaml", prompts=work / "prompts.jsonl",
                                         endpoints=endpoints, launch=MODEL_DIR if launch else None,
                                         tokenizer=MODEL_DIR, out=out, timeout_s=120, concurrency=4)
            outcome = trials.kill_and_resume(recipe, out, seed=seed + run, expected_ids=trials.prompt_row_ids(recipe),
                                             horizon_s=60.0 if launch else 8.0, scratch=work / "scratch")
            state = "finished before the kill" if outcome.finished_before_kill else "killed"
            counts[state] += 1
            counts["orphan servers"] += bool(outcome.orphans)
            counts["broken promises"] += bool(outcome.problems)
            broken |= bool(outcome.problems or outcome.orphans)
            print(f"run {run} seed {outcome.seed}: {state} after {outcome.killed_after_s:.2f} s, "
                  f"{outcome.journaled_before_kill} turns journaled, orphans {outcome.orphans}, "
                  f"problems {outcome.problems or 'none'}", flush=True)
    print(f"\n{runs} runs: {dict(counts)}")
    return not broken


def fault_trials(runs: int, prompts: int, seed: int, work: Path) -> bool:
    counts: Counter[str] = Counter()
    broken = False
    for run in range(runs):
        outcome = trials.fault_storm(work / f"storm-{run}", seed=seed + run, prompts=prompts)
        state = "complete" if outcome.completed_first_time else "failed loudly, rerun complete"
        counts[state] += 1
        counts["broken promises"] += bool(outcome.problems)
        broken |= bool(outcome.problems)
        print(f"run {run} seed {outcome.seed}: {state}"
              + (f" ({outcome.unfinished_rows} rows unfinished)" if outcome.failed_loudly else "")
              + f", most attempts {outcome.max_attempts}, restarted endpoint served {outcome.restarted_served}, "
              f"problems {outcome.problems or 'none'}", flush=True)
    print(f"\n{runs} runs: {dict(counts)}")
    return not broken


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trial", choices=["kill", "faults"])
    parser.add_argument("--runs", type=int)
    parser.add_argument("--prompts", type=int)
    parser.add_argument("--launch", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix=f"trial-{args.trial}-") as scratch:
        work = Path(scratch)
        if args.trial == "kill":
            ok = kill_trials(args.runs or 20, args.prompts or 40, args.launch, args.seed, work)
        else:
            ok = fault_trials(args.runs or 10, args.prompts or 60, args.seed, work)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
