"""Token statistics of a corpus in the target's tokens, and the served-ids check's verdict; memory per group.

Each row's figures (``tokens.TokenFacts``) are measured where the build reads it, when it can be (the replay
readers' ``Checker.measure``), and handed here by id; rows that come without them (collected, truncated, or a
corpus audited from its files) are measured here, in batches."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from ..records import Conversation
from ..tokens import TokenFacts, TokenSettings, TurnTokens
from ..tokens.measure import PLAN_CHUNK, TokenMismatch
from . import nearest_rank

GROUPINGS = ("source", "split")
PERCENTILES = (50, 90, 99)


class TokenTotalsReport(TypedDict):
    """Lengths in target tokens of a corpus or a part of it: nearest-rank percentiles of the conversations'
    lengths, the supervised (loss-masked) tokens and the reasoning share of them."""

    conversations: int
    tokens: int
    p50: int
    p90: int
    p99: int
    max: int
    supervised_tokens: int
    reasoning_tokens: int
    reasoning_token_share: float
    over_budget: int | None  # None: the recipe sets no max_seq_len


class MismatchJson(TypedDict):
    """A generated turn whose re-render differs from its served ids: where first, and the tokens on each side."""

    id: str
    message_index: int
    position: int
    part: str
    served: list[int]
    rendered: list[int]
    served_text: str
    rendered_text: str


def _mismatch_json(mismatch: TokenMismatch) -> MismatchJson:
    return {"id": mismatch.id, "message_index": mismatch.message_index, "position": mismatch.position,
            "part": mismatch.part, "served": mismatch.served, "rendered": mismatch.rendered,
            "served_text": mismatch.served_text, "rendered_text": mismatch.rendered_text}


class MismatchReport(TypedDict):
    count: int
    checked_turns: int
    turns: list[MismatchJson]


class TokenReport(TokenTotalsReport):
    """audit.json's ``tokens``: the token statistics, by source and split, and the served-ids check."""

    tokenizer: str
    max_seq_len: int | None
    token_mismatch: str
    by_source: dict[str, TokenTotalsReport]
    by_split: dict[str, TokenTotalsReport]
    mismatches: MismatchReport


@dataclass
class _Totals:
    lengths: Counter[int] = field(default_factory=Counter)  # exact histogram: memory per distinct length
    tokens: int = 0
    supervised: int = 0
    reasoning: int = 0
    over_budget: int = 0

    def add(self, facts: TokenFacts, over: bool) -> None:
        self.lengths[facts.tokens] += 1
        self.tokens += facts.tokens
        self.supervised += facts.supervised
        self.reasoning += facts.reasoning
        self.over_budget += over

    def merge(self, other: _Totals) -> None:
        self.lengths.update(other.lengths)
        self.tokens += other.tokens
        self.supervised += other.supervised
        self.reasoning += other.reasoning
        self.over_budget += other.over_budget

    def to_json(self) -> TotalsJson:
        return {"lengths": list(self.lengths.items()), "tokens": self.tokens, "supervised": self.supervised,
                "reasoning": self.reasoning, "over_budget": self.over_budget}

    @classmethod
    def from_json(cls, document: TotalsJson) -> _Totals:
        return cls(Counter(dict(document["lengths"])), document["tokens"], document["supervised"],
                   document["reasoning"], document["over_budget"])

    def report(self, budgeted: bool) -> TokenTotalsReport:
        conversations = sum(self.lengths.values())
        lengths = np.array(sorted(self.lengths), dtype=np.int64)
        counts = np.array([self.lengths[length] for length in lengths.tolist()], dtype=np.int64)
        p50, p90, p99 = (nearest_rank(lengths, counts, share) if conversations else 0 for share in PERCENTILES)
        return {"conversations": conversations, "tokens": self.tokens, "p50": p50, "p90": p90, "p99": p99,
                "max": max(self.lengths, default=0), "supervised_tokens": self.supervised,
                "reasoning_tokens": self.reasoning,
                "reasoning_token_share": round(self.reasoning / self.supervised, 6) if self.supervised else 0.0,
                "over_budget": self.over_budget if budgeted else None}


class TotalsJson(TypedDict):
    lengths: list[tuple[int, int]]
    tokens: int
    supervised: int
    reasoning: int
    over_budget: int


class FiguresJson(TypedDict):
    """``TokenFigures`` as JSON, what a task that wrote rows sends the driver."""

    overall: TotalsJson
    groups: dict[str, dict[str, TotalsJson]]
    mismatches: list[MismatchJson]
    checked_turns: int


