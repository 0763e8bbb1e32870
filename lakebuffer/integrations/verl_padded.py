"""verl's standard batch layout built from rollout rows: the one place that pads rows the way verl does.

``to_dataproto`` (no ``like=``) and ``like_dataproto`` (shaped like a live batch) both build on
:func:`padded_dataproto`, so it sits a layer below both modules.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from ..dataset import one_batch, pad_lists
from .verl_json import unpack_non_tensors

__all__ = ["padded_dataproto"]


def padded_dataproto(
    rows: pa.Table | pa.RecordBatch,
    *,
    pad_token_id: int | None = None,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    logprobs_key: str = "old_log_probs",
    reward_keys: Sequence[str] = ("token_level_scores", "token_level_rewards"),
    non_tensor_columns: Sequence[str] = ("key", "prompt_id", "policy_version", "reward"),
    response_mask_column: str | None = None,
    meta_info: dict | None = None,
    non_tensor_json: str | None = None,
):
    """A verl ``DataProto`` of ``rows`` in verl's layout (see ``lakebuffer.integrations.verl.to_dataproto``)."""
    import torch
    from verl.protocol import DataProto

    pad_token_id = 0 if pad_token_id is None else pad_token_id
    batch = one_batch(rows) if isinstance(rows, pa.Table) else rows
    names = batch.schema.names
    for need in ("prompt_ids", "response_ids", "group_id"):
        if need not in names:
            raise KeyError(f"to_dataproto needs column {need!r} (sample with columns=None or include it)")
    n = batch.num_rows
    prompts, p_mask = pad_lists(batch.column("prompt_ids"), pad_value=pad_token_id, padding_side="left",
                                width=max_prompt_length, truncation_side="left", dtype=np.int64)
    responses, r_attn = pad_lists(batch.column("response_ids"), pad_value=pad_token_id, padding_side="right",
                                  width=max_response_length, truncation_side="right", dtype=np.int64)
    r_width = responses.shape[1]
    attention = np.concatenate([p_mask, r_attn], axis=1)
    position = np.clip(np.cumsum(attention, axis=1) - 1, 0, None)
    if response_mask_column is not None and response_mask_column in names:
        stored, _ = pad_lists(batch.column(response_mask_column), width=r_width, dtype=np.int64)
        r_mask = stored * r_attn
    else:
        r_mask = r_attn
    t = torch.from_numpy
    tensors = {
        "prompts": t(prompts),
        "responses": t(responses),
        "input_ids": t(np.concatenate([prompts, responses], axis=1)),
        "attention_mask": t(attention),
        "position_ids": t(position),
        "response_mask": t(np.ascontiguousarray(r_mask)),
    }
    if "response_logprobs" in names and batch.column("response_logprobs").null_count == 0:
        lp, _ = pad_lists(batch.column("response_logprobs"), pad_value=0.0, width=r_width, dtype=np.float32)
        tensors[logprobs_key] = t(lp)
    if "reward" in names:
        reward = batch.column("reward").to_numpy(zero_copy_only=False).astype(np.float32)
        dense = np.zeros((n, r_width), dtype=np.float32)
        last = r_attn.sum(axis=1) - 1
        has = last >= 0
        dense[np.flatnonzero(has), last[has]] = reward[has]
        for k in reward_keys:
            tensors[k] = t(dense.copy())
    if "advantage" in names and n and batch.column("advantage").null_count == 0:
        adv = batch.column("advantage").to_numpy(zero_copy_only=False).astype(np.float32)
        dense = (adv[:, None] * r_mask).astype(np.float32)
        tensors["advantages"] = t(dense)
        tensors["returns"] = t(dense.copy())
    non_tensors = {"uid": np.array(batch.column("group_id").to_pylist(), dtype=object)}
    for name in non_tensor_columns:
        if name in names and name not in non_tensors:
            non_tensors[name] = np.array(batch.column(name).to_pylist(), dtype=object)
    if non_tensor_json is not None and non_tensor_json in names:
        for name, values in unpack_non_tensors(batch.column(non_tensor_json)).items():
            non_tensors.setdefault(name, values)
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=dict(meta_info or {}))
