"""A reader process for test_file_races: ``get`` and a payload ``sql`` over the warm tier in a loop.

Every row it gets back must carry the expected ``response_ids`` of its key (the parent wrote them with
``make_rollouts(N, tokens=T, seed=0)`` under the keys ``k0..k{N-1}``); a read may instead raise
``CorruptionError``. Any other exception exits 3, a wrong row exits 4; a crash signal is what the
parent looks for. Prints ``ready`` once the buffer is open, then counts at the end.

usage: python -m tests.warm_race_child BUFFER_DIR N TOKENS SECONDS
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pyarrow as pa

import lakebuffer as lb
from tests.rollouts import make_rollouts


def main() -> int:
    path, n, tokens, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    want = make_rollouts(n, tokens=tokens, seed=0).column("response_ids").combine_chunks()
    keys = [f"k{i}" for i in range(n)]
    counts = {"rows": 0, "corruption": 0, "calls": 0}

    def check(t: pa.Table) -> None:
        idx = np.array([int(k[1:]) for k in t.column("key").to_pylist()], np.int64)
        if not t.column("response_ids").combine_chunks().equals(want.take(pa.array(idx))):
            print(f"WRONG ROWS among {idx[:8].tolist()}", flush=True)
            sys.exit(4)
        counts["rows"] += t.num_rows

    with lb.ReplayBuffer.open(path, memory_limit_mb=4, snapshot_interval_s=0) as buf:
        print("ready", flush=True)
        rng = np.random.default_rng(1)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            counts["calls"] += 1
            try:
                if counts["calls"] % 2:
                    pick = [keys[i] for i in rng.choice(n, 32, replace=False)]
                    check(buf.get(pick, columns=["key", "response_ids"]))
                else:
                    pick = ", ".join(f"'{keys[i]}'" for i in rng.choice(n, 16, replace=False))
                    check(buf.sql(f"SELECT key, response_ids FROM rollouts WHERE key IN ({pick})"))
            except lb.CorruptionError:
                counts["corruption"] += 1
            except Exception as e:  # anything but CorruptionError breaks the guarantee
                print(f"UNEXPECTED {type(e).__name__}: {e}", flush=True)
                return 3
    print(f"done {counts}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
