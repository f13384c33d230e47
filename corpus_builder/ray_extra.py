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
from types import ModuleType
from typing import Final

from .errors import CorpusError

# What Ray reads from the environment: its single-machine mode (the default of Ray on Windows and macOS), in which a
# node's address is 127.0.0.1, so that every process of a cluster started here (GCS, raylet, workers, agents)
# listens on loopback alone and a named 127.0.0.1:PORT is joined as it is named (in its cluster mode Ray rewrites
# a loopback address to the machine's network one, which a head on loopback does not listen on); and no usage
# statistics sent to Ray's servers. Neither changes how a named cluster on the network is joined.
RAY_ENVIRONMENT: Final = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def named_address(address: str | None) -> str | None:
    """The cluster a Ray build or audit joins: ``address`` (``--address``), else ``RAY_ADDRESS``; None when neither
    names one (or either says ``local``): the engine starts its own."""
    named = address if address is not None else os.environ.get("RAY_ADDRESS") or None
    return None if named == "local" else named


def ray_engine(module: str, command: str) -> ModuleType:
    """The Ray engine's ``module`` (e.g. ``corpus_builder.build.ray_data``), imported with ``RAY_ENVIRONMENT`` set,
    or a CorpusError saying how to install Ray Data when it is missing (``command``: what to run with ``--engine
    local`` instead)."""
    os.environ.update(RAY_ENVIRONMENT)
    try:
        return importlib.import_module(module)
    except ImportError as error:
        if error.name is None or error.name.split(".")[0] != "ray":
            raise
        raise CorpusError("the Ray engine needs Ray Data, which is not installed: pip install "
                          f"'corpus-builder[ray]' (or {command} with --engine local)") from None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1, or IPv4's loopback mapped into IPv6)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return (mapped or address).is_loopback
