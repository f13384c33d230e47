"""The build's prompt stage: read the prompt sources once, decide once, regenerate.

The prompt sources are read exactly once per build, into a spool in the staging directory (the Arrow row
form), while they are counted and their first turns measured; bad prompt rows go to the ledger then. The
build then decides once: a journal that already holds every turn rebuilds with no backend at all (a
rebuild after changing only checks or output needs no server); otherwise the preflight (endpoints
probed, served model, prompt lengths against the context, the estimate) runs before any request, and the
backend starts: the recipe's endpoints, a local vLLM server started for the build (``target.launch``,
stopped when the stage ends, also on error or Ctrl-C), or the in-process engine (``target.backend:
engine``). Generation reads the spool.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TextIO

import pyarrow as pa

from ..errors import CorpusError, Skipped
from ..generate import GenerationProgress, generate, journal_coverage
from ..recipe.model import Recipe
from ..records import Conversation
from ..rows import ARROW_SCHEMA, batch_to_conversations, conversations_to_batch
from ..sources import prompt_stream
from ..tokens import TemplateRenderer
from .dry_run import SourceCounter, complete_plan, format_plan
from .shards import LedgerWriter

SPOOL = "prompts.arrow"
SPOOL_BATCH = 2048
SERVER_LOG = "vllm-server.log"


class PromptSpool:
    """The prompt conversations of one build, written once and read back as often as the build needs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows = 0

    def fill(self, prompts: Iterator[Conversation | Skipped], ledger: LedgerWriter) -> None:
        """Spool the conversations; bad rows go to the ledger."""
        pending: list[Conversation] = []
        with pa.OSFile(str(self.path), "wb") as sink, pa.ipc.new_stream(sink, ARROW_SCHEMA) as writer:
            for item in prompts:
                if isinstance(item, Skipped):
                    ledger.write(item)
                    continue
                pending.append(item)
                if len(pending) >= SPOOL_BATCH:
                    writer.write_batch(conversations_to_batch(pending))
                    self.rows += len(pending)
                    pending = []
            if pending:
                writer.write_batch(conversations_to_batch(pending))
                self.rows += len(pending)

    def __iter__(self) -> Iterator[Conversation]:
        with pa.OSFile(str(self.path), "rb") as source, pa.ipc.open_stream(source) as reader:
            for batch in reader:
                yield from batch_to_conversations(batch)


@contextmanager
def generated_rows(recipe: Recipe, journal_dir: Path, staging: Path, ledger: LedgerWriter,
                   renderer: TemplateRenderer | None, stream: TextIO) -> Iterator[Iterator[Conversation | Skipped]]:
    """Yields the stream of generated rows (and rows the generation dropped) for the checks to consume
    inside the ``with`` block; a launched server lives exactly as long as the block."""
    counter = SourceCounter(recipe, renderer)
    spool = PromptSpool(staging / SPOOL)
    spool.fill(counter.count(prompt_stream(recipe)), ledger)
    journal_dir.mkdir(parents=True, exist_ok=True)
    coverage = journal_coverage(iter(spool), recipe, journal_dir) if any(journal_dir.iterdir()) else None
    progress = GenerationProgress(spool.rows, stream=stream)
    with ExitStack() as stack:
        if coverage is not None and coverage.complete:
            rows = generate(iter(spool), recipe, journal_dir, endpoints=(), progress=progress, journal_only=True)
        else:
            plan = complete_plan(recipe, counter, ("prompts",), coverage)
            print(format_plan(plan), file=stream)
            if plan.problems:
                raise CorpusError("preflight failed: no request was sent", details=plan.problems)
            endpoints = stack.enter_context(_endpoints(recipe, journal_dir, stream))
            rows = generate(iter(spool), recipe, journal_dir, endpoints=endpoints, progress=progress)
        yield rows


@contextmanager
def _endpoints(recipe: Recipe, journal_dir: Path, stream: TextIO) -> Iterator[tuple[str, ...]]:
    target = recipe.target
    if target.backend == "engine" or target.endpoints:
        yield target.endpoints
        return
    if target.launch is None:
        raise CorpusError("prompt sources need target.endpoints, target.launch or target.backend: engine",
                          file=str(recipe.path))
    from ..generate.launcher import launched_server

    print(f"starting a local vLLM server for {target.model} (log: {journal_dir / SERVER_LOG})", file=stream)
    with launched_server(target.launch, target.model, log_path=journal_dir / SERVER_LOG,
                         trust_remote_code=target.trust_remote_code) as url:
        yield (url,)
