"""The transfer ramp (randomization.transfer_ramp_steps): a training starts on the nominal robot
and widens the transfer ranges (drive gains, joint friction / damping / rotor inertia, delays,
jitter, sensor offsets, contact softness) linearly to the configured ones; the classic ranges
are full from the start, and evaluation always draws the full ranges."""

import dataclasses

import numpy as np
import pytest

from claw_rl_ros.core.config import ConfigError, from_dict
from claw_rl_ros.core.evaluation.evaluator import eval_env_config
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from claw_rl_ros.core.sim.env_config import EnvConfig, RandomizationConfig
from claw_rl_ros.core.sim.randomization import ramp_fraction, ramped

WIDE = {'kp_scale': [0.7, 1.3], 'kd_scale': [0.7, 1.5], 'joint_friction_scale': [0.5, 5.0],
        'joint_damping_scale': [0.5, 2.0], 'armature_scale': [0.3, 3.0],
        'action_latency_substeps': [0, 8], 'contact_timeconst': [0.01, 0.02],
        'encoder_offset': [-0.03, 0.03], 'imu_gyro_bias': [-0.05, 0.05],
        'imu_tilt_offset': [-0.03, 0.03], 'joint_state_delay_substeps': [0, 2],
        'imu_delay_substeps': [1, 3], 'control_jitter_substeps': 2}


def config(**randomization) -> RandomizationConfig:
    return from_dict(RandomizationConfig, {**WIDE, **randomization}, source='test')


def test_the_fraction_is_linear_in_steps_and_full_without_a_ramp():
    assert ramp_fraction(config(), 0) == 1.0
    ramp = config(transfer_ramp_steps=200)
    assert [ramp_fraction(ramp, k) for k in (0, 50, 100, 200, 10_000)] == \
        [0.0, 0.25, 0.5, 1.0, 1.0]


def test_every_transfer_range_shrinks_about_its_nominal_value(robot):
    dr = config(transfer_ramp_steps=100, friction=[0.3, 1.5], motor_strength=[0.8, 1.2])
    nominal = ramped(dr, robot, 0.0)
    # The nominal robot: scales 1, no offsets, biases, sensor delays or jitter, the model's
    # own contacts, the robot's delay; a range leaving its nominal value out narrows to its
    # nearest end (the IMU delay, 1..3 steps, to 1).
    for name in ('kp_scale', 'kd_scale', 'joint_friction_scale', 'joint_damping_scale',
                 'armature_scale'):
        assert getattr(nominal, name) == (1.0, 1.0), name
    for name in ('encoder_offset', 'imu_gyro_bias', 'imu_tilt_offset'):
        assert getattr(nominal, name) == (0.0, 0.0), name
    assert nominal.contact_timeconst == (0.02, 0.02)
    assert nominal.joint_state_delay_substeps == (0, 0)
    assert nominal.imu_delay_substeps == (1, 1)
    nominal_delay = robot.actuator.nominal_delay_steps
    assert nominal.action_latency_substeps == (nominal_delay, nominal_delay)
    assert nominal.control_jitter_substeps == 0
    # The classic family is full from the start.
    assert (nominal.friction, nominal.motor_strength) == ((0.3, 1.5), (0.8, 1.2))
    half = ramped(dr, robot, 0.5)
    assert half.kp_scale == pytest.approx((0.85, 1.15))
    assert half.joint_friction_scale == pytest.approx((0.75, 3.0))
    assert half.encoder_offset == pytest.approx((-0.015, 0.015))
    assert half.contact_timeconst == pytest.approx((0.015, 0.02))
    assert half.action_latency_substeps == (nominal_delay, round(nominal_delay + 0.5 * (
        8 - nominal_delay)))
    assert half.imu_delay_substeps == (1, 2)
    assert ramped(dr, robot, 1.0) is dr


def make(robot, ramp: int, **randomization) -> VecLocomotionEnv:
    cfg = from_dict(EnvConfig, {'num_envs': 64, 'seed': 3, 'randomization': {
        **WIDE, 'worlds_per_model': 1, 'transfer_ramp_steps': ramp, 'push_interval_s': 0.0,
        **randomization}}, source='test')
    return VecLocomotionEnv(cfg, robot)


def spread(env) -> dict[str, tuple[float, float]]:
    """(min, max) over the worlds of what their resets drew."""
    sm = env.sensor_model
    return {'kp_scale': (env.kp_scale.min(), env.kp_scale.max()),
            'armature_scale': (env.armature_scale.min(), env.armature_scale.max()),
            'latency': (env.latency.min(), env.latency.max()),
            'encoder_offset': (sm.encoder_offset.min(), sm.encoder_offset.max()),
            'joint_delay': (sm.joint_delay.min(), sm.joint_delay.max())}


def test_worlds_reset_during_the_ramp_draw_from_the_narrowed_ranges(robot):
    env = make(robot, ramp=40)
    zeros = np.zeros((64, robot.num_joints))
    try:
        env.reset()
        first = spread(env)
        assert first['kp_scale'] == (1.0, 1.0) and first['armature_scale'] == (1.0, 1.0)
        assert first['encoder_offset'] == (0.0, 0.0) and first['joint_delay'] == (0, 0)
        # Jitter is ramped too: nothing samples early at the start.
        for _ in range(10):
            env.step(zeros)
            assert not env.sensor_model.early.any()
        for _ in range(10):
            env.step(zeros)
        env.reset()  # half way: half the widths
        half = spread(env)
        assert 0.85 <= half['kp_scale'][0] < 0.9 and 1.1 < half['kp_scale'][1] <= 1.15, half
        assert 0.03 * 0.5 >= max(map(abs, half['encoder_offset'])) > 0.01, half
        assert half['latency'][1] <= 4
        for _ in range(20):
            env.step(zeros)
        env.reset()  # past the ramp: the configured ranges
        full = spread(env)
        assert 0.7 <= full['kp_scale'][0] < 0.8 and 1.2 < full['kp_scale'][1] <= 1.3, full
        assert full['latency'] == (0, 8) and full['joint_delay'] == (0, 2), full
        assert env.common_step_counter == 40
    finally:
        env.close()


def test_the_step_count_is_part_of_the_env_state(robot):
    env, other = make(robot, ramp=100), make(robot, ramp=100)
    try:
        env.reset()
        for _ in range(30):
            env.step(np.zeros((64, robot.num_joints)))
        other.reset()
        other.set_state(env.get_state())
        assert other.common_step_counter == 30
        assert other.randomization_now() == env.randomization_now() != \
            other.cfg.randomization
    finally:
        env.close()
        other.close()


def test_evaluation_draws_the_full_ranges():
    cfg = from_dict(EnvConfig, {'randomization': {**WIDE, 'transfer_ramp_steps': 500}},
                    source='test')
    evaluated = eval_env_config(cfg, episodes=4, command=None, seed=0)
    assert evaluated.randomization.transfer_ramp_steps == 0
    assert dataclasses.replace(evaluated.randomization, transfer_ramp_steps=500,
                               worlds_per_model=1) == \
        dataclasses.replace(cfg.randomization, worlds_per_model=1)


@pytest.mark.parametrize('value', [-1, 'abc', 2.5, 20_000_000])
def test_a_bad_ramp_is_refused_by_name(value):
    with pytest.raises(ConfigError, match='transfer_ramp_steps'):
        from_dict(EnvConfig, {'randomization': {'transfer_ramp_steps': value}}, source='test')
