"""GymVecEnv: Gymnasium envs behind the runner's vec-env contract.

Shapes and dtypes, step-for-step agreement with plain Gymnasium envs through a time-out (final
observation, auto-reset, episode logs), terminations, action clipping, seeding, checkpoints,
bad inputs, and PPO learning through the adapter.
"""

import gymnasium as gym
import numpy as np
import pytest
import torch

from claw_rl_ros.core.learning import checkpoint as ckpt
from claw_rl_ros.core.config import from_dict
from claw_rl_ros.core.sim.gym_vec import GymVecEnv
from claw_rl_ros.core.learning.runner import OnPolicyRunner
from claw_rl_ros.core.learning.train_config import TrainConfig

PENDULUM_LIMIT = 200  # Pendulum-v1's TimeLimit; its dt is 0.05 s


def needs_mujoco_envs():
    """Gymnasium's MuJoCo envs import imageio (the gymnasium[mujoco] extra)."""
    try:
        import imageio  # noqa: F401
    except ImportError as exc:  # a missing dependency fails loudly, never skips
        pytest.fail(f'gymnasium MuJoCo envs need imageio (requirements.txt; make venv): {exc}')


class CountdownEnv(gym.Env):
    """Terminates after ``life`` steps; obs = [steps taken, last action]; reward = action."""

    def __init__(self, life: int = 3):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.life = life
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        a = float(action[0])
        return np.array([self.t, a], np.float32), a, self.t >= self.life, False, {}


class DictObsEnv(CountdownEnv):
    def __init__(self):
        super().__init__()
        self.observation_space = gym.spaces.Dict({'x': gym.spaces.Box(-1.0, 1.0, (2,))})


def countdown_factory(lives, limit):
    """A factory whose i-th env terminates after lives[i] steps, under a TimeLimit."""
    it = iter(lives)
    return lambda: gym.wrappers.TimeLimit(CountdownEnv(next(it)), max_episode_steps=limit)


