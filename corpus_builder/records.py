"""The one record type that flows through every stage, and the normalisation of reasoning.

A conversation's reasoning always lives in ``Message.reasoning``, never inside ``content``: real data
keeps it in a ``reasoning``/``reasoning_content``/``thinking`` field or as a ``<think>...</think>`` block
in the content, and both are brought here.

Tool traffic is OpenAI's: a conversation's ``tools`` (the function schemas it was served with), assistant
turns with ``tool_calls`` and ``tool`` turns that answer them by ``tool_call_id``. The role order is
``[system] user assistant(tool_calls) tool ... assistant user ...``: the results of a turn's calls come right
after it, and the assistant speaks again after them.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import orjson

from .errors import BadRow

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
REASONING_KEYS = ("reasoning", "reasoning_content", "thinking")

ROLES = ("system", "user", "assistant", "tool")

# Flags a row can carry; they are facts about the row, decisions are taken by the checks.
FLAG_UNCLOSED_THINK = "unclosed_think"
FLAG_TRUNCATED = "truncated_generation"
# A regenerated tool call whose result the source does not hold: the conversation was cut before it.
FLAG_TOOL_RESULT_UNKNOWN = "tool_result_unknown"
# A tool call whose arguments are not a JSON object (vLLM renders them as {}, not as the model emitted them), or a
# generated one that names no tool of the row or whose arguments do not fit the tool's schema.
FLAG_INVALID_TOOL_CALL = "invalid_tool_call"
# A tool of the row whose parameters are not a valid JSON Schema (the server cannot constrain a call to them).
FLAG_INVALID_TOOL_SCHEMA = "invalid_tool_schema"
# A repaired row carries "repaired:RULE:POLICY" for every repair rule that changed it, named exactly as the
# recipe setting that switches it (sources[].repair.RULE: POLICY), e.g. "repaired:leading_assistant:drop".
REPAIR_FLAG_PREFIX = "repaired:"

# Distinct parameter schemas whose validators are kept: a run's rows share a few tool sets, and building a
# validator (its schema checked against the metaschema first) costs far more than validating one call.
_CACHED_VALIDATORS = 1024
# orjson text of a schema -> (the schema, its validator or None when it is invalid), oldest first
_validators: dict[bytes, tuple[dict[str, object], Validator | None]] = {}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call of an assistant turn. ``arguments`` is the JSON text of the arguments as the model
    emitted it, never re-serialised: it may not even be JSON (see ``arguments_object``)."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    def to_openai(self) -> dict[str, object]:
        """The call as the OpenAI chat API writes it on an assistant message."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def arguments_object(self) -> dict[str, Any] | None:
        """The arguments as the JSON object they should be; None when the text is not one (a model may emit
        anything, so nothing downstream trusts the text to parse). Decoded as vLLM decodes them before its
        chat template renders a call (Python's json: NaN and integers of any size parse); orjson first, which
        reads what it accepts the same way, several times faster (every replayed call is decoded)."""
        try:
            value = orjson.loads(self.arguments)
        except orjson.JSONDecodeError:
            try:
                value = json.loads(self.arguments)
            except json.JSONDecodeError:
                return None
        return value if isinstance(value, dict) else None


@dataclass(slots=True)
class Message:
    role: str
    content: str
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()  # assistant turns: the calls the turn ends with
    tool_call_id: str | None = None  # tool turns: the call whose result this is

    def to_dict(self) -> dict[str, object]:
        return {"role": self.role, "content": self.content, "reasoning": self.reasoning,
                "tool_calls": [call.to_dict() for call in self.tool_calls] or None,
                "tool_call_id": self.tool_call_id}


# --- provenance ------------------------------------------------------------------------------------
# What a row records of where it came from and how it was made, the ``provenance`` object of
# schemas/conversation.schema.json (a JSON string in the Arrow form). Each record writes its keys in the order the
# readers and the generator have always written them, an optional one only when it is set, so a row's bytes are
# what they were when provenance was a dict; a value of another shape than the schema's (a hand-edited row) is read
# as not recorded.


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _object(value: object) -> dict[str, object]:
    """A JSON object as it is (its keys are strings), else an empty one."""
    return {str(key): item for key, item in value.items()} if isinstance(value, dict) else {}


