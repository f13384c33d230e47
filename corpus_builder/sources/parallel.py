"""Replay sources parsed on every core.

Worker processes read consecutive parts of the replay sources (byte ranges of large .jsonl files, or
whole files), normalise the rows, measure them with the caller's ``measure`` (the build's token counts
and dedup keys) and send them in batches. The main process consumes the parts strictly in order, so the
rows, their ids and their splits are exactly those of a sequential read: only the time changes. Queues
are bounded, so memory stays flat. With one worker (the default on two cores, unless rows are measured in
the target's tokens) the same batches are made in this process.

Or the workers take turns (``on_turns``): each walks the whole stream, and works on the units whose turn is
its own only (unit n on worker n mod the workers': the batches of rows measured in the target's tokens, the
columnar path's blocks), the main process taking them from each in turn. Or a stream is made on a thread of its own
(``on_thread``), a few items ahead of the caller: the columnar path's blocks in one process.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import sys
import threading
import traceback
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Generic, TypeVar, cast

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
    fork is not available. That holds for the columnar path's blocks too: on a quiet two-core machine two
    readers finished 1.04x sooner than one for 1.45x its CPU and 2.0x its memory (PSS) (BENCHMARKS.md). Rows
    measured in the target's tokens (``in_tokens``) are the exception: rendering and encoding them outweighs
    everything after, so every core gets a worker."""
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


class Turns:
    """Whose turn each unit of a stream is: unit n is worker n mod workers'. Every worker walks the whole stream,
    asking for each unit in order, and does the work of its own units only."""

    def __init__(self, worker: int, workers: int) -> None:
        self.worker, self.workers = worker, workers
        self.number = 0

    def mine(self) -> bool:
        """Whether the stream's next unit is this worker's."""
        mine = self.number % self.workers == self.worker
        self.number += 1
        return mine


@dataclass
class _Ended:
    """A worker's last message: its work is done (by parts, it ends each of its parts too)."""


@dataclass
class _Failed:
    """A worker's last message: its work failed with a CorpusError (``message``) or a bug (``trace``)."""

    message: str | None
    trace: str | None


def _run(work: Callable[[], Iterator[object]], queue: Queue[object]) -> None:
    """A worker's items sent to the main process, then its end or its failure."""
    try:
        for item in work():
            queue.put(item)
        queue.put(_Ended())
    except CorpusError as error:
        queue.put(_Failed(str(error), None))
    except BaseException:  # a bug: bring its traceback to the main process
        queue.put(_Failed(None, traceback.format_exc()))


def _received(queue: Queue[object]) -> object:
    """A worker's next message: an item, or ``_Ended``; its failure raised here."""
    message = queue.get()
    if isinstance(message, _Failed):
        if message.message is not None:
            raise CorpusError(message.message)
        raise RuntimeError(f"a source worker failed:\n{message.trace}")
    return message


@contextmanager
def _forked(works: Sequence[Callable[[], Iterator[object]]], depth: int) -> Iterator[list[Queue[object]]]:
    """Each of ``works`` run on a forked process of its own, its items sent to its queue (``depth`` items ahead at
    most); the processes are ended and joined when the caller is done, or fails."""
    context = multiprocessing.get_context("fork")
    queues: list[Queue[object]] = [context.Queue(depth) for _ in works]
    processes = [context.Process(target=_run, args=(work, queue), daemon=True) for work, queue in zip(works, queues,
                                                                                                      strict=True)]
    for process in processes:
        process.start()
    try:
        yield queues
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join()
        for queue in queues:
            queue.close()
            queue.cancel_join_thread()


