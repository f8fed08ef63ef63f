"""PPO update maths at the loop level: one update on a crafted batch against an independent
computation of the loss, its gradient and the Adam step; learning-rate schedule, returns, act.

The reference side never calls the code under test: it rebuilds the networks' forward pass from
their layers and writes every loss term in the textbook form (min of the surrogates, clipped
value error, Gaussian entropy and KL from ``torch.distributions``).
"""

import copy
import math

import pytest
import torch

from claw_rl_ros.core.learning.networks import ActorCritic
from claw_rl_ros.core.learning.ppo import PPO
from claw_rl_ros.core.learning.storage import compute_gae, MiniBatch
from claw_rl_ros.core.learning.train_config import DistillationConfig, PPOConfig

A = 2          # actions
B = 6          # transitions in the crafted batch
DT = torch.float64
DIMS = {'policy': 3, 'policy_noise_free': 3, 'privileged': 2}


def tiny_policy(seed=0, std=0.7, dtype=DT):
    """An actor-critic (float64 unless asked) whose normalisers hold non-trivial statistics."""
    torch.manual_seed(seed)
    policy = ActorCritic(3, 5, A, actor_hidden_dims=[4], critic_hidden_dims=[4],
                         init_noise_std=std, normalize_obs=True).to(dtype)
    g = torch.Generator().manual_seed(seed + 100)
    policy.update_normalization({
        'policy': torch.randn(50, 3, generator=g, dtype=dtype) * 2 + 1,
        'policy_noise_free': torch.randn(50, 3, generator=g, dtype=dtype) - 1,
        'privileged': torch.randn(50, 2, generator=g, dtype=dtype) - 3})
    return policy


def crafted_obs(seed=1, n=B, dtype=DT):
    """The three groups; the noise-free copy differs from the noisy one, as in the env."""
    g = torch.Generator().manual_seed(seed)
    policy = torch.randn(n, 3, generator=g, dtype=dtype)
    return {'policy': policy,
            'policy_noise_free': policy + 0.5 * torch.randn(n, 3, generator=g, dtype=dtype),
            'privileged': torch.randn(n, 2, generator=g, dtype=dtype)}


def ref_mean_std(policy, obs):
    """mu [B, A], std [B, A] rebuilt from the layers: actor((x - m) / (sqrt(v) + eps))."""
    norm = policy.actor_normalizer
    x = (obs['policy'] - norm.mean) / (norm.var.sqrt() + norm.eps)
    mu = policy.actor(x)
    return mu, policy.log_std.exp().expand_as(mu)


def ref_value(policy, obs):
    """V [B] of the critic on [policy_noise_free, privileged], normalised as above."""
    norm = policy.critic_normalizer
    x = torch.cat([obs['policy_noise_free'], obs['privileged']], dim=-1)
    return policy.critic((x - norm.mean) / (norm.var.sqrt() + norm.eps)).squeeze(-1)


# Target ratios r = pi / pi_old: two above 1 + eps, two below 1 - eps, two inside.
RATIOS = torch.tensor([1.5, 0.5, 1.1, 0.9, 1.35, 0.7], dtype=DT)
ADVANTAGES = torch.tensor([1.0, 1.0, -2.0, 0.5, -1.5, -0.8], dtype=DT)
# Old values relative to the current ones, and returns relative to the current values:
# rows 1 and 4 move the value by more than the clip, down and up, and there the clipped value
# error is the larger one.
OLD_VALUE_SHIFT = torch.tensor([0.0, 0.4, -0.1, 0.0, -0.5, 0.3], dtype=DT)
RETURN_SHIFT = torch.tensor([0.3, -0.1, 0.5, 0.0, 0.3, 0.6], dtype=DT)


def crafted_batch(policy, obs, behaviour_sigma_scale=1.0):
    """A MiniBatch whose stored log-probs give RATIOS under the current policy."""
    with torch.no_grad():
        mu, sigma = ref_mean_std(policy, obs)
        values = ref_value(policy, obs)
    offsets = torch.tensor([[0.1, -0.2], [0.3, 0.0], [-0.5, 0.2], [0.0, 0.4], [0.7, -0.3],
                            [-0.2, -0.6]], dtype=DT)
    actions = mu + offsets
    new_logp = torch.distributions.Normal(mu, sigma).log_prob(actions).sum(-1)
    return MiniBatch(obs=obs, actions=actions, values=values + OLD_VALUE_SHIFT,
                     advantages=ADVANTAGES.clone(), returns=values + RETURN_SHIFT,
                     log_probs=new_logp - RATIOS.log(), mu=mu + 0.05,
                     sigma=sigma * behaviour_sigma_scale)


