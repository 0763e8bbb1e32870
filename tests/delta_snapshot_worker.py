"""Starts a snapshot of run ``rc`` into a lake and stops mid-upload, to be killed there (SIGKILL).

Prints ``{"uploaded": n}`` once ``n`` >= 1 data files of the snapshot are on the store, then blocks
before the Delta commit forever: the parent kills it at that point, leaving uploaded files that no
commit lists (what a training process killed mid-snapshot leaves behind).
"""

from __future__ import annotations

import json
import sys
import time

import pyarrow as pa

from lakebuffer.lake import Lake
from tests.rollouts import make_rollouts


def main() -> None:
    url, options = sys.argv[1], json.loads(sys.argv[2])
    lake = Lake(url, options, row_group_rows=64, target_file_bytes=64 * 1024)
    prefix = f"{lake.store.root}/run_id=rc/"

    def uploaded() -> int:
        return len([p for p in lake.fs.find(prefix) if p.endswith(".parquet")]) if lake.fs.exists(prefix) else 0

    def rows():
        for i in range(40):
            t = make_rollouts(64, tokens=256, version=i % 3, seed=7_000 + i)
            yield t.append_column("key", pa.array([f"rc-{i:03d}-{j:03d}" for j in range(64)]))
            lake.fs.invalidate_cache()
            if i >= 3 and uploaded():
                print(json.dumps({"uploaded": uploaded()}), flush=True)
                while True:  # mid-snapshot: files are on the store, the commit never comes
                    time.sleep(1)

    lake.commit_snapshot("rc", rows())
    print(json.dumps({"committed": True}), flush=True)


if __name__ == "__main__":
    main()
