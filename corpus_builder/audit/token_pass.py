"""Token measures of conversations in the target's tokens, as served: lengths, copy-spans, supervised ids.

Per assistant turn: the prompt it was generated from, the response (its supervised tokens: reasoning, answer
and the end-of-turn token, as ``tokens.rows`` masks them), the reasoning part, and the response tokens that
lie inside spans of at least ``span_tokens`` tokens found verbatim earlier in the context (the traffic where
prompt-lookup speculation wins), with the longest such span. Per conversation: its length as served (its
longest budget view). And the supervised ids, for the token frequencies and the draft vocabulary.

The turns are measured by ``tokens.TurnTokens``, the rows' own measurement: each view rendered once, cut after
added tokens and encoded in one batch (with the tokenizer's exact tiktoken twin where it has one, like the
budget counts), so the measures are those of ``TokenRows``' rows. Generated turns are measured on their served
ids, as ``TokenRows`` and ``corpus vocab`` do. A conversation the template refuses is left out, its turns
counted as unmeasured. Copy-spans are found for the whole batch at once with numpy: a rolling hash of every
``span_tokens``-gram, its first occurrence in its view, and a response n-gram counts when that first
occurrence ends before the response starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

from ..records import Conversation
from ..tokens import TemplateRenderer, TurnTokens
from .options import DEFAULT_SPAN_TOKENS

_HASH_BASE = np.uint64(0x100000001B3)
_VIEW_SALT = np.uint64(0x9E3779B97F4A7C15)


@dataclass
class Measured:
    """The measures of one batch: per assistant turn (``turn_*``), per conversation (``conversation_tokens``,
    0 for a conversation none of whose turns could be measured) and the supervised ids."""

    turn_conversation: np.ndarray  # index into the batch of each turn's conversation
    turn_prompt: np.ndarray
    turn_response: np.ndarray
    turn_reasoning: np.ndarray
    turn_copied: np.ndarray
    turn_longest_copy: np.ndarray
    conversation_tokens: np.ndarray
    supervised_ids: np.ndarray
    unmeasured_turns: int  # turns the template refuses, or whose render extends their prompt in neither mode


class TokenMeter:
    def __init__(self, renderer: TemplateRenderer, span_tokens: int = DEFAULT_SPAN_TOKENS) -> None:
        if span_tokens < 1:
            raise ValueError("span_tokens must be at least 1")
        self.renderer = renderer
        self.span_tokens = span_tokens
        self.vocab_size: int = renderer.tokenizer.get_vocab_size(with_added_tokens=True)
        self.turns = TurnTokens(renderer)

    def measure(self, conversations: Sequence[Conversation]) -> Measured:
        measured = self.turns.measure(conversations, check_served=False, strict=False)
        tokens, starts, ends = measured.tokens, measured.turn_start, measured.turn_end
        turn_of_position = _owners(len(tokens), starts, ends)
        copied, longest = self._copy_spans(tokens, measured.view_starts, starts, turn_of_position)
        return Measured(measured.turn_conversation, starts - measured.view_starts[measured.turn_view], ends - starts,
                        measured.turn_reasoning, copied, longest, measured.conversation_tokens,
                        tokens[turn_of_position >= 0], measured.unmeasured_turns)

    def _copy_spans(self, tokens: np.ndarray, view_starts: np.ndarray, starts: np.ndarray,
                    turn_of_position: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Response tokens inside copied spans, and the longest such span, per turn: a response n-gram is
        copied when its first occurrence in its view ends before the response starts."""
        size = self.span_tokens
        count = len(tokens) - size + 1
        turns = len(starts)
        if count <= 0 or not turns:
            return np.zeros(turns, dtype=np.int64), np.zeros(turns, dtype=np.int64)
        view_of_gram = np.repeat(np.arange(len(view_starts) - 1), np.diff(view_starts))[:count]
        with np.errstate(over="ignore"):
            grams = np.zeros(count, dtype=np.uint64)
            values = tokens.astype(np.uint64)
            for offset in range(size):
                grams = grams * _HASH_BASE + values[offset:offset + count]
            keys = grams ^ (view_of_gram.astype(np.uint64) * _VIEW_SALT)
        gram_start = np.arange(count)
        whole = gram_start + size <= view_starts[view_of_gram + 1]  # the gram lies inside one view
        # Where each gram first occurs in its view: a hash group-by (polars) beats numpy's sort by far here.
        first_seen = pl.DataFrame({"key": keys, "at": gram_start}).select(
            pl.col("at").min().over("key")).to_series().to_numpy()
        gram_turn = turn_of_position[:count]
        last_turn = turn_of_position[np.minimum(gram_start + size - 1, len(tokens) - 1)]
        safe_turn = np.clip(gram_turn, 0, None)
        matched = whole & (gram_turn >= 0) & (last_turn == gram_turn) & (first_seen + size <= starts[safe_turn])
        where = np.flatnonzero(matched)
        cover = np.bincount(where, minlength=len(tokens) + 1) - np.bincount(where + size, minlength=len(tokens) + 1)
        covered = np.cumsum(cover[:-1]) > 0
        copied = np.bincount(turn_of_position[covered], minlength=turns).astype(np.int64)
        longest = np.zeros(turns, dtype=np.int64)
        edges = np.diff(np.concatenate(([0], covered.astype(np.int8), [0])))
        run_starts, run_ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        if len(run_starts):
            np.maximum.at(longest, turn_of_position[run_starts], run_ends - run_starts)
        return copied, longest


def _owners(length: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each of ``length`` positions, the turn whose response holds it (ascending, disjoint spans), or -1."""
    turn = np.searchsorted(starts, np.arange(length), side="right") - 1
    safe = np.clip(turn, 0, None)
    inside = (turn >= 0) & (np.arange(length) < ends[safe]) if len(starts) else np.zeros(length, dtype=bool)
    return np.where(inside, turn, -1)