def reference_loss(policy, b, cfg, teacher=None, alpha=0.0):
    """Textbook PPO loss (+ alpha KL(teacher || student)) and its parts, differentiable."""
    mu, sigma = ref_mean_std(policy, b.obs)
    dist = torch.distributions.Normal(mu, sigma)
    ratio = torch.exp(dist.log_prob(b.actions).sum(-1) - b.log_probs)
    adv = b.advantages
    if cfg.normalize_advantage_per_mini_batch:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    eps = cfg.clip_param
    # L_clip = E[min(r A, clip(r, 1 - eps, 1 + eps) A)]; PPO minimises -L_clip.
    surrogate = -torch.minimum(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv).mean()
    v = ref_value(policy, b.obs)
    if cfg.use_clipped_value_loss:
        v_clip = b.values + (v - b.values).clamp(-eps, eps)
        value_loss = torch.maximum((v - b.returns) ** 2, (v_clip - b.returns) ** 2).mean()
    else:
        value_loss = ((v - b.returns) ** 2).mean()
    entropy = dist.entropy().sum(-1).mean()
    loss = surrogate + cfg.value_loss_coef * value_loss - cfg.entropy_coef * entropy
    kl = None
    if teacher is not None:
        with torch.no_grad():
            mu_t, sigma_t = ref_mean_std(teacher, b.obs)
        kl = torch.distributions.kl_divergence(torch.distributions.Normal(mu_t, sigma_t),
                                               dist).mean()
        loss = loss + alpha * kl
    return loss, {'surrogate_loss': surrogate, 'value_loss': value_loss, 'entropy': entropy,
                  'distillation_loss': kl}


def grads(module):
    return {n: p.grad.clone() for n, p in module.named_parameters()}


CASES = {
    'clipped value, rollout-normalised advantages': dict(),
    'plain value loss, per-mini-batch advantages': dict(use_clipped_value_loss=False,
                                                        normalize_advantage_per_mini_batch=True),
    'other coefficients': dict(clip_param=0.3, value_loss_coef=0.7, entropy_coef=0.2),
}


@pytest.mark.parametrize('overrides', CASES.values(), ids=CASES.keys())
def test_one_update_matches_independent_loss_gradient_and_adam_step(overrides):
    cfg = PPOConfig(**{'schedule': 'fixed', 'learning_rate': 1e-3, 'max_grad_norm': 1e9,
                       'value_loss_coef': 0.5, 'entropy_coef': 0.01, 'clip_param': 0.2,
                       **overrides})
    policy = tiny_policy()
    ppo = PPO(policy, cfg, DistillationConfig())
    batch = crafted_batch(policy, crafted_obs())
    ref = copy.deepcopy(policy)
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}

    out = ppo._update_mini_batch(batch, alpha=0.0)

    loss, parts = reference_loss(ref, batch, cfg)
    loss.backward()
    for key in ('surrogate_loss', 'value_loss', 'entropy'):
        assert out[key] == pytest.approx(parts[key].item(), rel=1e-9, abs=1e-12), key
    assert out['distillation_loss'] == 0.0
    # The clips are active: the loss differs from the unclipped one.
    assert not math.isclose(parts['surrogate_loss'].item(),
                            -(RATIOS * ADVANTAGES).mean().item(), rel_tol=1e-3)
    expected = grads(ref)
    for name, p in policy.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-9, atol=1e-12)
        # First Adam step: p <- p - lr * g / (|g| + eps) (bias corrections cancel).
        g = expected[name]
        torch.testing.assert_close(p.detach(), before[name] - 1e-3 * g / (g.abs() + 1e-8),
                                   rtol=1e-9, atol=1e-12)


