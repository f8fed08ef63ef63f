"""PPO + OPD maths against hand-computed values; registry, storage, EMA, alpha = 0."""

import math

import numpy as np
import pytest
import torch

from claw_rl_ros.core.config import from_dict
from claw_rl_ros.core.learning.networks import ActorCritic, EmpiricalNormalization
from claw_rl_ros.core.learning.opd import (alpha_at, combined_loss,
                                           compute_distillation_loss, gaussian_kl,
                                           update_teacher_with_ema)
from claw_rl_ros.core.learning.ppo import PPO
from claw_rl_ros.core.learning.registry import PolicyRegistry
from claw_rl_ros.core.learning.storage import compute_gae, MiniBatch, RolloutStorage
from claw_rl_ros.core.learning.train_config import DistillationConfig, PPOConfig


def small_policy(seed=0, actor_dim=3, critic_dim=5, actions=2, normalize=False):
    torch.manual_seed(seed)
    return ActorCritic(actor_dim, critic_dim, actions, actor_hidden_dims=[8],
                       critic_hidden_dims=[8], init_noise_std=0.7, normalize_obs=normalize)


def obs_batch(b=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {'policy': torch.randn(b, 3, generator=g),
            'policy_noise_free': torch.randn(b, 3, generator=g),
            'privileged': torch.randn(b, 2, generator=g)}


# ---------------------------------------------------------------------------------------- GAE
def test_gae_matches_hand_computed_example_with_termination_and_time_out():
    gamma, lam = 0.9, 0.8
    # One world, 3 steps: r = 1, 2, 3; V = 0.5, 1.0, 1.5; episode ends (done) after step 1.
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [1.0], [1.5]])
    dones = torch.tensor([[0.0], [1.0], [0.0]])
    last = torch.tensor([2.0])
    returns = compute_gae(rewards, values, dones, last, gamma, lam)
    d2 = 3.0 + 0.9 * 2.0 - 1.5          # step 2 bootstraps from the last value
    d1 = 2.0 - 1.0                       # step 1 ends the episode: no bootstrap
    d0 = 1.0 + 0.9 * 1.0 - 0.5
    a2 = d2
    a1 = d1                              # the advantage does not flow across the episode end
    a0 = d0 + 0.9 * 0.8 * a1
    expected = torch.tensor([[a0 + 0.5], [a1 + 1.0], [a2 + 1.5]])
    torch.testing.assert_close(returns, expected)


def test_time_out_reward_is_bootstrapped_with_final_value():
    policy = small_policy()
    ppo = PPO(policy, PPOConfig(gamma=0.9), DistillationConfig())
    ppo.init_storage(1, 2, {'policy': 3, 'policy_noise_free': 3, 'privileged': 2}, 2)
    obs, final = obs_batch(2, 1), obs_batch(2, 2)
    ppo.act(obs)
    ppo.process_env_step(torch.tensor([1.0, 1.0]), torch.tensor([1.0, 1.0]),
                         torch.tensor([1.0, 0.0]), final)
    with torch.no_grad():
        v_final = policy.evaluate(final).squeeze(-1)
    # World 0 timed out: r + gamma V(s_final); world 1 terminated: r unchanged.
    torch.testing.assert_close(ppo.storage.rewards[0], torch.stack([1.0 + 0.9 * v_final[0],
                                                                    torch.tensor(1.0)]))


def test_nan_final_value_of_a_world_that_did_not_time_out_stays_out_of_its_reward():
    policy = small_policy()
    ppo = PPO(policy, PPOConfig(gamma=0.9), DistillationConfig())
    ppo.init_storage(1, 2, {'policy': 3, 'policy_noise_free': 3, 'privileged': 2}, 2)
    obs, final = obs_batch(2, 1), obs_batch(2, 2)
    final['privileged'][1] = float('nan')     # world 1 terminated in a diverged state
    ppo.act(obs)
    ppo.process_env_step(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 1.0]),
                         torch.tensor([1.0, 0.0]), final)
    assert torch.isfinite(ppo.storage.rewards[0]).all()
    assert ppo.storage.rewards[0, 1] == 2.0


