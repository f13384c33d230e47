"""Row validators: statistics are computed first, keep/drop decisions are taken from them by policy.

Keeping the two apart (as data-juicer does) lets the measuring run where the rows are read (the replay
workers) and lets a policy change (drop vs truncate, dedup mode) be a decision, not a new measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..errors import CONTAMINATED, Skipped, contamination_detail
from ..recipe.model import Checks
from ..records import FLAG_TRUNCATED, FLAG_UNCLOSED_THINK, Conversation, row_location
from ..tokens import TemplateRenderer, TokenFacts, TurnTokens
from .decontaminate import Contamination
from .dedup import Dedup
from .near_dedup import Signatures
from .normalise import ConversationText, conversation_text, normalised_chunks
from .pack import EVAL_PACK_COPY, PackScreen
from .screened import Screened

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


class Checker:
    """The screen, the per-batch stage of a build's plan (``assemble/plan.py``): it measures a batch of rows (their
    length in the target's tokens, the dedup signatures, the evaluation sets they match), then applies the checks
    that judge a row on its own: unclosed think blocks, the token budget, evaluation-set contamination, copies of
    the eval pack, in that order. Rows the eval pack holds out leave first, before any check. It holds no state of
    the stream: what needs every row's keys (ids, duplicates) is the keyed stages' (``screen.stream`` runs them
    after it, on a stream in priority order).

    ``dedup``: the index whose signatures the batch's rows get (None without dedup). ``facts``: the rows are
    measured whole where they are read (every turn, in one encode per view: the budget is one of the figures), so
    the writer adds their token facts instead of tokenizing them again."""

    def __init__(self, checks: Checks, renderer: TemplateRenderer | None, *, dedup: Dedup | None = None,
                 contamination: Contamination | None = None, pack: PackScreen | None = None, facts: bool = False,
                 keep_truncated: bool = False) -> None:
        self.checks = checks
        # target.generation.on_length for a served answer cut at max_tokens (a logged one): keep it, flagged, or
        # drop it (retry drops it too: a logged request cannot be asked again). Generated ones are judged as
        # they come back; those that reach here were kept.
        self.keep_truncated = keep_truncated
        self.renderer = renderer if checks.max_seq_len is not None else None
        self.turns = TurnTokens(renderer) if renderer is not None and facts else None
        self.dedup = dedup
        self.contamination = contamination
        self.pack = pack
        self._pack_shares_signatures = pack is not None and pack.shares_signatures(dedup)

    @property
    def in_tokens(self) -> bool:
        """Whether ``measure`` renders and encodes the rows in the target's tokens: most of a batch's cost."""
        return self.turns is not None or self.renderer is not None

    def measure(self, batch: list[Conversation]) -> BatchStats:
        stats = BatchStats([None] * len(batch), [False] * len(batch), *self._screen(batch))
        if self.pack is not None and not self._pack_shares_signatures:
            stats.pack_signatures = self.pack.signatures(batch)
        renderer, limit = self.renderer, self.checks.max_seq_len
        if renderer is None or limit is None:
            counted = list(range(len(batch)))
        else:
            # Memory and time stay flat whatever one row looks like: a row over the budget by its character
            # count alone is not rendered or tokenized.
            counted = []
            for index, conversation in enumerate(batch):
                floor = renderer.token_lower_bound(conversation)
                if floor > limit:
                    stats.tokens[index], stats.at_least[index] = floor, True
                else:
                    counted.append(index)
        if self.turns is not None:
            stats.token_facts = [None] * len(batch)
            for index, facts in zip(counted, self.turns.facts([batch[i] for i in counted]), strict=True):
                stats.tokens[index], stats.token_facts[index] = facts.tokens, facts
        elif renderer is not None:
            for index, tokens in zip(counted, renderer.count_tokens([batch[i] for i in counted]), strict=True):
                stats.tokens[index] = tokens
        return stats

    def _screen(self, batch: Sequence[Conversation]) -> tuple[Signatures | None, list[tuple[str, ...]] | None]:
        """The dedup signatures and the contamination of a batch. When dedup compares the text contamination
        is checked on (not the prompt screen's: dedup on prompts), each chunk is normalised once for both."""
        dedup, contamination = self.dedup, self.contamination
        if dedup is None or contamination is None or dedup.turns != CONTAMINATION_TEXT or not batch:
            return dedup.signatures(batch) if dedup is not None else None, self._contamination(batch)
        signatures: list[Signatures] = []
        matches: list[tuple[str, ...]] = []
        for chunk in normalised_chunks([conversation_text(row, CONTAMINATION_TEXT) for row in batch]):
            signatures.append(dedup.chunk_signatures(chunk))
            matches.extend(contamination.chunk_matches(chunk))
        return Signatures.concat(signatures), matches

    def _contamination(self, batch: Sequence[Conversation]) -> list[tuple[str, ...]] | None:
        if self.contamination is None:
            return None
        return self.contamination.matches([conversation_text(row, CONTAMINATION_TEXT) for row in batch])

    def screened(self, items: Sequence[Conversation | Skipped], stats: BatchStats) -> Screened:
        """A batch of consecutive records (``stats``: its rows' measurement) screened: the rows kept (perhaps
        truncated) and the skip records in their place, the rows the eval pack holds out left out; the kept rows'
        signatures and, where measured whole and not truncated, their token facts."""
        rows = [item for item in items if isinstance(item, Conversation)]
        outcomes, signatures = self.screen(rows, stats)
        records: list[Conversation | Skipped] = []
        kept: list[int] = []
        decided = iter(outcomes)
        row = 0
        for item in items:
            if isinstance(item, Skipped):
                records.append(item)
                continue
            outcome = next(decided)
            if outcome is not None:  # None: held out by the eval pack
                records.append(outcome)
                if isinstance(outcome, Conversation):
                    kept.append(row)
            row += 1
        facts = None
        if stats.token_facts is not None:
            measured = stats.token_facts
            facts = [measured[i] if outcomes[i] is rows[i] else None for i in kept]
        return Screened(records, signatures.rows(kept) if signatures is not None else None, facts)

    def screen(self, batch: list[Conversation], stats: BatchStats
               ) -> tuple[list[Conversation | Skipped | None], Signatures | None]:
        """The checks that judge each row on its own (the row checks, the evaluation sets, the eval pack), no
        state of the stream: per row kept (perhaps truncated), skipped, or None when the eval pack holds it out;
        and every row's dedup signatures (a truncated row's of its new text), None without dedup."""
        holds = self.pack.holds if self.pack is not None else None
        outcomes: list[Conversation | Skipped | None] = [None if holds is not None and holds(row)
                                                         else self._row_checks(row, stats, i)
                                                         for i, row in enumerate(batch)]
        # rows truncated to the budget are other texts now: measured again
        changed = {i: row for i, row in enumerate(outcomes) if isinstance(row, Conversation) and row is not batch[i]}
        if stats.contamination is not None:
            contamination = list(stats.contamination)
            for i, sets in zip(changed, self._contamination(list(changed.values())) or [], strict=True):
                contamination[i] = sets
            for i, sets in enumerate(contamination):
                if sets and isinstance(outcomes[i], Conversation):
                    outcomes[i] = Skipped(batch[i].source, CONTAMINATED, row_location(batch[i]),
                                          contamination_detail(sets), id=batch[i].id)
        if self.pack is not None:
            self._drop_pack_copies(batch, outcomes, stats, changed)
        signatures = stats.signatures
        if self.dedup is not None and signatures is not None and changed:
            signatures = signatures.replaced(list(changed), self.dedup.signatures(list(changed.values())))
        return outcomes, signatures

    def _drop_pack_copies(self, batch: list[Conversation], outcomes: list[Conversation | Skipped | None],
                          stats: BatchStats, changed: dict[int, Conversation]) -> None:
        assert self.pack is not None
        signatures = stats.signatures if self._pack_shares_signatures else stats.pack_signatures
        assert signatures is not None  # measure computes them whenever there is a pack
        if changed:
            signatures = signatures.replaced(list(changed), self.pack.signatures(list(changed.values())))
        candidates = [i for i, row in enumerate(outcomes) if isinstance(row, Conversation)]
        for i, copied in zip(candidates, self.pack.copies(signatures.rows(candidates)), strict=True):
            if copied is not None:
                outcomes[i] = Skipped(batch[i].source, EVAL_PACK_COPY, row_location(batch[i]), copied, id=batch[i].id)

    def _row_checks(self, conversation: Conversation, stats: BatchStats, index: int) -> Conversation | Skipped:
        """The checks of one row alone: an unclosed think block, an answer served cut at max_tokens, the token budget
        (dropped or truncated)."""
        if FLAG_UNCLOSED_THINK in conversation.flags and self.checks.on_unclosed_think == "drop":
            return Skipped(conversation.source, "unclosed_think", row_location(conversation), id=conversation.id)
        if FLAG_TRUNCATED in conversation.flags and not self.keep_truncated and conversation.origin == "replay":
            return Skipped(conversation.source, "truncated_generation", row_location(conversation),
                           "an answer was served cut at max_tokens (finish_reason: length)", id=conversation.id)
        limit, tokens = self.checks.max_seq_len, stats.tokens[index]
        if limit is not None and tokens is not None and tokens > limit:
            shortened = self._truncate(conversation, limit) if self.checks.on_over_length == "truncate" else None
            if shortened is None:
                return Skipped(conversation.source, "over_length", row_location(conversation),
                               f"{'at least ' if stats.at_least[index] else ''}{tokens} tokens > {limit}",
                               id=conversation.id)
            return shortened
        return conversation

    def _truncate(self, conversation: Conversation, limit: int) -> Conversation | None:
        """Drop trailing exchanges (a user turn and all that answers it: tool calls, their results, the answer)
        until the conversation fits; None when even the first exchange is too long."""
        assert self.renderer is not None
        messages = conversation.messages
        for cut in range(len(messages) - 1, 0, -1):
            if messages[cut].role != "user" or messages[cut - 1].role != "assistant":
                continue
            candidate = replace(conversation, messages=list(messages[:cut]),
                                flags=[*conversation.flags, FLAG_TRUNCATED_TO_BUDGET])
            if (self.renderer.token_lower_bound(candidate) <= limit
                    and self.renderer.count_tokens([candidate])[0] <= limit):
                return candidate
        return None
