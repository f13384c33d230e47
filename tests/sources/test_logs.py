"""Serving traffic as it is captured: logged request/response pairs read as conversations, one per chat (the
requests of a multi-turn chat folded into its last), the served mode and settings kept, truncated answers flagged,
in every shape gateways and tracing tools export."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corpus_builder.errors import BadRow, CorpusError, Skipped
from corpus_builder.recipe.model import Fold, Mapping, Take
from corpus_builder.records import FLAG_TRUNCATED, Conversation
from corpus_builder.sources import iter_file, iter_source
from corpus_builder.sources import readers as readers_module
from corpus_builder.sources import source as source_module
from corpus_builder.sources.fold import FOLDED_PREFIX, PrefixFold
from corpus_builder.sources.logs import ScannedAnswer, ScannedExchange, Turn, is_log_row, read_exchange, scan_line
from corpus_builder.sources.source import source_parts
from corpus_builder.stats.facts import thinking_mode_of
from tests.sources.test_sources import read, spec, split, write_lines
from tests.support.serving_logs import SHAPES, exchanges, log_row, logged_conversation
from tests.support.tool_chats import log_rows as tool_conversations

CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4.", "reasoning_content": "Two and two make four."},
        {"role": "user", "content": "And times 3?"},
        {"role": "assistant", "content": "12.", "reasoning_content": "Four times three is twelve."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You are welcome.", "reasoning_content": "A thank-you; reply kindly."}]
# Shapes that keep the answer's reasoning (Langfuse's OpenAI integration records none)
WITH_REASONING = tuple(shape for shape in SHAPES if not shape.startswith("langfuse"))


def turns(conversation: Conversation) -> list[tuple[str, str, str | None]]:
    return [(m.role, m.content, m.reasoning) for m in conversation.messages]


def expected_turns(messages: list[dict[str, Any]], *, reasoning: bool = True) -> list[tuple[str, str, str | None]]:
    return [(m["role"], m["content"], m.get("reasoning_content") if reasoning else None) for m in messages]


# --- one logged exchange ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_reads_the_exchange_with_its_answer_and_how_it_was_served(tmp_path: Path, shape: str) -> None:
    history, answer = exchanges(CHAT)[1]
    kept, skipped = _read_one(tmp_path, log_row(shape, history, answer))
    assert skipped == []
    [conversation] = kept
    with_reasoning = shape in WITH_REASONING
    assert turns(conversation)[-1] == ("assistant", "12.", "Four times three is twelve." if with_reasoning else None)
    assert turns(conversation)[:-1] == expected_turns(CHAT[:4], reasoning=False)
    served = conversation.provenance.served
    assert served.model == "tiny/target"
    assert served.sampling["temperature"] == 0.6
    # the template flag where the log keeps the request; LiteLLM's payload keeps the reasoning effort; Langfuse neither
    assert served.enable_thinking is (None if shape.startswith("langfuse") else True)
    assert served.finish_reason == (None if shape.startswith("langfuse") else "stop")
    assert thinking_mode_of(conversation) is with_reasoning


def _read_one(tmp_path: Path, row: dict[str, Any]) -> tuple[list[Conversation], list[Skipped]]:
    return read(write_lines(tmp_path / "log.jsonl", [row]))


def test_the_issue_shape_reads_as_one_conversation_not_missing_messages(tmp_path: Path) -> None:
    """The shape a new user tried: every row used to be skipped as missing_messages."""
    row = {"request": {"model": "tiny/target", "messages": [{"role": "user", "content": "hi"}],
                       "chat_template_kwargs": {"enable_thinking": True}, "temperature": 0.6},
           "response": {"choices": [{"message": {"content": "hello", "reasoning_content": "greet back"},
                                     "finish_reason": "stop"}], "usage": {"completion_tokens": 5}}}
    kept, skipped = _read_one(tmp_path, row)
    assert skipped == []
    assert turns(kept[0]) == [("user", "hi", None), ("assistant", "hello", "greet back")]
    assert kept[0].provenance.served.usage == {"completion_tokens": 5}


def test_a_vllm_answer_keeps_its_reasoning_field_and_a_streamed_langfuse_answer_its_text(tmp_path: Path) -> None:
    vllm = {"request": {"messages": [{"role": "user", "content": "q"}]},
            "response": {"choices": [{"message": {"role": "assistant", "content": "a", "reasoning": "r"}}]}}
    streamed = {"input": [{"role": "user", "content": "q"}], "output": "a streamed text"}
    assert turns(_read_one(tmp_path, vllm)[0][0])[-1] == ("assistant", "a", "r")
    assert turns(_read_one(tmp_path, streamed)[0][0])[-1] == ("assistant", "a streamed text", None)


def test_content_parts_are_joined_as_vllm_joins_them(tmp_path: Path) -> None:
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "x"}]
    row = {"messages": [{"role": "user", "content": parts}],
           "choices": [{"message": {"role": "assistant", "content": "ok"}}]}
    assert turns(_read_one(tmp_path, row)[0][0])[0] == ("user", "first\nx", None)
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
             "choices": [{"message": {"role": "assistant", "content": "ok"}}]}
    assert [s.reason for s in _read_one(tmp_path, image)[1]] == ["non_string_content"]


@pytest.mark.parametrize(("request_fields", "mode"), [
    ({"chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "high"}, False),  # the flag first
    ({"chat_template_kwargs": {"thinking": True}}, True),  # DeepSeek's name for it
    ({"reasoning_effort": "none"}, False),
    ({"reasoning_effort": "low"}, True),
    ({}, None),  # the template's default: not recorded
])
def test_the_served_mode_is_the_flag_then_the_effort(tmp_path: Path, request_fields: dict[str, Any],
                                                     mode: bool | None) -> None:
    row = {"request": {"messages": [{"role": "user", "content": "q"}], **request_fields},
           "response": {"choices": [{"message": {"role": "assistant", "content": "a"}}]}}
    assert _read_one(tmp_path, row)[0][0].provenance.served.enable_thinking is mode


@pytest.mark.parametrize(("ending", "mode"), [("/no_think", False), ("/think", True), ("no switch", None)])
def test_a_soft_switch_ending_the_last_user_turn_is_the_mode(tmp_path: Path, ending: str, mode: bool | None) -> None:
    row = {"request": {"messages": [{"role": "user", "content": f"solve it {ending}"}]},
           "response": {"choices": [{"message": {"role": "assistant", "content": "a"}}]}}
    assert _read_one(tmp_path, row)[0][0].provenance.served.enable_thinking is mode


def test_an_answer_cut_at_max_tokens_is_flagged_truncated(tmp_path: Path) -> None:
    history, answer = exchanges(CHAT)[0]
    cut = {"role": "assistant", "content": None, "reasoning_content": "Two and two make"}  # cut inside reasoning
    kept, _ = read(write_lines(tmp_path / "log.jsonl", [log_row("nested", history, answer),
                                                        log_row("nested", history, cut, finish_reason="length")]),
                   source="s")
    flags = {tuple(turns(c)[-1]): c.flags for c in kept}
    assert flags[("assistant", "4.", "Two and two make four.")] == []
    assert flags[("assistant", "", "Two and two make")] == [FLAG_TRUNCATED]


@pytest.mark.parametrize(("response", "detail"), [
    (None, "error: 500 upstream"), ({"choices": []}, "the response has no choices"), ({"id": "x"}, None)])
def test_a_request_without_an_answer_is_skipped_no_answer(tmp_path: Path, response: Any, detail: str | None) -> None:
    row = {"request": {"messages": [{"role": "user", "content": "q"}]}, "response": response, "error": "500 upstream"}
    if response is not None:
        del row["error"]
    kept, skipped = _read_one(tmp_path, row)
    assert kept == []
    assert [(s.reason, s.location) for s in skipped] == [("no_answer", "log.jsonl:1")]
    if detail is not None:
        assert skipped[0].detail == detail


def test_tool_calls_of_a_logged_answer_are_read_as_a_messages_row_reads_them(tmp_path: Path) -> None:
    [one_call, *_] = tool_conversations()
    logged = logged_conversation("nested", one_call)
    kept, skipped = read(write_lines(tmp_path / "log.jsonl", logged))
    direct, _ = read(write_lines(tmp_path / "direct.jsonl", [one_call]))
    assert [s.reason for s in skipped] == [FOLDED_PREFIX]
    assert kept[0].messages == direct[0].messages
    assert kept[0].tools == direct[0].tools


# --- one conversation per chat --------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
def test_a_chat_logged_per_request_is_one_conversation(tmp_path: Path, shape: str) -> None:
    logged = logged_conversation(shape, {"messages": CHAT})
    assert len(logged) == 3
    kept, skipped = read(write_lines(tmp_path / "log.jsonl", logged))
    assert [(s.reason, s.location, s.detail) for s in skipped] == [
        (FOLDED_PREFIX, "log.jsonl:1", "folded into log.jsonl:2"),
        (FOLDED_PREFIX, "log.jsonl:2", "folded into log.jsonl:3")]
    [conversation] = kept
    # every answer keeps the reasoning it was served with, though the history sent back had none
    assert turns(conversation) == expected_turns(CHAT, reasoning=shape in WITH_REASONING)
    assert conversation.provenance.source_line == 3
    assert conversation.provenance.folded_requests == 3


@pytest.mark.parametrize("repeated", [0, 1, 2])
def test_a_request_logged_twice_is_one_request_of_its_chat(tmp_path: Path, repeated: int) -> None:
    """A log line written twice (a retried write, two exports concatenated): the copy folds into the line that repeats
    it, so the chat is still one conversation, the prefix the fold removed never comes back (dedup would not catch
    it: no other row is equal to it), and the conversation counts every logged line it was made of."""
    logged = logged_conversation("nested", {"messages": CHAT})
    lines = [*logged[:repeated + 1], logged[repeated], *logged[repeated + 1:]]
    kept, skipped = read(write_lines(tmp_path / "log.jsonl", lines))
    assert [(s.reason, s.location, s.detail) for s in skipped] == [
        (FOLDED_PREFIX, f"log.jsonl:{line}", f"folded into log.jsonl:{line + 1}") for line in (1, 2, 3)]
    [conversation] = kept
    assert turns(conversation) == expected_turns(CHAT)
    assert conversation.provenance.source_line == 4
    assert conversation.provenance.folded_requests == 4


def test_interleaved_chats_fold_each_into_its_own_last_request(tmp_path: Path) -> None:
    chats = [{"messages": _chat(i, exchanges=1 + i % 4)} for i in range(12)]
    queues = [logged_conversation("nested", chat) for chat in chats]
    rng = random.Random(7)
    logged = []
    while any(queues):  # the requests of every chat in their order, the chats interleaved at random
        queue = rng.choice([q for q in queues if q])
        logged.append(queue.pop(0))
    kept, skipped = read(write_lines(tmp_path / "log.jsonl", logged))
    assert sorted(map(turns, kept)) == sorted(expected_turns(chat["messages"]) for chat in chats)
    assert len(skipped) == len(logged) - len(chats)
    assert {s.reason for s in skipped} == {FOLDED_PREFIX}


def test_a_request_missing_from_the_log_still_folds_the_one_before_it(tmp_path: Path) -> None:
    """The second request's answer failed (no answer logged): the chat's first request folds into its third, which
    holds it, though the request just before the third is not open."""
    logged = logged_conversation("nested", {"messages": CHAT})
    failed = {"request": logged[1]["request"], "response": None, "error": "502 bad gateway"}
    kept, skipped = read(write_lines(tmp_path / "log.jsonl", [logged[0], failed, logged[2]]))
    assert len(kept) == 1
    assert [(s.reason, s.detail) for s in skipped] == [("no_answer", "error: 502 bad gateway"),
                                                       (FOLDED_PREFIX, "folded into log.jsonl:3")]
    # the first answer's reasoning came from the first request; the second's was never logged with one
    assert turns(kept[0]) == [*expected_turns(CHAT[:3]), ("user", "And times 3?", None), ("assistant", "12.", None),
                              *expected_turns(CHAT[5:])]


def test_sessions_keep_chats_apart_that_begin_alike(tmp_path: Path) -> None:
    """Two users ask the same first question and get the same answer: by their sessions each first request folds into
    its own chat; without sessions the first two requests are one request logged twice, folded into the first chat
    that goes on."""
    first = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    a = {"messages": [*first, {"role": "user", "content": "tell a joke"}, {"role": "assistant", "content": "no"}]}
    b = {"messages": [*first, {"role": "user", "content": "tell a poem"}, {"role": "assistant", "content": "roses"}]}

    def logs(session: bool) -> list[dict[str, Any]]:
        rows_a = logged_conversation("nested", a, session="A" if session else None)
        rows_b = logged_conversation("nested", b, session="B" if session else None)
        return [rows_a[0], rows_b[0], rows_a[1], rows_b[1]]

    with_sessions, folded = read(write_lines(tmp_path / "s.jsonl", logs(True)))
    assert len(with_sessions) == 2 and len(folded) == 2
    # a log's session ids are not published
    assert all("session_id" not in c.provenance.to_json() for c in with_sessions)
    without, folded = read(write_lines(tmp_path / "n.jsonl", logs(False)))
    assert sorted(turns(c) for c in without) == sorted([expected_turns(a["messages"]), expected_turns(b["messages"])])
    assert [(s.location, s.detail) for s in folded] == [("n.jsonl:1", "folded into n.jsonl:2"),
                                                        ("n.jsonl:2", "folded into n.jsonl:3")]


@pytest.mark.parametrize("shape", ["nested", "langfuse_api", "langfuse_export", "helicone"])
@pytest.mark.parametrize("sessions", [(1, 2), (0, 7)])
def test_numeric_session_ids_keep_chats_apart(tmp_path: Path, shape: str, sessions: tuple[int, int]) -> None:
    """A log that numbers its sessions (an integer id, 0 included): two chats that begin alike are still two."""
    first = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    a = [*first, {"role": "user", "content": "tell a joke"}, {"role": "assistant", "content": "no"}]
    b = [*first, {"role": "user", "content": "tell a poem"}, {"role": "assistant", "content": "roses"}]
    rows_a, rows_b = (logged_conversation(shape, {"messages": messages}, session=session)
                      for messages, session in zip((a, b), sessions, strict=True))
    kept, folded = read(write_lines(tmp_path / "log.jsonl", [rows_a[0], rows_b[0], rows_a[1], rows_b[1]]))
    with_reasoning = shape in WITH_REASONING
    assert sorted(map(turns, kept)) == sorted(expected_turns(m, reasoning=with_reasoning) for m in (a, b))
    assert [(s.location, s.detail) for s in folded] == [("log.jsonl:1", "folded into log.jsonl:3"),
                                                        ("log.jsonl:2", "folded into log.jsonl:4")]


def test_the_fold_holds_at_most_max_open_conversations(tmp_path: Path) -> None:
    """Past the window the chat extended longest ago is written as it stands: its later requests are their own."""
    c0, c1, c2 = (logged_conversation("nested", {"messages": _chat(i, exchanges=2)}) for i in range(3))
    # with two open: c2's first request closes c0, whose second request then comes alone and closes c1's folded chat
    write_lines(tmp_path / "log.jsonl", [c0[0], c1[0], c2[0], c1[1], c2[1], c0[1]])
    wide = split(list(iter_source(spec(paths=("log.jsonl",)), tmp_path)))
    narrow = split(list(iter_source(spec(paths=("log.jsonl",), fold=Fold(max_open=2)), tmp_path)))
    off = split(list(iter_source(spec(paths=("log.jsonl",), fold=Fold(enabled=False)), tmp_path)))
    assert (len(wide[0]), len(wide[1])) == (3, 3)
    assert (len(narrow[0]), len(narrow[1])) == (4, 2)  # the first chat closed before its second request came
    assert (len(off[0]), len(off[1])) == (6, 0)


def test_a_fold_never_holds_more_than_max_open() -> None:
    fold: PrefixFold[int] = PrefixFold(max_open=5)
    out = []
    for i in range(50):
        row = log_row("nested", [{"role": "user", "content": f"q{i}"}], {"role": "assistant", "content": "a"})
        out += [held.tag for held, folded in fold.add(read_exchange(row), i)]
        assert len(fold._open) <= 5
    out += [held.tag for held in fold.close()]
    assert sorted(out) == list(range(50))


def test_a_chat_goes_on_across_the_files_of_one_source(tmp_path: Path) -> None:
    """Daily logs: a chat that began before midnight folds into its requests of the next day's file."""
    logged = logged_conversation("nested", {"messages": CHAT})
    write_lines(tmp_path / "day1.jsonl", logged[:2])
    write_lines(tmp_path / "day2.jsonl", logged[2:])
    source = spec(paths=("day*.jsonl",))
    kept, skipped = split(list(iter_source(source, tmp_path)))
    assert [turns(c) for c in kept] == [expected_turns(CHAT)]
    assert [s.detail for s in skipped] == ["folded into day1.jsonl:2", "folded into day2.jsonl:1"]
    # one part: the fold follows a chat across the source, whatever the workers
    assert len(source_parts(source, tmp_path, 4)) == 1


