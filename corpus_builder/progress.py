"""Progress lines for long phases: redrawn in place on a terminal, a plain line now and then in logs.

The hot-path call (``advance``) adds to a counter and reads the clock; drawing happens at most once per
interval. A phase with a known total shows its share and an ETA; without one, its rate.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

TTY_INTERVAL_S = 0.25
LOG_INTERVAL_S = 30.0


def duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


class ProgressLine:
    """One phase: ``label`` and ``unit`` name it ("read replay", "rows"); ``total`` when it is known."""

    def __init__(self, label: str, *, total: int | None = None, unit: str = "rows", stream: TextIO | None = None,
                 interval_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = interval_s if interval_s is not None else (TTY_INTERVAL_S if self.tty else LOG_INTERVAL_S)
        self._clock = clock
        self.done = 0
        self._started = clock()
        self._next_draw = self._started + self.interval_s
        self._drawn = False

    def restart_clock(self) -> None:
        """Rates and the ETA count from now (e.g. once a server is up)."""
        self._started = self._clock()
        self._next_draw = self._started + self.interval_s

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = self._clock()
        if now >= self._next_draw:
            self._next_draw = now + self.interval_s
            self._draw(now)

    def finish(self) -> None:
        """The final state, always drawn (a phase that ran at all says what it did)."""
        self._draw(self._clock())
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()

    def elapsed(self, now: float) -> float:
        return max(now - self._started, 1e-9)

    def head(self) -> str:
        """The label and the count: "label done/total unit (share%)", or "label done unit" without a total."""
        total = self.total
        if total is None:
            return f"{self.label} {self.done:,} {self.unit}"
        head = f"{self.label} {self.done:,}/{total:,} {self.unit}"
        if total:
            head += f" ({100 * self.done / total:.1f}%)"
        return head

    def eta(self, now: float, *, timed: int | None = None) -> str | None:
        """"ETA ..." while a phase with a known total is under way, at the pace of the ``timed`` items the
        elapsed time went to (default: every one done); None otherwise."""
        total = self.total
        if total is None or not 0 < self.done < total:
            return None
        return f"ETA {duration((total - self.done) * self.elapsed(now) / (timed or self.done))}"

    def parts(self, now: float) -> list[str]:
        """The pieces of the line; phases with more to say extend it."""
        head = self.head()
        if self.total is None:
            return [head, f"{self.done / self.elapsed(now):,.0f} {self.unit}/s"]
        eta = self.eta(now)
        return [head] if eta is None else [head, eta]

    def line(self, now: float) -> str:
        return " | ".join(self.parts(now))

    def _draw(self, now: float) -> None:
        text = self.line(now)
        self.stream.write(f"\r\x1b[2K{text}" if self.tty else f"{text}\n")
        self.stream.flush()
        self._drawn = True
