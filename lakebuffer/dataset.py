"""Training integration: the buffer and the lake as datasets (PyTorch, Ray Data).

Everything is built on one torch-free core, :func:`iter_batches`, which streams ``pa.RecordBatch``es
of exactly ``batch_size`` rows from a :class:`Source`:

* a live :class:`~lakebuffer.ReplayBuffer` (:class:`BufferSource`): one unit, its ``scan`` snapshot of
  hot + warm, taken when iteration starts;
* a lake, a read-only lake view or any ``pyarrow.dataset.Dataset`` (:class:`ArrowDatasetSource`):
  one unit per Parquet file (or row group), read with pyarrow's scanner, projection and filter pushed
  down.

Sharding. Every reader (a distributed rank times a DataLoader worker) is one of ``S`` shards and
computes the same plan from ``(seed, epoch)`` alone, so no coordination is needed:

* ``shard_by="unit"``: the units, sorted then permuted with the epoch's seed, go round-robin to the
  shards; each shard reads only its own files (I/O divided by S);
* ``shard_by="row"``: every shard reads every unit and keeps the rows with
  ``hash(key) % S = s`` (DuckDB's ``hash``, computed on the key column only, pushed into the
  buffer's scan); used when there are fewer units than shards (a live buffer is one unit);
* ``"auto"`` (default) picks ``unit`` when there are at least S units, else ``row``.

Either way each row lands in exactly one shard: no row twice in an epoch, none missing.

Predicates are DuckDB SQL strings (as in ``ReplayBuffer.sample``) or pyarrow expressions. Simple SQL
(comparisons, AND/OR/NOT, IN, BETWEEN, IS NULL over columns and literals) is translated to a pyarrow
expression and pushed into the Parquet scan (row-group and partition pruning); anything else is
evaluated exactly by DuckDB on the metadata columns of each record batch, and the payload is then
filtered in Arrow without ever passing through DuckDB.

Memory is bounded: a shard holds at most its read batches (sized from the row width, ~16 MiB), its
shuffle buffer (~64 MiB by default) and one output batch, however large the lake.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs  # noqa: F401  (pa.fs)

from .errors import QueryError, SchemaError


def _import_torch():
    """torch, imported on first need (it costs seconds and ~200 MB); ``None`` when not installed."""
    try:
        import torch
    except ImportError:  # pragma: no cover - exercised in the torch-free CI env
        return None
    return torch

__all__ = [
    "ArrowDatasetSource",
    "BufferSource",
    "IterStats",
    "Predicate",
    "RolloutDataset",
    "SamplingDataset",
    "Source",
    "Unit",
    "as_source",
    "bench_dataset",
    "compile_predicate",
    "iter_batches",
    "pad_collate",
    "pad_lists",
    "plan_shard",
    "sql_to_expression",
    "to_ray",
]

_READ_BYTES = 16 << 20  # target size of one read batch
_SHUFFLE_BYTES = 64 << 20  # default shuffle buffer size
_ROW_COL = "__lb_row"


# ------------------------------------------------------------------------------------------
# predicates: SQL text -> pyarrow expression (when simple) + DuckDB fallback
# ------------------------------------------------------------------------------------------
class _Untranslatable(Exception):
    pass


_TOKEN_RE = re.compile(
    r"""\s*(?:
      (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
    | (?P<str>'(?:[^']|'')*')
    | (?P<qid>"(?:[^"]|"")+")
    | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<op><=|>=|<>|!=|==|=|<|>|\(|\)|,|-)
    | (?P<other>\S)
    )""",
    re.X,
)
_KEYWORDS = {"AND", "OR", "NOT", "IN", "IS", "NULL", "BETWEEN", "TRUE", "FALSE"}
_CMP_OPS = {"=": "==", "==": "==", "!=": "!=", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


class _PyArrowBuild:
    """Builds pyarrow compute expressions for the parser."""

    def col(self, name):
        return pc.field(name)

    def lit(self, value):
        return pc.scalar(value)

    def cmp(self, op, a, b):
        return {"==": a.__eq__, "!=": a.__ne__, "<": a.__lt__, "<=": a.__le__, ">": a.__gt__, ">=": a.__ge__}[op](b)

    def and_(self, a, b):
        return a & b

    def or_(self, a, b):
        return a | b

    def not_(self, a):
        return ~a

    def is_null(self, a, negate):
        return a.is_valid() if negate else a.is_null()

    def in_(self, a, values):
        """``x IN (...)`` with SQL's null semantics (NULL stays NULL, so ``NOT IN`` keeps no nulls)."""
        if len(values) <= 32:  # an OR of equalities prunes row groups and partitions best
            return _balanced_or(self, [a == v for v in values])
        return pc.if_else(a.is_valid(), a.isin(values), pa.scalar(None, pa.bool_()))


class _RayBuild(_PyArrowBuild):
    """Builds ``ray.data.expressions`` predicates (what Ray Data pushes into Parquet reads)."""

    def __init__(self) -> None:
        from ray.data import expressions

        self.x = expressions

    def col(self, name):
        return self.x.col(name)

    def lit(self, value):
        return self.x.lit(value)

    def is_null(self, a, negate):
        return a.is_not_null() if negate else a.is_null()

    def in_(self, a, values):
        return _balanced_or(self, [a == self.x.lit(v) for v in values])


def _balanced_or(build, terms: list):
    while len(terms) > 1:
        terms = [build.or_(terms[i], terms[i + 1]) if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0]


def _tokenize(text: str) -> list[tuple[str, str]]:
    out = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:  # pragma: no cover - the pattern matches any non-space character
            raise _Untranslatable(text[pos:])
        pos = m.end()
        kind = m.lastgroup
        val = m.group(kind)
        if kind == "id" and val.upper() in _KEYWORDS:
            kind, val = "kw", val.upper()
        elif kind == "qid":
            kind, val = "id", val[1:-1].replace('""', '"')
        elif kind == "str":
            val = val[1:-1].replace("''", "'")
        out.append((kind, val))
    return out


