"""Row validators: statistics are computed first, keep/drop decisions are taken from them by policy.

Keeping the two apart (as data-juicer does) lets the measuring run where the rows are read (the replay
workers) and lets a policy change (drop vs truncate, dedup mode) be a decision, not a new measurement.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import Skipped
from ..recipe.model import Checks
from ..records import Conversation
from ..tokens import TemplateRenderer, TurnTokens
from .decontaminate import Contamination
from .dedup import Dedup
from .near_dedup import Signatures
from .normalise import conversation_text, normalised_chunks
from .pack import PackScreen
from .row_checks import CONTAMINATION_TEXT, ROW_CHECKS, BatchStats, CheckSetup, Judging, RowCheck
from .screened import Screened


class Checker:
    """The screen, the per-batch stage of a build's plan (``assemble/plan.py``): it measures a batch of rows (their
    length in the target's tokens, the dedup signatures, the evaluation sets they match), then applies the row
    checks the recipe asks for, each one object registered in ``row_checks.ROW_CHECKS`` (unclosed think blocks,
    answers served cut at max_tokens, the token budget, evaluation-set contamination, copies of the eval pack, in
    that order). Rows the eval pack holds out leave first, before any check. It holds no state of
    the stream: what needs every row's keys (ids, duplicates) is the keyed stages' (``screen.stream`` runs them
    after it, on a stream in priority order).

    ``dedup``: the index whose signatures the batch's rows get (None without dedup). ``facts``: the rows are
    measured whole where they are read (every turn, in one encode per view: the budget is one of the figures), so
    the writer adds their token facts instead of tokenizing them again."""

    def __init__(self, checks: Checks, renderer: TemplateRenderer | None, *, dedup: Dedup | None = None,
                 contamination: Contamination | None = None, pack: PackScreen | None = None, facts: bool = False,
                 keep_truncated: bool = False) -> None:
        self.checks = checks
        self.renderer = renderer if checks.max_seq_len is not None else None
        self.turns = TurnTokens(renderer) if renderer is not None and facts else None
        self.dedup = dedup
        self.contamination = contamination
        self.pack = pack
        # keep_truncated: target.generation.on_length keeps a logged answer served cut at max_tokens, flagged
        setup = CheckSetup(checks, keep_truncated, self.renderer, contamination, pack, dedup)
        self._pack_shares_signatures = setup.pack_shares_signatures
        # the registered checks the recipe asks for, in their order
        self.row_checks: list[RowCheck] = [check for kind in ROW_CHECKS if (check := kind.of(setup)) is not None]

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
        """The checks that judge each row on its own (``row_checks.ROW_CHECKS``), no state of the stream: per row
        kept (perhaps truncated), skipped, or None when the eval pack holds it out; and every row's dedup
        signatures (a truncated row's of its new text), None without dedup."""
        holds = self.pack.holds if self.pack is not None else None
        judging = Judging(batch, stats, [None if holds is not None and holds(row) else row for row in batch])
        for check in self.row_checks:
            check.judge(judging)
        signatures, rewritten = stats.signatures, judging.rewritten
        if self.dedup is not None and signatures is not None and rewritten:
            signatures = signatures.replaced(list(rewritten), self.dedup.signatures(list(rewritten.values())))
        return judging.outcomes, signatures
