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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import BadRow
from ..records import Served

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


@dataclass(slots=True)
class LoggedExchange:
    """One logged request with its answer: ``messages`` as the request sent them, ``answer`` as an assistant turn;
    ``session`` is the conversation id the log gives (None: the fold matches on the turns alone). The turns in the
    messages form the readers take (``turns``) and how it was served (``served``) are made when the row is kept,
    not for every request."""

    row: dict[str, Any]
    request: dict[str, Any]
    messages: list[Any]
    answer: dict[str, Any]
    tools: Any
    finish_reason: str | None
    completion: dict[str, Any] | None  # the chat completion the answer came in, where the log keeps one
    session: str | None

    def turns(self) -> list[Any]:
        """The request's messages then the answer, OpenAI's content parts joined (``_text_parts``)."""
        return [*map(_text_parts, self.messages), self.answer]

    def model(self) -> str | None:
        """The model the request was sent to (else the one the response names)."""
        found = _first_text(self.request, MODEL_FIELDS) or _first_text(self.row, MODEL_FIELDS)
        if found is None and self.completion is not None and isinstance(self.completion.get("model"), str):
            return str(self.completion["model"])
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


def is_log_row(row: dict[str, Any]) -> bool:
    """Whether a row is a logged exchange of one of the shapes above (the readers' ``auto`` layout asks first:
    a flat log row has a ``messages`` list too)."""
    if any(_request_body(row.get(name)) is not None for name in REQUEST_FIELDS if name in row):
        return True
    if isinstance(row.get("messages"), list):
        return any(name in row for name in RESPONSE_FIELDS)
    return LANGFUSE_INPUT in row and "output" in row


def read_exchange(row: dict[str, Any]) -> LoggedExchange:
    """The exchange a log row records; BadRow when it holds no request messages or no answer."""
    request = None
    for name in REQUEST_FIELDS:
        if name in row:
            request = _request_body(row[name])
            if request is not None:
                break
    tools: Any = None
    if request is None:
        request = row
        messages: Any = row.get("messages")
        if not isinstance(messages, list) and LANGFUSE_INPUT in row:
            messages = _decoded(row[LANGFUSE_INPUT])
            if isinstance(messages, dict):  # Langfuse's {"messages", "tools"} when the call sent tools
                tools = messages.get("tools")
                messages = messages.get("messages")
    else:
        messages = request["messages"]
    if not isinstance(messages, list) or not messages:
        raise BadRow("bad_messages", "the logged request has no list of messages")
    if tools is None:
        tools = request.get("tools", row.get("tools"))  # the request's, else the record's (one dict when flat)
    answer, finish_reason, completion = _answer(row)
    return LoggedExchange(row, request, messages, answer, tools, finish_reason, completion, _session(row, request))


def _decoded(value: Any) -> Any:
    """A field some exports write as JSON text (LiteLLM's SpendLogs, Langfuse's blob export), decoded."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _request_body(value: Any) -> dict[str, Any] | None:
    body = _decoded(value)
    if not isinstance(body, dict):
        return None
    messages = body.get("messages")
    return body if isinstance(messages, list) and messages else None


def _answer(row: dict[str, Any]) -> tuple[dict[str, Any], str | None, dict[str, Any] | None]:
    """The answer turn, its finish reason, and the chat completion it came in (None: the log keeps the answer
    alone)."""
    response: Any = None
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
    if isinstance(response, str):  # a streamed call's answer as Langfuse keeps it: the text alone (its role below)
        response = {"content": response}
    if not isinstance(response, dict) or _ANSWER_KEYS.isdisjoint(response):
        error = row.get("error", row.get("error_str"))
        detail = ("the response holds no answer message" if error is None
                  else f"error: {str(error)[:_DETAIL_CHARS]}")
        raise BadRow(NO_ANSWER, detail)
    if isinstance(response.get("content"), list):
        response = _text_parts(response)
    answer = {key: value for key, value in response.items() if value is not None}
    answer["role"] = "assistant"
    if answer.get("content") is None:  # only reasoning (cut inside it) or only calls: an empty answer text
        answer["content"] = ""
    return answer, finish_reason if isinstance(finish_reason, str) else None, completion


def _text_parts(turn: Any) -> Any:
    """A turn whose content is OpenAI's list of parts, with the text parts joined by newlines (as vLLM renders
    them); any other part (an image) leaves the list for the readers to refuse."""
    if not isinstance(turn, dict):
        return turn
    content = turn.get("content")
    if isinstance(content, list) and all(isinstance(part, dict) and part.get("type") == "text"
                                         and isinstance(part.get("text"), str) for part in content):
        return {**turn, "content": "\n".join(part["text"] for part in content)}
    return turn


def _parameters(row: dict[str, Any]) -> dict[str, Any]:
    for name in PARAMETER_FIELDS:
        value = _decoded(row.get(name))
        if isinstance(value, dict):
            return value
    return {}


def _metadata(row: dict[str, Any]) -> dict[str, Any]:
    value = _decoded(row.get("metadata"))
    return value if isinstance(value, dict) else {}


def _thinking(request: dict[str, Any], parameters: dict[str, Any], messages: list[Any]) -> bool | None:
    """Thinking as served: the template flag, else the reasoning effort, else a switch ending the last user turn;
    None when the record does not say (the template's default applied)."""
    for holder in (request, parameters):
        kwargs = _decoded(holder.get("chat_template_kwargs"))
        for value in ((kwargs.get("enable_thinking"), kwargs.get("thinking")) if isinstance(kwargs, dict) else ()):
            if isinstance(value, bool):
                return value
        if isinstance(holder.get("enable_thinking"), bool):
            return bool(holder["enable_thinking"])
    effort = request.get("reasoning_effort", parameters.get("reasoning_effort"))
    if isinstance(effort, str):
        return effort != "none"
    last_user = next((turn for turn in reversed(messages) if isinstance(turn, dict) and turn.get("role") == "user"),
                     None)
    text = _text_parts(last_user).get("content") if last_user is not None else None
    if isinstance(text, str):
        ending = text.rstrip()
        for switch, mode in THINK_SWITCHES:
            if ending.endswith(switch):
                return mode
    return None


def _first_text(holder: dict[str, Any], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = holder.get(name)
        if value and type(value) is str:
            return value
    return None


def _session_id(holder: dict[str, Any], names: tuple[str, ...]) -> str | None:
    """The first of ``names`` that holds an id: a non-empty string, or an integer (logs that number their sessions;
    0 is one), as its text."""
    for name in names:
        value = holder.get(name)
        if type(value) is int:  # not a bool: ``type`` is exact
            return str(value)
        if value and type(value) is str:
            return value
    return None


def _session(row: dict[str, Any], request: dict[str, Any]) -> str | None:
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
