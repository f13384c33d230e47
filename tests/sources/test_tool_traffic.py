"""Tool traffic as the readers take it: OpenAI chat logs and ShareGPT function-call dumps give the same record
(tools in the served shape, calls with their arguments' text, results linked by id), the role order with tool
turns, the repairs around them, prompts that keep their recorded calls, and the bad shapes skipped by reason."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corpus_builder.errors import BadRow, CorpusError
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
    by_id = {c.provenance.source_id: c for c in kept}
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
    by_id = {c.provenance.source_id: c for c in kept}
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
    assert [c.provenance.source_line for c in kept] == [2]


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
    assert [c.provenance.source_line for c in kept] == [1, 3]
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


# --- the readers' own shapes of a call, one by one (RowNormaliser, no file) -----------------------------

def normalise(row: dict[str, Any], kind: str = "replay", **rules: str) -> list[NormalisedRow]:
    return RowNormaliser(Mapping(), kind, repair=RepairRules(**rules))(row)


def refused(row: dict[str, Any], kind: str = "replay", **rules: str) -> BadRow:
    with pytest.raises(BadRow) as raised:
        normalise(row, kind, **rules)
    return raised.value


def idless(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": orjson.dumps(arguments).decode()}}


def unlinked(content: str) -> dict[str, Any]:
    """A tool's result without the id of the call it answers."""
    return {"role": "tool", "content": content}


