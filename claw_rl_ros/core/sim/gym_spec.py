"""The spec of a Gymnasium task: what an ONNX policy trained on it was made for.

The robot's counterpart is :class:`~.robot.RobotSpec`; both give ``name``, ``obs_dim``,
``num_actions``, ``to_metadata()`` (the JSON written into the exported model under
``claw_rl_spec``) and ``mismatches(metadata)`` (what a loader checks). A Gymnasium spec records
the env id, both spaces (shape, dtype, bounds; ``null`` marks an unbounded side) and the action
range the exported graph clips to, which is the action space itself: the range GymVecEnv
clipped every action to during training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from .gym_vec import check_spaces, EnvSource, make_env
from .robot_spec import spec_mismatches

# Value of the spec's ``kind`` key (robot specs have none: ``robot`` is the default).
KIND = 'gymnasium'
GYM_SPEC_VERSION = 1
# Keys that must agree for a model to run on an env (the others are informative).
COMPARED_KEYS = ('kind', 'env_id', 'obs_dim', 'action_dim', 'observation_space', 'action_space')


def _bounds(values: np.ndarray) -> list[float | None]:
    """Flattened bounds as JSON numbers, ``None`` where the side is unbounded."""
    return [float(v) if np.isfinite(v) else None for v in np.ravel(values)]


def box_metadata(space: gym.spaces.Box) -> dict[str, Any]:
    """``{'type': 'Box', 'shape', 'dtype', 'low', 'high'}`` of a Box space (JSON-able)."""
    low = np.broadcast_to(space.low, space.shape)
    high = np.broadcast_to(space.high, space.shape)
    return {'type': 'Box', 'shape': list(space.shape), 'dtype': str(space.dtype),
            'low': _bounds(low), 'high': _bounds(high)}


@dataclass
class GymTaskSpec:
    """A Box-observation, bounded Box-action Gymnasium task as an exported model sees it.

    ``action_low`` / ``action_high`` are [A] float64: the range actions are clipped to.
    """

    env_id: str
    obs_dim: int
    num_actions: int
    observation_space: dict[str, Any]
    action_space: dict[str, Any]
    action_low: np.ndarray
    action_high: np.ndarray
    max_episode_steps: int | None = None

    @property
    def name(self) -> str:
        return self.env_id

    @property
    def action_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """(low [A], high [A]): what the exported graph clips its actions to."""
        return self.action_low, self.action_high

    def to_metadata(self) -> dict[str, Any]:
        """JSON-able spec written into exported models and compared on load."""
        return {'kind': KIND, 'spec_version': GYM_SPEC_VERSION, 'env_id': self.env_id,
                'obs_dim': self.obs_dim, 'action_dim': self.num_actions,
                'observation_space': self.observation_space,
                'action_space': self.action_space,
                'max_episode_steps': self.max_episode_steps,
                'gymnasium_version': gym.__version__}

    def mismatches(self, metadata: dict[str, Any], tol: float = 1e-6) -> list[str]:
        """Differences between this task and a model's metadata (empty when they agree)."""
        mine = self.to_metadata()
        if metadata.get('kind', 'robot') != KIND:
            return [f'kind: the model was exported for robot {metadata.get("robot")!r}, not '
                    f'for the Gymnasium env {self.env_id!r}']
        return spec_mismatches({k: mine[k] for k in COMPARED_KEYS}, metadata, tol)


def gym_task_spec(env: EnvSource, env_kwargs: dict[str, Any] | None = None) -> GymTaskSpec:
    """The spec of a Gymnasium env id (or factory): one copy is made, read and closed."""
    name = env if isinstance(env, str) else getattr(env, '__name__', repr(env))
    instance = make_env(env, env_kwargs)
    try:
        obs_dim, num_actions = check_spaces(instance, name)
        act = instance.action_space
        limit = instance.spec.max_episode_steps if instance.spec is not None else None
        return GymTaskSpec(
            env_id=name, obs_dim=obs_dim, num_actions=num_actions,
            observation_space=box_metadata(instance.observation_space),
            action_space=box_metadata(act),
            action_low=np.broadcast_to(act.low, act.shape).reshape(-1).astype(np.float64),
            action_high=np.broadcast_to(act.high, act.shape).reshape(-1).astype(np.float64),
            max_episode_steps=limit)
    finally:
        instance.close()