def on_turns(work: Callable[[Turns], Iterator[T]], workers: int, depth: int = QUEUE_DEPTH
             ) -> Generator[T, None, None]:
    """The items of a stream worked on by ``workers`` forked processes, in the stream's order: each runs ``work``
    over the whole stream and yields the items of its turns (``Turns.mine``) only, so item n comes from worker
    n mod workers (each at most ``depth`` items ahead: memory stays flat). One worker: in this process."""
    with rare_collections():
        if workers <= 1:
            yield from work(Turns(0, 1))
            return
        with _forked([partial(work, Turns(worker, workers)) for worker in range(workers)], depth) as queues:
            # the stream ends with the end of the worker whose turn comes after the last item (every worker walks
            # the same units)
            turn = 0
            while not isinstance(message := _received(queues[turn % workers]), _Ended):
                yield cast(T, message)
                turn += 1


def on_thread(items: Generator[T, None, None], depth: int) -> Generator[T, None, None]:
    """The items of ``items``, made on a thread of their own at most ``depth`` ahead of the caller (memory stays
    flat): where making them is mostly pyarrow's and numpy's kernels and the caller's work is too (they release the
    GIL), the two overlap on two cores. A failure is raised in the caller; a caller that stops early stops the
    thread."""
    ready: queue.Queue[tuple[T] | _Ended | BaseException] = queue.Queue(depth)
    stop = threading.Event()

    def make() -> None:
        try:
            for item in items:
                if not _offered(ready, (item,), stop):
                    return
            _offered(ready, _Ended(), stop)
        except BaseException as error:  # raised again on the caller's thread
            _offered(ready, error, stop)
        finally:
            items.close()  # on its own thread, where it ran

    thread = threading.Thread(target=make, name="read-ahead", daemon=True)
    with rare_collections():
        thread.start()
        try:
            while not isinstance(message := ready.get(), _Ended):
                if isinstance(message, BaseException):
                    raise message
                yield message[0]
        finally:
            stop.set()
            thread.join()


def _offered(ready: queue.Queue[T], item: T, stop: threading.Event) -> bool:
    """``item`` put on ``ready`` once there is room, unless the caller stopped first (then False)."""
    while not stop.is_set():
        try:
            ready.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


def _measured_turns(parts: list[Part], measure: Callable[[list[Conversation]], T], batch_rows: int, turns: Turns
                    ) -> Iterator[MeasuredRows[T]]:
    """Every part read, the batches whose turn is this worker's measured."""
    for part in parts:
        for items, conversations in _batches(part(), batch_rows):
            if turns.mine():
                yield MeasuredRows(items, measure(conversations))


def _measured_share(parts: list[Part], measure: Callable[[list[Conversation]], T], batch_rows: int
                    ) -> Iterator[MeasuredRows[T] | _Ended]:
    """A worker's parts measured, each followed by its end."""
    for part in parts:
        yield from measured_rows(part(), measure, batch_rows)
        yield _Ended()


def measured_parts(parts: list[Part], measure: Callable[[list[Conversation]], T], workers: int,
                   batch_rows: int = PREPARED_ROWS, *, by_turns: bool = False) -> Iterator[MeasuredRows[T]]:
    """Run ``parts`` on ``workers`` forked processes and yield their batches in order: part i on worker i mod
    workers, or, ``by_turns``, every part on every worker, batch n measured by worker n mod workers.

    By parts, a worker runs at most QUEUE_DEPTH batches ahead of the part being consumed, so the workers take
    turns part by part: that pays where the consumer is the slowest (parsing). By turns, every worker parses
    every row but measures only its share, and the workers work side by side whatever the consumer's pace:
    that pays where measuring outweighs parsing (the target's tokens: rendering and encoding a row costs about
    ten times parsing it)."""
    if by_turns or workers <= 1 or not parts:
        yield from on_turns(partial(_measured_turns, parts, measure, batch_rows), workers)
        return
    workers = min(workers, len(parts))
    shares = [partial(_measured_share, parts[w::workers], measure,
                      batch_rows) for w in range(workers)]
    with rare_collections(), _forked(shares, QUEUE_DEPTH) as queues:
        for index in range(len(parts)):  # a part ends with its worker's end of it; the next comes from the next
            while not isinstance(message := _received(queues[index % workers]), _Ended):
                yield cast(MeasuredRows[T], message)


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
