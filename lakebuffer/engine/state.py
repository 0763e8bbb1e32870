"""The parts of one open buffer that the engine modules share, and the lock that orders them.

One lock (``lock``) covers the index's batch records, the hot tier and the warm version readers
see, so they change together: no reader ever sees a row twice or not at all. Engine modules take
this object instead of reaching into the facade.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..catalog import Catalog
from ..index import BatchInfo, KeyIndex
from ..lake.runtime import NativeLock
from ..tiers import HotTier, WarmTier, WriteAheadLog
from ..tiers.cold import ColdTier
from .readgate import ReadGate
from .tasks import TaskQueue


@dataclass
class BufferState:
    path: Path
    run_id: str
    schema: pa.Schema
    meta_columns: list[str]
    durability: str
    index: KeyIndex
    hot: HotTier
    warm: WarmTier
    wal: WriteAheadLog
    catalog: Catalog
    tasks: TaskQueue
    lock: NativeLock = field(default_factory=lambda: NativeLock("buffer state", refuse=False))  # exit waits for holders
    batches: dict[int, BatchInfo] = field(default_factory=dict)
    cold: ColdTier | None = None  # rows only the lake holds (``engine/diskbudget`` moves them there)
    served: dict[str, int] = field(default_factory=lambda: {"hot": 0, "warm": 0, "cold": 0})  # rows ``get`` read, per tier
    on_cold_read: Callable[[list[int]], None] | None = None  # told the cold batches a read served (promotion)
    gate: ReadGate = field(default_factory=ReadGate)  # sample/get shared, delete exclusive (engine/readgate)
    #: batches a snapshot step is uploading now (``engine/snapshots``): a delete of their rows leaves a
    #: tombstone, as for snapshotted rows, so rows the step read before the delete leave the lake next time
    uploading: set[int] = field(default_factory=set)
    #: when the last cold read ended (``time.monotonic``) and how many run now: background warming
    #: yields to cold reads, also to one still in flight (a first read from S3 takes seconds)
    last_cold_read: float = 0.0
    cold_reads_running: int = 0
    cold_reads_lock: threading.Lock = field(default_factory=threading.Lock)  # for the two above

    def meta_of(self, batch_id: int, table: pa.Table) -> pa.Table:
        """The catalog rows of a batch: its metadata columns plus ``_batch``."""
        return with_batch(table.select(self.meta_columns), batch_id)


def with_batch(meta: pa.Table, batch_id: int) -> pa.Table:
    """``meta`` with the ``_batch`` column the catalog keeps per row."""
    return meta.append_column("_batch", pa.array(np.full(meta.num_rows, batch_id, dtype=np.int64)))
