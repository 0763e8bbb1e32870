"""Issue 23 item 4: under a disk budget, pushes do not wait for the lake in steady state. Past the high
watermark a push queues a background relief (committed fragments leave local disk, down to the low
watermark; a snapshot is started ahead when too little is committed); the push's own synchronous
relief is the back-pressure, used only when the background one could not keep up."""

from __future__ import annotations

import time

import lakebuffer as lb
from lakebuffer.engine.diskbudget import HIGH_WATER, LOW_WATER
from tests.rollouts import make_rollouts

LIMIT = 6 * 2**20


def _wait(cond, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_past_the_high_watermark_room_is_made_in_the_background(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "b", lake=str(tmp_path / "lake"), memory_limit_mb=1, snapshot_interval_s=0,
                              disk_limit_gb=LIMIT / 2**30, disk_free_floor_gb=0) as buf:
        keys: list[str] = []
        seed = 0
        while buf.stats()["disk"]["used_bytes"] < HIGH_WATER * LIMIT * 0.9:  # committed up to just under the mark
            keys += buf.push(make_rollouts(32, tokens=512, seed=seed)).to_pylist()
            seed += 1
        buf.snapshot(wait=True)
        assert buf.stats()["disk"]["pushes_waited"] == 0
        while buf.stats()["disk"]["used_bytes"] <= HIGH_WATER * LIMIT:  # past the mark, still under the limit
            keys += buf.push(make_rollouts(8, tokens=512, seed=seed)).to_pylist()
            seed += 1
        assert _wait(lambda: buf.stats()["disk"]["background_reliefs"] >= 1)
        assert _wait(lambda: buf.stats()["disk"]["used_bytes"] <= LOW_WATER * LIMIT + 2**20)  # + the newest pushes
        d = buf.stats()["disk"]
        assert d["fragments_moved_to_lake"] >= 1 and d["pushes_waited"] == 0  # no push relieved on its own thread
        assert buf.get(keys, columns=["key"]).column("key").to_pylist() == keys  # every row still there


def test_too_little_committed_starts_a_snapshot_ahead(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "b", lake=str(tmp_path / "lake"), memory_limit_mb=1, snapshot_interval_s=0,
                              disk_limit_gb=LIMIT / 2**30, disk_free_floor_gb=0) as buf:
        keys: list[str] = []
        seed = 0
        while buf.stats()["disk"]["used_bytes"] <= HIGH_WATER * LIMIT:  # nothing snapshotted (no timer)
            keys += buf.push(make_rollouts(16, tokens=512, seed=seed)).to_pylist()
            seed += 1
        # a push judges the mark with the index's bytes listed up to 1 s before (``INDEX_BYTES_TTL_S``), stats
        # lists them fresh: the push after stats saw the mark crossed is one that sees it too
        keys += buf.push(make_rollouts(16, tokens=512, seed=seed)).to_pylist()
        assert _wait(lambda: buf.stats()["cold"]["lag_rows"] < len(keys))  # a snapshot began without being asked
        assert _wait(lambda: buf.stats()["disk"]["used_bytes"] <= HIGH_WATER * LIMIT)
        assert buf.stats()["disk"]["pushes_waited"] == 0
    with lb.ReplayBuffer.open_lake(str(tmp_path / "lake")) as view:
        assert len(view) > 0


def test_a_push_lists_the_index_directory_at_most_once_a_second_and_stats_every_time(tmp_path, monkeypatch):
    """The key index's bytes count in the budget; a push's checks reuse a listing younger than
    ``INDEX_BYTES_TTL_S`` (it cost a push ~10% at 8 GB), ``stats`` lists it fresh."""
    import lakebuffer.engine.diskbudget as diskbudget

    listed = []
    real = diskbudget.dir_bytes
    monkeypatch.setattr(diskbudget, "dir_bytes", lambda p: listed.append(p) or real(p))
    monkeypatch.setattr(diskbudget, "INDEX_BYTES_TTL_S", 3600.0)
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=64, disk_limit_gb=1, disk_free_floor_gb=0) as buf:
        buf.push(make_rollouts(16, seed=0))
        before = len(listed)
        for seed in range(1, 6):
            buf.push(make_rollouts(16, seed=seed))
        assert len(listed) == before  # five pushes, no listing
        used = buf.stats()["disk"]["used_bytes"]
        assert len(listed) == before + 1
        assert used == buf._disk.usage(fresh=True) > 0
        monkeypatch.setattr(diskbudget, "INDEX_BYTES_TTL_S", 0.0)
        buf.push(make_rollouts(16, seed=9))
        assert len(listed) > before + 2  # past the TTL: each check lists again
