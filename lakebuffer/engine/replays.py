"""Replay events: which rollout was replayed, by which policy version / trainer step, and when.

``sample_count`` says how often a rollout was replayed, not how stale it was when it was: policy
lag is a property of the replay (replaying version - rollout version), so each ``sample`` records
one event per key drawn. The catalog holds the events in its ``replays`` table (queryable in
``sql()``); this module makes them durable as append-only Arrow IPC segments under
``<dir>/replays/``, written on the low-priority worker like replay counts, and loads them on open.

Events stay in the buffer's directory, not the lake: the lake's snapshot path (engine/snapshots,
lake/) carries rollouts only; shipping events beside them is a follow-up there.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from ..catalog import Catalog
from ..tiers.wal import fsync_path
from .tasks import P0, TaskQueue

#: The ``replays`` table: one row per replayed key (a key drawn twice in one sample is two events).
REPLAY_SCHEMA = pa.schema([
    ("key", pa.string()),
    ("replay_version", pa.int64()),  # the policy version that replayed it (``set_policy_version``)
    ("replay_step", pa.int64()),     # the trainer step, if given
    ("replayed_at", pa.timestamp("us", tz="UTC")),
])

#: Past this many segment files, open merges them into one (a long run samples thousands of times).
MERGE_AT = 64


class ReplayLog:
    """Records replay events into the catalog and persists them under ``path`` in the background."""

    def __init__(self, path: Path, catalog: Catalog, tasks: TaskQueue) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.catalog, self.tasks = catalog, tasks
        self.version: int | None = None
        self.step: int | None = None
        self._lock = threading.Lock()
        self._pending: list[pa.Table] = []
        self._queued = False
        self._seq = 0

    def set_policy_version(self, version: int | None, step: int | None = None) -> None:
        """The policy (and step) that replays from now on; recorded with every later ``sample``."""
        self.version = None if version is None else int(version)
        self.step = None if step is None else int(step)

    def record(self, keys: pa.Array) -> None:
        """One event per key drawn: into the catalog now, to disk on the p0 worker."""
        n = len(keys)
        if n == 0:
            return
        now = np.datetime64(time.time_ns() // 1000, "us")
        events = pa.table({
            "key": keys.cast(pa.string()),
            "replay_version": pa.nulls(n, pa.int64()) if self.version is None else pa.array(np.full(n, self.version)),
            "replay_step": pa.nulls(n, pa.int64()) if self.step is None else pa.array(np.full(n, self.step)),
            "replayed_at": pa.array(np.full(n, now), pa.timestamp("us")).cast(pa.timestamp("us", tz="UTC")),
        }, schema=REPLAY_SCHEMA)
        self.catalog.add_replay_events(events)
        with self._lock:
            self._pending.append(events)
            if self._queued:
                return  # the queued write takes these too
            self._queued = True
        self.tasks.submit(P0, self._write, name="persist replay events")

    def _write(self) -> None:
        with self._lock:
            batch, self._pending, self._queued = self._pending, [], False
        if batch:
            self._write_segment(pa.concat_tables(batch))

    def _write_segment(self, table: pa.Table) -> None:
        """Write to a temporary name, fsync, rename: a segment is whole or absent after a crash."""
        self._seq += 1
        name = f"{time.time_ns():020d}-{os.getpid()}-{self._seq:06d}.arrow"
        tmp = self.path / f".{name}.tmp"
        with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, REPLAY_SCHEMA) as w:
            w.write_table(table)
        fsync_path(tmp)
        os.replace(tmp, self.path / name)

    def load(self) -> int:
        """Load persisted events into the catalog (merging many segments into one); how many."""
        for tmp in self.path.glob(".*.tmp"):
            tmp.unlink()  # a write a crash interrupted: its events were never on disk whole
        files = sorted(self.path.glob("*.arrow"))
        if not files:
            return 0
        tables = []
        for f in files:
            with pa.memory_map(str(f)) as source:
                tables.append(ipc.open_file(source).read_all())
        events = pa.concat_tables(tables)
        if len(files) > MERGE_AT:
            self._write_segment(events)  # the merged copy is durable before the parts go
            for f in files:
                f.unlink()
        self.catalog.add_replay_events(events)
        return events.num_rows
