"""The row checks: each one object that says what it measures, what it decides and the skip reason of a row it
drops, registered in ``ROW_CHECKS`` in the order the screen (``checks.Checker``) applies them. The skip reasons
reference (``reference/skip_reasons.py``) lists them from here.

A check reads what ``Checker.measure`` measured of the batch (``BatchStats``: lengths in target tokens, the
evaluation sets each row matches, the eval pack's signatures), possibly in the processes that read the rows, and
decides by the recipe's policy: keep the row, keep it rewritten (truncated), or drop it as a ``Skipped``. A check
judges the rows still kept after the checks before it.

To add a check: a subclass here, in ``ROW_CHECKS``; what it reads, if the screen does not measure it yet, in
``BatchStats`` and ``Checker.measure``; its reason in ``errors.REASONS``; its setting, if any, in the recipe's
``checks``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import ClassVar

from ..errors import CONTAMINATED, Skipped, contamination_detail
from ..recipe.model import Checks
from ..records import FLAG_TRUNCATED, FLAG_UNCLOSED_THINK, Conversation, row_location
from ..tokens import TemplateRenderer, TokenFacts
from .decontaminate import Contamination
from .dedup import Dedup
from .near_dedup import Signatures
from .normalise import ConversationText, conversation_text
from .pack import EVAL_PACK_COPY, PackScreen

FLAG_TRUNCATED_TO_BUDGET = "truncated_to_budget"
# What contamination is checked on: the whole conversation (a response that reproduces a reference answer is
# contaminated too).
CONTAMINATION_TEXT: ConversationText = "all"


@dataclass(slots=True)
class BatchStats:
    """What the checks measure of a batch of rows before deciding (possibly in the processes that read them)."""

    tokens: list[int | None]  # each row's length in target tokens, or its floor when ``at_least``
    at_least: list[bool]  # over the budget by its floor alone: never rendered or tokenized
    signatures: Signatures | None  # what dedup compares
    contamination: list[tuple[str, ...]] | None  # the evaluation sets each row matches
    pack_signatures: Signatures | None = None  # what the eval pack's index compares, when not dedup's own
    token_facts: list[TokenFacts | None] | None = None  # what the token statistics add up, of the rows measured


@dataclass(frozen=True)
class CheckSetup:
    """What the screen holds that a check may need: the recipe's checks, the policy for answers served cut at
    max_tokens, the target's renderer (when lengths are checked), the evaluation sets' index, the eval pack and the
    dedup index."""

    checks: Checks
    keep_truncated: bool = False
    renderer: TemplateRenderer | None = None
    contamination: Contamination | None = None
    pack: PackScreen | None = None
    dedup: Dedup | None = None

    @property
    def pack_shares_signatures(self) -> bool:
        """The eval pack compares dedup's own signatures (measured once for both)."""
        return self.pack is not None and self.pack.shares_signatures(self.dedup)


@dataclass
class Judging:
    """A batch being judged: its rows as measured, their measurement, and each row's outcome so far (the row,
    kept, perhaps rewritten; a Skipped; None when the eval pack holds it out)."""

    rows: list[Conversation]
    stats: BatchStats
    outcomes: list[Conversation | Skipped | None]
    rewritten: dict[int, Conversation] = field(default_factory=dict)  # rows a check rewrote: other texts now

    def kept(self) -> list[int]:
        return [i for i, outcome in enumerate(self.outcomes) if isinstance(outcome, Conversation)]

    def drop(self, index: int, reason: str, detail: str = "") -> None:
        row = self.rows[index]
        self.outcomes[index] = Skipped(row.source, reason, row_location(row), detail, id=row.id)

    def rewrite(self, index: int, row: Conversation) -> None:
        self.outcomes[index] = self.rewritten[index] = row


class RowCheck(ABC):
    """One check: what it ``measures``, what it ``decides`` and the skip ``reason`` of a row it drops (for the
    reference and the architecture's table, as its code does them)."""

    reason: ClassVar[str]
    measures: ClassVar[str]
    decides: ClassVar[str]

    @classmethod
    @abstractmethod
    def of(cls, setup: CheckSetup) -> RowCheck | None:
        """The check as the screen's settings ask for it; None when they switch it off."""

    @abstractmethod
    def judge(self, judging: Judging) -> None:
        """Decide on every row of ``judging`` still kept."""


class OneRowCheck(RowCheck):
    """A check that judges each row on its own."""

    def judge(self, judging: Judging) -> None:
        for index in judging.kept():
            self.judge_row(judging, index)

    @abstractmethod
    def judge_row(self, judging: Judging, index: int) -> None: ...


@dataclass(frozen=True)
class UnclosedThink(OneRowCheck):
    reason: ClassVar[str] = "unclosed_think"
    measures: ClassVar[str] = "the row's `unclosed_think` flag (a reasoning block opened and never closed)"
    decides: ClassVar[str] = "drop the row (`checks.on_unclosed_think: drop`, the default) or keep it flagged"

    @classmethod
    def of(cls, setup: CheckSetup) -> UnclosedThink | None:
        return cls() if setup.checks.on_unclosed_think == "drop" else None

    def judge_row(self, judging: Judging, index: int) -> None:
        if FLAG_UNCLOSED_THINK in judging.rows[index].flags:
            judging.drop(index, self.reason)


