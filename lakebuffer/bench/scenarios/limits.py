"""Scenario ``limits``: the machine's memcpy, disk and S3 ceilings that other ratios divide by."""

from __future__ import annotations

from typing import Any

from ..context import Context

NAME = "limits"


def run(ctx: Context) -> dict[str, Any]:
    """Measure every limit (each is measured once per run; scenarios reuse what is already known)."""
    return {name: ctx.limit(name) for name in ("memcpy", "disk", "s3")}


def steps(cfg: Any) -> int:
    return 0
