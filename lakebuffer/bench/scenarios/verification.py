"""Scenario ``verification``: what reading only verified data costs (issue 15, guarantee 2).

Warm fragments are checked (crc32 of their files) the first time a process reads them and then
trusted while their files keep their size and mtime; WAL segments carry a CRC32C footer checked on
recovery. This scenario runs the same work twice on the same generated rollouts, all of them in the
warm tier of a freshly reopened buffer (so nothing is verified yet), once with read-path
verification on (the default) and once with it switched off, and reports each path's time:

* ``snapshot``: the first snapshot reads every fragment (the first read verifies it);
* ``get``: 256 random keys' ``response_ids`` (steady state: fragments already verified);
* ``scan``: every row's ``response_ids`` through ``scan`` (DuckDB over the verified source).

Ratios are "without / with" for times (1.0 = free; 0.8 = verification costs 25% more time).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from ..context import Context, error_entry
from ..timing import median, percentile, quiet_gc, safe_ratio

NAME = "verification"
_GET_KEYS = 256


def run(ctx: Context) -> dict[str, Any]:
    import lakebuffer as lb

    tables = ctx.payload()
    out: dict[str, Any] = {}
    for mode in ("verified", "unverified"):
        ctx.say(f"verification: {mode}")
        try:
            with quiet_gc():
                out[mode] = _measure(lb, ctx, tables, verify=mode == "verified")
        except Exception as e:
            out[mode] = error_entry(e)
        ctx.say("verification done", advance=True)
    on, off = out.get("verified", {}), out.get("unverified", {})
    out["ratio"] = {
        f"{k}_unverified_vs_verified": safe_ratio(off.get(f"{k}_s"), on.get(f"{k}_s"))
        for k in ("snapshot", "get_p50", "scan")
    }
    out["note"] = ("same rollouts, all warm, buffer reopened before each run; verification = CRC32C of each "
                   "fragment file (its footer) at its first read in the process, then one stat per file")
    return out


def _measure(lb: Any, ctx: Context, tables: list, *, verify: bool) -> dict[str, Any]:
    path, lake = ctx.tmp("verify-buffer"), ctx.tmp("verify-lake")
    opts = {"lake": str(lake), "memory_limit_mb": ctx.cfg.budget_mb, "snapshot_interval_s": 0}
    with lb.ReplayBuffer.open(path, **opts) as buf:
        for t in tables:  # the buffer assigns keys and run_id itself (as the ingest scenario's system does)
            buf.push(t.drop_columns([c for c in ("key", "run_id") if c in t.column_names]))
        buf.evict_all()
    with lb.ReplayBuffer.open(path, **opts) as buf:  # a new process's view: nothing verified yet
        buf.warm.verify_reads = verify
        warm_bytes = buf.stats()["warm"].get("bytes", 0)
        t0 = time.perf_counter()
        buf.snapshot(wait=True)
        snapshot_s = time.perf_counter() - t0
        keys = buf.sql("SELECT key FROM meta").column("key")
        rng = np.random.default_rng(0)
        times = []
        for _ in range(max(ctx.cfg.get_trials, 5)):
            pick = keys.take(rng.choice(len(keys), min(_GET_KEYS, len(keys)), replace=False))
            t0 = time.perf_counter()
            buf.get(pick, columns=["response_ids"])
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rows = sum(b.num_rows for b in buf.scan(columns=["response_ids"]))
        scan_s = time.perf_counter() - t0
    return {"snapshot_s": snapshot_s, "get_p50_s": median(times), "get_p99_s": percentile(times, 99),
            "scan_s": scan_s, "rows": rows, "warm_bytes": warm_bytes}


def steps(cfg: Any) -> int:
    return 2
