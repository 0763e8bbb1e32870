"""Snapshot / restore / delete cost of the lake format, public API only (runs on any lakebuffer version).

``python benchmarks/bench_lake_format.py WORKDIR snapshot|restore|delete``, one phase per process, in this
order: ``snapshot`` pushes 32 x 1,024 rollouts (512 tokens, ~193 MB Arrow) into WORKDIR/a and times
``snapshot(wait=True)`` into WORKDIR/lake; ``restore`` times ``ReplayBuffer.open`` of a fresh WORKDIR/b
with the same lake and run (the restore); ``delete`` deletes 100 keys spread over every file from b and
times the snapshot that carries them to the lake. Prints one JSON line per phase (BENCHMARKS.md).
"""

from __future__ import annotations

import json
import resource
import sys
import time

import numpy as np
import pyarrow as pa

import lakebuffer as lb


def rollouts(n: int, seed: int, tokens: int = 512) -> pa.Table:
    rng = np.random.default_rng(seed)
    off = pa.array(np.arange(0, (n + 1) * tokens, tokens, dtype=np.int32))

    def ids() -> pa.Array:
        return pa.ListArray.from_arrays(off, pa.array(rng.integers(0, 32000, n * tokens, dtype=np.int32)))

    return pa.table({
        "prompt_id": [f"p{seed}-{i // 8}" for i in range(n)],
        "policy_version": pa.array(np.full(n, seed % 4, np.int64)),
        "prompt_ids": ids(),
        "response_ids": ids(),
        "response_logprobs": pa.ListArray.from_arrays(off, pa.array(-rng.random(n * tokens, dtype=np.float32))),
        "reward": pa.array(rng.random(n, dtype=np.float32)),
    })


def report(**kw: object) -> None:
    kw["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(json.dumps(kw))


def main(work: str, phase: str) -> None:
    lake = f"{work}/lake"
    opts = {"lake": lake, "run_id": "bench", "snapshot_interval_s": 0, "memory_limit_mb": 1024}
    if phase == "snapshot":
        buf = lb.ReplayBuffer.open(f"{work}/a", **opts)
        nbytes = 0
        for i in range(32):
            t = rollouts(1024, i)
            nbytes += t.nbytes
            buf.push(t)
        buf.flush()
        t0 = time.perf_counter()
        s = buf.snapshot(wait=True)
        took = time.perf_counter() - t0
        buf.close()
        report(phase=phase, arrow_mb=round(nbytes / 2**20), rows=s["rows"], seconds=round(took, 2))
    elif phase == "restore":
        t0 = time.perf_counter()
        buf = lb.ReplayBuffer.open(f"{work}/b", **opts)
        took = time.perf_counter() - t0
        n = len(buf)
        buf.close()
        report(phase=phase, rows=n, seconds=round(took, 2))
    elif phase == "delete":
        buf = lb.ReplayBuffer.open(f"{work}/b", **opts)
        keys = buf.sql("SELECT key FROM rollouts ORDER BY key").column(0)
        gone = keys.take(list(range(0, len(keys), max(1, len(keys) // 100))))
        buf.delete(keys=gone)
        t0 = time.perf_counter()
        buf.snapshot(wait=True)
        took = time.perf_counter() - t0
        n = len(buf)
        buf.close()
        report(phase=phase, deleted=len(gone), rows=n, seconds=round(took, 2))
    else:
        raise SystemExit(f"unknown phase {phase!r}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
