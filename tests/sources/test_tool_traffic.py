"""Tool traffic as the readers take it: OpenAI chat logs and ShareGPT function-call dumps give the same record
(tools in the served shape, calls with their arguments' text, results linked by id), the role order with tool
turns, the repairs around them, prompts that keep their recorded calls, and the bad shapes skipped by reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.recipe.model import Mapping
from corpus_builder.records import (
    FLAG_INVALID_TOOL_CALL,
    Conversation,
    Message,
    RepairRules,
    ToolCall,
    content_key,
    conversation_id,
)
from corpus_builder.sources import iter_source, mappings
from corpus_builder.sources.mappings import NormalisedRow, RowNormaliser
from tests.sources.test_sources import spec, split, write_lines
from tests.support.tool_chats import (
    SEARCH,
    TIME,
    WEATHER,
    call,
    calling,
    glaive_rows,
    log_rows,
    result,
    say,
)

MERGED, LEADING, TRIMMED = ("repaired:consecutive_turns:merge", "repaired:leading_assistant:drop",
                            "repaired:trailing_user:trim")


def served(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool in the shape vLLM hands the template: description and parameters always present."""
    function = tool["function"]
    return {"type": "function", "function": {"name": function["name"], "description": function.get("description"),
                                             "parameters": function["parameters"]}}


def read_rows(tmp_path: Path, rows: list[dict[str, Any]], kind: str = "replay") -> tuple[list[Conversation], list]:
    write_lines(tmp_path / "rows.jsonl", rows)
    return split(list(iter_source(spec(kind=kind, paths=("rows.jsonl",)), tmp_path)))


def read_turns(tmp_path: Path, turns: list[dict[str, Any]], kind: str = "replay") -> tuple[list[Conversation], list]:
    return read_rows(tmp_path, [{"tools": [WEATHER], "messages": turns}], kind)


def test_openai_logs_keep_tools_calls_and_results(tmp_path: Path) -> None:
    kept, skipped = read_rows(tmp_path, log_rows())
    assert skipped == []
    by_id = {c.provenance["source_id"]: c for c in kept}
    one = by_id["one-call"]
    assert one.tools == [served(WEATHER)]
    assert one.messages == [
        Message("user", "What is the weather in Paris?"),
        Message("assistant", "", "I should look it up.", (ToolCall("call_p", "get_weather", '{"city":"Paris"}'),)),
        Message("tool", '{"temp_c":21,"sky":"clear"}', tool_call_id="call_p"),
        Message("assistant", "It is 21 °C and clear in Paris.", "The tool says 21 and clear."),
    ]
    parallel = by_id["parallel"]
    assert [m.role for m in parallel.messages] == ["system", "user", "assistant", "tool", "tool", "assistant", "user",
                                                   "assistant", "tool", "assistant"]
    assert parallel.messages[2].content == "Let me check both."
    assert [(c.id, c.name) for c in parallel.messages[2].tool_calls] == [("call_w", "get_weather"),
                                                                        ("call_t", "get_time")]
    assert [m.tool_call_id for m in parallel.messages[3:5]] == ["call_t", "call_w"]  # answered out of order
    # Logged before the result came back: the call is the row's last turn, and a training turn of its own.
    assert by_id["unanswered"].messages[-1].tool_calls[0].name == "search"
    assert by_id["unanswered"].tools == [served(SEARCH)] and served(SEARCH)["function"]["description"] is None
    plain = by_id["plain"]
    assert plain.tools is None and not plain.has_tool_traffic
    assert all(not c.flags for c in kept)  # nothing here needed a repair: calls and answers are not "merged"


