"""The rollout schema (declared in ``schemas/rollout.json``) and validation of pushed batches.

Every input type ``push`` accepts is turned into one ``pa.Table`` conforming to the buffer's
schema here, before anything is stored, so a bad batch fails whole and loses nothing.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import SchemaError
from .resources import resource_dir

SCHEMA_FILE = resource_dir("schemas") / "rollout.json"

def parse_type(text: str) -> pa.DataType:
    """Parse the type language of the schema file: pyarrow's own aliases (``int32``, ``string``,
    ``timestamp[us]``, ... via ``pa.type_for_alias``) plus ``list<T>`` and ``timestamp[unit, tz]``,
    which pyarrow has no alias for."""
    text = text.strip()
    m = re.fullmatch(r"list<(.+)>", text)
    if m:
        return pa.list_(parse_type(m.group(1)))
    m = re.fullmatch(r"timestamp\[(\w+),\s*(\S+)\]", text)
    if m:
        return pa.timestamp(m.group(1), tz=m.group(2))
    try:
        return pa.type_for_alias(text)
    except ValueError:
        raise ValueError(f"unknown type in schema file: {text!r}") from None


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type: pa.DataType
    nullable: bool
    required: bool
    default: str | None
    payload: bool


def _load_specs() -> tuple[list[FieldSpec], dict[str, Any]]:
    doc = json.loads(SCHEMA_FILE.read_text())
    specs = [
        FieldSpec(
            name=f["name"],
            type=parse_type(f["type"]),
            nullable=bool(f.get("nullable", True)),
            required=bool(f.get("required", False)),
            default=f.get("default"),
            payload=bool(f.get("payload", False)),
        )
        for f in doc["fields"]
    ]
    return specs, doc.get("partitioning", {})


FIELD_SPECS, PARTITIONING = _load_specs()
ROLLOUT_SCHEMA: pa.Schema = pa.schema(
    [pa.field(s.name, s.type, nullable=s.nullable) for s in FIELD_SPECS],
    metadata={"lakebuffer.schema": "rollout/1"},
)
_SPEC_BY_NAME = {s.name: s for s in FIELD_SPECS}
PAYLOAD_COLUMNS = tuple(s.name for s in FIELD_SPECS if s.payload)


def metadata_columns(schema: pa.Schema) -> list[str]:
    """Columns small enough to keep in the metadata catalog: every non-nested column."""
    return [f.name for f in schema if not pa.types.is_nested(f.type) and not _is_binary(f.type)]


def _is_binary(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


def projection(schema: pa.Schema, columns: Any) -> tuple[list[str], list[str]]:
    """The columns asked for (all if None) and the columns to read: those plus ``key`` (to align rows)."""
    cols = list(columns) if columns is not None else list(schema.names)
    names = set(schema.names)
    bad = [c for c in cols if c not in names]
    if bad:
        raise SchemaError(f"unknown column {bad[0]!r}; the schema has {', '.join(schema.names)}")
    return cols, cols if "key" in cols else [*cols, "key"]


def key_list(keys: Any) -> list[str]:
    """Keys given as an Arrow array or any sequence, as a Python list."""
    return keys.to_pylist() if isinstance(keys, (pa.Array, pa.ChunkedArray)) else list(keys)


def merge_schema(user: pa.Schema | None) -> pa.Schema:
    """The buffer schema: the rollout schema plus the user's extra columns (built-ins may not change type)."""
    if user is None:
        return ROLLOUT_SCHEMA
    fields = list(ROLLOUT_SCHEMA)
    for f in user:
        spec = _SPEC_BY_NAME.get(f.name)
        if spec is None:
            fields.append(f)
        elif not f.type.equals(spec.type):
            raise SchemaError(f"column {f.name!r} must be {spec.type}, the schema given has {f.type}")
    return pa.schema(fields, metadata=ROLLOUT_SCHEMA.metadata)


def to_table(data: Any) -> pa.Table:
    """Turn any supported input into a ``pa.Table`` without copying Arrow data."""
    try:
        return _to_table(data)
    except UnicodeEncodeError as e:  # Python text Arrow cannot hold (a lone surrogate): the user's input
        raise SchemaError(f"a text value is not valid UTF-8 ({e.reason}: {e.object[e.start:e.end]!r} "
                          f"in {e.object!r}); strings must be encodable text") from e


