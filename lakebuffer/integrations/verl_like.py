"""Replayed rows as a ``DataProto`` shaped like the live batch, so ``DataProto.concat`` accepts both.

``DataProto.concat([batch, replay])`` concatenates the two TensorDicts (same keys, same trailing
shapes) and the non-tensor arrays key by key (same keys), and merges ``meta_info`` (equal values
for shared keys). ``like_dataproto`` therefore builds exactly the live batch's keys, widths, dtypes
and pad token, from what the buffer stores:

==========================================  ==================================================
live key                                    replayed value
==========================================  ==================================================
prompts, responses, input_ids,              the stored tokens, padded as verl pads (prompt
attention_mask, position_ids, response_mask left, response right, the live batch's widths)
rollout_log_probs                           ``response_logprobs``: the behaviour policy's, the
                                            log-probs verl's rollout correction treats as pi_rollout
old_log_probs                               the behaviour log-probs too (verl's bypass mode sets
                                            old_log_probs = rollout_log_probs the same way)
rm_scores, token_level_scores,              ``reward`` on the last response token, as verl's
token_level_rewards                         reward loop places it
advantages, returns                         ``advantage`` over the response mask (GRPO: exact)
dummy_tensor                                zeros (the dataset's placeholder)
uid                                         ``group_id``
other non-tensor keys                       a column of that name, else the JSON column
                                            (``non_tensor_json``), else ``non_tensor_fill``;
                                            ``multi_modal_inputs`` empty dicts for text rows
==========================================  ==================================================

Anything else the live batch holds (``values``, ``ref_log_prob``, ``entropys``, ``routed_experts``,
...) is computed by verl from the current models, so replay must be mixed in before verl computes
it; asking for it raises ``SchemaError`` naming the keys.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import SchemaError
from .verl_json import object_array, unpack_non_tensors
from .verl_padded import padded_dataproto

__all__ = ["like_dataproto"]

_LAYOUT_KEYS = ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask")


def _pad_token(like: Any) -> int:
    """The live batch's pad token: what ``input_ids`` holds where ``attention_mask`` is 0 (else 0)."""
    td = like.batch
    if "input_ids" not in td.keys():
        return 0
    padded = td["input_ids"][td["attention_mask"] == 0]
    return int(padded[0]) if padded.numel() else 0


def _check_layout(like: Any) -> tuple[int, int]:
    """The live prompt / response widths, after checking verl's layout (prompt left-, response right-padded)."""
    td = like.batch
    missing = [k for k in ("prompts", "responses", "attention_mask") if k not in td.keys()]
    if missing:
        raise SchemaError(f"like= needs a generated batch; it has no {', '.join(missing)}")
    p_w, r_w = td["prompts"].shape[1], td["responses"].shape[1]
    mask = td["attention_mask"]
    if mask.dim() != 2 or mask.shape[1] != p_w + r_w:
        raise SchemaError(f"attention_mask is {tuple(mask.shape)}, expected [B, {p_w} + {r_w}]")
    if "position_ids" in td.keys() and td["position_ids"].dim() != 2:
        raise SchemaError("position_ids are not [B, L] (multimodal rope); replaying multimodal rollouts is not supported")
    p, r = mask[:, :p_w], mask[:, p_w:]
    if p_w > 1 and bool((p[:, 1:] < p[:, :-1]).any()):
        raise SchemaError("the live prompts are not left-padded (verl's layout); cannot match their padding")
    if r_w > 1 and bool((r[:, 1:] > r[:, :-1]).any()):
        raise SchemaError("the live responses are not right-padded (verl's layout); cannot match their padding")
    return p_w, r_w


