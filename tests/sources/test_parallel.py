"""The forked readers (sources/parallel.py): a stream worked on by turns comes back in its order, from every worker;
a worker's failure is raised in the main process and the workers are ended. A stream read ahead on a thread comes
back in its order, made on that thread, never more than its depth ahead; its failure is raised in the caller, and a
caller that stops early stops it."""

from __future__ import annotations

import os
import threading
from collections.abc import Generator, Iterator

import pytest

from corpus_builder.errors import CorpusError
from corpus_builder.sources.parallel import Turns, on_thread, on_turns, worker_count


def numbered(units: int, turns: Turns) -> Iterator[tuple[int, int]]:
    """Units 0 to ``units`` - 1, each of this worker's turns as (unit, the process that worked on it)."""
    for unit in range(units):
        if turns.mine():
            yield unit, os.getpid()


def failing_at(unit: int, error: Exception, turns: Turns) -> Iterator[tuple[int, int]]:
    for number, pid in numbered(unit + 5, turns):
        if number == unit:
            raise error
        yield number, pid


def ended(pids: set[int]) -> bool:
    """Whether none of ``pids`` (processes this test's stream started) still runs."""
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_stream_on_turns_comes_back_in_order_from_every_worker(workers: int) -> None:
    items = list(on_turns(lambda turns: numbered(11, turns), workers, depth=1))
    assert [unit for unit, _ in items] == list(range(11))
    pids = {pid for _, pid in items}
    if workers == 1:
        assert pids == {os.getpid()}
    else:  # unit n on worker n mod workers
        assert len(pids) == workers and os.getpid() not in pids
        assert all(items[n][1] == items[n % workers][1] for n in range(11))
        assert ended(pids)


def test_a_workers_corpus_error_is_raised_in_the_main_process_and_the_workers_end() -> None:
    seen: set[int] = set()
    with pytest.raises(CorpusError, match=r"^rows\.jsonl:7: cannot read this row$"):
        for _, pid in on_turns(lambda turns: failing_at(3, CorpusError("cannot read this row", file="rows.jsonl",
                                                                       line=7), turns), 2):
            seen.add(pid)
    assert len(seen) == 2 and ended(seen)


def test_a_workers_bug_comes_with_its_traceback() -> None:
    with pytest.raises(RuntimeError, match=r"(?s)a source worker failed:.*failing_at.*ZeroDivisionError: no"):
        list(on_turns(lambda turns: failing_at(4, ZeroDivisionError("no"), turns), 2))


def test_a_main_process_that_stops_early_ends_the_workers() -> None:
    stream = on_turns(lambda turns: numbered(1000, turns), 2, depth=1)
    pids = {pid for _, pid in (next(stream), next(stream))}
    stream.close()
    assert len(pids) == 2 and ended(pids)


class Made:
    """What a stream read ahead did: the items it made (and on which thread), whether it was closed."""

    def __init__(self, watched: int = -1) -> None:
        self.threads: list[int] = []
        self.closed = False
        self.watched = watched  # the item whose making ``made_watched`` tells
        self.made_watched = threading.Event()

    def items(self, count: int, failing_at: int | None = None) -> Generator[int, None, None]:
        try:
            for item in range(count):
                if item == failing_at:
                    raise ZeroDivisionError("no")
                self.threads.append(threading.get_ident())
                if item == self.watched:
                    self.made_watched.set()
                yield item
        finally:
            self.closed = True


def test_a_stream_read_ahead_comes_back_in_order_made_on_another_thread() -> None:
    made = Made()
    assert list(on_thread(made.items(50), depth=2)) == list(range(50))
    assert set(made.threads) != {threading.get_ident()} and len(set(made.threads)) == 1
    assert made.closed


def test_a_stream_read_ahead_runs_at_most_its_depth_ahead() -> None:
    made = Made(watched=3)
    stream = on_thread(made.items(50), depth=2)
    taken = [next(stream)]
    # the one taken, two queued, one waiting for room: the thread makes no more until the caller takes one
    assert made.made_watched.wait(timeout=60)
    assert len(made.threads) == 4
    taken += list(stream)
    assert taken == list(range(50))


def test_a_stream_read_ahead_raises_its_failure_in_the_caller() -> None:
    made = Made()
    with pytest.raises(ZeroDivisionError, match="no"):
        list(on_thread(made.items(10, failing_at=6), depth=1))
    assert made.closed


def test_a_caller_that_stops_early_stops_the_stream_read_ahead() -> None:
    made = Made()
    threads = threading.active_count()
    stream = on_thread(made.items(1000), depth=1)
    assert [next(stream), next(stream)] == [0, 1]
    stream.close()
    assert made.closed and len(made.threads) < 1000 and threading.active_count() == threads


@pytest.mark.parametrize(("cores", "rows", "in_tokens"), [(1, 1, 1), (2, 1, 2), (8, 7, 8)])
def test_the_default_workers_follow_the_measurements(monkeypatch: pytest.MonkeyPatch, cores: int, rows: int,
                                                      in_tokens: int) -> None:
    """Rows and the columnar path's blocks: none forked on two cores; beyond, one per core but one; rows measured
    in tokens: one per core (BENCHMARKS.md)."""
    monkeypatch.delenv("CORPUS_WORKERS", raising=False)
    monkeypatch.setattr("corpus_builder.sources.parallel.sys.platform", "linux")
    monkeypatch.setattr("corpus_builder.sources.parallel.os.cpu_count", lambda: cores)
    assert (worker_count(), worker_count(in_tokens=True)) == (rows, in_tokens)
    monkeypatch.setenv("CORPUS_WORKERS", "3")
    assert worker_count() == worker_count(in_tokens=True) == 3
