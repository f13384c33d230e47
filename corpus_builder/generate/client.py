"""HTTP client for one or more OpenAI-compatible (vLLM) endpoints: routing, failover, retries.

One ``aiohttp.ClientSession`` serves every endpoint; bodies are encoded and decoded with orjson. The
hot path (``EndpointPool.complete``) builds one dict, one bytes body and one ``TurnResult`` per request
and logs nothing: at an instant server it is the generator's ceiling, so it must stay cheap.

Routing sends each request to the healthy endpoint with the fewest requests in flight, and a retry to
another endpoint than the one that just failed when there is one. An endpoint that fails with a
connection error or a timeout, or answers 5xx/garbage ``max_consecutive_failures`` times in a row, is
taken out for ``cooldown_s``; requests of an unreachable endpoint retry at once elsewhere, and a
background re-check brings it back when it answers ``/health`` and serves the model again. Health checks
use a connection pool of their own: requests filling the main pool never make a recovered endpoint wait.

A request that keeps failing transiently raises ``RetriesExhausted`` (the row is unfinished, never
dropped as refused); a 4xx refusal raises ``PermanentError``. When no endpoint has answered for
``max_outage_s`` (or ``alive`` says the launched server is gone), every request raises
``GenerationIncomplete``: the build stops instead of burning through every row's retries.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from yarl import URL

from ..errors import CorpusError
from ..records import THINK_CLOSE, THINK_OPEN, split_think
from .types import (
    EndpointInfo,
    FaultCounters,
    GenerationIncomplete,
    PermanentError,
    RetriesExhausted,
    TurnRequest,
    TurnResult,
)

# 408 Request Timeout, 409 Conflict, 425 Too Early and 429 Too Many Requests are transient refusals;
# every other 4xx (bad request, context overflow, unknown model) would fail the same way again.
RETRYABLE_4XX = frozenset({408, 409, 425, 429})
RETRY_AFTER_STATUSES = frozenset({429, 503})
MESSAGE_LIMIT = 500  # characters of a server's error message kept in PermanentError
# Faults that say "this endpoint is unreachable", as opposed to "this endpoint is busy/refusing".
ENDPOINT_FAULTS = frozenset({"timeout", "connection"})
# Faults of a reachable but broken server. It answers fast, so least-in-flight routing would feed it
# more than its share: after a run of these it is taken out like an unreachable one.
SERVER_FAULTS = frozenset({"5xx", "malformed"})

_THINKING_ON = {"enable_thinking": True}
_THINKING_OFF = {"enable_thinking": False}
_JSON_HEADERS = {"Content-Type": "application/json"}


class _Endpoint:
    """Routing state of one server. ``url`` is the display base URL (``.../v1``, no credentials)."""

    __slots__ = ("chat_url", "down_until", "failures", "headers", "health_url", "in_flight", "models_url", "origin",
                 "prefix", "retired", "up", "url", "version_url")

    def __init__(self, raw_url: str, api_key: str | None) -> None:
        parsed = URL(raw_url.strip())
        if parsed.scheme not in ("http", "https") or not parsed.host:
            shown = raw_url.rsplit("@", 1)[-1]  # never echo credentials
            raise CorpusError(f"endpoint {shown!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)")
        headers = dict(_JSON_HEADERS)
        if parsed.user is not None:
            pair = f"{parsed.user}:{parsed.password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        elif api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        # Accept ".../v1" or the server root; a path prefix (behind a proxy) is kept for every route.
        prefix = parsed.path.rstrip("/")
        if prefix.endswith("/v1"):
            prefix = prefix[: -len("/v1")]
        origin = parsed.with_user(None).with_password(None).with_query(None).with_fragment(None)
        self.url = str(origin.with_path(f"{prefix}/v1"))
        self.headers = headers
        self.chat_url = origin.with_path(f"{prefix}/v1/chat/completions")
        self.models_url = origin.with_path(f"{prefix}/v1/models")
        self.health_url = origin.with_path(f"{prefix}/health")
        self.version_url = origin.with_path(f"{prefix}/version")
        self.origin, self.prefix = origin, prefix  # the server's other routes (/metrics, ...): see EndpointPool.fetch
        self.in_flight = 0
        self.failures = 0  # consecutive SERVER_FAULTS
        self.up = True
        self.down_until = 0.0
        # Serves the wrong model: a healthy /health must not bring it back; only a new check() can.
        self.retired = False


class _Attempt:
    """Why one attempt failed: the fault class, the HTTP status if any, and a short explanation."""

    __slots__ = ("detail", "fault", "retry_after", "status")

    def __init__(self, fault: str, status: int | None, detail: str, retry_after: float | None = None) -> None:
        self.fault = fault
        self.status = status
        self.detail = detail
        self.retry_after = retry_after


class EndpointPool:
    """Async client over several OpenAI-compatible endpoints. Use as ``async with EndpointPool(...)``.

    ``timeout_s`` bounds each attempt (connect, queue for a connection, send, generate, read);
    ``max_retries`` bounds the retries of one request after its first attempt; ``concurrency`` sizes
    the connection pool (the caller bounds how many requests it keeps in flight).
    """

    def __init__(self, urls: list[str] | tuple[str, ...], *, timeout_s: float, max_retries: int,
                 concurrency: int, api_key: str | None = None, cooldown_s: float = 10.0,
                 recheck_interval_s: float = 2.0, backoff_base_s: float = 0.5, backoff_max_s: float = 30.0,
                 max_retry_after_s: float = 300.0, probe_timeout_s: float = 10.0,
                 max_consecutive_failures: int = 5, max_outage_s: float = 120.0,
                 alive: Callable[[], None] | None = None) -> None:
        if not urls:
            raise CorpusError("no endpoint given: set target.endpoints or target.launch in the recipe")
        if max_retries < 0 or concurrency < 1 or timeout_s <= 0:
            raise CorpusError("max_retries must be >= 0, concurrency >= 1 and timeout_s > 0")
        self._endpoints = [_Endpoint(u, api_key) for u in urls]
        self._single = self._endpoints[0] if len(self._endpoints) == 1 else None
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.cooldown_s = cooldown_s
        self.recheck_interval_s = recheck_interval_s
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.max_retry_after_s = max_retry_after_s
        self.probe_timeout_s = probe_timeout_s
        self.max_consecutive_failures = max_consecutive_failures
        self.max_outage_s = max_outage_s
        self.alive = alive  # raises GenerationIncomplete when what serves the endpoints is known to be gone
        self.counters = FaultCounters()
        self.last_check: list[EndpointInfo] = []
        self._expected_model: str | None = None
        self._unreachable_since: float | None = None  # every endpoint down since then
        self._last_outage_fault = ""
        self._session: aiohttp.ClientSession | None = None
        self._probe_session: aiohttp.ClientSession | None = None
        self._recheck_task: asyncio.Task[None] | None = None

    @property
    def urls(self) -> list[str]:
        """The endpoints' base URLs as reported in results (``.../v1``, without credentials)."""
        return [ep.url for ep in self._endpoints]

    def in_flight(self) -> dict[str, int]:
        return {ep.url: ep.in_flight for ep in self._endpoints}

    def up(self) -> dict[str, bool]:
        return {ep.url: ep.up for ep in self._endpoints}

    async def __aenter__(self) -> EndpointPool:
        connector = aiohttp.TCPConnector(limit=self.concurrency, limit_per_host=self.concurrency,
                                         ttl_dns_cache=300)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=min(self.timeout_s, 10.0))
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        probes = aiohttp.TCPConnector(limit=2 * len(self._endpoints), ttl_dns_cache=300)
        self._probe_session = aiohttp.ClientSession(connector=probes)
        if self.recheck_interval_s > 0:
            self._recheck_task = asyncio.create_task(self._recheck_loop())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._recheck_task is not None:
            self._recheck_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._recheck_task
            self._recheck_task = None
        for session in (self._session, self._probe_session):
            if session is not None:
                await session.close()
        self._session = self._probe_session = None

    # ---- health ----------------------------------------------------------------------------------

    async def check(self, expected_model: str | None = None) -> list[EndpointInfo]:
        """Probe every endpoint (/health, /v1/models, /version); mark each up or down.

        Raises CorpusError naming each endpoint's problem when none is healthy. With
        ``expected_model``, an endpoint that does not serve that name counts as unhealthy.
        """
        self._expected_model = expected_model
        infos = await asyncio.gather(*(self._probe(ep, expected_model) for ep in self._endpoints))
        self.last_check = list(infos)
        if not any(info.healthy for info in infos):
            raise CorpusError("no healthy generation endpoint",
                              details=[f"{info.url}: {info.error}" for info in infos])
        return self.last_check

    async def _probe(self, ep: _Endpoint, expected_model: str | None) -> EndpointInfo:
        info = EndpointInfo(url=ep.url, healthy=False, models=[], engine_version=None, max_model_len=None,
                            error=None)
        ep.retired = False
        try:
            status, _ = await self._get(ep, ep.health_url)
            if status != 200:
                info.error = f"GET /health answered HTTP {status}"
            else:
                status, raw = await self._get(ep, ep.models_url)
                if status != 200:
                    info.error = f"GET /v1/models answered HTTP {status}: {_server_message(raw)}"
                else:
                    cards = _model_cards(raw)
                    info.models = [card["id"] for card in cards]
                    first = cards[0] if cards else None
                    chosen = next((c for c in cards if c["id"] == expected_model), first)
                    if chosen is not None and isinstance(chosen.get("max_model_len"), int):
                        info.max_model_len = chosen["max_model_len"]
                    if chosen is not None and isinstance(chosen.get("root"), str):
                        info.model_root = chosen["root"]
                    if expected_model is not None and expected_model not in info.models:
                        info.error = f"does not serve model {expected_model!r} (serves {info.models})"
                        ep.retired = True
                    else:
                        info.healthy = True
                info.engine_version = await self._engine_version(ep)
        except (aiohttp.ClientError, TimeoutError) as exc:
            info.error = f"unreachable: {_describe(exc)}"
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            info.error = f"GET /v1/models answered something that is not a model list ({exc})"
        ep.up = info.healthy
        if info.healthy:
            self._unreachable_since = None
        else:
            ep.down_until = asyncio.get_running_loop().time() + self.cooldown_s
        return info

    async def _engine_version(self, ep: _Endpoint) -> str | None:
        """vLLM's /version; other servers may not have it, which is not a health problem."""
        try:
            status, raw = await self._get(ep, ep.version_url)
            if status == 200:
                version = orjson.loads(raw).get("version")
                return str(version) if version is not None else None
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, AttributeError):
            pass
        return None

    async def fetch(self, route: str, query: dict[str, str] | None = None) -> tuple[int, bytes]:
        """GET another route of the server of a one-endpoint pool (e.g. "/metrics"), on the health checks'
        connections: the status and the body. Connection errors and timeouts are the caller's to judge."""
        assert self._single is not None, "fetch reads the server of a pool of one endpoint"
        ep = self._single
        return await self._get(ep, ep.origin.with_path(f"{ep.prefix}{route}").with_query(query or {}))

    async def _get(self, ep: _Endpoint, url: URL) -> tuple[int, bytes]:
        assert self._probe_session is not None, "use EndpointPool inside 'async with'"
        timeout = aiohttp.ClientTimeout(total=min(self.timeout_s, self.probe_timeout_s))
        async with self._probe_session.get(url, headers=ep.headers, timeout=timeout) as resp:
            return resp.status, await resp.read()

    async def _recheck_loop(self) -> None:
        """Bring endpoints back once their cooldown is over and they pass the probe again (health, and the
        model the run serves)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.recheck_interval_s)
            now = loop.time()
            down = [ep for ep in self._endpoints if not ep.up and not ep.retired and now >= ep.down_until]
            if down:
                await asyncio.gather(*(self._probe(ep, self._expected_model) for ep in down))

    # ---- requests --------------------------------------------------------------------------------

    async def complete(self, request: TurnRequest) -> TurnResult:
        """Generate one assistant turn; retries transient faults, raises PermanentError otherwise.

        The length cap is sent as ``max_tokens`` (as given in ``request.sampling``): vLLM 0.32 reads it
        when ``max_completion_tokens`` is absent, and every OpenAI-compatible server, old or new,
        understands it, whereas a server that predates ``max_completion_tokens`` would silently ignore
        that field and generate up to the context limit.
        """
        fields = {
            "model": request.model,
            "messages": request.messages,
            **request.sampling,
            "chat_template_kwargs": _THINKING_ON if request.enable_thinking else _THINKING_OFF,
            "return_token_ids": True,
            "n": 1,
        }
        if request.tools:
            fields["tools"] = request.tools
            if request.tool_choice is not None:
                fields["tool_choice"] = request.tool_choice
        return await self._post(orjson.dumps(fields))

    async def _post(self, body: bytes) -> TurnResult:
        session = self._session
        assert session is not None, "use EndpointPool inside 'async with'"
        loop = asyncio.get_running_loop()
        attempt = 0
        failed: _Endpoint | None = None
        while True:
            self._check_outage(loop.time())
            ep = self._single or self._choose(failed)
            ep.in_flight += 1
            try:
                async with session.post(ep.chat_url, data=body, headers=ep.headers) as resp:
                    status = resp.status
                    raw = await resp.read()
                    if status == 200:
                        try:
                            result = _parse_completion(raw, ep.url)
                            ep.failures = 0
                            self._unreachable_since = None
                            return result
                        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError,
                                ValueError) as exc:
                            failure = _Attempt("malformed", status, f"unreadable response body ({exc})")
                    else:
                        failure = self._classify_status(status, raw, resp.headers, ep)
            except TimeoutError:
                failure = _Attempt("timeout", None, f"no complete answer within {self.timeout_s:g}s")
            except aiohttp.ClientError as exc:
                failure = _Attempt("connection", None, _describe(exc))
            finally:
                ep.in_flight -= 1

            if failure.fault in ENDPOINT_FAULTS:
                self._take_out(ep, loop.time())
                if self.alive is not None:
                    self.alive()
                if self._unreachable_since is None and not any(e.up for e in self._endpoints):
                    self._unreachable_since = loop.time()
                self._last_outage_fault = f"{failure.fault}: {failure.detail}"
            elif failure.fault in SERVER_FAULTS:
                ep.failures += 1
                if ep.failures >= self.max_consecutive_failures:
                    self._take_out(ep, loop.time())
            failed = ep
            if attempt >= self.max_retries:
                self.counters.error(failure.fault)
                raise RetriesExhausted(
                    f"{ep.url}: gave up after {attempt + 1} attempts; last failure: "
                    f"{failure.fault}: {failure.detail}", fault=failure.fault, endpoint=ep.url)
            self.counters.retry(failure.fault)
            attempt += 1
            delay = self._delay(attempt, failure, ep)
            if delay > 0:
                await asyncio.sleep(delay)

    def _classify_status(self, status: int, raw: bytes, headers: Any, ep: _Endpoint) -> _Attempt:
        """Sort a non-200 answer into a retryable fault, or raise PermanentError for a refusal."""
        if status == 429 or status >= 500 or status in RETRYABLE_4XX:
            retry_after = _retry_after(headers.get("Retry-After")) if status in RETRY_AFTER_STATUSES else None
            fault = "429" if status == 429 else ("5xx" if status >= 500 else "4xx")
            return _Attempt(fault, status, f"HTTP {status}: {_server_message(raw)}", retry_after)
        self.counters.error("4xx")
        raise PermanentError(f"{ep.url}: HTTP {status}: {_server_message(raw)}", status=status,
                             endpoint=ep.url)

    def _delay(self, attempt: int, failure: _Attempt, ep: _Endpoint) -> float:
        """Seconds to wait before the next attempt.

        An unreachable endpoint's requests move to another one at once (the fault was the endpoint's,
        not the load). A Retry-After is honoured (plus a little jitter so a burst of refused requests
        does not come back in lockstep); otherwise exponential backoff with full jitter.
        """
        if failure.fault in ENDPOINT_FAULTS and any(e.up for e in self._endpoints if e is not ep):
            return 0.0
        if failure.retry_after is not None:
            return min(failure.retry_after, self.max_retry_after_s) + random.uniform(0, self.backoff_base_s)
        return random.uniform(0, min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1)))

    def _check_outage(self, now: float) -> None:
        if self._unreachable_since is not None and now - self._unreachable_since >= self.max_outage_s:
            raise GenerationIncomplete(f"no endpoint has answered for {now - self._unreachable_since:.0f} s "
                                    f"(target.generation.max_outage_s {self.max_outage_s:g}); last failure: "
                                    f"{self._last_outage_fault}",
                                    details=[f"{ep.url}: down" for ep in self._endpoints])

    def _take_out(self, ep: _Endpoint, now: float) -> None:
        ep.up = False
        ep.failures = 0
        ep.down_until = now + self.cooldown_s

    def _choose(self, failed: _Endpoint | None = None) -> _Endpoint:
        """The up endpoint with the fewest requests in flight, other than the one a retry just failed
        on when there is a choice; when all are down, the one whose cooldown ends first (the request
        then doubles as a probe rather than waiting)."""
        best: _Endpoint | None = None
        for ep in self._endpoints:
            if ep.up and ep is not failed and (best is None or ep.in_flight < best.in_flight):
                best = ep
        if best is None and failed is not None and failed.up:
            best = failed
        if best is None:
            candidates = [e for e in self._endpoints if not e.retired] or self._endpoints
            best = min(candidates, key=lambda e: e.down_until)
        return best


# ---- response parsing (pure functions, unit-testable) -------------------------------------------

def _parse_completion(raw: bytes, endpoint: str) -> TurnResult:
    doc = orjson.loads(raw)
    choice = doc["choices"][0]
    message = choice["message"]
    content = message.get("content")
    reasoning = message.get("reasoning")
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    if reasoning is None and content and (THINK_CLOSE in content or THINK_OPEN in content):
        # No reasoning parser on the server: the think block is still inside the content.
        content, reasoning, unclosed = split_think(content)
        if unclosed and not content:
            content = None
    usage = doc.get("usage") or {}
    details = usage.get("completion_tokens_details") or {}
    return TurnResult(
        tool_calls=_tool_calls(message.get("tool_calls")),
        content=content,
        reasoning=reasoning,
        finish_reason=choice.get("finish_reason"),
        prompt_token_ids=doc.get("prompt_token_ids"),
        token_ids=choice.get("token_ids"),
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
        reasoning_tokens=details.get("reasoning_tokens"),
        endpoint=endpoint,
        served_model=doc["model"],
        metrics=doc["metrics"] if isinstance(doc.get("metrics"), dict) else None,
    )


def _tool_calls(calls: Any) -> list[dict[str, str]] | None:
    """``message.tool_calls`` as {"id", "name", "arguments"}: only the shape is checked here (a call without a
    function name makes the body unreadable); whether the arguments parse or fit the tool's schema is judged
    later, on the record (``generate.tool_results``)."""
    if not calls:
        return None
    parsed = []
    for call in calls:
        function = call["function"]
        name, arguments = function["name"], function.get("arguments")
        if not isinstance(name, str) or not name:
            raise ValueError("a tool call has no function name")
        parsed.append({"id": str(call.get("id") or ""), "name": name,
                       "arguments": arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()})
    return parsed


def _model_cards(raw: bytes) -> list[dict[str, Any]]:
    cards = orjson.loads(raw)["data"]
    if not isinstance(cards, list) or not all(isinstance(c, dict) and "id" in c for c in cards):
        raise TypeError("'data' is not a list of model cards")
    return cards


def _server_message(raw: bytes) -> str:
    """The server's own explanation from an error body (vLLM: {"error": {"message": ...}}), trimmed."""
    text: Any = None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        doc = None
    if isinstance(doc, dict):
        error = doc.get("error")
        text = error.get("message") if isinstance(error, dict) else error
        text = text or doc.get("message") or doc.get("detail")
    if not isinstance(text, str) or not text:
        text = raw.decode("utf-8", errors="replace")
    message = " ".join(text.split())
    return message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 3] + "..."


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds; the HTTP-date form is ignored (backoff applies instead)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
