"""The build's prompt stage: read the prompt sources once, decide once, regenerate.

The prompt sources are read exactly once per build, into a spool in the staging directory (the Arrow row
form), while they are counted and their first turns measured; bad prompt rows, and duplicate or contaminated
prompts (the screen's checks), go to the ledger then. The
build then decides once: a journal that already holds every turn rebuilds with no backend at all (a
rebuild after changing only checks or output needs no server); otherwise the preflight (endpoints
probed, served model, prompt lengths against the context, the estimate) runs before any request, and the
backend starts: the recipe's endpoints, a local vLLM server started for the build (``target.launch``,
stopped when the stage ends, also on error or Ctrl-C), or the in-process engine (``target.backend:
engine``). Generation reads the spool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TextIO

from ..errors import CorpusError, Skipped
from ..generate import GenerationIncomplete, GenerationProgress, JournalCoverage, generate, journal_coverage
from ..generate.journal import SEGMENT_GLOB
from ..recipe.model import Recipe
from ..records import Conversation
from ..rows import RowSpool
from ..sources import prompt_stream
from ..tokens import TemplateRenderer
from .dry_run import SourceCounter, complete_plan, format_plan
from .shards import LedgerWriter

SPOOL = "prompts.arrow"
SERVER_LOG = "vllm-server.log"


def spool_prompts(path: Path, prompts: Iterator[Conversation | Skipped], ledger: LedgerWriter) -> RowSpool:
    """The prompt conversations of one build, spooled once to be read back as often as the build needs; bad
    rows go to the ledger."""
    with RowSpool(path) as spool:
        for item in prompts:
            if isinstance(item, Skipped):
                ledger.write(item)
            else:
                spool.append(item)
    return spool


class GenerationSession:
    """Generation for one build: the prompt sources read once into a spool, the journal, and a backend that
    is started at most once, the first time a batch of prompts needs a turn the journal does not hold.

    ``rows`` may be called several times (a build that tops sources up asks in rounds); each call first asks
    the journal alone whether it covers the batch, so a rebuild needs no server at all."""

    def __init__(self, recipe: Recipe, journal_dir: Path, staging: Path, ledger: LedgerWriter,
                 renderer: TemplateRenderer | None, stream: TextIO, stack: ExitStack, *,
                 screen: Callable[[Iterable[Conversation | Skipped]], Iterator[Conversation | Skipped]]) -> None:
        self.recipe = recipe
        self.journal_dir = journal_dir
        self.stream = stream
        self._stack = stack
        self._counter = SourceCounter(recipe, renderer)
        # duplicate and contaminated prompts are dropped before they cost a request
        self.spool = spool_prompts(staging / SPOOL, self._counter.count(screen(prompt_stream(recipe))), ledger)
        journal_dir.mkdir(parents=True, exist_ok=True)
        self._backend: tuple[tuple[str, ...], Callable[[], None] | None] | None = None

    def rows(self, prompts: Callable[[], Iterator[Conversation]], count: int) -> Iterator[Conversation | Skipped]:
        """The generated rows of the ``count`` prompts ``prompts()`` yields (it is called once or twice)."""
        journal = self.journal_dir
        coverage = journal_coverage(prompts(), self.recipe, journal) if any(journal.glob(SEGMENT_GLOB)) else None
        progress = GenerationProgress(count, stream=self.stream)
        if coverage is not None and coverage.complete:
            rows = generate(prompts(), self.recipe, journal, endpoints=(), progress=progress, journal_only=True)
        else:
            endpoints, alive = self._started(coverage)
            rows = generate(prompts(), self.recipe, journal, endpoints=endpoints, progress=progress, alive=alive)
        return _stopped_with_count(rows, progress)

    def _started(self, coverage: JournalCoverage | None) -> tuple[tuple[str, ...], Callable[[], None] | None]:
        """The backend, after the preflight (printed; its problems stop the build before any request)."""
        if self._backend is None:
            plan = complete_plan(self.recipe, self._counter, ("prompts",), coverage)
            print(format_plan(plan), file=self.stream)
            if plan.problems:
                raise CorpusError("preflight failed: no request was sent", details=plan.problems)
            self._backend = self._stack.enter_context(_endpoints(self.recipe, self.journal_dir, self.stream))
        return self._backend


def _stopped_with_count(rows: Iterator[Conversation | Skipped], progress: GenerationProgress
                        ) -> Iterator[Conversation | Skipped]:
    """The generated rows; when generation stops, the error says how many rows are left for a rerun."""
    try:
        yield from rows
    except GenerationIncomplete as stopped:
        left = (progress.total or 0) - progress.done
        raise GenerationIncomplete(f"{stopped.problem}; {left:,} of {progress.total or 0:,} generated rows unfinished: "
                                   "nothing was written, rerun to resume (every finished turn is journaled)",
                                   unfinished_rows=left, details=stopped.details) from stopped


@contextmanager
def _endpoints(recipe: Recipe, journal_dir: Path, stream: TextIO
               ) -> Iterator[tuple[tuple[str, ...], Callable[[], None] | None]]:
    """The endpoints to generate with, and the liveness check of a server launched for the build."""
    target = recipe.target
    if target.backend == "engine" or target.endpoints:
        yield target.endpoints, None
        return
    if target.launch is None:
        raise CorpusError("prompt sources need target.endpoints, target.launch or target.backend: engine",
                          file=str(recipe.path))
    from ..generate.launcher import launched_server

    print(f"starting a local vLLM server for {target.model} (log: {journal_dir / SERVER_LOG})", file=stream)
    with launched_server(target.launch, target.model, log_path=journal_dir / SERVER_LOG,
                         trust_remote_code=target.trust_remote_code) as server:
        yield (server.url,), server.raise_if_exited
