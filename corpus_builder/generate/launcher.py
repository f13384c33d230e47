"""Start a local vLLM OpenAI-compatible server for a build, wait until it is ready, always stop it.

The server runs in its own process group (its engine workers are children), so stopping it means
signalling the group: SIGTERM, a grace period, then SIGKILL. The group is stopped when the ``with``
block ends for any reason: normal exit, an exception, Ctrl-C (KeyboardInterrupt) or SIGTERM of this
process (turned into SystemExit while the server runs, so the cleanup below executes). On Linux the
server also gets SIGTERM if this process dies without cleaning up (e.g. SIGKILL).

Server output goes to a log file, never to the terminal; a server that exits or hangs during startup
raises CorpusError with the tail of that log, and one that exits while it serves is told by
``ServerHandle.raise_if_exited`` (GenerationIncomplete, with the same tail).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..errors import CorpusError, MissingDependency
from ..recipe.model import LaunchSpec
from .types import GenerationIncomplete

HOST = "127.0.0.1"
HEALTH_POLL_S = 0.5
STOP_GRACE_S = 30.0
LOG_TAIL_LINES = 40
# Options the launcher sets itself; taking them from launch.args too would start a server that
# listens elsewhere or serves another name than the one the generator asks for.
RESERVED_ARGS = ("--model", "--served-model-name", "--host", "--port")
SERVER_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1"}
SERVER_ENV_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "1"}  # GiB; only used by the CPU build, kept if set


@dataclass(frozen=True)
class ServerHandle:
    """A server started by this process: its base URL (``http://127.0.0.1:PORT/v1``) and its process."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def raise_if_exited(self) -> None:
        """GenerationIncomplete, with the tail of the server's log, once the server process has exited."""
        code = self.process.poll()
        if code is not None:
            raise GenerationIncomplete(f"the vLLM server exited with code {code} while serving (log: {self.log_path})",
                                    details=log_tail(self.log_path))


@contextlib.contextmanager
def launched_server(spec: LaunchSpec, served_model_name: str, *, log_path: Path | None = None,
                    reasoning_parser: str | None = "qwen3", trust_remote_code: bool = False) -> Iterator[ServerHandle]:
    """Serve ``spec.model_dir`` as ``served_model_name`` on 127.0.0.1; yields its handle (``.url`` ends in /v1).

    ``spec.args`` are passed to the server after the launcher's own options; ``reasoning_parser`` is
    added unless the args choose one. Raises CorpusError when vLLM is missing, the model directory does
    not exist, the args set an option the launcher owns, or the server fails to become ready.
    """
    model_dir = Path(spec.model_dir)
    if not model_dir.is_dir():
        raise CorpusError(f"model directory not found: {model_dir}", file="target.launch.model_dir")
    args = list(spec.args)
    reserved = sorted({a.split("=", 1)[0] for a in args} & set(RESERVED_ARGS))
    if reserved:
        raise CorpusError(f"launch.args must not set {', '.join(reserved)}: the launcher sets them from "
                          "launch.model_dir, launch.port and target.model")
    if importlib.util.find_spec("vllm") is None:
        raise MissingDependency("vllm", "vllm", "Launching a local vLLM server (target.launch)")
    port = spec.port or free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--served-model-name", served_model_name, "--host", HOST, "--port", str(port)]
    if reasoning_parser and not any(a.split("=", 1)[0] == "--reasoning-parser" for a in args):
        command += ["--reasoning-parser", reasoning_parser]
    if trust_remote_code:
        command.append("--trust-remote-code")
    env = {**SERVER_ENV_DEFAULTS, **os.environ, **SERVER_ENV, **spec.env}
    with running_server(command + args, port, env=env, log_path=log_path,
                        startup_timeout_s=spec.startup_timeout_s) as server:
        yield server


@contextlib.contextmanager
def running_server(command: Sequence[str], port: int, *, env: dict[str, str] | None = None,
                   log_path: Path | None = None, startup_timeout_s: float = 600.0) -> Iterator[ServerHandle]:
    """Run ``command`` (an HTTP server that will listen on 127.0.0.1:``port`` and answer GET /health)
    until the ``with`` block ends; yields its handle (url ``http://127.0.0.1:PORT/v1``) once /health answers 200.

    Output goes to ``log_path``, or to a temporary file that is removed after a clean run and kept (and
    named in the error) when startup fails.
    """
    if not port_is_free(port):
        raise CorpusError(f"port {port} on {HOST} is already in use: choose another launch.port (0 picks a "
                          "free one)")
    keep_log = log_path is not None
    if log_path is None:
        handle, name = tempfile.mkstemp(prefix="corpus-vllm-", suffix=".log")
        os.close(handle)
        log_path = Path(name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log, _sigterm_as_exit():
        process = _spawn(command, env, log)
        try:
            _wait_until_ready(process, port, startup_timeout_s, log_path)
        except BaseException:
            stop_process_group(process)
            raise
        try:
            yield ServerHandle(f"http://{HOST}:{port}/v1", process, log_path)
        finally:
            stop_process_group(process)
    if not keep_log:
        log_path.unlink(missing_ok=True)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def port_is_free(port: int) -> bool:
    """True when a server could listen on 127.0.0.1:``port`` now. SO_REUSEADDR, as servers set it: a
    port that only has closed connections in TIME_WAIT is free, one with a listener is not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
        return True


def stop_process_group(process: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the process's group, wait up to ``grace_s`` for it to empty, then SIGKILL what is left."""
    group = process.pid  # the leader of its own session: its pid is the group id
    _signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_s)
    while _group_alive(group) and time.monotonic() < deadline:
        time.sleep(0.1)
    if process.poll() is None or _group_alive(group):
        _signal_group(group, signal.SIGKILL)
        process.wait()


def _spawn(command: Sequence[str], env: dict[str, str] | None, log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True, preexec_fn=_die_with_parent())


def _die_with_parent() -> Callable[[], None] | None:
    """On Linux, have the kernel SIGTERM the server when this process dies (even by SIGKILL)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1

    def set_death_signal() -> None:
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)

    return set_death_signal


def _wait_until_ready(process: subprocess.Popen[bytes], port: int, timeout_s: float, log_path: Path) -> None:
    url = f"http://{HOST}:{port}/health"
    deadline = time.monotonic() + timeout_s
    while True:
        code = process.poll()
        if code is not None:
            raise CorpusError(f"the vLLM server exited with code {code} before it was ready "
                              f"(log: {log_path})", details=log_tail(log_path))
        if _healthy(url):
            return
        if time.monotonic() >= deadline:
            raise CorpusError(f"the vLLM server did not answer {url} within {timeout_s:g} s "
                              f"(launch.startup_timeout_s; log: {log_path})", details=log_tail(log_path))
        time.sleep(HEALTH_POLL_S)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    """The last non-empty lines of a server log (for error messages)."""
    try:
        text = log_path.read_bytes()[-16_384:].decode("utf-8", errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


def _signal_group(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """While the server runs, SIGTERM raises SystemExit(143) here (the default would end this process
    without running any cleanup, leaving the server behind). Only the main thread can set handlers, and
    a handler the program installed itself is left alone."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):  # a caller's own handler wins
        yield
        return

    def exit_on_sigterm(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