# One exchange of a generated row: the recorded ids of its parallel calls (None: the call came without one).
EXCHANGES = st.lists(st.lists(st.sampled_from([None, None, "call_0", "call_1", "call_2", "call_4", "x"]),
                              min_size=1, max_size=3).filter(lambda ids: len({i for i in ids if i}) ==
                                                             sum(1 for i in ids if i)),
                     min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(EXCHANGES)
def test_assigned_call_ids_are_unique_in_the_row_and_the_results_answer_their_calls(
        exchanges: list[list[str | None]]) -> None:
    """Whatever ids a row's calls came with (some ``call_N`` the readers would assign, one id in several turns),
    an id-less call gets ``call_N`` for its position among the row's calls, or the next N whose ``call_N`` neither a
    call of the row nor an earlier assignment has; and each id-less result answers the next id-less call of the
    turn before it, while the recorded ones answer theirs in any order."""
    turns: list[dict[str, Any]] = []
    for number, ids in enumerate(exchanges):
        made = [call(call_id, "get_weather", {"city": f"{number}-{slot}"}) if call_id else
                idless("get_weather", {"city": f"{number}-{slot}"}) for slot, call_id in enumerate(ids)]
        turns += [say("user", f"q{number}"), calling(*made)]
        turns += [result(call_id, f"{number}-{slot}") for slot, call_id in reversed(list(enumerate(ids))) if call_id]
        turns += [unlinked(f"{number}-{slot}") for slot, call_id in enumerate(ids) if not call_id]
        turns.append(say("assistant", f"a{number}"))
    (row,) = normalise({"tools": [WEATHER], "messages": turns})
    recorded = {call_id for ids in exchanges for call_id in ids if call_id}
    calls = [made for message in row.messages for made in message.tool_calls]
    taken, expected = set(recorded), []
    for position, call_id in enumerate(call_id for ids in exchanges for call_id in ids):
        if call_id is None:
            call_id = next(f"call_{n}" for n in itertools.count(position) if f"call_{n}" not in taken)
            taken.add(call_id)
        expected.append(call_id)
    assert [made.id for made in calls] == expected
    assigned = [made.id for made, call_id in zip(calls, (i for ids in exchanges for i in ids), strict=True)
                if call_id is None]
    assert len(set(assigned)) == len(assigned) and not set(assigned) & recorded
    answered = {made.arguments: made.id for made in calls}
    assert all(message.tool_call_id == answered[orjson.dumps({"city": message.content}).decode()]
               for message in row.messages if message.role == "tool")


@pytest.mark.parametrize(("turn", "call_id"), [
    ({"role": "assistant", "tool_calls": [call("c1", "get_weather", '{"city": "Oslo"}')]}, "c1"),
    ({"role": "assistant", "function_call": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}, "call_0"),
    ({"role": "assistant", "content": None, "tool_calls": None,
      "function_call": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}, "call_0"),
], ids=["tool-calls-without-content", "legacy-function-call-without-content", "legacy-function-call-tool-calls-null"])
def test_an_assistant_turn_that_only_calls_may_leave_its_content_out(turn: dict[str, Any], call_id: str) -> None:
    """OpenAI logs leave out (or null) the content of a turn that calls tools, the legacy ``function_call`` too;
    the legacy call has no id (it gets ``call_0``), and its ``function`` result answers it."""
    legacy_result = {"role": "function", "name": "get_weather", "content": "cold"}
    (row,) = normalise({"tools": [WEATHER], "messages": [say("user", "q"), turn, legacy_result, say("assistant", "a")]})
    made = ToolCall(call_id, "get_weather", '{"city": "Oslo"}')
    assert row.messages[1:3] == [Message("assistant", "", None, (made,)), Message("tool", "cold", tool_call_id=call_id)]


@pytest.mark.parametrize("turn", [{"role": "assistant"}, {"role": "assistant", "tool_calls": []},
                                  {"role": "assistant", "tool_calls": None, "function_call": None}],
                         ids=["nothing", "no-calls", "null-calls"])
def test_an_assistant_turn_without_content_or_calls_has_no_content(turn: dict[str, Any]) -> None:
    problem = refused({"messages": [say("user", "q"), turn]})
    assert (problem.reason, problem.detail) == ("null_content", "turn 1 (assistant) has no content")


def test_an_empty_list_of_calls_is_a_turn_without_calls() -> None:
    (row,) = normalise({"messages": [say("user", "q"), {"role": "assistant", "content": "a", "tool_calls": []}]})
    assert row.messages == [Message("user", "q"), Message("assistant", "a")] and row.flags == []


@pytest.mark.parametrize(("turn", "detail"), [
    ({"role": "assistant", "content": None, "tool_calls": "get_weather()"}, "turn 1: tool_calls is a str, not a list"),
    ({"role": "assistant", "content": None, "tool_calls": {"name": "f"}}, "turn 1: tool_calls is a dict, not a list"),
    ({"role": "assistant", "content": None, "function_call": "f()"}, "turn 1: a tool call has no function name"),
    (calling({"function": {"arguments": "{}"}}), "turn 1: a tool call has no function name"),
    (calling({"function": {"name": "", "arguments": "{}"}}), "turn 1: a tool call has no function name"),
    (calling({"function": {"name": 7, "arguments": "{}"}}), "turn 1: a tool call has no function name"),
    (calling({"function": "get_weather"}), "turn 1: a tool call has no function name"),
    (calling({"name": "f", "arguments": 3}), "turn 1: the arguments of f are a int"),
    (calling({"name": "f", "arguments": True}), "turn 1: the arguments of f are a bool"),
    ({"from": "function_call", "value": "get_weather(city=Oslo)"}, "turn 1: the function call is not JSON"),
    ({"from": "function_call", "value": '["get_weather"]'}, "turn 1: a tool call has no function name"),
], ids=["tool-calls-a-string", "tool-calls-an-object", "legacy-call-a-string", "no-name", "empty-name",
        "name-not-a-string", "function-not-an-object", "arguments-a-number", "arguments-a-bool", "value-not-json",
        "value-a-list-of-strings"])
def test_a_call_that_cannot_be_read_names_its_turn_and_problem(turn: dict[str, Any], detail: str) -> None:
    if "from" in turn:
        row = {"conversations": [{"from": "human", "value": "q"}, turn, {"from": "gpt", "value": "a"}]}
    else:
        row = {"messages": [say("user", "q"), turn, say("assistant", "a")]}
    problem = refused(row)
    assert (problem.reason, problem.detail) == ("bad_tool_call", detail)


@pytest.mark.parametrize(("made", "expected"), [
    ({"name": "f", "arguments": '{"a": 1}'}, ToolCall("call_0", "f", '{"a": 1}')),  # bare, as glaive writes it
    ({"name": "f", "parameters": {"a": 1}}, ToolCall("call_0", "f", '{"a":1}')),  # some dumps say parameters
    ({"name": "f", "arguments": '{"a": 1}', "parameters": {"b": 2}}, ToolCall("call_0", "f", '{"a": 1}')),
    ({"name": "f"}, ToolCall("call_0", "f", "{}")),
    ({"name": "f", "arguments": None}, ToolCall("call_0", "f", "{}")),
    ({"function": {"name": "f", "arguments": [1, "b"]}}, ToolCall("call_0", "f", '[1,"b"]')),
    ({"id": 5, "function": {"name": "f", "arguments": "{}"}}, ToolCall("call_0", "f", "{}")),
    ({"id": "c9", "function": {"name": "f", "arguments": "{}"}, "name": "g"}, ToolCall("c9", "f", "{}")),
], ids=["bare", "parameters", "arguments-win", "no-arguments", "null-arguments", "decoded-list", "id-not-a-string",
        "function-wins"])
def test_each_shape_of_a_call_reads_as_one_call(made: dict[str, Any], expected: ToolCall) -> None:
    for row in ({"messages": [say("user", "q"), calling(made), unlinked("r"), say("assistant", "a")]},
                {"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": made},
                                   {"from": "observation", "value": "r"}, {"from": "gpt", "value": "a"}]}):
        (read,) = normalise(row)
        assert read.messages[1].tool_calls == (expected,)
        assert read.messages[2].tool_call_id == expected.id


@pytest.mark.parametrize("recorded", ["", 7, None], ids=["empty", "a-number", "null"])
def test_a_result_whose_call_id_is_empty_or_not_a_string_answers_the_open_call(recorded: Any) -> None:
    (row,) = normalise({"messages": [say("user", "q"), calling(call("c1", "f", {})),
                                     {"role": "tool", "content": "r", "tool_call_id": recorded},
                                     say("assistant", "a")]})
    assert row.messages[2] == Message("tool", "r", tool_call_id="c1")


