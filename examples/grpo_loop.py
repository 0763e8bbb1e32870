"""A GRPO loop on CPU with lakebuffer: generate -> push -> sample -> train, with replay.

The policy is a tiny GRU language model over a 12-token vocabulary; the toy task rewards the
fraction of response tokens equal to ``TARGET`` (a verifier you would replace by yours), so the
mean reward climbs from chance (1/12) within a few steps. Each step:

1. generate: G responses for each of P prompts, keeping the behaviour log-probs;
2. score and compute GRPO advantages per group (reward minus the group mean, over the group std);
3. push the rollouts into the buffer (``policy_version`` = step);
4. train: a few PPO-clip updates on batches sampled from the buffer, fresh and replayed rollouts
   (``where="policy_version >= step - lag"``), collated by ``pad_collate``.

At the end the buffer is snapshotted to its lake and one offline epoch is streamed from the lake
with ``RolloutDataset`` (sharded, shuffled) to show the offline path. Run::

    python examples/grpo_loop.py --steps 30
"""

from __future__ import annotations

import argparse
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from torch import nn

import lakebuffer as lb
from lakebuffer.dataset import RolloutDataset, SamplingDataset, pad_collate

VOCAB, PROMPT_LEN, RESPONSE_LEN, TARGET = 12, 4, 6, 5


class TinyPolicy(nn.Module):
    def __init__(self, vocab: int = VOCAB, hidden: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor, state: torch.Tensor | None = None):
        out, state = self.rnn(self.embed(ids), state)
        return self.head(out), state

    @torch.no_grad()
    def generate(self, prompts: torch.Tensor, length: int, temperature: float = 1.0):
        """Sample ``length`` tokens after each prompt; returns (tokens, their log-probs)."""
        logits, state = self(prompts)
        tokens, logps = [], []
        last = logits[:, -1]
        for _ in range(length):
            dist = torch.distributions.Categorical(logits=last / temperature)
            tok = dist.sample()
            tokens.append(tok)
            logps.append(dist.log_prob(tok))
            logits, state = self(tok[:, None], state)
            last = logits[:, -1]
        return torch.stack(tokens, 1), torch.stack(logps, 1)


def token_logprobs(policy: TinyPolicy, batch: dict) -> torch.Tensor:
    """Log-probs of every response token under ``policy`` ([B, L], valid where loss_mask is 1)."""
    ids = batch["input_ids"]
    logits, _ = policy(ids[:, :-1])
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(logp, (1, 0))  # position t holds log p(token t | tokens < t)


def old_logprobs_like(batch: dict) -> torch.Tensor:
    """The stored behaviour log-probs placed at the response positions of ``input_ids``."""
    old = torch.zeros_like(batch["loss_mask"], dtype=torch.float32)
    mask = batch["loss_mask"].bool()
    old[mask] = batch["response_logprobs"][batch["response_mask"].bool()]
    return old


def rollouts(policy: TinyPolicy, step: int, n_prompts: int, group: int, rng: np.random.Generator) -> pa.Table:
    prompts = torch.from_numpy(rng.integers(0, VOCAB, (n_prompts, PROMPT_LEN))).repeat_interleave(group, 0)
    responses, logps = policy.generate(prompts, RESPONSE_LEN)
    reward = (responses == TARGET).float().mean(1)  # the verifier
    grouped = reward.view(n_prompts, group)
    adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).view(-1)
    ids = [f"s{step}-p{i // group}" for i in range(n_prompts * group)]
    return pa.table({
        "prompt_id": ids,
        "group_id": ids,
        "policy_version": pa.array([step] * len(ids), pa.int64()),
        "prompt_ids": pa.array(prompts.tolist(), pa.list_(pa.int32())),
        "response_ids": pa.array(responses.tolist(), pa.list_(pa.int32())),
        "response_logprobs": pa.array(logps.tolist(), pa.list_(pa.float32())),
        "reward": pa.array(reward.numpy(), pa.float32()),
        "advantage": pa.array(adv.numpy(), pa.float32()),
    })


def ppo_step(policy: TinyPolicy, opt: torch.optim.Optimizer, batch: dict, clip: float = 0.2) -> float:
    mask = batch["loss_mask"].float()
    logp = token_logprobs(policy, batch)
    ratio = torch.exp(logp - old_logprobs_like(batch))
    adv = batch["advantage"].float()[:, None]
    loss = -(torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv) * mask).sum() / mask.sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--updates", type=int, default=8, help="PPO updates per step")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--lag", type=int, default=2, help="replay rollouts of up to this many policy versions back")
    ap.add_argument("--dir", default=None, help="buffer directory (default: a temporary one, removed at the end)")
    args = ap.parse_args(argv)
    if args.dir is not None:
        return run(args, Path(args.dir))
    with tempfile.TemporaryDirectory(prefix="lakebuffer-grpo-") as tmp:  # leaves nothing behind in /tmp
        result = run(args, Path(tmp))
    result["dir"] = None
    return result


def run(args: argparse.Namespace, root: Path) -> dict:
    """The loop itself, with its buffer and lake under ``root``."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    policy = TinyPolicy()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    collate = partial(pad_collate, pad_token_id=0)
    history = []
    t0 = time.perf_counter()
    with lb.ReplayBuffer.open(root / "buffer", memory_limit_mb=64, snapshot_interval_s=0,
                              lake=(root / "lake").as_uri()) as buf:
        for step in range(args.steps):
            batch = rollouts(policy, step, args.prompts, args.group, rng)  # 1. generate + score
            buf.push(batch)  # 2. push
            history.append(float(np.mean(batch.column("reward").to_numpy())))
            replay = SamplingDataset(  # 3. sample fresh + replayed rollouts, any registered sampler
                buf, n_steps=args.updates, batch_size=args.batch_size, sampler="uniform",
                where=f"policy_version >= {step - args.lag}", seed=step, collate=collate)
            losses = [ppo_step(policy, opt, b) for b in replay]  # 4. train
            if step % 5 == 0 or step == args.steps - 1:
                print(f"step {step:3d}  reward {history[-1]:.3f}  loss {np.mean(losses):+.4f}  "
                      f"buffer {len(buf)} rows")
        buf.snapshot(wait=True)
    # offline: one shuffled, sharded epoch over everything the run wrote to its lake
    with lb.ReplayBuffer.open_lake((root / "lake").as_uri()) as lake:
        data = RolloutDataset(lake, where="reward > 0.5", batch_size=args.batch_size, shuffle=True,
                              collate=collate, rank=0, world_size=1)
        data.set_epoch(0)
        offline = sum(int(b["input_ids"].shape[0]) for b in data.loader(num_workers=0))
    result = {"first_reward": float(np.mean(history[:3])), "last_reward": float(np.mean(history[-3:])),
              "offline_rows": offline, "seconds": time.perf_counter() - t0, "dir": str(root)}
    print(f"reward {result['first_reward']:.3f} -> {result['last_reward']:.3f}; offline epoch over the lake: "
          f"{offline} rows with reward > 0.5; {result['seconds']:.1f} s; data in {root}")
    return result


if __name__ == "__main__":
    main()
