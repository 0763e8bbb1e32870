"""The hot tier: Arrow tables in RAM under a byte budget, least recently used first out.

A batch stays readable here until the warm tier has it on disk ("evicting" state), so a row is
always in exactly one place a reader can find, and the budget counts evicting bytes too.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import pyarrow as pa


def table_bytes(table: pa.Table) -> int:
    """Bytes of the Arrow buffers a table holds (what the budget is measured in)."""
    return table.get_total_buffer_size()


@dataclass
class HotBatch:
    batch_id: int
    table: pa.Table
    nbytes: int
    evicting: bool = False


class HotTier:
    """LRU-ordered batches; not thread-safe by itself (the buffer holds its lock, and its budget:
    the hot tier's share of it shrinks as the metadata catalog grows, see ``ReplayBuffer._hot_limit``)."""

    def __init__(self) -> None:
        self._batches: OrderedDict[int, HotBatch] = OrderedDict()
        self.nbytes = 0
        self.version = 0  # bumped on every change, so the catalog knows when to re-register

    def __contains__(self, batch_id: int) -> bool:
        return batch_id in self._batches

    def __len__(self) -> int:
        return len(self._batches)

    @property
    def rows(self) -> int:
        return sum(b.table.num_rows for b in self._batches.values())

    def add(self, batch_id: int, table: pa.Table) -> None:
        nbytes = table_bytes(table)
        self._batches[batch_id] = HotBatch(batch_id, table, nbytes)
        self.nbytes += nbytes
        self.version += 1

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
        self.version += 1

    def remove(self, batch_id: int) -> HotBatch:
        b = self._batches.pop(batch_id)
        self.nbytes -= b.nbytes
        self.version += 1
        return b

    def resident_bytes(self) -> int:
        """Bytes not yet handed to write-back."""
        return sum(b.nbytes for b in self._batches.values() if not b.evicting)

    def choose_victims(self, target_resident: int) -> list[HotBatch]:
        """Mark least recently used batches as evicting until resident bytes <= target."""
        resident = self.resident_bytes()
        victims = []
        for b in self._batches.values():
            if resident <= target_resident:
                break
            if b.evicting:
                continue
            b.evicting = True
            resident -= b.nbytes
            victims.append(b)
        return victims

    def tables(self) -> list[pa.Table]:
        return [b.table for b in self._batches.values()]
