"""A reopen does not read the rows of the hot batches its WAL holds (issue 23: an open is O(metadata)).

Each such segment becomes its batch's warm fragment by a hard link (one file, one copy), checked chunk
by chunk as reads reach it like any fragment a reopen finds; a crash in the middle of it loses and
duplicates nothing."""

from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from crc32c import crc32c

import lakebuffer as lb
from lakebuffer.engine.writeback import PROMOTE_BYTES
from lakebuffer.tiers import segfooter
from tests.rollouts import make_rollouts
from tests.sizes import fast_and_full

ROOT = Path(__file__).resolve().parent.parent

OPEN = {"memory_limit_mb": 256, "snapshot_interval_s": 0}
COLUMNS = ["key", "reward", "prompt_ids", "response_ids", "response_logprobs", "policy_version"]


def _rchar() -> int:
    """Bytes this process has read through read system calls (page cache or not)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def _fill(path: Path) -> tuple[list[str], pa.Table, dict[int, int]]:
    """Three hot batches (WAL segments, nothing evicted); their keys, rows, and segment inodes by size."""
    with lb.ReplayBuffer.open(path, **OPEN) as buf:
        keys = []
        for seed in range(3):
            keys += buf.push(make_rollouts(512, tokens=1024, seed=seed)).to_pylist()
        assert buf.stats()["tiers"]["hot"]["rows"] == len(keys)
        rows = buf.get(keys, COLUMNS)
    inodes = {p.stat().st_ino: p.stat().st_size for p in (path / "wal").glob("*.arrow")}
    assert len(inodes) == 3
    return keys, rows, inodes


def test_a_reopen_reads_the_wal_segments_footers_not_their_rows(tmp_path):
    keys, rows, inodes = _fill(tmp_path)
    wal_bytes = sum(inodes.values())
    before = _rchar()
    buf = lb.ReplayBuffer.open(tmp_path, **OPEN)
    read = _rchar() - before
    try:
        assert read < wal_bytes / 20, f"the open read {read} bytes of {wal_bytes} in the WAL"
        tiers = buf.stats()["tiers"]
        assert tiers["hot"]["rows"] == 0 and tiers["warm"]["rows"] == len(keys)
        # the segments became the fragments: the same files under the warm tier's names, not copies
        assert not list((tmp_path / "wal").glob("*.arrow"))
        assert {p.stat().st_ino for p in (tmp_path / "warm").glob("*.arrow")} == set(inodes)
        assert buf.get(keys, COLUMNS).equals(rows)
        assert buf.sql("SELECT count(*) FROM rollouts").column(0)[0].as_py() == len(keys)
    finally:
        buf.close()
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:  # and again: nothing moved twice, nothing lost
        assert sorted(buf.sql("SELECT key FROM rollouts").column(0).to_pylist()) == sorted(keys)
        buf.snapshot(wait=True)  # a snapshot reads them whole (checked) into the lake
        assert buf.get(keys, COLUMNS).equals(rows)


def test_a_crash_between_linking_and_the_index_write_is_undone_by_the_next_open(tmp_path):
    """What a crash in the middle of the adoption leaves: a warm name linked to a segment whose batch
    the index still places in the WAL. The next open drops that name and adopts the segment once."""
    keys, rows, inodes = _fill(tmp_path)
    seg = sorted((tmp_path / "wal").glob("*.arrow"))[0]
    (tmp_path / "warm").mkdir(exist_ok=True)
    os.link(seg, tmp_path / "warm" / f"{0:016d}.arrow")
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        counts = buf.sql("SELECT count(*) AS n, count(DISTINCT key) AS d FROM rollouts").to_pylist()
        assert counts == [{"n": len(keys), "d": len(keys)}]
        assert buf.get(keys, COLUMNS).equals(rows)
        assert len(list((tmp_path / "warm").glob("*.arrow"))) == 3


def test_a_segment_of_an_older_release_is_still_read_and_checked_whole(tmp_path):
    """An ``LBW1`` segment (one CRC32C for the whole file, before chunk CRCs) cannot be checked chunk by
    chunk as it is read: the reopen reads it into RAM and checks it as before; a damaged one is refused."""
    keys, rows, _ = _fill(tmp_path)
    seg = sorted((tmp_path / "wal").glob("*.arrow"))[0]
    ipc = seg.read_bytes()[: segfooter.ipc_end(str(seg))]
    seg.write_bytes(ipc + struct.pack("<I4s", crc32c(ipc), b"LBW1"))
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        tiers = buf.stats()["tiers"]
        assert tiers["hot"]["rows"] == 512 and tiers["warm"]["rows"] == 1024
        assert buf.get(keys, COLUMNS).equals(rows)
    data = bytearray(seg.read_bytes())
    data[len(data) // 3] ^= 0x01
    seg.write_bytes(bytes(data))
    with pytest.raises(lb.CorruptionError, match=seg.name):
        lb.ReplayBuffer.open(tmp_path, **OPEN)


def test_a_batch_under_promote_bytes_is_read_into_ram_and_checked_as_before(tmp_path):
    """Write-back coalesces small batches instead of keeping a small file each; a reopen reads those into
    RAM (bounded by the budget), checked whole: a flipped one is refused by the open, naming its segment."""
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        keys = buf.push(make_rollouts(64, tokens=64, seed=1)).to_pylist()
        big = buf.push(make_rollouts(512, tokens=1024, seed=2)).to_pylist()
    small, _ = sorted((tmp_path / "wal").glob("*.arrow"))
    assert small.stat().st_size < PROMOTE_BYTES
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        tiers = buf.stats()["tiers"]
        assert tiers["hot"]["rows"] == len(keys) and tiers["warm"]["rows"] == len(big)
    data = bytearray(small.read_bytes())
    data[len(data) // 2] ^= 0x01
    small.write_bytes(bytes(data))
    with pytest.raises(lb.CorruptionError, match=small.name):
        lb.ReplayBuffer.open(tmp_path, **OPEN)


_OPEN_CHILD = """
import sys, time
import lakebuffer as lb
from lakebuffer.tiers.wal import WriteAheadLog
from lakebuffer.tiers.warm import WarmTier

