"""The generation scheduler against the fault-injecting OpenAI-compatible server (corpus_builder.testing)."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
import zstandard

from corpus_builder.errors import CorpusError, Skipped
from corpus_builder.generate import GenerationProgress, Journal, generate, journal_coverage
from corpus_builder.generate.client import EndpointPool
from corpus_builder.generate.journal import turn_key
from corpus_builder.generate.scheduler import RunSettings, Scheduler, drive
from corpus_builder.records import (
    FLAG_TRUNCATED,
    FLAG_UNCLOSED_THINK,
    Conversation,
    Message,
    conversation_id,
    openai_messages,
)
from corpus_builder.testing.fault_server import Fault, FaultServer
from tests.support.generate_run import make_prompts, make_recipe

MODEL = "fault-model"


@pytest.fixture
def server():
    with FaultServer(model=MODEL) as fault_server:
        yield fault_server


def run(server: FaultServer, prompts, journal_dir: Path, **generation) -> list[Conversation | Skipped]:
    return list(generate(prompts, make_recipe(MODEL, **generation), journal_dir, endpoints=[server.base_url]))


def request_for(server: FaultServer, user_text: str) -> dict:
    """The body of the last chat request whose final user turn is ``user_text``."""
    bodies = [r.body for r in server.chat_requests if r.body["messages"][-1]["content"] == user_text]
    assert bodies, f"no request ended with {user_text!r}"
    return bodies[-1]


@pytest.mark.parametrize("history_reasoning", ["keep", "drop"])
def test_turn_two_is_generated_on_the_regenerated_turn_one(server, tmp_path, history_reasoning):
    prompts = make_prompts(3, turns=2)
    rows = run(server, prompts, tmp_path, history_reasoning=history_reasoning)

    assert len(server.chat_requests) == 6
    row = rows[1]
    assert [m.role for m in row.messages] == ["system", "user", "assistant", "user", "assistant"]
    first = row.messages[2]
    assert first.content == f"Answer to {prompts[1].messages[1].content}."
    assert first.reasoning == f"Let me think about {prompts[1].messages[1].content}."
    body = request_for(server, prompts[1].messages[2].content)
    sent_history = body["messages"][2]
    expected = {"role": "assistant", "content": first.content}
    if history_reasoning == "keep":
        expected["reasoning_content"] = first.reasoning
    assert sent_history == expected
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    assert body["top_k"] == 20 and body["return_token_ids"] is True


def test_rows_carry_ids_provenance_and_token_ids(server, tmp_path):
    prompts = make_prompts(2, turns=2)
    rows = run(server, prompts, tmp_path)
    row = rows[0]
    assert row.id == conversation_id("prompts", prompts[0].messages)
    assert (row.source, row.origin, row.task, row.license) == ("prompts", "generated", "chat", "MIT")
    assert row.provenance.source_line == 1
    generation = row.provenance.generation
    assert generation.model == MODEL and generation.served_model == MODEL
    assert generation.engine_version == server.version
    assert generation.enable_thinking is True and generation.history_reasoning == "keep"
    assert generation.sampling == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 2048}
    assert generation.sample_index == 0
    turns = generation.turns
    assert [t.message_index for t in turns] == [2, 4]
    for turn in turns:
        assert turn.endpoint == server.base_url and turn.finish_reason == "stop"
        assert len(turn.token_ids) == turn.completion_tokens > 0
        assert len(turn.prompt_token_ids) == turn.prompt_tokens > 0
        assert turn.reasoning_tokens > 0 and turn.retried_for_length is False
    assert turns[1].prompt_tokens > turns[0].prompt_tokens  # turn two's prompt holds turn one


def test_thinking_off_is_sent_and_recorded(server, tmp_path):
    rows = run(server, make_prompts(1), tmp_path, enable_thinking=False)
    assert server.chat_requests[0].body["chat_template_kwargs"] == {"enable_thinking": False}
    assert rows[0].messages[-1].reasoning is None
    assert rows[0].provenance.generation.enable_thinking is False


def test_n_samples_give_distinct_ids_and_seeds(server, tmp_path):
    prompts = make_prompts(2)
    rows = run(server, prompts, tmp_path, n=3, seed=7)
    assert len(rows) == 6 and len(server.chat_requests) == 6
    assert [r.provenance.generation.sample_index for r in rows] == [0, 1, 2, 0, 1, 2]
    assert [r.id for r in rows[:3]] == [conversation_id("prompts", prompts[0].messages, salt=f"#{i}")
                                        for i in range(3)]
    assert len({r.id for r in rows}) == 6
    assert sorted(r.body["seed"] for r in server.chat_requests) == [7, 7, 8, 8, 9, 9]
    assert rows[2].provenance.generation.sampling["seed"] == 9


def test_extra_sampling_is_sent_recorded_and_keys_the_journal(server, tmp_path):
    prompts = make_prompts(2)
    extra = {"min_p": 0.05, "repetition_penalty": 1.1, "stop": ["</answer>"]}
    rows = run(server, prompts, tmp_path, extra_sampling=extra)
    assert all(r.body.items() >= extra.items() for r in server.chat_requests)
    assert rows[0].provenance.generation.sampling == {"temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                                            "max_tokens": 2048, **extra}
    run(server, prompts, tmp_path)  # other sampling: other journal keys, so generated again
    assert len(server.chat_requests) == 4
    run(server, prompts, tmp_path, extra_sampling=extra)  # the same sampling again: all from the journal
    assert len(server.chat_requests) == 4


def test_on_length_drop_skips_the_row(server, tmp_path):
    prompts = make_prompts(3)
    server.by_prompt[prompts[1].messages[1].content] = Fault("length")
    rows = run(server, prompts, tmp_path)
    assert [type(r).__name__ for r in rows] == ["Conversation", "Skipped", "Conversation"]
    assert rows[1].reason == "truncated_generation" and rows[1].location == "prompts.jsonl:2"
    assert rows[1].id == prompts[1].id


def test_on_length_keep_flags_the_row(server, tmp_path):
    prompts = make_prompts(1, turns=2)
    server.by_prompt[prompts[0].messages[1].content] = Fault("length")
    row = run(server, prompts, tmp_path, on_length="keep")[0]
    assert row.flags == [FLAG_TRUNCATED]
    assert row.messages[2].content == "" and row.messages[2].reasoning  # thinking cut: reasoning only
    assert row.provenance.generation.turns[0].finish_reason == "length"
    assert len(row.messages) == 5  # the conversation goes on after a kept truncated turn


def test_on_length_retry_doubles_max_tokens_once(server, tmp_path):
    prompts = make_prompts(2)
    server.by_prompt[prompts[0].messages[1].content] = Fault("length")  # only the first attempt
    server.by_prompt[prompts[1].messages[1].content] = Fault("length", times=2)  # the retry too
    rows = run(server, prompts, tmp_path, on_length="retry", max_tokens=100)
    assert isinstance(rows[0], Conversation) and not rows[0].flags
    assert rows[0].provenance.generation.turns[0].retried_for_length is True
    assert isinstance(rows[1], Skipped) and rows[1].reason == "truncated_generation"
    assert "max_tokens=200" in rows[1].detail
    assert sorted(r.body["max_tokens"] for r in server.chat_requests) == [100, 100, 200, 200]


def test_permanent_error_is_skipped_with_the_server_message_and_journaled(server, tmp_path):
    prompts = make_prompts(3)
    server.by_prompt[prompts[2].messages[1].content] = Fault("overflow", times=10)
    rows = run(server, prompts, tmp_path)
    assert isinstance(rows[2], Skipped) and rows[2].reason == "generation_error"
    assert "maximum context length" in rows[2].detail
    before = len(server.chat_requests)
    again = run(server, prompts, tmp_path)  # a 4xx refusal is deterministic: not asked again
    assert len(server.chat_requests) == before
    assert [r.id for r in again] == [r.id for r in rows] and again[2].detail == rows[2].detail


def test_exhausted_retries_leave_the_row_unfinished_and_not_journaled(server, tmp_path):
    prompts = make_prompts(1)
    server.by_prompt[prompts[0].messages[1].content] = Fault("500", times=1)
    rows = run(server, prompts, tmp_path, max_retries=0)
    assert isinstance(rows[0], Skipped) and rows[0].reason == "unfinished" and "HTTP 500" in rows[0].detail
    rows = run(server, prompts, tmp_path, max_retries=0)  # a transient failure is tried again
    assert isinstance(rows[0], Conversation)


def test_a_turn_that_never_leaves_the_think_block_is_flagged_unclosed(server, tmp_path):
    """EOS before </think>: everything is reasoning, the answer is empty; it is the unclosed-think case."""
    prompts = make_prompts(2)
    server.by_prompt[prompts[0].messages[1].content] = Fault("unclosed")
    rows = run(server, prompts, tmp_path)
    assert FLAG_UNCLOSED_THINK in rows[0].flags and rows[0].messages[-1].content == ""
    assert rows[0].messages[-1].reasoning and FLAG_UNCLOSED_THINK not in rows[1].flags
    off = run(server, make_prompts(1, words="plain"), tmp_path / "off", enable_thinking=False)
    assert FLAG_UNCLOSED_THINK not in off[0].flags  # thinking off: no block was ever open


def test_output_keeps_input_order_when_answers_arrive_out_of_order(tmp_path):
    prompts = make_prompts(12, turns=2)
    slow = {prompts[i].messages[1].content: Fault("stall", times=1) for i in (0, 5)}
    with FaultServer(model=MODEL, by_prompt=slow, stall_s=0.4) as server:
        rows = run(server, prompts, tmp_path, concurrency=6)
        arrival = [r.body["messages"][-1]["content"] for r in server.chat_requests]
    assert [r.id for r in rows] == [p.id for p in prompts]
    assert arrival.index(prompts[0].messages[1].content) < arrival.index(prompts[1].messages[2].content)


class CountingPool:
    """Wraps the HTTP pool: holds each request a little and records the most in flight at once."""

    def __init__(self, pool: EndpointPool, delay_s: float) -> None:
        self.pool = pool
        self.delay_s = delay_s
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls = 0

    async def complete(self, request):
        self.in_flight += 1
        self.calls += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s * (1 + self.calls % 3))
            return await self.pool.complete(request)
        finally:
            self.in_flight -= 1


def test_in_flight_and_window_bounds(server, tmp_path):
    prompts = make_prompts(40, turns=3)
    pulled = []

    def lazily():
        for prompt in prompts:
            pulled.append(prompt.id)
            yield prompt

    plan = RunSettings.from_recipe(make_recipe(MODEL, concurrency=5), window=8)
    loop = asyncio.new_event_loop()
    pool = EndpointPool([server.base_url], timeout_s=10, max_retries=0, concurrency=5)
    loop.run_until_complete(pool.__aenter__())
    counting = CountingPool(pool, delay_s=0.002)
    try:
        with Journal(tmp_path) as journal:
            scheduler = Scheduler(lazily(), plan, journal, counting.complete)
            rows = []
            for row in drive(loop, scheduler):
                rows.append(row)
                assert len(pulled) - len(rows) <= 8  # rows admitted but not yet yielded
    finally:
        loop.run_until_complete(pool.__aexit__(None, None, None))
        loop.close()
    assert [r.id for r in rows] == [p.id for p in prompts]
    assert counting.max_in_flight == 5  # reached, never exceeded
    assert len(server.chat_requests) == 120


def test_a_finished_request_sends_the_next_while_the_consumer_is_away(server, tmp_path):
    prompts = make_prompts(3)
    plan = RunSettings.from_recipe(make_recipe(MODEL, concurrency=1))

    async def consume() -> tuple[list[Conversation | Skipped], int]:
        async with EndpointPool([server.base_url], timeout_s=10, max_retries=0, concurrency=1) as pool:
            with Journal(tmp_path) as journal:
                scheduler = Scheduler(iter(prompts), plan, journal, pool.complete)
                rows = await scheduler.next_batch()
                # The consumer is busy with its first row and not asking for more; the slot is not idle.
                for _ in range(500):
                    if len(server.chat_requests) == len(prompts):
                        break
                    await asyncio.sleep(0.01)
                sent_while_away = len(server.chat_requests)
                while (batch := await scheduler.next_batch()) is not None:
                    rows += batch
        return rows, sent_while_away

    rows, sent_while_away = asyncio.run(consume())
    assert sent_while_away == 3
    assert [r.id for r in rows] == [p.id for p in prompts]


def test_identical_turns_in_flight_together_share_one_generation(server, tmp_path):
    prompts = [*make_prompts(2), make_prompts(1)[0]]  # the first prompt twice, both admitted at once
    assert prompts[2].messages == prompts[0].messages
    rows = run(server, prompts, tmp_path, concurrency=4)
    assert len(server.chat_requests) == 2  # one key, one generation: a rebuild yields the same rows
    assert rows[2].messages == rows[0].messages and rows[2].id == rows[0].id


@pytest.mark.parametrize("share", [False, True])
def test_identical_first_turns_of_different_conversations_get_their_own_samples(server, tmp_path, share):
    """A "Hello?" that opens many chats: each conversation gets its own sample of the answer, unless the recipe
    asks identical turns to share one generation."""
    def chat(follow_up: str) -> Conversation:
        messages = [Message("user", "Hello?"), Message("user", follow_up)]
        return Conversation(conversation_id("chats", messages), "chats", "prompt", messages)

    prompts = [chat("tell me a joke"), chat("what time is it?"), chat("bye")]
    rows = run(server, prompts, tmp_path, share_identical_turns=share)
    hellos = [r for r in server.chat_requests if r.body["messages"][-1]["content"] == "Hello?"]
    assert len(hellos) == (1 if share else 3)
    assert len({row.id for row in rows}) == 3


def test_journal_only_rebuild_and_coverage(server, tmp_path):
    prompts = make_prompts(4, turns=2)
    rows = run(server, prompts[:3], tmp_path)
    recipe = make_recipe(MODEL)
    rebuilt = list(generate(prompts[:3], recipe, tmp_path, endpoints=[], journal_only=True))
    assert [r.to_row() for r in rebuilt] == [r.to_row() for r in rows]

    coverage = journal_coverage(prompts, recipe, tmp_path)
    assert (coverage.rows, coverage.cached_rows, coverage.missing_rows) == (4, 3, 1)
    assert coverage.missing_examples[0].id == prompts[3].id and not coverage.complete
    with pytest.raises(CorpusError, match="not in the journal"):
        list(generate(prompts, recipe, tmp_path, endpoints=[], journal_only=True))


def test_progress_reports_rows_tokens_thinking_and_faults(server, tmp_path):
    prompts = make_prompts(5)
    server.by_prompt[prompts[0].messages[1].content] = Fault("429", times=1)
    stream = io.StringIO()
    progress = GenerationProgress(total=5, stream=stream, interval_s=0.0)
    list(generate(prompts, make_recipe(MODEL), tmp_path, endpoints=[server.base_url], progress=progress))
    last = stream.getvalue().splitlines()[-1]
    assert last.startswith("generate 5/5 rows (100.0%)")
    assert "tok/s" in last and "thinking " in last and "retries 429:1" in last
    assert progress.turns_generated == 5 and progress.reasoning_tokens > 0


def test_unknown_model_is_a_user_error(tmp_path):
    with FaultServer(model="other-model") as first, FaultServer(model="third-model") as second:
        recipe = make_recipe(MODEL)
        with pytest.raises(CorpusError, match="no endpoint serves the target model"):
            list(generate(make_prompts(1), recipe, tmp_path, endpoints=[first.base_url, second.base_url]))


def test_endpoint_credentials_never_reach_provenance(server, tmp_path):
    with_credentials = server.base_url.replace("http://", "http://user:s3cret@")
    rows = list(generate(make_prompts(2), make_recipe(MODEL), tmp_path, endpoints=[with_credentials]))
    endpoints = {turn.endpoint for row in rows for turn in row.provenance.generation.turns}
    assert endpoints == {server.base_url}
    for path in tmp_path.glob("segment-*.zst"):
        with path.open("rb") as file:
            journaled = zstandard.ZstdDecompressor().stream_reader(file, read_across_frames=True).read()
        assert server.base_url.encode() in journaled and b"s3cret" not in journaled


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_redraws_one_line_on_a_terminal_with_an_eta():
    now = [0.0]
    stream = FakeTTY()
    progress = GenerationProgress(total=10, stream=stream, clock=lambda: now[0])
    progress.start(samples_per_prompt=2)
    for _ in range(5):
        now[0] += 1.0
        progress.turn(100, 25, cached=False)
        progress.row(skipped=False, live=True)
    progress.finish()
    frames = stream.getvalue().split("\r\x1b[2K")[1:]
    assert len(frames) == 6 and stream.getvalue().endswith("\n")
    assert frames[-1].rstrip() == "generate 5/20 rows (25.0%) | 100 tok/s | thinking 25% | ETA 0m15s"


def test_a_journal_of_an_older_build_still_answers(tmp_path):
    """A record journaled before tool calls and the target's identity were (the answer, its ids and counts, the
    endpoint and the served model only) still rebuilds its row: no calls, the target's identity unknown."""
    prompt = make_prompts(1)[0]
    recipe = make_recipe(MODEL)
    settings = RunSettings.from_recipe(recipe)
    sent = tuple(openai_messages(prompt.messages, keep_history_reasoning=True, current=len(prompt.messages)))
    key = turn_key(sent, settings.sampling, model=MODEL, revision=None, enable_thinking=True, sample_index=0,
                   conversation=conversation_id(prompt.source, prompt.messages))
    old = {"content": "It is 0.", "reasoning": "zero plus zero", "finish_reason": "stop",
           "prompt_token_ids": [1, 2], "token_ids": [3, 4, 5], "prompt_tokens": 2, "completion_tokens": 3,
           "reasoning_tokens": 1, "endpoint": "http://127.0.0.1:1/v1", "served_model": MODEL}
    with Journal(tmp_path) as journal:
        journal.append(key, old)
    [row] = generate([prompt], recipe, tmp_path, endpoints=[], journal_only=True)
    assert isinstance(row, Conversation)
    assert row.messages[-1] == Message("assistant", "It is 0.", "zero plus zero")
    generation = row.provenance.generation
    assert generation is not None and generation.served_model == MODEL
    assert (generation.model_root, generation.dtype, generation.engine_version) == (None, None, None)
    assert [(turn.endpoint, turn.token_ids, turn.completion_tokens) for turn in generation.turns] == [
        ("http://127.0.0.1:1/v1", [3, 4, 5], 3)]
