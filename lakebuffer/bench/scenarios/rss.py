"""Scenario ``peak_rss``: each system ingests ``rss_bytes`` in a child process (``lakebuffer.bench.rss``)
that reports its own peak RSS; a fresh process is the only clean way to attribute memory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from .. import baselines as bl
from ..context import Context, error_entry
from ..systems import BASELINES
from ..timing import safe_ratio

NAME = "peak_rss"


def run(ctx: Context) -> dict[str, Any]:
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
    ratio = {f"vs_{b}": safe_ratio(out.get(b, {}).get("peak_rss_bytes"), lb.get("peak_rss_bytes")) for b in BASELINES}
    ratio["lakebuffer_rss_over_data"] = safe_ratio(lb.get("peak_rss_bytes"), lb.get("logical_bytes"))
    ratio["lakebuffer_rss_over_target"] = safe_ratio(lb.get("peak_rss_bytes"), target)
    out["ratio"] = ratio
    out["note"] = "RSS includes file-backed pages (torchrl memmap, mmapped fragments); peak_anon_bytes = RSS - shared"
    return out


def _child(args: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[3])
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


def steps(cfg: Any) -> int:
    return 4
