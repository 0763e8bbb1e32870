"""Issue 23: A/B of one switch of the cold get path (a module constant), on the same buffer, in one
process, the two values alternated per call (ABBA), fresh cold keys each call, ``--evict-cache``: the
lake's pages (and before a sample the buffer's warm files') dropped before every call (from disk)
or not (page cache). Uses a buffer built by
``cold_scale.py``. Prints p50 / mean of ``get(256 cold keys, ["response_ids"])`` and of
``sample(256, where) + get`` for each value.

    PYTHONPATH=. .venv/bin/python benchmarks/cold_get_ab.py --root /work/coldscale-data --mb 8192 \\
        --switch lakebuffer.lake.rowpages:DECODE_ON_FETCH --values True False --calls 20 --evict-cache
"""

from __future__ import annotations

import argparse
import ast
import importlib
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
    ap.add_argument("--switch", required=True, help="module:NAME")
    ap.add_argument("--values", nargs=2, required=True, help="two Python literals")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--keys", type=int, default=256)
    ap.add_argument("--evict-cache", action="store_true")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    import lakebuffer as lb

    mod_name, attr = a.switch.split(":")
    mod = importlib.import_module(mod_name)
    values = [ast.literal_eval(v) for v in a.values]
    t = cs.Target(a.root, a.mb, None)
    buf = lb.ReplayBuffer.open(t.buf, **t.open_kwargs())
    cold = buf.sql("SELECT key FROM cold_rows").column("key").to_pylist()
    random.Random(11).shuffle(cold)
    where = cs.where_for(len(buf))
    times = {str(v): {"get": [], "sample_get": []} for v in values}
    load0 = os.getloadavg()
    at = 0
    for r in range(a.calls + 1):  # round 0 reads footers; not counted
        order = values if r % 2 == 0 else values[::-1]
        for v in order:
            setattr(mod, attr, v)
            keys = cold[at:at + a.keys]
            at += a.keys
            if a.evict_cache:
                cs.evict_cache(t.lake)
            t0 = time.perf_counter()
            got = buf.get(keys, cs.COLS)
            dt = time.perf_counter() - t0
            assert got.num_rows == len(keys)
            if a.evict_cache:  # the lake and the buffer's own files (a sample reads warm rows too)
                cs.evict_cache(t.lake)
                cs.evict_cache(str(t.buf))
            t0 = time.perf_counter()
            buf.sample(a.keys, where=where, columns=["key", *cs.COLS], seed=r * 7 + len(str(v)))
            ds = time.perf_counter() - t0
            if r:
                times[str(v)]["get"].append(dt * 1e3)
                times[str(v)]["sample_get"].append(ds * 1e3)
    buf.close()
    out = {"mb": a.mb, "switch": a.switch, "calls": a.calls, "evict_cache": a.evict_cache,
           "load_start_end": [load0, os.getloadavg()], "cpus": os.cpu_count()}
    for v, d in times.items():
        out[v] = {k: {"p50_ms": round(statistics.median(xs), 1), "mean_ms": round(statistics.fmean(xs), 1)} for k, xs in d.items()}
    a0, b0 = (str(v) for v in values)
    out["a_over_b_p50"] = {k: round(out[a0][k]["p50_ms"] / out[b0][k]["p50_ms"], 3) for k in ("get", "sample_get")}
    print(json.dumps(out, indent=1))
    if a.out:
        a.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
