"""The options of ``ReplayBuffer.open``, as one frozen value validated in one place.

A frozen dataclass rather than loose keyword arguments: the engine parts receive one object that
cannot change under them, and every check (durability, positive budget, ...) happens before any
file is touched.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import pyarrow as pa

from .errors import OptionError

DURABILITY = ("wal", "memory")
DEFAULT_MEMORY_LIMIT_MB = 1024


#: how a fresh directory resumes a run from the lake (``ReplayBuffer.open``)
RESTORE_MODES = ("lazy", "cold", "eager")


@dataclass(frozen=True)
class BufferOptions:
    """See ``ReplayBuffer.open`` for what each option means."""

    lake: str | None = None
    memory_limit_mb: float | None = 1024  # None: the budget the run was last opened with (tools)
    snapshot_interval_s: float | None = 180
    storage_options: dict | None = None
    schema: pa.Schema | None = None
    run_id: str | None = None
    durability: str = "wal"
    sync: bool = False
    push_timeout_s: float = 60.0
    key_prefix: str | None = None
    takeover: bool = False
    duckdb_threads: int | None = None
    progress: Any = None
    max_rows: int | None = None
    max_policy_lag: int | None = None
    snapshot_max_rows: int | None = None  # per snapshot commit: a backlog is drained in steps
    snapshot_max_bytes: int | None = 512 * 2**20
    lake_timeout_s: float | None = 120.0  # overall deadline of one snapshot or restore
    evict: str = "lru"  # which hot batches leave RAM first (lakebuffer.tiers.eviction)
    disk_limit_gb: float | None = None  # local disk budget of the directory (engine/diskbudget); None: unlimited
    disk_free_floor_gb: float | None = None  # keep this free on the filesystem; None: 1 GB or 5 %, whichever is less
    promote_cold_reads: bool = False  # batches get/sample read from the lake come back to local disk (engine/promotion)
    restore: str = "lazy"  # a fresh directory's resume: "lazy" | "cold" (engine/resume) or "eager" (every row copied)


    def __post_init__(self) -> None:
        from .tiers.eviction import EvictionPolicy

        EvictionPolicy(self.evict)  # syntax now, before any file is touched; columns once the schema is known
        for name in ("disk_limit_gb", "disk_free_floor_gb"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0
                                  or (name == "disk_limit_gb" and v == 0)):
                raise OptionError(f"{name} must be a positive number of GB or None, not {v!r}")
        if not isinstance(self.promote_cold_reads, bool):
            raise OptionError(f"promote_cold_reads must be True or False, not {self.promote_cold_reads!r}")
        if self.restore not in RESTORE_MODES:
            raise OptionError(f"restore must be one of {', '.join(RESTORE_MODES)}, not {self.restore!r}")
        if self.lake_timeout_s is not None and not self.lake_timeout_s > 0:
            raise OptionError(f"lake_timeout_s must be positive or None, not {self.lake_timeout_s!r}")
        for name in ("snapshot_max_rows", "snapshot_max_bytes"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise OptionError(f"{name} must be a positive int or None, not {v!r}")
        for name in ("max_rows", "max_policy_lag"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise OptionError(f"{name} must be a non-negative int or None, not {v!r}")
        if self.durability not in DURABILITY:
            raise ValueError(f"durability must be one of {DURABILITY}, not {self.durability!r}")
        if self.memory_limit_mb is not None and self.memory_limit_mb <= 0:
            raise ValueError("memory_limit_mb must be positive")

    @property
    def memory_limit_bytes(self) -> int:
        return int((self.memory_limit_mb if self.memory_limit_mb is not None else DEFAULT_MEMORY_LIMIT_MB) * 2**20)

    @property
    def disk_limit_bytes(self) -> int | None:
        return None if self.disk_limit_gb is None else int(self.disk_limit_gb * 2**30)

    @property
    def disk_free_floor_bytes(self) -> int | None:
        return None if self.disk_free_floor_gb is None else int(self.disk_free_floor_gb * 2**30)

    @property
    def periodic_snapshots(self) -> bool:
        return bool(self.snapshot_interval_s and self.snapshot_interval_s > 0)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
