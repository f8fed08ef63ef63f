"""The trainer's own actor (trainer_node ``device_worlds``): worlds of the train config's env,
on its engine and device (``env.physics``, ``env.device``: MuJoCo Warp on a GPU, or MuJoCo on
the trainer's cores), stepped in the trainer's process with each new student.

Its chunks never cross DDS: :meth:`DeviceActor.offer_chunk` hands the encoded chunk straight to
:meth:`LiveTrainer.offer <.live_trainer.LiveTrainer.offer>`, which validates and lag-filters it
as it does a batched actor's. It acts as a batched actor does, from the exported student the
trainer pushes (:class:`~.batched_actor.OnnxBehaviour`: the same bytes, version and sha), one
chunk per student (synchronous PPO), so a graph may mix it with actor nodes, and checkpoints
keep the one layout every run writes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .batched_actor import BatchedActor, OnnxBehaviour
from .chunk_encoding import encode
from ..config import ConfigError
from ..control.model_swap import DEFAULT_MAX_MODEL_BYTES, ModelCache
from ..learning.train_config import TrainConfig
from ..sim.env import VecLocomotionEnv


def check_worlds(num_envs: int) -> int:
    """``num_envs`` if it is a device actor's world count (1 to 65536), else a ConfigError
    naming ``device_worlds`` (checked before a trainer writes anything)."""
    if not 1 <= num_envs <= 65536:
        raise ConfigError('trainer_node', 'device_worlds', f'{num_envs}: use 1 to 65536 '
                          'worlds (0 turns the device actor off)')
    return num_envs


class DeviceActor:
    """``num_envs`` worlds of ``cfg.env`` acting with the newest pushed student (module
    docstring); ``seed`` seeds its env and its action sampling."""

    def __init__(self, cfg: TrainConfig, num_envs: int, seed: int, robot: Any = None):
        env_cfg = dataclasses.replace(cfg.env, num_envs=check_worlds(num_envs), seed=seed)
        self.env = VecLocomotionEnv(env_cfg, robot)
        self.models = ModelCache(self.env.robot, DEFAULT_MAX_MODEL_BYTES)
        self.actor = BatchedActor(self.env, None, cfg.runner.num_steps_per_env, 'device',
                                  seed=seed, chunks_in_flight=1)

    def use(self, model: bytes) -> None:
        """Act with this exported student from now on (the trainer's push: trusted bytes,
        validated all the same); ValueError if the model does not fit the robot."""
        sha, verdict = self.models.offer(bytes(model))
        if isinstance(verdict, Exception):
            raise ValueError(f'device actor: model {sha[:12]} rejected: {verdict}')
        self.actor.use_behaviour(OnnxBehaviour(self.models.get(sha)))

    def offer_chunk(self, trainer: Any) -> Any:
        """Collect one chunk with the newest student, if it has not acted for it yet, and offer
        it to ``trainer``: False when there was nothing to collect, else the trainer's verdict
        (None: accepted, or the ChunkError it was dropped for)."""
        if not self.actor.may_collect():
            return False
        return trainer.offer(encode(self.actor.collect(), 'raw'))

    def close(self) -> None:
        self.env.close()
