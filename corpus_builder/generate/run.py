"""A generation run: ``generate`` (the target regenerates the assistant turns of prompt conversations, every
finished turn journaled first) and ``journal_coverage`` (what a journal-only rebuild would miss), on one backend
picked by the recipe (``server``: the HTTP endpoint pool; ``engine``: vllm in this process)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..collector import rare_collections
from ..errors import CorpusError, Skipped
from ..recipe.model import Recipe
from ..records import Conversation
from .backend import Backend
from .journal import Journal
from .progress import GenerationProgress
from .scheduler import RunSettings, Scheduler, drive
from .types import MODEL_FIELDS, EndpointInfo, TargetIdentity


def generate(prompts: Iterable[Conversation], recipe: Recipe, journal_dir: Path, *, endpoints: Sequence[str],
             progress: GenerationProgress | None = None, journal_only: bool = False, backend: str | None = None,
             api_key: str | None = None, window: int | None = None, engine_kwargs: dict[str, Any] | None = None,
             alive: Callable[[], None] | None = None) -> Iterator[Conversation | Skipped]:
    """Regenerate the assistant turns of ``prompts`` with the recipe's target; rows in input order.

    ``backend`` is "server" (the OpenAI-compatible ``endpoints``) or "engine" (``vllm.LLM`` in this
    process); it defaults to ``recipe.target.backend``. ``journal_only`` uses no backend at all and
    raises CorpusError at the first turn the journal does not hold (see ``journal_coverage``).
    ``window`` bounds the rows admitted but not yet yielded (default 8 x concurrency);
    ``engine_kwargs`` go to ``vllm.LLM`` (e.g. dtype, max_model_len) with the engine backend. ``alive``
    raises ``GenerationIncomplete`` once whatever serves the endpoints is gone (a launched server's handle).

    A row whose request runs out of retries comes out as a Skipped with reason "unfinished" (nothing
    journaled); ``GenerationIncomplete`` ends the run when no endpoint can answer any more.
    """
    backend = backend or recipe.target.backend
    loop = _new_loop()
    try:
        with rare_collections(), Journal(journal_dir) as journal:
            if journal_only:
                settings = RunSettings.from_recipe(recipe, window=window)
                if progress is not None:
                    progress.start(samples_per_prompt=settings.n)
                yield from drive(loop, Scheduler(prompts, settings, journal, None, progress=progress))
            else:
                pool = _open_backend(recipe, endpoints, backend, api_key, engine_kwargs, alive)
                loop.run_until_complete(pool.__aenter__())
                try:
                    served_model, infos = loop.run_until_complete(check_served_model(pool, recipe.target.model))
                    settings = RunSettings.from_recipe(recipe, served_model, window=window)
                    if progress is not None:
                        progress.start(samples_per_prompt=settings.n, counters=pool.counters)
                    identities = _identities(infos, served_model, settings.allow_mixed_targets)
                    scheduler = Scheduler(prompts, settings, journal, pool.complete, identities=identities,
                                          progress=progress)
                    yield from drive(loop, scheduler)
                finally:
                    loop.run_until_complete(pool.__aexit__(None, None, None))
            if progress is not None:
                progress.finish()
    finally:
        loop.close()


@dataclass
class JournalCoverage:
    """What a journal-only rebuild would produce: rows resolvable from the journal and rows missing."""

    rows: int = 0
    cached_rows: int = 0
    missing_rows: int = 0
    missing_examples: list[Skipped] = field(default_factory=list)  # the first few, for the message

    @property
    def complete(self) -> bool:
        return self.missing_rows == 0


def journal_coverage(prompts: Iterable[Conversation], recipe: Recipe, journal_dir: Path, *,
                     examples: int = 10) -> JournalCoverage:
    """Walk the prompts against the journal alone (no server): how many rows it can rebuild."""
    coverage = JournalCoverage()
    settings = RunSettings.from_recipe(recipe)
    loop = _new_loop()
    try:
        with Journal(journal_dir) as journal:
            for row in drive(loop, Scheduler(prompts, settings, journal, None, count_missing=True)):
                coverage.rows += 1
                if isinstance(row, Skipped) and row.reason == "not_in_journal":
                    coverage.missing_rows += 1
                    if len(coverage.missing_examples) < examples:
                        coverage.missing_examples.append(row)
                else:
                    coverage.cached_rows += 1
    finally:
        loop.close()
    return coverage


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop when it is installed (it comes with vLLM's server extras): about a fifth less client CPU
    per request; the standard loop otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _open_backend(recipe: Recipe, endpoints: Sequence[str], backend: str, api_key: str | None,
                  engine_kwargs: dict[str, Any] | None, alive: Callable[[], None] | None) -> Backend:
    settings = recipe.target.generation
    if backend == "engine":
        from .engine import EnginePool

        return EnginePool(recipe.target.model, revision=recipe.target.revision,
                          concurrency=settings.concurrency, trust_remote_code=recipe.target.trust_remote_code,
                          engine_kwargs=engine_kwargs)
    if backend != "server":
        raise CorpusError(f"unknown generation backend {backend!r} (expected 'server' or 'engine')")
    from .client import EndpointPool

    return EndpointPool(list(endpoints), timeout_s=settings.timeout_s, max_retries=settings.max_retries,
                        concurrency=settings.concurrency, api_key=api_key, max_outage_s=settings.max_outage_s,
                        alive=alive)


def _identities(infos: list[EndpointInfo], served_model: str, allow_mixed: bool) -> dict[str, TargetIdentity]:
    """What each usable endpoint serves; endpoints serving different models fail the run unless accepted."""
    identities = {info.url: TargetIdentity.of(info, served_model) for info in infos
                  if info.healthy and served_model in info.models}
    models = {tuple(identity.fields()[name] for name in MODEL_FIELDS) for identity in identities.values()}
    if len(models) > 1 and not allow_mixed:
        raise CorpusError("the endpoints serve different targets: one corpus trains one draft against one verifier "
                          "(point every endpoint at the same model, or set target.allow_mixed_targets: true)",
                          details=[f"{url}: {identity.describe()}" for url, identity in identities.items()])
    return identities


async def check_served_model(pool: Backend, model: str | None) -> tuple[str, list[EndpointInfo]]:
    """Probe the endpoints; pick the served model name (``model``, or the one name every healthy endpoint
    serves) and take endpoints that do not serve it out of the rotation."""
    infos = await pool.check()
    healthy = [info for info in infos if info.healthy]
    if model is not None and any(model in info.models for info in healthy):
        served = model
    else:
        names = {name for info in healthy for name in info.models}
        if len(names) != 1:
            raise CorpusError(f"no endpoint serves the target model {model!r}" if model is not None
                              else "the endpoints serve more than one model: name the one to use",
                              details=[f"{info.url} serves {info.models}" for info in healthy])
        served = names.pop()
    if not all(served in info.models for info in healthy):
        infos = await pool.check(served)
    return served, infos
