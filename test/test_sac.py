"""SAC: Polyak math, squashed log-prob, temperature, OPD through the registry, learning, the
``algorithm`` switch and exact resume with the replay buffer."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from claw_rl_ros.core.config import from_dict, merge, to_dict
from claw_rl_ros.core.export.onnx_export import export_checkpoint, verify_onnx
from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
from claw_rl_ros.core.learning import checkpoint as ckpt
from claw_rl_ros.core.learning import fast_torch
from claw_rl_ros.core.learning.opd import gaussian_kl
from claw_rl_ros.core.learning.ppo import PPO
from claw_rl_ros.core.learning.runner import OnPolicyRunner
from claw_rl_ros.core.learning.networks import mlp, mlp_forward
from claw_rl_ros.core.learning.fast_torch import fused_adam_step, polyak_update
from claw_rl_ros.core.learning.sac import SAC
from claw_rl_ros.core.learning.sac_networks import (
    EnsembleQ, log1m_tanh_sq, SACPolicy, squashed_log_prob, squashed_log_prob_from_noise)
from claw_rl_ros.core.learning.train_config import TrainConfig
from claw_rl_ros.core.sim.gym_vec import GymVecEnv


class ReachEnv(gym.Env):
    """1-D point to a goal: obs (x, goal), x += 0.25 a, reward -|x - goal|, 16 steps."""

    observation_space = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = self.np_random.uniform(-1.0, 1.0, 2)
        return self.state.astype(np.float32), {}

    def step(self, action):
        x = np.clip(self.state[0] + 0.25 * float(action[0]), -2.0, 2.0)
        self.state = np.array([x, self.state[1]])
        return self.state.astype(np.float32), -abs(x - self.state[1]), False, False, {}


def reach_env(num_envs=8, seed=1):
    return GymVecEnv(lambda: gym.wrappers.TimeLimit(ReachEnv(), 16), num_envs, seed=seed)


def config(algorithm='sac', sac=None, distillation=None, **runner):
    return from_dict(TrainConfig, {
        'algorithm': algorithm,
        'policy': {'actor_hidden_dims': [32, 32], 'critic_hidden_dims': [32, 32],
                   'activation': 'relu'},
        'sac': {'learning_starts': 256, 'batch_size': 64, 'utd_ratio': 0.25, **(sac or {})},
        'distillation': distillation or {},
        'runner': {'torch_threads': 1, 'seed': 3, 'num_steps_per_env': 16,
                   'save_interval': 1, 'eval_episodes': 0, **runner}}, source='test')


# ------------------------------------------------------------------------------------ maths
def test_polyak_update_moves_the_target_by_tau():
    source, target = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    torch.nn.init.constant_(source.weight, 1.0)
    torch.nn.init.constant_(target.weight, 0.0)
    torch.nn.init.constant_(source.bias, -2.0)
    torch.nn.init.constant_(target.bias, 4.0)
    polyak_update(target, source, 0.1)
    assert torch.allclose(target.weight, torch.full((2, 3), 0.1))
    assert torch.allclose(target.bias, torch.full((2,), 0.9 * 4.0 + 0.1 * -2.0))
    polyak_update(target, source, 0.1)
    assert torch.allclose(target.weight, torch.full((2, 3), 0.19))
    assert torch.equal(source.weight, torch.ones(2, 3))


def test_log1m_tanh_sq_is_exact_and_stable():
    u = torch.linspace(-8.0, 8.0, 101, dtype=torch.float64)
    torch.testing.assert_close(log1m_tanh_sq(u), torch.log(1.0 - torch.tanh(u) ** 2))
    big = log1m_tanh_sq(torch.tensor([30.0, -30.0, 100.0]))
    # 1 - tanh^2 underflows to 0 in float32 there; the stable form keeps ~ 2 log 2 - 2 |u|.
    assert torch.isfinite(big).all()
    torch.testing.assert_close(big, torch.tensor([2 * math.log(2) - 60, 2 * math.log(2) - 60,
                                                  2 * math.log(2) - 200]))


def test_squashed_log_prob_matches_a_numerical_change_of_variables():
    mean = torch.tensor([[0.3, -1.2]], dtype=torch.float64)
    std = torch.tensor([[0.7, 1.5]], dtype=torch.float64)
    u = torch.tensor([[0.5, -2.0]], dtype=torch.float64)
    # log p(a) = log N(u) - log |da/du| with the derivative taken by central differences.
    h = 1e-6
    da_du = (torch.tanh(u + h) - torch.tanh(u - h)) / (2 * h)
    normal = torch.distributions.Normal(mean, std)
    numeric = (normal.log_prob(u) - da_du.log()).sum(-1)
    torch.testing.assert_close(squashed_log_prob(u, mean, std), numeric, rtol=1e-7, atol=1e-7)
    # The density of a = tanh(u) integrates to 1 over (-1, 1) in each dimension.
    a = torch.linspace(-1 + 1e-9, 1 - 1e-9, 400_001, dtype=torch.float64)
    for m, s in ((0.3, 0.7), (-1.2, 1.5), (2.0, 0.3)):
        dens = squashed_log_prob(torch.atanh(a)[:, None], torch.tensor([[m]], dtype=a.dtype),
                                 torch.tensor([[s]], dtype=a.dtype)).exp()
        assert float(torch.trapezoid(dens, a)) == pytest.approx(1.0, abs=1e-3)


def test_log_prob_from_the_noise_equals_the_change_of_variables_with_gradients():
    gen = torch.Generator().manual_seed(5)
    mean = torch.randn(64, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    log_std = torch.randn(64, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    noise = torch.randn(64, 3, generator=gen, dtype=torch.float64)
    grads = []
    for form in ('density', 'noise'):
        u = mean + log_std.exp() * noise
        logp = squashed_log_prob(u, mean, log_std.exp()) if form == 'density' \
            else squashed_log_prob_from_noise(noise, log_std, u)
        grads.append((logp, *torch.autograd.grad(logp.sum(), (mean, log_std))))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def two_mlps_and_their_ensemble(seed=0):
    """Two independent critic MLPs ``[5 + 2] -> 16 -> 16 -> 1`` and an EnsembleQ holding the
    same weights: layer ``l`` of member ``m`` is slice ``m`` of the stacked parameters."""
    torch.manual_seed(seed)
    q1, q2 = (mlp(7, [16, 16], 1, 'relu').double() for _ in range(2))
    ens = EnsembleQ(5, 2, [16, 16], 'relu').double()
    # nn.Sequential numbers Linear, activation, Linear, ...: layer l is entry 2 l; EnsembleQ
    # stores each member's weight transposed ([in, out]).
    ens.load_state_dict({
        **{f'weights.{layer}': torch.stack([q[2 * layer].weight.t() for q in (q1, q2)])
           for layer in range(3)},
        **{f'biases.{layer}': torch.stack([q[2 * layer].bias for q in (q1, q2)])
           for layer in range(3)}})
    return q1, q2, ens


def test_ensemble_critic_matches_two_independent_mlps():
    q1, q2, ens = two_mlps_and_their_ensemble()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(32, 5, generator=gen, dtype=torch.float64)
    a = torch.randn(32, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    y = torch.randn(32, generator=gen, dtype=torch.float64)
    # Values and every weight gradient of the critic loss.
    q = ens(x, a)
    ref = torch.stack([q1(torch.cat([x, a], -1)).squeeze(-1),
                       q2(torch.cat([x, a], -1)).squeeze(-1)])
    torch.testing.assert_close(q, ref, rtol=1e-12, atol=1e-12)
    torch.nn.functional.mse_loss(q, y.expand_as(q)).backward()
    (0.5 * (torch.nn.functional.mse_loss(ref[0], y) + torch.nn.functional.mse_loss(ref[1], y))
     ).backward()
    for layer in range(3):
        for m, net in enumerate((q1, q2)):
            torch.testing.assert_close(ens.weights[layer].grad[m], net[2 * layer].weight.grad.t())
            torch.testing.assert_close(ens.biases[layer].grad[m], net[2 * layer].bias.grad)
    # The actor's pass: gradient of min Q to the action only, none to the weights.
    ens.zero_grad(set_to_none=True)
    g_ens, = torch.autograd.grad(ens(x, a, detach_weights=True).amin(0).sum(), a)
    g_ref, = torch.autograd.grad(torch.minimum(q1(torch.cat([x, a], -1)),
                                               q2(torch.cat([x, a], -1))).sum(), a)
    torch.testing.assert_close(g_ens, g_ref)
    assert all(p.grad is None for p in ens.parameters())


@pytest.mark.parametrize('net', ['actor', 'critic'])
def test_bfloat16_hidden_matmuls_keep_float32_outputs_and_gradients(net):
    torch.manual_seed(0)
    x = torch.randn(256, 5)
    a = torch.rand(256, 2) * 2 - 1
    if net == 'actor':
        module = mlp(5, [256, 256], 4, 'relu')

        def run(dtype):
            return mlp_forward(module, x, dtype)
    else:
        module = EnsembleQ(5, 2, [256, 256], 'relu')

        def run(dtype):
            return module(x, a, hidden_dtype=dtype)
    # None is the stored float32 network, exactly.
    exact = module(x) if net == 'actor' else module(x, a)
    assert torch.equal(run(None), exact)
    grads = {}
    for dtype in (None, torch.bfloat16):
        module.zero_grad(set_to_none=True)
        out = run(dtype)
        # The outputs (Q values, action mean / log std) keep float32 resolution.
        assert out.dtype == torch.float32
        out.square().mean().backward()
        grads[dtype] = torch.cat([p.grad.flatten() for p in module.parameters()])
        assert all(p.dtype == torch.float32 for p in module.parameters())
        if dtype is not None:
            # bfloat16 inputs (8-bit mantissa): ~0.4 % per product, far from a different net.
            assert not torch.equal(out, exact)
            assert (out - exact).abs().max() < 0.02 * exact.abs().max()
    cosine = torch.nn.functional.cosine_similarity(grads[None], grads[torch.bfloat16], dim=0)
    assert cosine > 0.999, float(cosine)


def test_bfloat16_sac_trains_float32_parameters_with_bfloat16_matmuls(tmp_path):
    cfg = config(max_iterations=2, sac={'learning_starts': 64, 'matmul_dtype': 'bfloat16'})
    runner = OnPolicyRunner(cfg, tmp_path, env=reach_env(4))
    assert runner.alg.matmul_dtype is torch.bfloat16
    before = [p.detach().clone() for p in runner.policy.parameters()]
    seen = set()

    class RecordMatmulDtypes(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.baddbmm, torch.nn.functional.linear):
                seen.add(args[1].dtype)
            return func(*args, **(kwargs or {}))
    with RecordMatmulDtypes():
        metrics = runner.learn()
    assert torch.bfloat16 in seen and torch.float32 in seen
    after = list(runner.policy.parameters())
    assert all(p.dtype == torch.float32 for p in after)
    assert any(not torch.equal(b, p) for b, p in zip(before, after))
    final = metrics['final_metrics']
    assert final['updates'] > 0 and math.isfinite(final['critic_loss']), final
    # Acting and the exported student stay float32.
    assert runner.alg.act(runner.obs).dtype == torch.float32
    runner.close()


@pytest.mark.parametrize('native', [True, False])
def test_matmul_dtype_auto_uses_bfloat16_only_where_the_cpu_has_it(monkeypatch, native):
    monkeypatch.setattr(fast_torch, 'native_bfloat16', lambda: native)
    assert fast_torch.matmul_dtype('float32') is None
    assert fast_torch.matmul_dtype('auto') is (torch.bfloat16 if native else None)
    if native:
        assert fast_torch.matmul_dtype('bfloat16') is torch.bfloat16
    else:
        # Asked for explicitly, it is honoured, with a warning that says what it costs.
        with pytest.warns(UserWarning, match='no native support.*sac.matmul_dtype: float32'):
            assert fast_torch.matmul_dtype('bfloat16') is torch.bfloat16


def test_matmul_dtype_is_refused_by_name_when_unknown():
    with pytest.raises(ValueError, match=r'matmul_dtype.*float16'):
        config(sac={'matmul_dtype': 'float16'})


def test_ensemble_members_start_as_separately_built_mlps_would():
    torch.manual_seed(3)
    q1, q2 = mlp(7, [16, 16], 1, 'relu'), mlp(7, [16, 16], 1, 'relu')
    torch.manual_seed(3)
    ens = EnsembleQ(5, 2, [16, 16], 'relu')
    for layer in range(3):
        assert torch.equal(ens.weights[layer][1], q2[2 * layer].weight.detach().t())
        assert torch.equal(ens.biases[layer][0], q1[2 * layer].bias.detach())


def test_fused_adam_step_is_optimizer_step_bit_for_bit():
    torch.manual_seed(0)
    nets = [torch.nn.Linear(4, 3) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    extra = [torch.zeros((), requires_grad=True) for _ in range(2)]
    opts = [torch.optim.Adam([{'params': list(n.parameters()), 'lr': 1e-2},
                              {'params': [e], 'lr': 3e-3}], fused=True)
            for n, e in zip(nets, extra)]
    x = torch.randn(8, 4)
    for _ in range(4):  # the first step creates the state through Optimizer.step
        for net, e, opt, fast in zip(nets, extra, opts, (False, True)):
            (net(x).square().mean() + e * 0.7).backward()
            if fast:
                fused_adam_step(opt)
            else:
                opt.step()
                opt.zero_grad()
    for p, q in zip([*nets[0].parameters(), extra[0]], [*nets[1].parameters(), extra[1]]):
        assert torch.equal(p, q) and q.grad is None
    assert str(opts[0].state_dict()) == str(opts[1].state_dict())


def sac_on_reach(**sac):
    cfg = config(sac=sac)
    env = reach_env(4)
    runner = OnPolicyRunner(cfg, '/nonexistent', env=env)
    return runner, runner.alg


def fill_replay(alg: SAC, steps=64):
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        obs = {'policy': torch.rand(4, 2, generator=gen), 'policy_noise_free': None}
        obs['policy_noise_free'] = obs['policy']
        obs['privileged'] = torch.zeros(4, 0)
        alg.act(obs)
        alg.process_env_step(torch.rand(4, generator=gen), torch.zeros(4), torch.zeros(4),
                             None, next_obs=obs)


def test_time_outs_bootstrap_from_their_final_state_and_terminations_do_not():
    runner, alg = sac_on_reach()
    obs = runner.obs
    alg.act(obs)
    nxt = {k: v + 1.0 for k, v in obs.items()}
    final = {k: v - 5.0 for k, v in obs.items()}
    # World 0 timed out, world 1 terminated, worlds 2 and 3 go on.
    alg.process_env_step(torch.ones(4), torch.tensor([1.0, 1.0, 0.0, 0.0]),
                         torch.tensor([1.0, 0.0, 0.0, 0.0]), final, next_obs=nxt)
    buf = alg.storage
    assert buf.terminated[0].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert buf.dones[0].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert torch.equal(buf.next_obs['policy'][0, :2], final['policy'][:2])
    assert torch.equal(buf.next_obs['policy'][0, 2:], nxt['policy'][2:])
    runner.close()


def test_the_critic_target_comes_from_the_target_critic_not_the_online_one():
    runner, alg = sac_on_reach(learning_starts=0)
    fill_replay(alg)
    # A target critic that differs from the online one, as it does after Polyak steps.
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in alg.target_critic.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen))
    policy, dtype, state = alg.policy, alg.matmul_dtype, alg.generator.get_state()
    # The critic loss of the step, rebuilt with the generator draws the step will make.
    b = alg.storage.sample(alg.cfg.batch_size, alg.generator)
    with torch.no_grad():
        next_a, next_logp = policy.sample(b.next_obs, alg.generator, dtype)
        ent_coef = alg.log_ent_coef.exp()

        def critic_loss_with(target):
            next_q = target(policy.critic_input(b.next_obs), next_a, hidden_dtype=dtype).amin(0)
            y = b.rewards + b.discounts * (1.0 - b.terminated) * (next_q - ent_coef * next_logp)
            q = policy.critic(policy.critic_input(b.obs), b.actions, hidden_dtype=dtype)
            return ((q - y) ** 2).mean()
        expected, online = critic_loss_with(alg.target_critic), critic_loss_with(policy.critic)
    assert abs(float(expected - online)) > 1e-3 * float(expected)  # the two targets differ
    alg.generator.set_state(state)
    torch.testing.assert_close(alg._update_batch(0.0)[0], expected)
    runner.close()


@pytest.mark.parametrize('target_entropy, grows', [(5.0, True), (-50.0, False)])
def test_temperature_moves_towards_the_target_entropy(target_entropy, grows):
    runner, alg = sac_on_reach(target_entropy=target_entropy, learning_starts=0)
    fill_replay(alg)
    before = alg.ent_coef
    for _ in range(5):
        alg._update_batch(0.0)
    assert (alg.ent_coef > before) == grows, (before, alg.ent_coef)
    runner.close()


def test_default_target_entropy_is_minus_the_action_count():
    env = GymVecEnv('Pendulum-v1', 2)
    runner = OnPolicyRunner(config(), '/nonexistent', env=env)
    assert runner.alg.target_entropy == -1.0
    policy = SACPolicy(3, 3, 4, actor_hidden_dims=[8], critic_hidden_dims=[8])
    assert SAC(policy, config().sac, config().distillation).target_entropy == -4.0
    # Actions land in the env's range: Pendulum's torque is in [-2, 2].
    obs = {k: torch.as_tensor(v) for k, v in env.reset()[0].items()}
    assert torch.equal(runner.policy.action_scale, torch.tensor([2.0]))
    assert runner.policy.act_inference(obs).abs().max() <= 2.0
    runner.close()


# ------------------------------------------------------------------------------ distillation
def distil_through_a_fake_teacher(algorithm: str, alpha: float) -> tuple[float, dict]:
    """Train 4 iterations with a registry teacher that is a constant Gaussian (the teacher
    module itself is NaN); final KL(teacher || student) and the registry calls."""
    cfg = config(algorithm, sac={'learning_starts': 0, 'utd_ratio': 1.0, 'actor_lr': 1e-3},
                 distillation={'teacher_mode': 'ema', 'alpha': 1.0})
    runner = OnPolicyRunner(cfg, '/nonexistent', env=reach_env(4))
    alg = runner.alg
    assert isinstance(alg, {'ppo': PPO, 'sac': SAC}[algorithm])
    # A teacher module full of NaNs: any direct use of it would poison the losses.
    with torch.no_grad():
        for p in alg.teacher.parameters():
            p.fill_(float('nan'))
    calls = {'teacher': 0, 'student': 0}
    target_mean, target_std = -1.5, 0.3

    def teacher_fn(obs):
        calls['teacher'] += 1
        n = obs['policy'].shape[0]
        return torch.full((n, 1), target_mean), torch.full((n, 1), target_std)

    student_fn = alg.registry._entries['student']

    def counting_student(obs):
        calls['student'] += 1
        return student_fn(obs)

    alg.registry.register('teacher', teacher_fn)
    alg.registry.register('student', counting_student)
    obs = runner.obs
    for _ in range(4):
        runner.collect_experience()
        alg.compute_returns(runner.obs)
        losses = alg.update(alpha)
        assert math.isfinite(losses['distillation_loss'])
    with torch.no_grad():
        mean, std = student_fn(obs)
    kl = float(gaussian_kl(torch.full_like(mean, target_mean), torch.full_like(std, target_std),
                           mean, std).mean())
    assert kl == pytest.approx(alg.kl_to_teacher(obs), rel=1e-5)
    runner.close()
    return kl, calls


@pytest.mark.parametrize('algorithm', ['ppo', 'sac'])
def test_distillation_reaches_teacher_and_student_only_through_the_registry(algorithm):
    kl_rl, _ = distil_through_a_fake_teacher(algorithm, 0.0)
    kl_opd, calls = distil_through_a_fake_teacher(algorithm, 20.0)
    assert calls['teacher'] > 0 and calls['student'] > 0
    # Only the registry's teacher can have pulled the student there.
    assert kl_opd < 0.6 * kl_rl, (kl_opd, kl_rl)


# ------------------------------------------------------------------------------- the switch
def test_switching_algorithm_changes_the_trainer_and_nothing_else(tmp_path):
    runners = {a: OnPolicyRunner(config(a), tmp_path / a, env=reach_env(4))
               for a in ('ppo', 'sac')}
    ppo, sac = runners['ppo'], runners['sac']
    assert type(ppo.alg) is PPO and type(sac.alg) is SAC
    a, b = to_dict(ppo.cfg), to_dict(sac.cfg)
    assert {k for k in a if a[k] != b[k]} == {'algorithm'}
    # The env, its observations and the distillation layer are untouched by the switch.
    assert ppo.obs_dims == sac.obs_dims and type(ppo.env) is type(sac.env)
    for k in ppo.obs:
        assert torch.equal(ppo.obs[k], sac.obs[k])
    assert ppo.alg.registry.names == sac.alg.registry.names == ['student']
    for runner in runners.values():
        metrics = runner.train_one_epoch()
        assert metrics['total_steps'] == 64 and 'mean_episode_return' in metrics
        runner.close()


def test_sac_return_rises_on_a_reach_task(tmp_path):
    # Short horizon and a small initial temperature, so that ~400 gradient steps suffice.
    cfg = config(sac={'learning_starts': 256, 'batch_size': 64, 'utd_ratio': 0.25,
                      'init_ent_coef': 0.05, 'actor_lr': 1e-3, 'critic_lr': 1e-3,
                      'gamma': 0.9}, max_iterations=14)
    runner = OnPolicyRunner(cfg, tmp_path, env=reach_env(8))
    runner.learn()
    returns = list(runner.learner.episodes.returns)
    # The first 16 episodes act uniformly at random (learning_starts), the last 16 learnt.
    first, last = float(np.mean(returns[:16])), float(np.mean(returns[-16:]))
    assert last > first + 5.0, (first, last)
    runner.close()


def test_resume_with_the_replay_buffer_is_exact(tmp_path):
    cfg = config(max_iterations=3, sac={'learning_starts': 64, 'n_step': 2})
    first = OnPolicyRunner(cfg, tmp_path / 'a', env=reach_env(4, seed=1))
    first.learn()
    resumed = OnPolicyRunner(cfg, tmp_path / 'b', env=reach_env(4, seed=9))
    resumed.load(ckpt.checkpoint_path(tmp_path / 'a', 2))
    assert resumed.alg.storage.size == 2 * 16
    resumed.train_one_epoch()
    for key, value in first.policy.state_dict().items():
        torch.testing.assert_close(resumed.policy.state_dict()[key], value, rtol=0, atol=0)
    for key, value in first.alg.target_critic.state_dict().items():
        torch.testing.assert_close(resumed.alg.target_critic.state_dict()[key], value,
                                   rtol=0, atol=0)
    assert resumed.alg.ent_coef == first.alg.ent_coef
    assert torch.equal(resumed.alg.storage.rewards, first.alg.storage.rewards)
    # Without the buffer in the checkpoint the file is smaller and resume starts it empty.
    light = config(max_iterations=1, sac={'learning_starts': 100, 'checkpoint_replay': False})
    OnPolicyRunner(light, tmp_path / 'c', env=reach_env(4)).learn()
    full_size = ckpt.checkpoint_path(tmp_path / 'a', 1).stat().st_size
    assert ckpt.checkpoint_path(tmp_path / 'c', 1).stat().st_size < full_size
    light_resumed = OnPolicyRunner(light, tmp_path / 'e', env=reach_env(4))
    light_resumed.load(ckpt.checkpoint_path(tmp_path / 'c', 1))
    assert len(light_resumed.alg.storage) == 0
    # The policy acts; updates wait until learning_starts transitions are stored again.
    assert light_resumed.train_one_epoch()['updates'] == 0.0
    assert light_resumed.train_one_epoch()['updates'] > 0
    ppo = OnPolicyRunner(config('ppo'), tmp_path / 'd', env=reach_env(4))
    with pytest.raises(Exception, match='trained with sac'):
        ppo.load(ckpt.checkpoint_path(tmp_path / 'a', 2))


# -------------------------------------------------------------------------------- export
def test_sac_student_on_the_claw_env_exports_its_squashed_mean(robot, tmp_path):
    cfg = from_dict(TrainConfig, merge(to_dict(config(max_iterations=1)), {
        'env': {'num_envs': 8, 'episode_length_s': 1.0, 'num_threads': 1},
        'sac': {'learning_starts': 32, 'action_bound': 0.8}}), source='test')
    runner = OnPolicyRunner(cfg, tmp_path)
    runner.learn()
    runner.close()
    policy = runner.policy
    assert policy.actor_normalizer.count > 0  # the normaliser is in the graph, not identity
    path = export_checkpoint(ckpt.latest_checkpoint(tmp_path), tmp_path / 'student.onnx')
    model = OnnxPolicy(path, robot)
    assert model.metadata['algorithm'] == '"sac"'
    assert verify_onnx(policy, path) < 1e-5
    obs = np.random.default_rng(0).standard_normal((64, robot.policy_obs.dim)).astype(
        np.float32) * 2.0
    with torch.no_grad():
        mean, _ = policy.action_mean_std({'policy': torch.from_numpy(obs)})
    # The deterministic action is the tanh of the pre-tanh mean, scaled to +-action_bound.
    np.testing.assert_allclose(model(obs), 0.8 * np.tanh(mean.numpy()), atol=1e-5)
    assert np.abs(model(obs)).max() <= 0.8


def test_frozen_teacher_must_come_from_the_same_algorithm(tmp_path):
    for algorithm in ('ppo', 'sac'):
        OnPolicyRunner(config(algorithm, max_iterations=1), tmp_path / algorithm,
                       env=reach_env(4)).learn()
    sac_teacher = ckpt.latest_checkpoint(tmp_path / 'sac')
    frozen = {'teacher_mode': 'frozen', 'alpha': 1.0, 'teacher_checkpoint': str(sac_teacher)}
    student = OnPolicyRunner(config(distillation=frozen), tmp_path / 'student', env=reach_env(4))
    assert isinstance(student.alg.teacher, SACPolicy)
    teacher_params = torch.cat([p.flatten() for p in student.alg.teacher.parameters()])
    student.train_one_epoch()
    # Frozen: the teacher is exactly the checkpoint's student and gets no updates.
    assert torch.equal(teacher_params,
                       torch.cat([p.flatten() for p in student.alg.teacher.parameters()]))
    frozen['teacher_checkpoint'] = str(ckpt.latest_checkpoint(tmp_path / 'ppo'))
    with pytest.raises(Exception, match='teacher was trained with ppo, the student uses sac'):
        OnPolicyRunner(config(distillation=frozen), tmp_path / 'bad', env=reach_env(4))