class _Parser:
    """Recursive descent over the simple predicate subset; anything else raises ``_Untranslatable``."""

    def __init__(self, tokens: list[tuple[str, str]], build: _PyArrowBuild) -> None:
        self.t = tokens
        self.i = 0
        self.b = build

    def peek(self, kind: str | None = None, val: str | None = None) -> bool:
        if self.i >= len(self.t):
            return False
        k, v = self.t[self.i]
        return (kind is None or k == kind) and (val is None or v == val)

    def take(self, kind: str | None = None, val: str | None = None) -> str:
        if not self.peek(kind, val):
            raise _Untranslatable(f"expected {val or kind} at token {self.i}")
        self.i += 1
        return self.t[self.i - 1][1]

    def parse(self):
        e = self.or_()
        if self.i != len(self.t):
            raise _Untranslatable(f"unexpected token {self.t[self.i]}")
        return e

    def or_(self):
        e = self.and_()
        while self.peek("kw", "OR"):
            self.take()
            e = self.b.or_(e, self.and_())
        return e

    def and_(self):
        e = self.not_()
        while self.peek("kw", "AND"):
            self.take()
            e = self.b.and_(e, self.not_())
        return e

    def not_(self):
        if self.peek("kw", "NOT"):
            self.take()
            return self.b.not_(self.not_())
        return self.pred()

    def pred(self):
        left = self.operand()
        if self.peek("op") and self.t[self.i][1] in _CMP_OPS:
            op = _CMP_OPS[self.take()]
            return self.b.cmp(op, left, self.operand())
        if self.peek("kw", "IS"):
            self.take()
            neg = self.peek("kw", "NOT")
            if neg:
                self.take()
            self.take("kw", "NULL")
            return self.b.is_null(left, neg)
        neg = False
        if self.peek("kw", "NOT"):
            self.take()
            neg = True
            if not (self.peek("kw", "IN") or self.peek("kw", "BETWEEN")):
                raise _Untranslatable("NOT after an operand")
        if self.peek("kw", "IN"):
            self.take()
            self.take("op", "(")
            values = [self.literal()]
            while self.peek("op", ","):
                self.take()
                values.append(self.literal())
            self.take("op", ")")
            e = self.b.in_(left, values)
            return self.b.not_(e) if neg else e
        if self.peek("kw", "BETWEEN"):
            self.take()
            lo = self.operand()
            self.take("kw", "AND")
            hi = self.operand()
            e = self.b.and_(self.b.cmp(">=", left, lo), self.b.cmp("<=", left, hi))
            return self.b.not_(e) if neg else e
        return left

    def literal(self):
        if self.peek("op", "-"):
            self.take()
            return -self._number(self.take("num"))
        if self.peek("num"):
            return self._number(self.take())
        if self.peek("str"):
            return self.take()
        if self.peek("kw", "TRUE") or self.peek("kw", "FALSE"):
            return self.take() == "TRUE"
        raise _Untranslatable("literal expected")

    @staticmethod
    def _number(text: str) -> int | float:
        return float(text) if any(c in text for c in ".eE") else int(text)

    def operand(self):
        if self.peek("op", "("):
            self.take()
            e = self.or_()
            self.take("op", ")")
            return e
        if self.peek("id"):
            name = self.take()
            if self.peek("op", "("):
                raise _Untranslatable(f"function {name}()")
            return self.b.col(name)
        if self.peek("kw", "NULL"):
            self.take()
            return self.b.lit(None)
        return self.b.lit(self.literal())


def _check_expression(expr: pc.Expression, schema: pa.Schema) -> None:
    """Bind ``expr`` against ``schema`` (raises on unknown columns or mismatched types)."""
    out = ds.dataset(schema.empty_table()).to_table(filter=expr)
    if out.num_rows:  # pragma: no cover - an empty table filters to nothing
        raise AssertionError


def sql_to_expression(where: str, schema: pa.Schema | None = None) -> pc.Expression | None:
    """Translate a simple SQL predicate to a pyarrow expression, or ``None`` when it is not simple.

    Understood: comparisons (``= == != <> < <= > >=``), ``AND``/``OR``/``NOT``, ``IN (...)``,
    ``BETWEEN``, ``IS [NOT] NULL``, parentheses, column names (bare or ``"quoted"``) and literals
    (numbers, ``'strings'``, ``TRUE``/``FALSE``/``NULL``). With ``schema`` the expression is also
    bound (type-checked) against it, and ``None`` is returned when that fails (e.g. comparing a
    timestamp with a string: DuckDB casts, pyarrow does not).
    """
    try:
        expr = _Parser(_tokenize(where), _PyArrowBuild()).parse()
    except (_Untranslatable, TypeError, ValueError, pa.ArrowException):
        return None
    if schema is not None:
        try:
            _check_expression(expr, schema)
        except (pa.ArrowException, TypeError, ValueError, AssertionError):
            return None
    return expr


def sql_to_ray_expression(where: str, schema: pa.Schema | None = None):
    """The ``ray.data.expressions`` predicate for a simple SQL ``where`` (``None`` when not simple)."""
    if sql_to_expression(where, schema) is None:
        return None
    return _Parser(_tokenize(where), _RayBuild()).parse()


def _sql_columns(where: str, schema: pa.Schema) -> list[str]:
    """Columns of ``schema`` the SQL text mentions (a superset is fine: they are only read)."""
    try:
        names = {v for k, v in _tokenize(where) if k == "id"}
    except _Untranslatable:  # pragma: no cover
        names = set()
    return [n for n in schema.names if n in names]


@dataclass(frozen=True)
class Predicate:
    """A compiled ``where``: what can be pushed into a scan and what DuckDB must still check.

    ``sql`` is the DuckDB text (``None`` when the user gave a pyarrow expression); ``expression``
    is pushed into pyarrow scans; ``exact`` says the expression alone implements the predicate.
    """

    sql: str | None
    expression: pc.Expression | None
    exact: bool
    columns: tuple[str, ...]

    @property
    def is_true(self) -> bool:
        return self.sql is None and self.expression is None


def compile_predicate(where: str | pc.Expression | None, schema: pa.Schema) -> Predicate:
    if where is None or (isinstance(where, str) and not where.strip()):
        return Predicate(None, None, True, ())
    if isinstance(where, pc.Expression):
        try:
            _check_expression(where, schema)
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise QueryError(f"cannot apply {where} to this source: {e}") from e
        return Predicate(None, where, True, ())
    if not isinstance(where, str):
        raise TypeError(f"where must be a SQL string or a pyarrow expression, not {type(where).__name__}")
    if ";" in where:
        raise QueryError(f"a where predicate must be a single SQL expression, got {where!r}")
    expr = sql_to_expression(where, schema)
    return Predicate(where, expr, expr is not None, tuple(_sql_columns(where, schema)))


