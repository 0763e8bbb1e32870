"""Removed WAL segments kept as spare files and written over by the next segments (``tiers/wal.py``).

What must hold: a segment written over a spare reads back exactly (its own length, its own CRC), a
segment another name links (a warm fragment adopted it) is never written over, spares count in the
disk budget and leave first when it is short, at close and at open, and a buffer killed with spares
on disk reopens with exactly its acknowledged rows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

import lakebuffer as lb
from lakebuffer.tiers import wal as walmod
from lakebuffer.tiers.wal import SPARE_SUFFIX, WriteAheadLog
from tests.rollouts import make_rollouts


def _keyed(n: int, seed: int) -> pa.Table:
    t = make_rollouts(n, seed=seed)
    return t.append_column("key", pa.array([f"s{seed}-{i}" for i in range(n)], pa.string()))


def _spares(wal: WriteAheadLog) -> list:
    return sorted(wal.path.glob(f"*{SPARE_SUFFIX}"))


def _on_disk(wal: WriteAheadLog) -> int:
    return sum(p.stat().st_size for p in wal.path.iterdir())


def test_a_segment_written_over_a_spare_reads_back_exactly(tmp_path):
    wal = WriteAheadLog(tmp_path / "wal", spares=True)
    big, small = make_rollouts(64, seed=1), make_rollouts(8, seed=2)
    wal.write(1, big)
    inode = wal.segment_path(1).stat().st_ino
    wal.remove(1)
    assert [p.stat().st_ino for p in _spares(wal)] == [inode]  # kept, not unlinked
    assert wal.nbytes() == _on_disk(wal) > 0  # and counted
    wal.write(2, small)  # over the bigger spare: cut to its own length
    seg = wal.segment_path(2)
    assert seg.stat().st_ino == inode and not _spares(wal)
    assert wal.read(2).equals(small)
    fresh = WriteAheadLog(tmp_path / "fresh")
    fresh.write(2, small)
    assert seg.read_bytes() == fresh.segment_path(2).read_bytes()  # byte for byte what a new file holds
    assert wal.nbytes() == _on_disk(wal)


def test_a_segment_another_name_links_is_never_written_over(tmp_path):
    """A warm fragment adopts a segment by a hard link; the WAL's name is removed afterwards."""
    wal = WriteAheadLog(tmp_path / "wal", spares=True)
    t = make_rollouts(32, seed=3)
    wal.write(1, t)
    adopted = tmp_path / "fragment.arrow"
    os.link(wal.segment_path(1), adopted)
    before = adopted.read_bytes()
    wal.remove(1)
    assert not _spares(wal) and not wal.segment_path(1).exists()
    wal.write(2, make_rollouts(32, seed=4))
    assert adopted.read_bytes() == before


def test_the_pool_keeps_at_most_its_files_and_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(walmod, "SPARE_FILES", 2)
    wal = WriteAheadLog(tmp_path / "wal", spares=True)
    for bid in range(1, 5):
        wal.write(bid, make_rollouts(16, seed=bid))
    for bid in range(1, 5):
        wal.remove(bid)
    assert len(_spares(wal)) == 2 and wal.spare_bytes() == _on_disk(wal) == wal.nbytes()
    wal.spare_limit_bytes = 1  # smaller than any segment: none kept
    assert wal.drop_spares() > 0 and not _spares(wal) and wal.nbytes() == 0
    wal.write(5, make_rollouts(16, seed=5))
    wal.remove(5)
    assert not _spares(wal) and not any(wal.path.iterdir())


def test_a_wal_without_spares_unlinks_and_open_removes_leftover_spares(tmp_path):
    wal = WriteAheadLog(tmp_path / "wal")  # fsck's and rebuild's: no pool
    wal.write(1, make_rollouts(8, seed=1))
    wal.remove(1)
    assert not any(wal.path.iterdir())
    live = WriteAheadLog(tmp_path / "wal", spares=True)
    live.write(1, make_rollouts(8, seed=1))
    live.remove(1)
    assert _spares(live)
    assert WriteAheadLog(tmp_path / "wal").remove_torn() == 1  # a crash's leftover spare goes at open
    assert not any(wal.path.iterdir())


def test_through_the_buffer_deleted_batches_segments_are_written_over(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "buf", memory_limit_mb=64) as buf:
        first = _keyed(32, seed=1)
        buf.push(first)
        buf.delete(keys=first.column("key").to_pylist())  # the hot batch goes: its segment becomes a spare
        assert _spares(buf.wal)
        inode = _spares(buf.wal)[0].stat().st_ino
        second = _keyed(32, seed=2)
        buf.push(second)
        (bid,) = buf.wal.ids()
        assert buf.wal.segment_path(bid).stat().st_ino == inode and not _spares(buf.wal)
        assert buf.stats()["wal"]["bytes"] == sum(p.stat().st_size for p in buf.wal.path.iterdir())
    assert not _spares(WriteAheadLog(tmp_path / "buf" / "wal"))  # close drops them
    with lb.ReplayBuffer.open(tmp_path / "buf", memory_limit_mb=64) as buf:
        keys = second.column("key").to_pylist()
        assert len(buf) == 32 and buf.get(keys, ["key", "reward"]).column("reward").equals(
            second.column("reward").cast(pa.float32()))


def test_a_small_disk_budget_keeps_spares_within_a_sixteenth(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "buf", memory_limit_mb=64, disk_limit_gb=32 / 1024) as buf:
        assert buf.wal.spare_limit_bytes == (32 << 20) // 16
    with lb.ReplayBuffer.open(tmp_path / "buf2", memory_limit_mb=64) as buf:
        assert buf.wal.spare_limit_bytes == walmod.SPARE_BYTES


@pytest.mark.skipif(sys.platform != "linux", reason="SIGKILL of a child")
def test_a_buffer_killed_with_spares_on_disk_reopens_with_its_acknowledged_rows(tmp_path):
    """Pushes, deletes and pushes over spares, then SIGKILL after an acknowledged push: the reopened
    buffer holds exactly the acknowledged rows, and no spare is left."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {os.getcwd()!r})
        import lakebuffer as lb
        from tests.test_wal_spares import _keyed
        buf = lb.ReplayBuffer.open({str(tmp_path / "buf")!r}, memory_limit_mb=64)
        for i in range(12):
            t = _keyed(16, seed=i)
            buf.push(t)
            if i % 3 == 2:  # the last push is deleted too: its segment is a spare at the kill
                buf.delete(keys=t.column("key").to_pylist())
        print("acked", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL and "acked" in p.stdout, p.stderr[-2000:]
    assert _spares(WriteAheadLog(tmp_path / "buf" / "wal"))  # the kill left spares behind
    kept = [i for i in range(12) if i % 3 != 2]
    with lb.ReplayBuffer.open(tmp_path / "buf", memory_limit_mb=64) as buf:
        assert len(buf) == 16 * len(kept)
        for i in kept:
            t = _keyed(16, seed=i)
            got = buf.get(t.column("key").to_pylist(), ["key", "response_ids"])
            assert got.column("response_ids").to_pylist() == t.column("response_ids").to_pylist()
        assert not _spares(buf.wal)
