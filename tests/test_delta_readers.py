"""Issue 14 "Done when": the lake is a Delta table that every Delta reader reads exactly.

Two runs push, delete and snapshot into one S3 lake (moto on loopback), and a third process is killed
(SIGKILL) in the middle of a snapshot's upload. Then ``deltalake.DeltaTable``, ``polars.scan_delta``,
DuckDB over the table's pyarrow dataset and a plain ``pyarrow.parquet`` read of the files the table
lists all return exactly the rows lakebuffer returns, and each snapshot is a Delta version that
``version=`` reads back as lakebuffer's snapshot.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import deltalake
import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import s3fs

import lakebuffer as lb
from lakebuffer.lake import Lake
from tests.rollouts import make_rollouts

ROOT = Path(__file__).resolve().parent.parent


def _kill_mid_snapshot(url: str, options: dict) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.delta_snapshot_worker", url, json.dumps(options)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        line = json.loads(proc.stdout.readline())
        assert line.get("uploaded", 0) >= 1, line  # files of the snapshot are on S3, no commit yet
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        proc.stdout.close()


def _rows(table, cols=("key", "run_id", "policy_version", "reward")) -> list[tuple]:
    t = pa.table({c: table.column(c).cast(pa.string()) for c in cols}) if not isinstance(table, pa.Table) else table
    t = t.select(list(cols))
    return sorted(zip(*[t.column(c).to_pylist() for c in cols]))


def test_every_delta_reader_returns_exactly_lakebuffers_rows(tmp_path, s3_server, s3_bucket):
    url, opts = f"{s3_bucket}/lake", s3_server.storage_options
    snapshots: dict[str, list[int]] = {}
    for n, run in enumerate(["ra", "rb"]):
        with lb.ReplayBuffer.open(tmp_path / run, lake=url, storage_options=opts, run_id=run,
                                  snapshot_interval_s=0, memory_limit_mb=64) as buf:
            keys = []
            for i in range(3):
                keys += buf.push(make_rollouts(48, tokens=16, version=i, seed=10 * n + i)).to_pylist()
                buf.snapshot(wait=True)
            buf.delete(keys=keys[5:15])  # rows already in the lake: a Delta delete
            more = buf.push(make_rollouts(16, tokens=16, version=3, seed=90 + n)).to_pylist()
            buf.delete(keys=more[:2])  # rows never snapshotted
            buf.snapshot(wait=True)
    lake = Lake(url, opts, read_only=True)
    for run in ("ra", "rb"):
        snapshots[run] = lake.snapshots(run)
        assert len(snapshots[run]) == 4
    _kill_mid_snapshot(url, opts)

    with lb.ReplayBuffer.open_lake(url, storage_options=opts) as view:
        ours = view.sql("SELECT key, run_id, policy_version, reward FROM rollouts")
    assert ours.num_rows == 2 * (3 * 48 - 10 + 16 - 2)
    expected = _rows(ours)

    dopts = lake.delta_storage_options
    dt = deltalake.DeltaTable(url, storage_options=dopts)
    assert _rows(dt.to_pyarrow_table()) == expected
    assert _rows(pl.scan_delta(url, storage_options=dopts).collect().to_arrow()) == expected
    con = duckdb.connect()
    con.register("lake", dt.to_pyarrow_dataset())
    assert _rows(con.sql("SELECT key, run_id, policy_version, reward FROM lake").to_arrow_table()) == expected
    # the files the table lists, as plain Parquet (no run_id column in them: it is the partition)
    fs = s3fs.S3FileSystem(**opts)
    plain = pq.read_table([u.removeprefix("s3://") for u in dt.file_uris()], filesystem=fs)
    assert sorted(plain.column("key").to_pylist()) == sorted(k for k, *_ in expected)
    # each snapshot is a Delta version: version= reads lakebuffer's snapshot of that run back
    for run, sids in snapshots.items():
        for sid in sids:
            m = lake.manifest(run, sid)
            at = deltalake.DeltaTable(url, version=m["version"], storage_options=dopts).to_pyarrow_table()
            at = at.filter(pc.equal(at.column("run_id"), run))
            assert m["version"] is not None and at.num_rows == sum(f["rows"] for f in m["files"])
            ours_then = pa.Table.from_batches(list(lake.scan_batches(run, ["key"], snapshot_id=sid)))
            assert sorted(at.column("key").to_pylist()) == sorted(ours_then.column("key").to_pylist())
    # (vacuum with no grace period below removes the files of older versions: check them first)

    # the killed snapshot left files on S3 that no commit lists: no reader counts them, gc removes them
    stored = [p for p in fs.find(url.removeprefix("s3://")) if p.endswith(".parquet")]
    orphans = [p for p in stored if "run_id=rc/" in p]
    assert orphans and not any("run_id=rc/" in u for u in dt.file_uris())
    assert Lake(url, opts).gc(older_than_s=0) >= len(orphans)
    assert _rows(deltalake.DeltaTable(url, storage_options=dopts).to_pyarrow_table()) == expected
