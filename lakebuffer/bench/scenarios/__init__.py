"""The scenarios: each runs every system on the same generated rollouts in this process.

One module per scenario, each with ``NAME``, ``run(ctx) -> dict`` and ``steps(cfg) -> int`` (how
many progress steps it reports, for a progress bar's total). ``SCENARIOS`` and ``STEPS`` are the
registry the runner uses, in run order (``get`` reuses the stores ``ingest`` leaves behind).

A scenario returns ``{system: figures, ..., "ratio": {...}}``. A ratio is always "lakebuffer
relative to X" with > 1 meaning lakebuffer is better: throughput ratios divide lakebuffer's
GB/s by X's, latency ratios divide X's latency by lakebuffer's. A system that fails or is not
installed reports ``{"error": ...}`` / ``{"unavailable": ...}`` and the scenario goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..context import Context
from . import get, ingest, ingest_cpu, limits, rss, sample, scale, snapshot, verification, warm_get
from .sample import version_threshold

_MODULES = (limits, ingest, ingest_cpu, get, warm_get, sample, snapshot, rss, verification, scale)

SCENARIOS: dict[str, Callable[[Context], dict[str, Any]]] = {m.NAME: m.run for m in _MODULES}

# how many progress steps each scenario reports (for a progress bar's total)
STEPS: dict[str, Callable[[Any], int]] = {m.NAME: m.steps for m in _MODULES}

__all__ = ["SCENARIOS", "STEPS", "version_threshold"]
