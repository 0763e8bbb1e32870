"""A failed ``open()`` releases everything it took (issue 24 item 3).

Every stage of ``ReplayBuffer.__init__`` is made to fail in turn (the real part is built first, then
an error is raised, so whatever that stage took must be given back), plus real damage: a damaged
index, WAL segment and lake file, a wrong run id, an unreachable lake, a run claimed by another
buffer. After each failure, in the same process: the directory lock is free (another ``DirLock``
and ``fsck`` get it), a retry opens the directory, RocksDB's own lock is free, no thread the open
started is left and no file descriptor it opened is still open.
"""

from __future__ import annotations

import os
import threading

import pytest

import lakebuffer as lb
from lakebuffer import buffer as buffer_mod
from lakebuffer import fsck
from lakebuffer.engine.dirlock import DirLock
from lakebuffer.engine.snapshots import Snapshots
from tests.rollouts import make_rollouts

#: process-wide threads a buffer may leave by design: the one low-priority snapshot thread (Acero
#: slots, see engine/snapshots.at_low_priority) and fsspec's / s3fs's event loop
_PROCESS_THREADS = ("lakebuffer-snapshot", "fsspecIO", "asyncio_")


class Injected(Exception):
    """The failure a stage is made to raise."""


def _fds() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            pass
    with open("/proc/self/maps") as f:  # memory-mapped files (warm fragments) count as held too
        out.update(line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6)
    return out


def _threads() -> dict[int, str]:
    return {t.ident: t.name for t in threading.enumerate() if t.is_alive()}


def _make(d, lake=None, run_id=None, **kw):
    with lb.ReplayBuffer.open(d, lake=lake, memory_limit_mb=64, snapshot_interval_s=0, run_id=run_id, **kw) as b:
        b.push(make_rollouts(32, tokens=8))
        b.evict_all()
        b.push(make_rollouts(32, tokens=8, seed=1))  # one warm batch, one hot (WAL) batch
        if lake is not None:
            b.snapshot()


def _assert_released(d, threads_before, fds_before):
    """Nothing the failed open took is still held."""
    DirLock(d).acquire().release()  # the directory lock
    left = {i: n for i, n in _threads().items() if i not in threads_before and not n.startswith(_PROCESS_THREADS)}
    assert not left, f"threads left by the failed open: {sorted(left.values())}"
    leaked = {p for p in _fds() - fds_before if str(d) in p}
    assert not leaked, f"files the failed open still holds: {sorted(leaked)}"
    report = fsck.check(d)  # what the error message recommends, in the same process
    assert "problems" in report


def _stage(monkeypatch, target, name, how="after"):
    """Make ``target.name`` fail: after the real call (what it took must be released) or before it."""
    real = getattr(target, name)

    def failing(*args, **kwargs):
        if how == "before":
            raise Injected(f"{name} failed")
        real(*args, **kwargs)
        raise Injected(f"{name} failed")

    monkeypatch.setattr(target, name, failing)


# every part _open_parts builds or runs, in order (module names as buffer.py binds them)
_STAGES = [
    (buffer_mod, "refuse_damaged_index"),
    (buffer_mod, "KeyIndex"),
    (buffer_mod, "open_lake"),
    (buffer_mod, "Catalog"),
    (buffer_mod, "TaskQueue"),
    (buffer_mod, "WarmTier"),
    (buffer_mod, "WriteAheadLog"),
    (buffer_mod, "Snapshots"),
    (buffer_mod, "ColdTier"),
    (buffer_mod, "DiskBudget"),
    (buffer_mod, "Ingest"),
    (buffer_mod, "ReplayLog"),
    (buffer_mod, "Retention"),
    (Snapshots, "claim"),
    (buffer_mod, "recover"),
    (Snapshots, "restore"),
    (Snapshots, "refresh_cold"),
    (Snapshots, "start_timer"),
    (buffer_mod.ReplayBuffer, "_open_parts"),  # everything built, then a failure
]


@pytest.mark.parametrize("target,name", _STAGES, ids=[n for _, n in _STAGES])
def test_failure_at_each_stage_of_open_releases_everything(tmp_path, monkeypatch, target, name):
    d = tmp_path / "b"
    _make(d)
    threads, fds = _threads(), _fds()
    with monkeypatch.context() as m:
        # a class fails instead of being built (the parts before it must be released); a function or
        # method fails after doing its work (what it took must be released too)
        _stage(m, target, name, how="before" if isinstance(getattr(target, name), type) else "after")
        with pytest.raises(Injected):
            lb.ReplayBuffer.open(d, memory_limit_mb=64, snapshot_interval_s=5)
    _assert_released(d, threads, fds)
    with lb.ReplayBuffer.open(d, memory_limit_mb=64, snapshot_interval_s=0) as b:  # RocksDB, DuckDB free too
        assert len(b) == 64


