"""Batched torch tensors <-> Arrow columns, without Python rows and without pickling.

A TransferQueue field is a batch: a dense tensor ``[B, ...]``, a jagged nested tensor (one 1-D
sequence per sample) or a ``NonTensorStack`` of strings/numbers. Dense and jagged tensors become
Arrow arrays over the tensor's own memory (``numpy()`` of a CPU tensor is a view, and a list
array is offsets over the flat values), so the only copies are the casts the column type asks
for (int64 token ids stored as the rollout schema's int32, bfloat16 which numpy cannot hold) and
the device-to-host move of a GPU tensor. Reading back is the mirror: flat values as a tensor
view, reshaped to the per-sample shape TransferQueue recorded, cast to its dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import torch
from tensordict import NonTensorStack

from ..errors import SchemaError

_TORCH_TO_ARROW = {
    torch.float64: pa.float64(), torch.float32: pa.float32(), torch.float16: pa.float16(),
    torch.bfloat16: pa.float32(),  # numpy has no bfloat16: stored widened, narrowed on read
    torch.int64: pa.int64(), torch.int32: pa.int32(), torch.int16: pa.int16(), torch.int8: pa.int8(),
    torch.uint8: pa.uint8(), torch.bool: pa.bool_(),
}


def type_text_for(value: Any) -> str:
    """The column type (the schema file's type language, or ``json``) a batched field gets when the
    config declares none: tensors by dtype (a list per sample when they have per-sample dims),
    strings as ``string``, any other Python objects as ``json`` text."""
    if isinstance(value, torch.Tensor):
        elem = _TORCH_TO_ARROW.get(value.dtype)
        if elem is None:
            raise SchemaError(f"tensors of dtype {value.dtype} have no Arrow column type")
        name = {pa.float32(): "float32", pa.float16(): "float16", pa.float64(): "float64"}.get(elem, str(elem))
        return f"list<{name}>" if value.is_nested or value.dim() > 1 else name
    items = value.tolist() if isinstance(value, NonTensorStack) else list(value)
    return "string" if items and all(isinstance(v, str) for v in items) else "json"


def _flat_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()  # the one unavoidable copy of a GPU field: device to host
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.contiguous().reshape(-1).numpy()


def to_arrow(value: Any, type_: pa.DataType, name: str) -> pa.Array:
    """One batched field as an Arrow array of ``type_`` (``SchemaError`` naming ``name`` if it cannot be)."""
    try:
        return _to_arrow(value, type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as e:
        raise SchemaError(f"TransferQueue field {name!r} cannot be stored as {type_}: {e}") from e


def _to_arrow(value: Any, type_: pa.DataType) -> pa.Array:
    if not isinstance(value, torch.Tensor):
        items = value.tolist() if isinstance(value, NonTensorStack) else list(value)
        return pa.array(items, type_)  # strings are Python objects already: no faster path exists
    is_list = pa.types.is_list(type_) or pa.types.is_large_list(type_)
    if value.is_nested:
        if not is_list:
            raise TypeError("a jagged field needs a list<...> column")
        if value.layout != torch.jagged:  # a strided nested tensor has no flat values: re-layout once
            value = torch.nested.as_nested_tensor(list(value.unbind()), layout=torch.jagged)
        inner = int(np.prod(value.values().shape[1:], dtype=np.int64))  # [L_i, *inner] per sample
        flat = _flat_numpy(value.values())
        offsets = value.offsets().cpu().numpy() * inner
    else:
        n = value.shape[0]
        width = int(np.prod(value.shape[1:], dtype=np.int64)) if value.dim() > 1 else 1
        flat = _flat_numpy(value)
        if not is_list:
            if width != 1:
                raise TypeError(f"a field of per-sample shape {tuple(value.shape[1:])} needs a list<...> column")
            return pa.array(flat).cast(type_, safe=True)
        offsets = np.arange(0, (n + 1) * width, width, dtype=np.int64)
    off_type = pa.int64() if pa.types.is_large_list(type_) else pa.int32()
    values = pa.array(flat).cast(type_.value_type, safe=True)
    cls = pa.LargeListArray if pa.types.is_large_list(type_) else pa.ListArray
    return cls.from_arrays(pa.array(offsets).cast(off_type, safe=True), values)


def _torch_dtype(dtype: Any) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(torch, str(dtype).removeprefix("torch."), None)
    return found if isinstance(found, torch.dtype) else None


def _owned(arr: pa.Array, dtype: torch.dtype | None, private: bool = False) -> torch.Tensor:
    """A tensor of ``dtype`` the caller may write into: TransferQueue consumers may write into what
    they get. A private, writable, aligned buffer of the right type (a reply's frame) is used in
    place: 16 x 16,384 tokens, 1.3 ms of copy and first-touch faults a field saved. Anything else
    (shared or read-only buffers, a cast back to the recorded dtype, nulls) is one copy, fused with
    the cast."""
    view = _writable_view(arr, dtype) if private else None
    if view is not None:
        return torch.from_numpy(view)
    return torch.tensor(arr.to_numpy(zero_copy_only=False), dtype=dtype)


def _writable_view(arr: pa.Array, dtype: torch.dtype | None) -> np.ndarray | None:
    """``arr``'s values as a writable numpy view of its own buffer, or None when there is none."""
    if arr.null_count or not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)):
        return None
    np_type = arr.type.to_pandas_dtype()
    if dtype is not None and torch.from_numpy(np.empty(0, np_type)).dtype != dtype:
        return None
    data = arr.buffers()[1]
    item = np.dtype(np_type).itemsize
    if data is None or not data.is_mutable or (data.address + arr.offset * item) % item:
        return None
    return np.frombuffer(data, dtype=np_type, count=len(arr), offset=arr.offset * item)


def to_field(column: pa.Array | pa.ChunkedArray, schema: dict[str, Any], private: bool = False) -> Any:
    """An Arrow column read back as the batched field TransferQueue recorded in ``schema``
    (its ``dtype``, per-sample ``shape``, ``is_nested``, ``is_non_tensor``). ``private``: the column's
    buffers belong to this call alone (a reply just received), so writable ones are used in place."""
    if isinstance(column, pa.ChunkedArray):  # combine_chunks copies even a single chunk
        arr = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    else:
        arr = column
    n = len(arr)
    if schema.get("is_non_tensor") or pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        return NonTensorStack(*arr.to_pylist())
    dtype = _torch_dtype(schema.get("dtype"))
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        # TransferQueue's default backend hands every field with per-sample dims back as a jagged
        # nested tensor (dense puts included) and a 1-D field as a dense (B,) tensor: the same forms here
        values = _owned(arr.flatten(), dtype, private)
        shape = schema.get("shape")
        per_sample = schema.get("per_sample_shapes")
        first = tuple(shape) if shape else (tuple(per_sample[0]) if per_sample and per_sample[0] is not None else ())
        inner = first[1:]
        width = int(np.prod(inner, dtype=np.int64)) if inner else 1
        lengths = np.asarray(arr.value_lengths().to_numpy(zero_copy_only=False), dtype=np.int64)
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]) // width)
        return torch.nested.nested_tensor_from_jagged(values.reshape(-1, *inner), offsets)
    return _owned(arr, dtype, private).reshape(n)
