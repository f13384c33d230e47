"""Raw rows -> turns: the sharegpt, messages, gsm8k and field mappings, and their detection.

``auto`` looks at the first row it recognises in each file and fixes the layout for the whole file, so
the per-row work is a handful of dict lookups:

- a ``conversations`` or ``messages`` list whose turns have ``from``/``value`` -> sharegpt,
  with ``role``/``content`` -> messages;
- a ``question`` field -> gsm8k (``answer`` is the assistant turn, or the reference answer of a prompt);
- a string ``prompt`` field -> field (the single user prompt; style ``field`` reads ``mapping.field``,
  ``prompt`` by default);
- a logged chat-completions exchange (a request and the response served to it, ``sources.logs``) -> log, asked
  first: a flat log row has a ``messages`` list too. Its turns are the request's messages then the answer, read
  as a messages row is; how it was served travels with it (``NormalisedRow.served``).

Reasoning on a turn comes from a ``reasoning``, ``reasoning_content`` or ``thinking`` field or a
``<think>`` block in the content (``records.make_message`` moves it out).

Tool traffic comes as OpenAI chat messages (an assistant turn's ``tool_calls``, whose content may be null, or
the legacy ``function_call``; ``tool`` turns with ``tool_call_id``; legacy ``function`` results) or as the
ShareGPT variant of glaive/LLaMA-Factory dumps (``function_call`` turns holding the call's JSON, one call or a
list of parallel ones, and ``observation`` turns holding the result); a row's ``tools`` is a list or a JSON
string of function schemas, in OpenAI's form or bare (``records.normalise_tools``; parameters that are not a
valid JSON Schema flag the row ``invalid_tool_schema``). Calls without an id get ``call_N`` (the call's position
among the row's calls; the next free N when the row already holds that id) and results without one answer the
calls before them in order, so a dump without ids reads the same way on every run.

A row whose turns break the role order, or hold an empty turn, is repaired by the source's repair rules
(``records.repair_turns``; empty turns are dropped here, as they are read) and skipped only when no valid
conversation is left, with the reason the unrepaired row had.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import Any

import orjson

from ..errors import BadRow, CorpusError
from ..recipe.model import Mapping
from ..records import (
    FLAG_INVALID_TOOL_CALL,
    FLAG_INVALID_TOOL_SCHEMA,
    FLAG_TRUNCATED,
    FLAG_UNCLOSED_THINK,
    REASONING_KEYS,
    Message,
    RepairRules,
    Served,
    ToolCall,
    carries_tool_traffic,
    check_role_order,
    has_non_object_arguments,
    invalid_tool_schemas,
    make_message,
    normalise_tools,
    repair_flag,
    repair_turns,
    split_think,
)
from .logs import LoggedExchange, is_log_row, read_exchange

STYLES = ("auto", "sharegpt", "messages", "gsm8k", "field", "log")
TURN_FIELDS = ("conversations", "messages")
GSM8K_QUESTION, GSM8K_ANSWER = "question", "answer"
PROMPT_FIELD = "prompt"
TOOLS_FIELD = "tools"
TOOL_CHOICE_UNDEFINED = "tool_choice_undefined"  # the Skipped reason of a row whose tools lack the named function

# Speaker names seen in ShareGPT exports, chat datasets and chat logs, mapped to the four roles.
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
    "function_call": "assistant",  # ShareGPT tool dumps: an assistant turn whose value is the call(s)
    "tool": "tool",
    "function": "tool",  # OpenAI's legacy function result
    "observation": "tool",  # ShareGPT tool dumps
    "ipython": "tool",  # Llama 3's tool result
}
CALL_SPEAKERS = frozenset({"function_call"})  # speakers whose value is the JSON of the call(s), not text
TURN_KEYS = {"sharegpt": ("from", "value"), "messages": ("role", "content")}
_DETAIL_CHARS = 80
_ROLE = attrgetter("role")
_EMPTY_TURNS_DROPPED = repair_flag("empty_turns", "drop")
_SPLIT = repair_flag("consecutive_turns", "split")
DEFAULT_REPAIRS = RepairRules()


@dataclass(frozen=True, slots=True)
class Layout:
    """Where one file's rows keep their turns: the style and the field that holds them."""

    style: str  # sharegpt | messages | gsm8k | field | log
    field: str


_LOG_TURNS = Layout("messages", "messages")  # a logged exchange's turns, in the form read_exchange gives them


