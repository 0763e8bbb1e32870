"""Success blend: a fixed share of every batch replays verified / high-reward history."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..predicate import parse
from . import _common as c
from .base import Sampler
from .uniform import UniformSampler


class SuccessBlendSampler(Sampler):
    """``round(n * success_fraction)`` keys from successes, the rest from fresh rows, shuffled.

    Options:
        success_fraction: the share of each batch drawn from the success pool (default 0.25);
            the split is exact, not probabilistic.
        success_where: SQL predicate of a success (default ``verified OR reward >= threshold``).
        threshold: the reward of a success in the default ``success_where`` (default 1.0).
        fresh_where: SQL predicate of a fresh row (default ``policy_version >= current - max_lag``).
        max_lag, current_version: the default fresh window (``current_version`` defaults to the
            buffer's newest version, ``max_lag`` to 0).
        replacement, allow_fewer: as for ``uniform``, applied to each part.

    Both parts also satisfy the caller's ``where``. The success part is drawn first; the fresh part
    excludes the keys already drawn, so a batch never holds a key twice (a fresh success may be
    in either part). The keys come back in a random order (the RNG's permutation). Raises
    ``NotEnoughRowsError`` when either pool is short of its share.
    """

    name = "success_blend"

    def __init__(self, success_fraction: float = 0.25, success_where: str | None = None,
                 threshold: float = 1.0, fresh_where: str | None = None, max_lag: int = 0,
                 current_version: int | None = None, replacement: bool = False,
                 allow_fewer: bool = False) -> None:
        if not 0.0 <= float(success_fraction) <= 1.0:
            raise ValueError(f"success_fraction must be in [0, 1], got {success_fraction!r}")
        if int(max_lag) != max_lag or max_lag < 0:
            raise ValueError(f"max_lag must be a non-negative integer, got {max_lag!r}")
        self.success_fraction = float(success_fraction)
        self.threshold = float(threshold)
        parse(success_where, "success_where")  # user SQL: one expression over the row's columns
        parse(fresh_where, "fresh_where")
        self.success_where = success_where or f"verified OR reward >= {c.literal(self.threshold)}"
        self.fresh_where = fresh_where
        self.max_lag = int(max_lag)
        self.current_version = None if current_version is None else int(current_version)
        self.replacement = bool(replacement)
        self.allow_fewer = bool(allow_fewer)
        self._part = UniformSampler(replacement=replacement, allow_fewer=allow_fewer)

    def split(self, n: int) -> tuple[int, int]:
        """(successes, fresh) of a batch of ``n``."""
        s = int(math.floor(n * self.success_fraction + 0.5))
        return s, n - s

    def _fresh(self, catalog) -> str:
        if self.fresh_where is not None:
            return self.fresh_where
        current = self.current_version if self.current_version is not None else c.max_policy_version(catalog)
        return "FALSE" if current is None else f"policy_version >= {current - self.max_lag}"

    def sample(self, catalog, n: int, where: str | None, rng: np.random.Generator) -> pa.Array:
        n = self.check_n(n)
        n_success, n_fresh = self.split(n)
        with catalog.lock:
            source, pred = c.resolve(catalog, where, self.success_where)
            success = self._part.sample_resolved(catalog, n_success, source, pred, rng)
            source, pred = c.resolve(catalog, where, self._fresh(catalog))
            tables = {}
            described = pred
            if len(success):
                tables["sample_excluded"] = pa.table({"key": pc.unique(success)})
                pred = f"{pred} AND key NOT IN (SELECT key FROM sample_excluded)"
            fresh = self._part.sample_resolved(catalog, n_fresh, source, pred, rng, tables=tables,
                                               described=described)
        keys = pa.concat_arrays([success, fresh])
        return keys.take(pa.array(rng.permutation(len(keys))))

