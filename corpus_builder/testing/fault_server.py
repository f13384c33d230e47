"""A scriptable OpenAI-compatible (vLLM-like) server on 127.0.0.1 for client tests.

It answers ``/health``, ``/version``, ``/v1/models`` and ``/v1/chat/completions`` like a
vLLM server with a reasoning parser, runs its own event loop in a background thread, and records every
request (arrival time, path, JSON body). A fault plan, keyed by the index of a chat request or by the
text of its last user message, makes chosen requests fail in the ways real servers fail.

Tokens are whitespace-separated words (plus 4 per message for the template), so "too long" is easy to
build: a prompt of more than ``max_model_len`` words gets vLLM's 400 context-length error.

``/metrics`` holds vLLM's request and generated-token counters, and with ``speculative_tokens`` its
speculative-decoding counters too: each answered request adds drafts of ``speculative_tokens`` tokens of which
the first ``accepted_per_draft`` are accepted (0 tokens: counters that never move). ``foreign`` (chat request
index -> requests) counts requests of other clients as finished while that request is served (a server someone
else uses too). ``server_info`` is the ``vllm_config`` that ``/server_info`` tells, as vLLM's development mode does
(without it the route is missing, as on a production server), as JSON when asked ``config_format=json`` and as
text otherwise. ``drafts_in`` names the modes (``enable_thinking`` values) in which the speculator drafts at all
(an n-gram speculator finds nothing to copy in some outputs). The page holds the time per output token (20 ms a
request), and a response's own counts say 10 ms. ``page_faults`` (chat requests answered -> fault) serves a
broken counters page while that many requests are answered (``PAGE_FAULTS``); ``count_lag_reads`` reads of the
page after a request still show the counts from before it (a server that counts late; a page fault shows after
them). ``misreported`` adds
accepted tokens to every request's own counts; ``own_count_faults`` (chat request index -> fault) breaks the own
counts of chosen requests (``OWN_COUNT_FAULTS``). ``usage=False`` leaves ``usage`` out of answers; ``also_serves``
lists more served names; ``answers`` (last user message -> ``Scripted``) answers chosen prompts with a text of
their own, drafted with an acceptance of their own (requests of very different lengths and acceptance, an answer
that loops); ``on_chat`` is called with each chat request's index as it arrives (a test's hook to
change the world mid-run, e.g. fill the disk).

Tool calls, like a server with ``--enable-auto-tool-choice``: a request with ``tools`` whose last turn is the
user's (or any request with ``tool_choice`` "required" or a named function) is answered by calling each of its
tools (only the named one) with ``{"query": <the last user turn>}``; a request whose last turn is a tool's
result, with ``tool_choice`` "auto" or unset, is answered in text. So a recorded call to a tool with the same
arguments is what the server calls again, and tests can build both matching and differing recorded calls.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

# What a fault makes the server do with one chat request.
FAULT_KINDS = (
    "429",  # Too Many Requests (with Retry-After when given)
    "408",  # Request Timeout (retryable 4xx)
    "500",  # Internal Server Error
    "503",  # Service Unavailable (with Retry-After when given)
    "reset",  # abort the TCP connection (RST) without answering
    "stall",  # answer only after ``stall_s`` (past the client's timeout)
    "malformed",  # 200 with a body that is not JSON
    "length",  # thinking cut by max_tokens: reasoning only, content null, finish_reason "length"
    "unclosed",  # EOS inside the pre-opened think block: reasoning only, content null, finish_reason "stop"
    "overflow",  # 400 with vLLM's maximum-context-length message
    "raw_think",  # no reasoning parser: the reasoning stays in content, ending with </think>
    "legacy",  # an older server: reasoning in message.reasoning_content
    "truncated",  # 200 whose body stops short of its Content-Length (a connection cut mid-answer)
)


# What a broken /metrics page looks like (``page_faults``).
PAGE_FAULTS = (
    "cut",  # cut short in the middle of a sample line
    "nan",  # the accepted tokens' counter holds NaN
    "html",  # an HTML page (a proxy's, a web UI's)
    "missing_position",  # the sample of draft position 1 is left out
    "down",  # every counter at a quarter of its count (below the page before: counters that go down)
    "overdrafted",  # one draft token more per draft than the speculator drafts
    "extra_tokens",  # one generated token more a request than the answers held (another client's, as far as it shows)
    "status",  # HTTP 503 instead of the page
    "reset",  # the connection reset instead of an answer
)
# What a broken response's own counts look like (``own_count_faults``).
OWN_COUNT_FAULTS = (
    "missing",  # no metrics.speculative_decoding
    "overaccepted",  # more tokens accepted than drafted
    "overdrafted",  # one draft token more per draft than the speculator drafts
)
OWN_TPOT_MS = 10.0  # a response's own mean inter-token latency
PAGE_TPOT_S = 0.02  # each request's time per output token on the page


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    retry_after: float | None = None
    times: int = 1  # for prompt-keyed faults: how many requests with this prompt get the fault

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; known: {FAULT_KINDS}")


@dataclass(frozen=True, slots=True)
class Scripted:
    """How the server answers one prompt: ``text`` as the answer (no reasoning; its tokens are its words and the
    end of the turn), each verify step accepting ``accepted_per_draft`` of its drafted tokens."""

    text: str
    accepted_per_draft: int


@dataclass(frozen=True, slots=True)
class Recorded:
    time: float  # time.monotonic() at arrival
    path: str
    body: object  # decoded JSON body, or None for GET
    authorization: str | None = None  # the Authorization header, to check credentials are sent


def count_tokens(messages: list[dict[str, object]]) -> int:
    return sum(len(str(m.get("content") or "").split()) + 4 for m in messages)


def last_user_text(messages: list[dict[str, object]]) -> str:
    return next((str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")


def context_error(max_model_len: int, prompt_tokens: int) -> dict[str, object]:
    return {"error": {
        "message": (f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
                    f"contains {prompt_tokens} input tokens, which exceeds this limit even without any "
                    "output tokens. Please reduce the length of the input prompt."),
        "type": "BadRequestError", "param": "input_tokens", "code": 400}}


class FaultServer:
    """Use as ``with FaultServer(...) as server`` (or start()/close()); ``server.base_url`` ends in /v1."""

    def __init__(self, *, model: str = "fault-model", max_model_len: int = 4096,
                 by_index: dict[int, Fault] | None = None, by_prompt: dict[str, Fault] | None = None,
                 stall_s: float = 30.0, version: str = "0.32.0-fault", port: int = 0,
                 die_after: int | None = None, fault_mix: dict[str, float] | None = None, seed: int = 0,
                 root: str | None = None, speculative_tokens: int | None = None, accepted_per_draft: int = 0,
                 foreign: dict[int, int] | None = None, server_info: dict[str, object] | None = None,
                 per_request_metrics: bool = False, misreported: int = 0,
                 own_count_faults: dict[int, str] | None = None, drafts_in: tuple[bool, ...] = (True, False),
                 page_faults: dict[int, str] | None = None, count_lag_reads: int = 0, usage: bool = True,
                 on_chat: Callable[[int], None] | None = None, also_serves: tuple[str, ...] = (),
                 answers: dict[str, Scripted] | None = None, detailed: bool = False) -> None:
        self.model = model
        self.also_serves = also_serves  # other names /v1/models lists (the same weights served twice)
        self.max_model_len = max_model_len
        self.by_index = dict(by_index or {})
        self.by_prompt = dict(by_prompt or {})
        self.stall_s = stall_s
        self.version = version
        self.healthy = True
        self.dead = False
        self.root = root or f"/models/{model}"  # what /v1/models says the server loaded
        self.die_after = die_after  # chat requests answered before the server dies by itself (a crash mid-run)
        # kind -> share of the other chat requests that get it (e.g. {"500": 0.1, "reset": 0.1}), seeded
        self.fault_mix = dict(fault_mix or {})
        self._mix_random = random.Random(seed)
        self.speculative_tokens = speculative_tokens
        self.accepted_per_draft = accepted_per_draft
        self.answers = dict(answers or {})
        self.foreign = dict(foreign or {})
        self.server_info = server_info
        # vLLM's --per-request-spec-decode-metrics: each response carries its own counts (``misreported`` more
        # accepted tokens than it counted, a server whose two accounts disagree)
        self.per_request_metrics = per_request_metrics
        self.detailed = detailed  # --per-request-spec-decode-metrics detailed: each verify step's counts too
        self.misreported = misreported
        self.own_count_faults = dict(own_count_faults or {})
        self.drafts_in = drafts_in
        self.page_faults = dict(page_faults or {})
        for faults, known in ((self.page_faults, PAGE_FAULTS), (self.own_count_faults, OWN_COUNT_FAULTS)):
            unknown = set(faults.values()) - set(known)
            if unknown:
                raise ValueError(f"unknown fault(s) {sorted(unknown)}; known: {known}")
        self.count_lag_reads = count_lag_reads
        self._lagging: tuple[int, dict[str, int], list[float]] | None = None  # reads left, counts shown meanwhile
        self.usage = usage
        self.on_chat = on_chat
        self.counters = {"requests": 0, "tokens": 0, "drafts": 0, "draft_tokens": 0, "accepted": 0}
        self.accepted_by_position: list[float] = [0] * (speculative_tokens or 0)
        self.requests: list[Recorded] = []
        self._port = port
        self._chat_count = 0
        self._prompt_hits: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._closing: asyncio.Event | None = None

    # ---- lifecycle -------------------------------------------------------------------------------

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    @property
    def chat_requests(self) -> list[Recorded]:
        return [r for r in self.requests if r.path == "/v1/chat/completions"]

    def start(self) -> FaultServer:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True, name="fault-server")
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fault server did not start")
        return self

    def close(self) -> None:
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def die(self) -> None:
        """Stop listening and reset every request on already-open connections (a crashed server)."""
        self.dead = True
        self._call(self._stop_site())

    def revive(self) -> None:
        """Listen again on the same port."""
        self.dead = False
        self._call(self._start_site())

    def _call(self, coro: Coroutine[object, object, object]) -> None:
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._setup())
        ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _setup(self) -> None:
        self._closing = asyncio.Event()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/metrics", self._metrics)
        if self.server_info is not None:
            app.router.add_get("/server_info", self._server_info)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        await self._start_site()

    async def _start_site(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, "127.0.0.1", self._port, reuse_address=True)
        await self._site.start()
        # port 0 picks one: aiohttp only tells it through its (loosely typed) private server object
        self._port = self._site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _stop_site(self) -> None:
        if self._site is not None:
            await self._site.stop()
            self._site = None

    async def _shutdown(self) -> None:
        assert self._closing is not None and self._runner is not None
        self._closing.set()
        await self._runner.cleanup()

    # ---- handlers --------------------------------------------------------------------------------

    def _record(self, request: web.Request, body: object) -> None:
        self.requests.append(Recorded(time.monotonic(), request.path, body,
                                      request.headers.get("Authorization")))

    async def _health(self, request: web.Request) -> web.StreamResponse:
        self._record(request, None)
        if self.dead:
            return _reset(request)
        return web.Response(status=200 if self.healthy else 503)

    async def _version(self, request: web.Request) -> web.Response:
        self._record(request, None)
        return web.json_response({"version": self.version})

    async def _models(self, request: web.Request) -> web.Response:
        self._record(request, None)
        cards = [{"id": name, "object": "model", "owned_by": "vllm", "root": self.root,
                  "max_model_len": self.max_model_len} for name in (self.model, *self.also_serves)]
        return web.json_response({"object": "list", "data": cards})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self._record(request, body)
        index = self._chat_count
        self._chat_count += 1
        if self.on_chat is not None:
            self.on_chat(index)
        if self.die_after is not None and index >= self.die_after and not self.dead:
            self.dead = True
            asyncio.get_running_loop().create_task(self._stop_site())
        if self.dead:
            return _reset(request)
        prompt = last_user_text(body["messages"])
        fault = self.by_index.get(index) or self._prompt_fault(prompt) or self._mixed_fault()
        kind = fault.kind if fault else None
        headers = None
        if fault is not None and fault.retry_after is not None:
            headers = {"Retry-After": f"{fault.retry_after:g}"}
        if kind in ("429", "408", "500", "503"):
            return _json({"error": {"message": f"injected {kind}", "type": "Injected", "code": int(kind)}},
                         status=int(kind), headers=headers)
        if kind == "reset":
            return _reset(request)
        if kind == "stall":
            assert self._closing is not None
            with suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.stall_s)
        if kind == "malformed":
            return web.Response(body=b'{"id": "chatcmpl-x", "choices": [{"message": ', status=200,
                                content_type="application/json")
        if kind == "truncated":
            response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            response.content_length = 4096
            await response.prepare(request)
            await response.write(b'{"id": "chatcmpl-x", "choices": [')
            return _reset(request)
        prompt_tokens = count_tokens(body["messages"])
        if kind == "overflow" or prompt_tokens > self.max_model_len:
            return _json(context_error(self.max_model_len, prompt_tokens), status=400)
        completion = self._completion(body, prompt, prompt_tokens, kind)
        tokens = completion["usage"]["completion_tokens"]
        drafting = bool((body.get("chat_template_kwargs") or {}).get("enable_thinking", True)) in self.drafts_in
        scripted = self.answers.get(prompt)
        accepting = self.accepted_per_draft if scripted is None else scripted.accepted_per_draft
        if self.count_lag_reads:
            self._lagging = (self.count_lag_reads, dict(self.counters), list(self.accepted_by_position))
        self._count(tokens, accepting, foreign=self.foreign.get(index, 0), drafting=drafting)
        own_fault = self.own_count_faults.get(index)
        if self.per_request_metrics and self.speculative_tokens and own_fault != "missing":
            completion["metrics"] = {"speculative_decoding": self._own_counts(tokens if drafting else 0, accepting,
                                                                              own_fault),
                                     "mean_itl_ms": OWN_TPOT_MS}
        if not self.usage:
            del completion["usage"]
        return _json(completion)

    def _own_counts(self, tokens: int, accepting: int, fault: str | None) -> dict[str, Any]:
        """A request's ``metrics.speculative_decoding`` as vLLM 0.32 writes it: every verify step accepted
        ``accepting`` of its drafted tokens (``misreported`` more counted accepted; ``fault`` breaks them)."""
        assert self.speculative_tokens is not None
        steps = -(-tokens // (accepting + 1))
        histogram = [0] * (self.speculative_tokens + 1)
        histogram[accepting] = steps
        drafted = steps * (self.speculative_tokens + (fault == "overdrafted"))
        accepted = steps * accepting + self.misreported + (drafted + 1 if fault == "overaccepted" else 0)
        counts = {"mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
                  "draft_acceptance_rate": accepted / drafted if steps else 0.0,
                  "acceptance_histogram": histogram, "num_spec_steps": steps, "num_accepted_draft_tokens": accepted,
                  "num_draft_tokens": drafted, "num_spec_tokens": self.speculative_tokens}
        if self.detailed:
            counts |= {"per_step_accepted": [accepting] * steps, "per_step_drafted": [self.speculative_tokens] * steps}
        return counts

    def _count(self, tokens: int, accepting: int, *, foreign: int, drafting: bool = True) -> None:
        """vLLM's counters after a request of ``tokens`` (and ``foreign`` requests of others, alike) finished,
        each verify step accepting ``accepting`` drafted tokens; its speculator drafted only when ``drafting``."""
        for _ in range(1 + foreign):
            self.counters["requests"] += 1
            self.counters["tokens"] += tokens
            if self.speculative_tokens and drafting:
                drafts = -(-tokens // (accepting + 1))
                self.counters["drafts"] += drafts
                self.counters["draft_tokens"] += drafts * self.speculative_tokens
                self.counters["accepted"] += drafts * accepting
                for position in range(accepting):
                    self.accepted_by_position[position] += drafts

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self._record(request, None)
        if self.dead:
            return _reset(request)
        # a late count shows the counts from before the last request, faults apart; then the page as it is now
        fault = self.page_faults.get(self._chat_count) if self._lagging is None else None
        if fault == "html":
            return web.Response(text="\n  <!DOCTYPE html><html><body>Metrics dashboard</body></html>\n",
                                content_type="text/html")
        if fault == "status":
            return web.Response(status=503, text="metrics are not ready")
        if fault == "reset":
            return _reset(request)
        shown: dict[str, float] = dict(self.counters)
        positions = list(self.accepted_by_position)
        if self._lagging is not None:  # the counts from before the last request, for a few reads more
            reads, before, positions = self._lagging
            shown = dict(before)
            self._lagging = (reads - 1, before, positions) if reads > 1 else None
        scale = 0.25 if fault == "down" else 1.0
        labels = f'engine="0",model_name="{self.model}"'
        counters = {name: scale * count for name, count in shown.items()}
        counters["draft_tokens"] += counters["drafts"] if fault == "overdrafted" else 0
        counters["tokens"] += self._chat_count if fault == "extra_tokens" else 0
        accepted = "NaN" if fault == "nan" else f"{counters['accepted']:.1f}"
        lines = ["# TYPE vllm:request_success_total counter",
                 f'vllm:request_success_total{{{labels},finished_reason="stop"}} {counters["requests"]:.1f}',
                 f'vllm:request_success_total{{{labels},finished_reason="length"}} 0.0',
                 f"vllm:generation_tokens_total{{{labels}}} {counters['tokens']:.1f}",
                 f"vllm:request_time_per_output_token_seconds_sum{{{labels}}} {PAGE_TPOT_S * counters['requests']}",
                 f"vllm:request_time_per_output_token_seconds_count{{{labels}}} {counters['requests']:.1f}"]
        if self.speculative_tokens is not None:  # 0: a speculator that never drafts
            lines += [f"vllm:spec_decode_num_drafts_total{{{labels}}} {counters['drafts']:.1f}",
                      f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {counters['draft_tokens']:.1f}",
                      f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {accepted}"]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{position}"}} '
                      f"{scale * count:.1f}" for position, count in enumerate(positions)
                      if not (fault == "missing_position" and position == 1)]
        page = "\n".join(lines) + "\n"
        if fault == "cut":
            page = page[:page.rindex("{") + 5]  # in the middle of the last sample's labels
        return web.Response(text=page, content_type="text/plain")

    async def _server_info(self, request: web.Request) -> web.Response:
        """vLLM's development route: its config as JSON when asked, as text (a str of it) otherwise."""
        self._record(request, None)
        as_json = request.query.get("config_format") == "json"
        return web.json_response({"vllm_config": self.server_info if as_json else str(self.server_info)})

    def _mixed_fault(self) -> Fault | None:
        draw = self._mix_random.random()
        for kind, share in self.fault_mix.items():
            if draw < share:
                return Fault(kind, retry_after=1.0 if kind in ("429", "503") else None)
            draw -= share
        return None

    def _prompt_fault(self, prompt: str) -> Fault | None:
        fault = self.by_prompt.get(prompt)
        if fault is None:
            return None
        hits = self._prompt_hits.get(prompt, 0)
        self._prompt_hits[prompt] = hits + 1
        return fault if hits < fault.times else None

    def _completion(self, body: dict[str, Any], prompt: str, prompt_tokens: int, kind: str | None) -> dict[str, Any]:
        thinking = bool((body.get("chat_template_kwargs") or {}).get("enable_thinking", True))
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 64)
        scripted = self.answers.get(prompt)
        reasoning = f"Let me think about {prompt[:60]}." if thinking and scripted is None else None
        content: str | None = f"Answer to {prompt[:60]}." if scripted is None else scripted.text
        finish = "stop"
        if kind == "length":
            reasoning, content, finish = (reasoning or "") + " And more thinking", None, "length"
        elif kind == "unclosed":
            content = None
        calls = _tool_calls(body, prompt, self._chat_count) if kind is None else []
        if calls:
            content, finish = None, "tool_calls"
        reasoning_tokens = len(reasoning.split()) + (0 if finish == "length" else 1) if reasoning else 0
        content_tokens = len(content.split()) + 1 if content else sum(len(orjson.dumps(c)) // 8 + 1 for c in calls)
        completion_tokens = min(max_tokens, reasoning_tokens + content_tokens)
        if finish == "length":
            completion_tokens = max_tokens
        message: dict[str, object] = {"role": "assistant", "content": content, "reasoning": reasoning,
                                   "tool_calls": calls}
        if kind == "raw_think" and reasoning is not None:
            message["content"] = f"{reasoning}\n</think>\n\n{content}"
            message["reasoning"] = None
        elif kind == "legacy":
            message["reasoning_content"] = message.pop("reasoning")
        doc: dict[str, Any] = {
            "id": f"chatcmpl-{self._chat_count}", "object": "chat.completion", "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens,
                      "completion_tokens_details": {"reasoning_tokens": reasoning_tokens}},
        }
        if body.get("return_token_ids"):
            doc["prompt_token_ids"] = list(range(100, 100 + prompt_tokens))
            # a scripted answer's tokens are its words (one id a word) and the end of the turn; others all differ
            words = content.split() if scripted is not None and content else []
            vocabulary = {word: 5000 + index for index, word in enumerate(dict.fromkeys(words))}
            doc["choices"][0]["token_ids"] = ([vocabulary[word] for word in words] + [2] if words
                                              else list(range(5000, 5000 + completion_tokens)))
        return doc


def _tool_calls(body: dict[str, Any], prompt: str, request_number: int) -> list[dict[str, object]]:
    """The calls the server answers a request with (see the module docstring): none without tools."""
    tools = body.get("tools") or []
    choice = body.get("tool_choice")
    last = body["messages"][-1].get("role") if body["messages"] else None
    if not tools or choice == "none" or (choice in (None, "auto") and last != "user"):
        return []
    names = [tool["function"]["name"] for tool in tools]
    if isinstance(choice, dict):
        names = [choice["function"]["name"]]
    arguments = orjson.dumps({"query": prompt}).decode()
    return [{"id": f"call-{request_number}-{index}", "type": "function",
             "function": {"name": name, "arguments": arguments}} for index, name in enumerate(names)]


def _json(doc: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(doc), status=status, headers=headers,
                        content_type="application/json")


def _reset(request: web.Request) -> web.StreamResponse:
    """Abort the connection with a TCP RST (SO_LINGER 0) instead of answering."""
    transport = request.transport
    if transport is not None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    return web.Response(status=500)  # never reaches the client: the connection is gone


@contextmanager
def fault_server(**kwargs: Any) -> Iterator[FaultServer]:
    with FaultServer(**kwargs) as server:
        yield server
