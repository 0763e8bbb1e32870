"""The scenarios: each runs every system on the same generated rollouts in this process.

A scenario returns ``{system: figures, ..., "ratio": {...}}``. A ratio is always "lakebuffer
relative to X" with > 1 meaning lakebuffer is better: throughput ratios divide lakebuffer's
GB/s by X's, latency ratios divide X's latency by lakebuffer's. A system that fails or is not
installed reports ``{"error": ...}`` / ``{"unavailable": ...}`` and the scenario goes on.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from . import baselines as bl
from . import data, limits
from .context import Context, error_entry
from .systems import LakeBufferStore
from .timing import gbps, latency_loop, median, percentile, quiet_gc

PAYLOAD_SYSTEMS = ("lakebuffer", "lakebuffer_memory", "rocksdb_pickle", "deque", "torchrl")
BASELINES = ("rocksdb_pickle", "deque", "torchrl")
SAMPLE_N = 256
REWARD_GT = 0.5


# limits ---------------------------------------------------------------------------------------
def limit(ctx: Context, name: str) -> dict[str, Any]:
    """A physical limit, measured once per run on first use."""
    if name not in ctx.limits:
        cfg = ctx.cfg
        trials = max(cfg.trials, 3) if not cfg.quick else 2
        ctx.say(f"limit: {name}")
        try:
            if name == "memcpy":
                ctx.limits[name] = limits.memcpy(cfg.memcpy_bytes, trials=5)
            elif name == "disk":
                ctx.limits[name] = limits.disk(ctx.workdir, cfg.disk_bytes, trials=trials)
            elif name == "s3":
                ctx.limits[name] = limits.s3(ctx.s3(), cfg.s3_bytes, trials=trials)
        except Exception as e:
            ctx.limits[name] = error_entry(e)
    return ctx.limits[name]


def run_limits(ctx: Context) -> dict[str, Any]:
    return {name: limit(ctx, name) for name in ("memcpy", "disk", "s3")}


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or (isinstance(a, float) and math.isnan(a)):
        return None
    return a / b


# payload stores -------------------------------------------------------------------------------
def _factory(ctx: Context, name: str, rows: int) -> Callable[[Path], Any] | str:
    """How to build system ``name`` for a payload of ``rows`` rows, or why it can't be built."""
    budget_mb = ctx.cfg.budget_mb
    if name == "lakebuffer":
        return lambda root: LakeBufferStore(root, budget_mb)
    if name == "lakebuffer_memory":
        return lambda root: LakeBufferStore(root, budget_mb, durability="memory")
    if name == "rocksdb_pickle":
        return lambda root: bl.RocksPickleStore(root, budget_mb << 20)
    if name == "deque":
        return lambda root: bl.DequeStore(root, budget_mb << 20)
    if name == "torchrl":
        reason = bl.torch_available()
        return reason if reason else (lambda root: bl.TorchRLStore(root, rows))
    raise KeyError(name)


def _ingest_once(store: Any, tables: list[pa.Table]) -> dict[str, Any]:
    """Push every batch; only ``push`` and the final ``finish`` are timed."""
    pushes: list[float] = []
    for t in tables:
        item = store.prepare(t)
        t0 = time.perf_counter()
        store.push(item)
        pushes.append(time.perf_counter() - t0)
        del item
    t0 = time.perf_counter()
    store.finish()
    finish = time.perf_counter() - t0
    return {"seconds": sum(pushes) + finish, "finish_s": finish, "push_p50_ms": median(pushes) * 1e3, "push_p99_ms": percentile(pushes, 99) * 1e3}