class _RowFilter:
    """Exact SQL predicate and/or row shard, evaluated by DuckDB on a few columns of each batch.

    Only the referenced (metadata) columns and a row number go to DuckDB; the selected row numbers
    then ``take`` the full batch in Arrow, so payload never round-trips through DuckDB.
    """

    def __init__(self, sql: str | None, columns: Sequence[str], shard: tuple[int, int] | None,
                 fallback_columns: Sequence[str]) -> None:
        parts = []
        if sql is not None:
            parts.append(f"({sql})")
        if shard is not None:
            s, n = shard
            parts.append(f"(hash(key) % {int(n)} = {int(s)})")
        self.cond = " AND ".join(parts)
        self.columns = list(dict.fromkeys([*columns, *(["key"] if shard is not None else [])]))
        self.fallback = list(dict.fromkeys([*self.columns, *fallback_columns]))
        self.con = None

    def needed(self) -> list[str]:
        return self.fallback

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        if n == 0:
            return batch
        if self.con is None:  # created lazily, i.e. inside the DataLoader worker process
            import duckdb

            self.con = duckdb.connect()
            self.con.execute("SET threads TO 1")
        idx = self._select(batch, self.columns, retry=True)
        if len(idx) == n:
            return batch
        idx.sort()
        return batch.take(pa.array(idx))

    def _select(self, batch: pa.RecordBatch, columns: list[str], retry: bool) -> np.ndarray:
        import duckdb

        have = [c for c in columns if c in batch.schema.names]
        small = pa.record_batch(
            [batch.column(c) for c in have] + [pa.array(np.arange(batch.num_rows, dtype=np.int64))],
            names=[*have, _ROW_COL],
        )
        self.con.register("__lb_batch", small)
        try:
            res = self.con.execute(f"SELECT {_ROW_COL} FROM __lb_batch WHERE {self.cond}").fetchnumpy()
        except duckdb.BinderException as e:
            if retry and self.fallback != columns:  # a column the tokenizer did not spot: send them all
                return self._select(batch, self.fallback, retry=False)
            raise QueryError(f"{type(e).__name__}: {e}") from e
        except duckdb.Error as e:
            raise QueryError(f"{type(e).__name__}: {e}") from e
        finally:
            self.con.unregister("__lb_batch")
        return np.asarray(res[_ROW_COL], dtype=np.int64)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["con"] = None
        return state


# ------------------------------------------------------------------------------------------
# sources
# ------------------------------------------------------------------------------------------
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


def _metadata_names(schema: pa.Schema) -> list[str]:
    return [f.name for f in schema if not pa.types.is_nested(f.type)]


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
        return None

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
        read_cols = cols if post is None else list(dict.fromkeys([*cols, *_metadata_names(self.schema)]))
        for b in self.buffer.scan(where=where, columns=read_cols, batch_size=batch_rows):
            if post is not None:
                b = b.filter(post).select(cols)
            yield b


def _dataset_parts(dataset: ds.Dataset) -> tuple[list, pc.Expression | None]:
    """Fragments of ``dataset`` and the filter it carries (``Dataset.filter`` hides fragments)."""
    base = (getattr(dataset, "_scan_options", None) or {}).get("filter")
    try:
        frags = list(dataset.get_fragments())
    except ValueError:
        frags = list(dataset._get_fragments(None))
    return frags, base


class ArrowDatasetSource:
    """A ``pyarrow.dataset.Dataset`` (the lake's committed Parquet files): one unit per file or row group.

    ``unit="file"`` (default) needs no I/O to plan; ``unit="row_group"`` reads every footer to plan
    finer, better balanced units. A filter the dataset carries (``Dataset.filter``, e.g. the lake's
    tombstones) is applied to every read.

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
            post = _RowFilter(None if exact else predicate.sql, () if exact else predicate.columns, shard,
                              _metadata_names(self.schema))
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


class _TableSource(ArrowDatasetSource):
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
        return _TableSource(obj)
    if isinstance(obj, str) or hasattr(obj, "__fspath__"):
        return ArrowDatasetSource(ds.dataset(str(obj), format="parquet", partitioning="hive"), unit=unit)
    from .buffer import ReplayBuffer

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


# ------------------------------------------------------------------------------------------
# the core iterator (no torch)
# ------------------------------------------------------------------------------------------
@dataclass
class IterStats:
    """What one pass did: rows and batches out, units read, the most rows held at once."""

    rows: int = 0
    batches: int = 0
    units: int = 0
    mode: str = ""
    max_rows_held: int = 0
    read_rows: int = 0
    shuffle_rows: int = 0
    extra: dict = field(default_factory=dict)


def _seed_int(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(1)[0])


def plan_shard(units: Sequence[Unit], shard: int, num_shards: int, *, seed: int = 0, epoch: int = 0,
               shuffle: bool = True, shard_by: str = "auto") -> tuple[list[Unit], tuple[int, int] | None, str]:
    """This shard's units and row shard: ``(units, (shard, num_shards) or None, mode)``.

    Depends only on its arguments, so every rank and worker computes the same partition.
    """
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} out of range for {num_shards} shard(s)")
    if shard_by not in ("auto", "unit", "row"):
        raise ValueError("shard_by must be 'auto', 'unit' or 'row'")
    order = list(units)
    if shuffle and len(order) > 1:
        perm = np.random.default_rng(_seed_int(seed, epoch, 0x756E6974)).permutation(len(order))
        order = [order[i] for i in perm]
    if num_shards == 1:
        return order, None, "single"
    mode = shard_by if shard_by != "auto" else ("unit" if len(order) >= num_shards else "row")
    if mode == "unit":
        return order[shard::num_shards], None, "unit"
    return order, (shard, num_shards), "row"


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    batches = table.combine_chunks().to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def _fast_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and (
        pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type))


class _Gather:
    """Rows of several record batches gathered in any order into new batches, each row copied once.

    pyarrow's ``take`` on a list column builds an index per *element*; for token lists a slice copy
    per row is ~10x faster, so long primitive lists take that path and everything else ``take``.
    """

    def __init__(self, batches: list[pa.RecordBatch]) -> None:
        self.schema = batches[0].schema
        self.base = np.cumsum([0] + [b.num_rows for b in batches])
        self.cols: list[Any] = []
        for i, f in enumerate(self.schema):
            chunks = [b.column(i) for b in batches]
            fast = _fast_list(f.type) and all(c.null_count == 0 and c.values.null_count == 0 for c in chunks)
            if fast:
                offs = [np.asarray(c.offsets, dtype=np.int64) for c in chunks]
                n_vals = sum(int(o[-1] - o[0]) for o in offs)
                fast = n_vals >= 16 * int(self.base[-1])  # short lists: take's per-element path is fine
            if fast:
                self.cols.append(("list", [c.values.to_numpy() for c in chunks],
                                  np.concatenate([o[:-1] for o in offs]), np.concatenate([o[1:] for o in offs])))
            else:
                self.cols.append(("arrow", pa.chunked_array(chunks, type=f.type)))

    def take(self, idx: np.ndarray) -> pa.RecordBatch:
        chunk: list[int] | None = None
        arrays = []
        for (kind, *rest), f in zip(self.cols, self.schema):
            if kind == "arrow":
                arrays.append(rest[0].take(pa.array(idx)).combine_chunks())
                continue
            values, starts, ends = rest
            if chunk is None:
                chunk = (np.searchsorted(self.base, idx, side="right") - 1).tolist()
            s, e = starts[idx], ends[idx]
            vt = f.type.value_type
            buf, flat = _pool_empty(int((e - s).sum()), values[0].dtype)
            if len(idx):
                np.concatenate([values[c][a:b] for c, a, b in zip(chunk, s.tolist(), e.tolist())], out=flat)
            child = pa.Array.from_buffers(vt, len(flat), [None, buf])
            offsets = np.zeros(len(idx) + 1, dtype=np.int64 if pa.types.is_large_list(f.type) else np.int32)
            np.cumsum(e - s, out=offsets[1:])
            arrays.append(pa.Array.from_buffers(f.type, len(idx), [None, pa.py_buffer(offsets)], children=[child]))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _pool_empty(shape: int | tuple[int, ...], dtype: Any) -> tuple[pa.Buffer, np.ndarray]:
    """An uninitialised writable array in Arrow's memory pool (mimalloc/jemalloc reuse freed pages;
    fresh NumPy allocations of this size are mmap'ed, page-faulted and zeroed each time)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    buf = pa.allocate_buffer(max(n * dtype.itemsize, 1))
    return buf, np.frombuffer(buf, dtype=dtype, count=n).reshape(shape)


