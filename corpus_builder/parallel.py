"""Replay sources parsed on every core.

Worker processes read consecutive parts of the replay sources (byte ranges of large .jsonl files, or
whole files), normalise the rows, measure them (token counts, dedup keys) and send Arrow batches. The main
process consumes the parts strictly in order, so the rows, their ids and their splits are exactly those
of a sequential read: only the time changes. Queues are bounded, so memory stays flat.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .collector import rare_collections
from .errors import CorpusError, Skipped
from .recipe_types import Recipe
from .records import Conversation

PREPARED_ROWS = 2048
QUEUE_DEPTH = 4
_PART_DONE = "part-done"
_FAILED = "failed"


@dataclass
class PreparedBatch:
    """Normalised rows in Arrow form (split not set yet), their measurements, and the bad rows before them."""

    batch: pa.RecordBatch
    tokens: list[int | None]
    dedup_keys: list[int | None]
    skipped: list[Skipped]


def worker_count() -> int:
    """CORPUS_WORKERS, else one worker per core but one, leaving a core to the decisions and the writer.

    With two cores or fewer the workers' extra cost (pickled batches, a second copy of the interpreter)
    eats the gain (measured in BENCHMARKS.md), so sources are read in this process; so they are where
    fork is not available."""
    configured = os.environ.get("CORPUS_WORKERS")
    if configured:
        try:
            return max(1, int(configured))
        except ValueError:
            raise CorpusError(f"CORPUS_WORKERS must be a whole number, not {configured!r}") from None
    cores = os.cpu_count() or 1
    if sys.platform != "linux" or cores <= 2:
        return 1
    return cores - 1


def _prepare(rows: Iterator[Conversation | Skipped], measure: Callable[[list[Conversation]], Any]
             ) -> Iterator[PreparedBatch]:
    from .write import conversations_to_batch

    conversations: list[Conversation] = []
    skipped: list[Skipped] = []

    def package() -> PreparedBatch:
        stats = measure(conversations) if conversations else []
        prepared = PreparedBatch(conversations_to_batch(conversations), [s.tokens for s in stats],
                                 [s.dedup_key for s in stats], list(skipped))
        conversations.clear()
        skipped.clear()
        return prepared

    for item in rows:
        if isinstance(item, Skipped):
            skipped.append(item)
            continue
        conversations.append(item)
        if len(conversations) >= PREPARED_ROWS:
            yield package()
    if conversations or skipped:
        yield package()


def _work(parts: list[tuple[int, Callable[[], Iterator[Conversation | Skipped]]]],
          measure: Callable[[list[Conversation]], Any], queue: Any) -> None:
    try:
        for index, part in parts:
            for prepared in _prepare(part(), measure):
                queue.put(prepared)
            queue.put((_PART_DONE, index))
    except CorpusError as error:
        queue.put((_FAILED, str(error), None))
    except BaseException:  # a bug: bring its traceback to the main process
        queue.put((_FAILED, None, traceback.format_exc()))


def prepared_parts(parts: list[Callable[[], Iterator[Conversation | Skipped]]],
                   measure: Callable[[list[Conversation]], Any], workers: int) -> Iterator[PreparedBatch]:
    """Run ``parts`` on ``workers`` forked processes (part i on worker i mod workers); yield in part order."""
    with rare_collections():
        yield from _prepared_parts(parts, measure, workers)


def _prepared_parts(parts: list[Callable[[], Iterator[Conversation | Skipped]]],
                    measure: Callable[[list[Conversation]], Any], workers: int) -> Iterator[PreparedBatch]:
    if workers <= 1:
        for part in parts:
            yield from _prepare(part(), measure)
        return
    context = multiprocessing.get_context("fork")
    workers = min(workers, len(parts))
    queues = [context.Queue(QUEUE_DEPTH) for _ in range(workers)]
    processes = [context.Process(target=_work, args=([(i, p) for i, p in enumerate(parts) if i % workers == w],
                                                     measure, queues[w]), daemon=True)
                 for w in range(workers)]
    for process in processes:
        process.start()
    try:
        for index in range(len(parts)):
            queue = queues[index % workers]
            while True:
                message = queue.get()
                if isinstance(message, PreparedBatch):
                    yield message
                    continue
                if message[0] == _FAILED:
                    if message[1] is not None:
                        raise CorpusError(message[1])
                    raise RuntimeError(f"a source worker failed:\n{message[2]}")
                break  # this part is complete; the next one comes from the next worker
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join()
        for queue in queues:
            queue.close()
            queue.cancel_join_thread()


def replay_stream(recipe: Recipe, measure: Callable[[list[Conversation]], Any]) -> Iterator[PreparedBatch]:
    """Every replay source of a recipe, in recipe order, prepared on ``worker_count()`` processes."""
    from .sources import source_parts

    workers = worker_count()
    parts = [part for spec in recipe.sources if spec.kind == "replay"
             for part in source_parts(spec, recipe.base_dir, workers)]
    if recipe.checks.redact_secrets:
        from .publish.secrets import redact_conversations

        parts = [lambda part=part: redact_conversations(part()) for part in parts]
    return prepared_parts(parts, measure, workers)