def ingest(ctx: Context) -> dict[str, Any]:
    """Push the whole payload under the budget, system by system, trial by trial (interleaved)."""
    cfg = ctx.cfg
    tables = ctx.payload()
    nbytes = data.logical_bytes(tables)
    rows = sum(t.num_rows for t in tables)
    out: dict[str, Any] = {}
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in PAYLOAD_SYSTEMS}
    factories = {n: _factory(ctx, n, rows) for n in PAYLOAD_SYSTEMS}
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
                    r = _ingest_once(store, tables)
                r["footprint"] = store.footprint()
                if isinstance(store, bl.DequeStore):
                    r["out_of_budget_at"] = store.out_of_budget_at
                runs[name].append(r)
            except Exception as e:
                out[name] = error_entry(e)
            if last and store is not None and name != "lakebuffer_memory" and name not in out:
                ctx.stores[name] = store  # kept for the get scenario
            else:
                _close(store, root)
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
    disk = limit(ctx, "disk")
    memcpy = limit(ctx, "memcpy")
    out["disk"] = {"write_gbps": disk.get("write_gbps")}
    out["memcpy"] = {"gbps": memcpy.get("gbps")}
    lb = out.get("lakebuffer", {}).get("gbps")
    ratio = {f"vs_{b}": _ratio(lb, out.get(b, {}).get("gbps")) for b in BASELINES}
    ratio["vs_disk"] = _ratio(lb, disk.get("write_gbps"))
    ratio["vs_memcpy"] = _ratio(lb, memcpy.get("gbps"))
    ratio["wal_vs_memory"] = _ratio(lb, out.get("lakebuffer_memory", {}).get("gbps"))
    out["ratio"] = ratio
    out["data"] = {"logical_bytes": nbytes, "rows": rows, "batches": len(tables), "budget_mb": cfg.budget_mb}
    return out


def _close(store: Any, root: Path | None) -> None:
    if store is not None:
        try:
            store.close()
        except Exception:
            pass
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


# get ------------------------------------------------------------------------------------------
def get(ctx: Context) -> dict[str, Any]:
    """Fetch ``response_ids`` of 256 sampled keys from the stores the ingest scenario left behind."""
    cfg = ctx.cfg
    tables = ctx.payload()
    rows = sum(t.num_rows for t in tables)
    out: dict[str, Any] = {}
    for name in ("lakebuffer", "rocksdb_pickle", "deque", "torchrl"):
        store = ctx.stores.get(name)
        if store is None:
            make = _factory(ctx, name, rows)
            if isinstance(make, str):
                out[name] = {"unavailable": make}
                continue
            ctx.say(f"get: building {name}")
            try:
                store = make(ctx.tmp(f"get-{name}"))
                _ingest_once(store, tables)
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
    disk = limit(ctx, "disk")
    memcpy = limit(ctx, "memcpy")
    out["disk"] = {"read_gbps": disk.get("read_gbps")}
    out["memcpy"] = {"gbps": memcpy.get("gbps")}
    lb = out.get("lakebuffer", {}).get("mbps")
    ratio = {f"vs_{b}": _ratio(lb, out.get(b, {}).get("mbps")) for b in BASELINES}
    ratio["vs_disk"] = _ratio(lb, (disk.get("read_gbps") or 0) * 1e3)
    ratio["vs_memcpy"] = _ratio(lb, (memcpy.get("gbps") or 0) * 1e3)
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


# sample ---------------------------------------------------------------------------------------
def version_threshold(rows: int, shape: data.Shape = data.METADATA) -> int:
    """``v`` such that ``policy_version >= v`` keeps the newest 20% of versions (10% of rows match)."""
    versions = math.ceil(rows / shape.rows_per_version)
    return versions - max(1, math.ceil(0.2 * versions))


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


def sample(ctx: Context) -> dict[str, Any]:
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
                _close(live.pop("deque"), None)
            ctx.say(f"sample: building {size:,} metadata rollouts")
            while built < size:
                n = min(chunk, size - built)
                t = data.rollouts(built, n, seed=1, shape=data.METADATA, run_id="meta")
                for name, store in list(live.items()):
                    try:
                        out[name]["build_s"] += _feed(store, t, cfg.meta_push_rows)
                    except Exception as e:
                        out[name] = error_entry(e)
                        _close(live.pop(name), None)
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
            _close(store, getattr(store, "root", None))
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
        by_size[str(size)] = {f"vs_{b}": _ratio(p(b, size), lb) for b in ("numpy", "rocksdb_pickle", "deque", "torchrl")}
    growth = {}
    if len(sizes) >= 2:
        a, b = sizes[-2], sizes[-1]
        for name in out:
            growth[name] = _ratio(p(name, b), p(name, a))
    top = by_size[str(sizes[-1])]
    out["ratio"] = {**top, "by_size": by_size, "growth_p99": growth, "growth_from_to": [sizes[-2], sizes[-1]] if len(sizes) >= 2 else None}


