"""Integrity of the local tiers (issue 15, guarantees 2 and 3).

No read returns or copies data that fails its checksum (warm fragments, WAL segments), repair only
copies from a verified lake, and a damaged key index makes ``open`` refuse (deleting nothing) until
``fsck --repair`` rebuilds it from the fragments and WAL.
"""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

import lakebuffer as lb
from lakebuffer.fsck import check as fsck
from tests.rollouts import make_rollouts

OPEN = {"memory_limit_mb": 64, "snapshot_interval_s": 0}


def flip(path: Path, at: float = 0.5) -> None:
    """Flip one bit of a file in place (same size: only a checksum can tell)."""
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    path.write_bytes(bytes(data))


def warm_files(buf: lb.ReplayBuffer) -> list[Path]:
    data = buf.path / "warm"
    return sorted({data / f for i in buf._batches.values() if i.tier == "warm" for f in i.files})


def contents(buf: lb.ReplayBuffer) -> pa.Table:
    """Every row's key and payload, sorted by key (what a rebuild must give back)."""
    keys = sorted(buf.sql("SELECT key FROM rollouts").column(0).to_pylist())
    return buf.get(keys, ["key", "reward", "response_ids", "prompt_id"])


def listing(path: Path) -> dict[str, bytes]:
    """Every file outside the index (whose files RocksDB may rewrite) with its bytes."""
    out = {}
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path)
        if p.is_file() and rel.parts[0] != "index" and p.name != "LOCK":
            out[str(rel)] = p.read_bytes()
    return out


# guarantee 2: no read returns corrupted data ------------------------------------------------
def test_flipped_warm_byte_fails_every_read_and_copy_path(tmp_path):
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        keys = buf.push(make_rollouts(256, tokens=64, seed=1)).to_pylist()
        buf.evict_all()
        (victim,) = warm_files(buf)
    flip(victim)
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        name = victim.name
        every = buf.schema.names  # reads that take in the flipped byte (a take checks only the chunks it reads)
        with pytest.raises(lb.CorruptionError, match=name):
            buf.get(keys, every)
        with pytest.raises(lb.CorruptionError, match=name):
            buf.sample(256, columns=every)
        with pytest.raises(lb.CorruptionError, match=name):
            buf.sql("SELECT sum(list_sum(response_ids)) FROM rollouts")
        with pytest.raises(lb.CorruptionError, match=name):
            list(buf.scan(columns=["key", "response_ids"]))
        with pytest.raises(lb.CorruptionError, match="fsck --repair"):
            buf.snapshot(wait=True)
        # metadata alone (the catalog) is still served
        assert buf.sql("SELECT count(*) FROM meta").column(0)[0].as_py() == 256
    assert not list((tmp_path / "lake").rglob("*.parquet"))  # the lake received nothing
    report = fsck(tmp_path)
    assert not report["ok"] and any(name in p for p in report["problems"])


def test_file_changed_while_open_is_verified_again(tmp_path):
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        keys = buf.push(make_rollouts(64, tokens=64, seed=2)).to_pylist()
        buf.evict_all()
        assert buf.get(keys, ["response_ids"]).num_rows == 64  # verified (and cached) once
        (victim,) = warm_files(buf)
        flip(victim)  # a later write changes (size, mtime): the cache does not vouch for it any more
        with pytest.raises(lb.CorruptionError, match=victim.name):
            buf.get(keys, ["response_ids"])


