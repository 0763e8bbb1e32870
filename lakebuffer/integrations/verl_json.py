"""verl's non-tensor batch (NumPy object arrays of per-row values) as one JSON text column and back.

A generated verl batch carries per-row Python values next to its tensors: ``reward_model`` (the
ground truth), ``extra_info``, ``__num_turns__``, the reward function's extra info (``acc``, ...),
the agent loop's ``turn_scores`` / ``tool_rewards``. Their keys differ between datasets and reward
functions, so they are stored as one JSON object per row in a ``string`` column (queryable with
DuckDB's ``json_extract``), not as columns the buffer schema would have to declare up front.
Values go through ``json`` row by row: these are a few small values per rollout, next to its tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import SchemaError

__all__ = ["object_array", "pack_non_tensors", "unpack_non_tensors"]


def object_array(values: list) -> np.ndarray:
    """A 1-D object array of ``values`` (lists stay list elements; ``np.array`` would make them a 2-D array)."""
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def _plain(value: Any) -> Any:
    """NumPy (and torch) values as the JSON-able Python values they hold."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "tolist") and type(value).__module__.split(".")[0] == "torch":
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def pack_non_tensors(non_tensors: Mapping[str, Any], n: int) -> pa.Array:
    """``n`` JSON objects ``{key: row value}``, one per row, as a ``string`` array."""
    columns = {}
    for key, values in non_tensors.items():
        arr = np.asarray(values, dtype=object) if not isinstance(values, np.ndarray) else values
        if len(arr) != n:
            raise SchemaError(f"non_tensor_batch[{key!r}] has {len(arr)} rows, the batch {n}")
        columns[key] = arr.tolist() if arr.dtype != object else list(arr)
    out = []
    for i in range(n):
        row = {k: v[i] for k, v in columns.items()}
        try:
            out.append(json.dumps(row, default=_plain))
        except TypeError as e:
            bad = next((k for k, v in row.items() if not _json_ok(v)), "?")
            raise SchemaError(f"non_tensor_batch[{bad!r}] holds a value that cannot be stored as JSON ({e}); "
                              "leave it out or convert it before pushing") from e
    return pa.array(out, pa.string())


def _json_ok(value: Any) -> bool:
    try:
        json.dumps(value, default=_plain)
    except TypeError:
        return False
    return True


def unpack_non_tensors(column: pa.Array | pa.ChunkedArray) -> dict[str, np.ndarray]:
    """Per key, an object array of the rows' values (``None`` where a row's object lacks the key)."""
    rows = [json.loads(text) if text is not None else {} for text in column.to_pylist()]
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    return {key: object_array([row.get(key) for row in rows]) for key in keys}
