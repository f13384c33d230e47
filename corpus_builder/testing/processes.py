"""The processes a command under test started, and which of them outlive it.

A check that scans every process on the machine by name (say, every vLLM process created since a build
began) also counts what other programs start meanwhile. These helpers look only at the process tree of
the command a test started: a server the command launched is its child (whatever session or process
group it runs in), and stays on the list after the command exits and it is handed to init.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

SAMPLE_INTERVAL_S = 0.1


class ProcessTree:
    """Every process found under ``root_pid`` (its children, their children...) by ``sample``."""

    def __init__(self, root_pid: int) -> None:
        # psutil comes with the test extra; corpus_builder.testing ships in the wheel without it.
        import psutil

        self._root = psutil.Process(root_pid)
        # Each process found, with its command line when last seen. A Process is its pid and start time: a
        # reused pid is another process.
        self._seen: dict[psutil.Process, str] = {}
        self._lock = threading.Lock()

    def sample(self) -> None:
        """Add the root's descendants running now (none once the root has exited)."""
        import psutil

        try:
            children = self._root.children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            with contextlib.suppress(psutil.Error), self._lock:
                self._seen[child] = " ".join(child.cmdline())

    @property
    def seen(self) -> dict[psutil.Process, str]:
        """Every process sampled, by pid, with its command line when last seen."""
        with self._lock:
            return dict(sorted(self._seen.items(), key=lambda item: item[0].pid))

    def alive(self) -> list[psutil.Process]:
        """The sampled processes that still run (an exited process not yet reaped is gone)."""
        import psutil

        def running(process: psutil.Process) -> bool:
            try:
                return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                return False

        return [process for process in self.seen if running(process)]

    def wait_gone(self, timeout_s: float) -> list[psutil.Process]:
        """``alive()`` once it is empty or ``timeout_s`` has passed."""
        deadline = time.monotonic() + timeout_s
        while (left := self.alive()) and time.monotonic() < deadline:
            time.sleep(SAMPLE_INTERVAL_S)
        return left


@contextlib.contextmanager
def watched(process: subprocess.Popen[str] | subprocess.Popen[bytes]) -> Iterator[ProcessTree]:
    """Sample ``process``'s tree every SAMPLE_INTERVAL_S in a thread while the block runs and ``process`` does."""
    tree = ProcessTree(process.pid)
    done = threading.Event()

    def sample_until_done() -> None:
        while not done.is_set() and process.poll() is None:
            tree.sample()
            done.wait(SAMPLE_INTERVAL_S)

    sampler = threading.Thread(target=sample_until_done, name="process-tree-sampler", daemon=True)
    sampler.start()
    try:
        yield tree
    finally:
        done.set()
        sampler.join()


def kill_all(processes: list[psutil.Process]) -> None:
    """SIGKILL each of ``processes`` that still runs (a test's clean-up of what it found left behind)."""
    import psutil

    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()
