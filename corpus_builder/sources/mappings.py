"""Raw rows -> turns: the sharegpt, messages, gsm8k and field mappings, and their detection.

``auto`` looks at the first row it recognises in each file and fixes the layout for the whole file, so
the per-row work is a handful of dict lookups:

- a ``conversations`` or ``messages`` list whose turns have ``from``/``value`` -> sharegpt,
  with ``role``/``content`` -> messages;
- a ``question`` field -> gsm8k (``answer`` is the assistant turn, or the reference answer of a prompt);
- a string ``prompt`` field -> field (the single user prompt; style ``field`` reads ``mapping.field``,
  ``prompt`` by default).

Reasoning on a turn comes from a ``reasoning``, ``reasoning_content`` or ``thinking`` field or a
``<think>`` block in the content (``records.make_message`` moves it out).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from ..errors import BadRow, CorpusError
from ..recipe.model import Mapping
from ..records import REASONING_KEYS, Message, check_role_order, make_message, split_think

STYLES = ("auto", "sharegpt", "messages", "gsm8k", "field")
TURN_FIELDS = ("conversations", "messages")
GSM8K_QUESTION, GSM8K_ANSWER = "question", "answer"
PROMPT_FIELD = "prompt"

# Speaker names seen in ShareGPT exports and chat datasets, mapped to the three roles.
ROLE_ALIASES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "model": "assistant",
}
_TURN_KEYS = {"sharegpt": ("from", "value"), "messages": ("role", "content")}
_DETAIL_CHARS = 80
_ROLE = attrgetter("role")


@dataclass(frozen=True, slots=True)
class Layout:
    """Where one file's rows keep their turns: the style and the field that holds them."""

    style: str  # sharegpt | messages | gsm8k | field
    field: str


@dataclass(slots=True)
class NormalisedRow:
    messages: list[Message]
    unclosed_think: bool
    source_id: str | None
    reference_answer: str | None = None


def check_mapping(mapping: Mapping, source: str) -> None:
    """Recipe-level mistakes that would otherwise skip every row."""
    if mapping.style not in STYLES:
        raise CorpusError(f"source '{source}': unknown mapping style '{mapping.style}' "
                          f"(expected one of {', '.join(STYLES)})")


def detect_layout(row: dict[str, Any], mapping: Mapping) -> Layout | None:
    """The layout a row shows under ``mapping``; None when this row does not tell."""
    style = mapping.style
    if style == "gsm8k":
        return Layout("gsm8k", GSM8K_QUESTION)
    if style == "field":
        return Layout("field", mapping.field or PROMPT_FIELD)
    if style in _TURN_KEYS:
        if mapping.field:
            return Layout(style, mapping.field)
        present = next((name for name in TURN_FIELDS if name in row), None)
        return Layout(style, present) if present else None
    candidates = (mapping.field,) if mapping.field else TURN_FIELDS
    for name in candidates:
        value = row.get(name)
        if isinstance(value, list) and value and isinstance(value[0], dict):
            return Layout("sharegpt" if "from" in value[0] else "messages", name)
        if mapping.field and isinstance(value, str):
            return Layout("field", name)
    if GSM8K_QUESTION in row and not mapping.field:
        return Layout("gsm8k", GSM8K_QUESTION)
    if isinstance(row.get(PROMPT_FIELD), str) and not mapping.field:
        return Layout("field", PROMPT_FIELD)
    return None


class RowNormaliser:
    """Turns the rows of ONE file into checked turns; make a new one per file (layouts differ).

    ``kind`` "replay" keeps every turn and needs an assistant turn; "prompts" checks the order, then
    keeps only the system and user turns (the target regenerates the rest) and adds ``system_prompt``
    when the row has no system turn.
    """

    def __init__(self, mapping: Mapping, kind: str, system_prompt: str | None = None) -> None:
        self.mapping = mapping
        self.replay = kind == "replay"
        self.system_prompt = system_prompt
        self.id_field = mapping.id_field or "id"
        self.layout: Layout | None = None
        self._accepted_roles: set[tuple[str, ...]] = set()

    def __call__(self, row: Any) -> NormalisedRow:
        if not isinstance(row, dict):
            raise BadRow("not_an_object", type(row).__name__)
        layout = self.layout
        if layout is None:
            layout = self.layout = detect_layout(row, self.mapping)
            if layout is None:
                if any(name in row for name in (self.mapping.field, *TURN_FIELDS)):
                    raise BadRow("bad_messages", "the turns field is not a non-empty list of turn objects")
                wanted = self.mapping.field or "conversations/messages/question/prompt"
                raise BadRow("missing_messages", f"no {wanted} field")
        if layout.style == "gsm8k":
            messages, unclosed, reference = self._gsm8k(row)
        elif layout.style == "field":
            messages, unclosed, reference = [_user_turn(row, layout.field)], False, None
        else:
            messages, unclosed = self._turns(row, layout)
            reference = None
        # Few distinct role sequences occur (they depend only on the length and a leading system
        # turn), so a sequence check_role_order accepted once is not checked again.
        roles = tuple(map(_ROLE, messages))
        if roles not in self._accepted_roles:
            check_role_order(messages, need_assistant=self.replay)
            self._accepted_roles.add(roles)
        if not self.replay:
            messages = [m for m in messages if m.role != "assistant"]
            unclosed = False  # the discarded assistant turns held the open block
            if self.system_prompt and messages[0].role != "system":
                messages.insert(0, Message("system", self.system_prompt))
        source_id = row.get(self.id_field)
        return NormalisedRow(messages, unclosed, None if source_id is None else str(source_id), reference)

    def _turns(self, row: dict[str, Any], layout: Layout) -> tuple[list[Message], bool]:
        turns = row.get(layout.field)
        if turns is None:
            raise BadRow("missing_messages", f"no '{layout.field}' field")
        if not isinstance(turns, list) or not turns:
            raise BadRow("bad_messages", f"'{layout.field}' is {_describe(turns)}")
        role_key, content_key = _TURN_KEYS[layout.style]
        check_assistant = self.replay  # prompts discard assistant turns, so their content is not checked
        messages: list[Message] = []
        unclosed = False
        for index, turn in enumerate(turns):
            try:
                role = ROLE_ALIASES[turn[role_key]]
                content = turn[content_key]
            except (KeyError, TypeError):  # not a dict, unknown or missing role, missing content
                raise _bad_turn(index, turn, role_key) from None
            # The common turns (plain text with no extra fields) are built directly: without a reasoning
            # field make_message reduces to split_think on assistant turns holding a think tag (one scan
            # finds both tags). Anything else goes through make_message's checks.
            if len(turn) > 2 or type(content) is not str:
                message, turn_unclosed = make_message(role, content, _turn_reasoning(turn))
                unclosed |= turn_unclosed
                content = message.content
            elif role == "assistant" and "think>" in content:
                content, reasoning, turn_unclosed = split_think(content)
                message = Message(role, content, reasoning)
                unclosed |= turn_unclosed
            else:
                message = Message(role, content)
            if (not content or content.isspace()) and (check_assistant or role != "assistant"):
                _require_content(message, index)
            messages.append(message)
        return messages, unclosed

    def _gsm8k(self, row: dict[str, Any]) -> tuple[list[Message], bool, str | None]:
        messages = [_user_turn(row, GSM8K_QUESTION)]
        answer = row.get(GSM8K_ANSWER)
        if not self.replay:
            return messages, False, None if answer is None else str(answer)
        if GSM8K_ANSWER not in row:
            return messages, False, None  # check_role_order reports the missing assistant turn
        message, unclosed = make_message("assistant", answer)
        _require_content(message, 1)
        messages.append(message)
        return messages, unclosed, None


def _user_turn(row: dict[str, Any], name: str) -> Message:
    if name not in row:
        raise BadRow("missing_messages", f"no '{name}' field")
    message, _ = make_message("user", row[name])
    _require_content(message, 0)
    return message


def _bad_turn(index: int, turn: Any, role_key: str) -> BadRow:
    """Why a turn could not be read (the slow path, taken only for bad rows)."""
    if not isinstance(turn, dict):
        return BadRow("bad_messages", f"turn {index} is {type(turn).__name__}")
    speaker = turn.get(role_key)
    if not isinstance(speaker, str) or speaker not in ROLE_ALIASES:
        return BadRow("unknown_role", f"turn {index} {role_key}={str(speaker)[:_DETAIL_CHARS]!r}")
    return BadRow("null_content", f"turn {index} ({ROLE_ALIASES[speaker]}) has no content")


def _turn_reasoning(turn: dict[str, Any]) -> Any:
    for key in REASONING_KEYS:
        value = turn.get(key)
        if value is not None:
            return value
    return None


def _require_content(message: Message, index: int) -> None:
    """An empty prompt is useless and an empty answer teaches nothing (reasoning alone is kept)."""
    content = message.content
    if (not content or content.isspace()) and not (message.role == "assistant" and message.reasoning):
        raise BadRow("empty_content", f"turn {index} ({message.role}) is empty")


def _describe(value: Any) -> str:
    if isinstance(value, list):
        return "an empty list"
    return f"a {type(value).__name__}, not a list of turns"
