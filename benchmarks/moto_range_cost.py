"""What a ranged GET costs on moto's server by the size of the object it reads (issue 23, S3 scaling).

    PYTHONPATH=. .venv/bin/python benchmarks/moto_range_cost.py [--sizes 8 29 44 58] [--rounds 15]

Why: on moto, the 8 GB lake's cold get / ``sample + get`` were 2.4x / 2.7x its 2 GB lake's, and Lance's
take of the same rows 2.2x / 2.5x, while from local disk both stay within 1.2x. The two lakes' files
average 29 MB (2 GB) and 44 MB (8 GB). moto answers a GET with the whole object
(``FakeKey.value``: read from its spooled temp file, then copied) and slices the asked range out of
it afterwards, so each ranged request costs time in the object's size, where S3's does not. This
starts a moto server on loopback (``lakebuffer.bench.s3.MotoServer``), stores one object per size and
reads a 64 KiB range of each through pyarrow's S3 filesystem (the cold row reader's client), the sizes
alternated in every round, at one random offset a round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
from pyarrow import fs as pafs

from lakebuffer.bench.s3 import MotoServer

RANGE = 64 << 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 29, 44, 58], help="object sizes, MB")
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TMPDIR"] = tmp  # moto spools objects over 5 MB to temp files: keep them here
        moto = MotoServer().start()
        try:
            s3 = pafs.S3FileSystem(access_key="bench", secret_key="bench", endpoint_override=moto.endpoint,
                                   scheme="http", region="us-east-1")
            for mb in a.sizes:
                with s3.open_output_stream(f"{moto.bucket}/o{mb}") as f:
                    f.write(rng.bytes(mb << 20))
            files = {mb: s3.open_input_file(f"{moto.bucket}/o{mb}") for mb in a.sizes}
            times: dict[int, list[float]] = {mb: [] for mb in a.sizes}
            for _ in range(a.rounds):
                offset = int(rng.integers(0, (min(a.sizes) << 20) - RANGE))
                for mb, f in files.items():
                    t0 = time.perf_counter()
                    f.read_at(RANGE, offset)
                    times[mb].append(time.perf_counter() - t0)
            print(f"moto {__import__('moto').__version__}, load {os.getloadavg()[0]:.2f}: one 64 KiB ranged GET, median")
            for mb, xs in times.items():
                print(f"  {mb:4d} MB object: {statistics.median(xs) * 1e3:6.1f} ms")
        finally:
            moto.stop()


if __name__ == "__main__":
    main()
