"""Sources: what the dataset layer reads rollouts from, split into independently readable units.

* a live :class:`~lakebuffer.ReplayBuffer` (:class:`BufferSource`): one unit, its ``scan`` snapshot
  of hot + warm, taken when iteration starts; it uses only the reader's public ``schema`` and
  ``scan``, so any ``RolloutReader`` (a shard of a distributed buffer too) works;
* a lake, a read-only lake view or any ``pyarrow.dataset.Dataset`` (:class:`ArrowDatasetSource`):
  one unit per Parquet file (or row group), read with pyarrow's scanner, projection and filter
  pushed down.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs  # noqa: F401  (pa.fs)

from ..errors import SchemaError
from .filters import Predicate, RowFilter, metadata_names


@dataclass(frozen=True)
class Unit:
    """One independently readable piece of a source (a Parquet file, a row group, a snapshot)."""

    id: str
    fragment: Any = None
    rows: int | None = None


@runtime_checkable
class Source(Protocol):
    """What ``iter_batches`` needs from a source: a schema, a deterministic unit list, a reader.

    ``read`` streams the rows of ``units`` that match ``predicate`` (and, when ``shard=(s, S)``,
    have ``hash(key) % S = s``), with exactly ``columns``, in a deterministic order.
    """

    schema: pa.Schema

    def units(self) -> list[Unit]: ...

    def read(self, units: Sequence[Unit], *, columns: Sequence[str], predicate: Predicate,
             batch_rows: int, shard: tuple[int, int] | None) -> Iterator[pa.RecordBatch]: ...

    def row_bytes(self, columns: Sequence[str]) -> float | None: ...


class BufferSource:
    """A live ``ReplayBuffer``: one unit, its ``scan`` snapshot of hot + warm, taken per iteration.

    The SQL predicate and the row shard are pushed into the buffer's private DuckDB scan. Use it in
    the process that owns the buffer (``num_workers=0``): the buffer's Lance and RocksDB handles are
    not fork-safe. For many workers or ranks, read the lake instead.
    """

    def __init__(self, buffer: Any) -> None:
        self.buffer = buffer
        self.schema = buffer.schema

    def units(self) -> list[Unit]:
        return [Unit("snapshot")]

    def row_bytes(self, columns: Sequence[str]) -> float | None:
        measure = getattr(self.buffer, "row_bytes", None)  # sizes each read in bytes, not 4,096 rows
        return measure(columns) if measure is not None else None

    def memory_bytes(self) -> int | None:
        """The buffer's memory budget: reads and the shuffle buffer are sized within it."""
        return getattr(self.buffer, "memory_limit_bytes", None)

    def read(self, units, *, columns, predicate, batch_rows, shard):
        if not units:
            return
        cols = list(columns)
        parts = []
        if predicate.sql is not None:
            parts.append(f"({predicate.sql})")
        if shard is not None:
            parts.append(f"(hash(key) % {int(shard[1])} = {int(shard[0])})")
        where = " AND ".join(parts) or None
        post = predicate.expression if predicate.sql is None else None
        read_cols = cols if post is None else list(dict.fromkeys([*cols, *metadata_names(self.schema)]))
        for b in self.buffer.scan(where=where, columns=read_cols, batch_size=batch_rows):
            if post is not None:
                b = b.filter(post).select(cols)
            yield b


def _dataset_parts(dataset: ds.Dataset) -> tuple[list, pc.Expression | None]:
    """Fragments of ``dataset`` and the filter it carries (``Dataset.filter`` hides fragments).

    pyarrow has no public accessor for either on a filtered dataset: this is the one place that
    reads its private ``_scan_options`` / ``_get_fragments``.
    """
    base = (getattr(dataset, "_scan_options", None) or {}).get("filter")
    try:
        frags = list(dataset.get_fragments())
    except ValueError:
        frags = list(dataset._get_fragments(None))
    return frags, base