@pytest.mark.parametrize("take", [Take(fraction=0.5, seed=1), Take(count=4, seed=2)])
def test_a_take_chooses_among_conversations_not_requests(tmp_path: Path, take: Take) -> None:
    chats = [{"messages": _chat(i, exchanges=3)} for i in range(10)]
    write_lines(tmp_path / "log.jsonl", [row for chat in chats for row in logged_conversation("nested", chat)])
    kept, skipped = split(list(iter_source(spec(paths=("log.jsonl",), take=take), tmp_path)))
    assert all(len(c.messages) == 6 for c in kept)  # never a chat's early request alone
    assert {s.reason for s in skipped} == {FOLDED_PREFIX}
    if take.count is not None:
        assert len(kept) == 4
    again = split(list(iter_source(spec(paths=("log.jsonl",), take=take), tmp_path)))[0]
    assert [c.id for c in again] == [c.id for c in kept]


def test_a_mapping_may_name_the_log_style_and_other_styles_never_fold(tmp_path: Path) -> None:
    logged = logged_conversation("flat_choices", {"messages": CHAT})
    write_lines(tmp_path / "log.jsonl", logged)
    assert len(split(list(iter_source(spec(paths=("log.jsonl",), mapping=Mapping(style="log")), tmp_path)))[0]) == 1
    # read as plain messages rows, a flat log's answers are not in its messages: the first request has no assistant
    # turn (skipped); the later ones end on a user turn (trimmed) and none is folded
    kept, skipped = split(list(iter_source(spec(paths=("log.jsonl",), mapping=Mapping(style="messages")), tmp_path)))
    assert [(s.reason, s.location) for s in skipped] == [("no_assistant_turn", "log.jsonl:1")]
    assert [turns(c) for c in kept] == [expected_turns(CHAT[:3], reasoning=False),
                                        expected_turns(CHAT[:5], reasoning=False)]