def test_sharegpt_function_call_dumps_read_as_the_same_traffic(tmp_path: Path) -> None:
    kept, skipped = read_rows(tmp_path, glaive_rows())
    assert skipped == []
    one, parallel = kept
    assert one.tools == [served(WEATHER), served(TIME)]  # bare function schemas, from a JSON string
    assert one.messages == [
        Message("user", "Weather in Paris?"),
        Message("assistant", "", None, (ToolCall("call_0", "get_weather", '{"city":"Paris"}'),)),
        Message("tool", '{"temp_c": 21}', tool_call_id="call_0"),
        Message("assistant", "21 °C."),
    ]
    # One observation holding the JSON list of the parallel calls' results is one result per call, in order.
    assert parallel.messages[1].tool_calls == (ToolCall("call_0", "get_weather", '{"city":"Rome"}'),
                                               ToolCall("call_1", "get_time", '{"city":"Rome"}'))
    assert [(m.role, m.content, m.tool_call_id) for m in parallel.messages[2:4]] == [
        ("tool", '{"temp_c": 25}', "call_0"), ("tool", "14:05", "call_1")]
    again, _ = read_rows(tmp_path, glaive_rows())
    assert [c.id for c in again] == [c.id for c in kept]  # assigned ids are the same on every read


def test_assigned_call_ids_never_repeat_an_id_the_row_holds(tmp_path: Path) -> None:
    """A call without an id in a turn (or a row) that also holds a recorded ``call_0``: the assigned id is another,
    so each result answers one call."""
    idless = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    same_turn = [say("user", "q"), calling(idless, call("call_0", "get_weather", {"city": "Rome"})),
                 result("call_0", "rome"), {"role": "tool", "content": "oslo"}, say("assistant", "a")]
    later_turn = [say("user", "q"), calling(idless), {"role": "tool", "content": "oslo"}, say("assistant", "a"),
                  say("user", "q2"), calling(call("call_0", "get_weather", {"city": "Rome"})), result("call_0", "rome"),
                  say("assistant", "b")]
    kept, skipped = read_rows(tmp_path, [{"tools": [WEATHER], "messages": turns} for turns in (same_turn, later_turn)])
    assert skipped == []
    for row in kept:
        ids = [c.id for m in row.messages for c in m.tool_calls]
        assert len(set(ids)) == len(ids) and "call_0" in ids
        oslo = next(c.id for m in row.messages for c in m.tool_calls if c.arguments == '{"city": "Oslo"}')
        assert [m.tool_call_id for m in row.messages if m.content == "oslo"] == [oslo]


@pytest.mark.parametrize(("turns", "detail"), [
    ([say("user", "q"), say("assistant", "a"), result("call_x", "r"), say("assistant", "b")], "expected user"),
    ([say("user", "q"), calling(call("c1", "get_weather", {})), result("c2", "r"), say("assistant", "a")],
     "answers tool call 'c2'"),
], ids=["result-without-call", "result-of-another-call"])
def test_results_must_answer_the_calls_before_them(tmp_path: Path, turns: list[dict[str, Any]], detail: str) -> None:
    kept, skipped = read_turns(tmp_path, turns)
    assert kept == [] and [s.reason for s in skipped] == ["wrong_role_order"]
    assert detail in skipped[0].detail


@pytest.mark.parametrize(("kind", "consecutive_turns"), [("replay", "merge"), ("replay", "split"),
                                                        ("prompts", "merge")])
@pytest.mark.parametrize(("turns", "detail"), [
    ([say("user", "q"), calling(call("c1", "get_weather", {})), say("assistant", "a")], "c1 of"),
    ([say("user", "q"), calling(call("c1", "get_weather", {}), call("c2", "get_weather", {})), result("c1", "r"),
      say("assistant", "a")], "c2 of"),
    ([say("user", "q"), calling(call("c1", "get_weather", {})), say("user", "again?"), say("assistant", "a")],
     "c1 of"),
], ids=["no-result-then-an-answer", "one-of-two-results-then-an-answer", "user-before-the-result"])
def test_a_call_left_unanswered_while_the_row_goes_on_skips_it(tmp_path: Path, turns: list[dict[str, Any]],
                                                                detail: str, kind: str, consecutive_turns: str) -> None:
    """Whether none or some of a turn's calls are answered, the answer after them was made with results the row
    does not hold: one reason, never repaired away (a merge would put the answer before the call)."""
    write_lines(tmp_path / "rows.jsonl", [{"tools": [WEATHER], "messages": turns}])
    source = spec(kind=kind, paths=("rows.jsonl",), repair=RepairRules(consecutive_turns=consecutive_turns))
    kept, skipped = split(list(iter_source(source, tmp_path)))
    assert kept == [] and [s.reason for s in skipped] == ["unanswered_tool_call"]
    assert f"{detail} the assistant turn before have no result" in skipped[0].detail


