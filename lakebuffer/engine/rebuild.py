"""Rebuild a lost or damaged key index from the local data (``lakebuffer fsck --repair``).

The local data describes itself: every warm fragment and WAL segment holds its rows with their
keys and metadata columns, and the schema and run id come with them. What the index alone knew
is lost, and the report says so: replay counts since push (``sample_count`` restarts from the
pushed value), deletes not yet carried to the lake (tombstones) and, without a readable lake, which
rows a snapshot already holds. With the lake (``--lake``, or ``<dir>/lake`` when it exists), rows
whose keys its last snapshot holds are marked snapshotted, so they are not uploaded twice.

Nothing is deleted: the damaged index is moved aside to ``quarantine/index/index.damaged-<time>``, and a WAL segment
that fails its checksum goes to ``quarantine/wal/``. Warm fragments carry their own CRC32C footer
(the WAL's segment format): one that fails it is reported and not indexed. A row slot blanked by a
delete (key ``""``) keeps its position and is not indexed.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import CorruptionError, LakeBufferError
from ..index import BatchInfo, KeyIndex, probe
from ..schema import metadata_columns
from ..tiers import WriteAheadLog, table_bytes
from ..tiers.warm import DELETED_KEY, WarmTier, has_fragments, warm_path
from . import quarantine
from .recovery import quarantine_segment
from .snapshots import RESTORING

log = logging.getLogger("lakebuffer")

#: a generated key ends with ``-<sequence>``; the sequence restarts past the largest one seen
_SEQ = r"-(?P<seq>[0-9]{1,18})$"


def _next_seq(keys: pa.ChunkedArray | pa.Array) -> int:
    """One past the largest generated-key sequence number among ``keys`` (0 if none)."""
    m = pc.extract_regex(keys, _SEQ)
    seq = pc.cast(pc.struct_field(m, "seq"), pa.int64())
    top = pc.max(seq).as_py()
    return 0 if top is None else int(top) + 1


def _lake_state(lake_url: str | None, storage_options: dict | None, run_id: str) -> tuple[dict | None, set, str]:
    """(latest manifest, its keys, a note) for ``run_id``; keys come through the lake's verified reader."""
    if lake_url is None:
        return None, set(), "no lake given: which rows are already snapshotted is unknown"
    from ..lake import Lake

    try:
        lake = Lake(lake_url, storage_options)
        manifest = lake.latest_manifest(run_id)
        if manifest is None:
            return None, set(), f"the lake {lake_url} holds no snapshot of run {run_id!r}"
        keys: set = set()
        for rb in lake.scan_batches(run_id, ["key"], snapshot_id=manifest["snapshot_id"], verify=True):
            keys.update(rb.column(0).to_pylist())
        return manifest, keys, f"snapshot state taken from {lake_url} (snapshot {manifest['snapshot_id']})"
    except LakeBufferError as e:
        return None, set(), f"the lake {lake_url} could not be read ({e}): which rows are snapshotted is unknown"


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of each run of equal values in ``mask``."""
    if len(mask) == 0:
        return []
    edges = np.flatnonzero(mask[1:] != mask[:-1]) + 1
    bounds = np.concatenate([[0], edges, [len(mask)]])
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


#: settings of the old index worth keeping when it can still read them: an unfinished restore's mark
#: (without it a half-restored directory would open as complete), the run's source lake, its writer id
_CARRIED = (RESTORING, "restored_from", "writer_id")


def _readable_settings(index_dir: Path, names: tuple[str, ...] = _CARRIED) -> dict[str, bytes]:
    """The ``names`` settings the damaged index still gives on a read-only look (often none)."""
    try:
        settings = probe(index_dir) or {}
    except LakeBufferError:
        return {}
    return {k: settings[k] for k in names if k in settings}


def _index_cold(index: KeyIndex, lake_url: str, storage_options: dict | None, run_id: str, schema: pa.Schema,
                meta_cols: list[str], keys: list[str], sid: int | None, next_bid: int) -> tuple[int, int]:
    """Record ``keys`` (in the lake, in no local tier) as cold batches, one per lake file; (next batch id, rows)."""
    from ..lake import Lake
    from ..tiers import Location
    from ..tiers.cold import ColdTier

    lake = Lake(lake_url, storage_options)
    cold = ColdTier(lambda: lake, run_id, schema)
    files, file_idx, row, found = cold.locate(keys)
    n = 0
    for i, entry in enumerate(files):
        sel = np.flatnonzero(found & (file_idx == i))
        part = np.full(len(sel), cold.number(entry), np.int64)
        meta = cold.take_checked(Location(part, row[sel]), meta_cols, [keys[j] for j in sel.tolist()])
        info = BatchInfo(batch_id=next_bid, tier="cold", rows=len(sel), files=[entry["path"]], snapshot=sid)
        index.record_batch(info, meta.column("key").to_pylist(), meta)
        index.set_cold([(info, [entry], np.zeros(len(sel), np.int64), row[sel])])
        next_bid += 1
        n += len(sel)
    return next_bid, n


def rebuild_index(path: Path, lake_url: str | None, storage_options: dict | None) -> dict[str, Any]:
    """Build a new index from ``path``'s fragments and WAL; ``{"repaired", "problems", "lost_keys"}``."""
    repaired: list[str] = []
    problems: list[str] = []
    index_dir = path / "index"
    carried = _readable_settings(index_dir)
    # a resumed directory may hold no fragment or WAL (its rows cold, or in the local mirror of restore="eager"):
    # then the schema and run come from the damaged index's settings, if they still read
    own = _readable_settings(index_dir, ("schema", "run_id")) if RESTORING in carried else {}
    if index_dir.exists():
        aside = quarantine.move(index_dir, path, "index", "RocksDB could not read it (or it lost entries); "
                                "fsck --repair rebuilt the index from the fragments and WAL",
                                name=f"index.damaged-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
        repaired.append(f"moved the damaged index aside to {aside}")
    frag_ids = WriteAheadLog(warm_path(path)).ids() if has_fragments(path) else []
    wal = WriteAheadLog(path / "wal")
    wal.remove_torn()
    segments: dict[int, pa.Table] = {}
    for bid in wal.ids():
        try:
            segments[bid] = wal.read(bid)
        except CorruptionError as e:
            target = quarantine_segment(wal, bid, path, f"it fails its check ({e}); found by fsck --repair")
            problems.append(f"WAL segment {bid} fails its check and was not used (moved to {target}): {e}")
    warm: WarmTier | None = None
    first: pa.Table | None = None
    for frag in frag_ids:  # the schema comes with the first fragment that decodes
        try:
            first = WriteAheadLog(warm_path(path)).read(frag)
            break
        except CorruptionError:
            continue
    if first is not None:
        schema = first.schema
        warm = WarmTier(warm_path(path), schema)
    elif segments:
        schema = next(iter(segments.values())).schema
    elif "schema" in own and "run_id" in own:
        schema = pa.ipc.read_schema(pa.py_buffer(own["schema"]))
    else:
        return {"repaired": repaired, "problems": problems + ["no fragments or WAL segments to rebuild from"],
                "lost_keys": []}
    meta_cols = metadata_columns(schema)
    run_id = None
    for t in [*segments.values()] + ([first] if first is not None else []):
        if t.num_rows:
            run_id = t.column("run_id")[0].as_py()
            break
    if run_id is None:
        run_id = own["run_id"].decode() if "run_id" in own else path.resolve().name
    if lake_url is None and (path / "lake").is_dir():
        lake_url = str(path / "lake")
    manifest, lake_keys, note = _lake_state(lake_url, storage_options, run_id)
    repaired.append(note)

    index = KeyIndex(index_dir)
    try:
        index.put_setting("run_id", run_id.encode())
        index.put_setting("schema", schema.serialize().to_pybytes())
        if lake_url is not None:
            index.put_setting("lake", lake_url.encode())
        sid = manifest["snapshot_id"] if manifest else None
        seen: set = set()
        all_keys: list[pa.Array] = []
        next_bid = max(segments, default=-1) + 1
        rows = 0
        for frag in frag_ids if warm is not None else []:
            try:
                t = warm.read(frag, meta_cols)  # checked against its CRC32C footer
            except LakeBufferError as e:
                problems.append(f"warm fragment {frag} fails its check and was not indexed: {e}")
                continue
            live = pc.not_equal(t.column("key"), DELETED_KEY)
            addr = np.flatnonzero(live.to_numpy(zero_copy_only=False)).astype(np.int64)
            t = t.filter(live)
            keys = t.column("key").to_pylist()
            if seen.intersection(keys):
                problems.append(f"warm fragment {frag} repeats keys of another fragment and was not indexed")
                continue
            seen.update(keys)
            files = (warm.file_of(frag).name,)
            checksum = None  # the fragment's own footer is its checksum
            nbytes = warm.file_of(frag).stat().st_size
            in_lake = np.array([k in lake_keys for k in keys], dtype=bool)
            meta = t.select(meta_cols)
            for start, stop in _runs(in_lake):
                offset = int(addr[start])
                info = BatchInfo(batch_id=next_bid, tier="warm", rows=stop - start, fragment=frag, offset=offset,
                                 files=list(files), checksum=checksum, nbytes=nbytes,
                                 snapshot=sid if in_lake[start] else None)
                index.record_batch(info, keys[start:stop], meta.slice(start, stop - start), addr[start:stop] - offset)
                next_bid += 1
            all_keys.append(t.column("key").combine_chunks())
            rows += len(keys)
        for bid, table in sorted(segments.items()):
            keys = table.column("key").to_pylist()
            if seen.issuperset(keys):
                target = quarantine_segment(wal, bid, path, "its rows are all in a warm fragment (a write-back's leftover)")
                repaired.append(f"WAL segment {bid} repeats rows of a warm fragment (a write-back's leftover): "
                                f"moved to {target}")
                continue
            if seen.intersection(keys):
                target = quarantine_segment(wal, bid, path, "it shares some keys with other data (not used by the index rebuild)")
                problems.append(f"WAL segment {bid} shares some keys with other data and was not used "
                                f"(moved to {target})")
                continue
            seen.update(keys)
            snapped = sid if keys and all(k in lake_keys for k in keys) else None
            info = BatchInfo(batch_id=bid, tier="hot", rows=table.num_rows, nbytes=table_bytes(table), snapshot=snapped)
            index.record_batch(info, keys, table.select(meta_cols))
            all_keys.append(table.column("key").combine_chunks())
            rows += len(keys)
        missing = sorted(lake_keys - seen)
        if missing:  # rows that had left local disk (the cold tier): indexed where the lake holds them
            next_bid, n = _index_cold(index, lake_url, storage_options, run_id, schema, meta_cols, missing, sid, next_bid)
            repaired.append(f"indexed {n} rows only the lake holds (cold) where its files hold them")
            all_keys.append(pa.array(missing, pa.string()))
            seen.update(missing)
            rows += n
        seq = _next_seq(pa.chunked_array(all_keys, pa.string())) if all_keys else 0
        if manifest:
            seq = max(seq, int(manifest.get("meta", {}).get("next_seq", 0)))
            index.put_setting("last_snapshot", str(sid).encode())
        index.set_next_seq(seq)
        index.set_next_batch(next_bid)
        for name, value in carried.items():
            index.put_setting(name, value)
        if RESTORING in carried:
            repaired.append(f"kept the mark of an unfinished restore (snapshot {carried[RESTORING].decode()}): "
                            "opening the buffer resumes it")
        repaired.append(f"rebuilt the index of run {run_id!r} from {len(seen)} keys ({rows} rows) in the warm "
                        f"fragments and WAL; key sequence restarts at {seq}")
        problems.append("the index was rebuilt: replay counts since push and deletes not yet carried to the lake "
                        "were only in the old index and are lost")
    finally:
        index.close()
    return {"repaired": repaired, "problems": problems, "lost_keys": []}
