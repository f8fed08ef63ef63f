"""Actor-critic maths: layer layout, observation normaliser, Gaussian log-density and entropy,
group selection, and that the deployed action is the normalised mean."""

import math

import pytest
import torch
from torch import nn

from claw_rl_ros.core.learning.networks import (ActorCritic, EmpiricalNormalization,
                                                gaussian_entropy, gaussian_log_prob, mlp,
                                                select_obs)


def test_mlp_layout_and_activations():
    net = mlp(3, [8, 6], 2, 'tanh')
    kinds = [type(m) for m in net]
    assert kinds == [nn.Linear, nn.Tanh, nn.Linear, nn.Tanh, nn.Linear]
    assert [(m.in_features, m.out_features) for m in net if isinstance(m, nn.Linear)] == \
        [(3, 8), (8, 6), (6, 2)]
    assert [type(m) for m in mlp(4, [], 1, 'elu')] == [nn.Linear]
    assert isinstance(mlp(2, [5], 1, 'leaky_relu')[1], nn.LeakyReLU)


def test_normaliser_forward_is_shift_and_scale_with_eps():
    norm = EmpiricalNormalization(2, eps=0.5)
    norm.mean.copy_(torch.tensor([1.0, -2.0]))
    norm.var.copy_(torch.tensor([4.0, 0.25]))
    y = norm(torch.tensor([[3.0, -1.0]]))
    torch.testing.assert_close(y, torch.tensor([[(3.0 - 1.0) / 2.5, (-1.0 + 2.0) / 1.0]]))
    assert EmpiricalNormalization(3).eps == 0.01


def test_normaliser_first_batch_is_taken_whole_and_empty_batches_are_ignored():
    norm = EmpiricalNormalization(2)
    assert norm.count.dtype == torch.float64 and norm.count.item() == 0
    assert norm.var.tolist() == [1.0, 1.0]
    norm.update(torch.zeros(0, 2))
    assert norm.count.item() == 0 and norm.mean.tolist() == [0.0, 0.0]
    x = torch.tensor([[1.0, 10.0], [3.0, 14.0]])
    norm.update(x)
    assert norm.mean.tolist() == [2.0, 12.0] and norm.var.tolist() == [1.0, 4.0]
    assert norm.count.item() == 2


def test_normaliser_merges_batches_of_different_sizes_exactly():
    g = torch.Generator().manual_seed(0)
    data = torch.randn(23, 2, generator=g, dtype=torch.float64) * 3 + 1
    norm = EmpiricalNormalization(2).double()
    norm.count.zero_()
    # [B, T, dim] input is flattened over all leading dimensions.
    norm.update(data[:5].reshape(5, 1, 2))
    norm.update(data[5:])
    torch.testing.assert_close(norm.mean, data.mean(0))
    torch.testing.assert_close(norm.var, data.var(0, unbiased=False))
    assert norm.count.item() == 23


def test_log_prob_and_entropy_by_hand():
    actions = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    mean = torch.tensor([[0.5, 0.0]], dtype=torch.float64)
    std = torch.tensor([[0.5, 2.0]], dtype=torch.float64)
    # log N = -(a - m)^2 / (2 s^2) - log s - log sqrt(2 pi), summed over dims.
    expected = (-0.5 - math.log(0.5)) + (-1 / 8 - math.log(2.0)) - math.log(2 * math.pi)
    assert gaussian_log_prob(actions, mean, std).item() == pytest.approx(expected, rel=1e-12)
    expected_h = 1.0 + math.log(2 * math.pi) + math.log(0.5) + math.log(2.0)
    assert gaussian_entropy(std).item() == pytest.approx(expected_h, rel=1e-12)
    assert gaussian_log_prob(actions, mean, std).shape == gaussian_entropy(std).shape == (1,)


def test_select_obs_concatenates_in_the_given_order():
    obs = {'policy': torch.tensor([[1.0, 2.0]]), 'privileged': torch.tensor([[3.0]])}
    assert select_obs(obs, ['policy']) is obs['policy']
    assert select_obs(obs, ['privileged', 'policy']).tolist() == [[3.0, 1.0, 2.0]]
    assert select_obs(obs, ['policy', 'privileged']).tolist() == [[1.0, 2.0, 3.0]]