def test_distillation_term_adds_alpha_times_kl_teacher_to_student_to_the_gradient():
    cfg = PPOConfig(schedule='fixed', learning_rate=1e-3, max_grad_norm=1e9)
    policy, teacher = tiny_policy(0), tiny_policy(7, std=0.4)
    ppo = PPO(policy, cfg, DistillationConfig(teacher_mode='frozen', teacher_checkpoint='x'),
              teacher=teacher)
    batch = crafted_batch(policy, crafted_obs())
    ref, ref_teacher = copy.deepcopy(policy), copy.deepcopy(teacher)
    teacher_before = copy.deepcopy(teacher.state_dict())

    out = ppo._update_mini_batch(batch, alpha=0.5)

    loss, parts = reference_loss(ref, batch, cfg, teacher=ref_teacher, alpha=0.5)
    loss.backward()
    assert out['distillation_loss'] == pytest.approx(parts['distillation_loss'].item(),
                                                     rel=1e-9)
    expected = grads(ref)
    for name, p in policy.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-9, atol=1e-12)
    # The teacher is frozen: no gradient, no change.
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    for k, v in teacher.state_dict().items():
        assert torch.equal(v, teacher_before[k])
    # The same update without the teacher term has a different gradient.
    plain, _ = reference_loss(copy.deepcopy(policy), batch, cfg)
    assert not math.isclose(plain.item(), loss.item(), rel_tol=1e-6)


def test_gradient_clipping_rescales_to_the_max_norm():
    cfg = PPOConfig(schedule='fixed', learning_rate=1e-3, max_grad_norm=1e-3)
    policy = tiny_policy()
    ppo = PPO(policy, cfg, DistillationConfig())
    batch = crafted_batch(policy, crafted_obs())
    ref = copy.deepcopy(policy)
    ppo._update_mini_batch(batch, alpha=0.0)
    loss, _ = reference_loss(ref, batch, cfg)
    loss.backward()
    expected = grads(ref)
    total = torch.sqrt(sum(g.square().sum() for g in expected.values()))
    assert total > 1e-2     # far above the clip: the clip is active
    for name, p in policy.named_parameters():
        torch.testing.assert_close(p.grad, expected[name] * (1e-3 / total), rtol=1e-5,
                                   atol=1e-12)


def test_approx_kl_is_kl_behaviour_to_current_policy():
    policy = tiny_policy()
    ppo = PPO(policy, PPOConfig(schedule='fixed', learning_rate=1e-12), DistillationConfig())
    # The behaviour sigma differs from the current one: KL(old || new) != KL(new || old).
    batch = crafted_batch(policy, crafted_obs(), behaviour_sigma_scale=1.6)
    with torch.no_grad():
        mu, sigma = ref_mean_std(policy, batch.obs)
    old = torch.distributions.Normal(batch.mu, batch.sigma)
    new = torch.distributions.Normal(mu, sigma)
    forward = torch.distributions.kl_divergence(old, new).sum(-1).mean().item()
    backward = torch.distributions.kl_divergence(new, old).sum(-1).mean().item()
    out = ppo._update_mini_batch(batch, alpha=0.0)
    assert out['approx_kl'] == pytest.approx(forward, rel=1e-9)
    assert abs(forward - backward) > 0.05


def kl_batch(policy, kl_target):
    """A batch whose KL(behaviour || current), summed over 2 dims, is kl_target (mean shift)."""
    obs = crafted_obs()
    with torch.no_grad():
        mu, sigma = ref_mean_std(policy, obs)
    # KL of equal-variance Gaussians is d^2 / (2 s^2) per dim; 2 dims share it.
    shift = sigma * math.sqrt(kl_target)
    zeros = torch.zeros(B, dtype=DT)
    return MiniBatch(obs=obs, actions=mu, values=zeros, advantages=zeros, returns=zeros,
                     log_probs=zeros, mu=mu + shift, sigma=sigma)


