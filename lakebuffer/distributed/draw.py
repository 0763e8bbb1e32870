"""Exact global sampling over shards: every sampler answers as it would over one buffer.

Two paths, both exact (the keys one ``ReplayBuffer`` holding every shard's rows would return for
the same seed):

* ``uniform`` (the default, with or without replacement): a merge of per-shard top-k lists. The
  uniform sample is the ``n`` matching rows of smallest seeded key hash; with the seed the sampler
  would draw, each shard returns its ``k_i`` smallest (key, hash) and the requested columns in
  one round trip, the coordinator keeps the global ``n`` smallest. It is exact when every shard
  either ran out or its last hash is past the global cut; a shard short of that is asked again
  (rare: ``k_i`` is its share of the last draw of this predicate shape plus 4 standard
  deviations). With replacement the shards also count their matching rows, and the positions
  are drawn from the global total as ``UniformSampler`` does.
* ``prioritized_time`` / ``priority`` without replacement: the same merge over each row's
  Efraimidis-Spirakis key (a function of the row's seeded hash and weight only).
* ``group`` when rows are routed by ``group_id`` (a group on one shard): each shard's first groups
  for the seed, merged by the group's seeded hash (``merge_groups``).
* every other sampler, a user's own included: the shards return their rows' metadata (no
  payload; a ``where`` over payload is evaluated on the shards into a ``_match`` flag), the
  sampler runs on the coordinator over the union in a DuckDB catalog of its own, then the chosen
  rows are fetched. Global statistics (quantiles, the newest version, group membership across
  shards) are therefore those of all rows, and a sampler registered in the driver needs no
  shipping. Cost: the metadata of every live row per call (about 100 B a row).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import samplers as _samplers
from ..catalog import Catalog
from ..resources import render_sql, sql_text
from ..samplers import _common as c
from ..samplers.base import Sampler
from ..samplers.freshness import FreshnessSampler
from ..samplers.prioritized_time import PrioritizedTimeSampler
from ..samplers.priority import PrioritySampler
from ..samplers.reward import RewardSampler
from ..samplers.uniform import UniformSampler

#: per predicate shape: each shard's share of the last uniform draw (sizes the next ``k_i``)
_SHARES_MAX = 256


def split_counts(n: int, weights: Sequence[int]) -> list[int]:
    """Split ``n`` in proportion to ``weights`` (largest remainder; ties to the lower index)."""
    total = int(sum(weights))
    if total == 0:
        return [0] * len(weights)
    exact = np.asarray(weights, dtype=np.float64) * n / total
    base = np.floor(exact).astype(np.int64)
    short = n - int(base.sum())
    order = np.argsort(-(exact - base), kind="stable")
    base[order[:short]] += 1
    return [int(min(b, w)) for b, w in zip(base, weights)]


def is_mergeable(strategy: Sampler) -> bool:
    """Samplers answered by the top-k merge: exactly ``UniformSampler`` (not a subclass), and the
    built-in weighted samplers without replacement (their Efraimidis-Spirakis keys are per row)."""
    if type(strategy) is UniformSampler:
        return True
    return type(strategy) in (PrioritizedTimeSampler, PrioritySampler) and not strategy.replacement


#: per-shard partial results a filter sampler's predicate is computed from over every shard (the
#: templates shards may run for ``partial``): each is a table over the shard's rows matching where
PARTIALS = frozenset({"shard_reward_values", "shard_max_version"})


def partial_of(strategy: Sampler) -> str | None:
    """For a filter answered as its predicate then a top-k merge (``reward``, ``freshness`` over a
    mergeable base): the partial result its predicate needs from each shard (in ``PARTIALS``), or
    ``""`` when it needs none (a fixed ``min_reward`` / ``current_version``); None for other samplers.

    Exact: the filter's own ``extra_predicate`` runs over the union of the partials (the reward
    of every matching row for a quantile cut, each shard's newest version for the newest), then
    the base sampler draws over the narrowed ``where`` with the same seed, as ``FilteredSampler``
    does over one buffer. ``max_reuse`` stays on the union path (its counts must be live)."""
    if type(strategy) not in (RewardSampler, FreshnessSampler) or not is_mergeable(strategy.base):
        return None
    if isinstance(strategy, RewardSampler):
        return "" if strategy.min_reward is not None else "shard_reward_values"
    return "" if strategy.current_version is not None else "shard_max_version"


def merge_groups(parts: Sequence[pa.Table], n: int, rows_unit: bool) -> tuple[pa.Array, np.ndarray, int]:
    """The global first groups from each shard's first groups (``top_groups``: key, g, gh in order).

    Exact when every group lives on one shard (``route="group_id"``): the sampler orders eligible
    groups by (hash, id), so the global first ``n`` groups (or the fewest reaching ``n`` rows) are
    a prefix of each shard's own first ones. Returns (keys in order, their shard, units found).
    """
    tagged = []
    for i, t in enumerate(parts):
        pos = pa.array(np.arange(t.num_rows, dtype=np.int64))
        tagged.append(t.append_column("_pos", pos).append_column("_shard", pa.array(np.full(t.num_rows, i, np.int32))))
    rows = pa.concat_tables(tagged, promote_options="default")
    if rows.num_rows == 0:
        return rows.column("key").combine_chunks(), np.zeros(0, np.int32), 0
    groups = rows.group_by(["gh", "g"], use_threads=False).aggregate([("_pos", "min"), ("key", "count")])
    groups = groups.sort_by([("gh", "ascending"), ("g", "ascending")])
    sizes = groups.column("key_count").to_numpy()
    if rows_unit:
        reach = np.cumsum(sizes)
        take = int(np.searchsorted(reach, n) + 1) if reach[-1] >= n else len(sizes)
        found = int(reach[take - 1]) if take else 0
    else:
        take = min(n, len(sizes))
        found = take
    chosen = groups.slice(0, take)
    rank = pc.index_in(rows.column("g"), value_set=chosen.column("g"))
    picked = rows.append_column("_rank", rank).filter(pc.is_valid(rank))
    picked = picked.sort_by([("_rank", "ascending"), ("_pos", "ascending")])
    return picked.column("key").combine_chunks(), picked.column("_shard").to_numpy(), found


def plan_k(n: int, shares: Sequence[float] | None, num: int) -> list[int]:
    """Candidates to ask each shard for: ``n`` when nothing is known, else share + 4 sd + 8 (<= n)."""
    if shares is None or len(shares) != num:
        return [max(n, 1)] * num
    out = []
    for p in shares:
        mean = n * p
        out.append(max(1, min(n, math.ceil(mean + 4.0 * math.sqrt(max(mean * (1 - p), 0.0)) + 8))))
    return out


def merge_top(
    fetch: Callable[[dict[int, int]], dict[int, dict]],
    num: int,
    n: int,
    shares: Sequence[float] | None,
) -> tuple[pa.Table, list[int | None], list[int]]:
    """The exact global ``n`` smallest (h, key) rows over ``num`` shards.

    ``fetch({shard: k})`` returns ``{shard: {"rows", "exhausted", "total"}}``. Returns the merged
    rows (sorted, ``_shard`` column added, at most ``n``), the shards' totals and the ``k`` asked.
    """
    ks = plan_k(n, shares, num)
    got = fetch(dict(enumerate(ks)))
    while True:
        parts = []
        for i in range(num):
            rows = got[i]["rows"]
            parts.append(rows.append_column("_shard", pa.array(np.full(rows.num_rows, i, np.int32))))
        merged = pa.concat_tables(parts, promote_options="default").sort_by([("h", "ascending"), ("key", "ascending")])
        cut = None
        if merged.num_rows >= n and n > 0:
            cut = (merged.column("h")[n - 1].as_py(), merged.column("key")[n - 1].as_py())
        short = {}
        for i in range(num):
            if got[i]["exhausted"]:
                continue
            rows = got[i]["rows"]
            last = (rows.column("h")[-1].as_py(), rows.column("key")[-1].as_py()) if rows.num_rows else None
            if cut is None or last is None or last < cut:
                short[i] = min(max(2 * ks[i], ks[i] + 64), max(n, 1)) if ks[i] < n else max(n, 1)
        if not short or all(ks[i] >= max(n, 1) for i in short):
            break
        for i, k in short.items():
            ks[i] = k
        got.update(fetch(short))
    return merged.slice(0, n), [got[i]["total"] for i in range(num)], ks


def shares_of(merged: pa.Table, num: int) -> list[float]:
    """Each shard's share of a merged draw (with a floor, so a shard is never asked for nothing)."""
    if merged.num_rows == 0:
        return [1.0 / num] * num
    counts = np.bincount(merged.column("_shard").to_numpy(), minlength=num)
    return list(counts / counts.sum())