def _as_like(values: list, ref: np.ndarray, key: str) -> np.ndarray:
    if ref.dtype == object:
        return object_array(values)
    if any(v is None for v in values):
        raise SchemaError(f"non_tensor_batch[{key!r}] is {ref.dtype} in the live batch but some replayed rows lack it; "
                          f"give non_tensor_fill={{{key!r}: ...}}")
    out = np.asarray(values, dtype=ref.dtype)
    if out.shape[1:] != ref.shape[1:]:
        raise SchemaError(f"non_tensor_batch[{key!r}] rows are {out.shape[1:]} when replayed, {ref.shape[1:]} live")
    return out


def like_dataproto(
    rows: pa.Table | pa.RecordBatch,
    like: Any,
    *,
    pad_token_id: int | None = None,
    response_mask_column: str | None = None,
    non_tensor_json: str | None = None,
    non_tensor_fill: dict[str, Any] | None = None,
):
    """A ``DataProto`` of ``rows`` with exactly ``like``'s keys, dtypes, widths, padding and ``meta_info``.

    ``pad_token_id`` defaults to the live batch's. ``meta_info`` is copied except ``metrics``
    (per-sample worker metrics of the live rows, which ``concat`` would append twice).
    """
    import torch
    from verl.protocol import DataProto

    p_w, r_w = _check_layout(like)
    pad = _pad_token(like) if pad_token_id is None else pad_token_id
    base = padded_dataproto(rows, pad_token_id=pad, max_prompt_length=p_w, max_response_length=r_w,
                            logprobs_key="rollout_log_probs", reward_keys=("rm_scores",), non_tensor_columns=(),
                            response_mask_column=response_mask_column)
    n = len(base)
    have = dict(base.batch.items())
    if "rollout_log_probs" in have:
        have["old_log_probs"] = have["rollout_log_probs"]
    if "rm_scores" in have:
        have["token_level_scores"] = have["token_level_rewards"] = have["rm_scores"]
    td = like.batch
    tensors, missing, used = {}, [], set()
    for key in td.keys():
        ref = td[key]
        if key in have:
            t = have[key]
        elif key == "dummy_tensor":
            t = torch.zeros((n, *ref.shape[1:]), dtype=ref.dtype)
        else:
            missing.append(key)
            continue
        if tuple(t.shape[1:]) != tuple(ref.shape[1:]):
            raise SchemaError(f"batch[{key!r}] is {tuple(t.shape[1:])} per row when replayed, {tuple(ref.shape[1:])} live")
        t = t.to(ref.dtype)
        tensors[key] = t.clone() if id(t) in used else t  # aliases (old_log_probs = rollout_log_probs) get copies
        used.add(id(t))
    if missing:
        why = ("the stored rows have no response_logprobs" if "rollout_log_probs" in missing else
               "verl computes them from the current models; mix replay in before it does (after generation, "
               "before reward / old_log_prob / ref / values / advantages)")
        raise SchemaError(f"the live batch has {', '.join(missing)}, which replayed rows cannot supply: {why}")

    stored = rows.schema.names
    packed = unpack_non_tensors(rows.column(non_tensor_json)) if non_tensor_json in stored else {}
    fill = non_tensor_fill or {}
    non_tensors, missing = {}, []
    for key, ref in like.non_tensor_batch.items():
        if key == "uid":
            values = list(base.non_tensor_batch["uid"])
        elif key in stored and key != non_tensor_json:
            values = rows.column(key).to_pylist()
        elif key in packed:
            values = list(packed[key])
        elif key in fill:
            values = [copy.deepcopy(fill[key]) for _ in range(n)]
        elif key == "multi_modal_inputs" and not any(len(x or {}) for x in ref):
            values = [{} for _ in range(n)]
        else:
            missing.append(key)
            continue
        non_tensors[key] = _as_like(values, np.asarray(ref), key)
    if missing:
        raise SchemaError(f"the live batch has non-tensor keys {', '.join(missing)}, which the replayed rows do not "
                          "hold (store them with from_dataproto(..., non_tensor_json=...) or give non_tensor_fill=)")
    meta = {k: copy.deepcopy(v) for k, v in (like.meta_info or {}).items() if k != "metrics"}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)
