"""The one algorithm interface every trainer implements (rsl_rl): PPO and SAC are selected by
config and the loops (offline runner, chunk-fed trainer) only call these methods."""

from __future__ import annotations

import copy
from typing import Any

import torch

from .opd import compute_distillation_loss, update_teacher_with_ema
from .registry import Obs, PolicyRegistry


class Algorithm:
    """``act`` -> ``process_env_step`` per control step, then :meth:`learn` per iteration.

    Subclasses provide ``policy`` (with ``update_normalization`` and
    ``normalize_every_step``), ``teacher`` (or None),
    ``storage``, and the methods ``compute_returns``, ``rollout_obs``, ``update``,
    ``kl_to_teacher``, ``update_teacher_with_ema``, ``state_dict``, ``load_state_dict``.
    """

    policy: Any
    teacher: Any

    def init_registry(self, policy: Any, teacher: Any, teacher_mode: str) -> None:
        """Register ``student`` and (for ema / frozen modes) ``teacher``: distillation reaches
        them only through ``self.registry``. The teacher never receives gradients."""
        if teacher_mode == 'frozen' and teacher is None:
            raise ValueError('teacher_mode frozen needs a teacher policy')
        if teacher is None and teacher_mode == 'ema':
            teacher = copy.deepcopy(policy)
        self.teacher = teacher
        if teacher is not None:
            teacher.requires_grad_(False)
            teacher.eval()
        self.registry = PolicyRegistry()
        self.registry.register_module('student', policy)
        if teacher is not None:
            self.registry.register_module('teacher', teacher)

    def update_teacher_with_ema(self) -> None:
        """EMA teacher mode: let the teacher follow the student."""
        if self.distill.teacher_mode == 'ema' and self.teacher is not None:
            update_teacher_with_ema(self.teacher, self.policy, self.distill.ema_decay)

    @torch.no_grad()
    def kl_to_teacher(self, obs: Obs) -> float:
        """Mean per-dimension KL(teacher || student) on ``obs`` (a metric; for SAC, of the
        pre-tanh Gaussians)."""
        if 'teacher' not in self.registry:
            return 0.0
        return float(compute_distillation_loss(self.registry, obs))

    def learn(self, last_obs: Obs, alpha: float) -> dict[str, float]:
        """The learning half of ``train_one_epoch`` on the collected data: returns from
        ``last_obs``, the update with combined_loss (RL + alpha * KL(teacher || student)), the
        normaliser update, the teacher's EMA; mean losses (plus ``kl_to_teacher``, measured
        before the update, when there is a teacher)."""
        self.compute_returns(last_obs)
        kl_teacher = self.kl_to_teacher(self.rollout_obs()) if self.teacher is not None else None
        losses = self.update(alpha)
        # rsl_rl normalisers learn from the rollout only now, so the rollout's behaviour policy
        # is exactly the policy the update starts from (the adaptive-KL schedule relies on it).
        # sb3 normalisers already merged every step in ``act`` (rsl_rl 3 / SB3 order): the
        # update then starts from the end-of-rollout statistics, a small drift late in training.
        if not self.policy.normalize_every_step:
            self.policy.update_normalization(self.rollout_obs(max_samples=1 << 30))
        self.update_teacher_with_ema()
        if kl_teacher is not None:
            losses['kl_to_teacher'] = kl_teacher
        return losses