def _chat(i: int, *, exchanges: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for turn in range(exchanges):
        messages += [{"role": "user", "content": f"chat {i} asks question {turn}"},
                     {"role": "assistant", "content": f"chat {i} answers {turn}", "reasoning_content": f"r {i}.{turn}"}]
    return messages


# --- the fold, checked against the conversations the logs were made from ---------------------------------------

_TEXT = st.text(alphabet="abc xyz", min_size=1, max_size=6).map(str.strip).filter(bool)


@st.composite
def _conversations(draw: st.DrawFn) -> list[list[dict[str, Any]]]:
    count = draw(st.integers(1, 6))
    conversations = []
    for number in range(count):
        messages: list[dict[str, Any]] = []
        if draw(st.booleans()):
            messages.append({"role": "system", "content": draw(_TEXT)})
        for turn in range(draw(st.integers(1, 4))):
            answer = {"role": "assistant", "content": f"{number}.{turn} {draw(_TEXT)}"}
            if draw(st.booleans()):
                answer["reasoning_content"] = draw(_TEXT)
            messages += [{"role": "user", "content": draw(_TEXT)}, answer]
        conversations.append(messages)
    return conversations


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_conversations(), st.sampled_from(WITH_REASONING), st.booleans(), st.randoms(use_true_random=False))
def test_folded_logs_give_back_the_conversations_they_were_made_from(
        tmp_path: Path, conversations: list[list[dict[str, Any]]], shape: str, sessions: bool,
        rng: random.Random) -> None:
    """Each conversation logged request by request (histories without reasoning), the chats interleaved at random,
    with or without session ids: the readers give back every conversation exactly once, reasoning included, and
    count every other request as folded."""
    queues = [logged_conversation(shape, {"messages": messages}, session=f"s{i}" if sessions else None)
              for i, messages in enumerate(conversations)]
    logged = []
    while any(queues):
        queue = rng.choice([q for q in queues if q])
        logged.append(queue.pop(0))
    kept, skipped = read(write_lines(tmp_path / "log.jsonl", logged))
    assert Counter(map(lambda c: orjson.dumps(turns(c)), kept)) == Counter(
        orjson.dumps(expected_turns(messages)) for messages in conversations)
    assert Counter(s.reason for s in skipped) == Counter({FOLDED_PREFIX: len(logged) - len(conversations)})


# --- the fold's rules, each pinned by the conversations and ledger it gives ---------------------------------------

QUESTION = {"role": "user", "content": "q"}


def _call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _answered(turn: dict[str, Any]) -> list[dict[str, Any]]:
    """What follows an answer sent back in a history: its calls' results (each call with an id), else a user turn."""
    calls = [call for call in turn.get("tool_calls") or () if isinstance(call, dict) and "id" in call]
    if calls:
        return [{"role": "tool", "tool_call_id": call["id"], "content": "done"} for call in calls]
    return [{"role": "user", "content": "next"}]


def _first_fate(served: dict[str, Any], sent_back: dict[str, Any], tmp_path: Path) -> str:
    """What becomes of a request whose answer is ``served`` when the next request sends it back as ``sent_back``:
    folded into it, or read on its own (kept, or its skip reason)."""
    first = log_row("nested", [QUESTION], served)
    second = log_row("nested", [QUESTION, sent_back, *_answered(sent_back)], {"role": "assistant", "content": "end"})
    kept, skipped = read(write_lines(tmp_path / "log.jsonl", [first, second]))
    fates = [s.reason for s in skipped if s.location == "log.jsonl:1"]
    fates += ["kept" for c in kept if c.provenance.source_line == 1]
    [fate] = fates
    return fate


def _assistant(content: Any = None, **fields: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **fields}


def _calling(call_id: str, name: str, arguments: Any, content: str | None = None) -> dict[str, Any]:
    return _assistant(content, tool_calls=[_call(call_id, name, arguments)])


