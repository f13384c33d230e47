"""The in-process backend: ``vllm.LLM`` behind the same interface as the HTTP ``EndpointPool``.

The scheduler hands over turns one by one; this pool gathers every turn queued while the engine is
busy into one ``LLM.chat`` batch (run in a worker thread, so the event loop keeps collecting the next
turns of multi-turn rows). No reasoning parser runs offline: the output is split at ``</think>`` here.

CPU note: vLLM's worker processes are started with ``spawn``, which re-imports the caller's main
module; a script without an ``if __name__ == "__main__":`` guard would start generating again in every
child. This pool runs the engine core in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless set) and
refuses to start inside a spawned child with a message naming the fix.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..errors import CorpusError, MissingDependency
from ..records import THINK_CLOSE, split_think
from .types import EndpointInfo, FaultCounters, PermanentError, TurnRequest, TurnResult

ENGINE_ENDPOINT = "in-process"  # what provenance records as the endpoint of engine generations


class EnginePool:
    """Use as ``async with EnginePool(model, ...)``; ``complete`` batches concurrent turns."""

    def __init__(self, model: str, *, revision: str | None = None, concurrency: int = 64,
                 trust_remote_code: bool = False, engine_kwargs: dict[str, Any] | None = None) -> None:
        self.model = model
        self.revision = revision
        self.concurrency = concurrency
        self.trust_remote_code = trust_remote_code
        self.engine_kwargs = engine_kwargs or {}
        self.counters = FaultCounters()
        self._llm: Any = None
        self._think_close_id: int | None = None
        self._version: str | None = None
        self._queue: list[tuple[TurnRequest, asyncio.Future[TurnResult]]] = []
        self._runner: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-engine")

    async def __aenter__(self) -> EnginePool:
        if multiprocessing.parent_process() is not None:
            raise CorpusError("the in-process vLLM engine was started from a spawned child process: put the "
                              "code that calls generate() under `if __name__ == \"__main__\":`")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            import vllm
        except ImportError as error:
            raise MissingDependency("vllm", "vllm", "the in-process generation engine") from error
        self._version = getattr(vllm, "__version__", None)
        loop = asyncio.get_running_loop()
        self._llm = await loop.run_in_executor(self._executor, lambda: vllm.LLM(
            model=self.model, revision=self.revision, trust_remote_code=self.trust_remote_code,
            **self.engine_kwargs))
        close_id = self._llm.get_tokenizer().convert_tokens_to_ids(THINK_CLOSE)
        self._think_close_id = close_id if isinstance(close_id, int) else None
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._runner is not None:
            self._runner.cancel()
        self._executor.shutdown(wait=True)
        self._llm = None

    async def check(self, expected_model: str | None = None) -> list[EndpointInfo]:
        config = self._llm.llm_engine.model_config
        return [EndpointInfo(url=ENGINE_ENDPOINT, healthy=True, models=[self.model],
                             engine_version=self._version, max_model_len=getattr(config, "max_model_len", None),
                             error=None, model_root=self.model)]

    async def complete(self, request: TurnRequest) -> TurnResult:
        if request.tools:
            raise CorpusError("prompts with tools need a server: the in-process engine has no tool-call parser to "
                              "read the target's calls (set target.backend: server, with vLLM's "
                              "--enable-auto-tool-choice --tool-call-parser for the target's format)")
        future: asyncio.Future[TurnResult] = asyncio.get_running_loop().create_future()
        self._queue.append((request, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run())
        return await future

    async def _run(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self.concurrency], self._queue[self.concurrency:]
            await self._settle(batch)

    async def _settle(self, batch: list[tuple[TurnRequest, asyncio.Future[TurnResult]]]) -> None:
        loop = asyncio.get_running_loop()
        try:
            results = await loop.run_in_executor(self._executor, self._generate, [r for r, _ in batch])
        except Exception as error:
            if len(batch) > 1:  # one bad prompt fails the whole batch: find it, let the others through
                for item in batch:
                    await self._settle([item])
                return
            # vLLM refuses a bad request (e.g. a prompt over max_model_len) with ValueError: permanent.
            # Anything else is the engine's own failure, not the prompt's, and is not journaled.
            status = 400 if isinstance(error, ValueError) else None
            self.counters.error("4xx" if status else "5xx")
            if not batch[0][1].done():
                batch[0][1].set_exception(PermanentError(str(error), status=status, endpoint=ENGINE_ENDPOINT))
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    def _generate(self, requests: list[TurnRequest]) -> list[TurnResult]:
        from vllm import SamplingParams

        try:
            params = [SamplingParams(**_vllm_fields(r.sampling)) for r in requests]
        except TypeError as error:  # a target.generation.extra_sampling field vLLM's engine does not take
            raise CorpusError(f"target.generation.extra_sampling: vllm.SamplingParams refused it: {error}") from None
        outputs = self._llm.chat([list(r.messages) for r in requests], params, use_tqdm=False,
                                 chat_template_kwargs={"enable_thinking": requests[0].enable_thinking})
        return [self._result(request, output) for request, output in zip(requests, outputs, strict=True)]

    def _result(self, request: TurnRequest, output: Any) -> TurnResult:
        completion = output.outputs[0]
        token_ids = list(completion.token_ids)
        text = completion.text
        reasoning: str | None
        content: str | None
        if request.enable_thinking and THINK_CLOSE not in text:
            # The template opened the think block; no close means the whole output is reasoning.
            reasoning, content = text.strip() or None, None
        else:
            content, reasoning, _ = split_think(text)
        if not request.enable_thinking:
            reasoning_tokens = 0
        elif self._think_close_id in token_ids:
            reasoning_tokens = token_ids.index(self._think_close_id) + 1
        else:
            reasoning_tokens = len(token_ids)
        prompt_ids = list(output.prompt_token_ids or [])
        return TurnResult(content=content, reasoning=reasoning, finish_reason=completion.finish_reason,
                          prompt_token_ids=prompt_ids, token_ids=token_ids, prompt_tokens=len(prompt_ids),
                          completion_tokens=len(token_ids), reasoning_tokens=reasoning_tokens,
                          endpoint=ENGINE_ENDPOINT, served_model=self.model)


def _vllm_fields(sampling: Mapping[str, object]) -> dict[str, Any]:
    """The sampling as ``vllm.SamplingParams`` keywords: its values are the recipe's JSON, whose names and types
    vLLM checks itself (a TypeError, reported above)."""
    return dict(sampling)
