"""Where shards run: spread over the cluster's nodes, and which shard is local to a producer.

``spread`` (the default) reserves one small bundle per shard in a placement group with Ray's
``SPREAD`` strategy: bundles go to distinct nodes while there are nodes (then round again), and
when a node dies Ray reschedules its bundles on the surviving nodes, where the shards' actors
restart (``max_restarts``). A soft node affinity was tried first: Ray 2.60 does not honour it on
a loopback cluster (a shard aimed at the head landed on the other node). ``None`` leaves
placement to Ray's default scheduler (which may pack every shard on one node).
"""

from __future__ import annotations

from typing import Any

#: the CPU share each shard reserves (placement needs a non-empty bundle; shards are I/O bound)
SHARD_CPU = 0.01


def strategies(ray: Any, num_shards: int, placement: str | None) -> tuple[list[dict], Any]:
    """(actor options per shard, the placement group or None) for ``placement`` ("spread" or None)."""
    if placement is None:
        return [{} for _ in range(num_shards)], None
    if placement != "spread":
        from ..errors import OptionError

        raise OptionError(f"placement must be 'spread' or None, got {placement!r}")
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = placement_group([{"CPU": SHARD_CPU}] * num_shards, strategy="SPREAD")
    ray.get(pg.ready())
    return [{"num_cpus": SHARD_CPU,
             "scheduling_strategy": PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)}
            for i in range(num_shards)], pg


def release(ray: Any, pg: Any) -> None:
    """Remove the shards' placement group (after the actors are gone)."""
    if pg is not None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(pg)


def local_shards(shard_nodes: list[str | None], node: str) -> list[int]:
    """Indices of the shards running on ``node``."""
    return [i for i, n in enumerate(shard_nodes) if n == node]
