"""Deletes across every store that holds a row: index, hot tier + WAL, warm tier, catalog, lake.

Rows the lake already holds get a tombstone in the index; the next snapshot carries it, so the
lake hides them too. Write-back is paused and the tasks queued before the delete are waited for,
so no batch moves between tiers while its rows are being removed. A snapshot step may run
meanwhile: rows of a batch it is uploading get tombstones, so what it read before the delete leaves
the lake at the next snapshot. The read gate keeps a ``sample`` from selecting keys before the
delete and fetching them after, and a snapshot from reading half of a batch's delete.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import predicate
from ..schema import key_list
from .budget import Budget
from .state import BufferState
from .writeback import WriteBack


def delete(s: BufferState, budget: Budget, writeback: WriteBack, keys: Sequence[str] | pa.Array | None,
           where: str | None) -> int:
    """Delete by key and/or predicate; how many rows were deleted."""
    if keys is None and where is None:
        raise ValueError("delete needs keys=..., where=... or both (to delete everything, where='TRUE')")
    if keys is None:
        predicate.check(where)  # a bad predicate is an error whether or not rows exist
        with s.lock:
            empty = not s.batches
        if empty:  # no row in any tier: nothing matches (a TransferQueue store's first generation, mostly)
            return 0
    writeback.pause()
    try:
        # what was queued before (write-backs, promotions) finishes first. Not a drain, which producers and
        # back-to-back snapshot steps refill forever (deletes starved: 2 in 60 s), and not the snapshots:
        # a step uploading now gets tombstones for what it read (``s.uploading``)
        s.tasks.barrier(ignore="snapshot")
        s.tasks.check()
        with s.gate.exclusive(), budget.space:
            return _delete_locked(s, keys, where)
    finally:
        writeback.resume()


def _matching(s: BufferState, keys: Sequence[str] | pa.Array | None, where: str | None) -> list[str]:
    wanted: list[str] = []
    if keys is not None:
        wanted = key_list(keys)
    if where is not None:
        t = s.catalog.query_where("select_keys", predicate.check(where))  # the user's strict check first
        matched = t.column("key").to_pylist()
        wanted = matched if keys is None else sorted(set(wanted) & set(matched))
    return wanted


def _delete_locked(s: BufferState, keys, where) -> int:
    wanted = _matching(s, keys, where)
    if not wanted:
        return 0
    batch, _pos, found = s.index.lookup(wanted)
    gone = [k for k, f in zip(wanted, found) if f]
    warm_gone: list[str] = []
    warm_parts: set[int] = set()
    for bid in np.unique(batch[found]).tolist():
        removed = [wanted[i] for i in np.flatnonzero(found & (batch == bid))]
        info = s.batches[bid]
        meta = s.index.batch_meta(bid)
        new_meta = meta.filter(pc.invert(pc.is_in(meta.column("key"), pa.array(removed))))
        info.rows = new_meta.num_rows
        positions: dict[str, int] = {}
        if bid in s.hot:
            s.hot.delete(removed, parts=[bid])
            kept = s.hot.get(bid, touch=False)
            if kept is not None:
                positions = dict(zip(kept.table.column("key").to_pylist(), range(kept.table.num_rows)))
                if s.durability == "wal":
                    s.wal.write(bid, kept.table)
            else:
                s.wal.remove(bid)
        elif info.tier == "cold":  # nothing local to rewrite: the tombstones below reach the lake
            if s.cold is not None:
                s.cold.forget(bid, info.rows)
        else:
            warm_gone.extend(removed)
            warm_parts.add(info.fragment)
        if info.snapshot is not None or bid in s.uploading:
            s.index.add_tombstones(removed)  # the lake holds (or a step is uploading) them: the next snapshot hides them
        s.index.rewrite_batch(info, removed, positions, new_meta)
        if info.rows == 0:
            s.batches.pop(bid)
    s.warm.delete(warm_gone, parts=sorted(warm_parts))
    s.catalog.delete_meta(pa.array(gone, pa.string()))
    return len(gone)
