"""Warm ``get`` of random rows from disk by the size of the segment footer's CRC chunks.

Why: a warm take checks the CRC32C chunks its rows' bytes lie in, so it reads whole chunks; with 64 KiB
chunks a ~8 KB rollout row read ~46 KB from disk. One buffer per chunk size (the same rows, written
with ``segfooter.CHUNK_BYTES`` set), the page cache dropped before each call, the sizes alternated; the
bytes the disk served (``/proc/self/io`` ``read_bytes``), the call's time, and the CPU of a payload scan
(which checks every chunk: one CRC call each; in a buffer opened for it, after the gets: a take does not
read a chunk the process has checked again), from the page cache.

    PYTHONPATH=. python benchmarks/warm_chunk_size.py --root /tmp/warm-chunks
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cold_bytes_vs_lance import read_bytes  # noqa: E402
from cold_scale import evict_cache  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--kib", type=int, nargs="+", default=[64, 16, 8])
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--rows", type=int, default=64)
    args = ap.parse_args()
    import lakebuffer as lb
    from lakebuffer.bench.data import rollouts
    from lakebuffer.tiers import segfooter

    default = segfooter.CHUNK_BYTES
    made: dict[int, tuple[str, list[str]]] = {}
    for kib in args.kib:
        segfooter.CHUNK_BYTES = kib * 1024
        d = args.root / f"{kib}k"
        shutil.rmtree(d, ignore_errors=True)
        with lb.ReplayBuffer.open(d, memory_limit_mb=64, snapshot_interval_s=0) as buf:
            keys = []
            for v in range(60):
                keys += buf.push(rollouts(v * 256, 256, seed=v).drop_columns(["key", "run_id"])).to_pylist()
            buf.evict_all()
        made[kib] = (str(d), keys)
    segfooter.CHUNK_BYTES = default  # reads follow each file's own footer
    bufs = {k: lb.ReplayBuffer.open(d, memory_limit_mb=64, snapshot_interval_s=0) for k, (d, _) in made.items()}
    ms: dict[int, list[float]] = {k: [] for k in made}
    mb: dict[int, list[float]] = {k: [] for k in made}
    scan: dict[int, list[float]] = {k: [] for k in made}
    try:
        for r in range(args.calls):
            for kib in (args.kib if r % 2 else args.kib[::-1]):
                d, keys = made[kib]
                evict_cache(d)
                pick = [keys[i] for i in np.random.default_rng(r).choice(len(keys), args.rows, replace=False)]
                b0, t0 = read_bytes(), time.perf_counter()
                bufs[kib].get(pick, ["response_ids"])
                ms[kib].append((time.perf_counter() - t0) * 1e3)
                mb[kib].append((read_bytes() - b0) / 1e6)
        for b in bufs.values():
            b.close()
        for r in range(4):  # a scan checks every chunk (once a process): each in a buffer opened for it
            for kib in (args.kib if r % 2 else args.kib[::-1]):
                bufs[kib] = lb.ReplayBuffer.open(made[kib][0], memory_limit_mb=64, snapshot_interval_s=0)
                c0 = time.process_time()
                bufs[kib].sql("SELECT sum(len(response_ids)) AS n FROM rollouts")
                scan[kib].append(time.process_time() - c0)
                bufs[kib].close()
    finally:
        for b in bufs.values():
            b.close()
    print(json.dumps({f"{k} KiB": {"get_p50_ms": round(float(np.median(ms[k])), 2),
                                   "disk_mb_per_get_p50": round(float(np.median(mb[k])), 2),
                                   "payload_scan_cpu_s_p50": round(float(np.median(scan[k])), 3)} for k in made},
                     indent=1))


if __name__ == "__main__":
    main()
