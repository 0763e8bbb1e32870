"""Issue 23 item 4: push latency under a disk budget, and what a fresh-node resume costs.

``push``: one buffer with a local lake, ``disk_limit_gb`` at a quarter of the data, a periodic snapshot,
pushes of generated GRPO rollouts (``lakebuffer.bench.data.stream``) as fast as they go; per-push latency
p50 / p99 / max and the ingest rate. Run it once with this tree and once with another (before/after)::

    PYTHONPATH=/work/main .venv/bin/python benchmarks/push_disk_budget.py --mb 384 --out before.json
    PYTHONPATH=$PWD       .venv/bin/python benchmarks/push_disk_budget.py --mb 384 --out after.json

``--resume``: the same run resumed into an empty directory, ``restore="eager"`` (every row copied before
``open`` returns) and ``restore="cold"`` (index from the metadata columns), each timed to its first
``sample(256) + get``, next to a raw copy (``shutil.copytree``) of the lake's files. Page cache warm for all.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import lakebuffer as lb
from lakebuffer.bench.data import stream

ROWS = 64  # ~1.2 MB a push


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def push(root: Path, mb: int, interval: float, rate: float | None) -> dict:
    lake = str(root / "lake")
    limit_gb = mb / 4 / 1024
    lat: list[float] = []
    t0 = time.perf_counter()
    with lb.ReplayBuffer.open(root / "buf", lake=lake, run_id="pdb", memory_limit_mb=64, snapshot_interval_s=interval,
                              disk_limit_gb=limit_gb) as b:
        sent = 0
        for t in stream(mb * 2**20, batch_rows=ROWS, run_id="gen"):
            if rate:  # paced: a trainer producing ``rate`` MB/s
                time.sleep(max(0.0, t0 + sent / (rate * 2**20) - time.perf_counter()))
            sent += t.nbytes
            s = time.perf_counter()
            b.push(t.drop_columns([c for c in ("key", "run_id") if c in t.column_names]))
            lat.append(time.perf_counter() - s)
        wall = time.perf_counter() - t0
        st = b.stats()
    return {"mb": mb, "rate_mb_s": rate, "disk_limit_mb": mb / 4, "pushes": len(lat), "p50_ms": 1000 * _pct(lat, 0.5),
            "p90_ms": 1000 * _pct(lat, 0.9), "p99_ms": 1000 * _pct(lat, 0.99), "over_3x_p50": sum(x > 3 * _pct(lat, 0.5) for x in lat), "max_ms": 1000 * max(lat), "p99_over_p50": _pct(lat, 0.99) / _pct(lat, 0.5),
            "mb_per_s": mb / wall, "disk": st.get("disk"), "tiers": {k: v.get("rows") for k, v in st["tiers"].items()}}


def resume(root: Path) -> dict:
    lake = root / "lake"
    out: dict = {"lake_mb": sum(f.stat().st_size for f in lake.rglob("*.parquet")) / 2**20}
    s = time.perf_counter()
    shutil.copytree(lake, root / "copy")
    out["raw_copy_s"] = time.perf_counter() - s
    for mode in ("eager", "cold"):
        s = time.perf_counter()
        with lb.ReplayBuffer.open(root / f"fresh-{mode}", lake=str(lake), run_id="pdb", memory_limit_mb=64,
                                  snapshot_interval_s=0, restore=mode) as b:
            opened = time.perf_counter() - s
            b.sample(256, seed=1)
            out[mode] = {"open_s": opened, "first_sample_get_s": time.perf_counter() - s}
    out["eager_vs_raw_copy"] = out["raw_copy_s"] / out["eager"]["open_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=384)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--rate", type=float, help="pace pushes to this many MB/s (default: as fast as they go)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        res = {"push": push(Path(d), a.mb, a.interval, a.rate), "load": os.getloadavg()}
        if a.resume:
            res["resume"] = resume(Path(d))
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
