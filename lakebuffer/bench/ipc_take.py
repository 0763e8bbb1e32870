"""Issue 17's yardstick for ``get``: a memory-mapped Arrow IPC take of the same rows, nothing else.

``locate`` is the index step of ``reads.get`` (RocksDB multi-get, then batch -> (fragment, row));
``IpcFiles`` maps files of its own (a page another map already touched costs no fault, so sharing
maps would flatter whichever ran second) and takes rows as zero-copy one-row slices joined by one
native concat per column. Reads buffer internals: a reference measurement, not an API.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..tiers import Location, segfooter
from ..tiers.base import gather


def locate(buf: Any, keys: list[str]) -> Location:
    """Where ``keys`` live in the warm tier of ``buf`` (every key must be warm: ``evict_all`` first)."""
    s = buf._state
    with s.lock:
        batch, pos, _ = s.index.lookup(keys)
        uniq, first = np.unique(batch, return_inverse=True)
        frag = np.array([s.batches[b].fragment for b in uniq.tolist()], np.int64)
        off = np.array([s.batches[b].offset for b in uniq.tolist()], np.int64)
    return Location(frag[first], off[first] + pos)


def warm_files(buf: Any) -> dict[int, Path]:
    """Every warm fragment of ``buf`` -> its file."""
    w = buf._state.warm
    return {f: w.file_of(f) for f in w.fragment_ids()}


class IpcFiles:
    """Memory-mapped IPC files (WAL segment format); a fragment is (file, first row) in one of them."""

    def __init__(self, paths: dict[int, Path], first_row: dict[int, int] | None = None) -> None:
        self.paths = paths  # fragment -> file
        self.first = first_row or {}
        self.tables: dict[Path, pa.Table] = {}
        self.sig: dict[Path, tuple[int, int]] = {}

    def table(self, p: Path) -> pa.Table:
        t = self.tables.get(p)
        if t is None:
            buf = pa.memory_map(str(p)).read_buffer()
            footer = segfooter.parse_buffer(memoryview(buf))
            buf = buf.slice(0, footer.ipc_end if footer is not None else buf.size)
            t = self.tables[p] = pa.ipc.open_file(pa.BufferReader(buf)).read_all()
            st = os.stat(p)
            self.sig[p] = (st.st_size, st.st_mtime_ns)
        return t

    def verify(self, parts: np.ndarray) -> None:
        """The buffer's per-call check: one ``stat`` per file touched, a re-map if it changed."""
        for f in parts.tolist():
            p = self.paths[f]
            st = os.stat(p)
            if self.sig.get(p) != (st.st_size, st.st_mtime_ns):
                self.tables.pop(p, None)
                self.table(p)

    def take(self, where: Location, cols: list[str]) -> pa.Table:
        """One zero-copy one-row slice per asked row, then one native concat per column."""
        uniq, inv = np.unique(where.part, return_inverse=True)
        tabs = [self.table(self.paths[f]) for f in uniq.tolist()]
        first = np.array([self.first.get(f, 0) for f in uniq.tolist()], np.int64)
        rows = where.row + first[inv]
        if any(t.column(0).num_chunks != 1 for t in tabs):  # a coalesced fragment of several batches
            return gather(tabs, inv, rows, cols)
        rows, inv = rows.tolist(), inv.tolist()
        out = {}
        for c in cols:
            arrs = [t.column(c).chunk(0) for t in tabs]
            out[c] = pa.concat_arrays([arrs[i].slice(r, 1) for i, r in zip(inv, rows)])
        return pa.table(out)

    def take_pyarrow(self, where: Location, cols: list[str]) -> pa.Table:
        """The plain way: one pyarrow ``take`` per file touched."""
        uniq, inv = np.unique(where.part, return_inverse=True)
        pieces, order = [], []
        for i, f in enumerate(uniq.tolist()):
            sel = np.flatnonzero(inv == i)
            t = self.table(self.paths[f]).select(cols)
            pieces.append(t.take(pa.array(where.row[sel] + self.first.get(f, 0))))
            order.append(sel)
        out = pa.concat_tables(pieces)
        return out.take(pa.array(np.argsort(np.concatenate(order))))