class ArrowDatasetSource:
    """A ``pyarrow.dataset.Dataset`` (the lake's committed Parquet files): one unit per file or row group.

    ``unit="file"`` (default) needs no I/O to plan; ``unit="row_group"`` reads every footer to plan
    finer, better balanced units. A filter the dataset carries (``Dataset.filter``) is applied to
    every read.

    ``pre_buffer`` is pyarrow's Parquet option: it fetches a whole file's column chunks ahead, which
    remote stores need for throughput but which holds about a file per read-ahead slot in memory;
    default: off on the local filesystem, on elsewhere.
    """

    def __init__(self, dataset: ds.Dataset, unit: str = "file", pre_buffer: bool | None = None) -> None:
        if unit not in ("file", "row_group"):
            raise ValueError("unit must be 'file' or 'row_group'")
        self.dataset = dataset
        if pre_buffer is None:
            fs = getattr(dataset, "filesystem", None)
            while isinstance(fs, pa.fs.SubTreeFileSystem):
                fs = fs.base_fs
            pre_buffer = not isinstance(fs, pa.fs.LocalFileSystem)
        self.pre_buffer = pre_buffer
        self.fragment_readahead = 1 if pre_buffer else 2  # pre-buffering holds a whole file per slot
        self.schema = dataset.schema
        self.unit = unit
        self._frags, self.base_filter = _dataset_parts(dataset)
        self._units: list[Unit] | None = None
        self._row_bytes: dict[tuple[str, ...], float | None] = {}

    @property
    def fragments(self) -> list:
        """The dataset's fragments (files), in the dataset's order."""
        return list(self._frags)

    @property
    def file_based(self) -> bool:
        return isinstance(self.dataset, ds.FileSystemDataset)

    @property
    def filesystem(self):
        return getattr(self.dataset, "filesystem", None)

    def files(self) -> list[str]:
        return sorted(getattr(f, "path", None) for f in self._frags if getattr(f, "path", None))

    def units(self) -> list[Unit]:
        if self._units is None:
            units: list[Unit] = []
            if all(getattr(f, "path", None) for f in self._frags):
                order = sorted(range(len(self._frags)), key=lambda i: self._frags[i].path)
            else:
                order = list(range(len(self._frags)))
            for i in order:
                f = self._frags[i]
                name = getattr(f, "path", None) or f"fragment-{i}"
                if self.unit == "row_group" and hasattr(f, "split_by_row_group"):
                    for j, rg in enumerate(f.split_by_row_group()):
                        units.append(Unit(f"{name}#{j}", rg, rg.row_groups[0].num_rows if rg.row_groups else None))
                else:
                    units.append(Unit(name, f))
            self._units = units
        return self._units

    def row_bytes(self, columns: Sequence[str]) -> float | None:
        key = tuple(columns)
        if key not in self._row_bytes:
            est = None
            for f in self._frags[:1]:
                md = getattr(f, "metadata", None)
                if md is None or md.num_rows == 0 or md.num_row_groups == 0:
                    continue
                rg = md.row_group(0)
                wanted = set(columns)
                total = 0
                for c in range(rg.num_columns):
                    col = rg.column(c)
                    top = col.path_in_schema.split(".")[0]
                    if top in wanted:
                        total += col.total_uncompressed_size
                est = total / max(rg.num_rows, 1) if total else None
            self._row_bytes[key] = est
        return self._row_bytes[key]

    def read(self, units, *, columns, predicate, batch_rows, shard):
        if not units:
            return
        cols = list(columns)
        expr = predicate.expression
        if self.base_filter is not None:
            expr = self.base_filter if expr is None else (self.base_filter & expr)
        post = None
        read_cols = cols
        if not predicate.exact or shard is not None:
            exact = predicate.exact
            post = RowFilter(None if exact else predicate.sql, () if exact else predicate.columns, shard,
                              metadata_names(self.schema))
            read_cols = list(dict.fromkeys([*cols, *post.columns]))
        frags = [u.fragment for u in units]
        opts = dict(columns=read_cols, filter=expr, batch_size=batch_rows, batch_readahead=2, use_threads=True)
        if isinstance(getattr(self.dataset, "format", None), ds.ParquetFileFormat):
            opts["fragment_scan_options"] = ds.ParquetFragmentScanOptions(pre_buffer=self.pre_buffer)
        if self.file_based:
            sub = ds.FileSystemDataset(frags, self.schema, self.dataset.format, self.dataset.filesystem)
            batches: Iterable[pa.RecordBatch] = sub.scanner(fragment_readahead=self.fragment_readahead,
                                                            **opts).to_batches()
        else:
            batches = (b for f in frags for b in ds.Scanner.from_fragment(f, schema=self.schema, **opts).to_batches())
        for b in batches:
            if post is not None:
                b = post(b)
                if read_cols != cols:
                    b = b.select(cols)
            yield b


class TableSource(ArrowDatasetSource):
    """An in-memory table split into units of ``unit_rows`` rows (tests, small corpora)."""

    def __init__(self, table: pa.Table, unit_rows: int = 65536) -> None:
        batches = table.to_batches(max_chunksize=unit_rows) or table.schema.empty_table().to_batches()
        super().__init__(ds.InMemoryDataset(batches, schema=table.schema))


def as_source(obj: Any, unit: str = "file") -> Source:
    """The :class:`Source` for a buffer, a lake, a read-only lake view, a pyarrow dataset, a table or a path."""
    if isinstance(obj, (BufferSource, ArrowDatasetSource)):
        return obj
    if isinstance(obj, ds.Dataset):
        return ArrowDatasetSource(obj, unit=unit)
    if isinstance(obj, pa.RecordBatch):
        obj = pa.Table.from_batches([obj])
    if isinstance(obj, pa.Table):
        return TableSource(obj)
    if isinstance(obj, str) or hasattr(obj, "__fspath__"):
        return ArrowDatasetSource(ds.dataset(str(obj), format="parquet", partitioning="hive"), unit=unit)
    from ..buffer import ReplayBuffer

    if isinstance(obj, ReplayBuffer):
        return BufferSource(obj)  # its hot + warm tiers; for its cold tier pass buffer.lake
    lake = getattr(obj, "lake", None)
    if lake is not None and callable(getattr(obj, "dataset", None)):  # a read-only view: its pinned dataset
        return ArrowDatasetSource(obj.dataset(), unit=unit)
    if callable(getattr(obj, "dataset", None)):  # a Lake
        return ArrowDatasetSource(obj.dataset(), unit=unit)
    if hasattr(obj, "scan") and hasattr(obj, "schema") and hasattr(obj, "push"):
        return BufferSource(obj)  # buffer-like (e.g. a shard of a distributed buffer)
    if isinstance(obj, Source):
        return obj
    raise TypeError(f"cannot read rollouts from {type(obj).__name__}: pass a ReplayBuffer, a lake, "
                    f"a pyarrow dataset, a table or a path")


def resolve_columns(source: Source, columns: Sequence[str] | None) -> list[str]:
    """``columns`` checked against the source (``None``: all of them)."""
    if columns is None:
        return list(source.schema.names)
    cols = list(columns)
    bad = [c for c in cols if c not in source.schema.names]
    if bad:
        raise SchemaError(f"unknown column {bad[0]!r}; the source has {', '.join(source.schema.names)}")
    return cols
