"""What the robot's sensors report: encoder offsets, IMU gyro bias and tilt, joint-state and
IMU delays and control jitter (core/sim/sensor_model.py), contact softness, solver and cone:
each checked against the physics' own record, so a delay one step short, an offset left out or
a gait clock that ignores the jitter fails here."""

import mujoco
import numpy as np
import pytest

from claw_rl_ros.core.config import ConfigError, from_dict
from claw_rl_ros.core.math_utils import gravity_in_body, quat_mul, quat_rotate_inverse
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.sim.sensor_model import tilt_quat
from claw_rl_ros.core.sim.sim_session import SimSession

PINNED = {'friction': [1.0, 1.0], 'added_mass': [0.0, 0.0], 'link_mass_scale': [1.0, 1.0],
          'com_offset': [0.0, 0.0], 'motor_strength': [1.0, 1.0], 'init_joint_pos_noise': 0.0,
          'push_interval_s': 0.0, 'action_latency_substeps': [0, 0]}


def make(robot, n=3, noise=False, **randomization):
    cfg = from_dict(EnvConfig, {'num_envs': n, 'noise': {'enabled': noise},
                                'randomization': {**PINNED, **randomization}}, source='test')
    return VecLocomotionEnv(cfg, robot)


def term(robot, obs, name):
    """[N, size] the observation term ``name`` of a policy batch, unscaled."""
    for sl in robot.policy_obs.slices:
        if sl.name == name:
            return obs[:, sl.start:sl.start + sl.size] / np.asarray(sl.scale)
    raise KeyError(name)


def test_encoder_offsets_gyro_bias_and_imu_tilt_reach_the_policy_not_the_critic(robot):
    env = make(robot, encoder_offset=[-0.03, 0.03], imu_gyro_bias=[0.05, 0.05],
               imu_tilt_offset=[0.02, 0.02])
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        obs, *_ = env.step(np.zeros((3, 12)))
    sm, p = env.sensor_model, env.physics
    assert np.ptp(sm.encoder_offset) > 0 and (np.abs(sm.encoder_offset) <= 0.03).all()
    truth = p.qpos[:, p.qadr] - robot.default_joint_pos
    np.testing.assert_allclose(term(robot, obs['policy'], 'joint_pos'),
                               truth + sm.encoder_offset, atol=1e-5)
    quat, gyro, _ = p.imu()
    tilt = tilt_quat(np.full(3, 0.02), np.full(3, 0.02))
    # The gyro reads the rate in the tilted frame, plus the bias.
    np.testing.assert_allclose(term(robot, obs['policy'], 'base_ang_vel'),
                               quat_rotate_inverse(tilt, gyro) + 0.05, atol=1e-5)
    np.testing.assert_allclose(term(robot, obs['policy'], 'projected_gravity'),
                               gravity_in_body(quat_mul(quat, tilt)), atol=1e-5)
    # The noise-free copy is the same sensors; the privileged group has no joint readings.
    np.testing.assert_allclose(obs['policy'], obs['policy_noise_free'])
    env.close()


@pytest.mark.parametrize('delay', [1, 3, 6])
def test_joint_states_and_imu_are_read_exactly_their_delay_old(robot, delay):
    env = make(robot, 2, joint_state_delay_substeps=[delay, delay],
               imu_delay_substeps=[delay - 1, delay - 1])
    env.reset(seed=0)
    p = env.physics
    rng = np.random.default_rng(0)
    joints, imus = [], []
    for _ in range(4):
        obs, *_ = env.step(rng.uniform(-1, 1, (2, 12)))
        pos, _, quat, gyro = p.substep_readings()
        joints += list(pos.transpose(1, 0, 2).copy())
        imus += list(gyro.transpose(1, 0, 2).copy())
    # The last reading is joints[-1]; `delay` physics steps old is joints[-1 - delay].
    np.testing.assert_allclose(term(robot, obs['policy'], 'joint_pos'),
                               joints[-1 - delay] - robot.default_joint_pos, atol=1e-5)
    np.testing.assert_allclose(term(robot, obs['policy'], 'base_ang_vel'),
                               imus[-delay], atol=1e-5)
    assert not np.allclose(joints[-1 - delay], joints[-delay])
    env.close()