def random_actions(env, steps, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return scale * rng.uniform(-1.0, 1.0, (steps, env.num_envs, env.num_actions))


def train_config(**runner):
    return from_dict(TrainConfig, {
        'policy': {'actor_hidden_dims': [64, 64], 'critic_hidden_dims': [64, 64]},
        'runner': {'torch_threads': 1, 'seed': 1, **runner}}, source='test')


@torch.no_grad()
def evaluate(policy, env_id, num_envs=8, seed=500):
    """Mean return of each world's first episode under the deterministic policy."""
    env = GymVecEnv(env_id, num_envs, seed=seed)
    obs, _ = env.reset()
    total, done = np.zeros(num_envs), np.zeros(num_envs, dtype=bool)
    while not done.all():
        actions = policy.act_inference({'policy': torch.as_tensor(obs['policy'])}).numpy()
        obs, reward, terminated, truncated, _ = env.step(actions)
        total += reward * ~done
        done |= terminated | truncated
    env.close()
    return float(total.mean())


# ------------------------------------------------------------------------------ the contract
def test_shapes_dtypes_and_extras():
    env = GymVecEnv('Pendulum-v1', num_envs=3, seed=0)
    assert (env.num_envs, env.obs_dim, env.num_actions, env.privileged_dim) == (3, 3, 1, 0)
    obs, extras = env.reset()
    assert extras == {}
    assert obs['policy'].shape == (3, 3) and obs['policy'].dtype == np.float32
    assert obs['privileged'].shape == (3, 0) and obs['privileged'].dtype == np.float32
    obs, reward, terminated, truncated, extras = env.step(np.zeros((3, 1)))
    assert reward.shape == (3,) and reward.dtype == np.float32
    assert terminated.dtype == bool and truncated.dtype == bool
    assert not (terminated | truncated).any()
    assert extras['diverged'] == 0 and not extras['time_outs'].any()
    assert 'final_obs' not in extras and 'episode' not in extras
    assert 'tracking_error' not in extras
    env.close()


def test_matches_plain_gymnasium_envs_through_a_time_out():
    env = GymVecEnv('Pendulum-v1', num_envs=2, seed=7)
    refs = [gym.make('Pendulum-v1') for _ in range(2)]
    obs, _ = env.reset()
    ref_obs = np.stack([r.reset(seed=7 + i)[0] for i, r in enumerate(refs)])
    np.testing.assert_array_equal(obs['policy'], ref_obs)
    ref_return = np.zeros(2)
    for t, actions in enumerate(random_actions(env, PENDULUM_LIMIT, scale=2.0)):
        obs, reward, terminated, truncated, extras = env.step(actions)
        steps = [r.step(a.astype(np.float32)) for r, a in zip(refs, actions)]
        ref_return += [s[1] for s in steps]
        np.testing.assert_allclose(reward, [s[1] for s in steps], rtol=1e-6)
        assert not terminated.any()
        if t < PENDULUM_LIMIT - 1:
            np.testing.assert_array_equal(obs['policy'], np.stack([s[0] for s in steps]))
    # The last step timed out: final_obs is where each world ended, obs its next episode.
    assert truncated.all() and extras['time_outs'].all()
    np.testing.assert_array_equal(extras['final_obs']['policy'], np.stack([s[0] for s in steps]))
    assert extras['final_obs']['privileged'].shape == (2, 0)
    np.testing.assert_array_equal(obs['policy'], np.stack([r.reset()[0] for r in refs]))
    episode = extras['episode']
    np.testing.assert_array_equal(episode['env_ids'], [0, 1])
    np.testing.assert_allclose(episode['return'], ref_return, rtol=1e-5)
    np.testing.assert_allclose(episode['length_s'], [PENDULUM_LIMIT * 0.05] * 2)
    # Counters restarted: the next step finishes nothing.
    assert 'episode' not in env.step(np.zeros((2, 1)))[4]


def test_terminations_are_per_world_and_not_time_outs():
    env = GymVecEnv(countdown_factory(lives=[2, 3], limit=3), num_envs=2)
    env.reset()
    env.step(np.array([[0.5], [0.25]]))
    obs, reward, terminated, truncated, extras = env.step(np.array([[0.5], [0.25]]))
    assert terminated.tolist() == [True, False] and not truncated.any()
    np.testing.assert_array_equal(extras['final_obs']['policy'], [[2, 0.5], [2, 0.25]])
    np.testing.assert_array_equal(obs['policy'], [[0, 0], [2, 0.25]])
    assert extras['episode']['env_ids'].tolist() == [0]
    np.testing.assert_allclose(extras['episode']['return'], [1.0])
    np.testing.assert_allclose(extras['episode']['length_s'], [2.0])  # no dt: steps
    # World 1 terminates on the step its time limit runs out: a termination, not a time-out.
    obs, reward, terminated, truncated, extras = env.step(np.array([[0.5], [0.25]]))
    assert terminated.tolist() == [False, True] and not truncated.any()
    assert not extras['time_outs'].any()
    np.testing.assert_allclose(extras['episode']['return'], [0.75])


def test_actions_are_clipped_to_the_action_space():
    env = GymVecEnv(countdown_factory(lives=[9, 9], limit=9), num_envs=2)
    env.reset()
    obs, reward, *_ = env.step(np.array([[5.0], [-7.0]]))
    np.testing.assert_array_equal(reward, [1.0, -1.0])
    np.testing.assert_array_equal(obs['policy'][:, 1], [1.0, -1.0])


def test_seeding_is_reproducible():
    a, b, c = (GymVecEnv('Pendulum-v1', 2, seed=s) for s in (3, 3, 4))
    first = a.reset()[0]['policy']
    np.testing.assert_array_equal(first, b.reset()[0]['policy'])
    assert not np.array_equal(first, c.reset()[0]['policy'])
    assert not np.array_equal(first[0], first[1])
    for actions in random_actions(a, 10):
        np.testing.assert_array_equal(a.step(actions)[0]['policy'], b.step(actions)[0]['policy'])
    np.testing.assert_array_equal(a.reset(seed=3)[0]['policy'], first)
    c.seed(3)
    np.testing.assert_array_equal(c.reset()[0]['policy'], first)


# ---------------------------------------------------------------------------- checkpoints
def _rollout(env, actions):
    """Everything the runner sees from a sequence of steps."""
    out = []
    for a in actions:
        obs, reward, terminated, truncated, extras = env.step(a)
        final = extras.get('final_obs', {}).get('policy')
        returns = extras['episode']['return'] if 'episode' in extras else None
        out.append((obs['policy'], reward, terminated, truncated, final, returns))
    return out


@pytest.mark.parametrize('env_id', ['Pendulum-v1', 'InvertedPendulum-v5'])
def test_state_round_trip_through_a_checkpoint_file(env_id, tmp_path):
    if env_id.endswith('-v5'):
        needs_mujoco_envs()
    env = GymVecEnv(env_id, 2, seed=1)
    env.reset()
    actions = random_actions(env, 260, seed=2, scale=0.3)
    _rollout(env, actions[:50])
    ckpt.save_checkpoint(tmp_path / 'env.pt', {'env': ckpt.to_torch(env.get_state())})
    expected = _rollout(env, actions[50:])
    assert any(step[4] is not None for step in expected), 'no episode ended after the save'
    restored = GymVecEnv(env_id, 2, seed=99)
    restored.set_state(ckpt.to_numpy(ckpt.load_checkpoint(tmp_path / 'env.pt')['env']))
    for want, got in zip(expected, _rollout(restored, actions[50:])):
        for w, g in zip(want, got):
            np.testing.assert_array_equal(w, g)


def test_state_of_an_env_without_a_known_state_is_refused():
    env = GymVecEnv(countdown_factory(lives=[3], limit=5), num_envs=1)
    env.reset()
    with pytest.raises(NotImplementedError, match='cannot save the state of CountdownEnv'):
        env.get_state()
    with pytest.raises(ValueError, match='saved state has 2 worlds'):
        env.set_state({'worlds': [{}, {}], 'episode_step': [0, 0], 'episode_return': [0, 0]})


def test_runner_resumes_a_gym_run_bit_for_bit(tmp_path):
    cfg = train_config(num_steps_per_env=16, max_iterations=2, save_interval=1)
    first = OnPolicyRunner(cfg, tmp_path / 'a', env=GymVecEnv('Pendulum-v1', 4, seed=1))
    first.learn()
    resumed = OnPolicyRunner(cfg, tmp_path / 'b', env=GymVecEnv('Pendulum-v1', 4, seed=5))
    resumed.load(ckpt.checkpoint_path(tmp_path / 'a', 1))
    resumed.train_one_epoch()
    for key, value in first.policy.state_dict().items():
        torch.testing.assert_close(resumed.policy.state_dict()[key], value, rtol=0, atol=0)


# ------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize('source, error, match', [
    ('CartPole-v1', TypeError, 'action space Discrete.* not a Box'),
    (DictObsEnv, TypeError, 'observation space Dict.*FlattenObservation'),
    (lambda: gym.wrappers.TimeLimit(_unbounded(), 5), ValueError, 'unbounded'),
    (42, TypeError, 'Gymnasium id or a factory'),
])
def test_unsupported_envs_are_refused(source, error, match):
    with pytest.raises(error, match=match):
        GymVecEnv(source, num_envs=1)


