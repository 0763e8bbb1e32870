"""Issue 16: what a ``get`` of cold keys (rows that left local disk, read from the lake) costs next to warm.

One buffer per lake (a local directory, then moto S3 on loopback) is filled to ``--mb`` of generated
GRPO rollouts (``lakebuffer.bench.data.stream``) under ``disk_limit_gb`` at a quarter of that, so most
rows end in the cold tier. Then, interleaved in one loop (round r: a warm call and a cold call with
fresh keys, alternating which goes first), ``get`` of ``--keys`` random keys' ``response_ids``:

* ``warm``: keys drawn from rows in warm fragments (memory-mapped Arrow IPC);
* ``cold``: keys drawn from cold-only rows (index -> lake file + row -> only the row groups that
  hold them, only the asked columns; each file checked whole against its sha256 once per process).

The first cold call of a file pays its one sha256 check; ``first_cold_ms`` reports it apart, and
p50/p99 are over the calls after it. Ratios are what to compare (the 2-core machine is shared).

    .venv/bin/python benchmarks/cold_get.py --mb 64 --calls 40 --out benchmarks/cold_get.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import lakebuffer as lb
from lakebuffer.bench.data import stream
from lakebuffer.bench.s3 import MotoServer

COLS = ["response_ids"]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def measure(lake: str, path: Path, mb: int, calls: int, n_keys: int, storage_options: dict | None,
            row_group_mb: float | None = None) -> dict:
    total = mb << 20
    with lb.ReplayBuffer.open(path, lake=lake, storage_options=storage_options, memory_limit_mb=max(4, mb // 16),
                              snapshot_interval_s=0, disk_limit_gb=total / 4 / 2**30) as buf:
        if row_group_mb:
            buf.lake.row_group_bytes = int(row_group_mb * 2**20)  # a lake option (LakeOptions), default 32 MiB
        for i, t in enumerate(stream(total, batch_rows=128, run_id=buf.run_id)):
            buf.push(t.drop_columns(["key"]) if "key" in t.column_names else t)
            if i % 8 == 7:
                buf.snapshot(wait=True)
        buf.snapshot(wait=True)
        buf.flush()
        warm = buf.sql("SELECT key FROM warm").column("key").to_pylist()
        cold = buf.sql("SELECT key FROM cold_rows").column("key").to_pylist()
        st = buf.stats()
        rng = random.Random(0)
        t0 = time.perf_counter()
        buf.get(rng.sample(cold, n_keys), COLS)
        first = time.perf_counter() - t0
        times: dict[str, list[float]] = {"warm": [], "cold": []}
        for r in range(calls):
            order = ["warm", "cold"] if r % 2 else ["cold", "warm"]
            for which in order:
                keys = rng.sample(warm if which == "warm" else cold, n_keys)
                t0 = time.perf_counter()
                got = buf.get(keys, COLS)
                times[which].append(time.perf_counter() - t0)
                assert got.num_rows == n_keys
        out = {
            "lake": lake.split("://")[0] if "://" in lake else "local",
            "pushed_mb": mb,
            "disk_limit_mb": total / 4 / 2**20,
            "rows": {k: v["rows"] for k, v in st["tiers"].items()},
            "local_mb": round(st["disk"]["used_bytes"] / 2**20, 1),
            "lake_files": st["cold"]["files"],
            "row_group_mb": buf.lake.row_group_bytes / 2**20,
            "keys_per_get": n_keys,
            "calls": calls,
            "first_cold_ms": round(first * 1e3, 1),
        }
        for which, xs in times.items():
            out[f"{which}_p50_ms"] = round(statistics.median(xs) * 1e3, 2)
            out[f"{which}_p99_ms"] = round(_pct(xs, 0.99) * 1e3, 2)
        out["cold_over_warm_p50"] = round(out["cold_p50_ms"] / out["warm_p50_ms"], 1)
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--keys", type=int, default=256)
    ap.add_argument("--row-group-mb", type=float, default=None, help="the lake's row group size (default 32)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="cold-get-") as tmp:
        results.append(measure(f"{tmp}/lake", Path(tmp) / "local", a.mb, a.calls, a.keys, None, a.row_group_mb))
        print(json.dumps(results[-1]), flush=True)
        with MotoServer() as s3:
            results.append(measure(s3.url("lake"), Path(tmp) / "s3", a.mb, a.calls, a.keys, s3.storage_options,
                                   a.row_group_mb))
            print(json.dumps(results[-1]), flush=True)
    if a.out:
        a.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
