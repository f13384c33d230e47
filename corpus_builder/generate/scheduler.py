"""Turn-by-turn regeneration of prompt conversations: a bounded in-flight pool, ordered output, resume.

Each output row (one prompt conversation x one sample index) is a ``_Job`` that walks its user turns:
the request for assistant turn k carries the system/user turns plus the assistant turns already
regenerated for turns < k. Every finished turn goes to the journal before anything built from it is
yielded; a turn whose key is in the journal is resolved without a request, so a rerun after a crash,
or a rebuild with other checks, repeats only what never finished.

A prompt with tool traffic sends its tools (and the source's ``tool_choice``) with every request and follows
its source's tool-result policy (``sources[].tool_results``): ``match`` reuses a recorded result only after
a regenerated call that matches the recorded one (``tool_results.pair_calls``), the assistant then speaking
again with it; a call with no recorded twin ends the row before it (flag ``tool_result_unknown``, or the row
skipped with that reason when nothing was generated before it), and a turn that answers without the recorded
call goes on to the next user turn. ``recorded`` keeps the recorded history (calls, results, answers) as it
is and regenerates only the final assistant turn.

Bounds: at most ``concurrency`` requests in flight (turns of different conversations interleave; the
next turns of older rows go first) and up to as many more waiting for a slot, at most ``window`` rows
admitted but not yet yielded, input pulled lazily. Rows are yielded in input order, so downstream stages
see the same stream on every run.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from ..errors import CorpusError, Skipped
from ..recipe.model import GenerationSettings, Recipe
from ..records import (
    FLAG_INVALID_TOOL_CALL,
    FLAG_TOOL_RESULT_UNKNOWN,
    FLAG_TRUNCATED,
    FLAG_UNCLOSED_THINK,
    Conversation,
    GeneratedTurn,
    Generation,
    Message,
    ToolSettings,
    conversation_id,
    has_non_object_arguments,
    make_message,
    openai_messages,
    row_location,
    trim_after_last_answer,
)
from .journal import Journal, turn_key
from .progress import GenerationProgress
from .tool_results import describe, invalid_calls, pair_calls
from .types import (
    FailedTurn,
    JournaledTurn,
    PermanentError,
    RetriesExhausted,
    TargetIdentity,
    TurnRequest,
    TurnResult,
    journal_entry,
    same_model,
)

Complete = Callable[[TurnRequest], Awaitable[TurnResult]]
Output = Conversation | Skipped

# Result fields stored per generated turn (the journal record); "engine_version" comes from the endpoint.
_RESULT_FIELDS = ("content", "reasoning", "finish_reason", "prompt_token_ids", "token_ids", "prompt_tokens",
                  "completion_tokens", "reasoning_tokens", "endpoint", "served_model", "tool_calls")
# A refusal of the request's content (bad request, prompt too long, unprocessable) would repeat on every
# run: it is journaled so a rebuild does not need the server again. Refusals that depend on the setup
# (401/403 credentials, 404 model name) and exhausted retries are not: a fixed rerun asks again.
_JOURNALED_ERROR_STATUSES = frozenset({400, 413, 422})
# Outcomes of a request that end its row (as a Skipped) while the run goes on.
_ROW_ENDINGS = (PermanentError, RetriesExhausted)
UNFINISHED = "unfinished"  # the Skipped reason of a row whose request ran out of retries


@dataclass(frozen=True, slots=True)
class RunSettings:
    """Everything that is fixed for one run, resolved from the recipe and the endpoints."""

    model: str  # the recipe's model id: part of the journal key
    revision: str | None
    served_model: str  # the name sent in requests
    enable_thinking: bool
    history_reasoning: str  # keep | drop
    on_length: str  # drop | keep | retry
    sampling: dict[str, object]
    retry_max_tokens: int
    n: int
    concurrency: int
    window: int
    share_identical_turns: bool  # identical turns of different conversations get one generation, not one each
    thinking_off_shares: dict[str, float]  # prompts source -> share of its rows regenerated with thinking off
    sampling_mixture: tuple[tuple[float, dict[str, object]], ...]  # (weight, overrides): a row draws one by its id
    tool_settings: dict[str, ToolSettings]  # prompts source -> its tool settings
    allow_mixed_targets: bool  # rows of another target than the corpus's are accepted, not refused

    @classmethod
    def from_recipe(cls, recipe: Recipe, served_model: str | None = None, *,
                    window: int | None = None) -> RunSettings:
        settings: GenerationSettings = recipe.target.generation
        return cls(
            model=recipe.target.model,
            revision=recipe.target.revision,
            served_model=served_model or recipe.target.model,
            enable_thinking=settings.enable_thinking,
            history_reasoning=settings.history_reasoning,
            on_length=settings.on_length,
            sampling=settings.sampling(),
            retry_max_tokens=settings.retry_max_tokens or 2 * settings.max_tokens,
            n=settings.n,
            concurrency=settings.concurrency,
            window=window or max(64, 8 * settings.concurrency),
            share_identical_turns=settings.share_identical_turns,
            thinking_off_shares={spec.name: spec.thinking_off_share for spec in recipe.sources
                                 if spec.kind == "prompts" and spec.thinking_off_share},
            sampling_mixture=tuple((float(entry["weight"]), {k: v for k, v in entry.items() if k != "weight"})
                                   for entry in settings.sampling_mixture),
            tool_settings={spec.name: ToolSettings(spec.tool_choice, spec.tool_results) for spec in recipe.sources
                           if spec.kind == "prompts"},
            allow_mixed_targets=recipe.target.allow_mixed_targets,
        )

    def row_mode(self, row_id: str, source: str) -> tuple[bool, dict[str, object]]:
        """(enable_thinking, sampling overrides) of one output row: its declared share of thinking-off rows and
        its draw from the sampling mixture, both seeded by the row's own id (so every run decides the same)."""
        thinking = self.enable_thinking
        off_share = self.thinking_off_shares.get(source, 0.0)
        if thinking and off_share and _draw(row_id, b"thinking-off") < off_share:
            thinking = False
        overrides: dict[str, object] = {}
        if self.sampling_mixture:
            draw = _draw(row_id, b"sampling") * sum(weight for weight, _ in self.sampling_mixture)
            for weight, candidate in self.sampling_mixture:
                overrides = candidate
                if draw < weight:
                    break
                draw -= weight
        return thinking, overrides

    def sample_sampling(self, sample_index: int) -> dict[str, object]:
        """Sampling for one sample: with a fixed seed, each sample gets its own (seed + index), or the
        n samples of a prompt would be the same text n times."""
        seed = self.sampling.get("seed")
        if self.n > 1 and isinstance(seed, int):
            return {**self.sampling, "seed": seed + sample_index}
        return self.sampling


