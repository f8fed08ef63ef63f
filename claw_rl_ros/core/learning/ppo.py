"""PPO with an optional online-distillation term (rsl_rl-style algorithm interface).

``act`` -> ``process_env_step`` (per control step), ``compute_returns`` (GAE), ``update``
(mini-batch epochs of ``combined_loss``; returns a dict of floats).
"""

from __future__ import annotations


import torch

from .algorithm import Algorithm
from .mirror_augmentation import augment_mini_batch, mirror_loss, ObsMirror
from .networks import ActorCritic, gaussian_entropy, gaussian_log_prob, sample_gaussian
from .opd import combined_loss, compute_distillation_loss, gaussian_kl
from .registry import Obs
from .storage import MiniBatch, RolloutStorage
from .train_config import DistillationConfig, PPOConfig


@torch.no_grad()
def sample_transition(policy: ActorCritic, obs: Obs,
                      generator: torch.Generator | None) -> dict[str, torch.Tensor]:
    """Stochastic actions and what PPO stores with them: obs, actions [N, A], log_probs [N],
    values [N], behaviour mu / sigma [N, A] (the learner's and the actors' one sampler)."""
    mean, std = policy.action_mean_std(obs)
    actions, log_probs = sample_gaussian(mean, std, generator)
    return {'obs': obs, 'actions': actions, 'log_probs': log_probs,
            'values': policy.evaluate(obs).squeeze(-1), 'mu': mean, 'sigma': std}