def _ids(value: object) -> list[int] | None:
    return value if isinstance(value, list) else None


@dataclass(frozen=True, slots=True)
class HubOrigin:
    """The Hub split a row was read from (``provenance.hub``)."""

    id: str
    config: str | None
    split: str
    revision: str | None

    def location(self) -> str:
        """As locations name it: ``ORG/NAME[/CONFIG]/SPLIT``."""
        config = f"/{self.config}" if self.config else ""
        return f"{self.id}{config}/{self.split}"

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "config": self.config, "split": self.split, "revision": self.revision}

    @classmethod
    def from_json(cls, value: Mapping[str, object]) -> HubOrigin:
        return cls(_str(value.get("id")) or "", _str(value.get("config")), _str(value.get("split")) or "",
                   _str(value.get("revision")))


@dataclass(frozen=True, slots=True)
class Served:
    """How a logged request was served (``provenance.served``, ``sources.logs``): thinking (None when the log does
    not say), the model, the sampling sent, the finish reason, the reasoning effort and the token usage where the
    log records them."""

    enable_thinking: bool | None
    model: str | None
    sampling: dict[str, object]
    finish_reason: str | None
    reasoning_effort: str | None = None
    usage: dict[str, int] | None = None

    def to_json(self) -> dict[str, object]:
        served: dict[str, object] = {"enable_thinking": self.enable_thinking, "model": self.model,
                                     "sampling": self.sampling, "finish_reason": self.finish_reason}
        if self.reasoning_effort is not None:
            served["reasoning_effort"] = self.reasoning_effort
        if self.usage is not None:
            served["usage"] = self.usage
        return served

    @classmethod
    def from_json(cls, value: Mapping[str, object]) -> Served:
        usage = value.get("usage")
        return cls(_bool(value.get("enable_thinking")), _str(value.get("model")), _object(value.get("sampling")),
                   _str(value.get("finish_reason")), _str(value.get("reasoning_effort")),
                   {key: count for key, count in _object(usage).items() if isinstance(count, int)}
                   if isinstance(usage, dict) else None)


@dataclass(frozen=True, slots=True)
class ToolSettings:
    """How a prompts source's rows with tool traffic are generated (sources[].tool_choice, .tool_results), as a
    generated row records them (``provenance.generation.tool_choice``, ``.tool_results``)."""

    choice: str | dict[str, object] | None = None  # sent with every request of a row that has tools; None: not sent
    results: str = "match"  # match | recorded


@dataclass(frozen=True, slots=True)
class GeneratedTurn:
    """One generated assistant turn of a row (``provenance.generation.turns[]``): where it is, who answered, why it
    stopped, its token counts and the ids the server read and wrote."""

    message_index: int
    endpoint: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    prompt_token_ids: list[int] | None
    token_ids: list[int] | None
    retried_for_length: bool = False

    def to_json(self) -> dict[str, object]:
        return {"message_index": self.message_index, "endpoint": self.endpoint, "finish_reason": self.finish_reason,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "reasoning_tokens": self.reasoning_tokens, "prompt_token_ids": self.prompt_token_ids,
                "token_ids": self.token_ids, "retried_for_length": self.retried_for_length}

    @classmethod
    def from_json(cls, value: Mapping[str, object]) -> GeneratedTurn:
        return cls(_int(value.get("message_index")) or 0, _str(value.get("endpoint")) or "",
                   _str(value.get("finish_reason")), _int(value.get("prompt_tokens")),
                   _int(value.get("completion_tokens")), _int(value.get("reasoning_tokens")),
                   _ids(value.get("prompt_token_ids")), _ids(value.get("token_ids")),
                   value.get("retried_for_length") is True)


