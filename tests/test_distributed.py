"""ShardedReplayBuffer on a local Ray of its own (address="local": never a cluster another test started); multi-node: test_distributed_cluster.py."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

ray = pytest.importorskip("ray")

import lakebuffer as lb  # noqa: E402
from lakebuffer.distributed import ShardedReplayBuffer, ShardError, split_counts  # noqa: E402
from lakebuffer.readers import RolloutReader  # noqa: E402
from lakebuffer.results import Snapshot  # noqa: E402
from tests.rollouts import make_rollouts  # noqa: E402
from tests.test_samplers import CASES, WORLD, _case  # noqa: E402


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
        t = buf.sample(120, where="reward > 0.3", columns=["key", "run_id", "reward"], seed=3)
        assert t.num_rows == 120 and all(r > 0.3 for r in t.column("reward").to_pylist())
        assert buf.get(keys[:5], ["key"]).column("key").to_pylist() == keys[:5]
        # kill one shard: a push in flight fails clearly, reads wait for Ray's restart (WAL + warm)
        victim = buf.shards[1]
        _, pid = ray.get(victim.where.remote())
        ray.kill(victim, no_restart=False)
        try:  # the kill is asynchronous: the push fails clearly, or lands whole before it
            keys += buf.push(make_rollouts(96, tokens=8, seed=99, first_prompt=1000)).to_pylist()
        except ShardError:
            pass
        deadline = time.monotonic() + 60
        while buf.stats()["shards"][1]["path"] and ray.get(victim.where.remote())[1] == pid:  # reads retry
            assert time.monotonic() < deadline
            time.sleep(0.2)
        stored = set(buf.sql_shards("SELECT key FROM rollouts").column(0).to_pylist())
        assert set(keys) <= stored  # nothing acknowledged was lost by the kill
        # snapshot(wait=True): one Snapshot per shard; one lake shared by the shards, readable by open_lake
        snaps = buf.snapshot(wait=True)
        assert len(snaps) == 3 and all(s is None or isinstance(s, Snapshot) for s in snaps)
        assert buf.snapshot(wait=False) is None
        with lb.ReplayBuffer.open_lake(str(tmp_path / "sharded" / "lake")) as view:
            assert sorted(view.runs) == ["dist-shard0", "dist-shard1", "dist-shard2"]
            lake_keys = set(view.sql("SELECT key FROM rollouts").column(0).to_pylist())
        assert set(keys) <= lake_keys
        assert buf.sql("SELECT count(*) AS n FROM rollouts").column(0)[0].as_py() == len(stored)
        whole = buf.sample(4, sampler="group", columns=["group_id"], seed=1)
        groups = whole.column("group_id").to_pylist()
        assert whole.num_rows == 32 and len(set(groups)) * 8 == len(groups)
        st = buf.stats()
        assert st["rows"] == len(stored) and len(st["shards"]) == 3 and sum(map(len, st["nodes"].values())) == 3
    finally:
        buf.close()


def test_snapshot_wait_returns_a_snapshot_per_shard_after_pushes(ray_cluster, tmp_path):
    with ShardedReplayBuffer(2, tmp_path / "s", snapshot_interval_s=None, run_id="snap") as buf:
        buf.push(make_rollouts(64, tokens=8, seed=1))
        snaps = buf.snapshot(wait=True)
        assert [type(s) for s in snaps] == [Snapshot, Snapshot]
        assert sum(s.rows for s in snaps) == 64 and {s.run_id for s in snaps} == {"snap-shard0", "snap-shard1"}


@pytest.fixture(scope="module")
def twins(ray_cluster, tmp_path_factory):
    """The sampler world in 3 shards, and the same rows (same keys) in one ReplayBuffer."""
    root = tmp_path_factory.mktemp("twins")
    sharded = ShardedReplayBuffer(3, root / "sharded", run_id="world", memory_limit_mb=0.2, snapshot_interval_s=0)
    try:
        for i in range(0, WORLD.num_rows, 64):
            sharded.push(WORLD.slice(i, 64))
        rows = sharded.sql_shards(f"SELECT {', '.join(WORLD.column_names)}, key FROM rollouts ORDER BY key")
        with lb.ReplayBuffer.open(root / "one", run_id="one", memory_limit_mb=0.2, snapshot_interval_s=0) as one:
            for i in range(0, rows.num_rows, 64):
                one.push(rows.slice(i, 64))
            yield sharded, one
    finally:
        sharded.close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_sampler_draws_what_one_buffer_draws(twins, name):
    """Exact semantics: the same keys as one buffer holding every shard's rows, for every sampler."""
    sharded, one = twins
    n, opts = _case(name)
    for seed in (1, 2):
        for where in (None, "reward > 0.3 AND policy_version >= 2", "len(response_ids) = 4 AND reward < 0.9"):
            if name in ("episode", "team", "segment") and where and "0.3" in where:
                where = "reward > 0.05"
            a = sharded.sample(n, where=where, seed=seed, return_keys=True, **opts).to_pylist()
            b = one.sample(n, where=where, seed=seed, return_keys=True, **opts).to_pylist()
            assert a == b, (name, seed, where)


