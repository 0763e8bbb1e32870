"""Scenario ``snapshot_restore``: snapshot to and restore from the loopback S3 (moto), every system,
next to raw s3fs transfers of the very same files, plus lakebuffer's push latency during an upload."""

from __future__ import annotations

import shutil
import time
from typing import Any

import pyarrow as pa

from .. import baselines as bl
from .. import data
from ..context import Context, error_entry
from ..systems import LakeBufferStore, close_store
from ..timing import gbps, median, percentile, safe_ratio

NAME = "snapshot_restore"


def run(ctx: Context) -> dict[str, Any]:
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
        ratio[f"snapshot_vs_{b}"] = safe_ratio(lb.get("snapshot_gbps"), out.get(b, {}).get("snapshot_gbps"))
        ratio[f"restore_vs_{b}"] = safe_ratio(lb.get("restore_gbps"), out.get(b, {}).get("restore_gbps"))
    out["ratio"] = ratio
    out["s3_single_object"] = ctx.limit("s3")
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
    queued the upload of everything new, so those pushes overlap the upload. That pair repeats
    ``rounds`` times (4 in the full run): with one pair of 13 pushes the p99 was just the largest push.
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

        without, during, pushed_s, snap_s = [], [], 0.0, 0.0
        rounds = 1 if ctx.cfg.quick else 4
        for r in range(rounds):
            without += pushes(tables[half:], 10_000 * (2 * r + 1))
            store.finish()
            t0 = time.perf_counter()
            store.buf.snapshot(wait=False)
            during += pushes(tables[half:], 10_000 * (2 * r + 2))
            pushed_s += time.perf_counter() - t0
            store.finish()
            snap_s += time.perf_counter() - t0
    finally:
        close_store(store, root)
    return {
        "p50_ms_without": median(without) * 1e3,
        "p99_ms_without": percentile(without, 99) * 1e3,
        "p50_ms_during": median(during) * 1e3,
        "p99_ms_during": percentile(during, 99) * 1e3,
        "pushes": len(during),
        "rounds": rounds,
        "pushes_done_s": pushed_s / rounds,
        "snapshot_done_s": snap_s / rounds,
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
        close_store(store, src)
    dst = ctx.tmp(f"restore-{name}")
    t0 = time.perf_counter()
    if name == "rocksdb_pickle":
        restored: Any = bl.RocksPickleStore.restore(fs, url, dst, budget)
    elif name == "torchrl":
        restored = bl.TorchRLStore.restore(fs, url, dst, rows)
    else:
        restored = bl.DequeStore.restore(fs, url, dst, None)
    restore = time.perf_counter() - t0
    close_store(restored, dst)
    return {"snapshot_s": snap, "restore_s": restore, "uploaded_bytes": uploaded}


def steps(cfg: Any) -> int:
    return cfg.trials
