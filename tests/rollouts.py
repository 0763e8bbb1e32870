"""Small synthetic rollouts for tests (vectorised; token lists of a chosen length)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def make_rollouts(
    n: int,
    *,
    tokens: int = 64,
    version: int | np.ndarray = 0,
    seed: int = 0,
    group_size: int = 8,
    prompt_prefix: str = "p",
    first_prompt: int = 0,
) -> pa.Table:
    """``n`` rollouts without keys (the buffer generates them), rewards uniform in [0, 1)."""
    rng = np.random.default_rng(seed)
    offsets = pa.array(np.arange(0, (n + 1) * tokens, tokens, dtype=np.int32))
    prompt_ids = pa.ListArray.from_arrays(offsets, pa.array(rng.integers(0, 1000, n * tokens, dtype=np.int32)))
    response_ids = pa.ListArray.from_arrays(offsets, pa.array(rng.integers(0, 1000, n * tokens, dtype=np.int32)))
    logprobs = pa.ListArray.from_arrays(offsets, pa.array(-rng.random(n * tokens, dtype=np.float32)))
    prompts = [f"{prompt_prefix}{first_prompt + i // group_size}" for i in range(n)]
    versions = np.broadcast_to(np.asarray(version, dtype=np.int64), (n,))
    return pa.table(
        {
            "prompt_id": prompts,
            "policy_version": pa.array(versions),
            "prompt_ids": prompt_ids,
            "response_ids": response_ids,
            "response_logprobs": logprobs,
            "reward": pa.array(rng.random(n, dtype=np.float32)),
            "verified": pa.array(rng.random(n) > 0.7),
        }
    )
