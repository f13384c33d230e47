"""Start-up: wall time and peak RSS of corpus's light commands, beside ``import speculators``; and a check
that none of corpus's light commands imports torch, transformers or vllm.

Each command runs ``--repeat`` times as a fresh process; the figures are medians. Peak RSS is the
command's maximum resident set as GNU time (/usr/bin/time, Debian package ``time``) reports it: the
rusage of a child that Python spawns itself also counts the parent's pages from before the exec.
The import check runs each corpus command once more with ``PYTHONPROFILEIMPORTTIME=1`` (Python's own
import log) and fails the benchmark, exit 1, when a heavy module shows up.

    python benchmarks/bench_startup.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GNU_TIME = Path("/usr/bin/time")
CORPUS = Path(sys.executable).with_name("corpus")  # the console script of this venv
SPECULATORS_PYTHON = Path(os.environ.get("SPECULATORS_VENV", REPO / ".venv-speculators")) / "bin" / "python"
HEAVY_MODULES = frozenset({"torch", "transformers", "vllm", "datasets", "huggingface_hub"})


@dataclass(frozen=True)
class Command:
    label: str
    argv: tuple[str, ...]
    expected_exit: int
    corpus: bool  # one of corpus's own commands: checked for heavy imports


def commands() -> list[Command]:
    corpus = str(CORPUS)
    return [
        Command("python -c pass (interpreter floor)", (sys.executable, "-c", "pass"), 0, corpus=False),
        Command("corpus --help", (corpus, "--help"), 0, corpus=True),
        Command("corpus validate recipes/quickstart.yaml", (corpus, "validate", "recipes/quickstart.yaml"), 0,
                corpus=True),
        Command("corpus validate recipes/thinking_v2.yaml", (corpus, "validate", "recipes/thinking_v2.yaml"), 0,
                corpus=True),
        Command("corpus audit recipes/data/workload-chat.jsonl.zst",
                (corpus, "audit", "recipes/data/workload-chat.jsonl.zst"), 0, corpus=True),
        Command("import speculators (.venv-speculators)", (str(SPECULATORS_PYTHON), "-c", "import speculators"), 0,
                corpus=False),
    ]


def timed_run(command: Command, env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MiB, stderr) of one run; raises when the exit code is not the expected one."""
    with tempfile.NamedTemporaryFile("r", prefix="bench-startup-", suffix=".rss") as rss_file:
        argv = [str(GNU_TIME), "--format", "%M", "--output", rss_file.name, *command.argv]
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              check=False)
        wall = time.perf_counter() - start
        # GNU time writes "Command exited with non-zero status N" before the figure when N != 0.
        peak_kib = int(rss_file.read().split()[-1])
    stderr = done.stderr.decode(errors="replace")
    if done.returncode != command.expected_exit:
        tail = "\n".join(stderr.splitlines()[-10:])
        raise RuntimeError(f"{command.label}: exit {done.returncode}, expected {command.expected_exit}\n{tail}")
    return wall, peak_kib / 1024, stderr


def heavy_imports(command: Command) -> set[str]:
    """Top-level packages from HEAVY_MODULES that the command imports (Python's import-time log)."""
    _, _, log = timed_run(command, {**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    imported = set()
    for line in log.splitlines():
        if line.startswith("import time:") and "|" in line:
            imported.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return imported & HEAVY_MODULES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if not GNU_TIME.exists():
        sys.exit(f"{GNU_TIME} not found: apt-get install time")
    selected = [c for c in commands() if SPECULATORS_PYTHON.exists() or "speculators" not in c.label]
    if len(selected) < len(commands()):
        print(f"({SPECULATORS_PYTHON} missing: run scripts/speculators_env.sh to include speculators)")
    print(f"load {os.getloadavg()[0]:.2f}; medians of {args.repeat} runs")
    print(f"{'command':52s} {'wall s':>7s} {'peak RSS MiB':>13s}  heavy imports")
    failures = []
    for command in selected:
        runs = [timed_run(command, dict(os.environ)) for _ in range(args.repeat)]
        wall = statistics.median(run[0] for run in runs)
        rss = statistics.median(run[1] for run in runs)
        verdict = ""
        if command.corpus:
            heavy = heavy_imports(command)
            verdict = ", ".join(sorted(heavy)) if heavy else "none"
            if heavy:
                failures.append(f"{command.label} imports {', '.join(sorted(heavy))}")
        print(f"{command.label:52s} {wall:7.2f} {rss:13.0f}  {verdict}", flush=True)
    print(f"load {os.getloadavg()[0]:.2f}")
    if failures:
        print("FAIL: " + "; ".join(failures))
        sys.exit(1)
    print("OK: no corpus command imports " + ", ".join(sorted(HEAVY_MODULES)))


if __name__ == "__main__":
    main()
