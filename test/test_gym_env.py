"""Gymnasium adapter: passes the official env checker and follows the episode API."""

import gymnasium as gym
from gymnasium.utils.env_checker import check_env
import numpy as np
import pytest

from claw_rl_ros.core.sim.gym_env import ClawLocomotionGymEnv, ENV_ID, register


def test_passes_gymnasium_check_env():
    env = ClawLocomotionGymEnv()
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()


def test_registered_env_runs_an_episode_to_its_time_out():
    register()
    env = gym.make(ENV_ID, env_cfg={'episode_length_s': 0.5, 'randomization': {'enabled': False}})
    obs, _ = env.reset(seed=3)
    assert obs.shape == (47,) and env.action_space.shape == (12,)
    steps = 0
    while True:
        obs, reward, terminated, truncated, info = env.step(np.zeros(12, np.float32))
        steps += 1
        assert np.isfinite(obs).all() and isinstance(reward, float)
        if terminated or truncated:
            break
    assert truncated and not terminated and steps == 25
    assert info['episode']['length_s'] == pytest.approx(0.5)
    env.close()


def test_privileged_observation_option_and_batch_guard():
    env = ClawLocomotionGymEnv(include_privileged=True)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (47 + env.env.privileged_dim,)
    env.close()
    from claw_rl_ros.core.sim.env_config import EnvConfig
    with pytest.raises(ValueError, match='runs one world'):
        ClawLocomotionGymEnv(EnvConfig(num_envs=2))
