"""``python -m lakebuffer.integrations.verl_main``: verl's ``main_ppo`` with replay from ``trainer.replay``.

verl 0.9.1 picks its DataProto trainer in code (``main_ppo_v0.TaskRunner.run`` builds
``RayPPOTrainer``); what it opens to extension is ``run_ppo(config, task_runner_class)``, which its
own recipes (``one_step_off_policy``, ``fully_async_policy``) call with their task runner, and a
hydra config that extends ``ppo_trainer``. This module is such a recipe: the config is verl's plus
the ``trainer.replay`` block (``verl_replay_trainer.yaml``), and the task runner is verl's
``TaskRunner`` whose ``run`` builds ``ReplayRayPPOTrainer`` (``ReplayTrainerMixin`` +
``RayPPOTrainer``) instead: the actor binds ``main_ppo_v0.RayPPOTrainer`` to it in its own process
before running verl's unchanged setup (workers, tokenizer, datasets). Nothing in verl is edited.
"""

from __future__ import annotations

from typing import Any

import hydra
import ray
from verl.trainer import main_ppo_v0
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from .verl_replay import ReplayTrainerMixin

__all__ = ["ReplayRayPPOTrainer", "ReplayTaskRunner", "main"]


class ReplayRayPPOTrainer(ReplayTrainerMixin, RayPPOTrainer):
    """``RayPPOTrainer`` that pushes every generated batch and mixes in replay (``trainer.replay``)."""


class _ReplayTaskRunner(main_ppo_v0.TaskRunner.__ray_actor_class__):
    def run(self, config: Any) -> Any:
        # this Ray actor's process only: verl's TaskRunner.run constructs the trainer by this name
        main_ppo_v0.RayPPOTrainer = ReplayRayPPOTrainer
        return super().run(config)


ReplayTaskRunner = ray.remote(_ReplayTaskRunner)


@hydra.main(config_path=".", config_name="verl_replay_trainer", version_base=None)
def main(config: Any) -> None:
    """verl's ``main_ppo.main`` for the DataProto trainer, with ``ReplayTaskRunner``."""
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=ReplayTaskRunner)


if __name__ == "__main__":
    main()