def _unbounded():
    env = CountdownEnv()
    env.action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    return env


def test_bad_num_envs_and_actions_are_refused():
    with pytest.raises(ValueError, match='num_envs must be at least 1'):
        GymVecEnv('Pendulum-v1', num_envs=0)
    env = GymVecEnv('Pendulum-v1', num_envs=2)
    env.reset()
    with pytest.raises(ValueError, match=r'expected \(2, 1\)'):
        env.step(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r'worlds \[1\] are not finite'):
        env.step(np.array([[0.0], [np.nan]]))


# -------------------------------------------------------------------------------- learning
def test_ppo_learns_inverted_pendulum_through_the_adapter(tmp_path):
    needs_mujoco_envs()
    cfg = train_config(num_steps_per_env=32, max_iterations=30)
    runner = OnPolicyRunner(cfg, tmp_path, env=GymVecEnv('InvertedPendulum-v5', 8, seed=1))
    before = evaluate(runner.policy, 'InvertedPendulum-v5')
    returns = [runner.train_one_epoch().get('mean_episode_return') for _ in range(30)]
    assert returns[-1] > 3 * returns[0]
    assert evaluate(runner.policy, 'InvertedPendulum-v5') > max(200.0, 10 * before)


def test_ppo_improves_pendulum_through_the_adapter(tmp_path):
    cfg = train_config(num_steps_per_env=100, max_iterations=25)
    cfg.ppo.gamma = 0.95
    runner = OnPolicyRunner(cfg, tmp_path, env=GymVecEnv('Pendulum-v1', 16, seed=1))
    before = evaluate(runner.policy, 'Pendulum-v1')
    summary = runner.learn()
    assert summary['iterations'] == 25 and ckpt.latest_checkpoint(tmp_path).name == 'model_25.pt'
    assert evaluate(runner.policy, 'Pendulum-v1') > before + 100.0