@pytest.mark.parametrize(("served", "sent_back", "fate"), [
    (_assistant("<think>r</think>  4."), _assistant("4."), FOLDED_PREFIX),  # the think block is not the text
    (_assistant("a</think>b</think>4."), _assistant("4."), FOLDED_PREFIX),  # the last one closes it
    (_assistant("a</think>4."), _assistant("b</think>4."), FOLDED_PREFIX),
    (_assistant("4."), _assistant("5."), "kept"),
    (_calling("c1", "f", '{"q": 1}'), _calling("c9", "f", '{"q": 1}', ""), FOLDED_PREFIX),  # ids are the client's
    (_calling("c1", "f", '{"q": 1}'), _calling("c1", "f", '{"q": 2}'), "kept"),
    (_calling("c1", "f", '{"q": 1}'), _calling("c1", "g", '{"q": 1}'), "kept"),
    (_calling("c1", "f", "{}", "x"), _assistant("x"), "kept"),
    (_calling("c1", "f", {"a": 1, "b": [2, {"d": 4, "c": 3}]}),
     _calling("c1", "f", {"b": [2, {"c": 3, "d": 4}], "a": 1}), FOLDED_PREFIX),  # an object: its keys in any order
    (_calling("c1", "f", {"a": 1}), _calling("c1", "f", {"a": 2}), "kept"),
    (_calling("c1", "f", {"a": 1, "b": 2}), _calling("c1", "f", '{"b":2,  "a": 1}'), FOLDED_PREFIX),  # written again
    (_calling("c1", "f", '{"a": 1}'), _calling("c1", "f", '{"a": 1.5}'), "kept"),
    (_calling("c1", "f", "not json"), _calling("c1", "f", "not json"), FOLDED_PREFIX),
    (_calling("c1", "f", "not json"), _calling("c1", "f", "not json!"), "kept"),
    (_calling("c1", "f", None), _calling("c1", "f", "null"), FOLDED_PREFIX),
    (_assistant(None, tool_calls=[{"id": "1", "name": "f", "arguments": {"q": 1}}]),  # calls without their wrapper
     _assistant(None, tool_calls=[{"id": "2", "name": "f", "arguments": {"q": 1}}]), FOLDED_PREFIX),
    (_assistant(None, tool_calls=[{"id": "1", "name": "f", "arguments": {"q": 1}}]),
     _assistant(None, tool_calls=[{"id": "1", "name": "f", "arguments": {"q": 2}}]), "kept"),
    (_assistant(None, function_call={"name": "f", "arguments": "{}"}),  # OpenAI's legacy call
     _assistant("", function_call={"name": "f", "arguments": "{}"}), FOLDED_PREFIX),
    (_assistant(None, function_call={"name": "f", "arguments": "{}"}),
     _assistant(None, function_call={"name": "f", "arguments": '{"a": 1}'}), "kept"),
    (_assistant("x", tool_calls=["a"]), _assistant("x", tool_calls=["a"]), FOLDED_PREFIX),  # calls the readers refuse
    (_assistant("x", tool_calls=["a"]), _assistant("x", tool_calls=["b"]), "bad_tool_call"),
    (_assistant("x", tool_calls="a"), _assistant("x", tool_calls="b"), "bad_tool_call"),
    (_assistant([{"type": "image_url", "image_url": {"url": "u"}}]),  # content the readers refuse, compared as JSON
     _assistant([{"image_url": {"url": "u"}, "type": "image_url"}]), FOLDED_PREFIX),
    (_assistant([{"type": "image_url", "image_url": {"url": "u"}}]),
     _assistant([{"type": "image_url", "image_url": {"url": "v"}}]), "non_string_content"),
    (_assistant(5), _assistant("5"), FOLDED_PREFIX),  # content that is no text, sent back as its JSON text
], ids=["think", "two-thinks", "think-in-both", "other-text", "call-ids", "call-arguments", "call-names", "no-calls",
        "object-arguments", "other-object-arguments", "object-and-its-text", "other-text-arguments",
        "text-arguments", "other-non-json-arguments", "null-arguments", "flat-calls", "other-flat-calls", "legacy-call",
        "other-legacy-call", "junk-calls", "other-junk-calls", "calls-not-a-list", "parts", "other-parts", "number"])
def test_an_answer_is_matched_on_its_text_and_calls(tmp_path: Path, served: dict[str, Any], sent_back: dict[str, Any],
                                                    fate: str) -> None:
    """The served answer and the one the next request sends back are the same turn when their text (without a think
    block, stripped) and their calls (name and arguments; an object's keys in any order) are: not their reasoning,
    nor the ids a client gives its calls."""
    assert _first_fate(served, sent_back, tmp_path) == fate


@pytest.mark.parametrize("session", [None, "S"])
def test_the_request_just_before_is_folded_not_every_open_request_of_the_chat(tmp_path: Path,
                                                                             session: str | None) -> None:
    """A log out of order (the second request logged before the first): the third request folds the one just before
    it; the first, open beside it, is let out as its own conversation (the fold looks for every earlier request of
    a chat only when the one just before is missing)."""
    logged = logged_conversation("nested", {"messages": CHAT}, session=session)
    kept, skipped = read(write_lines(tmp_path / "log.jsonl", [logged[1], logged[0], logged[2]]))
    assert [(s.location, s.detail) for s in skipped] == [("log.jsonl:1", "folded into log.jsonl:3")]
    assert [turns(c) for c in kept] == [expected_turns(CHAT[:3]), [*expected_turns(CHAT[:3], reasoning=False),
                                                                   *expected_turns(CHAT[3:])]]


def test_when_the_request_before_is_missing_every_earlier_open_request_of_the_chat_is_folded(tmp_path: Path) -> None:
    """The third request missing, the first two logged out of order: the fourth folds both, each answer with the
    reasoning it was served with (the third's never logged)."""
    chat = [*CHAT, {"role": "user", "content": "Bye"},
            {"role": "assistant", "content": "Bye.", "reasoning_content": "Close politely."}]
    logged = logged_conversation("nested", {"messages": chat})
    kept, skipped = read(write_lines(tmp_path / "log.jsonl", [logged[1], logged[0], logged[3]]))
    assert [(s.location, s.detail) for s in skipped] == [("log.jsonl:2", "folded into log.jsonl:3"),
                                                        ("log.jsonl:1", "folded into log.jsonl:3")]
    [conversation] = kept
    assert turns(conversation) == [*expected_turns(chat[:5]), ("user", "Thanks!", None),
                                   ("assistant", "You are welcome.", None), *expected_turns(chat[7:])]
    assert conversation.provenance.folded_requests == 3


def test_a_missing_request_folds_the_earlier_ones_of_its_own_session_only(tmp_path: Path) -> None:
    """Sessions A and B begin alike; B's second request is missing: B's third folds B's first, never A's."""
    logged_a, logged_b = (logged_conversation("nested", {"messages": CHAT}, session=name) for name in "AB")
    kept, skipped = read(write_lines(tmp_path / "log.jsonl", [logged_a[0], logged_b[0], logged_b[2]]))
    assert [(s.location, s.detail) for s in skipped] == [("log.jsonl:2", "folded into log.jsonl:3")]
    assert [turns(c) for c in kept] == [expected_turns(CHAT[:3]), [
        *expected_turns(CHAT[:3]), *expected_turns(CHAT[3:5], reasoning=False), *expected_turns(CHAT[5:])]]


