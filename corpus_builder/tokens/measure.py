"""Every assistant turn of a batch of conversations in the target's tokens, each view rendered and encoded once.

What a turn is in tokens is ``tokens.rows``' definition: a replayed turn ``j`` is the render of turns ``[:j+1]``
(its served view) through its end-of-turn token, supervised from where the render of its generation prompt
stops agreeing with it (the common prefix); a generated turn is its served ids. This module measures that for
the rows, the build's token statistics and the audit's meter alike (one implementation).

How a batch costs about one tokenization of its conversations. Each conversation's budget views are rendered
once (with history reasoning kept: the whole conversation; dropped: every assistant turn's view). A turn whose
served view is a prefix of a budget view is cut out of it instead of being encoded again: the view is cut right
after an added token (``<|im_end|>``, ``<think>``...) before the turn's prompt ends and right after its
end-of-turn token, and the pieces are encoded in one batch. ``tokenizers`` splits added tokens out before
anything else, so where no normalizer or prefix space can see across the cut, the pieces' ids are the whole
view's ids (``twin.cut_problem`` says when that is not sure: then each turn's view is encoded whole, on its
own). The few characters of a generation prompt after its last added token (ChatML's ``\\n``) are encoded once
more on their own: the supervised ids start where their ids stop agreeing with the piece's, the common-prefix
rule. A turn whose served view is not a prefix of the conversation's render (a template that renders earlier
turns differently once a later user turn follows) is encoded as a view of its own. Rendering a chunk of the
batch overlaps the encoding of the previous chunk (``TemplateRenderer.encode_overlapped``).

Generated turns are measured on their served ids. Their check (``check_served``): the prompt rendered in the mode
the row was served in, and the turn's own text after it, each tokenized alone as the server did, must give the
served ids; those texts are encoded with ``tokenizers`` (``TemplateRenderer.encode``), never the twin.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain

import numpy as np
import pyarrow as pa

from ..errors import CorpusError
from ..records import THINK_CLOSE, THINK_OPEN, Conversation
from .template import TemplateRenderer, TemplateWithoutTools

MISMATCH_WINDOW = 6  # tokens shown on each side of a mismatch
PLAN_CHUNK = 256  # conversations rendered while the previous chunk is being encoded
GUARD_TEXTS = 256  # texts of the first batch the twin encodes also encoded with ``tokenizers``, id for id

Encode = Callable[[Sequence[str]], list[list[int]]]


@dataclass(frozen=True, slots=True)
class TokenMismatch:
    """First position where a generated turn's re-render differs from its served ids."""

    id: str
    message_index: int
    position: int  # index into prompt_token_ids + token_ids
    part: str  # prompt | completion
    served: list[int]
    rendered: list[int]
    served_text: str
    rendered_text: str

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "message_index": self.message_index, "position": self.position, "part": self.part,
                "served": self.served, "rendered": self.rendered, "served_text": self.served_text,
                "rendered_text": self.rendered_text}


@dataclass(frozen=True, slots=True)
class TokenFacts:
    """What the token statistics add up of one conversation: its length as served (its longest budget view),
    its supervised and reasoning tokens, and its served-ids check. A few numbers: they travel with the row
    from where it is measured to the writer."""

    tokens: int
    supervised: int
    reasoning: int
    checked_turns: int
    mismatches: tuple[TokenMismatch, ...] = ()

    def named(self, conversation_id: str) -> TokenFacts:
        """These facts with their mismatches under ``conversation_id`` (the id the row is written under)."""
        if all(m.id == conversation_id for m in self.mismatches):
            return self
        return replace(self, mismatches=tuple(replace(m, id=conversation_id) for m in self.mismatches))


# A row's facts as a typed Arrow column (null: not measured), for the rows that travel between a build's tasks.
MISMATCH_TYPE = pa.struct([("id", pa.string()), ("message_index", pa.int64()), ("position", pa.int64()),
                           ("part", pa.string()), ("served", pa.list_(pa.int64())),
                           ("rendered", pa.list_(pa.int64())), ("served_text", pa.string()),
                           ("rendered_text", pa.string())])
