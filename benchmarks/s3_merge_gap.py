"""Issue 23 on S3: the gap under which two page ranges of one lake file are fetched by one request, A/B
in one process on one moto (loopback) lake, alternated per call. On an object store a request costs
about what ~1 MiB of transfer does; the row reader merged ranges less than 16 KiB apart (the local
setting), so a row's digest bytes and its page were two requests even when a file's digests lie
within a few hundred KiB of each other.

    PYTHONPATH=. .venv/bin/python benchmarks/s3_merge_gap.py --mb 256 --calls 12 --keys 128
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import lakebuffer.lake.rowpages as rowpages
from benchmarks import cold_scale as cs
from lakebuffer.bench.s3 import MotoServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--keys", type=int, default=128)
    ap.add_argument("--gaps", type=int, nargs=2, default=[1 << 20, 16 * 1024])
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    import lakebuffer as lb

    root = Path(tempfile.mkdtemp(prefix="s3gap-"))
    os.environ["TMPDIR"] = str(root)
    moto = MotoServer().start()
    try:
        t = cs.Target(root, a.mb, {"endpoint": moto.endpoint, "bucket": moto.bucket})
        t0 = time.perf_counter()
        info = cs.build(t)
        build_s = time.perf_counter() - t0
        buf = lb.ReplayBuffer.open(t.buf, **t.open_kwargs())
        cold = buf.sql("SELECT key FROM cold_rows").column("key").to_pylist()
        random.Random(5).shuffle(cold)
        times: dict[int, list[float]] = {g: [] for g in a.gaps}
        at = 0
        for r in range(a.calls + 1):
            for g in (a.gaps if r % 2 == 0 else a.gaps[::-1]):
                rowpages.OBJECT_MERGE_GAP = g
                keys = cold[at:at + a.keys]
                at = (at + a.keys) % max(1, len(cold) - a.keys)
                t1 = time.perf_counter()
                got = buf.get(keys, cs.COLS)
                if r:
                    times[g].append((time.perf_counter() - t1) * 1e3)
                assert got.num_rows == len(keys)
        buf.close()
        out = {"mb": a.mb, "keys": a.keys, "calls": a.calls, "build_s": round(build_s, 1), "cold_rows": len(cold),
               "lake_files": info.get("lake_files"), "load": os.getloadavg(),
               "get_p50_ms": {str(g): round(statistics.median(xs), 1) for g, xs in times.items()},
               "get_mean_ms": {str(g): round(statistics.fmean(xs), 1) for g, xs in times.items()}}
        print(json.dumps(out, indent=1))
        if a.out:
            a.out.write_text(json.dumps(out, indent=1) + "\n")
    finally:
        moto.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