@pytest.mark.parametrize('lr, kl_factor, expected', [
    (1e-3, 2.5, 1e-3 / 1.5),     # KL above 2x desired: divide by 1.5
    (1e-3, 2.1, 1e-3 / 1.5),
    (1e-3, 1.9, 1e-3),           # inside the band: unchanged
    (1e-3, 0.6, 1e-3),
    (1e-3, 0.4, 1e-3 * 1.5),     # below half the desired KL: multiply by 1.5
    (1.2e-5, 3.0, 1e-5),         # floor
    (9e-3, 0.1, 1e-2),           # ceiling
    (1e-3, 0.0, 1e-3),           # exactly 0 KL: unchanged (no information)
])
def test_adaptive_learning_rate_band_factors_and_bounds(lr, kl_factor, expected):
    desired = 0.01
    policy = tiny_policy()
    ppo = PPO(policy, PPOConfig(learning_rate=lr, desired_kl=desired), DistillationConfig())
    out = ppo._update_mini_batch(kl_batch(policy, kl_factor * desired), 0.0)
    assert out['approx_kl'] == pytest.approx(kl_factor * desired, rel=1e-9, abs=1e-15)
    assert ppo.learning_rate == pytest.approx(expected, rel=1e-12)
    assert ppo.optimizer.param_groups[0]['lr'] == pytest.approx(expected, rel=1e-12)


def test_fixed_schedule_never_touches_the_learning_rate():
    policy = tiny_policy()
    ppo = PPO(policy, PPOConfig(learning_rate=1e-3, schedule='fixed'), DistillationConfig())
    ppo._update_mini_batch(kl_batch(policy, 1.0), 0.0)
    assert ppo.learning_rate == 1e-3 and ppo.optimizer.param_groups[0]['lr'] == 1e-3


