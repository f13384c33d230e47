"""Token statistics of a corpus in the target's tokens, and the served-ids check's verdict; memory per group."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..records import Conversation
from ..tokens import ConversationTokens, TokenRows, TokenSettings

GROUPINGS = ("source", "split")
PERCENTILES = (50, 90, 99)


def percentile(lengths: Counter[int], share: float) -> int:
    """Nearest-rank percentile of a length histogram."""
    total = sum(lengths.values())
    rank = max(1, -(-total * share // 100))
    seen = 0
    for length in sorted(lengths):
        seen += lengths[length]
        if seen >= rank:
            return length
    return 0


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

    def report(self, budgeted: bool) -> dict[str, Any]:
        conversations = sum(self.lengths.values())
        report: dict[str, Any] = {"conversations": conversations, "tokens": self.tokens}
        for share in PERCENTILES:
            report[f"p{share}"] = percentile(self.lengths, share) if conversations else 0
        report["max"] = max(self.lengths, default=0)
        report["supervised_tokens"] = self.supervised
        report["reasoning_tokens"] = self.reasoning
        report["reasoning_token_share"] = round(self.reasoning / self.supervised, 6) if self.supervised else 0.0
        report["over_budget"] = self.over_budget if budgeted else None
        return report


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

    def report(self) -> dict[str, Any]:
        budgeted = self.settings.max_seq_len is not None
        report = {
            "tokenizer": str(self.settings.tokenizer),
            "max_seq_len": self.settings.max_seq_len,
            "token_mismatch": self.settings.mismatch_policy,
            **self.overall.report(budgeted),
        }
        for grouping in GROUPINGS:
            report[f"by_{grouping}"] = {key: totals.report(budgeted)
                                        for key, totals in sorted(self.groups[grouping].items())}
        report["mismatches"] = {"count": len(self.mismatches), "checked_turns": self.checked_turns,
                                "turns": self.mismatches}
        return report


def mismatch_problem(tokens: dict[str, Any] | None) -> str | None:
    """The corpus-level failure when the recipe makes served-ids mismatches fatal."""
    if not tokens or tokens.get("token_mismatch") != "fail":
        return None
    count = tokens["mismatches"]["count"]
    if not count:
        return None
    return (f"{count:,} of {tokens['mismatches']['checked_turns']:,} generated turns do not re-render to their "
            "served token ids (checks.token_mismatch: fail)")