# ---------------------------------------------------------------------------------------- PPO
def test_std_floor_keeps_a_gradient_and_logs_the_std_used():
    """Defect 4: at the floor, the entropy bonus can still raise the std; logged std == used."""
    policy = ActorCritic(3, 5, 2, actor_hidden_dims=[8], critic_hidden_dims=[8],
                         init_noise_std=0.01, normalize_obs=False, min_std=0.05)
    # The parameter itself starts on the floor, so the std used equals the logged one.
    torch.testing.assert_close(policy.log_std.detach(), torch.full((2,), math.log(0.05)))
    mean, std = policy.action_mean_std(obs_batch(4))
    torch.testing.assert_close(std, torch.full((4, 2), 0.05))
    # Only the entropy bonus: its gradient must push log_std up, even on the floor.
    std.log().sum().backward()
    assert (policy.log_std.grad > 0).all()
    cfg = PPOConfig(entropy_coef=1.0, value_loss_coef=0.0, schedule='fixed', learning_rate=0.1,
                    num_mini_batches=1, num_learning_epochs=1)
    ppo = PPO(policy, cfg, DistillationConfig())
    ppo.init_storage(2, 4, {'policy': 3, 'policy_noise_free': 3, 'privileged': 2}, 2)
    for _ in range(2):
        ppo.act(obs_batch(4))
        ppo.process_env_step(torch.zeros(4), torch.zeros(4), torch.zeros(4), None)
    ppo.compute_returns(obs_batch(4))
    out = ppo.update()
    assert (policy.log_std.detach() > math.log(0.05)).all()
    assert out['action_std'] == pytest.approx(float(policy.log_std.detach().exp().mean()))
    # A step that would go below the floor is clamped back onto it.
    with torch.no_grad():
        policy.log_std.fill_(math.log(0.01))
    policy.clamp_std_()
    assert float(policy.log_std.detach().exp().min()) == pytest.approx(0.05)


def test_ppo_losses_on_a_crafted_batch():
    policy = small_policy()
    cfg = PPOConfig(clip_param=0.2, value_loss_coef=0.5, entropy_coef=0.01, schedule='fixed',
                    learning_rate=0.0 + 1e-12)
    ppo = PPO(policy, cfg, DistillationConfig())
    obs = obs_batch(4)
    with torch.no_grad():
        mu, sigma = policy.action_mean_std(obs)
        values = policy.evaluate(obs).squeeze(-1)
    actions = mu + torch.tensor([[0.1, -0.2], [0.3, 0.0], [-0.5, 0.2], [0.0, 0.4]])
    dist = torch.distributions.Normal(mu, sigma)
    new_logp = dist.log_prob(actions).sum(-1)
    # Old log-probs give ratios 1.5, 0.5, 1.1, 0.9 (two clipped, two inside).
    ratios = torch.tensor([1.5, 0.5, 1.1, 0.9])
    old_logp = new_logp - torch.log(ratios)
    adv = torch.tensor([1.0, 1.0, -2.0, 0.5])
    returns = values + torch.tensor([0.3, -0.1, 0.5, 0.0])
    old_values = values + torch.tensor([0.0, 0.4, -0.1, 0.0])
    batch = MiniBatch(obs=obs, actions=actions, values=old_values, advantages=adv,
                      returns=returns, log_probs=old_logp, mu=mu, sigma=sigma)
    out = ppo._update_mini_batch(batch, alpha=0.0)
    # surrogate: mean of max(-A r, -A clip(r, 0.8, 1.2))
    expected_surrogate = np.mean([max(-1.5, -1.2), max(-0.5, -0.8), max(2.2, 2.2),
                                  max(-0.45, -0.45)])
    assert out['surrogate_loss'] == pytest.approx(expected_surrogate, abs=1e-5)
    # clipped value loss: max((V - R)^2, (V_old + clip(V - V_old, +-0.2) - R)^2)
    v_err = [0.3, -0.1, 0.5, 0.0]
    v_shift = [0.0, 0.4, -0.1, 0.0]
    expected_value = np.mean([max(e ** 2, (s + np.clip(-s, -0.2, 0.2) - e) ** 2)
                              for e, s in zip(v_err, v_shift)])
    assert out['value_loss'] == pytest.approx(expected_value, abs=1e-5)
    # entropy of a diagonal Gaussian: sum of 0.5 log(2 pi e sigma^2)
    expected_entropy = 2 * 0.5 * math.log(2 * math.pi * math.e * 0.7 ** 2)
    assert out['entropy'] == pytest.approx(expected_entropy, rel=1e-5)
    assert out['approx_kl'] == pytest.approx(0.0, abs=1e-9)