def test_replacement_allow_fewer_and_global_quantiles_match_one_buffer(twins):
    sharded, one = twins
    pool = "episode_id IS NULL AND policy_version < 5"  # 240 rows
    cases = [
        dict(n=241, where=pool, allow_fewer=True),
        dict(n=500, where=pool, replacement=True),
        dict(n=3000, where=pool, sampler="prioritized_time", replacement=True, half_life=2),
        dict(n=40, where="episode_id IS NULL", sampler="reward", top_fraction=0.1, bottom_fraction=0.1),
        dict(n=61, where="episode_id IS NULL", sampler="group", allow_fewer=True),
        dict(n=10, where="episode_id IS NULL", sampler="freshness", max_lag=1, base="group"),
    ]
    for kw in cases:
        kw = dict(kw)
        n = kw.pop("n")
        a = sharded.sample(n, seed=4, return_keys=True, **kw).to_pylist()
        assert a == one.sample(n, seed=4, return_keys=True, **kw).to_pylist(), kw
    with pytest.raises(lb.NotEnoughRowsError):
        sharded.sample(241, where=pool)
    rows = sharded.sample(30, where=pool, seed=5, columns=["key", "reward", "sample_count"])
    ref = one.sample(30, where=pool, seed=5, columns=["key", "reward", "sample_count"])
    assert rows.to_pydict() == ref.to_pydict()


def test_uniform_weighted_and_group_samples_are_one_round_trip_per_shard(twins):
    sharded, _ = twins

    def calls():
        return [ray.get(s.call_counts.remote()) for s in sharded.shards]

    sharded.sample(64, where="reward > 0.5", seed=0, columns=["key", "reward"])  # learns each shard's share
    sharded.sample(64, where="reward > 0.5", seed=0, sampler="prioritized_time", return_keys=True)
    before = calls()
    for seed in range(1, 6):
        sharded.sample(64, where="reward > 0.5", seed=seed, columns=["key", "reward"])
        sharded.sample(64, where="reward > 0.5", seed=seed, sampler="prioritized_time", return_keys=True)
        sharded.sample(4, where="episode_id IS NULL", seed=seed, sampler="group", return_keys=True)
    after = calls()
    for b, a in zip(before, after):
        assert a.get("top", 0) - b.get("top", 0) == 15  # one call per shard per sample, rows included
        assert a.get("meta", 0) == b.get("meta", 0) and a.get("take", 0) == b.get("take", 0)
        assert a.get("record", 0) == b.get("record", 0)  # the draws' replays rode along with the next call
    # ... and every read still sees them: the same keys drawn again count one replay more each
    keys = sharded.sample(8, where="reward > 0.5", seed=99, return_keys=True)
    first = sharded.get(keys, ["sample_count"]).column(0).to_pylist()
    assert sharded.sample(8, where="reward > 0.5", seed=99, return_keys=True).equals(keys)
    again = sharded.get(keys, ["sample_count"]).column(0).to_pylist()
    assert all(f >= 1 for f in first) and [g - f for f, g in zip(first, again)] == [1] * 8


def test_filter_samplers_ship_partial_results_not_metadata(twins):
    """reward / freshness over a mergeable base: the filter's predicate from per-shard partials
    (reward values of matching rows, each shard's newest version), then the top-k merge: the same
    keys as one buffer, no shard's metadata moved, a few bytes a row instead of ~100."""
    sharded, one = twins

    def calls():
        return [ray.get(s.call_counts.remote()) for s in sharded.shards]

    sharded.sample(20, seed=1, sampler="success_blend", success_fraction=0.3, max_lag=4, return_keys=True)
    union_bytes = sharded.last_sample_bytes  # the metadata-union path, for scale
    before = calls()
    cases = [dict(sampler="reward", top_fraction=0.3), dict(sampler="reward", top_fraction=0.3, bottom_fraction=0.1),
             dict(sampler="reward", min_reward=0.6), dict(sampler="reward", top_fraction=0.5, base="prioritized_time"),
             dict(sampler="freshness", max_lag=2), dict(sampler="freshness", max_lag=1, current_version=5)]
    for opts in cases:
        for where in (None, "len(response_ids) = 4 AND reward < 0.9"):
            for seed in (1, 2):
                a = sharded.sample(10, where=where, seed=seed, return_keys=True, **opts).to_pylist()
                assert a == one.sample(10, where=where, seed=seed, return_keys=True, **opts).to_pylist(), (opts, where)
                assert sharded.last_sample_bytes < 12 * WORLD.num_rows < union_bytes / 5, opts
    after = calls()
    assert all(a.get("meta", 0) == b.get("meta", 0) for a, b in zip(after, before))
    assert all(a.get("partial", 0) - b.get("partial", 0) == 4 * 2 * 2 for a, b in zip(after, before))  # not for fixed cuts


