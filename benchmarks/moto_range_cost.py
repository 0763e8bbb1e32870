"""What a ranged GET costs on moto's server by the size of the object it reads (issue 23, S3 scaling).

    .venv/bin/python benchmarks/moto_range_cost.py [--sizes 8 29 44 58] [--rounds 15]

Why: on moto, the 8 GB lake's cold get / ``sample + get`` were 2.4x / 2.7x its 2 GB lake's, and Lance's
take of the same rows 2.2x / 2.5x, while from local disk both stay within 1.2x. The two lakes' files
average 29 MB (2 GB) and 44 MB (8 GB). moto answers a GET with the whole object
(``FakeKey.value``: read from its spooled temp file, then copied) and slices the asked range out of
it afterwards, so each ranged request costs time in the object's size, where S3's does not. This
starts a moto server on loopback, stores one object per size and times the same 64 KiB range of each,
alternated.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 29, 44, 58], help="object sizes, MB")
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    import boto3

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="bench",
                              aws_secret_access_key="bench", region_name="us-east-1")
        for _ in range(50):
            try:
                client.create_bucket(Bucket="range-cost")
                break
            except Exception:  # noqa: BLE001 - the server is still starting
                time.sleep(0.2)
        for mb in a.sizes:
            client.put_object(Bucket="range-cost", Key=f"o{mb}", Body=os.urandom(mb << 20))
        times: dict[int, list[float]] = {mb: [] for mb in a.sizes}
        for _ in range(a.rounds):
            for mb in a.sizes:
                t0 = time.perf_counter()
                client.get_object(Bucket="range-cost", Key=f"o{mb}", Range="bytes=1000000-1065535")["Body"].read()
                times[mb].append(time.perf_counter() - t0)
        print(f"moto {__import__('moto').__version__}, load {os.getloadavg()[0]:.2f}: one 64 KiB ranged GET, median")
        for mb, xs in times.items():
            print(f"  {mb:4d} MB object: {statistics.median(xs) * 1e3:6.1f} ms")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
