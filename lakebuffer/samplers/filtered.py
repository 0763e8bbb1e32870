"""Samplers that narrow the caller's ``where`` with a predicate of their own, then delegate.

``freshness``, ``reward`` and ``max_reuse`` are such filters over a base sampler (``uniform`` by
default): ``get("freshness", max_lag=2, base="prioritized_time", half_life=1)`` samples p-time
among fresh rows. Options a filter does not know go to the base sampler's constructor.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from . import _common as c
from . import registry
from .base import Sampler


def build(base: str | Sampler | type[Sampler], options: dict[str, Any]) -> Sampler:
    return registry.resolve(base, **options)


class FilteredSampler(Sampler):
    """A predicate (``extra_predicate``) ANDed to ``where``, then the base sampler's choice."""

    forwards_options = True

    def __init__(self, base: str | Sampler | type[Sampler] = "uniform", **base_options: Any) -> None:
        self.base = build(base, base_options)

    @classmethod
    def passed_on_options(cls, options: dict[str, Any]) -> list[str]:
        """The base sampler's options (``base`` defaults to ``uniform``)."""
        base = options.get("base", "uniform")
        base_cls = registry.lookup(base) if isinstance(base, str) else base if isinstance(base, type) else None
        return registry.option_names(base_cls) if base_cls is not None else []

    @property
    def allow_fewer(self) -> bool:  # type: ignore[override]
        return self.base.allow_fewer

    def extra_predicate(self, catalog, where: str | None) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def sample(self, catalog, n: int, where: str | None, rng: np.random.Generator) -> pa.Array:
        n = self.check_n(n)
        with catalog.lock:
            extra = self.extra_predicate(catalog, where)
            return self.base.sample(catalog, n, c.combine(where, extra), rng)
