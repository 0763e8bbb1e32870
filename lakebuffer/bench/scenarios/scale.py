"""Scenario ``scale``: every path's peak anonymous memory at ``scale_bytes`` under ``scale_budget_mb``.

Issue 16's bound: RssAnon growth <= budget x 1.3 + 300 MB on push, sql and scan over payload,
sample + get, dataset iteration, fsck, snapshot, compact and restore, whatever the data size. The
work runs in a child process (``lakebuffer.bench.memory``) that samples its own RssAnon every 5 ms;
the full run pushes 16 GB under 1 GB (16x), the quick run 256 MB under 16 MB. Each phase reports
its peak growth, its share of the bound (ratio < 1 is within) and its time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

from ..context import Context, error_entry

NAME = "scale"


def run(ctx: Context) -> dict[str, Any]:
    from ..memory import bound_bytes  # not at import: ``python -m lakebuffer.bench.memory`` imports this package

    cfg = ctx.cfg
    root = ctx.tmp("scale")
    args = {"dir": str(root), "lake": str(root / "lake"), "bytes": cfg.scale_bytes, "budget_mb": cfg.scale_budget_mb}
    ctx.say(f"scale: {cfg.scale_bytes / 2**30:.1f} GiB under {cfg.scale_budget_mb} MB")
    # glibc's dynamic mmap threshold keeps freed heap pages resident; a fixed one makes RSS track live
    # memory (the README's advice for memory-bounded runs)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_ARENA_MAX": "2"}
    try:
        out = subprocess.run([sys.executable, "-m", "lakebuffer.bench.memory", json.dumps(args)],
                             capture_output=True, text=True, env=env, timeout=6 * 3600)
        if out.returncode != 0:
            raise RuntimeError(out.stderr[-2000:])
        res = json.loads(out.stdout.strip().splitlines()[-1])
    except Exception as e:
        return {"lakebuffer": error_entry(e)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ctx.say("scale done", advance=True)
    bound = bound_bytes(cfg.scale_budget_mb)
    phases = res["phases"]
    return {
        "lakebuffer": {"pushed_bytes": res["pushed_bytes"], "rows": res["rows"], "budget_mb": cfg.scale_budget_mb,
                       "bound_bytes": bound, "phases": phases},
        "ratio": {f"{name}_peak_over_bound": v["peak_growth_bytes"] / bound for name, v in phases.items()
                  if "peak_growth_bytes" in v},
        "note": "peak RssAnon growth per phase over the process after open + warm-up; bound = budget x 1.3 + 300 MB",
    }


def steps(cfg: Any) -> int:
    return 1