# ------------------------------------------------------------------------- act / returns
def test_act_samples_the_gaussian_and_records_the_transition():
    policy = tiny_policy()
    ppo = PPO(policy, PPOConfig(), DistillationConfig(),
              generator=torch.Generator().manual_seed(5))
    obs = crafted_obs()
    actions = ppo.act(obs)
    with torch.no_grad():
        mu, sigma = ref_mean_std(policy, obs)
        values = ref_value(policy, obs)
    # The same generator state reproduces the sample: a = mu + sigma * z.
    expected = torch.normal(mu, sigma, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(actions, expected)
    pending = ppo._pending
    assert pending['obs'] is obs and pending['actions'] is actions
    torch.testing.assert_close(pending['mu'], mu)
    torch.testing.assert_close(pending['sigma'], sigma)
    torch.testing.assert_close(pending['values'], values)
    torch.testing.assert_close(pending['log_probs'],
                               torch.distributions.Normal(mu, sigma).log_prob(actions).sum(-1))


def test_act_spread_matches_the_policy_std():
    policy = tiny_policy(std=0.3)
    ppo = PPO(policy, PPOConfig(), DistillationConfig(),
              generator=torch.Generator().manual_seed(0))
    obs = {k: v[:1].expand(20000, -1) for k, v in crafted_obs().items()}
    actions = ppo.act(obs)
    mu, _ = ref_mean_std(policy, {k: v[:1] for k, v in obs.items()})
    torch.testing.assert_close(actions.mean(0), mu[0].detach(), atol=0.01, rtol=0)
    torch.testing.assert_close(actions.std(0), torch.full((A,), 0.3, dtype=DT), atol=0.01,
                               rtol=0)


def fill(ppo, steps, envs, rewards, dones, seed=3):
    """Act and store `steps` steps of given rewards / dones (float32, as the storage)."""
    all_obs = []
    for t in range(steps):
        obs = crafted_obs(seed + t, envs, torch.float32)
        all_obs.append(obs)
        ppo.act(obs)
        ppo.process_env_step(rewards[t], dones[t], torch.zeros(envs), None)
    return all_obs


@pytest.mark.parametrize('per_mini_batch', [False, True])
def test_compute_returns_is_gae_from_the_last_observation(per_mini_batch):
    cfg = PPOConfig(gamma=0.9, lam=0.8, normalize_advantage_per_mini_batch=per_mini_batch)
    policy = tiny_policy(dtype=torch.float32)
    ppo = PPO(policy, cfg, DistillationConfig())
    ppo.init_storage(3, 2, DIMS, A)
    rewards = torch.tensor([[1.0, 0.0], [0.5, 2.0], [-1.0, 1.0]])
    dones = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    all_obs = fill(ppo, 3, 2, rewards, dones)
    last = crafted_obs(9, 2, torch.float32)
    ppo.compute_returns(last)
    with torch.no_grad():
        values = torch.stack([ref_value(policy, o) for o in all_obs])
        last_values = ref_value(policy, last)
    returns = compute_gae(rewards, values, dones, last_values, 0.9, 0.8)
    torch.testing.assert_close(ppo.storage.returns, returns)
    advantages = returns - values
    if not per_mini_batch:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    torch.testing.assert_close(ppo.storage.advantages, advantages)


def test_update_averages_every_mini_batch_of_every_epoch_and_clears_storage(monkeypatch):
    cfg = PPOConfig(num_learning_epochs=3, num_mini_batches=2)
    policy = tiny_policy(std=0.4, dtype=torch.float32)
    ppo = PPO(policy, cfg, DistillationConfig())
    ppo.init_storage(2, 3, DIMS, A)
    fill(ppo, 2, 3, torch.ones(2, 3), torch.zeros(2, 3))
    ppo.compute_returns(crafted_obs(9, 3, torch.float32))
    calls = []

    def fake(batch, alpha):
        calls.append((batch.actions.shape[0], alpha))
        i = float(len(calls))
        return {'value_loss': i, 'surrogate_loss': -i, 'entropy': 2 * i, 'approx_kl': i * i,
                'distillation_loss': 10 * i}

    monkeypatch.setattr(ppo, '_update_mini_batch', fake)
    out = ppo.update(alpha=0.25)
    # 3 epochs x 2 mini-batches of 3 transitions; means of 1..6, of 1..6 squared.
    assert calls == [(3, 0.25)] * 6
    assert out['value_loss'] == pytest.approx(3.5) and out['surrogate_loss'] == -3.5
    assert out['entropy'] == 7.0 and out['distillation_loss'] == 35.0
    assert out['approx_kl'] == pytest.approx(91 / 6)
    assert out['alpha'] == 0.25 and out['learning_rate'] == ppo.learning_rate
    assert out['action_std'] == pytest.approx(0.4)
    assert ppo.storage.step == 0


def real_update(global_seed, generator_seed=0):
    """One seeded PPO iteration on 4 steps x 3 worlds; returns (losses, policy)."""
    cfg = PPOConfig(num_learning_epochs=2, num_mini_batches=2, schedule='fixed')
    policy = tiny_policy(dtype=torch.float32)
    ppo = PPO(policy, cfg, DistillationConfig(),
              generator=torch.Generator().manual_seed(generator_seed))
    ppo.init_storage(4, 3, DIMS, A)
    g = torch.Generator().manual_seed(0)
    fill(ppo, 4, 3, torch.randn(4, 3, generator=g), torch.zeros(4, 3))
    ppo.compute_returns(crafted_obs(9, 3, torch.float32))
    torch.manual_seed(global_seed)
    return ppo.update(), policy


def test_real_update_reports_finite_means_and_changes_the_policy():
    out, policy = real_update(0)
    assert set(out) == {'value_loss', 'surrogate_loss', 'entropy', 'distillation_loss',
                        'approx_kl', 'learning_rate', 'action_std', 'alpha'}
    assert all(math.isfinite(v) for v in out.values())
    assert out['value_loss'] > 0 and out['entropy'] > 0 and out['alpha'] == 0.0
    assert not torch.equal(tiny_policy(dtype=torch.float32).actor[0].weight,
                           policy.actor[0].weight)
    # Sampling and shuffling draw from the PPO's generator only, never the global stream.
    again, same = real_update(123)
    other, _ = real_update(0, generator_seed=1)
    assert again == out and other != out
    for a, b in zip(policy.parameters(), same.parameters()):
        assert torch.equal(a, b)


def test_loop_level_gae_with_a_time_out_bootstrap_and_a_nan_in_a_terminated_world():
    """act -> process_env_step -> compute_returns on 2 worlds x 3 steps, checked by hand.

    Step 1: world 0 times out (bootstrapped with gamma V(s_final)), world 1 fails in a
    diverged state whose final observation is NaN: its reward must stay finite and unchanged.
    """
    gamma, lam = 0.9, 0.8
    cfg = PPOConfig(gamma=gamma, lam=lam, normalize_advantage_per_mini_batch=True)
    policy = tiny_policy(dtype=torch.float32)
    ppo = PPO(policy, cfg, DistillationConfig())
    ppo.init_storage(3, 2, DIMS, A)
    rewards = [[1.0, 0.5], [2.0, -1.0], [0.5, 0.25]]
    dones = [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]
    time_outs = [[0.0, 0.0], [1.0, 0.0], [0.0, 0.0]]
    final = crafted_obs(20, 2, torch.float32)
    final['privileged'][1] = float('nan')
    for t in range(3):
        ppo.act(crafted_obs(10 + t, 2, torch.float32))
        ppo.process_env_step(torch.tensor(rewards[t]), torch.tensor(dones[t]),
                             torch.tensor(time_outs[t]), final if t == 1 else None)
    last = crafted_obs(30, 2, torch.float32)
    ppo.compute_returns(last)
    with torch.no_grad():
        v = [ref_value(policy, crafted_obs(10 + t, 2, torch.float32)).tolist()
             for t in range(3)]
        v_final = ref_value(policy, final).tolist()
        v_last = ref_value(policy, last).tolist()
    assert math.isnan(v_final[1])
    stored = [r[:] for r in rewards]
    stored[1][0] += gamma * v_final[0]
    torch.testing.assert_close(ppo.storage.rewards, torch.tensor(stored))
    for n in range(2):
        # The episode ends after step 1: steps 0-1 and step 2 are separate GAE chains.
        a2 = stored[2][n] + gamma * v_last[n] - v[2][n]
        a1 = stored[1][n] - v[1][n]
        a0 = stored[0][n] + gamma * v[1][n] - v[0][n] + gamma * lam * a1
        torch.testing.assert_close(ppo.storage.returns[:, n],
                                   torch.tensor([a0 + v[0][n], a1 + v[1][n], a2 + v[2][n]]))


def test_process_env_step_without_time_outs_or_final_obs_stores_rewards_as_given():
    policy = tiny_policy(dtype=torch.float32)
    ppo = PPO(policy, PPOConfig(gamma=0.5), DistillationConfig())
    ppo.init_storage(2, 2, DIMS, A)
    final = crafted_obs(4, 2, torch.float32)
    ppo.act(crafted_obs(1, 2, torch.float32))
    ppo.process_env_step(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 0.0]),
                         torch.zeros(2), final)
    ppo.act(crafted_obs(2, 2, torch.float32))
    ppo.process_env_step(torch.tensor([3.0, 4.0]), torch.tensor([1.0, 1.0]),
                         torch.tensor([1.0, 1.0]), None)
    assert ppo.storage.rewards.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert ppo.storage.dones.tolist() == [[1.0, 0.0], [1.0, 1.0]]


