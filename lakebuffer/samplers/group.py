"""Group sampling: whole GRPO groups (every response to a prompt), chosen uniformly by group."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import _common as c
from .base import Sampler


class GroupSampler(Sampler):
    """Whole groups by ``group_id``: every row of each sampled group, groups in random order.

    Options:
        unit: ``"groups"`` (default): ``n`` groups; ``"rows"``: the fewest whole groups (in the
            sampled order) holding at least ``n`` rows, so the batch may exceed ``n`` by less than
            one group.
        match: ``"all"`` (default): a group is eligible if every one of its rows matches
            ``where``; ``"any"``: if at least one does. Either way the whole group is returned.
        allow_fewer: return fewer groups instead of raising.

    Each eligible group is equally likely whatever its size (smallest seeded hash of the group id).
    Rows of a group come back contiguous, ordered by key. Raises ``NotEnoughRowsError`` when fewer
    than ``n`` groups (or rows in eligible groups) match.
    """

    name = "group"
    by = "group_id"
    unit_name = "groups"

    def __init__(self, unit: str = "groups", match: str = "all", allow_fewer: bool = False) -> None:
        if unit == "groups" and self.unit_name != "groups":
            unit = self.unit_name
        if unit not in (self.unit_name, "rows"):
            raise ValueError(f"unit must be {self.unit_name!r} or 'rows', got {unit!r}")
        if match not in ("all", "any"):
            raise ValueError(f"match must be 'all' or 'any', got {match!r}")
        self.unit = unit
        self.match = match
        self.allow_fewer = bool(allow_fewer)

    def row_order(self) -> list[tuple[str, str]]:
        """How rows are ordered within one group."""
        return [("key", "ascending")]

    def sample(self, catalog, n: int, where: str | None, rng: np.random.Generator) -> pa.Array:
        n = self.check_n(n)
        seed = self.seed_from(rng)
        if n == 0:
            return c.empty_keys()
        source, pred = c.resolve(catalog, where)
        fields = {"source": source, "where": pred, "gid": self.by, "gh": c.value_hash([self.by], seed)}
        cache_key = ("group", id(catalog), source, self.by, c.shape_of(pred))
        rows_unit = self.unit == "rows"
        size_guess = _SIZE_GUESS.get(cache_key, 8.0)
        k = max(1, math.ceil(n / size_guess)) if rows_unit else n
        with catalog.lock:
            while True:
                cand, exhausted = c.smallest_by_hash(
                    catalog, k, template="sample_group_candidates", fields=fields,
                    cache_key=cache_key,
                    count=lambda: _scalar(catalog, catalog.render("sample_group_count", **fields)),
                )
                rows = catalog.query(catalog.render("sample_group_rows", **fields), sync=False,
                                     sample_groups=cand.select(["gid"]))
                rank = pc.index_in(rows.column("gid"), value_set=cand.column("gid")).to_numpy()
                sizes = np.bincount(rank, minlength=cand.num_rows)
                ok = np.ones(cand.num_rows, dtype=bool)
                if self.match == "all":
                    failing = ~rows.column("m").to_numpy(zero_copy_only=False).astype(bool)
                    ok = np.bincount(rank, weights=failing, minlength=cand.num_rows) == 0
                ok_idx = np.flatnonzero(ok)
                if rows_unit:
                    reach = np.cumsum(sizes[ok_idx])
                    take = int(np.searchsorted(reach, n) + 1) if len(reach) and reach[-1] >= n else len(ok_idx)
                    got = int(reach[take - 1]) if take else 0
                    enough = got >= n
                else:
                    take = min(n, len(ok_idx))
                    got = take
                    enough = take >= n
                if enough or exhausted:
                    break
                per_group = float(sizes[ok_idx].mean()) if len(ok_idx) else size_guess
                wanted, have = (n / per_group, got / per_group) if rows_unit else (n, got)
                k = c.next_k(k, math.ceil(wanted), math.floor(have), cand.num_rows, len(ok_idx))
        if len(ok_idx):
            if len(_SIZE_GUESS) > 512:
                _SIZE_GUESS.clear()
            _SIZE_GUESS[cache_key] = float(sizes[ok_idx].mean())
        self.check_enough(n, got, pred, "rows" if rows_unit else self.unit_name)
        chosen = ok_idx[:take]
        slot = np.full(cand.num_rows, -1, dtype=np.int64)
        slot[chosen] = np.arange(len(chosen))
        pos = slot[rank]
        keep = pos >= 0
        picked = rows.filter(pa.array(keep)).append_column("_slot", pa.array(pos[keep]))
        picked = picked.sort_by([("_slot", "ascending"), *self.row_order()])
        return picked.column("key").combine_chunks()


_SIZE_GUESS: dict[tuple, float] = {}


def _scalar(catalog, sql: str) -> int:
    return int(catalog.query(sql, sync=False).column(0)[0].as_py() or 0)