@pytest.mark.parametrize(("turns", "roles", "flags"), [
    # The text an assistant said before its call, logged as a turn of its own, joins the call turn ...
    ([say("user", "q"), say("assistant", "Let me see."), calling(call("c1", "get_weather", {"city": "x"})),
      result("c1", "r"), say("assistant", "a")], ["user", "assistant", "tool", "assistant"], [MERGED]),
    # ... a chunk that starts inside an exchange drops the calls and results whose question it does not hold ...
    ([calling(call("c1", "get_weather", {})), result("c1", "r"), say("assistant", "a"), say("user", "q"),
      say("assistant", "b")], ["user", "assistant"], [LEADING]),
    # ... and results the row holds no answer to are trimmed like an unanswered user turn.
    ([say("user", "q"), calling(call("c1", "get_weather", {})), result("c1", "r")], ["user", "assistant"],
     [TRIMMED]),
], ids=["text-before-a-call", "chunk-inside-an-exchange", "trailing-results"])
def test_repairs_around_tool_turns(tmp_path: Path, turns: list[dict[str, Any]], roles: list[str],
                                   flags: list[str]) -> None:
    kept, skipped = read_turns(tmp_path, turns)
    assert skipped == []
    (row,) = kept
    assert [m.role for m in row.messages] == roles and row.flags == flags
    if flags == [MERGED]:
        assert row.messages[1].content == "Let me see." and row.messages[1].tool_calls[0].id == "c1"


def test_prompts_with_tool_traffic_keep_their_recorded_calls_and_results(tmp_path: Path) -> None:
    kept, skipped = read_rows(tmp_path, log_rows(), kind="prompts")
    assert skipped == []
    by_id = {c.provenance["source_id"]: c for c in kept}
    # The tool-result policy needs the recorded calls and results; a plain prompt keeps only its questions.
    assert [m.role for m in by_id["one-call"].messages] == ["user", "assistant", "tool", "assistant"]
    assert [m.role for m in by_id["plain"].messages] == ["user"]


@pytest.mark.parametrize(("row", "reason"), [
    ({"tools": "not json", "messages": [say("user", "q"), say("assistant", "a")]}, "bad_tools"),
    ({"tools": {"name": "x"}, "messages": [say("user", "q"), say("assistant", "a")]}, "bad_tools"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}],
      "messages": [say("user", "q"), say("assistant", "a")]}, "bad_tools"),
    ({"messages": [say("user", "q"), {"role": "assistant", "content": None, "tool_calls": [{"function": {}}]}]},
     "bad_tool_call"),
    ({"messages": [say("user", "q"), {"role": "assistant", "content": None, "tool_calls": "get_weather()"}]},
     "bad_tool_call"),
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": "get_weather(x)"}]},
     "bad_tool_call"),
])
def test_bad_tool_shapes_are_skipped_by_reason(tmp_path: Path, row: dict[str, Any], reason: str) -> None:
    kept, skipped = read_rows(tmp_path, [row])
    assert kept == [] and [s.reason for s in skipped] == [reason]


