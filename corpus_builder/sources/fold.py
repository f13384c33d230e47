"""One conversation per conversation: the requests of a multi-turn chat, logged one by one, folded into the last.

A chat is logged once per request and every request repeats the whole history, so a 6-turn chat is 3 logged
rows: read as they are, they are 3 overlapping conversations that count its first turns three times. A row whose
turns (its request's messages and the answer) are a prefix of a later row's turns, of the same conversation (or
all of them: a line logged twice), is folded into that row: it is dropped (``folded_prefix``, in the ledger with
the row it was folded into) and the later row keeps what only the earlier one held: the reasoning of an answer,
which clients rarely send back in the history, and a cut answer's flag. The same conversation is the same session
where the log records one, else any row with the prefix.

The fold works on the logged exchanges as read (``logs.LoggedExchange``), or as scanned (``logs.ScannedExchange``:
the commonest shape, its turns and answer decoded natively into records, the line read whole only if the fold keeps
it), before they are normalised: a request folded into a later one is never normalised, so a chat costs one
normalisation however many requests logged it. A request's history is matched turn by turn on the turns' fields
and values (a ``logs.Turn`` record, hashed in C; a turn with other fields by its JSON text, keys sorted), in any key
order, a field left out not the same as one sent as null; the answer that ends it on role, text (stripped, an
answer's think block left out) and tool calls (name and arguments, as JSON whether an object or its text): the
reasoning and the call ids a client sends back are not trusted to be the served ones.

Memory is bounded by the number of open conversations (``max_open``), not by the file: past it the conversation
extended longest ago is let out as it stands (a later request of it is then its own conversation). Rows come out
when they close, so a log's conversations come out in the order their chats ended.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Generic, NamedTuple, TypeVar, cast

import msgspec
import orjson
from msgspec import UNSET

from ..errors import Skipped
from ..recipe.model import Fold
from ..records import FLAG_TRUNCATED, REASONING_KEYS, THINK_CLOSE, Message, split_think
from .logs import JsonObject, LoggedExchange, ScannedAnswer, ScannedExchange, Turn
from .mappings import NormalisedRow, RowNormaliser

FOLDED_PREFIX = "folded_prefix"

Tag = TypeVar("Tag")  # what the caller keeps with each request (where it was read)
ANSWER_ROLE = "assistant"
# A turn's role, read in C; a turn that is not an object raises TypeError, which ``_roles`` catches.
_ROLE = cast(Callable[[object], object], itemgetter("role"))
_REASONING_FIELDS = cast(Callable[[ScannedAnswer], tuple[object, ...]], attrgetter(*REASONING_KEYS))
Logged = LoggedExchange | ScannedExchange  # a logged request as the fold takes it: read, or scanned
Answer = JsonObject | ScannedAnswer | Turn  # an answer as read, as scanned, or sent back in a scanned history
TurnKey = Turn | bytes  # a history turn as the fold compares it: a record where it is one, else its JSON text


class Carried(NamedTuple):
    """What a folded request's answer leaves to its chat's conversation: where it stands among the chat's turns, the
    answer (its reasoning, and its text to check the turn it goes to, are read only when the chat is let out) and
    whether it was served cut."""

    position: int  # its answer's, among the turns of the requests after it
    answer: JsonObject | ScannedAnswer
    cut: bool

    @classmethod
    def of(cls, logged: Logged) -> Carried:
        turns = logged.turn_count if isinstance(logged, ScannedExchange) else len(logged.messages)
        return cls(turns, logged.answer, logged.finish_reason == "length")


@dataclass(slots=True)
class Held(Generic[Tag]):
    """A logged request, open or let out, with what the requests folded into it left (their exchanges are not
    kept: an open chat holds one request's row, or its line when it was scanned)."""

    logged: Logged
    tag: Tag
    head: int  # the key of the chat's first exchange (with its session)
    carried: tuple[Carried, ...] = ()  # a tuple: most requests carry nothing, and an empty one is no new object
    requests: int = 1

    @property
    def exchange(self) -> LoggedExchange:
        """The request read whole (a scanned line is read when first asked: the fold let it out)."""
        logged = self.logged
        if isinstance(logged, ScannedExchange):
            logged = self.logged = logged.exchange()
        return logged


def _turn_text(answer: Answer) -> str:
    """An answer's text as the fold compares it: stripped, its think block left out (null or absent: none; other
    content as its JSON text, which a client may send back instead)."""
    content = answer.get("content") if isinstance(answer, dict) else answer.content
    if type(content) is str:
        return content.rpartition(THINK_CLOSE)[2].strip()
    if content is None or content is UNSET:
        return ""
    return orjson.dumps(content, option=orjson.OPT_SORT_KEYS).decode()


def _arguments(arguments: object) -> object:
    """A call's arguments as the fold compares them: as JSON with its keys sorted, whether an object or its text (a
    client may write the text it sends back again, in its own spacing and key order); other text as it is."""
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return arguments
    return orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)


