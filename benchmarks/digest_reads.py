"""Issue 23 A/B: a cold get reading each row's ``_lb_hash`` digest bytes alone ("direct", the files
store the column uncompressed and PLAIN) against reading the whole digest page of each row ("pages",
the way files with zstd digests are read), on the same lake, in one process, modes alternated per call
(ABBA), with a Lance take of the same rows beside them.

Uses a buffer built by ``cold_scale.py`` (its files carry plain digests when built after this change).
Per round: fresh cold keys; for each mode: (``--evict-cache``: the lake's, the buffer's and Lance's
pages dropped first) ``get(keys, ["response_ids"])`` timed with the bytes it read (``/proc/self/io``
rchar), then ``sample(n, where) + get``; then a Lance take of the get's keys. Rows of both modes are
checked equal.

    PYTHONPATH=. .venv/bin/python benchmarks/digest_reads.py --root /work/coldscale-data --mb 8192 \
        --calls 16 --evict-cache --out benchmarks/notes/digest_reads.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import lakebuffer.lake.rowpages as rowpages
from benchmarks import cold_scale as cs

REAL_DIRECT = rowpages.direct_starts


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--mb", type=int, default=8192)
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--keys", type=int, default=256)
    ap.add_argument("--evict-cache", action="store_true")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    t = cs.Target(a.root, a.mb, None)
    side = cs.Side(t, a.keys, 7, a.evict_cache)
    modes = {"direct": REAL_DIRECT, "pages": lambda lay, groups: None}
    times: dict[str, dict[str, list[float]]] = {m: {"get": [], "sample": [], "get_bytes": []} for m in modes}
    lance: list[float] = []
    load0 = os.getloadavg()
    for r in range(a.calls + 1):
        keys = side.fresh_keys()
        order = ["direct", "pages"] if r % 2 == 0 else ["pages", "direct"]
        got = {}
        for m in order:
            rowpages.direct_starts = modes[m]
            if a.evict_cache:
                for url in (t.lake, t.lance, str(t.buf)):
                    cs.evict_cache(url)
            b0, t0 = _rchar(), time.perf_counter()
            got[m] = side.buf.get(keys, cs.COLS)
            dt, nbytes = time.perf_counter() - t0, _rchar() - b0
            t0 = time.perf_counter()
            s = side.buf.sample(a.keys, where=side.where, columns=["key", *cs.COLS], seed=1000 * r + len(m))
            ds = time.perf_counter() - t0
            if r:  # round 0 warms imports and footers
                times[m]["get"].append(dt)
                times[m]["get_bytes"].append(nbytes)
                times[m]["sample"].append(ds)
            assert s.num_rows > 0
        rowpages.direct_starts = REAL_DIRECT
        assert got["direct"].equals(got["pages"])
        if a.evict_cache:
            cs.evict_cache(t.lance)
        t0 = time.perf_counter()
        side.take(keys)
        if r:
            lance.append(time.perf_counter() - t0)
    out = {"mb": a.mb, "calls": a.calls, "keys": a.keys, "evict_cache": a.evict_cache,
           "load_start_end": [load0, os.getloadavg()], "machine": platform.platform(), "cpus": os.cpu_count(),
           "lance_take": cs.summary(lance)}
    for m, d in times.items():
        out[m] = {"get": cs.summary(d["get"]), "sample_get": cs.summary(d["sample"]),
                  "get_read_mb_p50": round(statistics.median(d["get_bytes"]) / 2**20, 2)}
    out["direct_over_pages_get_p50"] = round(out["direct"]["get"]["p50_ms"] / out["pages"]["get"]["p50_ms"], 3)
    out["direct_over_pages_sample_p50"] = round(out["direct"]["sample_get"]["p50_ms"] / out["pages"]["sample_get"]["p50_ms"], 3)
    for m in modes:
        out[f"{m}_get_over_lance_p50"] = round(out[m]["get"]["p50_ms"] / out["lance_take"]["p50_ms"], 2)
    print(json.dumps(out, indent=1))
    if a.out:
        a.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
