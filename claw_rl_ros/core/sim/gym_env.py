"""Single-world Gymnasium adapter over the batched env, for users of other RL libraries.

``gymnasium.make('ClawQuadruped-v0')`` gives the policy observation (Box [obs_dim]) and the
joint-action space (Box [J] within +-clip_actions). A finished episode returns its final
observation; call ``reset()`` to start the next one, as the Gymnasium API expects.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from ..config import from_dict
from .env import VecLocomotionEnv
from .env_config import EnvConfig

ENV_ID = 'ClawQuadruped-v0'


class ClawLocomotionGymEnv(gym.Env):
    """``gymnasium.Env`` view of one world of :class:`VecLocomotionEnv`."""

    metadata = {'render_modes': []}

    def __init__(self, env_cfg: EnvConfig | dict | None = None, include_privileged: bool = False):
        if env_cfg is None or isinstance(env_cfg, dict):
            env_cfg = from_dict(EnvConfig, {**(env_cfg or {}), 'num_envs': 1}, source='gym')
        elif env_cfg.num_envs != 1:
            raise ValueError(f'env_cfg.num_envs is {env_cfg.num_envs}; the Gymnasium adapter '
                             'runs one world (use VecLocomotionEnv for batches)')
        self.env = VecLocomotionEnv(env_cfg)
        self.include_privileged = include_privileged
        dim = self.env.obs_dims['policy'] + (self.env.privileged_dim if include_privileged else 0)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (dim,), np.float32)
        clip = env_cfg.clip_actions
        self.action_space = gym.spaces.Box(-clip, clip, (self.env.num_actions,), np.float32)

    def _flat(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        parts = [obs['policy'][0]] + ([obs['privileged'][0]] if self.include_privileged else [])
        return np.concatenate(parts).astype(np.float32)

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.env.seed(seed)
        obs, _ = self.env.reset()
        return self._flat(obs), {}

    def step(self, action: np.ndarray):
        obs, reward, terminated, truncated, extras = self.env.step(np.asarray(action)[None])
        info: dict[str, Any] = {'diverged': extras['diverged']}
        done = bool(terminated[0] or truncated[0])
        if done:
            # The vec env already reset this world; hand back the state it ended in.
            obs = extras['final_obs']
            info['episode'] = {k: v[0] for k, v in extras['episode'].items() if k != 'env_ids'}
        return self._flat(obs), float(reward[0]), bool(terminated[0]), bool(truncated[0]), info

    def close(self) -> None:
        self.env.close()


def register() -> None:
    """Register ``ClawQuadruped-v0`` with Gymnasium (idempotent)."""
    if ENV_ID not in gym.registry:
        gym.register(ENV_ID, entry_point='claw_rl_ros.core.sim.gym_env:ClawLocomotionGymEnv')
