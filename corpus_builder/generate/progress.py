"""Live progress of a generation run: rows done/total, output tokens/s, thinking share, faults, ETA.

The hot-path calls (``turn``, ``row``) only add to counters and read the clock; drawing happens at most
once per interval (see ``corpus_builder.progress``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from ..progress import ProgressLine
from .types import FaultCounters


def _classes(counts: dict[str, int]) -> str:
    return " ".join(f"{name}:{count}" for name, count in counts.items())


class GenerationProgress(ProgressLine):
    """``total`` is the number of prompt conversations when the pipeline knows it (rows = total x n)."""

    def __init__(self, total: int | None = None, *, stream: TextIO | None = None, interval_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__("generate", total=total, stream=stream, interval_s=interval_s, clock=clock)
        self.prompts = total
        self.counters: FaultCounters | None = None
        self.rows_skipped = 0
        self.rows_live = 0  # rows that needed at least one request (not all from the journal)
        self.turns_generated = 0
        self.turns_cached = 0
        self.output_tokens = 0  # generated in this run (cached turns excluded): the rate's numerator
        self.completion_tokens = 0  # all turns, cached included: the thinking share's denominator
        self.reasoning_tokens = 0

    def start(self, *, samples_per_prompt: int = 1, counters: FaultCounters | None = None) -> None:
        self.total = None if self.prompts is None else self.prompts * samples_per_prompt
        self.counters = counters
        self.restart_clock()

    def turn(self, completion_tokens: int, reasoning_tokens: int, *, cached: bool) -> None:
        if cached:
            self.turns_cached += 1
        else:
            self.turns_generated += 1
            self.output_tokens += completion_tokens
        self.completion_tokens += completion_tokens
        self.reasoning_tokens += reasoning_tokens

    def row(self, *, skipped: bool, live: bool) -> None:
        self.rows_skipped += skipped
        self.rows_live += live
        self.advance()

    def parts(self, now: float) -> list[str]:
        parts = [self.head(), f"{self.output_tokens / self.elapsed(now):,.0f} tok/s"]
        if self.completion_tokens:
            parts.append(f"thinking {100 * self.reasoning_tokens / self.completion_tokens:.0f}%")
        if self.turns_cached:
            parts.append(f"cached {self.turns_cached:,} turns")
        if self.rows_skipped:
            parts.append(f"skipped {self.rows_skipped:,}")
        if self.counters is not None:
            snapshot = self.counters.snapshot()
            if snapshot["retries"]:
                parts.append(f"retries {_classes(snapshot['retries'])}")
            if snapshot["errors"]:
                parts.append(f"errors {_classes(snapshot['errors'])}")
        # Rows finished from the journal cost nothing; the rate that predicts the rest is the live one.
        eta = self.eta(now, timed=self.rows_live)
        if eta is not None:
            parts.append(eta)
        return parts
