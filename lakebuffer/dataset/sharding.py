"""Shard planning: which units and rows each reader (distributed rank x DataLoader worker) reads.

Every reader is one of ``S`` shards and computes the same plan from ``(seed, epoch)`` alone, so no
coordination is needed:

* ``shard_by="unit"``: the units, sorted then permuted with the epoch's seed, go round-robin to the
  shards; each shard reads only its own files (I/O divided by S);
* ``shard_by="row"``: every shard reads every unit and keeps the rows with
  ``hash(key) % S = s`` (DuckDB's ``hash``, computed on the key column only, pushed into the
  buffer's scan); used when there are fewer units than shards (a live buffer is one unit);
* ``"auto"`` (default) picks ``unit`` when there are at least S units, else ``row``.

Either way each row lands in exactly one shard: no row twice in an epoch, none missing.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from .sources import Unit


def seed_int(*parts: int) -> int:
    """A 64-bit seed mixed from integers (epoch, shard, ...): independent streams per combination."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(1)[0])


def plan_shard(units: Sequence[Unit], shard: int, num_shards: int, *, seed: int = 0, epoch: int = 0,
               shuffle: bool = True, shard_by: str = "auto") -> tuple[list[Unit], tuple[int, int] | None, str]:
    """This shard's units and row shard: ``(units, (shard, num_shards) or None, mode)``.

    Depends only on its arguments, so every rank and worker computes the same partition.
    """
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} out of range for {num_shards} shard(s)")
    if shard_by not in ("auto", "unit", "row"):
        raise ValueError("shard_by must be 'auto', 'unit' or 'row'")
    order = list(units)
    if shuffle and len(order) > 1:
        perm = np.random.default_rng(seed_int(seed, epoch, 0x756E6974)).permutation(len(order))
        order = [order[i] for i in perm]
    if num_shards == 1:
        return order, None, "single"
    mode = shard_by if shard_by != "auto" else ("unit" if len(order) >= num_shards else "row")
    if mode == "unit":
        return order[shard::num_shards], None, "unit"
    return order, (shard, num_shards), "row"


def rank_world() -> tuple[int, int]:
    """``(rank, world_size)`` of torch.distributed when initialised, else ``(0, 1)``; never imports torch."""
    torch = sys.modules.get("torch")  # never imported: no process group and no DataLoader worker
    if torch is not None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    return 0, 1


def loader_worker() -> tuple[int, int]:
    """``(worker_id, num_workers)`` inside a DataLoader worker, else ``(0, 1)``."""
    torch = sys.modules.get("torch")
    if torch is not None:
        info = torch.utils.data.get_worker_info()
        if info is not None:
            return info.id, info.num_workers
    return 0, 1
