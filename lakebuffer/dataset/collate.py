"""Collation: Arrow record batches of rollouts -> padded NumPy arrays or torch tensors.

Token lists are padded into ``[B, W]`` arrays with masks by scattering each row's values (one slice
copy per long row, a vectorised scatter for short ones) into buffers from Arrow's memory pool,
which reuses freed pages where fresh NumPy allocations of this size would be mmap'ed and zeroed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def import_torch() -> Any:
    """torch, imported on first need (it costs seconds and ~200 MB); ``None`` when not installed."""
    try:
        import torch
    except ImportError:  # pragma: no cover - exercised in the torch-free CI env
        return None
    return torch


def one_batch(table: pa.Table) -> pa.RecordBatch:
    """``table`` as exactly one record batch (what collators and trainers take); empty keeps the schema."""
    batches = table.combine_chunks().to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def pool_empty(shape: int | tuple[int, ...], dtype: Any) -> tuple[pa.Buffer, np.ndarray]:
    """An uninitialised writable array in Arrow's memory pool (mimalloc/jemalloc reuse freed pages;
    fresh NumPy allocations of this size are mmap'ed, page-faulted and zeroed each time)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    buf = pa.allocate_buffer(max(n * dtype.itemsize, 1))
    return buf, np.frombuffer(buf, dtype=dtype, count=n).reshape(shape)


def pool_full(shape: tuple[int, ...], value: Any, dtype: Any) -> np.ndarray:
    arr = pool_empty(shape, dtype)[1]
    arr.fill(value)
    return arr


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
    torch = import_torch() if return_tensors == "pt" else None
    if return_tensors == "pt" and torch is None:
        raise ImportError("pad_collate(return_tensors='pt') needs torch: pip install 'lakebuffer[torch]'")
    if isinstance(batch, pa.Table):
        batch = one_batch(batch)
    names = batch.schema.names
    out: dict[str, Any] = {}
    p_side = prompt_padding_side or padding_side
    r_side = response_padding_side or padding_side
    parts = {}
    if "prompt_ids" in names:
        v, s, n = _list_parts(batch.column("prompt_ids"))
        kept, s, w = _fit(n, s, max_prompt_length, "left")
        ids = pool_full((len(n), w), pad_token_id, np.int64)
        m = pool_full((len(n), w), 0, np.int64)
        _scatter(ids, m, v, s, kept, (w - kept) if p_side == "left" else np.zeros_like(kept))
        out["prompt_ids"], out["prompt_attention_mask"] = ids, m
        parts["prompt"] = (v, s, kept)
    if "response_ids" in names:
        v, s, n = _list_parts(batch.column("response_ids"))
        kept, s, w = _fit(n, s, max_response_length, "right")
        ids = pool_full((len(n), w), pad_token_id, np.int64)
        m = pool_full((len(n), w), 0, np.int64)
        col0 = (w - kept) if r_side == "left" else np.zeros_like(kept)
        _scatter(ids, m, v, s, kept, col0)
        out["response_ids"], out["response_mask"] = ids, m
        parts["response"] = (v, s, kept)
        if "response_logprobs" in names:
            lv, ls, ln = _list_parts(batch.column("response_logprobs"))
            lk = np.minimum(ln, kept)
            lp = pool_full((len(n), w), 0, np.float32)
            _scatter(lp, None, lv.astype(np.float32, copy=False), ls, lk,
                     (w - lk) if r_side == "left" else np.zeros_like(lk))
            out["response_logprobs"] = lp
    if parts:
        b = batch.num_rows
        pk = parts["prompt"][2] if "prompt" in parts else np.zeros(b, np.int64)
        rk = parts["response"][2] if "response" in parts else np.zeros(b, np.int64)
        total = pk + rk
        w = int(total.max()) if b else 0
        ids = pool_full((b, w), pad_token_id, np.int64)
        attn = pool_full((b, w), 0, np.int64)
        loss = pool_full((b, w), 0, np.int64)
        shift = (w - total) if padding_side == "left" else np.zeros_like(total)
        if "prompt" in parts:
            v, s, k = parts["prompt"]
            _scatter(ids, attn, v, s, k, shift)
        if "response" in parts:
            v, s, k = parts["response"]
            _scatter(ids, attn, v, s, k, shift + pk)
            _scatter(None, loss, None, s, k, shift + pk)
        out["input_ids"], out["attention_mask"], out["loss_mask"] = ids, attn, loss
        pos = pool_empty((b, w), np.int64)[1]
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
