"""Scale-out benchmark: aggregate ingest and sampling with 1, 2, 4 Ray shards, and Ray's per-call cost.

    python benchmarks/bench_distributed.py [--quick] [--out benchmarks/results-distributed.json]

Every configuration pushes the same generated rollouts (lakebuffer.bench.data) from one driver;
sampling asks for 256 rows with `reward > 0.5 AND policy_version >= v`. Medians over trials.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import ray

from lakebuffer.bench.data import rollouts
from lakebuffer.distributed import ShardedReplayBuffer


@ray.remote(num_cpus=0)
class _Echo:
    def ping(self, x=None):
        return x


def ray_call_overhead(trials: int = 200) -> dict:
    a = _Echo.remote()
    ray.get(a.ping.remote())
    lat = []
    for _ in range(trials):
        t0 = time.perf_counter()
        ray.get(a.ping.remote())
        lat.append(time.perf_counter() - t0)
    ray.kill(a)
    lat.sort()
    return {"p50_ms": 1000 * lat[len(lat) // 2], "p99_ms": 1000 * lat[int(len(lat) * 0.99)]}


def run_config(shards: int, batches: list, root: str, sample_trials: int) -> dict:
    path = os.path.join(root, f"s{shards}")
    buf = ShardedReplayBuffer(shards, path, memory_limit_mb=256, snapshot_interval_s=0, run_id=f"b{shards}")
    try:
        nbytes = sum(b.nbytes for b in batches)
        rows = sum(b.num_rows for b in batches)
        t0 = time.perf_counter()
        for b in batches:
            buf.push(b)
        buf.flush()
        ingest_s = time.perf_counter() - t0
        top = max(int(b.column("policy_version").to_numpy().max()) for b in batches)
        where = f"reward > 0.5 AND policy_version >= {max(0, top // 2)}"
        lat = []
        for i in range(sample_trials):
            t1 = time.perf_counter()
            buf.sample(256, where=where, seed=i, return_keys=True)
            lat.append(time.perf_counter() - t1)
        lat.sort()
        return {
            "shards": shards, "rows": rows, "bytes": nbytes,
            "ingest_gb_s": nbytes / 1e9 / ingest_s, "ingest_rows_s": rows / ingest_s,
            "sample_keys_p50_ms": 1000 * statistics.median(lat),
            "sample_keys_p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
            "sample_keys_per_s": 256 / statistics.median(lat),
        }
    finally:
        buf.close()
        shutil.rmtree(path, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    total_mb = 48 if args.quick else 512
    per = rollouts(0, 256).nbytes
    batches = [rollouts(i * 256, 256, seed=3) .drop_columns(["key", "run_id"]) for i in range(max(1, int(total_mb * 2**20 / per)))]
    root = tempfile.mkdtemp(prefix="lb-dist-")
    res = {"cores": os.cpu_count(), "ray_call": ray_call_overhead(), "configs": []}
    for shards in (1, 2, 4):
        res["configs"].append(run_config(shards, batches, root, 20 if args.quick else 100))
        print(json.dumps(res["configs"][-1]))
    print(json.dumps(res["ray_call"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    ray.shutdown()


if __name__ == "__main__":
    main()
