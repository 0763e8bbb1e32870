"""Child process of tests/test_open_metadata.py: bytes read and written through the filesystem by one
buffer operation, from ``/proc/self/io`` (``rchar``/``wchar``: every read()/write() syscall, page cache
hits included, so a warm cache hides nothing). Imports and a throwaway open/close come first, so
lazily imported modules are not counted against the operation."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np


def io() -> tuple[int, int]:
    f = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(f["rchar"]), int(f["wchar"])


def _rows():
    sys.path.insert(0, str(Path(__file__).parent))
    from rollouts import make_rollouts

    return make_rollouts(16, tokens=4)


def main() -> None:
    import lakebuffer as lb

    op, path, lake, run_id = sys.argv[1:5]
    extra = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    where = sys.argv[6] if len(sys.argv) > 6 else None
    with tempfile.TemporaryDirectory() as d:  # warm-up: imports, DuckDB, RocksDB, deltalake
        with lb.ReplayBuffer.open(Path(d) / "b", lake=str(Path(d) / "lake"), snapshot_interval_s=0) as b:  # not the measured lake: its files would be verified (cached) here
            b.push(_rows())
            b.snapshot(wait=True)
            b.sample(1)
    r0, w0 = io()
    buf = lb.ReplayBuffer.open(path, lake=lake, snapshot_interval_s=0, run_id=run_id, memory_limit_mb=64, **extra)
    r1, w1 = io()
    out: dict = {"open_read": r1 - r0, "open_write": w1 - w0, "rows": len(buf)}
    if op == "warm-kill":  # die (SIGKILL) while the background warm of a lazy resume is under way
        import os
        import signal
        import time

        deadline = time.monotonic() + 60
        while buf.stats()["reads"].get("promoted_batches", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        print(json.dumps({"promoted": buf.stats()["reads"].get("promoted_batches", 0)}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    if op == "resume":
        keys = buf.sample(32, where=where, seed=1, columns=["key"]).column("key").to_pylist()
        got = buf.get(keys, columns=["key", "response_ids", "reward"])
        r2, w2 = io()
        out.update(first_read=r2 - r0, first_write=w2 - w0, keys=keys,
                   sums=[int(np.sum(v)) for v in got.column("response_ids").to_pylist()],
                   got_keys=got.column("key").to_pylist())
    buf.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