where, at = sys.argv[2], int(sys.argv[3])
calls = [0]

def pause_after(cls, name):  # the parent kills the process while it sleeps here
    orig = getattr(cls, name)
    def wrapper(self, *a, **k):
        out = orig(self, *a, **k)
        calls[0] += 1
        if calls[0] == at:
            print("paused", flush=True)
            time.sleep(30)
        return out
    setattr(cls, name, wrapper)

if where != "none":
    pause_after(WarmTier if where == "adopt" else WriteAheadLog, where)
print("imported", flush=True)
lb.ReplayBuffer.open(sys.argv[1], memory_limit_mb=256, snapshot_interval_s=0).close()
print("opened", flush=True)
"""

#: where a reopen adopting 24 segments is killed: after the n-th link (before the index write), after the
#: n-th WAL name is removed (after it), or at a random moment after the imports
KILL_POINTS = [("adopt", 1), ("remove", 12), ("adopt", 13), ("adopt", 24), ("remove", 1), ("remove", 24),
               ("none", 0), ("none", 0)]


@fast_and_full("kills", KILL_POINTS[:2], KILL_POINTS)
def test_a_kill_minus_nine_at_any_point_of_the_adopting_reopen_loses_and_duplicates_nothing(tmp_path, kills):
    """SIGKILL a reopen that is adopting 24 segments (inside the adoption: after some links and before the
    index write, or after it with WAL names left; or at a random moment), then open again: every
    acknowledged row once, bit-exact, and the WAL's segments all adopted once."""
    rng = random.Random(23)
    for i, (where, at) in enumerate(kills):
        path = tmp_path / f"b{i}"
        with lb.ReplayBuffer.open(path, **OPEN) as buf:
            keys = []
            for seed in range(24):
                keys += buf.push(make_rollouts(96, tokens=1024, seed=seed)).to_pylist()
            rows = buf.get(keys, COLUMNS)
        proc = subprocess.Popen([sys.executable, "-c", _OPEN_CHILD, str(path), where, str(at)], cwd=ROOT,
                                stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"imported"
        if where == "none":
            time.sleep(rng.uniform(0.0, 0.2))
        else:
            assert proc.stdout.readline().strip() == b"paused", (where, at)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        left = len(list((path / "wal").glob("*.arrow")))
        if where == "adopt":  # linked, index not written: every segment still in the WAL
            assert left == 24 and len(list((path / "warm").glob("*.arrow"))) == at
        elif where == "remove":
            assert left == 24 - at
        with lb.ReplayBuffer.open(path, **OPEN) as buf:
            counts = buf.sql("SELECT count(*) AS n, count(DISTINCT key) AS d FROM rollouts").to_pylist()
            assert counts == [{"n": len(keys), "d": len(keys)}], (where, at)
            assert buf.get(keys, COLUMNS).equals(rows)
            assert buf.stats()["tiers"]["warm"]["rows"] == len(keys)
        assert not list((path / "wal").glob("*.arrow"))
        assert len(list((path / "warm").glob("*.arrow"))) == 24  # one fragment a batch: none twice