def _draw(row_id: str, purpose: bytes) -> float:
    """A uniform number in [0, 1) from a row id, one stream per purpose."""
    digest = hashlib.blake2b(row_id.encode(), digest_size=8, person=b"corpus-" + purpose[:9]).digest()
    return int.from_bytes(digest, "big") / 2**64


class _Job:
    """One output row in the making."""

    __slots__ = ("cursor", "flags", "id", "identity", "live", "messages", "prompt", "retrying", "sample_index",
                 "sampling", "sent_tools", "seq", "thinking", "tool_settings", "turns")

    def __init__(self, seq: int, prompt: Conversation, row_id: str, sample_index: int,
                 sampling: dict[str, object], thinking: bool, tool_settings: ToolSettings | None) -> None:
        self.seq = seq
        self.prompt = prompt
        self.id = row_id
        self.sample_index = sample_index
        self.sampling = sampling
        self.thinking = thinking  # enable_thinking of every request of this row
        self.tool_settings = tool_settings  # None: the row has no tool traffic
        # What goes with every request besides the messages: the row's tools and the tool_choice (None for a
        # row without tools).
        self.sent_tools: dict[str, object] | None = (
            None if tool_settings is None or not prompt.tools
            else {"tools": prompt.tools, "tool_choice": tool_settings.choice})
        self.cursor = 0  # index in prompt.messages of the next recorded turn to take
        self.messages: list[Message] = []
        self.turns: list[GeneratedTurn] = []
        self.flags: list[str] = list(prompt.flags)  # e.g. the repairs the prompt row needed
        self.retrying = False
        self.live = False  # at least one turn came from a request in this run
        self.identity: TargetIdentity | None = None  # of the target that generated its first turn