def trained_policy(normalize=True, **kw):
    torch.manual_seed(0)
    policy = ActorCritic(3, 5, 2, actor_hidden_dims=[6], critic_hidden_dims=[7],
                         init_noise_std=0.3, normalize_obs=normalize, **kw)
    return policy


def obs(n=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {'policy': torch.randn(n, 3, generator=g) * 2 + 1,
            'policy_noise_free': torch.randn(n, 3, generator=g) + 4,
            'privileged': torch.randn(n, 2, generator=g) - 1}


def test_actor_critic_defaults_and_sizes():
    policy = trained_policy()
    assert policy.actor_obs_groups == ['policy']
    assert policy.critic_obs_groups == ['policy_noise_free', 'privileged']
    assert policy.actor[0].in_features == 3 and policy.actor[-1].out_features == 2
    assert policy.critic[0].in_features == 5 and policy.critic[-1].out_features == 1
    assert isinstance(policy.actor[1], nn.ELU)
    torch.testing.assert_close(policy.log_std.detach(), torch.full((2,), math.log(0.3)))
    assert isinstance(policy.actor_normalizer, EmpiricalNormalization)
    plain = trained_policy(False)
    assert isinstance(plain.actor_normalizer, nn.Identity)
    assert isinstance(plain.critic_normalizer, nn.Identity)
    assert isinstance(policy.critic_normalizer, EmpiricalNormalization)
    # Defaults: std 1, ELU, normalisers on, no std floor.
    default = ActorCritic(3, 5, 2, actor_hidden_dims=[4], critic_hidden_dims=[4])
    assert default.log_std.tolist() == [0.0, 0.0] and default.min_std == 0.0
    assert isinstance(default.actor[1], nn.ELU)
    assert isinstance(default.actor_normalizer, EmpiricalNormalization)


def test_act_inference_is_the_normalised_mean_and_std_is_exp_log_std():
    policy = trained_policy()
    policy.update_normalization(obs(64, seed=2))
    x = obs()
    norm = policy.actor_normalizer
    assert norm.count.item() == 64 and not torch.allclose(norm.mean, torch.zeros(3))
    by_hand = policy.actor((x['policy'] - norm.mean) / (norm.var.sqrt() + norm.eps))
    mean, std = policy.action_mean_std(x)
    torch.testing.assert_close(policy.act_inference(x), by_hand)
    torch.testing.assert_close(mean, by_hand)
    torch.testing.assert_close(std, torch.full((4, 2), 0.3))
    # Without a normaliser the raw observation goes in.
    raw = trained_policy(False)
    torch.testing.assert_close(raw.act_inference(x), raw.actor(x['policy']))


def test_critic_reads_its_groups_through_its_own_normaliser():
    policy = trained_policy(critic_obs_groups=['privileged', 'policy'],
                            actor_obs_groups=['policy'])
    policy.update_normalization(obs(64, seed=2))
    x = obs()
    joined = torch.cat([x['privileged'], x['policy']], dim=-1)
    norm = policy.critic_normalizer
    torch.testing.assert_close(norm.mean, torch.cat([obs(64, 2)['privileged'],
                                                     obs(64, 2)['policy']], -1).mean(0))
    value = policy.evaluate(x)
    assert value.shape == (4, 1)
    torch.testing.assert_close(value, policy.critic((joined - norm.mean) /
                                                    (norm.var.sqrt() + norm.eps)))


def test_update_normalization_without_normalisers_is_a_no_op():
    policy = trained_policy(False)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    policy.update_normalization(obs())
    assert all(torch.equal(v, before[k]) for k, v in policy.state_dict().items())


def test_sb3_normaliser_puts_eps_inside_the_root_and_clips_at_ten():
    norm = EmpiricalNormalization(3, variant='sb3')
    assert (norm.eps, norm.clip) == (1e-8, 10.0)
    norm.mean.copy_(torch.tensor([1.0, 0.0, 0.0]))
    norm.var.copy_(torch.tensor([4.0, 1e-4, 0.0]))
    y = norm(torch.tensor([[5.0, 0.05, 1.0], [-100.0, -0.05, 0.0]]))
    # (x - mean) / sqrt(var + 1e-8), then clip to +-10 (a zero-variance input saturates).
    expected = torch.tensor([[2.0, 0.05 / math.sqrt(1e-4 + 1e-8), 10.0],
                             [-10.0, -0.05 / math.sqrt(1e-4 + 1e-8), 0.0]])
    torch.testing.assert_close(y, expected)
    # rsl_rl: eps added to the std, no clip; the two differ on a low-variance input.
    rsl = EmpiricalNormalization(3)
    rsl.load_state_dict(norm.state_dict())
    assert rsl(torch.tensor([[0.0, 0.05, 0.0]]))[0, 1].item() == pytest.approx(0.05 / 0.02)
    assert rsl(torch.tensor([[-100.0, 0.0, 0.0]]))[0, 0].item() == pytest.approx(-101 / 2.01)
    with pytest.raises(ValueError, match='normaliser variant .*rsl_rl, sb3'):
        EmpiricalNormalization(2, variant='vecnorm')


def test_orthogonal_init_uses_sb3_gains_and_zero_biases():
    torch.manual_seed(0)
    policy = ActorCritic(5, 7, 3, actor_hidden_dims=[64, 64], critic_hidden_dims=[64, 64],
                         activation='tanh', init='orthogonal')
    for net, out_gain in ((policy.actor, 0.01), (policy.critic, 1.0)):
        linears = [m for m in net if isinstance(m, nn.Linear)]
        for k, layer in enumerate(linears):
            gain = out_gain if k == len(linears) - 1 else math.sqrt(2.0)
            w = layer.weight.detach().double()
            # Orthogonal rows (out <= in) or columns (out > in), scaled by the gain.
            gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
            torch.testing.assert_close(gram, gain ** 2 * torch.eye(gram.shape[0],
                                                                   dtype=torch.float64),
                                       atol=1e-5 * gain ** 2, rtol=0)
            assert not layer.bias.detach().any()
    # Every action mean starts near 0 (0.01 gain); PyTorch's default init does not.
    obs = {'policy': torch.randn(256, 5)}
    assert policy.act_inference(obs).abs().max() < 0.05
    torch.manual_seed(0)
    default = ActorCritic(5, 7, 3, actor_hidden_dims=[64, 64], critic_hidden_dims=[64, 64],
                          activation='tanh')
    assert default.act_inference(obs).abs().max() > 0.1
    with pytest.raises(ValueError, match='init .*torch or orthogonal'):
        ActorCritic(5, 7, 3, actor_hidden_dims=[8], critic_hidden_dims=[8], init='xavier')


def test_one_sample_at_a_time_gives_the_batch_statistics_and_the_critic_shares_them():
    """The per-step path (sb3) merges single samples; a critic reading the same groups gets
    the same statistics, one reading other groups its own."""
    g = torch.Generator().manual_seed(3)
    data = torch.randn(23, 2, generator=g, dtype=torch.float64) * 3 + 1
    norm = EmpiricalNormalization(2).double()
    norm.count.zero_()
    for row in data:
        norm.update(row[None])
    torch.testing.assert_close(norm.mean, data.mean(0))
    torch.testing.assert_close(norm.var, data.var(0, unbiased=False))
    same = ActorCritic(2, 2, 1, actor_hidden_dims=[4], critic_hidden_dims=[4],
                       critic_obs_groups=['policy'], obs_normalizer='sb3')
    other = ActorCritic(2, 4, 1, actor_hidden_dims=[4], critic_hidden_dims=[4],
                        critic_obs_groups=['policy', 'privileged'], obs_normalizer='sb3')
    obs = {'policy': data[:5].float(), 'privileged': data[5:10].float()}
    for policy in (same, other):
        policy.update_normalization(obs)
        torch.testing.assert_close(policy.actor_normalizer.mean, data[:5].float().mean(0))
    torch.testing.assert_close(same.critic_normalizer.mean, same.actor_normalizer.mean)
    assert same.critic_normalizer.count.item() == 5
    torch.testing.assert_close(other.critic_normalizer.mean,
                               torch.cat([data[:5], data[5:10]], 1).float().mean(0))