def test_an_id_less_result_after_a_system_turn_still_answers_the_call_before_it() -> None:
    """A system turn between a call and its result does not speak: the result answers the call."""
    (row,) = normalise({"messages": [say("user", "q"), calling(idless("f", {})), say("system", "be brief"),
                                     unlinked("r"), say("assistant", "a")]})
    assert [(m.role, m.tool_call_id) for m in row.messages] == [("user", None), ("assistant", None), ("system", None),
                                                                 ("tool", "call_0"), ("assistant", None)]


@pytest.mark.parametrize(("observation", "calls", "results"), [
    # N results for N calls: one each, in order, a result that is not a string as its JSON
    ('[{"temp_c": 25}, "14:05", 3]', 3, ['{"temp_c":25}', "14:05", "3"]),
    ('["a", "b"]', 2, ["a", "b"]),
    # anything else is one result, of the first call (the observations after it answer the others)
    ('["a", "b"]', 3, None),
    ('["a", "b", "c"]', 2, None),
    ("[not json", 2, None),
    ('{"0": "a", "1": "b"}', 2, None),
    (' ["a", "b"]', 2, None),
    ('["a", "b"]', 1, None),  # one call: its result is the list, whatever its length
    ('["a"]', 1, None),
], ids=["three-each", "two-each", "too-few", "too-many", "not-json", "an-object", "not-at-the-start", "one-call",
        "one-call-a-list-of-one"])
def test_one_observation_after_parallel_calls_is_a_result_per_call_only_when_it_lists_one_each(
        observation: str, calls: int, results: list[str] | None) -> None:
    made = [{"name": "f", "arguments": {"n": n}} for n in range(calls)]
    later = [] if results else [f"r{n}" for n in range(1, calls)]
    row = {"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": made},
                             {"from": "observation", "value": observation},
                             *({"from": "observation", "value": text} for text in later),
                             {"from": "gpt", "value": "a"}]}
    (read,) = normalise(row)
    assert [(m.role, m.content, m.tool_call_id) for m in read.messages[2:-1]] == [
        ("tool", text, f"call_{n}") for n, text in enumerate(results or [observation, *later])]


@pytest.mark.parametrize("kind", ["replay", "prompts"])
def test_a_merge_keeps_the_calls_and_texts_of_every_turn_it_joins(kind: str) -> None:
    """An assistant's words and reasoning logged as turns of their own before its parallel calls join the call turn:
    every call stays, in its order, with the results answering them; a call turn is never joined to the turn after
    it (that answer would come before the call)."""
    weather, time = call("c1", "get_weather", {"city": "Rome"}), call("c2", "get_time", {"city": "Rome"})
    turns = [say("user", "q"), say("assistant", "Let me see.", "Two tools."), say("assistant", "Both, then."),
             calling(weather, time, content="Calling.", reasoning="Go."), result("c2", "14:05"), result("c1", "25"),
             say("assistant", "25 at 14:05.")]
    (row,) = normalise({"tools": [WEATHER, TIME], "messages": turns}, kind)
    assert row.flags == [MERGED]
    assert row.messages[1] == Message("assistant", "Let me see.\n\nBoth, then.\n\nCalling.", "Two tools.\n\nGo.", (
        ToolCall("c1", "get_weather", '{"city":"Rome"}'), ToolCall("c2", "get_time", '{"city":"Rome"}')))
    assert [(m.role, m.tool_call_id) for m in row.messages[2:]] == [("tool", "c2"), ("tool", "c1"), ("assistant", None)]
    glaive = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "Let me see."},
                                {"from": "function_call", "value": [{"name": "get_weather", "arguments": {"c": 1}},
                                                                    {"name": "get_time", "arguments": {"c": 2}}]},
                                {"from": "observation", "value": '["25", "14:05"]'}, {"from": "gpt", "value": "ok"}]}
    (read,) = normalise(glaive, kind)
    assert read.messages[1] == Message("assistant", "Let me see.", None, (ToolCall("call_0", "get_weather", '{"c":1}'),
                                                                         ToolCall("call_1", "get_time", '{"c":2}')))
    assert [(m.content, m.tool_call_id) for m in read.messages[2:4]] == [("25", "call_0"), ("14:05", "call_1")]


def test_a_result_that_names_its_call_is_one_result_whatever_it_holds() -> None:
    """Only an id-less observation is read as the results of parallel calls: one with its call's id is that call's."""
    (row,) = normalise({"messages": [say("user", "q"), calling(call("c1", "f", {}), call("c2", "g", {})),
                                     result("c1", ["a", "b"]), result("c2", "r"), say("assistant", "a")]})
    assert [(m.content, m.tool_call_id) for m in row.messages[2:4]] == [('["a","b"]', "c1"), ("r", "c2")]


def test_a_result_before_any_call_after_a_system_turn_answers_nothing(tmp_path: Path) -> None:
    """No call is open before the first assistant turn, also when only a system turn precedes the result."""
    rows = [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "tool", "content": "42"},
                          {"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]}]
    kept, skipped = read_rows(tmp_path, rows)
    assert not skipped and [m.role for m in kept[0].messages] == ["system", "user", "assistant"]
