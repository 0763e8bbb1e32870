"""cProfile of a snapshot to and a restore from moto S3 on loopback, next to s3fs moving the same files (issue 17).

    python benchmarks/profile_restore.py --mb 263
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import tempfile
import time
from pathlib import Path

import lakebuffer as lb
from lakebuffer.bench import data
from lakebuffer.bench.s3 import MotoServer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mb", type=int, default=263)
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="lb-profile-restore-"))
    try:
        with MotoServer() as s3:
            so, lake = s3.storage_options, s3.url("lake")
            opts = dict(lake=lake, storage_options=so, run_id="r", memory_limit_mb=256, snapshot_interval_s=0)
            buf = lb.ReplayBuffer.open(root / "a", **opts)
            for t in data.stream(a.mb << 20, batch_rows=512, seed=0):
                buf.push(t.drop_columns(["run_id", "key"]))
            buf.flush()
            t0 = time.perf_counter()
            buf.snapshot(wait=True)
            print(f"snapshot {time.perf_counter() - t0:.2f} s")
            buf.close()
            pr = cProfile.Profile()
            t0 = time.perf_counter()
            pr.enable()
            restored = lb.ReplayBuffer.open(root / "b", **opts)
            pr.disable()
            print(f"restore {time.perf_counter() - t0:.2f} s, {len(restored):,} rows")
            pstats.Stats(pr).sort_stats("tottime").print_stats(12)
            restored.close()
            fs = s3.filesystem()
            files = [f for f in fs.find(lake) if f.endswith(".parquet")]
            t0 = time.perf_counter()
            fs.cat(files)
            print(f"s3fs cat of the same {len(files)} files ({sum(fs.size(f) for f in files) >> 20} MB): "
                  f"{time.perf_counter() - t0:.2f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
