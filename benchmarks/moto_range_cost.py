"""What one ranged GET costs on the loopback S3 server (moto) as the object grows.

    PYTHONPATH=. python benchmarks/moto_range_cost.py [--sizes-mb 8 32 64 128] [--requests 40]

moto answers a ranged GET by reading the whole object and slicing it (``FakeKey.value``), so on moto a
request's time grows with the object while on S3 it does not. ``cold_scale.py --s3`` compares 2 and 8 GB
lakes whose files differ in size: this says how much of that comparison is the server. 64 KiB ranges at
random offsets, through pyarrow's S3 filesystem (the cold row reader's client); medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np
from pyarrow import fs as pafs

from lakebuffer.bench.s3 import MotoServer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[8, 32, 64, 128])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--range-kb", type=int, default=64)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TMPDIR"] = tmp  # moto spools objects over 5 MB to temp files
        moto = MotoServer().start()
        try:
            s3 = pafs.S3FileSystem(access_key="bench", secret_key="bench", endpoint_override=moto.endpoint,
                                   scheme="http", region="us-east-1")
            out = {}
            for mb in a.sizes_mb:
                path = f"{moto.bucket}/obj{mb}"
                with s3.open_output_stream(path) as f:
                    f.write(rng.bytes(mb << 20))
                span = a.range_kb << 10
                times = []
                with s3.open_input_file(path) as f:
                    for off in rng.integers(0, (mb << 20) - span, a.requests):
                        t0 = time.perf_counter()
                        f.read_at(span, int(off))
                        times.append((time.perf_counter() - t0) * 1e3)
                out[mb] = round(statistics.median(times), 2)
                print(f"{mb} MB object: {a.range_kb} KiB ranged GET p50 {out[mb]} ms", flush=True)
            print(json.dumps({"range_kb": a.range_kb, "p50_ms_by_object_mb": out, "loadavg": os.getloadavg()}))
        finally:
            moto.stop()


if __name__ == "__main__":
    main()
