"""Run configuration (full vs quick) and the state scenarios share within one run."""

from __future__ import annotations

import os
import shutil
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from . import data, limits
from .systems import close_store

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Config:
    """Sizes of one run. ``FULL`` follows the issues; ``QUICK`` keeps every code path under 60 s."""

    quick: bool
    budget_mb: int  # hot-tier / cache budget for every spilling system
    ingest_bytes: int  # payload rollouts pushed in ingest (and reused by get)
    batch_rows: int  # rows per push (one trainer step's worth)
    trials: int  # repeated trials, median reported
    sample_sizes: tuple[int, ...]  # metadata-only rollout counts for the sample scenario
    sample_trials: int  # max latency trials per (system, size)
    sample_max_s: float  # ... and the time cap after 5 trials
    meta_push_rows: int  # rows per lakebuffer push while building the metadata buffer
    deque_max_rows: int  # above this the RAM-only baseline is reported as out of budget
    get_trials: int
    snapshot_bytes: int
    rss_bytes: int
    memcpy_bytes: int
    disk_bytes: int
    s3_bytes: int
    scale_bytes: int = 16 << 30  # the scale scenario: every path at this size ...
    scale_budget_mb: int = 1024  # ... under this budget (issue 16)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


FULL = Config(
    quick=False,
    budget_mb=256,
    ingest_bytes=2_000_000_000,
    batch_rows=512,
    trials=3,
    sample_sizes=(100_000, 1_000_000, 10_000_000),
    sample_trials=200,
    sample_max_s=6.0,
    meta_push_rows=16_384,
    deque_max_rows=1_000_000,
    get_trials=50,
    snapshot_bytes=256_000_000,
    rss_bytes=1_000_000_000,
    memcpy_bytes=512 << 20,
    disk_bytes=1 << 30,
    s3_bytes=128 << 20,
)

QUICK = Config(
    quick=True,
    budget_mb=24,
    ingest_bytes=150_000_000,
    batch_rows=512,
    trials=1,
    sample_sizes=(100_000,),
    sample_trials=50,
    sample_max_s=1.5,
    meta_push_rows=16_384,
    deque_max_rows=1_000_000,
    get_trials=20,
    snapshot_bytes=16_000_000,
    rss_bytes=48_000_000,
    memcpy_bytes=128 << 20,
    disk_bytes=128 << 20,
    s3_bytes=16 << 20,
    scale_bytes=128 << 20,
    scale_budget_mb=8,
)


def error_entry(e: BaseException) -> dict[str, Any]:
    """What a system that failed reports instead of figures (the run goes on)."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else ""
    return {"error": f"{type(e).__name__}: {e}"[:500], "at": where}


@dataclass
class Context:
    """Shared within a run: the generated payload, the S3 server, limits, stores kept for ``get``."""

    cfg: Config
    progress: Progress | None = None
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="lakebuffer-bench-", dir=os.environ.get("LAKEBUFFER_BENCH_DIR"))))
    limits: dict[str, dict[str, Any]] = field(default_factory=dict)
    stores: dict[str, Any] = field(default_factory=dict)
    steps_total: int = 0
    steps_done: int = 0
    _payload: list[pa.Table] | None = None
    _s3: Any = None
    _n: int = 0

    def say(self, message: str, advance: bool = False) -> None:
        if advance:
            self.steps_done += 1
        if self.progress is not None:
            self.progress(message, self.steps_done, self.steps_total)

    def payload(self) -> list[pa.Table]:
        """The ingest rollouts, generated once and shared by every system and trial."""
        if self._payload is None:
            self.say(f"generating {self.cfg.ingest_bytes / 1e9:.2f} GB of rollouts")
            self._payload = data.generate(self.cfg.ingest_bytes, batch_rows=self.cfg.batch_rows)
        return self._payload

    def s3(self) -> Any:
        if self._s3 is None:
            from .s3 import MotoServer

            self._s3 = MotoServer().start()
        return self._s3

    def tmp(self, name: str) -> Path:
        self._n += 1
        p = self.workdir / f"{self._n:03d}-{name}"
        p.mkdir(parents=True)
        return p

    def limit(self, name: str) -> dict[str, Any]:
        """A physical limit (``memcpy``, ``disk``, ``s3``), measured once per run on first use."""
        if name not in self.limits:
            cfg = self.cfg
            trials = max(cfg.trials, 3) if not cfg.quick else 2
            self.say(f"limit: {name}")
            try:
                if name == "memcpy":
                    self.limits[name] = limits.memcpy(cfg.memcpy_bytes, trials=5)
                elif name == "disk":
                    self.limits[name] = limits.disk(self.workdir, cfg.disk_bytes, trials=trials)
                elif name == "s3":
                    self.limits[name] = limits.s3(self.s3(), cfg.s3_bytes, trials=trials)
            except Exception as e:
                self.limits[name] = error_entry(e)
        return self.limits[name]

    def drop_store(self, name: str) -> None:
        store = self.stores.pop(name, None)
        if store is not None:
            close_store(store, getattr(store, "root", None))

    def close(self) -> None:
        for name in list(self.stores):
            self.drop_store(name)
        if self._s3 is not None:
            self._s3.stop()
            self._s3 = None
        self._payload = None
        shutil.rmtree(self.workdir, ignore_errors=True)
