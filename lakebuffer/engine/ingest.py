"""Push: validate a batch, give it keys, make it durable, then visible.

A batch that fits the hot tier's budget is written to the WAL (``durability="wal"``) and the index
before it enters the hot tier, so an acknowledged push survives kill -9; a batch larger than the
hot budget allows goes straight to the warm tier in chunks through the one install path, and a
failure half way undoes the chunks already stored (a push is all or nothing).
"""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import SchemaError
from ..index import BatchInfo
from ..schema import conform, to_table
from ..tiers import table_bytes
from .budget import EVICT_LOW, Budget
from .state import BufferState
from .writeback import WriteBack


def now_us() -> np.datetime64:
    return np.datetime64(time.time_ns() // 1000, "us")


class Ingest:
    def __init__(self, state: BufferState, budget: Budget, writeback: WriteBack, *, key_prefix: str,
                 push_timeout_s: float, disk: Any = None) -> None:
        self.s = state
        self.disk = disk  # ``DiskBudget``: room on local disk first (rows already in the lake leave)
        self.budget = budget
        self.writeback = writeback
        self.key_prefix = key_prefix
        self.push_timeout_s = push_timeout_s
        # generated keys are ``<prefix>-<seq>``; user keys may not take that form, so the two key
        # spaces are disjoint and a later generated key can never meet an earlier user key
        self._generated = f"^{re.escape(key_prefix)}-[0-9]+$"
        state.index.skip_generated(key_prefix)

    def push(self, batch: Any) -> pa.Array:
        """Store a batch; its keys (see ``ReplayBuffer.push``)."""
        table = self._conform(batch)
        run_id = self.s.run_id
        if table.num_rows and pc.any(pc.not_equal(table.column("run_id"), run_id)).as_py():
            raise SchemaError(f"column 'run_id' must be this buffer's run {run_id!r} (or absent)")
        if table.num_rows == 0:
            return pa.array([], pa.string())
        table = table.combine_chunks()
        nbytes = table_bytes(table)
        if self.disk is not None:
            self.disk.admit(nbytes)  # BackpressureError, nothing stored, when nothing can leave
        if nbytes > self.budget.hot_limit() * EVICT_LOW:
            self._push_direct(table)
        else:
            self._push_hot(table, nbytes)
        if self.disk is not None:
            self.disk.ahead(nbytes)  # past the high watermark: room is made in the background
        return table.column("key").combine_chunks()

    # validation ----------------------------------------------------------------------------
    def _generate_keys(self, n: int) -> pa.Array:
        seq = self.s.index.reserve_keys(n)
        nums = pc.cast(pa.array(np.arange(seq, seq + n, dtype=np.int64)), pa.string())
        return pc.binary_join_element_wise(self.key_prefix, pc.utf8_lpad(nums, 10, "0"), "-")

    def _conform(self, data: Any) -> pa.Table:
        s = self.s
        table = to_table(data)
        n = table.num_rows
        if "key" in table.column_names and table.column("key").null_count < n:
            given = table.column("key")
            keys = self._generate_keys(n) if given.null_count else None
            table = conform(table, s.schema, run_id=s.run_id, now=now_us(), keys=keys)
            user_keys = pc.drop_null(given).cast(pa.string())
            taken = pc.match_substring_regex(user_keys, self._generated)
            if pc.any(taken).as_py():
                bad = user_keys.filter(taken)[0].as_py()
                raise SchemaError(
                    f"column 'key': {bad!r} has the form '{self.key_prefix}-<number>' this buffer uses for the "
                    "keys it generates; give your keys another form (or leave 'key' null to have one generated)")
            if pc.any(pc.equal(user_keys, "")).as_py():
                raise SchemaError("column 'key' has an empty key (a key needs at least one character)")
            if pc.count_distinct(table.column("key")).as_py() != n:
                raise SchemaError("column 'key' has duplicate values within the batch")
            # fail fast before the WAL write; the check that guarantees uniqueness is the index's,
            # atomic with the insert (``KeyIndex.record_batch``)
            _, _, found = s.index.lookup(user_keys.to_pylist())
            if found.any():
                dup = user_keys[int(np.flatnonzero(found)[0])].as_py()
                raise SchemaError(f"column 'key': key {dup!r} is already stored (keys are unique)")
            return table
        return conform(table, s.schema, run_id=s.run_id, now=now_us(), keys=self._generate_keys(n))

    # the two paths -------------------------------------------------------------------------
    def _push_hot(self, table: pa.Table, nbytes: int) -> None:
        s = self.s
        self.budget.admit(nbytes, lambda: s.hot.nbytes, lambda extra: self.writeback.schedule(extra=extra),
                          self.push_timeout_s, on_wait=s.tasks.check)
        bid = s.index.reserve_batch()
        try:
            if s.durability == "wal":
                s.wal.write(bid, table)
            staged = s.hot.stage(table, part=bid)
            info = BatchInfo(batch_id=bid, tier="hot", rows=table.num_rows, nbytes=nbytes)
            meta = s.meta_of(bid, table)
            s.index.record_batch(info, table.column("key").to_pylist(), meta.drop_columns(["_batch"]))
        except BaseException:
            self.budget.unreserve(nbytes)
            s.wal.remove(bid)
            raise
        with self.budget.space:
            self.budget.reserved -= nbytes
            s.hot.publish(staged)
            s.batches[bid] = info
            s.catalog.insert_meta(meta)
            self.writeback.evict_past_high_mark()

    def _push_direct(self, table: pa.Table) -> None:
        """A batch larger than the hot budget allows goes to the warm tier in chunks, synchronously."""
        chunk_rows = max(1, int(table.num_rows * (self.budget.hot_limit() / 4) / table_bytes(table)))
        written: list[int] = []
        try:
            for start in range(0, table.num_rows, chunk_rows):
                info = self.writeback.installer.install(table.slice(start, chunk_rows))
                written.append(info.batch_id)
        except BaseException:
            self._rollback(written)
            raise

    def _rollback(self, batch_ids: list[int]) -> None:
        """Undo the batches of a push that failed half way (nothing of it stays stored)."""
        s = self.s
        with s.lock:
            for bid in batch_ids:
                info = s.batches.pop(bid)
                meta = s.index.batch_meta(bid)
                keys = meta.column("key") if meta is not None else pa.array([], pa.string())
                s.warm.drop_fragments([info.fragment])
                s.index.drop_batch(bid, keys.to_pylist())
                s.catalog.delete_meta(keys)