def test_flipped_wal_segment_is_refused_by_every_read_after_a_reopen_and_flagged_by_fsck(tmp_path):
    """A reopen adopts a hot batch's WAL segment as a warm fragment without reading its rows (an open is
    O(metadata)), so the flipped byte is found where it is read: every read path refuses it, naming the file."""
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        keys = buf.push(make_rollouts(64, tokens=4096, seed=3)).to_pylist()  # a batch over PROMOTE_BYTES
    (seg,) = sorted((tmp_path / "wal").glob("*.arrow"))
    flip(seg, 0.4)
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        (adopted,) = warm_files(buf)
        assert not seg.exists()  # the batch's segment is now its warm fragment (one name, one copy)
        every = buf.schema.names
        for read in (lambda: buf.get(keys, every), lambda: buf.sample(64, columns=every),
                     lambda: buf.sql("SELECT sum(list_sum(response_ids)) FROM rollouts"),
                     lambda: list(buf.scan(columns=["key", "response_ids"]))):
            with pytest.raises(lb.CorruptionError, match=adopted.name):
                read()
        with pytest.raises(lb.CorruptionError, match="fsck --repair"):
            buf.snapshot(wait=True)
    report = fsck(tmp_path)
    assert not report["ok"] and any(adopted.name in p for p in report["problems"])
    rep = fsck(tmp_path, repair=True)  # nothing verified to rebuild from: reported lost, not served
    assert len(rep["lost_keys"]) == 64 and not rep["ok"]
    assert list((tmp_path / "quarantine").rglob("*.arrow"))  # kept aside, not deleted
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        assert len(buf) == 0


def test_a_wal_segment_with_a_damaged_footer_is_still_refused_on_open(tmp_path):
    """A segment whose footer cannot be read cannot be checked chunk by chunk: the reopen reads it whole,
    as before, and refuses it naming the segment."""
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        buf.push(make_rollouts(64, tokens=4096, seed=3))  # one it would adopt
    (seg,) = sorted((tmp_path / "wal").glob("*.arrow"))
    flip(seg, 0.9999)
    with pytest.raises(lb.CorruptionError, match=seg.name):
        lb.ReplayBuffer.open(tmp_path, **OPEN)
    assert seg.exists() and not list((tmp_path / "warm").glob("*.arrow"))


def test_fsck_repairs_only_from_a_lake_copy_that_verifies(tmp_path):
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        keys = buf.push(make_rollouts(256, tokens=64, seed=4)).to_pylist()
        buf.evict_all()
        buf.snapshot(wait=True)
        before = contents(buf)
        (victim,) = warm_files(buf)
    flip(victim)
    (parquet,) = sorted((tmp_path / "lake").rglob("*.parquet"))
    good = parquet.read_bytes()
    flip(parquet)
    rep = fsck(tmp_path, repair=True)
    assert not rep["ok"] and not rep["lost_keys"]
    assert any("lake's copy fails its check" in p for p in rep["problems"])
    assert not any("rebuilt" in r for r in rep["repaired"])
    assert not fsck(tmp_path)["ok"]  # still broken: never reported ok after refusing
    parquet.write_bytes(good)
    rep = fsck(tmp_path, repair=True)
    assert rep["lost_keys"] == [] and any("rebuilt" in r for r in rep["repaired"])
    assert fsck(tmp_path)["ok"]
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        assert contents(buf).equals(before) and len(buf) == len(keys)


# guarantee 3: recovery never deletes data because metadata is unreadable ---------------------
def _fill(path: Path) -> tuple[pa.Table, list[str]]:
    """Snapshotted warm rows, unsnapshotted warm rows and hot rows (in the WAL)."""
    with lb.ReplayBuffer.open(path, **OPEN) as buf:
        keys = []
        for v in range(3):
            keys += buf.push(make_rollouts(128, tokens=64, version=v, seed=v)).to_pylist()
        buf.evict_all()
        buf.delete(keys=keys[:5])  # deleted rows leave gaps in a fragment
        buf.snapshot(wait=True)
        for v in range(3, 6):
            keys += buf.push(make_rollouts(128, tokens=64, version=v, seed=v)).to_pylist()
        buf.evict_all()
        keys += buf.push(make_rollouts(64, tokens=64, version=6, seed=6)).to_pylist()
        assert buf.stats()["hot"]["rows"] == 64
        return contents(buf), keys[5:]


