"""Lake maintenance: verify, compact (Delta compaction), gc (Delta vacuum) and aborting a crashed
writer's multipart uploads.

Functions over a lake's parts (``LakeParts``) rather than a mixin: they are policies over the lake's public
parts (``store``, ``delta``, ``options``) and keep no state of their own. ``Lake`` checks writability and
delegates here.

Why compaction does not call ``DeltaTable.optimize.compact()``: delta-rs rewrites with its own writer,
so the new files would carry no sha256 in their names (nothing left to verify them by) and no page
checksums, and it peaked at 1.3-1.6 GB RSS on 375 MB in issue 14. The rewrite here reads each file
verified, streams the rows through the snapshot ``Writer`` (bounded memory) and commits remove + add
actions with ``dataChange=false``: the same Delta semantics as ``optimize`` (readers of any engine
see a rearrangement, not new data; streaming readers skip it).

Measured once (2-core machine shared with other jobs, load ~15; 40 files, 49 MB on disk, 81 MB of Arrow,
one partition, into one file; script in the issue-14 report): this rewrite 1.31 s, peak RSS 361 MB;
``optimize.compact()`` 1.33 s, peak RSS 420 MB. After one flipped byte in the compacted file, lakebuffer's
read of our file raised ``CorruptionError``; deltalake's own reader returned all 40,960 rows silently for
both files, and the delta-rs file (no sha256 in its name) could only be read unverified.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from deltalake.exceptions import CommitFailedError

from ..errors import CorruptionError, LakeBufferError, LakeError
from ..schema import cast_to
from . import s3
from .check import check_files
from .entries import add_action, entries_of, remove_action
from .layout import TOKEN_TIME, check_run_id
from .parts import LakeParts
from .reader import FileReader, read_group
from .rows import schema_from_b64, without
from .writer import Writer

_TOTALS = ("files_before", "files_after", "rows_before", "rows_after", "bytes_before", "bytes_after", "files_rewritten", "files_written", "delete_files_applied")


def verify(lake: LakeParts, run_id: str | None = None) -> dict:
    """Check size and sha256 (from its name) of every live file of the table (or of one run), through
    ``check.check_files`` (fsck's check: one implementation); ``CorruptionError`` naming every bad or
    missing file, else a summary. A store that does not answer raises ``LakeError`` (not damage)."""
    res = check_files(lake, run_id, strict=True)
    bad = [f"{d['path']} ({d['problem']}, run {d['run_id']!r})" for d in res["damaged"]]
    if bad:
        err = CorruptionError(f"{len(bad)} lake file(s) fail verification: " + "; ".join(bad))
        err.paths = [d["path"] for d in res["damaged"]]
        raise err
    return {"files": res["files"], "bytes": res["bytes"], "version": res["version"]}


def _plan(entries: list[dict], target_file_bytes: int, small_file_fraction: float) -> list[dict]:
    by_bucket: dict[int, list[dict]] = {}
    for f in entries:
        by_bucket.setdefault(int(f["policy_bucket"]), []).append(f)
    chosen: list[dict] = []
    for files in by_bucket.values():
        small = [f for f in files if int(f["bytes"]) < small_file_fraction * target_file_bytes]
        if len(small) >= 2:
            chosen.extend(sorted(small, key=lambda f: (int(f["policy_bucket"]), int(f.get("snapshot_id", 0)), f["path"])))
    return chosen


def _compact_run(lake: LakeParts, r: str, target_file_bytes: int, small_file_fraction: float, tick: Callable[[int], None]) -> dict:
    dt = lake.delta.table()
    before = entries_of(dt, r)
    rs = {
        "snapshot_id": dt.transaction_version(f"lakebuffer:{r}") if dt is not None else None,
        "files_before": len(before),
        "rows_before": sum(int(f["rows"] or 0) for f in before),
        "bytes_before": sum(int(f["bytes"]) for f in before),
        "delete_files_applied": 0,
    }
    chosen = _plan(before, target_file_bytes, small_file_fraction)
    if not chosen:
        rs.update(files_after=rs["files_before"], rows_after=rs["rows_before"], bytes_after=rs["bytes_before"], files_rewritten=0, files_written=0)
        return rs
    commits = lake.delta.run_commits(dt, r)
    doc = commits[max(commits)][1] if commits else {}
    schema = schema_from_b64(doc["schema"]) if doc.get("schema") else None
    opts = lake.options
    in_bytes: dict[int, int] = {}
    for f in chosen:
        in_bytes[int(f["policy_bucket"])] = in_bytes.get(int(f["policy_bucket"]), 0) + int(f["bytes"])
    lanes = {b: min(opts.encode_threads, max(1, n // target_file_bytes)) for b, n in in_bytes.items()}
    writer: Writer | None = None
    committing = False
    try:
        for entry, pf, i in FileReader(lake.store, opts, chosen, verify=True).row_groups():
            t = read_group(lake.store, entry, pf, i)
            if writer is None:
                file_schema = without(schema, ["run_id", "policy_bucket"]) if schema is not None else t.schema
                writer = Writer(lake.store, opts, lake.policy_bucket_size, r, int(rs["snapshot_id"] or 0), file_schema, target_file_bytes, tag="c", lanes=lanes)
            for b in cast_to(t, writer.schema).to_batches():
                writer.add(b)
            tick(int(entry["bytes"]) // max(pf.metadata.num_row_groups, 1))
        entries = writer.finish() if writer is not None else []
        committing = True  # a failure now may leave a landed commit: keep the files
        lake.delta.commit(  # no app transaction: compaction is no snapshot of the run
            dt,
            adds=[add_action(e, r, data_change=False) for e in entries],
            removes=[remove_action(f, data_change=False) for f in chosen],
            schema=schema if schema is not None else lake.schema(r),
            doc={"run_id": r, "operation": "compact", "summary": {"target_file_bytes": target_file_bytes}},
            txn=None,
            settings={},
        )
    except BaseException as e:
        if not committing and writer is not None:
            writer.abort()
        if isinstance(e, (LakeBufferError, KeyboardInterrupt)):
            raise
        if isinstance(e, CommitFailedError):
            raise LakeError(f"compaction of run {r!r} in lake {lake.url} conflicts with a concurrent commit ({e}); nothing was committed, run it again") from e
        raise LakeError(f"compaction of run {r!r} in lake {lake.url} failed, nothing was committed: {type(e).__name__}: {e}") from e
    after = entries_of(lake.delta.table(), r)
    rs.update(
        files_after=len(after),
        rows_after=sum(int(f["rows"] or 0) for f in after),
        bytes_after=sum(int(f["bytes"]) for f in after),
        files_rewritten=len(chosen),
        files_written=len(entries),
    )
    return rs


def compact(
    lake: LakeParts,
    run_id: str | None,
    target_file_bytes: int,
    progress: Callable[[int, int], None] | None,
    small_file_fraction: float,
) -> dict:
    """See ``Lake.compact``."""
    runs = [check_run_id(run_id)] if run_id is not None else lake.runs()
    stats: dict = {"runs": {}, **{k: 0 for k in _TOTALS}}
    dt = lake.delta.table()
    total = sum(int(f["bytes"]) for r in runs for f in _plan(entries_of(dt, r), target_file_bytes, small_file_fraction))
    done = 0

    def tick(n: int) -> None:
        nonlocal done
        done = min(total, done + n)
        if progress is not None:
            progress(done, total)

    if progress is not None:
        progress(0, total)
    for r in runs:
        rs = _compact_run(lake, r, target_file_bytes, small_file_fraction, tick)
        stats["runs"][r] = rs
        for k in _TOTALS:
            stats[k] += rs[k]
    if progress is not None:
        progress(total, total)
    return stats


def gc(lake: LakeParts, older_than_s: float) -> int:
    """See ``Lake.gc``: ``DeltaTable.vacuum(full=True)`` with a retention of ``older_than_s`` rounded up
    to whole hours (vacuum's unit; never shorter than asked), plus the stale multipart uploads."""
    cutoff = time.time() - float(older_than_s)
    dt = lake.delta.table()
    removed = 0
    if dt is not None:
        hours = max(0, math.ceil(float(older_than_s) / 3600))
        before = _data_objects(lake)
        lake.delta._call(
            "vacuuming the Delta table", dt.vacuum, retention_hours=hours, dry_run=False, enforce_retention_duration=False, full=True
        )
        # vacuum reports every file its remove actions name, also those an earlier vacuum deleted: count
        removed = len(before - _data_objects(lake))
    return removed + abort_stale_uploads(lake, cutoff)


def _data_objects(lake: LakeParts) -> set[str]:
    """Every data object under the lake (the Delta log and lakebuffer's own folders excluded)."""
    return {p for p in lake.store.find(what="listing the lake's files") if "/_delta_log/" not in p and "/_writers/" not in p}


def abort_stale_uploads(lake: LakeParts, cutoff: float) -> int:
    """S3: abort multipart uploads of our data files started before ``cutoff`` (a crashed writer's)."""
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
