"""Issue 16 parts 2, 3, 5: the local disk budget and the cold tier serving reads.

A buffer with ``disk_limit_gb`` at about a quarter of the data pushed keeps its directory under the
limit (+ one fragment) by moving fragments already in the lake off local disk; every row stays
readable, with identical values, through ``get``, ``sample``, ``sql`` and ``scan``, across reopen,
deletes, lake rewrites (deletes, compaction) and kill -9 during the tier moves. With the lake down
and the budget passed, ``push`` raises ``BackpressureError`` and stores nothing.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import lakebuffer as lb
from lakebuffer.engine.diskbudget import dir_bytes
from lakebuffer.errors import BackpressureError, CorruptionError, KeyNotFoundError
from lakebuffer.fsck import check as fsck
from lakebuffer.tiers import Location
from tests.rollouts import make_rollouts
from tests.sizes import fast_and_full

ROOT = Path(__file__).resolve().parent.parent
LIMIT_GB = 4 / 1024  # 4 MiB: a quarter of the ~16 MiB pushed below
COLS = ["key", "policy_version", "response_ids", "reward"]


def _local_bytes(path: Path) -> int:
    """What the budget covers, measured independently: the directory minus DuckDB's spill folder."""
    return dir_bytes(path) - dir_bytes(path / "tmp")


def _fill(buf: lb.ReplayBuffer, batches: int = 84, snapshot_every: int = 4, seed: int = 0) -> tuple[pa.Table, int, int]:
    """Push ~16 MiB (snapshotting now and then); the pushed rows with their keys, the peak local bytes
    and the bytes pushed."""
    pushed, peak, total = [], 0, 0
    for i in range(batches):
        t = make_rollouts(64, tokens=256, version=i % 5, seed=seed + i)
        total += t.nbytes
        keys = buf.push(t)
        pushed.append(t.append_column("key", keys))
        if i % snapshot_every == snapshot_every - 1:
            buf.snapshot(wait=True)
        peak = max(peak, _local_bytes(buf.path))
    buf.flush()
    return pa.concat_tables(pushed).select(COLS), peak, total


def _by_key(t: pa.Table) -> pa.Table:
    return t.select(COLS).sort_by("key")


def _same(a: pa.Table, b: pa.Table) -> bool:
    """Same rows and values in the same order (field names and nullability aside: SQL renames list items)."""
    schema = pa.schema([pa.field(f.name, f.type) for f in b.select(COLS).schema])
    return a.select(COLS).cast(schema).equals(b.select(COLS).cast(schema))


def _open(path: Path, lake: str, **kw) -> lb.ReplayBuffer:
    return lb.ReplayBuffer.open(path, lake=lake, memory_limit_mb=2, snapshot_interval_s=0, disk_limit_gb=LIMIT_GB, **kw)


def test_disk_limit_keeps_the_directory_under_budget_and_every_row_readable_identically(tmp_path):
    path, lake = tmp_path / "buf", str(tmp_path / "lake")
    with _open(path, lake) as buf:
        ref, peak, total = _fill(buf)
        assert total > 3.5 * LIMIT_GB * 2**30  # the data is ~4x the budget
        biggest = max(buf.warm.fragment_bytes(f) for f in buf.warm.fragment_ids())
        assert peak <= LIMIT_GB * 2**30 + max(biggest, 1 << 20), (peak, biggest)
        st = buf.stats()
        assert st["tiers"]["cold"]["rows"] > ref.num_rows // 2  # most rows left local disk
        assert sum(t["rows"] for t in st["tiers"].values()) == ref.num_rows == st["rows"] == len(buf)
        assert st["disk"]["fragments_moved_to_lake"] > 0

        keys = ref.column("key").to_pylist()
        got = buf.get(keys, COLS)  # every row, in the order asked
        assert got.column("key").to_pylist() == keys
        assert _same(got, ref)
        assert buf.stats()["reads"]["rows_from"]["cold"] >= st["tiers"]["cold"]["rows"]

        expect = _by_key(ref)
        assert _same(_by_key(buf.sql("SELECT key, policy_version, response_ids, reward FROM rollouts")), expect)
        scanned = pa.Table.from_batches(list(buf.scan(columns=COLS)))
        assert _same(_by_key(scanned), expect)
        assert buf.sql("SELECT count(*) n, count(DISTINCT key) d FROM rollouts WHERE policy_version >= 3").to_pylist() == [
            {"n": int(pc.sum(pc.greater_equal(ref.column("policy_version"), 3)).as_py()),
             "d": int(pc.sum(pc.greater_equal(ref.column("policy_version"), 3)).as_py())}]

        before = buf.stats()["reads"]["rows_from"]["cold"]
        sampled = buf.sample(300, columns=COLS, seed=3)
        assert buf.stats()["reads"]["rows_from"]["cold"] > before  # cold rows are sampled like the others
        want = ref.take(pc.index_in(sampled.column("key"), value_set=ref.column("key")))
        assert _same(sampled, want)
        # a payload predicate reaches cold rows too (it runs over ``rollouts``)
        hit = buf.sample(50, where="list_count(response_ids) = 256 AND reward >= 0", return_keys=True, seed=4)
        assert len(hit) == 50
        # the datasets (a buffer source streams ``scan``): every row once over the shards, values intact
        from lakebuffer.dataset.shuffle import iter_batches

        shards = [pa.Table.from_batches(list(iter_batches(buf, columns=COLS, batch_size=500, shuffle=True,
                                                          shard=i, num_shards=2))) for i in range(2)]
        assert _same(_by_key(pa.concat_tables(shards)), expect)
    assert fsck(path)["ok"]


