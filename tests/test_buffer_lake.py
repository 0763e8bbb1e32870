"""The buffer with its cold tier: snapshots, restore, deletes carried, open_lake, outages (real S3 on 127.0.0.1)."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.dataset as pads
import pytest

import lakebuffer as lb
from lakebuffer.fsck import check as fsck
from tests.rollouts import make_rollouts


def _fill(buf, batches=6, rows=64, tokens=256, seed=0):
    keys = []
    for v in range(batches):
        keys += buf.push(make_rollouts(rows, tokens=tokens, version=v, seed=seed + v)).to_pylist()
    return keys


def _contents(buf_or_view, cols=("key", "reward", "policy_version", "response_ids")):
    t = buf_or_view.sql(f"SELECT {', '.join(cols)} FROM rollouts ORDER BY key")
    return t.to_pylist()


@pytest.fixture(params=["local", "s3"])
def lake(request, tmp_path):
    if request.param == "local":
        return {"lake": f"file://{tmp_path / 'lake'}", "storage_options": None}
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    return {"lake": f"{bucket}/lake", "storage_options": server.storage_options}


def test_snapshot_then_restore_into_fresh_dir_equals_source(tmp_path, lake):
    src_dir, dst_dir = tmp_path / "run-a", tmp_path / "restored"
    with lb.ReplayBuffer.open(src_dir, memory_limit_mb=1, snapshot_interval_s=0, run_id="exp1", **lake) as buf:
        keys = _fill(buf)
        buf.flush()
        assert buf.stats()["warm"]["rows"] > 0 and buf.stats()["hot"]["rows"] > 0
        m = buf.snapshot(wait=True)
        assert m is not None and buf.stats()["cold"]["last_snapshot_id"] == m["snapshot_id"]
        assert buf.snapshot(wait=True) is None  # nothing new
        before = _contents(buf)
        cold = buf.sql("SELECT count(*) FROM cold").column(0)[0].as_py()
        assert cold == len(keys)
    with lb.ReplayBuffer.open(dst_dir, memory_limit_mb=1, snapshot_interval_s=0, run_id="exp1", **lake) as buf:
        assert _contents(buf) == before
        more = buf.push(make_rollouts(8, tokens=4)).to_pylist()
        assert not set(more) & set(keys)  # the key sequence continues past restored keys
    assert fsck(dst_dir)["ok"]


def test_deletes_are_carried_into_the_lake(tmp_path, lake):
    with lb.ReplayBuffer.open(tmp_path / "a", memory_limit_mb=1, snapshot_interval_s=0, run_id="r1", **lake) as buf:
        keys = _fill(buf)
        buf.snapshot(wait=True)
        assert buf.delete(keys=keys[:5]) == 5
        buf.delete(where="policy_version = 2")
        buf.snapshot(wait=True)
        live = sorted(buf.sql("SELECT key FROM rollouts").column(0).to_pylist())
        assert sorted(buf.sql("SELECT key FROM cold").column(0).to_pylist()) == live
    with lb.ReplayBuffer.open_lake(lake["lake"], storage_options=lake["storage_options"]) as view:
        assert sorted(view.sql("SELECT key FROM rollouts").column(0).to_pylist()) == live


@pytest.mark.parametrize("lake", ["local", pytest.param("s3", marks=pytest.mark.slow)], indirect=True)  # s3: 12 s
def test_periodic_snapshot_while_pushing_from_another_thread(tmp_path, lake):
    buf = lb.ReplayBuffer.open(tmp_path / "a", memory_limit_mb=2, snapshot_interval_s=0.2, run_id="live", **lake)
    acked: list[str] = []
    stop = time.monotonic() + 2.5

    def producer():
        i = 0
        while time.monotonic() < stop:
            acked.extend(buf.push(make_rollouts(32, tokens=64, version=i % 4, seed=i)).to_pylist())
            i += 1

    th = threading.Thread(target=producer)
    th.start()
    th.join()
    deadline = time.monotonic() + 20
    while buf.stats()["cold"]["last_snapshot_id"] in (None, 1) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert buf.stats()["cold"]["last_snapshot_id"] >= 2  # several periodic snapshots happened
    buf.close()  # a final snapshot on close (periodic snapshots are on)
    with lb.ReplayBuffer.open_lake(lake["lake"], storage_options=lake["storage_options"]) as view:
        got = view.sql("SELECT key FROM rollouts").column(0).to_pylist()
    assert len(got) == len(set(got)) == len(acked)
    assert set(got) == set(acked)


def test_s3_outage_mid_snapshot_fails_clearly_and_is_retried(tmp_path, s3_server, s3_bucket):
    url = f"{s3_bucket}/lake"
    opts = s3_server.storage_options
    buf = lb.ReplayBuffer.open(tmp_path / "a", lake=url, storage_options=opts, memory_limit_mb=2,
                               snapshot_interval_s=0, run_id="out")
    try:
        first = _fill(buf, batches=3)
        buf.snapshot(wait=True)
        second = _fill(buf, batches=3, seed=100)
        with s3_server.outage():
            with pytest.raises(lb.LakeError, match="nothing was committed|cannot reach|failed"):
                buf.snapshot(wait=True)
            assert buf.stats()["cold"]["last_error"]
            more = buf.push(make_rollouts(16, tokens=8)).to_pylist()  # pushes keep working while S3 is down
        with lb.ReplayBuffer.open_lake(url, storage_options=opts) as view:  # still the first snapshot only
            assert sorted(view.sql("SELECT key FROM rollouts").column(0).to_pylist()) == sorted(first)
        m = buf.snapshot(wait=True)  # the retry carries everything that was pending
        assert m is not None and buf.stats()["cold"]["last_error"] is None
        with lb.ReplayBuffer.open_lake(url, storage_options=opts) as view:
            got = view.sql("SELECT key FROM rollouts").column(0).to_pylist()
        assert sorted(got) == sorted(first + second + more)
    finally:
        s3_server.start()
        buf.close()


def test_missing_bucket_is_a_clear_error(tmp_path, s3_server):
    with pytest.raises(lb.LakeError, match="does not exist"):
        lb.ReplayBuffer.open(tmp_path / "a", lake="s3://no-such-bucket-xyz/lake",
                             storage_options=s3_server.storage_options, snapshot_interval_s=0)
    # and the directory is not left locked
    with lb.ReplayBuffer.open(tmp_path / "a", snapshot_interval_s=0) as buf:
        assert len(buf) == 0


def test_compaction_through_the_buffer_keeps_content(tmp_path, lake):
    with lb.ReplayBuffer.open(tmp_path / "a", memory_limit_mb=1, snapshot_interval_s=0, run_id="c", **lake) as buf:
        for i in range(4):
            _fill(buf, batches=2, seed=10 * i)
            buf.snapshot(wait=True)
        before = _contents(buf)
        files_before = buf.stats()["cold"]["files"]
        res = buf.compact()
        assert buf.stats()["cold"]["files"] < files_before, res
        assert sorted(buf.sql("SELECT key FROM cold").column(0).to_pylist()) == [r["key"] for r in before]
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=1, snapshot_interval_s=0, run_id="c", **lake) as buf:
        assert _contents(buf) == before


def test_open_lake_across_three_runs_and_cross_run_sampling(tmp_path, lake):
    all_keys = {}
    for r in ("run-a", "run-b", "current"):
        with lb.ReplayBuffer.open(tmp_path / r, memory_limit_mb=1, snapshot_interval_s=0, run_id=r, **lake) as buf:
            all_keys[r] = _fill(buf, batches=3, seed=hash(r) % 1000)
            buf.snapshot(wait=True)
    with lb.ReplayBuffer.open_lake(lake["lake"], storage_options=lake["storage_options"]) as view:
        assert sorted(view.runs) == ["current", "run-a", "run-b"]
        rows = view.sql("SELECT run_id, count(*) AS n FROM rollouts GROUP BY 1").to_pylist()
        per_run = {d["run_id"]: d["n"] for d in rows}
        assert per_run == {r: len(k) for r, k in all_keys.items()}
        s = view.sample(20, where="run_id <> 'current' AND verified", columns=["key", "run_id", "verified"], seed=1)
        assert s.num_rows == 20 and set(s.column("run_id").to_pylist()) <= {"run-a", "run-b"}
        assert all(s.column("verified").to_pylist())
        got = view.get(all_keys["run-b"][:3], ["key", "response_ids"])
        assert got.column("key").to_pylist() == all_keys["run-b"][:3]
        assert sum(rb.num_rows for rb in view.scan(where="run_id = 'run-a'", columns=["key"])) == len(all_keys["run-a"])
        with pytest.raises(lb.ReadOnlyError):
            view.push(make_rollouts(1))
    # a new run samples from older runs' rollouts
    with lb.ReplayBuffer.open(tmp_path / "current", memory_limit_mb=1, snapshot_interval_s=0, run_id="current", **lake) as buf:
        old = buf.sql("SELECT count(*) FROM lake WHERE run_id <> 'current'").column(0)[0].as_py()
        assert old == len(all_keys["run-a"]) + len(all_keys["run-b"])


def test_lake_is_plain_parquet_readable_without_lakebuffer(tmp_path):
    lake_dir = tmp_path / "lake"
    with lb.ReplayBuffer.open(tmp_path / "a", lake=str(lake_dir), memory_limit_mb=1, snapshot_interval_s=0, run_id="x") as buf:
        keys = _fill(buf)
        buf.snapshot(wait=True)
    d = pads.dataset(str(lake_dir), format="parquet", partitioning="hive", exclude_invalid_files=True)
    t = d.to_table(columns=["key", "run_id", "policy_bucket"])
    assert sorted(t.column("key").to_pylist()) == sorted(keys)
    assert set(t.column("run_id").to_pylist()) == {"x"}
    import polars as pl

    df = pl.scan_parquet(str(lake_dir / "**/*.parquet"), hive_partitioning=True).select("key").collect()
    assert sorted(df["key"].to_list()) == sorted(keys)


def test_default_lake_is_embedded_under_the_dir(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "a", memory_limit_mb=1, snapshot_interval_s=0) as buf:
        _fill(buf, batches=2)
        buf.snapshot(wait=True)
        assert buf.lake_url == str(tmp_path / "a" / "lake")
    assert list((tmp_path / "a" / "lake").rglob("*.parquet"))
    assert isinstance(pa.array([1]), pa.Array)


def test_buffer_and_lake_view_are_rollout_readers_with_the_same_count(tmp_path):
    from lakebuffer.readers import RolloutReader

    lake = {"lake": f"file://{tmp_path / 'lake'}"}
    with lb.ReplayBuffer.open(tmp_path / "a", memory_limit_mb=1, snapshot_interval_s=0, run_id="rd", **lake) as buf:
        _fill(buf, batches=3)
        buf.snapshot(wait=True)
        assert isinstance(buf, RolloutReader)
        n, n_v1 = buf.count(), buf.count("policy_version = 1")
        assert (n, n_v1) == (len(buf), 64) and n == 192
        with lb.ReplayBuffer.open_lake(lake["lake"]) as view:
            assert isinstance(view, RolloutReader)
            assert (view.count(), view.count("policy_version = 1")) == (n, n_v1) and len(view) == n