def test_adaptive_learning_rate_follows_kl():
    policy = small_policy()
    ppo = PPO(policy, PPOConfig(learning_rate=1e-3, desired_kl=0.01), DistillationConfig())
    obs = obs_batch(8)
    with torch.no_grad():
        mu, sigma = policy.action_mean_std(obs)
    zeros = torch.zeros(8)
    far = MiniBatch(obs=obs, actions=mu, values=zeros, advantages=zeros, returns=zeros,
                    log_probs=zeros, mu=mu + 1.0, sigma=sigma)
    ppo._update_mini_batch(far, 0.0)
    assert ppo.learning_rate == pytest.approx(1e-3 / 1.5)
    near = MiniBatch(obs=obs, actions=mu, values=zeros, advantages=zeros, returns=zeros,
                     log_probs=zeros, mu=mu + 0.01, sigma=sigma)
    ppo._update_mini_batch(near, 0.0)
    assert ppo.learning_rate == pytest.approx(1e-3)
    assert ppo.optimizer.param_groups[0]['lr'] == pytest.approx(1e-3)


# ---------------------------------------------------------------------------------- KL / OPD
def test_kl_closed_form_matches_monte_carlo():
    g = torch.Generator().manual_seed(0)
    mu_p, std_p = torch.tensor([0.3, -1.0]), torch.tensor([0.5, 1.2])
    mu_q, std_q = torch.tensor([0.0, -0.5]), torch.tensor([0.8, 1.0])
    closed = gaussian_kl(mu_p, std_p, mu_q, std_q)
    x = mu_p + std_p * torch.randn(400_000, 2, generator=g)
    p = torch.distributions.Normal(mu_p, std_p)
    q = torch.distributions.Normal(mu_q, std_q)
    monte_carlo = (p.log_prob(x) - q.log_prob(x)).mean(0)
    torch.testing.assert_close(closed, monte_carlo, atol=5e-3, rtol=0)
    torch.testing.assert_close(closed, torch.distributions.kl_divergence(p, q))


def test_kl_is_zero_for_identical_distributions():
    mu, std = torch.randn(5, 3), torch.rand(5, 3) + 0.1
    assert torch.count_nonzero(gaussian_kl(mu, std, mu, std)) == 0
    registry = PolicyRegistry()
    policy = small_policy()
    registry.register_module('teacher', policy)
    registry.register_module('student', policy)
    assert compute_distillation_loss(registry, obs_batch()).item() == 0.0


def test_teacher_gets_no_gradient_and_student_does():
    teacher, student = small_policy(1), small_policy(2)
    registry = PolicyRegistry()
    registry.register_module('teacher', teacher)
    registry.register_module('student', student)
    loss = compute_distillation_loss(registry, obs_batch())
    assert loss.item() > 0
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert student.actor[0].weight.grad is not None


def test_combined_loss_and_alpha_schedule():
    rl, kl = torch.tensor(2.0), torch.tensor(3.0)
    assert combined_loss(rl, kl, 0.5).item() == 3.5
    assert combined_loss(rl, kl, 0.0) is rl
    cfg = DistillationConfig(alpha=1.0, alpha_final=0.0, alpha_schedule_iterations=10,
                             teacher_mode='ema')
    assert [alpha_at(cfg, i) for i in (0, 5, 10, 20)] == [1.0, 0.5, 0.0, 0.0]
    assert alpha_at(DistillationConfig(alpha=0.3, teacher_mode='ema'), 99) == 0.3


