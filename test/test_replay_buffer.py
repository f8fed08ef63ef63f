"""Replay buffer: wrap-around, unbiased sampling, n-step returns, exact state round trip."""

import pytest
import torch

from claw_rl_ros.core.learning.replay_buffer import ReplayBuffer

DIMS = {'policy': 2, 'privileged': 1}


def fill(buf: ReplayBuffer, steps: int, start: int = 0, dones=None, terminated=None) -> None:
    """Step ``t`` of world ``e`` has reward ``100 t + e`` and obs / action tagged with it."""
    n = buf.num_envs
    for t in range(start, start + steps):
        tag = 100.0 * t + torch.arange(n, dtype=torch.float32)
        obs = {k: tag[:, None].expand(n, d).clone() for k, d in DIMS.items()}
        nxt = {k: v + 0.5 for k, v in obs.items()}
        d = torch.zeros(n) if dones is None else dones(t)
        term = torch.zeros(n) if terminated is None else terminated(t)
        buf.add(obs, tag[:, None].expand(n, 3), tag, term, d, nxt)


def test_wrap_around_keeps_the_newest_rows():
    buf = ReplayBuffer(4, 2, DIMS, 3)
    fill(buf, 6)
    assert len(buf) == 8 and buf.size == 4 and buf.pos == 2
    # Steps 4 and 5 overwrote rows 0 and 1; rows 2, 3 still hold steps 2, 3.
    assert buf.rewards[:, 0].tolist() == [400.0, 500.0, 200.0, 300.0]
    assert buf.obs['policy'][1, 1].tolist() == [501.0, 501.0]
    assert buf.next_obs['privileged'][3, 0].tolist() == [300.5]
    stored = set(buf.sample(4000, torch.Generator().manual_seed(0)).rewards.tolist())
    assert stored == {100.0 * t + e for t in range(2, 6) for e in range(2)}


def test_sampling_is_uniform_over_stored_transitions():
    buf = ReplayBuffer(5, 3, DIMS, 3)
    fill(buf, 7)  # wrapped: 15 transitions of steps 2..6
    draws = 150_000
    rewards = buf.sample(draws, torch.Generator().manual_seed(1)).rewards
    values, counts = torch.unique(rewards, return_counts=True)
    assert len(values) == 15
    expected = draws / 15
    # Chi-square with 14 degrees of freedom: 36.1 is its 0.999 quantile.
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 36.1, counts
    # Before the first wrap only the written rows are drawn, each as often.
    part = ReplayBuffer(5, 3, DIMS, 3)
    fill(part, 2)
    counts = torch.unique(part.sample(60_000, torch.Generator().manual_seed(2)).rewards,
                          return_counts=True)[1]
    assert len(counts) == 6 and counts.min() > 9000 and counts.max() < 11000


def test_samples_keep_obs_action_reward_and_next_obs_together():
    buf = ReplayBuffer(8, 4, DIMS, 3)
    fill(buf, 11)
    s = buf.sample(256, torch.Generator().manual_seed(3))
    assert torch.equal(s.obs['policy'][:, 0], s.rewards)
    assert torch.equal(s.actions[:, 2], s.rewards)
    assert torch.equal(s.next_obs['privileged'][:, 0], s.rewards + 0.5)
    assert torch.equal(s.discounts, torch.full((256,), 0.99))


