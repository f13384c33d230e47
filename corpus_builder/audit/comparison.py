"""The comparison of a corpus with traffic as JSON (``corpus audit --against ... --json``, the page's input): typed
records of what ``traffic`` writes and ``html`` and the text read, one per section, in the order they are written."""

from __future__ import annotations

from typing import NotRequired, TypedDict

from ..stats.corpus import AuditReport


class GroupShares(TypedDict):
    """A source's, task's or split's conversations and shares; a source's also its main task."""

    conversations: int
    thinking_share: float  # of the thinking mode (``facts.thinking_mode``)
    reasoning_share: float  # of the conversations that carry reasoning (``facts.thinking``)
    task: NotRequired[str]


class TokenSample(TypedDict):
    """The rows the token dimensions were measured on."""

    conversations: int
    of: int
    unmeasured_turns: int
    skipped: dict[str, int]
    supervised_tokens: int


class LengthRow(TypedDict):
    """Conversations (or turns) in one length bucket of a source and thinking mode (the page's histograms)."""

    source: str
    thinking: str
    measure: str
    bucket: str
    count: int


class CopyFigures(TypedDict):
    turns: int
    response_tokens: int
    copied_tokens: int
    share: float
    longest: int


class GroupCopies(CopyFigures):
    buckets: dict[str, int]


class Copies(CopyFigures):
    """Response tokens inside spans of ``span_tokens`` or more copied from the context: overall (first in the JSON:
    ``span_tokens``), by task and source."""

    span_tokens: int
    by_task: dict[str, GroupCopies]
    by_source: dict[str, GroupCopies]


class Side(TypedDict):
    """One side of the comparison (the corpus, or the traffic): counts and shares by dimension, and with a
    tokenizer the token sample's lengths and copy-spans."""

    label: str
    conversations: int
    skipped: dict[str, int]
    folded_prefix: int
    thinking_share: float
    reasoning_share: float
    served: dict[str, int]
    by_task: dict[str, GroupShares]
    by_source: dict[str, GroupShares]
    by_split: dict[str, GroupShares]
    counts: dict[str, dict[str, int]]
    token_sample: NotRequired[TokenSample]
    lengths: NotRequired[dict[str, dict[str, int | float]]]
    length_buckets: NotRequired[list[LengthRow]]
    copies: NotRequired[Copies | None]
    shares: NotRequired[dict[str, dict[str, float]]]


class Readable(TypedDict):
    """How much of the traffic the figures describe."""

    rows: int
    skipped: int
    skipped_share: float
    max_skipped_share: float
    partial: bool
    folded_prefix: int
    note: NotRequired[str]


class Gap(TypedDict):
    bucket: str
    corpus: float
    traffic: float
    gap: float


class Divergence(TypedDict):
    tvd: float
    gaps: list[Gap]


class MaxDivergence(TypedDict):
    dimension: str
    tvd: float


class CurvePoint(TypedDict):
    """The share of supervised tokens the top ``k`` cover: the corpus's by its own top-k; with traffic, the
    traffic's by the corpus's top-k and by its own."""

    k: int
    corpus: float | None
    traffic: NotRequired[float | None]
    traffic_own: NotRequired[float | None]


class Vocab(TypedDict):
    """The draft vocabulary ``corpus vocab`` would choose from the corpus, and (with traffic) how much of the
    traffic's supervised tokens it covers."""

    draft_vocab_size: int
    target_vocab_size: int
    traffic_coverage: NotRequired[float | None]
    traffic_outside: NotRequired[float | None]
    traffic_oracle_coverage: NotRequired[float | None]
    corpus_coverage: NotRequired[float | None]
    traffic_tokens_unseen_in_corpus: NotRequired[float | None]
    curve: list[CurvePoint]


class PlanEntry(TypedDict):
    """A corpus source's rows now and the rows it should give for the corpus to follow the traffic."""

    source: str
    task: str
    rows: int
    target_rows: int
    change: int
    thinking_share: float


class Comparison(TypedDict):
    """``audit_against``'s report (corpus and traffic), or ``describe_corpus``'s (the corpus alone: no traffic,
    readable, divergence, plan, diff or suggestions)."""

    corpus: Side
    traffic: NotRequired[Side]
    readable: NotRequired[Readable]
    divergence: NotRequired[dict[str, Divergence]]
    notes: NotRequired[list[str]]
    tokenizer: NotRequired[str | None]
    vocab: NotRequired[Vocab]
    max_divergence: NotRequired[MaxDivergence | None]
    plan: NotRequired[list[PlanEntry]]
    recipe_diff: NotRequired[str | None]
    suggestions: NotRequired[list[str]]


class AuditedComparison(Comparison):
    """``corpus audit --against ... --json``: the comparison, with the corpus's statistics under ``audit``."""

    audit: AuditReport
