"""What the fuzz tests (trial 4: bad input) share: their hypothesis settings and their outcome counts.

In CI every property runs a small, fixed set of examples (derandomized: the same ones on every run). By
hand, CORPUS_FUZZ_EXAMPLES raises the count for every property and draws fresh random examples:

    CORPUS_FUZZ_EXAMPLES=5000 .venv/bin/python -m pytest -q -s tests/recipe/test_fuzz.py tests/sources/test_fuzz.py

With ``-s`` each module prints how the examples ended (the figures in RELIABILITY.md).

Under mutmut (scripts/mutation.py sets CORPUS_MUTATION_OWNERS for its whole run) every property runs at most
MUTATION_EXAMPLES of its examples, the first ones of the CI set, and a failing example is not shrunk
(tests/conftest.py loads that profile): a mutant a property kills dies at its first failing example, one the property
misses pays its examples in full before the test that kills it, and the score is then that of a lighter suite.
"""

from __future__ import annotations

import os
from collections import Counter
from datetime import timedelta

from hypothesis import HealthCheck, settings

EXAMPLES_ENV = "CORPUS_FUZZ_EXAMPLES"
MUTATION_ENV = "CORPUS_MUTATION_OWNERS"
MUTATION_EXAMPLES = 40


def fuzz_settings(examples: int) -> settings:
    """``examples`` per property in CI; CORPUS_FUZZ_EXAMPLES of fresh random ones when set."""
    wanted = os.environ.get(EXAMPLES_ENV)
    if wanted:
        examples = int(wanted)
    elif MUTATION_ENV in os.environ:
        examples = min(examples, MUTATION_EXAMPLES)
    return settings(
        max_examples=examples,
        derandomize=not wanted,
        database=None,  # nothing written next to the tests; a failure prints its reproducing example
        print_blob=True,
        # A hang shows as an example over this (the real work per example is milliseconds).
        deadline=timedelta(seconds=20),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.function_scoped_fixture],
    )


class Outcomes:
    """How the examples of one module ended, by property and outcome, printed at the module's end."""

    def __init__(self, trial: str) -> None:
        self.trial = trial
        self.counts: dict[str, Counter[str]] = {}

    def record(self, prop: str, outcome: str) -> None:
        self.counts.setdefault(prop, Counter())[outcome] += 1

    def report(self) -> str:
        lines = [f"{self.trial}: examples by outcome (hypothesis's shrinking runs included)"]
        for prop, counts in sorted(self.counts.items()):
            lines.append(f"  {prop}: {sum(counts.values())} examples: {dict(sorted(counts.items()))}")
        return "\n".join(lines)