def test_n_step_returns_stop_at_episode_ends_and_the_head():
    gamma = 0.5
    buf = ReplayBuffer(10, 1, DIMS, 3, n_step=3, gamma=gamma)
    # World 0 times out after step 2 and terminates after step 5.
    fill(buf, 7, dones=lambda t: torch.tensor([float(t in (2, 5))]),
         terminated=lambda t: torch.tensor([float(t == 5)]))
    s = buf._n_step(torch.tensor([0, 1, 2, 3, 4, 5, 6]), torch.zeros(7, dtype=torch.long))
    r = [100.0 * t for t in range(7)]
    assert s.rewards.tolist() == pytest.approx([
        r[0] + gamma * r[1] + gamma ** 2 * r[2], r[1] + gamma * r[2], r[2],
        r[3] + gamma * r[4] + gamma ** 2 * r[5], r[4] + gamma * r[5], r[5], r[6]])
    assert s.discounts.tolist() == pytest.approx([gamma ** k for k in (3, 2, 1, 3, 2, 1, 1)])
    assert s.terminated.tolist() == [0, 0, 0, 1, 1, 1, 0]
    # The bootstrap state is the next obs of the last step taken.
    assert s.next_obs['policy'][:, 0].tolist() == [
        200.5, 200.5, 200.5, 500.5, 500.5, 500.5, 600.5]


def test_n_step_window_does_not_cross_the_write_head_after_wrapping():
    buf = ReplayBuffer(4, 1, DIMS, 3, n_step=3, gamma=1.0)
    fill(buf, 6)  # rows hold steps 4, 5, 2, 3; the head is at row 2
    s = buf._n_step(torch.tensor([2, 3, 0, 1]), torch.zeros(4, dtype=torch.long))
    assert s.rewards.tolist() == [200.0 + 300 + 400, 300.0 + 400 + 500, 400.0 + 500, 500.0]


def test_state_dict_round_trip_resumes_sampling_exactly():
    buf = ReplayBuffer(6, 2, DIMS, 3, n_step=2)
    fill(buf, 9)
    state = buf.state_dict()
    copy = ReplayBuffer(6, 2, DIMS, 3, n_step=2)
    copy.load_state_dict(state)
    fill(buf, 2, start=9)
    fill(copy, 2, start=9)
    a = buf.sample(64, torch.Generator().manual_seed(4))
    b = copy.sample(64, torch.Generator().manual_seed(4))
    for x, y in ((a.rewards, b.rewards), (a.actions, b.actions),
                 (a.next_obs['policy'], b.next_obs['policy'])):
        assert torch.equal(x, y)
    with pytest.raises(ValueError, match='sac.buffer_size'):
        ReplayBuffer(5, 2, DIMS, 3).load_state_dict(state)


@pytest.mark.parametrize('blocks', [[3, 2], [4, 5], [9], [1, 1, 6, 2]])
def test_extend_stores_a_block_of_rows_as_that_many_adds(blocks):
    """The live SAC learner writes whole chunks at once: same rows, head and size as adding
    them one by one, with wrap-around inside a block and blocks larger than the buffer."""
    one_by_one, at_once = ReplayBuffer(4, 2, DIMS, 3), ReplayBuffer(4, 2, DIMS, 3)
    fill(one_by_one, sum(blocks), dones=lambda t: torch.tensor([t % 3 == 0, 0.0]).float(),
         terminated=lambda t: torch.tensor([0.0, t % 4 == 0]).float())
    steps = ReplayBuffer(sum(blocks), 2, DIMS, 3)  # the same rows, recorded to slice blocks
    fill(steps, sum(blocks), dones=lambda t: torch.tensor([t % 3 == 0, 0.0]).float(),
         terminated=lambda t: torch.tensor([0.0, t % 4 == 0]).float())
    start = 0
    for k in blocks:
        rows = slice(start, start + k)
        at_once.extend({g: v[rows] for g, v in steps.obs.items()}, steps.actions[rows],
                       steps.rewards[rows], steps.terminated[rows], steps.dones[rows],
                       {g: v[rows] for g, v in steps.next_obs.items()})
        start += k
    assert (at_once.pos, at_once.size) == (one_by_one.pos, one_by_one.size)
    for name in ('actions', 'rewards', 'terminated', 'dones'):
        assert torch.equal(getattr(at_once, name), getattr(one_by_one, name)), name
    for g in DIMS:
        assert torch.equal(at_once.obs[g], one_by_one.obs[g])
        assert torch.equal(at_once.next_obs[g], one_by_one.next_obs[g])
