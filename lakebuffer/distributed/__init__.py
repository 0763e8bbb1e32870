"""Scale-out on Ray: N actors, each owning one ``ReplayBuffer`` shard, all snapshotting into one lake.

* ``coordinator``: ``ShardedReplayBuffer``, the ``ReplayBuffer`` API over the shards (routing,
  retries while a shard restarts, global reads);
* ``draw``: exact global sampling (a top-k merge for ``uniform``, the union of the shards'
  metadata for every other sampler);
* ``shard``: the actor body; ``placement``: shards spread over nodes, local shards of a producer.

Each shard's rows go to the lake under their own run id, ``<run_id>-shard<i>``, so shards never
contend for a manifest and ``ReplayBuffer.open_lake`` sees all of them as runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import LakeBufferError


class ShardError(LakeBufferError, RuntimeError):
    """A shard actor failed or died while serving a call (the call's rows were not acknowledged)."""


def split_counts(n: int, weights: Any) -> list[int]:
    """Split ``n`` in proportion to ``weights`` (largest remainder; ties to the lower index)."""
    total = int(sum(weights))
    if total == 0:
        return [0] * len(weights)
    exact = np.asarray(weights, dtype=np.float64) * n / total
    base = np.floor(exact).astype(np.int64)
    short = n - int(base.sum())
    order = np.argsort(-(exact - base), kind="stable")
    base[order[:short]] += 1
    return [int(min(b, w)) for b, w in zip(base, weights)]


from .coordinator import ShardedReplayBuffer  # noqa: E402 - ShardError is defined first

__all__ = ["ShardError", "ShardedReplayBuffer", "split_counts"]
