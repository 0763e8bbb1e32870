"""The ``Tier`` protocol: what every storage tier (hot RAM, warm local disk, the cold lake) offers.

Why a protocol and not a base class: the tiers share no code, only a shape, and the cold tier
(the lake package) must be able to implement it without importing anything from here but these
names. The shape is the one the engine needs to move data one way (hot -> warm -> cold) while
reads reach every tier:

* ``stage`` writes rows where no reader sees them yet and says where they went (a ``Staged``);
  ``publish`` makes them visible. The engine publishes together with the index update, under
  its lock, so a row is never visible twice or not at all.
* ``take`` reads rows by ``Location`` (numbered parts and row positions, vectorised: one call for
  many parts), only the asked columns, in the asked order. A cold tier answers it with
  (file, row) locations.
* ``delete`` hides rows by key; ``arrow_source`` is the Arrow object (table, dataset) the catalog
  registers for SQL, and ``version`` changes whenever it would change; ``stats`` counts rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pds


@dataclass(frozen=True)
class Location:
    """Where rows live inside one tier: row ``row[i]`` of part ``part[i]`` (int64 arrays).

    A part is the tier's unit of storage: a hot batch id, a warm fragment id, a cold file number.
    """

    part: np.ndarray
    row: np.ndarray

    @classmethod
    def of(cls, part: int | np.ndarray, row: Sequence[int] | np.ndarray) -> Location:
        """Locations of ``row`` positions in ``part`` (one part id for all, or one per row)."""
        rows = np.asarray(row, dtype=np.int64)
        parts = np.broadcast_to(np.asarray(part, dtype=np.int64), rows.shape).copy()
        return cls(parts, rows)

    @classmethod
    def concat(cls, locations: Sequence[Location]) -> Location:
        if not locations:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64))
        return cls(np.concatenate([loc.part for loc in locations]), np.concatenate([loc.row for loc in locations]))

    def __len__(self) -> int:
        return len(self.row)


def gather(tables: Sequence[pa.Table | pa.RecordBatch], which: np.ndarray, row: np.ndarray,
           columns: Sequence[str]) -> pa.Table:
    """Row ``row[i]`` of ``tables[which[i]]`` for every i, with only ``columns``, in that order.

    Each row is a zero-copy one-row slice and each column one native concat: a pyarrow ``take``
    over several tables first concatenates them whole, and even on one table it costs ~10-30x
    more for list columns at a few hundred random rows (measured, issue 17). Record batches take
    the short path; tables may have several chunks, and which one holds a row is found vectorised.
    """
    columns = list(columns)
    which = np.asarray(which, np.int64)
    row = np.asarray(row, np.int64)
    if tables and all(isinstance(t, pa.RecordBatch) for t in tables):  # the usual case: one batch each
        runs = _runs(which, row)
        names = tables[0].schema.names
        out = []
        for c in columns:
            i = names.index(c)
            arrays = [t.column(i) for t in tables]
            out.append(_joined(arrays, runs))
        return pa.Table.from_arrays(out, schema=pa.schema([tables[0].schema.field(c) for c in columns]))
    batches: list[pa.RecordBatch] = []
    starts: list[np.ndarray] = []
    for t in tables:
        bs = t.select(list(columns)).to_batches() or [pa.RecordBatch.from_pylist([], schema=t.select(list(columns)).schema)]
        batches.extend(bs)
        starts.append(np.cumsum([0] + [b.num_rows for b in bs[:-1]], dtype=np.int64))
    if len(batches) == len(tables):
        chunk, local = which, row
    else:
        first = np.cumsum([0] + [len(x) for x in starts[:-1]], dtype=np.int64)
        allstarts = np.concatenate(starts)
        keyed = np.repeat(np.arange(len(tables), dtype=np.int64), [len(x) for x in starts]) * (1 << 40) + allstarts
        chunk = np.searchsorted(keyed, which * (1 << 40) + row, side="right") - 1
        chunk = np.maximum(chunk, first[which])
        local = row - allstarts[chunk]
    runs = _runs(chunk, local)
    out = []
    for i in range(len(columns)):
        arrays = [b.column(i) for b in batches]
        out.append(_joined(arrays, runs))
    return pa.Table.from_arrays(out, schema=batches[0].schema)


def _joined(arrays: Sequence[pa.Array], runs: list[tuple[int, int, int]]) -> pa.Array:
    """The rows of ``runs`` as one array: one copy (``concat_arrays``), except where they are one whole
    array that owns exactly its buffers, which is returned as it is. (Not any one run as a zero-copy
    slice: a slice sent to another process pickles its parents' whole buffers, 4x the bytes for 16 of 64
    rows; a whole array sends only its own. A TransferQueue get of the 16 rows one put stored is such a
    case: 16 x 16,384 tokens, a 3 MB copy saved.)"""
    if not runs:
        return arrays[0].slice(0, 0)
    if len(runs) == 1:
        k, first, n = runs[0]
        whole = arrays[k]
        # (its buffers hold no more than its rows: an offsets buffer has one entry more than ``nbytes`` counts)
        if first == 0 and n == len(whole) and whole.get_total_buffer_size() <= whole.nbytes * 1.01 + 64:
            return whole
    return pa.concat_arrays([arrays[k].slice(r, n) for k, r, n in runs])


def _runs(chunk: np.ndarray, row: np.ndarray) -> list[tuple[int, int, int]]:
    """(chunk, first row, length) of each run of consecutive rows of one chunk: a whole batch read in
    order (a snapshot) is one slice, 256 random rows are 256."""
    if len(row) == 0:
        return []
    brk = np.flatnonzero((np.diff(chunk) != 0) | (np.diff(row) != 1)) + 1
    first = np.concatenate([[0], brk])
    lengths = np.diff(np.concatenate([first, [len(row)]]))
    return list(zip(chunk[first].tolist(), row[first].tolist(), lengths.tolist()))


class ScannedDataset(pds.InMemoryDataset):
    """A dataset whose every read goes through its ``scanner`` (DuckDB calls it when a query reads the
    tier, not to bind a view): subclasses verify, filter or build the real dataset there; what a
    caller other than DuckDB may ask is answered by the same scan."""

    def count_rows(self, **kwargs: Any) -> int:
        return self.scanner(filter=kwargs.get("filter")).count_rows()

    def to_table(self, **kwargs: Any) -> pa.Table:
        return self.scanner(**kwargs).to_table()

    def to_batches(self, **kwargs: Any) -> Any:
        return self.scanner(**kwargs).to_batches()

    def head(self, num_rows: int, **kwargs: Any) -> pa.Table:
        return self.scanner(**kwargs).head(num_rows)


class DeferredDataset(ScannedDataset):
    """A dataset built (and its files verified) only when a scan reads it: binding a DuckDB view over
    it reads nothing, so opening a buffer costs no data file read (issue 23: open is O(metadata)).
    Reads one file and two batches ahead, from the system allocator: a lake row group decodes to tens
    of MiB, and a scan must stay within the RAM budget at any lake size."""

    _make: Any = None

    @classmethod
    def over(cls, make: Any, schema: pa.Schema) -> DeferredDataset:
        """``make()`` returns the real ``pyarrow.dataset.Dataset`` (of ``schema``) at scan time."""
        out = cls(schema.empty_table())
        out._make = make
        return out

    def scanner(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("fragment_readahead", 1)
        kwargs.setdefault("batch_readahead", 2)
        kwargs.setdefault("memory_pool", pa.system_memory_pool())
        return self._make().scanner(*args, **kwargs)


@dataclass(frozen=True)
class Staged:
    """Rows a tier has written but not yet published: their part and what verifies it later."""

    part: int
    rows: int
    nbytes: int
    files: tuple[str, ...] = ()
    checksum: int | None = None
    handle: Any = None  # the tier's own token for ``publish`` (a table, a dataset version)


@runtime_checkable
class Tier(Protocol):
    """A storage tier (see the module docstring for the contract)."""

    name: str

    @property
    def version(self) -> int:
        """Changes whenever ``arrow_source`` would return something different."""
        ...

    def stage(self, table: pa.Table, part: int | None = None) -> Staged:
        """Write ``table`` invisibly; ``part`` is the caller's id where the tier has none of its own."""
        ...

    def publish(self, staged: Staged) -> None:
        """Make staged rows visible to ``take``, ``arrow_source`` and ``stats``."""
        ...

    def take(self, where: Location, columns: Sequence[str]) -> pa.Table:
        """The rows at ``where``, in that order, with only ``columns``."""
        ...

    def delete(self, keys: Sequence[str]) -> None:
        """Hide the rows with these keys."""
        ...

    def arrow_source(self) -> Any:
        """An Arrow table or dataset of the visible rows (what the catalog registers)."""
        ...

    def stats(self) -> dict[str, int]:
        """At least ``rows`` (visible rows) and ``bytes``."""
        ...
