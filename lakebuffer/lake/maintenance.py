"""Lake maintenance: verify, compact, gc and aborting a crashed writer's multipart uploads.

Functions over a ``Lake`` rather than a mixin: they are policies over the lake's public parts
(``store``, ``log``, ``tombstones``, ``options``) and keep no state of their own, so each one reads
as a unit and can be replaced on its own (the Delta Lake issue maps compact -> optimize and
gc -> vacuum). ``Lake`` checks writability and delegates here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import CorruptionError, LakeBufferError, LakeError
from . import s3
from .fs import mtime
from .layout import DATA_FILE, DELETE_FILE, MANIFEST_DIR, TOKEN_TIME, check_run_id, manifest_rel
from .manifest import manifest_paths
from .reader import check_bytes, copy_rows, files_with_keys
from .rows import schema_from_b64, without
from .writer import Writer

if TYPE_CHECKING:
    from .table import Lake

_TOTALS = ("files_before", "files_after", "rows_before", "rows_after", "bytes_before", "bytes_after", "files_rewritten", "files_written", "delete_files_applied")


def verify(lake: Lake, run_id: str | None = None) -> dict:
    """Check size and sha256 of every live data and delete file of the latest snapshots;
    ``CorruptionError`` naming every bad or missing file, else a summary."""
    bad: list[str] = []
    nfiles = nbytes = 0
    for r, m in lake.log.select(run_id).items():
        for entry in [*m["files"], *m.get("delete_files", [])]:
            nfiles += 1
            url = lake.store.url_of(entry["path"])
            try:
                data = lake.store.cat(entry["path"])
            except FileNotFoundError:
                bad.append(f"{url} (missing; snapshot {m['snapshot_id']} of run {r!r})")
                continue
            nbytes += len(data)
            problem = check_bytes(entry, data)
            if problem:
                bad.append(f"{url} ({problem})")
    if bad:
        err = CorruptionError(f"{len(bad)} lake file(s) fail verification: " + "; ".join(bad))
        err.paths = [b.split(" (", 1)[0] for b in bad]
        raise err
    return {"files": nfiles, "bytes": nbytes}


def _plan(lake: Lake, runs: list[str], target_file_bytes: int, small_file_fraction: float) -> list[tuple]:
    """Per run: (run, parent manifest, tombstones, files to rewrite)."""
    plans = []
    for r in runs:
        parent = lake.log.latest(r)
        if parent is None:
            continue
        tomb = lake.tombstones.of(parent)
        by_bucket: dict[int, list[dict]] = {}
        for f in parent["files"]:
            by_bucket.setdefault(int(f["policy_bucket"]), []).append(f)
        chosen: list[dict] = []
        for files in by_bucket.values():
            small = [f for f in files if int(f["bytes"]) < small_file_fraction * target_file_bytes]
            pick = small if len(small) >= 2 else []
            if len(tomb):
                picked = {f["path"] for f in pick}
                rest = {"files": [f for f in files if f["path"] not in picked]}
                pick = pick + files_with_keys(lake.store, rest, tomb)
            chosen.extend(sorted(pick, key=lambda f: (int(f["policy_bucket"]), int(f.get("snapshot_id", 0)), f["path"])))
        plans.append((r, parent, tomb, chosen))
    return plans


def _compact_run(lake: Lake, r: str, parent: dict, tomb, chosen: list[dict], target_file_bytes: int, tick: Callable[[int], None]) -> dict:
    before = parent["files"]
    rs = {
        "snapshot_id": parent["snapshot_id"],
        "files_before": len(before),
        "rows_before": sum(int(f["rows"]) for f in before),
        "bytes_before": sum(int(f["bytes"]) for f in before),
    }
    if not chosen and not parent.get("delete_files"):
        rs.update(files_after=rs["files_before"], rows_after=rs["rows_before"], bytes_after=rs["bytes_before"], files_rewritten=0, files_written=0, delete_files_applied=0)
        return rs
    opts = lake.options
    file_schema = without(schema_from_b64(parent["schema"]), ["run_id", "policy_bucket"])
    in_bytes: dict[int, int] = {}
    for f in chosen:
        in_bytes[int(f["policy_bucket"])] = in_bytes.get(int(f["policy_bucket"]), 0) + int(f["bytes"])
    # parallel encoders only where the partition fills several target-size files
    lanes = {b: min(opts.encode_threads, max(1, n // target_file_bytes)) for b, n in in_bytes.items()}
    writer = Writer(lake.store, opts, lake.policy_bucket_size, r, parent["snapshot_id"] + 1, file_schema, target_file_bytes, tag="c", lanes=lanes)
    committing = False
    try:
        copy_rows(lake.store, opts, chosen, writer, tomb, file_schema, progress=tick)
        entries = writer.finish()
        committing = True  # a failure now may leave a landed manifest: keep the files
        m = lake.log.commit(
            r,
            parent,
            policy_bucket_size=lake.policy_bucket_size,
            operation="compact",
            add_files=entries,
            remove_files={f["path"] for f in chosen},
            add_deletes=[],
            remove_deletes={d["path"] for d in parent.get("delete_files", [])},
            schema=schema_from_b64(parent["schema"]),
            meta={"compaction": {"target_file_bytes": target_file_bytes, "parent_id": parent["snapshot_id"]}},
        )
    except BaseException as e:
        if not committing:
            writer.abort()
        if isinstance(e, (LakeBufferError, KeyboardInterrupt)):
            raise
        raise LakeError(f"compaction of run {r!r} in lake {lake.url} failed, nothing was committed: {type(e).__name__}: {e}") from e
    after = m["files"]
    rs.update(
        snapshot_id=m["snapshot_id"],
        files_after=len(after),
        rows_after=sum(int(f["rows"]) for f in after),
        bytes_after=sum(int(f["bytes"]) for f in after),
        files_rewritten=len(chosen),
        files_written=len(entries),
        delete_files_applied=len(parent.get("delete_files", [])),
    )
    return rs


def compact(
    lake: Lake,
    run_id: str | None,
    target_file_bytes: int,
    progress: Callable[[int, int], None] | None,
    small_file_fraction: float,
) -> dict:
    """See ``Lake.compact``."""
    runs = [check_run_id(run_id)] if run_id is not None else lake.runs()
    stats: dict = {"runs": {}, **{k: 0 for k in _TOTALS}}
    plans = _plan(lake, runs, target_file_bytes, small_file_fraction)
    total = sum(int(f["bytes"]) for _, _, _, chosen in plans for f in chosen)
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done = min(total, done + n)
        if progress is not None:
            progress(done, total)

    if progress is not None:
        progress(0, total)
    for r, parent, tomb, chosen in plans:
        rs = _compact_run(lake, r, parent, tomb, chosen, target_file_bytes, tick)
        stats["runs"][r] = rs
        for k in _TOTALS:
            stats[k] += rs[k]
    if progress is not None:
        progress(total, total)
    return stats


def _referenced(lake: Lake, cutoff: float) -> tuple[set[str], list[str]]:
    """(files a live snapshot needs, manifests that expired before ``cutoff``)."""
    keep: set[str] = set()
    doomed: list[str] = []
    for r, sids in lake.log.listing().items():
        latest = lake.log.get(r, sids[-1])
        keep |= manifest_paths(latest)
        successor_time = float(latest.get("created_at_s", time.time()))
        expired = False
        for sid in reversed(sids[:-1]):
            if not expired and successor_time > cutoff:
                m = lake.log.get(r, sid)
                keep |= manifest_paths(m)
                successor_time = float(m.get("created_at_s", 0))
            else:
                expired = True
                doomed.append(manifest_rel(r, sid))
    return keep, doomed


def gc(lake: Lake, older_than_s: float) -> int:
    """See ``Lake.gc``."""
    cutoff = time.time() - float(older_than_s)
    keep, doomed = _referenced(lake, cutoff)
    store = lake.store
    prefix = store.root.rstrip("/") + "/"
    for path, info in store.find(detail=True).items():
        path = store.strip(path)
        if not path.startswith(prefix):
            continue
        rel = path[len(prefix) :]
        if rel.startswith(MANIFEST_DIR + "/"):
            if os.path.basename(rel).startswith(".tmp-"):
                mt = mtime(info)
                if mt is not None and mt < cutoff:
                    doomed.append(rel)
            continue
        if not (DATA_FILE.match(rel) or DELETE_FILE.match(rel)) or rel in keep:
            continue
        mt = mtime(info)
        if mt is not None and mt < cutoff:
            doomed.append(rel)
    for rel in doomed:
        store.remove(rel)
        lake.tombstones.forget(rel)
    return len(doomed) + abort_stale_uploads(lake, cutoff)


def abort_stale_uploads(lake: Lake, cutoff: float) -> int:
    """S3: abort multipart uploads under the lake started before ``cutoff`` (a crashed writer's)."""
    store = lake.store
    if not s3.can_call(store.fs, store.protocol):
        return 0
    bucket, _, prefix = store.root.partition("/")
    prefix = prefix + "/" if prefix else ""
    uploads = store.io("listing multipart uploads", s3.list_uploads, store.fs, bucket, prefix)
    n = 0
    for up in uploads:
        m = TOKEN_TIME.search(up.get("Key", ""))
        if m is None:  # not ours
            continue
        if int(m.group(1)) < cutoff:
            store.io("aborting an upload", s3.abort_upload, store.fs, bucket, up["Key"], up["UploadId"])
            n += 1
    return n
