"""The warm tier as DuckDB (and ``scan``) sees it: a dataset whose scans read fragments chunk by chunk.

Split from ``warm.py`` (one job: what a query's scan of the warm tier does). The batches are pulled on
the consumer's thread, never by Arrow read-ahead threads (issue 24, exit safety).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .base import ScannedDataset

# ``tier`` below is a ``warm.WarmTier`` (typed Any: warm imports this module)

#: the key a deleted row's slot carries inside a fragment (keys are never empty: ingest refuses "")
DELETED_KEY = ""


def _filter_columns(names: Sequence[str], expr: Any) -> list[str]:
    """Columns a pyarrow filter expression may reference (by name in its text; more is only slower)."""
    if expr is None:
        return []
    text = str(expr)
    if any(not re.fullmatch(r"\w+", n) for n in names):
        return list(names)
    return [n for n in names if re.search(rf"\b{n}\b", text)]


class WarmDataset(ScannedDataset):
    """The warm fragments as DuckDB sees them: a scan reads each fragment's asked columns by positioned
    reads, batch by batch, after verifying it; deleted row slots are filtered out here.

    DuckDB calls ``scanner`` when a query actually reads the warm tier (not to bind a view), so a
    query over ``meta`` only never pays for it.
    """

    _tier: Any = None
    _ids: tuple[int, ...] = ()

    @classmethod
    def over(cls, tier: Any, ids: Sequence[int]) -> WarmDataset:
        out = cls(tier.schema.empty_table())
        out._tier, out._ids = tier, tuple(ids)
        return out

    def scanner(self, *args: Any, **kwargs: Any) -> Any:
        tier: Any = self._tier
        flt = kwargs.get("filter")
        if tier.has_deletes(self._ids):
            live = pc.field("key") != pa.scalar(DELETED_KEY)
            flt = live if flt is None else flt & live
        names = tier.schema.names
        asked = list(kwargs.get("columns") or names)
        read = [c for c in names if c in asked or c in _filter_columns(names, flt)] or ["key"]
        return _Scan(tier, self._ids, read, asked, flt)


class _Scan:
    """What ``scanner`` returns: the fragments' batches pulled on the *consumer's* thread.

    Not ``pds.Scanner.from_batches``: that pulls the Python generator from Arrow's own threads
    (read-ahead), which outlive the query and, at interpreter exit, abort the process reaching for the
    GIL (issue 24). A reader pulls only while DuckDB (or the caller) asks for a batch, i.e. inside a
    query the exit hook waits for. The filter (DuckDB's pushed-down one and the deleted rows') is
    applied here exactly.
    """

    def __init__(self, tier: Any, ids: Sequence[int], read: list[str], asked: list[str], flt: Any) -> None:
        self._tier, self._ids, self._read, self._asked, self._filter = tier, tuple(ids), read, asked, flt
        self.projected_schema = pa.schema([tier.schema.field(c) for c in asked])

    def _batches(self) -> Iterator[pa.RecordBatch]:
        for b in self._tier.stream(self._ids, self._read):
            if self._filter is not None:
                t = pa.Table.from_batches([b]).filter(self._filter)
                yield from t.select(self._asked).to_batches()
            else:
                yield b.select(self._asked)

    def to_reader(self) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(self.projected_schema, self._batches())

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        return self._batches()

    def to_table(self) -> pa.Table:
        return pa.Table.from_batches(list(self._batches()), schema=self.projected_schema)

    def count_rows(self) -> int:
        return sum(b.num_rows for b in self._batches())

    def head(self, num_rows: int) -> pa.Table:
        out, n = [], 0
        for b in self._batches():
            if n >= num_rows:
                break
            out.append(b.slice(0, num_rows - n))
            n += out[-1].num_rows
        return pa.Table.from_batches(out, schema=self.projected_schema)
