"""Replay in verl on CPU: a replay batch shaped like the live one, and the ``trainer.replay`` hook.

verl's trainer holds each step's generated batch as a ``DataProto``; this example builds such
batches with verl's own constructors (as ``RayPPOTrainer.fit`` has them before it scores them and
recomputes log-probs: prompts, responses, masks, ``rollout_log_probs``, ``rm_scores``, ``uid``,
``reward_model``, ...), then

1. pushes one into a buffer and samples a replay ``DataProto`` with ``like=batch``, which
   ``DataProto.concat([batch, replay])`` accepts;
2. runs the hook the way ``ReplayRayPPOTrainer`` does from a ``trainer.replay`` config block:
   push every step's batch, grow it by replayed rows (``ratio`` of the result), report
   ``replay/*`` metrics, then hand the mixed batch to verl's GRPO advantage.

Needs torch, verl 0.9.x (``pip install --no-deps verl``) and its import dependencies
(``requirements-integration.txt``). Run::

    python examples/verl_replay.py            # a temporary buffer, removed at the end
    python examples/verl_replay.py --dir runs/verl-demo
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import uuid
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import AdvantageEstimator
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.utils.model import compute_position_id_with_mask
from verl.utils.torch_functional import get_response_mask

import lakebuffer as lb
from lakebuffer.integrations.verl import from_dataproto, sample_dataproto
from lakebuffer.integrations.verl_replay import (
    NON_TENSOR_JSON,
    RESPONSE_MASK,
    VERL_SCHEMA,
    ReplayConfig,
    ReplayMixer,
)

PAD, EOS, N = 0, 2, 4  # pad / eos token ids, responses per prompt (rollout.n)


def generated_batch(step: int, n_prompts: int = 4, p_len: int = 8, r_len: int = 10) -> DataProto:
    """A scored batch of ``n_prompts * N`` rollouts in verl's layout (a stand-in for vLLM + the reward loop)."""
    g = torch.Generator().manual_seed(step)
    b = n_prompts * N
    plen = torch.randint(2, p_len + 1, (n_prompts,), generator=g).repeat_interleave(N)
    prompt_mask = (torch.arange(p_len)[None, :] >= (p_len - plen)[:, None]).long()  # left padding
    prompts = torch.where(prompt_mask.bool(), torch.randint(10, 500, (b, p_len), generator=g), PAD)
    responses = torch.randint(10, 500, (b, r_len), generator=g)
    responses[torch.arange(b), torch.randint(1, r_len, (b,), generator=g)] = EOS
    response_mask = get_response_mask(response_id=responses, eos_token=EOS, dtype=torch.int64)
    responses = torch.where(response_mask.bool(), responses, PAD)  # right padding
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    score = torch.randint(0, 2, (b,), generator=g).float()
    rm_scores = torch.zeros(b, r_len)
    rm_scores[torch.arange(b), response_mask.sum(-1) - 1] = score  # the score on the last response token
    uid = np.array([str(uuid.uuid4()) for _ in range(n_prompts)], dtype=object).repeat(N)
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "response_mask": response_mask,
                 "input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attention_mask,
                 "position_ids": compute_position_id_with_mask(attention_mask),
                 "rollout_log_probs": -torch.rand(b, r_len, generator=g) * response_mask, "rm_scores": rm_scores},
        non_tensors={"uid": uid, "data_source": np.array(["gsm8k"] * b, dtype=object),
                     "reward_model": np.array([{"ground_truth": "42", "style": "rule"} for _ in range(b)]),
                     "__num_turns__": np.full(b, 2, dtype=np.int32)},
        meta_info={"temperature": 1.0, "reward_extra_keys": []},
    )


def concat_demo(root: Path) -> None:
    """1. A replay DataProto like the live batch, and DataProto.concat."""
    with lb.ReplayBuffer.open(root / "concat", memory_limit_mb=64, snapshot_interval_s=0, schema=VERL_SCHEMA) as buf:
        buf.push(from_dataproto(generated_batch(1), policy_version=1, non_tensor_columns=["data_source"],
                                non_tensor_json=NON_TENSOR_JSON, response_mask_column=RESPONSE_MASK))
        batch = generated_batch(2)
        replay = sample_dataproto(buf, 8, where="policy_version < 2", sampler="uniform", like=batch,
                                  non_tensor_json=NON_TENSOR_JSON, response_mask_column=RESPONSE_MASK)
        mixed = DataProto.concat([batch, replay])
        print(f"DataProto.concat([batch {len(batch)}, replay {len(replay)}]) -> {len(mixed)} rows; "
              f"keys {sorted(mixed.batch.keys())}; non-tensor {sorted(mixed.non_tensor_batch)}; "
              f"meta_info {mixed.meta_info}")


def hook_demo(root: Path, steps: int) -> None:
    """2. The trainer.replay hook: push, mix at `ratio`, metrics, then verl's GRPO advantage."""
    config = OmegaConf.create({
        "trainer": {"experiment_name": "verl-demo", "replay": {
            "enable": True, "dir": str(root / "hook"), "ratio": 0.5, "max_lag": 2, "sampler": "group",
            "where": "data_source = 'gsm8k'", "snapshot_interval_s": 0}},
    })
    # ReplayRayPPOTrainer builds this from its config: multiple_of = ppo_mini_batch_size * rollout.n
    with ReplayMixer(ReplayConfig.from_trainer_config(config), multiple_of=N, group_size=N) as mixer:
        for step in range(1, steps + 1):
            batch = generated_batch(step)
            metrics: dict = {}
            mixer.mix(batch, step, metrics)  # what ReplayRayPPOTrainer._balance_batch does
            batch.batch["token_level_rewards"] = batch.batch["rm_scores"]
            batch = compute_advantage(batch, adv_estimator=AdvantageEstimator.GRPO, num_repeat=N)
            shown = {k: round(v, 3) for k, v in metrics.items() if k != "replay/seconds"}
            print(f"step {step}: batch {len(batch)} rows, advantages {tuple(batch.batch['advantages'].shape)}, {shown}")
        lag = mixer.buffer.sql("SELECT max(policy_version) AS newest, count(*) AS n FROM rollouts").to_pylist()[0]
        print(f"buffer: {lag['n']} rollouts stored, newest policy version {lag['newest']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", help="where the buffers go (default: a temporary directory, removed)")
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="lakebuffer-verl-"))
    try:
        concat_demo(root)
        hook_demo(root, args.steps)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
