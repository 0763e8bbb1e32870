"""Small timing helpers: medians over trials, percentiles, and time-capped latency loops."""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); with few trials p99 is simply the maximum."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))
    return float(s[k])


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def latency_loop(fn: Callable[[int], Any], *, min_trials: int, max_trials: int, max_seconds: float) -> dict[str, Any]:
    """Call ``fn(trial)`` until ``max_trials`` or ``max_seconds`` (after ``min_trials``); p50/p99 in ms.

    The cap keeps a 2 s-per-call baseline from eating the whole run while still giving it a median.
    The first call (cold caches, catalog registration) is reported apart as ``first_ms``.
    """
    first, _ = timed(lambda: fn(max_trials))  # a trial number the loop itself never uses
    times: list[float] = []
    start = time.perf_counter()
    for i in range(max_trials):
        dt, _ = timed(lambda i=i: fn(i))
        times.append(dt)
        if i + 1 >= min_trials and time.perf_counter() - start > max_seconds:
            break
    return {
        "p50_ms": median(times) * 1e3,
        "p99_ms": percentile(times, 99) * 1e3,
        "mean_ms": sum(times) / len(times) * 1e3,
        "trials": len(times),
        "first_ms": first * 1e3,
    }


def safe_ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, or ``None`` when either side is missing (a system that failed or was skipped)."""
    if a is None or b is None or not b or (isinstance(a, float) and math.isnan(a)):
        return None
    return a / b


def gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """Collect, then freeze what exists, so one system's millions of live Python objects (the
    deque's rows, the score index) do not bill their GC passes to the system being timed."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
