"""verl batches as ``RayPPOTrainer.fit`` (verl 0.9.1) holds them when it calls ``_balance_batch``.

Built with verl's own code where it runs without a model: the dataset collate (``collate_fn``),
``DataProto.from_single_dict``, ``RayPPOTrainer._get_gen_batch``, ``repeat`` / ``union``,
``get_response_mask`` and ``compute_position_id_with_mask``. The generated part has the layout of
the agent loop's ``_postprocess`` (left-padded prompts, right-padded responses, ``rollout_log_probs``,
``rm_scores`` with the score on the last response token, ``__num_turns__``, the reward's extra info
and the default extra fields).
"""

from __future__ import annotations

import uuid

import numpy as np
import torch

PAD, EOS = 7, 2
DATA_SOURCES = ("gsm8k", "math")


def seam_batch(step: int, n_prompts: int = 4, n: int = 4, p_len: int = 10, r_len: int = 12, seed: int | None = None,
               multi_turn: bool = False):
    """The live batch at verl's ``_balance_batch`` seam of step ``step``: ``n_prompts * n`` rows."""
    from verl.protocol import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.dataset.rl_dataset import collate_fn
    from verl.utils.model import compute_position_id_with_mask
    from verl.utils.torch_functional import get_response_mask

    g = torch.Generator().manual_seed(step * 7919 + (seed or 0))
    rows = [{"dummy_tensor": torch.tensor([0], dtype=torch.uint8),
             "data_source": DATA_SOURCES[i % 2],
             "reward_model": {"ground_truth": str(int(torch.randint(0, 100, (1,), generator=g))), "style": "rule"},
             "extra_info": {"index": step * 100 + i, "split": "train"},
             "raw_prompt": [{"role": "user", "content": f"question {step}.{i}"}],
             "index": step * 100 + i, "tools_kwargs": {}, "interaction_kwargs": {}}
            for i in range(n_prompts)]
    batch = DataProto.from_single_dict(collate_fn(rows))
    batch.meta_info["temperature"] = 1.0
    batch.non_tensor_batch["uid"] = np.array([str(uuid.UUID(int=step * 1000 + i)) for i in range(n_prompts)], dtype=object)
    gen_batch = RayPPOTrainer._get_gen_batch(None, batch)  # the prompt side leaves `batch`, as in fit()
    assert "raw_prompt" in gen_batch.non_tensor_batch

    b = n_prompts * n
    plen = torch.randint(1, p_len + 1, (n_prompts,), generator=g).repeat_interleave(n)
    ptok = torch.randint(10, 1000, (n_prompts, p_len), generator=g).repeat_interleave(n, dim=0)
    prompt_mask = (torch.arange(p_len)[None, :] >= (p_len - plen)[:, None]).long()
    prompts = torch.where(prompt_mask.bool(), ptok, PAD)
    responses = torch.randint(10, 1000, (b, r_len), generator=g)
    eos_at = torch.randint(0, r_len + 3, (b,), generator=g)
    for i, e in enumerate(eos_at.tolist()):
        if e < r_len:
            responses[i, e] = EOS
    attn_r = get_response_mask(response_id=responses, eos_token=EOS, dtype=torch.int64)
    responses = torch.where(attn_r.bool(), responses, PAD)
    response_mask = attn_r.clone()
    if multi_turn:
        response_mask[:, 2:4] = 0  # tool-output tokens
        response_mask *= attn_r
    attention_mask = torch.cat([prompt_mask, attn_r], dim=1)
    scores = torch.rand(b, generator=g).round()
    rm_scores = torch.zeros(b, r_len, dtype=torch.float32)
    rm_scores[torch.arange(b), attn_r.sum(-1) - 1] = scores
    extra = {}
    for key in ("turn_scores", "tool_rewards", "min_global_steps", "max_global_steps", "extras"):
        arr = np.empty(b, dtype=object)
        arr[:] = [[] if key in ("turn_scores", "tool_rewards") else (step if "global" in key else None)
                  for _ in range(b)]
        extra[key] = arr
    gen_output = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "response_mask": response_mask,
                 "input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attention_mask,
                 "position_ids": compute_position_id_with_mask(attention_mask),
                 "rollout_log_probs": -torch.rand(b, r_len, generator=g) * attn_r,
                 "rm_scores": rm_scores},
        non_tensors={"__num_turns__": np.full(b, 4 if multi_turn else 2, dtype=np.int32),
                     "acc": scores.numpy().astype(np.float64) > 0.5,
                     "multi_modal_inputs": np.array([{} for _ in range(b)], dtype=object), **extra},
        meta_info={"reward_extra_keys": ["acc"]},
    )
    batch = batch.repeat(repeat_times=n, interleave=True)
    return batch.union(gen_output)