def test_every_update_step_clamps_log_std_onto_the_floor():
    """A step that lowers the std below min_std lands exactly on the floor (issue 7 defect 4)."""
    torch.manual_seed(0)
    policy = ActorCritic(3, 5, A, actor_hidden_dims=[4], critic_hidden_dims=[4],
                         init_noise_std=0.052, normalize_obs=False, min_std=0.05)
    cfg = PPOConfig(schedule='fixed', learning_rate=0.1, value_loss_coef=0.0, entropy_coef=0.0)
    ppo = PPO(policy, cfg, DistillationConfig())
    obs = crafted_obs(1, B, torch.float32)
    with torch.no_grad():
        mu, sigma = policy.action_mean_std(obs)
    zeros = torch.zeros(B)
    # Actions at the mean with positive advantages: the surrogate wants a narrower Gaussian.
    batch = MiniBatch(obs=obs, actions=mu, values=zeros, advantages=torch.ones(B),
                      returns=zeros, log_probs=torch.distributions.Normal(mu, sigma)
                      .log_prob(mu).sum(-1), mu=mu, sigma=sigma)
    ppo._update_mini_batch(batch, 0.0)
    assert policy.log_std.grad.gt(0).all()      # the gradient step goes down...
    torch.testing.assert_close(policy.log_std.detach(),
                               torch.full((A,), math.log(0.05)))   # ...and stops on the floor
    _, std = policy.action_mean_std(obs)
    torch.testing.assert_close(std, torch.full((B, A), 0.05))


