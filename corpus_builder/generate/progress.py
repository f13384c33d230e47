"""Live progress of a generation run: rows done/total, output tokens/s, thinking share, faults, ETA.

On a terminal the line is redrawn in place a few times a second; otherwise (CI logs, files) a plain
line is written every ``interval_s`` seconds. The hot-path calls (``turn``, ``row``) only add to
counters and read the clock; drawing happens at most once per interval.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from .types import FaultCounters

TTY_INTERVAL_S = 0.25
LOG_INTERVAL_S = 30.0


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _classes(counts: dict[str, int]) -> str:
    return " ".join(f"{name}:{count}" for name, count in counts.items())


class Progress:
    """``total`` is the number of prompt conversations when the pipeline knows it (rows = total x n)."""

    def __init__(self, total: int | None = None, *, stream: TextIO | None = None,
                 interval_s: float | None = None, label: str = "generate",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        default_interval = TTY_INTERVAL_S if self.tty else LOG_INTERVAL_S
        self.interval_s = interval_s if interval_s is not None else default_interval
        self.label = label
        self._clock = clock
        self.samples_per_prompt = 1
        self.counters: FaultCounters | None = None
        self.rows_done = 0
        self.rows_skipped = 0
        self.rows_live = 0  # rows that needed at least one request (not all from the journal)
        self.turns_generated = 0
        self.turns_cached = 0
        self.output_tokens = 0  # generated in this run (cached turns excluded): the rate's numerator
        self.completion_tokens = 0  # all turns, cached included: the thinking share's denominator
        self.reasoning_tokens = 0
        self._started = clock()
        self._next_draw = self._started + self.interval_s
        self._drawn = False

    def start(self, *, samples_per_prompt: int = 1, counters: FaultCounters | None = None) -> None:
        self.samples_per_prompt = samples_per_prompt
        self.counters = counters
        self._started = self._clock()
        self._next_draw = self._started + self.interval_s

    def turn(self, completion_tokens: int, reasoning_tokens: int, *, cached: bool) -> None:
        if cached:
            self.turns_cached += 1
        else:
            self.turns_generated += 1
            self.output_tokens += completion_tokens
        self.completion_tokens += completion_tokens
        self.reasoning_tokens += reasoning_tokens

    def row(self, *, skipped: bool, live: bool) -> None:
        self.rows_done += 1
        self.rows_skipped += skipped
        self.rows_live += live
        now = self._clock()
        if now >= self._next_draw:
            self._next_draw = now + self.interval_s
            self._draw(now)

    def finish(self) -> None:
        self._draw(self._clock())
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()

    @property
    def total_rows(self) -> int | None:
        return None if self.total is None else self.total * self.samples_per_prompt

    def line(self, now: float | None = None) -> str:
        """The current state as one line (what is drawn)."""
        elapsed = max((self._clock() if now is None else now) - self._started, 1e-9)
        total = self.total_rows
        parts = [f"{self.label} {self.rows_done:,}/{total:,} rows" if total is not None
                 else f"{self.label} {self.rows_done:,} rows"]
        if total:
            parts[0] += f" ({100 * self.rows_done / total:.1f}%)"
        parts.append(f"{self.output_tokens / elapsed:,.0f} tok/s")
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
        if total is not None and self.rows_done < total and self.rows_done:
            # Rows finished from the journal cost nothing; the rate that predicts the rest is the live one.
            rows = self.rows_live or self.rows_done
            parts.append(f"ETA {_duration((total - self.rows_done) * elapsed / rows)}")
        return " | ".join(parts)

    def _draw(self, now: float) -> None:
        text = self.line(now)
        if self.tty:
            self.stream.write(f"\r\x1b[2K{text}")
        else:
            self.stream.write(f"{text}\n")
        self.stream.flush()
        self._drawn = True