@dataclass(slots=True)
class NormalisedRow:
    """One conversation of a row (a row split by ``consecutive_turns: split`` gives one per part)."""

    messages: list[Message]
    flags: list[str]
    source_id: str | None
    reference_answer: str | None = None
    part: int | None = None  # which part of a split row, in order
    tools: list[dict[str, Any]] | None = None
    served: Served | None = None  # a logged exchange's: how it was served (sources.logs)
    session: str | None = None  # a logged exchange's conversation id, where the log records one


def row_object(row: object) -> dict[str, object]:
    """A row as the object every layout reads it as; BadRow for any other value."""
    if not isinstance(row, dict):
        raise BadRow("not_an_object", type(row).__name__)
    return row


def check_mapping(mapping: Mapping, source: str) -> None:
    """Recipe-level mistakes that would otherwise skip every row."""
    if mapping.style not in STYLES:
        raise CorpusError(f"source '{source}': unknown mapping style '{mapping.style}' "
                          f"(expected one of {', '.join(STYLES)})")


def detect_layout(row: dict[str, object], mapping: Mapping) -> Layout | None:
    """The layout a row shows under ``mapping``; None when this row does not tell."""
    style = mapping.style
    if style == "log" or (style == "auto" and not mapping.field and is_log_row(row)):
        return Layout("log", "")
    if style == "gsm8k":
        return Layout("gsm8k", GSM8K_QUESTION)
    if style == "field":
        return Layout("field", mapping.field or PROMPT_FIELD)
    if style in TURN_KEYS:
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


def first_layout(rows: Iterable[dict[str, object]], mapping: Mapping) -> Layout | None:
    """The layout of a file, fixed by the first of its object ``rows`` (read from its start) that shows one, as
    ``RowNormaliser`` fixes it; None when no row shows one. Rows after that one are not read."""
    return next((layout for row in rows if (layout := detect_layout(row, mapping)) is not None), None)


