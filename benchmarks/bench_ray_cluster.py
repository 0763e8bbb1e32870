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
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ray  # noqa: E402

from lakebuffer.bench.data import rollouts  # noqa: E402
from lakebuffer.distributed import ShardedReplayBuffer  # noqa: E402
from tests.raycluster import ray_nodes  # noqa: E402


def pct(lat: list[float], q: float) -> float:
    lat = sorted(lat)
    return 1000 * lat[min(len(lat) - 1, int(len(lat) * q))]


class GcClock:
    """Seconds this process spent in garbage collection pauses (gc.callbacks)."""

    def __init__(self) -> None:
        self.s, self._t0 = 0.0, 0.0
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.s += time.perf_counter() - self._t0


GC = GcClock()


def timed(fn, trials: int, buf: ShardedReplayBuffer | None = None, space_s: float = 0.0) -> dict:
    """p50 / p99 of ``fn(seed)``; with ``buf`` (a top-k sampler: every shard serves each call) also
    where each call's time went: the slowest shard's own serving time (its wall, CPU and GC), the
    driver's CPU and GC, and the rest (Ray scheduling, transfer, queueing behind other processes).
    ``space_s``: sleep between calls (separates queueing behind the previous call from our cost)."""
    fn(0)  # warm: the per-shape shares are learnt on the first call
    lat, cpu, gcs = [], [], []
    for i in range(1, trials + 1):
        if space_s:
            time.sleep(space_s)
        g0, c0, t0 = GC.s, time.process_time(), time.perf_counter()
        fn(i)
        lat.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        gcs.append(GC.s - g0)
    out = {"p50_ms": 1000 * statistics.median(lat), "p99_ms": pct(lat, 0.99),
           "driver_cpu_p50_ms": 1000 * statistics.median(cpu), "driver_cpu_p99_ms": pct(cpu, 0.99),
           "driver_gc_max_ms": 1000 * max(gcs)}
    if buf is not None:
        served = [s[-trials:] for s in ray.get([a.served.remote() for a in buf.shards])]
        if all(len(s) == trials for s in served):
            slowest = [max(s[i][0] for s in served) for i in range(trials)]
            rest = [lat[i] - slowest[i] for i in range(trials)]
            # our own work per call, whatever the queueing: the driver's CPU plus the busiest shard's
            own = [cpu[i] + max(s[i][1] for s in served) for i in range(trials)]
            out |= {"own_cpu_p50_ms": 1000 * statistics.median(own), "own_cpu_p99_ms": pct(own, 0.99)}
            out |= {"shard_wall_p50_ms": 1000 * statistics.median(slowest), "shard_wall_p99_ms": pct(slowest, 0.99),
                    "shard_cpu_p99_ms": pct([max(s[i][1] for s in served) for i in range(trials)], 0.99),
                    "shard_gc_max_ms": 1000 * max(s[i][2] for s in served for i in range(trials)),
                    "rest_p50_ms": 1000 * statistics.median(rest), "rest_p99_ms": pct(rest, 0.99)}
            worst = sorted(range(trials), key=lambda i: lat[i])[-3:]
            out["worst_calls_ms"] = [{"wall": round(1000 * lat[i], 1), "slowest_shard": round(1000 * slowest[i], 1),
                                      "driver_cpu": round(1000 * cpu[i], 1), "driver_gc": round(1000 * gcs[i], 1)}
                                     for i in worst]
    return out


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
            out["uniform_keys"] = timed(lambda s: buf.sample(256, where=where, seed=s, return_keys=True), trials, buf)
            out["uniform_keys_spaced"] = timed(lambda s: buf.sample(256, where=where, seed=s, return_keys=True),
                                               trials, buf, space_s=0.05)
            out["uniform_cols"] = timed(lambda s: buf.sample(256, where=where, seed=s, columns=["key", "reward"]),
                                        trials, buf)
            out["ptime_keys"] = timed(lambda s: buf.sample(256, where=where, seed=s, sampler="prioritized_time",
                                                           return_keys=True), max(5, trials // 5), buf)
            out["group_keys"] = timed(lambda s: buf.sample(32, where=where, seed=s, sampler="group", match="any",
                                                           return_keys=True), max(5, trials // 5))
            m = 64 if len(batches) < 200 else 256  # the quick size has ~250 rows in the top half
            for name, opts in (("union_reward_keys", {"top_fraction": 0.5}), ("reward_min_keys", {"min_reward": 0.75})):
                out[name] = timed(lambda s, o=opts: buf.sample(m, where=where, seed=s, sampler="reward", return_keys=True,
                                                            **o), max(5, trials // 5))
                out[name]["bytes_per_call"] = buf.last_sample_bytes
            out["freshness_keys"] = timed(lambda s: buf.sample(m, where=where, seed=s, sampler="freshness", max_lag=1,
                                                               return_keys=True), max(5, trials // 5))
            out["freshness_keys"]["bytes_per_call"] = buf.last_sample_bytes
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
