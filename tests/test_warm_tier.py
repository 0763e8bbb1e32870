"""The IPC warm tier in a buffer (issue 17): one write per byte, deletes in place, self-describing files."""

from __future__ import annotations

import os
import shutil

import pyarrow as pa

import lakebuffer as lb
from lakebuffer.fsck import check as fsck
from tests.rollouts import make_rollouts

OPEN = {"memory_limit_mb": 16, "snapshot_interval_s": 0}


def test_write_back_promotes_the_wal_segment_without_writing_it_again(tmp_path):
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        keys = buf.push(make_rollouts(256, tokens=2048, seed=1)).to_pylist()  # ~4 MB: one hot batch
        (bid,) = list(buf._batches)
        seg = os.stat(tmp_path / "wal" / f"{bid:016d}.arrow")
        buf.evict_all()
        info = buf._batches[bid]
        assert info.tier == "warm"
        frag = os.stat(tmp_path / "warm" / f"{info.fragment:016d}.arrow")
        assert (frag.st_ino, frag.st_size) == (seg.st_ino, seg.st_size)  # the same file: linked, not copied
        assert not (tmp_path / "wal" / f"{bid:016d}.arrow").exists()
        got = buf.get(keys[::-7], ["key", "response_ids"])
        assert got.column("key").to_pylist() == keys[::-7]
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:  # and it is read back (verified) after a restart
        assert buf.get(keys[:5], ["key"]).column(0).to_pylist() == keys[:5]
    assert fsck(tmp_path)["ok"]


def test_small_batches_are_coalesced_into_one_fragment(tmp_path):
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        for i in range(6):
            buf.push(make_rollouts(8, tokens=16, seed=i))
        buf.evict_all()
        assert len({i.fragment for i in buf._batches.values()}) == 1
        assert buf.stats()["warm"]["rows"] == 48


def test_warm_delete_hides_rows_everywhere_and_survives_reopen_and_index_rebuild(tmp_path):
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        keys = buf.push(make_rollouts(256, tokens=2048, seed=2)).to_pylist()
        buf.evict_all()
        gone, kept = keys[10:20], keys[:10] + keys[20:]
        assert buf.delete(keys=gone) == 10
        assert buf.stats()["warm"]["rows"] == 246
        for view in ("warm", "rollouts"):
            assert sorted(buf.sql(f"SELECT key FROM {view}").column(0).to_pylist()) == sorted(kept)
        assert sorted(k for b in buf.scan(columns=["key"]) for k in b.column(0).to_pylist()) == sorted(kept)
        with_payload = buf.get(kept, ["key", "response_ids"])  # positions of kept rows did not move
        assert with_payload.column("key").to_pylist() == kept
        try:
            buf.get(gone[:1])
            raise AssertionError("a deleted key was served")
        except lb.KeyNotFoundError:
            pass
        before = with_payload
    assert fsck(tmp_path)["ok"]
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        assert buf.get(kept, ["key", "response_ids"]).equals(before)
        assert buf.count() == 246
    shutil.rmtree(tmp_path / "index")  # the fragments describe themselves: fsck rebuilds the index
    rep = fsck(tmp_path, repair=True)
    assert any("rebuilt the index" in r for r in rep["repaired"])
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        assert sorted(buf.sql("SELECT key FROM rollouts").column(0).to_pylist()) == sorted(kept)
        assert buf.get(kept, ["key", "response_ids"]).equals(before)


def test_empty_key_is_refused(tmp_path):
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        t = make_rollouts(2, tokens=4)
        t = t.set_column(t.column_names.index("key"), "key", pa.array(["", "a"])) if "key" in t.column_names \
            else t.append_column("key", pa.array(["", "a"]))
        try:
            buf.push(t)
            raise AssertionError("an empty key was accepted")
        except lb.SchemaError as e:
            assert "empty" in str(e)
