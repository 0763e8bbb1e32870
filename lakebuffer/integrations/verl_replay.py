"""Replay in verl's PPO trainer, turned on by a ``trainer.replay`` config block.

verl 0.9.1's ``RayPPOTrainer.fit`` (the DataProto trainer, ``trainer.use_v1=false``) calls
``self._balance_batch(batch, metrics)`` once per step, right after the generated batch is joined to
its prompts and before anything is computed from the current models: reward extraction,
``old_log_probs``, ``ref_log_prob``, ``values``, advantages. ``ReplayTrainerMixin`` overrides that
method: it pushes the live rows into a ``ReplayBuffer`` and grows ``batch`` in place with replayed
rows shaped like it (``like_dataproto``), so verl then scores, recomputes log-probs and advantages
for live and replayed rows alike, with ``rollout_log_probs`` holding each row's behaviour log-probs
for verl's rollout correction (``algorithm.rollout_correction``). Metrics go into the step's
``metrics`` dict: ``replay/rows``, ``replay/ratio``, ``replay/policy_lag_mean``,
``replay/policy_lag_max``, ``replay/pushed``, ``replay/seconds``.

``ReplayMixer`` is that step without the trainer (config block in, ``mix(batch, step, metrics)``),
for custom loops and tests. ``lakebuffer.integrations.verl_main`` is verl's ``main_ppo`` with a
trainer built from this mixin (``python -m lakebuffer.integrations.verl_main trainer.replay.enable=true
trainer.replay.dir=...``).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import pyarrow as pa

from ..buffer import ReplayBuffer
from ..errors import NotEnoughRowsError, OptionError
from .verl import from_dataproto
from .verl_like import like_dataproto

__all__ = ["NON_TENSOR_JSON", "RESPONSE_MASK", "ReplayConfig", "ReplayMixer", "ReplayTrainerMixin", "VERL_SCHEMA"]

NON_TENSOR_JSON = "verl_non_tensor"  # reward_model (ground truth), extra_info, __num_turns__, ... as JSON
RESPONSE_MASK = "response_mask"  # multi-turn masks (tool tokens 0) round-trip exactly
VERL_SCHEMA = pa.schema([
    pa.field("data_source", pa.string()),
    pa.field(NON_TENSOR_JSON, pa.string()),
    pa.field(RESPONSE_MASK, pa.list_(pa.int8())),
])


@dataclass(frozen=True)
class ReplayConfig:
    """The ``trainer.replay`` block. ``ratio`` is the share of the training batch that is replayed."""

    dir: str
    lake: str | None = None
    storage_options: dict | None = None
    ratio: float = 0.25
    where: str | None = None
    max_lag: int | None = None
    sampler: str = "group"
    sampler_options: dict = field(default_factory=dict)
    seed: int = 0
    memory_limit_mb: float | None = 1024
    snapshot_interval_s: float = 180
    run_id: str | None = None
    open_options: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.dir:
            raise OptionError("trainer.replay.dir is required (the buffer's local directory)")
        if not 0 <= self.ratio < 1:
            raise OptionError(f"trainer.replay.ratio must be in [0, 1) (the replayed share of a batch), got {self.ratio}")
        if self.max_lag is not None and self.max_lag < 1:
            raise OptionError(f"trainer.replay.max_lag must be >= 1 or null, got {self.max_lag}")

    @classmethod
    def from_trainer_config(cls, config: Any) -> ReplayConfig | None:
        """The block at ``trainer.replay`` of a verl config, or None when absent or ``enable`` is false."""
        from omegaconf import OmegaConf

        block = OmegaConf.select(config, "trainer.replay", default=None)
        if block is None:
            return None
        values = OmegaConf.to_container(block, resolve=True) if OmegaConf.is_config(block) else dict(block)
        if not values.pop("enable", False):
            return None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise OptionError(f"unknown trainer.replay option(s) {', '.join(unknown)}; known: enable, {', '.join(sorted(known))}")
        if values.get("run_id") is None:
            values["run_id"] = OmegaConf.select(config, "trainer.experiment_name", default=None)
        values = {k: v for k, v in values.items() if v is not None or k in ("dir", "lake", "where", "max_lag", "run_id")}
        return cls(**values)


class ReplayMixer:
    """Push each live batch, then append replayed rows (``ratio`` of the result) shaped like it.

    ``multiple_of``: the replayed row count is a multiple of it (verl's mini-batch, so the grown
    batch still splits into whole mini-batches and data-parallel shards). ``group_size``: rows per
    GRPO group (``rollout.n``), used by the ``group`` sampler, which replays whole groups.
    """

    def __init__(self, config: ReplayConfig, *, multiple_of: int = 1, group_size: int = 1) -> None:
        self.config = config
        self.multiple_of = max(1, int(multiple_of))
        self.group_size = max(1, int(group_size))
        self.buffer = ReplayBuffer.open(
            config.dir, lake=config.lake, memory_limit_mb=config.memory_limit_mb,
            snapshot_interval_s=config.snapshot_interval_s, storage_options=config.storage_options,
            schema=VERL_SCHEMA, run_id=config.run_id, **config.open_options)

    def replay_rows(self, live_rows: int) -> int:
        """Rows to replay next to ``live_rows`` for a replayed share of ``ratio`` (whole multiples)."""
        r = self.config.ratio
        ideal = live_rows * r / (1 - r)
        return int(round(ideal / self.multiple_of)) * self.multiple_of

    def where(self, step: int) -> str:
        """Rows of earlier steps, within ``max_lag`` versions, matching the user's predicate."""
        parts = [f"policy_version < {int(step)}"]
        if self.config.max_lag is not None:
            parts.append(f"policy_version >= {int(step) - self.config.max_lag}")
        if self.config.where:
            parts.append(f"({self.config.where})")
        return " AND ".join(parts)

    def push(self, batch: Any, step: int) -> int:
        """Store the live rows (behaviour log-probs, reward, non-tensor fields) as ``policy_version = step``."""
        nt = batch.non_tensor_batch
        if "rm_scores" not in batch.batch.keys():
            raise OptionError("trainer.replay needs the rollout's reward (batch['rm_scores']) when the batch is mixed; "
                              "verl puts it there when the reward loop scores during rollout")
        rows = from_dataproto(batch, policy_version=step, reward_key="rm_scores", advantage_key=None,
                              non_tensor_columns=[k for k in ("data_source",) if k in nt],
                              non_tensor_json=NON_TENSOR_JSON, response_mask_column=RESPONSE_MASK)
        self.buffer.push(rows)
        return rows.num_rows

    def sample(self, like: Any, step: int, n_rows: int) -> tuple[Any, np.ndarray]:
        """Up to ``n_rows`` replayed rows as a ``DataProto`` like ``like`` (None when none qualify),
        and their policy versions."""
        none = (None, np.zeros(0, dtype=np.int64))
        if n_rows <= 0:
            return none
        c = self.config
        options = dict(c.sampler_options)
        n = n_rows
        if c.sampler == "group":
            options.setdefault("allow_fewer", True)
            n = n_rows // self.group_size
        self.buffer.set_policy_version(step, step)
        try:
            rows = self.buffer.sample(n, where=self.where(step), sampler=c.sampler,
                                      seed=c.seed * 1_000_003 + int(step), **options)
        except NotEnoughRowsError:
            return none
        keep = min(rows.num_rows, n_rows) // self.multiple_of * self.multiple_of
        if keep == 0:
            return none
        rows = rows.slice(0, keep)
        replay = like_dataproto(rows, like, response_mask_column=RESPONSE_MASK, non_tensor_json=NON_TENSOR_JSON)
        return replay, rows.column("policy_version").to_numpy()

    def mix(self, batch: Any, step: int, metrics: dict | None = None) -> Any:
        """Push ``batch``, then grow it in place by the replayed rows; report ``replay/*`` into ``metrics``."""
        from verl.protocol import DataProto

        t0 = time.perf_counter()
        live = len(batch)
        pushed = self.push(batch, step)
        replay, versions = self.sample(batch, step, self.replay_rows(live))
        k = 0 if replay is None else len(replay)
        out = {"replay/pushed": float(pushed), "replay/rows": float(k), "replay/ratio": k / (live + k)}
        if replay is not None:
            lag = int(step) - versions
            out["replay/policy_lag_mean"] = float(lag.mean())
            out["replay/policy_lag_max"] = float(lag.max())
            merged = DataProto.concat([batch, replay])
            batch.batch = merged.batch
            batch.non_tensor_batch = merged.non_tensor_batch
        out["replay/seconds"] = time.perf_counter() - t0
        if metrics is not None:
            metrics.update(out)
        return batch

    def close(self) -> None:
        self.buffer.close()

    def __enter__(self) -> ReplayMixer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ReplayMixer({asdict(self.config)!r}, multiple_of={self.multiple_of}, group_size={self.group_size})"