FACTS_TYPE = pa.struct([("tokens", pa.int64()), ("supervised", pa.int64()), ("reasoning", pa.int64()),
                        ("checked_turns", pa.int64()), ("mismatches", pa.list_(MISMATCH_TYPE))])


def facts_to_arrow(facts: Sequence[TokenFacts | None]) -> pa.Array:
    """Rows' facts as a ``FACTS_TYPE`` column."""
    return pa.array([None if found is None else
                     {"tokens": found.tokens, "supervised": found.supervised, "reasoning": found.reasoning,
                      "checked_turns": found.checked_turns, "mismatches": [m.to_dict() for m in found.mismatches]}
                     for found in facts], FACTS_TYPE)


def facts_from_arrow(column: pa.Array | pa.ChunkedArray) -> list[TokenFacts | None]:
    """The facts of a ``FACTS_TYPE`` column."""
    return [None if found is None else
            TokenFacts(found["tokens"], found["supervised"], found["reasoning"], found["checked_turns"],
                       tuple(TokenMismatch(**mismatch) for mismatch in found["mismatches"]))
            for found in column.to_pylist()]


@dataclass(frozen=True, slots=True)
class ServedTurn:
    """A generated turn's ids as the server read and wrote them, and why it stopped."""

    prompt_token_ids: list[int]
    token_ids: list[int]
    finish_reason: str | None


def served_turns(conversation: Conversation) -> dict[int, ServedTurn]:
    """Generated turns with their served ids, by message index."""
    generation = conversation.provenance.generation
    return {turn.message_index: ServedTurn(turn.prompt_token_ids, turn.token_ids, turn.finish_reason)
            for turn in (generation.turns if generation is not None else ())
            if turn.prompt_token_ids is not None and turn.token_ids is not None}


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many first ids ``a`` and ``b`` share (where a turn's supervised ids start after its prompt's)."""
    if b[:len(a)] == a:  # the usual case, compared at C speed
        return len(a)
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _first_difference(served: list[int], rendered: list[int]) -> int | None:
    if rendered[:len(served)] == served:
        return None
    for position, (a, b) in enumerate(zip(served, rendered, strict=False)):
        if a != b:
            return position
    return min(len(served), len(rendered))


@dataclass(slots=True)
class _View:
    conversation: int
    pieces: list[int] = field(default_factory=list)  # indices of a rendered view's pieces in the texts, in order
    ids: list[int] | None = None  # a generated turn's served ids, instead of pieces
    budget: bool = False  # one of the conversation's budget views


@dataclass(slots=True)
class _Turn:
    conversation: int
    message: int
    view: int
    piece: int  # rendered: which of the view's pieces runs from the safe cut through the end of turn; served: -1
    tail: int  # rendered: the text index of that piece's prompt part; served: the prompt's length in tokens
    reasoned: bool  # the turn has reasoning (without, an empty think block is template, not reasoning)
    check: int = -1  # a checked generated turn: the index of its prompt's ids among the checks' (its text's next)


@dataclass(slots=True)
class _Cut:
    """Where a rendered turn lies in the text of the view that holds it."""

    safe: int  # the end of the last added token before the prompt ends: a cut there splits no token
    prompt_end: int
    end: int  # after the turn's end-of-turn token
    message: int
    reasoned: bool


@dataclass
class _Plan:
    """A batch cut into texts to encode: views, turns, the served-ids checks' texts."""

    texts: list[str] = field(default_factory=list)
    views: list[_View] = field(default_factory=list)
    turns: list[_Turn] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    unmeasured: int = 0


