"""Issue 23: warm rows from disk, with and without announcing the reads (``POSIX_FADV_WILLNEED``).

A ``sample`` of a big buffer reads ~20% of its rows from the warm tier. The warm take read them one
after another in the calling thread (a page fault or a chunk check at a time), ~0.2 ms a row from this
VM's disk. ``tiers/ipcread.py`` now announces a take's reads first: the chunk runs it must check
(``ANNOUNCE``) and, when sampled ranges are not in the page cache, every range (``ANNOUNCE_READS``).
Both switches are alternated per call in one process on a buffer built by ``cold_scale.py``, fresh warm
keys each call:

* ``--mode checked``: the buffer freshly opened, so a row's chunks are checked on first read (what a
  sample after a reopen does), the buffer's files dropped from the page cache before each call;
* ``--mode known``: every chunk checked first (a scan of the warm tier), then the same; the reads are
  the rows' own bytes;
* ``--mode cached``: the same keys read again and again from the page cache (what the probe costs).

    PYTHONPATH=. .venv/bin/python benchmarks/warm_announce_ab.py --root /work/coldscale-data --mb 8192 --mode checked
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

from benchmarks import cold_scale as cs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--mb", type=int, default=8192)
    ap.add_argument("--mode", choices=["checked", "known", "cached"], default="checked")
    ap.add_argument("--keys", type=int, default=60)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    import lakebuffer as lb
    from lakebuffer.tiers import ipcread

    t = cs.Target(a.root, a.mb, None)
    buf = lb.ReplayBuffer.open(t.buf, **t.open_kwargs())
    warm = buf.sql("SELECT key FROM warm").column("key").to_pylist()  # (a scan: checks every chunk)
    random.Random(a.seed).shuffle(warm)
    if a.mode == "checked":  # forget the checks: a reopened buffer
        buf.close()
        buf = lb.ReplayBuffer.open(t.buf, **t.open_kwargs())
    hot = warm[:a.keys * 4]
    if a.mode == "cached":
        buf.get(hot, cs.COLS)
    times: dict[bool, list[float]] = {True: [], False: []}
    at = 0
    for r in range(a.calls):
        for on in ([True, False] if r % 2 else [False, True]):
            ipcread.ANNOUNCE = ipcread.ANNOUNCE_READS = on
            if a.mode == "cached":
                keys = random.Random(r).sample(hot, a.keys)
            else:
                cs.evict_cache(str(t.buf))
                keys = warm[at:at + a.keys]
                at += a.keys
            t0 = time.perf_counter()
            got = buf.get(keys, cs.COLS)
            times[on].append((time.perf_counter() - t0) * 1e3)
            assert got.num_rows == len(keys)
    buf.close()
    res = {"mb": a.mb, "mode": a.mode, "keys": a.keys, "calls": a.calls, "load": os.getloadavg(),
           "announced": {"p50_ms": round(statistics.median(times[True]), 2), "mean_ms": round(statistics.mean(times[True]), 2)},
           "not_announced": {"p50_ms": round(statistics.median(times[False]), 2), "mean_ms": round(statistics.mean(times[False]), 2)}}
    res["announced_over_not_p50"] = round(res["announced"]["p50_ms"] / res["not_announced"]["p50_ms"], 3)
    print(json.dumps(res, indent=1))
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
