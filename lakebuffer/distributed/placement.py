"""Where shards run: spread over the cluster's nodes, and which shard is local to a producer.

``spread`` (the default) pins shard ``i`` to the ``i``-th alive node (round-robin, head node
first) with a *soft* node-affinity strategy: shards land on every node, and when a node dies Ray
restarts its shards (``max_restarts``) on a surviving node instead of waiting for it. ``None``
leaves placement to Ray's default scheduler (which may pack every shard on one node).
"""

from __future__ import annotations

from typing import Any


def alive_nodes(ray: Any) -> list[str]:
    """Node ids of the alive nodes that can run an actor, the head (the driver's node) first."""
    here = ray.get_runtime_context().get_node_id()
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    return sorted(nodes, key=lambda nid: (nid != here, nid))


def strategies(ray: Any, num_shards: int, placement: str | None) -> list[dict]:
    """Actor options per shard for ``placement`` (``"spread"`` or None)."""
    if placement is None:
        return [{} for _ in range(num_shards)]
    if placement != "spread":
        from ..errors import OptionError

        raise OptionError(f"placement must be 'spread' or None, got {placement!r}")
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = alive_nodes(ray)
    return [{"scheduling_strategy": NodeAffinitySchedulingStrategy(nodes[i % len(nodes)], soft=True)}
            for i in range(num_shards)]


def local_shards(shard_nodes: list[str | None], node: str) -> list[int]:
    """Indices of the shards running on ``node``."""
    return [i for i, n in enumerate(shard_nodes) if n == node]
