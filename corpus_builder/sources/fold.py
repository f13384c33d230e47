"""One conversation per conversation: the requests of a multi-turn chat, logged one by one, folded into the last.

A chat is logged once per request and every request repeats the whole history, so a 6-turn chat is 3 logged
rows: read as they are, they are 3 overlapping conversations that count its first turns three times. A row whose
turns (its request's messages and the answer) are a prefix of a later row's turns, of the same conversation,
is folded into that row: it is dropped (``folded_prefix``, in the ledger with the row it was folded into) and the
later row keeps what only the earlier one held: the reasoning of an answer, which clients rarely send back in the
history, and the earlier row's flags. The same conversation is the same session where the log records one
(``provenance.session_id``), else any row with the prefix.

Turns are matched on role, text (stripped) and tool calls (name and arguments): the reasoning and the call ids a
client sends back are not trusted to be the served ones. The fold streams: a row is held while its conversation is
open, and memory is bounded by the number of open conversations (``max_open``), not by the file; past it the
conversation extended longest ago is written as it stands (a later request of it is then its own conversation).
Rows come out when they close, so a log's conversations come out in the order their chats ended.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..errors import Skipped
from ..recipe.model import Fold
from ..records import Conversation, Message, conversation_id, row_location

FOLDED_PREFIX = "folded_prefix"
SESSION_KEY = "session_id"  # the provenance key of a logged row's conversation id
FOLDED_KEY = "folded_requests"  # provenance: how many logged requests a folded conversation was made of
_DIGEST_BYTES = 16

Tag = TypeVar("Tag")  # what the caller keeps with each row (its position)


@dataclass(slots=True)
class _Open(Generic[Tag]):
    conversation: Conversation
    tag: Tag
    requests: int


def turn_digests(messages: list[Message]) -> tuple[list[bytes], bytes]:
    """The digests of the turns up to each assistant turn before the last turn (where an earlier request's answer
    ends), and of all the turns."""
    hasher = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    prefixes: list[bytes] = []
    for index, message in enumerate(messages):
        if index and messages[index - 1].role == "assistant":
            prefixes.append(hasher.copy().digest())
        parts = [message.role, message.content.strip()]
        for call in message.tool_calls:
            parts += (call.name, call.arguments)
        hasher.update("\0".join(parts).encode("utf-8", "surrogatepass") + b"\1")
    return prefixes, hasher.digest()


class PrefixFold(Generic[Tag]):
    """Folds the logged rows of one source, fed in log order; ``add`` and ``close`` yield what is finished."""

    def __init__(self, max_open: int = Fold().max_open) -> None:
        if max_open < 1:
            raise ValueError("max_open must be at least 1")
        self.max_open = max_open
        self._open: OrderedDict[tuple[str | None, bytes], _Open[Tag]] = OrderedDict()

    def add(self, conversation: Conversation, tag: Tag) -> Iterator[tuple[Tag, Conversation | Skipped]]:
        """Take one row: the rows it folds come out as ``folded_prefix`` skips, and a conversation the window
        closes (the one extended longest ago) comes out whole."""
        session = conversation.provenance.pop(SESSION_KEY, None)  # matching only: a log's ids are not published
        prefixes, full = turn_digests(conversation.messages)
        requests = 1
        for digest in prefixes:
            earlier = self._open.pop((session, digest), None)
            if earlier is None:
                continue
            requests += earlier.requests
            _carry(earlier.conversation, conversation)
            yield earlier.tag, Skipped(earlier.conversation.source, FOLDED_PREFIX, row_location(earlier.conversation),
                                       f"folded into {row_location(conversation)}", earlier.conversation.id)
        if requests > 1:
            conversation.provenance[FOLDED_KEY] = requests
            conversation.id = conversation_id(conversation.source, conversation.messages, tools=conversation.tools)
        key = (session, full)
        same = self._open.pop(key, None)  # the same request logged twice: both stay (dedup's to judge)
        if same is not None:
            yield same.tag, same.conversation
        self._open[key] = _Open(conversation, tag, requests)
        if len(self._open) > self.max_open:
            _, closed = self._open.popitem(last=False)
            yield closed.tag, closed.conversation

    def close(self) -> Iterator[tuple[Tag, Conversation]]:
        """The conversations still open, in the order they were last extended."""
        while self._open:
            _, closed = self._open.popitem(last=False)
            yield closed.tag, closed.conversation


def _carry(earlier: Conversation, later: Conversation) -> None:
    """What the later row of a conversation lacks of the earlier one's turns: an answer's reasoning (the history a
    client sends back seldom holds it), and the earlier row's flags."""
    for old, new in zip(earlier.messages, later.messages, strict=False):
        if old.reasoning and not new.reasoning and new.role == "assistant":
            new.reasoning = old.reasoning
    later.flags.extend(flag for flag in earlier.flags if flag not in later.flags)
