"""Serving traffic as gateways and tracing tools capture it: a conversation logged once per request, each request
repeating the history (without the answers' reasoning, as OpenAI clients send it back), in every shape the readers
take (field names from each project's own code: see corpus_builder/sources/logs.py)."""

from __future__ import annotations

from typing import Any

import orjson

# The shapes a logged exchange comes in.
SHAPES = ("nested", "helicone", "litellm_payload", "litellm_spend_logs", "langfuse_api", "langfuse_export",
          "flat_choices", "flat_output")
REASONING = ("reasoning_content", "reasoning", "thinking")


def exchanges(messages: list[dict[str, Any]]) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """Each request of a conversation and the answer it got: the turns before each assistant turn (earlier answers
    without their reasoning, as a client sends the history back) and that turn."""
    logged = []
    for index, turn in enumerate(messages):
        if turn["role"] == "assistant":
            history = [{key: value for key, value in earlier.items() if key not in REASONING}
                       for earlier in messages[:index]]
            logged.append((history, turn))
    return logged


def _completion(answer: dict[str, Any], finish_reason: str, model: str) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": answer, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}


def log_row(shape: str, history: list[dict[str, Any]], answer: dict[str, Any], *, model: str = "tiny/target",
            thinking: bool | None = True, session: str | int | None = None, tools: list[dict[str, Any]] | None = None,
            finish_reason: str = "stop", temperature: float = 0.6) -> dict[str, Any]:
    """One logged exchange in ``shape``."""
    request: dict[str, Any] = {"model": model, "messages": history, "temperature": temperature}
    if thinking is not None:
        request["chat_template_kwargs"] = {"enable_thinking": thinking}
    if tools:
        request["tools"] = tools
    completion = _completion(answer, finish_reason, model)
    row: dict[str, Any]
    if shape == "nested":
        row = {"request": request, "response": completion}
    elif shape == "helicone":
        row = {"request_id": "h1", "request_body": request, "response_body": completion, "request_model": model}
        if session is not None:
            row["request_properties"] = {"Helicone-Session-Id": session}
        return row
    elif shape == "litellm_payload":  # StandardLoggingPayload: the parameters apart, chat_template_kwargs dropped
        parameters: dict[str, Any] = {"temperature": temperature}
        if tools:
            parameters["tools"] = tools
        if thinking is not None:
            parameters["reasoning_effort"] = "medium" if thinking else "none"
        row = {"id": "chatcmpl-1", "call_type": "acompletion", "model": model, "messages": history,
               "response": completion, "model_parameters": parameters, "status": "success"}
    elif shape == "litellm_spend_logs":  # the request body and the response as JSON text; messages left empty
        row = {"request_id": "chatcmpl-1", "model": model, "messages": "{}",
               "proxy_server_request": orjson.dumps(request).decode(), "response": orjson.dumps(completion).decode()}
    elif shape in ("langfuse_api", "langfuse_export"):
        sent: Any = {"messages": history, "tools": tools} if tools else history
        output = {key: value for key, value in answer.items() if key not in REASONING}  # Langfuse keeps none
        parameters = {"temperature": temperature, "max_tokens": 512}
        if shape == "langfuse_api":
            row = {"id": "obs1", "traceId": "t1", "type": "GENERATION", "model": model, "modelParameters": parameters,
                   "input": sent, "output": output, "usageDetails": {"input": 11, "output": 7, "total": 18}}
        else:
            row = {"id": "obs1", "trace_id": "t1", "type": "GENERATION", "provided_model_name": model,
                   "model_parameters": orjson.dumps(parameters).decode(), "input": orjson.dumps(sent).decode(),
                   "output": orjson.dumps(output).decode(), "usage_details": {"input": 11, "output": 7}}
        if session is not None:  # Langfuse records neither the reasoning nor the template flag
            row["session_id" if shape == "langfuse_export" else "sessionId"] = session
        return row
    elif shape == "flat_choices":
        row = {**request, "choices": completion["choices"], "usage": completion["usage"]}
    elif shape == "flat_output":
        row = {**request, "output": answer, "finish_reason": finish_reason}
    else:
        raise ValueError(shape)
    if session is not None:
        row["session_id"] = session
    return row


def logged_conversation(shape: str, conversation: dict[str, Any], *, session: str | int | None = None,
                        thinking: bool | None = True, model: str = "tiny/target") -> list[dict[str, Any]]:
    """A conversation row (``messages``, optional ``tools``) as the requests its chat made, in order."""
    return [log_row(shape, history, answer, session=session, thinking=thinking, model=model,
                    tools=conversation.get("tools"))
            for history, answer in exchanges(conversation["messages"])]
