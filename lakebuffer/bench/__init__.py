"""Benchmarks of lakebuffer side by side with the buffers users would otherwise pick.

``run(quick=False, out=None, scenarios=None, progress=None)`` runs every scenario on the same
generated rollouts in this process and returns (and optionally writes) the results dict.
``summary(results)`` renders the markdown tables. See BENCHMARKS.md for what each figure means.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .context import FULL, QUICK, Config, Context, Progress, error_entry
from .report import clean, machine, plot_sample_latency, summary, write_json
from .scenarios import SCENARIOS, STEPS

__all__ = ["FULL", "QUICK", "SCENARIOS", "Config", "run", "summary"]


def run(
    quick: bool = False,
    out: str | None = None,
    scenarios: list[str] | None = None,
    progress: Progress | None = None,
    *,
    plot: str | None = None,
    config: Config | None = None,
) -> dict[str, Any]:
    """Run the benchmark scenarios and return the results.

    ``progress(message, steps_done, steps_total)`` is called as work advances (for a progress
    bar). With ``out``, the JSON is written there, with ``summary.md`` and ``sample_latency.png``
    beside it unless ``plot`` names another PNG path. ``config`` overrides the preset sizes.
    """
    cfg = config or (QUICK if quick else FULL)
    names = list(scenarios) if scenarios else list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario {unknown[0]!r}; choose from {', '.join(SCENARIOS)}")
    ctx = Context(cfg, progress)
    ctx.steps_total = sum(STEPS[n](cfg) for n in names)
    results: dict[str, Any] = {"machine": machine(), "quick": cfg.quick, "config": cfg.as_dict(), "scenarios": {}}
    start = time.perf_counter()
    try:
        for name in names:
            t0 = time.perf_counter()
            ctx.say(f"scenario {name}")
            try:
                res = SCENARIOS[name](ctx)
            except Exception as e:  # a broken scenario is reported, the others still run
                res = error_entry(e)
            res["elapsed_s"] = time.perf_counter() - t0
            results["scenarios"][name] = res
        if "limits" not in results["scenarios"] and ctx.limits:
            results["scenarios"]["limits"] = dict(ctx.limits)
    finally:
        ctx.close()
    results["elapsed_s"] = time.perf_counter() - start
    results = clean(results)
    if out:
        write_json(results, out)
        base = Path(out).parent
        (base / "summary.md").write_text(summary(results) + "\n")
        plot_sample_latency(results, plot or base / "sample_latency.png")
    elif plot:
        plot_sample_latency(results, plot)
    return results
