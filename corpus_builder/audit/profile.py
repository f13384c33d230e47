"""One side of an audit (a corpus, or serving traffic) read once into count tables: memory per group, never
per row.

Every row's facts (``frames.row_facts``) are counted by all the fact keys at once, so each dimension and
each cross-tab (thinking by task, by source, by split) is a marginal of one table. A seeded sample of the
rows (``--token-sample``, all of a small input) is also measured in the target's tokens
(``token_pass.TokenMeter``): lengths bucketed by source, split, task and thinking mode, exact length
histograms for the percentiles, copy-span sums, and the supervised-token frequencies.

The units are read in parts (``inputs.read_parts``): each part's profile is read on its own (``read_part``) and
merged into the whole (``Profile.merge``), locally one after the other, on a cluster by separate tasks
(``ray_data``). Every count is a sum over rows, so the merged profile is the one a single reading gives; the
sample is one ``TokenSample`` for every part, keyed by each row's place in its unit.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import polars as pl
import pyarrow as pa

from ..errors import Skipped
from ..records import Conversation
from ..stats.facts import THINKING_MODE
from .frames import FACT_KEYS, row_facts
from .inputs import Unit, read_parts, sample_mask
from .token_pass import Measured, TokenMeter

TOKEN_BATCH: Final = 512  # conversations measured together (one encode call, one numpy pass)
GROUP_KEYS: Final = ("source", "split", "task", THINKING_MODE)  # what token measures are grouped by
# Length buckets in target tokens: [low, high) edges.
LENGTH_EDGES: Final = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
LENGTH_BUCKETS: Final = ("<128", "128-256", "256-512", "512-1k", "1k-2k", "2k-4k", "4k-8k", "8k-16k", "16k-32k",
                         "32k+")
LENGTH_MEASURES: Final = ("prompt_tokens", "response_tokens", "reasoning_tokens", "conversation_tokens")
# Share of a turn's response tokens inside copied spans: "0", then (low, high] buckets.
COPY_EDGES: Final = (0.1, 0.25, 0.5, 0.75, 1.0)
COPY_BUCKETS: Final = ("0", "0-10%", "10-25%", "25-50%", "50-75%", "75-100%")
_COMPACT_PARTS = 32
_COUNTS = pa.map_(pa.string(), pa.int64())  # a Counter as a typed column


class _Table:
    """Partial group-by results of chunks, merged every few chunks (memory: the distinct groups)."""

    def __init__(self, keys: Sequence[str], sums: Sequence[str], maxes: Sequence[str] = ()) -> None:
        self.keys = list(keys)
        self.aggregations = [pl.col(c).sum() for c in sums] + [pl.col(c).max() for c in maxes]
        self.parts: list[pl.DataFrame] = []
        self._merged: pl.DataFrame | None = None  # frame() of the parts, until a part is added

    def add(self, part: pl.DataFrame) -> None:
        self.parts.append(part)
        self._merged = None
        if len(self.parts) >= _COMPACT_PARTS:
            self.parts = [self.frame()]
            self._merged = None  # the next frame() merges the compacted part as before (same dtypes)

    def merge(self, other: _Table) -> None:
        """Another table's counts added to these."""
        if other.parts:
            self.add(other.frame())

    def to_ipc(self) -> bytes:
        """The counts as an Arrow IPC file (typed: its schema travels with it); ``add_ipc`` adds them back."""
        sink = io.BytesIO()
        self.frame().write_ipc(sink)
        return sink.getvalue()

    def add_ipc(self, data: bytes) -> None:
        frame = pl.read_ipc(io.BytesIO(data))
        if frame.width:
            self.add(frame)

    def frame(self) -> pl.DataFrame:
        """The parts merged: one row per group, sorted by the keys (merged once; the report reads it often)."""
        if self._merged is None:
            self._merged = self._merge()
        return self._merged

    def _merge(self) -> pl.DataFrame:
        if not self.parts:
            return pl.DataFrame()
        return pl.concat(self.parts, how="vertical_relaxed").group_by(self.keys).agg(self.aggregations) \
            .sort(self.keys, nulls_last=True)