# snapshot / restore ---------------------------------------------------------------------------
def snapshot_restore(ctx: Context) -> dict[str, Any]:
    """Snapshot to and restore from the loopback S3, next to raw s3fs transfers of the same files."""
    cfg = ctx.cfg
    server = ctx.s3()
    fs = server.filesystem()
    tables = data.generate(cfg.snapshot_bytes, batch_rows=cfg.batch_rows, seed=3)
    nbytes = data.logical_bytes(tables)
    rows = sum(t.num_rows for t in tables)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in ("lakebuffer", "s3", "rocksdb_pickle", "torchrl", "deque")}
    out: dict[str, Any] = {}
    if (reason := bl.torch_available()) is not None:
        out["torchrl"] = {"unavailable": reason}
    for trial in range(cfg.trials):
        ctx.say(f"snapshot: lakebuffer trial {trial + 1}")
        if "lakebuffer" not in out:
            try:
                lb = _lakebuffer_snapshot(ctx, server, fs, tables, trial)
                runs["lakebuffer"].append(lb)
                runs["s3"].append(_raw_s3(fs, lb["files"], server.url(f"raw/t{trial}")))
            except Exception as e:
                out["lakebuffer"] = error_entry(e)
        for name in ("rocksdb_pickle", "torchrl", "deque"):
            if name in out:
                continue
            ctx.say(f"snapshot: {name} trial {trial + 1}")
            try:
                runs[name].append(_baseline_snapshot(ctx, name, fs, server.url(f"{name}/t{trial}"), tables, rows))
            except Exception as e:
                out[name] = error_entry(e)
        _empty_bucket(fs, server.bucket)  # moto keeps objects in its RAM: start each trial lean
        ctx.say("snapshot trial done", advance=True)
    for name, rs in runs.items():
        if name in out or not rs:
            continue
        fig: dict[str, Any] = {}
        for k in rs[0]:
            if k.endswith("_s"):
                fig[k] = median([r[k] for r in rs])
        up = median([r["uploaded_bytes"] for r in rs])
        fig["uploaded_bytes"] = up
        if name == "s3":
            fig["put_gbps"] = gbps(up, fig["put_s"])
            fig["get_gbps"] = gbps(up, fig["get_s"])
        else:
            fig["snapshot_gbps"] = gbps(nbytes, fig["snapshot_s"])
            fig["restore_gbps"] = gbps(nbytes, fig["restore_s"])
            fig["snapshot_wire_gbps"] = gbps(up, fig["snapshot_s"])
            fig["restore_wire_gbps"] = gbps(up, fig["restore_s"])
        out[name] = fig
    if "lakebuffer" not in out or "error" not in out["lakebuffer"]:
        ctx.say("snapshot: lakebuffer push latency during a snapshot")
        try:
            out.setdefault("lakebuffer", {})["push_during_snapshot"] = _push_during_snapshot(ctx, server, tables)
        except Exception as e:
            out.setdefault("lakebuffer", {})["push_during_snapshot"] = error_entry(e)
        _empty_bucket(fs, server.bucket)
    lb, raw = out.get("lakebuffer", {}), out.get("s3", {})
    ratio: dict[str, Any] = {}
    during = lb.get("push_during_snapshot", {})
    if "p99_ms_during" in during:
        ratio["push_p99_during_vs_without"] = during["p99_ms_during"] / during["p99_ms_without"]
    if "snapshot_s" in lb and "put_s" in raw:
        ratio["snapshot_vs_s3"] = raw["put_s"] / lb["snapshot_s"]
        ratio["restore_vs_s3"] = raw["get_s"] / lb["restore_s"]
    for b in ("rocksdb_pickle", "torchrl", "deque"):
        ratio[f"snapshot_vs_{b}"] = _ratio(lb.get("snapshot_gbps"), out.get(b, {}).get("snapshot_gbps"))
        ratio[f"restore_vs_{b}"] = _ratio(lb.get("restore_gbps"), out.get(b, {}).get("restore_gbps"))
    out["ratio"] = ratio
    out["s3_single_object"] = limit(ctx, "s3")
    out["data"] = {"logical_bytes": nbytes, "rows": rows}
    out["note"] = (
        "snapshot_gbps/restore_gbps in logical (Arrow) bytes; the s3 row moves exactly lakebuffer's snapshot files "
        "(fs.cat / fs.pipe, concurrent); restore = open a fresh dir from the lake + read every row once"
    )
    return out


