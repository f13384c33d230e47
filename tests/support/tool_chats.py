"""Tool-calling conversations as serving logs write them (OpenAI chat messages) and as glaive/LLaMA-Factory
ShareGPT dumps do, shared by the tool-traffic tests."""

from __future__ import annotations

from typing import Any

import orjson


def tool(name: str, description: str | None = None, **properties: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI tool whose arguments are ``properties``, all required, nothing else allowed."""
    function: dict[str, Any] = {"name": name, "parameters": {
        "type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}}
    if description is not None:
        function["description"] = description
    return {"type": "function", "function": function}


WEATHER = tool("get_weather", "Current weather of a city", city={"type": "string"})
TIME = tool("get_time", "Local time of a city", city={"type": "string"})
SEARCH = tool("search", None, query={"type": "string"})  # no description: the served shape makes it null


def call(call_id: str, name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def result(call_id: str, content: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id,
            "content": content if isinstance(content, str) else orjson.dumps(content).decode()}


def calling(*calls: dict[str, Any], content: str | None = None, reasoning: str | None = None) -> dict[str, Any]:
    """An assistant turn that calls tools; OpenAI logs write ``content: null`` when it says nothing."""
    turn: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": list(calls)}
    if reasoning is not None:
        turn["reasoning_content"] = reasoning
    return turn


def say(role: str, content: str, reasoning: str | None = None) -> dict[str, Any]:
    turn = {"role": role, "content": content}
    if reasoning is not None:
        turn["reasoning_content"] = reasoning
    return turn


def log_rows() -> list[dict[str, Any]]:
    """Four logged conversations: one call; parallel calls answered out of order, then a second exchange; a
    row logged before its call's result came back; and a chat without tools."""
    return [
        {"id": "one-call", "tools": [WEATHER], "messages": [
            say("user", "What is the weather in Paris?"),
            calling(call("call_p", "get_weather", {"city": "Paris"}), reasoning="I should look it up."),
            result("call_p", {"temp_c": 21, "sky": "clear"}),
            say("assistant", "It is 21 °C and clear in Paris.", "The tool says 21 and clear."),
        ]},
        {"id": "parallel", "tools": [WEATHER, TIME], "messages": [
            say("system", "You answer travel questions."),
            say("user", "Weather and local time in Rome?"),
            calling(call("call_w", "get_weather", {"city": "Rome"}), call("call_t", "get_time", {"city": "Rome"}),
                    content="Let me check both.", reasoning="Two tools, one question."),
            result("call_t", "14:05"),
            result("call_w", {"temp_c": 25}),
            say("assistant", "25 °C, and it is 14:05 there.", "Both results are in."),
            say("user", "And in Oslo?"),
            calling(call("call_o", "get_weather", {"city": "Oslo"})),
            result("call_o", {"temp_c": 3}),
            say("assistant", "3 °C in Oslo."),
        ]},
        {"id": "unanswered", "tools": [SEARCH], "messages": [
            say("user", "Find the opening hours of the Louvre."),
            calling(call("call_s", "search", {"query": "Louvre opening hours"})),
        ]},
        {"id": "plain", "messages": [say("user", "Say hi."), say("assistant", "Hi!")]},
    ]


def glaive_rows() -> list[dict[str, Any]]:
    """The same kind of traffic as glaive-function-calling / LLaMA-Factory ShareGPT dumps keep it: bare function
    schemas as a JSON string, calls and results as their own turns, no ids; parallel calls as a list with
    their results in one observation."""
    functions = orjson.dumps([WEATHER["function"], TIME["function"]]).decode()
    return [
        {"tools": functions, "conversations": [
            {"from": "human", "value": "Weather in Paris?"},
            {"from": "function_call", "value": orjson.dumps({"name": "get_weather",
                                                             "arguments": {"city": "Paris"}}).decode()},
            {"from": "observation", "value": '{"temp_c": 21}'},
            {"from": "gpt", "value": "21 °C."},
        ]},
        {"tools": functions, "conversations": [
            {"from": "human", "value": "Weather and time in Rome?"},
            {"from": "function_call", "value": orjson.dumps([
                {"name": "get_weather", "arguments": {"city": "Rome"}},
                {"name": "get_time", "arguments": {"city": "Rome"}}]).decode()},
            {"from": "observation", "value": orjson.dumps(['{"temp_c": 25}', "14:05"]).decode()},
            {"from": "gpt", "value": "25 °C at 14:05."},
        ]},
    ]
