"""EndpointPool against real HTTP servers: the scriptable fault server, and (marked vllm) a real vLLM."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.generate.client import EndpointPool
from corpus_builder.generate.types import (
    GenerationIncomplete,
    PermanentError,
    RetriesExhausted,
    TurnRequest,
    TurnResult,
)
from corpus_builder.testing.fault_server import Fault, FaultServer, count_tokens

MODEL = "fault-model"
SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_tokens": 64, "seed": 3}
T = TypeVar("T")
E = TypeVar("E", bound=Exception)


def turn(text: str, *, thinking: bool = True, model: str = MODEL) -> TurnRequest:
    messages = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": text})
    return TurnRequest(messages=messages, sampling=SAMPLING, enable_thinking=thinking, model=model)


def with_pool(urls: list[str], action: Callable[[EndpointPool], Awaitable[T]], **options: Any) -> T:
    """Run ``action(pool)`` in a fresh event loop; fast backoff so retry tests stay quick."""
    settings: dict[str, Any] = {"timeout_s": 5.0, "max_retries": 3, "concurrency": 8, "backoff_base_s": 0.01}
    settings.update(options)

    async def main() -> T:
        async with EndpointPool(urls, **settings) as pool:
            return await action(pool)

    return asyncio.run(main())


def complete_with_counters(server: FaultServer, text: str, **options: Any) -> tuple[TurnResult, dict]:
    async def action(pool: EndpointPool) -> tuple[TurnResult, dict]:
        return await pool.complete(turn(text)), pool.counters.snapshot()

    return with_pool([server.base_url], action, **options)


def failed_completion(server: FaultServer, text: str, error_type: type[E], **options: Any) -> tuple[E, dict]:
    """The ``error_type`` that completing ``text`` must raise, and the fault counters after it."""
    async def action(pool: EndpointPool) -> tuple[E, dict]:
        with pytest.raises(error_type) as caught:
            await pool.complete(turn(text))
        return caught.value, pool.counters.snapshot()

    return with_pool([server.base_url], action, **options)


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


@pytest.fixture
def server() -> FaultServer:
    with FaultServer(model=MODEL) as fault_server:
        yield fault_server


# ---- request and response shape -----------------------------------------------------------------

@pytest.mark.parametrize("thinking", [True, False])
def test_request_body_and_result(server: FaultServer, thinking: bool) -> None:
    request = turn("What is 2 plus 2?", thinking=thinking)
    result = with_pool([server.base_url], lambda pool: pool.complete(request))

    (recorded,) = server.chat_requests
    body = recorded.body
    assert body["chat_template_kwargs"] == {"enable_thinking": thinking}  # top level, not in extra_body
    assert "extra_body" not in body
    assert body["return_token_ids"] is True and body["n"] == 1
    assert body["model"] == MODEL
    assert body["messages"] == list(request.messages)
    assert {key: body[key] for key in SAMPLING} == SAMPLING
    assert "max_completion_tokens" not in body

    assert result.endpoint == server.base_url and result.served_model == MODEL
    assert result.finish_reason == "stop"
    assert result.content == "Answer to What is 2 plus 2?."
    assert result.reasoning == ("Let me think about What is 2 plus 2?." if thinking else None)
    assert result.prompt_tokens == count_tokens(body["messages"]) == len(result.prompt_token_ids or [])
    assert result.completion_tokens == len(result.token_ids or []) > 0
    assert result.reasoning_tokens == (10 if thinking else 0)


@pytest.mark.parametrize(("kind", "content", "reasoning", "finish"), [
    ("legacy", "Answer to q.", "Let me think about q.", "stop"),  # older vLLM: message.reasoning_content
    ("raw_think", "Answer to q.", "Let me think about q.", "stop"),  # no reasoning parser: split </think>
    ("length", None, "Let me think about q. And more thinking", "length"),  # thinking cut by max_tokens
])
def test_reasoning_is_read_from_every_server_shape(server: FaultServer, kind: str, content: str | None,
                                                    reasoning: str, finish: str) -> None:
    server.by_prompt["q"] = Fault(kind)
    result, counters = complete_with_counters(server, "q")
    assert (result.content, result.reasoning, result.finish_reason) == (content, reasoning, finish)
    assert counters == {"retries": {}, "errors": {}}


# ---- retries ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "fault_class"), [
    ("429", "429"), ("408", "4xx"), ("500", "5xx"), ("503", "5xx"),
    ("reset", "connection"), ("stall", "timeout"), ("malformed", "malformed"), ("truncated", "connection"),
])
def test_transient_fault_is_retried_then_succeeds(server: FaultServer, kind: str, fault_class: str) -> None:
    server.by_prompt["q"] = Fault(kind)
    result, counters = complete_with_counters(server, "q", timeout_s=0.5)
    assert result.content == "Answer to q."
    assert len(server.chat_requests) == 2
    assert counters == {"retries": {fault_class: 1}, "errors": {}}


@pytest.mark.parametrize(("kind", "fault_class"), [
    ("500", "5xx"), ("429", "429"), ("reset", "connection"), ("malformed", "malformed"),
])
def test_retries_are_bounded_and_never_a_refusal(server: FaultServer, kind: str, fault_class: str) -> None:
    """Transient faults that outlast the retries leave the row unfinished (a rerun asks again); they are never
    reported as the server refusing it."""
    server.by_prompt["q"] = Fault(kind, times=100)
    error, counters = failed_completion(server, "q", RetriesExhausted, max_retries=2)
    assert not isinstance(error, PermanentError)
    assert len(server.chat_requests) == 3
    assert error.fault == fault_class and error.endpoint == server.base_url
    assert "gave up after 3 attempts" in str(error) and fault_class in str(error)
    assert counters == {"retries": {fault_class: 2}, "errors": {fault_class: 1}}


def test_timeout_retries_are_bounded(server: FaultServer) -> None:
    server.by_prompt["q"] = Fault("stall", times=100)
    error, counters = failed_completion(server, "q", RetriesExhausted, max_retries=1, timeout_s=0.3)
    assert error.fault == "timeout" and "timeout" in str(error)
    assert len(server.chat_requests) == 2
    assert counters == {"retries": {"timeout": 1}, "errors": {"timeout": 1}}


def test_context_overflow_is_permanent_and_not_retried() -> None:
    with FaultServer(model=MODEL, max_model_len=50) as server:
        error, counters = failed_completion(server, " ".join(["word"] * 100), PermanentError)
        assert error.status == 400 and error.endpoint == server.base_url
        assert "maximum context length is 50 tokens" in str(error) and "110 input tokens" in str(error)
        assert len(server.chat_requests) == 1
        assert counters == {"retries": {}, "errors": {"4xx": 1}}


@pytest.mark.parametrize("kind", ["429", "503"])
def test_retry_after_is_honoured(server: FaultServer, kind: str) -> None:
    server.by_prompt["q"] = Fault(kind, retry_after=1)
    result, counters = complete_with_counters(server, "q")
    first, second = server.chat_requests
    assert second.time - first.time >= 1.0  # the backoff alone would be at most 10 ms
    assert result.content == "Answer to q."
    assert sum(counters["retries"].values()) == 1


# ---- routing and failover -----------------------------------------------------------------------

def test_requests_go_to_the_endpoint_with_fewest_in_flight() -> None:
    slow = {"slow": Fault("stall")}
    with FaultServer(model=MODEL, by_prompt=slow, stall_s=0.5) as a, \
            FaultServer(model=MODEL, by_prompt=slow, stall_s=0.5) as b:

        async def action(pool: EndpointPool) -> tuple[str, list[str], list[str]]:
            slow_task = asyncio.create_task(pool.complete(turn("slow")))
            while not a.chat_requests:  # ties go to the first endpoint
                await asyncio.sleep(0.005)
            while_busy = [(await pool.complete(turn(f"quick {i}"))).endpoint for i in range(3)]
            slow_endpoint = (await slow_task).endpoint
            burst = await asyncio.gather(*(pool.complete(turn(f"burst {i}")) for i in range(32)))
            return slow_endpoint, while_busy, [r.endpoint for r in burst]

        slow_endpoint, while_busy, burst = with_pool([a.base_url, b.base_url], action)
        assert slow_endpoint == a.base_url
        assert while_busy == [b.base_url] * 3  # a had one request in flight, b none
        assert burst.count(a.base_url) == burst.count(b.base_url) == 16


def test_failover_when_an_endpoint_dies_and_recovery_after_recheck() -> None:
    with FaultServer(model=MODEL) as a, FaultServer(model=MODEL) as b:

        async def action(pool: EndpointPool) -> dict[str, Any]:
            async def run(prefix: str, count: int) -> list[str]:
                results = await asyncio.gather(*(pool.complete(turn(f"{prefix} {i}")) for i in range(count)))
                return [r.endpoint for r in results]

            before = await run("before", 8)
            a.die()
            during = await run("during", 16)
            down = pool.up()[a.base_url]
            a.revive()
            for _ in range(200):
                if pool.up()[a.base_url]:
                    break
                await asyncio.sleep(0.01)
            after = await run("after", 8)
            return {"before": before, "during": during, "down": down, "after": after,
                    "counters": pool.counters.snapshot()}

        outcome = with_pool([a.base_url, b.base_url], action, cooldown_s=0.1, recheck_interval_s=0.02)
        assert set(outcome["before"]) == {a.base_url, b.base_url}
        assert outcome["during"] == [b.base_url] * 16  # every request answered, by the survivor
        assert outcome["down"] is False
        assert outcome["counters"]["retries"]["connection"] >= 1 and outcome["counters"]["errors"] == {}
        assert a.base_url in outcome["after"]  # the re-check brought it back


def test_a_recovered_endpoint_serves_again_while_requests_fill_the_pool() -> None:
    """Health checks have their own connections: an endpoint that comes back is probed and takes traffic even
    while stalled requests hold every connection of the main pool."""
    stalls = {"stall": Fault("stall", times=100)}
    with FaultServer(model=MODEL, by_prompt=stalls, stall_s=3.0) as busy, FaultServer(model=MODEL) as back:
        back.die()

        async def action(pool: EndpointPool) -> tuple[list[str], float]:
            await pool.check(MODEL)
            stalled = [asyncio.create_task(pool.complete(turn("stall"))) for _ in range(2)]
            while len(busy.chat_requests) < 2:  # both connections of the pool are now taken
                await asyncio.sleep(0.01)
            back.revive()
            started = asyncio.get_running_loop().time()
            while not pool.up()[back.base_url]:
                await asyncio.sleep(0.01)
            waited = asyncio.get_running_loop().time() - started  # the probe got through the full pool
            for task in stalled:
                task.cancel()
            await asyncio.gather(*stalled, return_exceptions=True)
            answered = await asyncio.gather(*(pool.complete(turn(f"after {i}")) for i in range(4)))
            return [r.endpoint for r in answered], waited

        endpoints, waited = with_pool([busy.base_url, back.base_url], action, concurrency=2, timeout_s=10,
                                      cooldown_s=0.05, recheck_interval_s=0.02)
        assert waited < 2.0  # well before a stalled request freed a connection
        assert back.base_url in endpoints  # and it takes traffic again


def test_no_endpoint_answering_stops_the_run_instead_of_spending_every_retry() -> None:
    with FaultServer(model=MODEL) as server:
        server.die()
        started = time.monotonic()

        async def action(pool: EndpointPool) -> None:
            await pool.complete(turn("q"))

        with pytest.raises(GenerationIncomplete, match="no endpoint has answered for"):
            with_pool([server.base_url], action, max_retries=1000, max_outage_s=0.5, backoff_max_s=0.05)
        assert time.monotonic() - started < 5


def test_a_dead_launched_server_stops_the_run_at_the_first_connection_failure() -> None:
    with FaultServer(model=MODEL) as server:
        server.die()
        checks: list[bool] = []

        def alive() -> None:
            checks.append(True)
            raise GenerationIncomplete("the vLLM server exited with code -9 while serving")

        async def action(pool: EndpointPool) -> None:
            await pool.complete(turn("q"))

        with pytest.raises(GenerationIncomplete, match="exited with code -9"):
            with_pool([server.base_url], action, max_retries=1000, alive=alive)
        assert checks == [True] and len(server.chat_requests) <= 1


def test_a_failing_endpoint_is_avoided_on_retry_then_taken_out() -> None:
    broken = {i: Fault("500") for i in range(1000)}
    with FaultServer(model=MODEL, by_index=broken) as a, FaultServer(model=MODEL) as b:

        async def action(pool: EndpointPool) -> tuple[list[str], dict, dict]:
            endpoints = [(await pool.complete(turn(f"q {i}"))).endpoint for i in range(10)]
            return endpoints, pool.counters.snapshot(), pool.up()

        endpoints, counters, up = with_pool([a.base_url, b.base_url], action, recheck_interval_s=0,
                                            max_consecutive_failures=5)
        assert endpoints == [b.base_url] * 10  # each failure on a was retried on b
        assert len(a.chat_requests) == 5 and up[a.base_url] is False  # then a was taken out
        assert counters == {"retries": {"5xx": 5}, "errors": {}}


# ---- health checks ------------------------------------------------------------------------------

def test_check_reports_each_endpoint_and_routes_around_an_unhealthy_one() -> None:
    with FaultServer(model=MODEL, max_model_len=2048) as a, FaultServer(model=MODEL) as b:
        b.healthy = False

        async def action(pool: EndpointPool) -> tuple[list, list[str]]:
            infos = await pool.check(MODEL)
            results = await asyncio.gather(*(pool.complete(turn(f"q {i}")) for i in range(4)))
            return infos, [r.endpoint for r in results]

        infos, endpoints = with_pool([a.base_url, b.base_url], action, recheck_interval_s=0)
        good, bad = infos
        assert (good.healthy, good.models, good.max_model_len, good.engine_version, good.error) == (
            True, [MODEL], 2048, a.version, None)
        assert not bad.healthy and "HTTP 503" in (bad.error or "")
        assert endpoints == [a.base_url] * 4


def test_check_fails_when_no_endpoint_is_healthy(server: FaultServer) -> None:
    server.healthy = False
    dead = closed_port_url()
    with pytest.raises(CorpusError) as caught:
        with_pool([server.base_url, dead], lambda pool: pool.check())
    message = str(caught.value)
    assert "no healthy generation endpoint" in message
    assert f"{server.base_url}: GET /health answered HTTP 503" in message
    assert f"{dead}: unreachable" in message


def test_check_rejects_an_endpoint_serving_another_model(server: FaultServer) -> None:
    with pytest.raises(CorpusError, match="does not serve model 'other-model'"):
        with_pool([server.base_url], lambda pool: pool.check("other-model"))

    with FaultServer(model="other-model") as other:

        async def action(pool: EndpointPool) -> tuple[list, list[str]]:
            infos = await pool.check(MODEL)
            await asyncio.sleep(0.1)  # several re-checks: its /health is fine, it must stay out anyway
            results = await asyncio.gather(*(pool.complete(turn(f"q {i}")) for i in range(4)))
            return infos, [r.endpoint for r in results]

        infos, endpoints = with_pool([other.base_url, server.base_url], action, cooldown_s=0.01,
                                     recheck_interval_s=0.01)
        assert [info.healthy for info in infos] == [False, True]
        assert endpoints == [server.base_url] * 4 and not other.chat_requests


# ---- preflight, URLs, credentials ---------------------------------------------------------------

def test_credentials_are_sent_but_never_reported(server: FaultServer) -> None:
    with_secret = server.root_url.replace("http://", "http://user:s3cret@")  # no /v1: the pool adds it
    result = with_pool([with_secret], lambda pool: pool.complete(turn("q")))
    assert result.endpoint == server.base_url
    assert (server.chat_requests[0].authorization or "").startswith("Basic ")

    with_pool([server.base_url], lambda pool: pool.complete(turn("q")), api_key="k-123")
    assert server.chat_requests[1].authorization == "Bearer k-123"


def test_an_endpoint_that_is_not_a_url_is_a_user_error() -> None:
    with pytest.raises(CorpusError, match="not an http"):
        EndpointPool(["localhost:8000"], timeout_s=1, max_retries=0, concurrency=1)


# ---- a real vLLM server -------------------------------------------------------------------------

@pytest.mark.vllm
@pytest.mark.parametrize("thinking", [True, False])
def test_real_vllm_completion(vllm_server: Any, thinking: bool) -> None:
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_tokens": 48, "seed": 11}
    request = TurnRequest(messages=({"role": "user", "content": "What is two plus two?"},), sampling=sampling,
                          enable_thinking=thinking, model=vllm_server.model)

    async def action(pool: EndpointPool) -> tuple[list, TurnResult]:
        infos = await pool.check(vllm_server.model)
        return infos, await pool.complete(request)

    infos, result = with_pool([vllm_server.base_url], action, timeout_s=120)
    (info,) = infos
    assert info.healthy and vllm_server.model in info.models
    assert info.max_model_len and info.engine_version
    assert result.served_model == vllm_server.model and result.finish_reason in ("stop", "length")
    assert result.prompt_token_ids and len(result.prompt_token_ids) == result.prompt_tokens
    assert result.token_ids and len(result.token_ids) == result.completion_tokens <= 48
    if thinking:
        # The template pre-opens <think>: the output starts inside the reasoning.
        assert result.reasoning
        if result.finish_reason == "length" and result.content is None:
            assert result.reasoning_tokens == result.completion_tokens
    else:
        assert result.reasoning is None and result.content is not None


@pytest.mark.vllm
def test_real_vllm_context_overflow_is_permanent(vllm_server: Any) -> None:
    request = TurnRequest(messages=({"role": "user", "content": "word " * 5000},), sampling={"max_tokens": 8},
                          enable_thinking=True, model=vllm_server.model)

    async def action(pool: EndpointPool) -> tuple[int, PermanentError, dict]:
        max_model_len = (await pool.check(vllm_server.model))[0].max_model_len or 0
        with pytest.raises(PermanentError) as caught:
            await pool.complete(request)
        return max_model_len, caught.value, pool.counters.snapshot()

    max_model_len, error, counters = with_pool([vllm_server.base_url], action, timeout_s=120)
    assert max_model_len == 2048
    assert error.status == 400 and "maximum context length" in str(error)
    assert counters == {"retries": {}, "errors": {"4xx": 1}}
