"""Damage is reported as the damaged part's (issue 15, guarantees 3, 6, 7): a key index that RocksDB
cannot read while a restore resumes is the index's damage (``CorruptionError`` naming the index and
``lakebuffer fsck --repair``), not "the lake interrupted the restore"; a damaged lake file met at the
same point is the lake's. Either way nothing is served half-restored, and the named fix works.

The index damage is real: one bit flipped in a RocksDB data block of ``k/`` entries (checked by its
block checksum), which the read-only look at open does not read and the resume's key lookup does.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import lakebuffer as lb
from lakebuffer.fsck import check as fsck
from tests.rollouts import make_rollouts

RUN = "ix"


class _Stop(Exception):
    """Raised from the progress callback: the restore stops part way (a crash, as far as the index knows)."""


def _half_restored(tmp_path: Path, part: int = 2) -> tuple[str, list[str], Path]:
    """A lake with 8 commits of run ``RUN`` and a directory whose restore stopped after 4096 / ``part`` rows
    (``part=4`` where files must stay uncopied: an eager restore copies up to ~4 files ahead of its indexing)
    (``restore="eager"``: these cases are about the copy of every row; a lazy resume reads only the
    metadata columns, tests/test_open_metadata.py)."""
    lake = f"file://{tmp_path / 'lake'}"
    keys: list[str] = []
    with lb.ReplayBuffer.open(tmp_path / "src", lake=lake, snapshot_interval_s=0, memory_limit_mb=1, run_id=RUN) as src:
        for v in range(8):
            keys += src.push(make_rollouts(512, tokens=8, version=v, seed=v)).to_pylist()
            src.snapshot(wait=True)

    def stop_half_way(done: int, total: int) -> None:
        if done >= total // part:
            raise _Stop

    dst = tmp_path / "dst"
    with pytest.raises(_Stop):
        lb.ReplayBuffer.open(dst, lake=lake, snapshot_interval_s=0, memory_limit_mb=1, restore="eager", run_id=RUN,
                             progress=stop_half_way)
    return lake, keys, dst


def _flip_key_block(index: Path) -> None:
    """Flip a bit inside a data block of the index's ``k/`` entries, away from the first and last ones
    (the first block also holds batch records, which open reads; the last one is read to continue the
    key sequence): the resume's lookup of already restored keys reads it."""
    for sst in sorted(index.glob("*.sst")):
        data = bytearray(sst.read_bytes())
        at = [m.start() for m in re.finditer(rb"k/" + RUN.encode() + rb"-", data)]
        if len(at) >= 8:
            data[at[len(at) // 4] + 8] ^= 0x01
            sst.write_bytes(bytes(data))
            return
    raise AssertionError(f"no SST of {index} holds enough k/ entries")


def _keys(buf: lb.ReplayBuffer) -> list[str]:
    return sorted(buf.sql("SELECT key FROM rollouts").column(0).to_pylist())


def test_index_damage_met_while_resuming_a_restore_is_reported_as_the_index(tmp_path):
    lake, keys, dst = _half_restored(tmp_path)
    _flip_key_block(dst / "index")
    with pytest.raises(lb.CorruptionError) as err:
        lb.ReplayBuffer.open(dst, lake=lake, snapshot_interval_s=0, memory_limit_mb=1, restore="eager")
    msg = str(err.value)
    assert msg.startswith(f"the key index {dst / 'index'} is damaged"), msg  # the index, first
    assert f"lakebuffer fsck --repair {dst}" in msg
    assert "not at fault" in msg and "once the lake is reachable" not in msg  # not blamed on the lake
    rep = fsck(dst, repair=True)  # the fix it names: rebuild the index, keeping the unfinished restore's mark
    assert any("rebuilt the index" in r for r in rep["repaired"])
    assert any("unfinished restore" in r for r in rep["repaired"])
    with lb.ReplayBuffer.open(dst, lake=lake, snapshot_interval_s=0, memory_limit_mb=1, restore="eager") as buf:
        assert _keys(buf) == sorted(keys)  # resumed to the whole run, each row once: never half-open


def test_lake_damage_met_while_resuming_a_restore_is_reported_as_the_lake(tmp_path):
    lake, keys, dst = _half_restored(tmp_path, part=4)
    # the newest file not copied yet (an eager restore copies each file, verified, then indexes it from the copy)
    copied = {p.name for p in (dst / "mirror").rglob("*.parquet")}
    last = max((p for p in (tmp_path / "lake").rglob("*.parquet") if p.name not in copied),
               key=lambda p: p.stat().st_mtime_ns)
    good = last.read_bytes()
    data = bytearray(good)
    data[len(data) // 2] ^= 0x01
    last.write_bytes(bytes(data))
    with pytest.raises(lb.CorruptionError) as err:
        lb.ReplayBuffer.open(dst, lake=lake, snapshot_interval_s=0, memory_limit_mb=1, restore="eager")
    msg = str(err.value)
    assert "interrupted" in msg and last.name in msg and "damaged lake file" in msg
    assert "key index" not in msg and "fsck" not in msg  # the index is fine: no index repair is asked for
    last.write_bytes(good)  # the lake file restored from a copy: the restore resumes
    with lb.ReplayBuffer.open(dst, lake=lake, snapshot_interval_s=0, memory_limit_mb=1, restore="eager") as buf:
        assert _keys(buf) == sorted(keys)
