"""The Ray engine's leaf: how its modules are imported (only when a command asks for ``--engine ray``), and which
cluster it runs on. Imports no Ray itself.

A build or audit on Ray joins only the cluster the user names (``--address``, else ``RAY_ADDRESS``); without one
it starts its own on this machine, never one that another process left running (Ray's own default,
``ray.init()``, joins the cluster the last ``ray start`` on the machine recorded). The cluster it starts listens
on loopback alone: Ray resolves a node's address when it is imported, so the settings that make it 127.0.0.1 go
into the environment before the engine imports Ray (``RAY_ENVIRONMENT``).
"""

from __future__ import annotations

import importlib
import ipaddress
import os
import socket
from dataclasses import dataclass
from types import ModuleType
from typing import Final

from .errors import CorpusError

# What Ray reads from the environment: its single-machine mode (the default of Ray on Windows and macOS), in which a
# node's address is 127.0.0.1, so that every process of a cluster started here (GCS, raylet, workers, agents)
# listens on loopback alone and a named 127.0.0.1:PORT is joined as it is named (in its cluster mode Ray rewrites
# a loopback address to the machine's network one, which a head on loopback does not listen on); and no usage
# statistics sent to Ray's servers. Neither changes how a named cluster on the network is joined.
RAY_ENVIRONMENT: Final = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
# Seconds a named cluster has to accept a connection and answer as a gRPC server does, before Ray is asked to join
# it (Ray itself retries an address where nothing answers for minutes).
PROBE_SECONDS: Final = 5.0
# The client's side of an HTTP/2 connection's start (RFC 9113, section 3.4): the preface and an empty SETTINGS
# frame. A gRPC server, which a Ray head's GCS port is, answers with a SETTINGS frame of its own.
_HTTP2_PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS_FRAME: Final = 4
_HOW_TO_NAME = "a Ray head's address is HOST:PORT, as `ray start --head` prints it (port 6379 by default)"


def ray_engine(module: str, command: str) -> ModuleType:
    """The Ray engine's ``module`` (e.g. ``corpus_builder.assemble.ray_data``), imported with ``RAY_ENVIRONMENT`` set,
    or a CorpusError saying how to install Ray Data when it is missing (``command``: what to run with ``--engine
    local`` instead)."""
    os.environ.update(RAY_ENVIRONMENT)
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if error.name is None or error.name.split(".")[0] != "ray":
            raise
        raise CorpusError(ray_missing(command)) from None


def ray_missing(command: str) -> str:
    """What to do when Ray Data is not installed (``command``: what to run with ``--engine local`` instead)."""
    return ("the Ray engine needs Ray Data, which is not installed: pip install 'corpus-builder[ray]' "
            f"(or {command} with --engine local)")


@dataclass(frozen=True)
class NamedCluster:
    """A cluster the user named: ``HOST:PORT`` of its head, or ``auto`` (the cluster ``ray start`` last started on
    this machine, found by Ray); ``named_by``: where (``--address`` or ``RAY_ADDRESS``)."""

    address: str
    named_by: str

    def __str__(self) -> str:
        return f"{self.named_by} {self.address}"


def named_cluster(address: str | None) -> NamedCluster | None:
    """The cluster a Ray build or audit joins: ``address`` (``--address``), else ``RAY_ADDRESS``; None when neither
    names one (or either says ``local``): the engine starts its own. A CorpusError when the address is not one."""
    named_by = "--address"
    if address is None:
        address, named_by = os.environ.get("RAY_ADDRESS") or None, "RAY_ADDRESS"
    if address is None or address == "local":
        return None
    cluster = NamedCluster(address, named_by)
    if address != "auto":
        _host_and_port(cluster)
    return cluster


def _host_and_port(cluster: NamedCluster) -> tuple[str, int]:
    """The head's host and port; a CorpusError when the address is not HOST:PORT."""
    if "://" in cluster.address:
        raise CorpusError(f"{cluster}: the Ray engine joins a cluster by its head's address, not a URL "
                          f"(Ray Client's ray:// is not supported): {_HOW_TO_NAME}")
    host, colon, port = cluster.address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):  # [IPv6]:PORT
        host = host[1:-1]
    if not colon or not host or any(character.isspace() or character in "[]/" for character in host) or not (
            port.isascii() and port.isdigit() and 0 < int(port) < 1 << 16):
        raise CorpusError(f"{cluster}: not a Ray cluster's address: {_HOW_TO_NAME}")
    return host, int(port)


def probe_cluster(cluster: NamedCluster, timeout: float = PROBE_SECONDS) -> None:
    """Check, without joining it, that a named cluster's head answers: a connection accepted within ``timeout``
    seconds and, unless Ray's connections use TLS (``RAY_USE_TLS``), an HTTP/2 SETTINGS frame in answer to the
    client's preface, as a gRPC server (a GCS) gives. A CorpusError saying what failed otherwise. ``auto`` is found
    by Ray itself, not probed here."""
    if cluster.address == "auto":
        return
    host, port = _host_and_port(cluster)
    try:
        connection = socket.create_connection((host, port), timeout=timeout)
    except socket.gaierror:
        raise CorpusError(f"{cluster}: cannot resolve the host {host}") from None
    except ConnectionRefusedError:
        raise CorpusError(f"{cluster}: no Ray cluster there (nothing listens on port {port} of {host}): "
                          f"{_HOW_TO_NAME}") from None
    except TimeoutError:
        raise CorpusError(f"{cluster}: no answer within {timeout:g} s (a firewall, or a host that is down)") from None
    except OSError as error:
        raise CorpusError(f"{cluster}: cannot reach it: {error.strerror or error}") from None
    with connection:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            return
        try:
            connection.sendall(_HTTP2_PREFACE)
            head = _received(connection, 9)
        except OSError:  # reset, or no answer within the timeout
            head = b""
    if len(head) < 9 or head[3] != _SETTINGS_FRAME:
        raise CorpusError(f"{cluster}: something listens there, but it is not a Ray cluster's head (it does not "
                          f"answer as gRPC does; the dashboard's port is not the head's): {_HOW_TO_NAME}")


def _received(connection: socket.socket, size: int) -> bytes:
    """Up to ``size`` bytes, fewer when the peer closes first."""
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1, or IPv4's loopback mapped into IPv6)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback
