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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corpus_builder.errors import Skipped
from corpus_builder.recipe.model import Fold, Mapping, Take
from corpus_builder.records import FLAG_TRUNCATED, Conversation
from corpus_builder.sources import iter_source
from corpus_builder.sources.fold import FOLDED_KEY, FOLDED_PREFIX, PrefixFold
from corpus_builder.sources.logs import read_exchange
from corpus_builder.sources.source import source_parts
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
    served = conversation.provenance["served"]
    assert served["model"] == "tiny/target"
    assert served["sampling"]["temperature"] == 0.6
    # the template flag where the log keeps the request; LiteLLM's payload keeps the reasoning effort; Langfuse neither
    assert served["enable_thinking"] is (None if shape.startswith("langfuse") else True)
    assert served["finish_reason"] == (None if shape.startswith("langfuse") else "stop")
    assert conversation.thinking_mode is with_reasoning


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
    assert kept[0].provenance["served"]["usage"] == {"completion_tokens": 5}


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
    assert _read_one(tmp_path, row)[0][0].provenance["served"]["enable_thinking"] is mode


@pytest.mark.parametrize(("ending", "mode"), [("/no_think", False), ("/think", True), ("no switch", None)])
def test_a_soft_switch_ending_the_last_user_turn_is_the_mode(tmp_path: Path, ending: str, mode: bool | None) -> None:
    row = {"request": {"messages": [{"role": "user", "content": f"solve it {ending}"}]},
           "response": {"choices": [{"message": {"role": "assistant", "content": "a"}}]}}
    assert _read_one(tmp_path, row)[0][0].provenance["served"]["enable_thinking"] is mode


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
    assert conversation.provenance["source_line"] == 3
    assert conversation.provenance[FOLDED_KEY] == 3


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
    assert conversation.provenance["source_line"] == 4
    assert conversation.provenance[FOLDED_KEY] == 4


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
    assert all("session_id" not in c.provenance for c in with_sessions)  # a log's session ids are not published
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
    path = write_lines(tmp_path / "log.jsonl", [c0[0], c1[0], c2[0], c1[1], c2[1], c0[1]])
    wide = split(list(iter_source(spec(paths=("log.jsonl",)), tmp_path)))
    narrow = split(list(iter_source(spec(paths=("log.jsonl",), fold=Fold(max_open=2)), tmp_path)))
    off = split(list(iter_source(spec(paths=("log.jsonl",), fold=Fold(enabled=False)), tmp_path)))
    assert (len(wide[0]), len(wide[1])) == (3, 3)
    assert (len(narrow[0]), len(narrow[1])) == (4, 2)  # the first chat closed before its second request came
    assert (len(off[0]), len(off[1])) == (6, 0)
    assert path.exists()


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
    # read as plain messages rows, a flat log's answers are not in its messages: no assistant turn, skipped
    plain = split(list(iter_source(spec(paths=("log.jsonl",), mapping=Mapping(style="messages")), tmp_path)))
    assert {s.reason for s in plain[1]} == {"no_assistant_turn"} or not plain[0]


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
