"""Replay in verl 0.9.1's trainer on CPU: batches like the live one, and the ``trainer.replay`` hook.

The live batches are built as ``RayPPOTrainer.fit`` holds them at the ``_balance_batch`` seam
(``verl_batches.seam_batch``); the hook is verl's real ``RayPPOTrainer`` (built from the composed
hydra config, without workers), driven through the seam and then through the driver-side code
``fit`` runs next: ``extract_reward``, bypass-mode log-probs, ``compute_advantage`` (GRPO) and
``compute_data_metrics``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensordict")
verl_protocol = pytest.importorskip("verl.protocol")
pytest.importorskip("torchdata", reason="verl.trainer.ppo.ray_trainer imports torchdata")
pytest.importorskip("hydra")

import lakebuffer as lb  # noqa: E402
from lakebuffer.errors import OptionError, SchemaError  # noqa: E402
from lakebuffer.integrations.verl import from_dataproto, sample_dataproto  # noqa: E402
from lakebuffer.integrations.verl_replay import (  # noqa: E402
    NON_TENSOR_JSON,
    RESPONSE_MASK,
    VERL_SCHEMA,
    ReplayConfig,
    ReplayMixer,
)

sys.path.insert(0, str(Path(__file__).parent))
from verl_batches import PAD, seam_batch  # noqa: E402

DataProto = verl_protocol.DataProto
ROOT = Path(__file__).resolve().parents[2]


def _push(buf, batch, step):
    return buf.push(from_dataproto(batch, policy_version=step, reward_key="rm_scores",
                                   non_tensor_columns=["data_source"], non_tensor_json=NON_TENSOR_JSON,
                                   response_mask_column=RESPONSE_MASK))


def _row_index(batch) -> dict:
    """(uid, response tokens) -> row, over a batch (pushed rows are found again by their content)."""
    r = batch.batch["responses"]
    return {(batch.non_tensor_batch["uid"][i], tuple(r[i].tolist())): i for i in range(len(batch))}


@pytest.mark.parametrize("multi_turn", [False, True])
def test_replay_like_the_live_batch_concatenates(tmp_path, multi_turn):
    pushed = {s: seam_batch(s, multi_turn=multi_turn) for s in (1, 2)}
    live = seam_batch(3, multi_turn=multi_turn)
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=8, snapshot_interval_s=0, schema=VERL_SCHEMA) as buf:
        for s, b in pushed.items():
            _push(buf, b, s)
        replay = sample_dataproto(buf, 24, where="policy_version < 3", seed=3, like=live,
                                  response_mask_column=RESPONSE_MASK, non_tensor_json=NON_TENSOR_JSON)
    assert len(replay) == 24
    # exactly the live keys, dtypes, trailing shapes; meta_info copied
    assert list(replay.batch.keys()) == list(live.batch.keys())
    for k in live.batch.keys():
        assert replay.batch[k].dtype == live.batch[k].dtype, k
        assert replay.batch[k].shape[1:] == live.batch[k].shape[1:], k
    assert list(replay.non_tensor_batch) == list(live.non_tensor_batch)
    for k, v in live.non_tensor_batch.items():
        assert replay.non_tensor_batch[k].dtype == v.dtype, k
    assert replay.meta_info == live.meta_info
    both = DataProto.concat([live, replay])
    assert len(both) == len(live) + 24 and both.meta_info == live.meta_info
    # every replayed row is a pushed row, tensor for tensor and field for field
    index = {s: _row_index(b) for s, b in pushed.items()}
    for i in range(len(replay)):
        uid = replay.non_tensor_batch["uid"][i]
        key = (uid, tuple(replay.batch["responses"][i].tolist()))
        src_step = next(s for s in pushed if key in index[s])
        src, j = pushed[src_step], index[src_step][key]
        for k in live.batch.keys():
            assert torch.equal(replay.batch[k][i], src.batch[k][j]), k
        for k in live.non_tensor_batch:
            assert replay.non_tensor_batch[k][i] == src.non_tensor_batch[k][j], k
    # the pad token is the live batch's (7), on both padding sides
    assert int(replay.batch["input_ids"][replay.batch["attention_mask"] == 0][0]) == PAD


def test_like_refuses_what_the_buffer_cannot_supply(tmp_path):
    live = seam_batch(2)
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=8, snapshot_interval_s=0, schema=VERL_SCHEMA) as buf:
        _push(buf, seam_batch(1), 1)
        later = seam_batch(2).union(DataProto.from_dict(tensors={"values": torch.zeros(len(live), 12)}))
        with pytest.raises(SchemaError, match="values.*before"):
            sample_dataproto(buf, 4, like=later, non_tensor_json=NON_TENSOR_JSON)
        # a non-tensor field that was never stored
        live.non_tensor_batch["judge"] = np.array(["x"] * len(live), dtype=object)
        with pytest.raises(SchemaError, match="judge"):
            sample_dataproto(buf, 4, like=live, non_tensor_json=NON_TENSOR_JSON)
        got = sample_dataproto(buf, 4, like=live, non_tensor_json=NON_TENSOR_JSON, non_tensor_fill={"judge": "n/a"})
        assert list(got.non_tensor_batch["judge"]) == ["n/a"] * 4
        DataProto.concat([live, got])


@pytest.fixture(scope="module")
def verl_config():
    from hydra import compose, initialize_config_module

    def make(tmp: Path, *extra: str):
        with initialize_config_module(config_module="lakebuffer.integrations", version_base=None):
            return compose("verl_replay_trainer", overrides=[
                "trainer.device=cpu", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=1", "algorithm.adv_estimator=grpo",
                "algorithm.rollout_correction.bypass_mode=true", "trainer.balance_batch=false",
                f"trainer.replay.dir={tmp}", *extra])
    return make


def _trainer(config):
    from verl.trainer.ppo.utils import Role

    from lakebuffer.integrations.verl_main import ReplayRayPPOTrainer

    return ReplayRayPPOTrainer(config=config, tokenizer=None, role_worker_mapping={Role.ActorRollout: object},
                               resource_pool_manager=None, train_dataset=list(range(8)), val_dataset=list(range(2)))


def _rest_of_the_step(trainer, batch) -> dict:
    """What RayPPOTrainer.fit does on the driver after _balance_batch, minus the model calls."""
    from verl.trainer.ppo.metric_utils import compute_data_metrics
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.trainer.ppo.reward import extract_reward
    from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode

    cfg = trainer.config
    batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
    reward_tensor, extra = extract_reward(batch)
    apply_bypass_mode(batch=batch, rollout_corr_config=cfg.algorithm.rollout_correction,
                      policy_loss_config=cfg.actor_rollout_ref.actor.policy_loss)
    batch.batch["token_level_scores"] = reward_tensor
    batch.non_tensor_batch.update({k: np.array(v) for k, v in extra.items()})
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    out = compute_advantage(batch, adv_estimator=cfg.algorithm.adv_estimator, gamma=cfg.algorithm.gamma,
                            lam=cfg.algorithm.lam, num_repeat=cfg.actor_rollout_ref.rollout.n,
                            norm_adv_by_std_in_grpo=True, config=cfg.algorithm)
    return compute_data_metrics(batch=out, use_critic=False)


def test_trainer_replay_hook_end_to_end(tmp_path, verl_config):
    cfg = verl_config(tmp_path / "buf", "trainer.replay.enable=true", "trainer.replay.ratio=0.5",
                      "trainer.replay.max_lag=2", "trainer.replay.snapshot_interval_s=0")
    trainer = _trainer(cfg)
    mixer = trainer.replay_mixer
    assert isinstance(mixer, ReplayMixer) and mixer.multiple_of == 4 and mixer.group_size == 4
    assert trainer.config.trainer.balance_batch is True and trainer._replay_balances is False
    seen = {}
    try:
        for step in range(1, 6):
            trainer.global_steps = step
            batch = seam_batch(step)
            seen[step] = batch.slice(0, len(batch))
            live_uids = set(batch.non_tensor_batch["uid"])
            metrics: dict = {}
            trainer._balance_batch(batch, metrics=metrics)  # the call fit() makes
            assert metrics["replay/pushed"] == 16
            if step == 1:
                assert len(batch) == 16 and metrics["replay/rows"] == 0 and metrics["replay/ratio"] == 0
                continue
            assert len(batch) == 32 and metrics["replay/rows"] == 16 and metrics["replay/ratio"] == 0.5
            replayed = [i for i, u in enumerate(batch.non_tensor_batch["uid"]) if u not in live_uids]
            assert len(replayed) == 16
            uids = batch.non_tensor_batch["uid"][replayed]
            # whole GRPO groups, from earlier steps within max_lag
            assert all(np.sum(uids == u) == 4 for u in set(uids))
            lags = []
            for i in replayed:
                key = (batch.non_tensor_batch["uid"][i], tuple(batch.batch["responses"][i].tolist()))
                src = next(s for s in seen if s < step and key in _row_index(seen[s]))
                j = _row_index(seen[src])[key]
                assert torch.equal(batch.batch["rollout_log_probs"][i], seen[src].batch["rollout_log_probs"][j])
                assert torch.equal(batch.batch["input_ids"][i], seen[src].batch["input_ids"][j])
                assert batch.non_tensor_batch["reward_model"][i] == seen[src].non_tensor_batch["reward_model"][j]
                lags.append(step - src)
            assert 1 <= min(lags) and max(lags) <= 2
            assert metrics["replay/policy_lag_max"] == max(lags)
            assert metrics["replay/policy_lag_mean"] == pytest.approx(np.mean(lags))
            data = _rest_of_the_step(trainer, batch)
            assert data["response_length/mean"] > 0
            adv = batch.batch["advantages"]
            assert adv.shape == (32, 12) and torch.isfinite(adv).all()
            # GRPO over a replayed group: scores standardised within the group
            u = uids[0]
            rows = [i for i in range(32) if batch.non_tensor_batch["uid"][i] == u]
            score = batch.batch["token_level_scores"][rows].sum(-1)
            mask = batch.batch["response_mask"][rows].bool()
            a = (batch.batch["advantages"][rows] * mask).sum(-1) / mask.sum(-1)
            if float(score.std()) > 0:
                want = (score - score.mean()) / (score.std() + 1e-6)
                assert torch.allclose(a, want, atol=1e-4)
    finally:
        mixer.close()
    # the pushed rollouts answer SQL, replay events included
    with lb.ReplayBuffer.open(tmp_path / "buf", memory_limit_mb=8, snapshot_interval_s=0, schema=VERL_SCHEMA,
                              run_id=trainer.config.trainer.experiment_name) as buf:
        assert len(buf) == 5 * 16
        got = buf.sql(f"SELECT count(*) AS n FROM rollouts WHERE json_extract_string({NON_TENSOR_JSON}, "
                      "'$.reward_model.style') = 'rule' AND data_source IN ('gsm8k', 'math')").column("n")[0].as_py()
        assert got == 80


def test_hook_off_and_bad_options(tmp_path, verl_config):
    trainer = _trainer(verl_config(tmp_path / "off"))
    assert trainer.replay_mixer is None and trainer.config.trainer.balance_batch is False
    assert not (tmp_path / "off").exists()
    with pytest.raises(OptionError, match="ratio"):
        ReplayConfig.from_trainer_config(verl_config(tmp_path / "x", "trainer.replay.enable=true",
                                                     "trainer.replay.ratio=1.0"))
    with pytest.raises(OptionError, match="dir is required"):
        ReplayConfig.from_trainer_config(verl_config("null", "trainer.replay.enable=true"))
    with pytest.raises(OptionError, match="unknown trainer.replay option"):
        ReplayConfig.from_trainer_config(verl_config(tmp_path / "x", "trainer.replay.enable=true",
                                                     "+trainer.replay.ration=0.1"))


def test_task_runner_is_verls_with_the_replay_trainer():
    from verl.trainer import main_ppo_v0
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from lakebuffer.integrations.verl_main import ReplayRayPPOTrainer, ReplayTaskRunner

    assert issubclass(ReplayRayPPOTrainer, RayPPOTrainer)
    assert issubclass(ReplayTaskRunner.__ray_actor_class__, main_ppo_v0.TaskRunner.__ray_actor_class__)
    assert main_ppo_v0.RayPPOTrainer is RayPPOTrainer  # bound only inside the actor's process, at run()


def test_example_runs(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "verl_replay.py"), "--dir", str(tmp_path / "ex")],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "DataProto.concat" in out.stdout and "replay/policy_lag_mean" in out.stdout


def test_entry_point_composes_verls_config_with_the_block(tmp_path):
    """hydra's `--cfg job` prints the config `python -m lakebuffer.integrations.verl_main` would run with."""
    out = subprocess.run([sys.executable, "-m", "lakebuffer.integrations.verl_main", "--cfg", "job",
                          "trainer.replay.enable=true", f"trainer.replay.dir={tmp_path}", "trainer.replay.ratio=0.3",
                          "actor_rollout_ref.rollout.n=8"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(out.stdout[out.stdout.index("actor_rollout_ref:"):])
    assert cfg.trainer.use_v1 is False and cfg.actor_rollout_ref.rollout.n == 8
    rc = ReplayConfig.from_trainer_config(cfg)
    assert rc.dir == str(tmp_path) and rc.ratio == 0.3 and rc.sampler == "group"
    assert rc.run_id == cfg.trainer.experiment_name
