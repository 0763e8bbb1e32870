"""ShardedReplayBuffer on a real multi-node Ray cluster: two raylets on loopback (ray.cluster_utils.Cluster).

Placement (shards on both nodes, ``route="local"``) and node loss: a node removed after a
snapshot, mid-ingest and mid-sample; its shards come back on the surviving node and resume from
the lake with no manual step. Each test starts and shuts down its own cluster (2 CPUs a node).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import pytest

ray = pytest.importorskip("ray")

from lakebuffer.distributed import ShardedReplayBuffer, ShardError  # noqa: E402
from tests.raycluster import ray_nodes  # noqa: E402
from tests.rollouts import make_rollouts  # noqa: E402


@contextlib.contextmanager
def two_nodes() -> Iterator[tuple]:
    """A head and a worker raylet (2 CPUs each), shut down after."""
    with ray_nodes(2) as (cluster, workers):
        yield cluster, workers[0]


def _worker_id(worker) -> str:
    return worker.node_id


@pytest.mark.slow  # ~30 s on a loaded 2-core machine: two raylets and a worker process importing lakebuffer
def test_shards_spread_over_both_nodes_and_local_route(tmp_path):
    with two_nodes() as (cluster, worker):
        with ShardedReplayBuffer(4, tmp_path / "p", route="local", run_id="p", snapshot_interval_s=None) as buf:
            nodes = buf.shard_nodes
            assert len(set(nodes)) == 2 and nodes.count(_worker_id(worker)) == 2
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            @ray.remote(num_cpus=0)
            def produce(b, seed):  # a producer on the worker node pushes through the same buffer
                return b.push(make_rollouts(64, tokens=8, seed=seed, first_prompt=100 * seed)).to_pylist()

            there = ray.get(produce.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
                _worker_id(worker), soft=False)).remote(buf, 1))
            here = buf.push(make_rollouts(64, tokens=8, seed=2, first_prompt=200)).to_pylist()
            on_worker = {f"p-shard{i}" for i, n in enumerate(nodes) if n == _worker_id(worker)}
            assert {k.rsplit("-", 1)[0] for k in there} <= on_worker  # rows stayed on their node
            assert not {k.rsplit("-", 1)[0] for k in here} & on_worker
            assert buf.count() == 128


@pytest.mark.slow
def test_a_lost_node_costs_nothing_snapshotted(tmp_path):
    """Node removed after a snapshot: its shards restart on the head and resume from the lake."""
    with two_nodes() as (cluster, worker):
        buf = ShardedReplayBuffer(2, tmp_path / "n", run_id="n", memory_limit_mb=1, snapshot_interval_s=None)
        try:
            lost = [i for i, n in enumerate(buf.shard_nodes) if n == _worker_id(worker)]
            assert lost and len(lost) < 2
            keys = []
            for v in range(4):
                keys += buf.push(make_rollouts(128, tokens=16, version=v, seed=v, first_prompt=20 * v)).to_pylist()
            snaps = buf.snapshot(wait=True)
            assert sum(s.rows for s in snaps) == 512
            # rows after the snapshot: on the lost node they are the documented loss window
            late = buf.push(make_rollouts(64, tokens=16, seed=9, first_prompt=900)).to_pylist()
            late_kept = [k for k in late if not k.startswith(f"n-shard{lost[0]}-")]
            before = buf.sample(50, seed=3, return_keys=True).to_pylist()
            t0 = time.monotonic()
            cluster.remove_node(worker)
            # no manual step: reads wait for the restart, then every snapshotted row is there
            assert buf.count() == 512 + len(late_kept)
            assert time.monotonic() - t0 < 60
            assert buf.get(keys, ["key"]).column(0).to_pylist() == keys
            assert set(buf.shard_nodes) == {ray.get_runtime_context().get_node_id()}
            # pushes and samples work on after it; new keys do not collide with the lake's
            more = buf.push(make_rollouts(64, tokens=16, seed=10, first_prompt=1000)).to_pylist()
            assert not set(more) & set(keys) and buf.count() == 512 + len(late_kept) + 64
            assert not set(more) & set(late)  # keys of rows lost with the node are not reissued
            # the snapshotted rows drawn before the loss are the same rows after it
            kept = [k for k in before if k in set(keys)]
            after = buf.get(kept, ["key", "prompt_id"])
            assert after.column("key").to_pylist() == kept
        finally:
            buf.close()


@pytest.mark.slow
def test_node_removed_mid_ingest_and_mid_sample_with_durable_pushes(tmp_path):
    """durable=True: every acknowledged row survives the node; samples during the loss still answer."""
    import threading

    with two_nodes() as (cluster, worker):
        buf = ShardedReplayBuffer(2, tmp_path / "d", run_id="d", durable=True, snapshot_interval_s=None)
        try:
            acked: list[str] = []
            failed: set[str] = set()  # groups (prompt ids) of batches that raised: not acknowledged
            errors: list[BaseException] = []
            stop = threading.Event()

            def ingest():
                seed = 0
                while not stop.is_set():
                    seed += 1
                    batch = make_rollouts(32, tokens=8, seed=seed, first_prompt=40 * seed)
                    try:
                        acked.extend(buf.push(batch).to_pylist())
                    except ShardError:  # not acknowledged (a producer would push it again)
                        failed.update(batch.column("prompt_id").to_pylist())  # = group_id when stored
                        time.sleep(0.2)
                    except BaseException as e:  # noqa: BLE001
                        errors.append(e)
                        return

            t = threading.Thread(target=ingest)
            t.start()
            while len(acked) < 128:
                time.sleep(0.05)
            cluster.remove_node(worker)
            for seed in range(5):  # mid-sample: reads wait for the restarted shard
                assert buf.sample(16, seed=seed, return_keys=True).to_pylist()
            time.sleep(1.0)
            stop.set()
            t.join(60)
            assert not errors, errors
            # every acknowledged row is there; anything else is a part of a batch that raised
            stored = buf.sql_shards("SELECT key, group_id FROM rollouts")
            assert buf.count() == stored.num_rows and len(acked) == len(set(acked))
            assert set(acked) <= set(stored.column("key").to_pylist())
            extra = {g for k, g in zip(*stored.to_pydict().values()) if k not in set(acked)}
            assert extra <= failed
            assert sorted(buf.get(acked, ["key"]).column(0).to_pylist()) == sorted(acked)
        finally:
            stop.set()
            buf.close()
