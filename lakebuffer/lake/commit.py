"""The snapshot commit of a run: stream the rows into Parquet files, copy-on-write delete keys from the
run's earlier files, and commit both as ONE Delta version carrying the run's snapshot id.

Functions over a lake's parts (``LakeParts``) rather than methods of ``Lake``: the commit protocol is one
job (write, delete, commit, recognise a lost reply); ``Lake.commit_snapshot`` checks writability, calls
it and builds the manifest.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from ..errors import LakeBufferError, LakeDiskFullError, LakeError, LockedError, SchemaError, is_disk_full
from ..schema import ROLLOUT_SCHEMA, cast_to, key_array
from .delta import app_id
from .entries import add_action, entries_of, remove_action
from .layout import check_run_id
from .parts import LakeParts
from .reader import close_file, holds_any, key_range_hit, open_verified, read_group
from .rows import iter_input, schema_from_b64, schema_to_b64, with_run_id, without, without_columns
from .verified import mark_verified
from .writer import Writer


def _writer(lake: LakeParts, run_id: str, snapshot_id: int, schema: pa.Schema, target: int, **kw: Any) -> Writer:
    return Writer(lake.store, lake.options, lake.policy_bucket_size, run_id, snapshot_id, schema, target, **kw)


def commit_snapshot(
    lake: LakeParts,
    run_id: str,
    batches: Iterable[pa.Table | pa.RecordBatch],
    deleted_keys: Sequence[str] | pa.Array = (),
    *,
    meta: dict | None = None,
    force: bool = False,
) -> tuple[DeltaTable, int, dict] | None:
    """Append ``batches`` (streamed, never concatenated) and delete ``deleted_keys`` from the run's
    earlier files as one Delta commit = one snapshot of ``run_id``; return (the new table, snapshot id, commit document), or None for
    an empty snapshot (no rows, no deletes) unless ``force``.

    Deletes are Delta copy-on-write deletes in the same commit: the files of the run whose key
    range (Delta stats) may hold a deleted key are fetched (verified), their key column read, and
    those that do hold one are rewritten without those rows (remove + add). Rows of this snapshot
    are never deleted by it, so a key deleted and pushed again ends with the new row only. The
    snapshot id is the run's app-transaction version + 1, committed with the data: a second writer
    of the run racing for the same id loses (``LockedError``). Rows must belong to ``run_id``
    (their ``run_id`` column, if any, is checked and dropped: the partition carries it). Any
    storage error raises LakeError and leaves the committed state as it was."""
    check_run_id(run_id)
    dt = lake.delta.table()
    parent_sid = (dt.transaction_version(app_id(run_id)) if dt is not None else None) or 0
    sid = parent_sid + 1
    parent_doc: dict = {}
    if parent_sid and dt is not None:
        parent_doc = lake.delta.run_commits(dt, run_id).get(parent_sid, (None, {}))[1]
    dkeys = key_array(deleted_keys)
    writer: Writer | None = None
    rewriter: Writer | None = None
    row_schema: pa.Schema | None = None
    file_schema: pa.Schema | None = None
    user_error: BaseException | None = None
    committing = False
    it = iter_input(batches)
    try:
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            except BaseException as e:
                user_error = e
                raise
            if batch.num_rows == 0:
                continue
            if "run_id" in batch.schema.names:
                col = batch.column("run_id")
                if not pa.types.is_string(col.type):
                    col = col.cast(pa.string())
                if col.null_count or pc.any(pc.not_equal(col, pa.scalar(run_id))).as_py():
                    raise SchemaError(f"batch holds rows of another run than {run_id!r}")
            if row_schema is None:
                row_schema = with_run_id(without(batch.schema, ["policy_bucket"]))
                file_schema = without(batch.schema, ["run_id", "policy_bucket"])
                if "policy_version" not in file_schema.names:
                    raise SchemaError("batches need a 'policy_version' column (the lake partitions by it)")
                if parent_doc.get("schema"):
                    try:
                        pa.unify_schemas([schema_from_b64(parent_doc["schema"]), row_schema])
                    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                        raise SchemaError(f"snapshot schema does not fit run {run_id!r}: {e}") from e
                writer = _writer(lake, run_id, sid, file_schema, lake.options.target_file_bytes)
            batch = without_columns(batch, ("run_id", "policy_bucket"))
            if not batch.schema.equals(file_schema, check_metadata=False):
                if set(batch.schema.names) != set(file_schema.names):
                    raise SchemaError(
                        f"batches of one snapshot must have the same columns: {batch.schema.names} vs {file_schema.names}"
                    )
                try:
                    batch = cast_to(batch, file_schema)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                    raise SchemaError(f"batch does not fit the snapshot schema: {e}") from e
            writer.add(batch)
        entries = writer.finish() if writer is not None else []
        nrows = sum(int(e["rows"]) for e in entries)
        if nrows == 0 and len(dkeys) == 0 and not force:
            return None
        schema_doc = row_schema or (schema_from_b64(parent_doc["schema"]) if parent_doc.get("schema") else with_run_id(ROLLOUT_SCHEMA))
        if parent_doc.get("schema") and row_schema is not None:
            schema_doc = pa.unify_schemas([schema_from_b64(parent_doc["schema"]), row_schema])
        removed: list[dict] = []
        rewritten: list[dict] = []
        deleted = 0
        if len(dkeys) and dt is not None:
            rewriter = _writer(lake, run_id, sid, without(schema_doc, ["run_id", "policy_bucket"]), lake.options.target_file_bytes, tag="d", max_lanes=1)
            removed, deleted = _delete_rows(lake, dt, run_id, dkeys, rewriter)
            rewritten = rewriter.finish()
        doc = {
            "run_id": run_id,
            "snapshot_id": sid,
            "commit_id": uuid.uuid4().hex,  # recognises this commit after a lost reply
            "operation": "append",
            "schema": schema_to_b64(schema_doc),
            "meta": meta or {},
            "summary": {"added_rows": nrows, "deleted_keys": len(dkeys), "deleted_rows": deleted,
                        "added_files": len(entries) + len(rewritten), "removed_files": len(removed)},
        }
        adds = [add_action(e, run_id, data_change=True) for e in entries + rewritten]
        removes = [remove_action(e, data_change=True) for e in removed]
        committing = True  # from here on a failure may leave a commit that landed: keep the files
        try:
            new_dt, doc = lake.delta.commit(
                dt, adds=adds, removes=removes, schema=schema_doc, doc=doc, txn=(run_id, sid),
                settings={"format": "lakebuffer.delta/1", "policy_bucket_size": lake.policy_bucket_size},
            )
        except CommitFailedError as e:
            committing = False
            raise _commit_failed(lake, run_id, sid, e) from e
        except LakeError:
            landed = _landed(lake, run_id, sid, doc["commit_id"])  # a lost reply: did it land?
            if landed is None:
                raise
            new_dt, doc = landed
        mark_verified(lake.store, entries + rewritten)  # checksummed from the bytes written
        return new_dt, sid, doc
    except BaseException as e:
        if not committing:  # nothing references these files: try to remove them (vacuum gets the rest)
            for w in (writer, rewriter):
                if w is not None:
                    w.abort()
        if not committing and is_disk_full(e):  # the lake's filesystem is full: say so, and the fix
            raise LakeDiskFullError(f"snapshot of run {run_id!r} to lake {lake.url} failed, nothing was committed: "
                                    f"its filesystem is full ({e}); every row stays in the local buffer: free "
                                    "space in the lake (or run gc / set retention), then snapshot again") from e
        if not committing and type(e) is LakeError:  # a storage error before the commit
            raise LakeError(f"snapshot of run {run_id!r} to lake {lake.url} failed, nothing was committed: {e}") from e
        if e is user_error or isinstance(e, (LakeBufferError, KeyboardInterrupt)):
            raise
        raise LakeError(
            f"snapshot of run {run_id!r} to lake {lake.url} failed, nothing was committed: {type(e).__name__}: {e}"
        ) from e

def _landed(lake: LakeParts, run_id: str, sid: int, commit_id: str) -> tuple[DeltaTable, dict] | None:
    try:
        dt = lake.delta.table()
        if dt is None:
            return None
        found = lake.delta.run_commits(dt, run_id).get(sid)
    except LakeBufferError:
        return None
    if found is None or found[1].get("commit_id") != commit_id:
        return None
    return dt, found[1]

def _commit_failed(lake: LakeParts, run_id: str, sid: int, e: Exception) -> LakeBufferError:
    dt = lake.delta.table()
    now_sid = dt.transaction_version(app_id(run_id)) if dt is not None else None
    if now_sid is not None and now_sid >= sid:
        holder = lake.claims.holder(run_id) or {}
        return LockedError(
            f"snapshot {sid} of run {run_id!r} in lake {lake.url} was committed by another writer at the same time "
            f"({holder.get('path', '?')} on {holder.get('host', '?')}); nothing of this snapshot was committed. "
            "One buffer writes a run: use a different run_id or close the other buffer"
        )
    return LakeError(
        f"snapshot {sid} of run {run_id!r} conflicts with a concurrent commit to lake {lake.url} ({e}); nothing "
        "was committed and the snapshot is retried at the next one"
    )

def _delete_rows(lake: LakeParts, dt: DeltaTable, run_id: str, keys: pa.Array, rewriter: Writer) -> tuple[list[dict], int]:
    """Copy-on-write delete of ``keys`` from the run's files of ``dt``: (files removed, rows dropped);
    their surviving rows go to ``rewriter``."""
    keys = pc.unique(keys)
    sorted_keys = sorted(keys.to_pylist())
    removed: list[dict] = []
    dropped = 0
    for entry in entries_of(dt, run_id):
        if not key_range_hit(entry, sorted_keys):
            continue
        pf = open_verified(lake.store, lake.options, entry)  # a large file: streamed, by row group
        try:
            if not holds_any(pf, keys):
                continue
            for i in range(pf.metadata.num_row_groups):
                t = read_group(lake.store, entry, pf, i)
                keep = pc.invert(pc.is_in(t.column("key"), value_set=keys))
                survivors = t.filter(keep)
                dropped += t.num_rows - survivors.num_rows
                if survivors.num_rows:
                    for b in cast_to(survivors, rewriter.schema).to_batches():
                        rewriter.add(b)
                del t, survivors
        finally:
            close_file(pf)
        rewriter.seal(int(entry["policy_bucket"]))  # one file in, (at most) one file out
        removed.append(entry)
    return removed, dropped

