"""lakebuffer behind the same small store surface as the baselines, through its public API only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa


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