def uniform_plan(strategy: UniformSampler, n: int, where: str | None, seed: int | None,
                 top: Callable[[int, bool], tuple[pa.Table, list[int | None]]]) -> tuple[pa.Table, np.ndarray | None]:
    """Mirror of ``UniformSampler.sample_resolved`` over merged shard tops.

    ``top(m, count)`` gives the exact global ``m`` smallest rows (and, with ``count``, per-shard
    totals). Returns the candidate rows and the take indices into them (None: take all in order).
    """
    rng = np.random.default_rng(seed)
    Sampler.seed_from(rng)  # the sampler's first draw: the SQL seed the shards were given (sql_seed_of)
    described = c.combine(where)
    if n == 0:
        return pa.table({"key": c.empty_keys(), "h": pa.array([], pa.uint64())}), None
    if not strategy.replacement:
        rows, _ = top(n, False)
        strategy.check_enough(n, rows.num_rows, described)
        return rows, None
    rows, totals = top(n, True)
    total = int(sum(t or 0 for t in totals))
    if total == 0:
        strategy.check_enough(n, 0, described)
        return rows.slice(0, 0), None
    positions = rng.integers(0, total, size=n)
    distinct = np.unique(positions)
    if rows.num_rows < len(distinct):
        raise RuntimeError("the matching rows changed while sampling; sample again")
    return rows.slice(0, len(distinct)), np.searchsorted(distinct, positions)