def test_past_max_open_the_chat_extended_longest_ago_is_let_out_first(tmp_path: Path) -> None:
    """Two open at most: the third chat's first request lets out the first chat's (extended longest ago); the first
    chat's second request then comes alone and lets out the second chat, whose last request was older than the
    third's. Conversations come out as their chats are let out."""
    c0, c1, c2 = ([{"role": "user", "content": f"chat {i} asks"}, {"role": "assistant", "content": f"{i} says"},
                   {"role": "user", "content": f"chat {i} asks again"}, {"role": "assistant", "content": f"{i} again"}]
                  for i in range(3))
    l0, l1, l2 = (logged_conversation("nested", {"messages": chat}) for chat in (c0, c1, c2))
    write_lines(tmp_path / "log.jsonl", [l0[0], l1[0], l2[0], l1[1], l2[1], l0[1]])
    kept, skipped = split(list(iter_source(spec(paths=("log.jsonl",), fold=Fold(max_open=2)), tmp_path)))
    assert [(c.provenance.source_line, turns(c)) for c in kept] == [
        (1, expected_turns(c0[:2])), (4, expected_turns(c1)), (5, expected_turns(c2)), (6, expected_turns(c0))]
    assert [(s.source, s.reason, s.location, s.detail) for s in skipped] == [
        ("src", FOLDED_PREFIX, "log.jsonl:2", "folded into log.jsonl:4"),
        ("src", FOLDED_PREFIX, "log.jsonl:3", "folded into log.jsonl:5")]


def test_one_open_chat_is_enough_for_a_chat_logged_in_order_and_none_is_refused() -> None:
    fold: PrefixFold[int] = PrefixFold(max_open=1)
    out = []
    for line, row in enumerate(logged_conversation("nested", {"messages": CHAT})):
        out += [(held.tag, folded) for held, folded in fold.add(read_exchange(row), line)]
    out += [(held.tag, False) for held in fold.close()]
    assert out == [(0, True), (1, True), (2, False)]
    with pytest.raises(ValueError) as refused:
        PrefixFold(max_open=0)
    assert str(refused.value) == "max_open must be at least 1"


def test_the_fold_remembers_a_chat_beginning_only_while_a_request_of_it_is_open() -> None:
    """Memory is bounded by the open chats: each open request counts its chat's first exchange once, and none is
    remembered once every chat is let out."""
    fold: PrefixFold[int] = PrefixFold(max_open=3)
    chats = [logged_conversation("nested", {"messages": _chat(i % 5, exchanges=3)}) for i in range(8)]
    for line, row in enumerate(row for rows in zip(*chats, strict=True) for row in rows):
        list(fold.add(read_exchange(row), line))
        assert sum(fold._heads.values()) == len(fold._open) <= 3
    list(fold.close())
    assert fold._heads == {} and len(fold._open) == 0


@pytest.mark.parametrize(("finish_reason", "flags"), [("length", [FLAG_TRUNCATED]), ("stop", [])])
def test_an_earlier_answer_served_cut_flags_the_chat_it_is_folded_into(tmp_path: Path, finish_reason: str,
                                                                       flags: list[str]) -> None:
    history, answer = exchanges(CHAT)[0]
    later_history, later_answer = exchanges(CHAT)[1]
    lines = [log_row("nested", history, answer, finish_reason=finish_reason),
             log_row("nested", later_history, later_answer), log_row("nested", later_history, later_answer)]
    kept, _ = read(write_lines(tmp_path / "log.jsonl", lines))  # the third line a copy: the flag is carried twice
    assert [c.flags for c in kept] == [flags]


def test_reasoning_goes_to_the_answer_that_lacks_it_from_a_field_or_a_think_block(tmp_path: Path) -> None:
    """The first answer was served with its reasoning in a think block, the second in a field; the client sent the
    first back with reasoning of its own (kept), the second without (the served one is carried)."""
    first = log_row("nested", [QUESTION], _assistant("<think>served one</think>a1"))
    second = log_row("nested", [QUESTION, _assistant("a1", reasoning_content="the client's"), {"role": "user",
                                                                                              "content": "q2"}],
                     _assistant("a2", reasoning_content="served two"))
    third = log_row("nested", [QUESTION, _assistant("a1", reasoning_content="the client's"),
                               {"role": "user", "content": "q2"}, _assistant("a2"), {"role": "user", "content": "q3"}],
                    _assistant("a3"))
    only_block = log_row("nested", [{"role": "user", "content": "other"}], _assistant("<think>blocked</think>b1"))
    after_block = log_row("nested", [{"role": "user", "content": "other"}, _assistant("b1"),
                                     {"role": "user", "content": "more"}], _assistant("b2"))
    kept, _ = read(write_lines(tmp_path / "log.jsonl", [first, second, third, only_block, after_block]))
    assert [turns(c) for c in kept] == [
        [("user", "q", None), ("assistant", "a1", "the client's"), ("user", "q2", None),
         ("assistant", "a2", "served two"), ("user", "q3", None), ("assistant", "a3", None)],
        [("user", "other", None), ("assistant", "b1", "blocked"), ("user", "more", None), ("assistant", "b2", None)]]


def test_reasoning_is_carried_only_to_a_turn_with_the_served_text(tmp_path: Path) -> None:
    """The history repeats an answer then a second assistant turn, which the readers merge into one (consecutive_turns:
    merge): the merged turn is not the answer served, so the served reasoning stays out of it."""
    first = log_row("nested", [QUESTION], _assistant("a1", reasoning_content="R1"))
    second = log_row("nested", [QUESTION, _assistant("a1"), _assistant("a1b"), {"role": "user", "content": "q2"}],
                     _assistant("a2", reasoning_content="R2"))
    kept, skipped = read(write_lines(tmp_path / "log.jsonl", [first, second]))
    assert [s.location for s in skipped] == ["log.jsonl:1"]
    assert [turns(c) for c in kept] == [[("user", "q", None), ("assistant", "a1\n\na1b", None), ("user", "q2", None),
                                         ("assistant", "a2", "R2")]]


def test_a_chat_read_as_prompts_folds_into_one_prompt(tmp_path: Path) -> None:
    """A prompts source keeps no assistant turn: nothing takes the carried reasoning, the cut flag still goes."""
    first = log_row("nested", [QUESTION], _assistant("a1", reasoning_content="R1"), finish_reason="length")
    second = log_row("nested", [QUESTION, _assistant("a1"), {"role": "user", "content": "q2"}],
                     _assistant("a2", reasoning_content="R2"))
    write_lines(tmp_path / "log.jsonl", [first, second])
    kept, skipped = split(list(iter_source(spec(kind="prompts", paths=("log.jsonl",)), tmp_path)))
    assert [(turns(c), c.flags) for c in kept] == [([("user", "q", None), ("user", "q2", None)], [FLAG_TRUNCATED])]
    assert [s.location for s in skipped] == ["log.jsonl:1"]


@pytest.mark.parametrize(("odd", "reason"), [("a string", "bad_messages"), ({"content": "no role"}, "unknown_role")])
def test_a_turn_without_a_role_does_not_stop_the_fold(tmp_path: Path, odd: Any, reason: str) -> None:
    """A history with a turn the readers refuse: the request before it is still folded into it (the chat is one,
    though the readers then skip it)."""
    first = log_row("nested", [odd, QUESTION], _assistant("a1"))
    second = log_row("nested", [odd, QUESTION, _assistant("a1"), {"role": "user", "content": "q2"}], _assistant("a2"))
    _, skipped = read(write_lines(tmp_path / "log.jsonl", [first, second]))
    assert [(s.reason, s.location) for s in skipped] == [(FOLDED_PREFIX, "log.jsonl:1"), (reason, "log.jsonl:2")]


