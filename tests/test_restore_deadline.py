"""Issue 15, guarantee 8 for restore: ``lake_timeout_s`` ends a restore whose lake read stalls
inside a batch (not only between batches), with a clear ``LakeError``; the restore stays resumable.

The stall is real: one data file of a file lake is replaced by a FIFO with no writer, so opening
it blocks, as a read from a hung NFS mount or a silent S3 endpoint does.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import pytest

import lakebuffer as lb
from tests.rollouts import make_rollouts


def _unblock(fifo: Path) -> None:
    """Let a reader blocked opening ``fifo`` go on (it then reads EOF)."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_restore_stalled_inside_a_read_ends_at_its_deadline_then_resumes(tmp_path):
    lake_dir = tmp_path / "lake"
    lake = f"file://{lake_dir}"
    keys: list[str] = []
    with lb.ReplayBuffer.open(tmp_path / "src", lake=lake, snapshot_interval_s=0, memory_limit_mb=2,
                              run_id="slow") as src:
        for i in range(3):  # three commits: three data files, read one after the other
            keys += src.push(make_rollouts(64, tokens=16, version=i, seed=i)).to_pylist()
            src.snapshot(wait=True)
    files = sorted(lake_dir.rglob("*.parquet"), key=lambda p: p.stat().st_mtime_ns)
    assert len(files) >= 2
    victim = files[-1]  # the last commit's file: read after the first batches were installed
    saved = victim.read_bytes()
    victim.unlink()
    os.mkfifo(victim)
    # without a bound the restore would wait forever: release the reader after 60 s so the test fails
    release = threading.Timer(60, _unblock, args=(victim,))
    release.start()
    seen: list[int] = []
    dst = tmp_path / "dst"
    try:
        t0 = time.monotonic()
        with pytest.raises(lb.LakeError, match="lake_timeout_s") as err:
            lb.ReplayBuffer.open(dst, lake=lake, run_id="slow", snapshot_interval_s=0, lake_timeout_s=2,
                                 progress=lambda done, total: seen.append(done))
        elapsed = time.monotonic() - t0
        assert elapsed < 15, f"the restore took {elapsed:.1f} s for a 2 s deadline"
        assert "interrupted" in str(err.value)  # and says how to go on
        assert seen and seen[-1] < len(keys)  # it stalled part way, after installing the first batches
        with pytest.raises(lb.LakeError, match="interrupted"):  # still stalled: refused, never half-open
            lb.ReplayBuffer.open(dst, lake=lake, snapshot_interval_s=0, lake_timeout_s=2)
    finally:
        release.cancel()
        _unblock(victim)
    time.sleep(0.2)  # the abandoned readers see EOF and end
    victim.unlink()
    victim.write_bytes(saved)
    with lb.ReplayBuffer.open(dst, lake=lake, snapshot_interval_s=0) as buf:  # resumed: every row once
        stored = buf.sql("SELECT key FROM rollouts").column(0).to_pylist()
        assert sorted(stored) == sorted(keys)
