"""Prompts with tool traffic regenerated against the fault server, which calls tools the way a server with
``--enable-auto-tool-choice`` does (corpus_builder.testing.fault_server): what each request sends, and each
tool-result policy (``sources[].tool_results``): match (reuse after a matching call, parallel calls in any order;
an unmatched call cut and counted; an answer without the call), recorded (only the final turn), with the
journal keyed by the tools sent."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corpus_builder.errors import REASONS, CorpusError, Skipped
from corpus_builder.generate import TurnRequest, generate, turn_key
from corpus_builder.generate.client import _parse_completion
from corpus_builder.generate.engine import EnginePool
from corpus_builder.generate.tool_results import describe, invalid_calls, pair_calls
from corpus_builder.recipe import Recipe, SourceSpec
from corpus_builder.records import (
    FLAG_INVALID_TOOL_CALL,
    FLAG_TOOL_RESULT_UNKNOWN,
    Conversation,
    Message,
    ToolCall,
    invalid_tool_schemas,
)
from corpus_builder.sources import iter_source
from corpus_builder.testing.fault_server import FaultServer
from tests.sources.test_sources import spec, split, write_lines
from tests.support.generate_run import make_recipe
from tests.support.tool_chats import call, calling, result, say, tool

MODEL = "fault-model"
SOURCE = "tools"
LOOKUP = tool("lookup", "Look a thing up", query={"type": "string"})
TRANSLATE = tool("translate", query={"type": "string"})
WEATHER = tool("get_weather", "Weather of a city", city={"type": "string"})


@pytest.fixture
def server():
    with FaultServer(model=MODEL) as fault_server:
        yield fault_server


def recipe(**tool_settings: Any) -> Recipe:
    source = SourceSpec(name=SOURCE, kind="prompts", paths=("prompts.jsonl",), **tool_settings)
    return replace(make_recipe(MODEL), sources=(source,))


def prompts(directory: Path, *rows: dict[str, Any]) -> list[Conversation]:
    write_lines(directory / "prompts.jsonl", list(rows))
    kept, skipped = split(list(iter_source(spec(name=SOURCE, kind="prompts", paths=("prompts.jsonl",)), directory)))
    assert skipped == []
    return kept


def run(server: FaultServer, directory: Path, rows: list[Conversation], **tool_settings: Any
        ) -> list[Conversation | Skipped]:
    return list(generate(rows, recipe(**tool_settings), directory / "journal", endpoints=[server.base_url]))


def answer(question: str) -> str:
    return f"Answer to {question}."  # what the fault server answers a question with


def turns(row: Conversation) -> list[tuple[str, str, tuple[str, ...], str | None]]:
    return [(m.role, m.content, tuple(c.name for c in m.tool_calls), m.tool_call_id) for m in row.messages]


def test_a_matching_call_reuses_the_recorded_result(server: FaultServer, tmp_path: Path) -> None:
    rows = prompts(tmp_path, {"tools": [LOOKUP], "messages": [
        say("user", "Find the Louvre's hours."),
        # the same call the server makes, written with other spacing: arguments compare as parsed JSON
        calling(call("rec-1", "lookup", '{ "query" : "Find the Louvre\'s hours." }')),
        result("rec-1", "9:00-18:00"),
        say("assistant", "(the recorded answer)"),
    ]})
    (row,) = run(server, tmp_path, rows)
    first, second = (r.body for r in server.chat_requests)
    assert first["tools"] == rows[0].tools and "tool_choice" not in first  # no tool_choice set: not sent
    made = row.messages[1].tool_calls[0]
    assert made == ToolCall("call-1-0", "lookup", orjson.dumps({"query": "Find the Louvre's hours."}).decode())
    # the recorded result now answers the regenerated call, and the target speaks again with it
    assert second["messages"][1:] == [
        {"role": "assistant", "content": "", "reasoning_content": "Let me think about Find the Louvre's hours..",
         "tool_calls": [made.to_openai()]},
        {"role": "tool", "content": "9:00-18:00", "tool_call_id": "call-1-0"}]
    assert turns(row) == [("user", "Find the Louvre's hours.", (), None), ("assistant", "", ("lookup",), None),
                          ("tool", "9:00-18:00", (), "call-1-0"),
                          ("assistant", answer("Find the Louvre's hours."), (), None)]
    generation = row.provenance.generation
    assert [t.message_index for t in generation.turns] == [1, 3]
    assert (generation.tools.choice, generation.tools.results) == (None, "match") and row.flags == []
    assert row.tools == rows[0].tools


def test_parallel_calls_match_in_any_order(server: FaultServer, tmp_path: Path) -> None:
    question = "Look up and translate 'bonjour'."
    arguments = {"query": question}
    rows = prompts(tmp_path, {"tools": [LOOKUP, TRANSLATE], "messages": [
        say("user", question),
        calling(call("rec-t", "translate", arguments), call("rec-l", "lookup", arguments)),
        result("rec-l", "a greeting"), result("rec-t", "hello"),
        say("assistant", "(recorded)"),
    ]})
    (row,) = run(server, tmp_path, rows)
    # the server calls lookup then translate; each recorded result answers the call it was recorded for
    assert [(c.id, c.name) for c in row.messages[1].tool_calls] == [("call-1-0", "lookup"), ("call-1-1", "translate")]
    assert [(m.content, m.tool_call_id) for m in row.messages[2:4]] == [("a greeting", "call-1-0"),
                                                                       ("hello", "call-1-1")]
    assert row.messages[4].content == answer(question) and row.flags == []


def test_a_call_with_no_recorded_twin_is_cut_and_counted(server: FaultServer, tmp_path: Path) -> None:
    first_call = {"tools": [LOOKUP], "messages": [
        say("user", "Find A."), calling(call("rec-1", "lookup", {"query": "something else"})),
        result("rec-1", "r"), say("assistant", "(recorded)")]}
    later_call = {"tools": [LOOKUP], "messages": [
        say("user", "Find B."), calling(call("rec-2", "lookup", {"query": "Find B."})), result("rec-2", "rb"),
        say("assistant", "(recorded b)"),
        say("user", "Thanks, and C?"), say("assistant", "(recorded c, answered without a call)")]}
    skipped, cut = run(server, tmp_path, prompts(tmp_path, first_call, later_call))
    assert isinstance(skipped, Skipped) and skipped.reason == "tool_result_unknown" in REASONS
    assert skipped.detail == ('assistant turn 1 called lookup({"query":"Find A."}); the recorded turn there called '
                              'lookup({"query":"something else"})')
    # The second exchange's call has no recorded result: the row ends before it, at its last assistant turn.
    assert isinstance(cut, Conversation) and cut.flags == [FLAG_TOOL_RESULT_UNKNOWN]
    assert [m.role for m in cut.messages] == ["user", "assistant", "tool", "assistant"]
    assert cut.messages[-1].content == answer("Find B.")
    assert [t.message_index for t in cut.provenance.generation.turns] == [1, 3]


def test_an_answer_without_the_recorded_call_goes_on_to_the_next_user_turn(server: FaultServer,
                                                                          tmp_path: Path) -> None:
    rows = prompts(tmp_path, {"tools": [LOOKUP], "messages": [
        say("user", "Find A."), calling(call("rec-1", "lookup", {"query": "Find A."})), result("rec-1", "r"),
        say("assistant", "(recorded)"), say("user", "And B?")]})
    (row,) = run(server, tmp_path, rows, tool_choice="none")  # the server may not call: it answers in text
    assert [r.body["tool_choice"] for r in server.chat_requests] == ["none", "none"]
    assert turns(row) == [("user", "Find A.", (), None), ("assistant", answer("Find A."), (), None),
                          ("user", "And B?", (), None), ("assistant", answer("And B?"), (), None)]


def test_recorded_keeps_the_history_and_regenerates_only_the_final_turn(server: FaultServer, tmp_path: Path) -> None:
    recorded = {"tools": [LOOKUP], "messages": [
        say("user", "Find A."), calling(call("rec-1", "lookup", {"query": "what the model asked then"}),
                                        reasoning="Recorded reasoning."),
        result("rec-1", "r"), say("assistant", "(the recorded final answer)")]}
    (row,) = run(server, tmp_path, prompts(tmp_path, recorded), tool_results="recorded")
    (request,) = (r.body for r in server.chat_requests)
    assert request["messages"][1] == {"role": "assistant", "content": "", "reasoning_content": "Recorded reasoning.",
                                      "tool_calls": [call("rec-1", "lookup", {"query": "what the model asked then"})]}
    assert request["messages"][2] == {"role": "tool", "content": "r", "tool_call_id": "rec-1"}
    assert turns(row)[:3] == [("user", "Find A.", (), None), ("assistant", "", ("lookup",), None),
                              ("tool", "r", (), "rec-1")]
    assert row.messages[3].content == answer("Find A.")
    assert row.provenance.generation.tools.results == "recorded"
    assert [t.message_index for t in row.provenance.generation.turns] == [3]


def test_a_kept_recorded_call_whose_arguments_are_not_an_object_is_flagged(server: FaultServer, tmp_path: Path) -> None:
    """tool_results: recorded keeps the recorded calls in the row, and vLLM renders arguments that are not a JSON
    object as {}: flagged as a replayed row is; a history whose calls are objects is not."""
    def recorded(arguments: str) -> dict[str, Any]:
        return {"tools": [LOOKUP], "messages": [say("user", f"Find {arguments}."),
                                                calling(call("rec-1", "lookup", arguments)), result("rec-1", "r"),
                                                say("assistant", "(recorded)")]}

    rows = prompts(tmp_path, recorded("[1, 2]"), recorded("query=A"), recorded('{"query": "A"}'))
    assert [row.flags for row in rows] == [[], [], []]  # the prompts: their calls may be regenerated
    generated = run(server, tmp_path, rows, tool_results="recorded")
    assert [row.flags for row in generated] == [[FLAG_INVALID_TOOL_CALL], [FLAG_INVALID_TOOL_CALL], []]


def test_a_final_call_is_kept_and_an_invalid_one_flagged(server: FaultServer, tmp_path: Path) -> None:
    """The regenerated final turn may itself call a tool: nothing follows it, so no result is needed. The
    server's call does not fit the tool's schema (it sends a query, the tool takes a city): flagged."""
    rows = prompts(tmp_path, {"tools": [WEATHER], "messages": [say("user", "Weather in Paris?")]})
    named = {"type": "function", "function": {"name": "get_weather"}}  # recipe {function: get_weather}, as loaded
    (row,) = run(server, tmp_path, rows, tool_results="recorded", tool_choice=named)
    assert server.chat_requests[0].body["tool_choice"] == named
    assert row.messages[-1].tool_calls[0].name == "get_weather" and row.flags == [FLAG_INVALID_TOOL_CALL]
    assert row.provenance.generation.tools.choice == named


def test_invalid_calls_names_misfits_and_holds_no_unusable_schema_against_a_call() -> None:
    """Every turn asks again for the same few schemas (their validators are reused): the verdicts stay the ones of
    each schema, and a schema that is invalid or whose $ref does not resolve here flags nothing."""
    broken = {"type": "function", "function": {"name": "broken", "parameters": {"type": 12}}}
    elsewhere = {"type": "function", "function": {"name": "elsewhere", "parameters": {
        "type": "object", "properties": {"city": {"$ref": "https://example.invalid/city.json"}}}}}
    no_metaschema = {"type": "function", "function": {"name": "no_metaschema", "parameters": {"$schema": [1]}}}
    tools = [WEATHER, LOOKUP, broken, elsewhere, no_metaschema]
    calls = [ToolCall("1", "get_weather", '{"city": "Paris"}'), ToolCall("2", "get_weather", '{"query": "Paris"}'),
             ToolCall("3", "lookup", '{"query": 3}'), ToolCall("4", "lookup", "not json"),
             ToolCall("5", "broken", '{"anything": 1}'), ToolCall("6", "elsewhere", '{"city": "Paris"}'),
             ToolCall("7", "unknown", "{}"), ToolCall("8", "no_metaschema", "{}")]
    for _ in range(2):
        assert invalid_calls(calls, tools) == ["get_weather", "lookup", "lookup", "unknown"]


# Calls a target makes: two functions, small arguments (so that equal calls occur).
CALLS = st.lists(st.tuples(st.sampled_from(["lookup", "translate"]),
                           st.dictionaries(st.sampled_from(["query", "lang"]), st.integers(0, 2), max_size=2)),
                 min_size=1, max_size=4)


def as_calls(prefix: str, made: list[tuple[str, dict[str, Any]]], *, respelled: bool = False) -> list[ToolCall]:
    """The calls with ids ``prefix-N``; ``respelled``: their arguments with keys sorted and no spaces."""
    def text(arguments: dict[str, Any]) -> str:
        return orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode() if respelled else json.dumps(
            arguments, indent=1)

    return [ToolCall(f"{prefix}-{n}", name, text(arguments)) for n, (name, arguments) in enumerate(made)]


@settings(max_examples=80, deadline=None)
@given(CALLS, st.randoms(use_true_random=False))
def test_calls_pair_with_their_recorded_twins_all_of_them_in_any_order(made: list[tuple[str, dict[str, Any]]],
                                                                       rng: Any) -> None:
    """The same calls in another order and spelling pair one to one, every recorded call with a regenerated one that
    makes the same call; one call fewer, one more, or one other, and there is no pairing."""
    recorded = as_calls("rec", made)
    generated = as_calls("gen", made, respelled=True)
    rng.shuffle(generated)
    pairs = pair_calls(generated, recorded)
    assert pairs is not None and sorted(pairs) == sorted(c.id for c in recorded)
    assert sorted(pairs.values()) == sorted(c.id for c in generated)
    by_id = {c.id: c for c in generated}
    for old in recorded:
        new = by_id[pairs[old.id]]
        assert (new.name, new.arguments_object()) == (old.name, old.arguments_object())
    assert pair_calls(generated[1:], recorded) is None and pair_calls(generated, recorded[1:]) is None
    assert pair_calls([*generated, generated[0]], [*recorded, ToolCall("rec-x", "other", "{}")]) is None
    other = replace(generated[0], arguments='{"query": 3}')  # no recorded call has a 3
    assert pair_calls([other, *generated[1:]], recorded) is None


def test_a_recorded_call_pairs_once_and_arguments_that_are_not_an_object_never_pair() -> None:
    paris, rome = (ToolCall(f"r{n}", "lookup", orjson.dumps({"query": city}).decode())
                   for n, city in enumerate(("Paris", "Rome")))
    assert pair_calls([replace(paris, id="g0"), replace(paris, id="g1")], [paris, rome]) is None
    assert pair_calls([replace(paris, id="g0"), replace(rome, id="g1")], [paris, paris]) is None
    assert pair_calls([replace(rome, id="g0"), replace(paris, id="g1")], [paris, rome]) == {"r0": "g1", "r1": "g0"}
    assert pair_calls([replace(paris, id="g0", name="translate")], [paris]) is None
    assert pair_calls([], []) is None  # no call: nothing to reuse a result for
    for text in ("query=Paris", "[1, 2]", '"Paris"', "null"):
        same = ToolCall("r", "lookup", text)
        assert pair_calls([replace(same, id="g")], [same]) is None


@pytest.mark.parametrize("parameters", [None, {}, {"type": "object"}, {"type": 12}],
                         ids=["none", "empty", "any-object", "invalid"])
@pytest.mark.parametrize("arguments", ["query=Paris", "[1]", '"Paris"', "", "{"], ids=repr)
def test_arguments_that_are_not_a_json_object_are_invalid_whatever_the_schema(parameters: dict[str, Any] | None,
                                                                              arguments: str) -> None:
    function: dict[str, Any] = {"name": "lookup", **({} if parameters is None else {"parameters": parameters})}
    tools = [{"type": "function", "function": function}, TRANSLATE]
    calls = [ToolCall("1", "lookup", "{}"), ToolCall("2", "lookup", arguments), ToolCall("3", "translate", arguments)]
    assert invalid_calls(calls, tools) == ["lookup", "translate"]  # a call the schema lets through checks on


def test_with_no_tools_every_call_is_invalid_and_describe_cuts_the_arguments_short() -> None:
    calls = [ToolCall("1", "lookup", '{"query": "' + "x" * 100 + '"}'), ToolCall("2", "translate", "{}")]
    assert invalid_calls(calls, None) == invalid_calls(calls, []) == ["lookup", "translate"]
    assert describe(calls) == f'lookup({calls[0].arguments[:80]}), translate({{}})'
    assert len(calls[0].arguments[:80]) == 80 and describe([]) == ""


def test_schemas_that_only_json_text_blurs_keep_their_own_verdicts() -> None:
    """The validators are cached by the schema's JSON text, where NaN reads as null: a NaN bound is a number (a
    valid schema), a null one is not, whichever was asked first."""
    def tool_with(bound: float | None) -> dict[str, Any]:
        return {"type": "function", "function": {"name": "t", "parameters": {"type": "number", "minimum": bound}}}

    for first, second in ((None, float("nan")), (float("nan"), None)):
        assert [invalid_tool_schemas([tool_with(bound)]) for bound in (first, second, first)] == (
            [["t"], [], ["t"]] if first is None else [[], ["t"], []])


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "build"])
def test_a_named_tool_choice_no_row_defines_stops_the_build_before_any_request(server: FaultServer, tmp_path: Path,
                                                                              dry_run: bool) -> None:
    write_lines(tmp_path / "prompts.jsonl", [{"tools": [LOOKUP], "messages": [say("user", f"Find {n}.")]}
                                             for n in range(3)])
    (tmp_path / "recipe.yaml").write_text(f"""\