def test_cold_rows_survive_reopen_deletes_lake_rewrites_and_compaction(tmp_path):
    path, lake = tmp_path / "buf", str(tmp_path / "lake")
    with _open(path, lake) as buf:
        ref, _, _ = _fill(buf, batches=40)
    ref_keys = ref.column("key").to_pylist()
    with _open(path, lake) as buf:
        cold_batches = buf._state.cold.batch_ids()
        assert cold_batches
        meta = buf.index.batch_meta(cold_batches[0])
        gone = meta.column("key").to_pylist()[:5]
        assert buf.get(gone, ["key"]).column("key").to_pylist() == gone
        assert buf.delete(keys=gone) == 5
        with pytest.raises(KeyNotFoundError):
            buf.get(gone[:1])
        buf.snapshot(wait=True)  # the lake rewrites the files that held them: cold rows there move
        left = [k for k in ref_keys if k not in set(gone)]
        expect = _by_key(ref.filter(pc.is_in(ref.column("key"), value_set=pa.array(left))))
        assert _same(_by_key(buf.get(left, COLS)), expect)
        assert _same(_by_key(buf.sql("SELECT * FROM rollouts")), expect)
        buf.compact(target_file_bytes=64 << 20)  # every file rewritten: cold locations go stale
        assert _same(_by_key(buf.get(left, COLS)), expect)
        assert sum(b.num_rows for b in buf.scan(columns=["key"])) == len(left)
    report = fsck(path)
    assert report["ok"], report["problems"]


def test_a_flipped_byte_in_the_lake_file_a_cold_get_reads_raises_corruption_error(tmp_path):
    path, lake = tmp_path / "buf", str(tmp_path / "lake")
    with _open(path, lake) as buf:
        _fill(buf, batches=40)
        bid = buf._state.cold.batch_ids()[0]
        files, _, _ = buf.index.cold_locations(bid)
        target = Path(buf.lake.store.abs(files[0]["path"]))
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x01
        target.write_bytes(bytes(data))
        # a get reads (and verifies) only the pages of the rows it asks for (#23): ask for every row and
        # column of the file through the cold tier, so the damaged page is among those read
        keys = pq.read_table(target, columns=["key"]).column("key").to_pylist()
        cold = buf._state.cold
        where = Location.of(cold.number(files[0]), np.arange(len(keys)))
        every = [n for n in pq.read_schema(target).names if n != "_lb_hash"]
        with pytest.raises(CorruptionError, match=str(target)):
            cold.take_checked(where, every, keys)
        hot = buf.sql("SELECT key FROM hot LIMIT 1").column("key").to_pylist()
        assert buf.get(hot, ["key"]).column("key").to_pylist() == hot  # other tiers still serve


