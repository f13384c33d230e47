"""A real local Ray cluster for a test module: two worker processes on this machine, never an existing cluster."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def local_cluster() -> Iterator[str]:
    """Start the cluster (``ray.init(address="local", num_cpus=2)``, no auth: loopback only); yield its address,
    for a CLI that joins it; shut it down."""
    import ray

    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield str(ray.get_runtime_context().gcs_address)
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved
