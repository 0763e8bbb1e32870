"""verl adapter: ``DataProto`` batches to rollout rows and back.

A verl PPO/GRPO trainer holds a generated batch as a ``verl.protocol.DataProto``: its ``batch``
TensorDict has left-padded ``prompts`` [B, P], right-padded ``responses`` [B, R], ``input_ids`` /
``attention_mask`` / ``position_ids`` [B, P + R], ``response_mask`` [B, R], ``old_log_probs`` (or
``rollout_log_probs``) and ``token_level_scores`` / ``token_level_rewards`` [B, R], maybe
``advantages`` / ``returns``; its ``non_tensor_batch`` holds NumPy object arrays such as ``uid``
(the GRPO group). This module turns that into unpadded rollout rows (``from_dataproto``, then
``ReplayBuffer.push``) and builds a real ``DataProto`` from sampled rows (``to_dataproto``), so a
trainer can push after generation and sample a ``DataProto`` for the update step::

    from lakebuffer.integrations.verl import from_dataproto, to_dataproto

    buf.push(from_dataproto(batch, policy_version=step))        # after generation + reward
    rows = buf.sample(256, where=f"policy_version >= {step - 2}", sampler="uniform")
    replay = to_dataproto(rows, pad_token_id=tok.pad_token_id,
                          max_prompt_length=cfg.data.max_prompt_length,
                          max_response_length=cfg.data.max_response_length)

What is kept: prompt tokens (``attention_mask`` over the prompt part), response tokens (the
attention mask over the response part), their log-probs, ``reward`` = the sum of the token-level
rewards over the response, ``advantage`` = the mean token advantage over ``response_mask``
(exact for GRPO's outcome advantages, which are constant per row), ``group_id`` = ``uid``.
``to_dataproto`` rebuilds the tensors the way verl's agent loop does (prompt left-padded,
response right-padded, ``position_ids`` = ``compute_position_id_with_mask``) and puts the reward
on the last response token (as verl's reward managers do), so a batch in that layout round-trips
exactly. Dense per-token rewards are summed (not kept); a multi-turn ``response_mask`` that masks
tool tokens is kept only if you name a column for it (``response_mask_column=``, declared in the
buffer schema as ``list<int8>``).

Needs ``pip install 'lakebuffer[verl]'`` (torch, tensordict, verl).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from .verl_json import pack_non_tensors
from .verl_like import like_dataproto
from .verl_padded import padded_dataproto

__all__ = ["from_dataproto", "push_dataproto", "sample_dataproto", "to_dataproto"]

# behaviour log-probs first: ``rollout_log_probs`` are the inference engine's (the policy that
# generated), ``old_log_probs`` the trainer's recomputation (the proximal policy, unless verl's
# rollout-correction bypass mode copied the rollout's into it)
_LOGPROB_KEYS = ("rollout_log_probs", "old_log_probs")
_REWARD_KEYS = ("token_level_rewards", "token_level_scores", "rm_scores")


def _torch():
    import torch

    return torch


def _ragged(values, mask, arrow_type: pa.DataType) -> pa.ListArray:
    """The masked entries of each row of a [B, L] tensor as a list array (row order kept)."""
    mask = mask.bool()
    flat = values[mask].detach().cpu().numpy()
    lengths = mask.sum(dim=1).cpu().numpy().astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.astype(arrow_type.to_pandas_dtype(), copy=False)))


def _first_key(td, wanted: str | None, candidates: Sequence[str]) -> str | None:
    keys = set(td.keys())
    if wanted is not None:
        if wanted not in keys:
            raise KeyError(f"DataProto.batch has no {wanted!r}; it has {sorted(keys)}")
        return wanted
    return next((k for k in candidates if k in keys), None)


def _as_strings(values: Any) -> pa.Array:
    return pa.array([None if v is None else str(v) for v in np.asarray(values, dtype=object).tolist()], pa.string())


def from_dataproto(
    data: Any,
    *,
    policy_version: int | Sequence[int] | None = None,
    run_id: str | None = None,
    uid_key: str = "uid",
    prompt_id_key: str | None = None,
    logprobs_key: str | None = None,
    reward_key: str | None = None,
    advantage_key: str | None = "advantages",
    verified_key: str | None = None,
    non_tensor_columns: Sequence[str] = (),
    response_mask_column: str | None = None,
    non_tensor_json: str | None = None,
) -> pa.Table:
    """Rollout rows (unpadded) from a verl ``DataProto``, ready for ``ReplayBuffer.push``.

    ``policy_version`` defaults to ``data.meta_info["global_steps"]``. ``prompt_id`` is
    ``non_tensor_batch[prompt_id_key]`` (default: the ``uid``, verl's per-prompt id), ``group_id``
    the ``uid``. ``logprobs_key`` defaults to ``old_log_probs`` then ``rollout_log_probs``;
    ``reward_key`` to ``token_level_rewards``, ``token_level_scores`` then ``rm_scores``.
    ``verified_key`` names a non-tensor (e.g. ``"acc"``) stored as ``verified``;
    ``non_tensor_columns`` are copied as extra columns (declare them in the buffer schema).
    ``non_tensor_json`` names a ``string`` column that receives every other non-tensor key of the
    batch (``reward_model`` with the ground truth, ``extra_info``, ``__num_turns__``, reward extra
    info, ...) as one JSON object per row, so ``to_dataproto(..., like=batch)`` can give them back.
    """
    torch = _torch()
    td = data.batch
    nt = data.non_tensor_batch or {}
    if td is None or "responses" not in td.keys() or "attention_mask" not in td.keys():
        raise ValueError("the DataProto needs batch['responses'] and batch['attention_mask'] (a generated batch)")
    responses = td["responses"]
    n, r_len = responses.shape
    attention = td["attention_mask"]
    p_len = attention.shape[1] - r_len
    if "prompts" in td.keys():
        prompts = td["prompts"]
    elif "input_ids" in td.keys():
        prompts = td["input_ids"][:, :p_len]
    else:
        raise ValueError("the DataProto needs batch['prompts'] or batch['input_ids']")
    if prompts.shape[1] != p_len:
        raise ValueError(f"prompts are {prompts.shape[1]} wide but attention_mask leaves {p_len} for them")
    p_mask = attention[:, :p_len].bool()
    r_attn = attention[:, p_len:].bool()
    r_mask = td["response_mask"].bool() if "response_mask" in td.keys() else r_attn

    cols: dict[str, Any] = {}
    if uid_key not in nt:
        raise KeyError(f"non_tensor_batch has no {uid_key!r} (the GRPO group id); it has {sorted(nt)}")
    uid = _as_strings(nt[uid_key])
    cols["prompt_id"] = _as_strings(nt[prompt_id_key]) if prompt_id_key else uid
    cols["group_id"] = uid
    if run_id is not None:
        cols["run_id"] = pa.array([run_id] * n, pa.string())
    if policy_version is None:
        policy_version = (data.meta_info or {}).get("global_steps")
        if policy_version is None:
            raise ValueError("give policy_version= (the behaviour policy's version); meta_info has no 'global_steps'")
    cols["policy_version"] = pa.array(np.broadcast_to(np.asarray(policy_version, dtype=np.int64), (n,)))
    cols["prompt_ids"] = _ragged(prompts, p_mask, pa.int32())
    cols["response_ids"] = _ragged(responses, r_attn, pa.int32())
    lp_key = _first_key(td, logprobs_key, _LOGPROB_KEYS)
    if lp_key is not None:
        cols["response_logprobs"] = _ragged(td[lp_key].float(), r_attn, pa.float32())
    rw_key = _first_key(td, reward_key, _REWARD_KEYS)
    if rw_key is None:
        raise KeyError(f"DataProto.batch has no reward tensor (looked for {', '.join(_REWARD_KEYS)})")
    rewards = (td[rw_key].double() * r_attn).sum(dim=1)
    cols["reward"] = pa.array(rewards.cpu().numpy().astype(np.float32))
    if advantage_key is not None and advantage_key in td.keys():
        counts = r_mask.sum(dim=1)
        adv = (td[advantage_key].double() * r_mask).sum(dim=1) / counts.clamp(min=1)
        adv_np = adv.cpu().numpy().astype(np.float32)
        cols["advantage"] = pa.array(adv_np, mask=(counts == 0).cpu().numpy())
    if verified_key is not None:
        v = np.asarray(nt[verified_key], dtype=object)
        cols["verified"] = pa.array([None if x is None else bool(x) for x in v.tolist()], pa.bool_())
    for name in non_tensor_columns:
        cols[name] = pa.array(np.asarray(nt[name], dtype=object).tolist())
    if response_mask_column is not None:
        cols[response_mask_column] = _ragged(r_mask.to(torch.int8), r_attn, pa.int8())
    if non_tensor_json is not None:
        stored = {uid_key, *non_tensor_columns, *([verified_key] if verified_key else [])}
        cols[non_tensor_json] = pack_non_tensors({k: v for k, v in nt.items() if k not in stored}, n)
    return pa.table(cols)


def to_dataproto(
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
    like: Any = None,
    non_tensor_json: str | None = None,
    non_tensor_fill: dict | None = None,
):
    """A verl ``DataProto`` from rollout rows (e.g. ``buf.sample(...)``), padded the way verl pads.

    ``like=batch`` (a live ``DataProto``) returns one that ``DataProto.concat([batch, replay])``
    accepts: exactly ``batch``'s tensor and non-tensor keys, dtypes and widths, its pad token, and
    its ``meta_info`` (see ``lakebuffer.integrations.verl_like.like_dataproto``); the other
    arguments but ``pad_token_id``, ``response_mask_column``, ``non_tensor_json`` and
    ``non_tensor_fill`` (values for live non-tensor keys the rows lack) are then unused.

    ``batch``: ``prompts`` [B, P] left-padded with ``pad_token_id`` (default 0), ``responses`` [B, R]
    right-padded, ``input_ids`` = both, ``attention_mask``, ``position_ids``
    (``compute_position_id_with_mask``), ``response_mask``, ``logprobs_key`` [B, R] from
    ``response_logprobs`` (when no row lacks them), each of ``reward_keys`` with the reward on the
    last response token, and ``advantages`` / ``returns`` broadcast over ``response_mask`` when every
    row has an ``advantage``. P and R are ``max_prompt_length`` / ``max_response_length`` (longer
    rows are cut: a prompt keeps its last tokens, a response its first) or the longest row.
    ``non_tensor_batch``: ``uid`` = ``group_id`` and ``non_tensor_columns`` (those present), as
    object arrays. ``meta_info`` is passed through.
    """
    if like is not None:
        return like_dataproto(rows, like, pad_token_id=pad_token_id, response_mask_column=response_mask_column,
                              non_tensor_json=non_tensor_json, non_tensor_fill=non_tensor_fill)
    return padded_dataproto(rows, pad_token_id=pad_token_id, max_prompt_length=max_prompt_length,
                            max_response_length=max_response_length, logprobs_key=logprobs_key,
                            reward_keys=reward_keys, non_tensor_columns=non_tensor_columns,
                            response_mask_column=response_mask_column, meta_info=meta_info,
                            non_tensor_json=non_tensor_json)


def push_dataproto(buffer: Any, data: Any, **kwargs: Any) -> pa.Array:
    """``buffer.push(from_dataproto(data, **kwargs))``; returns the stored keys."""
    return buffer.push(from_dataproto(data, **kwargs))


def sample_dataproto(buffer: Any, n: int, where: str | None = None, sampler: Any = "uniform", seed: int | None = 0,
                     sampler_options: dict | None = None, **kwargs: Any):
    """``to_dataproto(buffer.sample(n, where, sampler, seed=seed, **sampler_options), **kwargs)``.

    Pass ``like=batch`` (the live ``DataProto``) for a replay batch that concatenates with it.
    """
    rows = buffer.sample(n, where=where, sampler=sampler, seed=seed, **(sampler_options or {}))
    return to_dataproto(rows, **kwargs)
