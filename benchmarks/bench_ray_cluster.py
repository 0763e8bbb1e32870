"""Scale-out on a real multi-node Ray cluster (raylets on loopback): 1, 2 and 4 nodes, one shard a node.

    python benchmarks/bench_ray_cluster.py [--quick] [--out benchmarks/results-ray-cluster.json]

Per node count: ingest from one driver (512-row pushes of lakebuffer.bench.data rollouts), global
samples of 256 (uniform: the one-round-trip top-k merge, keys only and with two columns;
prioritized_time and group: the same kind of merge; reward top_fraction: the metadata-union path), and, with 2+ nodes, node-loss recovery: snapshot,
remove a worker node, time until ``count()`` answers every snapshotted row again (its shard
restarted on a surviving node and resumed from the lake). With 2 nodes also the cost of
``durable=True`` (acknowledge after the lake commit) on ingest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lakebuffer.bench.data import rollouts  # noqa: E402
from lakebuffer.distributed import ShardedReplayBuffer  # noqa: E402
from tests.raycluster import ray_nodes  # noqa: E402


def pct(lat: list[float], q: float) -> float:
    lat = sorted(lat)
    return 1000 * lat[min(len(lat) - 1, int(len(lat) * q))]


def timed(fn, trials: int) -> dict:
    fn(0)  # warm: the per-shape shares are learnt on the first call
    lat = []
    for i in range(1, trials + 1):
        t0 = time.perf_counter()
        fn(i)
        lat.append(time.perf_counter() - t0)
    return {"p50_ms": 1000 * statistics.median(lat), "p99_ms": pct(lat, 0.99)}


def ingest(buf: ShardedReplayBuffer, batches: list) -> dict:
    t0 = time.perf_counter()
    for b in batches:
        buf.push(b)
    buf.flush()
    s = time.perf_counter() - t0
    return {"rows_s": sum(b.num_rows for b in batches) / s, "mb_s": sum(b.nbytes for b in batches) / 2**20 / s}


def run(nodes: int, batches: list, root: str, trials: int) -> dict:
    out: dict = {"nodes": nodes}
    with ray_nodes(nodes, cpus=1) as (cluster, workers):
        path = os.path.join(root, f"n{nodes}")
        buf = ShardedReplayBuffer(nodes, path, run_id=f"n{nodes}", memory_limit_mb=128, snapshot_interval_s=None)
        try:
            out["distinct_nodes"] = len(set(buf.shard_nodes))
            out["ingest"] = ingest(buf, batches)
            where = "reward > 0.5"
            out["uniform_keys"] = timed(lambda s: buf.sample(256, where=where, seed=s, return_keys=True), trials)
            out["uniform_cols"] = timed(lambda s: buf.sample(256, where=where, seed=s, columns=["key", "reward"]),
                                        trials)
            out["ptime_keys"] = timed(lambda s: buf.sample(256, where=where, seed=s, sampler="prioritized_time",
                                                           return_keys=True), max(5, trials // 5))
            out["group_keys"] = timed(lambda s: buf.sample(32, where=where, seed=s, sampler="group", match="any",
                                                           return_keys=True), max(5, trials // 5))
            out["union_reward_keys"] = timed(lambda s: buf.sample(256, where=where, seed=s, sampler="reward",
                                                                  top_fraction=0.5, return_keys=True), max(5, trials // 5))
            if nodes >= 2:
                snaps = buf.snapshot(wait=True)
                total = sum(s.rows for s in snaps if s is not None)
                lost = [i for i, n in enumerate(buf.shard_nodes) if n == workers[-1].node_id]
                t0 = time.perf_counter()
                cluster.remove_node(workers[-1])
                assert buf.count() == total
                out["recovery"] = {"s": time.perf_counter() - t0, "rows_total": total,
                                   "lost_shards": lost, "rows_per_shard": total // nodes}
        finally:
            buf.close()
            shutil.rmtree(path, ignore_errors=True)
        if nodes == 2:  # durable=True: what acknowledging after the lake commit costs
            path = os.path.join(root, "durable")
            buf = ShardedReplayBuffer(2, path, run_id="dur", durable=True, memory_limit_mb=128, snapshot_interval_s=None)
            try:
                out["ingest_durable"] = ingest(buf, batches[: max(4, len(batches) // 4)])
            finally:
                buf.close()
                shutil.rmtree(path, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--nodes", default="1,2,4")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    total_mb = 24 if args.quick else 96
    per = rollouts(0, 512).nbytes
    batches = [rollouts(i * 512, 512, seed=3).drop_columns(["key", "run_id"])
               for i in range(max(2, int(total_mb * 2**20 / per)))]
    root = tempfile.mkdtemp(prefix="lb-raycluster-")
    res = {"cores": os.cpu_count(), "mb": total_mb, "configs": []}
    try:
        for n in (int(x) for x in args.nodes.split(",")):
            res["configs"].append(run(n, batches, root, 20 if args.quick else 100))
            print(json.dumps(res["configs"][-1]), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