def test_reads_wait_for_a_restarting_shard(ray_cluster, tmp_path):
    with ShardedReplayBuffer(2, tmp_path / "r", run_id="r", snapshot_interval_s=0) as buf:
        keys = buf.push(make_rollouts(64, tokens=8, seed=2)).to_pylist()
        ray.kill(buf.shards[0], no_restart=False)
        t0 = time.monotonic()
        assert buf.count() == 64 and sorted(buf.get(keys, ["key"]).column(0).to_pylist()) == sorted(keys)
        assert time.monotonic() - t0 < 60
        assert isinstance(buf.sample(8, seed=1, return_keys=True), pa.Array)


def test_the_dataset_layer_reads_a_sharded_buffer_like_a_buffer(twins):
    """iter_batches over the sharded reader (a RolloutReader): every row once across two ranks."""
    from lakebuffer.dataset import iter_batches

    sharded, one = twins
    seen = []
    for rank in range(2):
        for b in iter_batches(sharded, columns=["key", "reward"], batch_size=50, num_shards=2, shard=rank,
                              where="reward > 0.2", drop_last=False):
            seen += b.column("key").to_pylist()
    want = one.sql("SELECT key FROM meta WHERE reward > 0.2").column(0).to_pylist()
    assert len(seen) == len(set(seen)) and sorted(seen) == sorted(want)


def test_get_finds_keys_given_at_push(ray_cluster, tmp_path):
    """Keys a user gave at push name no shard: get asks every shard, as one buffer would answer."""
    with ShardedReplayBuffer(2, tmp_path / "k", run_id="k", snapshot_interval_s=None) as buf:
        rows = make_rollouts(16, tokens=4, seed=3)
        mine = [f"mine-{i}" for i in range(16)]
        assert buf.push(rows.append_column("key", pa.array(mine))).to_pylist() == mine
        made = buf.push(make_rollouts(16, tokens=4, seed=4, first_prompt=50)).to_pylist()
        order = [mine[5], made[2], mine[0], made[9]]
        assert buf.get(order, ["key"]).column(0).to_pylist() == order
        with pytest.raises(lb.KeyNotFoundError):
            buf.get(["mine-99"], ["key"])


def test_a_shard_that_cannot_open_fails_fast(ray_cluster, tmp_path):
    """A shard whose ReplayBuffer refuses to open (its run is held by another writer) is a ShardError
    at once, not a 60 s wait for restarts that cannot help."""
    with ShardedReplayBuffer(1, tmp_path / "a", tmp_path / "lake", run_id="same", snapshot_interval_s=None):
        t0 = time.monotonic()
        with pytest.raises(ShardError, match="could not open"):
            ShardedReplayBuffer(1, tmp_path / "b", tmp_path / "lake", run_id="same", snapshot_interval_s=None)
        assert time.monotonic() - t0 < 30


def test_episodes_routed_by_episode_merge_exactly(ray_cluster, tmp_path):
    """route="episode_id": each episode on one shard, so the episode sampler takes the one-round-trip
    merge and still draws what one buffer holding the same rows draws."""
    with ShardedReplayBuffer(2, tmp_path / "e", route="episode_id", run_id="ep", snapshot_interval_s=None) as sharded:
        for i in range(0, WORLD.num_rows, 256):
            sharded.push(WORLD.slice(i, 256))
        rows = sharded.sql_shards(f"SELECT {', '.join(WORLD.column_names)}, key FROM rollouts")
        with lb.ReplayBuffer.open(tmp_path / "one", run_id="one", snapshot_interval_s=None) as one:
            one.push(rows)
            before = [ray.get(s.call_counts.remote()).get("meta", 0) for s in sharded.shards]
            for kw in (dict(n=3), dict(n=40, unit="rows"), dict(n=25, allow_fewer=True, where="episode_id LIKE 'm%'")):
                kw = dict(kw)
                n = kw.pop("n")
                a = sharded.sample(n, sampler="episode", seed=2, return_keys=True, **kw).to_pylist()
                assert a == one.sample(n, sampler="episode", seed=2, return_keys=True, **kw).to_pylist(), kw
            assert [ray.get(s.call_counts.remote()).get("meta", 0) for s in sharded.shards] == before  # no union