def _damage(path: Path, how: str) -> None:
    index = path / "index"
    if how == "manifest":
        (m,) = glob.glob(str(index / "MANIFEST-*"))
        os.truncate(m, os.path.getsize(m) // 2)
    elif how == "current":
        (index / "CURRENT").write_bytes(b"garbage\n")
    elif how == "sst":
        for s in sorted(index.glob("*.sst")):
            flip(s, 0.3)
    elif how == "deleted":
        shutil.rmtree(index)


@pytest.mark.parametrize("how", ["manifest", "current", "sst", "deleted"])
def test_damaged_index_refuses_to_open_and_fsck_rebuilds_every_row(tmp_path, how):
    before, keys = _fill(tmp_path)
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        buf.flush()  # the index's memtable into SST files, so each kind of damage has a target
        buf.index.flush()
    assert list((tmp_path / "index").glob("*.sst"))
    _damage(tmp_path, how)
    files = listing(tmp_path)
    ssts = set((tmp_path / "index").glob("*.sst"))
    with pytest.raises(lb.CorruptionError, match="fsck --repair"):
        lb.ReplayBuffer.open(tmp_path, **OPEN)
    assert listing(tmp_path) == files  # nothing deleted or changed
    assert ssts <= set((tmp_path / "index").glob("*.sst"))  # RocksDB deleted none of the index's data either
    assert not fsck(tmp_path)["ok"]

    rep = fsck(tmp_path, repair=True)
    assert not rep["ok"] and any("rebuilt the index" in r for r in rep["repaired"])
    assert any("replay counts" in p for p in rep["problems"])  # what was only in the index is said lost
    assert fsck(tmp_path)["ok"]
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        assert contents(buf).equals(before)
        new = buf.push(make_rollouts(32, tokens=8, seed=99)).to_pylist()
        assert not set(new) & set(keys) and len(buf) == len(keys) + 32
        buf.snapshot(wait=True)  # rows the lake already held are not uploaded twice
        lake_keys = buf.sql("SELECT key FROM cold").column(0).to_pylist()
        assert len(lake_keys) == len(set(lake_keys)) == len(keys) + 32


def test_rolled_back_index_does_not_drop_fragments_it_forgot(tmp_path):
    """An index older than the fragments (as a truncated MANIFEST can leave) refuses; fsck restores all."""
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        keys = buf.push(make_rollouts(128, tokens=64, seed=7)).to_pylist()
        buf.evict_all()
    shutil.copytree(tmp_path / "index", tmp_path.parent / "old-index")
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        keys += buf.push(make_rollouts(128, tokens=64, seed=8)).to_pylist()
        buf.evict_all()
        before = contents(buf)
    shutil.rmtree(tmp_path / "index")
    shutil.copytree(tmp_path.parent / "old-index", tmp_path / "index")
    files = listing(tmp_path)
    with pytest.raises(lb.CorruptionError, match="fsck --repair"):
        lb.ReplayBuffer.open(tmp_path, **OPEN)
    assert listing(tmp_path) == files
    fsck(tmp_path, repair=True)
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        assert contents(buf).equals(before) and len(buf) == len(keys)


def test_crash_leftovers_are_still_cleaned_and_unknown_wal_is_quarantined(tmp_path):
    """What a crash leaves is still recognised: an install that never recorded its batch is dropped,
    a WAL segment of a batch the index does not know is moved aside (never deleted, never served)."""
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        keys = buf.push(make_rollouts(64, tokens=16, seed=9)).to_pylist()
        (seg,) = sorted((tmp_path / "wal").glob("*.arrow"))
        # a crashed install: noted in flight, fragment written, index record never made
        bid = buf.index.reserve_batch()
        buf.index.begin_install(bid)
        buf.warm.stage(_rows_like(buf, 16))
    stray = tmp_path / "wal" / f"{10**6:016d}.arrow"
    shutil.copy(seg, stray)  # a push that crashed before its acknowledgement
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        assert sorted(buf.sql("SELECT key FROM rollouts").column(0).to_pylist()) == sorted(keys)
        assert buf.warm.fragment_ids() == []
    assert not stray.exists() and (tmp_path / "quarantine" / "wal" / stray.name).exists()


def _rows_like(buf: lb.ReplayBuffer, n: int) -> pa.Table:
    """``n`` conformed rows with keys the index does not know (what an install writes)."""
    t = buf.get(buf.sql("SELECT key FROM rollouts LIMIT 1").column(0).to_pylist() * n)
    return t.set_column(t.schema.get_field_index("key"), "key", pa.array([f"ghost-{i}" for i in range(n)]))