def test_a_get_of_warm_and_cold_rows_at_once_returns_them_in_order_and_names_a_damaged_warm_file(tmp_path):
    """A get whose keys are split between the warm and the cold tier: rows come back in the asked order
    with identical values, and damage in the warm fragment fails the whole get, naming the file."""
    path, lake = tmp_path / "buf", str(tmp_path / "lake")
    with _open(path, lake) as buf:
        pushed, _, _ = _fill(buf, batches=40)
        cold_keys = buf.sql("SELECT key FROM cold_rows ORDER BY key").column("key").to_pylist()
        warm_keys = buf.sql("SELECT key FROM warm ORDER BY key").column("key").to_pylist()
        assert cold_keys and warm_keys
        rng = random.Random(3)
        keys = rng.sample(cold_keys, 40) + rng.sample(warm_keys, 40)
        rng.shuffle(keys)
        before = dict(buf.stats()["reads"]["rows_from"])
        got = buf.get(keys, COLS)
        after = buf.stats()["reads"]["rows_from"]
        assert after["cold"] - before["cold"] == 40 and after["warm"] - before["warm"] == 40
        want = pushed.take(pc.index_in(pa.array(keys), pushed.column("key")))
        assert got.column("key").to_pylist() == keys and got.to_pylist() == want.to_pylist()

        # damage in the warm fragment of one asked warm row: the get fails, naming that file
        state = buf._state
        batch, _, _ = state.index.lookup([warm_keys[0]])
        warm_file = state.warm.file_of(state.batches[int(batch[0])].fragment)
        data = bytearray(warm_file.read_bytes())
        data[len(data) // 3] ^= 0x01
        warm_file.write_bytes(bytes(data))
        with pytest.raises(CorruptionError, match=warm_file.name):
            buf.get([cold_keys[0], warm_keys[0]], COLS)
        assert buf.get([cold_keys[0]], COLS).column("key").to_pylist() == [cold_keys[0]]


def test_push_backpressures_without_losing_anything_while_the_lake_is_down(tmp_path, s3_server, s3_bucket):
    path, lake = tmp_path / "buf", f"{s3_bucket}/lake"
    with _open(path, lake, storage_options=s3_server.storage_options, lake_timeout_s=10) as buf:
        ref, _, _ = _fill(buf, batches=24)
        acked = ref.column("key").to_pylist()
        s3_server.stop()
        try:
            refused = None
            for i in range(60):  # pushes go on until nothing more can leave local disk
                t = make_rollouts(64, tokens=256, seed=1000 + i).append_column(
                    "key", pa.array([f"down-{i}-{j}" for j in range(64)]))
                try:
                    buf.push(t)
                except BackpressureError as e:
                    refused = (i, str(e))
                    break
                acked += t.column("key").to_pylist()
            assert refused is not None, "the budget never pushed back"
            assert "the lake failed" in refused[1]
            n = len(buf)
            with pytest.raises(KeyNotFoundError):  # the refused batch stored nothing
                buf.get([f"down-{refused[0]}-0"])
            assert n == len(acked)
        finally:
            s3_server.start()
        keys = buf.push(make_rollouts(64, tokens=256, seed=99)).to_pylist()  # the lake is back: it snapshots
        acked += keys
        assert buf.get(acked, ["key"]).column("key").to_pylist() == acked
        stored = buf.sql("SELECT key FROM rollouts").column("key").to_pylist()
        assert sorted(stored) == sorted(acked)


# kill -9 during tier moves -----------------------------------------------------------------------

def _run_worker(path: Path, lake: str, seed: int, mode: str, delay: float) -> list[str]:
    """Run ``tests.cold_worker``; SIGKILL it after ``delay`` s (mode ``random``) or let it kill itself
    inside a tier move (mode ``in-move``); the keys it acknowledged."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.cold_worker", str(path), lake, str(seed), mode],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=delay)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err.decode()[-3000:]
    acked = []
    for line in out.splitlines():
        msg = json.loads(line)
        acked += msg.get("keys", [])
    return acked


def _check_once(path: Path, lake: str, acked: list[str], what: str) -> None:
    with _open(path, lake) as buf:
        stored = buf.sql("SELECT key FROM rollouts").column("key").to_pylist()
        assert len(stored) == len(set(stored)), f"{what}: a row is seen twice"
        missing = set(acked) - set(stored)
        assert not missing, f"{what}: {len(missing)} acknowledged rows lost"
        assert sum(b.num_rows for b in buf.scan(columns=["key"])) == len(stored)
        got = buf.get(acked, ["key"]).column("key").to_pylist()
        assert got == acked
    report = fsck(path)
    assert report["ok"], (what, report["problems"])


@fast_and_full("kills", 1, 6)
def test_kill_minus_nine_inside_a_tier_move_and_at_random_loses_nothing_and_reads_nothing_twice(tmp_path, kills):
    path, lake = tmp_path / "buf", str(tmp_path / "lake")
    acked = _run_worker(path, lake, 0, "in-move", 120)  # killed between the index write and the file's removal
    assert acked
    _check_once(path, lake, acked, "killed inside a move")
    rng = random.Random(16)
    for i in range(int(os.environ.get("LAKEBUFFER_CRASH_KILLS", kills))):
        acked += _run_worker(path, lake, i + 1, "random", rng.uniform(2.0, 5.0))
        _check_once(path, lake, acked, f"random kill {i}")
    with _open(path, lake) as buf:
        assert buf.stats()["tiers"]["cold"]["rows"] > 0  # the kills did land while rows were moving


@pytest.mark.parametrize("mode", ["promote-before", "promote-after"])
def test_kill_minus_nine_inside_a_promotion_loses_nothing_and_reads_nothing_twice(tmp_path, mode):
    path, lake = tmp_path / "buf", str(tmp_path / "lake")
    with _open(path, lake) as buf:
        ref, _, _ = _fill(buf, batches=40)
        buf.snapshot(wait=True)
        cold_before = buf.stats()["tiers"]["cold"]["rows"]
    assert cold_before > 0
    proc = subprocess.run([sys.executable, "-m", "tests.cold_worker", str(path), lake, "0", mode], cwd=ROOT,
                          capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1])["killed_in"] == mode  # it died inside the promotion
    keys = ref.column("key").to_pylist()
    _check_once(path, lake, keys, f"killed {mode}")
    with _open(path, lake) as buf:
        cold_after = buf.stats()["tiers"]["cold"]["rows"]
        assert _same(buf.get(keys, COLS), ref)
    # before the index write the batch stays cold (its fragment dropped on open); after it, it is warm
    assert (cold_after == cold_before) if mode == "promote-before" else (cold_after < cold_before)


def test_promote_cold_reads_brings_read_batches_back_within_the_disk_budget(tmp_path):
    path, lake = tmp_path / "buf", str(tmp_path / "lake")
    with _open(path, lake) as buf:
        ref, _, _ = _fill(buf, batches=40)
        buf.snapshot(wait=True)
        cold_keys = buf.sql("SELECT key FROM cold_rows ORDER BY key").column("key").to_pylist()
        buf.get(cold_keys[:100], COLS)
        buf.flush()
        assert buf.stats()["reads"]["promoted_batches"] == 0  # off by default
        assert buf.stats()["tiers"]["cold"]["rows"] == len(cold_keys)
    with _open(path, lake, promote_cold_reads=True) as buf:  # near its budget: only what fits comes back
        buf.get(cold_keys, COLS)
        buf.flush()
        assert buf.stats()["tiers"]["cold"]["rows"] > 0
        assert _local_bytes(path) <= LIMIT_GB * 2**30
    room = 64 / 1024
    with lb.ReplayBuffer.open(path, lake=lake, memory_limit_mb=2, snapshot_interval_s=0, disk_limit_gb=room,
                              promote_cold_reads=True) as buf:
        still_cold = buf.sql("SELECT key FROM cold_rows ORDER BY key").column("key").to_pylist()
        asked = still_cold[:100]
        first = buf.get(asked, COLS)
        buf.flush()  # the promotions ran on the write-back worker
        st = buf.stats()
        assert st["reads"]["promoted_batches"] > 0
        assert st["tiers"]["cold"]["rows"] <= len(still_cold) - len(asked)  # every batch read left the cold tier
        assert sum(t["rows"] for t in st["tiers"].values()) == ref.num_rows == len(buf)
        cold_reads = st["reads"]["rows_from"]["cold"]
        again = buf.get(asked, COLS)
        assert buf.stats()["reads"]["rows_from"]["cold"] == cold_reads  # served locally now
        assert _same(again, first)
        assert _same(buf.get(ref.column("key").to_pylist(), COLS), ref)
        stored = buf.sql("SELECT key FROM rollouts").column("key").to_pylist()
        assert sorted(stored) == sorted(ref.column("key").to_pylist())  # each row once, none lost
        assert sum(b.num_rows for b in buf.scan(columns=["key"])) == ref.num_rows
        assert _local_bytes(path) <= room * 2**30
        snap = buf.snapshot(wait=True)
        assert snap is None or snap.rows == ref.num_rows  # promoted batches are not uploaded again
    assert fsck(path)["ok"]
    with _open(path, lake) as buf:  # back under the small budget: the promoted batches leave again on the next push
        assert _same(buf.get(ref.column("key").to_pylist(), COLS), ref)
        buf.push(make_rollouts(64, tokens=256, seed=999))
        assert _local_bytes(path) <= LIMIT_GB * 2**30 + (1 << 20)


def test_fsck_repair_of_a_lost_index_indexes_the_cold_rows_where_the_lake_holds_them(tmp_path):
    import shutil

    path, lake = tmp_path / "buf", str(tmp_path / "lake")
    with _open(path, lake) as buf:
        ref, _, _ = _fill(buf, batches=40)
        buf.snapshot(wait=True)
        assert buf.stats()["tiers"]["cold"]["rows"] > 0
    shutil.rmtree(path / "index")
    report = fsck(path, repair=True, lake=lake)
    assert any("only the lake holds" in r for r in report["repaired"]), report
    with _open(path, lake) as buf:
        assert buf.stats()["tiers"]["cold"]["rows"] > 0
        keys = ref.column("key").to_pylist()
        assert _same(buf.get(keys, COLS), ref)
        assert _same(_by_key(buf.sql("SELECT * FROM rollouts")), _by_key(ref))
    assert fsck(path)["ok"]


def test_warm_to_cold_follows_the_eviction_priority(tmp_path):
    path, lake = tmp_path / "buf", str(tmp_path / "lake")
    with _open(path, lake, evict="policy_version") as buf:
        _fill(buf, batches=48)
        versions = buf.sql("SELECT DISTINCT policy_version v FROM cold_rows ORDER BY v").column("v").to_pylist()
        # local = hot or warm (rows still in RAM are local too: how many wait for write-back depends on timing)
        local = buf.sql("SELECT DISTINCT policy_version v FROM rollouts WHERE key NOT IN (SELECT key FROM cold_rows) "
                        "ORDER BY v").column("v").to_pylist()
        assert versions and local
        assert min(versions) < max(local)  # low priorities left local disk first
        assert min(versions) == 0 and max(local) == 4


def test_a_restore_into_a_fresh_directory_stays_within_the_disk_budget(tmp_path):
    src, lake = tmp_path / "src", str(tmp_path / "lake")
    with lb.ReplayBuffer.open(src, lake=lake, memory_limit_mb=8, snapshot_interval_s=0, run_id="r") as buf:
        for i in range(60):
            buf.push(make_rollouts(64, tokens=256, seed=i))
        buf.snapshot(wait=True)
        n = len(buf)
    dst = tmp_path / "dst"
    with _open(dst, lake, run_id="r") as buf:  # restores the run, moving what passes the budget to the cold tier
        assert len(buf) == n
        assert _local_bytes(dst) <= LIMIT_GB * 2**30 + (8 << 20)
        assert buf.stats()["tiers"]["cold"]["rows"] > n // 2
        keys = buf.sql("SELECT key FROM rollouts").column("key").to_pylist()
        assert len(keys) == len(set(keys)) == n
        assert buf.get(keys, ["key"]).column("key").to_pylist() == keys


@pytest.mark.parametrize("bad", [{"disk_limit_gb": 0}, {"disk_limit_gb": -1}, {"disk_limit_gb": "1"},
                                 {"disk_free_floor_gb": -0.5}, {"disk_limit_gb": True}])
def test_bad_disk_budgets_are_refused_before_anything_is_written(tmp_path, bad):
    with pytest.raises(lb.LakeBufferError, match="must be a positive number of GB"):
        lb.ReplayBuffer.open(tmp_path / "buf", **bad)
    assert not (tmp_path / "buf").exists()


def test_a_free_space_floor_the_disk_cannot_keep_backpressures_without_a_lake_copy(tmp_path):
    """The floor alone (no disk_limit_gb): a disk with less free than it and nothing in the lake yet
    pushes back; nothing is stored."""
    import shutil

    free_gb = shutil.disk_usage(tmp_path).free / 2**30
    with lb.ReplayBuffer.open(tmp_path / "buf", lake=str(tmp_path / "lake"), snapshot_interval_s=0,
                              disk_free_floor_gb=free_gb * 2, lake_timeout_s=30) as buf:
        with pytest.raises(BackpressureError, match="disk budget"):
            buf.push(make_rollouts(8))
        assert len(buf) == 0