@dataclass
class TokenTables:
    """What the token pass measured: buckets by group, exact histograms, copy sums, supervised frequencies."""

    span_tokens: int
    frequencies: np.ndarray
    buckets: _Table = field(default_factory=lambda: _Table((*GROUP_KEYS, "measure", "bucket"), ("count",)))
    exact: _Table = field(default_factory=lambda: _Table(("measure", "tokens"), ("count",)))
    copies: _Table = field(default_factory=lambda: _Table(
        ("source", "task", THINKING_MODE, "copy_bucket"), ("turns", "response_tokens", "copied_tokens"),
        ("longest_copy",)))
    conversations: int = 0
    unmeasured_turns: int = 0
    skipped: Counter[str] = field(default_factory=Counter)  # sampled rows the readers' normaliser refused

    def merge(self, other: TokenTables) -> None:
        """Another part's measures added to these."""
        self.frequencies += other.frequencies
        for mine, theirs in ((self.buckets, other.buckets), (self.exact, other.exact), (self.copies, other.copies)):
            mine.merge(theirs)
        self.conversations += other.conversations
        self.unmeasured_turns += other.unmeasured_turns
        self.skipped.update(other.skipped)

    def to_arrow(self) -> dict[str, pa.Array]:
        """The measures as typed columns of one row (``Profile.to_arrow``)."""
        return {"span_tokens": pa.array([self.span_tokens], pa.int64()),
                "frequencies": pa.array([self.frequencies], pa.list_(pa.int64())),
                "buckets": pa.array([self.buckets.to_ipc()], pa.binary()),
                "exact": pa.array([self.exact.to_ipc()], pa.binary()),
                "copies": pa.array([self.copies.to_ipc()], pa.binary()),
                "conversations": pa.array([self.conversations], pa.int64()),
                "unmeasured_turns": pa.array([self.unmeasured_turns], pa.int64()),
                "token_skipped": pa.array([list(self.skipped.items())], _COUNTS)}

    @classmethod
    def from_arrow(cls, row: pa.Table) -> TokenTables:
        tables = cls(row.column("span_tokens")[0].as_py(),
                     np.asarray(row.column("frequencies")[0].values.to_numpy(zero_copy_only=False), dtype=np.int64),
                     conversations=row.column("conversations")[0].as_py(),
                     unmeasured_turns=row.column("unmeasured_turns")[0].as_py(),
                     skipped=Counter(dict(row.column("token_skipped")[0].as_py())))
        for name, table in (("buckets", tables.buckets), ("exact", tables.exact), ("copies", tables.copies)):
            table.add_ipc(row.column(name)[0].as_py())
        return tables

    def add(self, keys: pl.DataFrame, measured: Measured) -> None:
        self.conversations += keys.height
        self.unmeasured_turns += measured.unmeasured_turns
        self.frequencies += np.bincount(measured.supervised_ids, minlength=len(self.frequencies))
        turns = keys[measured.turn_conversation].with_columns(
            prompt_tokens=pl.Series(measured.turn_prompt), response_tokens=pl.Series(measured.turn_response),
            reasoning_tokens=pl.Series(measured.turn_reasoning), copied_tokens=pl.Series(measured.turn_copied),
            longest_copy=pl.Series(measured.turn_longest_copy))
        lengths = pl.concat([
            turns.unpivot(["prompt_tokens", "response_tokens", "reasoning_tokens"], index=list(GROUP_KEYS),
                          variable_name="measure", value_name="tokens"),
            keys.with_columns(measure=pl.lit("conversation_tokens"),
                              tokens=pl.Series(measured.conversation_tokens)),
        ], how="vertical_relaxed").filter(pl.col("tokens") > 0)
        bucket = np.searchsorted(np.array(LENGTH_EDGES), lengths.get_column("tokens").to_numpy(), side="right")
        lengths = lengths.with_columns(bucket=pl.Series(np.array(LENGTH_BUCKETS)[bucket]))
        self.buckets.add(lengths.group_by((*GROUP_KEYS, "measure", "bucket")).agg(count=pl.len()))
        self.exact.add(lengths.group_by("measure", "tokens").agg(count=pl.len()))
        share = measured.turn_copied / np.maximum(measured.turn_response, 1)
        copy_bucket = np.where(measured.turn_copied == 0, 0,
                               np.searchsorted(np.array(COPY_EDGES), share, side="left") + 1)
        self.copies.add(turns.with_columns(copy_bucket=pl.Series(np.array(COPY_BUCKETS)[copy_bucket]))
                        .group_by("source", "task", THINKING_MODE, "copy_bucket")
                        .agg(turns=pl.len(), response_tokens=pl.col("response_tokens").sum(),
                             copied_tokens=pl.col("copied_tokens").sum(), longest_copy=pl.col("longest_copy").max()))


