"""The one rollout loop: a policy acts in every world of a vec env for ``num_steps`` steps.

Both collectors run it: the offline runner records each step into the algorithm's storage
(``alg.process_env_step``), the live batched actor into a rollout chunk. What differs is only
the two callables, so the two paths cannot drift apart (test_chunk_learning.py checks them bit
for bit).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

Obs = dict[str, torch.Tensor]


def obs_to_torch(obs: dict[str, np.ndarray]) -> Obs:
    """{group: [N, d]} arrays as float32 tensors (no copy when already float32)."""
    return {k: torch.as_tensor(v, dtype=torch.float32) for k, v in obs.items()}


def rollout_stats(errors: list[dict[str, float]], diverged: int) -> dict[str, float]:
    """Diverged worlds and the tracking errors averaged over the steps."""
    stats = {'diverged': float(diverged)}
    for key in errors[0]:
        stats[f'tracking_error/{key}'] = float(np.mean([e[key] for e in errors]))
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

    def add(self, reward: np.ndarray, extras: dict[str, Any]) -> None:
        self.reward_means.append(float(reward.mean()))
        self.errors.append(extras.get('tracking_error', {}))
        self.diverged += extras.get('diverged', 0)
        if 'episode' in extras:
            self.episodes.append(extras['episode'])

    def stats(self) -> dict[str, float]:
        """The runner's rollout columns: mean_reward, diverged, tracking_error/<key>."""
        return {'mean_reward': float(np.mean(self.reward_means)),
                **rollout_stats(self.errors, self.diverged)}


# act(obs [N, d] per group) -> env actions [N, A]
Act = Callable[[Obs], torch.Tensor]
# record(t, obs, actions, reward [N], terminated [N], truncated [N], extras, next_obs)
Record = Callable[[int, Obs, torch.Tensor, np.ndarray, np.ndarray, np.ndarray, dict, Obs],
                  None]


@torch.no_grad()
def collect_rollout(env: Any, obs: Obs, num_steps: int, act: Act,
                    record: Record) -> tuple[Obs, RolloutSummary]:
    """``num_steps`` steps of ``act`` in every world of ``env`` from ``obs``; each step goes to
    ``record``. Returns the observation after the last step and the summary."""
    summary = RolloutSummary()
    for t in range(num_steps):
        actions = act(obs)
        raw, reward, terminated, truncated, extras = env.step(actions.numpy())
        next_obs = obs_to_torch(raw)
        record(t, obs, actions, reward, terminated, truncated, extras, next_obs)
        summary.add(reward, extras)
        obs = next_obs
    return obs, summary
