"""The hot tier: Arrow tables in RAM, least recently used (or least wanted, ``evict=``) first out.

A batch stays readable here until the warm tier has it on disk ("evicting" state), so a row is
always in exactly one place a reader can find, and the budget counts evicting bytes too. Parts
are the engine's batch ids (the hot tier has no ids of its own). Not thread-safe by itself: the
engine holds its lock, and owns the byte budget (``lakebuffer.engine.budget``), whose hot share
shrinks as the metadata catalog grows.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .base import Location, Staged, gather
from .eviction import EvictionPolicy


def table_bytes(table: pa.Table) -> int:
    """Bytes of the Arrow buffers a table holds (what the budget is measured in)."""
    return table.get_total_buffer_size()


@dataclass
class HotBatch:
    batch_id: int
    table: pa.Table
    nbytes: int
    evicting: bool = False
    score: float | None = None  # keep priority from the eviction policy (None: by recency only)


class HotTier:
    """LRU-ordered batches of Arrow rows (implements ``Tier``)."""

    name = "hot"

    def __init__(self, schema: pa.Schema, policy: EvictionPolicy | None = None) -> None:
        self.schema = schema
        self.policy = policy or EvictionPolicy()
        self._batches: OrderedDict[int, HotBatch] = OrderedDict()
        self.nbytes = 0
        self._version = 0  # bumped on every change, so the catalog knows when to re-register

    @property
    def version(self) -> int:
        return self._version

    def __contains__(self, batch_id: int) -> bool:
        return batch_id in self._batches

    def __len__(self) -> int:
        return len(self._batches)

    @property
    def rows(self) -> int:
        return sum(b.table.num_rows for b in self._batches.values())

    # Tier ----------------------------------------------------------------------------------
    def stage(self, table: pa.Table, part: int | None = None) -> Staged:
        """Hold ``table`` aside as batch ``part`` (RAM needs no writing: publishing is all); its keep
        score is computed here, outside the engine's lock."""
        if part is None:
            raise ValueError("the hot tier stores batches under the caller's batch id: pass part=")
        nbytes = table_bytes(table)
        batch = HotBatch(part, table, nbytes, score=self.policy.score(table))
        return Staged(part=part, rows=table.num_rows, nbytes=nbytes, handle=batch)

    def publish(self, staged: Staged) -> None:
        batch: HotBatch = staged.handle
        self._insert(batch)

    def take(self, where: Location, columns: Sequence[str]) -> pa.Table:
        """Rows by (batch, position) in the order given: one-row zero-copy slices (``gather``)."""
        columns = list(columns)
        if len(where) == 0:
            return self.schema.empty_table().select(columns)
        ids, inverse = np.unique(where.part, return_inverse=True)
        tables = []
        for bid in ids.tolist():
            b = self._batches.get(bid)
            if b is None:
                raise KeyError(f"hot batch {bid} is not in RAM")
            tables.append(b.table)
        return gather(tables, inverse, where.row, columns)

    def delete(self, keys: Sequence[str], parts: Sequence[int] | None = None) -> None:
        """Filter rows with these keys out of ``parts`` (all batches if None); empty batches go."""
        gone = pa.array(list(keys), pa.string())
        for bid in list(parts) if parts is not None else list(self._batches):
            b = self._batches.get(bid)
            if b is None:
                continue
            kept = b.table.filter(pc.invert(pc.is_in(b.table.column("key"), gone)))
            if kept.num_rows == b.table.num_rows:
                continue
            if kept.num_rows:
                self.replace(bid, kept)
            else:
                self.remove(bid)

    def arrow_source(self) -> pa.Table:
        tables = self.tables()
        return pa.concat_tables(tables) if tables else self.schema.empty_table()

    def stats(self) -> dict[str, int | str]:
        return {"rows": self.rows, "bytes": self.nbytes, "batches": len(self._batches), "evict": self.policy.evict}

    # batches -------------------------------------------------------------------------------
    def add(self, batch_id: int, table: pa.Table) -> None:
        self._insert(HotBatch(batch_id, table, table_bytes(table), score=self.policy.score(table)))

    def _insert(self, batch: HotBatch) -> None:
        self._batches[batch.batch_id] = batch
        self.nbytes += batch.nbytes
        self._version += 1

    def get(self, batch_id: int, touch: bool = True) -> HotBatch | None:
        b = self._batches.get(batch_id)
        if b is not None and touch:
            self._batches.move_to_end(batch_id)
        return b

    def replace(self, batch_id: int, table: pa.Table) -> None:
        """Swap a batch's table (after a delete filtered it)."""
        b = self._batches[batch_id]
        self.nbytes -= b.nbytes
        b.table, b.nbytes = table, table_bytes(table)
        self.nbytes += b.nbytes
        self._version += 1

    def remove(self, batch_id: int) -> HotBatch:
        b = self._batches.pop(batch_id)
        self.nbytes -= b.nbytes
        self._version += 1
        return b

    def clear(self) -> None:
        """Drop every batch: the buffer closed (its rows are durable elsewhere), so the tables, and the
        WAL segments they may map, are released now rather than whenever the object is collected."""
        self._batches.clear()
        self.nbytes = 0
        self._version += 1

    def resident_bytes(self) -> int:
        """Bytes not yet handed to write-back."""
        return sum(b.nbytes for b in self._batches.values() if not b.evicting)

    def choose_victims(self, target_resident: int) -> list[HotBatch]:
        """Mark batches as evicting until resident bytes <= target: lowest keep score first, ties
        (and every batch under ``evict="lru"``) least recently used first."""
        resident = self.resident_bytes()
        victims = []
        order = list(self._batches.values())
        if not self.policy.by_recency:  # sorted() is stable: equal scores keep their LRU order
            order = sorted(order, key=lambda b: -np.inf if b.score is None else b.score)
        for b in order:
            if resident <= target_resident:
                break
            if b.evicting:
                continue
            b.evicting = True
            resident -= b.nbytes
            victims.append(b)
        return victims

    def release_victims(self, batch_ids: Sequence[int]) -> None:
        """A write-back failed: these batches are plain resident batches again."""
        for bid in batch_ids:
            b = self._batches.get(bid)
            if b is not None:
                b.evicting = False

    def tables(self) -> list[pa.Table]:
        return [b.table for b in self._batches.values()]