@dataclass(frozen=True, slots=True)
class Generation:
    """How a generated row was made (``provenance.generation``): the target (as the recipe names it and as the
    server reported it), the thinking mode, the history policy, the sampling, the sample index, its generated
    turns, and the tool settings of a row with tool traffic."""

    model: str
    served_model: str | None
    model_revision: str | None
    engine_version: str | None
    model_root: str | None
    quantization: str | None
    dtype: str | None
    enable_thinking: bool
    history_reasoning: str
    sampling: dict[str, object]
    sample_index: int
    turns: tuple[GeneratedTurn, ...]
    tools: ToolSettings | None = None

    def to_json(self) -> dict[str, object]:
        generation: dict[str, object] = {
            "model": self.model, "served_model": self.served_model, "model_revision": self.model_revision,
            "engine_version": self.engine_version, "model_root": self.model_root, "quantization": self.quantization,
            "dtype": self.dtype, "enable_thinking": self.enable_thinking, "history_reasoning": self.history_reasoning,
            "sampling": self.sampling, "sample_index": self.sample_index,
            "turns": [turn.to_json() for turn in self.turns],
        }
        if self.tools is not None:
            generation["tool_choice"] = self.tools.choice
            generation["tool_results"] = self.tools.results
        return generation

    @classmethod
    def from_json(cls, value: Mapping[str, object]) -> Generation:
        turns = value.get("turns")
        choice = value.get("tool_choice")
        return cls(
            _str(value.get("model")) or "", _str(value.get("served_model")), _str(value.get("model_revision")),
            _str(value.get("engine_version")), _str(value.get("model_root")), _str(value.get("quantization")),
            _str(value.get("dtype")), value.get("enable_thinking") is True, _str(value.get("history_reasoning")) or "",
            _object(value.get("sampling")), _int(value.get("sample_index")) or 0,
            tuple(GeneratedTurn.from_json(turn) for turn in turns if isinstance(turn, dict))
            if isinstance(turns, list) else (),
            ToolSettings(_object(choice) if isinstance(choice, dict) else _str(choice),
                         _str(value.get("tool_results")) or "match") if "tool_results" in value else None)


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a row came from (a file and its line or row, or a Hub split and its row; the part of a split row; the
    source's own id and reference answer), how a logged request was served, how many logged requests a folded
    conversation was made of, and how a generated row was generated."""

    source_file: str | None = None
    hub: HubOrigin | None = None
    source_line: int | None = None
    source_row: int | None = None
    source_part: int | None = None  # which part of a source row that repair consecutive_turns: split cut
    source_id: str | int | None = None
    reference_answer: str | None = None
    served: Served | None = None
    folded_requests: int | None = None
    generation: Generation | None = None

    @property
    def position(self) -> int | None:
        """The row's line (in a line format) or row index (else) in its file or split."""
        return self.source_line if self.source_line is not None else self.source_row

    def to_json(self) -> dict[str, object]:
        provenance: dict[str, object] = {}
        if self.source_file is not None:
            provenance["source_file"] = self.source_file
        if self.hub is not None:
            provenance["hub"] = self.hub.to_json()
        for name in ("source_line", "source_row", "source_part", "source_id", "reference_answer"):
            value = getattr(self, name)
            if value is not None:
                provenance[name] = value
        if self.served is not None:
            provenance["served"] = self.served.to_json()
        if self.folded_requests is not None:
            provenance["folded_requests"] = self.folded_requests
        if self.generation is not None:
            provenance["generation"] = self.generation.to_json()
        return provenance

    @classmethod
    def from_json(cls, value: Mapping[str, object]) -> Provenance:
        hub, served, generation, source_id = (value.get(name) for name in ("hub", "served", "generation",
                                                                             "source_id"))
        return cls(
            source_file=_str(value.get("source_file")),
            hub=HubOrigin.from_json(hub) if isinstance(hub, dict) else None,
            source_line=_int(value.get("source_line")),
            source_row=_int(value.get("source_row")),
            source_part=_int(value.get("source_part")),
            source_id=source_id if isinstance(source_id, str) else _int(source_id),
            reference_answer=_str(value.get("reference_answer")),
            served=Served.from_json(served) if isinstance(served, dict) else None,
            folded_requests=_int(value.get("folded_requests")),
            generation=Generation.from_json(generation) if isinstance(generation, dict) else None,
        )


# Where a row's assistant turns come from: kept as served (replay), to be regenerated by the target (prompt: a
# prompt source's row, which never reaches a corpus: the schema's enum and the publish gate refuse it), or
# regenerated (generated).
Origin = Literal["replay", "prompt", "generated"]


@dataclass(slots=True)
class Conversation:
    id: str
    source: str
    origin: Origin
    messages: list[Message]
    task: str | None = None
    license: str | None = None
    flags: list[str] = field(default_factory=list)
    provenance: Provenance = field(default_factory=Provenance)
    split: str | None = None
    tools: list[dict[str, Any]] | None = None  # the OpenAI function schemas the conversation was served with

    @property
    def thinking(self) -> bool:
        """True when any assistant turn carries a non-empty reasoning trace."""
        return any(m.reasoning for m in self.messages if m.role == "assistant")

    @property
    def has_tool_traffic(self) -> bool:
        return carries_tool_traffic(self.messages, self.tools)

    def to_row(self) -> dict[str, object]:
        """The JSON shape of schemas/conversation.schema.json (provenance as an object); the Arrow form is
        ``corpus_builder.rows``."""
        return {
            "id": self.id,
            "source": self.source,
            "origin": self.origin,
            "task": self.task,
            "license": self.license,
            "messages": [m.to_dict() for m in self.messages],
            "tools": self.tools,
            "thinking": self.thinking,
            "flags": list(self.flags),
            "split": self.split,
            "provenance": self.provenance.to_json(),
        }


def row_location(conversation: Conversation) -> str:
    """Where a row came from, as the ledger and every message name it: ``file:line``, ``file#row``, a Hub split's
    ``ORG/NAME[/CONFIG]/SPLIT#row`` (as its reader names the rows it skips), else the source."""
    provenance = conversation.provenance
    hub = provenance.hub
    where = provenance.source_file or (hub.location() if hub else conversation.source)
    if provenance.source_line is not None:
        return f"{where}:{provenance.source_line}"
    if provenance.source_row is not None:
        return f"{where}#{provenance.source_row}"
    return where


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


def make_message(role: str, content: object, reasoning: object = None, *, tool_calls: tuple[ToolCall, ...] = (),
                 tool_call_id: str | None = None) -> tuple[Message, bool]:
    """Build one turn, moving think blocks out of the content; returns (message, unclosed_think). An assistant
    turn that calls tools may have no content (OpenAI sends null): it is empty."""
    if content is None and tool_calls:
        content = ""
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
    return Message(role, content, reasoning, tool_calls, tool_call_id), unclosed


def normalise_tools(value: object) -> list[dict[str, Any]] | None:
    """A row's tools in the one shape the record keeps: OpenAI's ``{"type": "function", "function": {name,
    description, parameters[, strict]}}``, with description and parameters present (null when missing), the
    dict vLLM hands the chat template, so every consumer renders the row alike. Accepts the OpenAI form, bare
    function definitions (glaive-style dumps) and a JSON string of either; None for no tools."""
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            raise BadRow("bad_tools", "tools is a string that is not JSON") from None
    if value is None or value == []:
        return None
    if not isinstance(value, list):
        raise BadRow("bad_tools", f"tools is a {type(value).__name__}, not a list")
    return [_served_tool(index, tool) for index, tool in enumerate(value)]


def _served_tool(index: int, tool: object) -> dict[str, Any]:
    function = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise BadRow("bad_tools", f"tool {index} has no function name")
    description, parameters, strict = function.get("description"), function.get("parameters"), function.get("strict")
    if not (description is None or isinstance(description, str)) or not (parameters is None or isinstance(
            parameters, dict)) or not (strict is None or isinstance(strict, bool)):
        raise BadRow("bad_tools", f"tool {index} ({function['name']}): description must be a string, parameters "
                                  "an object, strict a boolean")
    served: dict[str, object] = {"name": function["name"], "description": description, "parameters": parameters}
    if strict is not None:
        served["strict"] = strict
    return {"type": "function", "function": served}


def invalid_tool_schemas(tools: Sequence[dict[str, Any]] | None) -> list[str]:
    """The names of the tools whose parameters are not a valid JSON Schema (checked against its metaschema)."""
    functions = [tool["function"] for tool in tools or ()]
    return [function["name"] for function in functions
            if function["parameters"] is not None and parameters_validator(function["parameters"]) is None]


def parameters_validator(schema: dict[str, object]) -> Validator | None:
    """The validator of a tool's parameter schema, None when the schema is invalid; built once per distinct schema
    (every row with tools asks). Keyed by orjson's text, fast, which blurs NaN and infinities into null: an entry
    serves only a schema equal to its own (a schema holding NaN equals none, and is built each time)."""
    try:
        key = orjson.dumps(schema)
    except orjson.JSONEncodeError:  # not JSON text (keys of other types than str, a cycle): built each time
        return _checked_validator(schema)
    cached = _validators.get(key)
    if cached is not None and cached[0] == schema:
        return cached[1]
    if len(_validators) >= _CACHED_VALIDATORS:
        del _validators[next(iter(_validators))]
    own = copy.deepcopy(schema)  # the validator keeps its schema: a row's later change cannot reach it
    validator = _checked_validator(own)
    _validators[key] = (own, validator)
    return validator


def _checked_validator(schema: dict[str, object]) -> Validator | None:
    import jsonschema  # ~150 ms to import: only rows with tools pay for it

    if not isinstance(schema.get("$schema", ""), str):
        return None  # names no metaschema (jsonschema would fail to look it up)
    validator_class = jsonschema.validators.validator_for(schema)
    try:
        validator_class.check_schema(schema)
    except jsonschema.exceptions.SchemaError:
        return None
    return validator_class(schema)


def openai_messages(messages: Sequence[Message], *, keep_history_reasoning: bool, current: int
                    ) -> list[dict[str, object]]:
    """The turns as OpenAI chat messages, exactly as the generator sends them (and so as the target's template
    saw them): ``reasoning_content`` on assistant turns with reasoning, either all of them (history reasoning
    kept) or only those of the exchange turn ``current`` belongs to (after the last user turn before it: the
    tool-calling steps that led to it, as templates that drop history reasoning keep them); ``tool_calls``
    with the arguments' text; ``tool_call_id`` on tool turns. A turn without tool traffic has only the keys it
    had before tools existed, so the request (and its journal key) is unchanged."""
    exchange = max((index for index in range(min(current, len(messages))) if messages[index].role == "user"),
                   default=-1)
    sent = []
    for index, message in enumerate(messages):
        turn: dict[str, object] = {"role": message.role, "content": message.content}
        if message.role == "assistant":
            if message.reasoning and (keep_history_reasoning or index > exchange):
                turn["reasoning_content"] = message.reasoning
            if message.tool_calls:
                turn["tool_calls"] = [call.to_openai() for call in message.tool_calls]
        elif message.role == "tool":
            turn["tool_call_id"] = message.tool_call_id
        sent.append(turn)
    return sent


def has_non_object_arguments(messages: Sequence[Message]) -> bool:
    """Whether a turn calls a tool with arguments that are not a JSON object (not JSON, or a list, a number...):
    vLLM and the token counts render them as ``{}``, so the row's text is not what the model emitted."""
    return any(call.arguments_object() is None for message in messages for call in message.tool_calls)


def carries_tool_traffic(messages: Sequence[Message], tools: Sequence[object] | None) -> bool:
    """Whether a conversation was served with tools, or holds a tool call or a tool's result."""
    return bool(tools) or any(m.tool_calls or m.role == "tool" for m in messages)


def check_role_order(messages: list[Message], *, need_assistant: bool, mid_system: bool = False) -> None:
    """[system] user assistant user assistant ...; an assistant turn with tool calls (each id once: else its
    results could not be told apart) is followed by one tool turn per call (by ``tool_call_id``, in any order),
    then by the assistant again: a call left without its result while the row goes on, whether none or only some
    of its turn's calls are answered, is ``unanswered_tool_call``. Replayed rows must end on an assistant turn
    (whose calls may then be unanswered: the row was logged before their results). With ``mid_system`` a system
    turn may also stand between the others (repair ``mid_system: keep``)."""
    start = 1 if messages and messages[0].role == "system" else 0
    speakers = [(index, message) for index, message in enumerate(messages)
                if index >= start and not (mid_system and message.role == "system")]
    if not speakers:
        raise BadRow("wrong_role_order", "no user turn")
    expected = "user"
    open_calls: list[str] = []  # ids of the latest assistant turn's calls that have no result yet
    for index, message in speakers:
        role = message.role
        if expected == "tool":
            if role != "tool":
                raise BadRow("unanswered_tool_call", f"turn {index} is {role}, but tool call(s) "
                                                     f"{', '.join(open_calls)} of the assistant turn before have no "
                                                     "result")
            if message.tool_call_id not in open_calls:
                raise BadRow("wrong_role_order", f"turn {index} answers tool call {message.tool_call_id!r}, which "
                                                 "the assistant turn before did not make (or was answered already)")
            open_calls.remove(message.tool_call_id)
            expected = "tool" if open_calls else "assistant"
            continue
        if role != expected:
            raise BadRow("wrong_role_order", f"turn {index} is {role}, expected {expected}")
        if role == "assistant" and message.tool_calls:
            open_calls, expected = [call.id for call in message.tool_calls], "tool"
            if len(set(open_calls)) < len(open_calls):
                repeated = sorted({call_id for call_id in open_calls if open_calls.count(call_id) > 1})
                raise BadRow("duplicate_tool_call_id", f"turn {index} makes several calls with id "
                                                       f"{', '.join(map(repr, repeated))}")
        else:
            expected = "assistant" if role == "user" else "user"
    last = speakers[-1][1]
    if expected == "tool" and last.role == "tool":
        raise BadRow("unanswered_tool_call", f"tool call(s) {', '.join(open_calls)} have no result")
    if need_assistant and last.role != "assistant":
        raise BadRow("no_assistant_turn" if len(speakers) == 1 else "wrong_role_order",
                     "conversation does not end with an assistant turn")


# --- repairs -----------------------------------------------------------------------------------------
# Real dumps break the strict order in a few known ways: public ShareGPT dumps cut long chats into chunks
# (a chunk may start with the assistant or end with an unanswered user turn), scrapers lose turns (empty
# turns, two turns of one speaker in a row), and some logs put a system turn in the middle. Each rule fixes
# one of them; a rule set to "skip" leaves the row to be skipped, as it was before repairs existed.

TURN_SEPARATOR = "\n\n"  # between the texts of merged turns: each stays its own paragraph


@dataclass(frozen=True, slots=True)
class RepairRules:
    """The policy of each repair rule (recipe ``sources[].repair``; schemas/recipe.schema.json documents them)."""

    leading_assistant: Literal["drop", "skip"] = "drop"
    consecutive_turns: Literal["merge", "split", "skip"] = "merge"
    trailing_user: Literal["trim", "skip"] = "trim"  # (replay rows only: a prompt's last user turn is the one answered)
    empty_turns: Literal["drop", "skip"] = "drop"  # (applied by the reader, which sees the turns one by one)
    mid_system: Literal["keep", "move", "drop", "skip"] = "keep"


def repair_flag(rule: str, policy: str) -> str:
    return f"{REPAIR_FLAG_PREFIX}{rule}:{policy}"


@dataclass(slots=True)
class RepairedTurns:
    """One conversation a row's turns make after the repairs, and the flags of the rules that changed it."""

    messages: list[Message]
    flags: list[str]


def repair_turns(messages: list[Message], rules: RepairRules, *, replay: bool) -> list[RepairedTurns]:
    """The valid conversations left after the repairs: one, several (``consecutive_turns: split``) or none.

    ``split`` cuts the row first; then each part goes through the rules of ``_PART_REPAIRS`` in their
    order, each on what the one before left. A part that still breaks the order (a rule set to skip) or
    holds no exchange is left out. System turns never count as a speaker's turn: two user turns with a
    system turn between them are consecutive.
    """
    parts = [messages]
    split_flags: list[str] = []
    if rules.consecutive_turns == "split":
        parts = _split_at_repeated_speaker(messages)
        if len(parts) > 1:
            split_flags.append(repair_flag("consecutive_turns", "split"))
    repaired = []
    for part in parts:
        flags = list(split_flags)
        for (rule, policy), repair in _PART_REPAIRS.items():
            if getattr(rules, rule) != policy or (rule in _REPLAY_ONLY and not replay):
                continue
            changed = repair(part)
            if changed is not None:
                part = changed
                flags.append(repair_flag(rule, policy))
        try:
            check_role_order(part, need_assistant=replay, mid_system=rules.mid_system == "keep")
        except BadRow:
            continue
        repaired.append(RepairedTurns(part, flags))
    return repaired


def _is_speaker(message: Message) -> bool:
    """User, assistant and tool turns speak; system turns do not (they never separate two turns of a speaker).
    A tool turn separates the assistant turn that called it from the one that answers with its result."""
    return message.role != "system"


def _repeats(message: Message, previous: Message | None) -> bool:
    """A user or assistant turn right after a turn of its own speaker (tool results of parallel calls follow
    each other by design). Never the turn after one that calls tools: what follows a call is its results, so an
    assistant turn there leaves the call unanswered (``unanswered_tool_call``), not said twice; merged, the
    answer would come before the call."""
    return (previous is not None and message.role == previous.role and message.role != "tool"
            and not previous.tool_calls)


def _join(first: Message, second: Message) -> Message:
    reasoning = [text for text in (first.reasoning, second.reasoning) if text]
    return Message(first.role, TURN_SEPARATOR.join(text for text in (first.content, second.content) if text),
                   TURN_SEPARATOR.join(reasoning) or None, first.tool_calls + second.tool_calls)


def _split_at_repeated_speaker(turns: list[Message]) -> list[list[Message]]:
    """Cut before each user/assistant turn whose speaker also spoke the turn before; the system turns
    between the two open the new part (they came before the turn they preceded)."""
    parts: list[list[Message]] = [[]]
    previous: Message | None = None
    for message in turns:
        if _is_speaker(message):
            if _repeats(message, previous):
                current = parts[-1]
                cut = len(current)
                while not _is_speaker(current[cut - 1]):
                    cut -= 1
                parts.append(current[cut:])
                del current[cut:]
            previous = message
        parts[-1].append(message)
    return parts


def _drop_leading_assistant(turns: list[Message]) -> list[Message] | None:
    """Assistant turns before the first user turn answer a prompt the chunk does not hold (and tool turns there
    answer calls it does not hold)."""
    first_user = next((index for index, message in enumerate(turns) if message.role == "user"), len(turns))
    kept = [message for index, message in enumerate(turns)
            if index >= first_user or message.role not in ("assistant", "tool")]
    return kept if len(kept) < len(turns) else None


def _merge_repeated_speaker(turns: list[Message]) -> list[Message] | None:
    """Consecutive turns of one speaker become one turn (texts joined by a blank line). The merged turn takes
    the later turn's place, so a system turn between the two stays ahead of the text it preceded."""
    merged: list[Message] = []
    last_speaker: int | None = None  # index in merged of the latest user/assistant turn
    for message in turns:
        if _is_speaker(message):
            if last_speaker is not None and _repeats(message, merged[last_speaker]):
                message = _join(merged.pop(last_speaker), message)
            last_speaker = len(merged)
        merged.append(message)
    return merged if len(merged) < len(turns) else None


def _mid_system_indices(turns: list[Message]) -> list[int]:
    return [index for index, message in enumerate(turns) if index > 0 and message.role == "system"]


def _keep_mid_system(turns: list[Message]) -> list[Message] | None:
    """Kept where they are (the order check then lets them through): only the flag records them."""
    return turns if _mid_system_indices(turns) else None


def _drop_mid_system(turns: list[Message]) -> list[Message] | None:
    """For a target or trainer that takes a system turn only first (SpecForge's rules)."""
    mid = set(_mid_system_indices(turns))
    return [message for index, message in enumerate(turns) if index not in mid] if mid else None


def _move_mid_system(turns: list[Message]) -> list[Message] | None:
    """Joined, in order, into the leading system turn (made when there is none)."""
    mid = set(_mid_system_indices(turns))
    if not mid:
        return None
    rest = [message for index, message in enumerate(turns) if index not in mid]
    leading = rest.pop(0) if rest[0].role == "system" else Message("system", "")
    for index in sorted(mid):
        leading = _join(leading, turns[index])
    return [leading, *rest]


def trim_after_last_answer(turns: list[Message]) -> list[Message] | None:
    """The turns after the last answer, when they hold a user turn left without one (or tool results the row
    holds no answer to): nothing learns from them (speculators makes a sample per assistant turn; FastChat
    masks everything but the answers)."""
    last_answer = max((index for index, message in enumerate(turns) if message.role == "assistant"), default=-1)
    tail = turns[last_answer + 1:]
    return turns[:last_answer + 1] if any(message.role in ("user", "tool") for message in tail) else None


# (rule, policy) -> the repair, in the order they run on each part; None from a repair: nothing to repair.
_PART_REPAIRS: dict[tuple[str, str], Callable[[list[Message]], list[Message] | None]] = {
    ("leading_assistant", "drop"): _drop_leading_assistant,
    # before the merge and the placing: turns it cuts off are neither merged nor placed
    ("trailing_user", "trim"): trim_after_last_answer,
    ("consecutive_turns", "merge"): _merge_repeated_speaker,
    ("mid_system", "keep"): _keep_mid_system,
    ("mid_system", "move"): _move_mid_system,
    ("mid_system", "drop"): _drop_mid_system,
}
_REPLAY_ONLY = frozenset({"trailing_user"})  # a prompt's last user turn is the one the target answers


def _turn_key(message: Message) -> tuple[object, ...]:
    plain = (message.role, message.content, message.reasoning)
    if not message.tool_calls and message.tool_call_id is None:
        return plain  # the key of a turn without tool traffic is what it was before tools existed
    return (*plain, [(call.id, call.name, call.arguments) for call in message.tool_calls], message.tool_call_id)


def content_key(messages: Sequence[Message], tools: Sequence[object] | None = None) -> bytes:
    """Canonical bytes of a conversation's turns (roles, content, reasoning, tool calls and results) and of
    the tools it was served with."""
    turns = [_turn_key(m) for m in messages]
    return orjson.dumps([turns, tools] if tools else turns, option=orjson.OPT_SORT_KEYS)


def content_digest(messages: Sequence[Message], tools: Sequence[object] | None = None) -> bytes:
    """sha256 of the canonical turns and tools: the basis of ids."""
    return hashlib.sha256(content_key(messages, tools)).digest()


def conversation_id(source: str, messages: Sequence[Message], salt: str = "",
                    tools: Sequence[object] | None = None) -> str:
    """Stable id: it depends on the source name, the turns and the tools, never on input order or position."""
    digest = content_digest(messages, tools)
    return hashlib.sha256(b"corpus-conv\0%s\0%s\0%s" % (source.encode(), salt.encode(), digest)).hexdigest()[:20]