class PPO(Algorithm):
    """Clipped-surrogate PPO on an :class:`ActorCritic` student, plus alpha * KL to a teacher."""

    def __init__(self, policy: ActorCritic, cfg: PPOConfig, distill: DistillationConfig,
                 teacher: torch.nn.Module | None = None,
                 generator: torch.Generator | None = None):
        self.policy = policy
        self.cfg = cfg
        self.distill = distill
        self.learning_rate = cfg.learning_rate
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.learning_rate,
                                          eps=cfg.adam_eps, fused=True)
        self.generator = generator
        # The teacher is a registry entry: an EMA copy of the student, or a frozen policy.
        self.init_registry(policy, teacher, distill.teacher_mode)
        self.storage: RolloutStorage | None = None
        self._pending: dict[str, torch.Tensor] = {}
        # Fraction of training done before this update (the loop sets it): linear schedule.
        self.progress = 0.0
        # The robot's mirror (the Learner sets it when ppo.symmetry is on).
        self.mirror: ObsMirror | None = None

    def init_storage(self, num_steps: int, num_envs: int, obs_dims: dict[str, int],
                     num_actions: int) -> None:
        self.storage = RolloutStorage(num_steps, num_envs, obs_dims, num_actions)

    @torch.no_grad()
    def act(self, obs: Obs) -> torch.Tensor:
        """Sample actions [N, A] for the current observations and remember the transition.

        An ``sb3`` normaliser first merges ``obs`` into its statistics (SB3 / CleanRL order).
        """
        if self.policy.normalize_every_step:
            self.policy.update_normalization(obs)
        self._pending = sample_transition(self.policy, obs, self.generator)
        return self._pending['actions']

    @torch.no_grad()
    def process_env_step(self, rewards: torch.Tensor, dones: torch.Tensor,
                         time_outs: torch.Tensor, final_obs: Obs | None,
                         next_obs: Obs | None = None) -> None:
        """Store the step; time-outs are bootstrapped with the value of their final state.

        ``next_obs`` (the observation after the step) is part of the interface for off-policy
        algorithms; PPO bootstraps from ``compute_returns`` and does not need it.
        """
        if final_obs is not None and time_outs.any():
            final_values = self.policy.evaluate(final_obs).squeeze(-1)
            # A select, not a product: a NaN value of a world that did not time out (a
            # diverged world's placeholder state) must not reach its reward (NaN * 0 = NaN).
            rewards = torch.where(time_outs > 0, rewards + self.cfg.gamma * final_values,
                                  rewards)
        self.storage.add(rewards=rewards, dones=dones, **self._pending)

    @torch.no_grad()
    def compute_returns(self, last_obs: Obs) -> None:
        """GAE over the stored rollout, bootstrapped from ``last_obs``."""
        last_values = self.policy.evaluate(last_obs).squeeze(-1)
        self.storage.compute_returns(last_values, self.cfg.gamma, self.cfg.lam,
                                     normalize_advantages=not
                                     self.cfg.normalize_advantage_per_mini_batch)

    def rollout_obs(self, max_samples: int = 4096) -> Obs:
        """Observations [B, dim] of the stored rollout (normaliser and KL metric)."""
        return self.storage.obs_flat(max_samples)

    def state_dict(self) -> dict:
        """Optimiser and (adaptive) learning rate, for a checkpoint."""
        return {'optimizer': self.optimizer.state_dict(), 'learning_rate': self.learning_rate}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state['optimizer'])
        self.learning_rate = state['learning_rate']

    def update(self, alpha: float = 0.0) -> dict[str, float]:
        """Mini-batch epochs of RL loss + alpha * KL(teacher || student); mean losses."""
        if self.cfg.schedule == 'linear':
            # CleanRL's anneal: lr0 (1 - done fraction), fixed through this update's epochs.
            self.learning_rate = self.cfg.learning_rate * max(0.0, 1.0 - self.progress)
            for group in self.optimizer.param_groups:
                group['lr'] = self.learning_rate
        cfg = self.cfg
        sums = {'value_loss': 0.0, 'surrogate_loss': 0.0, 'entropy': 0.0, 'distillation_loss': 0.0,
                'approx_kl': 0.0}
        count = 0
        for batch in self.storage.mini_batches(cfg.num_mini_batches, cfg.num_learning_epochs,
                                               self.generator):
            losses = self._update_mini_batch(batch, alpha)
            for k, v in losses.items():
                sums[k] = sums.get(k, 0.0) + v
            count += 1
        self.storage.clear()
        out = {k: v / count for k, v in sums.items()}
        out['learning_rate'] = self.learning_rate
        # The std actions are sampled with (the parameter is kept at or above the floor).
        out['action_std'] = float(torch.exp(self.policy.log_std.detach()).mean())
        out['alpha'] = alpha
        return out

    def _update_mini_batch(self, b: MiniBatch, alpha: float) -> dict[str, float]:
        cfg = self.cfg
        symmetry = cfg.symmetry if self.mirror is not None else None
        acted = len(b.actions)  # the first rows are the acted transitions, then their mirror
        if symmetry is not None and symmetry.data_augmentation:
            b = augment_mini_batch(b, self.mirror)
        mu, sigma = self.policy.action_mean_std(b.obs)
        log_probs = gaussian_log_prob(b.actions, mu, sigma)
        entropy = gaussian_entropy(sigma).mean()
        # Adaptive learning rate from the KL between behaviour and current policy (rsl_rl),
        # on the acted half only.
        with torch.no_grad():
            approx_kl = gaussian_kl(b.mu[:acted], b.sigma[:acted], mu[:acted],
                                    sigma[:acted]).sum(-1).mean().item()
        if cfg.schedule == 'adaptive':
            if approx_kl > 2.0 * cfg.desired_kl:
                self.learning_rate = max(1e-5, self.learning_rate / 1.5)
            elif 0.0 < approx_kl < 0.5 * cfg.desired_kl:
                self.learning_rate = min(1e-2, self.learning_rate * 1.5)
            for group in self.optimizer.param_groups:
                group['lr'] = self.learning_rate
        advantages = b.advantages
        if cfg.normalize_advantage_per_mini_batch:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        # Clipped surrogate: -min(r A, clip(r, 1 - e, 1 + e) A).
        ratio = torch.exp(log_probs - b.log_probs)
        surrogate = torch.max(-advantages * ratio,
                              -advantages * ratio.clamp(1.0 - cfg.clip_param,
                                                        1.0 + cfg.clip_param)).mean()
        # Value loss, clipped around the behaviour values like the policy.
        values = self.policy.evaluate(b.obs).squeeze(-1)
        if cfg.use_clipped_value_loss:
            clipped = b.values + (values - b.values).clamp(-cfg.clip_param, cfg.clip_param)
            value_loss = torch.max((values - b.returns).square(),
                                   (clipped - b.returns).square()).mean()
        else:
            value_loss = (values - b.returns).square().mean()
        rl_loss = surrogate + cfg.value_loss_coef * value_loss - cfg.entropy_coef * entropy
        # KL(teacher || student) on the student's mean and std from the surrogate's pass.
        distillation = compute_distillation_loss(self.registry, b.obs,
                                                 student_logits=(mu, sigma)) \
            if alpha > 0.0 and 'teacher' in self.registry else None
        loss = combined_loss(rl_loss, distillation, alpha)
        extra = {}
        if symmetry is not None and symmetry.mirror_loss_coef > 0:
            # || mu(mirror(o)) - mirror(mu(o)) ||^2: the augmented half when there is one,
            # else one more forward pass on the mirrored observations.
            mirrored_mu = mu[acted:] if symmetry.data_augmentation else \
                self.policy.action_mean_std(self.mirror.obs(b.obs))[0]
            symmetric = mirror_loss(mu[:acted], mirrored_mu, self.mirror)
            loss = loss + symmetry.mirror_loss_coef * symmetric
            extra['mirror_loss'] = symmetric.item()
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm, foreach=True)
        self.optimizer.step()
        self.policy.clamp_std_()
        return {'value_loss': value_loss.item(), 'surrogate_loss': surrogate.item(),
                'entropy': entropy.item(), 'approx_kl': approx_kl,
                'distillation_loss': distillation.item() if distillation is not None else 0.0,
                **extra}
