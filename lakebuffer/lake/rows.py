"""Arrow helpers of the lake: schema (de)serialisation, column juggling, input batches (conforming
and key arrays are ``lakebuffer.schema``'s, one copy for the whole package).

Vectorised Arrow/NumPy only (no per-row Python): they sit on the snapshot and restore paths.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from .layout import PARTITION_FIELDS


def schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_from_b64(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def without(schema: pa.Schema, names: Iterable[str]) -> pa.Schema:
    drop = set(names)
    return pa.schema([f for f in schema if f.name not in drop], metadata=schema.metadata)


def with_run_id(schema: pa.Schema) -> pa.Schema:
    """The row schema of a run: the file schema with ``run_id`` where the rollout schema has it."""
    if "run_id" in schema.names:
        return schema
    pos = schema.get_field_index("key") + 1 if "key" in schema.names else 0
    return schema.insert(pos, PARTITION_FIELDS[0])


def floor_buckets(pv: pa.Array | pa.ChunkedArray, size: int) -> np.ndarray:
    arr = pv.to_numpy()
    return np.floor_divide(arr, size) if size != 1 else arr


def without_columns(batch: pa.RecordBatch | pa.Table, names: Iterable[str]) -> pa.RecordBatch | pa.Table:
    drop = [n for n in names if n in batch.schema.names]
    return batch.drop_columns(drop) if drop else batch


def iter_input(batches: Any) -> Iterator[pa.RecordBatch]:
    """Record batches of a table, batch, reader, polars frame or an iterable of those, streamed."""
    if isinstance(batches, (pa.Table, pa.RecordBatch, pa.RecordBatchReader)):
        batches = [batches]
    for item in batches:
        if isinstance(item, pa.RecordBatch):
            yield item
        elif isinstance(item, pa.Table):
            yield from item.to_batches()
        elif isinstance(item, pa.RecordBatchReader):
            yield from item
        elif hasattr(item, "to_arrow"):  # polars
            yield from item.to_arrow().to_batches()
        else:
            raise TypeError(f"commit_snapshot takes pa.Table / pa.RecordBatch items, not {type(item).__name__}")
