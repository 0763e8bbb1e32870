"""Open-time recovery: bring index, WAL and warm tier into agreement, then load the catalog.

The index is the truth. A warm fragment no batch refers to is a write that crashed before its
index update (dropped); a WAL segment no hot batch refers to is a push that crashed before its
acknowledgement, or a write-back that crashed after its index update (removed). A hot batch
whose segment is missing was only in RAM (``durability="memory"``) and is lost, as documented.
"""

from __future__ import annotations

import logging

import pyarrow as pa

from .state import BufferState, with_batch
from .writeback import WriteBack

log = logging.getLogger("lakebuffer")


def recover(s: BufferState, writeback: WriteBack) -> None:
    batches = s.index.batches()
    referenced = {b.fragment for b in batches.values() if b.tier == "warm"}
    orphans = [f for f in s.warm.fragment_ids() if f not in referenced]
    if orphans:
        log.warning("dropping %d warm fragment(s) no index entry refers to: %s", len(orphans), orphans)
        s.warm.drop_fragments(orphans)
    s.wal.remove_torn()
    wal_ids = set(s.wal.ids())
    for bid, info in sorted(batches.items()):
        if info.tier == "warm":
            s.batches[bid] = info
            continue
        if bid in wal_ids:
            s.hot.add(bid, s.wal.read(bid))
            s.batches[bid] = info
        else:
            meta = s.index.batch_meta(bid)
            keys = meta.column("key").to_pylist() if meta is not None else []
            log.warning("batch %d (%d rows) was only in RAM (durability='memory') and is lost", bid, len(keys))
            s.index.drop_batch(bid, keys)
    hot_ids = {b for b, i in s.batches.items() if i.tier == "hot"}
    for stale in wal_ids - hot_ids:
        s.wal.remove(stale)
    metas = [with_batch(meta, bid) for bid, meta in s.index.all_meta() if bid in s.batches]
    if metas:
        s.catalog.insert_meta(pa.concat_tables(metas).select(s.catalog.meta_schema.names))
    s.catalog.load_replays(s.index.sample_counts())
    writeback.evict_to_low_mark()
