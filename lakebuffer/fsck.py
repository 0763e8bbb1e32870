"""``lakebuffer fsck``: check a buffer directory's index against its fragments and WAL, the run's lake
files and rows (``--lake``), or every file of a lake (``check_lake``).

It reads the parts directly (not through ``ReplayBuffer.open``, whose recovery would silently fix
what fsck should report), under the directory lock so no writer runs meanwhile.

A damaged index (RocksDB cannot read it, it lost its settings while data is present, or fragments
hold rows it does not know) is reported; ``--repair`` rebuilds it from the fragments and WAL
(``engine/rebuild``). Every WAL segment and warm fragment is checked against its checksum; a broken
batch is rebuilt from the lake only after the lake's copy of the run passes its own check.

Given ``lake``, the run's lake files are verified (size and sha256; ``lake/check.py``) and the keys of
the index's committed batches are looked for in the lake (``engine/lakeaudit``): rows another writer
removed are reported, split into those a local tier still holds (the next snapshot uploads them again)
and those lost. Nothing on the lake is ever changed or deleted by fsck.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .engine import quarantine
from .engine.dirlock import DirLock
from .engine.lakeaudit import AUDIT, find_missing, foreign_versions, removals
from .engine.rebuild import rebuild_index
from .engine.recovery import has_local_data, quarantine_segment, sweep_wal, unexplained_fragments
from .engine.writeback import FragmentInstaller
from .errors import CorruptionError, LakeError
from .index import BatchInfo, KeyIndex, probe
from .schema import conform_restored, metadata_columns
from .tiers import WarmTier, WriteAheadLog, warm_path


def check(path: str | Path, repair: bool = False, lake: str | None = None,
          storage_options: dict | None = None) -> dict[str, Any]:
    """Return ``{"ok", "problems", "repaired", "lost_keys", "batches", "keys", "quarantine"}`` (and
    ``quarantine_help`` when files are in quarantine); ``repair`` fixes what can be.

    Repairs: drop warm fragments a crash left (their rows never acknowledged or stored elsewhere),
    quarantine WAL segments no batch refers to; rebuild a broken batch from the cold lake when a
    snapshot holds its rows and the lake's copy passes its check (``lake`` defaults to the URL the
    buffer was last opened with); forget the rest (their keys are listed as lost). A damaged index
    is rebuilt from the fragments and WAL.

    ``quarantine`` lists what recovery or a repair moved into ``<path>/quarantine/`` (path, bytes,
    why, when): kept, never served, and not a problem by itself (``ok`` ignores it); how to dispose
    of it is in ``quarantine_help``.
    """
    path = Path(path)
    if not is_buffer_dir(path):
        raise FileNotFoundError(f"{path} is not a lakebuffer directory (no index/, fragments or WAL)")
    lock = DirLock(path).acquire(hint="close it before fsck")
    try:
        report = _check_or_rebuild(path, repair, lake, storage_options)
        report["quarantine"] = quarantine.listing(path)
        if report["quarantine"]:
            report["quarantine_help"] = quarantine.how_to_dispose(path)
        return report
    finally:
        lock.release()


def is_buffer_dir(path: Path) -> bool:
    """Whether ``path`` is a buffer directory (an index, fragments or WAL segments), not a lake."""
    return (path / "index").is_dir() or has_local_data(path)


def check_lake(url: str, storage_options: dict | None = None) -> dict[str, Any]:
    """Verify every file of the lake at ``url`` (``lakebuffer fsck LAKE_URL``): ``{"ok", "path",
    "problems", "damaged_files", "files", "bytes", "unverifiable_files", "runs", "version"}``.

    A damaged Delta log is reported with the log file that does not parse; a URL that does not exist,
    or holds no Delta table, is a ``LakeError``. Reads only: nothing is changed or deleted.
    """
    from .lake import Lake
    from .lake.check import check_files
    from .lake.location import require_existing

    report: dict[str, Any] = {"ok": False, "path": url, "problems": [], "damaged_files": []}
    try:
        lake = Lake(url, storage_options, read_only=True)
    except CorruptionError as e:  # the Delta log itself
        report["problems"].append(str(e))
        bad = getattr(e, "path", None) or _damaged_log_file(url, storage_options)
        if bad:
            report["damaged_files"].append(bad)
        return report
    require_existing(lake)
    if lake.table() is None:
        raise LakeError(f"{lake.url} holds no Delta table (no _delta_log/): it is not a lake, or nothing was "
                        "committed to it yet; check the URL")
    res = check_files(lake)
    for d in res["damaged"]:
        report["problems"].append(f"lake file {d['path']} (run {d['run_id']!r}): {d['problem']}")
        report["damaged_files"].append(d["path"])
    report.update(ok=not report["problems"], path=lake.url, files=res["files"], bytes=res["bytes"],
                  unverifiable_files=res["unverifiable"], runs=len(lake.runs()), version=res["version"])
    return report


def _damaged_log_file(url: str, storage_options: dict | None) -> str | None:
    """The Delta log file that does not parse (named for the report), or None."""
    try:
        from .lake.delta import DeltaLog
        from .lake.fs import LakeFS

        return DeltaLog(LakeFS(url, storage_options)).damaged_file()
    except Exception:  # noqa: BLE001 - only a hint; the problem itself is already reported
        return None


def _check_lake_side(index: KeyIndex, batches: dict[int, BatchInfo], lake_url: str,
                     storage_options: dict | None, repair: bool = False) -> tuple[list[str], dict[str, Any]]:
    """The run's lake files (verified) and committed rows (present): problems and report fields.

    ``repair`` forgets the keys the buffer itself recorded as lost (``engine/lakeaudit``: gone from the
    lake and from the files another writer removed) and still finds missing: their rows exist nowhere,
    and a key the index keeps would fail every read of it."""
    from .lake import Lake
    from .lake.check import check_files

    run = index.get_setting("run_id").decode()
    try:
        lake = Lake(lake_url, storage_options, read_only=True)
        res = check_files(lake, run)
    except (CorruptionError, LakeError) as e:
        return [f"the lake {lake_url} cannot be checked: {e}"], {}
    problems = [f"lake file {d['path']}: {d['problem']}" for d in res["damaged"]]
    fields: dict[str, Any] = {"lake": lake.url, "lake_files": res["files"],
                              "damaged_files": [d["path"] for d in res["damaged"]]}
    try:
        found = find_missing(index, batches, lake, run)
        if found.rows:
            found.removed_by = removals(lake, foreign_versions(lake, None), run)
    except (CorruptionError, LakeError, OSError) as e:
        return problems + [f"the run's keys in lake {lake_url} cannot be read: {e}"], fields
    fields["missing_rows"] = found.rows
    if found.rows:
        by = sorted({f"version {r['version']} ({r['operation']})" for r in found.removed_by})
        problems.append(
            f"{found.rows} rows of run {run!r} committed to the lake are gone from it (removed by another writer"
            f"{': ' + ', '.join(by) if by else ''}); {found.local_rows} are still held locally and the buffer's next "
            f"snapshot uploads them again; {len(found.lost)} only the lake held: the next snapshot uploads them "
            "again from the removed files while a vacuum has not deleted those, else they are lost")
        fields["lake_only_missing_keys"] = found.lost
        if repair:
            fields.update(_forget_lost(index, batches, found.lost))
    return problems, fields


def _forget_lost(index: KeyIndex, batches: dict[int, BatchInfo], missing: list[str]) -> dict[str, Any]:
    """Drop from the index the ``missing`` keys the buffer's lake audit recorded as lost."""
    raw = index.get_setting(AUDIT)
    audit = json.loads(raw.decode()) if raw else {}
    recorded = set(audit.get("lost_keys", []))
    forget = [k for k in missing if k in recorded]
    if not forget:
        return {}
    batch, _pos, known = index.lookup(forget)
    for bid in np.unique(batch[known]).tolist():
        removed = [k for k, b, ok in zip(forget, batch.tolist(), known.tolist()) if ok and b == bid]
        meta = index.batch_meta(bid)
        info = batches[bid]
        new_meta = meta.filter(pc.invert(pc.is_in(meta.column("key"), pa.array(removed, pa.string()))))
        info.rows = new_meta.num_rows
        index.rewrite_batch(info, removed, {}, new_meta)  # the other keys keep their lake locations
    audit["lost_keys"] = [k for k in audit.get("lost_keys", []) if k not in set(forget)]
    index.put_setting(AUDIT, json.dumps(audit).encode())
    return {"forgot_lost_keys": forget,
            "repaired_lake": [f"forgot {len(forget)} keys whose rows the lake lost (removed by another writer, "
                              "then vacuumed; the buffer recorded them lost)"]}


