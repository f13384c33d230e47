"""The tool-result policy of prompts with tool traffic: when a recorded tool result may follow a regenerated call.

A prompt's recorded conversation holds the calls the model made then and the results its tools returned. When
the target regenerates a turn, a recorded result is only true for the same call: the same function with the same
arguments, compared as parsed JSON (key order and spacing do not matter; arguments that are not a JSON object
never match). Parallel calls match as a set: each regenerated call pairs with an equal recorded one, in any order.

Regenerated calls are what a model emitted, so nothing here trusts them: ``invalid_calls`` names the calls that
call no tool of the row or whose arguments do not fit the tool's parameter schema (the row is flagged, not
dropped: it is still what the target does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..records import ToolCall, parameters_validator


def pair_calls(generated: Sequence[ToolCall], recorded: Sequence[ToolCall]) -> dict[str, str] | None:
    """Recorded call id -> the id of the regenerated call that makes the same call, when every regenerated call
    has its recorded twin and none is left over; None otherwise."""
    if len(generated) != len(recorded) or not generated:
        return None
    unpaired = list(recorded)
    pairs: dict[str, str] = {}
    for call in generated:
        arguments = call.arguments_object()
        twin = next((old for old in unpaired if arguments is not None and old.name == call.name
                     and old.arguments_object() == arguments), None)
        if twin is None:
            return None
        unpaired.remove(twin)
        pairs[twin.id] = call.id
    return pairs


def invalid_calls(calls: Sequence[ToolCall], tools: Sequence[dict[str, Any]] | None) -> list[str]:
    """The calls that name no tool of ``tools`` or whose arguments are not an object fitting the tool's
    ``parameters``. A schema that cannot be checked (invalid, or a ``$ref`` that does not resolve here: nothing
    is fetched) is not held against the call."""
    import jsonschema
    import referencing.exceptions

    functions = {tool["function"]["name"]: tool["function"] for tool in tools or ()}
    invalid = []
    for call in calls:
        function = functions.get(call.name)
        arguments = call.arguments_object()
        if function is None or arguments is None:
            invalid.append(call.name)
            continue
        schema = function.get("parameters")
        if not schema:
            continue
        try:
            validator = parameters_validator(schema)
            if validator is None:
                continue
            fits = next(validator.iter_errors(arguments), None) is None
        except (jsonschema.exceptions.SchemaError, referencing.exceptions.Unresolvable):
            continue
        if not fits:
            invalid.append(call.name)
    return invalid


def describe(calls: Sequence[ToolCall]) -> str:
    """Calls as a person reads them: name(arguments), arguments cut short."""
    return ", ".join(f"{call.name}({call.arguments[:80]})" for call in calls)
