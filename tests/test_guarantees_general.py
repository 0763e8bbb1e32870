"""Issue 15's guarantees beyond the reported cases: each test checks a guarantee on paths the first
reproductions did not take (4: a lake view writes nothing through any method; 7: a damaged writer
claim does not lock out local data; 8: close() ends cleanly and in bounded time under real faults;
9: no float column is changed silently by the cast)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

import lakebuffer as lb
from lakebuffer.fsck import check as fsck
from tests.rollouts import make_rollouts

ROOT = Path(__file__).resolve().parent.parent


def _keys(reader) -> list[str]:
    return sorted(reader.sql("SELECT key FROM rollouts").column(0).to_pylist())


def _tree(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file under ``root``: (size, mtime_ns, bytes)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()}


# 4. a lake view writes nothing, through any of its methods ------------------------------------
def test_every_method_of_a_lake_view_leaves_the_lake_byte_for_byte_unchanged(tmp_path):
    lake = tmp_path / "lake"
    with lb.ReplayBuffer.open(tmp_path / "a", lake=str(lake), snapshot_interval_s=0, memory_limit_mb=2,
                              run_id="ro") as buf:
        for v in range(3):
            buf.push(make_rollouts(32, tokens=8, version=0, seed=v))
            buf.snapshot(wait=True)  # three small files of one partition: a compaction would have work to do
    before = _tree(lake)
    with lb.ReplayBuffer.open_lake(str(lake)) as view:
        keys = view.sql("SELECT key FROM rollouts").column(0).to_pylist()
        assert len(keys) == 96 and view.count() == 96 and len(view) == 96
        assert view.get(keys[:5]).num_rows == 5
        assert view.sample(8, seed=1).num_rows == 8
        assert sum(b.num_rows for b in view.scan(where="reward >= 0")) == 96
        assert view.stats()["cold"]["rows"] == 96 and view.runs == ["ro"]
        view.refresh()
        assert view.dataset().count_rows() == 96
        repr(view)
        view._repr_html_()
        for write in (lambda: view.push(make_rollouts(2, tokens=2)), lambda: view.delete(keys[:1]),
                      lambda: view.snapshot(), lambda: view.compact()):
            with pytest.raises(lb.ReadOnlyError, match="read-only"):
                write()
    assert _tree(lake) == before  # not a byte, not an mtime changed
    # compaction of a lake URL stays available where it is asked for explicitly: the CLI
    r = subprocess.run([sys.executable, "-m", "lakebuffer.cli", "compact", str(lake), "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["files_after"] < json.loads(r.stdout)["files_before"]
    with lb.ReplayBuffer.open_lake(str(lake)) as view:
        assert sorted(view.sql("SELECT key FROM rollouts").column(0).to_pylist()) == sorted(keys)


# 7. a damaged writer claim does not lock out intact local data -------------------------------
def _claim_file(lake: Path) -> Path:
    """The lake's writer-claim file (JSON naming the host), wherever the format keeps it."""
    for p in sorted(lake.rglob("*.json")):
        try:
            doc = json.loads(p.read_bytes())
        except ValueError:
            continue
        if isinstance(doc, dict) and "host" in doc and "writer" in doc:
            return p
    raise AssertionError(f"no writer claim under {lake}")


