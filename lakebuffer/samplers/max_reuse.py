"""Max reuse: a rollout is replayed at most ``k`` times, over the buffer's whole life."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import _common as c
from .filtered import FilteredSampler


class MaxReuseSampler(FilteredSampler):
    """Only rows with ``sample_count < k`` are eligible; the base sampler chooses among them.

    Options:
        k: a rollout already sampled ``k`` times (its ``sample_count``, which every sampler's
            draws increment) is no longer eligible (default 1: each rollout at most once).
        base: the sampler applied to the eligible rows (default ``"uniform"``, which must be
            without replacement); other options go to it.

    ``needs_counts`` makes ``ReplayBuffer.sample`` apply pending replay counts before and after
    the call, so ``sample_count`` (persisted in the index, kept across restarts) is exact. The
    count is read from ``meta`` even when ``where`` needs payload columns (the payload tiers keep
    the value at push). A base sampler that may return a key twice in one batch (with
    replacement, overlapping segments) is rejected if that would exceed ``k``. Raises
    ``NotEnoughRowsError`` when fewer than ``n`` eligible rows match ``where``.
    """

    name = "max_reuse"
    needs_counts = True

    def __init__(self, k: int = 1, base: Any = "uniform", **base_options: Any) -> None:
        if int(k) != k or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        self.k = int(k)
        super().__init__(base, **base_options)
        if getattr(self.base, "replacement", False) and self.k == 1:
            raise ValueError("max_reuse with k=1 needs a base sampler without replacement")

    def extra_predicate(self, catalog, where: str | None) -> str:
        source, _ = c.resolve(catalog, where)
        if source == "meta":
            return f"sample_count < {self.k}"
        return f"key IN (SELECT key FROM meta WHERE sample_count < {self.k})"

    def sample(self, catalog, n: int, where: str | None, rng: np.random.Generator) -> pa.Array:
        with catalog.lock:
            keys = super().sample(catalog, n, where, rng)
            if len(keys) and pc.count_distinct(keys).as_py() < len(keys):
                self._check_repeats(catalog, keys)
        return keys

    def _check_repeats(self, catalog, keys: pa.Array) -> None:
        vc = pc.value_counts(keys)
        repeated = pa.table({"key": vc.field("values"), "n": vc.field("counts")}).filter(
            pc.greater(vc.field("counts"), 1))
        live = catalog.query(catalog.render("sample_live_counts"), sync=False, wanted=repeated.select(["key"]))
        have = dict(zip(live.column("key").to_pylist(), live.column("sample_count").to_pylist()))
        for key, times in zip(repeated.column("key").to_pylist(), repeated.column("n").to_pylist()):
            if have.get(key, 0) + times > self.k:
                raise ValueError(
                    f"the base sampler returned {key!r} {times} times, which would exceed k={self.k}; "
                    "use a base sampler without repeats"
                )