def _pool_full(shape: tuple[int, ...], value: Any, dtype: Any) -> np.ndarray:
    arr = _pool_empty(shape, dtype)[1]
    arr.fill(value)
    return arr


class _Drain:
    """Yield ``count`` rows of ``pending`` as batches, one at a time; ``rest`` is what is left after."""

    def __init__(self, pending: list[pa.RecordBatch], held: int, count: int, batch_size: int,
                 rng: np.random.Generator | None) -> None:
        self.pending, self.held, self.count, self.batch_size, self.rng = pending, held, count, batch_size, rng
        self.rest: list[pa.RecordBatch] = []

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        count, bs = self.count, self.batch_size
        if self.rng is None:
            table = pa.Table.from_batches(self.pending)
            self.pending = []
            for i in range(0, count, bs):
                yield _one_batch(table.slice(i, min(bs, count - i)))
            rest = table.slice(count)
            self.rest = rest.to_batches() if rest.num_rows else []
            return
        perm = self.rng.permutation(self.held)
        g = _Gather(self.pending)
        self.pending = []
        if count < self.held:  # carried over: copied first, so the read batches are freed with g
            self.rest = [g.take(perm[count:])]
        for i in range(0, count, bs):
            yield g.take(perm[i : min(i + bs, count)])


def _rebatch(batches: Iterable[pa.RecordBatch], batch_size: int, rng: np.random.Generator | None,
             shuffle_rows: Callable[[pa.RecordBatch], int], drop_last: bool, stats: IterStats) -> Iterator[pa.RecordBatch]:
    """Exactly ``batch_size`` rows per batch; with ``rng``, shuffled in blocks of the shuffle buffer.

    Shuffling fills the buffer with ``target`` rows (zero-copy read batches), permutes it and emits
    every full batch, each row copied once; only the last partial batch's rows are carried over.
    Memory: at most ``target`` rows plus one read batch, plus the batch being built.
    """
    pending: list[pa.RecordBatch] = []
    held = 0
    target = batch_size
    if rng is not None:
        target = 0
    for b in batches:
        if b.num_rows == 0:
            continue
        if not target:
            target = max(batch_size, shuffle_rows(b))
            stats.shuffle_rows = target
        pending.append(b)
        held += b.num_rows
        stats.max_rows_held = max(stats.max_rows_held, held)
        if held < target:
            continue
        emit = held // batch_size * batch_size
        drain = _Drain(pending, held, emit, batch_size, rng)
        pending = []
        yield from drain
        pending = drain.rest
        held -= emit
    if held:
        end = held if not drop_last else held // batch_size * batch_size
        yield from _Drain(pending, held, end, batch_size, rng)


def _resolve_columns(source: Source, columns: Sequence[str] | None) -> list[str]:
    if columns is None:
        return list(source.schema.names)
    cols = list(columns)
    bad = [c for c in cols if c not in source.schema.names]
    if bad:
        raise SchemaError(f"unknown column {bad[0]!r}; the source has {', '.join(source.schema.names)}")
    return cols


def iter_batches(
    source: Any,
    where: str | pc.Expression | None = None,
    columns: Sequence[str] | None = None,
    batch_size: int = 256,
    *,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    shard: int = 0,
    num_shards: int = 1,
    shard_by: str = "auto",
    shuffle_buffer: int | None = None,
    read_rows: int | None = None,
    drop_last: bool = False,
    stats: IterStats | None = None,
) -> Iterator[pa.RecordBatch]:
    """Stream shard ``shard`` of ``num_shards`` of ``source`` as record batches of ``batch_size`` rows.

    The torch-free core of :class:`RolloutDataset`. Over all shards of one ``(seed, epoch)`` every
    matching row comes out exactly once. ``shuffle`` permutes the unit order (with the epoch's seed)
    and rows within a sliding buffer of ``shuffle_buffer`` rows (default: ~64 MiB of rows).
    ``read_rows`` is the read granularity (default: ~16 MiB of rows). ``stats`` (an ``IterStats``)
    is filled as the pass goes.
    """
    if batch_size <= 0:
        raise ValueError("batch_size must be positive")
    src = as_source(source)
    cols = _resolve_columns(src, columns)
    pred = compile_predicate(where, src.schema)
    stats = stats if stats is not None else IterStats()
    units, row_shard, mode = plan_shard(src.units(), shard, num_shards, seed=seed, epoch=epoch,
                                        shuffle=shuffle, shard_by=shard_by)
    stats.mode, stats.units = mode, len(units)
    width = src.row_bytes(cols)
    rows = read_rows or (int(min(max(_READ_BYTES / width, 64), 65536)) if width else 4096)
    stats.read_rows = rows

    def shuffle_rows(first: pa.RecordBatch) -> int:
        if shuffle_buffer:
            return int(shuffle_buffer)
        w = width or (first.nbytes / max(first.num_rows, 1))
        return int(min(max(_SHUFFLE_BYTES / max(w, 1), 1024), 1 << 20))

    rng = np.random.default_rng(_seed_int(seed, epoch, shard, num_shards)) if shuffle else None
    batches = src.read(units, columns=cols, predicate=pred, batch_rows=rows, shard=row_shard)
    for b in _rebatch(batches, batch_size, rng, shuffle_rows, drop_last, stats):
        stats.rows += b.num_rows
        stats.batches += 1
        yield b