@pytest.mark.parametrize("kind", ["replay", "prompts"])
def test_a_call_id_repeated_within_a_turn_skips_the_row_and_across_turns_does_not(tmp_path: Path, kind: str) -> None:
    """Results answer the calls of the turn right before them by id: two calls of one turn with one id leave their
    results ambiguous; one id in two turns does not (servers that number the calls of each answer reuse them)."""
    twice = [say("user", "q"), calling(call("x", "get_weather", {"city": "A"}), call("x", "get_time", {"city": "A"})),
             result("x", "a"), result("x", "b"), say("assistant", "a")]
    in_two_turns = [say("user", "q"), calling(call("x", "get_weather", {"city": "A"})), result("x", "a"),
                    say("assistant", "a"), say("user", "q2"), calling(call("x", "get_weather", {"city": "B"})),
                    result("x", "b"), say("assistant", "b")]
    kept, skipped = read_rows(tmp_path, [{"tools": [WEATHER], "messages": turns} for turns in (twice, in_two_turns)],
                              kind)
    assert [s.reason for s in skipped] == ["duplicate_tool_call_id"] and skipped[0].location.endswith(":1")
    assert "turn 1" in skipped[0].detail and "'x'" in skipped[0].detail
    assert [c.provenance["source_line"] for c in kept] == [2]


@pytest.mark.parametrize("arguments", ["city=Paris", "[1, 2]", '"Paris"'], ids=["not-json", "a-list", "a-string"])
def test_a_recorded_call_whose_arguments_are_not_an_object_is_flagged(tmp_path: Path, arguments: str) -> None:
    """vLLM renders such arguments as {}: the row is not the text the model emitted. Replayed, it is flagged (the
    arguments kept as they were); a prompt's recorded calls are regenerated (the generator flags a kept one)."""
    rows = [{"tools": [WEATHER], "messages": [say("user", "q"), calling(call("c1", "get_weather", text)),
                                              result("c1", "r"), say("assistant", "a")]}
            for text in (arguments, '{"city": "Paris"}')]
    kept, skipped = read_rows(tmp_path, rows)
    assert skipped == [] and [row.flags for row in kept] == [[FLAG_INVALID_TOOL_CALL], []]
    assert kept[0].messages[1].tool_calls[0].arguments == arguments
    prompts, skipped = read_rows(tmp_path, rows, kind="prompts")
    assert skipped == [] and [row.flags for row in prompts] == [[], []]


@pytest.mark.parametrize("kind", ["replay", "prompts"])
@pytest.mark.parametrize("parameters", [{"type": "bogus"}, {"type": "object", "properties": {"n": {"type": "int"}}},
                                        {"type": "object", "required": "n"}, {"$schema": ["draft"]}],
                         ids=["unknown-type", "nested-unknown-type", "required-not-a-list", "schema-not-a-uri"])
def test_a_tool_whose_parameters_are_not_a_valid_json_schema_flags_the_row(tmp_path: Path, kind: str,
                                                                           parameters: dict[str, Any]) -> None:
    broken = {"type": "function", "function": {"name": "broken", "parameters": parameters}}
    no_schema = {"type": "function", "function": {"name": "free"}}
    turns = [say("user", "q"), say("assistant", "a")]
    kept, skipped = read_rows(tmp_path, [{"tools": [WEATHER, broken], "messages": turns},
                                         {"tools": [WEATHER, no_schema], "messages": turns}], kind)
    assert skipped == [] and [row.flags for row in kept] == [["invalid_tool_schema"], []]
    assert kept[0].tools is not None and kept[0].tools[1]["function"]["parameters"] == parameters  # kept as served


NAMED_WEATHER = {"type": "function", "function": {"name": "get_weather"}}


def test_rows_whose_tools_lack_the_named_tool_choice_are_skipped_before_any_request(tmp_path: Path) -> None:
    """The server refuses a named tool_choice the request's tools do not define: such a row is skipped as it is
    read; rows that define it, and rows without tools (sent without a tool_choice), are kept."""
    turns = [say("user", "q")]
    write_lines(tmp_path / "rows.jsonl", [{"tools": [WEATHER, TIME], "messages": turns},
                                          {"tools": [TIME, SEARCH], "messages": turns}, {"messages": turns}])
    source = spec(kind="prompts", paths=("rows.jsonl",), tool_choice=NAMED_WEATHER)
    kept, skipped = split(list(iter_source(source, tmp_path)))
    assert [c.provenance["source_line"] for c in kept] == [1, 3]
    assert [(s.reason, s.location) for s in skipped] == [("tool_choice_undefined", "rows.jsonl:2")]
    assert "'get_weather'" in skipped[0].detail and "get_time, search" in skipped[0].detail


