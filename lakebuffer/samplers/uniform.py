"""Uniform sampling, with or without replacement."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..catalog import check_predicate
from .base import Sampler


class UniformSampler(Sampler):
    """Every matching rollout equally likely.

    Without replacement (default) the n keys are the top-n of a seeded hash permutation, computed
    by DuckDB as a parallel top-N; with replacement, positions are drawn by the RNG.
    """

    name = "uniform"

    def __init__(self, replacement: bool = False) -> None:
        self.replacement = replacement

    def sample(self, catalog, n: int, where: str | None, rng: np.random.Generator) -> pa.Array:
        source = catalog.source_for(where)
        pred = check_predicate(where)
        if not self.replacement:
            sql = catalog.render("sample_uniform", source=source, where=pred, seed=self.seed_from(rng), n=int(n))
            keys = catalog.query(sql, sync=False).column("key").combine_chunks()
            if len(keys) < n:
                raise self.not_enough(n, len(keys), where)
            return keys
        total = catalog.count(where, source)
        if total == 0 and n > 0:
            raise self.not_enough(n, 0, where)
        positions = rng.integers(0, total, size=n)
        wanted = pa.table({"pos": pa.array(np.unique(positions))})
        found = catalog.query(
            catalog.render("sample_positions", source=source, where=pred), sync=False, wanted=wanted
        )
        pos_sorted = np.asarray(found.column("pos").to_numpy())
        order = np.argsort(pos_sorted)
        keys_sorted = found.column("key").combine_chunks().take(pa.array(order))
        idx = np.searchsorted(pos_sorted[order], positions)
        return keys_sorted.take(pa.array(idx))