def test_ema_update_math():
    teacher, student = small_policy(1, normalize=True), small_policy(2, normalize=True)
    student.actor_normalizer.update(torch.randn(10, 3) + 2.0)
    t0 = {k: v.clone() for k, v in teacher.state_dict().items()}
    s0 = student.state_dict()
    update_teacher_with_ema(teacher, student, decay=0.9)
    for name, value in teacher.state_dict().items():
        if value.is_floating_point():
            torch.testing.assert_close(value, 0.9 * t0[name] + 0.1 * s0[name])
        else:
            assert torch.equal(value, s0[name])
    # decay 1 keeps the teacher, decay 0 copies the student
    update_teacher_with_ema(teacher, student, decay=0.0)
    for name, value in teacher.state_dict().items():
        torch.testing.assert_close(value, s0[name])


class TinyLinearPolicy(torch.nn.Module):
    """A different student implementation: linear mean, learnable std, no critic."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)
        self.log_std = torch.nn.Parameter(torch.zeros(2))

    def action_mean_std(self, obs):
        mean = self.linear(obs['policy'])
        return mean, self.log_std.exp().expand_as(mean)


def test_registry_swaps_the_student_without_touching_distillation_code():
    teacher = small_policy(3)
    registry = PolicyRegistry()
    registry.register_module('teacher', teacher)
    registry.register_module('student', TinyLinearPolicy())
    first = compute_distillation_loss(registry, obs_batch())
    # Any callable returning (mean, std) is a valid student too.
    registry.register('student', lambda obs: (torch.zeros(obs['policy'].shape[0], 2),
                                              torch.ones(2)))
    second = compute_distillation_loss(registry, obs_batch())
    assert first.item() > 0 and second.item() > 0 and first.item() != second.item()
    with pytest.raises(KeyError, match="no policy 'ghost'"):
        registry.get_action_logits('ghost', obs_batch())
    with pytest.raises(TypeError):
        registry.register_module('bad', torch.nn.Linear(2, 2))


# ------------------------------------------------------------------------------------ storage
def test_storage_shapes_overflow_and_mini_batches():
    storage = RolloutStorage(3, 4, {'policy': 5, 'privileged': 2}, 2)
    obs = {'policy': torch.ones(4, 5), 'privileged': torch.zeros(4, 2)}
    for t in range(3):
        storage.add(obs, torch.full((4, 2), float(t)), torch.zeros(4), torch.zeros(4),
                    torch.zeros(4, 2), torch.ones(4, 2), torch.ones(4), torch.zeros(4))
    assert storage.obs['policy'].shape == (3, 4, 5) and storage.actions.shape == (3, 4, 2)
    with pytest.raises(OverflowError, match='full'):
        storage.add(obs, torch.zeros(4, 2), torch.zeros(4), torch.zeros(4), torch.zeros(4, 2),
                    torch.ones(4, 2), torch.ones(4), torch.zeros(4))
    storage.compute_returns(torch.zeros(4), 0.99, 0.95)
    batches = list(storage.mini_batches(num_mini_batches=2, num_epochs=3,
                                        generator=torch.Generator().manual_seed(0)))
    assert len(batches) == 6
    assert batches[0].obs['policy'].shape == (6, 5) and batches[0].actions.shape == (6, 2)
    # Each epoch covers every transition once.
    seen = torch.cat([b.actions[:, 0] for b in batches[:2]]).sort().values
    torch.testing.assert_close(seen, torch.tensor([0.0] * 4 + [1.0] * 4 + [2.0] * 4))
    storage.clear()
    with pytest.raises(RuntimeError, match='0/3'):
        storage.compute_returns(torch.zeros(4), 0.99, 0.95)


def test_empirical_normalization_matches_batch_statistics():
    norm = EmpiricalNormalization(3)
    data = torch.randn(1000, 3) * torch.tensor([1.0, 5.0, 0.1]) + torch.tensor([2.0, -1.0, 0.0])
    for chunk in data.split(137):
        norm.update(chunk)
    torch.testing.assert_close(norm.mean, data.mean(0), atol=1e-5, rtol=0)
    torch.testing.assert_close(norm.var, data.var(0, unbiased=False), atol=1e-4, rtol=1e-4)
    assert norm.count.item() == 1000


def test_ppo_rejects_frozen_mode_without_teacher():
    with pytest.raises(ValueError, match='needs a teacher'):
        PPO(small_policy(), PPOConfig(),
            from_dict(DistillationConfig, {'teacher_mode': 'frozen', 'teacher_checkpoint': 'x'}))


def test_closed_form_log_prob_and_entropy_match_torch_normal():
    from claw_rl_ros.core.learning.networks import gaussian_entropy, gaussian_log_prob
    g = torch.Generator().manual_seed(3)
    mean, std = torch.randn(6, 4, generator=g), torch.rand(6, 4, generator=g) + 0.05
    actions = torch.randn(6, 4, generator=g)
    normal = torch.distributions.Normal(mean, std)
    torch.testing.assert_close(gaussian_log_prob(actions, mean, std),
                               normal.log_prob(actions).sum(-1))
    torch.testing.assert_close(gaussian_entropy(std), normal.entropy().sum(-1))


def one_rollout(ppo, steps=3, envs=4):
    """``steps`` act/process steps of distinct observations, then returns; the obs used."""
    seen = []
    for t in range(steps):
        obs = obs_batch(envs, seed=10 + t)
        obs['policy'] = obs['policy'] * 5 + 3
        seen.append(obs)
        ppo.act(obs)
        ppo.process_env_step(torch.zeros(envs), torch.zeros(envs), torch.zeros(envs), None)
    ppo.compute_returns(obs_batch(envs, seed=99))
    return seen


@pytest.mark.parametrize('variant', ['rsl_rl', 'sb3'])
def test_normaliser_statistics_follow_steps_or_rollouts_by_variant(variant):
    """sb3: merged at every step before acting (the action uses them) and not again after the
    update; rsl_rl: untouched while acting, merged once from the whole rollout after it."""
    torch.manual_seed(0)
    policy = ActorCritic(3, 3, 2, actor_hidden_dims=[8], critic_hidden_dims=[8],
                         critic_obs_groups=['policy'], obs_normalizer=variant)
    cfg = PPOConfig(schedule='fixed', num_mini_batches=1, num_learning_epochs=1)
    ppo = PPO(policy, cfg, DistillationConfig())
    ppo.init_storage(3, 4, {'policy': 3, 'policy_noise_free': 3, 'privileged': 2}, 2)
    first = obs_batch(4, seed=10)
    first['policy'] = first['policy'] * 5 + 3
    ppo.act(first)
    norm = policy.actor_normalizer
    if variant == 'sb3':
        assert norm.count.item() == 4
        torch.testing.assert_close(norm.mean, first['policy'].mean(0))
        # The stored behaviour mean is the actor on the statistics that include this step.
        torch.testing.assert_close(ppo._pending['mu'], policy.act_inference(first))
    else:
        assert norm.count.item() == 0 and not norm.mean.any()
    ppo.process_env_step(torch.zeros(4), torch.zeros(4), torch.zeros(4), None)
    ppo.storage.clear()
    ppo.init_storage(3, 4, {'policy': 3, 'policy_noise_free': 3, 'privileged': 2}, 2)
    norm.count.zero_(), norm.mean.zero_(), norm.var.fill_(1.0)
    seen = one_rollout(ppo)
    ppo.learn(obs_batch(4, seed=99), alpha=0.0)
    data = torch.cat([o['policy'] for o in seen])
    # Both end with the statistics of exactly the rollout's observations, merged once.
    assert norm.count.item() == 12
    torch.testing.assert_close(norm.mean, data.mean(0))
    torch.testing.assert_close(norm.var, data.var(0, unbiased=False))


def test_adam_eps_reaches_the_optimiser():
    ppo = PPO(small_policy(), PPOConfig(adam_eps=1e-5), DistillationConfig())
    assert ppo.optimizer.param_groups[0]['eps'] == 1e-5
    assert PPO(small_policy(), PPOConfig(), DistillationConfig()).optimizer \
        .param_groups[0]['eps'] == 1e-8