class RowNormaliser:
    """Turns the rows of ONE file into checked turns; make a new one per file (layouts differ).

    ``kind`` "replay" keeps every turn and needs an assistant turn; "prompts" checks the order, then
    keeps only the system and user turns (the target regenerates the rest) and adds ``system_prompt``
    when the row has no system turn; "pack" (an eval pack's file) keeps every turn and needs no assistant turn (a
    row may end with the question the target answers). A prompt with tool traffic keeps its recorded assistant and
    tool turns: the tool-result policy (``sources[].tool_results``) needs the recorded calls and their results.
    ``repair`` says which repairs may save a row that breaks the order. ``tool_choice_function``, the function
    a prompts source's tool_choice names, skips a row with tools that do not define it: the server refuses its
    every request.
    """

    def __init__(self, mapping: Mapping, kind: str, system_prompt: str | None = None,
                 repair: RepairRules = DEFAULT_REPAIRS, tool_choice_function: str | None = None) -> None:
        self.mapping = mapping
        self.replay = kind == "replay"
        self.every_turn = kind != "prompts"  # assistant turns kept (and their content checked)
        self.system_prompt = system_prompt
        self.repair = repair
        self.tool_choice_function = tool_choice_function
        self.drop_empty_turns = repair.empty_turns == "drop"
        self.id_field = mapping.id_field or "id"
        self.layout: Layout | None = None
        self._accepted_roles: set[tuple[str, ...]] = set()

    def __call__(self, row: object) -> list[NormalisedRow]:
        fields = row_object(row)
        layout = self.layout_of(fields)
        return self._normalise(fields, layout, read_exchange(fields) if layout.style == "log" else None)

    def layout_of(self, row: object) -> Layout:
        """The file's layout, fixed by the first row that shows one; BadRow for a row that cannot be read."""
        row = row_object(row)
        layout = self.layout
        if layout is None:
            layout = self.layout = detect_layout(row, self.mapping)
            if layout is None:
                if any(name in row for name in (self.mapping.field, *TURN_FIELDS)):
                    raise BadRow("bad_messages", "the turns field is not a non-empty list of turn objects")
                wanted = self.mapping.field or "conversations/messages/question/prompt"
                raise BadRow("missing_messages", f"no {wanted} field")
        return layout

    def logged(self, exchange: LoggedExchange) -> list[NormalisedRow]:
        """The conversation(s) of an exchange already read from a log row (``sources.fold`` reads them first)."""
        return self._normalise(exchange.row, Layout("log", ""), exchange)

    def _normalise(self, row: dict[str, object], layout: Layout, exchange: LoggedExchange | None
                   ) -> list[NormalisedRow]:
        empty: BadRow | None = None
        turn_traffic = False  # a tool call or a tool's result among the turns
        served = session = None
        raw_tools = row.get(TOOLS_FIELD)
        if exchange is not None:
            served, session, raw_tools = exchange.served(), exchange.session, exchange.tools
            messages, unclosed, empty, turn_traffic = self._turns({"messages": exchange.turns()}, _LOG_TURNS)
            reference = None
        elif layout.style == "gsm8k":
            messages, unclosed, reference = self._gsm8k(row)
        elif layout.style == "field":
            messages, unclosed, reference = [_user_turn(row, layout.field)], False, None
        else:
            messages, unclosed, empty, turn_traffic = self._turns(row, layout)
            reference = None
        tools = normalise_tools(raw_tools)
        named = self.tool_choice_function
        if named is not None and tools is not None and all(tool["function"]["name"] != named for tool in tools):
            raise BadRow(TOOL_CHOICE_UNDEFINED, f"tool_choice names {named!r}; the row's tools are "
                                                f"{', '.join(tool['function']['name'] for tool in tools)}")
        # A prompt served with tools keeps its assistant turns, as one with tool turns does.
        tooled = turn_traffic or bool(tools)
        # A prompt's open block was in an assistant turn it discards (with tool traffic: that the target may
        # regenerate); the generated row is judged on its own turns.
        row_flags = [FLAG_UNCLOSED_THINK] if unclosed and self.replay else []
        if served is not None and served.finish_reason == "length" and self.replay:  # cut as a generation is
            row_flags.append(FLAG_TRUNCATED)
        if tools is not None and invalid_tool_schemas(tools):  # served, and sent with a prompt's every request
            row_flags.append(FLAG_INVALID_TOOL_SCHEMA)
        source_id = row.get(self.id_field)
        source_id = None if source_id is None else str(source_id)
        # Few distinct role sequences occur (they depend only on the length and a leading system turn), so
        # a sequence the strict order accepted once is not checked again: most rows take this way. Not rows
        # with tool calls or results: whether their results answer their calls is in the ids, not in the roles.
        # A ``tools`` list alone does not matter to the order, so those rows take this way too.
        if empty is None and not turn_traffic and tuple(map(_ROLE, messages)) in self._accepted_roles:
            return [NormalisedRow(messages if self.every_turn else self._prompt(messages, tooled), row_flags,
                                  source_id, reference, tools=tools, served=served, session=session)]
        if empty is not None:
            row_flags.append(_EMPTY_TURNS_DROPPED)
        problem = empty or self._order_problem(messages, remember=not turn_traffic)
        if problem is None:
            parts = [(messages, row_flags)]
        else:
            # unclosed_think stays a fact about the source row: a part whose unclosed turn a repair left out
            # still carries it (the check drops it, as it would have dropped the unrepaired row).
            parts = [(part.messages, row_flags + part.flags)
                     for part in repair_turns(messages, self.repair, replay=self.replay)]
            if not parts:
                raise problem
        if turn_traffic and self.replay:  # a prompt's recorded calls are regenerated, or flagged where kept
            parts = [(part, [*flags, FLAG_INVALID_TOOL_CALL] if has_non_object_arguments(part) else flags)
                     for part, flags in parts]
        return [NormalisedRow(part if self.every_turn
                              else self._prompt(part, tooled and carries_tool_traffic(part, tools)),
                              flags, source_id, reference, index if _SPLIT in flags else None, tools, served, session)
                for index, (part, flags) in enumerate(parts)]

    def _order_problem(self, messages: list[Message], *, remember: bool) -> BadRow | None:
        """Why the turns break the strict order, or None (the sequence is then remembered as accepted)."""
        try:
            check_role_order(messages, need_assistant=self.replay)
        except BadRow as problem:
            return problem
        if remember:
            self._accepted_roles.add(tuple(map(_ROLE, messages)))
        return None

    def _prompt(self, messages: list[Message], tooled: bool) -> list[Message]:
        """The turns a prompt sends: system and user turns (every turn when it has tool traffic), with the
        source's system prompt when none."""
        if not tooled:
            messages = [m for m in messages if m.role != "assistant"]
        if self.system_prompt and messages[0].role != "system":
            messages.insert(0, Message("system", self.system_prompt))
        return messages

    def _turns(self, row: dict[str, object], layout: Layout) -> tuple[list[Message], bool, BadRow | None, bool]:
        """The turns, whether a kept one holds an unclosed think block, why the first empty turn was dropped
        (None when none was; with ``empty_turns: skip`` the first empty turn skips the row), and whether a
        turn calls a tool or holds a tool's result."""
        turns = row.get(layout.field)
        if turns is None:
            raise BadRow("missing_messages", f"no '{layout.field}' field")
        if not isinstance(turns, list) or not turns:
            raise BadRow("bad_messages", f"'{layout.field}' is {_describe(turns)}")
        role_key, content_key = TURN_KEYS[layout.style]
        check_assistant = self.every_turn  # prompts discard assistant turns, so their content is not checked
        messages: list[Message] = []
        unclosed = tool_traffic = False
        empty: BadRow | None = None
        for index, turn in enumerate(turns):
            try:
                speaker = turn[role_key]
                role = ROLE_ALIASES[speaker]
            except (KeyError, TypeError):  # not a dict, unknown or missing role
                raise _bad_turn(index, turn, role_key) from None
            content = turn.get(content_key)
            # OpenAI logs may leave out the content of an assistant turn that only calls tools
            if content is None and content_key not in turn and not (role == "assistant" and _declares_calls(turn)):
                raise _bad_turn(index, turn, role_key)
            # The common turns (plain text with no extra fields) are built directly: without a reasoning
            # field make_message reduces to split_think on assistant turns holding a think tag (one scan
            # finds both tags). Anything else goes through make_message's checks.
            turn_unclosed = False
            if speaker in CALL_SPEAKERS:
                message = Message(role, "", None, _calls(_json_value(content, index), index))
            elif len(turn) > 2 or type(content) is not str:
                message, turn_unclosed = make_message(
                    role, content, _turn_reasoning(turn), tool_calls=_turn_calls(turn, index) if role == "assistant"
                    else (), tool_call_id=_tool_call_id(turn) if role == "tool" else None)
            elif role == "assistant" and "think>" in content:
                content, reasoning, turn_unclosed = split_think(content)
                message = Message(role, content, reasoning)
            else:
                message = Message(role, content)
            if (not message.content or message.content.isspace()) and (check_assistant or role != "assistant"):
                problem = _empty_turn(message, index)
                if problem is not None:
                    if not self.drop_empty_turns:
                        raise problem
                    empty = empty or problem
                    continue
            unclosed |= turn_unclosed
            tool_traffic = tool_traffic or role == "tool" or bool(message.tool_calls)
            messages.append(message)
        return (_link_tool_results(messages) if tool_traffic else messages), unclosed, empty, tool_traffic

    def _gsm8k(self, row: dict[str, object]) -> tuple[list[Message], bool, str | None]:
        messages = [_user_turn(row, GSM8K_QUESTION)]
        answer = row.get(GSM8K_ANSWER)
        if not self.every_turn:
            return messages, False, None if answer is None else str(answer)
        if GSM8K_ANSWER not in row:
            return messages, False, None  # check_role_order reports the missing assistant turn
        message, unclosed = make_message("assistant", answer)
        _require_content(message, 1)
        messages.append(message)
        return messages, unclosed, None


