"""ShardedReplayBuffer on a local Ray cluster (ray.init(num_cpus=2), 3 shards)."""

from __future__ import annotations

import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import lakebuffer as lb  # noqa: E402
from lakebuffer.distributed import ShardedReplayBuffer, ShardError, split_counts  # noqa: E402
from lakebuffer.readers import RolloutReader  # noqa: E402
from tests.rollouts import make_rollouts  # noqa: E402


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(address="local", num_cpus=2, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    yield
    ray.shutdown()


def test_split_counts_is_proportional_and_exact():
    assert split_counts(3, [1, 1, 2]) == [1, 1, 1]
    assert split_counts(4, [1, 1, 2]) == [1, 1, 2]
    assert sum(split_counts(256, [100, 300, 600])) == 256
    assert split_counts(256, [100, 300, 600]) == [26, 77, 153]
    assert split_counts(5, [0, 10, 0]) == [0, 5, 0]


def test_routing_sampling_kill_and_lake(ray_cluster, tmp_path):
    buf = ShardedReplayBuffer(3, tmp_path / "sharded", memory_limit_mb=2, snapshot_interval_s=0, run_id="dist")
    try:
        keys = []
        for v in range(6):
            keys += buf.push(make_rollouts(96, tokens=32, version=v, seed=v, first_prompt=12 * v)).to_pylist()
        assert len(keys) == len(set(keys)) == 576 and len(buf) == 576
        counts = buf.counts()
        assert all(c > 0 for c in counts) and sum(counts) == 576
        assert isinstance(buf, RolloutReader) and buf.count() == 576 and "reward" in buf.schema.names
        # routing by group: every group lives on exactly one shard
        per_shard = buf.sql_shards("SELECT group_id, run_id FROM rollouts")
        owners = {}
        for g, r in zip(per_shard.column("group_id").to_pylist(), per_shard.column("run_id").to_pylist()):
            owners.setdefault(g, set()).add(r)
        assert all(len(s) == 1 for s in owners.values())
        # global sampling: proportional to each shard's matching rows
        where = "reward > 0.3"
        matching = buf.counts(where)
        t = buf.sample(120, where=where, columns=["key", "run_id", "reward"], seed=3)
        assert t.num_rows == 120 and all(r > 0.3 for r in t.column("reward").to_pylist())
        got = [t.column("run_id").to_pylist().count(f"dist-shard{i}") for i in range(3)]
        assert got == split_counts(120, matching)
        assert buf.get(keys[:5], ["key"]).column("key").to_pylist() == keys[:5]
        # kill one shard: in-flight calls fail clearly, Ray restarts it, it recovers its rows (WAL + warm)
        victim = buf.shards[1]
        pid = ray.get(victim.pid.remote())
        ray.kill(victim, no_restart=False)
        with pytest.raises(ShardError):
            buf.push(make_rollouts(96, tokens=8, seed=99, first_prompt=1000))
        deadline = time.monotonic() + 60
        while True:
            try:
                assert ray.get(victim.pid.remote()) != pid
                break
            except ray.exceptions.RayActorError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        stored = set(buf.sql_shards("SELECT key FROM rollouts").column(0).to_pylist())
        assert set(keys) <= stored  # nothing acknowledged was lost by the kill
        # one lake shared by the shards, readable by open_lake
        buf.snapshot()
        with lb.ReplayBuffer.open_lake(str(tmp_path / "sharded" / "lake")) as view:
            assert sorted(view.runs) == ["dist-shard0", "dist-shard1", "dist-shard2"]
            lake_keys = set(view.sql("SELECT key FROM rollouts").column(0).to_pylist())
        assert set(keys) <= lake_keys
        assert buf.sql("SELECT count(*) AS n FROM rollouts").column(0)[0].as_py() == len(stored)
        whole = buf.sample(4, sampler="group", columns=["group_id"], seed=1)
        groups = whole.column("group_id").to_pylist()
        assert whole.num_rows % 8 == 0 and len(set(groups)) * 8 == len(groups)
    finally:
        buf.close()
    assert isinstance(np.int64(1), np.integer)
