"""Benchmarks of lakebuffer side by side with the buffers users would otherwise pick.

``run(quick=False, out=None, scenarios=None, progress=None)`` runs every scenario on the same
generated rollouts in this process and returns (and optionally writes) the results dict.
``summary(results)`` renders the markdown tables. See BENCHMARKS.md for what each figure means.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .context import FULL, QUICK, Config, Context, Progress, error_entry
from .report import clean, machine, plot_sample_latency, regressions, summary, targets, write_json
from .scenarios import SCENARIOS, STEPS

__all__ = ["FULL", "QUICK", "SCENARIOS", "Config", "run", "summary"]


def _load() -> float | None:
    """1-minute load average: a figure measured while the machine was busy says so here."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _previous(path: str | Path | None) -> dict[str, Any] | None:
    """The results of an earlier run to compare with, if ``path`` holds any."""
    if path is None or not Path(path).is_file():
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def run(
    quick: bool = False,
    out: str | None = None,
    scenarios: list[str] | None = None,
    progress: Progress | None = None,
    *,
    plot: str | None = None,
    config: Config | None = None,
    previous: str | None = None,
) -> dict[str, Any]:
    """Run the benchmark scenarios and return the results.

    ``progress(message, steps_done, steps_total)`` is called as work advances (for a progress
    bar). With ``out`` (``results.json``), the JSON is written there, the markdown summary beside
    it (``results.md``) and the plot too (``sample_latency.png``, ``sample_latency-quick.png`` for a
    quick run) unless ``plot`` names another PNG path. ``config`` overrides the preset sizes.
    ``previous`` (default: the ``out`` file as it was before this run) is compared figure by figure.
    """
    prev = _previous(previous if previous is not None else out)
    cfg = config or (QUICK if quick else FULL)
    names = list(scenarios) if scenarios else list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario {unknown[0]!r}; choose from {', '.join(SCENARIOS)}")
    ctx = Context(cfg, progress)
    ctx.steps_total = sum(STEPS[n](cfg) for n in names)
    results: dict[str, Any] = {"machine": machine(), "quick": cfg.quick, "config": cfg.as_dict(), "scenarios": {}}
    results["machine"]["loadavg_1m_at_start"] = _load()
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
            res["loadavg_1m"] = _load()
            results["scenarios"][name] = res
        if "limits" not in results["scenarios"] and ctx.limits:
            results["scenarios"]["limits"] = dict(ctx.limits)
    finally:
        ctx.close()
    results["elapsed_s"] = time.perf_counter() - start
    results["regressions"] = regressions(results, prev)
    results["targets"] = targets(results)
    results = clean(results)
    if out:
        write_json(results, out)
        path = Path(out)
        path.with_suffix(".md").write_text(summary(results) + "\n")
        png = "sample_latency-quick.png" if cfg.quick else "sample_latency.png"
        plot_sample_latency(results, plot or path.parent / png)
    elif plot:
        plot_sample_latency(results, plot)
    return results