def test_a_damaged_writer_claim_leaves_local_tiers_open_and_reported(tmp_path):
    lake = tmp_path / "lake"
    opts = {"lake": f"file://{lake}", "snapshot_interval_s": 0, "memory_limit_mb": 2}
    with lb.ReplayBuffer.open(tmp_path / "a", run_id="claim", **opts) as buf:
        first = buf.push(make_rollouts(32, tokens=8, seed=1)).to_pylist()
        buf.snapshot(wait=True)
        second = buf.push(make_rollouts(32, tokens=8, seed=2)).to_pylist()  # local only
    # another directory takes the run over and crashes: its claim stays in the lake, then gets damaged
    code = (f"import os, signal, lakebuffer as lb\n"
            f"lb.ReplayBuffer.open({str(tmp_path / 'b')!r}, run_id='claim', takeover=True, lake={opts['lake']!r}, "
            f"snapshot_interval_s=0)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=120)
    claim = _claim_file(lake)
    saved = claim.read_bytes()
    claim.write_bytes(saved[: len(saved) // 2])

    buf = lb.ReplayBuffer.open(tmp_path / "a", **opts)  # opens: the local tiers are intact
    try:
        assert _keys(buf) == sorted(first + second)
        err = buf.stats()["cold"]["last_error"]
        assert err and "damaged" in err and claim.name in err
        more = buf.push(make_rollouts(8, tokens=8, seed=3)).to_pylist()
        with pytest.raises(lb.LakeError, match="damaged"):  # no snapshot while the claim cannot be read
            buf.snapshot(wait=True)
        claim.unlink()  # the fix the error names (the crashed writer's claim is gone for good)
        buf.snapshot(wait=True)  # claims the run and carries everything pending
        assert buf.stats()["cold"]["last_error"] is None and buf.stats()["cold"]["lag_rows"] == 0
    finally:
        buf.close()
    with lb.ReplayBuffer.open_lake(f"file://{lake}") as view:
        assert _keys(view) == sorted(first + second + more)


# 8. close() ends cleanly, in bounded time, under real faults ----------------------------------
def test_close_against_a_stalled_s3_ends_by_the_deadline_and_keeps_everything(tmp_path, s3_server, s3_bucket):
    url, so = f"{s3_bucket}/lake", s3_server.storage_options  # per request: 30 s read timeout, 2 attempts
    path = tmp_path / "a"
    buf = lb.ReplayBuffer.open(path, lake=url, storage_options=so, snapshot_interval_s=0, memory_limit_mb=2,
                               run_id="stallclose", lake_timeout_s=2)
    keys = buf.push(make_rollouts(32, tokens=8)).to_pylist()
    buf.snapshot(wait=True)
    keys += buf.push(make_rollouts(32, tokens=8, seed=1)).to_pylist()
    s3_server.pause()
    try:
        t0 = time.monotonic()
        try:
            buf.close()
        except lb.LakeBufferError:
            pass  # a clear error is allowed; a hang or a foreign exception is not
        elapsed = time.monotonic() - t0
    finally:
        s3_server.resume()
    assert elapsed < 15, f"close() took {elapsed:.1f} s against a stalled lake with lake_timeout_s=2"
    # the directory lock is free and the claim is still this directory's: it reopens, with every row
    with lb.ReplayBuffer.open(path, lake=url, storage_options=so, snapshot_interval_s=0, memory_limit_mb=2) as again:
        assert _keys(again) == sorted(keys)
        again.snapshot(wait=True)
        assert again.stats()["cold"]["rows"] == len(keys)


@pytest.mark.parametrize("fault", ["index-gone", "warm-unwritable", "lake-down"])
def test_close_under_a_fault_raises_only_lakebuffer_errors_and_releases_the_directory(
        tmp_path, s3_server, s3_bucket, fault):
    path = tmp_path / "a"
    kw: dict = {"snapshot_interval_s": 0, "memory_limit_mb": 2, "lake_timeout_s": 5}
    if fault == "warm-unwritable":
        kw["durability"] = "memory"  # close must write the hot rows to the warm tier
    if fault == "lake-down":
        kw.update(lake=f"{s3_bucket}/lake", storage_options=s3_server.storage_options, snapshot_interval_s=30)
    buf = lb.ReplayBuffer.open(path, **kw)
    keys = buf.push(make_rollouts(32, tokens=8)).to_pylist()
    data = path / "warm"  # the warm tier's fragment directory (tiers.warm.warm_path)
    aside = tmp_path / "aside"
    if fault == "index-gone":
        (path / "index").rename(aside)
    elif fault == "warm-unwritable":
        data.mkdir(parents=True, exist_ok=True)
        data.rename(aside)
        data.write_bytes(b"not a directory")
    else:
        s3_server.stop()  # connection refused: the final snapshot and the claim release fail
    t0 = time.monotonic()
    try:
        buf.close()
    except Exception as e:  # noqa: BLE001 - the point: what close() raises
        assert isinstance(e, lb.LakeBufferError), f"close() raised a foreign {type(e).__name__}: {e}"
    finally:
        if fault == "index-gone":
            aside.rename(path / "index")
        elif fault == "warm-unwritable":
            data.unlink()
            aside.rename(data)
        else:
            s3_server.start()
    assert time.monotonic() - t0 < 60
    kw.pop("durability", None)
    kw["snapshot_interval_s"] = 0
    with lb.ReplayBuffer.open(path, **kw) as again:  # same process: the directory was released
        if fault != "warm-unwritable":  # memory mode loses the rows that never left RAM (documented)
            assert _keys(again) == sorted(keys)
    assert fsck(path)["ok"]


# 9. no float column is changed silently by the cast to the schema -----------------------------
@pytest.mark.parametrize("column,values", [
    ("advantage", pa.array([0.5, 1e300], pa.float64())),
    ("response_logprobs", pa.array([[-0.1, -1e300], [-0.2]], pa.list_(pa.float64()))),
    ("score", pa.array([1.0, -1e39], pa.float64())),  # a user's extra float32 column
])
def test_a_float_that_the_cast_would_make_infinite_is_refused_in_every_column(tmp_path, column, values):
    schema = pa.schema([pa.field("score", pa.float32())])
    with lb.ReplayBuffer.open(tmp_path / "b", snapshot_interval_s=0, memory_limit_mb=4, schema=schema) as buf:
        t = make_rollouts(2, tokens=2)
        t = t.drop_columns([column]) if column in t.column_names else t
        with pytest.raises(lb.SchemaError, match=f"{column}.*beyond the range"):
            buf.push(t.append_column(column, values))
        assert len(buf) == 0
        fine = pa.array([0.5, 1e30], pa.float64()) if column != "response_logprobs" else \
            pa.array([[-0.1, -30.0], [-0.2]], pa.list_(pa.float64()))
        buf.push(t.append_column(column, fine))  # in range: stored as the nearest float32
        got = buf.sql(f"SELECT {column} FROM rollouts").column(0).to_pylist()
        assert len(got) == 2
