"""Scenario ``ingest``: push the whole payload under the budget, every payload system, interleaved trials.

The stores of the last trial stay in ``ctx.stores`` for the ``get`` scenario (same data, no rebuild).
"""

from __future__ import annotations

from typing import Any

from .. import baselines as bl
from .. import data
from ..context import Context, error_entry
from ..systems import BASELINES, PAYLOAD_SYSTEMS, close_store, ingest_once, payload_factory
from ..timing import gbps, median, quiet_gc, safe_ratio

NAME = "ingest"


def run(ctx: Context) -> dict[str, Any]:
    """Push the whole payload under the budget, system by system, trial by trial (interleaved)."""
    cfg = ctx.cfg
    tables = ctx.payload()
    nbytes = data.logical_bytes(tables)
    rows = sum(t.num_rows for t in tables)
    out: dict[str, Any] = {}
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in PAYLOAD_SYSTEMS}
    factories = {n: payload_factory(n, rows, cfg.budget_mb) for n in PAYLOAD_SYSTEMS}
    for n, f in factories.items():
        if isinstance(f, str):
            out[n] = {"unavailable": f}
    for trial in range(cfg.trials):
        last = trial == cfg.trials - 1
        for name, make in factories.items():
            if isinstance(make, str) or "error" in out.get(name, {}):
                continue
            ctx.say(f"ingest: {name} trial {trial + 1}/{cfg.trials}")
            root = ctx.tmp(f"ingest-{name}")
            store = None
            try:
                store = make(root)
                with quiet_gc():
                    r = ingest_once(store, tables)
                r["footprint"] = store.footprint()
                if isinstance(store, bl.DequeStore):
                    r["out_of_budget_at"] = store.out_of_budget_at
                runs[name].append(r)
            except Exception as e:
                out[name] = error_entry(e)
            if last and store is not None and name != "lakebuffer_memory" and name not in out:
                ctx.stores[name] = store  # kept for the get scenario
            else:
                close_store(store, root)
        ctx.say("ingest trial done", advance=True)
    for name, rs in runs.items():
        if not rs or name in out:
            continue
        secs = [r["seconds"] for r in rs]
        fig = {
            "gbps": gbps(nbytes, median(secs)),
            "runs_gbps": [gbps(nbytes, s) for s in secs],
            "seconds": median(secs),
            **{k: rs[-1][k] for k in ("finish_s", "push_p50_ms", "push_p99_ms", "footprint")},
        }
        if name == "deque":
            fp = rs[-1]["footprint"]
            fig["out_of_budget_at"] = rs[-1]["out_of_budget_at"]
            fig["rows_dropped"] = fp["rows_dropped"]
            fig["retained_fraction"] = fp["rows"] / rows
        out[name] = fig
    for name in ("lakebuffer", "lakebuffer_memory"):
        if name in out and "gbps" in out[name]:
            out[name]["durability"] = "memory" if name.endswith("memory") else "wal"
    disk = ctx.limit("disk")
    memcpy = ctx.limit("memcpy")
    out["disk"] = {"write_gbps": disk.get("write_gbps")}
    out["memcpy"] = {"gbps": memcpy.get("gbps")}
    lb = out.get("lakebuffer", {}).get("gbps")
    ratio = {f"vs_{b}": safe_ratio(lb, out.get(b, {}).get("gbps")) for b in BASELINES}
    ratio["vs_disk"] = safe_ratio(lb, disk.get("write_gbps"))
    ratio["vs_memcpy"] = safe_ratio(lb, memcpy.get("gbps"))
    ratio["wal_vs_memory"] = safe_ratio(lb, out.get("lakebuffer_memory", {}).get("gbps"))
    out["ratio"] = ratio
    out["data"] = {"logical_bytes": nbytes, "rows": rows, "batches": len(tables), "budget_mb": cfg.budget_mb}
    return out


def steps(cfg: Any) -> int:
    return cfg.trials
