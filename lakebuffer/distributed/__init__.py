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

from .coordinator import ShardedReplayBuffer
from .draw import split_counts
from .shard import ShardError

__all__ = ["ShardError", "ShardedReplayBuffer", "split_counts"]
