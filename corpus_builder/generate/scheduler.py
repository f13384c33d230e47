"""Turn-by-turn regeneration of prompt conversations: a bounded in-flight pool, ordered output, resume.

Each output row (one prompt conversation x one sample index) is a ``_Job`` that walks its user turns:
the request for assistant turn k carries the system/user turns plus the assistant turns already
regenerated for turns < k. Every finished turn goes to the journal before anything built from it is
yielded; a turn whose key is in the journal is resolved without a request, so a rerun after a crash,
or a rebuild with other checks, repeats only what never finished.

Bounds: at most ``concurrency`` requests in flight (turns of different conversations interleave; the
next turns of older rows go first) and up to as many more waiting for a slot, at most ``window`` rows
admitted but not yet yielded, input pulled lazily. Rows are yielded in input order, so downstream stages
see the same stream on every run.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import CorpusError, Skipped
from ..recipe.model import GenerationSettings, Recipe
from ..records import (
    FLAG_TRUNCATED,
    FLAG_UNCLOSED_THINK,
    Conversation,
    Message,
    conversation_id,
    make_message,
)
from .journal import Journal, turn_key
from .progress import GenerationProgress
from .types import PermanentError, TurnRequest, TurnResult

Complete = Callable[[TurnRequest], Awaitable[TurnResult]]
Output = Conversation | Skipped

# Result fields stored per generated turn (the journal record); "engine_version" comes from the endpoint.
_RESULT_FIELDS = ("content", "reasoning", "finish_reason", "prompt_token_ids", "token_ids", "prompt_tokens",
                  "completion_tokens", "reasoning_tokens", "endpoint", "served_model")
# A refusal of the request's content (bad request, prompt too long, unprocessable) would repeat on every
# run: it is journaled so a rebuild does not need the server again. Refusals that depend on the setup
# (401/403 credentials, 404 model name) and exhausted retries are not: a fixed rerun asks again.
_JOURNALED_ERROR_STATUSES = frozenset({400, 413, 422})


@dataclass(frozen=True, slots=True)
class RunSettings:
    """Everything that is fixed for one run, resolved from the recipe and the endpoints."""

    model: str  # the recipe's model id: part of the journal key
    revision: str | None
    served_model: str  # the name sent in requests
    enable_thinking: bool
    history_reasoning: str  # keep | drop
    on_length: str  # drop | keep | retry
    sampling: dict[str, Any]
    retry_max_tokens: int
    n: int
    concurrency: int
    window: int

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
        )

    def sample_sampling(self, sample_index: int) -> dict[str, Any]:
        """Sampling for one sample: with a fixed seed, each sample gets its own (seed + index), or the
        n samples of a prompt would be the same text n times."""
        if self.n > 1 and "seed" in self.sampling:
            return {**self.sampling, "seed": self.sampling["seed"] + sample_index}
        return self.sampling


class _Job:
    """One output row in the making."""

    __slots__ = ("cursor", "engine_version", "flags", "history", "id", "live", "messages", "prompt",
                 "retrying", "sample_index", "sampling", "seq", "served_model", "turns")

    def __init__(self, seq: int, prompt: Conversation, row_id: str, sample_index: int,
                 sampling: dict[str, Any]) -> None:
        self.seq = seq
        self.prompt = prompt
        self.id = row_id
        self.sample_index = sample_index
        self.sampling = sampling
        self.cursor = 0  # index in prompt.messages of the next turn to copy
        self.history: list[dict[str, Any]] = []  # the request messages so far
        self.messages: list[Message] = []
        self.turns: list[dict[str, Any]] = []
        self.flags: list[str] = []
        self.retrying = False
        self.live = False  # at least one turn came from a request in this run
        self.served_model: str | None = None
        self.engine_version: str | None = None


def _location(prompt: Conversation) -> str:
    provenance = prompt.provenance
    where = str(provenance.get("source_file", prompt.source))
    if "source_line" in provenance:
        return f"{where}:{provenance['source_line']}"
    if "source_row" in provenance:
        return f"{where}#{provenance['source_row']}"
    return where


def result_record(result: TurnResult, engine_version: str | None) -> dict[str, Any]:
    record = {name: getattr(result, name) for name in _RESULT_FIELDS}
    record["engine_version"] = engine_version
    return record


class Scheduler:
    """Drives the jobs. ``complete`` is None in journal-only mode: a missing turn then raises
    CorpusError, or (``count_missing``) is yielded as a Skipped with reason "not_in_journal"."""

    def __init__(self, prompts: Iterable[Conversation], settings: RunSettings, journal: Journal,
                 complete: Complete | None, *, engine_versions: dict[str, str | None] | None = None,
                 progress: GenerationProgress | None = None, count_missing: bool = False) -> None:
        self._input = iter(prompts)
        self._settings = settings
        self._journal = journal
        self._complete = complete
        self._engine_versions = engine_versions or {}
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
            except Exception as error:  # PermanentError becomes a Skipped; anything else is re-raised
                outcome = error
            self._in_flight -= 1
            self._completed.append((job, key, outcome))
            self._wakeup.set()
            if not self._waiting or (isinstance(outcome, Exception) and not isinstance(outcome, PermanentError)):
                return
            job, request, key = self._take_waiting()

    def _absorb(self) -> None:
        """Journal a batch of finished requests (one frame), then move their rows on."""
        batch = list(self._completed)
        self._completed.clear()
        records = []
        for job, key, outcome in batch:
            if isinstance(outcome, PermanentError):
                record: dict[str, Any] = {"error": outcome.message, "status": outcome.status}
                if outcome.status in _JOURNALED_ERROR_STATUSES:
                    self._journal.append(key, record)
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                record = result_record(outcome, self._engine_versions.get(outcome.endpoint))
                self._journal.append(key, record)
            records.append((job, key, record))
        self._journal.flush()  # before any row built from these turns can be yielded
        for job, key, record in records:
            for row in (job, *self._sharing.pop(key)):
                if self._apply(row, record, cached=row is not job):
                    self._advance(row)

    # -- rows --------------------------------------------------------------------------------------

    def _admit(self, prompt: Conversation) -> None:
        settings = self._settings
        for sample_index in range(settings.n):
            salt = f"#{sample_index}" if settings.n > 1 else ""
            row_id = conversation_id(prompt.source, prompt.messages, salt=salt)
            job = _Job(self._next_seq, prompt, row_id, sample_index, settings.sample_sampling(sample_index))
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
            messages = tuple(job.history)
            key = turn_key(messages, sampling, model=settings.model, revision=settings.revision,
                           enable_thinking=settings.enable_thinking, sample_index=job.sample_index)
            record = self._journal.get(key)
            if record is None:
                if self._complete is None:
                    self._missing(job)
                    return
                if key in self._sharing:  # an identical turn is already asked for: one key, one generation
                    self._sharing[key].append(job)
                    return
                self._sharing[key] = []
                request = TurnRequest(messages=messages, sampling=sampling,
                                      enable_thinking=settings.enable_thinking, model=settings.served_model)
                self._tie += 1
                heapq.heappush(self._waiting, (job.seq, self._tie, job, request, key))
                return
            if not self._apply(job, record, cached=True):
                return

    def _copy_prompt_turn(self, job: _Job) -> bool:
        """Copy prompt turns up to and including the next user turn; False when none is left."""
        messages = job.prompt.messages
        while job.cursor < len(messages):
            message = messages[job.cursor]
            job.cursor += 1
            if message.role == "assistant":
                continue  # prompts carry no assistant turns; a stray one is not ours to answer
            job.messages.append(message)
            job.history.append({"role": message.role, "content": message.content})
            if message.role == "user":
                return True
        return False

    def _apply(self, job: _Job, record: dict[str, Any], *, cached: bool) -> bool:
        """Take one turn's result into the row; False when the row is finished (dropped)."""
        settings = self._settings
        if "error" in record:
            self._finish(job, self._skipped(job, "generation_error", record["error"]))
            return False
        job.live |= not cached
        if self._progress is not None:
            self._progress.turn(record.get("completion_tokens") or 0, record.get("reasoning_tokens") or 0,
                                cached=cached)
        if record["finish_reason"] == "length":
            if settings.on_length == "retry" and not job.retrying:
                job.retrying = True
                return True
            if settings.on_length != "keep":
                limit = settings.retry_max_tokens if job.retrying else job.sampling["max_tokens"]
                detail = f"assistant turn {len(job.messages)} stopped at max_tokens={limit}"
                self._finish(job, self._skipped(job, "truncated_generation", detail))
                return False
            if FLAG_TRUNCATED not in job.flags:
                job.flags.append(FLAG_TRUNCATED)
        message, unclosed = make_message("assistant", record["content"] or "", record["reasoning"])
        if unclosed and FLAG_UNCLOSED_THINK not in job.flags:
            job.flags.append(FLAG_UNCLOSED_THINK)
        job.turns.append({
            "message_index": len(job.messages),
            "endpoint": record["endpoint"],
            "finish_reason": record["finish_reason"],
            "prompt_tokens": record["prompt_tokens"],
            "completion_tokens": record["completion_tokens"],
            "reasoning_tokens": record["reasoning_tokens"],
            "prompt_token_ids": record["prompt_token_ids"],
            "token_ids": record["token_ids"],
            "retried_for_length": job.retrying,
        })
        if job.served_model is None:
            job.served_model = record["served_model"]
            job.engine_version = record.get("engine_version")
        job.messages.append(message)
        sent: dict[str, Any] = {"role": "assistant", "content": message.content}
        if settings.history_reasoning == "keep" and message.reasoning:
            sent["reasoning_content"] = message.reasoning
        job.history.append(sent)
        job.retrying = False
        return True

    def _conversation(self, job: _Job) -> Conversation:
        settings, prompt = self._settings, job.prompt
        generation = {
            "model": settings.model,
            "served_model": job.served_model,
            "model_revision": settings.revision,
            "engine_version": job.engine_version,
            "enable_thinking": settings.enable_thinking,
            "history_reasoning": settings.history_reasoning,
            "sampling": job.sampling,
            "sample_index": job.sample_index,
            "turns": job.turns,
        }
        return Conversation(id=job.id, source=prompt.source, origin="generated", messages=job.messages,
                            task=prompt.task, license=prompt.license, flags=job.flags,
                            provenance={**prompt.provenance, "generation": generation})

    def _skipped(self, job: _Job, reason: str, detail: str) -> Skipped:
        return Skipped(source=job.prompt.source, reason=reason, location=_location(job.prompt), detail=detail,
                       id=job.id)

    def _missing(self, job: _Job) -> None:
        turn = len(job.messages)
        if not self._count_missing:
            raise CorpusError(
                f"journal-only run: assistant turn {turn} of row {job.id} ({_location(job.prompt)}) is not "
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
