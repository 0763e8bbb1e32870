"""Predicates for the dataset layer: a ``where`` compiled for one source schema, and the DuckDB row filter.

A SQL ``where`` is parsed once by :mod:`lakebuffer.predicate`; what its simple subset translates to
is pushed into pyarrow scans (row-group and partition pruning), and the rest is evaluated exactly by
:class:`RowFilter`: DuckDB on the few referenced columns of each batch, the payload then taken in
Arrow without ever passing through DuckDB.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import QueryError
from ..predicate import Untranslatable, bind, parse

ROW_COL = "__lb_row"


def sql_to_expression(where: str, schema: pa.Schema | None = None) -> pc.Expression | None:
    """Translate a simple SQL predicate to a pyarrow expression, or ``None`` when it is not simple.

    Understood: comparisons (``= == != <> < <= > >=``), ``AND``/``OR``/``NOT``, ``IN (...)``,
    ``BETWEEN``, ``IS [NOT] NULL``, parentheses, column names (bare or ``"quoted"``) and literals
    (numbers, ``'strings'``, ``TRUE``/``FALSE``/``NULL``). With ``schema`` the expression is also
    bound (type-checked) against it, and ``None`` is returned when that fails (e.g. comparing a
    timestamp with a string: DuckDB casts, pyarrow does not).
    """
    try:
        return parse(where).to_pyarrow(schema)
    except (Untranslatable, QueryError):
        return None


def sql_to_ray_expression(where: str, schema: pa.Schema | None = None) -> Any:
    """The ``ray.data.expressions`` predicate for a simple SQL ``where`` (``None`` when not simple)."""
    if sql_to_expression(where, schema) is None:
        return None
    return parse(where).to_ray()


def metadata_names(schema: pa.Schema) -> list[str]:
    """The non-nested columns: what an opaque predicate may need."""
    return [f.name for f in schema if not pa.types.is_nested(f.type)]


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
    """``where`` (SQL or a pyarrow expression) compiled for ``schema``; ``QueryError`` when it is not valid."""
    if where is None or (isinstance(where, str) and not where.strip()):
        return Predicate(None, None, True, ())
    if isinstance(where, pc.Expression):
        try:
            bind(where, schema)
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise QueryError(f"cannot apply {where} to this source: {e}") from e
        return Predicate(None, where, True, ())
    if not isinstance(where, str):
        raise TypeError(f"where must be a SQL string or a pyarrow expression, not {type(where).__name__}")
    parsed = parse(where)  # the one validity check: QueryError for anything but one expression
    if parsed.is_true:
        return Predicate(None, None, True, ())
    try:
        expr = parsed.to_pyarrow(schema)
    except Untranslatable:
        expr = None
    names = parsed.columns
    return Predicate(where, expr, expr is not None, tuple(n for n in schema.names if n in names))


class RowFilter:
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

            from ..sandbox import sandbox

            self.con = duckdb.connect()
            self.con.execute("SET threads TO 1")
            sandbox(self.con)
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
            names=[*have, ROW_COL],
        )
        self.con.register("__lb_batch", small)
        try:
            res = self.con.execute(f"SELECT {ROW_COL} FROM __lb_batch WHERE {self.cond}").fetchnumpy()
        except duckdb.BinderException as e:
            if retry and self.fallback != columns:  # a column the parse did not name: send them all
                return self._select(batch, self.fallback, retry=False)
            raise QueryError(f"{type(e).__name__}: {e}") from e
        except duckdb.Error as e:
            raise QueryError(f"{type(e).__name__}: {e}") from e
        finally:
            self.con.unregister("__lb_batch")
        return np.asarray(res[ROW_COL], dtype=np.int64)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["con"] = None
        return state

