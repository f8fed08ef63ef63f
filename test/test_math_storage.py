"""Rollout storage and GAE against hand-computed cases (time-outs, terminations, lambda limits)."""

import pytest
import torch

from claw_rl_ros.core.learning.storage import compute_gae, RolloutStorage


def gae_by_hand(rewards, values, dones, last_values, gamma, lam):
    """Per world, per step, with Python floats: A_t = sum_k (gamma lam)^k delta_{t+k}."""
    steps, envs = len(rewards), len(rewards[0])
    returns = [[0.0] * envs for _ in range(steps)]
    for n in range(envs):
        for t in range(steps):
            advantage, discount = 0.0, 1.0
            for k in range(t, steps):
                next_value = last_values[n] if k == steps - 1 else values[k + 1][n]
                delta = rewards[k][n] + gamma * next_value * (1 - dones[k][n]) - values[k][n]
                advantage += discount * delta
                if dones[k][n]:
                    break
                discount *= gamma * lam
            returns[t][n] = advantage + values[t][n]
    return returns


def test_gae_two_worlds_four_steps_against_the_sum_of_discounted_deltas():
    rewards = [[1.0, -0.5], [0.2, 1.0], [3.0, 0.0], [-1.0, 2.0]]
    values = [[0.5, 0.1], [0.7, -0.3], [1.5, 0.4], [0.2, 0.9]]
    dones = [[0, 0], [1, 0], [0, 0], [0, 1]]
    last = [2.0, -1.0]
    got = compute_gae(torch.tensor(rewards, dtype=torch.float64),
                      torch.tensor(values, dtype=torch.float64),
                      torch.tensor(dones, dtype=torch.float64),
                      torch.tensor(last, dtype=torch.float64), 0.9, 0.7)
    expected = torch.tensor(gae_by_hand(rewards, values, dones, last, 0.9, 0.7),
                            dtype=torch.float64)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_gae_with_lambda_one_and_gamma_one_is_the_monte_carlo_return():
    rewards = torch.tensor([[1.0], [2.0], [4.0]], dtype=torch.float64)
    values = torch.tensor([[10.0], [20.0], [30.0]], dtype=torch.float64)
    returns = compute_gae(rewards, values, torch.zeros(3, 1, dtype=torch.float64),
                          torch.tensor([8.0], dtype=torch.float64), 1.0, 1.0)
    # The values cancel: G_t = sum of the remaining rewards + V(s_T).
    torch.testing.assert_close(returns, torch.tensor([[15.0], [14.0], [12.0]],
                                                     dtype=torch.float64))


def test_gae_with_lambda_zero_is_the_one_step_td_target():
    rewards = torch.tensor([[1.0], [2.0], [4.0]], dtype=torch.float64)
    values = torch.tensor([[10.0], [20.0], [30.0]], dtype=torch.float64)
    returns = compute_gae(rewards, values, torch.tensor([[0.0], [0.0], [1.0]],
                                                        dtype=torch.float64),
                          torch.tensor([8.0], dtype=torch.float64), 0.5, 0.0)
    # r_t + gamma V(s_{t+1}); the last step ended its episode: no bootstrap from 8.
    torch.testing.assert_close(returns, torch.tensor([[11.0], [17.0], [4.0]],
                                                     dtype=torch.float64))


def test_time_out_bootstrap_enters_through_the_reward_only():
    """A time-out is a done (no flow of the next episode's value) whose reward already holds
    gamma V(s_final): the return equals that of an episode continued with value V(s_final)."""
    gamma, lam, v_final = 0.9, 0.95, 5.0
    values = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    timed_out = compute_gae(torch.tensor([[1.0], [1.0 + gamma * v_final]], dtype=torch.float64),
                            values, torch.tensor([[0.0], [1.0]], dtype=torch.float64),
                            torch.tensor([-100.0], dtype=torch.float64), gamma, lam)
    continued = compute_gae(torch.tensor([[1.0], [1.0]], dtype=torch.float64), values,
                            torch.zeros(2, 1, dtype=torch.float64),
                            torch.tensor([v_final], dtype=torch.float64), gamma, lam)
    torch.testing.assert_close(timed_out, continued)