def filled_ppo(teacher_mode='none', teacher=None, ema_decay=0.5):
    """A float32 PPO with a 3-step x 4-world rollout stored, ready to learn."""
    policy = tiny_policy(dtype=torch.float32)
    distill = DistillationConfig(teacher_mode=teacher_mode, ema_decay=ema_decay,
                                 teacher_checkpoint='t.pt' if teacher_mode == 'frozen' else None)
    ppo = PPO(policy, PPOConfig(num_mini_batches=2, num_learning_epochs=1, schedule='fixed'),
              distill, teacher=teacher, generator=torch.Generator().manual_seed(0))
    ppo.init_storage(3, 4, DIMS, A)
    g = torch.Generator().manual_seed(1)
    fill(ppo, 3, 4, torch.randn(3, 4, generator=g), torch.zeros(3, 4))
    return ppo


def test_learn_measures_the_teacher_kl_first_then_updates_normalisers_on_the_whole_rollout():
    teacher = tiny_policy(5, std=0.4, dtype=torch.float32)
    ppo = filled_ppo('frozen', teacher)
    policy = ppo.policy
    all_obs = {k: v.flatten(0, 1).clone() for k, v in ppo.storage.obs.items()}
    kl_before = ppo.kl_to_teacher(ppo.storage.obs_flat())
    norms = copy.deepcopy((policy.actor_normalizer, policy.critic_normalizer))
    norms[0].update(all_obs['policy'])
    norms[1].update(torch.cat([all_obs['policy_noise_free'], all_obs['privileged']], -1))
    teacher_state = copy.deepcopy(teacher.state_dict())
    out = ppo.learn(crafted_obs(9, 4, torch.float32), alpha=0.5)
    assert out['kl_to_teacher'] == pytest.approx(kl_before) and kl_before > 0
    assert out['alpha'] == 0.5 and out['distillation_loss'] > 0
    for mine, expected in zip((policy.actor_normalizer, policy.critic_normalizer), norms):
        torch.testing.assert_close(mine.mean, expected.mean)
        torch.testing.assert_close(mine.var, expected.var)
        assert mine.count.item() == expected.count.item()
    assert ppo.storage.step == 0
    # A frozen teacher is not moved by learning.
    for k, v in teacher.state_dict().items():
        assert torch.equal(v, teacher_state[k])


def test_learn_moves_an_ema_teacher_and_reports_no_kl_without_a_teacher():
    ppo = filled_ppo('ema', ema_decay=0.5)
    before = copy.deepcopy(ppo.teacher.state_dict())
    out = ppo.learn(crafted_obs(9, 4, torch.float32), alpha=0.0)
    assert out['kl_to_teacher'] == 0.0          # the EMA copy starts equal to the student
    student = ppo.policy.state_dict()
    for k, v in ppo.teacher.state_dict().items():
        if v.is_floating_point():
            torch.testing.assert_close(v, 0.5 * before[k] + 0.5 * student[k])
    plain = filled_ppo()
    assert 'kl_to_teacher' not in plain.learn(crafted_obs(9, 4, torch.float32), alpha=0.0)


def test_state_dict_round_trip_restores_optimiser_moments_and_the_adaptive_rate():
    a = filled_ppo()
    a.learn(crafted_obs(9, 4, torch.float32), alpha=0.0)
    a.learning_rate = 3e-4
    state = a.state_dict()
    assert set(state) == {'optimizer', 'learning_rate'} and state['learning_rate'] == 3e-4
    b = filled_ppo()
    b.load_state_dict(state)
    assert b.learning_rate == 3e-4
    moments_a = [s['exp_avg'] for s in a.optimizer.state_dict()['state'].values()]
    moments_b = [s['exp_avg'] for s in b.optimizer.state_dict()['state'].values()]
    assert len(moments_a) == len(moments_b) > 0
    for x, y in zip(moments_a, moments_b):
        assert torch.equal(x, y)


def test_rollout_obs_thins_to_4096_rows_by_default():
    ppo = PPO(tiny_policy(dtype=torch.float32), PPOConfig(), DistillationConfig())
    ppo.init_storage(41, 100, DIMS, A)
    ppo.storage.obs['policy'][:] = torch.arange(4100.0).reshape(41, 100, 1)
    assert ppo.rollout_obs()['policy'].shape == (4096, 3)
    assert ppo.rollout_obs(10)['privileged'].shape == (10, 2)
    assert ppo.rollout_obs()['policy'][-1, 0] == 4099
