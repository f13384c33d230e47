"""The build's generation stage: pick the backend for a recipe and turn prompt rows into generated rows.

Backends, in order: a journal that already holds every turn (a rebuild after changing only checks or
output needs no server at all); the recipe's endpoints; a local vLLM server started for the build
(`target.launch`, stopped when the build ends, also on error or Ctrl-C); the in-process engine
(`target.backend: engine`).
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from .errors import CorpusError, Skipped
from .recipe_types import Recipe
from .records import Conversation

PromptFactory = Callable[[], Iterator[Conversation | Skipped]]
SERVER_LOG = "vllm-server.log"


def split_skipped(items: Iterator[Conversation | Skipped], skipped: deque[Skipped]) -> Iterator[Conversation]:
    """Feed prompt conversations to the generator; bad prompt rows wait in ``skipped`` for the ledger."""
    for item in items:
        if isinstance(item, Skipped):
            skipped.append(item)
        else:
            yield item


def _merge(generated: Iterator[Conversation | Skipped], skipped: deque[Skipped]) -> Iterator[Conversation | Skipped]:
    for row in generated:
        while skipped:
            yield skipped.popleft()
        yield row
    while skipped:
        yield skipped.popleft()


def journal_is_complete(recipe: Recipe, prompts: PromptFactory, journal_dir: Path) -> bool:
    from .generate import journal_coverage

    if not journal_dir.is_dir() or not any(journal_dir.iterdir()):
        return False
    return journal_coverage(split_skipped(prompts(), deque()), recipe, journal_dir).complete


@contextmanager
def generated_stream(recipe: Recipe, prompts: PromptFactory, journal_dir: Path,
                     *, total: int | None = None) -> Iterator[Iterator[Conversation | Skipped]]:
    """Yields the stream of generated rows (and skipped prompt rows) for ``write_corpus`` to consume
    inside the ``with`` block; a launched server lives exactly as long as the block."""
    from .generate import Progress, generate

    journal_dir.mkdir(parents=True, exist_ok=True)
    skipped: deque[Skipped] = deque()
    progress = Progress(total, stream=sys.stderr)
    with ExitStack() as stack:
        if journal_is_complete(recipe, prompts, journal_dir):
            rows = generate(split_skipped(prompts(), skipped), recipe, journal_dir, endpoints=(),
                            progress=progress, journal_only=True)
        else:
            _preflight(recipe, journal_dir.parent)
            endpoints = stack.enter_context(_endpoints(recipe, journal_dir))
            rows = generate(split_skipped(prompts(), skipped), recipe, journal_dir, endpoints=endpoints,
                            progress=progress)
        yield _merge(rows, skipped)


def _preflight(recipe: Recipe, out_dir: Path) -> None:
    """Before any request: the endpoints answer and serve the model, prompts fit the context; the estimate."""
    from .plan import format_plan, plan_build

    plan = plan_build(recipe, out_dir, kinds=("prompts",))
    print(format_plan(plan), file=sys.stderr)
    if plan.problems:
        raise CorpusError("preflight failed: no request was sent", details=plan.problems)


@contextmanager
def _endpoints(recipe: Recipe, journal_dir: Path) -> Iterator[tuple[str, ...]]:
    target = recipe.target
    if target.backend == "engine" or target.endpoints:
        yield target.endpoints
        return
    if target.launch is None:
        raise CorpusError("prompt sources need target.endpoints, target.launch or target.backend: engine",
                          file=str(recipe.path))
    from .generate.launcher import launched_server

    print(f"starting a local vLLM server for {target.model} (log: {journal_dir / SERVER_LOG})", file=sys.stderr)
    with launched_server(target.launch, target.model, log_path=journal_dir / SERVER_LOG,
                         trust_remote_code=target.trust_remote_code) as url:
        yield (url,)