def filled_storage(steps=3, envs=4, dims=None, actions=2):
    """A storage whose every field encodes (step, world, field) so mixing them shows."""
    dims = dims or {'policy': 5, 'privileged': 2}
    storage = RolloutStorage(steps, envs, dims, actions)
    for t in range(steps):
        base = torch.arange(envs, dtype=torch.float32) + 100 * t

        def col(offset, width=None):
            v = base + offset
            return v[:, None].expand(envs, width).clone() if width else v

        storage.add(obs={k: col(0.1 * (i + 1), d) for i, (k, d) in enumerate(dims.items())},
                    actions=col(0.3, actions), log_probs=col(0.4), values=col(0.5),
                    mu=col(0.6, actions), sigma=col(0.7, actions), rewards=col(0.8),
                    dones=(base % 2 == 1).float())
    return storage


def test_every_buffer_is_preallocated_time_by_worlds():
    s = RolloutStorage(3, 4, {'policy': 5, 'privileged': 2}, 2)
    assert s.step == 0 and (s.num_steps, s.num_envs) == (3, 4)
    assert {k: tuple(v.shape) for k, v in s.obs.items()} == {'policy': (3, 4, 5),
                                                             'privileged': (3, 4, 2)}
    for name in ('actions', 'mu', 'sigma'):
        assert getattr(s, name).shape == (3, 4, 2), name
    for name in ('rewards', 'dones', 'values', 'log_probs', 'returns', 'advantages'):
        assert getattr(s, name).shape == (3, 4), name
        assert getattr(s, name).dtype == torch.float32, name


def test_add_puts_each_field_at_its_step_and_world():
    s = filled_storage()
    assert s.step == 3
    for t in range(3):
        for n in range(4):
            v = 100 * t + n
            assert s.obs['policy'][t, n].tolist() == pytest.approx([v + 0.1] * 5)
            assert s.obs['privileged'][t, n].tolist() == pytest.approx([v + 0.2] * 2)
            assert s.actions[t, n].tolist() == pytest.approx([v + 0.3] * 2)
            assert s.log_probs[t, n].item() == pytest.approx(v + 0.4)
            assert s.values[t, n].item() == pytest.approx(v + 0.5)
            assert s.mu[t, n].tolist() == pytest.approx([v + 0.6] * 2)
            assert s.sigma[t, n].tolist() == pytest.approx([v + 0.7] * 2)
            assert s.rewards[t, n].item() == pytest.approx(v + 0.8)
            assert s.dones[t, n].item() == n % 2


def test_overflow_names_the_fix_and_clear_allows_refilling():
    s = filled_storage()
    with pytest.raises(OverflowError, match=r'^rollout storage is full \(3 steps\); call '
                                            r'clear\(\) after each update$'):
        s.add({'policy': torch.zeros(4, 5), 'privileged': torch.zeros(4, 2)}, torch.zeros(4, 2),
              torch.zeros(4), torch.zeros(4), torch.zeros(4, 2), torch.ones(4, 2), torch.zeros(4),
              torch.zeros(4))
    s.clear()
    assert s.step == 0
    s.add({'policy': torch.full((4, 5), 7.0), 'privileged': torch.zeros(4, 2)},
          torch.zeros(4, 2), torch.zeros(4), torch.zeros(4), torch.zeros(4, 2), torch.ones(4, 2),
          torch.zeros(4), torch.zeros(4))
    assert s.step == 1 and s.obs['policy'][0, 0, 0] == 7.0


def test_compute_returns_fills_advantages_and_normalises_them_over_the_rollout():
    s = filled_storage()
    last = torch.tensor([1.0, 2.0, 3.0, 4.0])
    s.compute_returns(last, 0.9, 0.8, normalize_advantages=False)
    returns = compute_gae(s.rewards, s.values, s.dones, last, 0.9, 0.8)
    torch.testing.assert_close(s.returns, returns)
    torch.testing.assert_close(s.advantages, returns - s.values)
    s.compute_returns(last, 0.9, 0.8)
    raw = returns - s.values
    torch.testing.assert_close(s.advantages, (raw - raw.mean()) / (raw.std() + 1e-8))
    assert abs(s.advantages.mean().item()) < 1e-5
    assert s.advantages.std().item() == pytest.approx(1.0, abs=1e-5)


def test_importance_weights_scale_the_normalised_advantages_and_clear_resets_them():
    s = filled_storage()
    last = torch.tensor([1.0, 2.0, 3.0, 4.0])
    s.compute_returns(last, 0.9, 0.8)
    unweighted = s.advantages.clone()
    total = s.num_steps * s.num_envs
    weights = torch.linspace(0.1, 1.0, total).reshape(s.num_steps, s.num_envs)
    s.weights = weights
    s.compute_returns(last, 0.9, 0.8)
    # Normalised over the rollout first, then weighted (w >= 0 commutes with PPO's min).
    torch.testing.assert_close(s.advantages, unweighted * weights)
    s.clear()
    assert s.weights is None


