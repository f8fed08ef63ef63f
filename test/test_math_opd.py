"""Distillation maths: KL(teacher || student) direction checked by quadrature, the registry
contract, the EMA teacher and the alpha schedule."""

import math

import pytest
import torch

from claw_rl_ros.core.learning.networks import ActorCritic
from claw_rl_ros.core.learning.opd import (alpha_at, combined_loss, compute_distillation_loss,
                                           gaussian_kl, update_teacher_with_ema)
from claw_rl_ros.core.learning.ppo import PPO
from claw_rl_ros.core.learning.registry import PolicyRegistry
from claw_rl_ros.core.learning.storage import MiniBatch
from claw_rl_ros.core.learning.train_config import DistillationConfig, PPOConfig


def kl_by_quadrature(mu_p, std_p, mu_q, std_q, points=200_001):
    """KL(p || q) = integral of p(x) log(p(x) / q(x)) dx, trapezoid rule over mu_p +- 14 s_p."""
    x = torch.linspace(mu_p - 14 * std_p, mu_p + 14 * std_p, points, dtype=torch.float64)
    log_p = -0.5 * ((x - mu_p) / std_p) ** 2 - math.log(std_p * math.sqrt(2 * math.pi))
    log_q = -0.5 * ((x - mu_q) / std_q) ** 2 - math.log(std_q * math.sqrt(2 * math.pi))
    return torch.trapezoid(log_p.exp() * (log_p - log_q), x).item()


PAIRS = [  # (mu_p, std_p, mu_q, std_q): p wide / narrow, shifted means
    (0.3, 0.5, -0.2, 1.4),
    (-1.0, 1.2, 0.5, 0.3),
    (0.0, 0.2, 0.0, 0.9),
    (2.0, 1.0, 1.0, 1.0),
]


@pytest.mark.parametrize('mu_p, std_p, mu_q, std_q', PAIRS)
def test_closed_form_kl_is_the_asymmetric_integral(mu_p, std_p, mu_q, std_q):
    t = lambda *v: torch.tensor([v], dtype=torch.float64)  # noqa: E731
    forward = gaussian_kl(t(mu_p), t(std_p), t(mu_q), t(std_q)).item()
    backward = gaussian_kl(t(mu_q), t(std_q), t(mu_p), t(std_p)).item()
    assert forward == pytest.approx(kl_by_quadrature(mu_p, std_p, mu_q, std_q), rel=1e-7)
    assert backward == pytest.approx(kl_by_quadrature(mu_q, std_q, mu_p, std_p), rel=1e-7)
    if std_p != std_q:
        # Different widths: the two directions differ.
        assert abs(forward - backward) > 0.05 * max(forward, backward)


class FixedGaussian:
    """A registry entry with state-independent (mean [A], std [A])."""

    def __init__(self, mean, std):
        self.mean, self.std = torch.tensor(mean, dtype=torch.float64), \
            torch.tensor(std, dtype=torch.float64)

    def __call__(self, obs):
        n = obs['policy'].shape[0]
        return self.mean.expand(n, -1), self.std     # std [A]: the registry broadcasts it


def test_distillation_loss_is_mean_kl_teacher_to_student_per_dimension():
    registry = PolicyRegistry()
    registry.register('teacher', FixedGaussian([0.3, -1.0], [0.5, 1.2]))
    registry.register('student', FixedGaussian([-0.2, 0.5], [1.4, 0.3]))
    obs = {'policy': torch.zeros(7, 3)}
    loss = compute_distillation_loss(registry, obs).item()
    forward = (kl_by_quadrature(0.3, 0.5, -0.2, 1.4) + kl_by_quadrature(-1.0, 1.2, 0.5, 0.3)) / 2
    backward = (kl_by_quadrature(-0.2, 1.4, 0.3, 0.5) + kl_by_quadrature(0.5, 0.3, -1.0, 1.2)) / 2
    assert loss == pytest.approx(forward, rel=1e-7)
    assert abs(forward - backward) > 1.0
    # Names select the entries: swapping them gives the other direction.
    swapped = compute_distillation_loss(registry, obs, teacher='student', student='teacher')
    assert swapped.item() == pytest.approx(backward, rel=1e-7)