def _to_table(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if hasattr(data, "__arrow_c_stream__") and type(data).__module__.split(".")[0] != "pandas":
        # the Arrow PyCapsule protocol: polars, DuckDB relations, nanoarrow, ... hand over their
        # columns without a copy and without lakebuffer knowing the library
        try:
            return pa.table(data)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
            raise SchemaError(f"cannot read {type(data).__name__} through the Arrow C stream: {e}") from e
    mod = type(data).__module__.split(".")[0]
    if mod == "pandas":
        return pa.Table.from_pandas(data, preserve_index=False)
    if isinstance(data, dict):
        try:
            return pa.table({k: v if isinstance(v, (pa.Array, pa.ChunkedArray)) else _to_array(v) for k, v in data.items()})
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
            raise SchemaError(f"cannot build columns from dict: {e}") from e
    if isinstance(data, list):
        if not data:
            return pa.table({})
        if not all(isinstance(r, dict) for r in data):
            raise SchemaError("a list passed to push must hold dict rows")
        try:
            return pa.Table.from_pylist(data)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise SchemaError(f"cannot build a table from rows: {e}") from e
    raise SchemaError(
        f"push accepts pa.RecordBatch, pa.Table, polars/pandas DataFrame, list of dicts or dict of columns, not {type(data).__name__}"
    )


def _to_array(v: Any) -> pa.Array:
    if isinstance(v, np.ndarray) and v.ndim == 2:
        # a 2-D token matrix: one list per row, zero-copy offsets over the flat buffer
        n, width = v.shape
        offsets = pa.array(np.arange(0, (n + 1) * width, width, dtype=np.int32))
        return pa.ListArray.from_arrays(offsets, pa.array(v.reshape(-1)))
    return pa.array(v)


def _compatible(src: pa.DataType, dst: pa.DataType) -> bool:
    """Casts we accept silently: same family (ints to ints, floats, lists of those, strings, times),
    including the view layouts the Arrow C stream of polars and others hands over."""
    if src.equals(dst) or pa.types.is_null(src):
        return True
    if pa.types.is_integer(dst):
        return pa.types.is_integer(src)
    if pa.types.is_floating(dst):
        return pa.types.is_integer(src) or pa.types.is_floating(src)
    if pa.types.is_string(dst) or pa.types.is_large_string(dst):
        return (pa.types.is_string(src) or pa.types.is_large_string(src) or pa.types.is_string_view(src)
                or pa.types.is_dictionary(src))
    if pa.types.is_timestamp(dst):
        return pa.types.is_timestamp(src) or pa.types.is_date(src)
    if pa.types.is_boolean(dst):
        return pa.types.is_boolean(src)
    if pa.types.is_list(dst) or pa.types.is_large_list(dst):
        if (pa.types.is_list(src) or pa.types.is_large_list(src) or pa.types.is_fixed_size_list(src)
                or pa.types.is_list_view(src) or pa.types.is_large_list_view(src)):
            return _compatible(src.value_type, dst.value_type)
        return False
    return False


def conform(table: pa.Table, schema: pa.Schema, *, run_id: str, now: Any, keys: pa.Array | None,
            finite_rewards: bool = True) -> pa.Table:
    """Validate ``table`` against ``schema`` and fill defaults; raise ``SchemaError`` naming the column.

    ``keys`` are the generated keys to use where the batch brings none. ``finite_rewards=False``
    (rows restored from a lake) refuses only NaN, as pushes did before ±inf was refused, so a lake
    written then still restores.
    """
    n = table.num_rows
    names = set(table.column_names)
    unknown = [c for c in table.column_names if c not in schema.names]
    if unknown:
        raise SchemaError(
            f"column {unknown[0]!r} is not in the buffer schema; declare extra columns with "
            f"ReplayBuffer.open(..., schema=...)"
        )
    for spec in FIELD_SPECS:
        if spec.required and spec.name not in names:
            raise SchemaError(f"missing required column {spec.name!r}")
    columns: dict[str, pa.ChunkedArray | pa.Array] = {}
    for field in schema:
        name = field.name
        if name in names:
            col = table.column(name)
            if not _compatible(col.type, field.type):
                raise SchemaError(f"column {name!r} has type {col.type}, expected {field.type}")
            try:
                cast = col.cast(field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise SchemaError(f"column {name!r} cannot be cast to {field.type}: {e}") from e
            _refuse_overflow(name, col, cast)
            col = cast
        else:
            col = None
        col = _fill_default(name, col, n, run_id=run_id, now=now, keys=keys, filled=columns, type_=field.type)
        if not field.nullable and col.null_count:
            raise SchemaError(f"column {name!r} has {col.null_count} null value(s) but is not nullable")
        columns[name] = col
    reward = columns["reward"]
    # checked after the cast: a float64 1e300 is finite, its float32 is inf
    bad = pc.invert(pc.is_finite(reward)) if finite_rewards else pc.is_nan(reward)
    n_bad = pc.sum(bad.cast(pa.int64())).as_py() or 0
    if n_bad:
        first = reward.filter(bad)[0].as_py()
        raise SchemaError(f"column 'reward' has {n_bad} non-finite value(s) as {reward.type} (first: {first}; "
                          "NaN, +-inf, or beyond the type's range); rewards must be finite numbers")
    return pa.table(columns, schema=schema)


def _floats(col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array | None:
    """The float values of a float column or of a (nested) list of floats, flattened; None otherwise."""
    t = col.type
    while pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        col = pc.list_flatten(col)
        t = col.type
    return col if pa.types.is_floating(t) else None


def _refuse_overflow(name: str, before: pa.ChunkedArray | pa.Array, after: pa.ChunkedArray | pa.Array) -> None:
    """``SchemaError`` if the cast to the schema's type made a finite float infinite (a float64 1e300 as
    float32): every float column, nested or not, keeps what was pushed or refuses it, never changes it
    silently. (NaN and +-inf pushed as such pass here; ``reward`` refuses them separately.)"""
    if before.type.equals(after.type):
        return
    b, a = _floats(before), _floats(after)
    if b is None or a is None or len(b) != len(a):
        return
    overflow = pc.and_(pc.is_finite(b), pc.invert(pc.is_finite(a)))
    n = pc.sum(overflow.cast(pa.int64())).as_py() or 0
    if n:
        first = b.filter(overflow)[0].as_py()
        raise SchemaError(f"column {name!r} has {n} value(s) beyond the range of {after.type} (first: {first}): "
                          f"they would become non-finite (inf); scale them or declare the column with a wider type")


def conform_restored(table: pa.Table, schema: pa.Schema, run_id: str) -> pa.Table:
    """Rows read back from the lake as the buffer's ``schema``: lake-only columns dropped, the rest
    validated and defaulted like a push (restore and fsck's rebuild share this)."""
    table = table.select([c for c in schema.names if c in table.column_names])
    return conform(table, schema, run_id=run_id, now=np.datetime64(time.time_ns() // 1000, "us"), keys=None,
                   finite_rewards=False)


def _fill_default(name, col, n, *, run_id, now, keys, filled, type_):
    spec = _SPEC_BY_NAME.get(name)
    default = spec.default if spec else None
    if col is not None and (default is None or col.null_count == 0):
        return col
    if default == "generated":
        fill = keys if keys is not None else pa.nulls(n, pa.string())
    elif default == "run_id":
        fill = pa.array([run_id] * 1, type_).take(pa.array(np.zeros(n, dtype=np.int64)))
    elif default == "prompt_id":
        fill = filled["prompt_id"]
    elif default == "now":
        fill = pa.array(np.full(n, now, dtype="datetime64[us]")).cast(type_)
    elif default == "zero":
        fill = pa.array(np.zeros(n, dtype=type_.to_pandas_dtype()))
    else:
        return col if col is not None else pa.nulls(n, type_)
    if col is None:
        return fill
    return pc.coalesce(col, fill)


def cast_to(table: pa.Table | pa.RecordBatch, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly the columns of ``schema``: reordered, cast, missing ones as nulls.

    The lake's half of conforming: its files may predate a column or store a narrower type. A push
    goes through :func:`conform` instead, which also validates and fills defaults."""
    n = table.num_rows
    cols = []
    for f in schema:
        idx = table.schema.get_field_index(f.name)
        if idx < 0:
            cols.append(pa.nulls(n, f.type))
            continue
        col = table.column(idx)
        if not col.type.equals(f.type):
            col = col.cast(f.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=schema)


def unique_keys(parts: Sequence[pa.Array | pa.ChunkedArray]) -> pa.Array:
    """The distinct non-null keys of several arrays, as one string array."""
    parts = [p.combine_chunks() if isinstance(p, pa.ChunkedArray) else p for p in parts if len(p)]
    if not parts:
        return pa.array([], pa.string())
    arr = pa.concat_arrays([p.cast(pa.string()) for p in parts]) if len(parts) > 1 else parts[0].cast(pa.string())
    return pc.unique(arr.drop_null())


def key_array(keys: Sequence[str] | pa.Array | pa.ChunkedArray | None) -> pa.Array:
    """Keys given as a sequence or an Arrow array, as one array of distinct strings (None: none)."""
    if keys is None:
        return pa.array([], pa.string())
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not isinstance(keys, pa.Array):
        keys = pa.array(list(keys), pa.string())
    return unique_keys([keys])
