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
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn
import torch.nn.functional as F

from .algorithm import Algorithm
from .networks import EmpiricalNormalization, gaussian_log_prob, mlp, select_obs
from .opd import combined_loss, compute_distillation_loss
from .registry import Obs
from .replay import ReplayBuffer
from .train_config import DistillationConfig, SACConfig

# Bounds of the actor's log std (CleanRL's SAC: squashed into [-5, 2] with a tanh).
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
LOG_2 = math.log(2.0)


def log1m_tanh_sq(u: torch.Tensor) -> torch.Tensor:
    """``log(1 - tanh(u)^2)`` elementwise, stable for large ``|u|``."""
    # 1 - tanh(u)^2 = 4 / (e^u + e^-u)^2  =>  log = 2 (log 2 - u - softplus(-2 u))
    return 2.0 * (LOG_2 - u - F.softplus(-2.0 * u))


def squashed_log_prob(u: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Log-density [B] of ``a = tanh(u)``, ``u ~ N(mean, std)`` [B, A], in the [-1, 1] box."""
    # Change of variables: log p(a) = log N(u) - sum log |da/du| = log N(u) - sum log(1 - a^2)
    return gaussian_log_prob(u, mean, std) - log1m_tanh_sq(u).sum(-1)


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * source, parameter by parameter."""
    for t, s in zip(target.parameters(), source.parameters()):
        t.mul_(1.0 - tau).add_(s, alpha=tau)


class TwinQ(nn.Module):
    """Two Q networks ``Q_i(obs [B, critic_dim], action [B, A]) -> [B]``."""

    def __init__(self, critic_dim: int, num_actions: int, hidden: list[int], activation: str):
        super().__init__()
        self.q1 = mlp(critic_dim + num_actions, hidden, 1, activation)
        self.q2 = mlp(critic_dim + num_actions, hidden, 1, activation)

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xa = torch.cat([x, a], dim=-1)
        return self.q1(xa).squeeze(-1), self.q2(xa).squeeze(-1)


class SACPolicy(nn.Module):
    """Squashed Gaussian actor ``a = bias + scale * tanh(u)``, ``u ~ N(mu(obs), sigma(obs))``,
    and twin Q critics on the noise-free groups; normalisers as in ActorCritic.

    Shapes: actor obs [B, actor_dim] -> (mean, std) [B, A] of ``u``; the critics take the
    squashed action ``tanh(u)`` [B, A] in [-1, 1] (scale-free, as stable-baselines3 does).
    """

    def __init__(self, actor_dim: int, critic_dim: int, num_actions: int, *,
                 actor_hidden_dims: list[int], critic_hidden_dims: list[int],
                 activation: str = 'relu', normalize_obs: bool = True,
                 actor_obs_groups: list[str] | None = None,
                 critic_obs_groups: list[str] | None = None,
                 action_low: torch.Tensor | float = -1.0, action_high: torch.Tensor | float = 1.0):
        super().__init__()
        self.actor_obs_groups = list(actor_obs_groups or ['policy'])
        self.critic_obs_groups = list(critic_obs_groups or ['policy_noise_free', 'privileged'])
        self.actor = mlp(actor_dim, actor_hidden_dims, 2 * num_actions, activation)
        self.critic = TwinQ(critic_dim, num_actions, critic_hidden_dims, activation)
        self.actor_normalizer = EmpiricalNormalization(actor_dim) if normalize_obs \
            else nn.Identity()
        self.critic_normalizer = EmpiricalNormalization(critic_dim) if normalize_obs \
            else nn.Identity()
        low = torch.as_tensor(action_low, dtype=torch.float32).expand(num_actions)
        high = torch.as_tensor(action_high, dtype=torch.float32).expand(num_actions)
        self.register_buffer('action_scale', (high - low) / 2.0)
        self.register_buffer('action_bias', (high + low) / 2.0)

    def action_mean_std(self, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-tanh Gaussian parameters: mean [B, A], std [B, A] (what distillation compares)."""
        mean, log_std = self.actor(self.actor_normalizer(select_obs(obs, self.actor_obs_groups))
                                   ).chunk(2, dim=-1)
        # Squash the raw log std into [LOG_STD_MIN, LOG_STD_MAX] smoothly (CleanRL).
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1.0)
        return mean, log_std.exp()

    def sample(self, obs: Obs, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised squashed action ``tanh(u)`` [B, A] in [-1, 1] and its log-prob [B]."""
        mean, std = self.action_mean_std(obs)
        u = mean + std * torch.randn(mean.shape, generator=generator)
        return torch.tanh(u), squashed_log_prob(u, mean, std)

    def to_env(self, squashed: torch.Tensor) -> torch.Tensor:
        """[-1, 1] actions [B, A] -> the env's action range."""
        return self.action_bias + self.action_scale * squashed

    def act_inference(self, obs: Obs) -> torch.Tensor:
        """Deterministic action ``bias + scale * tanh(mean)`` [B, A]: what deployment runs."""
        return self.to_env(torch.tanh(self.action_mean_std(obs)[0]))

    def critic_input(self, obs: Obs) -> torch.Tensor:
        return self.critic_normalizer(select_obs(obs, self.critic_obs_groups))

    def update_normalization(self, obs: Obs) -> None:
        if isinstance(self.actor_normalizer, EmpiricalNormalization):
            self.actor_normalizer.update(select_obs(obs, self.actor_obs_groups))
            self.critic_normalizer.update(select_obs(obs, self.critic_obs_groups))


class SAC(Algorithm):
    """SAC on a :class:`SACPolicy` student, plus alpha * KL(teacher || student) on the actor."""

    def __init__(self, policy: SACPolicy, cfg: SACConfig, distill: DistillationConfig,
                 teacher: nn.Module | None = None, generator: torch.Generator | None = None):
        self.policy = policy
        self.cfg = cfg
        self.distill = distill
        self.generator = generator
        self.target_critic = copy.deepcopy(policy.critic).requires_grad_(False)
        self.actor_optimizer = torch.optim.Adam(policy.actor.parameters(), lr=cfg.actor_lr,
                                                fused=True)
        self.critic_optimizer = torch.optim.Adam(policy.critic.parameters(), lr=cfg.critic_lr,
                                                 fused=True)
        num_actions = policy.action_scale.shape[0]
        # Automatic temperature: minimise -log_ent_coef * (log pi + target entropy).
        self.target_entropy = -float(num_actions) if cfg.target_entropy is None \
            else cfg.target_entropy
        self.log_ent_coef = torch.tensor(math.log(cfg.init_ent_coef), requires_grad=True)
        self.ent_optimizer = torch.optim.Adam([self.log_ent_coef], lr=cfg.ent_coef_lr)
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

    @torch.no_grad()
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
        self.num_transitions += rewards.shape[0]
        self._owed_updates += self.cfg.utd_ratio * rewards.shape[0]

    def compute_returns(self, last_obs: Obs) -> None:
        """Nothing to do: SAC forms its (n-step) targets per sampled batch in :meth:`update`."""

    def rollout_obs(self, max_samples: int = 4096) -> Obs:
        """Observations [B, dim] of the latest iteration's steps (normaliser and KL metric)."""
        return self.storage.recent_obs(self.num_steps, max_samples)

    def update(self, alpha: float = 0.0) -> dict[str, float]:
        """``utd_ratio`` gradient steps per new transition (once learning_starts is reached)."""
        keys = ('critic_loss', 'actor_loss', 'ent_coef_loss', 'entropy', 'q_mean',
                'distillation_loss')
        # Also after a resume without the replay buffer: updates wait until it holds
        # learning_starts transitions again (the policy, not random actions, fills it).
        refilled = len(self.storage) >= min(self.cfg.learning_starts,
                                            self.storage.capacity * self.storage.num_envs)
        if self.num_transitions < self.cfg.learning_starts or not refilled:
            self._owed_updates = 0.0
            return {**{k: float('nan') for k in keys}, 'ent_coef': self.ent_coef,
                    'alpha': alpha, 'updates': 0.0}
        count = int(self._owed_updates)
        self._owed_updates -= count
        sums = dict.fromkeys(keys, 0.0)
        for _ in range(count):
            for k, v in self._update_batch(alpha).items():
                sums[k] += v
        out = {k: v / max(count, 1) for k, v in sums.items()}
        out.update(ent_coef=self.ent_coef, alpha=alpha, updates=float(count))
        return out

    def _update_batch(self, alpha: float) -> dict[str, float]:
        cfg = self.cfg
        b = self.storage.sample(cfg.batch_size, self.generator)
        ent_coef = self.log_ent_coef.detach().exp()
        # Soft target: y = R + gamma^k (1 - done) (min Q'(s', a') - ent_coef log pi(a'|s')).
        with torch.no_grad():
            next_a, next_logp = self.policy.sample(b.next_obs, self.generator)
            tq1, tq2 = self.target_critic(self.policy.critic_input(b.next_obs), next_a)
            soft_v = torch.min(tq1, tq2) - ent_coef * next_logp
            y = b.rewards + b.discounts * (1.0 - b.terminated) * soft_v
        q1, q2 = self.policy.critic(self.policy.critic_input(b.obs), b.actions)
        critic_loss = 0.5 * (F.mse_loss(q1, y) + F.mse_loss(q2, y))
        self.critic_optimizer.zero_grad()
        critic_loss.backward()
        self._clip(self.policy.critic)
        self.critic_optimizer.step()
        # Actor: minimise ent_coef log pi(a|s) - min Q(s, a), a reparameterised, + alpha KL.
        a, logp = self.policy.sample(b.obs, self.generator)
        # The critics only pass gradients through to the action here: no weight gradients.
        self.policy.critic.requires_grad_(False)
        q_pi = torch.min(*self.policy.critic(self.policy.critic_input(b.obs), a))
        actor_loss = (ent_coef * logp - q_pi).mean()
        distillation = compute_distillation_loss(self.registry, b.obs) \
            if alpha > 0.0 and 'teacher' in self.registry else None
        loss = combined_loss(actor_loss, distillation, alpha)
        self.actor_optimizer.zero_grad()
        loss.backward()
        self.policy.critic.requires_grad_(True)
        self._clip(self.policy.actor)
        self.actor_optimizer.step()
        # Temperature: grows while the entropy -log pi is below the target, shrinks above it.
        ent_loss = -(self.log_ent_coef * (logp.detach() + self.target_entropy)).mean()
        if cfg.auto_ent_coef:
            self.ent_optimizer.zero_grad()
            ent_loss.backward()
            self.ent_optimizer.step()
        self.num_updates += 1
        if self.num_updates % cfg.target_update_interval == 0:
            polyak_update(self.target_critic, self.policy.critic, cfg.tau)
        return {'critic_loss': critic_loss.item(), 'actor_loss': actor_loss.item(),
                'ent_coef_loss': ent_loss.item(), 'entropy': -logp.mean().item(),
                'q_mean': q1.mean().item(),
                'distillation_loss': distillation.item() if distillation is not None else 0.0}

    def _clip(self, module: nn.Module) -> None:
        if self.cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(module.parameters(), self.cfg.max_grad_norm)

    def state_dict(self) -> dict[str, Any]:
        """Optimisers, temperature, target critics, counters and (optionally) the replay."""
        return {'actor_optimizer': self.actor_optimizer.state_dict(),
                'critic_optimizer': self.critic_optimizer.state_dict(),
                'ent_optimizer': self.ent_optimizer.state_dict(),
                'log_ent_coef': self.log_ent_coef.detach().clone(),
                'target_critic': self.target_critic.state_dict(),
                'counters': [self.num_transitions, self.num_updates, self._owed_updates],
                'replay': self.storage.state_dict() if self.cfg.checkpoint_replay else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.actor_optimizer.load_state_dict(state['actor_optimizer'])
        self.critic_optimizer.load_state_dict(state['critic_optimizer'])
        self.ent_optimizer.load_state_dict(state['ent_optimizer'])
        with torch.no_grad():
            self.log_ent_coef.copy_(state['log_ent_coef'])
        self.target_critic.load_state_dict(state['target_critic'])
        self.num_transitions, self.num_updates, self._owed_updates = state['counters']
        if state['replay'] is not None:
            self.storage.load_state_dict(state['replay'])