def test_compute_returns_refuses_a_partial_rollout():
    s = RolloutStorage(3, 2, {'policy': 1}, 1)
    s.add({'policy': torch.zeros(2, 1)}, torch.zeros(2, 1), torch.zeros(2), torch.zeros(2),
          torch.zeros(2, 1), torch.ones(2, 1), torch.zeros(2), torch.zeros(2))
    with pytest.raises(RuntimeError, match='holds 1/3 steps'):
        s.compute_returns(torch.zeros(2), 0.99, 0.95)


def test_mini_batches_keep_fields_aligned_and_cover_each_transition_once_per_epoch():
    s = filled_storage()
    s.compute_returns(torch.zeros(4), 0.9, 0.8, normalize_advantages=False)
    flat_adv = s.advantages.flatten()
    flat_ret = s.returns.flatten()
    batches = list(s.mini_batches(3, 2, torch.Generator().manual_seed(0)))
    assert len(batches) == 6
    for epoch in range(2):
        ids = []
        for b in batches[3 * epoch:3 * epoch + 3]:
            assert b.actions.shape == (4, 2) and b.obs['privileged'].shape == (4, 2)
            # Every field of a row comes from the same transition.
            key = b.actions[:, 0] - 0.3
            for field, offset in (('values', 0.5), ('log_probs', 0.4), ('mu', 0.6),
                                  ('sigma', 0.7)):
                value = getattr(b, field)
                value = value[:, 0] if value.dim() == 2 else value
                torch.testing.assert_close(value - offset, key)
            torch.testing.assert_close(b.obs['policy'][:, 0] - 0.1, key)
            torch.testing.assert_close(b.obs['privileged'][:, 0] - 0.2, key)
            t_n = key.round().long()
            idx = t_n // 100 * 4 + t_n % 100
            torch.testing.assert_close(b.advantages, flat_adv[idx])
            torch.testing.assert_close(b.returns, flat_ret[idx])
            ids += idx.tolist()
        assert sorted(ids) == list(range(12))
    # The two epochs are shuffled differently.
    first = torch.cat([b.log_probs for b in batches[:3]])
    second = torch.cat([b.log_probs for b in batches[3:]])
    assert not torch.equal(first, second)


def test_mini_batches_drop_the_remainder_and_refuse_empty_batches():
    s = filled_storage()
    s.compute_returns(torch.zeros(4), 0.9, 0.8)
    batches = list(s.mini_batches(5, 1, torch.Generator().manual_seed(0)))
    assert [b.actions.shape[0] for b in batches] == [2] * 5
    assert len({round(v.item(), 3) for b in batches for v in b.values}) == 10
    # One transition per mini-batch is still a valid split.
    assert len(list(s.mini_batches(12, 1))) == 12
    with pytest.raises(ValueError, match='12 transitions cannot make 13 mini-batches'):
        next(s.mini_batches(13, 1))


def test_mini_batch_order_comes_from_the_given_generator():
    s = filled_storage()
    s.compute_returns(torch.zeros(4), 0.9, 0.8)

    def order(seed):
        return [b.log_probs.tolist() for b in s.mini_batches(3, 2, torch.Generator()
                                                             .manual_seed(seed))]

    torch.manual_seed(0)
    first = order(5)
    torch.manual_seed(1)
    assert order(5) == first and order(6) != first


def test_obs_flat_keeps_at_most_4096_rows_by_default():
    s = RolloutStorage(41, 100, {'policy': 1}, 1)
    s.obs['policy'][:] = torch.arange(4100, dtype=torch.float32).reshape(41, 100, 1)
    rows = s.obs_flat()['policy'][:, 0]
    assert rows.shape == (4096,) and rows[0] == 0 and rows[-1] == 4099


def test_obs_flat_thins_evenly_and_keeps_the_ends():
    s = filled_storage()
    full = s.obs_flat()
    assert full['policy'].shape == (12, 5)
    torch.testing.assert_close(full['policy'], s.obs['policy'].flatten(0, 1))
    thin = s.obs_flat(max_samples=5)
    # linspace(0, 11, 5) -> rows 0, 2, 5, 8, 11 of the [T * N] flattening.
    rows = [0, 2, 5, 8, 11]
    torch.testing.assert_close(thin['privileged'], s.obs['privileged'].flatten(0, 1)[rows])
    assert thin['policy'][:, 0].tolist() == pytest.approx([0.1, 2.1, 101.1, 200.1, 203.1])
