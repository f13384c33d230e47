"""The one record type that flows through every stage, and the normalisation of reasoning.

A conversation's reasoning always lives in ``Message.reasoning``, never inside ``content``: real data
keeps it in a ``reasoning``/``reasoning_content``/``thinking`` field or as a ``<think>...</think>`` block
in the content, and both are brought here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson

from .errors import BadRow

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
REASONING_KEYS = ("reasoning", "reasoning_content", "thinking")

# Flags a row can carry; they are facts about the row, decisions are taken by the checks.
FLAG_UNCLOSED_THINK = "unclosed_think"
FLAG_TRUNCATED = "truncated_generation"


@dataclass(slots=True)
class Message:
    role: str
    content: str
    reasoning: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "content": self.content, "reasoning": self.reasoning}


@dataclass(slots=True)
class Conversation:
    id: str
    source: str
    origin: str  # "replay" | "generated"
    messages: list[Message]
    task: str | None = None
    license: str | None = None
    flags: list[str] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)
    split: str | None = None
    digest: bytes | None = None  # content_digest(messages) when the reader already computed it; not stored

    @property
    def thinking(self) -> bool:
        """True when any assistant turn carries a non-empty reasoning trace."""
        return any(m.reasoning for m in self.messages if m.role == "assistant")

    def to_row(self) -> dict[str, Any]:
        """The JSON shape of schemas/conversation.schema.json (provenance as an object); the Arrow form is
        ``corpus_builder.rows``."""
        return {
            "id": self.id,
            "source": self.source,
            "origin": self.origin,
            "task": self.task,
            "license": self.license,
            "messages": [m.to_dict() for m in self.messages],
            "thinking": self.thinking,
            "flags": list(self.flags),
            "split": self.split,
            "provenance": self.provenance,
        }


def split_think(text: str) -> tuple[str, str | None, bool]:
    """Move a think block out of ``text``: returns (content, reasoning, unclosed).

    Handles ``<think>r</think>c``, the pre-opened form ``r</think>c`` (what a server without a
    reasoning parser returns for a template that opens the block itself) and an unclosed ``<think>r``.
    """
    close = text.find(THINK_CLOSE)
    open_ = text.find(THINK_OPEN)
    if close < 0:
        if open_ < 0:
            return text, None, False
        return text[:open_].strip(), text[open_ + len(THINK_OPEN):].strip() or None, True
    start = open_ + len(THINK_OPEN) if 0 <= open_ < close else 0
    before = text[:open_] if 0 <= open_ < close else ""
    reasoning = text[start:close].strip()
    content = (before + text[close + len(THINK_CLOSE):]).strip()
    return content, reasoning or None, False


def make_message(role: str, content: Any, reasoning: Any = None) -> tuple[Message, bool]:
    """Build one turn, moving think blocks out of the content; returns (message, unclosed_think)."""
    if content is None:
        raise BadRow("null_content", f"{role} turn")
    if not isinstance(content, str):
        raise BadRow("non_string_content", f"{role} turn has {type(content).__name__}")
    if reasoning is not None and not isinstance(reasoning, str):
        raise BadRow("non_string_content", f"{role} reasoning has {type(reasoning).__name__}")
    unclosed = False
    if role == "assistant" and (THINK_OPEN in content or THINK_CLOSE in content):
        content, embedded, unclosed = split_think(content)
        if embedded and not reasoning:
            reasoning = embedded
    if reasoning is not None:
        reasoning = reasoning.strip() or None
    return Message(role, content, reasoning), unclosed


def check_role_order(messages: list[Message], *, need_assistant: bool) -> None:
    """[system] user assistant user assistant ...; replayed rows must end on an assistant turn."""
    start = 1 if messages and messages[0].role == "system" else 0
    turns = messages[start:]
    if not turns:
        raise BadRow("wrong_role_order", "no user turn")
    for i, message in enumerate(turns):
        expected = "user" if i % 2 == 0 else "assistant"
        if message.role != expected:
            raise BadRow("wrong_role_order", f"turn {start + i} is {message.role}, expected {expected}")
    if need_assistant and turns[-1].role != "assistant":
        raise BadRow("no_assistant_turn" if len(turns) == 1 else "wrong_role_order",
                     "conversation does not end with an assistant turn")


def content_key(messages: list[Message]) -> bytes:
    """Canonical bytes of a conversation's turns (roles, content, reasoning)."""
    return orjson.dumps([(m.role, m.content, m.reasoning) for m in messages])


def content_digest(messages: list[Message]) -> bytes:
    """sha256 of the canonical turns: the basis of ids and of exact dedup (computed once per row)."""
    return hashlib.sha256(content_key(messages)).digest()


def conversation_id(source: str, messages: list[Message], salt: str = "", digest: bytes | None = None) -> str:
    """Stable id: it depends on the source name and the turns, never on input order or position."""
    digest = digest or content_digest(messages)
    return hashlib.sha256(b"corpus-conv\0%s\0%s\0%s" % (source.encode(), salt.encode(), digest)).hexdigest()[:20]
