"""Pushes batches forever into a buffer dir and prints each acknowledged key batch as one JSON line.

Used by the crash test, which kills this process with SIGKILL at random moments.
"""

from __future__ import annotations

import json
import sys

import lakebuffer as lb
from tests.rollouts import make_rollouts


def main() -> None:
    path, seed = sys.argv[1], int(sys.argv[2])
    lake = sys.argv[3] if len(sys.argv) > 3 else None
    maintain = len(sys.argv) > 4 and sys.argv[4] == "maintain"  # also snapshot, compact + gc in the loop
    storage_options = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
    buf = lb.ReplayBuffer.open(path, memory_limit_mb=1, snapshot_interval_s=0.3 if lake else 0, lake=lake,
                               storage_options=storage_options)
    print(json.dumps({"ready": True}), flush=True)
    i = 0
    while True:
        t = make_rollouts(32, tokens=64, version=i % 5, seed=seed * 100_000 + i)
        keys = buf.push(t).to_pylist()
        print(json.dumps({"keys": keys}), flush=True)
        i += 1
        if i % 7 == 0:
            buf.sample(8, seed=i)
        if maintain and i % 3 == 0:
            buf.snapshot(wait=True)
        if maintain and i % 5 == 0:
            buf.compact(target_file_bytes=1 << 20)  # rewrites small files, then gc


if __name__ == "__main__":
    main()
