"""A cold ``get`` whose rows move while it reads them, and what finding a cold row costs.

``engine/reads._take_cold`` reads cold rows from the lake locations it was given under the engine's
lock; when one turns out stale (a compaction or lake delete rewrote its file) it finds the rows again
and reads once more. Between the first read and the retry a promotion (``promote_cold_reads``, a lazy
resume's warming) may have moved the batch back to the warm tier: the retry must then plan the keys by
tier again, not ask the index for cold locations the promotion dropped (that was a ``CorruptionError``
for a healthy buffer). The interleaving is forced deterministically: the first cold read promotes the
batch, then reports its location stale.

``ColdTier.locate`` (moving a fragment out, relocating) reads the key column of the files whose key
range may hold the keys, never a whole file (the whole-file sha256 is for scans, restore and fsck).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

import lakebuffer as lb
from lakebuffer.lake.verified import forget_verified
from lakebuffer.tiers.cold import StaleLocation
from tests.rollouts import make_rollouts

LIMIT_GB = 2 / 1024  # most of the ~6 MiB pushed leaves local disk
COLS = ["key", "policy_version", "response_ids", "reward"]


def _open(path: Path, lake: str, **kw) -> lb.ReplayBuffer:
    return lb.ReplayBuffer.open(path, lake=lake, memory_limit_mb=2, snapshot_interval_s=0, disk_limit_gb=LIMIT_GB, **kw)


def _fill(buf: lb.ReplayBuffer, batches: int = 24) -> pa.Table:
    pushed = []
    for i in range(batches):
        t = make_rollouts(64, tokens=256, version=i % 3, seed=i)
        pushed.append(t.append_column("key", buf.push(t)))
        if i % 4 == 3:
            buf.snapshot(wait=True)
    buf.snapshot(wait=True)
    buf.flush()
    return pa.concat_tables(pushed)


def test_a_cold_get_whose_batch_is_promoted_before_its_retry_reads_it_from_the_warm_tier(tmp_path):
    with _open(tmp_path / "buf", str(tmp_path / "lake"), promote_cold_reads=False) as buf:
        ref = _fill(buf)
        s = buf._state
        bid = s.cold.batch_ids()[0]
        keys = s.index.batch_meta(bid).column("key").to_pylist()[:5]
        assert all(s.batches[int(b)].tier == "cold" for b in s.index.lookup(keys)[0].tolist())
        real = s.cold.take_checked
        calls = {"n": 0}

        def promote_then_stale(where, columns, ks):
            calls["n"] += 1
            if calls["n"] == 1:  # the get's first read: the batch goes warm under it, its location goes stale
                s.cold.take_checked = real
                try:
                    assert buf._promotion.promote(bid)
                finally:
                    s.cold.take_checked = promote_then_stale
                raise StaleLocation("forced by the test")
            return real(where, columns, ks)

        s.cold.take_checked = promote_then_stale
        try:
            got = buf.get(keys, COLS)
        finally:
            s.cold.take_checked = real
        assert s.batches[bid].tier == "warm"
        want = ref.filter(pa.compute.is_in(ref.column("key"), pa.array(keys))).select(COLS)
        order = {k: i for i, k in enumerate(want.column("key").to_pylist())}
        want = want.take(pa.array([order[k] for k in keys]))
        assert got.select(COLS).cast(want.schema).equals(want)
        assert calls["n"] == 1  # the retry read the warm tier, not the lake


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar")


def test_locating_cold_keys_reads_key_columns_not_whole_files(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "buf", lake=str(tmp_path / "lake"), memory_limit_mb=64,
                              snapshot_interval_s=0) as buf:
        keys = []
        for i in range(8):  # one policy version, one snapshot: one lake file of ~4 MB
            keys += buf.push(make_rollouts(64, tokens=1024, version=0, seed=i)).to_pylist()
        buf.snapshot(wait=True)
        s = buf._state
        keys = keys[100:110]
        m = buf.lake.latest_manifest(buf.run_id)
        forget_verified()  # a fresh process: no file checked yet
        s.cold.invalidate()
        before = _rchar()
        files, _fi, _row, found = s.cold.locate(keys)
        read = _rchar() - before
        assert found.all() and files
        lake_bytes = sum(int(e["bytes"]) for e in m["files"])
        assert min(int(e["bytes"]) for e in files) > 2 << 20
        assert read < 0.1 * sum(int(e["bytes"]) for e in files), (read, lake_bytes)  # the sha256 read them all
