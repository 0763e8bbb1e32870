"""The shard actor body: one ``ReplayBuffer`` plus the calls the coordinator needs.

Sampling calls never record replays themselves: the coordinator chooses the keys over every
shard, then tells each shard which of its keys were drawn (``record`` / ``take``), so
``sample_count`` (``max_reuse``) and the ``replays`` table count only what was really drawn.

Each shard's directory is node-local: ``<root>/node-<node id>/shard<i>``. On one machine (a loopback
test cluster) that still separates the nodes' disks, so a shard restarted on another node finds an
empty directory and resumes from the lake (``ReplayBuffer.open(dir, lake=, run_id=)``), as it
would on a real cluster; restarted on its own node it reopens its directory (WAL + warm recovery).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import os
import time
from collections import Counter, deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import predicate
from .. import samplers as _samplers
from ..errors import LakeBufferError
from ..resources import render_sql
from ..results import Snapshot
from ..samplers import _common as c
from ..samplers.base import Sampler
from .draw import PARTIALS


class ShardError(LakeBufferError, RuntimeError):
    """A shard actor failed or died while serving a call (the call's rows were not acknowledged)."""


def node_id() -> str:
    """The Ray node this process runs on (hex), or ``local`` outside Ray."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() or "local"
    except Exception:  # noqa: BLE001 - no Ray context: one machine
        return "local"


def reconstructed() -> bool:
    """True in an actor Ray restarted (its previous incarnation is dead, so its lake claim is stale)."""
    try:
        import ray

        return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # noqa: BLE001 - no Ray context
        return False


def shard_dir(root: str, index: int, node: str) -> Path:
    """Where shard ``index`` keeps its files on ``node`` (node-local: a node's own subdirectory)."""
    return Path(root) / f"node-{node[:16]}" / f"shard{index}"


class Shard:
    """The actor body (``ray.remote(**opts)(Shard)``); also usable in-process."""

    def __init__(self, root: str, index: int, open_kwargs: dict, durable: bool = False) -> None:
        from ..buffer import ReplayBuffer

        self.index = index
        self.node = node_id()
        self.path = shard_dir(root, index, self.node)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.durable = durable
        self.calls: Counter[str] = Counter()  # sampling calls served (round trips per global sample)
        #: per top-k call served: (wall s, CPU s, s in GC pauses), the newest 4,096 (benchmarks)
        self._served: deque[tuple[float, float, float]] = deque(maxlen=4096)
        self._gc_s, self._gc_t0 = 0.0, 0.0
        gc.callbacks.append(self._on_gc)
        # a restart (on another node after a node loss) takes over the run from its dead incarnation
        kw = {**open_kwargs, "takeover": True} if reconstructed() else open_kwargs
        self.buf = ReplayBuffer.open(self.path, **kw)

    # writes -------------------------------------------------------------------------------
    def push(self, table: pa.Table, floor: int = 0) -> pa.Array:
        """Push; with ``durable`` the rows are in the lake before the call returns (no loss window).

        ``floor``: the coordinator's next key number for this shard, so a shard that lost rows with
        its node never reissues a key it acknowledged for one of them."""
        if floor:
            self.buf.index.advance_keys(floor)
        keys = self.buf.push(table)
        if self.durable:
            self.buf.snapshot(wait=True)
        return keys

    def update_priority(self, keys: pa.Array, priority: np.ndarray) -> int:
        return self.buf.update_priority(keys, priority)

    def delete(self, keys: list[str] | None, where: str | None) -> int:
        return self.buf.delete(keys=keys, where=where)

    def record(self, keys: pa.Array) -> None:
        """Count one replay of each key (repeats count again), as ``ReplayBuffer.sample`` does."""
        self.calls["record"] += 1
        self.buf.record_replays(keys)

    # reads ----------------------------------------------------------------------------------
    def count(self, where: str | None) -> int:
        return self.buf.count(where)

    def schema(self) -> pa.Schema:
        return self.buf.schema

    def meta(self, where: str | None) -> tuple[pa.Table, bool, pa.Table]:
        """Every live row's metadata, whether it has a ``_match`` column (when ``where`` needs
        payload columns: evaluated here, where the payload is), and the priorities
        ``update_priority`` set here (key, priority)."""
        self.calls["meta"] += 1
        cat = self.buf.catalog
        pred = predicate.check(where)
        cat.sync()
        prios = cat.query(render_sql("shard_priorities"), sync=False)
        if pred == "TRUE" or cat.source_for(pred) == "meta":
            return cat.query(render_sql("shard_meta")), False, prios
        return cat.query(render_sql("shard_meta_match", where=pred)), True, prios

    def partial(self, template: str, where: str | None) -> pa.Table:
        """A filter sampler's partial result here (``draw.partial_of``): ``template`` (one of
        ``draw.PARTIALS``) over this shard's rows matching ``where``."""
        if template not in PARTIALS:
            raise ValueError(f"not a shard partial: {template!r}")
        self.calls["partial"] += 1
        cat = self.buf.catalog
        pred = predicate.check(where)
        cat.sync()
        with cat.lock, cat.counts_deferred():
            source, full = c.resolve(cat, pred)
            return cat.query(render_sql(template, source=source, where=full), sync=False)

    def top(self, k: int, where: str | None, seed: int, columns: list[str] | None, count: bool,
            record: pa.Array | None = None) -> dict[str, Any]:
        """The ``k`` matching rows of smallest seeded key hash (``UniformSampler``'s order), with
        ``h``, the requested columns, whether fewer than ``k`` exist, and (``count``) how many match.
        ``record``: keys earlier draws took from this shard, counted first (see ``record``)."""
        with self._serving(where, record) as (cat, source, full):
            rows, exhausted = c.smallest_by_hash(
                cat, k, template="sample_threshold",
                fields={"source": source, "where": full, "h": c.key_hash(cat, source, seed)},
                cache_key=("uniform", id(cat), source, c.shape_of(full)),
                count=lambda: c.count_rows(cat, source, full),
            )
            rows = rows.slice(0, k)
            total = c.count_rows(cat, source, full) if count else None
        return self._with_columns(rows, k, columns, exhausted) | {"total": total}

    def top_weighted(self, k: int, where: str | None, strategy: Any, seed: int,
                     columns: list[str] | None, record: pa.Array | None = None) -> dict[str, Any]:
        """The ``k`` rows a ``WeightedSampler`` without replacement ranks first here (its
        Efraimidis-Spirakis key as ``h``; this shard's ``update_priority`` values apply)."""
        with self._serving(where, record) as (cat, source, full):
            sql = render_sql("shard_weighted_top", source=source, where=full, n=k, u=c.uniform01("hh"),
                             h=c.key_hash(cat, source, seed), logw=strategy.log_weight(cat, source, full))
            rows = cat.query(sql, sync=False)
        return self._with_columns(rows, k, columns, False) | {"total": None}

    @contextlib.contextmanager
    def _serving(self, where: str | None, record: pa.Array | None) -> Iterator[tuple[Any, str, str]]:
        """A top-k call's common part: counted and timed, earlier draws recorded, the catalog
        synced and locked with replay counts deferred; yields (catalog, source, checked where)."""
        self.calls["top"] += 1
        t0, c0, g0 = time.perf_counter(), time.process_time(), self._gc_s
        if record is not None:
            self.buf.record_replays(record)
        cat = self.buf.catalog
        pred = predicate.check(where)
        cat.sync()
        with cat.lock, cat.counts_deferred():
            yield (cat, *c.resolve(cat, pred))
        self._served.append((time.perf_counter() - t0, time.process_time() - c0, self._gc_s - g0))

    def top_groups(self, n: int, where: str | None, strategy: Any, seed: int | None,
                   record: pa.Array | None = None) -> pa.Table:
        """This shard's first ``n`` groups (rows: enough groups for ``n`` rows) as ``strategy`` (a
        ``GroupSampler``) orders them for ``seed``: ``key``, ``g`` (the group) and ``gh`` (its
        seeded hash), in the sampler's order; fewer when this shard has fewer. ``record``: as ``top``."""
        self.calls["top"] += 1
        if record is not None:
            self.buf.record_replays(record)
        part = copy.copy(strategy)
        part.allow_fewer = True
        cat = self.buf.catalog
        cat.sync()
        with cat.counts_deferred():
            keys = _samplers.draw(part, cat, n, where, seed)
            gh = c.value_hash([strategy.by], Sampler.seed_from(np.random.default_rng(seed)))
            found = cat.query(render_sql("shard_group_of", by=strategy.by, gh=gh), sync=False,
                              wanted=pa.table({"key": keys}))
        return found.take(pc.index_in(keys, value_set=found.column("key")))

    def _with_columns(self, rows: pa.Table, k: int, columns: list[str] | None, exhausted: bool) -> dict[str, Any]:
        keys = rows.column("key").combine_chunks()
        out = pa.table({"key": keys, "h": rows.column("h").combine_chunks()})
        if columns is None or columns:
            got = self.buf.get(keys, columns)
            for name in got.column_names:
                if name not in out.column_names:
                    out = out.append_column(name, got.column(name))
        return {"rows": out, "exhausted": bool(exhausted or rows.num_rows < k)}

    def get(self, keys: list[str] | pa.Array, columns: list[str] | None) -> pa.Table:
        return self.buf.get(keys, columns)

    def find(self, keys: pa.Array, columns: list[str] | None) -> pa.Table:
        """The rows of those ``keys`` this shard holds (the others are skipped, not an error)."""
        cat = self.buf.catalog
        held = cat.query(render_sql("shard_known_keys"), wanted=pa.table({"key": keys})).column("key")
        return self.buf.get(held.combine_chunks(), columns)

    def take(self, keys: pa.Array, columns: list[str] | None) -> pa.Table:
        """Record one replay of each key, then return their rows (``ReplayBuffer.sample``'s order)."""
        self.calls["take"] += 1
        self.record(keys)
        return self.buf.get(keys, columns)

    def sql(self, query: str) -> pa.Table:
        return self.buf.sql(query)

    def snapshot(self, wait: bool = True) -> Snapshot | None:
        return self.buf.snapshot(wait=wait)

    def flush(self) -> None:
        self.buf.flush()

    def set_policy_version(self, version: int | None, step: int | None) -> None:
        self.buf.set_policy_version(version, step)

    def stats(self) -> dict:
        return self.buf.stats() | {"node": self.node, "shard": self.index}

    def call_counts(self) -> dict[str, int]:
        return dict(self.calls)

    def served(self) -> list[tuple[float, float, float]]:
        """(wall s, CPU s, GC pause s) of each top-k call served, oldest first (where a global
        sample's tail comes from: this shard's own cost vs scheduling and transfer)."""
        return list(self._served)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            self._gc_s += time.perf_counter() - self._gc_t0

    def where(self) -> tuple[str, int]:
        """(node id, pid): where this shard runs now."""
        return self.node, os.getpid()

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)
        self.buf.close()
