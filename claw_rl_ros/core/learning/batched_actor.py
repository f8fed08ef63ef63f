"""The batched actor: N worlds of a vec env plus a local copy of the student -> rollout chunks.

It runs exactly the runner's ``collect_experience`` (same sampler, :func:`~.ppo.
sample_transition`, same time-out bootstrap inputs), but writes what it saw into a
:class:`~.rollout_chunk.RolloutChunk` tagged with the model version that acted, instead of
into the learner's storage. With the learner's generator and policy it reproduces the offline
runner (test_chunk_learning.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .networks import ActorCritic
from .ppo import sample_transition
from .rollout_chunk import RolloutChunk
from .runner import obs_to_torch


class BatchedActor:
    """Acts with ``policy`` (an ActorCritic: mean, std and values) in every world of ``env``."""

    def __init__(self, env: Any, policy: ActorCritic, num_steps: int, actor_id: str = 'actor',
                 generator: torch.Generator | None = None, seed: int = 0):
        self.env = env
        self.policy = policy
        self.num_steps = num_steps
        self.actor_id = actor_id
        self.generator = generator if generator is not None else \
            torch.Generator().manual_seed(seed)
        self.model_sha = ''
        self.policy_version = -1
        self.seq = 0
        obs, _ = env.reset()
        self.obs = obs

    def load_policy(self, state_dict: dict[str, torch.Tensor], version: int, sha: str) -> None:
        """Act from now on with these weights, tagging chunks with (version, sha)."""
        self.policy.load_state_dict(state_dict)
        self.policy_version, self.model_sha = int(version), sha

    @torch.no_grad()
    def collect(self) -> RolloutChunk:
        """``num_steps`` steps in every world -> one chunk (float32 arrays, [T, N, ...])."""
        t_max, n, a = self.num_steps, self.env.num_envs, self.env.num_actions
        dims = self.env.obs_dims
        obs = {g: np.empty((t_max, n, d), np.float32) for g, d in dims.items()}
        buf = {k: np.empty((t_max, n, a), np.float32) for k in ('actions', 'mu', 'sigma')}
        buf.update({k: np.empty((t_max, n), np.float32)
                    for k in ('log_probs', 'values', 'rewards')})
        flags = {k: np.empty((t_max, n), bool) for k in ('terminated', 'truncated')}
        final_obs: dict[str, list] = {g: [] for g in dims}
        final_values, episodes, errors = [], [], []
        diverged = 0
        for t in range(t_max):
            step = sample_transition(self.policy, obs_to_torch(self.obs), self.generator)
            for g in dims:
                obs[g][t] = self.obs[g]
            for k in ('actions', 'mu', 'sigma', 'log_probs', 'values'):
                buf[k][t] = step[k].numpy()
            self.obs, reward, terminated, truncated, extras = self.env.step(
                step['actions'].numpy())
            buf['rewards'][t] = reward
            flags['terminated'][t], flags['truncated'][t] = terminated, truncated
            if truncated.any():
                # Time-out worlds: their final observation and its value (all worlds in one
                # batch, as the runner evaluates them), kept for the truncated rows only.
                values = self.policy.evaluate(obs_to_torch(extras['final_obs'])).squeeze(-1)
                final_values.append(values.numpy()[truncated])
                for g in dims:
                    final_obs[g].append(extras['final_obs'][g][truncated])
            if 'episode' in extras:
                episodes.append(extras['episode'])
            errors.append(extras.get('tracking_error', {}))
            diverged += extras.get('diverged', 0)
        self.seq += 1
        return RolloutChunk(
            model_sha=self.model_sha, policy_version=self.policy_version,
            actor_id=self.actor_id, seq=self.seq, obs=obs, log_probs=buf['log_probs'],
            actions=buf['actions'], mu=buf['mu'], sigma=buf['sigma'], values=buf['values'],
            rewards=buf['rewards'], terminated=flags['terminated'],
            truncated=flags['truncated'],
            final_obs={g: _rows(final_obs[g], dims[g]) for g in dims},
            final_values=np.concatenate(final_values) if final_values
            else np.zeros(0, np.float32),
            last_obs={g: np.array(self.obs[g], np.float32) for g in dims},
            episodes=_episodes(episodes), stats=_stats(errors, diverged))


def _rows(parts: list[np.ndarray], dim: int) -> np.ndarray:
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros((0, dim), np.float32)


def _episodes(logs: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-episode logs of the chunk, [E] each (``env_ids`` left out: they mean nothing to the
    trainer)."""
    if not logs:
        return {}
    keys = [k for k in logs[0] if k != 'env_ids']
    return {k: np.concatenate([log[k] for log in logs]).astype(np.float32) for k in keys}


def _stats(errors: list[dict[str, float]], diverged: int) -> dict[str, float]:
    """The runner's rollout statistics: diverged worlds, mean tracking errors over steps."""
    stats = {'diverged': float(diverged)}
    for key in errors[0]:
        stats[f'tracking_error/{key}'] = float(np.mean([e[key] for e in errors]))
    return stats
