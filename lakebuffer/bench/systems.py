"""The systems under test behind one small store surface: lakebuffer (public API only) and how
every scenario builds, fills and disposes of a payload store, so no scenario repeats that."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from . import baselines as bl
from .timing import median, percentile

PAYLOAD_SYSTEMS = ("lakebuffer", "lakebuffer_memory", "rocksdb_pickle", "deque", "torchrl")
BASELINES = ("rocksdb_pickle", "deque", "torchrl")
SAMPLE_N = 256  # rows per sample / get call in every scenario
REWARD_GT = 0.5  # the reward threshold of every scenario's predicate


def where(reward_gt: float, version_ge: int) -> str:
    return f"reward > {reward_gt} AND policy_version >= {version_ge}"


class LakeBufferStore:
    """``lb.ReplayBuffer.open(dir, memory_limit_mb=budget, snapshot_interval_s=0, ...)``.

    Periodic snapshots are off so a background upload never lands inside another scenario's
    timing; the snapshot scenario calls ``snapshot(wait=True)`` itself.
    """

    name = "lakebuffer"

    def __init__(self, root: Path, budget_mb: float, *, durability: str | None = None, **open_kw: Any) -> None:
        import lakebuffer as lb

        kw: dict[str, Any] = {"memory_limit_mb": budget_mb, "snapshot_interval_s": 0, **open_kw}
        if durability is not None:
            kw["durability"] = durability
        self.root = Path(root)
        self.buf = lb.ReplayBuffer.open(str(self.root), **kw)

    def prepare(self, table: pa.Table) -> pa.Table:
        """The generated rows minus ``key`` and ``run_id``, which the buffer assigns itself.

        The buffer stamps its own run_id (another run's is refused), and generated keys are the
        default path: caller-supplied keys add a duplicate check against the index on every push.
        """
        return table.drop_columns([c for c in ("key", "run_id") if c in table.column_names])

    def push(self, table: pa.Table) -> None:
        self.buf.push(table)

    def finish(self) -> None:
        self.buf.flush()

    def sample_keys(self, n: int, reward_gt: float, version_ge: int, seed: int) -> Any:
        try:
            return self.buf.sample(n, where=where(reward_gt, version_ge), seed=seed, return_keys=True)
        except TypeError:  # an API without return_keys: the narrowest projection instead
            return self.buf.sample(n, where=where(reward_gt, version_ge), seed=seed, columns=["key"]).column("key")

    def get(self, keys: Any, column: str) -> int:
        return self.buf.get(keys, columns=[column]).column(column).nbytes

    def footprint(self) -> dict[str, Any]:
        s = self.buf.stats()
        hot, warm = s.get("hot", {}), s.get("warm", {})
        return {
            "rows": s.get("rows"),
            "ram_bytes": hot.get("bytes"),
            "disk_bytes": warm.get("bytes"),
            "warm_fragments": warm.get("fragments"),
            "wal_bytes": s.get("wal", {}).get("bytes"),
        }

    def stats(self) -> dict[str, Any]:
        return self.buf.stats()

    def close(self) -> None:
        self.buf.close()


def payload_factory(name: str, rows: int, budget_mb: int) -> Callable[[Path], Any] | str:
    """How to build system ``name`` for a payload of ``rows`` rows, or why it can't be built."""
    if name == "lakebuffer":
        return lambda root: LakeBufferStore(root, budget_mb)
    if name == "lakebuffer_memory":
        return lambda root: LakeBufferStore(root, budget_mb, durability="memory")
    if name == "rocksdb_pickle":
        return lambda root: bl.RocksPickleStore(root, budget_mb << 20)
    if name == "deque":
        return lambda root: bl.DequeStore(root, budget_mb << 20)
    if name == "torchrl":
        reason = bl.torch_available()
        return reason if reason else (lambda root: bl.TorchRLStore(root, rows))
    raise KeyError(name)


def ingest_once(store: Any, tables: list[pa.Table]) -> dict[str, Any]:
    """Push every batch; only ``push`` and the final ``finish`` are timed."""
    pushes: list[float] = []
    for t in tables:
        item = store.prepare(t)
        t0 = time.perf_counter()
        store.push(item)
        pushes.append(time.perf_counter() - t0)
        del item
    t0 = time.perf_counter()
    store.finish()
    finish = time.perf_counter() - t0
    return {"seconds": sum(pushes) + finish, "finish_s": finish, "push_p50_ms": median(pushes) * 1e3, "push_p99_ms": percentile(pushes, 99) * 1e3}


def close_store(store: Any, root: Path | None) -> None:
    """Close ``store`` (a failure to close is not a benchmark figure) and remove its directory."""
    if store is not None:
        try:
            store.close()
        except Exception:
            pass
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
