"""Shared fixtures: the robot spec and small environments built from config overrides."""

import pytest

from claw_rl_ros.core.config import from_dict, merge
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.sim.robot import load_robot


@pytest.fixture(scope='session')
def robot():
    return load_robot('claw_quadruped')


@pytest.fixture
def make_env(robot):
    """make_env(num_envs=4, **overrides) -> VecLocomotionEnv, closed after the test."""
    envs = []

    def factory(num_envs=4, **overrides):
        cfg = from_dict(EnvConfig, merge({'num_envs': num_envs}, overrides), source='test')
        env = VecLocomotionEnv(cfg, robot)
        envs.append(env)
        return env

    yield factory
    for env in envs:
        env.close()