def _check_or_rebuild(path: Path, repair: bool, lake: str | None, storage_options: dict | None) -> dict[str, Any]:
    damage = _index_damage(path)
    if damage is None:
        try:
            return _check(path, repair, lake, storage_options)
        except _Damaged as e:
            damage = str(e)
        except CorruptionError as e:  # RocksDB failed part way through the check
            damage = str(e)
    report = {"ok": False, "problems": [damage], "repaired": [], "lost_keys": [], "batches": 0, "keys": 0}
    if repair:
        stored = _stored_lake(path)
        done = rebuild_index(path, lake or stored, storage_options)
        report["problems"] += done["problems"]
        report["repaired"] += done["repaired"]
    return report


class _Damaged(Exception):
    """The index does not describe the local data (it must be rebuilt, not patched)."""


def _index_damage(path: Path) -> str | None:
    """Why the index cannot be used as it is (read-only look), or None."""
    try:
        settings = probe(path / "index")
    except CorruptionError as e:
        return str(e)
    if (settings is None or "schema" not in settings or "run_id" not in settings) and has_local_data(path):
        return f"the key index {path / 'index'} is missing or empty but fragments or WAL segments are present"
    return None


def _stored_lake(path: Path) -> str | None:
    try:
        settings = probe(path / "index") or {}
    except CorruptionError:
        return None
    v = settings.get("lake")
    return v.decode() if v else None