def sql_seed_of(seed: int | None) -> int:
    """The SQL hash seed ``UniformSampler`` derives from ``seed`` (its first RNG draw)."""
    return Sampler.seed_from(np.random.default_rng(seed))


class UnionCatalog:
    """The coordinator's DuckDB catalog over the union of the shards' metadata (one per buffer)."""

    def __init__(self, schema: pa.Schema, meta_columns: list[str]) -> None:
        self.catalog = Catalog(schema, meta_columns, native_meta=False)
        self.catalog.con.execute(sql_text("priority_table"))  # the shards' update_priority values
        self.catalog.keeps_priorities = True

    def load(self, parts: Sequence[tuple[pa.Table, bool]], priorities: Sequence[pa.Table] = ()) -> bool:
        """Serve ``parts`` (the shards' ``meta`` answers) as ``meta`` and ``priorities`` (theirs)
        as ``priorities``; True if ``_match`` is the where."""
        tables = [t for t, _ in parts]
        union = pa.concat_tables(tables, promote_options="default") if tables else pa.table({})
        self.catalog.define_views({"__sharded_meta": union},
                                  [render_sql("sharded_meta_view", source="__sharded_meta")])
        prios = (pa.concat_tables(list(priorities)) if priorities
                 else pa.table({"key": pa.array([], pa.string()), "priority": pa.array([], pa.float64())}))
        with self.catalog.lock:
            self.catalog.con.register("__sharded_priorities", prios)
            try:
                self.catalog.con.execute(render_sql("sharded_priorities_load", source="__sharded_priorities"))
            finally:
                self.catalog.con.unregister("__sharded_priorities")
        return any(payload for _, payload in parts)

    def draw(self, strategy: Sampler, n: int, where: str | None, seed: int | None) -> pa.Array:
        return _samplers.draw(strategy, self.catalog, n, where, seed)

    def close(self) -> None:
        self.catalog.close()


def count_repeats(keys: pa.Array) -> pa.Array:
    """How many times each position's key occurs in ``keys`` (to add a draw's replays to counts)."""
    vc = pc.value_counts(keys)
    pos = pc.index_in(keys, value_set=vc.field("values"))
    return vc.field("counts").take(pos)


def assemble(tables: dict[int, pa.Table], positions: dict[int, np.ndarray]) -> pa.Table:
    """Rows fetched per shard back in the draw's order (``positions[i]``: where shard i's rows go)."""
    if not tables:
        return pa.table({})
    table = pa.concat_tables(list(tables.values()), promote_options="default")
    where_from = np.concatenate([positions[i] for i in tables])
    inverse = np.empty(len(where_from), dtype=np.int64)
    inverse[where_from] = np.arange(len(where_from))
    return table.take(pa.array(inverse))


def group_by_shard(shard_of: np.ndarray, num: int) -> dict[int, np.ndarray]:
    """Positions per shard index (only shards that have some)."""
    return {i: idx for i in range(num) if len(idx := np.flatnonzero(shard_of == i))}