def test_turns_json_cannot_hold_are_matched_by_their_text(tmp_path: Path) -> None:
    """A parquet log with a binary field in its turns (orjson refuses bytes): two chats that differ only there are
    still two, each folded into its own last request."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def asks(blob: bytes) -> dict[str, Any]:
        return {"role": "user", "content": "same", "blob": blob}

    rows = [log_row("nested", [asks(blob)], _assistant("a")) for blob in (b"\x01", b"\x02")]
    rows += [log_row("nested", [asks(blob), _assistant("a"), {"role": "user", "content": "more"}],
                     _assistant(f"b{blob[0]}")) for blob in (b"\x01", b"\x02")]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "log.parquet")
    kept, skipped = split(list(iter_file(tmp_path / "log.parquet")))
    assert [(s.location, s.detail) for s in skipped] == [("log.parquet#0", "folded into log.parquet#2"),
                                                        ("log.parquet#1", "folded into log.parquet#3")]
    assert [turns(c)[-1] for c in kept] == [("assistant", "b1", None), ("assistant", "b2", None)]


def test_a_copy_carries_what_the_request_before_it_left_then_what_its_twin_did(tmp_path: Path) -> None:
    """The first request logged twice with the same answer but other reasoning, each followed by the same second
    request: the last line keeps the reasoning its own request before it was served with."""
    first = log_row("nested", [QUESTION], _assistant("a1", reasoning_content="first serving"))
    again = log_row("nested", [QUESTION], _assistant("a1", reasoning_content="second serving"))
    second = log_row("nested", [QUESTION, _assistant("a1"), {"role": "user", "content": "q2"}], _assistant("a2"))
    kept, skipped = read(write_lines(tmp_path / "log.jsonl", [first, second, again, second]))
    assert [(s.location, s.detail) for s in skipped] == [
        ("log.jsonl:1", "folded into log.jsonl:2"), ("log.jsonl:3", "folded into log.jsonl:4"),
        ("log.jsonl:2", "folded into log.jsonl:4")]
    [conversation] = kept
    assert turns(conversation)[1] == ("assistant", "a1", "second serving")
    assert conversation.provenance.folded_requests == 4


# --- which choice and which fields of a logged request are read ----------------------------------------------------

SERVED_BY_SHAPE = {  # how the second request of CHAT was served, as each shape records it
    "nested": {"enable_thinking": True, "model": "tiny/target", "sampling": {"temperature": 0.6},
               "finish_reason": "stop", "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}},
    "litellm_payload": {"enable_thinking": True, "model": "tiny/target", "sampling": {"temperature": 0.6},
                        "finish_reason": "stop", "reasoning_effort": "medium",
                        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}},
    "langfuse_api": {"enable_thinking": None, "model": "tiny/target",
                     "sampling": {"temperature": 0.6, "max_tokens": 512}, "finish_reason": None,
                     "usage": {"input": 11, "output": 7, "total": 18}},
    "langfuse_export": {"enable_thinking": None, "model": "tiny/target",
                        "sampling": {"temperature": 0.6, "max_tokens": 512}, "finish_reason": None,
                        "usage": {"input": 11, "output": 7}},
    "flat_output": {"enable_thinking": True, "model": "tiny/target", "sampling": {"temperature": 0.6},
                    "finish_reason": "stop"},
}


@pytest.mark.parametrize("shape", SERVED_BY_SHAPE)
def test_how_a_request_was_served_is_read_whole_from_each_shape(shape: str) -> None:
    history, answer = exchanges(CHAT)[1]
    exchange = read_exchange(log_row(shape, history, answer, session="S"))
    assert exchange.served().to_json() == SERVED_BY_SHAPE[shape]
    assert exchange.session == "S"


ANSWER = {"role": "assistant", "content": "a"}


@pytest.mark.parametrize(("row", "served"), [
    ({"request": {"messages": [QUESTION], "reasoning_effort": "high", "enable_thinking": False},
      "response": {"choices": [{"message": ANSWER}]}},
     {"enable_thinking": False, "model": None, "sampling": {}, "finish_reason": None, "reasoning_effort": "high"}),
    ({"request": {"messages": [QUESTION]}, "model": "row-model", "usage": {"completion_tokens": 3, "note": "x"},
      "response": {"model": "served-model", "choices": [{"message": ANSWER, "finish_reason": "length"}]}},
     {"enable_thinking": None, "model": "row-model", "sampling": {}, "finish_reason": "length",
      "usage": {"completion_tokens": 3}}),  # the record's model before the completion's; its usage, numbers only
    ({"request": {"messages": [QUESTION], "model": 5}, "response": {"model": "served-model", "choices": [
        {"message": ANSWER}], "usage": {"prompt_tokens": 2}}},
     {"enable_thinking": None, "model": "served-model", "sampling": {}, "finish_reason": None,
      "usage": {"prompt_tokens": 2}}),  # no model named as text: the completion's
    ({"messages": [QUESTION], "model_parameters": '{"enable_thinking": true, "top_k": 20}', "output": "a",
      "finish_reason": 7},
     {"enable_thinking": True, "model": None, "sampling": {"top_k": 20}, "finish_reason": None}),
])
def test_the_served_fields_are_read_where_each_log_keeps_them(row: dict[str, Any], served: dict[str, Any]) -> None:
    assert read_exchange(row).served().to_json() == served


@pytest.mark.parametrize(("messages", "mode"), [
    ([{"role": "user", "content": "solve it /no_think  \n"}], False),  # trailing spaces after the switch
    ([{"role": "user", "content": "/no_think solve it"}], None),  # a switch must end the turn
    ([{"role": "user", "content": "plain"}, {"role": "tool", "content": "done /no_think"}], None),  # the user's turn
    ([{"role": "user", "content": [{"type": "text", "text": "solve"}, {"type": "text", "text": "/think"}]}], True),
    ([{"role": "system", "content": "be brief /no_think"}], None),  # no user turn at all
    (["not a turn", {"role": "user", "content": "go /think"}], True),
])
def test_the_soft_switch_is_read_at_the_end_of_the_last_user_turn(messages: list[Any], mode: bool | None) -> None:
    row = {"request": {"messages": messages}, "response": {"choices": [{"message": ANSWER}]}}
    assert read_exchange(row).served().enable_thinking is mode


@pytest.mark.parametrize(("response", "answer", "finish_reason"), [
    ({"status_code": 200, "body": {"choices": [{"message": {"role": "assistant", "content": "batched"},
                                                "finish_reason": "stop"}]}}, "batched", "stop"),
    ({"choices": [{"delta": {"content": "streamed"}, "finish_reason": "length"}]}, "streamed", "length"),
    ({"choices": [{"message": {"content": "first"}}, {"message": {"content": "second"}}]}, "first", "row's"),
    ([{"role": "assistant", "content": "n=2, first"}, {"role": "assistant", "content": "n=2, second"}], "n=2, first",
     "row's"),
    (["a message as text", "another"], "a message as text", "row's"),  # Langfuse's texts of an n > 1 call
])
def test_the_first_choice_is_the_answer_and_its_finish_reason_the_row_s_unless_it_has_one(
        response: Any, answer: str, finish_reason: str) -> None:
    exchange = read_exchange({"messages": [QUESTION], "response": response, "finish_reason": "row's"})
    assert (exchange.answer, exchange.finish_reason) == ({"role": "assistant", "content": answer}, finish_reason)


@pytest.mark.parametrize(("row", "detail"), [
    ({"response": None, "error_str": "LiteLLM: 429"}, "error: LiteLLM: 429"),
    ({"response": None, "error": "500", "error_str": "ignored"}, "error: 500"),
    ({"response": {"id": "x"}}, "the response holds no answer message"),
])
def test_a_request_without_an_answer_names_the_error_the_log_kept(row: dict[str, Any], detail: str) -> None:
    with pytest.raises(BadRow) as skipped:
        read_exchange({"messages": [QUESTION], **row})
    assert (skipped.value.reason, skipped.value.detail) == ("no_answer", detail)


@pytest.mark.parametrize("messages", [[], "hi", None])
def test_a_request_without_a_list_of_messages_is_bad_messages(messages: Any) -> None:
    with pytest.raises(BadRow) as skipped:
        read_exchange({"request": {"model": "m", "messages": messages}, "response": {"choices": [{"message": ANSWER}]},
                       "messages": messages})
    assert (skipped.value.reason, skipped.value.detail) == ("bad_messages",
                                                            "the logged request has no list of messages")


def test_a_langfuse_finish_reason_is_read_from_its_metadata_and_its_input_may_carry_tools() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    api = read_exchange({"input": {"messages": [QUESTION], "tools": tools}, "output": "streamed",
                         "metadata": {"finish_reason": "length", "session_id": "L1"}})
    export = read_exchange({"input": orjson.dumps([QUESTION]).decode(), "output": "x",
                            "metadata": '{"finish_reason": "stop"}'})
    odd = read_exchange({"input": [QUESTION], "output": "x", "metadata": "not json"})
    assert (odd.finish_reason, odd.session) == (None, None)
    assert (api.messages, api.tools, api.finish_reason, api.session) == ([QUESTION], tools, "length", "L1")
    assert (export.messages, export.tools, export.finish_reason, export.session) == ([QUESTION], None, "stop", None)


@pytest.mark.parametrize(("row", "tools"), [
    ({"request": {"messages": [QUESTION]}, "tools": ["row"]}, ["row"]),  # beside the request: the row's
    ({"request": {"messages": [QUESTION], "tools": ["request"]}, "tools": ["row"]}, ["request"]),
    ({"messages": [QUESTION], "tools": ["flat"]}, ["flat"]),
])
def test_a_request_s_tools_before_the_record_s(row: dict[str, Any], tools: list[str]) -> None:
    assert read_exchange({**row, "response": {"choices": [{"message": ANSWER}]}}).tools == tools


def test_the_first_field_that_holds_a_request_body_is_the_request() -> None:
    """A nested record may keep other fields under names the readers look at (a raw body text, an input string):
    the request body found first stands."""
    row = {"request": {"messages": [QUESTION], "model": "m"}, "body": "raw text", "input": "the prompt",
           "response": {"choices": [{"message": ANSWER}]}}
    exchange = read_exchange(row)
    assert (exchange.messages, exchange.model()) == ([QUESTION], "m")
    flat = read_exchange({"messages": [QUESTION], "input": [{"role": "user", "content": "other"}], "output": "a"})
    assert flat.messages == [QUESTION]  # a flat record's messages before Langfuse's input


@pytest.mark.parametrize(("row", "logged"), [
    ({"input": "x"}, False), ({"output": "y"}, False), ({"input": [QUESTION], "output": "a"}, True),
    ({"request": {"input": "embed me"}, "response": {}}, False),  # a body without messages
    ({"request": {"messages": "hi"}, "response": {}}, False),
    ({"request": {"messages": [QUESTION]}}, True), ({"messages": [QUESTION], "choices": []}, True),
    ({"messages": [QUESTION]}, False),
])
def test_what_makes_a_row_a_logged_request(row: dict[str, Any], logged: bool) -> None:
    assert is_log_row(row) is logged


@pytest.mark.parametrize(("first", "second", "apart"), [
    ({"metadata": {"session_id": "A"}}, {"metadata": {"session_id": "B"}}, True),  # LiteLLM's payload
    ({"metadata": '{"session_id": "A"}'}, {"metadata": '{"session_id": "B"}'}, True),
    ({"metadata": {"user": "u"}}, {"metadata": {"user": "u"}}, False),  # metadata without a session
    ({"session_id": True}, {"session_id": 1.5}, False),  # neither text nor an integer: no session
    ({"session_id": ""}, {"session_id": ""}, False),
    ({"request_properties": {"Helicone-Session-Id": 7}}, {"request_properties": {"Helicone-Session-Id": 8}}, True),
])
def test_sessions_are_read_where_gateways_keep_them(tmp_path: Path, first: dict[str, Any], second: dict[str, Any],
                                                    apart: bool) -> None:
    """Two chats that begin alike, each with what its gateway records: apart by their sessions, or one prefix."""
    begin = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    rows = []
    for extra, topic in ((first, "joke"), (second, "poem")):
        chat = [*begin, {"role": "user", "content": f"a {topic}"}, {"role": "assistant", "content": topic}]
        rows.append([{**log_row("flat_choices", history, answer, thinking=None), **extra}
                     for history, answer in exchanges(chat)])
    kept, folded = read(write_lines(tmp_path / "log.jsonl", [rows[0][0], rows[1][0], rows[0][1], rows[1][1]]))
    assert [(s.location, s.detail) for s in folded] == (
        [("log.jsonl:1", "folded into log.jsonl:3"), ("log.jsonl:2", "folded into log.jsonl:4")] if apart else
        [("log.jsonl:1", "folded into log.jsonl:2"), ("log.jsonl:2", "folded into log.jsonl:3")])
    assert len(kept) == 2


def test_only_text_parts_are_joined() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}]  # the Responses API's type: not joined
    exchange = read_exchange({"messages": [{"role": "user", "content": parts}, QUESTION], "output": "x"})
    assert exchange.turns()[0] == {"role": "user", "content": parts}


# --- the native scan: what it reads, and the same rows and ledger as the lines read whole -------------------------

def _varied_log() -> list[dict[str, Any] | bytes]:
    """Nested-shape requests of several chats interleaved, with what the scan leaves to the whole read beside them:
    a session, a batch wrapper, a record's own finish reason, metadata; a chat's cut answer, a think block, tool
    calls, a request logged twice, a missing request, a history sent back with its keys in another order, a bad line
    and a blank one."""
    lines: list[dict[str, Any] | bytes] = []
    for number, (history, answer) in enumerate(exchanges(CHAT)):
        lines.append(log_row("nested", history, answer, finish_reason="length" if number == 0 else "stop"))
    think = [{"role": "user", "content": "why?"}, {"role": "assistant", "content": "<think>hm</think> because"},
             {"role": "user", "content": "sure?"}, {"role": "assistant", "content": "yes"}]
    lines[1:1] = [log_row("nested", history, answer) for history, answer in exchanges(think)]
    lines += [row for row in tool_conversations() if "request" in row]
    lines.append(lines[2])  # logged twice
    sessions = exchanges([{"role": "user", "content": "s"}, {"role": "assistant", "content": "a"},
                          {"role": "user", "content": "t"}, {"role": "assistant", "content": "b"}])
    lines += [log_row("nested", history, answer, session="S1") for history, answer in sessions]
    wrapped = log_row("nested", *sessions[0])
    lines.append({**wrapped, "response": {"status_code": 200, "body": wrapped["response"]}})
    lines.append(log_row("nested", *sessions[1]))
    own_reason = exchanges([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
                            {"role": "user", "content": "z"}, {"role": "assistant", "content": "w"}])
    first = log_row("nested", *own_reason[0])
    del first["response"]["choices"][0]["finish_reason"]  # the record's own applies: cut, carried to the chat
    lines += [{**first, "finish_reason": "length"}, log_row("nested", *own_reason[1])]
    gap = exchanges([*CHAT, {"role": "user", "content": "more?"}, {"role": "assistant", "content": "no"}])
    lines += [log_row("nested", *gap[0]), log_row("nested", *gap[3])]  # the requests between are missing
    mixed = exchanges([{"role": "user", "content": "m"}, {"role": "assistant", "content": "n"},
                       {"role": "user", "content": "o"}, {"role": "assistant", "content": "p"},
                       {"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}])
    reordered = [{key: turn[key] for key in reversed(turn)} for turn in mixed[2][0]]  # its keys in another order
    lines += [log_row("nested", *mixed[0]),  # scanned, then read whole (metadata), then scanned again
              {**log_row("nested", *mixed[1]), "metadata": {"team": "t"}}, log_row("nested", reordered, mixed[2][1])]
    lines += [b"{not json", b""]
    return lines


def _rows(items: list[Conversation | Skipped]) -> list[object]:
    return [item.to_row() if isinstance(item, Conversation) else item for item in items]


@pytest.mark.parametrize("max_open", [50_000, 2])
def test_scanned_lines_give_the_rows_and_ledger_of_the_lines_read_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_open: int) -> None:
    path = write_lines(tmp_path / "log.jsonl", _varied_log())
    log = spec(paths=("log.jsonl",), fold=Fold(max_open=max_open))
    scanned = [scan_line(line) for line in path.read_bytes().splitlines() if line.startswith(b'{"')]
    assert sum(isinstance(line, ScannedExchange) for line in scanned) >= 10  # the scan, not the whole read, took most
    fast = list(iter_source(log, tmp_path))
    monkeypatch.setattr(source_module, "scan_line", orjson.loads)  # every line read whole, as before the scan
    whole = list(iter_source(log, tmp_path))
    assert _rows(fast) == _rows(whole)
    assert Counter(item.reason for item in whole if isinstance(item, Skipped))[FOLDED_PREFIX] >= 8


@pytest.mark.parametrize("block_lines", [1, 2, 3, 7])
def test_the_scan_hands_lines_on_in_blocks_each_row_at_its_line_whatever_the_blocks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, block_lines: int) -> None:
    """A block of lines is scanned in one loop, and a block holding a line the scan refuses (not JSON, blank) is
    read line by line: the rows, the ledger and every location are the same as when each line is read alone."""
    varied = _varied_log()
    write_lines(tmp_path / "log.jsonl", [*varied[:9], b"{cut", b"", *varied[9:], b"  ", *varied[:4]])
    log = spec(paths=("log.jsonl",))
    monkeypatch.setattr(readers_module, "SCAN_BLOCK_LINES", 1)  # each line a block of its own
    alone = _rows(list(iter_source(log, tmp_path)))
    assert [(row.reason, row.location) for row in alone if isinstance(row, Skipped) and row.reason != FOLDED_PREFIX
            ][:2] == [("invalid_json", "log.jsonl:10"), ("invalid_json", f"log.jsonl:{len(varied) + 3 - 2}")]
    monkeypatch.setattr(readers_module, "SCAN_BLOCK_LINES", block_lines)
    assert _rows(list(iter_source(log, tmp_path))) == alone


def test_a_cut_compressed_log_gives_its_rows_before_the_error_as_read_line_by_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines are taken a block at a time; the rows before a cut in the file still come before its error (here the
    ledger entries of the chats' first requests, each folded into the next line)."""
    rows = [orjson.dumps(log_row("nested", history, answer)) for number in range(400)
            for history, answer in exchanges([{"role": "user", "content": f"q{number}"}, _assistant(f"a{number}"),
                                              {"role": "user", "content": "more"}, _assistant("b")])]
    path = tmp_path / "log.jsonl.zst"
    data = zstandard.ZstdCompressor().compress(b"\n".join(rows) + b"\n")
    path.write_bytes(data[:-7])

    def until_the_error() -> tuple[list[object], str]:
        found: list[object] = []
        with pytest.raises(CorpusError, match="truncated zstd stream") as error:
            found.extend(iter_file(path))
        return _rows(found), str(error.value)

    monkeypatch.setattr(readers_module, "SCAN_BLOCK_LINES", 1)
    alone = until_the_error()
    monkeypatch.setattr(readers_module, "SCAN_BLOCK_LINES", 256)
    assert until_the_error() == alone and len(alone[0]) > 256


