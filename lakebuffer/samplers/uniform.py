"""Uniform sampling, with or without replacement."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from . import _common as c
from .base import Sampler


class UniformSampler(Sampler):
    """Every matching rollout equally likely.

    Options:
        replacement: ``False`` (default) draws ``n`` distinct keys; ``True`` draws ``n`` i.i.d.
            keys (repeats possible).
        allow_fewer: without replacement, return every matching key (fewer than ``n``) instead of
            raising ``NotEnoughRowsError``; with replacement only an empty match is short.

    Without replacement the sample is the ``n`` matching rows with the smallest
    ``hash(xor(hash(key), seed))``: a uniformly random subset in uniformly random order, independent of
    the tier or insertion order of the rows. DuckDB evaluates it as a filtered scan with a hash
    threshold sized for about ``1.5 n`` rows (see ``_common.smallest_by_hash``), not a top-N.

    With replacement, ``n`` positions are drawn by the RNG among the ``M`` matching rows; the
    ``D`` distinct positions are mapped to the ``D`` rows of smallest hash (a uniform random
    ``D``-subset in random order), which gives exactly the law of ``n`` i.i.d. uniform draws.

    Raises ``NotEnoughRowsError`` when fewer than ``n`` rows match (without replacement) or none
    match (with replacement), ``QueryError`` for a bad ``where``.
    """

    name = "uniform"

    def __init__(self, replacement: bool = False, allow_fewer: bool = False) -> None:
        self.replacement = bool(replacement)
        self.allow_fewer = bool(allow_fewer)

    def sample(self, catalog, n: int, where: str | None, rng: np.random.Generator) -> pa.Array:
        n = self.check_n(n)
        source, pred = c.resolve(catalog, where)
        return self.sample_resolved(catalog, n, source, pred, rng)

    def sample_resolved(self, catalog, n: int, source: str, pred: str, rng: np.random.Generator,
                        tables: dict | None = None, described: str | None = None) -> pa.Array:
        """Sample from an already combined predicate (used by the samplers built on this one)."""
        seed = self.seed_from(rng)
        described = pred if described is None else described
        if n == 0:
            return c.empty_keys()
        with catalog.lock:
            if not self.replacement:
                keys = c.uniform_keys(catalog, n, source, pred, seed, tables=tables)
                self.check_enough(n, len(keys), described)
                return keys
            total = c.count_rows(catalog, source, pred, tables)
            if total == 0:
                self.check_enough(n, 0, described)
                return c.empty_keys()
            positions = rng.integers(0, total, size=n)
            distinct = np.unique(positions)
            keys = c.uniform_keys(catalog, len(distinct), source, pred, seed, tables=tables)
            if len(keys) < len(distinct):  # cannot happen under the catalog lock; never index past the end
                raise RuntimeError("the matching rows changed while sampling")
        return keys.take(pa.array(np.searchsorted(distinct, positions)))