def _user_turn(row: dict[str, object], name: str) -> Message:
    if name not in row:
        raise BadRow("missing_messages", f"no '{name}' field")
    message, _ = make_message("user", row[name])
    _require_content(message, 0)
    return message


def _bad_turn(index: int, turn: object, role_key: str) -> BadRow:
    """Why a turn could not be read (the slow path, taken only for bad rows)."""
    if not isinstance(turn, dict):
        return BadRow("bad_messages", f"turn {index} is {type(turn).__name__}")
    speaker = turn.get(role_key)
    if not isinstance(speaker, str) or speaker not in ROLE_ALIASES:
        return BadRow("unknown_role", f"turn {index} {role_key}={str(speaker)[:_DETAIL_CHARS]!r}")
    return BadRow("null_content", f"turn {index} ({ROLE_ALIASES[speaker]}) has no content")


def _json_value(text: object, index: int) -> object:
    """The call(s) a ShareGPT ``function_call`` turn holds, as JSON text (or already decoded)."""
    if not isinstance(text, str):
        return text
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        raise BadRow("bad_tool_call", f"turn {index}: the function call is not JSON") from None


def _declares_calls(turn: dict[str, object]) -> bool:
    return bool(turn.get("tool_calls") or turn.get("function_call"))


def _turn_calls(turn: dict[str, object], index: int) -> tuple[ToolCall, ...]:
    """An OpenAI assistant turn's ``tool_calls`` (or the legacy single ``function_call``)."""
    calls = turn.get("tool_calls")
    if calls is None and turn.get("function_call") is not None:
        calls = [turn["function_call"]]
    if calls is None or calls == []:
        return ()
    if not isinstance(calls, list):
        raise BadRow("bad_tool_call", f"turn {index}: tool_calls is a {type(calls).__name__}, not a list")
    return _calls(calls, index)


