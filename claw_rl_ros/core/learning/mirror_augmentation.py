"""Mirror symmetry for PPO (rsl_rl's symmetry module): data augmentation and a mirror loss.

Data augmentation appends every mini-batch's mirrored copy (observations of every group and
actions mirrored; values, advantages, returns and behaviour log-probabilities repeated), so the
policy learns both halves of a left/right symmetric task from one half's experience. The mirror
loss pulls the action mean of a mirrored observation towards the mirrored action mean:
``|| mu(mirror(o)) - mirror(mu(o)) ||^2`` (the target detached). The maps come from the robot
(``core.sim.symmetry``): signed permutations, their own inverses.
"""

from __future__ import annotations

from typing import Any

import torch

from ..config import ConfigError
from .registry import Obs
from ..sim.robot import load_robot
from ..sim.symmetry import env_group_mirrors
from .storage import MiniBatch


class _TorchMap:
    """A signed permutation on torch tensors: ``x[..., index] * coef``."""

    def __init__(self, perm: Any):
        self.index = torch.as_tensor(perm.index, dtype=torch.long)
        self.coef = torch.as_tensor(perm.coef, dtype=torch.float32)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., self.index] * self.coef


class ObsMirror:
    """Mirrors of observation groups ({group: [B, d]}) and of actions [B, A]."""

    def __init__(self, groups: dict[str, Any], actions: Any):
        self.groups = {g: _TorchMap(p) for g, p in groups.items()}
        self.action_map = _TorchMap(actions)

    def obs(self, obs: Obs) -> Obs:
        """{group: [B, d]} -> the mirrored observations, group by group."""
        return {g: self.groups[g](x) for g, x in obs.items()}

    def actions(self, actions: torch.Tensor) -> torch.Tensor:
        """[B, A] -> [B, A] mirrored actions (or action means)."""
        return self.action_map(actions)

    def check_dims(self, obs_dims: dict[str, int], num_actions: int, key: str) -> None:
        """ConfigError naming ``key`` when a group or the action size has no matching map."""
        for group, dim in obs_dims.items():
            if group not in self.groups:
                raise ConfigError('', key, f'observation group {group!r} has no mirror')
            if len(self.groups[group].index) != dim:
                raise ConfigError('', key, f'observation group {group!r} has {dim} values, its '
                                  f'mirror {len(self.groups[group].index)}; the checkpoint or '
                                  'env does not match the robot')
        if len(self.action_map.index) != num_actions:
            raise ConfigError('', key, f'{num_actions} actions, the mirror has '
                              f'{len(self.action_map.index)}')


def augment_mini_batch(batch: MiniBatch, mirror: ObsMirror) -> MiniBatch:
    """[B] mini-batch -> [2B]: the original then its mirror (rsl_rl's data augmentation).

    Values, advantages, returns, log-probabilities and the behaviour (mu, sigma) are repeated:
    under a symmetric policy the mirrored action has the original's probability.
    """
    mirrored = mirror.obs(batch.obs)
    return MiniBatch(
        obs={g: torch.cat([x, mirrored[g]]) for g, x in batch.obs.items()},
        actions=torch.cat([batch.actions, mirror.actions(batch.actions)]),
        values=batch.values.repeat(2), advantages=batch.advantages.repeat(2),
        returns=batch.returns.repeat(2), log_probs=batch.log_probs.repeat(2),
        mu=torch.cat([batch.mu, mirror.actions(batch.mu)]),
        sigma=torch.cat([batch.sigma, batch.sigma[:, mirror.action_map.index]]))


def mirror_loss(mean: torch.Tensor, mirrored_mean: torch.Tensor,
                mirror: ObsMirror) -> torch.Tensor:
    """Mean squared gap between mu(mirror(o)) [B, A] and mirror(mu(o)) [B, A] (detached)."""
    return (mirrored_mean - mirror.actions(mean).detach()).square().mean()


def build_obs_mirror(cfg: Any, obs_dims: dict[str, int], num_actions: int) -> ObsMirror:
    """The mirror of the robot in ``cfg.env`` for these group sizes; ConfigError (key
    ``ppo.symmetry``) for a Gymnasium env, a robot without a mirror, or sizes that differ."""
    key = 'ppo.symmetry'
    if cfg.gym_env:
        raise ConfigError('', key, f'symmetry needs the robot\'s mirror; the Gymnasium env '
                          f'{cfg.gym_env!r} has none: set ppo.symmetry.data_augmentation and '
                          'mirror_loss_coef off')
    robot = load_robot(cfg.env.robot, overlay=cfg.env.robot_overlay)
    try:
        groups = env_group_mirrors(robot, cfg.env)
    except ValueError as exc:
        raise ConfigError('', key, f'{exc}, or turn symmetry off') from None
    mirror = ObsMirror(groups, robot.mirror.actions)
    mirror.check_dims(obs_dims, num_actions, key)
    return mirror
