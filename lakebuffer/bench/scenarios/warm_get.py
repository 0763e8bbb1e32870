"""Scenario ``warm_get``: the trainer-facing reads at 16x the budget, quiet and under an ingest (issue 17).

One buffer holds the whole ingest payload under 1/16 of its bytes (2 GB under 119 MB in the full
run), every row written back to the warm tier. Each call draws 256 uniform keys and times, in a
rotating order: the buffer's ``get`` of their ``response_ids``; a memory-mapped Arrow IPC take of
the same rows from the buffer's own files with maps of its own (``ipc_take``: the floor); the
index step alone (``index_lookup``: RocksDB multi-get, batch -> fragment, what ``get`` adds); and
``sample(256, where="reward > 0.5 AND policy_version >= v")``. Quiet first, then again while a
thread pushes more rollouts into the same buffer (write-back running), so the tail under a
concurrent ingest is measured next to the quiet one in the same run.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pyarrow as pa

from .. import data
from ..context import Context, error_entry
from ..ipc_take import IpcFiles, locate, warm_files
from ..systems import REWARD_GT, SAMPLE_N, where
from ..timing import median, percentile, quiet_gc
from .ingest_cpu import budget_mb
from .sample import version_threshold

NAME = "warm_get"
COLS = ["response_ids"]


def _fig(times: list[float]) -> dict[str, Any]:
    if not times:
        return {"error": "no calls"}
    p50, p99 = median(times) * 1e3, percentile(times, 99) * 1e3
    return {"p50_ms": p50, "p99_ms": p99, "p99_over_p50": p99 / p50, "calls": len(times)}


def _calls(buf: Any, ref: IpcFiles, keys: np.ndarray, pred: str, n: int, seed: int,
           until: threading.Event | None = None) -> dict[str, dict[str, Any]]:
    """``n`` calls of each variant (or, with ``until``, as many as fit before it is set, at least 20)."""
    rng = np.random.default_rng(seed)
    times: dict[str, list[float]] = {"get": [], "ipc_take": [], "index_lookup": [], "sample": []}
    names = list(times)
    i = 0
    while (i < n) if until is None else (i < 20 or not until.is_set()) and i < 10 * n:
        ks = keys[rng.choice(len(keys), SAMPLE_N, replace=False)].tolist()
        w = locate(buf, ks)
        k = i % len(names)
        for name in names[k:] + names[:k]:
            t0 = time.perf_counter()
            if name == "get":
                buf.get(ks, COLS)
            elif name == "ipc_take":
                ref.verify(np.unique(w.part))
                ref.take(w, COLS)
            elif name == "index_lookup":  # what get pays before its take: RocksDB multi-get + batch -> fragment
                locate(buf, ks)
            else:
                buf.sample(SAMPLE_N, where=pred, seed=seed + i, return_keys=True)
            times[name].append(time.perf_counter() - t0)
        i += 1
    return {name: _fig(t) for name, t in times.items()}


def run(ctx: Context) -> dict[str, Any]:
    from lakebuffer import ReplayBuffer

    cfg = ctx.cfg
    tables = [t.drop_columns([c for c in ("key", "run_id") if c in t.column_names]) for t in ctx.payload()]
    rows = sum(t.num_rows for t in tables)
    budget = budget_mb(cfg)
    calls = 40 if cfg.quick else 300
    pred = where(REWARD_GT, version_threshold(rows, data.PAYLOAD))
    ctx.say(f"warm_get: building {data.logical_bytes(tables) / 1e9:.2f} GB under {budget} MB")
    buf = ReplayBuffer.open(ctx.tmp("warm-get"), memory_limit_mb=budget, snapshot_interval_s=None, run_id="bench")
    out: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        keys = np.asarray(pa.concat_arrays([buf.push(t) for t in tables]).to_numpy(zero_copy_only=False), dtype=object)
        buf.evict_all()
        build_s = time.perf_counter() - t0
        ref = IpcFiles(warm_files(buf))
        ks = keys[:SAMPLE_N].tolist()  # warm-up + proof that the floor reads the very same rows
        if not ref.take(locate(buf, ks), COLS).column(0).equals(buf.get(ks, COLS).column(0)):
            raise RuntimeError("the IPC take returned other rows than get")
        for i in range(3):  # the first sample registers the catalog's views; not what a trainer waits on each step
            buf.sample(SAMPLE_N, where=pred, seed=i, return_keys=True)
        ctx.say("warm_get: quiet")
        with quiet_gc():
            quiet = _calls(buf, ref, keys, pred, calls, seed=17)
        ctx.say("warm_get: under a concurrent ingest")
        done = threading.Event()
        more = tables[: max(8, len(tables) // 4)]  # a quarter of the payload again (new keys)
        err: list[BaseException] = []

        def ingest() -> None:
            try:
                for t in more:
                    buf.push(t)
                buf.flush()
            except BaseException as e:  # reported, not raised in a thread
                err.append(e)
            finally:
                done.set()

        th = threading.Thread(target=ingest, name="bench-ingest", daemon=True)
        with quiet_gc():
            t0 = time.perf_counter()
            th.start()
            busy = _calls(buf, ref, keys, pred, calls, seed=29, until=done)
            th.join()
            busy_s = time.perf_counter() - t0
        if err:
            raise err[0]
        stats = buf.stats()
    except Exception as e:
        return {"lakebuffer": error_entry(e)}
    finally:
        buf.close()
    ctx.say("warm_get done", advance=True)
    for name in ("get", "sample"):
        out.setdefault("lakebuffer", {})[name] = {"quiet": quiet[name], "under_ingest": busy[name]}
    out["ipc_take"] = {"quiet": quiet["ipc_take"], "under_ingest": busy["ipc_take"]}
    out["index_lookup"] = {"quiet": quiet["index_lookup"], "under_ingest": busy["index_lookup"]}
    lb = out["lakebuffer"]
    out["ratio"] = {
        "get_p50_over_ipc_take": lb["get"]["quiet"]["p50_ms"] / quiet["ipc_take"]["p50_ms"],
        "get_p50_over_ipc_take_under_ingest": lb["get"]["under_ingest"]["p50_ms"] / busy["ipc_take"]["p50_ms"],
        "get_p99_over_ipc_take_p99": lb["get"]["quiet"]["p99_ms"] / quiet["ipc_take"]["p99_ms"],
        "get_p99_over_p50": lb["get"]["quiet"]["p99_over_p50"],
        "ipc_take_p99_over_p50": quiet["ipc_take"]["p99_over_p50"],
        "get_p99_over_p50_under_ingest": lb["get"]["under_ingest"]["p99_over_p50"],
        "sample_p99_over_p50": lb["sample"]["quiet"]["p99_over_p50"],
        "sample_p99_over_p50_under_ingest": lb["sample"]["under_ingest"]["p99_over_p50"],
    }
    out["data"] = {"logical_bytes": data.logical_bytes(tables), "rows": rows, "budget_mb": budget,
                   "oversubscription": data.logical_bytes(tables) / (budget << 20), "build_s": build_s,
                   "warm_fragments": stats.get("warm", {}).get("fragments"), "ingest_under_reads_s": busy_s,
                   "ingest_under_reads_bytes": data.logical_bytes(more), "predicate": pred}
    out["note"] = ("256 uniform warm keys per call; ipc_take = mmapped Arrow IPC take of the same rows of the same files "
                   "(own maps, one stat per file as the buffer's check); ratios here: lower is better")
    return out


def steps(cfg: Any) -> int:
    return 1
