"""Scenario ``get``: fetch ``response_ids`` of 256 sampled keys from each payload store.

Reuses the stores the ``ingest`` scenario left in ``ctx.stores``; builds them when run alone.
"""

from __future__ import annotations

import time
from typing import Any

from ..context import Context, error_entry
from ..systems import BASELINES, REWARD_GT, SAMPLE_N, ingest_once, payload_factory
from ..timing import median, percentile, quiet_gc, safe_ratio

NAME = "get"


def run(ctx: Context) -> dict[str, Any]:
    """Fetch ``response_ids`` of 256 sampled keys from the stores the ingest scenario left behind."""
    cfg = ctx.cfg
    tables = ctx.payload()
    rows = sum(t.num_rows for t in tables)
    out: dict[str, Any] = {}
    for name in ("lakebuffer", "rocksdb_pickle", "deque", "torchrl"):
        store = ctx.stores.get(name)
        if store is None:
            make = payload_factory(name, rows, ctx.cfg.budget_mb)
            if isinstance(make, str):
                out[name] = {"unavailable": make}
                continue
            ctx.say(f"get: building {name}")
            try:
                store = make(ctx.tmp(f"get-{name}"))
                ingest_once(store, tables)
                ctx.stores[name] = store
            except Exception as e:
                out[name] = error_entry(e)
                continue
        ctx.say(f"get: {name}")
        try:
            with quiet_gc():
                out[name] = _get_loop(store, cfg.get_trials)
        except Exception as e:
            out[name] = error_entry(e)
        ctx.drop_store(name)
        ctx.say("get done", advance=True)
    disk = ctx.limit("disk")
    memcpy = ctx.limit("memcpy")
    out["disk"] = {"read_gbps": disk.get("read_gbps")}
    out["memcpy"] = {"gbps": memcpy.get("gbps")}
    lb = out.get("lakebuffer", {}).get("mbps")
    ratio = {f"vs_{b}": safe_ratio(lb, out.get(b, {}).get("mbps")) for b in BASELINES}
    ratio["vs_disk"] = safe_ratio(lb, (disk.get("read_gbps") or 0) * 1e3)
    ratio["vs_memcpy"] = safe_ratio(lb, (memcpy.get("gbps") or 0) * 1e3)
    lb_p50 = out.get("lakebuffer", {}).get("p50_ms")
    for b in BASELINES:  # issue 17: get p50 >= 2x TorchRL's memmap storage (its p50 over ours)
        ratio[f"p50_vs_{b}"] = safe_ratio(out.get(b, {}).get("p50_ms"), lb_p50)
    out["ratio"] = ratio
    out["note"] = "keys drawn with reward > 0.5 over all versions (mostly spilled rows); page cache warm"
    return out


def _get_loop(store: Any, trials: int) -> dict[str, Any]:
    times, rates = [], []
    for i in range(trials):
        keys = store.sample_keys(SAMPLE_N, REWARD_GT, 0, seed=1000 + i)
        t0 = time.perf_counter()
        nbytes = store.get(keys, "response_ids")
        dt = time.perf_counter() - t0
        times.append(dt)
        rates.append(nbytes / dt / 1e6)
    return {"mbps": median(rates), "p50_ms": median(times) * 1e3, "p99_ms": percentile(times, 99) * 1e3, "trials": trials, "keys": SAMPLE_N}


def steps(cfg: Any) -> int:
    return 4
