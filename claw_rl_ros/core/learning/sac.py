"""Soft actor-critic with an optional online-distillation term (the PPO algorithm interface).

``act`` -> ``process_env_step`` (per control step, into a :class:`ReplayBuffer`),
``compute_returns`` (nothing to do: targets are formed per sampled batch), ``update`` (gradient
steps on uniformly sampled batches; returns a dict of floats). Twin Q critics with Polyak-averaged
targets, a tanh-squashed Gaussian actor and an automatically tuned entropy temperature
(Haarnoja et al. 2018; the loss forms of stable-baselines3). Distillation adds
``alpha * KL(teacher || student)`` on the pre-tanh Gaussians to the actor loss, through the same
:func:`~.opd.combined_loss` and :class:`~.registry.PolicyRegistry` as PPO.

Actor lag: SAC is off-policy; its losses never use the behaviour policy's log-probabilities, so
any recent actor version may produce the transitions (local worlds, remote actors publishing
version-tagged chunks). Lag only makes the replay data older, as the replay buffer does anyway;
no importance correction is applied and the only bound on lag is the buffer's horizon
(``buffer_size``). With ``n_step > 1`` the n-step return is, as in Rainbow / D4PG, uncorrected
for the behaviour policy, so keep n small when actors lag much.

The actor and critics are in :mod:`.sac_networks`, the speed tricks of the gradient step
(bfloat16 matmuls, fused Adam, foreach Polyak) in :mod:`.fast_torch`.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn
import torch.nn.functional as F

from .algorithm import Algorithm
from .fast_torch import fused_adam_step, matmul_dtype, polyak_update
from .opd import combined_loss, compute_distillation_loss
from .registry import Obs
from .replay_buffer import ReplayBuffer
from .sac_networks import SACPolicy
from .train_config import DistillationConfig, SACConfig

# What update() reports, in the order of _update_batch's loss vector.
LOSS_KEYS = ('critic_loss', 'actor_loss', 'ent_coef_loss', 'entropy', 'q_mean',
             'distillation_loss')


class SAC(Algorithm):
    """SAC on a :class:`SACPolicy` student, plus alpha * KL(teacher || student) on the actor."""

    def __init__(self, policy: SACPolicy, cfg: SACConfig, distill: DistillationConfig,
                 teacher: nn.Module | None = None, generator: torch.Generator | None = None):
        self.policy = policy
        self.cfg = cfg
        self.distill = distill
        self.generator = generator
        self.target_critic = copy.deepcopy(policy.critic).requires_grad_(False)
        # Fused Adam: on CPU ~4-7x faster than the single-tensor / foreach paths for these sizes.
        self.critic_optimizer = torch.optim.Adam(policy.critic.parameters(), lr=cfg.critic_lr,
                                                 fused=True)
        num_actions = policy.action_scale.shape[0]
        # Automatic temperature: minimise -log_ent_coef * (log pi + target entropy).
        self.target_entropy = -float(num_actions) if cfg.target_entropy is None \
            else cfg.target_entropy
        self.log_ent_coef = torch.tensor(math.log(cfg.init_ent_coef), requires_grad=True)
        # Hidden-layer matmuls of the gradient steps (acting and export stay float32).
        self.matmul_dtype = matmul_dtype(cfg.matmul_dtype)
        # The actor and the temperature share one Adam (a parameter group each, own lr): each
        # loss sees the other's parameters detached, so one backward and one step serve both.
        groups = [{'params': list(policy.actor.parameters()), 'lr': cfg.actor_lr}]
        if cfg.auto_ent_coef:
            groups.append({'params': [self.log_ent_coef], 'lr': cfg.ent_coef_lr})
        self.actor_optimizer = torch.optim.Adam(groups, fused=True)
        self.init_registry(policy, teacher, distill.teacher_mode)
        self.storage: ReplayBuffer | None = None
        self.num_steps = 1
        self.num_transitions = 0
        self.num_updates = 0
        self._owed_updates = 0.0
        self._pending: dict[str, Any] = {}

    @property
    def ent_coef(self) -> float:
        return float(self.log_ent_coef.detach().exp())

    def init_storage(self, num_steps: int, num_envs: int, obs_dims: dict[str, int],
                     num_actions: int) -> None:
        """Replay of ``buffer_size`` transitions: ``buffer_size // num_envs`` rows of N worlds."""
        self.num_steps = num_steps
        self.storage = ReplayBuffer(max(1, self.cfg.buffer_size // num_envs), num_envs, obs_dims,
                                    num_actions, self.cfg.n_step, self.cfg.gamma)

    @torch.inference_mode()
    def act(self, obs: Obs) -> torch.Tensor:
        """Env actions [N, A]: uniform over the range until learning_starts, then the policy."""
        n = next(iter(obs.values())).shape[0]
        num_actions = self.policy.action_scale.shape[0]
        if self.num_transitions < self.cfg.learning_starts:
            squashed = torch.rand((n, num_actions), generator=self.generator) * 2.0 - 1.0
        else:
            squashed, _ = self.policy.sample(obs, self.generator)
        self._pending = {'obs': obs, 'actions': squashed}
        return self.policy.to_env(squashed)

    @torch.no_grad()
    def process_env_step(self, rewards: torch.Tensor, dones: torch.Tensor,
                         time_outs: torch.Tensor, final_obs: Obs | None,
                         next_obs: Obs | None = None) -> None:
        """Store the transition; only true terminations stop the bootstrap (time-outs do not)."""
        if next_obs is None:
            raise ValueError('SAC needs next_obs in process_env_step (the observation after '
                             'the step)')
        if final_obs is not None:
            # Worlds that ended bootstrap from the state they ended in, not the reset state.
            ended = dones > 0
            next_obs = {k: torch.where(ended[:, None], final_obs[k], v)
                        for k, v in next_obs.items()}
        terminated = dones * (1.0 - time_outs)
        self.storage.add(self._pending['obs'], self._pending['actions'], rewards, terminated,
                         dones, next_obs)
        self._stored(rewards.shape[0])

    def extend_replay(self, obs: Obs, actions: torch.Tensor, rewards: torch.Tensor,
                      terminated: torch.Tensor, dones: torch.Tensor, next_obs: Obs) -> None:
        """Store a block of collected transitions (``[K, N, ...]``, squashed actions), as K
        calls of :meth:`process_env_step` would; they are this iteration's (the normaliser's
        and the KL metric's rows)."""
        self.storage.extend(obs, actions, rewards, terminated, dones, next_obs)
        self.num_steps = actions.shape[0]
        self._stored(actions.shape[0] * actions.shape[1])

    def _stored(self, count: int) -> None:
        """``count`` new transitions: counted, and ``utd_ratio`` gradient steps owed each."""
        self.num_transitions += count
        self._owed_updates += self.cfg.utd_ratio * count

    def compute_returns(self, last_obs: Obs) -> None:
        """Nothing to do: SAC forms its (n-step) targets per sampled batch in :meth:`update`."""

    def rollout_obs(self, max_samples: int = 4096) -> Obs:
        """Observations [B, dim] of the latest iteration's steps (normaliser and KL metric)."""
        return self.storage.recent_obs(self.num_steps, max_samples)

    def update(self, alpha: float = 0.0) -> dict[str, float]:
        """``utd_ratio`` gradient steps per new transition (once learning_starts is reached)."""
        # Also after a resume without the replay buffer: updates wait until it holds
        # learning_starts transitions again (the policy, not random actions, fills it).
        refilled = len(self.storage) >= min(self.cfg.learning_starts,
                                            self.storage.capacity * self.storage.num_envs)
        if self.num_transitions < self.cfg.learning_starts or not refilled:
            self._owed_updates = 0.0
            return {**{k: float('nan') for k in LOSS_KEYS}, 'ent_coef': self.ent_coef,
                    'alpha': alpha, 'updates': 0.0}
        count = int(self._owed_updates)
        self._owed_updates -= count
        # Losses stay tensors until the end: no host conversion per gradient step.
        sums = torch.zeros(len(LOSS_KEYS))
        for _ in range(count):
            sums += self._update_batch(alpha)
        out = dict(zip(LOSS_KEYS, (sums / max(count, 1)).tolist()))
        out.update(ent_coef=self.ent_coef, alpha=alpha, updates=float(count))
        return out

    def _update_batch(self, alpha: float) -> torch.Tensor:
        """One gradient step of the critics, then the actor and temperature on one batch;
        the detached losses [len(LOSS_KEYS)] in ``LOSS_KEYS`` order."""
        cfg, policy = self.cfg, self.policy
        b = self.storage.sample(cfg.batch_size, self.generator)
        ent_coef = self.log_ent_coef.detach().exp()
        critic_obs = policy.critic_input(b.obs)
        # Soft target: y = R + gamma^k (1 - done) (min_i Q'_i(s', a') - ent_coef log pi(a'|s')).
        with torch.no_grad():
            next_a, next_logp = policy.sample(b.next_obs, self.generator, self.matmul_dtype)
            next_q = self.target_critic(policy.critic_input(b.next_obs), next_a,
                                        hidden_dtype=self.matmul_dtype).amin(0)
            y = b.rewards + b.discounts * (1.0 - b.terminated) * (next_q - ent_coef * next_logp)
        # Mean over both members and the batch = 0.5 (mse(Q1, y) + mse(Q2, y)).
        q = policy.critic(critic_obs, b.actions, hidden_dtype=self.matmul_dtype)
        critic_loss = F.mse_loss(q, y.expand_as(q))
        critic_loss.backward()
        self._clip(policy.critic)
        fused_adam_step(self.critic_optimizer)
        # Actor: minimise ent_coef log pi(a|s) - min_i Q_i(s, a), a reparameterised, + alpha KL;
        # the (updated) critics pass gradients to the action only, not to their weights.
        a, logp = policy.sample(b.obs, self.generator, self.matmul_dtype)
        q_pi = policy.critic(critic_obs, a, detach_weights=True,
                             hidden_dtype=self.matmul_dtype).amin(0)
        actor_loss = (ent_coef * logp - q_pi).mean()
        distillation = compute_distillation_loss(self.registry, b.obs) \
            if alpha > 0.0 and 'teacher' in self.registry else None
        loss = combined_loss(actor_loss, distillation, alpha)
        # Temperature: grows while the entropy -log pi is below the target, shrinks above it.
        ent_loss = -(self.log_ent_coef * (logp.detach() + self.target_entropy)).mean()
        (loss + ent_loss if cfg.auto_ent_coef else loss).backward()
        self._clip(policy.actor)
        fused_adam_step(self.actor_optimizer)
        self.num_updates += 1
        if self.num_updates % cfg.target_update_interval == 0:
            polyak_update(self.target_critic, policy.critic, cfg.tau)
        zero = actor_loss.new_zeros(())
        return torch.stack([critic_loss, actor_loss, ent_loss, -logp.mean(), q[0].mean(),
                            zero if distillation is None else distillation]).detach()

    def _clip(self, module: nn.Module) -> None:
        if self.cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(module.parameters(), self.cfg.max_grad_norm)

    def state_dict(self) -> dict[str, Any]:
        """Optimisers, temperature, target critics, counters and (optionally) the replay."""
        return {'actor_optimizer': self.actor_optimizer.state_dict(),
                'critic_optimizer': self.critic_optimizer.state_dict(),
                'log_ent_coef': self.log_ent_coef.detach().clone(),
                'target_critic': self.target_critic.state_dict(),
                'counters': [self.num_transitions, self.num_updates, self._owed_updates],
                'replay': self.storage.state_dict() if self.cfg.checkpoint_replay else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self.actor_optimizer.load_state_dict(state['actor_optimizer'])
        self.critic_optimizer.load_state_dict(state['critic_optimizer'])
        with torch.no_grad():
            self.log_ent_coef.copy_(state['log_ent_coef'])
        self.target_critic.load_state_dict(state['target_critic'])
        self.num_transitions, self.num_updates, self._owed_updates = state['counters']
        if state['replay'] is not None:
            self.storage.load_state_dict(state['replay'])