def _calls(value: object, index: int) -> tuple[ToolCall, ...]:
    """Calls in OpenAI's shape ({id, type, function: {name, arguments}}) or bare ({name, arguments}), one or a
    list; arguments kept as the text they were (JSON-encoded when a dump decoded them). Ids may be empty here:
    ``_link_tool_results`` assigns the missing ones."""
    calls = []
    for call in value if isinstance(value, list) else [value]:
        function = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(call, dict) or not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not function["name"]:
            raise BadRow("bad_tool_call", f"turn {index}: a tool call has no function name")
        name = function["name"]
        arguments = function.get("arguments", function.get("parameters"))
        if arguments is None:
            arguments = "{}"
        elif not isinstance(arguments, str):
            if not isinstance(arguments, dict | list):
                raise BadRow("bad_tool_call", f"turn {index}: the arguments of {name} are a "
                                              f"{type(arguments).__name__}")
            arguments = orjson.dumps(arguments).decode()
        call_id = call.get("id")
        calls.append(ToolCall(call_id if isinstance(call_id, str) else "", name, arguments))
    return tuple(calls)


def _tool_call_id(turn: dict[str, object]) -> str | None:
    value = turn.get("tool_call_id")
    return value if isinstance(value, str) and value else None


def _link_tool_results(messages: list[Message]) -> list[Message]:
    """Ids for calls and results that came without one, so results answer calls the same way on every read:
    a call gets ``call_N`` (N: its position among the row's calls, or the next number whose ``call_N`` no call
    of the row has: an assigned id never repeats one the row holds), a result the id of the first call of the
    assistant turn before it that is still unanswered. One ShareGPT ``observation`` after N > 1 parallel calls
    that holds a JSON list of N results is N results."""
    linked: list[Message] = []
    number = 0
    taken = {call.id for message in messages for call in message.tool_calls if call.id}
    open_calls: list[str] = []
    for message in messages:
        if message.tool_calls:
            message.tool_calls = tuple(call if call.id else replace(call, id=_unused_call_id(number + offset, taken))
                                       for offset, call in enumerate(message.tool_calls))
            number += len(message.tool_calls)
            open_calls = [call.id for call in message.tool_calls]
        elif message.role == "tool":
            results = _parallel_results(message, len(open_calls)) if message.tool_call_id is None else [message]
            for result in results:
                if result.tool_call_id is None and open_calls:
                    result.tool_call_id = open_calls[0]
                if result.tool_call_id in open_calls:
                    open_calls.remove(result.tool_call_id)
            linked += results
            continue
        elif message.role != "system":
            open_calls = []
        linked.append(message)
    return linked


def _unused_call_id(number: int, taken: set[str]) -> str:
    """``call_N`` for the first N from ``number`` that no call of the row has; the id is then taken."""
    while f"call_{number}" in taken:
        number += 1
    call_id = f"call_{number}"
    taken.add(call_id)
    return call_id


def _parallel_results(message: Message, calls: int) -> list[Message]:
    if calls < 2 or not message.content.startswith("["):
        return [message]
    try:
        results = orjson.loads(message.content)
    except orjson.JSONDecodeError:
        return [message]
    if not isinstance(results, list) or len(results) != calls:
        return [message]
    return [Message("tool", result if isinstance(result, str) else orjson.dumps(result).decode())
            for result in results]


def _turn_reasoning(turn: dict[str, object]) -> object:
    for key in REASONING_KEYS:
        value = turn.get(key)
        if value is not None:
            return value
    return None


def _empty_turn(message: Message, index: int) -> BadRow | None:
    """An empty prompt is useless and an empty answer teaches nothing (reasoning alone is kept, and so is a turn
    that calls tools); a tool's result is whatever the tool returned, empty or not."""
    content = message.content
    if message.role == "tool" or message.tool_calls:
        return None
    if (not content or content.isspace()) and not (message.role == "assistant" and message.reasoning):
        return BadRow("empty_content", f"turn {index} ({message.role}) is empty")
    return None


def _require_content(message: Message, index: int) -> None:
    """The one prompt or answer of a gsm8k or field row: nothing is left to repair without it."""
    problem = _empty_turn(message, index)
    if problem is not None:
        raise problem


def _describe(value: object) -> str:
    if isinstance(value, list):
        return "an empty list"
    return f"a {type(value).__name__}, not a list of turns"