def _lakebuffer_snapshot(ctx: Context, server: Any, fs: Any, tables: list[pa.Table], trial: int) -> dict[str, Any]:
    import lakebuffer as lb

    url = server.url(f"lake/t{trial}")
    run_id = f"snap{trial}"
    kw = {"lake": url, "storage_options": server.storage_options, "run_id": run_id}
    src_root = ctx.tmp("snap-src")
    store = LakeBufferStore(src_root, ctx.cfg.budget_mb, **kw)
    try:
        for t in tables:
            store.push(store.prepare(t))
        store.finish()
        t0 = time.perf_counter()
        store.buf.snapshot(wait=True)
        snap = time.perf_counter() - t0
    finally:
        store.close()
    files = [f for f in fs.find(url.removeprefix("s3://"))]
    uploaded = sum(fs.info(f)["size"] for f in files)
    dst_root = ctx.tmp("snap-dst")
    t0 = time.perf_counter()
    buf = lb.ReplayBuffer.open(str(dst_root), memory_limit_mb=ctx.cfg.budget_mb, snapshot_interval_s=0, **kw)
    try:
        opened = time.perf_counter() - t0
        n = sum(b.num_rows for b in buf.scan())
        restore = time.perf_counter() - t0
    finally:
        buf.close()
    expected = sum(t.num_rows for t in tables)
    if n != expected:
        raise RuntimeError(f"restore returned {n} rows, {expected} were snapshotted")
    shutil.rmtree(src_root, ignore_errors=True)
    shutil.rmtree(dst_root, ignore_errors=True)
    return {"snapshot_s": snap, "restore_s": restore, "restore_open_s": opened, "uploaded_bytes": uploaded, "files": files}


def _push_during_snapshot(ctx: Context, server: Any, tables: list[pa.Table]) -> dict[str, Any]:
    """Push latency with and without an upload in the background (issue: p99 within 2x).

    The first half of the batches is pushed and snapshotted (so the lake exists), then the
    second half is pushed twice over: once plainly, once right after ``snapshot(wait=False)``
    queued the upload of everything new, so those pushes overlap the upload.
    """
    half = len(tables) // 2
    kw = {"lake": server.url("lake/during"), "storage_options": server.storage_options, "run_id": "during"}
    root = ctx.tmp("snap-during")
    store = LakeBufferStore(root, ctx.cfg.budget_mb, **kw)
    try:
        for t in tables[:half]:
            store.push(store.prepare(t))
        store.finish()
        store.buf.snapshot(wait=True)

        def pushes(batch: list[pa.Table], shift: int) -> list[float]:
            out = []
            for i, t in enumerate(batch):
                t = store.prepare(data.rollouts((shift + i) * ctx.cfg.batch_rows, t.num_rows, seed=5))
                t0 = time.perf_counter()
                store.push(t)
                out.append(time.perf_counter() - t0)
            return out

        without = pushes(tables[half:], 10_000)
        store.finish()
        t0 = time.perf_counter()
        store.buf.snapshot(wait=False)
        during = pushes(tables[half:], 20_000)
        pushed_s = time.perf_counter() - t0
        store.finish()
        snap_s = time.perf_counter() - t0
    finally:
        _close(store, root)
    return {
        "p50_ms_without": median(without) * 1e3,
        "p99_ms_without": percentile(without, 99) * 1e3,
        "p50_ms_during": median(during) * 1e3,
        "p99_ms_during": percentile(during, 99) * 1e3,
        "pushes": len(during),
        "pushes_done_s": pushed_s,
        "snapshot_done_s": snap_s,
    }


def _empty_bucket(fs: Any, bucket: str) -> None:
    for entry in fs.ls(bucket, detail=False, refresh=True):
        fs.rm(entry, recursive=True)


def _raw_s3(fs: Any, files: list[str], dest: str) -> dict[str, Any]:
    """The same files moved by s3fs alone: a concurrent ``cat`` then a concurrent ``pipe``."""
    t0 = time.perf_counter()
    blobs = fs.cat(files)
    got = time.perf_counter() - t0
    dest = dest.removeprefix("s3://")
    renamed = {f"{dest}/{i:05d}": blobs[f] for i, f in enumerate(files)}
    t0 = time.perf_counter()
    fs.pipe(renamed)
    put = time.perf_counter() - t0
    return {"put_s": put, "get_s": got, "uploaded_bytes": sum(len(b) for b in renamed.values()), "files": len(files)}


