"""What a rollout saw besides its transitions, in plain numpy (no torch: the control-loop
actor in sim_node and policy_node's training records use it, and the deploy path stays
torch-free)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


def rollout_stats(errors: list[dict[str, float]], diverged: int,
                  terrain_level: dict[str, float] | None = None) -> dict[str, float]:
    """Diverged worlds, the tracking errors averaged over the steps and, on terrain, the mean
    curriculum level per type at the rollout's end (``terrain_level/<type>``, and their mean
    over types as ``terrain_level/mean``)."""
    stats = {'diverged': float(diverged)}
    for key in errors[0]:
        stats[f'tracking_error/{key}'] = float(np.mean([e[key] for e in errors]))
    if terrain_level:
        stats.update({f'terrain_level/{k}': float(v) for k, v in terrain_level.items()})
        stats['terrain_level/mean'] = float(np.mean(list(terrain_level.values())))
    return stats


def episode_arrays(logs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The env's per-episode logs of a rollout, [E] float32 each (``env_ids`` left out: they
    mean nothing to a learner)."""
    if not logs:
        return {}
    keys = [k for k in logs[0] if k != 'env_ids']
    return {k: np.concatenate([log[k] for log in logs]).astype(np.float32) for k in keys}


@dataclass
class RolloutSummary:
    """What a rollout saw besides its transitions: per-step mean rewards, tracking errors,
    diverged worlds and the env's logs of the episodes that ended."""

    reward_means: list[float] = field(default_factory=list)
    errors: list[dict[str, float]] = field(default_factory=list)
    diverged: int = 0
    episodes: list[dict[str, np.ndarray]] = field(default_factory=list)
    terrain_level: dict[str, float] = field(default_factory=dict)  # the last step's

    def add(self, reward: np.ndarray, extras: dict[str, Any]) -> None:
        self.reward_means.append(float(reward.mean()))
        self.errors.append(extras.get('tracking_error', {}))
        self.diverged += extras.get('diverged', 0)
        if 'episode' in extras:
            self.episodes.append(extras['episode'])
        self.terrain_level = extras.get('terrain_level', self.terrain_level)

    def stats(self) -> dict[str, float]:
        """The runner's rollout columns: mean_reward, diverged, tracking_error/<key>,
        terrain_level/<type> (on terrain)."""
        return {'mean_reward': float(np.mean(self.reward_means)),
                **rollout_stats(self.errors, self.diverged, self.terrain_level)}
