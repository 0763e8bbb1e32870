"""Issue 15, the cold tier's guarantees: 6 (an interrupted restore is resumed or refused), 7 (a damaged
lake does not lock out intact local data), 8 (snapshot and restore end by a deadline against a
stalled S3) and 10 (snapshots keep up, and their lag is reported)."""

from __future__ import annotations

from pathlib import Path

import pytest

import lakebuffer as lb
from tests.rollouts import make_rollouts


def _fill(buf, batches=4, rows=64, tokens=32, seed=0) -> list[str]:
    keys: list[str] = []
    for v in range(batches):
        keys += buf.push(make_rollouts(rows, tokens=tokens, version=v, seed=seed + v)).to_pylist()
    return keys


def _keys(buf) -> list[str]:
    return sorted(buf.sql("SELECT key FROM rollouts").column(0).to_pylist())


# 7. a damaged lake does not lock out intact local data ------------------------------------------
def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("damage", ["newest-commit", "first-commit"])
def test_damaged_lake_leaves_local_tiers_open_and_reported(tmp_path, damage):
    lake_dir = tmp_path / "lake"
    buf = lb.ReplayBuffer.open(tmp_path / "a", lake=f"file://{lake_dir}", snapshot_interval_s=0,
                               memory_limit_mb=2, run_id="dmg")
    first = _fill(buf, batches=2)
    buf.snapshot(wait=True)
    first += _fill(buf, batches=2, seed=20)
    buf.snapshot(wait=True)
    second = _fill(buf, seed=50)  # local only
    buf.close()
    commits = sorted((lake_dir / "_delta_log").glob("*.json"))
    target = commits[-1] if damage == "newest-commit" else commits[0]  # the first holds schema and settings
    assert target.is_file()
    saved = target.read_bytes()
    _truncate(target)

    buf = lb.ReplayBuffer.open(tmp_path / "a", lake=f"file://{lake_dir}", snapshot_interval_s=0, memory_limit_mb=2)
    try:
        assert _keys(buf) == sorted(first + second)  # every local row is served
        assert len(buf.get(second[:5])) == 5
        err = buf.stats()["cold"]["last_error"]
        assert err and "damaged" in err and target.name in err
        more = buf.push(make_rollouts(8, tokens=8, seed=9)).to_pylist()  # pushes keep working
        with pytest.raises(lb.LakeError, match="damaged"):  # snapshots fail clearly until it is fixed
            buf.snapshot(wait=True)
        assert len(buf) == len(first) + len(second) + len(more)  # nothing local was dropped
        target.write_bytes(saved)  # the lake is fixed: the next snapshot carries everything pending
        buf.snapshot(wait=True)
        assert buf.stats()["cold"]["last_error"] is None
    finally:
        buf.close()
    with lb.ReplayBuffer.open_lake(f"file://{lake_dir}") as view:
        assert sorted(view.sql("SELECT key FROM rollouts").column(0).to_pylist()) == sorted(first + second + more)


# 6. an interrupted restore is resumed or refused, never half-open -------------------------------
@pytest.mark.slow  # ~25 s: 50 MB through moto, then an outage; `make test-slow` runs it
def test_restore_interrupted_by_an_s3_outage_is_refused_then_resumed(tmp_path, s3_server, s3_bucket):
    url, opts = f"{s3_bucket}/lake", s3_server.storage_options
    src = lb.ReplayBuffer.open(tmp_path / "src", lake=url, storage_options=opts, snapshot_interval_s=0,
                               memory_limit_mb=1, run_id="rr")
    # ten snapshots of ~5 MB each: ten lake files, 50 MB, far more than the restore below may fetch ahead
    # (half its lake memory: 16 MB at a 1 MB budget), so an outage after the first install always meets
    # files still to fetch, however fast or slow the machine is
    keys: list[str] = []
    for step in range(10):
        keys += _fill(src, batches=4, rows=256, tokens=1024, seed=10 * step)
        src.snapshot(wait=True)
    src.close()

    seen: list[int] = []

    def cut_after_first(done: int, total: int) -> None:
        seen.append(done)
        if len(seen) == 1:
            s3_server.stop()  # the outage begins after the first batch is installed

    dst = tmp_path / "dst"
    try:
        with pytest.raises(lb.LakeError, match="interrupted"):
            lb.ReplayBuffer.open(dst, lake=url, storage_options=opts, snapshot_interval_s=0, run_id="rr",
                                 memory_limit_mb=1, progress=cut_after_first)
        assert seen and seen[0] < len(keys)  # part of the run was installed when it failed
        with pytest.raises(lb.LakeError, match="interrupted|cannot reach"):  # still down: refused, not half-open
            lb.ReplayBuffer.open(dst, lake=url, storage_options=opts, snapshot_interval_s=0)
    finally:
        s3_server.start()
    with lb.ReplayBuffer.open(dst, lake=url, storage_options=opts, snapshot_interval_s=0) as buf:
        assert _keys(buf) == sorted(keys)  # resumed: every row once
        new = buf.push(make_rollouts(4, tokens=8)).to_pylist()
        assert not set(new) & set(keys)  # the key sequence continues past the lake's keys
        assert buf.stats()["cold"]["last_error"] is None