def test_a_named_tool_choice_that_no_row_defines_is_an_error_naming_source_and_function(tmp_path: Path) -> None:
    write_lines(tmp_path / "rows.jsonl", [{"tools": [TIME], "messages": [say("user", "q")]},
                                          {"messages": [say("user", "q2")]}])
    source = spec(name="agent", kind="prompts", paths=("rows.jsonl",), tool_choice=NAMED_WEATHER)
    with pytest.raises(CorpusError, match=r"source 'agent': tool_choice names the function 'get_weather', which no "):
        list(iter_source(source, tmp_path))


def test_ids_of_rows_without_tools_are_what_they_were_and_tools_tell_rows_apart(tmp_path: Path) -> None:
    messages = [Message("user", "q"), Message("assistant", "a", "r")]
    # the canonical key of a conversation without tool traffic is the one from before tools existed
    assert content_key(messages) == orjson.dumps([(m.role, m.content, m.reasoning) for m in messages])
    rows = [{"messages": [say("user", "q"), say("assistant", "a")]},
            {"tools": [WEATHER], "messages": [say("user", "q"), say("assistant", "a")]},
            {"tools": [TIME], "messages": [say("user", "q"), say("assistant", "a")]}]
    kept, _ = read_rows(tmp_path, rows)
    assert kept[0].id == conversation_id("src", [Message("user", "q"), Message("assistant", "a")])
    assert len({c.id for c in kept}) == 3


# Rows that carry a tools list but no call or result: the role order is what decides, so after the first row of
# a role sequence they skip the order check, and come out exactly as the full check gives them.
TOOLS_ONLY_ROWS: list[dict[str, Any]] = [
    {"id": "t1", "tools": [WEATHER], "messages": [say("user", "q1"), say("assistant", "a1")]},
    {"id": "t2", "tools": [TIME], "messages": [say("user", "q2"), say("assistant", "a2")]},
    {"id": "plain", "messages": [say("user", "q3"), say("assistant", "a3")]},
    {"id": "t3", "tools": [WEATHER, TIME], "messages": [say("system", "s"), say("user", "q4"),
                                                       say("assistant", "a4")]},
    {"id": "t4", "tools": [SEARCH], "messages": [say("system", "s"), say("user", "q5"), say("assistant", "a5")]},
]


@pytest.mark.parametrize("kind", ["replay", "prompts"])
def test_rows_with_tools_but_no_calls_take_the_checked_sequence_way_with_the_same_output(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[tuple[str, ...]] = []
    check_role_order = mappings.check_role_order

    def counted_check(messages: list[Message], *, need_assistant: bool) -> None:
        checked.append(tuple(m.role for m in messages))
        check_role_order(messages, need_assistant=need_assistant)

    monkeypatch.setattr(mappings, "check_role_order", counted_check)
    warm = RowNormaliser(Mapping(), kind, system_prompt="be brief")
    through_warm = [warm(row) for row in TOOLS_ONLY_ROWS]
    # one full check per role sequence: the rows after the first of each were not checked again
    assert checked == [("user", "assistant"), ("system", "user", "assistant")]
    # a fresh normaliser has accepted no sequence yet, so it checks every row in full
    through_full_check = [RowNormaliser(Mapping(), kind, system_prompt="be brief")(row) for row in TOOLS_ONLY_ROWS]
    assert through_warm == through_full_check
    prompt_system = [] if kind == "replay" else [Message("system", "be brief")]
    assert through_warm[1] == [NormalisedRow(
        [*prompt_system, Message("user", "q2"), Message("assistant", "a2")], [], "t2", tools=[served(TIME)])]
    assert through_warm[2] == [NormalisedRow(
        [*prompt_system, Message("user", "q3")] + ([Message("assistant", "a3")] if kind == "replay" else []),
        [], "plain")]
    assert through_warm[4] == [NormalisedRow(
        [Message("system", "s"), Message("user", "q5"), Message("assistant", "a5")], [], "t4",
        tools=[served(SEARCH)])]