def _check(path: Path, repair: bool, lake_url: str | None, storage_options: dict | None) -> dict[str, Any]:
    index = KeyIndex(path / "index")
    problems: list[str] = []
    repaired: list[str] = []
    lost: list[str] = []
    explicit_lake = lake_url  # asked for: the run's lake side is checked too
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(index.get_setting("schema")))
        warm = WarmTier(warm_path(path), schema)
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
            elif info.tier == "cold":  # only the lake holds it: the index must say where (the lake is checked by --lake)
                locs = index.cold_locations(bid)
                _, pos, known = index.lookup(keys)
                placed = 0
                if locs is not None and known.all() and (pos < len(locs[1])).all():
                    placed = int((locs[1][pos] >= 0).sum())
                if placed != info.rows:
                    problems.append(f"batch {bid}: cold, but the index places {placed} of its {info.rows} rows in the lake")
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
        orphan_frags, unexplained = unexplained_fragments(index, warm, batches)
        if unexplained:
            raise _Damaged(f"warm fragments {unexplained} hold rows the key index does not know: the index is damaged")
        orphan_wal = sorted(wal_ids - {b for b, i in batches.items() if i.tier == "hot"})
        if orphan_frags:
            problems.append(f"warm fragments with no index entry (left by a crashed write): {orphan_frags}")
        if orphan_wal:
            problems.append(f"WAL segments with no hot batch: {orphan_wal}")
        if repair:
            installer = FragmentInstaller(index, warm, metadata_columns(schema))
            if orphan_frags:
                warm.drop_fragments(orphan_frags)
                repaired.append(f"dropped fragments left by a crashed write {orphan_frags}")
            index.clear_installs(index.pending_installs())
            if wal.remove_torn():
                repaired.append("removed torn WAL writes (*.arrow.tmp)")
            repaired += sweep_wal(index, warm, wal, batches, path)
            dead_frags = set()
            stored = index.get_setting("lake")
            lake_url = lake_url or (stored.decode() if stored else None)
            lake_checked: dict[str, str | None] = {}
            keep_frags: set = set()
            for bid in broken:
                info = batches[bid]
                if info.tier == "hot" and bid in wal_ids and wal.segment_path(bid).exists():
                    target = quarantine_segment(wal, bid, path, "it fails its checksum (fsck --repair)")
                    repaired.append(f"moved WAL segment {bid}, which fails its check, to {target}")
                meta = index.batch_meta(bid)
                keys = meta.column("key").to_pylist() if meta is not None else []
                if info.tier == "warm" and info.fragment in fragments:
                    dead_frags.add(info.fragment)
                if info.snapshot is not None and lake_url and keys:
                    bad_lake = _check_lake(index, lake_url, storage_options, lake_checked)
                    if bad_lake is not None:
                        problems.append(f"batch {bid} not rebuilt: the lake's copy fails its check ({bad_lake}); "
                                        f"fix the lake (or pass --lake with a good copy) and run fsck --repair again")
                        keep_frags.add(info.fragment)
                        continue
                    if _rebuild_from_lake(index, installer, info, meta, lake_url, storage_options, schema):
                        repaired.append(f"rebuilt batch {bid} ({len(keys)} rows) from the lake {lake_url} (verified)")
                        continue
                lost.extend(keys)
                index.drop_batch(bid, keys)
                repaired.append(f"forgot batch {bid} ({len(keys)} rows whose data is gone)")
            for f in sorted(dead_frags - keep_frags):  # damaged files are kept aside, never deleted (issue 24)
                if warm.file_of(f).exists():
                    target = quarantine.move(warm.file_of(f), path, "warm",
                                             f"warm fragment {f} fails its check (fsck --repair)")
                    repaired.append(f"moved warm fragment {f}, which fails its check, to {target}")
            warm.drop_fragments(sorted(dead_frags - keep_frags))
        lake_fields: dict[str, Any] = {}
        if explicit_lake:
            more, lake_fields = _check_lake_side(index, index.batches(), explicit_lake, storage_options, repair)
            problems += more
            repaired += lake_fields.pop("repaired_lake", [])
            lost += lake_fields.pop("forgot_lost_keys", [])
        return {
            "ok": not problems,
            "problems": problems,
            "repaired": repaired,
            "lost_keys": lost,
            "batches": len(batches),
            "keys": len(index_keys),
            **lake_fields,
        }
    finally:
        index.close()


def _check_lake(index: KeyIndex, lake_url: str, storage_options: dict | None, cache: dict[str, str | None]) -> str | None:
    """Verify the run's files in the lake once per fsck (size + sha256); what is wrong, or None."""
    if lake_url not in cache:
        from .lake import Lake

        try:
            Lake(lake_url, storage_options).verify(index.get_setting("run_id").decode())
            cache[lake_url] = None
        except Exception as e:  # noqa: BLE001 - a lake that cannot be verified is not a source
            cache[lake_url] = f"{type(e).__name__}: {e}"
    return cache[lake_url]


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
