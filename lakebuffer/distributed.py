"""Scale-out on Ray: N actors, each owning one ``ReplayBuffer`` shard, all snapshotting into one lake.

Rows are routed by a hash of ``group_id`` (default: a GRPO group stays on one shard, so the
``group`` sampler still returns whole groups), of ``episode_id``, round-robin, or to a fixed shard.
``sample`` draws globally: every shard counts the rows matching the predicate, ``n`` is split in
proportion (largest remainder, deterministic), the shards sample in parallel and the Arrow tables
are concatenated. Tables travel through Ray's object store as Arrow buffers, never as Python rows.

Each shard's rows go to the lake under their own run id, ``<run_id>-shard<i>``, so shards never
contend for a manifest and ``ReplayBuffer.open_lake`` sees all of them as runs. A shard actor that
dies is restarted by Ray (``max_restarts``) and reopens its directory (WAL + warm recovery) or, on a
fresh node, restores from the lake; calls in flight to it raise ``ShardError``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .errors import LakeBufferError
from .results import Snapshot
from .schema import key_list, to_table


class ShardError(LakeBufferError, RuntimeError):
    """A shard actor failed or died while serving a call (the call's rows were not acknowledged)."""


def _ray():
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("lakebuffer.distributed needs Ray: pip install 'lakebuffer[ray]'") from e
    return ray


class _Shard:
    """The actor body: a ReplayBuffer plus the few calls the coordinator needs."""

    def __init__(self, path: str, open_kwargs: dict) -> None:
        from .buffer import ReplayBuffer

        self.buf = ReplayBuffer.open(path, **open_kwargs)

    def push(self, table: pa.Table) -> pa.Array:
        return self.buf.push(table)

    def count(self, where: str | None) -> int:
        return self.buf.count(where)

    def schema(self) -> pa.Schema:
        return self.buf.schema

    def sample(self, n: int, kwargs: dict) -> pa.Table | pa.Array:
        return self.buf.sample(n, **kwargs)

    def get(self, keys: list[str], columns: list[str] | None) -> pa.Table:
        return self.buf.get(keys, columns)

    def sql(self, query: str) -> pa.Table:
        return self.buf.sql(query)

    def delete(self, keys: list[str] | None, where: str | None) -> int:
        return self.buf.delete(keys=keys, where=where)

    def snapshot(self) -> Snapshot | None:
        return self.buf.snapshot(wait=True)

    def flush(self) -> None:
        self.buf.flush()

    def stats(self) -> dict:
        return self.buf.stats()

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.buf.close()


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
    # never ask a shard for more than it has
    return [int(min(b, w)) for b, w in zip(base, weights)]


class ShardedReplayBuffer:
    """The ``ReplayBuffer`` API (push/sample/get/sql/delete/snapshot/stats/close) over N Ray actors.

    A ``RolloutReader``: ``sql`` and ``scan`` read the lake after a snapshot of every shard (exact
    across shards); ``count``, ``sample`` and ``get`` ask the shards.
    """

    def __init__(
        self,
        num_shards: int,
        root: str | os.PathLike,
        lake: str | None = None,
        *,
        route: str = "group_id",
        run_id: str | None = None,
        max_restarts: int = 3,
        actor_options: dict | None = None,
        **open_kwargs: Any,
    ) -> None:
        ray = _ray()
        if not ray.is_initialized():
            ray.init()
        if route not in ("group_id", "episode_id", "key", "round_robin") and not route.startswith("shard:"):
            raise ValueError("route must be group_id, episode_id, key, round_robin or shard:<i>")
        self.num_shards = int(num_shards)
        self.root = Path(root)
        self.run_id = run_id or self.root.resolve().name
        self.lake = lake or str(self.root / "lake")
        self.route = route
        self.storage_options = open_kwargs.get("storage_options")
        self._rr = 0
        self._schema: pa.Schema | None = None
        opts = {"max_restarts": max_restarts, "max_task_retries": 0, "num_cpus": 0, **(actor_options or {})}
        actor = ray.remote(**opts)(_Shard)
        self._shards = []
        for i in range(self.num_shards):
            kw = {**open_kwargs, "lake": self.lake, "run_id": f"{self.run_id}-shard{i}"}
            self._shards.append(actor.remote(str(self.root / f"shard{i}"), kw))
        self._call(lambda s: s.pid.remote())  # wait until every shard is open

    # plumbing ---------------------------------------------------------------------------
    def _get(self, refs: list) -> list:
        ray = _ray()
        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as e:
            raise ShardError(f"a shard actor died during the call (it is being restarted): {e}") from e
        except ray.exceptions.RayTaskError as e:
            cause = e.as_instanceof_cause() if hasattr(e, "as_instanceof_cause") else e
            if isinstance(cause, LakeBufferError):
                raise cause from None
            raise ShardError(f"a shard failed: {e}") from e

    def _call(self, fn) -> list:
        return self._get([fn(s) for s in self._shards])

    @property
    def shards(self) -> list:
        """The actor handles (e.g. to kill one in a fault test)."""
        return list(self._shards)

    def _route(self, table: pa.Table) -> np.ndarray:
        n = table.num_rows
        if self.route == "round_robin":
            out = (np.arange(n) + self._rr) % self.num_shards
            self._rr = (self._rr + n) % self.num_shards
            return out
        if self.route.startswith("shard:"):
            return np.full(n, int(self.route.split(":", 1)[1]) % self.num_shards)
        col = self.route if self.route != "group_id" or "group_id" in table.column_names else "prompt_id"
        if col not in table.column_names:
            raise ValueError(f"route={self.route!r} needs column {col!r} in pushed batches")
        import polars as pl

        hashes = pl.from_arrow(table.column(col)).cast(pl.Utf8).hash(seed=0).to_numpy()
        return (hashes % np.uint64(self.num_shards)).astype(np.int64)

    # API --------------------------------------------------------------------------------
    def push(self, batch: Any) -> pa.Array:
        """Route rows to shards (one call per shard, in parallel); keys in the input's row order."""
        table = to_table(batch)
        dest = self._route(table)
        refs, parts = [], []
        for i in range(self.num_shards):
            idx = np.flatnonzero(dest == i)
            if len(idx):
                refs.append(self._shards[i].push.remote(table.take(pa.array(idx))))
                parts.append(idx)
        results = self._get(refs)
        keys = pa.concat_arrays([r.combine_chunks() if isinstance(r, pa.ChunkedArray) else r for r in results])
        order = np.argsort(np.concatenate(parts), kind="stable")
        return keys.take(pa.array(order))

    def counts(self, where: str | None = None) -> list[int]:
        """Matching rows per shard."""
        return self._call(lambda s: s.count.remote(where))

    def count(self, where: str | None = None) -> int:
        """Matching rows over all shards."""
        return int(sum(self.counts(where)))

    @property
    def schema(self) -> pa.Schema:
        """The shards' rollout schema (they are opened with the same options)."""
        if self._schema is None:
            self._schema = self._get([self._shards[0].schema.remote()])[0]
        return self._schema

    def sample(
        self,
        n: int,
        where: str | None = None,
        sampler: Any = "uniform",
        columns: Sequence[str] | None = None,
        seed: int | None = 0,
        return_keys: bool = False,
        **options: Any,
    ) -> pa.Table | pa.Array:
        """Global sampling: ``n`` split over shards by their matching-row counts."""
        from .errors import NotEnoughRowsError

        counts = self.counts(where)
        if sum(counts) < n:
            raise NotEnoughRowsError(f"asked for {n} rollouts but only {sum(counts)} match where={where!r} on all shards")
        per = split_counts(n, counts)
        base = 0 if seed is None else int(seed)
        refs = []
        for i, k in enumerate(per):
            if k:
                kw = {"where": where, "sampler": sampler, "columns": columns, "seed": base * 1_000_003 + i,
                      "return_keys": return_keys, **options}
                refs.append(self._shards[i].sample.remote(k, kw))
        parts = self._get(refs)
        if return_keys:
            return pa.concat_arrays([p.combine_chunks() if isinstance(p, pa.ChunkedArray) else p for p in parts])
        return pa.concat_tables(parts)

    def get(self, keys: Sequence[str] | pa.Array, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows by key: every shard is asked for the keys whose prefix names it."""
        keys = key_list(keys)
        by_shard: dict[int, list[int]] = {}
        for j, k in enumerate(keys):
            prefix = k.rsplit("-", 1)[0]
            if not prefix.startswith(f"{self.run_id}-shard"):
                raise KeyError(f"key {k!r} was not made by this sharded buffer")
            by_shard.setdefault(int(prefix.rsplit("shard", 1)[1]), []).append(j)
        refs, order = [], []
        for i, idx in sorted(by_shard.items()):
            refs.append(self._shards[i].get.remote([keys[j] for j in idx], list(columns) if columns else None))
            order += idx
        table = pa.concat_tables(self._get(refs))
        return table.take(pa.array(np.argsort(np.asarray(order), kind="stable")))

    def sql_shards(self, query: str) -> pa.Table:
        """Run ``query`` on every shard and concatenate (exact for row-wise queries, not for aggregates)."""
        return pa.concat_tables(self._call(lambda s: s.sql.remote(query)))

    def _lake_view(self):
        from .lakeview import LakeView

        return LakeView(self.lake, storage_options=self.storage_options)

    def sql(self, query: str, params: list | dict | None = None) -> pa.Table:
        """Analytical SQL over all shards: snapshot them, then run ``query`` over the lake (exact)."""
        self.snapshot()
        with self._lake_view() as view:
            return view.sql(query, params)

    def scan(self, where: str | None = None, columns: Sequence[str] | None = None,
             batch_size: int = 4096) -> Iterator[pa.RecordBatch]:
        """Stream every matching row once: snapshot the shards, then scan the lake (bounded memory)."""
        self.snapshot()
        with self._lake_view() as view:
            yield from view.scan(where, columns, batch_size)

    def delete(self, keys: Sequence[str] | None = None, where: str | None = None) -> int:
        return int(sum(self._call(lambda s: s.delete.remote(list(keys) if keys is not None else None, where))))

    def snapshot(self) -> list[Snapshot | None]:
        return self._call(lambda s: s.snapshot.remote())

    def flush(self) -> None:
        self._call(lambda s: s.flush.remote())

    def stats(self) -> dict:
        per = self._call(lambda s: s.stats.remote())
        return {"shards": per, "rows": sum(p["rows"] for p in per)}

    def __len__(self) -> int:
        return self.count()

    def close(self) -> None:
        ray = _ray()
        try:
            self._call(lambda s: s.close.remote())
        finally:
            for s in self._shards:
                ray.kill(s, no_restart=True)

    def __enter__(self) -> ShardedReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
