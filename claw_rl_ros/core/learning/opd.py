"""Online policy distillation (OPD): RL loss + alpha * KL(teacher || student).

The student's own rollouts supply the states; the teacher is evaluated on them under
``torch.no_grad()`` and never receives gradients. The teacher is either an exponential moving
average of the student (``update_teacher_with_ema``) or a frozen policy loaded from a checkpoint.
Everything here talks to policies through the :class:`~.registry.PolicyRegistry` only.
"""

from __future__ import annotations

import torch

from .registry import Obs, PolicyRegistry
from .train_config import DistillationConfig


def gaussian_kl(mu_p: torch.Tensor, std_p: torch.Tensor, mu_q: torch.Tensor,
                std_q: torch.Tensor) -> torch.Tensor:
    """Per-dimension KL(p || q) of diagonal Gaussians, [B, A] (closed form)."""
    # KL = log(s_q / s_p) + (s_p^2 + (m_p - m_q)^2) / (2 s_q^2) - 1/2
    var_q = std_q.square()
    return (torch.log(std_q / std_p) + (std_p.square() + (mu_p - mu_q).square()) / (2.0 * var_q)
            - 0.5)


def compute_distillation_loss(registry: PolicyRegistry, obs: Obs, teacher: str = 'teacher',
                              student: str = 'student',
                              student_logits: tuple[torch.Tensor, torch.Tensor] | None = None
                              ) -> torch.Tensor:
    """Mean over batch and action dimensions of KL(teacher || student) on ``obs``.

    ``student_logits`` (mean [B, A], std [B, A] or [A]): the student's output on ``obs`` that
    the caller already computed with gradients (PPO's surrogate needs it too), instead of a
    second forward pass of the student.
    """
    with torch.no_grad():
        mu_t, std_t = registry.get_action_logits(teacher, obs)
    if student_logits is None:
        mu_s, std_s = registry.get_action_logits(student, obs)
    else:
        mu_s, std_s = student_logits[0], student_logits[1].expand_as(student_logits[0])
    return gaussian_kl(mu_t, std_t, mu_s, std_s).mean()


def combined_loss(rl_loss: torch.Tensor, distillation_loss: torch.Tensor | None,
                  alpha: float) -> torch.Tensor:
    """RL loss + alpha * distillation loss; exactly the RL loss when alpha is 0."""
    if alpha == 0.0 or distillation_loss is None:
        return rl_loss
    return rl_loss + alpha * distillation_loss


@torch.no_grad()
def update_teacher_with_ema(teacher: torch.nn.Module, student: torch.nn.Module,
                            decay: float) -> None:
    """teacher <- decay * teacher + (1 - decay) * student, for parameters and float buffers."""
    t_state = teacher.state_dict()
    for name, value in student.state_dict().items():
        target = t_state[name]
        if target.is_floating_point():
            target.mul_(decay).add_(value, alpha=1.0 - decay)
        else:
            target.copy_(value)


def alpha_at(cfg: DistillationConfig, iteration: int) -> float:
    """Distillation weight at ``iteration``: constant, or linear from alpha to alpha_final."""
    if cfg.alpha_final is None or cfg.alpha_schedule_iterations == 0:
        return cfg.alpha
    frac = min(1.0, iteration / cfg.alpha_schedule_iterations)
    return cfg.alpha + frac * (cfg.alpha_final - cfg.alpha)