@dataclass
class Profile:
    """One side of the audit, as counts."""

    label: str
    facts: _Table = field(default_factory=lambda: _Table(FACT_KEYS, ("count",)))
    skipped: Counter[str] = field(default_factory=Counter)
    tokens: TokenTables | None = None
    rows_read: int = 0
    folded: int = 0  # logged requests folded into a later request of their conversation: not skipped, not rows
    models: Counter[str] = field(default_factory=Counter)  # logged requests by the model that served them

    @classmethod
    def empty(cls, label: str, meter: TokenMeter | None) -> Profile:
        """No rows yet; token tables when there is a meter."""
        if meter is None:
            return cls(label)
        return cls(label, tokens=TokenTables(meter.span_tokens, np.zeros(meter.vocab_size, dtype=np.int64)))

    def to_arrow(self) -> pa.Table:
        """The profile as one row of typed columns, to cross from a task to the driver: the count tables as Arrow
        IPC files, the counters as maps, the token tables' columns (null without a token pass)."""
        columns: dict[str, pa.Array] = {
            "label": pa.array([self.label], pa.string()), "facts": pa.array([self.facts.to_ipc()], pa.binary()),
            "skipped": pa.array([list(self.skipped.items())], _COUNTS),
            "rows_read": pa.array([self.rows_read], pa.int64()), "folded": pa.array([self.folded], pa.int64()),
            "models": pa.array([list(self.models.items())], _COUNTS)}
        if self.tokens is not None:
            columns |= self.tokens.to_arrow()
        return pa.table(columns)

    @classmethod
    def from_arrow(cls, row: pa.Table) -> Profile:
        """The profile of ``to_arrow``'s row."""
        profile = cls(row.column("label")[0].as_py(), skipped=Counter(dict(row.column("skipped")[0].as_py())),
                      tokens=TokenTables.from_arrow(row) if "frequencies" in row.column_names else None,
                      rows_read=row.column("rows_read")[0].as_py(), folded=row.column("folded")[0].as_py(),
                      models=Counter(dict(row.column("models")[0].as_py())))
        profile.facts.add_ipc(row.column("facts")[0].as_py())
        return profile

    def merge(self, other: Profile) -> None:
        """Another part's counts added to these (both measured by the same meter, or neither)."""
        self.facts.merge(other.facts)
        self.skipped.update(other.skipped)
        if self.tokens is not None and other.tokens is not None:
            self.tokens.merge(other.tokens)
        self.rows_read += other.rows_read
        self.folded += other.folded
        self.models.update(other.models)


@dataclass
class TokenSample:
    """Which rows the token pass measures: about ``token_sample`` rows spread over the input (0: every row), by a
    seeded hash of each row's unit and place in it (``inputs.sample_mask``). The share is decided at the first
    chunk read, from its rows and bytes and the units' sizes (rows exact where known, else bytes at that density);
    every part of one reading shares it."""

    token_sample: int
    seed: int
    sizes: tuple[tuple[int | None, int], ...]  # each unit's known rows (None: unknown) and bytes
    share: float | None = None

    @classmethod
    def of(cls, units: Sequence[Unit], token_sample: int, seed: int = 0) -> TokenSample:
        return cls(token_sample, seed, tuple((unit.rows, unit.size) for unit in units),
                   None if token_sample else 1.0)

    def decide(self, first_rows: int, first_bytes: int) -> float:
        """The share, decided by the first chunk read (its rows and bytes) unless it is already."""
        if self.share is None:
            density = first_rows / first_bytes if first_bytes else 0.0
            estimate = sum(rows if rows is not None else round(size * density) for rows, size in self.sizes)
            self.share = min(1.0, self.token_sample / max(1, estimate))
        return self.share


