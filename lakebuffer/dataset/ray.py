"""Ray Data: :func:`to_ray` reads a lake (or a live buffer) as a ``ray.data.Dataset``.

Projection and the simple part of ``where`` are pushed into Ray's Parquet reads (Ray's optimizer
pushes ``select_columns`` and ``filter(expr=...)`` into each read); the rest is applied exactly after
the read. Ray is imported only when called.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..predicate import parse
from .filters import RowFilter, compile_predicate, metadata_names
from .sources import ArrowDatasetSource, as_source, resolve_columns


def _duck_filter(batch: pa.Table, *, sql: str) -> pa.Table:
    flt = RowFilter(sql, batch.schema.names, None, batch.schema.names)
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
    or pyarrow; correct, not pushed down); so is a filter the dataset carries. A live
    ``ReplayBuffer`` has no files: its ``scan`` snapshot is copied into Ray's object store
    (``ray.data.from_arrow``); for large data read its lake (``to_ray(buffer.lake)``).
    Other keyword arguments go to ``ray.data.read_parquet``.
    """
    import ray.data

    src = as_source(source)
    cols = resolve_columns(src, columns)
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
            ray_expr = parse(pred.sql).to_ray()
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
        need += metadata_names(src.schema)  # an opaque expression: give it every metadata column
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
