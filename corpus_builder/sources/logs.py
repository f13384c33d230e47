"""Captured serving traffic: one logged chat-completions exchange (a request and the answer served to it) -> turns.

Teams capture their target's traffic at a gateway or a tracing tool, one record per request. The shapes read here
(field names from the projects' own code; a value that is a JSON string, as some exports write them, is decoded):

- **nested**: ``{"request": {"model", "messages", "chat_template_kwargs", "temperature", ...}, "response": {"choices":
  [{"message": {...}, "finish_reason"}], "usage", "model"}}``; the request may also be ``request_body`` (Helicone's
  ``request_body``/``response_body``), ``proxy_server_request`` (LiteLLM's SpendLogs, whose ``messages`` column is
  empty) or ``body``;
- **flat**: ``messages`` beside ``response`` (a chat completion), ``choices`` or ``output`` (LiteLLM's
  ``StandardLoggingPayload``: ``messages``, ``response``, ``model_parameters``, ``model``);
- **Langfuse** generations (the public API's camelCase or the blob export's snake_case): ``input`` (the messages,
  or ``{"messages", "tools"}``), ``output`` (the answer message, or its text when the call streamed),
  ``modelParameters``/``model_parameters``, ``model``/``provided_model_name``, ``sessionId``/``session_id``.

The answer becomes the last assistant turn, with its reasoning (``reasoning_content`` or ``reasoning``), tool calls
and ``finish_reason``; OpenAI's content parts (``[{"type": "text", "text"}]``) are joined as vLLM joins them. What
the request says of how it was served travels with the row (``LoggedExchange.served``): thinking on or off (the
template flag ``chat_template_kwargs.enable_thinking``, else ``reasoning_effort``, else a ``/think`` or ``/no_think``
switch ending the last user turn), the sampling settings, the model, the finish reason and the usage.

The commonest shape (the nested one with no session field) is scanned natively (``scan_line``: msgspec, the turns and
the answer decoded into records, the rest skipped), so a request the fold drops never becomes a parsed row; any other
line is parsed whole and read here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

import msgspec
import orjson

from ..errors import BadRow
from ..records import Served
from .readers import decode_lines

# Where a record keeps the request body, and the answer served to it, in the order they are looked for.
REQUEST_FIELDS = ("request", "request_body", "proxy_server_request", "body")
RESPONSE_FIELDS = ("response", "response_body", "output", "choices")
LANGFUSE_INPUT = "input"
# The request fields that say how a request was sampled (kept as sent; unset ones fell back to the server's).
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "max_completion_tokens", "n", "seed",
                   "presence_penalty", "frequency_penalty", "repetition_penalty", "stop")
PARAMETER_FIELDS = ("model_parameters", "modelParameters")  # LiteLLM's and Langfuse's copy of them
MODEL_FIELDS = ("model", "provided_model_name", "request_model", "model_group")
SESSION_FIELDS = ("session_id", "sessionId", "conversation_id")
HELICONE_SESSION = "Helicone-Session-Id"
THINK_SWITCHES = (("/no_think", False), ("/think", True))  # Qwen-style soft switches at a user turn's end
NO_ANSWER = "no_answer"
_ANSWER_KEYS = frozenset({"content", "tool_calls", "function_call", "reasoning_content", "reasoning"})
_SESSION_HOLDERS = frozenset({*SESSION_FIELDS, "metadata", "request_properties"})  # where a session id may be
_DETAIL_CHARS = 80

JsonObject = dict[str, object]  # a JSON object as parsed: its values narrowed with isinstance where read


@dataclass(slots=True)
class LoggedExchange:
    """One logged request with its answer: ``messages`` as the request sent them, ``answer`` as an assistant turn;
    ``session`` is the conversation id the log gives (None: the fold matches on the turns alone). The turns in the
    messages form the readers take (``turns``) and how it was served (``served``) are made when the row is kept,
    not for every request."""

    row: JsonObject
    request: JsonObject
    messages: list[object]
    answer: JsonObject
    tools: object
    finish_reason: str | None
    completion: JsonObject | None  # the chat completion the answer came in, where the log keeps one
    session: str | None

    def turns(self) -> list[object]:
        """The request's messages then the answer, OpenAI's content parts joined (``_text_parts``)."""
        return [*map(_text_parts, self.messages), self.answer]

    def model(self) -> str | None:
        """The model the request was sent to (else the one the response names)."""
        found = _first_text(self.request, MODEL_FIELDS) or _first_text(self.row, MODEL_FIELDS)
        if found is None and self.completion is not None:
            model = self.completion.get("model")
            return model if isinstance(model, str) else None
        return found

    def served(self) -> Served:
        """How the request was served (a row's provenance): thinking, model, sampling, finish reason, usage."""
        request, row = self.request, self.row
        parameters = _parameters(row)
        sampling = {name: value for name in SAMPLING_FIELDS
                    if (value := request.get(name, parameters.get(name))) is not None}
        effort = request.get("reasoning_effort", parameters.get("reasoning_effort"))
        usage = row.get("usage", row.get("usageDetails", row.get("usage_details")))
        if self.completion is not None:
            usage = self.completion.get("usage", usage)
        return Served(_thinking(request, parameters, self.messages), self.model(), sampling, self.finish_reason,
                      effort if isinstance(effort, str) else None,
                      {key: value for key, value in usage.items() if isinstance(value, int)}
                      if isinstance(usage, dict) else None)


def is_log_row(row: Mapping[str, object]) -> bool:
    """Whether a row is a logged exchange of one of the shapes above (the readers' ``auto`` layout asks first:
    a flat log row has a ``messages`` list too)."""
    if any(_request_body(row.get(name)) is not None for name in REQUEST_FIELDS if name in row):
        return True
    if isinstance(row.get("messages"), list):
        return any(name in row for name in RESPONSE_FIELDS)
    return LANGFUSE_INPUT in row and "output" in row


def read_exchange(row: JsonObject) -> LoggedExchange:
    """The exchange a log row records; BadRow when it holds no request messages or no answer."""
    request = None
    for name in REQUEST_FIELDS:
        if name in row:
            request = _request_body(row[name])
            if request is not None:
                break
    tools: object = None
    if request is None:
        request = row
        messages = row.get("messages")
        if not isinstance(messages, list) and LANGFUSE_INPUT in row:
            messages = _decoded(row[LANGFUSE_INPUT])
            if isinstance(messages, dict):  # Langfuse's {"messages", "tools"} when the call sent tools
                tools = messages.get("tools")
                messages = messages.get("messages")
    else:
        messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRow("bad_messages", "the logged request has no list of messages")
    if tools is None:
        tools = request.get("tools", row.get("tools"))  # the request's, else the record's (one dict when flat)
    answer, finish_reason, completion = _answer(row)
    return LoggedExchange(row, request, messages, answer, tools, finish_reason, completion, _session(row, request))


def _decoded(value: object) -> object:
    """A field some exports write as JSON text (LiteLLM's SpendLogs, Langfuse's blob export), decoded."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _request_body(value: object) -> JsonObject | None:
    body = _decoded(value)
    if not isinstance(body, dict):
        return None
    messages = body.get("messages")
    return body if isinstance(messages, list) and messages else None


def _answer(row: JsonObject) -> tuple[JsonObject, str | None, JsonObject | None]:
    """The answer turn, its finish reason, and the chat completion it came in (None: the log keeps the answer
    alone)."""
    response: object = None
    for name in RESPONSE_FIELDS:
        value = row.get(name)
        if value is not None:
            response = _decoded(value)
            break
    completion = None
    # the record's finish reason (Langfuse keeps a streamed call's in its metadata), unless the choice has one
    finish_reason = row["finish_reason"] if "finish_reason" in row else _metadata(row).get("finish_reason")
    if type(response) is dict and "status_code" in response and isinstance(response.get("body"), dict):
        response = response["body"]  # a batch-style wrapper: {status_code, body: chat.completion}
    if type(response) is dict and "choices" in response:
        completion = response
        response = response["choices"]
    if isinstance(response, list):  # choices, or Langfuse's answers of an n > 1 call: the first is the answer
        if not response:
            raise BadRow(NO_ANSWER, "the response has no choices")
        response = response[0]
        if isinstance(response, dict) and ("message" in response or "finish_reason" in response):
            finish_reason = response.get("finish_reason", finish_reason)
            response = response["message"] if "message" in response else response.get("delta")
    answer = _answer_turn(response)
    if answer is None:
        error = row.get("error", row.get("error_str"))
        detail = ("the response holds no answer message" if error is None
                  else f"error: {str(error)[:_DETAIL_CHARS]}")
        raise BadRow(NO_ANSWER, detail)
    return answer, finish_reason if isinstance(finish_reason, str) else None, completion


def _answer_turn(response: object, *, owned: bool = False) -> JsonObject | None:
    """The answer as an assistant turn (None: the response holds none): a streamed call's text alone (as Langfuse
    keeps it) becomes its content, content parts are joined, null fields left out, an absent text made empty.
    ``owned``: the response was parsed for this alone, so it may become the turn itself (the same keys, in order)."""
    if isinstance(response, str):
        response = {"content": response}
    if not isinstance(response, dict) or _ANSWER_KEYS.isdisjoint(response):
        return None
    if isinstance(response.get("content"), list):
        response = _joined(response)
    if owned and None not in response.values():
        answer = response
    else:
        answer = {key: value for key, value in response.items() if value is not None}
    answer["role"] = "assistant"
    if answer.get("content") is None:  # only reasoning (cut inside it) or only calls: an empty answer text
        answer["content"] = ""
    return answer


def _text_parts(turn: object) -> object:
    """A turn whose content is OpenAI's list of parts, with the text parts joined by newlines (as vLLM renders
    them); any other part (an image) leaves the list for the readers to refuse."""
    return _joined(turn) if isinstance(turn, dict) else turn


def _joined(turn: JsonObject) -> JsonObject:
    content = turn.get("content")
    if isinstance(content, list) and all(isinstance(part, dict) and part.get("type") == "text"
                                         and isinstance(part.get("text"), str) for part in content):
        return {**turn, "content": "\n".join(part["text"] for part in content)}
    return turn


def _parameters(row: JsonObject) -> JsonObject:
    for name in PARAMETER_FIELDS:
        value = _decoded(row.get(name))
        if isinstance(value, dict):
            return value
    return {}


def _metadata(row: JsonObject) -> JsonObject:
    value = _decoded(row.get("metadata"))
    return value if isinstance(value, dict) else {}


def _thinking(request: JsonObject, parameters: JsonObject, messages: list[object]) -> bool | None:
    """Thinking as served: the template flag, else the reasoning effort, else a switch ending the last user turn;
    None when the record does not say (the template's default applied)."""
    for holder in (request, parameters):
        kwargs = _decoded(holder.get("chat_template_kwargs"))
        for value in ((kwargs.get("enable_thinking"), kwargs.get("thinking")) if isinstance(kwargs, dict) else ()):
            if isinstance(value, bool):
                return value
        flag = holder.get("enable_thinking")
        if isinstance(flag, bool):
            return flag
    effort = request.get("reasoning_effort", parameters.get("reasoning_effort"))
    if isinstance(effort, str):
        return effort != "none"
    last_user = next((turn for turn in reversed(messages) if isinstance(turn, dict) and turn.get("role") == "user"),
                     None)
    joined = _text_parts(last_user)
    text = joined.get("content") if isinstance(joined, dict) else None
    if isinstance(text, str):
        ending = text.rstrip()
        for switch, mode in THINK_SWITCHES:
            if ending.endswith(switch):
                return mode
    return None


def _first_text(holder: JsonObject, names: tuple[str, ...]) -> str | None:
    for name in names:
        value = holder.get(name)
        if value and isinstance(value, str):
            return value
    return None


def _session_id(holder: Mapping[str, object], names: tuple[str, ...]) -> str | None:
    """The first of ``names`` that holds an id: a non-empty string, or an integer (logs that number their sessions;
    0 is one), as its text."""
    for name in names:
        value = holder.get(name)
        if type(value) is int:  # not a bool: ``type`` is exact
            return str(value)
        if value and isinstance(value, str):
            return value
    return None


def _session(row: JsonObject, request: JsonObject) -> str | None:
    """The conversation id the log records: a session field on the record, in its metadata or in the request's,
    or Helicone's session header."""
    if _SESSION_HOLDERS.isdisjoint(row) and _SESSION_HOLDERS.isdisjoint(request):
        return None  # the log records none (most logs): nothing to look through
    for holder in (row, request):
        found = _session_id(holder, SESSION_FIELDS)
        if found is not None:
            return found
        if "metadata" in holder:
            found = _session_id(_metadata(holder), SESSION_FIELDS)
            if found is not None:
                return found
    properties = row.get("request_properties")
    return _session_id(properties, (HELICONE_SESSION,)) if isinstance(properties, dict) else None


# --- the native scan of the commonest shape -----------------------------------------------------------------------
# Each line of a log the fold reads is first scanned into these records (msgspec, in C): the nested shape, its turns
# and its answer as records. A field typed ``None`` is one that ``read_exchange`` reads when it holds a value (a
# session, the record's own finish reason), and a field typed ``UnsetType`` one it reads when present: a line with
# such a value, or of another shape, or with a value of another type, fails the scan and is parsed whole and read by
# ``read_exchange``, whose rules these follow for what they take.


class Turn(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """A history turn as the fold compares it (``sources.fold``): a record of its fields, whatever their order in the
    line; a field the log leaves out is not one it writes as null. A turn with any other field is no ``Turn``."""

    role: str
    content: str | msgspec.UnsetType | None = msgspec.UNSET
    name: str | msgspec.UnsetType = msgspec.UNSET
    tool_call_id: str | msgspec.UnsetType = msgspec.UNSET


_NoCalls = Annotated[list[msgspec.Raw], msgspec.Meta(max_length=0)]  # an answer with calls is read whole
_SomeOf = msgspec.Meta(min_length=1)  # a request without turns, or a response without choices, is read whole


class ScannedAnswer(msgspec.Struct, gc=False):
    """The answer of a scanned request: what the fold compares (its text) and carries (its reasoning). Calls are left
    to the whole read (``tool_calls`` must be empty); the answer's other fields are read only if the fold keeps it."""

    content: str | msgspec.UnsetType | None = msgspec.UNSET
    reasoning: str | msgspec.UnsetType | None = msgspec.UNSET
    reasoning_content: str | msgspec.UnsetType | None = msgspec.UNSET
    thinking: str | msgspec.UnsetType | None = msgspec.UNSET
    tool_calls: _NoCalls | msgspec.UnsetType | None = msgspec.UNSET
    function_call: msgspec.UnsetType | None = msgspec.UNSET

    def is_answer(self) -> bool:
        """Whether ``read_exchange`` finds an answer here (one of ``_ANSWER_KEYS`` present; a call is no scan's)."""
        present = (self.content, self.reasoning, self.reasoning_content, self.tool_calls, self.function_call)
        return any(value is not msgspec.UNSET for value in present)


class _Sessionless(msgspec.Struct, gc=False, kw_only=True):
    """The fields where a record or its request may name a session (``_SESSION_HOLDERS``): null or absent."""

    session_id: None = None
    sessionId: None = None
    conversation_id: None = None
    metadata: None = None
    request_properties: None = None


class _Body(_Sessionless, kw_only=True):
    messages: Annotated[list[Turn], _SomeOf]


class _Choice(msgspec.Struct, gc=False):
    message: ScannedAnswer
    finish_reason: str | None = None


class _Completion(msgspec.Struct, gc=False):
    choices: Annotated[list[_Choice], _SomeOf]
    status_code: msgspec.UnsetType = msgspec.UNSET  # a batch-style wrapper


class _Nested(_Sessionless, kw_only=True):
    request: _Body
    response: _Completion
    finish_reason: None = None


_SCAN = msgspec.json.Decoder(_Nested)


class ScannedExchange(msgspec.Struct, gc=False):
    """A logged request of the nested shape, scanned: its line (read whole by ``exchange`` when the fold keeps it),
    its history's turns and its answer as records. Such a line names no session."""

    line: bytes
    turns: list[Turn]  # emptied once the fold has keyed them: an open chat holds its line and answer only
    answer: ScannedAnswer
    finish_reason: str | None
    turn_count: int  # how many turns its history holds

    def row(self) -> object:
        """The line parsed as the readers parse a line (a ``BadRow`` for the rare line msgspec scans and orjson
        refuses: an infinite number in a field the scan skips)."""
        try:
            row: object = orjson.loads(self.line)
        except orjson.JSONDecodeError:
            return next(decode_lines((self.line,)))
        return row

    def exchange(self) -> LoggedExchange:
        row = self.row()
        if isinstance(row, BadRow):
            raise row
        assert isinstance(row, dict)  # the scan read an object
        return read_exchange(row)


def scan_line(line: bytes) -> ScannedExchange | object:
    """A log line as the fold reads it: scanned (``ScannedExchange``) when it is of the nested shape with no session,
    a request with messages and an answer without calls; else the line parsed (orjson, as the readers parse a line;
    it raises on invalid JSON as they expect)."""
    try:
        nested = _SCAN.decode(line)
    except msgspec.DecodeError:
        pass
    else:
        choice, turns = nested.response.choices[0], nested.request.messages
        answer = choice.message
        # The line must parse as the readers parse it: orjson refuses what msgspec skips unread (invalid UTF-8).
        if (answer.content is not msgspec.UNSET or answer.is_answer()) and (line.isascii() or _utf8(line)):
            return ScannedExchange(line, turns, answer, choice.finish_reason, len(turns))
    parsed: object = orjson.loads(line)
    return parsed


def _utf8(line: bytes) -> bool:
    try:
        line.decode()
    except UnicodeDecodeError:
        return False
    return True
