"""Issue 23 item 3: open is O(metadata). A reopen reads no lake data file; a fresh-node resume
(``open(empty_dir, lake=, run_id=)``) indexes the run's rows as cold from the lake's metadata columns,
serves ``sample``/``get`` at once and warms the local tiers in the background (``restore="lazy"``); an
eager restore stays available (``restore="eager"``: verified local copies of the lake files,
``tiers/mirror``).

Bytes are counted in a child process from ``/proc/self/io`` (``rchar``/``wchar``: every read/write
syscall, page-cache hits included) around the operation (``tests/io_child.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import lakebuffer as lb
from tests.rollouts import make_rollouts

CHILD = Path(__file__).with_name("io_child.py")
VERSIONS = 16  # one lake file per policy bucket: a get of one version's rows touches one file of 16
ROWS = 150  # LLM-sized rollouts: 3 token lists of 2,048 (the metadata is a small share of each row)


def _lake(tmp_path: Path) -> tuple[str, Path, int]:
    lake = str(tmp_path / "lake")
    src = tmp_path / "src"
    with lb.ReplayBuffer.open(src, lake=lake, snapshot_interval_s=0, run_id="om", memory_limit_mb=8) as b:
        for v in range(VERSIONS):
            b.push(make_rollouts(ROWS, tokens=2048, seed=v, version=v))
        b.snapshot(wait=True)
        # hot rows to the warm tier: a reopen's WAL replay (read, not mapped, since the warm tier stopped
        # memory-mapping) is bounded by memory_limit_mb and is not what these tests count
        b.evict_all()
    nbytes = sum(f.stat().st_size for f in Path(lake).rglob("*.parquet"))
    return lake, src, nbytes


def _child(op: str, path: Path, lake: str, opts: dict | None = None, where: str | None = None) -> dict:
    args = [sys.executable, str(CHILD), op, str(path), lake, "om", json.dumps(opts or {})] + ([where] if where else [])
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()})
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert lines, r.stderr[-3000:]
    return json.loads(lines[-1])


def _expected(src: Path, lake: str, keys: list[str]) -> list[int]:
    """The rows as a read-only view of the lake serves them (it reads the files whole, verified)."""
    with lb.ReplayBuffer.open_lake(lake) as view:
        got = view.get(keys, columns=["response_ids"])
    return [int(np.sum(v)) for v in got.column("response_ids").to_pylist()]


def test_reopen_reads_no_lake_data_file(tmp_path):
    lake, src, nbytes = _lake(tmp_path)
    out = _child("reopen", src, lake)
    assert out["rows"] == ROWS * VERSIONS
    assert out["open_read"] <= 0.05 * nbytes, (out, nbytes)  # was 1.03x: every file sha256-hashed at open


def test_fresh_resume_serves_the_first_sample_and_get_from_metadata(tmp_path):
    lake, src, nbytes = _lake(tmp_path)
    out = _child("resume", tmp_path / "fresh", lake, {"restore": "cold"}, where="policy_version = 3")
    assert out["rows"] == ROWS * VERSIONS
    # was 1.0x read + 1.8x written (every row copied to the warm tier) before the first sample
    assert out["first_read"] + out["first_write"] <= 0.15 * nbytes, (out, nbytes)
    assert out["got_keys"] == out["keys"] and len(set(out["keys"])) == 32
    assert out["sums"] == _expected(src, lake, out["keys"])  # the right rows


def test_lazy_resume_warms_in_the_background_within_the_disk_budget(tmp_path):
    lake, src, nbytes = _lake(tmp_path)
    limit_gb = 3 * nbytes / 2**30  # room for the run (fragments are ~2x the zstd lake files)
    with lb.ReplayBuffer.open(tmp_path / "fresh", lake=lake, run_id="om", snapshot_interval_s=0,
                              memory_limit_mb=8, disk_limit_gb=limit_gb) as b:
        assert len(b) == ROWS * VERSIONS
        keys = b.sample(64, seed=2, columns=["key"]).column("key").to_pylist()
        deadline = time.monotonic() + 60
        while b.stats()["tiers"]["cold"]["rows"] and time.monotonic() < deadline:
            time.sleep(0.05)
        st = b.stats()
        assert st["tiers"]["cold"]["rows"] == 0 and st["tiers"]["warm"]["rows"] == ROWS * VERSIONS
        assert st["disk"]["used_bytes"] <= limit_gb * 2**30
        got = b.get(keys, columns=["response_ids"])
        assert [int(np.sum(v)) for v in got.column("response_ids").to_pylist()] == _expected(src, lake, keys)
        new = b.push(make_rollouts(8, tokens=8)).to_pylist()
    assert not set(new) & set(keys)


def test_background_warming_waits_while_cold_reads_run(tmp_path):
    """Warming decodes whole row groups on the write-back worker: on 2 cores it tripled a resumed run's
    first ``sample + get`` calls, so it waits while cold reads run (bounded per batch) and goes on after."""
    from lakebuffer.engine import promotion

    lake, src, nbytes = _lake(tmp_path)
    with lb.ReplayBuffer.open(tmp_path / "fresh", lake=lake, run_id="om", snapshot_interval_s=0,
                              memory_limit_mb=8, disk_limit_gb=3 * nbytes / 2**30) as b:
        cold0 = b.stats()["tiers"]["cold"]["rows"]
        assert cold0 == ROWS * VERSIONS
        keys = b.sample(ROWS * VERSIONS, seed=0, columns=["key"]).column("key").to_pylist()
        reading_until = time.monotonic() + 4 * promotion.YIELD_S  # shorter than YIELD_TIMES waits
        i = 0
        while time.monotonic() < reading_until:  # cold reads back to back
            b.get(keys[i % len(keys):i % len(keys) + 8], columns=["response_ids"])
            i += 8
        assert b.stats()["tiers"]["cold"]["rows"] == cold0  # nothing warmed while the reads ran
        deadline = time.monotonic() + 60
        while b.stats()["tiers"]["cold"]["rows"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.stats()["tiers"]["cold"]["rows"] == 0  # and all of it once they stopped


def test_background_warming_waits_for_a_cold_read_still_in_flight(tmp_path):
    """A resumed run's first read from S3 took seconds: warming that only looked at when the last
    read ended went on beside it (31% of the lake written before that first call returned). One
    read longer than ``YIELD_S`` (the lake made slow around the real take) keeps warming waiting."""
    import threading

    from lakebuffer.engine import promotion

    lake, src, nbytes = _lake(tmp_path)
    with lb.ReplayBuffer.open(tmp_path / "fresh", lake=lake, run_id="om", snapshot_interval_s=0,
                              memory_limit_mb=8, disk_limit_gb=3 * nbytes / 2**30) as b:
        assert b.stats()["tiers"]["cold"]["rows"] == ROWS * VERSIONS
        keys = b.sample(16, seed=0, columns=["key"]).column("key").to_pylist()
        cold = b._state.cold
        real_take = cold.take_checked
        inside = threading.Event()

        def slow_take(*args, **kwargs):
            inside.set()
            time.sleep(3 * promotion.YIELD_S)  # a slow object store, within YIELD_TIMES waits
            return real_take(*args, **kwargs)

        real_promote = b._promotion.promote
        promoted_at: list[float] = []  # when each promotion began (it reads the lake and writes fragments)

        def promote(batch_id):
            promoted_at.append(time.monotonic())
            return real_promote(batch_id)

        cold.take_checked, b._promotion.promote = slow_take, promote
        got: list = []
        reader = threading.Thread(target=lambda: got.append(b.get(keys, columns=["key"])))
        reader.start()
        assert inside.wait(10)
        began = time.monotonic()
        reader.join()
        ended = time.monotonic()
        cold.take_checked = real_take
        assert got and got[0].column("key").to_pylist() == keys
        assert not [t for t in promoted_at if began <= t < ended]  # no warming while the read was in flight
        deadline = time.monotonic() + 60
        while b.stats()["tiers"]["cold"]["rows"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert b.stats()["tiers"]["cold"]["rows"] == 0  # and all of it once it ended


def test_eager_restore_makes_every_row_local_before_open_returns(tmp_path):
    """``restore="eager"``: verified local copies of the run's lake files (``tiers/mirror``); when open
    returns every row reads without the lake (get, sample, sql), each once."""
    lake, src, nbytes = _lake(tmp_path)
    with lb.ReplayBuffer.open_lake(lake) as view:
        keys = sorted(view.sql("SELECT key FROM rollouts").column(0).to_pylist())
    want = _expected(src, lake, keys)
    moved = tmp_path / "lake-away"
    with lb.ReplayBuffer.open(tmp_path / "fresh", lake=lake, run_id="om", snapshot_interval_s=0,
                              memory_limit_mb=8, restore="eager", promote_cold_reads=False) as b:
        b._promotion.stop()  # the background conversion to warm fragments is not what this checks
        cold = b.stats()["tiers"]["cold"]
        assert cold["local_rows"] == ROWS * VERSIONS and cold["mirror_bytes"] == nbytes  # every row local
        Path(lake).rename(moved)  # the lake is gone: reads must not need it
        try:
            got = b.get(keys, columns=["key", "response_ids"])
            assert got.column("key").to_pylist() == keys
            assert [int(np.sum(v)) for v in got.column("response_ids").to_pylist()] == want
            assert b.sample(64, seed=3, where="policy_version = 5").column("policy_version").to_pylist() == [5] * 64
            sql = sorted(b.sql("SELECT key FROM rollouts").column(0).to_pylist())
            assert sql == keys  # each row once
        finally:
            moved.rename(lake)
    with pytest.raises(lb.OptionError, match="restore"):
        lb.ReplayBuffer.open(tmp_path / "x", lake=lake, run_id="om", restore="sometimes")


def test_eager_restore_refuses_a_damaged_file_and_a_disk_budget_it_does_not_fit(tmp_path):
    lake, src, nbytes = _lake(tmp_path)
    fresh = tmp_path / "fresh"
    with pytest.raises(lb.OptionError, match="restore='lazy'"):  # refused before anything is copied
        lb.ReplayBuffer.open(fresh, lake=lake, run_id="om", snapshot_interval_s=0, memory_limit_mb=8,
                             restore="eager", disk_limit_gb=nbytes / 2 / 2**30)
    assert not list((fresh / "mirror").rglob("*.parquet"))
    files = sorted(Path(lake).rglob("*.parquet"))
    victim = files[len(files) // 2]
    good = victim.read_bytes()
    data = bytearray(good)
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    with pytest.raises(lb.CorruptionError, match=victim.name):
        lb.ReplayBuffer.open(fresh, lake=lake, run_id="om", snapshot_interval_s=0, memory_limit_mb=8, restore="eager")
    assert not list((fresh / "mirror").rglob(f"{victim.name}*"))  # no copy of it kept, not even a part
    victim.write_bytes(good)  # restored from a copy: the restore resumes, copying what is missing
    with lb.ReplayBuffer.open(fresh, lake=lake, run_id="om", snapshot_interval_s=0, memory_limit_mb=8,
                              restore="eager") as b:
        keys = sorted(b.sql("SELECT key FROM rollouts").column(0).to_pylist())
        assert len(keys) == len(set(keys)) == ROWS * VERSIONS
        # warmed into fragments in the background; a copy leaves once no cold batch reads it
        end = time.monotonic() + 60
        while b.stats()["tiers"]["cold"]["rows"] and time.monotonic() < end:
            time.sleep(0.05)
        st = b.stats()["tiers"]
        assert st["cold"]["rows"] == 0 and st["warm"]["rows"] == ROWS * VERSIONS and st["cold"]["mirror_files"] == 0
        pick = keys[::97]
        got = b.get(pick, columns=["response_ids"])
        assert [int(np.sum(v)) for v in got.column("response_ids").to_pylist()] == _expected(src, lake, pick)


def test_a_kill_during_the_background_warm_loses_nothing(tmp_path):
    lake, src, _ = _lake(tmp_path)
    fresh = tmp_path / "fresh"
    out = _child("warm-kill", fresh, lake)
    assert out["promoted"] >= 1  # killed with the warm under way (16 batches queued)
    with lb.ReplayBuffer.open(fresh, lake=lake, run_id="om", snapshot_interval_s=0, memory_limit_mb=8) as b:
        assert len(b) == ROWS * VERSIONS
        keys = sorted(b.sql("SELECT key FROM rollouts").column(0).to_pylist())
        assert len(keys) == len(set(keys)) == ROWS * VERSIONS
        pick = keys[::97]
        got = b.get(pick, columns=["response_ids"])
        assert [int(np.sum(v)) for v in got.column("response_ids").to_pylist()] == _expected(src, lake, pick)
        end = time.monotonic() + 60  # the reopen carries on with the warm the kill cut short
        while b.stats()["tiers"]["cold"]["rows"] and time.monotonic() < end:
            time.sleep(0.05)
        assert b.stats()["tiers"]["cold"]["rows"] == 0 and b.stats()["tiers"]["warm"]["rows"] == ROWS * VERSIONS
