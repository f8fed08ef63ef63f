"""SimSession: the sim node's single world (standing, IMU sensors, timeout hold, reset, DR)."""

import numpy as np
import pytest

from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.sim.sim_session import SimSession


@pytest.fixture
def session(robot):
    sessions = []

    def make(**kwargs):
        s = SimSession(robot, EnvConfig(num_envs=1), **kwargs)
        sessions.append(s)
        return s
    yield make
    for s in sessions:
        s.close()


def test_default_pose_stands_and_imu_sensors_agree_with_the_base(session, robot):
    sim = session()
    start = sim.readings()
    np.testing.assert_allclose(start.imu_quat, [1, 0, 0, 0], atol=1e-9)
    for _ in range(100):  # 2 s holding q0
        assert not sim.step(sim.active_targets(0.0))
    r = sim.readings()
    assert r.base_pos[2] > 0.18 and sim.falls == 0
    np.testing.assert_allclose(r.joint_pos, robot.default_joint_pos, atol=0.1)
    # The IMU site sits on the trunk frame: its sensors equal the base's own orientation/rate.
    np.testing.assert_allclose(r.imu_quat, r.base_quat, atol=1e-3)
    np.testing.assert_allclose(r.imu_gyro, r.base_ang_vel, atol=1e-3)
    assert r.imu_acc[2] == pytest.approx(9.81, abs=0.3)  # standing still: specific force = g
    assert r.time == pytest.approx(100 * robot.control_dt)


def test_targets_move_joints_and_time_out_to_the_default_pose(session, robot):
    sim = session(command_timeout_s=0.1)
    q0 = robot.default_joint_pos
    target = q0.copy()
    target[1] += 0.3
    sim.set_targets(target, now=0.0)
    np.testing.assert_array_equal(sim.active_targets(0.05), target)
    assert not sim.timed_out
    for _ in range(25):
        sim.step(sim.active_targets(0.05))
    assert sim.readings().joint_pos[1] == pytest.approx(target[1], abs=0.1)
    np.testing.assert_array_equal(sim.active_targets(0.2), q0)
    assert sim.timed_out
    way_out = q0 + 100.0
    sim.set_targets(way_out, now=1.0)
    np.testing.assert_array_equal(sim.active_targets(1.0), robot.joint_upper)  # clamped


def test_reset_fall_detection_and_switchable_randomisation(session, robot):
    sim = session()
    sim.physics.qpos[0, 3:7] = [np.sqrt(0.5), np.sqrt(0.5), 0, 0]  # rolled 90 deg: a fall
    assert sim.step(sim.active_targets(0.0)) and sim.falls == 1
    sim.reset()
    assert sim.readings().base_pos[2] == pytest.approx(robot.init_base_height)
    plain = session(seed=1)
    rand = session(seed=1, randomization=True, pushes=True, noise=True)
    assert rand.physics.models[0].geom_friction[rand.physics.floor_geom, 0] != \
        plain.physics.models[0].geom_friction[plain.physics.floor_geom, 0]
    a, b = plain.readings(), rand.readings()
    assert np.abs(a.joint_pos - b.joint_pos).max() > 1e-4  # reset noise + sensor noise
    for _ in range(round(8.0 / robot.control_dt)):
        rand.step(rand.active_targets(0.0))
    assert rand.pushes_done == 1 and plain.pushes_done == 0
