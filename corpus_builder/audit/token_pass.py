"""Token measures of conversations in the target's tokens, as served: lengths, copy-spans, supervised ids.

Per assistant turn: the prompt it was generated from, the response (its supervised tokens: reasoning, answer
and the end-of-turn token, as ``tokens.rows`` masks them), the reasoning part, and the response tokens that
lie inside spans of at least ``span_tokens`` tokens found verbatim earlier in the context (the traffic where
prompt-lookup speculation wins), with the longest such span. Per conversation: its length as served (its
longest budget view). And the supervised ids, for the token frequencies and the draft vocabulary.

How it stays near the tokenizer's own speed. ``tokens.TokenRows`` tokenizes every turn's prompt and view on
their own (a k-turn conversation costs about k + 1 encodings of it); here each budget view is rendered once
and cut into pieces that are encoded in one batch (with the tokenizer's exact tiktoken twin where it has one,
like the budget counts). Every cut is right after an added token (``<|im_end|>``, ``<think>``...), which the
tokenizer splits out before anything else, so the pieces' ids are the whole render's ids. The few characters
of a generation prompt after its last added token (ChatML's ``\n``) are encoded once more on their own: the
response starts where their ids stop agreeing with the piece's, ``TokenRows``' common-prefix rule, so the
rows are the rows of ``TokenRows``. Generated turns are measured on their served ids, as ``TokenRows`` and
``corpus vocab`` do. Copy-spans are found for the whole batch at once with numpy: a rolling hash of every
``span_tokens``-gram, its first occurrence in its view, and a response n-gram counts when that first
occurrence ends before the response starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
import polars as pl

from ..errors import CorpusError
from ..records import THINK_CLOSE, THINK_OPEN, Conversation
from ..tokens import TemplateRenderer, TemplateWithoutTools, common_prefix, served_turns
from .options import DEFAULT_SPAN_TOKENS

_HASH_BASE = np.uint64(0x100000001B3)
_VIEW_SALT = np.uint64(0x9E3779B97F4A7C15)
GUARD_TEXTS = 256  # texts of the first batch also encoded with ``tokenizers``, id for id


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


@dataclass(slots=True)
class _View:
    pieces: list[int]  # indices of this view's pieces in the batch's texts, in order (a rendered view)
    ids: list[int] | None  # served ids (a generated turn), instead of pieces
    budget: bool  # one of the conversation's budget views


@dataclass(slots=True)
class _Turn:
    conversation: int
    view: int
    piece: int  # rendered: the view's piece from the prompt's last added token through the end-of-turn token
    tail: int  # rendered: the text index of that piece's prompt part; served: the prompt's length in tokens
    reasoned: bool  # the turn has reasoning (without, an empty think block is template, not reasoning)


class TokenMeter:
    def __init__(self, renderer: TemplateRenderer, span_tokens: int = DEFAULT_SPAN_TOKENS) -> None:
        if span_tokens < 1:
            raise ValueError("span_tokens must be at least 1")
        self.renderer = renderer
        self.span_tokens = span_tokens
        self.vocab_size: int = renderer.tokenizer.get_vocab_size(with_added_tokens=True)
        self.eos = renderer.eos_token
        self.close_id = renderer.token_id(THINK_CLOSE)
        self.open_id = renderer.token_id(THINK_OPEN)
        self.added = tuple(token.content for token in renderer.tokenizer.get_added_tokens_decoder().values())

    def measure(self, conversations: Sequence[Conversation]) -> Measured:
        texts: list[str] = []
        views: list[_View] = []
        view_of_conversation: list[int] = []  # first view index of each conversation
        turns: list[_Turn] = []
        unmeasured = 0
        for number, conversation in enumerate(conversations):
            view_of_conversation.append(len(views))
            planned = (len(texts), len(views), len(turns))
            try:
                unmeasured += self._plan(number, conversation, texts, views, turns)
            except TemplateWithoutTools:  # every row of its kind would go unmeasured: the user must know
                raise
            except CorpusError:  # the template refuses this conversation (raise_exception): not measured
                del texts[planned[0]:], views[planned[1]:], turns[planned[2]:]
                unmeasured += sum(message.role == "assistant" for message in conversation.messages)
        view_of_conversation.append(len(views))
        # The first texts are checked against ``tokenizers`` (once per renderer), as the budget counts are.
        ids = self.renderer.fast_encode(texts, guard_texts=GUARD_TEXTS)
        return self._assemble(len(conversations), ids, views, view_of_conversation, turns, unmeasured)

    def _plan(self, number: int, conversation: Conversation, texts: list[str], views: list[_View],
              turns: list[_Turn]) -> int:
        """Cut this conversation's views into pieces; returns the turns that cannot be measured."""
        renderer = self.renderer
        messages = conversation.messages
        served = served_turns(conversation)
        budget = renderer.budget_views(conversation)
        # Per view, its turns: (safe cut, prompt end, turn end, has reasoning).
        cuts: list[list[tuple[int, int, int, bool]]] = [[] for _ in budget]
        unmeasured = 0
        order = -1
        for j, message in enumerate(messages):
            if message.role != "assistant":
                continue
            order += 1
            if j in served:
                turn = served[j]
                turns.append(_Turn(number, len(views), -1, len(turn["prompt_token_ids"]), bool(message.reasoning)))
                views.append(_View([], [*turn["prompt_token_ids"], *turn["token_ids"]], False))
                continue
            view = 0 if len(budget) == 1 else order
            text = budget[view]
            # Where the generation prompt ends in its view, found as ``TokenRows`` finds it.
            prompt = renderer.extended_prompt(conversation, j, text)
            if prompt is None:
                unmeasured += 1
                continue
            start = len(prompt)
            # The turn ends at the last end-of-turn token of its own view (``TokenRows``' rule: a turn's content
            # may hold the token's text); in a whole-conversation view that view is a prefix of it.
            through = len(text) if len(budget) > 1 or j == len(messages) - 1 else \
                len(renderer.render_through(conversation, j))
            end = text.rfind(self.eos, start, through) if self.eos else -1
            cuts[view].append((self._safe_cut(text, start), start, end + len(self.eos) if end >= 0 else through,
                               bool(message.reasoning)))
        for view, text in enumerate(budget):
            pieces: list[int] = []
            done = 0
            for safe, start, end, reasoned in cuts[view]:
                pieces.append(len(texts))
                texts.append(text[done:safe])
                turns.append(_Turn(number, len(views), len(pieces), len(texts), reasoned))
                texts.append(text[safe:start])
                pieces.append(len(texts))
                texts.append(text[safe:end])
                done = end
            pieces.append(len(texts))
            texts.append(text[done:])
            views.append(_View(pieces, None, True))
        return unmeasured

    def _safe_cut(self, text: str, prompt_end: int) -> int:
        """The end of the last added token before ``prompt_end``: a cut there splits no token."""
        return max((at + len(token) for token in self.added
                    if (at := text.rfind(token, 0, prompt_end)) >= 0 and at + len(token) <= prompt_end), default=0)

    def _assemble(self, conversations: int, ids: list[list[int]], views: list[_View],
                  view_of_conversation: list[int], turns: list[_Turn], unmeasured: int) -> Measured:
        """One flat token array of every view of the batch, and each turn's response span in it."""
        lengths = [len(piece) for piece in ids]
        view_lengths = np.array([len(view.ids) if view.ids is not None else sum(lengths[p] for p in view.pieces)
                                 for view in views], dtype=np.int64)
        view_starts = np.zeros(len(views) + 1, dtype=np.int64)
        np.cumsum(view_lengths, out=view_starts[1:])
        tokens = np.fromiter(chain.from_iterable(view.ids if view.ids is not None else
                                                 chain.from_iterable(ids[p] for p in view.pieces) for view in views),
                             dtype=np.int64, count=int(view_starts[-1]))
        starts = np.empty(len(turns), dtype=np.int64)
        ends = np.empty(len(turns), dtype=np.int64)
        for index, turn in enumerate(turns):
            view = views[turn.view]
            base = int(view_starts[turn.view])
            if view.ids is not None:
                starts[index], ends[index] = base + turn.tail, int(view_starts[turn.view + 1])
                continue
            piece = view.pieces[turn.piece]
            before = base + sum(lengths[p] for p in view.pieces[:turn.piece])
            starts[index] = before + common_prefix(ids[turn.tail], ids[piece])
            ends[index] = before + lengths[piece]
        view_of_turn = np.array([turn.view for turn in turns], dtype=np.int64)
        reasoned = np.array([turn.reasoned for turn in turns], dtype=bool)
        # Turns are planned conversation by conversation and view by view, so their starts ascend.
        turn_of_position = _owners(len(tokens), starts, ends)
        copied, longest = self._copy_spans(tokens, view_starts, starts, turn_of_position)
        budget = np.array([view.budget for view in views], dtype=bool)
        conversation_tokens = np.zeros(conversations, dtype=np.int64)
        owner = np.repeat(np.arange(conversations), np.diff(view_of_conversation))
        np.maximum.at(conversation_tokens, owner[budget], view_lengths[budget])
        return Measured(np.array([turn.conversation for turn in turns], dtype=np.int64),
                        starts - view_starts[view_of_turn], ends - starts,
                        self._reasoning(tokens, view_starts, starts, ends, view_of_turn) * reasoned, copied, longest,
                        conversation_tokens, tokens[turn_of_position >= 0], unmeasured)

    def _reasoning(self, tokens: np.ndarray, view_starts: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                   view_of_turn: np.ndarray) -> np.ndarray:
        """Supervised tokens through the first ``</think>``; with none, all of them when the prompt left a think
        block open (truncated thinking), else none (``TokenRows``' rule)."""
        if self.close_id is None or not len(starts):
            return np.zeros(len(starts), dtype=np.int64)
        closes = np.flatnonzero(tokens == self.close_id)
        following = np.searchsorted(closes, starts)
        close_at = np.where(following < len(closes), closes[np.minimum(following, len(closes) - 1)], ends)
        closed = close_at < ends
        open_in_prompt = np.zeros(len(starts), dtype=bool)
        if self.open_id is not None:
            opens = np.flatnonzero(tokens == self.open_id)
            last_open = _last_before(opens, starts)
            last_close = _last_before(closes, starts)
            in_view = last_open >= view_starts[view_of_turn]
            open_in_prompt = in_view & (last_open > last_close)
        return np.where(closed, close_at - starts + 1, np.where(open_in_prompt, ends - starts, 0))

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


def _last_before(positions: np.ndarray, limits: np.ndarray) -> np.ndarray:
    """The last of the sorted ``positions`` below each limit, or -1."""
    index = np.searchsorted(positions, limits) - 1
    return np.where(index >= 0, positions[np.clip(index, 0, None)] if len(positions) else -1, -1)
