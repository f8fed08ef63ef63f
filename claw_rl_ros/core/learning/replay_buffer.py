"""Replay buffer preallocated on the batched env: ``[capacity, N, ...]`` ring of transitions.

Every control step writes one row of ``N`` transitions (one per world): observation groups,
actions, rewards, ``terminated`` (a true end: no bootstrap), ``dones`` (terminated or timed
out: an n-step window stops there) and the next observation groups (for a world that just
ended, the observation it ended in, so time-outs bootstrap from their real final state).
Sampling is uniform over every stored (step, world) pair; with ``n_step > 1`` a sample's return
sums up to ``n`` rewards of its own world, stopping at an episode end or at the newest row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

Obs = dict[str, torch.Tensor]


@dataclass
class ReplaySample:
    """A batch of (n-step) transitions, each ``[B, ...]``.

    ``rewards`` is ``sum_j gamma^j r_{t+j}`` over the ``k <= n`` steps taken, ``discounts`` is
    ``gamma^k`` and ``terminated`` says whether the last of them ended the episode for real.
    """

    obs: Obs
    actions: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    next_obs: Obs
    discounts: torch.Tensor


class ReplayBuffer:
    """Ring buffer of ``capacity`` control steps x ``num_envs`` worlds, allocated once."""

    def __init__(self, capacity: int, num_envs: int, obs_dims: dict[str, int],
                 num_actions: int, n_step: int = 1, gamma: float = 0.99):
        if capacity < 1 or num_envs < 1 or n_step < 1:
            raise ValueError(f'replay buffer needs capacity, num_envs and n_step >= 1, got '
                             f'{capacity}, {num_envs}, {n_step}')
        self.capacity, self.num_envs = int(capacity), int(num_envs)
        self.n_step, self.gamma = int(n_step), float(gamma)
        c, n = self.capacity, self.num_envs
        self.obs = {k: torch.zeros(c, n, d) for k, d in obs_dims.items()}
        self.next_obs = {k: torch.zeros(c, n, d) for k, d in obs_dims.items()}
        self.actions = torch.zeros(c, n, num_actions)
        self.rewards = torch.zeros(c, n)
        self.terminated = torch.zeros(c, n)
        self.dones = torch.zeros(c, n)
        self.pos = 0
        self.size = 0

    def __len__(self) -> int:
        """Number of stored transitions (rows x worlds)."""
        return self.size * self.num_envs

    def add(self, obs: Obs, actions: torch.Tensor, rewards: torch.Tensor,
            terminated: torch.Tensor, dones: torch.Tensor, next_obs: Obs) -> None:
        """Store one step of every world (tensors ``[N, ...]``), overwriting the oldest row."""
        i = self.pos
        for k in self.obs:
            self.obs[k][i].copy_(obs[k])
            self.next_obs[k][i].copy_(next_obs[k])
        self.actions[i].copy_(actions)
        self.rewards[i].copy_(rewards)
        self.terminated[i].copy_(terminated)
        self.dones[i].copy_(dones)
        self.pos = (self.pos + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def extend(self, obs: Obs, actions: torch.Tensor, rewards: torch.Tensor,
               terminated: torch.Tensor, dones: torch.Tensor, next_obs: Obs) -> None:
        """Store ``K`` rows at once (tensors ``[K, N, ...]``), as ``K`` calls of :meth:`add`
        (the oldest rows are overwritten; only the last ``capacity`` rows of a larger block
        are kept)."""
        k = actions.shape[0]
        keep = slice(max(0, k - self.capacity), k)
        # Rows pos, pos+1, ... (mod capacity) for the kept tail of the block.
        rows = (self.pos + torch.arange(keep.start, k)) % self.capacity
        for name in self.obs:
            self.obs[name][rows] = obs[name][keep]
            self.next_obs[name][rows] = next_obs[name][keep]
        self.actions[rows] = actions[keep]
        self.rewards[rows] = rewards[keep]
        self.terminated[rows] = terminated[keep]
        self.dones[rows] = dones[keep]
        self.pos = (self.pos + k) % self.capacity
        self.size = min(self.size + k, self.capacity)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> ReplaySample:
        """``batch_size`` transitions drawn uniformly (with replacement) from all stored ones."""
        if self.size == 0:
            raise RuntimeError('replay buffer is empty: collect transitions before sampling')
        flat = torch.randint(self.size * self.num_envs, (batch_size,), generator=generator)
        if self.n_step == 1:
            return self._one_step(flat)
        # Stored rows are 0..size-1 before the first wrap and all rows after it.
        rows, envs = flat // self.num_envs, flat % self.num_envs
        return self._n_step(rows, envs)

    def _one_step(self, flat: torch.Tensor) -> ReplaySample:
        """1-step transitions at flat indices ``row * num_envs + env`` [B]: one gather each."""
        def take(x: torch.Tensor) -> torch.Tensor:
            return x.flatten(0, 1).index_select(0, flat)
        return ReplaySample(
            obs={k: take(v) for k, v in self.obs.items()}, actions=take(self.actions),
            rewards=take(self.rewards), terminated=take(self.terminated),
            next_obs={k: take(v) for k, v in self.next_obs.items()},
            discounts=torch.full((flat.shape[0],), self.gamma))

    def _n_step(self, rows: torch.Tensor, envs: torch.Tensor) -> ReplaySample:
        """n-step transitions starting at ``rows`` of worlds ``envs`` ([B] each)."""
        # Rows written after each start (0 for the newest): the window may not pass the head.
        oldest = (self.pos - self.size) % self.capacity
        ahead = self.size - 1 - (rows - oldest) % self.capacity
        returns = torch.zeros(rows.shape[0])
        active = torch.ones(rows.shape[0], dtype=torch.bool)
        last = rows.clone()
        steps = torch.zeros(rows.shape[0])
        for j in range(self.n_step):
            row = (rows + j) % self.capacity
            # R = sum_j gamma^j r_{t+j} until an episode end or the newest row.
            returns += torch.where(active, self.gamma ** j * self.rewards[row, envs], 0.0)
            last = torch.where(active, row, last)
            steps += active.float()
            active &= (self.dones[row, envs] == 0) & (ahead > j)
        return ReplaySample(
            obs={k: v[rows, envs] for k, v in self.obs.items()}, actions=self.actions[rows, envs],
            rewards=returns, terminated=self.terminated[last, envs],
            next_obs={k: v[last, envs] for k, v in self.next_obs.items()},
            discounts=self.gamma ** steps)

    def recent_obs(self, num_rows: int, max_samples: int = 1 << 30) -> Obs:
        """Observations ``[B, dim]`` of the newest ``num_rows`` rows, evenly thinned."""
        num_rows = min(num_rows, self.size)
        rows = (self.pos - 1 - torch.arange(num_rows)) % self.capacity
        total = num_rows * self.num_envs
        idx = torch.linspace(0, total - 1, min(total, max_samples)).long()
        return {k: v[rows].flatten(0, 1)[idx] for k, v in self.obs.items()}

    def state_dict(self) -> dict[str, Any]:
        """The filled rows ``[:size]`` (no unused capacity) and the write head, for a checkpoint.

        Rows are filled in order from 0 and, once full, overwritten in place, so rows
        ``0..size-1`` are exactly the stored ones; keeping their layout keeps the samples of a
        resumed run identical to those of the uninterrupted one.
        """
        s = self.size
        return {'capacity': self.capacity, 'num_envs': self.num_envs, 'pos': self.pos,
                'size': s, 'obs': {k: v[:s].clone() for k, v in self.obs.items()},
                'next_obs': {k: v[:s].clone() for k, v in self.next_obs.items()},
                'actions': self.actions[:s].clone(), 'rewards': self.rewards[:s].clone(),
                'terminated': self.terminated[:s].clone(), 'dones': self.dones[:s].clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output into a buffer of the same shape."""
        for key in ('capacity', 'num_envs'):
            if state[key] != getattr(self, key):
                raise ValueError(f'replay buffer state has {key} {state[key]}, this buffer '
                                 f'{getattr(self, key)}: resume with the same sac.buffer_size '
                                 'and env.num_envs')
        s = int(state['size'])
        for k in self.obs:
            self.obs[k][:s].copy_(state['obs'][k])
            self.next_obs[k][:s].copy_(state['next_obs'][k])
        for key in ('actions', 'rewards', 'terminated', 'dones'):
            getattr(self, key)[:s].copy_(state[key])
        self.size, self.pos = s, int(state['pos'])