# ------------------------------------------------------------------------------------------
# padding / collation
# ------------------------------------------------------------------------------------------
def _list_parts(arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flat values, row starts into them, row lengths) of a list array; null rows have length 0."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if pa.types.is_large_list(arr.type):
        arr = arr.cast(pa.list_(arr.type.value_type))
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    base = int(offsets[0]) if len(offsets) else 0
    end = int(offsets[-1]) if len(offsets) else 0
    flat = arr.values.slice(base, end - base)
    values = flat.to_numpy(zero_copy_only=False) if flat.null_count == 0 else flat.fill_null(0).to_numpy(zero_copy_only=False)
    starts = offsets[:-1] - base
    lengths = np.diff(offsets)
    if arr.null_count:
        lengths = np.where(np.asarray(arr.is_valid()), lengths, 0)
    return values, starts, lengths


def _scatter(out: np.ndarray | None, mask: np.ndarray | None, values: np.ndarray | None, starts: np.ndarray,
             lengths: np.ndarray, col0: np.ndarray) -> None:
    """out[i, col0[i] + k] = values[starts[i] + k] and mask[...] = 1, for k < lengths[i]."""
    total = int(lengths.sum())
    if total == 0:
        return
    if total >= 16 * len(lengths):  # long rows (token lists): one slice copy per row
        for i, (s, n, c) in enumerate(zip(starts.tolist(), lengths.tolist(), col0.tolist())):
            if n:
                if out is not None:
                    out[i, c : c + n] = values[s : s + n]
                if mask is not None:
                    mask[i, c : c + n] = 1
        return
    rows = np.repeat(np.arange(len(lengths)), lengths)
    k = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    cols = col0[rows] + k
    if out is not None:
        out[rows, cols] = values[starts[rows] + k]
    if mask is not None:
        mask[rows, cols] = 1


def _fit(lengths: np.ndarray, starts: np.ndarray, width: int | None, truncate: str) -> tuple[np.ndarray, np.ndarray, int]:
    w = int(lengths.max()) if width is None and len(lengths) else int(width or 0)
    kept = np.minimum(lengths, w)
    if truncate == "left":
        starts = starts + (lengths - kept)
    return kept, starts, w