@dataclass
class Measurement:
    """A measured batch: every view's ids one after the other (``tokens``, view ``v`` at
    ``view_starts[v]:view_starts[v + 1]``) and each turn's supervised span in them; turns in ascending order of
    position (conversation by conversation, view by view). ``conversation_tokens`` is 0 for a conversation none
    of whose views could be measured."""

    tokens: np.ndarray
    view_starts: np.ndarray
    view_conversation: np.ndarray
    turn_conversation: np.ndarray
    turn_message: np.ndarray
    turn_view: np.ndarray
    turn_start: np.ndarray  # absolute: index into ``tokens``
    turn_end: np.ndarray
    turn_reasoning: np.ndarray
    turn_served: np.ndarray
    conversation_tokens: np.ndarray
    checked_turns: np.ndarray  # per conversation
    mismatches: list[list[TokenMismatch]]  # per conversation
    unmeasured_turns: int  # turns the template refuses, or whose render extends their prompt in neither mode

    def facts(self) -> list[TokenFacts]:
        """Per conversation, what the token statistics add up."""
        count = len(self.conversation_tokens)
        supervised = np.bincount(self.turn_conversation, weights=self.turn_end - self.turn_start, minlength=count)
        reasoning = np.bincount(self.turn_conversation, weights=self.turn_reasoning, minlength=count)
        return [TokenFacts(tokens, round(sup), round(reason), checked, tuple(mismatches))
                for tokens, sup, reason, checked, mismatches in zip(
                    self.conversation_tokens.tolist(), supervised.tolist(), reasoning.tolist(),
                    self.checked_turns.tolist(), self.mismatches, strict=True)]


