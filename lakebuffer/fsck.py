"""``lakebuffer fsck``: check a buffer directory's index against its fragments and WAL.

It reads the parts directly (not through ``ReplayBuffer.open``, whose recovery would silently fix
what fsck should report), under the directory lock so no writer runs meanwhile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from .engine.dirlock import DirLock
from .engine.writeback import FragmentInstaller
from .errors import CorruptionError
from .index import BatchInfo, KeyIndex
from .schema import conform_restored, metadata_columns
from .tiers import WarmTier, WriteAheadLog


def check(path: str | Path, repair: bool = False, lake: str | None = None,
          storage_options: dict | None = None) -> dict[str, Any]:
    """Return ``{"ok", "problems", "repaired", "lost_keys", "batches", "keys"}``; ``repair`` fixes what can be.

    Repairs: drop warm fragments and WAL segments no index entry refers to (leftovers of a crash);
    rebuild a broken batch from the cold lake when a snapshot holds its rows (``lake`` defaults to
    the URL the buffer was last opened with); forget the rest (their keys are listed as lost).
    """
    path = Path(path)
    if not (path / "index").is_dir():
        raise FileNotFoundError(f"{path} is not a lakebuffer directory (no index/)")
    lock = DirLock(path).acquire(hint="close it before fsck")
    try:
        return _check(path, repair, lake, storage_options)
    finally:
        lock.release()


def _check(path: Path, repair: bool, lake_url: str | None, storage_options: dict | None) -> dict[str, Any]:
    index = KeyIndex(path / "index")
    problems: list[str] = []
    repaired: list[str] = []
    lost: list[str] = []
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(index.get_setting("schema")))
        warm = WarmTier(path / "warm" / "rollouts.lance", schema)
        wal = WriteAheadLog(path / "wal")
        batches = index.batches()
        fragments = set(warm.fragment_ids())
        wal_ids = set(wal.ids())
        referenced = set()
        meta_keys: dict[str, int] = {}
        broken: list[int] = []
        for bid, info in sorted(batches.items()):
            meta = index.batch_meta(bid)
            keys = meta.column("key").to_pylist() if meta is not None else []
            if meta is None or meta.num_rows != info.rows:
                problems.append(f"batch {bid}: metadata has {0 if meta is None else meta.num_rows} rows, index says {info.rows}")
            for k in keys:
                if k in meta_keys:
                    problems.append(f"key {k!r} is in batches {meta_keys[k]} and {bid}")
                meta_keys[k] = bid
            if info.tier == "warm":
                referenced.add(info.fragment)
                if info.fragment not in fragments:
                    problems.append(f"batch {bid}: warm fragment {info.fragment} is missing")
                    broken.append(bid)
                    continue
                try:
                    warm.verify(info.fragment, tuple(info.files), info.checksum)
                except CorruptionError as e:
                    problems.append(f"batch {bid}: {e}")
                    broken.append(bid)
            else:
                if bid not in wal_ids:
                    problems.append(f"batch {bid}: hot batch has no WAL segment (lost in a crash in memory mode?)")
                    broken.append(bid)
                    continue
                try:
                    seg = wal.read(bid)
                    if seg.num_rows != info.rows:
                        problems.append(f"batch {bid}: WAL segment has {seg.num_rows} rows, index says {info.rows}")
                except CorruptionError as e:
                    problems.append(f"batch {bid}: {e}")
                    broken.append(bid)
        index_keys = {}
        for k, bid, _pos in index.iter_keys():
            index_keys[k] = bid
            if bid not in batches:
                problems.append(f"key {k!r} points to unknown batch {bid}")
        if set(index_keys) != set(meta_keys):
            extra = set(index_keys) - set(meta_keys)
            missing = set(meta_keys) - set(index_keys)
            problems.append(f"index keys vs metadata differ: {len(extra)} extra, {len(missing)} missing")
        orphan_frags = sorted(fragments - referenced)
        orphan_wal = sorted(wal_ids - {b for b, i in batches.items() if i.tier == "hot"})
        if orphan_frags:
            problems.append(f"warm fragments with no index entry: {orphan_frags}")
        if orphan_wal:
            problems.append(f"WAL segments with no hot batch: {orphan_wal}")
        if repair:
            installer = FragmentInstaller(index, warm, metadata_columns(schema))
            if orphan_frags:
                warm.drop_fragments(orphan_frags)
                repaired.append(f"dropped orphan fragments {orphan_frags}")
            if wal.remove_torn():
                repaired.append("removed torn WAL writes (*.arrow.tmp)")
            for w in orphan_wal:
                wal.remove(w)
            if orphan_wal:
                repaired.append(f"removed orphan WAL segments {orphan_wal}")
            dead_frags = set()
            stored = index.get_setting("lake")
            lake_url = lake_url or (stored.decode() if stored else None)
            for bid in broken:
                info = batches[bid]
                meta = index.batch_meta(bid)
                keys = meta.column("key").to_pylist() if meta is not None else []
                if info.tier == "warm" and info.fragment in fragments:
                    dead_frags.add(info.fragment)
                if info.snapshot is not None and lake_url and keys and _rebuild_from_lake(
                    index, installer, info, meta, lake_url, storage_options, schema
                ):
                    repaired.append(f"rebuilt batch {bid} ({len(keys)} rows) from the lake {lake_url}")
                    continue
                lost.extend(keys)
                index.drop_batch(bid, keys)
                repaired.append(f"forgot batch {bid} ({len(keys)} rows whose data is gone)")
            warm.drop_fragments(sorted(dead_frags))
        return {
            "ok": not problems,
            "problems": problems,
            "repaired": repaired,
            "lost_keys": lost,
            "batches": len(batches),
            "keys": len(index_keys),
        }
    finally:
        index.close()


def _rebuild_from_lake(index: KeyIndex, installer: FragmentInstaller, info: BatchInfo, meta: pa.Table,
                       lake_url: str, storage_options: dict | None, schema: pa.Schema) -> bool:
    """Install the batch's rows, read back from the lake, as a new warm fragment; False if incomplete.

    The batch keeps its id, its snapshot and its metadata as the index holds them (the index's
    ``sample_count`` is the pushed one: replays live apart, under ``sc/``).
    """
    from .lakeview import LakeView

    run = index.get_setting("run_id").decode()
    keys = meta.column("key").to_pylist()
    try:
        with LakeView(lake_url, storage_options=storage_options, run_id=run) as view:
            rows = view.get(keys, [c for c in schema.names if c in view.schema.names])
        table = conform_restored(rows, schema, run)
    except Exception:  # noqa: BLE001 - the lake cannot help: the batch is reported lost instead
        return False
    installer.install(table, snapshot=info.snapshot, batch_id=info.batch_id, meta=meta)
    return True
