"""Open-time recovery: bring index, WAL and warm tier into agreement, then load the catalog.

The index is the truth only while it is intact, so recovery never deletes data just because the
index does not know it:

* before the index is opened read-write, ``refuse_damaged_index`` reads it read-only: unreadable,
  or empty while the directory holds fragments or WAL segments, means damaged (``CorruptionError``
  naming ``fsck --repair``, nothing changed);
* a warm fragment no batch refers to is dropped only when the index explains it: an install noted
  in flight (``begin_install``) that never recorded its batch, or a write-back whose rows the index
  still places elsewhere (its hot batches, in the WAL). Any other such fragment holds rows the
  index lost: recovery refuses, before changing anything;
* a WAL segment no hot batch refers to is removed only when its batch is in a verified warm
  fragment (a write-back that crashed before removing it); a segment of a batch the index does not
  know (a push that crashed before its acknowledgement, or a damaged index) is moved aside into
  ``<dir>/quarantine/wal/``, never deleted;
* every segment and every warm fragment is checked against its checksum before its rows are served.

A hot batch whose segment is missing was only in RAM (``durability="memory"``) and is lost, as
documented.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa

from ..errors import CorruptionError
from ..index import BatchInfo, KeyIndex, probe
from ..tiers import WarmTier, WriteAheadLog, has_fragments
from . import quarantine
from .state import BufferState, with_batch
from .writeback import WriteBack

log = logging.getLogger("lakebuffer")

def has_local_data(path: Path) -> bool:
    """Whether ``path`` holds warm fragments or WAL segments (rows only the index can place)."""
    wal = path / "wal"
    return has_fragments(path) or (wal.is_dir() and any(wal.glob("*.arrow")))


def refuse_damaged_index(path: Path) -> None:
    """Raise ``CorruptionError`` (changing nothing) if the index of buffer ``path`` is damaged or lost."""
    settings = probe(path / "index")  # read-only; raises CorruptionError if RocksDB cannot read it
    if has_local_data(path) and (settings is None or "schema" not in settings or "run_id" not in settings):
        what = "missing" if settings is None else "empty (its settings are gone)"
        raise CorruptionError(
            f"the key index {path / 'index'} is {what} but {path} holds warm fragments or WAL segments; "
            f"nothing was changed: run `lakebuffer fsck --repair {path}` to rebuild it from them")


def unexplained_fragments(index: KeyIndex, warm: WarmTier, batches: dict[int, BatchInfo]) -> tuple[list[int], list[int]]:
    """Split the fragments no batch refers to into (safe to drop, unexplained) (see the module)."""
    referenced = {b.fragment for b in batches.values() if b.tier == "warm"}
    orphans = [f for f in warm.fragment_ids() if f not in referenced]
    if not orphans:
        return [], []
    in_flight = len(index.pending_installs())
    drop, unexplained = [], []
    for f in orphans:
        keys = warm.fragment_keys(f)
        _, _, found = index.lookup(keys) if keys else (None, None, None)
        if not keys or found.all():
            drop.append(f)  # its rows live elsewhere (a crashed write-back) or it has none
        elif not found.any() and in_flight > 0:
            in_flight -= 1  # an install that never recorded its batch: never acknowledged
            drop.append(f)
        else:
            unexplained.append(f)
    return drop, unexplained


def quarantine_segment(wal: WriteAheadLog, batch_id: int, buffer_dir: Path, why: str) -> Path:
    """Move a WAL segment aside (``<dir>/quarantine/wal/``, with ``why``): kept, never served, never deleted."""
    moved = quarantine.move(wal.segment_path(batch_id), buffer_dir, "wal", why)
    wal.forget(batch_id)
    return moved


def sweep_wal(index: KeyIndex, warm: WarmTier, wal: WriteAheadLog, batches: dict[int, BatchInfo],
              buffer_dir: Path) -> list[str]:
    """Remove or quarantine WAL segments no hot batch refers to; what was done, one line each."""
    done = []
    hot = {b for b, i in batches.items() if i.tier == "hot"}
    for bid in sorted(set(wal.ids()) - hot):
        info = batches.get(bid)
        if info is not None and info.tier == "warm":
            try:
                warm.expect(info.fragment, info.files, info.checksum)
                warm.ensure_verified([info.fragment])
            except CorruptionError as e:
                log.error("keeping WAL segment %d: its warm copy fails verification (%s)", bid, e)
                done.append(f"kept WAL segment {bid}: its warm fragment {info.fragment} fails verification")
                continue
            wal.remove(bid)
            done.append(f"removed WAL segment {bid} (its batch is in warm fragment {info.fragment})")
        else:
            target = quarantine_segment(wal, bid, buffer_dir, "no index entry refers to it (a push that crashed "
                                        "before its acknowledgement, or a damaged index)")
            log.warning("WAL segment %d belongs to no batch the index knows (a push that crashed before its "
                        "acknowledgement?): moved to %s", bid, target)
            done.append(f"moved WAL segment {bid}, which no index entry refers to, to {target}")
    return done


def recover(s: BufferState, writeback: WriteBack) -> None:
    batches = s.index.batches()
    for info in batches.values():
        if info.tier == "warm":
            s.warm.expect(info.fragment, info.files, info.checksum)
    drop, unexplained = unexplained_fragments(s.index, s.warm, batches)
    if unexplained:
        raise CorruptionError(
            f"warm fragment(s) {unexplained} of {s.path} hold rows the key index does not know: the index is "
            f"damaged; nothing was changed: run `lakebuffer fsck --repair {s.path}` to rebuild it")
    if drop:
        log.warning("dropping %d warm fragment(s) left by a crashed write (their rows were never acknowledged "
                    "or are stored elsewhere): %s", len(drop), drop)
        s.warm.drop_fragments(drop)
    s.index.clear_installs(s.index.pending_installs())
    s.wal.remove_torn()
    s.warm.remove_torn()
    wal_ids = set(s.wal.ids())
    # hot batches of >= 1 MB become warm fragments unread (their infos say so): the loop takes them as warm
    writeback.adopt_recovered({b: i for b, i in batches.items() if i.tier == "hot" and b in wal_ids})
    for bid, info in sorted(batches.items()):
        if info.tier == "warm":
            s.batches[bid] = info
            continue
        if info.tier == "cold":  # only the lake holds its rows: the index says where
            locs = s.index.cold_locations(bid)
            if locs is None:
                raise CorruptionError(f"batch {bid} of {s.path} is cold but its lake locations are missing from the "
                                      f"key index; nothing was changed: run `lakebuffer fsck --repair {s.path}`")
            s.batches[bid] = info
            if s.cold is not None:
                s.cold.admit(bid, info.rows, info.nbytes, locs[0])
            continue
        if bid in wal_ids:
            s.hot.add(bid, s.wal.read(bid))  # checks the segment's crc32
            s.batches[bid] = info
        else:
            meta = s.index.batch_meta(bid)
            keys = meta.column("key").to_pylist() if meta is not None else []
            log.warning("batch %d (%d rows) was only in RAM (durability='memory') and is lost", bid, len(keys))
            s.index.drop_batch(bid, keys)
    sweep_wal(s.index, s.warm, s.wal, s.batches, s.path)
    metas = [with_batch(meta, bid) for bid, meta in s.index.all_meta() if bid in s.batches]
    if metas:
        s.catalog.insert_meta(pa.concat_tables(metas).select(s.catalog.meta_schema.names))
    s.catalog.load_replays(s.index.sample_counts())
    writeback.evict_to_low_mark()
