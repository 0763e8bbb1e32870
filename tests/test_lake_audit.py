"""Issue 24 item 8: rows a run committed that another Delta writer removed from the lake.

A real ``deltalake.write_deltalake(mode="overwrite")`` from another writer drops some of the run's
committed rows. The buffer's next snapshot notices, uploads again what a local tier still holds,
reports what only the lake held as lost (``stats()["cold"]``), and ``fsck --lake`` reports both.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

import lakebuffer as lb
from lakebuffer.fsck import check as fsck
from tests.rollouts import make_rollouts


def _overwrite_without(lake: str, drop: pa.Array, storage_options: dict | None = None) -> None:
    """Another writer rewrites the whole table without the rows ``drop`` (a plain delta-rs overwrite)."""
    t = DeltaTable(lake, storage_options=storage_options).to_pyarrow_table()
    keep = t.filter(pc.invert(pc.is_in(t.column("key"), value_set=drop)))
    write_deltalake(lake, keep, mode="overwrite", storage_options=storage_options)


def _distinct_keys(lake: str, run: str, storage_options: dict | None = None) -> tuple[int, int]:
    t = DeltaTable(lake, storage_options=storage_options).to_pyarrow_table(columns=["key", "run_id"])
    t = t.filter(pc.equal(t.column("run_id"), run))
    return t.num_rows, len(pc.unique(t.column("key")))


def _fill(buf: lb.ReplayBuffer, batches: int = 4, rows: int = 100) -> pa.Array:
    keys = [buf.push(make_rollouts(rows, version=v, seed=v)) for v in range(batches)]
    buf.snapshot(wait=True)
    return pa.concat_arrays([k if isinstance(k, pa.Array) else pa.array(k) for k in keys])


def test_external_overwrite_is_noticed_reuploaded_and_reported(tmp_path):
    lake, path = str(tmp_path / "lake"), tmp_path / "buf"
    with lb.ReplayBuffer.open(path, lake=lake, run_id="r", snapshot_interval_s=0, memory_limit_mb=64) as buf:
        keys = _fill(buf)
    _overwrite_without(lake, keys.slice(100, 125))  # another writer: 125 of the 400 committed rows gone
    assert _distinct_keys(lake, "r") == (275, 275)

    rep = fsck(path, lake=lake)  # fsck --lake sees it before any snapshot
    assert not rep["ok"] and rep["missing_rows"] == 125
    assert any("125 rows" in p and "125 are still held locally" in p and "Overwrite" in p for p in rep["problems"])

    with lb.ReplayBuffer.open(path, lake=lake, run_id="r", snapshot_interval_s=0, memory_limit_mb=64) as buf:
        buf.push(make_rollouts(10, version=9, seed=9))
        buf.snapshot(wait=True)
        cold = buf.stats()["cold"]
        assert (cold["missing_rows"], cold["reuploaded_rows"], cold["lost_rows"]) == (125, 125, 0)
        assert cold["missing_files"] >= 1 and cold["removed_by"][0]["operation"].startswith("WRITE")
        buf.delete(keys=keys.slice(0, 5).to_pylist())  # our own deletes and compaction are no false alarm
        buf.snapshot(wait=True)
        buf.compact()
        buf.snapshot(wait=True)
        assert buf.stats()["cold"]["missing_rows"] == 125
    assert _distinct_keys(lake, "r") == (405, 405)  # every row once: put back, no duplicates
    from tests.test_lake_fsck import run

    code, out, _ = run("stats", str(path), "--json")  # the CLI says it too
    assert code == 0 and json.loads(out)["cold"]["missing_rows"] == 125
    code, out, _ = run("stats", str(path))
    assert code == 0 and "another" in out and "writer" in out and "125" in out
    assert fsck(path, lake=lake)["ok"]
    with lb.ReplayBuffer.open(tmp_path / "restored", lake=lake, run_id="r", snapshot_interval_s=0, takeover=True) as again:
        assert len(again) == 405


def test_rows_only_the_lake_held_come_back_until_a_vacuum_then_are_reported_lost(tmp_path):
    lake, path = str(tmp_path / "lake"), tmp_path / "buf"
    opts = dict(lake=lake, run_id="r", snapshot_interval_s=0, memory_limit_mb=2, disk_limit_gb=2 / 1024)
    with lb.ReplayBuffer.open(path, **opts) as buf:
        for i in range(36):  # ~7 MiB into a 2 MiB disk budget: most batches leave local disk
            buf.push(make_rollouts(64, tokens=256, version=i % 4, seed=i))
            if i % 4 == 3:
                buf.snapshot(wait=True)
        buf.snapshot(wait=True)
        buf.flush()  # a queued disk relief (past the high watermark) moves batches cold: done before the keys are read
        assert buf.stats()["tiers"]["cold"]["rows"] > 40
        cold_keys = pa.array(buf.sql("SELECT key FROM cold_rows ORDER BY key LIMIT 40").column("key").to_pylist(), pa.string())
        local = "SELECT key FROM (SELECT key FROM hot UNION ALL SELECT key FROM warm) ORDER BY key LIMIT 7"
        local_keys = pa.array(buf.sql(local).column("key").to_pylist(), pa.string())
        assert len(local_keys) == 7
    _overwrite_without(lake, pa.concat_arrays([cold_keys.slice(0, 20), local_keys]))

    rep = fsck(path, lake=lake)
    assert not rep["ok"] and rep["missing_rows"] == 27
    assert sorted(rep["lake_only_missing_keys"]) == cold_keys.slice(0, 20).to_pylist()

    with lb.ReplayBuffer.open(path, **opts) as buf:  # the removed files are still there: every row comes back
        buf.push(make_rollouts(8, version=5, seed=99))
        buf.snapshot(wait=True)
        cold = buf.stats()["cold"]
        assert (cold["missing_rows"], cold["reuploaded_rows"], cold["lost_rows"]) == (27, 27, 0)
    n = _distinct_keys(lake, "r")
    assert n[0] == n[1] == 36 * 64 + 8

    _overwrite_without(lake, cold_keys.slice(20, 20))  # again, and this time a vacuum deletes the old files
    DeltaTable(lake).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with lb.ReplayBuffer.open(path, **opts) as buf:
        buf.push(make_rollouts(8, version=6, seed=98))
        buf.snapshot(wait=True)
        cold = buf.stats()["cold"]
        assert (cold["missing_rows"], cold["reuploaded_rows"], cold["lost_rows"]) == (47, 27, 20)
        assert cold["lost_keys"] == cold_keys.slice(20, 20).to_pylist()
    with lb.ReplayBuffer.open(path, **opts) as buf:  # a reopen remembers, and does not count twice
        buf.push(make_rollouts(8, version=7, seed=97))
        buf.snapshot(wait=True)
        assert (buf.stats()["cold"]["lost_rows"], buf.stats()["cold"]["missing_rows"]) == (20, 47)
        total = len(buf)
    rep = fsck(path, lake=lake)
    assert not rep["ok"] and sorted(rep["lake_only_missing_keys"]) == cold_keys.slice(20, 20).to_pylist()
    rep = fsck(path, lake=lake, repair=True)  # the keys whose rows exist nowhere leave the index
    assert sorted(rep["lost_keys"]) == cold_keys.slice(20, 20).to_pylist()
    assert fsck(path, lake=lake)["ok"]
    with lb.ReplayBuffer.open(path, **opts) as buf:
        assert len(buf) == total - 20
        assert buf.get(buf.sample(len(buf), return_keys=True, seed=1), ["key"]).num_rows == total - 20


def test_external_overwrite_on_s3_is_noticed_and_reuploaded(s3_server, s3_bucket):
    url, so = f"{s3_bucket}/lake", s3_server.storage_options
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        with lb.ReplayBuffer.open(d, lake=url, storage_options=so, run_id="r", snapshot_interval_s=0,
                                  memory_limit_mb=64) as buf:
            keys = _fill(buf, batches=2, rows=50)
            dso = buf.lake.delta_storage_options
            _overwrite_without(url, keys.slice(10, 30), dso)
            buf.snapshot(wait=True)
            cold = buf.stats()["cold"]
            assert (cold["missing_rows"], cold["reuploaded_rows"], cold["lost_rows"]) == (30, 30, 0)
        assert _distinct_keys(url, "r", dso) == (100, 100)