def _baseline_snapshot(ctx: Context, name: str, fs: Any, url: str, tables: list[pa.Table], rows: int) -> dict[str, Any]:
    budget = ctx.cfg.budget_mb << 20
    src = ctx.tmp(f"snap-{name}")
    if name == "rocksdb_pickle":
        store = bl.RocksPickleStore(src, budget)
    elif name == "torchrl":
        store = bl.TorchRLStore(src, rows)
    else:
        store = bl.DequeStore(src, None)  # all rows held, so it snapshots the same data
    try:
        for t in tables:
            store.push(store.prepare(t))
        store.finish()
        t0 = time.perf_counter()
        uploaded = store.snapshot(fs, url, ctx.workdir)
        snap = time.perf_counter() - t0
    finally:
        _close(store, src)
    dst = ctx.tmp(f"restore-{name}")
    t0 = time.perf_counter()
    if name == "rocksdb_pickle":
        restored: Any = bl.RocksPickleStore.restore(fs, url, dst, budget)
    elif name == "torchrl":
        restored = bl.TorchRLStore.restore(fs, url, dst, rows)
    else:
        restored = bl.DequeStore.restore(fs, url, dst, None)
    restore = time.perf_counter() - t0
    _close(restored, dst)
    return {"snapshot_s": snap, "restore_s": restore, "uploaded_bytes": uploaded}


# peak RSS -------------------------------------------------------------------------------------
def peak_rss(ctx: Context) -> dict[str, Any]:
    """Each system ingests ``rss_bytes`` in a child process that reports its own peak RSS."""
    cfg = ctx.cfg
    out: dict[str, Any] = {}
    budget = cfg.budget_mb << 20
    for name in ("lakebuffer", "rocksdb_pickle", "torchrl", "deque"):
        if name == "torchrl" and (reason := bl.torch_available()):
            out[name] = {"unavailable": reason}
            continue
        ctx.say(f"peak_rss: {name}")
        args = {"system": name, "bytes": cfg.rss_bytes, "budget_mb": cfg.budget_mb, "dir": str(ctx.tmp(f"rss-{name}")), "batch_rows": cfg.batch_rows}
        try:
            out[name] = _child(args)
        except Exception as e:
            out[name] = error_entry(e)
        shutil.rmtree(args["dir"], ignore_errors=True)
        ctx.say("peak_rss done", advance=True)
    target = budget * 1.3 + 300e6
    lb = out.get("lakebuffer", {})
    if "peak_rss_bytes" in lb:
        lb["target_bytes"] = target
        lb["within_target"] = lb["peak_rss_bytes"] <= target
    ratio = {f"vs_{b}": _ratio(out.get(b, {}).get("peak_rss_bytes"), lb.get("peak_rss_bytes")) for b in BASELINES}
    ratio["lakebuffer_rss_over_data"] = _ratio(lb.get("peak_rss_bytes"), lb.get("logical_bytes"))
    ratio["lakebuffer_rss_over_target"] = _ratio(lb.get("peak_rss_bytes"), target)
    out["ratio"] = ratio
    out["note"] = "RSS includes file-backed pages (torchrl memmap, mmapped fragments); peak_anon_bytes = RSS - shared"
    return out


def _child(args: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run(
        [sys.executable, "-m", "lakebuffer.bench.rss", json.dumps(args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"child exited {p.returncode}: {p.stderr.strip()[-400:]}")
    return json.loads(lines[-1])


SCENARIOS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "limits": run_limits,
    "ingest": ingest,
    "get": get,
    "sample": sample,
    "snapshot_restore": snapshot_restore,
    "peak_rss": peak_rss,
}

# how many progress steps each scenario reports (for a progress bar's total)
STEPS: dict[str, Callable[[Any], int]] = {
    "limits": lambda cfg: 0,
    "ingest": lambda cfg: cfg.trials,
    "get": lambda cfg: 4,
    "sample": lambda cfg: len(cfg.sample_sizes),
    "snapshot_restore": lambda cfg: cfg.trials,
    "peak_rss": lambda cfg: 4,
}