def test_a_chat_folds_across_scanned_and_read_lines_its_turns_in_any_key_order(tmp_path: Path) -> None:
    """The second request is read whole (its metadata), the first and third are scanned; the third sends its history
    back with every turn's keys in another order: one conversation, the first two requests folded into the last."""
    mixed = exchanges([{"role": "user", "content": "m"}, {"role": "assistant", "content": "n"},
                       {"role": "user", "content": "o"}, {"role": "assistant", "content": "p"},
                       {"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}])
    reordered = [{key: turn[key] for key in reversed(turn)} for turn in mixed[2][0]]
    lines = [log_row("nested", *mixed[0]), {**log_row("nested", *mixed[1]), "metadata": {"team": "t"}},
             log_row("nested", reordered, mixed[2][1])]
    assert [type(scan_line(orjson.dumps(line))) for line in lines] == [ScannedExchange, dict, ScannedExchange]
    kept, skipped = read(write_lines(tmp_path / "log.jsonl", lines))
    assert [(s.location, s.detail) for s in skipped] == [("log.jsonl:1", "folded into log.jsonl:2"),
                                                        ("log.jsonl:2", "folded into log.jsonl:3")]
    assert [text for _, text, _ in turns(kept[0])] == ["m", "n", "o", "p", "q", "r"]


def test_a_turn_sent_back_with_a_field_it_was_sent_without_is_another_turn(tmp_path: Path) -> None:
    """A field left out is not the same as one sent as null: the later request is a chat of its own."""
    first = log_row("nested", [{"role": "user", "content": "q"}], _assistant("a"))
    second = log_row("nested", [{"role": "user", "content": "q", "name": None}, _assistant("a"),
                                {"role": "user", "content": "q2"}], _assistant("a2"))
    kept, skipped = read(write_lines(tmp_path / "log.jsonl", [first, second]))
    assert len(kept) == 2 and skipped == []


def test_the_scan_takes_the_nested_shape_with_no_session_and_leaves_the_rest_to_the_whole_read() -> None:
    history, answer = exchanges(CHAT)[0]
    scanned = scan_line(orjson.dumps(log_row("nested", history, answer, finish_reason="length")))
    assert isinstance(scanned, ScannedExchange)
    assert scanned.turns == [Turn(**turn) for turn in history] and scanned.turn_count == 2
    assert scanned.answer == ScannedAnswer(content=answer["content"], reasoning_content=answer["reasoning_content"])
    assert scanned.finish_reason == "length"
    nested = log_row("nested", history, answer)
    other = log_row("nested", history, {"role": "assistant", "content": "other"})
    calling = log_row("nested", history, _calling("c1", "f", "{}"))
    for row in (log_row("nested", history, answer, session="S"), log_row("helicone", history, answer),
                {**nested, "metadata": {"session_id": "S"}}, {**nested, "finish_reason": "length"},
                {**nested, "request": {**nested["request"], "session_id": "S"}},
                {**nested, "response": {**other["response"], "status_code": 200, "body": nested["response"]}},
                {"request": {"messages": []}, "response": {"choices": [{"message": answer}]}},
                {"request": {"messages": history}, "response": {"choices": [{"message": None}]}},
                {"request": {"messages": history}, "response": {"choices": [{"message": {"role": "assistant"}}]}},
                {"request": {"messages": [*history, {"role": "user", "content": "x", "extra": 1}]},
                 "response": nested["response"]},
                calling):
        assert scan_line(orjson.dumps(row)) == row
    with pytest.raises(orjson.JSONDecodeError):  # refused as the readers refuse it: invalid UTF-8 in a skipped field
        scan_line(orjson.dumps({**nested, "note": "x"}).replace(b'"note":"x"', b'"note":"\xff"'))


def test_a_scanned_line_that_orjson_refuses_is_skipped_as_the_readers_skip_it(tmp_path: Path) -> None:
    """msgspec skips a field the scan does not read, so it scans a number JSON cannot hold there; the readers refuse
    the line."""
    line = b'{"request":{"messages":[{"role":"user","content":"q"}],"temperature":1e999},' \
           b'"response":{"choices":[{"message":{"content":"a"}}]}}'
    assert isinstance(scan_line(line), ScannedExchange)
    kept, skipped = read(write_lines(tmp_path / "log.jsonl", [line]))
    assert kept == [] and [(s.reason, s.location) for s in skipped] == [("invalid_json", "log.jsonl:1")]
