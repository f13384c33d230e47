"""The Ray engine's connection to its cluster, shared by the build's and the audit's Ray engines (``assemble.ray_data``,
``audit.ray_data``): join the cluster the user named or start one on this machine, with the Ray Data settings both
run with. Imports Ray: imported only through ``ray_extra.ray_engine``'s modules, after ``RAY_ENVIRONMENT`` is set."""

from __future__ import annotations

from typing import Final

import ray
import ray.data

from .errors import CorpusError
from .ray_extra import RAY_ENVIRONMENT, NamedCluster, is_loopback, named_cluster, probe_cluster

# Parts per CPU of the cluster: enough for the tasks to balance, few enough that each reads a good run.
PARTS_PER_CPU: Final = 4
# Input a shuffle's map task partitions at once. Ray Data's default (1 GiB) gathers the blocks until that much has
# come, so below it a map task holds every row of the input: a worker grew with the input (the bucket entries' and
# the rows' joins; 1.6 GiB at 200k rows).
SHUFFLE_INPUT_BYTES: Final = 64 * 2**20


def connect(address: str | None) -> None:
    """Join the cluster the user named (``address``, else RAY_ADDRESS: ``ray_extra.named_cluster``), or start one on
    this machine (``start_cluster``), unless this process is connected already."""
    cluster = named_cluster(address)
    if not ray.is_initialized():
        if cluster is None:
            start_cluster()
        else:
            join_cluster(cluster)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the build prints its own lines
    context.enable_operator_progress_bars = False
    context.shuffle_input_batch_bytes = SHUFFLE_INPUT_BYTES


def start_cluster(num_cpus: int | None = None) -> None:
    """A new cluster of this process (``num_cpus``: its CPUs, default the machine's), every process of it on
    loopback (``ray_extra.RAY_ENVIRONMENT``), without a dashboard or usage statistics; never one already running
    on the machine. A CorpusError, before anything starts, when Ray would give it the machine's network address
    (Ray was imported before the engine set its environment)."""
    node = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    if not is_loopback(node):
        settings = " ".join(f"{name}={value}" for name, value in RAY_ENVIRONMENT.items())
        raise CorpusError(f"a Ray cluster started here would listen on {node}, not on loopback alone: Ray was "
                          f"imported before the Ray engine set {settings}; set them in the environment, or start "
                          "a cluster yourself and name it with --address")
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)


def join_cluster(cluster: NamedCluster) -> None:
    """Join the named cluster once its head answers (``ray_extra.probe_cluster``: at once a CorpusError where
    nothing does, rather than Ray's minutes of retries)."""
    probe_cluster(cluster)
    try:
        ray.init(address=cluster.address, log_to_driver=False)
    except (ConnectionError, RuntimeError) as error:
        raise CorpusError(f"{cluster}: cannot join the Ray cluster: {error}") from None