def test_control_jitter_moves_the_gait_clock_by_the_time_between_samples(robot):
    env = make(robot, 64, control_jitter_substeps=1, action_latency_substeps=[1, 1])
    env.reset(seed=0)
    sm = env.sensor_model
    seen = set()
    for _ in range(5):
        before = env.gait_phase.copy()
        env.step(np.zeros((64, 12)))
        steps = sm.elapsed_substeps()
        seen |= set(steps.tolist())
        advance = np.remainder(env.gait_phase - before, 1.0)
        ended = env.episode_step == 0
        np.testing.assert_allclose(advance[~ended], (steps * robot.sim_dt / robot.gait_period)
                                   [~ended], atol=1e-12)
    assert seen == {3, 4, 5}
    # A sample taken one step early sends its command one step earlier: with a delay of one
    # physics step, the new targets already drive the first physics step.
    before = env.targets.copy()
    env.step(np.ones((64, 12)))
    first = env.physics._ctrl[:, 0]
    early = sm.early == 1
    assert early.any() and (~early).any()
    np.testing.assert_allclose(first[early], env.targets[early])
    np.testing.assert_allclose(first[~early], before[~early])
    env.close()


def test_default_config_has_no_sensor_model_and_draws_the_same(robot):
    a = make(robot, 4)
    b = make(robot, 4, encoder_offset=[0.0, 0.0], joint_state_delay_substeps=[0, 0])
    assert a.sensor_model is None and b.sensor_model is None
    np.testing.assert_array_equal(a.physics.state, b.physics.state)
    a.close()
    b.close()


def test_contact_softness_solver_and_cone_reach_the_model(robot):
    env = make(robot, 4, contact_timeconst=[0.01, 0.05])
    ts = env.contact_timeconst
    assert ((ts >= 0.01) & (ts <= 0.05)).all() and np.ptp(ts) > 0
    for i in range(4):
        assert (env.physics.models[i].geom_solref[:, 0] == ts[i]).all()
    nominal = make(robot, 1)
    assert (nominal.physics.models[0].geom_solref[:, 0] == pytest.approx(0.02))
    # Torsional friction: the feet's contacts become 4-D with the drawn coefficient.
    ground = nominal.physics.ground_geoms
    assert (nominal.physics.models[0].geom_condim[ground] == 3).all()
    twist = make(robot, 2, torsional_friction=[0.01, 0.02])
    for i in range(2):
        m = twist.physics.models[i]
        assert (m.geom_condim[ground] == 4).all()
        assert (m.geom_friction[ground, 1] == twist.torsional_friction[i]).all()
    twist.step(np.zeros((2, 12)))
    data = mujoco.MjData(twist.physics.models[0])
    mujoco.mj_setState(twist.physics.models[0], data, twist.physics.state[0],
                       mujoco.mjtState.mjSTATE_FULLPHYSICS)
    mujoco.mj_forward(twist.physics.models[0], data)
    assert data.ncon > 0 and set(data.contact.dim[:data.ncon].tolist()) == {4}
    twist.close()
    cfg = from_dict(EnvConfig, {'num_envs': 1, 'cone': 'elliptic', 'solver': 'cg'}, source='t')
    other = VecLocomotionEnv(cfg, robot)
    assert other.physics.model.opt.cone == mujoco.mjtCone.mjCONE_ELLIPTIC
    assert other.physics.model.opt.solver == mujoco.mjtSolver.mjSOL_CG
    other.step(np.zeros((1, 12)))
    for env_ in (env, nominal, other):
        env_.close()


def test_sensor_and_contact_ranges_out_of_bounds_are_refused_by_name():
    for field, value in (('encoder_offset', [-0.6, 0.0]), ('imu_gyro_bias', [0.0, 2.0]),
                         ('imu_tilt_offset', [0.2, 0.1]), ('joint_state_delay_substeps', [0, 21]),
                         ('imu_delay_substeps', [-1, 0]), ('control_jitter_substeps', 5),
                         ('contact_timeconst', [0.001, 0.02]),
                         ('torsional_friction', [0.0, 0.2])):
        with pytest.raises(ConfigError, match=rf'randomization.{field}'):
            from_dict(EnvConfig, {'randomization': {field: value}}, source='test')
    for key, value in (('cone', 'round'), ('solver', 'pgs')):
        with pytest.raises(ConfigError, match=rf'{key}.*{value}.*use one of'):
            from_dict(EnvConfig, {key: value}, source='test')


def test_the_sim_node_session_reports_through_the_same_sensor_model(robot):
    cfg = from_dict(EnvConfig, {'num_envs': 1, 'randomization': {
        **PINNED, 'encoder_offset': [0.03, 0.03], 'imu_gyro_bias': [-0.05, -0.05],
        'joint_state_delay_substeps': [2, 2], 'control_jitter_substeps': 1}}, source='test')
    session = SimSession(robot, cfg, randomization=True)
    for _ in range(3):
        session.step(robot.default_joint_pos)
    pos, _, _, gyro = session.physics.substep_readings()
    out = session.readings()
    np.testing.assert_allclose(out.joint_pos, pos[0, -3] + 0.03)
    assert session.sample_interval() in (0.015, 0.02, 0.025)
    session.close()
