"""Results out: the machine, clean JSON, a markdown summary table, and the sample-latency plot."""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

_PACKAGES = ("lakebuffer", "pyarrow", "duckdb", "pylance", "rocksdict", "polars", "numpy", "s3fs", "moto", "torch", "torchrl", "tensordict")
SYSTEM_ORDER = ("lakebuffer", "lakebuffer_memory", "numpy", "rocksdb_pickle", "deque", "torchrl", "s3", "disk", "memcpy")


def machine() -> dict[str, Any]:
    """Cores, RAM, CPU model and package versions (read from metadata: torch is never imported here)."""
    import psutil

    versions = {}
    for p in _PACKAGES:
        try:
            versions["lance" if p == "pylance" else p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            versions["lance" if p == "pylance" else p] = None
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "lakebuffer_commit": _commit(),
        "cores": cores,
        "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "cpu": cpu or platform.processor(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "versions": versions,
    }


def _commit() -> str | None:
    """``git describe`` of the checkout lakebuffer runs from (``-dirty`` with local changes), if any."""
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    if not (repo / ".git").exists():
        return None
    try:
        p = subprocess.run(["git", "-C", str(repo), "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() or None


def clean(obj: Any) -> Any:
    """JSON-safe: NaN/inf become null, NumPy scalars become Python numbers."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        try:
            obj = obj.item()
        except (TypeError, ValueError):
            return str(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def write_json(results: dict[str, Any], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(clean(results), indent=2) + "\n")


def _f(x: Any, nd: int = 3) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int, float)):
        if x != 0 and abs(x) < 10 ** -nd:
            return f"{x:.1e}"
        return f"{x:,.{nd}f}" if isinstance(x, float) else f"{x:,}"
    return str(x)


def _cell(fig: dict[str, Any] | None, key: str, nd: int = 3) -> str:
    if fig is None:
        return "—"
    if "unavailable" in fig:
        return "n/a"
    if "error" in fig:
        return "error"
    if "skipped" in fig:
        return "out of budget"
    return _f(fig.get(key), nd)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def summary(results: dict[str, Any]) -> str:
    """Markdown tables of the headline figures, one per scenario that ran."""
    sc = results.get("scenarios", {})
    parts: list[str] = []
    m = results.get("machine", {})
    parts.append(
        f"machine: {m.get('cores')} cores, {m.get('ram_gb')} GB RAM, {m.get('cpu', '')}; python {m.get('python')}; "
        f"quick={results.get('quick')}; {results.get('elapsed_s', 0):.0f} s; 1-min load average at start "
        f"{_f(m.get('loadavg_1m_at_start'), 1)}, per scenario: "
        + ", ".join(f"{k} {_f(v.get('loadavg_1m'), 1)}" for k, v in sc.items() if isinstance(v, dict))
    )
    lim = sc.get("limits")
    if lim:
        parts.append("### limits\n" + _table(
            ["limit", "figure"],
            [
                ["memcpy GB/s", _cell(lim.get("memcpy"), "gbps", 2)],
                ["disk write+fsync GB/s", _cell(lim.get("disk"), "write_gbps")],
                ["disk cold read GB/s", _cell(lim.get("disk"), "read_gbps")],
                ["s3 put GB/s (one object)", _cell(lim.get("s3"), "put_gbps")],
                ["s3 get GB/s (one object)", _cell(lim.get("s3"), "get_gbps")],
            ],
        ))
    ing = sc.get("ingest")
    if ing and "error" not in ing:
        rows = [[n, _cell(ing.get(n), "gbps"), _cell(ing.get(n), "push_p99_ms", 1), _cell(ing.get(n), "finish_s", 2)]
                for n in ("lakebuffer", "lakebuffer_memory", "rocksdb_pickle", "deque", "torchrl") if n in ing]
        rows.append(["disk write+fsync", _f(ing.get("disk", {}).get("write_gbps")), "", ""])
        d = ing.get("data", {})
        head = f"### ingest ({d.get('logical_bytes', 0) / 1e9:.2f} GB, budget {d.get('budget_mb')} MB)\n"
        parts.append(head + _table(["system", "GB/s", "push p99 ms", "final flush s"], rows) + "\n\nratio: " + _ratios(ing.get("ratio")))
    g = sc.get("get")
    if g and "error" not in g:
        rows = [[n, _cell(g.get(n), "mbps", 1), _cell(g.get(n), "p50_ms", 2), _cell(g.get(n), "p99_ms", 2)]
                for n in ("lakebuffer", "rocksdb_pickle", "deque", "torchrl") if n in g]
        parts.append("### get response_ids of 256 sampled keys\n" + _table(["system", "MB/s", "p50 ms", "p99 ms"], rows)
                     + "\n\nratio: " + _ratios(g.get("ratio")))
    s = sc.get("sample")
    if s and "error" not in s:
        sizes = sorted({int(k) for v in s.values() if isinstance(v, dict) for k in v.get("by_size", {})})
        header = ["system"] + [f"{n:,} p50 / p99 ms" for n in sizes] + ["build rows/s"]
        rows = []
        for n in ("lakebuffer", "numpy", "rocksdb_pickle", "deque", "torchrl"):
            fig = s.get(n)
            if fig is None:
                continue
            if "by_size" not in fig:
                rows.append([n] + [_cell(fig, "p50_ms")] * len(sizes) + ["—"])
                continue
            cells = []
            for size in sizes:
                c = fig["by_size"].get(str(size))
                cells.append(f"{_cell(c, 'p50_ms', 2)} / {_cell(c, 'p99_ms', 2)}" if c and "p50_ms" in c else _cell(c, "p50_ms"))
            rows.append([n] + cells + [_f(fig.get("build_rows_per_s"), 0)])
        parts.append("### sample 256 keys, reward > 0.5 AND policy_version >= v\n" + _table(header, rows)
                     + "\n\nratio (p99, largest size): " + _ratios({k: v for k, v in s.get("ratio", {}).items() if k.startswith("vs_")})
                     + "; growth p99: " + _ratios(s.get("ratio", {}).get("growth_p99"))
                     + _fresh(s, sizes))
    sn = sc.get("snapshot_restore")
    if sn and "error" not in sn:
        rows = []
        for n in ("lakebuffer", "rocksdb_pickle", "torchrl", "deque"):
            if n in sn:
                rows.append([n, _cell(sn[n], "snapshot_gbps"), _cell(sn[n], "restore_gbps"), _cell(sn[n], "snapshot_s", 2), _cell(sn[n], "restore_s", 2)])
        raw = sn.get("s3", {})
        rows.append(["raw s3fs, same files", _cell(raw, "put_gbps"), _cell(raw, "get_gbps"), _cell(raw, "put_s", 2), _cell(raw, "get_s", 2)])
        d = sn.get("data", {})
        parts.append(f"### snapshot / restore on loopback S3 ({d.get('logical_bytes', 0) / 1e6:.0f} MB)\n"
                     + _table(["system", "snapshot GB/s", "restore GB/s", "snapshot s", "restore s"], rows)
                     + _during(sn.get("lakebuffer", {}).get("push_during_snapshot"))
                     + "\n\nratio: " + _ratios(sn.get("ratio")))
    r = sc.get("peak_rss")
    if r and "error" not in r:
        rows = []
        for n in ("lakebuffer", "rocksdb_pickle", "torchrl", "deque"):
            if n in r:
                fig = r[n]
                oob = fig.get("out_of_budget_at") if isinstance(fig, dict) else None
                rows.append([n, _f((fig.get("peak_rss_bytes") or 0) / 1e6, 0) if "peak_rss_bytes" in fig else _cell(fig, "x"),
                             _f((fig.get("peak_anon_bytes") or 0) / 1e6, 0) if "peak_anon_bytes" in fig else "—",
                             _f(fig.get("logical_bytes", 0) / 1e6, 0) if "logical_bytes" in fig else "—",
                             f"{oob['logical_bytes'] / 1e6:.0f} MB" if oob else "never"])
        parts.append("### peak RSS\n" + _table(["system", "peak RSS MB", "peak anon MB", "data MB", "passes budget at"], rows)
                     + "\n\nratio: " + _ratios(r.get("ratio")))
    r = sc.get("verification")
    if r and "error" not in r:
        rows = [[m, _f(r[m].get("snapshot_s"), 3), _f((r[m].get("get_p50_s") or 0) * 1e3, 2), _f(r[m].get("scan_s"), 3)]
                for m in ("verified", "unverified") if isinstance(r.get(m), dict) and "error" not in r[m]]
        parts.append("### verification cost\n" + _table(["reads", "snapshot s", "get p50 ms", "scan s"], rows)
                     + "\n\nratio: " + _ratios(r.get("ratio")))
    r = sc.get("scale")
    if r and "error" not in r.get("lakebuffer", {}):
        lb = r["lakebuffer"]
        rows = [[name, _f(v["peak_growth_bytes"] / 2**20, 0), _f(v["peak_growth_bytes"] / lb["bound_bytes"], 2), _f(v["seconds"], 1)]
                for name, v in lb["phases"].items() if "peak_growth_bytes" in v]
        parts.append(f"### scale: peak anonymous RSS per path, {lb['pushed_bytes'] / 2**30:.1f} GiB under {lb['budget_mb']} MB "
                     f"(bound {lb['bound_bytes'] / 2**20:.0f} MB)\n"
                     + _table(["path", "peak RssAnon growth MB", "of bound", "seconds"], rows))
    r = sc.get("ingest_cpu")
    if r and "median" in r:
        m = r["median"]
        parts.append(f"### ingest CPU: {r['trials']} interleaved trials of {r['gb_per_trial']:.2f} GiB under {r['budget_mb']} MB (medians)\n"
                     + _table(["", "CPU s/GB", "wall GB/s", "push p50 ms", "push p99 ms"],
                              [["lakebuffer push + flush", _f(m["buffer_cpu_s_per_gb"], 2), _f(m["buffer_wall_gbps"], 2),
                                _f(m["push_p50_ms"], 1), _f(m["push_p99_ms"], 1)],
                               ["raw Arrow IPC write", _f(m["raw_ipc_cpu_s_per_gb"], 2), _f(m["raw_wall_gbps"], 2), "", ""],
                               ["durable IPC write per batch (+fsync, rename, dir fsync)", "", "",
                                _f(m.get("durable_write_p50_ms"), 1), _f(m.get("durable_write_p99_ms"), 1)]])
                     + "\n\nratio: " + _ratios(r.get("ratio")))
    r = sc.get("warm_get")
    if r and "error" not in r.get("lakebuffer", {}):
        lb, ref, d = r["lakebuffer"], r["ipc_take"], r["data"]
        rows = [[name, *(f"{_f(fig[mode]['p50_ms'], 2)} / {_f(fig[mode]['p99_ms'], 2)} ({_f(fig[mode]['p99_over_p50'], 1)}x)"
                         for mode in ("quiet", "under_ingest"))]
                for name, fig in (("get", lb["get"]), ("mmapped IPC take, same rows", ref),
                                  ("index lookup alone (in get)", r.get("index_lookup")), ("sample", lb["sample"])) if fig]
        parts.append(f"### warm get and sample, {d['logical_bytes'] / 1e9:.2f} GB under {d['budget_mb']} MB "
                     f"({d['oversubscription']:.0f}x), 256 rows per call\n"
                     + _table(["call", "quiet p50 / p99 ms (p99/p50)", "under a concurrent ingest"], rows)
                     + "\n\nratio: " + _ratios(r.get("ratio")))
    if results.get("regressions"):
        parts.append("### against the previous run\n" + regressions_table(results))
    if any(k in sc for k in ("ingest", "sample", "snapshot_restore", "peak_rss", "ingest_cpu", "warm_get")):
        parts.append("### targets\n" + targets_table(results))
    return "\n\n".join(parts)


def _get(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)
    return d


def _top_size(sc: dict[str, Any]) -> str | None:
    sizes = sorted(int(k) for k in (_get(sc, "sample", "lakebuffer", "by_size") or {}))
    return str(sizes[-1]) if sizes else None


def _previous_ingest(results: dict[str, Any]) -> float | None:
    """This run's lakebuffer ingest GB/s over the previous full run's (issue 17: no lower than before)."""
    prev = _get(results, "regressions", "previous", "ingest_gbps")
    now = _get(results, "scenarios", "ingest", "lakebuffer", "gbps")
    return now / prev if isinstance(now, (int, float)) and isinstance(prev, (int, float)) and prev else None


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issues' performance targets, each with the measured value (mostly a same-run ratio) and whether it is met."""
    sc = results.get("scenarios", {})
    top = _top_size(sc)
    at = f"{int(top):,}" if top else "10M"
    rss = _get(sc, "peak_rss", "lakebuffer") or {}
    wg = ("warm_get", "lakebuffer")
    reg = results.get("regressions") or {}
    flagged = sum(1 for r in reg.get("figures", []) if r.get("flagged")) if reg.get("figures") else None
    rows = [
        ("ingest >= 10x rocksdb_pickle (#7)", _get(sc, "ingest", "ratio", "vs_rocksdb_pickle"), ">=", 10.0, "x"),
        ("ingest >= 50% of disk write+fsync (#2, #7)", _get(sc, "ingest", "ratio", "vs_disk"), ">=", 0.5, "of limit"),
        ("wal ingest >= 60% of memory mode (#5)", _get(sc, "ingest", "ratio", "wal_vs_memory"), ">=", 0.6, "of memory"),
        (f"sample p99 <= 20 ms at {at} rollouts (#4, #7)", _get(sc, "sample", "lakebuffer", "by_size", top, "p99_ms") if top else None,
         "<=", 20.0, "ms"),
        ("sample p99 growth 1M -> 10M < 3x (#4)", _get(sc, "sample", "ratio", "growth_p99", "lakebuffer"), "<", 3.0, "x"),
        ("peak RSS <= budget + 30% + 300 MB (#7)", (rss.get("peak_rss_bytes") or 0) / 1e6 or None, "<=",
         (rss.get("target_bytes") or 0) / 1e6 or None, "MB"),
        ("get p99 <= 20 ms, 256 random warm rows, buffer 16x its budget (#17)", _get(sc, *wg, "get", "quiet", "p99_ms"),
         "<=", 20.0, "ms"),
        ("get p50 >= 2x TorchRL memmap's, 2 GB (#17)", _get(sc, "get", "ratio", "p50_vs_torchrl"), ">=", 2.0, "x"),
        ("get p50 <= 4x a mmapped IPC take of the same rows (#17)", _get(sc, "warm_get", "ratio", "get_p50_over_ipc_take"),
         "<=", 4.0, "x"),
        ("ingest CPU s/GB <= 2x a raw IPC write, median of >= 5 interleaved trials (#17)",
         _get(sc, "ingest_cpu", "ratio", "cpu_vs_raw_ipc"), "<=", 2.0, "x"),
        ("push p99 <= 3x push p50 (#17)", _get(sc, "ingest_cpu", "ratio", "push_p99_over_p50"), "<=", 3.0, "x"),
        ("ingest wall GB/s >= the previous full run's (#17)", _previous_ingest(results), ">=", 1.0, "x"),
        ("snapshot >= 70% of a raw transfer of the same files (#3, #17)", _get(sc, "snapshot_restore", "ratio", "snapshot_vs_s3"),
         ">=", 0.7, "of raw"),
        ("restore >= 70% of a raw transfer of the same files (#3, #7, #17)", _get(sc, "snapshot_restore", "ratio", "restore_vs_s3"),
         ">=", 0.7, "of raw"),
        ("push p99 during a snapshot <= 2x without (#3, #17)", _get(sc, "snapshot_restore", "ratio", "push_p99_during_vs_without"),
         "<=", 2.0, "x"),
        ("get p99 <= 3x its p50, quiet (#17)", _get(sc, *wg, "get", "quiet", "p99_over_p50"), "<=", 3.0, "x"),
        ("get p99 <= 3x its p50, under a concurrent ingest (#17)", _get(sc, *wg, "get", "under_ingest", "p99_over_p50"),
         "<=", 3.0, "x"),
        ("sample p99 <= 3x its p50, quiet (#17)", _get(sc, *wg, "sample", "quiet", "p99_over_p50"), "<=", 3.0, "x"),
        ("sample p99 <= 3x its p50, under a concurrent ingest (#17)", _get(sc, *wg, "sample", "under_ingest", "p99_over_p50"),
         "<=", 3.0, "x"),
        (f"sample p99 at {at} at or below the NumPy floor's (numpy p99 / ours) (#17)", _get(sc, "sample", "ratio", "vs_numpy"),
         ">=", 1.0, "x"),
        (f"fresh-window sample p99 <= 5 ms at {at} (newest 2 versions) (#17)",
         _get(sc, "sample", "lakebuffer", "by_size", top, "fresh_p99_ms") if top else None, "<=", 5.0, "ms"),
        ("no figure > 10% worse than the previous full run (#17)", flagged, "<=", 0, "flagged"),
    ]
    out = []
    for name, value, op, goal, unit in rows:
        met = None
        if isinstance(value, (int, float)) and isinstance(goal, (int, float)):
            met = {">=": value >= goal, "<=": value <= goal, "<": value < goal}[op]
        out.append({"target": name, "measured": value, "goal": goal, "op": op, "unit": unit, "met": met})
    return out


# figures compared with the previous full run: (path under "scenarios", higher is better)
_TRACKED: tuple[tuple[tuple[str, ...], bool], ...] = (
    (("ingest", "lakebuffer", "gbps"), True),
    (("ingest", "lakebuffer_memory", "gbps"), True),
    (("ingest", "lakebuffer", "push_p99_ms"), False),
    (("ingest", "ratio", "vs_rocksdb_pickle"), True),
    (("ingest", "ratio", "vs_torchrl"), True),
    (("get", "lakebuffer", "p50_ms"), False),
    (("get", "lakebuffer", "p99_ms"), False),
    (("get", "ratio", "vs_rocksdb_pickle"), True),
    (("get", "ratio", "vs_torchrl"), True),
    (("sample", "ratio", "vs_numpy"), True),
    (("sample", "ratio", "vs_rocksdb_pickle"), True),
    (("sample", "ratio", "vs_torchrl"), True),
    (("snapshot_restore", "lakebuffer", "snapshot_gbps"), True),
    (("snapshot_restore", "lakebuffer", "restore_gbps"), True),
    (("snapshot_restore", "ratio", "snapshot_vs_s3"), True),
    (("snapshot_restore", "ratio", "restore_vs_s3"), True),
    (("snapshot_restore", "ratio", "push_p99_during_vs_without"), False),
    (("peak_rss", "lakebuffer", "peak_rss_bytes"), False),
)


def regressions(results: dict[str, Any], previous: dict[str, Any] | None, tolerance: float = 0.10) -> dict[str, Any]:
    """Every tracked figure of this run next to the previous run's; > ``tolerance`` worse is flagged.

    Only runs of the same kind compare (a quick run against a full one means nothing); sample
    latencies compare per rollout count. ``worse_by`` is the relative change in the bad direction.
    """
    if not previous:
        return {"note": "no previous results to compare with"}
    if bool(previous.get("quick")) != bool(results.get("quick")):
        return {"note": "the previous results are of the other kind (quick vs full): not compared"}
    now_sc, prev_sc = results.get("scenarios", {}), previous.get("scenarios", {})
    tracked = list(_TRACKED)
    for size in sorted(set(_get(now_sc, "sample", "lakebuffer", "by_size") or {}) & set(_get(prev_sc, "sample", "lakebuffer", "by_size") or {}),
                       key=int):
        tracked += [(("sample", "lakebuffer", "by_size", size, "p50_ms"), False), (("sample", "lakebuffer", "by_size", size, "p99_ms"), False)]
    figures = []
    for path, higher in tracked:
        now, before = _get(now_sc, *path), _get(prev_sc, *path)
        if not isinstance(now, (int, float)) or not isinstance(before, (int, float)) or not before:
            continue
        worse_by = (before - now) / before if higher else (now - before) / before
        figures.append({"figure": ".".join(path), "previous": before, "now": now, "higher_is_better": higher,
                        "worse_by": worse_by, "flagged": worse_by > tolerance})
    m = previous.get("machine", {})
    return {"previous": {"commit": m.get("lakebuffer_commit"), "loadavg_1m_at_start": m.get("loadavg_1m_at_start"),
                         "ingest_gbps": _get(prev_sc, "ingest", "lakebuffer", "gbps")},
            "tolerance": tolerance, "figures": figures}


def regressions_table(results: dict[str, Any]) -> str:
    reg = results.get("regressions") or {}
    if not reg.get("figures"):
        return reg.get("note", "no previous results to compare with")
    rows = [[r["figure"], _f(r["previous"], 3), _f(r["now"], 3), f"{r['worse_by'] * 100:+.0f}%",
             "**flagged**" if r["flagged"] else ""] for r in reg["figures"]]
    return (f"against commit {reg['previous'].get('commit')} (> {reg['tolerance'] * 100:.0f}% worse is flagged)\n\n"
            + _table(["figure", "previous", "now", "worse by", ""], rows))


def targets_table(results: dict[str, Any]) -> str:
    rows = [[t["target"], f"{_f(t['measured'], 2)} {t['unit']}", f"{t['op']} {_f(t['goal'], 2)}",
             {True: "met", False: "**not met**", None: "not measured"}[t["met"]]] for t in targets(results)]
    return _table(["target", "measured", "goal", "status"], rows)


def _fresh(s: dict[str, Any], sizes: list[int]) -> str:
    """The fresh-window predicate's p50 / p99 (newest 2 versions) per size, where measured."""
    cells = []
    for n in ("lakebuffer", "numpy"):
        by = (s.get(n) or {}).get("by_size", {})
        figs = [f"{size:,}: {_f(by[str(size)]['fresh_p50_ms'], 2)} / {_f(by[str(size)]['fresh_p99_ms'], 2)}"
                for size in sizes if "fresh_p99_ms" in by.get(str(size), {})]
        if figs:
            cells.append(f"{n} " + ", ".join(figs))
    return ("\n\nfresh window (reward > 0.5 AND policy_version >= newest - 1), p50 / p99 ms: " + "; ".join(cells)) if cells else ""


def _during(d: dict[str, Any] | None) -> str:
    if not d or "p99_ms_during" not in d:
        return ""
    return (f"\n\nlakebuffer push p50 / p99 without a snapshot {_f(d['p50_ms_without'], 1)} / {_f(d['p99_ms_without'], 1)} ms, "
            f"during one {_f(d['p50_ms_during'], 1)} / {_f(d['p99_ms_during'], 1)} ms ({d['pushes']} pushes each)")


def _ratios(r: dict[str, Any] | None) -> str:
    if not r:
        return "—"
    return ", ".join(f"{k} {_f(v, 2)}" for k, v in r.items() if not isinstance(v, (dict, list)))


def plot_sample_latency(results: dict[str, Any], path: str | Path) -> Path | None:
    """Sample p99 (solid) and p50 (dashed) latency vs rollout count, log-log, every system."""
    s = results.get("scenarios", {}).get("sample")
    if not s or "error" in s:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for i, name in enumerate(("lakebuffer", "numpy", "rocksdb_pickle", "deque", "torchrl")):
        by = s.get(name, {}).get("by_size", {})
        pts = sorted((int(k), v) for k, v in by.items() if isinstance(v, dict) and "p99_ms" in v)
        if not pts:
            continue
        xs = [p[0] for p in pts]
        color = f"C{i}"
        ax.plot(xs, [p[1]["p99_ms"] for p in pts], "o-", color=color, label=f"{name} p99")
        ax.plot(xs, [p[1]["p50_ms"] for p in pts], "x--", color=color, alpha=0.6, label=f"{name} p50")
    ax.axhline(20, color="grey", lw=0.8, ls=":", label="target p99 20 ms")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rollouts in buffer (metadata only)")
    ax.set_ylabel("latency, ms")
    m = results.get("machine", {})
    ax.set_title(
        f"sample 256 keys where reward > 0.5 AND policy_version >= v\n({m.get('cores')} cores{', quick run' if results.get('quick') else ''})",
        fontsize=10,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
