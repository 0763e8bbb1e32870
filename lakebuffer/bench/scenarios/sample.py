"""Scenario ``sample``: key selection with ``reward > 0.5 AND policy_version >= v`` as the buffer grows.

Metadata-only rollouts, so the figure is the selection itself, not payload movement.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from .. import baselines as bl
from .. import data
from ..context import Context, error_entry
from ..systems import REWARD_GT, SAMPLE_N, LakeBufferStore, close_store
from ..timing import latency_loop, quiet_gc, safe_ratio

NAME = "sample"


def version_threshold(rows: int, shape: data.Shape = data.METADATA) -> int:
    """``v`` such that ``policy_version >= v`` keeps the newest 20% of versions (10% of rows match)."""
    versions = math.ceil(rows / shape.rows_per_version)
    return versions - max(1, math.ceil(0.2 * versions))


def fresh_threshold(rows: int, shape: data.Shape = data.METADATA) -> int:
    """``v`` of a fresh-window predicate: the newest 2 policy versions (the common RL case)."""
    return max(0, math.ceil(rows / shape.rows_per_version) - 2)


def _meta_stores(ctx: Context, top: int) -> dict[str, Any]:
    stores: dict[str, Any] = {}
    for name, make in (
        ("lakebuffer", lambda: LakeBufferStore(ctx.tmp("sample-lakebuffer"), ctx.cfg.budget_mb)),
        ("numpy", bl.NumpyIndex),
        ("rocksdb_pickle", bl.ScoreIndex),
        ("deque", lambda: bl.DequeStore(Path("."), None)),
        ("torchrl", lambda: bl.TorchRLStore(ctx.tmp("sample-torchrl"), top, shape=data.METADATA)),
    ):
        if name == "torchrl" and (reason := bl.torch_available()):
            stores[name] = {"unavailable": reason}
            continue
        try:
            stores[name] = make()
        except Exception as e:
            stores[name] = error_entry(e)
    return stores


def _deque_meta_row_bytes() -> float:
    """Measured bytes of one metadata-only dict row (tracemalloc on 20k rows)."""
    import tracemalloc

    t = data.rollouts(0, 20_000, seed=1, shape=data.METADATA, run_id="meta")
    tracemalloc.start()
    try:
        rows = bl.dict_rows(t)
        size, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return size / len(rows)


def run(ctx: Context) -> dict[str, Any]:
    """Key selection with ``reward > 0.5 AND policy_version >= v`` as the buffer grows to 10M."""
    cfg = ctx.cfg
    sizes = sorted(cfg.sample_sizes)
    stores = _meta_stores(ctx, sizes[-1])
    out: dict[str, Any] = {n: ({"by_size": {}, "build_s": 0.0} if not isinstance(s, dict) else s) for n, s in stores.items()}
    live = {n: s for n, s in stores.items() if not isinstance(s, dict)}
    deque_row = _deque_meta_row_bytes()
    built = 0
    chunk = 262_144
    try:
        for size in sizes:
            if size > cfg.deque_max_rows and "deque" in live:
                close_store(live.pop("deque"), None)
            ctx.say(f"sample: building {size:,} metadata rollouts")
            while built < size:
                n = min(chunk, size - built)
                t = data.rollouts(built, n, seed=1, shape=data.METADATA, run_id="meta")
                for name, store in list(live.items()):
                    try:
                        out[name]["build_s"] += _feed(store, t, cfg.meta_push_rows)
                    except Exception as e:
                        out[name] = error_entry(e)
                        close_store(live.pop(name), None)
                built += n
            for name, store in list(live.items()):
                t0 = time.perf_counter()
                store.finish()
                out[name]["build_s"] += time.perf_counter() - t0
            v = version_threshold(size)
            for name, store in list(live.items()):
                ctx.say(f"sample: {name} at {size:,}")
                try:
                    out[name]["by_size"][str(size)] = _sample_loop(store, size, v, cfg)
                except Exception as e:
                    out[name]["by_size"][str(size)] = error_entry(e)
            if "deque" in out and "by_size" in out["deque"] and size > cfg.deque_max_rows:
                out["deque"]["by_size"][str(size)] = {
                    "skipped": f"out of budget: {deque_row * size / 1e9:.1f} GB of dict rows ({deque_row:.0f} B/row measured) vs a {cfg.budget_mb} MB budget"
                }
            ctx.say("sample size done", advance=True)
    finally:
        for store in live.values():
            close_store(store, getattr(store, "root", None))
    for fig in out.values():
        if "build_s" in fig:
            fig["build_rows_per_s"] = built / fig["build_s"] if fig["build_s"] else None
    if "deque" in out and "by_size" in out["deque"]:
        out["deque"]["row_bytes"] = deque_row
        out["deque"]["out_of_budget_at_rows"] = int(cfg.budget_mb * 2**20 / deque_row)
    _sample_ratios(out, sizes)
    out["predicate"] = "reward > 0.5 AND policy_version >= v (newest 20% of versions: ~10% of rows match)"
    out["note"] = "metadata-only rows (1..4 tokens); rocksdb_pickle = the RFC's in-memory score index (RocksDB is not read to select keys)"
    return out


def _feed(store: Any, table: pa.Table, push_rows: int) -> float:
    t0 = time.perf_counter()
    if isinstance(store, LakeBufferStore):
        table = store.prepare(table)
        for start in range(0, table.num_rows, push_rows):
            store.push(table.slice(start, push_rows))
    else:
        store.push(store.prepare(table))
    return time.perf_counter() - t0


def _sample_loop(store: Any, size: int, v: int, cfg: Any) -> dict[str, Any]:
    last: list[Any] = []

    def select(i: int) -> None:
        last[:] = [store.sample_keys(SAMPLE_N, REWARD_GT, v, seed=i)]

    with quiet_gc():
        fig = latency_loop(select, min_trials=5, max_trials=cfg.sample_trials, max_seconds=cfg.sample_max_s)
        fig["version_ge"] = v
        if isinstance(store, (LakeBufferStore, bl.NumpyIndex)):  # the fresh window: newest 2 versions
            vf = fresh_threshold(size)
            fresh = latency_loop(lambda i: store.sample_keys(SAMPLE_N, REWARD_GT, vf, seed=i), min_trials=5,
                                 max_trials=cfg.sample_trials, max_seconds=cfg.sample_max_s / 2)
            fig["fresh_p50_ms"], fig["fresh_p99_ms"], fig["fresh_version_ge"] = fresh["p50_ms"], fresh["p99_ms"], vf
        if hasattr(store, "get") and not isinstance(store, bl.NumpyIndex):
            keys = last[0]
            fig_get = latency_loop(lambda i: store.get(keys, "response_ids"), min_trials=3, max_trials=30, max_seconds=1.0)
            fig["get_p50_ms"], fig["get_p99_ms"] = fig_get["p50_ms"], fig_get["p99_ms"]
    store.finish()  # let lakebuffer's background work (replay counts) end before the next system runs
    return fig


def _sample_ratios(out: dict[str, Any], sizes: list[int]) -> None:
    def p(name: str, size: int, key: str = "p99_ms") -> float | None:
        return out.get(name, {}).get("by_size", {}).get(str(size), {}).get(key)

    by_size = {}
    for size in sizes:
        lb = p("lakebuffer", size)
        by_size[str(size)] = {f"vs_{b}": safe_ratio(p(b, size), lb) for b in ("numpy", "rocksdb_pickle", "deque", "torchrl")}
    growth = {}
    if len(sizes) >= 2:
        a, b = sizes[-2], sizes[-1]
        for name in out:
            growth[name] = safe_ratio(p(name, b), p(name, a))
    top = by_size[str(sizes[-1])]
    out["ratio"] = {**top, "by_size": by_size, "growth_p99": growth, "growth_from_to": [sizes[-2], sizes[-1]] if len(sizes) >= 2 else None}


def steps(cfg: Any) -> int:
    return len(cfg.sample_sizes)