class TurnTokens:
    """Measures batches of conversations in the target's tokens (see the module's docstring)."""

    def __init__(self, renderer: TemplateRenderer) -> None:
        self.renderer = renderer
        eos = renderer.eos_token
        # The end-of-turn token, when the tokenizer holds it as one token (else a turn runs to its view's end).
        self.eos = eos if renderer.token_id(eos) is not None else ""
        self.close_id = renderer.token_id(THINK_CLOSE)
        self.open_id = renderer.token_id(THINK_OPEN)
        self.cuttable = renderer.cut_problem is None
        self.added = tuple(token.content for token in renderer.tokenizer.get_added_tokens_decoder().values())

    def facts(self, conversations: Sequence[Conversation]) -> list[TokenFacts]:
        """What the token statistics add up of each conversation (counted as ``measure`` counts by default)."""
        return self.measure(conversations).facts()

    def measure(self, conversations: Sequence[Conversation], encode: Encode | None = None, *,
                check_served: bool = True, strict: bool = True) -> Measurement:
        """Every conversation's views and turns, encoded with ``encode`` (default: counting, by the tokenizer's
        exact tiktoken twin where it has one, ``TemplateRenderer.fast_encode``; the rows pass ``tokenizers``).
        ``strict``: a conversation the template refuses, or a turn whose render extends its prompt in neither
        thinking mode, is an error (else it is left out and counted in ``unmeasured_turns``; a template without
        tool support is an error either way). ``check_served``: compare generated turns with their served ids."""
        plan = _Plan()
        chunks = self._planned(conversations, plan, check_served=check_served, strict=strict)
        encoding = encode or self._count_encode

        def arrays(texts: Sequence[str]) -> list[np.ndarray]:  # a batch's ids as lists would take 36 bytes an id
            return [np.array(ids, dtype=np.int64) for ids in encoding(texts)]

        pieces = self.renderer.encode_overlapped(chunks, arrays)
        checks = self.renderer.encode(plan.checks) if plan.checks else []
        return self._assemble(conversations, plan, pieces, checks)

    def _count_encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.renderer.fast_encode(texts, guard_texts=GUARD_TEXTS)

    def _planned(self, conversations: Sequence[Conversation], plan: _Plan, *, check_served: bool,
                 strict: bool) -> Iterator[list[str]]:
        """Plans the conversations a chunk at a time, yielding each chunk's new texts (so they are encoded while
        the next chunk renders)."""
        for first in range(0, len(conversations), PLAN_CHUNK):
            done = len(plan.texts)
            for number in range(first, min(first + PLAN_CHUNK, len(conversations))):
                conversation = conversations[number]
                marks = (len(plan.texts), len(plan.views), len(plan.turns), len(plan.checks))
                try:
                    self._plan(number, conversation, plan, check_served=check_served, strict=strict)
                except TemplateWithoutTools:  # every row of its kind would go unmeasured: the user must know
                    raise
                except CorpusError:  # the template refuses this conversation (raise_exception)
                    if strict:
                        raise
                    del plan.texts[marks[0]:], plan.views[marks[1]:], plan.turns[marks[2]:], plan.checks[marks[3]:]
                    plan.unmeasured += sum(message.role == "assistant" for message in conversation.messages)
            yield plan.texts[done:]

    def _plan(self, number: int, conversation: Conversation, plan: _Plan, *, check_served: bool,
              strict: bool) -> None:
        renderer = self.renderer
        messages = conversation.messages
        served = served_turns(conversation)
        # A generated row was served in its own thinking mode (a recipe can mix both).
        generation = conversation.provenance.generation
        mode = generation.enable_thinking if served and generation is not None else None
        budget = renderer.budget_views(conversation)
        whole = renderer.history_reasoning == "keep"  # one budget view, the whole conversation, hosts every turn
        hosted: list[list[_Cut]] = [[] for _ in budget]
        own: list[tuple[str, _Cut]] = []  # turns encoded in a view of their own
        order = -1
        for j, message in enumerate(messages):
            if message.role != "assistant":
                continue
            order += 1
            host = 0 if whole else order
            host_text = budget[host]
            if j in served:
                turn = served[j]
                check = -1
                if check_served:
                    check = len(plan.checks)
                    through = self._view(conversation, j, host_text)
                    served_prompt = renderer.render_prompt(conversation, j, enable_thinking=mode)
                    plan.checks += [served_prompt, self._turn_text(through[len(served_prompt):])
                                    if through.startswith(served_prompt) else ""]
                plan.turns.append(_Turn(number, j, len(plan.views), -1, len(turn.prompt_token_ids),
                                        bool(message.reasoning), check))
                plan.views.append(_View(number, ids=[*turn.prompt_token_ids, *turn.token_ids]))
                continue
            through = self._view(conversation, j, host_text)
            prompt = renderer.extended_prompt(conversation, j, through)
            if prompt is None:
                if strict:
                    raise CorpusError(f"conversation {conversation.id}: the template's render of assistant turn {j} "
                                      "does not extend its generation prompt in either thinking mode; no loss mask "
                                      "can be derived")
                plan.unmeasured += 1
                continue
            eos_at = through.rfind(self.eos, len(prompt)) if self.eos else -1
            end = eos_at + len(self.eos) if eos_at >= 0 else len(through)
            reasoned = bool(message.reasoning)
            # Cut out of the budget view only where the cuts split no token: the turn's view is the whole of it, or
            # a prefix of it whose turn ends on its end-of-turn token.
            if through is host_text or through == host_text or (
                    self.cuttable and eos_at >= 0 and host_text.startswith(through)):
                hosted[host].append(self._cut(host_text, len(prompt), end, j, reasoned))
            else:
                own.append((through, self._cut(through, len(prompt), end, j, reasoned)))
        for text, cuts in zip(budget, hosted, strict=True):
            own += self._add_view(plan, number, text, cuts, budget=True)
        for text, cut in own:
            self._add_view(plan, number, text, [cut], budget=False)

    def _view(self, conversation: Conversation, turn: int, budget_view: str) -> str:
        """The served view of assistant turn ``turn``, rendered only when it is not its budget view (with history
        reasoning dropped every turn's view is one; kept, the whole conversation is the last turn's)."""
        if self.renderer.history_reasoning != "keep" or turn == len(conversation.messages) - 1:
            return budget_view
        return self.renderer.render_through(conversation, turn)

    def _cut(self, text: str, prompt_end: int, end: int, message: int, reasoned: bool) -> _Cut:
        safe = 0
        if self.cuttable:
            safe = max((at + len(token) for token in self.added
                        if (at := text.rfind(token, 0, prompt_end)) >= 0 and at + len(token) <= prompt_end), default=0)
        return _Cut(safe, prompt_end, end, message, reasoned)

    def _add_view(self, plan: _Plan, number: int, text: str, cuts: list[_Cut], *, budget: bool
                  ) -> list[tuple[str, _Cut]]:
        """Cut ``text`` into pieces at its turns; returns the turns it cannot hold (their cuts overlap an
        earlier turn's), for views of their own."""
        view = _View(number, budget=budget)
        texts = plan.texts
        left_out: list[tuple[str, _Cut]] = []
        done = 0
        for cut in cuts:
            if cut.safe < done:  # the turn's view is text[:cut.end] and more: that part is all its row needs
                left_out.append((text[:cut.end], cut))
                continue
            view.pieces.append(len(texts))
            texts.append(text[done:cut.safe])
            plan.turns.append(_Turn(number, cut.message, len(plan.views), len(view.pieces), len(texts), cut.reasoned))
            texts.append(text[cut.safe:cut.prompt_end])
            view.pieces.append(len(texts))
            texts.append(text[cut.safe:cut.end])
            done = cut.end
        view.pieces.append(len(texts))
        texts.append(text[done:])
        plan.views.append(view)
        return left_out

    def _turn_text(self, text: str) -> str:
        """A turn's rendered text through its end-of-turn token (what the model generates, not the template's
        separator after it)."""
        eos = self.renderer.eos_token
        end = text.rfind(eos) if eos else -1
        return text[:end + len(eos)] if end >= 0 else text

    def _assemble(self, conversations: Sequence[Conversation], plan: _Plan, ids: list[np.ndarray],
                  checks: list[list[int]]) -> Measurement:
        """One flat token array of every view of the batch, and each turn's supervised span in it."""
        views, turns = plan.views, plan.turns
        lengths = [len(piece) for piece in ids]
        view_lengths = np.array([len(view.ids) if view.ids is not None else sum(lengths[p] for p in view.pieces)
                                 for view in views], dtype=np.int64)
        view_starts = np.zeros(len(views) + 1, dtype=np.int64)
        np.cumsum(view_lengths, out=view_starts[1:])
        tokens = np.concatenate([np.zeros(0, dtype=np.int64), *chain.from_iterable(
            [np.array(view.ids, dtype=np.int64)] if view.ids is not None else [ids[p] for p in view.pieces]
            for view in views)])
        starts = np.empty(len(turns), dtype=np.int64)
        ends = np.empty(len(turns), dtype=np.int64)
        checked = np.zeros(len(conversations), dtype=np.int64)
        mismatches: list[list[TokenMismatch]] = [[] for _ in conversations]
        for index, turn in enumerate(turns):
            view = views[turn.view]
            base = int(view_starts[turn.view])
            if view.ids is not None:
                starts[index], ends[index] = base + turn.tail, int(view_starts[turn.view + 1])
                if turn.check >= 0:
                    checked[turn.conversation] += 1
                    mismatch = self._check(conversations[turn.conversation].id, turn.message,
                                           served_turns(conversations[turn.conversation])[turn.message],
                                           checks[turn.check], checks[turn.check + 1])
                    if mismatch is not None:
                        mismatches[turn.conversation].append(mismatch)
                continue
            piece = view.pieces[turn.piece]
            before = base + sum(lengths[p] for p in view.pieces[:turn.piece])
            tail = ids[turn.tail]
            starts[index] = before + common_prefix(tail.tolist(), ids[piece][:len(tail)].tolist())
            ends[index] = before + lengths[piece]
        view_conversation = np.array([view.conversation for view in views], dtype=np.int64)
        view_of_turn = np.array([turn.view for turn in turns], dtype=np.int64)
        reasoned = np.array([turn.reasoned for turn in turns], dtype=bool)
        budget = np.array([view.budget for view in views], dtype=bool)
        conversation_tokens = np.zeros(len(conversations), dtype=np.int64)
        np.maximum.at(conversation_tokens, view_conversation[budget], view_lengths[budget])
        return Measurement(
            tokens, view_starts, view_conversation, np.array([turn.conversation for turn in turns], dtype=np.int64),
            np.array([turn.message for turn in turns], dtype=np.int64), view_of_turn, starts, ends,
            self._reasoning(tokens, view_starts, starts, ends, view_of_turn) * reasoned,
            np.array([turn.piece < 0 for turn in turns], dtype=bool), conversation_tokens, checked, mismatches,
            plan.unmeasured)

    def _reasoning(self, tokens: np.ndarray, view_starts: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                   view_of_turn: np.ndarray) -> np.ndarray:
        """Supervised tokens through the first ``</think>``; with none, all of them when the prompt left a think
        block open (truncated thinking), else none (``tokens.rows``' rule)."""
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
        result: np.ndarray = np.where(closed, close_at - starts + 1, np.where(open_in_prompt, ends - starts, 0))
        return result

    def _check(self, conversation_id: str, turn: int, served: ServedTurn, prompt: list[int],
               completion: list[int]) -> TokenMismatch | None:
        served_prompt, served_completion = served.prompt_token_ids, served.token_ids
        position = _first_difference(served_prompt, prompt) if prompt != served_prompt else None
        if position is None and len(prompt) != len(served_prompt):
            position = min(len(prompt), len(served_prompt))
        if position is None:
            offset = _first_difference(served_completion, completion)
            if offset is None or (served.finish_reason == "length"
                                  and offset >= self._settled(served_completion)):
                return None
            position = len(served_prompt) + offset
        return self._mismatch(conversation_id, turn, position, len(served_prompt), served_prompt + served_completion,
                              prompt + completion)

    def _settled(self, ids: list[int]) -> int:
        """How many first ``ids`` of a turn cut at max_tokens come before the last piece of its text (a word, a
        number, a run of whitespace, as the pre-tokenizer cuts it). That piece's tokens depend on what follows it,
        and the render closes the turn right after it, where the model went on: ChatML's "\\n\\n" before
        ``<|im_end|>`` is one token, before more text two."""
        tokenizer = self.renderer.tokenizer
        text = tokenizer.decode(ids, skip_special_tokens=False)
        pieces = tokenizer.pre_tokenizer.pre_tokenize_str(text) if tokenizer.pre_tokenizer is not None else []
        if not pieces:
            return len(ids)
        start = pieces[-1][1][0]
        settled = len(ids)
        while settled and len(tokenizer.decode(ids[:settled], skip_special_tokens=False)) > start:
            settled -= 1
        return settled

    def _mismatch(self, conversation_id: str, turn: int, position: int, prompt_length: int,
                  served: list[int], rendered: list[int]) -> TokenMismatch:
        low = max(0, position - MISMATCH_WINDOW)
        served_window = served[low:position + MISMATCH_WINDOW]
        rendered_window = rendered[low:position + MISMATCH_WINDOW]
        decode = self.renderer.tokenizer.decode
        return TokenMismatch(conversation_id, turn, position, "prompt" if position < prompt_length else "completion",
                             served_window, rendered_window, decode(served_window, skip_special_tokens=False),
                             decode(rendered_window, skip_special_tokens=False))


def _last_before(positions: np.ndarray, limits: np.ndarray) -> np.ndarray:
    """The last of the sorted ``positions`` below each limit, or -1."""
    index = np.searchsorted(positions, limits) - 1
    result: np.ndarray = np.where(index >= 0, positions[np.clip(index, 0, None)] if len(positions) else -1, -1)
    return result
