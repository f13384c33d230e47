"""Replay sources parsed on every core.

Worker processes read consecutive parts of the replay sources (byte ranges of large .jsonl files, or
whole files), normalise the rows, measure them with the caller's ``measure`` (the build's token counts
and dedup keys) and send them in batches. The main process consumes the parts strictly in order, so the
rows, their ids and their splits are exactly those of a sequential read: only the time changes. Queues
are bounded, so memory stays flat. With one worker (the default on two cores, unless rows are measured in
the target's tokens) the same batches are made in this process.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Generic, TypeVar

from ..collector import rare_collections
from ..errors import CorpusError, Skipped
from ..recipe.model import SourceSpec
from ..records import Conversation
from ..secrets import redact_conversations
from .source import source_parts

PREPARED_ROWS = 2048
# Rows measured in the target's tokens carry each view's renders and ids until the batch is assembled: smaller
# batches keep a worker's memory near the interpreter's own (measured, unique memory per worker: 27 MiB at 128
# rows, 37 at 512, 85 at 2,048), at the same speed.
PREPARED_TOKEN_ROWS = 128
QUEUE_DEPTH = 4
_DONE = "done"
_FAILED = "failed"


T = TypeVar("T")
Part = Callable[[], Iterator[Conversation | Skipped]]


@dataclass
class MeasuredRows(Generic[T]):
    """Consecutive rows of a source in their order, kept and skipped, with the measurement of the kept rows."""

    items: list[Conversation | Skipped]
    measurement: T


def worker_count(*, in_tokens: bool = False) -> int:
    """CORPUS_WORKERS, else one worker per core but one, leaving a core to the decisions and the writer.

    With two cores or fewer the workers' extra cost (pickled batches, a second copy of the interpreter)
    eats the gain (measured in BENCHMARKS.md), so sources are read in this process; so they are where
    fork is not available. Rows measured in the target's tokens (``in_tokens``) are the exception: rendering
    and encoding them outweighs everything after, so every core gets a worker."""
    configured = os.environ.get("CORPUS_WORKERS")
    if configured:
        try:
            return max(1, int(configured))
        except ValueError:
            raise CorpusError(f"CORPUS_WORKERS must be a whole number, not {configured!r}") from None
    cores = os.cpu_count() or 1
    if sys.platform != "linux":
        return 1
    if in_tokens:
        return cores
    return 1 if cores <= 2 else cores - 1


def measured_rows(rows: Iterator[Conversation | Skipped], measure: Callable[[list[Conversation]], T],
                  batch_rows: int = PREPARED_ROWS) -> Iterator[MeasuredRows[T]]:
    """Consecutive rows in batches of ``batch_rows`` conversations (and the skipped rows between them), measured."""
    for items, conversations in _batches(rows, batch_rows):
        yield MeasuredRows(items, measure(conversations))


def _batches(rows: Iterator[Conversation | Skipped], batch_rows: int
             ) -> Iterator[tuple[list[Conversation | Skipped], list[Conversation]]]:
    items: list[Conversation | Skipped] = []
    conversations: list[Conversation] = []
    for item in rows:
        items.append(item)
        if isinstance(item, Conversation):
            conversations.append(item)
            if len(conversations) >= batch_rows:
                yield items, conversations
                items, conversations = [], []
    if items:
        yield items, conversations


def _work(parts: list[tuple[int, Part]], measure: Callable[[list[Conversation]], T], batch_rows: int,
          queue: Queue[object]) -> None:
    with _failures_sent(queue):
        for index, part in parts:
            for measured in measured_rows(part(), measure, batch_rows):
                queue.put(measured)
            queue.put((_DONE, index))


def _work_on_turns(parts: list[Part], measure: Callable[[list[Conversation]], T], batch_rows: int, worker: int,
                   workers: int, queue: Queue[object]) -> None:
    """Read every part, measure the batches whose turn is this worker's (batch n is worker n mod workers')."""
    with _failures_sent(queue):
        number = 0
        for part in parts:
            for items, conversations in _batches(part(), batch_rows):
                if number % workers == worker:
                    queue.put(MeasuredRows(items, measure(conversations)))
                number += 1
        queue.put((_DONE, number))


@contextmanager
def _failures_sent(queue: Queue[object]) -> Iterator[None]:
    try:
        yield
    except CorpusError as error:
        queue.put((_FAILED, str(error), None))
    except BaseException:  # a bug: bring its traceback to the main process
        queue.put((_FAILED, None, traceback.format_exc()))


def measured_parts(parts: list[Part], measure: Callable[[list[Conversation]], T], workers: int,
                   batch_rows: int = PREPARED_ROWS, *, by_turns: bool = False) -> Iterator[MeasuredRows[T]]:
    """Run ``parts`` on ``workers`` forked processes and yield their batches in order: part i on worker i mod
    workers, or, ``by_turns``, every part on every worker, batch n measured by worker n mod workers.

    By parts, a worker runs at most QUEUE_DEPTH batches ahead of the part being consumed, so the workers take
    turns part by part: that pays where the consumer is the slowest (parsing). By turns, every worker parses
    every row but measures only its share, and the workers work side by side whatever the consumer's pace:
    that pays where measuring outweighs parsing (the target's tokens: rendering and encoding a row costs about
    ten times parsing it)."""
    with rare_collections():
        yield from _measured_parts(parts, measure, workers, batch_rows, by_turns)


def _measured_parts(parts: list[Part], measure: Callable[[list[Conversation]], T], workers: int, batch_rows: int,
                    by_turns: bool) -> Iterator[MeasuredRows[T]]:
    if workers <= 1 or not parts:
        for part in parts:
            yield from measured_rows(part(), measure, batch_rows)
        return
    context = multiprocessing.get_context("fork")
    if not by_turns:
        workers = min(workers, len(parts))
    queues = [context.Queue(QUEUE_DEPTH) for _ in range(workers)]
    processes = [context.Process(target=_work_on_turns, args=(parts, measure, batch_rows, w, workers, queues[w]),
                                 daemon=True) if by_turns else
                 context.Process(target=_work, args=([(i, p) for i, p in enumerate(parts) if i % workers == w],
                                                     measure, batch_rows, queues[w]), daemon=True)
                 for w in range(workers)]
    for process in processes:
        process.start()
    try:
        # By parts, a part ends with its worker's done; by turns, the stream ends with the done of the worker
        # whose turn comes after the last batch (every worker counts the same batches).
        ends = 1 if by_turns else len(parts)
        turn = 0
        for _ in range(ends):
            while True:
                message = queues[turn % workers].get()
                if isinstance(message, MeasuredRows):
                    yield message
                    if by_turns:
                        turn += 1
                    continue
                if message[0] == _FAILED:
                    if message[1] is not None:
                        raise CorpusError(message[1])
                    raise RuntimeError(f"a source worker failed:\n{message[2]}")
                break
            if not by_turns:
                turn += 1  # this part is complete; the next one comes from the next worker
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join()
        for queue in queues:
            queue.close()
            queue.cancel_join_thread()


def _redacted(part: Part) -> Iterator[Conversation | Skipped]:
    return redact_conversations(part())


def replay_parts(sources: Sequence[SourceSpec], base_dir: Path, parts: int, *, redact: bool = False) -> list[Part]:
    """Replay sources (in dedup order: the row kept of duplicates is the first read) as consecutive parts (about
    ``parts`` per source file worth cutting); secrets redacted first when ``redact``."""
    cut = [part for spec in sources for part in source_parts(spec, base_dir, parts)]
    if redact:
        return [partial(_redacted, part) for part in cut]
    return cut


def replay_stream(parts: Callable[[int], list[Part]], measure: Callable[[list[Conversation]], T], *,
                  in_tokens: bool = False) -> Iterator[MeasuredRows[T]]:
    """The replay sources' ``parts(count)`` (cut for ``count`` workers), read and measured on ``worker_count()``
    processes; ``in_tokens``: ``measure`` renders and encodes the rows in the target's tokens."""
    workers = worker_count(in_tokens=in_tokens)
    if in_tokens:  # every worker reads every row (whole files, not cut), measures its turns' batches
        return measured_parts(parts(1), measure, workers, PREPARED_TOKEN_ROWS, by_turns=True)
    return measured_parts(parts(workers), measure, workers)
