"""``ShardedReplayBuffer``: the ``ReplayBuffer`` API over N Ray actors, one ``ReplayBuffer`` each.

Rows are routed by a hash of ``group_id`` (default: a GRPO group stays on one shard), of
``episode_id``, round-robin, to a fixed shard, or (``route="local"``) to a shard on the pushing
process's own node, so a rollout crosses the network at most once. ``sample`` draws globally and
exactly (``draw``). Tables travel through Ray's object store as Arrow buffers, never Python rows.

Failures: a shard actor that dies is restarted by Ray (``max_restarts``; on a surviving node when
its node died, see ``placement``). Reads (count, sample, get, sql, stats, snapshot) wait up to
``retry_s`` for it and retry; a push in flight raises ``ShardError`` (its rows were not
acknowledged: push again). A shard restarted on another node resumes from the lake, so rows
acknowledged but not yet snapshotted are lost with their node, unless ``durable=True`` (a push
returns only once its rows are in the lake; slower, see BENCHMARKS.md).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import predicate
from .. import samplers as _samplers
from ..engine.priorities import priority_values
from ..errors import KeyNotFoundError, LakeBufferError, OptionError
from ..results import Snapshot
from ..samplers import _common as c
from ..samplers.base import Sampler
from ..samplers.episode import EpisodeSampler
from ..samplers.group import GroupSampler
from ..samplers.uniform import UniformSampler
from ..schema import key_list, metadata_columns, to_table
from . import draw
from . import placement as _placement
from .shard import Shard, ShardError, node_id

_ROUTES = ("group_id", "episode_id", "key", "round_robin", "local")


class _ShardDown(ShardError):
    """A shard actor is dead or restarting (retried by reads)."""


def _ray():
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("lakebuffer.distributed needs Ray: pip install 'lakebuffer[ray]'") from e
    return ray


class ShardedReplayBuffer:
    """The ``ReplayBuffer`` API (push/sample/get/sql/scan/delete/snapshot/stats/close) over N Ray actors.

    A ``RolloutReader``. Every sampler answers as over one buffer holding all rows (same keys for
    the same seed and shard count); ``sql`` and ``scan`` read the lake after a snapshot of every
    shard (exact across shards); ``count`` and ``get`` ask the shards.

    Options: ``placement="spread"`` (shards over every alive node) or None (Ray decides);
    ``durable`` (ack after the lake commit); ``retry_s`` (how long reads wait for a restarting
    shard); ``max_restarts`` (per shard, -1 unlimited); ``open_kwargs`` go to each ``ReplayBuffer``.
    """

    def __init__(
        self,
        num_shards: int,
        root: str | os.PathLike,
        lake: str | os.PathLike | None = None,
        *,
        route: str = "group_id",
        run_id: str | None = None,
        placement: str | None = "spread",
        durable: bool = False,
        retry_s: float = 60.0,
        max_restarts: int = -1,
        actor_options: dict | None = None,
        **open_kwargs: Any,
    ) -> None:
        ray = _ray()
        if not ray.is_initialized():
            ray.init()
        if route not in _ROUTES and not route.startswith("shard:"):
            raise OptionError(f"route must be one of {', '.join(_ROUTES)} or shard:<i>, got {route!r}")
        self.num_shards = int(num_shards)
        self.root = Path(root)
        self.run_id = run_id or self.root.resolve().name
        self.lake = str(lake) if lake else str(self.root / "lake")
        self.route = route
        self.retry_s = float(retry_s)
        self.storage_options = open_kwargs.get("storage_options")
        self._rr = 0
        self._schema: pa.Schema | None = None
        self._shares: dict[str, list[float]] = {}
        self._floor = [0] * self.num_shards  # per shard: past the highest key number acknowledged
        #: Arrow bytes the last ``sample`` received from the shards (candidates, metadata, rows)
        self.last_sample_bytes = 0
        self._key_pattern = f"^{re.escape(self.run_id)}-shard(?P<s>[0-9]+)-[0-9]+$"
        places, self._pg = _placement.strategies(ray, self.num_shards, placement)
        opts = {"max_restarts": max_restarts, "max_task_retries": 0, "num_cpus": 0}
        self._shards = []
        for i in range(self.num_shards):
            kw = {**open_kwargs, "lake": self.lake, "run_id": f"{self.run_id}-shard{i}"}
            actor = ray.remote(**{**opts, **places[i], **(actor_options or {})})(Shard)
            self._shards.append(actor.remote(str(self.root), i, kw, durable))
        self._nodes: list[str | None] = [None] * self.num_shards
        self._init_local()
        self.refresh_placement()  # waits until every shard is open

    def _init_local(self) -> None:
        self._union: draw.UnionCatalog | None = None
        self._partials: draw.UnionCatalog | None = None  # filter samplers' partial results
        self._union_lock = threading.Lock()
        #: per shard: keys drawn but not yet told to it (sent with its next call, see ``_record``)
        self._unrecorded: dict[int, list[pa.Array]] = {}

    # plumbing ---------------------------------------------------------------------------
    def _get(self, refs: list) -> list:
        ray = _ray()
        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as e:
            if getattr(e, "actor_init_failed", False):  # its ReplayBuffer refused to open: no restart helps
                raise ShardError(f"a shard could not open its buffer (fix the cause, then reopen): {e}") from e
            raise _ShardDown(f"a shard actor died during the call (Ray restarts it; push again): {e}") from e
        except ray.exceptions.RayTaskError as e:
            cause = e.as_instanceof_cause() if hasattr(e, "as_instanceof_cause") else e
            if isinstance(cause, (LakeBufferError, TypeError, ValueError, KeyError)):
                raise cause from None
            raise ShardError(f"a shard failed: {e}") from e

    def _call(self, fn: Callable[[Any, int], Any], shards: Sequence[int] | None = None, *,
              retry: bool = True) -> list:
        """``fn(actor, i)`` on each shard (all by default), in parallel; reads retry while a shard restarts."""
        idx = list(range(self.num_shards)) if shards is None else list(shards)
        deadline = time.monotonic() + self.retry_s
        while True:
            try:
                self._send_records(idx)
                return self._get([fn(self._shards[i], i) for i in idx])
            except _ShardDown:
                if not retry or time.monotonic() > deadline:
                    raise
                time.sleep(0.25)
                self._nodes = [None] * self.num_shards

    @property
    def shards(self) -> list:
        """The actor handles (e.g. to kill one in a fault test)."""
        return list(self._shards)

    def refresh_placement(self) -> list[str]:
        """Ask every shard which node it runs on now (after a restart it may have moved)."""
        got = self._call(lambda s, i: s.where.remote())
        self._nodes = [n for n, _ in got]
        return list(self._nodes)

    @property
    def shard_nodes(self) -> list[str]:
        """The node id each shard runs on (as of the last placement refresh)."""
        if any(n is None for n in self._nodes):
            self.refresh_placement()
        return list(self._nodes)  # type: ignore[arg-type]

    def _hash_route(self, table: pa.Table, col: str, among: int) -> np.ndarray:
        if col not in table.column_names:
            raise OptionError(f"route={self.route!r} needs column {col!r} in pushed batches")
        import polars as pl

        hashes = pl.from_arrow(table.column(col)).cast(pl.Utf8).hash(seed=0).to_numpy()
        return (hashes % np.uint64(among)).astype(np.int64)

    def _route(self, table: pa.Table) -> np.ndarray:
        n = table.num_rows
        if self.route == "round_robin":
            out = (np.arange(n) + self._rr) % self.num_shards
            self._rr = (self._rr + n) % self.num_shards
            return out
        if self.route.startswith("shard:"):
            return np.full(n, int(self.route.split(":", 1)[1]) % self.num_shards)
        if "group_id" in table.column_names and "prompt_id" in table.column_names:
            # a null group_id is filled with prompt_id at push: route by what will be stored
            filled = pc.coalesce(table.column("group_id"), table.column("prompt_id"))
            table = table.set_column(table.column_names.index("group_id"), "group_id", filled)
        group = "group_id" if "group_id" in table.column_names else "prompt_id"
        if self.route == "local":
            here = _placement.local_shards(self.shard_nodes, node_id())
            if here:  # whole groups to one of this node's shards
                return np.asarray(here, dtype=np.int64)[self._hash_route(table, group, len(here))]
            return self._hash_route(table, group, self.num_shards)
        col = group if self.route == "group_id" else self.route
        return self._hash_route(table, col, self.num_shards)

    def _shard_of_keys(self, keys: pa.Array) -> np.ndarray:
        """The shard index of each key this buffer made (``<run_id>-shard<i>-<n>``), else -1
        (a key the user gave at push: its shard is found by asking every shard)."""
        found = pc.extract_regex(keys, self._key_pattern)
        digits = pc.if_else(pc.is_null(found), "-1", found.field("s"))
        out = pc.cast(digits, pa.int64()).to_numpy(zero_copy_only=False)
        if found.null_count:
            out = out.copy()
            out[out >= self.num_shards] = -1
            self._locate(keys, out)
        return out

    def _locate(self, keys: pa.Array, out: np.ndarray) -> None:
        """Fill in ``out`` (-1 entries) by asking every shard which of those keys it holds."""
        unknown = np.flatnonzero(out < 0)
        wanted = keys.take(pa.array(unknown))
        held = self._call(lambda s, i: s.find.remote(wanted, ["key"]))
        for i, t in enumerate(held):
            pos = pc.index_in(wanted, value_set=t.column("key").combine_chunks()).to_numpy(zero_copy_only=False)
            hit = ~np.isnan(pos.astype(np.float64))
            out[unknown[hit]] = i
        if (out < 0).any():
            bad = keys[int(np.flatnonzero(out < 0)[0])].as_py()
            raise KeyNotFoundError(f"key {bad!r} is in no shard of this sharded buffer (run_id {self.run_id!r})")

    # writes -----------------------------------------------------------------------------
    def push(self, batch: Any) -> pa.Array:
        """Route rows to shards (one call per shard, in parallel); keys in the input's row order.

        Not retried: if a shard dies meanwhile this raises ``ShardError`` and the batch was not
        acknowledged (push it again; rows that did land are duplicates with new keys)."""
        table = to_table(batch)
        dest = self._route(table)
        parts = draw.group_by_shard(dest, self.num_shards)
        refs = [self._shards[i].push.remote(table.take(pa.array(idx)), self._floor[i]) for i, idx in parts.items()]
        try:
            results = self._get(refs)
        except _ShardDown:
            self._nodes = [None] * self.num_shards
            raise
        results = [r.combine_chunks() if isinstance(r, pa.ChunkedArray) else r for r in results]
        for i, r in zip(parts, results):
            last = r[len(r) - 1].as_py() if len(r) else ""
            tail = last.rsplit("-", 1)[-1]
            if last.startswith(f"{self.run_id}-shard{i}-") and tail.isdigit():
                self._floor[i] = max(self._floor[i], int(tail) + 1)
        keys = pa.concat_arrays(results)
        order = np.argsort(np.concatenate(list(parts.values())), kind="stable")
        return keys.take(pa.array(order))

    def extend(self, batch: Any) -> pa.Array:
        return self.push(batch)

    def update_priority(self, keys: Sequence[str] | pa.Array, priority: Any) -> int:
        """``ReplayBuffer.update_priority`` over the shards: each key's priority goes to the shard
        holding it (one call per shard, in parallel); how many keys were set. The values are
        checked here first (``OptionError``, nothing set); a key no shard holds raises
        ``KeyNotFoundError``, and then the other shards' keys may already be set."""
        arr = pa.array(key_list(keys), pa.string())
        values = priority_values(len(arr), priority)
        pos = draw.group_by_shard(self._shard_of_keys(arr), self.num_shards)
        got = self._call(lambda s, i: s.update_priority.remote(arr.take(pa.array(pos[i])), values[pos[i]]),
                         list(pos), retry=False)
        return int(sum(got))

    def delete(self, keys: Sequence[str] | None = None, where: str | None = None) -> int:
        ks = list(keys) if keys is not None else None
        return int(sum(self._call(lambda s, i: s.delete.remote(ks, where), retry=False)))

    def set_policy_version(self, version: int | None, step: int | None = None) -> None:
        self._call(lambda s, i: s.set_policy_version.remote(version, step))

    # reads ------------------------------------------------------------------------------
    def counts(self, where: str | None = None) -> list[int]:
        """Matching rows per shard."""
        predicate.check(where)
        return self._call(lambda s, i: s.count.remote(where))

    def count(self, where: str | None = None) -> int:
        """Matching rows over all shards."""
        return int(sum(self.counts(where)))

    @property
    def schema(self) -> pa.Schema:
        """The shards' rollout schema (they are opened with the same options)."""
        if self._schema is None:
            self._schema = self._call(lambda s, i: s.schema.remote(), [0])[0]
        return self._schema

    def sample(
        self,
        n: int,
        where: str | None = None,
        sampler: Any = "uniform",
        columns: Sequence[str] | None = None,
        seed: int | None = 0,
        return_keys: bool = False,
        return_info: bool = False,
        **options: Any,
    ) -> Any:
        """``ReplayBuffer.sample`` over every shard's rows, exactly (see ``draw``)."""
        strategy = _samplers.resolve(sampler, **options)
        n = Sampler.check_n(n)
        predicate.check(where)
        cols = list(columns) if columns is not None else None
        self.last_sample_bytes = 0
        if type(strategy) in (GroupSampler, EpisodeSampler) and self.route == strategy.by:  # units on one shard
            keys, rows = self._sample_groups(strategy, n, where, seed, cols, return_keys)
            info_where, cat = where, None
        elif (partial := draw.partial_of(strategy)) is not None:  # a filter's predicate, then a top-k merge
            narrowed = c.combine(where, self._filter_predicate(strategy, partial, where))
            keys, rows, info_where, cat = *self._sample_top(strategy.base, n, narrowed, seed, cols, return_keys), where, None
        elif draw.is_mergeable(strategy):
            keys, rows, info_where, cat = *self._sample_top(strategy, n, where, seed, cols, return_keys), where, None
        else:
            keys, rows, info_where, cat = self._sample_union(strategy, n, where, seed, cols, return_keys)
        out = keys if return_keys else rows
        if not return_info:
            return out
        info = {"keys": keys} if cat is None else strategy.info(cat, keys, info_where)
        return out, info

    def _sample_top(self, strategy: Any, n: int, where: str | None, seed: int | None, cols: list[str] | None,
                    return_keys: bool) -> tuple[pa.Array, pa.Table | None]:
        sql_seed = draw.sql_seed_of(seed)
        uniform = isinstance(strategy, UniformSampler)
        shape = f"{'uniform' if uniform else 'weighted'}:{c.shape_of(c.combine(where))}"
        want = [] if return_keys else cols

        def fetch(ks: dict[int, int], count: bool) -> dict[int, dict]:
            rec = {i: self._take_records(i) for i in ks}  # the last draws' replays ride along
            if uniform:
                got = self._call(lambda s, i: s.top.remote(ks[i], where, sql_seed, want, count, rec[i]), list(ks))
            else:
                got = self._call(lambda s, i: s.top_weighted.remote(ks[i], where, strategy, sql_seed, want, rec[i]),
                                 list(ks))
            self.last_sample_bytes += sum(g["rows"].nbytes for g in got)
            return dict(zip(ks, got))

        def top(m: int, count: bool) -> tuple[pa.Table, list]:
            merged, totals, _ = draw.merge_top(lambda ks: fetch(ks, count), self.num_shards, m,
                                               self._shares.get(shape))
            if len(self._shares) > draw._SHARES_MAX:
                self._shares.clear()
            self._shares[shape] = draw.shares_of(merged, self.num_shards)
            return merged, totals

        if uniform:
            rows, take = draw.uniform_plan(strategy, n, where, seed, top)
        elif n == 0:
            rows, take = top(1, False)[0].slice(0, 0), None
        else:
            rows, take = top(n, False)[0], None
            strategy.check_enough(n, rows.num_rows, f"{c.combine(where)} with a positive weight")
        if take is not None:
            rows = rows.take(pa.array(take))
        keys = rows.column("key").combine_chunks()
        shard_of = rows.column("_shard").to_numpy() if rows.num_rows else np.zeros(0, np.int64)
        self._record(keys, shard_of)
        if return_keys:
            return keys, None
        if "sample_count" in rows.column_names:  # this draw's replays, as ReplayBuffer.sample counts them
            i = rows.column_names.index("sample_count")
            live = pc.add(rows.column(i).cast(pa.int64()), draw.count_repeats(keys)).cast(rows.schema.field(i).type)
            rows = rows.set_column(i, rows.schema.field(i), live)
        return keys, rows.select(cols if cols is not None else list(self.schema.names))

    def _filter_predicate(self, strategy: Any, partial: str, where: str | None) -> str | None:
        """``strategy.extra_predicate`` over every shard's rows: run over the union of the shards'
        ``partial`` results (the rows matching ``where`` already), or alone when it needs none."""
        if not partial:
            return strategy.extra_predicate(None, where)
        parts = self._call(lambda s, i: s.partial.remote(partial, where))
        self.last_sample_bytes += sum(t.nbytes for t in parts)
        with self._union_lock:
            if self._partials is None:
                self._partials = draw.UnionCatalog(pa.schema([]), [])
            self._partials.load([(t, False) for t in parts])
            return strategy.extra_predicate(self._partials.catalog, None)

    def _sample_groups(self, strategy: Any, n: int, where: str | None, seed: int | None, cols: list[str] | None,
                       return_keys: bool) -> tuple[pa.Array, pa.Table | None]:
        """Whole groups (episodes), each on one shard (routed by group_id / episode_id): the shards'
        first groups merged."""
        if n == 0:
            keys, shard_of = pa.array([], pa.string()), np.zeros(0, np.int32)
        else:
            rec = {i: self._take_records(i) for i in range(self.num_shards)}
            parts = self._call(lambda s, i: s.top_groups.remote(n, where, strategy, seed, rec[i]))
            self.last_sample_bytes += sum(t.nbytes for t in parts)
            keys, shard_of, found = draw.merge_groups(parts, n, strategy.unit == "rows")
            strategy.check_enough(n, found, c.combine(where), "rows" if strategy.unit == "rows" else strategy.unit_name)
        if return_keys:
            self._record(keys, shard_of)
            return keys, None
        pos = draw.group_by_shard(shard_of, self.num_shards)
        # retried like a read: a retry after a restart may count a replay twice, never loses the sample
        got = self._call(lambda s, i: s.take.remote(keys.take(pa.array(pos[i])), cols), list(pos))
        self.last_sample_bytes += sum(t.nbytes for t in got)
        if not pos:
            empty = self.schema.empty_table()
            return keys, empty.select(cols) if cols is not None else empty
        return keys, draw.assemble(dict(zip(pos, got)), pos)

    def _record(self, keys: pa.Array, shard_of: np.ndarray) -> None:
        """Note which of each shard's keys were drawn; the shard counts them before its next call
        runs (a top-k call carries them, any other call is preceded by a ``record``), so every
        read sees them and a steady run of samples costs no call of its own to record."""
        for i, idx in draw.group_by_shard(shard_of, self.num_shards).items():
            self._unrecorded.setdefault(i, []).append(keys.take(pa.array(idx)))

    def _take_records(self, i: int) -> pa.Array | None:
        """Shard ``i``'s drawn keys not yet sent (and forget them: the caller sends them)."""
        parts = self._unrecorded.pop(i, None)
        return pa.concat_arrays(parts) if parts else None

    def _send_records(self, shards: Sequence[int]) -> None:
        """Send pending drawn keys ahead of a call (an actor runs one caller's calls in order)."""
        for i in shards:
            if (keys := self._take_records(i)) is not None:
                self._shards[i].record.remote(keys)

    def _union_catalog(self) -> draw.UnionCatalog:
        if self._union is None:
            schema = self.schema
            self._union = draw.UnionCatalog(schema, [m for m in metadata_columns(schema) if m != "policy_bucket"])
        return self._union

    def _sample_union(self, strategy: Any, n: int, where: str | None, seed: int | None, cols: list[str] | None,
                      return_keys: bool) -> tuple[pa.Array, pa.Table | None, str | None, Any]:
        parts = self._call(lambda s, i: s.meta.remote(where))
        self.last_sample_bytes += sum(t.nbytes + pr.nbytes for t, _, pr in parts)
        tagged = [(t.append_column("_shard", pa.array(np.full(t.num_rows, i, np.int32))), p)
                  for i, (t, p, _) in enumerate(parts)]
        with self._union_lock:
            union = self._union_catalog()
            payload = union.load(tagged, [pr for _, _, pr in parts])
            w = "_match" if payload else where
            keys = union.draw(strategy, n, w, seed)
        known = pa.concat_arrays([t.column("key").combine_chunks() for t, _ in tagged])
        shard_col = pa.concat_arrays([t.column("_shard").combine_chunks() for t, _ in tagged])
        shard_of = shard_col.take(pc.index_in(keys, value_set=known)).to_numpy(zero_copy_only=False)
        if return_keys:
            self._record(keys, shard_of)
            return keys, None, w, union.catalog
        pos = draw.group_by_shard(shard_of, self.num_shards)
        # retried like a read: a retry after a restart may count a replay twice, never loses the sample
        got = self._call(lambda s, i: s.take.remote(keys.take(pa.array(pos[i])), cols), list(pos))
        self.last_sample_bytes += sum(t.nbytes for t in got)
        rows = draw.assemble(dict(zip(pos, got)), pos)
        if not pos:
            rows = self.schema.empty_table()
            rows = rows.select(cols) if cols is not None else rows
        return keys, rows, w, union.catalog

    def get(self, keys: Sequence[str] | pa.Array, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows by key in the order given: every shard is asked for the keys it made."""
        arr = pa.array(key_list(keys), pa.string())
        cols = list(columns) if columns else None
        pos = draw.group_by_shard(self._shard_of_keys(arr), self.num_shards)
        got = self._call(lambda s, i: s.get.remote(arr.take(pa.array(pos[i])), cols), list(pos))
        if not pos:
            empty = self.schema.empty_table()
            return empty.select(cols) if cols else empty
        return draw.assemble(dict(zip(pos, got)), pos)

    def sql_shards(self, query: str) -> pa.Table:
        """Run ``query`` on every shard and concatenate (exact for row-wise queries, not for aggregates)."""
        return pa.concat_tables(self._call(lambda s, i: s.sql.remote(query)))

    def _lake_view(self):
        from ..lakeview import LakeView

        return LakeView(self.lake, storage_options=self.storage_options)

    def sql(self, query: str, params: list | dict | None = None) -> pa.Table:
        """Analytical SQL over all shards: snapshot them, then run ``query`` over the lake (exact)."""
        self.snapshot(wait=True)
        with self._lake_view() as view:
            return view.sql(query, params)

    def scan(self, where: str | None = None, columns: Sequence[str] | None = None,
             batch_size: int = 4096) -> Iterator[pa.RecordBatch]:
        """Stream every matching row once: snapshot the shards, then scan the lake (bounded memory)."""
        predicate.check(where)
        self.snapshot(wait=True)
        with self._lake_view() as view:
            yield from view.scan(where, columns, batch_size)

    def snapshot(self, wait: bool = True, progress: Any = None) -> list[Snapshot | None] | None:
        """Snapshot every shard: with ``wait`` one ``Snapshot`` per shard (None where nothing was
        new), after every commit; without, the snapshots are queued and None is returned."""
        got = self._call(lambda s, i: s.snapshot.remote(wait))
        return got if wait else None

    def flush(self) -> None:
        self._call(lambda s, i: s.flush.remote())

    def stats(self) -> dict:
        """``ReplayBuffer.stats``' totals (rows, per-tier rows/bytes) summed over shards, plus
        ``shards`` (each shard's own stats, with its node) and ``nodes`` (shards per node)."""
        per = self._call(lambda s, i: s.stats.remote())
        tiers = {t: {"rows": sum(p["tiers"][t]["rows"] for p in per), "bytes": sum(p["tiers"][t]["bytes"] for p in per)}
                 for t in ("hot", "warm", "cold")}
        nodes: dict[str, list[int]] = {}
        for p in per:
            nodes.setdefault(p["node"], []).append(p["shard"])
        return {"run_id": self.run_id, "path": str(self.root), "rows": sum(p["rows"] for p in per),
                "tiers": tiers, "nodes": nodes, "shards": per}

    def __len__(self) -> int:
        return self.count()

    def close(self) -> None:
        ray = _ray()
        try:
            self._call(lambda s, i: s.close.remote(), retry=False)
        finally:
            for s in self._shards:
                ray.kill(s, no_restart=True)
            _placement.release(ray, self._pg)
            self._pg = None
            for name in ("_union", "_partials"):
                if getattr(self, name) is not None:
                    getattr(self, name).close()
                    setattr(self, name, None)

    def __getstate__(self) -> dict:
        """Picklable (actor handles travel), so a producer task elsewhere can ``push`` (``route="local"``)."""
        state = dict(self.__dict__)
        state.pop("_union", None)
        state.pop("_partials", None)
        state.pop("_union_lock", None)
        state.pop("_unrecorded", None)  # the original sends them
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_local()

    def __enter__(self) -> ShardedReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