def result_record(result: TurnResult, target: Mapping[str, str | None]) -> dict[str, object]:
    """The journal record of a turn: what the server answered, and ``target``, what the target that answered
    says it is (``recorded_identity``)."""
    record = {name: getattr(result, name) for name in _RESULT_FIELDS}
    record.update(target)
    return record


def recorded_identity(identity: TargetIdentity | None) -> dict[str, str | None]:
    """The identity fields a turn's journal record adds to the result's (served_model is one of those)."""
    if identity is None:
        return {"engine_version": None}
    return {name: value for name, value in identity.fields().items() if name != "served_model"}


class Scheduler:
    """Drives the jobs. ``complete`` is None in journal-only mode: a missing turn then raises
    CorpusError, or (``count_missing``) is yielded as a Skipped with reason "not_in_journal"."""

    def __init__(self, prompts: Iterable[Conversation], settings: RunSettings, journal: Journal,
                 complete: Complete | None, *, identities: dict[str, TargetIdentity] | None = None,
                 progress: GenerationProgress | None = None, count_missing: bool = False) -> None:
        self._input = iter(prompts)
        self._settings = settings
        self._journal = journal
        self._complete = complete
        self._identities = identities or {}
        # what each endpoint's journal records say of its target, worked out once, not once per turn
        self._recorded_identities = {url: recorded_identity(identity) for url, identity in self._identities.items()}
        self._unknown_identity = recorded_identity(None)
        # The one target of the corpus: what the endpoints serve, else the first journal record's
        live = next(iter(self._identities.values()), None)
        self._target: TargetIdentity | None = live
        self._progress = progress
        self._count_missing = count_missing
        self._exhausted = False
        self._next_seq = 0
        self._emit_seq = 0
        self._finished: dict[int, Output] = {}
        self._waiting: list[tuple[int, int, _Job, TurnRequest, bytes]] = []  # heap: oldest rows first
        self._sharing: dict[bytes, list[_Job]] = {}  # key asked for -> other rows waiting on the same turn
        self._tie = 0
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._completed: deque[tuple[_Job, bytes, TurnResult | BaseException]] = deque()
        self._wakeup: asyncio.Event | None = None

    # -- the async driver --------------------------------------------------------------------------

    async def next_batch(self) -> list[Output] | None:
        """The next rows in input order (at least one), or None when every row has been yielded."""
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
        while True:
            self._fill()
            ready = self._drain()
            if ready:
                return ready
            if self._in_flight == 0 and not self._waiting and self._exhausted and not self._completed:
                return None
            if not self._completed:
                await self._wakeup.wait()
            self._wakeup.clear()
            self._absorb()

    async def cancel(self) -> None:
        """Stop every request in flight (the consumer stopped early, or an error)."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _fill(self) -> None:
        """Fill free slots, then admit rows until ``concurrency`` more requests wait: a request task
        that finishes takes the next one itself (see _call), so no slot waits for this driver."""
        limit = self._settings.concurrency
        self._send_waiting()
        while (not self._exhausted and len(self._waiting) < limit
               and self._next_seq - self._emit_seq < self._settings.window):
            prompt = next(self._input, None)
            if prompt is None:
                self._exhausted = True
                break
            self._admit(prompt)
            self._send_waiting()

    def _drain(self) -> list[Output]:
        ready: list[Output] = []
        finished = self._finished
        while self._emit_seq in finished:
            ready.append(finished.pop(self._emit_seq))
            self._emit_seq += 1
        return ready

    def _send_waiting(self) -> None:
        """A request task for each free slot, oldest rows first."""
        limit = self._settings.concurrency
        while self._waiting and self._in_flight < limit:
            task = asyncio.get_running_loop().create_task(self._call(*self._take_waiting()))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take_waiting(self) -> tuple[_Job, TurnRequest, bytes]:
        _, _, job, request, key = heapq.heappop(self._waiting)
        self._in_flight += 1
        return job, request, key

    async def _call(self, job: _Job, request: TurnRequest, key: bytes) -> None:
        """Send requests until none waits. Taking the next waiting request here, the moment an answer
        arrives, keeps the server's slot busy; the driver may be several loop passes (or a consumer's
        batch) away. Its result is still journaled by _absorb before any row built from it is yielded."""
        assert self._complete is not None and self._wakeup is not None
        while True:
            outcome: TurnResult | BaseException
            try:
                outcome = await self._complete(request)
            except Exception as error:  # refusals and exhausted retries end the row; anything else is re-raised
                outcome = error
            self._in_flight -= 1
            self._completed.append((job, key, outcome))
            self._wakeup.set()
            if not self._waiting or (isinstance(outcome, Exception) and not isinstance(outcome, _ROW_ENDINGS)):
                return
            job, request, key = self._take_waiting()

    def _absorb(self) -> None:
        """Journal a batch of finished requests (one frame), then move their rows on."""
        batch = list(self._completed)
        self._completed.clear()
        records = []
        for job, key, outcome in batch:
            if isinstance(outcome, PermanentError):
                record: dict[str, object] = {"error": outcome.message, "status": outcome.status}
                if outcome.status in _JOURNALED_ERROR_STATUSES:
                    self._journal.append(key, record)
            elif isinstance(outcome, RetriesExhausted):
                record = {"error": outcome.message, "skip_reason": UNFINISHED}  # never journaled: a rerun asks again
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                record = result_record(outcome, self._recorded_identities.get(outcome.endpoint,
                                                                              self._unknown_identity))
                self._journal.append(key, record)
            records.append((job, key, record))
        self._journal.flush()  # before any row built from these turns can be yielded
        for job, key, record in records:
            for row in (job, *self._sharing.pop(key)):
                if self._apply(row, journal_entry(record), cached=row is not job):
                    self._advance(row)

    # -- rows --------------------------------------------------------------------------------------

    def _admit(self, prompt: Conversation) -> None:
        settings = self._settings
        tools = settings.tool_settings.get(prompt.source, ToolSettings()) if prompt.has_tool_traffic else None
        for sample_index in range(settings.n):
            salt = f"#{sample_index}" if settings.n > 1 else ""
            row_id = conversation_id(prompt.source, prompt.messages, salt=salt, tools=prompt.tools)
            thinking, overrides = settings.row_mode(row_id, prompt.source)
            job = _Job(self._next_seq, prompt, row_id, sample_index,
                       {**settings.sample_sampling(sample_index), **overrides}, thinking, tools)
            self._next_seq += 1
            self._advance(job)

    def _advance(self, job: _Job) -> None:
        """Resolve the row's turns from the journal as far as possible; queue the first missing one."""
        settings = self._settings
        while True:
            if not job.retrying and not self._copy_prompt_turn(job):
                self._finish(job, self._conversation(job))
                return
            sampling = {**job.sampling, "max_tokens": settings.retry_max_tokens} if job.retrying else job.sampling
            messages = tuple(openai_messages(job.messages, keep_history_reasoning=settings.history_reasoning == "keep",
                                             current=len(job.messages)))
            tools = job.sent_tools
            key = turn_key(messages, sampling, model=settings.model, revision=settings.revision,
                           enable_thinking=job.thinking, sample_index=job.sample_index,
                           conversation=None if settings.share_identical_turns else job.id, tools=tools)
            record = self._journal.get(key)
            if record is None:
                if self._complete is None:
                    self._missing(job)
                    return
                if key in self._sharing:  # an identical turn is already asked for: one key, one generation
                    self._sharing[key].append(job)
                    return
                self._sharing[key] = []
                request = TurnRequest(messages=messages, sampling=sampling, enable_thinking=job.thinking,
                                      model=settings.served_model,
                                      tools=tuple(job.prompt.tools or ()) if tools is not None else None,
                                      tool_choice=job.tool_settings.choice if job.tool_settings is not None
                                      and tools is not None else None)
                self._tie += 1
                heapq.heappush(self._waiting, (job.seq, self._tie, job, request, key))
                return
            if not self._apply(job, journal_entry(record), cached=True):
                return

    def _copy_prompt_turn(self, job: _Job) -> bool:
        """Copy prompt turns up to and including the next user turn; False when none is left. After the
        recorded results of a matched call the assistant speaks again at once; with ``recorded`` the whole
        recorded history up to the final assistant turn is copied, once."""
        messages = job.prompt.messages
        if job.tool_settings is not None and job.tool_settings.results == "recorded":
            if job.cursor:
                return False  # the final turn is generated: nothing else is
            job.messages += messages[:max(i for i, m in enumerate(messages) if m.role != "assistant") + 1]
            job.cursor = len(messages)
            if has_non_object_arguments(job.messages) and FLAG_INVALID_TOOL_CALL not in job.flags:
                job.flags.append(FLAG_INVALID_TOOL_CALL)  # the kept history renders such a call as {}
            return True
        if job.messages and job.messages[-1].role == "tool":
            return True
        while job.cursor < len(messages):
            message = messages[job.cursor]
            job.cursor += 1
            if message.role in ("assistant", "tool"):
                continue  # the recorded answer to a user turn the target answers itself
            job.messages.append(message)
            if message.role == "user":
                return True
        return False

    @staticmethod
    def _recorded_turn(job: _Job) -> Message | None:
        """The recorded turn in the place of the turn being generated (None: the recording ended before it)."""
        messages = job.prompt.messages
        return messages[job.cursor] if job.cursor < len(messages) else None

    def _recorded_results(self, job: _Job, message: Message) -> list[Message] | None:
        """The recorded results of the regenerated ``message``'s calls, answering the new calls' ids (the cursor
        moves past the recorded call and its results); None when the recorded turn there made other calls."""
        recorded = self._recorded_turn(job)
        pairs = pair_calls(message.tool_calls, recorded.tool_calls) if recorded is not None else None
        if pairs is None:
            return None
        messages = job.prompt.messages
        results = []
        job.cursor += 1
        while job.cursor < len(messages) and messages[job.cursor].role == "tool":
            result = messages[job.cursor]
            results.append(Message("tool", result.content, tool_call_id=pairs.get(result.tool_call_id or "")))
            job.cursor += 1
        return results

    def _cut(self, job: _Job, message: Message) -> Output:
        """The row before a regenerated call whose result the source does not hold, through its last assistant
        turn."""
        recorded = self._recorded_turn(job)
        if recorded is None:
            told = "the recorded conversation ended there"
        elif recorded.tool_calls:
            told = f"the recorded turn there called {describe(recorded.tool_calls)}"
        else:
            told = "the recorded turn there made no call"
        detail = f"assistant turn {len(job.messages)} called {describe(message.tool_calls)}; {told}"
        if not job.turns:
            return self._skipped(job, FLAG_TOOL_RESULT_UNKNOWN, detail)
        # what follows the last assistant turn (always a user turn after it, or results of its call) teaches
        # nothing, as repair trailing_user: trim judges it for replayed rows
        job.messages = trim_after_last_answer(job.messages) or job.messages
        job.flags.append(FLAG_TOOL_RESULT_UNKNOWN)
        return self._conversation(job)

    def _apply(self, job: _Job, record: JournaledTurn | FailedTurn, *, cached: bool) -> bool:
        """Take one turn's result into the row; False when the row is finished (dropped)."""
        settings = self._settings
        if isinstance(record, FailedTurn):  # a refusal or retries run out
            self._finish(job, self._skipped(job, record.skip_reason, record.error))
            return False
        job.live |= not cached
        result = record.result
        if self._progress is not None:
            self._progress.turn(result.completion_tokens or 0, result.reasoning_tokens or 0, cached=cached)
        if result.finish_reason == "length":
            if settings.on_length == "retry" and not job.retrying:
                job.retrying = True
                return True
            if settings.on_length != "keep":
                limit = settings.retry_max_tokens if job.retrying else job.sampling.get("max_tokens")
                detail = f"assistant turn {len(job.messages)} stopped at max_tokens={limit}"
                self._finish(job, self._skipped(job, "truncated_generation", detail))
                return False
            if FLAG_TRUNCATED not in job.flags:
                job.flags.append(FLAG_TRUNCATED)
        calls = record.tool_calls()
        message, unclosed = make_message("assistant", result.content or "", result.reasoning, tool_calls=calls)
        results: list[Message] = []
        if job.tool_settings is not None and calls and job.tool_settings.results == "match":
            found = self._recorded_results(job, message)
            if found is None:
                self._finish(job, self._cut(job, message))
                return False
            results = found
        # The template opens the think block; an output that stopped (not cut) with no answer never left it:
        # the EOS came before </think> (or nothing followed it). checks.on_unclosed_think decides.
        unclosed |= (job.thinking and result.finish_reason != "length"
                     and not message.content.strip() and not calls)
        if unclosed and FLAG_UNCLOSED_THINK not in job.flags:
            job.flags.append(FLAG_UNCLOSED_THINK)
        if calls and FLAG_INVALID_TOOL_CALL not in job.flags and invalid_calls(calls, job.prompt.tools):
            job.flags.append(FLAG_INVALID_TOOL_CALL)
        job.turns.append(GeneratedTurn(len(job.messages), result.endpoint, result.finish_reason, result.prompt_tokens,
                                       result.completion_tokens, result.reasoning_tokens, result.prompt_token_ids,
                                       result.token_ids, job.retrying))
        if job.identity is None:
            job.identity = record.identity
            self._check_target(job, job.identity)
        job.messages.append(message)
        job.messages += results
        job.retrying = False
        return True

    def _conversation(self, job: _Job) -> Conversation:
        settings, prompt = self._settings, job.prompt
        identity = job.identity or TargetIdentity(None, None, None, None, None)
        generation = Generation(
            model=settings.model, served_model=identity.served_model, model_revision=settings.revision,
            engine_version=identity.engine_version, model_root=identity.model_root,
            quantization=identity.quantization, dtype=identity.dtype, enable_thinking=job.thinking,
            history_reasoning=settings.history_reasoning, sampling=job.sampling, sample_index=job.sample_index,
            turns=tuple(job.turns), tools=job.tool_settings)
        return Conversation(id=job.id, source=prompt.source, origin="generated", messages=job.messages,
                            task=prompt.task, license=prompt.license, flags=job.flags,
                            provenance=replace(prompt.provenance, generation=generation), tools=prompt.tools)

    def _check_target(self, job: _Job, identity: TargetIdentity) -> None:
        """One target per corpus: a row generated by another model than the corpus's (another endpoint's, or
        an earlier run's in the journal) is refused unless the recipe accepts the mix."""
        if self._target is None:
            self._target = identity
        elif not same_model(self._target, identity) and not self._settings.allow_mixed_targets:
            shown = [target.describe() for target in (self._target, identity)]
            raise CorpusError(
                f"row {job.id} ({row_location(job.prompt)}) was generated by another target than the rest of the "
                "corpus: one corpus trains one draft against one verifier. Build into another output directory "
                "(its journal holds the other target's generations), or set target.allow_mixed_targets: true "
                "to accept the mix knowingly", details=[f"corpus target: {shown[0]}", f"this row: {shown[1]}"])

    def _skipped(self, job: _Job, reason: str, detail: str) -> Skipped:
        return Skipped(source=job.prompt.source, reason=reason, location=row_location(job.prompt), detail=detail,
                       id=job.id)

    def _missing(self, job: _Job) -> None:
        turn = len(job.messages)
        if not self._count_missing:
            raise CorpusError(
                f"journal-only run: assistant turn {turn} of row {job.id} ({row_location(job.prompt)}) is not "
                f"in the journal ({len(self._journal)} generations cached); give an endpoint to generate it")
        self._finish(job, self._skipped(job, "not_in_journal", f"assistant turn {turn}"))

    def _finish(self, job: _Job, output: Output) -> None:
        self._finished[job.seq] = output
        if self._progress is not None:
            self._progress.row(skipped=isinstance(output, Skipped), live=job.live)


def drive(loop: asyncio.AbstractEventLoop, scheduler: Scheduler) -> Iterator[Output]:
    """Run the scheduler on ``loop`` from synchronous code, batch by batch; cancels what is in flight
    when the consumer stops early."""
    try:
        while True:
            batch = loop.run_until_complete(scheduler.next_batch())
            if batch is None:
                return
            yield from batch
    finally:
        loop.run_until_complete(scheduler.cancel())
