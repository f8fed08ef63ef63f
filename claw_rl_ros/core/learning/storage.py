"""Preallocated on-policy rollout storage ``[T, N, ...]`` with GAE and mini-batches (rsl_rl)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch


def compute_gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor,
                last_values: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Generalised advantage estimation; returns the returns ``[T, N]``.

    Args:
        rewards: [T, N], with time-outs already bootstrapped (r += gamma * V(s_final)).
        values: [T, N] critic values of the states acted in.
        dones: [T, N] 1 where the episode ended after the step (termination or time-out).
        last_values: [N] values of the states after the last step.
    """
    steps = rewards.shape[0]
    returns = torch.zeros_like(rewards)
    advantage = torch.zeros_like(last_values)
    for t in reversed(range(steps)):
        next_values = last_values if t == steps - 1 else values[t + 1]
        not_done = 1.0 - dones[t]
        # delta_t = r_t + gamma V(s_{t+1}) - V(s_t); A_t = delta_t + gamma lambda A_{t+1}
        delta = rewards[t] + gamma * next_values * not_done - values[t]
        advantage = delta + gamma * lam * not_done * advantage
        returns[t] = advantage + values[t]
    return returns


@dataclass
class MiniBatch:
    """One PPO mini-batch, flattened over time and worlds: [B, ...]."""

    obs: dict[str, torch.Tensor]
    actions: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    log_probs: torch.Tensor
    mu: torch.Tensor
    sigma: torch.Tensor


class RolloutStorage:
    """Transitions of one iteration: obs groups, actions, rewards, dones, values, log-probs and
    the behaviour policy's (mu, sigma), each ``[T, N, ...]``."""

    def __init__(self, num_steps: int, num_envs: int, obs_dims: dict[str, int],
                 num_actions: int):
        self.num_steps, self.num_envs = num_steps, num_envs
        t, n = num_steps, num_envs
        self.obs = {k: torch.zeros(t, n, d) for k, d in obs_dims.items()}
        self.actions = torch.zeros(t, n, num_actions)
        self.rewards = torch.zeros(t, n)
        self.dones = torch.zeros(t, n)
        self.values = torch.zeros(t, n)
        self.log_probs = torch.zeros(t, n)
        self.mu = torch.zeros(t, n, num_actions)
        self.sigma = torch.zeros(t, n, num_actions)
        self.returns = torch.zeros(t, n)
        self.advantages = torch.zeros(t, n)
        # Optional per-transition weights [T, N] of the advantages (importance weights of data
        # acted by an older policy); None = all 1. Cleared with the storage.
        self.weights: torch.Tensor | None = None
        self.step = 0

    def add(self, obs: dict[str, torch.Tensor], actions: torch.Tensor, log_probs: torch.Tensor,
            values: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor, rewards: torch.Tensor,
            dones: torch.Tensor) -> None:
        """Store one step for all worlds (tensors [N, ...])."""
        if self.step >= self.num_steps:
            raise OverflowError(f'rollout storage is full ({self.num_steps} steps); call '
                                'clear() after each update')
        i = self.step
        for k, v in obs.items():
            self.obs[k][i].copy_(v)
        self.actions[i].copy_(actions)
        self.log_probs[i].copy_(log_probs)
        self.values[i].copy_(values)
        self.mu[i].copy_(mu)
        self.sigma[i].copy_(sigma)
        self.rewards[i].copy_(rewards)
        self.dones[i].copy_(dones)
        self.step += 1

    def obs_flat(self, max_samples: int = 4096) -> dict[str, torch.Tensor]:
        """Stored observations flattened to [B, dim], evenly thinned to at most max_samples."""
        total = self.num_steps * self.num_envs
        idx = torch.linspace(0, total - 1, min(total, max_samples)).long()
        return {k: v.flatten(0, 1)[idx] for k, v in self.obs.items()}

    def clear(self) -> None:
        self.step = 0
        self.weights = None

    def compute_returns(self, last_values: torch.Tensor, gamma: float, lam: float,
                        normalize_advantages: bool = True) -> None:
        """Fill returns and advantages (optionally normalised over the whole rollout)."""
        if self.step != self.num_steps:
            raise RuntimeError(f'storage holds {self.step}/{self.num_steps} steps')
        self.returns = compute_gae(self.rewards, self.values, self.dones, last_values, gamma, lam)
        self.advantages = self.returns - self.values
        if normalize_advantages:
            self.advantages = (self.advantages - self.advantages.mean()) / \
                (self.advantages.std() + 1e-8)
        if self.weights is not None:
            # Importance-weighted advantages: w * min(r A, clip(r) A) = min(r wA, clip(r) wA).
            self.advantages = self.advantages * self.weights

    def mini_batches(self, num_mini_batches: int, num_epochs: int,
                     generator: torch.Generator | None = None) -> Iterator[MiniBatch]:
        """Shuffled mini-batches over all T x N transitions, ``num_epochs`` times."""
        total = self.num_steps * self.num_envs
        size = total // num_mini_batches
        if size == 0:
            raise ValueError(f'{total} transitions cannot make {num_mini_batches} mini-batches')
        flat = {
            'actions': self.actions.flatten(0, 1), 'values': self.values.flatten(0, 1),
            'advantages': self.advantages.flatten(0, 1), 'returns': self.returns.flatten(0, 1),
            'log_probs': self.log_probs.flatten(0, 1), 'mu': self.mu.flatten(0, 1),
            'sigma': self.sigma.flatten(0, 1)}
        obs = {k: v.flatten(0, 1) for k, v in self.obs.items()}
        for _ in range(num_epochs):
            order = torch.randperm(total, generator=generator)
            for b in range(num_mini_batches):
                idx = order[b * size:(b + 1) * size]
                yield MiniBatch(obs={k: v[idx] for k, v in obs.items()},
                                **{k: v[idx] for k, v in flat.items()})