name: r
target: {{model: {MODEL}, endpoints: [{server.base_url}]}}
sources:
  - name: agent
    kind: prompts
    path: prompts.jsonl
    tool_choice: {{type: function, function: {{name: get_weather}}}}
output: {{dir: out}}
""", encoding="utf-8")
    command = [sys.executable, "-m", "corpus_builder", "build", str(tmp_path / "recipe.yaml"),
               *(["--dry-run"] if dry_run else [])]
    completed = subprocess.run(command, capture_output=True, text=True)  # from the checkout: its corpus_builder
    assert completed.returncode == 2, completed.stderr
    assert "source 'agent': tool_choice names the function 'get_weather'" in completed.stderr
    assert "Traceback" not in completed.stderr
    assert server.chat_requests == [] and not (tmp_path / "out" / "manifest.json").exists()


def test_the_journal_is_keyed_by_the_tools_sent(server: FaultServer, tmp_path: Path) -> None:
    row = {"tools": [LOOKUP], "messages": [say("user", "Find A."),
                                           calling(call("rec-1", "lookup", {"query": "Find A."})),
                                           result("rec-1", "r"), say("assistant", "(recorded)")]}
    first = run(server, tmp_path, prompts(tmp_path, row))
    assert len(server.chat_requests) == 2
    assert run(server, tmp_path, prompts(tmp_path, row)) == first and len(server.chat_requests) == 2
    other_tools = {**row, "tools": [{**LOOKUP, "function": {**LOOKUP["function"], "description": "Search"}}]}
    run(server, tmp_path, prompts(tmp_path, other_tools))
    assert len(server.chat_requests) == 4  # other tools: another prompt, asked again
    run(server, tmp_path, prompts(tmp_path, row), tool_choice="auto")
    assert len(server.chat_requests) == 6  # another tool_choice too


def test_rows_without_tools_send_and_key_what_they_did() -> None:
    """A turn without tools is keyed as before tools existed (the digest of this fixed request is pinned), so
    the journals of earlier builds still answer it; its request carries no tools."""
    key = turn_key(({"role": "user", "content": "q"},), {"temperature": 0.6}, model="m", revision=None,
                   enable_thinking=True, sample_index=0, conversation="c")
    assert key.hex() == "1ebcecc73dd69c53598717c0d543b5e3"
    assert TurnRequest(messages=(), sampling={}, enable_thinking=True, model="m").tools is None


def test_the_client_reads_the_calls_and_refuses_a_call_without_a_name() -> None:
    def body(calls: list[dict[str, Any]]) -> bytes:
        return orjson.dumps({"model": "m", "choices": [{"finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None, "reasoning": "r", "tool_calls": calls}}]})

    parsed = _parse_completion(body([{"id": "c", "function": {"name": "f", "arguments": {"a": 1}}}]), "e")
    assert parsed.tool_calls == [{"id": "c", "name": "f", "arguments": '{"a":1}'}] and parsed.content is None
    with pytest.raises(ValueError):  # the pool counts it as a malformed answer and retries
        _parse_completion(body([{"id": "c", "function": {"name": "", "arguments": "{}"}}]), "e")


def test_the_in_process_engine_refuses_tools_with_a_clear_error() -> None:
    request = TurnRequest(messages=({"role": "user", "content": "q"},), sampling={}, enable_thinking=True, model="m",
                          tools=(LOOKUP,))
    with pytest.raises(CorpusError, match="in-process engine has no tool-call parser"):
        asyncio.run(EnginePool("m").complete(request))


def test_prompts_without_tool_traffic_are_generated_as_before(server: FaultServer, tmp_path: Path) -> None:
    rows = prompts(tmp_path, {"messages": [say("user", "Hi."), say("assistant", "(dropped)"), say("user", "Bye.")]})
    (row,) = run(server, tmp_path, rows)
    assert all("tools" not in r.body and "tool_choice" not in r.body for r in server.chat_requests)
    assert [m.role for m in row.messages] == ["user", "assistant", "user", "assistant"]
    assert row.provenance.generation.tools is None and row.tools is None
    assert row.messages[1] == Message("assistant", answer("Hi."), "Let me think about Hi..")
