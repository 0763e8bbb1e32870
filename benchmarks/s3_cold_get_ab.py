"""Issue 23 on S3: A/B of one switch of the row reader (a ``lakebuffer.lake.rowpages`` constant) in one
process on one moto (loopback) lake, the two values alternated per call, fresh cold keys each call.

* ``OBJECT_MERGE_GAP``: the gap under which two page ranges of one file are fetched by one request (on
  an object store a request costs about what ~1 MiB of transfer does; at 16 KiB, the local setting, a
  row's digest bytes and its page were two requests);
* ``OBJECT_HANDLES``: open files kept by path (0: opened per read, a HEAD request each; the kept ones
  are dropped before each call with 0).

    PYTHONPATH=. .venv/bin/python benchmarks/s3_cold_get_ab.py --switch OBJECT_MERGE_GAP --values 1048576 16384
    PYTHONPATH=. .venv/bin/python benchmarks/s3_cold_get_ab.py --switch OBJECT_HANDLES --values 256 0
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
    ap.add_argument("--switch", default="OBJECT_MERGE_GAP")
    ap.add_argument("--values", type=int, nargs=2, default=[1 << 20, 16 * 1024])
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
        times: dict[int, list[float]] = {g: [] for g in a.values}
        readers = [p.rows for p in buf._state.cold._page_readers.values()]
        at = 0
        for r in range(a.calls + 1):
            for g in (a.values if r % 2 == 0 else a.values[::-1]):
                setattr(rowpages, a.switch, g)
                if a.switch == "OBJECT_HANDLES" and not g:
                    readers = readers or [p.rows for p in buf._state.cold._page_readers.values()]
                    for reader in readers:
                        reader._handles.clear()
                keys = cold[at:at + a.keys]
                at = (at + a.keys) % max(1, len(cold) - a.keys)
                t1 = time.perf_counter()
                got = buf.get(keys, cs.COLS)
                if r:
                    times[g].append((time.perf_counter() - t1) * 1e3)
                assert got.num_rows == len(keys)
        buf.close()
        out = {"switch": a.switch, "mb": a.mb, "keys": a.keys, "calls": a.calls, "build_s": round(build_s, 1), "cold_rows": len(cold),
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