def pad_lists(
    arr: pa.Array | pa.ChunkedArray,
    *,
    pad_value: int | float = 0,
    padding_side: str = "right",
    width: int | None = None,
    truncation_side: str = "right",
    dtype: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Pad a list column into ``(values [B, W], mask [B, W] int64)`` NumPy arrays.

    ``width`` fixes W (longer rows are cut on ``truncation_side``: ``"right"`` keeps the first
    tokens, ``"left"`` the last); default W = the longest row. ``padding_side`` puts the padding
    after (``"right"``) or before (``"left"``) each row's values.
    """
    if padding_side not in ("right", "left") or truncation_side not in ("right", "left"):
        raise ValueError("padding_side and truncation_side must be 'right' or 'left'")
    values, starts, lengths = _list_parts(arr)
    kept, starts, w = _fit(lengths, starts, width, truncation_side)
    out = np.full((len(lengths), w), pad_value, dtype=dtype or values.dtype)
    mask = np.zeros((len(lengths), w), dtype=np.int64)
    col0 = (w - kept) if padding_side == "left" else np.zeros_like(kept)
    _scatter(out, mask, values, starts, kept, col0)
    return out, mask


def _scalar_column(col: pa.ChunkedArray | pa.Array) -> Any:
    t = col.type
    if pa.types.is_boolean(t):
        if col.null_count:
            return col.to_pylist()
        return np.asarray(col.to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_integer(t) or pa.types.is_floating(t):  # copies: tensors want writable memory
        if col.null_count:
            return np.array(pc.fill_null(col.cast(pa.float64()), math.nan).to_numpy(zero_copy_only=False),
                            dtype=np.float32 if pa.types.is_floating(t) or t.bit_width <= 16 else np.float64)
        return np.array(col.to_numpy(zero_copy_only=False))
    if pa.types.is_timestamp(t):
        return np.array(col.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False))
    return col.to_pylist()


def pad_collate(
    batch: pa.RecordBatch | pa.Table,
    *,
    pad_token_id: int = 0,
    padding_side: str = "right",
    prompt_padding_side: str | None = None,
    response_padding_side: str | None = None,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    return_tensors: str = "pt",
) -> dict[str, Any]:
    """Collate a record batch of rollouts into padded tensors with attention masks.

    Returns, for B rows:

    * ``prompt_ids`` / ``prompt_attention_mask`` [B, Lp] (padding on ``prompt_padding_side``,
      default ``padding_side``; cut to ``max_prompt_length`` keeping the *last* tokens);
    * ``response_ids`` / ``response_mask`` [B, Lr] (padding on ``response_padding_side``; cut to
      ``max_response_length`` keeping the *first* tokens), ``response_logprobs`` [B, Lr] float32
      (0.0 at padding) when that column is present;
    * ``input_ids`` / ``attention_mask`` / ``position_ids`` / ``loss_mask`` [B, L]: prompt then
      response packed per row, padded on ``padding_side``; ``loss_mask`` marks response tokens and
      ``position_ids`` count real tokens from 0 (as verl's ``compute_position_id_with_mask``);
    * every other column: numeric/bool as a [B] tensor (nullable numbers as float with NaN),
      timestamps as int64 microseconds, strings and the rest as Python lists.

    Token ids are int64 (what embedding layers take). ``return_tensors="np"`` returns NumPy arrays
    (no torch needed). ``max_*_length`` also fixes the width (constant shapes across batches).
    Use with ``functools.partial`` to set options: ``collate=partial(pad_collate, padding_side="left")``.
    """
    if return_tensors not in ("pt", "np"):
        raise ValueError("return_tensors must be 'pt' or 'np'")
    torch = _import_torch() if return_tensors == "pt" else None
    if return_tensors == "pt" and torch is None:
        raise ImportError("pad_collate(return_tensors='pt') needs torch: pip install 'lakebuffer[torch]'")
    if isinstance(batch, pa.Table):
        batch = _one_batch(batch)
    names = batch.schema.names
    out: dict[str, Any] = {}
    p_side = prompt_padding_side or padding_side
    r_side = response_padding_side or padding_side
    parts = {}
    if "prompt_ids" in names:
        v, s, n = _list_parts(batch.column("prompt_ids"))
        kept, s, w = _fit(n, s, max_prompt_length, "left")
        ids = _pool_full((len(n), w), pad_token_id, np.int64)
        m = _pool_full((len(n), w), 0, np.int64)
        _scatter(ids, m, v, s, kept, (w - kept) if p_side == "left" else np.zeros_like(kept))
        out["prompt_ids"], out["prompt_attention_mask"] = ids, m
        parts["prompt"] = (v, s, kept)
    if "response_ids" in names:
        v, s, n = _list_parts(batch.column("response_ids"))
        kept, s, w = _fit(n, s, max_response_length, "right")
        ids = _pool_full((len(n), w), pad_token_id, np.int64)
        m = _pool_full((len(n), w), 0, np.int64)
        col0 = (w - kept) if r_side == "left" else np.zeros_like(kept)
        _scatter(ids, m, v, s, kept, col0)
        out["response_ids"], out["response_mask"] = ids, m
        parts["response"] = (v, s, kept)
        if "response_logprobs" in names:
            lv, ls, ln = _list_parts(batch.column("response_logprobs"))
            lk = np.minimum(ln, kept)
            lp = _pool_full((len(n), w), 0, np.float32)
            _scatter(lp, None, lv.astype(np.float32, copy=False), ls, lk,
                     (w - lk) if r_side == "left" else np.zeros_like(lk))
            out["response_logprobs"] = lp
    if parts:
        b = batch.num_rows
        pk = parts["prompt"][2] if "prompt" in parts else np.zeros(b, np.int64)
        rk = parts["response"][2] if "response" in parts else np.zeros(b, np.int64)
        total = pk + rk
        w = int(total.max()) if b else 0
        ids = _pool_full((b, w), pad_token_id, np.int64)
        attn = _pool_full((b, w), 0, np.int64)
        loss = _pool_full((b, w), 0, np.int64)
        shift = (w - total) if padding_side == "left" else np.zeros_like(total)
        if "prompt" in parts:
            v, s, k = parts["prompt"]
            _scatter(ids, attn, v, s, k, shift)
        if "response" in parts:
            v, s, k = parts["response"]
            _scatter(ids, attn, v, s, k, shift + pk)
            _scatter(None, loss, None, s, k, shift + pk)
        out["input_ids"], out["attention_mask"], out["loss_mask"] = ids, attn, loss
        pos = _pool_empty((b, w), np.int64)[1]
        np.cumsum(attn, axis=1, out=pos)
        np.subtract(pos, 1, out=pos)
        np.maximum(pos, 0, out=pos)
        out["position_ids"] = pos
    for name in names:
        if name in ("prompt_ids", "response_ids", "response_logprobs"):
            continue
        col = batch.column(name)
        if pa.types.is_nested(col.type):
            out[name] = col.to_pylist()
        else:
            out[name] = _scalar_column(col)
    if return_tensors == "pt":
        out = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in out.items()}
    return out


# ------------------------------------------------------------------------------------------
# torch datasets
# ------------------------------------------------------------------------------------------
def _dist_rank_world() -> tuple[int, int]:
    torch = sys.modules.get("torch")  # never imported: no process group and no DataLoader worker
    if torch is not None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _worker() -> tuple[int, int]:
    torch = sys.modules.get("torch")
    if torch is not None:
        info = torch.utils.data.get_worker_info()
        if info is not None:
            return info.id, info.num_workers
    return 0, 1


class _RolloutDataset:
    """A PyTorch ``IterableDataset`` of rollout batches from a buffer or a lake.

    Each item is one batch of ``batch_size`` rows: a ``pa.RecordBatch``, or ``collate(batch)``
    (e.g. :func:`pad_collate`). Use it with ``DataLoader(ds, batch_size=None, num_workers=k)``
    (or ``ds.loader(num_workers=k)``): the dataset batches, the loader must not.

    Rows are sharded over ``world_size`` ranks (default: torch.distributed's when initialised, else
    one) times the loader's workers; call ``set_epoch(e)`` before each epoch for a new, reproducible
    order (as with ``DistributedSampler``; with ``persistent_workers=True`` the workers keep the
    epoch they were started with). See the module docstring for how shards are assigned.

    ``source``: a ``ReplayBuffer``, a lake view (``ReplayBuffer.open_lake``), a ``Lake``, a
    ``pyarrow.dataset.Dataset``, a Parquet path or a table. ``where``: SQL or a pyarrow expression.
    Keyword-only: ``drop_last`` (drop each shard's short last batch), ``shard_by`` (``"auto"``,
    ``"unit"``, ``"row"``), ``shuffle_buffer`` (rows), ``read_rows`` (read granularity), ``unit``
    (``"file"`` or ``"row_group"`` for Parquet sources). Without torch installed it is a plain
    iterable (``iter_batches(worker_id, num_workers)`` gives a shard's record batches).
    """

    def __init__(
        self,
        source: Any,
        where: str | pc.Expression | None = None,
        columns: Sequence[str] | None = None,
        batch_size: int = 256,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        collate: Callable[[pa.RecordBatch], Any] | None = None,
        *,
        drop_last: bool = False,
        shard_by: str = "auto",
        shuffle_buffer: int | None = None,
        read_rows: int | None = None,
        unit: str = "file",
    ) -> None:
        self.source = as_source(source, unit=unit)
        self.columns = _resolve_columns(self.source, columns)
        compile_predicate(where, self.source.schema)  # fail early on a bad predicate
        self.where = where
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither")
        if rank is None:
            rank, world_size = _dist_rank_world()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world_size {world_size}")
        self.rank, self.world_size = int(rank), int(world_size)
        self.collate = collate
        self.drop_last = drop_last
        self.shard_by = shard_by
        self.shuffle_buffer = shuffle_buffer
        self.read_rows = read_rows
        self.epoch = 0
        self.last_stats: IterStats | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def shard(self, worker_id: int | None = None, num_workers: int | None = None) -> tuple[int, int]:
        """``(shard, num_shards)`` of this rank and DataLoader worker."""
        if worker_id is None:
            worker_id, num_workers = _worker()
        return self.rank * num_workers + worker_id, self.world_size * num_workers

    def iter_batches(self, worker_id: int | None = None, num_workers: int | None = None) -> Iterator[pa.RecordBatch]:
        """The raw record batches of this rank and worker (what ``__iter__`` collates)."""
        shard, num_shards = self.shard(worker_id, num_workers)
        self.last_stats = IterStats()
        return iter_batches(
            self.source, self.where, self.columns, self.batch_size, shuffle=self.shuffle, seed=self.seed,
            epoch=self.epoch, shard=shard, num_shards=num_shards, shard_by=self.shard_by,
            shuffle_buffer=self.shuffle_buffer, read_rows=self.read_rows, drop_last=self.drop_last,
            stats=self.last_stats,
        )

    def __iter__(self) -> Iterator[Any]:
        for b in self.iter_batches():
            yield self.collate(b) if self.collate is not None else b

    def loader(self, num_workers: int = 0, **kwargs: Any):
        """A ``torch.utils.data.DataLoader`` over this dataset (``batch_size=None``)."""
        torch = _import_torch()
        if torch is None:
            raise ImportError("RolloutDataset.loader needs torch: pip install 'lakebuffer[torch]'")
        return torch.utils.data.DataLoader(self, batch_size=None, num_workers=num_workers, **kwargs)


class _SamplingDataset:
    """Online replay: a map-style dataset whose item ``i`` is a fresh sample from any registered sampler.

    ``len(ds) == n_steps``; ``ds[i]`` calls ``buffer.sample(batch_size, where, sampler, columns,
    seed=f(seed, epoch, i), **sampler_options)`` and returns the batch as a ``pa.RecordBatch`` or
    ``collate(batch)``. Deterministic for a given buffer content, seed, epoch and step. The samples
    are drawn when the item is asked for, so rollouts pushed meanwhile are eligible. Use it in the
    process that owns the buffer: ``DataLoader(ds, batch_size=None, num_workers=0)`` or iterate it.
    """

    def __init__(
        self,
        buffer: Any,
        n_steps: int,
        batch_size: int,
        sampler: Any = "uniform",
        where: str | None = None,
        columns: Sequence[str] | None = None,
        seed: int = 0,
        collate: Callable[[pa.RecordBatch], Any] | None = None,
        **sampler_options: Any,
    ) -> None:
        if n_steps < 0 or batch_size <= 0:
            raise ValueError("n_steps must be >= 0 and batch_size positive")
        self.buffer = buffer
        self.n_steps = int(n_steps)
        self.batch_size = int(batch_size)
        self.sampler = sampler
        self.where = where
        self.columns = list(columns) if columns is not None else None
        self.seed = int(seed)
        self.collate = collate
        self.sampler_options = sampler_options
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.n_steps

    def sample(self, step: int) -> pa.RecordBatch:
        table = self.buffer.sample(self.batch_size, where=self.where, sampler=self.sampler, columns=self.columns,
                                   seed=_seed_int(self.seed, self.epoch, step), **self.sampler_options)
        return _one_batch(table)

    def __getitem__(self, step: int) -> Any:
        if not -self.n_steps <= step < self.n_steps:
            raise IndexError(step)
        b = self.sample(step % self.n_steps)
        return self.collate(b) if self.collate is not None else b

    def __iter__(self) -> Iterator[Any]:
        for i in range(self.n_steps):
            yield self[i]


if TYPE_CHECKING:
    RolloutDataset = _RolloutDataset
    SamplingDataset = _SamplingDataset


def __getattr__(name: str) -> Any:
    """``RolloutDataset`` / ``SamplingDataset`` are built on first use, on torch's ``IterableDataset`` /
    ``Dataset`` when torch is installed (so DataLoader treats them right), on ``object`` otherwise;
    importing this module never imports torch."""
    if name not in ("RolloutDataset", "SamplingDataset"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    torch = _import_torch()
    impl = _RolloutDataset if name == "RolloutDataset" else _SamplingDataset
    if torch is None:
        base: type = object
    else:
        base = torch.utils.data.IterableDataset if name == "RolloutDataset" else torch.utils.data.Dataset
    cls = type(name, (impl, base), {"__module__": __name__, "__doc__": impl.__doc__, "__qualname__": name})
    globals()[name] = cls
    return cls


# ------------------------------------------------------------------------------------------
# Ray Data
# ------------------------------------------------------------------------------------------
def _duck_filter(batch: pa.Table, *, sql: str) -> pa.Table:
    flt = _RowFilter(sql, batch.schema.names, None, batch.schema.names)
    return pa.Table.from_batches([flt(b) for b in batch.to_batches()], schema=batch.schema)


def _arrow_filter(batch: pa.Table, *, expr: pc.Expression) -> pa.Table:
    return batch.filter(expr)


def _ray_partitioning(schema: pa.Schema, files: list[str]):
    """Ray's hive ``Partitioning`` for the lake layout (``run_id=.../policy_bucket=...``), typed from the schema."""
    import posixpath

    from ray.data.datasource.partitioning import Partitioning

    parts = posixpath.commonpath([posixpath.dirname(f) for f in files]).split("/")
    while parts and "=" in parts[-1]:
        parts.pop()
    base = "/".join(parts)
    rel = files[0][len(base):].strip("/").split("/")[:-1]
    names = [seg.split("=", 1)[0] for seg in rel if "=" in seg]
    if not names:
        return None
    types = {}
    for name in names:
        t = schema.field(name).type if name in schema.names else pa.string()
        t = t.value_type if pa.types.is_dictionary(t) else t
        types[name] = int if pa.types.is_integer(t) else float if pa.types.is_floating(t) else str
    return Partitioning("hive", base_dir=base, field_names=names, field_types=types)


def to_ray(source: Any, where: str | pc.Expression | None = None, columns: Sequence[str] | None = None,
           **read_parquet_args: Any):
    """A ``ray.data.Dataset`` of the rollouts of a lake (or a live buffer), ``where`` and ``columns`` pushed down.

    Over a lake, a read-only view or a pyarrow dataset of Parquet files this is
    ``ray.data.read_parquet(files).select_columns(<projection + predicate columns>)`` then
    ``.filter(expr=<ray.data.expressions predicate>)``; Ray's optimizer pushes both into each
    Parquet read (only those columns are decoded; row groups whose statistics cannot match are
    skipped). On a Ray without ``ray.data.expressions`` they are passed as ``columns=`` /
    ``filter=`` (a pyarrow expression) to ``read_parquet``.
    ``where`` is SQL: simple predicates are translated (see :func:`sql_to_expression`); anything
    else, or a pyarrow expression, is applied exactly after the read in a ``map_batches`` (DuckDB
    or pyarrow; correct, not pushed down). The lake's tombstones are applied the same way. A live
    ``ReplayBuffer`` has no files: its ``scan`` snapshot is copied into Ray's object store
    (``ray.data.from_arrow``); for large data read its lake (``to_ray(buffer.lake)``).
    Other keyword arguments go to ``ray.data.read_parquet``.
    """
    import ray.data

    src = as_source(source)
    cols = _resolve_columns(src, columns)
    pred = compile_predicate(where, src.schema)
    empty = pa.schema([src.schema.field(c) for c in cols]).empty_table()
    if not (isinstance(src, ArrowDatasetSource) and src.file_based):
        tables = [pa.Table.from_batches([b]) for b in
                  src.read(src.units(), columns=cols, predicate=pred, batch_rows=8192, shard=None) if b.num_rows]
        return ray.data.from_arrow(tables or [empty])
    files = src.files()
    if not files:
        return ray.data.from_arrow(empty)
    ray_expr = None
    if pred.sql is not None and pred.exact:
        try:
            ray_expr = _Parser(_tokenize(pred.sql), _RayBuild()).parse()
        except ImportError:  # a Ray without expressions: pyarrow filter= on the read
            read_parquet_args["filter"] = pred.expression
    post: list[tuple[Any, dict]] = []
    if pred.sql is not None and not pred.exact:
        post.append((_duck_filter, {"sql": pred.sql}))
    elif pred.sql is None and pred.expression is not None:
        post.append((_arrow_filter, {"expr": pred.expression}))
    if src.base_filter is not None:
        post.append((_arrow_filter, {"expr": src.base_filter}))
    need = list(pred.columns)
    if pred.sql is None and pred.expression is not None:
        need += _metadata_names(src.schema)  # an opaque expression: give it every metadata column
    if src.base_filter is not None:
        need += [c for c in ("key", "run_id") if c in src.schema.names]
    read_cols = list(dict.fromkeys([*cols, *need]))
    kwargs = dict(read_parquet_args)
    part = _ray_partitioning(src.schema, files)
    if part is not None:
        kwargs.setdefault("partitioning", part)
    if "filter" in read_parquet_args:  # an older Ray: projection and filter as read arguments
        rds = ray.data.read_parquet(files, filesystem=src.filesystem, columns=read_cols, **kwargs)
    else:  # select_columns / filter(expr=) are pushed into the Parquet read by Ray's optimizer
        rds = ray.data.read_parquet(files, filesystem=src.filesystem, **kwargs).select_columns(read_cols)
    if ray_expr is not None:
        rds = rds.filter(expr=ray_expr)
    for fn, fn_kwargs in post:
        rds = rds.map_batches(fn, batch_format="pyarrow", fn_kwargs=fn_kwargs, batch_size=None)
    if read_cols != cols:
        rds = rds.select_columns(cols)
    return rds


# ------------------------------------------------------------------------------------------
# benchmark
# ------------------------------------------------------------------------------------------
def _tokens(b: pa.RecordBatch) -> int:
    n = 0
    for c in ("prompt_ids", "response_ids"):
        if c in b.schema.names:
            off = b.column(c).offsets
            n += off[len(off) - 1].as_py() - off[0].as_py() if len(off) else 0
    return n


def bench_dataset(path_or_lake: Any, *, columns: Sequence[str] | None = ("prompt_ids", "response_ids", "reward"),
                  batch_size: int = 256, repeats: int = 3, where: str | None = None,
                  collate: bool = True) -> dict[str, Any]:
    """Dataset iteration throughput next to a raw ``pyarrow.dataset`` scan of the same files, same run.

    Cases (run interleaved, one warm-up round first, medians of ``repeats``): ``raw`` =
    ``Dataset.scanner(columns=...).to_batches()`` with pyarrow's defaults; ``dataset`` =
    :func:`iter_batches` unshuffled; ``dataset_shuffled`` = shuffled (the ``RolloutDataset``
    default); ``dataset_collated`` = shuffled plus :func:`pad_collate` to NumPy (work the raw scan
    does not do). Each reports rows/s, tokens/s (prompt + response tokens), wall and CPU seconds;
    ``ratio_vs_raw`` is rows/s over raw's, ``cpu_ratio_vs_raw`` raw's CPU time over this one's
    (steadier than wall time on a shared machine).
    """
    src = as_source(path_or_lake)
    if not isinstance(src, ArrowDatasetSource):
        raise TypeError("bench_dataset reads a lake or a Parquet dataset")
    cols = _resolve_columns(src, columns)
    expr = sql_to_expression(where, src.schema) if where else None
    if where and expr is None:
        raise ValueError("bench_dataset needs a where that translates to a pyarrow expression (for the raw scan)")

    def raw():
        scan = src.dataset.scanner(columns=cols, filter=expr) if expr is not None else src.dataset.scanner(columns=cols)
        yield from scan.to_batches()

    def mine(shuffle: bool):
        return iter_batches(src, where, cols, batch_size, shuffle=shuffle, seed=1)

    def collated():
        for b in mine(True):
            pad_collate(b, return_tensors="np")
            yield b

    cases = {"raw": raw, "dataset": lambda: mine(False), "dataset_shuffled": lambda: mine(True)}
    if collate:
        cases["dataset_collated"] = collated
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    counts: dict[str, tuple[int, int]] = {}
    for rep in range(repeats + 1):
        for name, fn in cases.items():
            t0, c0 = time.perf_counter(), time.process_time()
            rows = tokens = 0
            for b in fn():
                rows += b.num_rows
                tokens += _tokens(b)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if rep:  # the first round warms the page cache
                times[name].append((dt, dc))
            counts[name] = (rows, tokens)
    out: dict[str, Any] = {"files": len(src.files()), "columns": cols, "batch_size": batch_size, "repeats": repeats,
                           "bytes_on_disk": sum(_file_size(src, f) for f in src._frags)}
    for name in cases:
        wall = float(np.median([t[0] for t in times[name]]))
        cpu = float(np.median([t[1] for t in times[name]]))
        rows, tokens = counts[name]
        out[name] = {"rows": rows, "tokens": tokens, "seconds": wall, "cpu_seconds": cpu,
                     "rows_per_s": rows / wall, "tokens_per_s": tokens / wall}
    base = out["raw"]
    for name in cases:
        if name != "raw":
            out[name]["ratio_vs_raw"] = out[name]["rows_per_s"] / base["rows_per_s"]
            out[name]["cpu_ratio_vs_raw"] = base["cpu_seconds"] / out[name]["cpu_seconds"]
    return out


def _file_size(src: ArrowDatasetSource, frag: Any) -> int:
    path = getattr(frag, "path", None)
    fs = src.filesystem
    if path is None or fs is None:
        return 0
    try:
        return int(fs.get_file_info(path).size or 0)
    except (OSError, pa.ArrowException):
        return 0
