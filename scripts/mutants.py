"""A scripted mutation check: each mutant breaks one promise; the tests that hold it must fail.

    python scripts/mutants.py [--only NAME ...] [--list]

Every mutant is applied to a scratch copy of the working tree (never to the tree itself), and the tests it
names run there with `-x`; a mutant the tests do not catch is a promise no test holds. Exit 1 when any
survives. The results of a run go to RELIABILITY.md ("Mutation check"). Needs the tiny model in .cache (the
set-up builds it); the mutants here need no vLLM server.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    old: str  # must occur exactly once in the file
    new: str
    tests: tuple[str, ...]


MUTANTS = [
    Mutant("publish read-back emptied", "corpus_builder/publish/commit.py",
           '    """Read the repository back at the new head: every file with our size and hash, no stale shard."""\n',
           '    """Read the repository back at the new head: every file with our size and hash, no stale shard."""\n'
           "    return\n",
           ("tests/publish",)),
    Mutant("manifest moved first", "corpus_builder/assemble/pipeline.py",
           "    (out_dir / MANIFEST).unlink(missing_ok=True)  # from here the old corpus no longer looks complete\n",
           "    os.replace(staging / MANIFEST, out_dir / MANIFEST)\n",
           ("tests/assemble/test_failures.py::test_a_commit_cut_short_never_leaves_a_directory_that_looks_complete",)),
    Mutant("split seeded from hash()", "corpus_builder/assemble/split.py",
           'split_draw(self.seed, row_id) < self.fraction',
           '(hash(row_id) % 2**32) / 2**32 < self.fraction',
           ("tests/assemble/test_pipeline.py::test_rebuilds_are_byte_identical_across_processes_and_from_the_journal",)),
    Mutant("unclosed think kept by default", "corpus_builder/screen/row_checks.py",
           'return cls() if setup.checks.on_unclosed_think == "drop" else None',
           'return cls() if setup.checks.on_unclosed_think == "never" else None',
           ("tests/assemble/test_row_checks.py",)),
    Mutant("generated turns never flagged unclosed", "corpus_builder/generate/scheduler.py",
           "        unclosed |= (job.thinking", "        unclosed |= False and (job.thinking",
           ("tests/generate/test_scheduler.py", "tests/assemble/test_row_checks.py")),
    Mutant("prompt sources not redacted", "corpus_builder/sources/source.py",
           "    return redact_conversations(prompts) if recipe.checks.redact_secrets else prompts",
           "    return prompts",
           ("tests/assemble/test_row_checks.py",)),
    Mutant("ledger detail lost", "corpus_builder/assemble/shards.py",
           '"detail": skipped.detail, "id": skipped.id}', '"detail": "", "id": skipped.id}',
           ("tests/assemble/test_row_checks.py",)),
    Mutant("audit characters without reasoning", "corpus_builder/stats/corpus.py",
           '"characters": _per_row_sums(offsets, content_len + reasoning_len),',
           '"characters": _per_row_sums(offsets, content_len),',
           ("tests/assemble/test_row_checks.py",)),
    Mutant("exhausted retries reported as a refusal", "corpus_builder/generate/client.py",
           '{failure.detail}", fault=failure.fault, endpoint=ep.url)',
           '{failure.detail}", fault=failure.fault, endpoint=ep.url) if False else PermanentError(\n'
           '                    "gave up", status=failure.status, endpoint=ep.url)',
           ("tests/generate/test_client.py", "tests/generate/test_scheduler.py")),
    Mutant("health checks share the request pool", "corpus_builder/generate/client.py",
           "        async with self._probe_session.get(url, headers=ep.headers, timeout=timeout) as resp:",
           "        assert self._session is not None\n"
           "        async with self._session.get(url, headers=ep.headers, timeout=timeout) as resp:",
           ("tests/generate/test_client.py",)),
    Mutant("no outage bound", "corpus_builder/generate/client.py",
           "            self._check_outage(loop.time())\n", "",
           ("tests/generate/test_client.py", "tests/assemble/test_failures.py")),
    Mutant("launched server death not checked", "corpus_builder/generate/client.py",
           "                if self.alive is not None:\n                    self.alive()\n", "",
           ("tests/generate/test_client.py",)),
    Mutant("journal short writes unchecked", "corpus_builder/generate/journal.py",
           "                written += count\n", "                written = len(data)\n",
           ("tests/generate/test_journal.py",)),
    Mutant("no output lock", "corpus_builder/assemble/pipeline.py",
           "        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n", "        pass\n",
           ("tests/assemble/test_failures.py",)),
    Mutant("filesystem errors as tracebacks", "corpus_builder/assemble/pipeline.py",
           "    except OSError as error:\n        where = error.filename or out_dir\n",
           "    except ZeroDivisionError as error:\n        where = out_dir\n",
           ("tests/assemble/test_failures.py",)),
    Mutant("empty think block counted as reasoning", "corpus_builder/tokens/rows.py",
           "if conversation.messages[j].reasoning else 0", "if True else 0",
           ("tests/tokens/test_rows.py",)),
    Mutant("huge rows tokenized whole", "corpus_builder/screen/checks.py",
           "            if floor > limit:\n", "            if False:\n",
           ("tests/tokens/test_rows.py",)),
    Mutant("dedup priority ignored (recipe order)", "corpus_builder/recipe/model.py",
           "        return sorted((s for s in self.sources if s.kind == kind), key=lambda s: ranks[s.name])",
           "        return [s for s in self.sources if s.kind == kind]",
           ("tests/screen/test_dedup.py",)),
    Mutant("no eviction by a higher-priority generated row", "corpus_builder/screen/dedup.py",
           "        if evict is not None and self.ranks.get(source, 0) < kept_rank:",
           "        if False:",
           ("tests/screen/test_dedup.py",)),
    Mutant("prompts not screened before generation", "corpus_builder/assemble/prompt_stage.py",
           "self._counter.count(screen.run(prompt_stream(recipe)))", "self._counter.count(prompt_stream(recipe))",
           ("tests/screen/test_dedup.py",)),
    Mutant("responses not decontaminated", "corpus_builder/screen/checks.py",
           "contamination=contamination,\n                   evict=evict)",
           "contamination=None,\n                   evict=evict)",
           ("tests/screen/test_dedup.py",)),
    Mutant("exact dedup on raw text", "corpus_builder/screen/near_dedup.py",
           "    if not text.isascii():\n", "    return text.encode()\n    if not text.isascii():\n",
           ("tests/screen/test_dedup.py", "tests/sources/test_repairs.py")),
    Mutant("a failed first build leaves its directory", "corpus_builder/assemble/pipeline.py",
           "            if created:\n                _remove_first_build(out_dir)\n", "",
           ("tests/assemble/test_failures.py", "tests/assemble/test_build.py")),
]


def scratch_copy(destination: Path) -> None:
    """The working tree as it is (tracked and untracked files), without the venv, caches and git."""
    skip = {".git", ".venv", ".venv-speculators", ".cache", "out", "__pycache__", ".pytest_cache", ".ruff_cache",
            ".mypy_cache"}
    shutil.copytree(REPO, destination, ignore=lambda _, names: [n for n in names if n in skip])
    (destination / ".cache").symlink_to(REPO / ".cache")


def run(mutant: Mutant | None, tests: tuple[str, ...], scratch: Path) -> tuple[bool, float]:
    """(the tests failed, seconds): apply the mutant (None: none, the control run) to a fresh copy, run tests."""
    tree = scratch / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    scratch_copy(tree)
    if mutant is not None:
        target = tree / mutant.file
        text = target.read_text(encoding="utf-8")
        if text.count(mutant.old) != 1:
            raise SystemExit(f"mutant {mutant.name!r}: its text occurs {text.count(mutant.old)} times in "
                             f"{mutant.file}")
        target.write_text(text.replace(mutant.old, mutant.new), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tree), "CORPUS_SKIP_VLLM": "1", "CORPUS_TEST_CACHE": str(REPO / ".cache")}
    started = time.monotonic()
    completed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m",
                                "not vllm", *tests], cwd=tree, env=env, capture_output=True, text=True)
    return completed.returncode != 0, time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="run only these mutants (by name)")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list:
        print("\n".join(f"{m.name}: {m.file} -> {' '.join(m.tests)}" for m in chosen))
        return 0
    survivors = []
    with tempfile.TemporaryDirectory(prefix="mutants-") as scratch:
        # The control: unmutated, every test named here passes in the scratch copy (else "caught" means nothing).
        union = tuple(dict.fromkeys(test for mutant in chosen for test in mutant.tests))
        failed, seconds = run(None, union, Path(scratch))
        if failed:
            raise SystemExit(f"the unmutated tree fails its own tests in the scratch copy ({seconds:.0f} s)")
        print(f"control: the unmutated tree passes all {len(union)} test targets ({seconds:.0f} s)", flush=True)
        for mutant in chosen:
            caught, seconds = run(mutant, mutant.tests, Path(scratch))
            print(f"{'caught  ' if caught else 'SURVIVED'} {mutant.name} ({seconds:.0f} s)", flush=True)
            if not caught:
                survivors.append(mutant.name)
    print(f"\n{len(chosen) - len(survivors)} of {len(chosen)} mutants caught"
          + (f"; survived: {', '.join(survivors)}" if survivors else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
