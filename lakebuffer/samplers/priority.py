"""Generic prioritized sampling: probability proportional to ``priority ** alpha`` (PER-style)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import _common as c
from .base import Sampler


class WeightedSampler(Sampler):
    """Shared core of the weighted samplers: subclasses give the SQL log-weight of a row.

    Without replacement: Efraimidis-Spirakis keys in SQL (one top-n scan). With replacement: the
    candidates' hashes and weights are read (numbers only), ``n`` i.i.d. draws are made by the RNG
    from the cumulative weights in a canonical (hash) order, then the drawn keys are fetched.
    """

    replacement: bool = False
    #: importance-weight exponent (``info`` only; sampling itself does not depend on it)
    beta: float = 1.0

    def log_weight(self, catalog, source: str, where: str | None) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def sample(self, catalog, n: int, where: str | None, rng: np.random.Generator) -> pa.Array:
        n = self.check_n(n)
        seed = self.seed_from(rng)
        source, pred = c.resolve(catalog, where)
        if n == 0:
            return c.empty_keys()
        with catalog.lock:
            logw = self.log_weight(catalog, source, where)
            h = c.key_hash(catalog, source, seed)
            fields = {"source": source, "where": pred, "h": h, "logw": logw}
            if not self.replacement:
                sql = catalog.render("sample_weighted", u=c.uniform01("h"), n=n, **fields)
                keys = catalog.query(sql, sync=False).column("key").combine_chunks()
                self.check_enough(n, len(keys), f"{pred} with a positive weight")
                return keys
            cand = catalog.query(catalog.render("sample_weighted_all", **fields), sync=False)
            if cand.num_rows == 0:
                self.check_enough(n, 0, f"{pred} with a positive weight")
                return c.empty_keys()
            hashes = cand.column("h").to_numpy()
            lw = cand.column("logw").to_numpy()
            order = np.argsort(hashes, kind="stable")
            hashes, lw = hashes[order], lw[order]
            cdf = np.cumsum(np.exp(lw - lw.max()))
            picks = np.searchsorted(cdf, rng.random(n) * cdf[-1], side="right")
            picks = np.minimum(picks, len(cdf) - 1)
            wanted_idx, inverse = np.unique(picks, return_inverse=True)
            wanted = pa.table({"h": pa.array(hashes[wanted_idx], pa.uint64())})
            found = catalog.query(catalog.render("sample_keys_by_hash", **fields), sync=False, wanted=wanted)
        pos = np.searchsorted(hashes[wanted_idx], found.column("h").to_numpy())
        keys = np.empty(len(wanted_idx), dtype=object)
        keys[pos] = found.column("key").to_numpy(zero_copy_only=False)
        return pa.array(keys[inverse], pa.string())


    def info(self, catalog, keys: pa.Array, where: str | None) -> dict[str, pa.Array]:
        """Keys, their sampling probability ``P(i) = w_i / sum_j w_j`` over the rows matching ``where``
        and importance weights ``(N P(i)) ** -beta / max_j (N P(j)) ** -beta`` (TorchRL's
        PrioritizedSampler), computed in log space: ``exp(-beta (logw_i - min_j logw_j))``.

        ``P(i)`` is the single-draw probability (exact with replacement; without replacement it is
        the first draw's, as in TorchRL).
        """
        source, pred = c.resolve(catalog, where)
        with catalog.lock:
            fields = {"source": source, "where": pred, "logw": self.log_weight(catalog, source, where)}
            stats = catalog.query(catalog.render("sample_weight_stats", **fields), sync=False).to_pylist()[0]
            wanted = pa.table({"key": keys})
            found = catalog.query(catalog.render("sample_weight_keys", **fields), sync=False, wanted=wanted)
        pos = pc.index_in(keys, value_set=found.column("key"))
        lw = found.column("logw").combine_chunks().take(pos).to_numpy(zero_copy_only=False).astype(np.float64)
        if not stats["n"]:
            empty = pa.array(np.full(len(keys), np.nan))
            return {"keys": keys, "weights": empty, "probabilities": empty}
        prob = np.exp(lw - stats["lmax"]) / stats["total"]
        weights = np.exp(-self.beta * (lw - stats["lmin"]))
        return {"keys": keys, "weights": pa.array(weights), "probabilities": pa.array(prob)}


class PrioritySampler(WeightedSampler):
    """Probability proportional to ``(priority + eps) ** alpha`` for any numeric SQL expression.

    Options:
        priority: a SQL expression over metadata columns (default ``"abs(advantage)"``); rows where
            ``priority + eps`` is NULL or not positive have weight 0 and are never chosen. A row
            given a priority by ``ReplayBuffer.update_priority`` uses that value instead.
        alpha: the exponent (0 is uniform over rows of positive priority), default 1.
        eps: added to the priority before the exponent (PER's epsilon), default 0.
        beta: importance-weight exponent of ``sample(..., return_info=True)``, default 1 (full
            correction; PER anneals it from ~0.4 to 1).
        replacement: ``False`` (default): ``n`` distinct keys by weighted sampling without
            replacement (Efraimidis-Spirakis, successive-draw semantics); ``True``: ``n`` i.i.d.
            weighted draws.
        allow_fewer: return fewer keys instead of raising.

    Raises ``NotEnoughRowsError`` when fewer than ``n`` rows matching ``where`` have a positive
    weight (without replacement; with replacement when none has), ``QueryError`` for bad SQL.
    """

    name = "priority"

    def __init__(self, priority: str = "abs(advantage)", alpha: float = 1.0, eps: float = 0.0,
                 replacement: bool = False, allow_fewer: bool = False, beta: float = 1.0) -> None:
        self.priority = priority
        c.check_expression(priority, "priority")
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.beta = float(beta)
        c.literal(self.beta)
        c.literal(self.alpha)
        c.literal(self.eps)
        self.replacement = bool(replacement)
        self.allow_fewer = bool(allow_fewer)

    def log_weight(self, catalog, source: str, where: str | None) -> str:
        expr = catalog.priority_sql(c.check_expression(self.priority, "priority"), source)
        p = f"({expr} + {c.literal(self.eps)})"
        return f"CASE WHEN {p} > 0 THEN {c.literal(self.alpha)} * ln({p}) END"
