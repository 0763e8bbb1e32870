"""The cold tier (lakebuffer.lake.Lake) on a local directory and on a real S3 HTTP server (moto)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import time
from dataclasses import dataclass

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import s3fs
from fsspec.implementations.local import LocalFileSystem

from lakebuffer.errors import CorruptionError, LakeError, LockedError, ReadOnlyError
from lakebuffer.lake import Lake
from lakebuffer.schema import ROLLOUT_SCHEMA
from tests.test_predicate import PARTITION_HINT_CASES, UNHINTED_WHERES

COLS = ROLLOUT_SCHEMA.names
T0 = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def rollouts(n: int, *, run: str = "run-a", versions=(0, 1, 2), seed: int = 0, tokens: int = 16, tag: str = "") -> pa.Table:
    """``n`` rollouts conforming to ROLLOUT_SCHEMA, with unique keys and policy versions cycling over ``versions``."""
    rng = np.random.default_rng(seed)
    tok = np.full(n, tokens) + rng.integers(0, 4, n)
    offsets = pa.array(np.concatenate([[0], np.cumsum(tok)]).astype(np.int32))
    total = int(tok.sum())

    def ints(hi):
        return pa.ListArray.from_arrays(offsets, pa.array(rng.integers(0, hi, total, dtype=np.int32)))

    versions = np.asarray(versions, dtype=np.int64)
    cols = {
        "key": [f"{run}-{seed}{tag}-{i:05d}" for i in range(n)],
        "run_id": [run] * n,
        "prompt_id": [f"p{seed}-{i // 4}" for i in range(n)],
        "group_id": [f"g{seed}-{i // 4}" for i in range(n)],
        "episode_id": [f"e{i // 8}" if i % 3 else None for i in range(n)],
        "agent_id": [f"a{i % 2}" for i in range(n)],
        "team_id": [f"t{i % 3}" for i in range(n)],
        "step": pa.array(np.arange(n) % 8, pa.int64()),
        "policy_version": pa.array(versions[np.arange(n) % len(versions)]),
        "prompt_ids": ints(1000),
        "response_ids": ints(32000),
        "response_logprobs": pa.ListArray.from_arrays(offsets, pa.array(-rng.random(total, dtype=np.float32))),
        "reward": pa.array(rng.random(n, dtype=np.float32)),
        "advantage": pa.array([float(x) if i % 5 else None for i, x in enumerate(rng.standard_normal(n))], pa.float32()),
        "verified": pa.array([bool(x > 0.5) if i % 7 else None for i, x in enumerate(rng.random(n))]),
        "created_at": pa.array([T0 + dt.timedelta(seconds=i) for i in range(n)], pa.timestamp("us", tz="UTC")),
        "sample_count": pa.array(np.zeros(n, dtype=np.int32)),
    }
    return pa.table(cols, schema=ROLLOUT_SCHEMA)


def canon(table: pa.Table) -> pa.Table:
    """Rollout columns only, sorted by key, for content comparison."""
    return table.select(COLS).sort_by("key")


def same(actual: pa.Table, expected: pa.Table) -> None:
    a, e = canon(actual), canon(expected)
    assert a.num_rows == e.num_rows
    for name in COLS:
        got, exp = a.column(name).combine_chunks(), e.column(name).combine_chunks()
        if got.type != exp.type:  # other readers' type mapping: large_string, tz=Etc/UTC, ...
            if pa.types.is_timestamp(got.type):
                assert got.type.unit == exp.type.unit and got.type.tz in ("UTC", "Etc/UTC")
            got = got.cast(exp.type)
        assert got.equals(exp), name


def without(table: pa.Table, keys) -> pa.Table:
    return table.filter(pc.invert(pc.is_in(table.column("key"), pa.array(list(keys), pa.string()))))


def restored(lake: Lake, run: str, **kw) -> pa.Table:
    return pa.Table.from_batches(list(lake.scan_batches(run, **kw)))


class _Counting:
    """fsspec mixin recording every file opened for reading."""

    def _open(self, path, mode="rb", *args, **kwargs):
        if "r" in mode:
            self.opened.add(self._strip_protocol(path))
        return super()._open(path, mode, *args, **kwargs)


class CountingLocal(_Counting, LocalFileSystem):
    cachable = False

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.opened = set()


class CountingS3(_Counting, s3fs.S3FileSystem):
    cachable = False

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.opened = set()


#: these tests check files and pruning per policy version: one version per partition (the default is 16)
PER_VERSION = 1


@dataclass
class Where:
    kind: str
    url: str
    storage_options: dict | None
    server: object | None = None

    def lake(self, **kw) -> Lake:
        return Lake(self.url, self.storage_options, **{"policy_bucket_size": PER_VERSION, **kw})

    def counting_lake(self, **kw) -> Lake:
        fs = CountingLocal() if self.kind == "local" else CountingS3(**self.storage_options)
        return Lake(self.url, filesystem=fs, **{"policy_bucket_size": PER_VERSION, **kw})


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path) -> Where:
    if request.param == "local":
        return Where("local", str(tmp_path / "lake"), None)
    server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    return Where("s3", f"{bucket}/lake", server.storage_options, server)


def file_bytes(lake: Lake, rel: str) -> bytes:
    return lake.fs.cat_file(lake.store.abs(rel))


# --------------------------------------------------------------------------------------------
# commit, read back, snapshots
# --------------------------------------------------------------------------------------------


def test_commit_and_read_back_equals_input(where):
    lake = where.lake(encode_threads=2, row_group_rows=40)  # two encoder lanes (files) per partition
    t = rollouts(300, versions=(0, 1, 2, 5))
    # a Table, a single mixed-version batch and a list of batches in one snapshot
    parts = [t.slice(0, 100), t.slice(100, 50).to_batches()[0], *t.slice(150).to_batches(max_chunksize=40)]
    m = lake.commit_snapshot("run-a", parts, meta={"note": "first"})

    assert m["snapshot_id"] == 1 and m["parent_id"] is None and m["meta"] == {"note": "first"}
    assert sum(f["rows"] for f in m["files"]) == 300
    assert sorted({f["policy_bucket"] for f in m["files"]}) == [0, 1, 2, 5] and len(m["files"]) == 8
    for f in m["files"]:  # layout and checksums computed while streaming match the stored bytes
        assert f["path"].startswith(f"run_id=run-a/policy_bucket={f['policy_bucket']}/part-00000001-")
        data = file_bytes(lake, f["path"])
        assert len(data) == f["bytes"] and hashlib.sha256(data).hexdigest() == f["sha256"]
    assert lake.latest_manifest("run-a") == m
    assert lake.runs() == ["run-a"]

    same(lake.dataset().to_table(), t)
    same(restored(lake, "run-a"), t)
    con = duckdb.connect()
    lake.register(con)
    same(con.sql("SELECT * FROM cold").to_arrow_table(), t)
    # a fresh Lake object (a new process) sees the same committed state
    same(where.lake(read_only=True).dataset("run-a").to_table(), t)
    # files carry no run_id column: it comes from the path
    first = ds.dataset(lake.files()[0], format="parquet", filesystem=None if where.kind == "local" else lake.fs)
    assert "run_id" not in first.schema.names


def test_scan_batches_columns_and_streaming(where):
    # ranged reads: row groups decoded as they arrive, pages verified by their Parquet checksums
    lake = where.lake(row_group_rows=64, read_ahead_bytes=16384, ranged_reads=True)
    t = rollouts(500, versions=(3,))
    lake.commit_snapshot("run-a", t.to_batches(max_chunksize=16))
    batches = list(lake.scan_batches("run-a", columns=["key", "run_id", "reward", "policy_bucket"]))
    assert len(batches) == 8  # one batch per row group of 64 rows, not one big table
    got = pa.Table.from_batches(batches)
    assert got.column_names == ["key", "run_id", "reward", "policy_bucket"]
    assert set(got.column("run_id").to_pylist()) == {"run-a"} and set(got.column("policy_bucket").to_pylist()) == {3}
    exp = t.select(["key", "reward"]).sort_by("key")
    assert got.select(["key", "reward"]).sort_by("key").equals(exp)
    assert list(lake.scan_batches("no-such-run")) == []
    # whole-file reads (the default): a read-ahead window smaller than a file
    lake.ranged_reads = False
    same(restored(lake, "run-a"), t)


def test_snapshots_accumulate_and_time_travel(where):
    lake = where.lake()
    tables = [rollouts(80, seed=s, versions=(s, s + 1)) for s in range(3)]
    ids = [lake.commit_snapshot("run-a", [t])["snapshot_id"] for t in tables]
    assert ids == [1, 2, 3]
    m3 = lake.latest_manifest("run-a")
    assert m3["parent_id"] == 2 and len(m3["files"]) == 6
    assert lake.snapshots("run-a") == [1, 2, 3]
    same(lake.dataset().to_table(), pa.concat_tables(tables))
    same(restored(lake, "run-a"), pa.concat_tables(tables))
    # a reader pinned to an older snapshot
    same(lake.dataset("run-a", snapshot_id=1).to_table(), tables[0])
    same(restored(lake, "run-a", snapshot_id=2), pa.concat_tables(tables[:2]))
    assert lake.stats()["rows"] == 240 and lake.stats()["last_snapshot_id"] == {"run-a": 3}
    # an empty snapshot is skipped; force commits one (e.g. to record meta)
    assert lake.commit_snapshot("run-a", []) is None
    assert lake.commit_snapshot("run-a", [rollouts(0)]) is None
    m4 = lake.commit_snapshot("run-a", [], meta={"watermark": 7}, force=True)
    assert m4["snapshot_id"] == 4 and m4["meta"] == {"watermark": 7} and m4["files"] == m3["files"]


def test_deletes_rewrite_the_files_that_held_the_keys(where):
    lake = where.lake()
    t1 = rollouts(100, seed=1)
    first = lake.commit_snapshot("run-a", [t1])
    gone = t1.column("key").to_pylist()[:10]
    t2 = rollouts(50, seed=2)
    m = lake.commit_snapshot("run-a", [t2], deleted_keys=gone)
    # copy-on-write in the same commit: the files that held the keys are replaced
    assert m["summary"]["deleted_rows"] == 10 and m["summary"]["removed_files"] == 3  # one per bucket
    assert len(lake.deleted_keys("run-a")) == 0 and m["version"] == first["version"] + 1
    live = pa.concat_tables([without(t1, gone), t2])
    # any reader of the listed files sees exactly the live rows (no tombstones to apply)
    paths = [lake.store.abs(f["path"]) for f in lake.latest_manifest("run-a")["files"]]
    plain = pq.read_table(paths, filesystem=lake.store.pafs)
    assert sorted(plain.column("key").to_pylist()) == sorted(live.column("key").to_pylist())
    same(lake.dataset().to_table(), live)
    same(restored(lake, "run-a"), live)
    con = duckdb.connect()
    lake.register(con)
    assert con.sql("SELECT count(*) FROM cold").fetchall()[0][0] == 140
    assert con.sql(f"SELECT count(*) FROM cold WHERE key IN ({', '.join(repr(k) for k in gone)})").fetchall()[0][0] == 0

    # a deletes-only snapshot
    more = t2.column("key").to_pylist()[:5]
    m = lake.commit_snapshot("run-a", [], deleted_keys=pa.array(more))
    assert m["snapshot_id"] == 3 and m["summary"]["deleted_rows"] == 5 and lake.stats()["rows"] == 135
    live = without(live, more)
    same(lake.dataset().to_table(), live)

    # a deleted key pushed again in a later snapshot is visible once, as the new row
    again = t1.slice(0, 1).set_column(COLS.index("reward"), ROLLOUT_SCHEMA.field("reward"), pa.array([42.0], pa.float32()))
    m = lake.commit_snapshot("run-a", [again])
    assert m["summary"]["added_rows"] == 1
    live = pa.concat_tables([live, again])
    got = lake.dataset().to_table()
    same(got, live)
    assert got.filter(pc.equal(got.column("key"), gone[0])).column("reward").to_pylist() == [42.0]
    same(restored(lake, "run-a"), live)
    # deleting and re-adding a key in the same snapshot keeps the new row only
    swap = t2.slice(10, 1).set_column(COLS.index("reward"), ROLLOUT_SCHEMA.field("reward"), pa.array([-1.0], pa.float32()))
    lake.commit_snapshot("run-a", [swap], deleted_keys=[swap.column("key")[0].as_py()])
    live = pa.concat_tables([without(live, [swap.column("key")[0].as_py()]), swap])
    same(lake.dataset().to_table(), live)
    same(restored(lake, "run-a"), live)


def test_three_runs_in_one_lake(where):
    lake = where.lake()
    tables = {r: rollouts(60 + 10 * i, run=r, seed=i, versions=(i, i + 1)) for i, r in enumerate(["b-run", "a-run", "c run/x"])}
    for r, t in tables.items():
        lake.commit_snapshot(r, [t])
    assert lake.runs() == sorted(tables)
    everything = lake.dataset().to_table()
    same(everything, pa.concat_tables(tables.values()))
    counts = dict(zip(*[c.to_pylist() for c in everything.group_by("run_id").aggregate([("key", "count")]).columns]))
    assert counts == {r: t.num_rows for r, t in tables.items()}
    for r, t in tables.items():
        same(lake.dataset(r).to_table(), t)
        same(restored(lake, r), t)
    con = duckdb.connect()
    lake.register(con, view="lake_all")
    assert con.sql("SELECT count(DISTINCT run_id) FROM lake_all").fetchall()[0][0] == 3
    assert con.sql("SELECT count(*) FROM lake_all WHERE run_id = 'c run/x'").fetchall()[0][0] == 80
    lake.register(con, view="only_a", run_id="a-run")
    assert con.sql("SELECT DISTINCT run_id FROM only_a").fetchall() == [("a-run",)]


# --------------------------------------------------------------------------------------------
# failures and concurrency
# --------------------------------------------------------------------------------------------


def quick_failing_s3(server, **kw) -> s3fs.S3FileSystem:
    """An s3fs instance that gives up at once when the server is down (the defaults retry for seconds)."""
    opts = server.storage_options
    opts["config_kwargs"]["retries"] = {"max_attempts": 1}
    fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **opts, **kw)
    fs.retries = 1
    return fs


def _committed_state(lake: Lake, run: str):
    return lake.snapshots(run), canon(lake.dataset(run).to_table())


def _parquet_on_s3(fs, bucket_url: str) -> set[str]:
    return {p for p in fs.find(f"{bucket_url[5:]}/lake") if p.endswith(".parquet")}


def test_s3_outage_mid_snapshot_leaves_committed_state_and_retry_succeeds(s3_server, s3_bucket):
    fs = quick_failing_s3(s3_server)
    lake = Lake(f"{s3_bucket}/lake", s3_server.storage_options, filesystem=fs, row_group_rows=50, target_file_bytes=256 * 1024)
    t1 = rollouts(200, seed=1)
    lake.commit_snapshot("run-a", [t1])
    before = _committed_state(lake, "run-a")
    stored = _parquet_on_s3(fs, s3_bucket)
    t2 = rollouts(600, seed=2, versions=(0,), tokens=2000)  # ~14 MB: several files

    def batches_then_outage():
        yield t2.slice(0, 400)
        deadline = time.monotonic() + 10  # wait until a file of the snapshot is really on S3
        while not _parquet_on_s3(fs, s3_bucket) - stored:
            assert time.monotonic() < deadline, "no data file uploaded"
            time.sleep(0.02)
        s3_server.stop()  # S3 goes away mid-snapshot
        yield t2.slice(400)

    try:
        with pytest.raises(LakeError, match="nothing was committed"):
            lake.commit_snapshot("run-a", batches_then_outage())
        with pytest.raises(LakeError):  # reads fail clearly while it is down
            lake.latest_manifest("run-a")
    finally:
        s3_server.start()
    # the previously committed state is readable and unchanged, also for a fresh reader
    assert _committed_state(lake, "run-a") == before
    assert _committed_state(Lake(f"{s3_bucket}/lake", s3_server.storage_options, read_only=True), "run-a") == before
    # the uploaded files of the failed snapshot (their removal failed too: S3 was down) are in no
    # commit: invisible to every Delta reader, and vacuumed by gc once older than its grace period
    orphans = _parquet_on_s3(fs, s3_bucket) - stored
    assert orphans
    assert lake.gc(older_than_s=3600) == 0
    assert lake.gc(older_than_s=0) == len(orphans)
    assert _parquet_on_s3(fs, s3_bucket) == stored
    assert _committed_state(lake, "run-a") == before
    # the retry succeeds and contains both snapshots
    m = lake.commit_snapshot("run-a", [t2])
    assert m["snapshot_id"] == 2
    same(lake.dataset().to_table(), pa.concat_tables([t1, t2]))
    same(restored(lake, "run-a"), pa.concat_tables([t1, t2]))
    lake.verify()


def test_gc_aborts_stale_multipart_uploads_of_data_files(s3_server, s3_bucket):
    lake = Lake(f"{s3_bucket}/lake", s3_server.storage_options)
    lake.commit_snapshot("run-a", [rollouts(20, seed=1)])
    bucket, s3 = s3_bucket[5:], s3_server.client()
    stale = int(time.time()) - 7200
    ours = f"lake/run_id=run-a/policy_bucket=0/part-00000002-0000-{stale}-0a1b2c3d.parquet"
    s3.create_multipart_upload(Bucket=bucket, Key=ours)  # a crashed writer's upload
    s3.create_multipart_upload(Bucket=bucket, Key="lake/not-ours.bin")
    assert lake.gc(older_than_s=3 * 3600) == 0
    assert lake.gc(older_than_s=3600) == 1
    assert [u["Key"] for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])] == ["lake/not-ours.bin"]


def test_s3_outage_at_the_delta_commit_leaves_only_invisible_orphans(s3_server, s3_bucket, monkeypatch):
    fs = quick_failing_s3(s3_server)
    lake = Lake(f"{s3_bucket}/lake", s3_server.storage_options, filesystem=fs, policy_bucket_size=PER_VERSION)
    t1 = rollouts(100, seed=1)
    lake.commit_snapshot("run-a", [t1])
    before = _committed_state(lake, "run-a")
    commit = lake.delta.commit

    def outage_then_commit(*a, **kw):
        s3_server.stop()  # data files (new and rewritten) are uploaded, the Delta commit fails
        return commit(*a, **kw)

    monkeypatch.setattr(lake.delta, "commit", outage_then_commit)
    try:
        with pytest.raises(LakeError, match="committing to the Delta table"):
            lake.commit_snapshot("run-a", [rollouts(100, seed=2)], deleted_keys=["run-a-1-00000"])
    finally:
        s3_server.start()
    monkeypatch.undo()
    assert _committed_state(lake, "run-a") == before
    on_s3 = _parquet_on_s3(fs, s3_bucket)
    committed = {lake.store.abs(f["path"]) for f in lake.latest_manifest("run-a")["files"]}
    assert len(on_s3 - committed) == 3 + 1  # appended + rewritten: uploaded, uncommitted, invisible
    assert lake.gc(older_than_s=3600) == 0
    assert lake.gc(older_than_s=0) == 4
    assert _parquet_on_s3(fs, s3_bucket) == committed
    assert _committed_state(lake, "run-a") == before


class FailingLocal(LocalFileSystem):
    """Local filesystem whose writes of data files start failing after ``budget`` bytes."""

    cachable = False

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.budget = None

    def _open(self, path, mode="rb", *args, **kwargs):
        f = super()._open(path, mode, *args, **kwargs)
        if "w" in mode and self.budget is not None and path.endswith(".parquet"):
            fs, inner = self, f.write

            def write(data):
                fs.budget -= len(data)
                if fs.budget < 0:
                    raise OSError("simulated I/O error mid-upload")
                return inner(data)

            f.write = write
        return f


def test_failed_upload_local_leaves_no_visible_files_and_gc_cleans(tmp_path):
    fs = FailingLocal()
    url = str(tmp_path / "lake")
    lake = Lake(url, filesystem=fs, row_group_rows=20, target_file_bytes=4096)
    t1 = rollouts(100, seed=1)
    lake.commit_snapshot("run-a", [t1])
    before = _committed_state(lake, "run-a")
    fs.budget = 3000
    with pytest.raises(LakeError, match="simulated I/O error"):
        lake.commit_snapshot("run-a", [rollouts(400, seed=2)], deleted_keys=["run-a-1-00000"])
    assert _committed_state(lake, "run-a") == before
    assert lake.deleted_keys().to_pylist() == []
    # a generator that fails is the caller's error, raised as is; nothing is committed either
    def bad():
        yield rollouts(10, seed=3)
        raise RuntimeError("producer died")

    fs.budget = None
    with pytest.raises(RuntimeError, match="producer died"):
        lake.commit_snapshot("run-a", bad())
    assert _committed_state(lake, "run-a") == before
    # an orphan left by a crash (simulated: a file that no commit lists) is invisible and vacuumed
    orphan = tmp_path / "lake" / "run_id=run-a" / "policy_bucket=0" / "part-00000002-0000-deadbeef.parquet"
    orphan.write_bytes(file_bytes(lake, lake.latest_manifest("run-a")["files"][0]["path"]))
    assert _committed_state(lake, "run-a") == before
    assert lake.gc(older_than_s=3600) == 0  # too young: may be an upload in progress
    old = 1_000_000_000
    os.utime(orphan, (old, old))
    assert lake.gc(older_than_s=3600) == 1 and not orphan.exists()
    lake.commit_snapshot("run-a", [rollouts(40, seed=4)])
    same(lake.dataset().to_table(), pa.concat_tables([t1, rollouts(40, seed=4)]))


def test_concurrent_commits_of_two_runs_both_land_and_one_run_has_one_writer(where):
    a, b = where.lake(), where.lake()
    t1, t2, t3 = rollouts(50, seed=1), rollouts(60, seed=2), rollouts(70, run="run-b", seed=3)
    a.commit_snapshot("run-a", [t1])

    def slow():
        yield t2
        # another writer commits a snapshot of another run while this one is still uploading
        assert b.commit_snapshot("run-b", [t3])["snapshot_id"] == 1

    m = a.commit_snapshot("run-a", slow())  # delta-rs rebases the append on the other commit
    assert m["snapshot_id"] == 2 and m["parent_id"] == 1 and m["version"] == 2
    same(a.dataset("run-a").to_table(), pa.concat_tables([t1, t2]))
    same(a.dataset("run-b").to_table(), t3)

    def racing():
        yield rollouts(10, seed=4)
        b.commit_snapshot("run-a", [rollouts(10, seed=5)])  # a second writer of run-a takes snapshot 3

    with pytest.raises(LockedError, match="another writer"):
        a.commit_snapshot("run-a", racing())
    assert a.snapshots("run-a") == [1, 2, 3] and a.dataset("run-a").count_rows() == 50 + 60 + 10


def test_read_only_and_missing_bucket(s3_server, tmp_path):
    ro = Lake(str(tmp_path / "nothing"), read_only=True)
    assert ro.runs() == [] and ro.files() == [] and ro.latest_manifest("x") is None
    with pytest.raises(ReadOnlyError):
        ro.commit_snapshot("x", [rollouts(3)])
    with pytest.raises(ReadOnlyError):
        ro.compact()
    with pytest.raises(LakeError, match="does not exist"):
        Lake("s3://no-such-bucket-lakebuffer/lake", s3_server.storage_options)
    s3_server.stop()
    try:
        with pytest.raises(LakeError, match="cannot reach"):
            Lake("s3://whatever/lake", filesystem=quick_failing_s3(s3_server))
    finally:
        s3_server.start()


def test_policy_bucket_size_is_fixed_per_lake(tmp_path):
    url = str(tmp_path / "lake")
    lake = Lake(url, policy_bucket_size=10)
    m = lake.commit_snapshot("run-a", [rollouts(60, versions=(3, 9, 10, 25))])
    assert sorted({f["policy_bucket"] for f in m["files"]}) == [0, 1, 2]
    assert Lake(url).policy_bucket_size == 10
    with pytest.raises(LakeError, match="policy_bucket_size=10"):
        Lake(url, policy_bucket_size=5)
    got = lake.dataset().to_table(filter=ds.field("policy_version") == 25)
    assert got.num_rows == 15 and set(got.column("policy_bucket").to_pylist()) == {2}



def test_a_new_lake_partitions_by_16_policy_versions_and_an_old_one_keeps_its_own(tmp_path):
    """The default bucket is 16 versions (a partition per version made a small file per version; #23);
    a lake created with another size (older lakes: 1) keeps it when opened without one."""
    fresh = Lake(str(tmp_path / "new"))
    m = fresh.commit_snapshot("run-a", [rollouts(60, versions=(0, 15, 16, 40))])
    assert sorted({f["policy_bucket"] for f in m["files"]}) == [0, 1, 2]
    assert Lake(str(tmp_path / "new")).policy_bucket_size == 16
    old = Lake(str(tmp_path / "old"), policy_bucket_size=1)
    old.commit_snapshot("run-a", [rollouts(60, versions=(0, 15, 16, 40))])
    reopened = Lake(str(tmp_path / "old"))
    assert reopened.policy_bucket_size == 1
    m = reopened.commit_snapshot("run-a", [rollouts(30, run="run-a", seed=7, versions=(41, 42))])
    assert sorted({f["policy_bucket"] for f in m["files"]}) == [0, 15, 16, 40, 41, 42]  # every file of the run

# --------------------------------------------------------------------------------------------
# compaction and gc
# --------------------------------------------------------------------------------------------


def test_compaction_keeps_content_and_pinned_readers(where):
    lake = where.lake()
    tables = [rollouts(120, seed=s, versions=(0, 1)) for s in range(5)]
    for i, t in enumerate(tables):
        gone = [tables[0].column("key")[i].as_py()] if i else []
        lake.commit_snapshot("run-a", [t], deleted_keys=gone)
    gone = tables[0].column("key").to_pylist()[1:5]
    expected = without(pa.concat_tables(tables), gone)
    old_manifest = lake.latest_manifest("run-a")
    old_dataset = lake.dataset("run-a")
    assert len(old_manifest["files"]) == 10 and old_manifest["delete_files"] == []  # deletes rewrote files
    version = lake.stats()["version"]

    calls = []
    stats = lake.compact(target_file_bytes=64 * 2**20, progress=lambda d, t: calls.append((d, t)))
    assert stats["files_before"] == 10 and stats["files_after"] == 2  # one file per policy bucket
    assert stats["rows_before"] == 596 and stats["rows_after"] == 596 and stats["delete_files_applied"] == 0
    assert calls[-1][0] == calls[-1][1] > 0 and all(d <= t for d, t in calls)
    new = lake.latest_manifest("run-a")
    # one Delta version with dataChange=false actions, no new snapshot of the run
    assert lake.stats()["version"] == version + 1 and new["snapshot_id"] == old_manifest["snapshot_id"]
    assert json.loads(lake.table().history(1)[0]["lakebuffer"])["operation"] == "compact"
    log = (lake.fs.cat_file(lake.store.abs(f"_delta_log/{version + 1:020d}.json")).decode().splitlines())
    actions = [json.loads(line) for line in log]
    assert {a["add"]["dataChange"] for a in actions if "add" in a} == {False}
    assert {a["remove"]["dataChange"] for a in actions if "remove" in a} == {False}
    assert not {f["path"] for f in new["files"]} & {f["path"] for f in old_manifest["files"]}
    assert lake.deleted_keys("run-a").to_pylist() == []
    same(lake.dataset().to_table(), expected)
    same(restored(lake, "run-a"), expected)
    lake.verify()
    # a reader that opened the lake before compaction still reads its snapshot, consistently
    same(old_dataset.to_table(), expected)
    same(lake.dataset("run-a", snapshot_id=old_manifest["snapshot_id"]).to_table(), expected)
    # gc keeps the replaced files during the grace period, then removes them
    assert lake.gc(older_than_s=3600) == 0
    same(old_dataset.to_table(), expected)
    removed = lake.gc(older_than_s=0)
    assert removed == 10 + 4  # the compacted files, and the files the 4 deletes replaced
    assert lake.snapshots("run-a") == [1, 2, 3, 4, 5]  # the log keeps every snapshot
    same(lake.dataset().to_table(), expected)
    with pytest.raises(Exception):  # noqa: B017 - its files are gone now
        old_dataset.to_table()
    # compacting again changes nothing
    again = lake.compact(target_file_bytes=64 * 2**20)
    assert again["files_rewritten"] == 0 and lake.latest_manifest("run-a")["snapshot_id"] == new["snapshot_id"]


def test_compaction_target_size_and_concurrent_snapshot(where):
    lake = where.lake(row_group_rows=100)
    tables = [rollouts(400, seed=s, versions=(7,), tokens=200) for s in range(4)]
    for t in tables:
        lake.commit_snapshot("run-a", [t])
    size = sum(f["bytes"] for f in lake.latest_manifest("run-a")["files"])
    late = rollouts(30, seed=9, versions=(7, 8))
    committed = []

    def progress(done, total):
        if done and not committed:  # a snapshot (append only) lands while compaction is running
            committed.append(lake.commit_snapshot("run-a", [late]))

    stats = lake.compact(target_file_bytes=size // 2, progress=progress)
    assert committed and stats["files_rewritten"] == 4
    assert 2 <= stats["files_written"] <= 3
    m = lake.latest_manifest("run-a")
    assert m["snapshot_id"] == committed[0]["snapshot_id"]
    # the concurrent snapshot's files survive the compaction commit (delta-rs rebased it)
    late_files = {f["path"] for f in committed[0]["files"] if f["snapshot_id"] == committed[0]["snapshot_id"]}
    assert len(late_files) == 2 and late_files <= {f["path"] for f in m["files"]}
    expected = pa.concat_tables([*tables, late])
    same(lake.dataset().to_table(), expected)
    same(restored(lake, "run-a"), expected)


def test_compaction_racing_a_delete_of_its_files_commits_nothing(tmp_path):
    lake = Lake(str(tmp_path / "lake"), row_group_rows=100)
    tables = [rollouts(100, seed=s, versions=(7,)) for s in range(3)]
    for t in tables:
        lake.commit_snapshot("run-a", [t])
    gone = [tables[1].column("key")[0].as_py()]
    raced = []

    def progress(done, total):
        if done and not raced:  # a delete rewrites a file the compaction is rewriting too
            raced.append(lake.commit_snapshot("run-a", [], deleted_keys=gone))

    before = lake.stats()["version"]
    with pytest.raises(LakeError, match="conflicts with a concurrent commit"):
        lake.compact(target_file_bytes=64 * 2**20, progress=progress)
    assert lake.stats()["version"] == before + 1  # the delete only
    expected = without(pa.concat_tables(tables), gone)
    same(lake.dataset().to_table(), expected)
    assert lake.compact(target_file_bytes=64 * 2**20)["files_rewritten"] == 3  # run again: it lands
    same(lake.dataset().to_table(), expected)
    same(restored(lake, "run-a"), expected)


# --------------------------------------------------------------------------------------------
# partition pruning
# --------------------------------------------------------------------------------------------


def _files_of(lake: Lake, pred) -> set[str]:
    return {lake.store.abs(f["path"]) for r in lake.runs() for f in lake.latest_manifest(r)["files"] if pred(r, f)}


def test_partition_pruning_opens_only_matching_files(where):
    lake = where.counting_lake()
    for i, r in enumerate(["run-a", "run-b"]):
        lake.commit_snapshot(r, [rollouts(120, run=r, seed=i, versions=(0, 1, 2, 3, 4, 5))])
    lake.commit_snapshot("run-a", [rollouts(30, run="run-a", seed=7, versions=(9,))], deleted_keys=["run-a-0-00000"])
    fs = lake.fs
    con = duckdb.connect()
    lake.register(con)

    def opened_by(sql: str):
        fs.opened.clear()
        result = con.sql(sql).fetchall()
        return result, set(fs.opened)

    # policy_version >= v: hidden partitioning, no hint needed
    (n,), *_ = opened_by("SELECT count(*) FROM cold WHERE policy_version >= 4")[0]
    _, opened = opened_by("SELECT count(*) FROM cold WHERE policy_version >= 4")
    assert n == 2 * 40 + 30 and opened == _files_of(lake, lambda r, f: f["policy_bucket"] >= 4)
    # run_id = 'x'
    res, opened = opened_by("SELECT count(*) FROM cold WHERE run_id = 'run-b'")
    assert res == [(120,)] and opened == _files_of(lake, lambda r, f: r == "run-b")
    # both, plus a column predicate, and the explicit bucket hint
    res, opened = opened_by(f"SELECT count(*) FROM cold WHERE {lake.prune_hint('reward >= 0 AND policy_version = 9')}")
    assert res == [(30,)] and opened == _files_of(lake, lambda r, f: f["policy_bucket"] == 9)
    res, opened = opened_by("SELECT count(*) FROM cold WHERE run_id = 'run-a' AND policy_version BETWEEN 1 AND 2")
    assert res == [(40,)] and opened == _files_of(lake, lambda r, f: r == "run-a" and f["policy_bucket"] in (1, 2))
    # the deleted key is gone inside pruned scans too
    res, _ = opened_by("SELECT count(*) FROM cold WHERE key = 'run-a-0-00000'")
    assert res == [(0,)]
    # pyarrow directly
    fs.opened.clear()
    t = lake.dataset().to_table(filter=(ds.field("policy_version") < 2) & (ds.field("run_id") == "run-a"))
    assert t.num_rows == 39 and fs.opened == _files_of(lake, lambda r, f: r == "run-a" and f["policy_bucket"] < 2)
    # without a predicate every file is opened (the counter works)
    _, opened = opened_by("SELECT count(*) FROM cold")
    assert opened == _files_of(lake, lambda r, f: True)


def test_prune_hint_lets_hive_readers_skip_other_buckets(tmp_path):
    lake = Lake(str(tmp_path / "lake"), policy_bucket_size=PER_VERSION)
    t = rollouts(200, versions=(0, 1, 2, 3, 4))
    lake.commit_snapshot("run-a", [t])
    # replace the files of buckets 2..4 with garbage: a reader that opens them fails
    for f in lake.latest_manifest("run-a")["files"]:
        if f["policy_bucket"] >= 2:
            with open(lake.store.abs(f["path"]), "wb") as out:
                out.write(b"not parquet")
    glob = f"{lake.url}/*/*/*.parquet"
    where = "reward >= 0 AND policy_version <= 1"
    hinted = lake.prune_hint(where)
    assert hinted == where + " AND policy_bucket <= 1"
    q = "SELECT count(*) FROM read_parquet('{}', hive_partitioning = true) WHERE {}"
    assert duckdb.sql(q.format(glob, hinted)).fetchall()[0][0] == 80
    with pytest.raises(duckdb.Error):
        duckdb.sql(q.format(glob, where)).fetchall()
    df = pl.scan_parquet(glob, hive_partitioning=True).filter(pl.sql_expr(hinted)).select(pl.len()).collect()
    assert df.item() == 80
    with pytest.raises(CorruptionError, match="policy_bucket=2"):
        lake.verify()


@pytest.mark.parametrize(("size", "where", "hint"), PARTITION_HINT_CASES)
def test_prune_hint_rewrites(tmp_path, size, where, hint):
    lake = Lake(str(tmp_path / "lake"), policy_bucket_size=size)
    assert lake.prune_hint(where) == f"{where} AND {hint}"


@pytest.mark.parametrize("where", [w for w in UNHINTED_WHERES if w is not None])
def test_prune_hint_leaves_other_predicates_alone(tmp_path, where):
    assert Lake(str(tmp_path / "lake")).prune_hint(where) == where


# --------------------------------------------------------------------------------------------
# plain Parquet for other tools, checksums
# --------------------------------------------------------------------------------------------


def test_lake_opens_without_lakebuffer(tmp_path):
    import deltalake

    lake = Lake(str(tmp_path / "lake"), policy_bucket_size=PER_VERSION)
    tables = [rollouts(90, run=r, seed=i, versions=(i, 4)) for i, r in enumerate(["run-a", "run-b", "run-c"])]
    for t in tables:
        lake.commit_snapshot(t.column("run_id")[0].as_py(), [t.slice(0, 50)])
        lake.commit_snapshot(t.column("run_id")[0].as_py(), [t.slice(50)])
    lake.commit_snapshot("run-b", [], deleted_keys=["run-b-1-00003"])
    expected = without(pa.concat_tables(tables), ["run-b-1-00003"])
    root = lake.url
    # deltalake, polars.scan_delta, DuckDB over the table's pyarrow dataset: exactly the live rows
    dt = deltalake.DeltaTable(root)
    same(dt.to_pyarrow_table(), expected)
    same(pl.scan_delta(root).collect().to_arrow(), expected)
    con = duckdb.connect()
    con.register("t", dt.to_pyarrow_dataset())
    same(con.sql("SELECT * FROM t").to_arrow_table(), expected)
    assert con.sql("SELECT count(*) FROM t WHERE run_id = 'run-b' AND policy_bucket = 4").fetchall()[0][0] == 44  # one deleted
    # the files the table lists, read as plain Parquet
    assert sorted(dt.file_uris()) == sorted(lake.files())
    assert pq.read_table(dt.file_uris()).num_rows == expected.num_rows
    # each snapshot is a version (time travel)
    m = lake.manifest("run-a", 1)
    old = deltalake.DeltaTable(root, version=m["version"]).to_pyarrow_table()
    assert old.filter(pc.equal(old.column("run_id"), "run-a")).num_rows == 50
    # the commit carries lakebuffer's document (snapshot id, meta) in commitInfo
    doc = json.loads(dt.history()[-1 - m["version"]]["lakebuffer"])
    assert doc["run_id"] == "run-a" and doc["snapshot_id"] == 1
    assert dt.transaction_version("lakebuffer:run-b") == 3


def test_s3_lake_opens_without_lakebuffer(s3_server, s3_bucket):
    import deltalake

    lake = Lake(f"{s3_bucket}/lake", s3_server.storage_options)
    t = rollouts(150, versions=(1, 2))
    lake.commit_snapshot("run-a", [t])
    opts = {
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "aws_region": "us-east-1",
        "aws_endpoint_url": s3_server.endpoint_url,
        "aws_allow_http": "true",
    }
    same(deltalake.DeltaTable(lake.url, storage_options=opts).to_pyarrow_table(), t)
    same(pl.scan_delta(lake.url, storage_options=opts).collect().to_arrow(), t)
    same(deltalake.DeltaTable(lake.url, storage_options=lake.delta_storage_options).to_pyarrow_table(), t)


def test_checksum_mismatch_raises_corruption_naming_the_file(where):
    lake = where.lake()
    lake.commit_snapshot("run-a", [rollouts(100, versions=(0, 1))])
    lake.commit_snapshot("run-a", [rollouts(10, seed=3)], deleted_keys=["run-a-0-00001"])
    assert lake.verify()["files"] == 2 + 3  # the delete rewrote one file of the first snapshot
    m = lake.latest_manifest("run-a")
    victim = m["files"][0]
    data = bytearray(file_bytes(lake, victim["path"]))
    # same size, one flipped byte in the middle of a data column every path reads (a flip in the
    # ``_lb_hash`` pages, which a ranged scan does not read, is test_lake_integrity's and rowpages')
    group = pq.read_metadata(pa.BufferReader(bytes(data))).row_group(0)
    chunk = next(group.column(j) for j in range(group.num_columns) if group.column(j).path_in_schema.startswith("response_ids."))
    data[chunk.data_page_offset + chunk.total_compressed_size // 2] ^= 0xFF
    lake.fs.pipe_file(lake.store.abs(victim["path"]), bytes(data))
    name = victim["path"].rsplit("/", 1)[1]
    with pytest.raises(CorruptionError, match=name):
        lake.verify()
    with pytest.raises(CorruptionError, match=name):
        list(lake.scan_batches("run-a"))
    with pytest.raises(CorruptionError, match=name):  # ranged reads: the Parquet page checksums
        list(where.lake(ranged_reads=True).scan_batches("run-a"))
    with pytest.raises(CorruptionError, match=name):
        lake.compact(target_file_bytes=2**20)
    assert lake.latest_manifest("run-a") == m  # the failed compaction committed nothing
    with pytest.raises(CorruptionError, match=name):  # a delete that must rewrite it
        lake.commit_snapshot("run-a", [], deleted_keys=[f"run-a-{k}" for k in ("0-00000", "0-00001", "0-00002", "0-00003", "3-00000")])
    assert lake.latest_manifest("run-a") == m
    # a missing file is named too
    lake.fs.rm_file(lake.store.abs(victim["path"]))
    with pytest.raises(CorruptionError, match="missing"):
        lake.verify()


def test_commit_whose_reply_was_lost_is_recognised(tmp_path, monkeypatch):
    lake = Lake(str(tmp_path / "lake"))
    t = rollouts(20)
    commit = lake.delta.commit

    def commit_then_fail(*a, **kw):
        commit(*a, **kw)  # the Delta commit lands, but the caller hears an error (a lost reply)
        raise LakeError("connection reset after the write")

    monkeypatch.setattr(lake.delta, "commit", commit_then_fail)
    m = lake.commit_snapshot("run-a", [t])
    assert m["snapshot_id"] == 1 and lake.snapshots("run-a") == [1]
    same(lake.dataset().to_table(), t)
    lake.verify()  # its files were kept


def test_file_urls_and_plain_paths_name_the_same_lake(tmp_path, monkeypatch):
    t = rollouts(30)
    Lake(f"file://{tmp_path}/lake").commit_snapshot("run-a", [t])
    monkeypatch.chdir(tmp_path)
    lake = Lake("lake", read_only=True)
    assert lake.url == str(tmp_path / "lake") and lake.runs() == ["run-a"]
    same(lake.dataset().to_table(), t)
    assert all(os.path.isabs(f) and os.path.exists(f) for f in lake.files())