# 10. snapshots keep up ------------------------------------------------------------------------
def test_a_backlog_is_committed_in_bounded_steps_and_the_lag_is_reported(tmp_path):
    lake = f"file://{tmp_path / 'lake'}"
    with lb.ReplayBuffer.open(tmp_path / "a", lake=lake, snapshot_interval_s=0, memory_limit_mb=4,
                              run_id="lag", snapshot_max_rows=100) as buf:
        keys = _fill(buf, batches=10, rows=64)
        cold = buf.stats()["cold"]
        assert cold["lag_rows"] == len(keys) and cold["lag_s"] >= 0
        buf.snapshot(wait=True)  # drains the whole backlog, one bounded commit per step
        cold = buf.stats()["cold"]
        assert cold["lag_rows"] == 0 and cold["lag_s"] == 0 and cold["rows"] == len(keys)
    ms = [m for m in (lb.lake.Lake(lake).manifest("lag", sid) for sid in lb.lake.Lake(lake).snapshots("lag"))]
    assert len(ms) >= 5  # 640 rows in steps of at most 100 rows (whole batches of 64)
    assert all(len(m["meta"]["batches"]) == 1 for m in ms)


@pytest.mark.slow  # ~11 s of continuous pushes; `make test-slow` runs it
def test_periodic_snapshots_catch_up_under_continuous_pushes(tmp_path):
    import threading
    import time

    lake = f"file://{tmp_path / 'lake'}"
    buf = lb.ReplayBuffer.open(tmp_path / "a", lake=lake, snapshot_interval_s=1, memory_limit_mb=8,
                               run_id="keepup", snapshot_max_rows=256)
    stop = threading.Event()
    pushed: list[int] = []

    def producer(seed: int) -> None:
        i = 0
        while not stop.is_set():
            pushed.append(len(buf.push(make_rollouts(32, tokens=16, seed=seed * 1000 + i))))
            i += 1
            time.sleep(0.01)

    try:
        threads = [threading.Thread(target=producer, args=(t,)) for t in range(2)]
        for t in threads:
            t.start()
        seen_in_lake = False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not seen_in_lake:  # snapshots land while pushes go on
            time.sleep(0.2)
            seen_in_lake = buf.stats()["cold"]["rows"] > 0
        time.sleep(2)
        stop.set()
        for t in threads:
            t.join()
        assert seen_in_lake
        deadline = time.monotonic() + 60  # generous: no timing assertion, only "it gets there"
        while buf.stats()["cold"]["lag_rows"] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert buf.stats()["cold"]["lag_rows"] == 0 and sum(pushed) == len(buf)
        with lb.ReplayBuffer.open_lake(lake) as view:  # the lake itself holds every row, before close()
            assert view.count() == sum(pushed)
    finally:
        stop.set()
        buf.close()


# 8. snapshot ends by its deadline against a stalled S3 endpoint ---------------------------------
def test_snapshot_against_a_stalled_s3_ends_by_its_deadline_and_is_retried(tmp_path, s3_server, s3_bucket):
    import time

    url, opts = f"{s3_bucket}/lake", s3_server.storage_options  # per request: 30 s read timeout, 2 attempts
    buf = lb.ReplayBuffer.open(tmp_path / "a", lake=url, storage_options=opts, snapshot_interval_s=0,
                               memory_limit_mb=2, run_id="stall", lake_timeout_s=3)
    try:
        keys = _fill(buf)
        s3_server.pause()  # moto stopped: the relay accepts connections, nothing answers
        try:
            t0 = time.monotonic()
            with pytest.raises(lb.LakeError, match="lake_timeout_s"):
                buf.snapshot(wait=True)
            assert time.monotonic() - t0 < 20  # the deadline, not 2 x 30 s of request timeouts
            assert "lake_timeout_s" in buf.stats()["cold"]["last_error"]
            assert _keys(buf) == sorted(keys)  # the rows are safe locally
        finally:
            s3_server.resume()
        deadline = time.monotonic() + 120  # the retry carries the rows once the endpoint answers
        while True:
            try:
                buf.snapshot(wait=True)
                if buf.stats()["cold"]["lag_rows"] == 0:
                    break
            except lb.LakeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        assert buf.stats()["cold"]["rows"] == len(keys)
    finally:
        s3_server.resume()
        buf.close()
    with lb.ReplayBuffer.open_lake(url, storage_options=opts) as view:
        assert sorted(view.sql("SELECT key FROM rollouts").column(0).to_pylist()) == sorted(keys)
