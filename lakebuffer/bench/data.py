"""Synthetic GRPO rollouts, generated once per run and fed to every system.

Everything is vectorised NumPy/Arrow (no per-row Python), so 2 GB of rollouts costs a few seconds.
Token ids and log-probs are cut from a seeded random pool instead of drawn afresh: drawing is as
slow as the systems under test, and a 4 M-entry pool repeats far beyond any compressor's window
(zstd's is at most 8 MiB at the levels used), so compression ratios stay those of random tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..schema import ROLLOUT_SCHEMA

GROUP_SIZE = 8  # GRPO: responses per prompt
VOCAB = 151_936  # a Qwen-sized vocabulary (17 bits of entropy per int32 token)
_POOL = 1 << 22  # 16 MiB of tokens: repeats far beyond any page/compressor window
_EPOCH_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z


@dataclass(frozen=True)
class Shape:
    """Token-length ranges; the payload default follows the issue (256..4096 response tokens)."""

    response: tuple[int, int] = (256, 4096)
    prompt: tuple[int, int] = (64, 1024)
    rows_per_version: int = 1024  # one trainer step = 128 prompts x 8 responses


PAYLOAD = Shape()
METADATA = Shape(response=(1, 4), prompt=(1, 4))  # "metadata only": tiny lists so 10M rows fit


@lru_cache(maxsize=2)
def _pools(seed: int, size: int = _POOL) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed ^ 0x5EED)
    tokens = rng.integers(0, VOCAB, size=size, dtype=np.int32)
    logprobs = (rng.random(size, dtype=np.float32) * np.float32(-8.0)).astype(np.float32)
    return tokens, logprobs


def _cut(pool: np.ndarray, start: int, n: int) -> np.ndarray:
    """``n`` consecutive pool entries from ``start``, wrapping around (a memcpy, no RNG)."""
    out = np.empty(n, dtype=pool.dtype)
    pos, start = 0, start % len(pool)
    while pos < n:
        take = min(n - pos, len(pool) - start)
        out[pos : pos + take] = pool[start : start + take]
        pos += take
        start = 0
    return out


def _lists(values: np.ndarray, lengths: np.ndarray) -> pa.ListArray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def _ids(prefix: str, numbers: np.ndarray, width: int) -> pa.Array:
    """Vectorised ``f"{prefix}{n:0{width}d}"`` strings."""
    digits = pc.utf8_lpad(pc.cast(pa.array(numbers), pa.string()), width=width, padding="0")
    return pc.binary_join_element_wise(pa.scalar(prefix), digits, "")


def rollouts(first_row: int, n_rows: int, *, seed: int = 0, shape: Shape = PAYLOAD, run_id: str = "bench") -> pa.Table:
    """Rows ``first_row .. first_row + n_rows`` of a deterministic rollout stream.

    The same ``(first_row, seed, shape)`` always gives the same rows, so a child process measuring
    RSS regenerates exactly what the parent measured. ``n_rows`` should be a multiple of 8 (groups).
    """
    rng = np.random.default_rng([seed, first_row])
    tokens, logprobs = _pools(seed)
    row = np.arange(first_row, first_row + n_rows, dtype=np.int64)
    group = row // GROUP_SIZE
    first_group = int(group[0])
    groups = group - first_group
    n_groups = int(groups[-1]) + 1 if n_rows else 0

    p_len = rng.integers(shape.prompt[0], shape.prompt[1] + 1, size=n_groups, dtype=np.int32)
    prompts = _lists(_cut(tokens, first_group * 977, int(p_len.sum())), p_len)
    prompt_ids = prompts.take(pa.array(groups))  # every response of a group shares its prompt
    r_len = rng.integers(shape.response[0], shape.response[1] + 1, size=n_rows, dtype=np.int32)
    total = int(r_len.sum())
    start = first_row * 2311
    response_ids = _lists(_cut(tokens, start, total), r_len)
    response_logprobs = _lists(_cut(logprobs, start, total), r_len)

    reward = rng.random(n_rows, dtype=np.float32)
    by_group = reward.reshape(-1, GROUP_SIZE) if n_rows % GROUP_SIZE == 0 else reward[None, :]
    advantage = (by_group - by_group.mean(axis=1, keepdims=True)).reshape(-1).astype(np.float32)
    created = (_EPOCH_US + row * 1000).astype("datetime64[us]")
    prompt_id = _ids("p", group, 10)
    cols = {
        "key": _ids(f"{run_id}-", row, 12),
        "run_id": pa.repeat(pa.scalar(run_id, pa.string()), n_rows),
        "prompt_id": prompt_id,
        "group_id": prompt_id,
        "episode_id": pa.nulls(n_rows, pa.string()),
        "agent_id": pa.nulls(n_rows, pa.string()),
        "team_id": pa.nulls(n_rows, pa.string()),
        "step": pa.array(np.zeros(n_rows, dtype=np.int64)),
        "policy_version": pa.array(row // shape.rows_per_version),
        "prompt_ids": prompt_ids,
        "response_ids": response_ids,
        "response_logprobs": response_logprobs,
        "reward": pa.array(reward),
        "advantage": pa.array(advantage),
        "verified": pa.array(reward > 0.9),
        "created_at": pa.array(created).cast(pa.timestamp("us", tz="UTC")),
        "sample_count": pa.array(np.zeros(n_rows, dtype=np.int32)),
    }
    return pa.table([cols[f.name] for f in ROLLOUT_SCHEMA], schema=ROLLOUT_SCHEMA)


def avg_row_bytes(shape: Shape = PAYLOAD) -> float:
    """Expected Arrow bytes per row, used to turn a byte target into a row count."""
    tok = (shape.response[0] + shape.response[1]) / 2 * 8 + (shape.prompt[0] + shape.prompt[1]) / 2 * 4
    return tok + 200


def stream(total_bytes: int, *, batch_rows: int = 512, seed: int = 0, shape: Shape = PAYLOAD, run_id: str = "bench") -> Iterator[pa.Table]:
    """Push-sized batches until ``total_bytes`` of Arrow data have been produced."""
    produced, first = 0, 0
    while produced < total_bytes:
        t = rollouts(first, batch_rows, seed=seed, shape=shape, run_id=run_id)
        produced += t.nbytes
        first += batch_rows
        yield t


def generate(total_bytes: int, **kw) -> list[pa.Table]:
    """The whole stream in memory: the one copy every system of a scenario ingests."""
    return list(stream(total_bytes, **kw))


def logical_bytes(tables: list[pa.Table]) -> int:
    """The data size all throughputs are quoted in: Arrow buffer bytes of the rows."""
    return sum(t.nbytes for t in tables)