def test_failed_close_still_releases(tmp_path, monkeypatch):
    """A final snapshot that fails with something other than LakeError used to leave the workers running."""
    d = tmp_path / "b"
    _make(d)
    threads, fds = _threads(), _fds()
    b = lb.ReplayBuffer.open(d, memory_limit_mb=64, snapshot_interval_s=3600)
    with monkeypatch.context() as m:
        _stage(m, Snapshots, "snapshot_now", how="before")
        with pytest.raises(Injected):
            b.close()
    _assert_released(d, threads, fds)


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _damage_index(d):
    for f in (d / "index").glob("*.sst"):
        f.write_bytes(b"garbage" * 100)


def _damage_wal(d):
    for f in (d / "wal").glob("*.arrow"):
        _flip(f)


@pytest.mark.parametrize("damage", [_damage_index, _damage_wal], ids=["index", "wal"])
def test_damaged_directory_open_fails_then_fsck_repair_gets_the_lock(tmp_path, damage):
    d = tmp_path / "b"
    _make(d)
    damage(d)
    threads, fds = _threads(), _fds()
    for _ in range(2):  # the retry says the same thing, not "already open in this process"
        with pytest.raises(lb.CorruptionError, match="fsck --repair"):
            lb.ReplayBuffer.open(d, memory_limit_mb=64)
    _assert_released(d, threads, fds)
    fsck.check(d, repair=True)
    lb.ReplayBuffer.open(d, memory_limit_mb=64, snapshot_interval_s=0).close()


def test_bad_options_are_option_errors_and_release(tmp_path):
    d = tmp_path / "b"
    _make(d)
    threads, fds = _threads(), _fds()
    with pytest.raises(lb.OptionError, match="holds run 'b', not 'other'"):
        lb.ReplayBuffer.open(d, run_id="other")
    with pytest.raises(lb.SchemaError):
        import pyarrow as pa

        lb.ReplayBuffer.open(d, schema=pa.schema([("x", pa.int64())]))
    with pytest.raises(lb.OptionError):
        lb.ReplayBuffer.open(d, evict="no such (column")
    _assert_released(d, threads, fds)
    (tmp_path / "file").write_text("not a directory")
    for bad in (tmp_path / "file", tmp_path / "file" / "b"):
        with pytest.raises(lb.StorageError, match="cannot use"):
            lb.ReplayBuffer.open(bad)


def test_restore_of_damaged_lake_file_releases(tmp_path):
    lake = str(tmp_path / "lake")
    _make(tmp_path / "src", lake=lake, run_id="r")
    for f in (tmp_path / "lake").rglob("*.parquet"):
        _flip(f)
    d = tmp_path / "dst"
    threads, fds = _threads(), _fds()
    for _ in range(2):
        with pytest.raises(lb.LakeBufferError):
            lb.ReplayBuffer.open(d, lake=lake, run_id="r", memory_limit_mb=64, restore="eager")
    _assert_released(d, threads, fds)


def test_run_claimed_by_another_buffer_releases(tmp_path):
    lake = str(tmp_path / "lake")
    _make(tmp_path / "src", lake=lake, run_id="r")
    holder = lb.ReplayBuffer.open(tmp_path / "src", lake=lake, run_id="r", memory_limit_mb=64, snapshot_interval_s=0)
    try:
        d = tmp_path / "dst"
        threads, fds = _threads(), _fds()
        for _ in range(2):
            with pytest.raises(lb.LockedError, match="another buffer"):
                lb.ReplayBuffer.open(d, lake=lake, run_id="r", memory_limit_mb=64)
        _assert_released(d, threads, fds)
    finally:
        holder.close()


def test_unreachable_lake_fails_fast_and_releases(tmp_path, s3_server, s3_bucket):
    lake = f"{s3_bucket}/lake"
    so = s3_server.storage_options
    d = tmp_path / "b"
    _make(d, lake=lake, run_id="r", storage_options=so)
    threads, fds = _threads(), _fds()
    with s3_server.outage():
        for _ in range(2):
            with pytest.raises(lb.LakeError, match="cannot reach lake"):
                lb.ReplayBuffer.open(d, lake=lake, storage_options=so, run_id="r", memory_limit_mb=64)
    _assert_released(d, threads, fds)


def test_stalled_lake_open_fails_within_lake_timeout_and_releases(tmp_path, s3_server, s3_bucket):
    """An endpoint that accepts and never answers: open raises LakeError within lake_timeout_s (it hung)."""
    import time

    lake = f"{s3_bucket}/lake"
    so = s3_server.storage_options
    d = tmp_path / "b"
    _make(d, lake=lake, run_id="r", storage_options=so)
    threads, fds = _threads(), _fds()
    s3_server.pause()
    try:
        t0 = time.monotonic()
        with pytest.raises(lb.LakeError, match="lake_timeout_s=2"):
            lb.ReplayBuffer.open(d, lake=lake, storage_options=so, run_id="r", memory_limit_mb=64, lake_timeout_s=2)
        assert time.monotonic() - t0 < 15
        DirLock(d).acquire().release()  # released at once, while the lake still stalls
    finally:
        s3_server.resume()
    deadline = time.monotonic() + 30  # the abandoned probe ends once the endpoint answers
    while any(n == "lakebuffer-open-lake" for n in _threads().values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    _assert_released(d, threads, fds)
