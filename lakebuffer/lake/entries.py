"""The run's live data files as entries (read from the Delta log's add actions, no data read) and the
Delta ``add``/``remove`` actions that put entries into a commit or take them out.

The one low layer that the table (``Lake``), the snapshot commit and maintenance all use.
"""

from __future__ import annotations

from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from .layout import now, sha256_of, snapshot_of


def entries_of(dt: DeltaTable | None, run_id: str | None = None) -> list[dict]:
    """The live data files of ``dt`` (of one run, or all) as entries: path (relative), run_id,
    policy_bucket, rows, bytes, sha256 (from the name), snapshot_id (from the name), key and
    policy_version ranges (from the Delta stats)."""
    if dt is None:
        return []
    t = pa.table(dt.get_add_actions(flatten=True))
    if t.num_rows == 0:
        return []
    if run_id is not None:
        t = t.filter(pc.equal(t.column("partition.run_id"), run_id))
    cols = {n: t.column(n).to_pylist() for n in t.column_names if n in (
        "path", "size_bytes", "num_records", "partition.run_id", "partition.policy_bucket",
        "min.key", "max.key", "min.policy_version", "max.policy_version")}
    out = []
    for i, logged in enumerate(cols["path"]):
        path = unquote(logged)  # get_add_actions gives the log's URI-encoded path
        out.append({
            "path": path,
            "run_id": cols["partition.run_id"][i],
            "policy_bucket": int(cols["partition.policy_bucket"][i]),
            "rows": cols.get("num_records", [None] * len(cols["path"]))[i],
            "bytes": int(cols["size_bytes"][i]),
            "sha256": sha256_of(path),
            "snapshot_id": snapshot_of(path),
            "min_key": cols.get("min.key", [None] * len(cols["path"]))[i],
            "max_key": cols.get("max.key", [None] * len(cols["path"]))[i],
            "min_policy_version": cols.get("min.policy_version", [None] * len(cols["path"]))[i],
            "max_policy_version": cols.get("max.policy_version", [None] * len(cols["path"]))[i],
        })
    out.sort(key=lambda e: (e["run_id"], e["snapshot_id"], e["path"]))
    return out


def add_action(entry: dict, run_id: str, *, data_change: bool) -> AddAction:
    return AddAction(
        entry["path"], int(entry["bytes"]), {"run_id": run_id, "policy_bucket": str(int(entry["policy_bucket"]))},
        int(now()[1] * 1000), data_change, entry["stats"],
    )


def remove_action(entry: dict, *, data_change: bool) -> RemoveAction:
    return RemoveAction(
        entry["path"], data_change, int(now()[1] * 1000), int(entry["bytes"]),
        {"run_id": entry["run_id"], "policy_bucket": str(int(entry["policy_bucket"]))},
    )