@dataclass(frozen=True)
class TruncatedGeneration(OneRowCheck):
    reason: ClassVar[str] = "truncated_generation"
    measures: ClassVar[str] = ("the row's `truncated_generation` flag (a logged answer served cut at max_tokens, "
                               "finish_reason: length)")
    decides: ClassVar[str] = ("drop a replayed row so flagged, unless `target.generation.on_length: keep` (generated "
                              "answers are judged as they come back)")

    @classmethod
    def of(cls, setup: CheckSetup) -> TruncatedGeneration | None:
        # A logged request cannot be asked again: retry drops it too.
        return None if setup.keep_truncated else cls()

    def judge_row(self, judging: Judging, index: int) -> None:
        row = judging.rows[index]
        if FLAG_TRUNCATED in row.flags and row.origin == "replay":
            judging.drop(index, self.reason, "an answer was served cut at max_tokens (finish_reason: length)")


@dataclass(frozen=True)
class OverLength(OneRowCheck):
    reason: ClassVar[str] = "over_length"
    measures: ClassVar[str] = ("the row's length in the target's tokens (a floor from its characters first: a row "
                               "over the budget by that alone is never rendered)")
    decides: ClassVar[str] = ("over `checks.max_seq_len`: drop the row, or cut trailing exchanges until it fits "
                              "(`checks.on_over_length: truncate`, flagged `truncated_to_budget`; dropped when even "
                              "the first exchange is too long)")

    limit: int
    renderer: TemplateRenderer | None  # None: never truncated
    truncate: bool

    @classmethod
    def of(cls, setup: CheckSetup) -> OverLength | None:
        limit = setup.checks.max_seq_len
        if limit is None:
            return None
        return cls(limit, setup.renderer, setup.checks.on_over_length == "truncate")

    def judge_row(self, judging: Judging, index: int) -> None:
        tokens, stats = judging.stats.tokens[index], judging.stats
        if tokens is None or tokens <= self.limit:
            return
        shortened = self._truncated(judging.rows[index]) if self.truncate else None
        if shortened is None:
            judging.drop(index, self.reason,
                         f"{'at least ' if stats.at_least[index] else ''}{tokens} tokens > {self.limit}")
        else:
            judging.rewrite(index, shortened)

    def _truncated(self, conversation: Conversation) -> Conversation | None:
        """Drop trailing exchanges (a user turn and all that answers it: tool calls, their results, the answer)
        until the conversation fits; None when even the first exchange is too long."""
        assert self.renderer is not None  # lengths were measured, so there is a renderer
        messages = conversation.messages
        for cut in range(len(messages) - 1, 0, -1):
            if messages[cut].role != "user" or messages[cut - 1].role != "assistant":
                continue
            candidate = replace(conversation, messages=list(messages[:cut]),
                                flags=[*conversation.flags, FLAG_TRUNCATED_TO_BUDGET])
            if (self.renderer.token_lower_bound(candidate) <= self.limit
                    and self.renderer.count_tokens([candidate])[0] <= self.limit):
                return candidate
        return None


@dataclass(frozen=True)
class Contaminated(RowCheck):
    reason: ClassVar[str] = CONTAMINATED
    measures: ClassVar[str] = ("the evaluation sets the row shares a run of `decontamination.ngram` words with "
                               "(normalised text of the whole conversation; a rewritten row measured again)")
    decides: ClassVar[str] = "drop the row, naming the sets"

    index: Contamination

    @classmethod
    def of(cls, setup: CheckSetup) -> Contaminated | None:
        return cls(setup.contamination) if setup.contamination is not None else None

    def judge(self, judging: Judging) -> None:
        if judging.stats.contamination is None:
            return
        contamination = list(judging.stats.contamination)
        rewritten = judging.rewritten
        again = self.index.matches([conversation_text(row, CONTAMINATION_TEXT) for row in rewritten.values()])
        for i, sets in zip(rewritten, again, strict=True):
            contamination[i] = sets
        for i, sets in enumerate(contamination):
            if sets and isinstance(judging.outcomes[i], Conversation):
                judging.drop(i, self.reason, contamination_detail(sets))


@dataclass(frozen=True)
class EvalPackCopy(RowCheck):
    reason: ClassVar[str] = EVAL_PACK_COPY
    measures: ClassVar[str] = ("the row's signatures against the eval pack's index (exact and, with "
                               "`checks.near_duplicates`, near copies; a rewritten row measured again)")
    decides: ClassVar[str] = "drop a copy or a near copy of a pack row, naming it (training on it would leak the pack)"

    pack: PackScreen
    shares_signatures: bool  # the pack compares dedup's signatures: measured once for both

    @classmethod
    def of(cls, setup: CheckSetup) -> EvalPackCopy | None:
        return cls(setup.pack, setup.pack_shares_signatures) if setup.pack is not None else None

    def judge(self, judging: Judging) -> None:
        stats = judging.stats
        signatures = stats.signatures if self.shares_signatures else stats.pack_signatures
        assert signatures is not None  # Checker.measure computes them whenever there is a pack
        if judging.rewritten:
            signatures = signatures.replaced(list(judging.rewritten),
                                             self.pack.signatures(list(judging.rewritten.values())))
        candidates = judging.kept()
        for i, copied in zip(candidates, self.pack.copies(signatures.rows(candidates)), strict=True):
            if copied is not None:
                judging.drop(i, self.reason, copied)


# The checks in the order the screen applies them: the flags a row carries, its length (which may rewrite it), then
# what is judged on the final text: the evaluation sets, the eval pack.
ROW_CHECKS: tuple[type[RowCheck], ...] = (UnclosedThink, TruncatedGeneration, OverLength, Contaminated, EvalPackCopy)
