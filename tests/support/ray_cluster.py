"""A real local Ray cluster for a test module, started as the Ray engine starts its own
(``corpus_builder.ray_cluster.start_cluster``: every process on loopback, no dashboard, no usage statistics), with
two worker processes; never an existing cluster. And what a test needs to see that a cluster stays on loopback: the
sockets of the processes it started.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import psutil
import pytest

from corpus_builder.ray_extra import RAY_ENVIRONMENT, is_loopback


def imported_ray() -> ModuleType:
    """Ray, imported as the Ray engine imports it (``RAY_ENVIRONMENT`` set first: Ray reads it when imported); the
    calling module skipped when Ray is not installed. A test module's first import of Ray."""
    os.environ.update(RAY_ENVIRONMENT)
    return pytest.importorskip("ray")


@contextmanager
def local_cluster() -> Iterator[str]:
    """Start the cluster (two CPUs: what CI's two cores hold; no auth, the cluster being private to the test);
    yield its address, for a CLI that joins it; shut it down."""
    ray = imported_ray()
    from corpus_builder.ray_cluster import start_cluster

    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    start_cluster(num_cpus=2)
    try:
        yield str(ray.get_runtime_context().gcs_address)
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved


@dataclass(frozen=True, order=True)
class Socket:
    """A socket of a process: a listening one (``remote`` empty) or a connection."""

    process: str  # its role (``role``)
    kind: str  # tcp, udp
    local: str
    remote: str = ""

    @property
    def outside(self) -> bool:
        """Whether it listens on, or is connected to, an address outside loopback."""
        return not is_loopback(self.remote.rpartition(":")[0] if self.remote else self.local.rpartition(":")[0])


def sockets(processes: Iterable[psutil.Process]) -> set[Socket]:
    """The sockets of ``processes`` that listen (a TCP socket listening, a UDP socket bound) or are connected (those
    of a process gone meanwhile left out)."""
    found = set()
    for process in processes:
        try:
            name = role(process)
            connections = process.net_connections(kind="inet")
        except psutil.Error:
            continue
        for connection in connections:
            kind = "tcp" if connection.type == socket.SOCK_STREAM else "udp"
            local = f"{connection.laddr.ip}:{connection.laddr.port}" if connection.laddr else ""
            if connection.raddr:
                found.add(Socket(name, kind, local, f"{connection.raddr.ip}:{connection.raddr.port}"))
            elif local and (kind == "udp" or connection.status == psutil.CONN_LISTEN):
                found.add(Socket(name, kind, local))
    return found


def role(process: psutil.Process) -> str:
    """A process's name (``gcs_server``, ``raylet``, ``ray::IDLE``...), or for a Python process the script it runs
    (``dashboard.py``, ``monitor.py``...)."""
    name = process.name()
    if not name.startswith("python"):
        return name
    return next((Path(argument).name for argument in process.cmdline()[1:] if argument.endswith(".py")), name)


def process_tree(pid: int) -> list[psutil.Process]:
    """A process and its descendants (empty when it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
