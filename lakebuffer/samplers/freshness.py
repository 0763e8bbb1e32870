"""Freshness: only rollouts whose policy lag is at most ``max_lag``."""

from __future__ import annotations

from typing import Any

from . import _common as c
from .filtered import FilteredSampler


class FreshnessSampler(FilteredSampler):
    """Drops rows with ``current_version - policy_version > max_lag``, samples the rest.

    Options:
        max_lag: the largest allowed policy lag (default 0: only the current version).
        current_version: the trainer's version; default ``max(policy_version)`` over the buffer
            (every live row, not only those matching ``where``).
        base: the sampler applied to the fresh rows (default ``"uniform"``); any other option
            (``replacement``, ``allow_fewer``, ``half_life``, ...) goes to it.

    The filter is the literal ``policy_version >= current_version - max_lag``, which DuckDB
    answers from zone maps (rows arrive roughly in version order), so a narrow window is cheap
    at any buffer size. Rows newer than ``current_version`` are kept. Raises
    ``NotEnoughRowsError`` when fewer than ``n`` fresh rows match ``where`` (or the buffer is empty).
    """

    name = "freshness"

    def __init__(self, max_lag: int = 0, current_version: int | None = None, base: Any = "uniform",
                 **base_options: Any) -> None:
        if int(max_lag) != max_lag or max_lag < 0:
            raise ValueError(f"max_lag must be a non-negative integer, got {max_lag!r}")
        self.max_lag = int(max_lag)
        self.current_version = None if current_version is None else int(current_version)
        super().__init__(base, **base_options)

    def extra_predicate(self, catalog, where: str | None) -> str:
        current = self.current_version
        if current is None:
            current = c.max_policy_version(catalog)
            if current is None:
                return "FALSE"
        return f"policy_version >= {current - self.max_lag}"