def read_profile(label: str, units: Sequence[Unit], meter: TokenMeter | None, *, token_sample: int,
                 seed: int = 0) -> Profile:
    """Read every unit once: facts of every row, token measures of the sampled ones (``token_sample`` rows
    about, spread over the input; 0: every row); part after part, merged."""
    profile = Profile.empty(label, meter)
    sample = TokenSample.of(units, token_sample, seed)
    for part in read_parts(units):
        profile.merge(read_part(label, part, meter, sample))
    return profile


def read_part(label: str, units: Sequence[Unit], meter: TokenMeter | None, sample: TokenSample) -> Profile:
    """The profile of some units (a part of ``inputs.read_parts``), read in order."""
    profile = Profile.empty(label, meter)
    pending: list[Conversation] = []
    pending_keys: list[pl.DataFrame] = []
    for unit in units:
        offset = unit.first_row or 0  # None (a range not placed) where every row is measured or none: no matter
        for chunk in unit.chunks():
            profile.skipped.update(chunk.skipped)
            profile.folded += chunk.folded
            profile.models.update(chunk.models)
            facts = row_facts(chunk.frame, source=unit.source, task=unit.task, turns_field=chunk.turns_field)
            if chunk.normalised is not None:
                facts = pl.concat([facts, row_facts(chunk.normalised, source=unit.source, task=unit.task)])
            valid = facts.get_column("conversation")
            if not valid.all():
                profile.skipped.update(_why_not(chunk.conversations(np.flatnonzero(~valid.to_numpy()))))
            profile.rows_read += facts.height
            profile.facts.add(facts.filter(valid).group_by(FACT_KEYS).agg(count=pl.len()))
            if profile.tokens is not None and meter is not None:
                share = sample.decide(chunk.rows, chunk.bytes)
                chosen = np.flatnonzero(sample_mask(unit.label, offset, facts.height, share, sample.seed)
                                        & valid.to_numpy())
                kept, keys = _sampled(chunk.conversations(chosen), facts[chosen], profile.tokens)
                pending += kept
                pending_keys.append(keys)
                while len(pending) >= TOKEN_BATCH:
                    waiting = pl.concat(pending_keys)
                    profile.tokens.add(waiting[:TOKEN_BATCH], meter.measure(pending[:TOKEN_BATCH]))
                    pending, pending_keys = pending[TOKEN_BATCH:], [waiting[TOKEN_BATCH:]]
            offset += facts.height
    if pending and profile.tokens is not None and meter is not None:
        profile.tokens.add(pl.concat(pending_keys), meter.measure(pending))
    return profile


def _why_not(items: list[tuple[int, Conversation | Skipped]]) -> Counter[str]:
    """The readers' reasons for rows without a turns list (not an object, no such field...); a row they
    accept in another layout (a gsm8k or prompt row) has no turns to audit all the same."""
    return Counter(item.reason if isinstance(item, Skipped) else "missing_messages" for _, item in items)


def _sampled(items: list[tuple[int, Conversation | Skipped]], facts: pl.DataFrame,
             tokens: TokenTables) -> tuple[list[Conversation], pl.DataFrame]:
    """The normalised conversations of the sampled rows, and their group keys (from their rows' facts)."""
    kept: list[Conversation] = []
    rows: list[int] = []
    for index, item in items:
        if isinstance(item, Skipped):
            tokens.skipped[item.reason] += 1
        else:
            kept.append(item)
            rows.append(index)
    return kept, facts[rows].select(GROUP_KEYS)