@dataclass
class TokenFigures:
    """What the token statistics add up, apart from the tokenizer that measures the rows: sent as JSON and merged
    (the Ray engine's writing tasks each add their rows' and the driver merges them)."""

    overall: _Totals = field(default_factory=_Totals)
    groups: dict[str, dict[str, _Totals]] = field(default_factory=lambda: {g: {} for g in GROUPINGS})
    mismatches: list[MismatchJson] = field(default_factory=list)
    checked_turns: int = 0

    def add(self, conversation: Conversation, facts: TokenFacts, over: bool) -> None:
        self.overall.add(facts, over)
        for grouping, key in (("source", conversation.source), ("split", conversation.split or "")):
            self.groups[grouping].setdefault(key, _Totals()).add(facts, over)
        self.checked_turns += facts.checked_turns
        self.mismatches += [_mismatch_json(m) for m in facts.named(conversation.id).mismatches]

    def to_json(self) -> FiguresJson:
        return {"overall": self.overall.to_json(),
                "groups": {grouping: {key: totals.to_json() for key, totals in groups.items()}
                           for grouping, groups in self.groups.items()},
                "mismatches": self.mismatches, "checked_turns": self.checked_turns}

    @classmethod
    def from_json(cls, document: FiguresJson) -> TokenFigures:
        return cls(_Totals.from_json(document["overall"]),
                   {grouping: {key: _Totals.from_json(totals) for key, totals in groups.items()}
                    for grouping, groups in document["groups"].items()},
                   document["mismatches"], document["checked_turns"])

    def merge(self, other: TokenFigures) -> None:
        """Add another's rows (the report orders the mismatches: only generated rows have any)."""
        self.overall.merge(other.overall)
        for grouping, groups in other.groups.items():
            for key, totals in groups.items():
                self.groups[grouping].setdefault(key, _Totals()).merge(totals)
        self.mismatches += other.mismatches
        self.checked_turns += other.checked_turns


class TokenStats:
    """Token statistics and the served-ids check over batches of a corpus; memory per group."""

    def __init__(self, settings: TokenSettings, turns: TurnTokens, measured: dict[str, TokenFacts] | None = None,
                 batch_size: int = 4 * PLAN_CHUNK) -> None:
        """``measured``: the facts of rows measured upstream, by the id they are written under; taken out as the
        rows are added. Rows are measured here ``batch_size`` at a time: several chunks, so that rendering one
        overlaps encoding the one before."""
        self.settings = settings
        self.turns = turns
        self.measured = measured if measured is not None else {}
        self.batch_size = batch_size
        self.figures = TokenFigures()

    def add_conversations(self, conversations: Sequence[Conversation]) -> None:
        """Rows in the order they are written; those measured upstream are not measured again."""
        facts: list[TokenFacts | None] = [self.measured.pop(c.id, None) for c in conversations] if self.measured \
            else [None] * len(conversations)
        unmeasured = [index for index, found in enumerate(facts) if found is None]
        for start in range(0, len(unmeasured), self.batch_size):
            chunk = unmeasured[start:start + self.batch_size]
            for index, measured in zip(chunk, self.turns.facts([conversations[i] for i in chunk]), strict=True):
                facts[index] = measured
        limit = self.settings.max_seq_len
        for conversation, found in zip(conversations, facts, strict=True):
            assert found is not None
            self.figures.add(conversation, found, limit is not None and found.tokens > limit)

    def report(self) -> TokenReport:
        budgeted = self.settings.max_seq_len is not None
        figures = self.figures

        def grouped(grouping: str) -> dict[str, TokenTotalsReport]:
            return {key: totals.report(budgeted) for key, totals in sorted(figures.groups[grouping].items())}

        return {"tokenizer": str(self.settings.tokenizer), "max_seq_len": self.settings.max_seq_len,
                "token_mismatch": self.settings.mismatch_policy, **figures.overall.report(budgeted),
                "by_source": grouped("source"), "by_split": grouped("split"),
                "mismatches": {"count": len(figures.mismatches), "checked_turns": figures.checked_turns,
                               "turns": sorted(figures.mismatches, key=_turn)}}


def _turn(mismatch: MismatchJson) -> tuple[str, int]:
    """A mismatch's place in the report: by the row's id, then its turn. The order the rows reach the statistics is
    how a writer cuts them into shards (a row group of a split at a time; on Ray, a writing task at a time), which
    no reader should see."""
    return mismatch["id"], mismatch["message_index"]


def mismatch_problem(tokens: TokenReport | None) -> str | None:
    """The corpus-level failure when the recipe makes served-ids mismatches fatal."""
    if not tokens or tokens.get("token_mismatch") != "fail":
        return None
    count = tokens["mismatches"]["count"]
    if not count:
        return None
    return (f"{count:,} of {tokens['mismatches']['checked_turns']:,} generated turns do not re-render to their "
            "served token ids (checks.token_mismatch: fail)")
