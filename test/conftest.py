"""Shared fixtures, found by pytest without imports: the robot spec, small environments built
from config overrides, a random-weights model, the fake LLM gateway's and the ROS graph's.

Plain helpers (classes, functions) stay in their modules (``ros_helpers``, ``control_models``,
``gateway_server``, ...) and are imported as usual.
"""

import os
from pathlib import Path
import random

import pytest

from claw_rl_ros.core.config import from_dict, merge
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.sim.robot import load_robot
from control_models import good_model
from gateway_server import ENV_VARS, FakeGateway
from ros_helpers import _STARTED, Probe


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


@pytest.fixture(scope='module')
def model(robot, tmp_path_factory):
    """A freshly initialised student (``control_models.good_model``, seed 0), one per module."""
    return good_model(robot, tmp_path_factory.mktemp('m') / 'a.onnx')


# The gateway tests (test_gateway_*.py) use clean_env on every test through
# ``pytestmark = pytest.mark.usefixtures('clean_env')``.
@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No key, config or proxy variables from the developer's shell; CWD and HOME in tmp."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('HOME', str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def gateway() -> FakeGateway:
    """A running FakeGateway (``gateway_server.KEY``), stopped after the test."""
    server = FakeGateway().start()
    yield server
    server.stop()


@pytest.fixture(scope='module')
def ros_env(tmp_path_factory):
    """Environment of an isolated ROS graph for one test module (also set in os.environ): a
    random ``ROS_DOMAIN_ID`` (1-100), ``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST`` and a temp
    ``ROS_HOME``/``ROS_LOG_DIR``; returned as the environment for child processes."""
    home = tmp_path_factory.mktemp('ros_home')
    env = {'ROS_DOMAIN_ID': str(random.SystemRandom().randint(1, 100)),
           'ROS_AUTOMATIC_DISCOVERY_RANGE': 'LOCALHOST', 'ROS_HOME': str(home),
           'ROS_LOG_DIR': str(home / 'log'), 'RMW_IMPLEMENTATION': 'rmw_fastrtps_cpp',
           'PYTHONUNBUFFERED': '1'}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield dict(os.environ)
    # Safety net: no node of this module outlives it, even when a test or fixture failed.
    for proc in list(_STARTED):
        proc.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope='module')
def probe(ros_env):
    """The module's :class:`ros_helpers.Probe`, on the ``ros_env`` graph."""
    p = Probe()
    yield p
    p.close()
