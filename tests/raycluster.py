"""A real multi-node Ray cluster for tests: raylets on loopback (``ray.cluster_utils.Cluster``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def ray_nodes(n: int = 2, cpus: int = 2) -> Iterator[tuple]:
    """A head and ``n - 1`` worker raylets (``cpus`` each) and a driver connected to them; all shut
    down on exit (a local Ray started by another module is shut down first)."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus, "include_dashboard": False})
    try:
        workers = [cluster.add_node(num_cpus=cpus) for _ in range(n - 1)]
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes()
        yield cluster, workers
    finally:
        ray.shutdown()
        cluster.shutdown()