def test_distillation_on_the_callers_student_pass_needs_no_second_forward():
    registry = PolicyRegistry()
    registry.register('teacher', FixedGaussian([0.3, -1.0], [0.5, 1.2]))
    registry.register('student', FixedGaussian([-0.2, 0.5], [1.4, 0.3]))
    obs = {'policy': torch.zeros(7, 3)}
    # The student's own output gives the registry's value; other logits give their own KL.
    same = compute_distillation_loss(registry, obs, student_logits=registry._entries[
        'student'](obs))
    assert same.item() == pytest.approx(compute_distillation_loss(registry, obs).item(),
                                        rel=1e-7)
    mean = torch.tensor([[0.3, -1.0]]).expand(7, -1).requires_grad_()
    other = compute_distillation_loss(registry, obs,
                                      student_logits=(mean, torch.tensor([0.5, 1.2])))
    assert other.item() == pytest.approx(0.0, abs=1e-7)
    other.backward()
    assert mean.grad is not None


def test_distillation_gradient_pulls_the_student_towards_the_teacher():
    mean = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    log_std = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    registry = PolicyRegistry()
    registry.register('teacher', FixedGaussian([1.0, -2.0], [0.5, 2.0]))
    registry.register('student', lambda obs: (mean.expand(obs['policy'].shape[0], -1),
                                              log_std.exp()))
    compute_distillation_loss(registry, {'policy': torch.zeros(4, 1)}).backward()
    # d/dmu_s KL(t || s) = (mu_s - mu_t) / s_s^2 / A; d/dlog s_s = 1 - (s_t^2 + dmu^2) / s_s^2.
    torch.testing.assert_close(mean.grad, torch.tensor([-0.5, 1.0], dtype=torch.float64))
    torch.testing.assert_close(log_std.grad, torch.tensor([(1 - 1.25) / 2, (1 - 8.0) / 2],
                                                          dtype=torch.float64))


def test_registry_broadcasts_std_replaces_entries_and_lists_names():
    registry = PolicyRegistry()
    assert registry.names == [] and 'teacher' not in registry
    registry.register('teacher', FixedGaussian([1.0, 2.0], [0.5, 0.25]))
    mean, std = registry.get_action_logits('teacher', {'policy': torch.zeros(3, 1)})
    assert mean.shape == std.shape == (3, 2)
    assert std.tolist() == [[0.5, 0.25]] * 3
    registry.register('student', FixedGaussian([0.0, 0.0], [1.0, 1.0]))
    registry.register('teacher', FixedGaussian([9.0, 9.0], [1.0, 1.0]))
    assert registry.names == ['student', 'teacher'] and 'student' in registry
    assert registry.get_action_logits('teacher', {'policy': torch.zeros(1, 1)})[0].tolist() == \
        [[9.0, 9.0]]
    with pytest.raises(KeyError, match=r"no policy 'ghost' registered \(have \['student', "
                                       r"'teacher'\]\)"):
        registry.get_action_logits('ghost', {})
    with pytest.raises(TypeError, match="policy 'x': params_fn must be callable"):
        registry.register('x', 3)
    with pytest.raises(TypeError, match="policy 'lin': Linear has no action_mean_std"):
        registry.register_module('lin', torch.nn.Linear(1, 1))


def test_teacher_is_evaluated_without_gradient_even_when_it_could_have_one():
    teacher_mean = torch.ones(2, requires_grad=True)
    student_mean = torch.zeros(2, requires_grad=True)
    registry = PolicyRegistry()
    registry.register('teacher', lambda obs: (teacher_mean.expand(2, -1), torch.ones(2)))
    registry.register('student', lambda obs: (student_mean.expand(2, -1), torch.ones(2)))
    compute_distillation_loss(registry, {}).backward()
    assert teacher_mean.grad is None and student_mean.grad is not None


def test_combined_loss_adds_alpha_times_the_distillation_term():
    rl, kl = torch.tensor(2.0), torch.tensor(3.0)
    assert combined_loss(rl, kl, 0.25).item() == 2.75
    assert combined_loss(rl, None, 0.5) is rl
    assert combined_loss(rl, kl, 0.0) is rl


def test_alpha_schedule_is_linear_then_constant():
    cfg = DistillationConfig(alpha=0.2, alpha_final=1.0, alpha_schedule_iterations=8,
                             teacher_mode='ema')
    assert [alpha_at(cfg, i) for i in (0, 2, 4, 8, 100)] == pytest.approx(
        [0.2, 0.4, 0.6, 1.0, 1.0])
    no_length = DistillationConfig(alpha=0.2, alpha_final=1.0, alpha_schedule_iterations=0,
                                   teacher_mode='ema')
    assert alpha_at(no_length, 50) == 0.2
    constant = DistillationConfig(alpha=0.2, alpha_schedule_iterations=8, teacher_mode='ema')
    assert alpha_at(constant, 4) == 0.2
    one_step = DistillationConfig(alpha=0.2, alpha_final=0.0, alpha_schedule_iterations=1,
                                  teacher_mode='ema')
    assert [alpha_at(one_step, i) for i in (0, 1, 2)] == [0.2, 0.0, 0.0]


def small_policy(seed):
    torch.manual_seed(seed)
    return ActorCritic(3, 5, 2, actor_hidden_dims=[4], critic_hidden_dims=[4],
                       init_noise_std=0.5)


def test_ema_blends_float_state_and_copies_integer_buffers():
    teacher, student = small_policy(1), small_policy(2)
    student.actor_normalizer.update(torch.randn(10, 3) + 2.0)
    teacher.register_buffer('steps', torch.tensor(3))
    student.register_buffer('steps', torch.tensor(11))
    t0 = {k: v.clone() for k, v in teacher.state_dict().items()}
    s0 = {k: v.clone() for k, v in student.state_dict().items()}
    update_teacher_with_ema(teacher, student, decay=0.75)
    for name, value in teacher.state_dict().items():
        if value.is_floating_point():
            torch.testing.assert_close(value, 0.75 * t0[name] + 0.25 * s0[name])
        else:
            assert torch.equal(value, s0[name])
    for name, value in student.state_dict().items():
        assert torch.equal(value, s0[name])     # the student is untouched


def test_frozen_mode_without_a_teacher_is_refused():
    with pytest.raises(ValueError, match='^teacher_mode frozen needs a teacher policy$'):
        PPO(small_policy(0), PPOConfig(),
            DistillationConfig(teacher_mode='frozen', teacher_checkpoint='t.pt'))


def test_ppo_teacher_modes():
    x = {'policy': torch.randn(4, 3), 'policy_noise_free': torch.randn(4, 3),
         'privileged': torch.randn(4, 2)}
    # none: no teacher, no KL, EMA is a no-op.
    plain = PPO(small_policy(0), PPOConfig(), DistillationConfig())
    assert plain.teacher is None and 'teacher' not in plain.registry
    assert plain.kl_to_teacher(x) == 0.0
    plain.update_teacher_with_ema()
    # ema: a frozen copy of the student that follows it.
    student = small_policy(0)
    ema = PPO(student, PPOConfig(), DistillationConfig(teacher_mode='ema', ema_decay=0.5))
    assert ema.teacher is not student and not ema.teacher.training
    assert all(not p.requires_grad for p in ema.teacher.parameters())
    assert all(p.requires_grad for p in student.parameters())
    assert ema.kl_to_teacher(x) == 0.0
    with torch.no_grad():
        student.log_std.fill_(math.log(0.25))
    ema.update_teacher_with_ema()
    torch.testing.assert_close(ema.teacher.log_std,
                               torch.full((2,), 0.5 * math.log(0.5) + 0.5 * math.log(0.25)))
    kl = ema.kl_to_teacher(x)
    expected = compute_distillation_loss(ema.registry, x).item()
    assert kl == pytest.approx(expected) and kl > 0
    # alpha 0 is plain PPO even with a teacher: no KL is computed or reported.
    zeros = torch.zeros(4)
    mean, std = student.action_mean_std(x)
    batch = MiniBatch(obs=x, actions=mean.detach(), values=zeros, advantages=zeros,
                      returns=zeros, log_probs=zeros, mu=mean.detach(), sigma=std.detach())
    assert ema._update_mini_batch(batch, 0.0)['distillation_loss'] == 0.0
    assert ema._update_mini_batch(batch, 0.5)['distillation_loss'] > 0.0
    # frozen: the given teacher, never moved by EMA.
    teacher = small_policy(5)
    frozen = PPO(small_policy(0), PPOConfig(),
                 DistillationConfig(teacher_mode='frozen', teacher_checkpoint='t.pt'),
                 teacher=teacher)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    frozen.update_teacher_with_ema()
    assert frozen.teacher is teacher and not teacher.training
    for k, v in teacher.state_dict().items():
        assert torch.equal(v, before[k])
    mean_t, _ = frozen.registry.get_action_logits('teacher', x)
    torch.testing.assert_close(mean_t, teacher.act_inference(x))
