"""Token statistics of a corpus in the target's tokens, and the served-ids check's verdict; memory per group."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np

from ..records import Conversation
from ..tokens import ConversationTokens, TokenRows, TokenSettings
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


class MismatchReport(TypedDict):
    count: int
    checked_turns: int
    turns: list[dict[str, Any]]


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

    def add(self, item: ConversationTokens, over: bool) -> None:
        self.lengths[item.tokens] += 1
        self.tokens += item.tokens
        self.supervised += sum(row.supervised for row in item.rows)
        self.reasoning += sum(row.reasoning for row in item.rows)
        self.over_budget += over

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


class TokenStats:
    """Token statistics and the served-ids check over batches of a corpus; memory per group."""

    def __init__(self, settings: TokenSettings, rows: TokenRows, batch_size: int = 256) -> None:
        self.settings = settings
        self.rows = rows
        self.batch_size = batch_size
        self.overall = _Totals()
        self.groups: dict[str, dict[str, _Totals]] = {g: {} for g in GROUPINGS}
        self.mismatches: list[dict[str, Any]] = []
        self.checked_turns = 0

    def add_conversations(self, conversations: list[Conversation]) -> None:
        for start in range(0, len(conversations), self.batch_size):
            self.add(self.rows.tokenize(conversations[start:start + self.batch_size]))

    def add(self, items: Iterable[ConversationTokens]) -> None:
        limit = self.settings.max_seq_len
        for item in items:
            over = limit is not None and item.tokens > limit
            self.overall.add(item, over)
            conversation = item.conversation
            for grouping, key in (("source", conversation.source), ("split", conversation.split or "")):
                self.groups[grouping].setdefault(key, _Totals()).add(item, over)
            self.checked_turns += item.checked_turns
            self.mismatches += [m.to_dict() for m in item.mismatches]

    def report(self) -> TokenReport:
        budgeted = self.settings.max_seq_len is not None

        def grouped(grouping: str) -> dict[str, TokenTotalsReport]:
            return {key: totals.report(budgeted) for key, totals in sorted(self.groups[grouping].items())}

        return {"tokenizer": str(self.settings.tokenizer), "max_seq_len": self.settings.max_seq_len,
                "token_mismatch": self.settings.mismatch_policy, **self.overall.report(budgeted),
                "by_source": grouped("source"), "by_split": grouped("split"),
                "mismatches": {"count": len(self.mismatches), "checked_turns": self.checked_turns,
                               "turns": self.mismatches}}


def mismatch_problem(tokens: dict[str, Any] | None) -> str | None:
    """The corpus-level failure when the recipe makes served-ids mismatches fatal."""
    if not tokens or tokens.get("token_mismatch") != "fail":
        return None
    count = tokens["mismatches"]["count"]
    if not count:
        return None
    return (f"{count:,} of {tokens['mismatches']['checked_turns']:,} generated turns do not re-render to their "
            "served token ids (checks.token_mismatch: fail)")