def mini_batch_rows(config: Any, use_critic: bool) -> int:
    """verl's mini-batch in rows (``ppo_mini_batch_size * rollout.n``; the critic's too when it trains):
    a batch that is not a whole number of them fails in verl's mini-batch iterator."""
    n = int(config.actor_rollout_ref.rollout.n)
    sizes = [int(config.actor_rollout_ref.actor.ppo_mini_batch_size) * n]
    if use_critic:
        sizes.append(int(config.critic.ppo_mini_batch_size) * n)
    return math.lcm(*sizes)


class ReplayTrainerMixin:
    """Put before ``RayPPOTrainer`` (``class T(ReplayTrainerMixin, RayPPOTrainer)``): replay from ``trainer.replay``.

    ``trainer.balance_batch`` is forced on so verl calls the seam; when the user had it off, the
    mixin mixes and returns without balancing.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replay_mixer: ReplayMixer | None = None
        cfg = ReplayConfig.from_trainer_config(self.config)
        if cfg is None:
            return
        from omegaconf import open_dict

        self._replay_balances = bool(self.config.trainer.get("balance_batch", True))
        with open_dict(self.config):
            self.config.trainer.balance_batch = True
        self.replay_mixer = ReplayMixer(cfg, multiple_of=mini_batch_rows(self.config, bool(getattr(self, "use_critic", False))),
                                        group_size=int(self.config.actor_rollout_ref.rollout.n))

    def _balance_batch(self, batch: Any, metrics: dict, logging_prefix: str = "global_seqlen",
                       keep_minibatch: bool = False) -> None:
        if self.replay_mixer is not None and logging_prefix == "global_seqlen":
            self.replay_mixer.mix(batch, int(self.global_steps), metrics)
            if not self._replay_balances:
                return None
        return super()._balance_batch(batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)

    def fit(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().fit(*args, **kwargs)
        finally:
            if self.replay_mixer is not None:
                self.replay_mixer.close()