def _calls(turn: Answer) -> tuple[object, ...]:
    """An answer's calls as the fold compares them (name and arguments); a scanned answer has none."""
    if not isinstance(turn, dict) or ("tool_calls" not in turn and "function_call" not in turn):
        return ()
    calls = turn.get("tool_calls") or ([turn["function_call"]] if turn.get("function_call") else ())
    if not isinstance(calls, list | tuple):
        return (repr(calls),)
    found: list[object] = []
    for call in calls:
        function = call.get("function", call) if isinstance(call, dict) else call
        if isinstance(function, dict):
            found.append((function.get("name"), _arguments(function.get("arguments"))))
        else:
            found.append(repr(function))
    return tuple(found)


def _key(session: str | None, history: tuple[TurnKey, ...], answer: Answer) -> int:
    """The key of a conversation of ``session`` that ends with ``answer`` after ``history``: the history's turns as
    the client sent them (a client sends its history back as it sent it before) and the answer as the fold compares
    it, whether served (with reasoning, nulls) or sent back in a later request's history (without them): its text and
    calls. Equal within one process (Python's hashes: a request is only matched with those the same process read)."""
    return hash((session, history, _turn_text(answer), _calls(answer)))


def _turn_key(turn: object) -> TurnKey:
    """A read turn as the fold compares it: the record the scan makes of it where it is one (so a read request and a
    scanned one of the same chat match), else its JSON text with its keys sorted (its repr where JSON cannot hold it:
    a Hub row's bytes)."""
    try:
        return msgspec.convert(turn, Turn)
    except msgspec.ValidationError:
        try:
            return orjson.dumps(turn, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            return repr(turn).encode()



def _roles(messages: list[object]) -> list[object]:
    """Each turn's role (None for a turn that is not an object), read in C when every turn has one."""
    try:
        return list(map(_ROLE, messages))
    except (KeyError, TypeError):  # a turn without a role, or not an object
        return [turn.get("role") if type(turn) is dict else None for turn in messages]


def _turns(logged: Logged) -> tuple[str | None, tuple[TurnKey, ...], list[object], Sequence[Answer | object]]:
    """A request's session, its history's turns as the fold compares them, their roles, and the turns themselves."""
    if isinstance(logged, ScannedExchange):
        turns = logged.turns
        return None, tuple(turns), [turn.role for turn in turns], turns
    messages = logged.messages
    return logged.session, tuple(map(_turn_key, messages)), _roles(messages), messages


def exchange_keys(exchange: Logged) -> tuple[int, int, int | None]:
    """The exchange's own key, the key of its chat's first exchange, and the key of the request before it (its turns
    up to the last answer its history holds; None when it holds none); each with the exchange's session."""
    if type(exchange) is ScannedExchange:
        return _scanned_keys(exchange)
    session, history, roles, turns = _turns(exchange)
    full = _key(session, history, exchange.answer)
    if ANSWER_ROLE not in roles:
        return full, full, None
    first = roles.index(ANSWER_ROLE)
    head = _key(session, history[:first], _answer_at(turns, first))
    last = len(roles) - 1 - roles[::-1].index(ANSWER_ROLE)
    return full, head, head if last == first else _key(session, history[:last], _answer_at(turns, last))


def _scanned_keys(exchange: ScannedExchange) -> tuple[int, int, int | None]:
    """``exchange_keys`` of a scanned request, read off its records (no session, no calls; a turn's text as
    ``_turn_text`` reads it): the request's own work is the fold's hot path."""
    turns = exchange.turns
    history = tuple(turns)
    content = exchange.answer.content
    full = hash((None, history, content.rpartition(THINK_CLOSE)[2].strip() if type(content) is str else "", ()))
    last = len(turns) - 1
    while last >= 0 and turns[last].role != ANSWER_ROLE:
        last -= 1
    if last < 0:
        return full, full, None
    first = 0
    while turns[first].role != ANSWER_ROLE:
        first += 1
    content = turns[first].content
    head = hash((None, history[:first], content.rpartition(THINK_CLOSE)[2].strip() if type(content) is str else "",
                 ()))
    if last == first:
        return full, head, head
    content = turns[last].content
    return full, head, hash((None, history[:last],
                             content.rpartition(THINK_CLOSE)[2].strip() if type(content) is str else "", ()))


def _answer_at(turns: Sequence[Answer | object], index: int) -> Answer:
    turn = turns[index]
    assert isinstance(turn, dict | Turn)  # its role is the answer's: an object
    return turn


def earlier_keys(exchange: Logged) -> list[int]:
    """The keys of every request before it in its chat: its turns up to each answer its history holds."""
    session, history, roles, turns = _turns(exchange)
    return [_key(session, history[:index], _answer_at(turns, index)) for index, role in enumerate(roles)
            if role == ANSWER_ROLE]


class PrefixFold(Generic[Tag]):
    """Folds the logged requests of one source, fed in log order; ``add`` and ``close`` give what is finished:
    ``(held, True)`` for a request folded into the one just added, ``(held, False)`` for one let out whole.

    A request is matched with the request just before it in its chat (its turns up to the last answer of its
    history); only when that one is not open but a chat that began as it did is, with every earlier request of
    its chat (a request in between missing from the log)."""

    def __init__(self, max_open: int = Fold().max_open) -> None:
        if max_open < 1:
            raise ValueError("max_open must be at least 1")
        self.max_open = max_open
        self._open: OrderedDict[int, Held[Tag]] = OrderedDict()  # by their key, which holds their session
        self._heads: dict[int, int] = {}  # how many open chats began with each first exchange

    def add(self, exchange: Logged, tag: Tag) -> list[tuple[Held[Tag], bool]]:
        scanned = exchange if type(exchange) is ScannedExchange else None
        full, head, previous = _scanned_keys(scanned) if scanned is not None else exchange_keys(exchange)
        held: Held[Tag] = Held(exchange, tag, head)
        finished: list[tuple[Held[Tag], bool]] = []  # a list, not a generator: most requests finish one or none
        opened, heads = self._open, self._heads
        continued = False  # the request before it was open: its chat goes on, its first exchange counted once still
        if previous is not None:
            earlier = opened.pop(previous, None)
            if earlier is not None:
                self._fold(earlier, held, finished)
                continued = earlier.head == head
                if not continued:
                    self._forget_head(earlier)
            elif head in heads:  # a chat that began alike is open: a request between may be missing
                for candidate in earlier_keys(exchange):
                    earlier = self._pop(candidate)
                    if earlier is not None:
                        self._fold(earlier, held, finished)
        same = opened.pop(full, None)  # the same request logged again (a line written twice): one of its chat
        if same is not None:
            self._forget_head(same)
            held.carried += same.carried  # its answer is this one's: only what was folded into it is carried
            held.requests += same.requests
            finished.append((same, True))
        if scanned is not None:
            scanned.turns = []  # keyed: freed now, while they are warm, not when the chat is let out
        opened[full] = held
        if not continued:
            heads[head] = heads.get(head, 0) + 1
        if len(opened) > self.max_open:
            finished.append((self._close_oldest(), False))
        return finished

    def close(self) -> Iterator[Held[Tag]]:
        """The conversations still open, in the order they were last extended."""
        while self._open:
            yield self._close_oldest()

    def _close_oldest(self) -> Held[Tag]:
        held = self._open.popitem(last=False)[1]
        self._forget_head(held)
        return held

    @staticmethod
    def _fold(earlier: Held[Tag], into: Held[Tag], finished: list[tuple[Held[Tag], bool]]) -> None:
        into.carried += (*earlier.carried, Carried.of(earlier.logged))
        into.requests += earlier.requests
        finished.append((earlier, True))

    def _pop(self, key: int) -> Held[Tag] | None:
        held = self._open.pop(key, None)
        if held is not None:
            self._forget_head(held)
        return held

    def _forget_head(self, held: Held[Tag]) -> None:
        left = self._heads[held.head] - 1
        if left:
            self._heads[held.head] = left
        else:
            del self._heads[held.head]


def folded_skip(source: str, earlier: str, into: str) -> Skipped:
    """The ledger's entry of a request folded into a later one (by their locations)."""
    return Skipped(source, FOLDED_PREFIX, earlier, f"folded into {into}")


def let_out(normaliser: RowNormaliser, held: Held[Tag]) -> list[NormalisedRow]:
    """A chat's conversation(s) as the readers make them of the request the fold let out (a repair may split it),
    with what the requests folded into it left (``carry``); BadRow when the readers refuse that request. The build's
    stream (``source``) and the audit's counters (``batches``) both let their chats out here."""
    rows = normaliser.logged(held.exchange)
    for row in rows:
        carry(row.messages, row.flags, held)
    return rows


def carry(messages: list[Message], flags: list[str], held: Held[Tag]) -> None:
    """What the turns of a folded chat take from the requests folded into it: each earlier answer's reasoning (the
    history a client sends back seldom holds it) and the flag of an answer served cut."""
    if not held.carried:
        return
    if FLAG_TRUNCATED not in flags and any(earlier.cut for earlier in held.carried):
        flags.append(FLAG_TRUNCATED)
    reasoned = [(earlier, reasoning) for earlier in held.carried if (reasoning := _reasoning(earlier.answer))]
    if not reasoned:  # most chats: no answer of theirs reasoned (the turns are not looked through)
        return
    answers = [message for message in messages if message.role == "assistant"]
    # the answers' places among the turns (a turn that is no object has no role: None)
    positions = [index for index, role in enumerate(_roles(held.exchange.messages)) if role == ANSWER_ROLE]
    for earlier, reasoning in reasoned:
        ordinal = bisect_right(positions, earlier.position)  # the chat's nth answer (its position is one of them)
        found = answers[ordinal - 1:ordinal]  # none when the kept turns hold fewer answers (a prompt holds none)
        if found and not found[0].reasoning and found[0].content.strip() == _turn_text(earlier.answer):
            found[0].reasoning = reasoning


def _reasoning(answer: JsonObject | ScannedAnswer) -> str | None:
    """An answer's reasoning as the readers take it: a reasoning field, else its think block."""
    fields: Iterable[object]
    content: object
    if isinstance(answer, ScannedAnswer):  # its fields read in C, not through ``get``
        fields, content = _REASONING_FIELDS(answer), answer.content
    else:
        fields, content = map(answer.get, REASONING_KEYS), answer.get("content")
    for value in fields:
        if isinstance(value, str) and value.strip():
            return value.strip()
    if isinstance(content, str) and THINK_CLOSE in content:
        return split_think(content)[1]
    return None
