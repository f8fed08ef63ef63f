"""The transfer gate's second engine (core/verify/second_engine.py): the student in PyBullet.

Joints are mapped by name; on the same state PyBullet and MuJoCo give the policy the same
observation through the policy node's own code; the rotor inertia makes PyBullet's joint
accelerations MuJoCo's; the PD law is the explicit clipped one with the robot's gains (a swap
of Kp and Kd fails); bad drive rates are refused by name; a trained and an untrained student
run closed loop into the gate's Episode and summary. pybullet is a requirement: no skips.
"""

import dataclasses
import math
from pathlib import Path
import re

import mujoco
import numpy as np
import pybullet
import pytest

from claw_rl_ros.core.control.state_input import imu_arrays, JointOrder, ObservationAssembler
from claw_rl_ros.core.export.onnx_policy import SpecMismatchError
from claw_rl_ros.core.sim.physics import BatchedPhysics
from claw_rl_ros.core.verify.gate_scoring import Episode
from claw_rl_ros.core.verify.second_engine import (BulletWorld, drive_steps_per_control,
                                                   ENGINE, HANGING_HEIGHT, run_episodes,
                                                   summarize)

WALKER = Path(__file__).resolve().parent / 'fixtures' / 'walker.onnx'
PER_JOINT = ('default_joint_pos', 'joint_lower', 'joint_upper', 'effort_limit',
             'velocity_limit', 'kp', 'kd')
# PyBullet keeps its state in single precision: a value read back differs from the one set by
# up to ~1e-7 of its size (gyro 0.5 -> 0.49999996). The observation's terms are O(1) after
# their scales, so 1e-5 is two orders above that noise and far below any convention error
# (a swapped quaternion order or a world-frame gyro is off by O(0.1)).
OBS_TOL = 1e-5


def permuted(robot, order):
    """The robot with its joints listed in another order (every per-joint array with them)."""
    return dataclasses.replace(robot, joint_names=[robot.joint_names[i] for i in order],
                               mirror=None, **{f: getattr(robot, f)[order] for f in PER_JOINT})


def pybullet_joints(world):
    """{joint name: PyBullet index} read from the loaded body itself."""
    c = world.client
    return {pybullet.getJointInfo(world.body, i, physicsClientId=c)[1].decode(): i
            for i in range(pybullet.getNumJoints(world.body, physicsClientId=c))}


def tilted_moving_state(robot):
    """A state far from the default: tilted, turning, moving base; joints off their pose."""
    rng = np.random.default_rng(7)
    quat = np.array([0.95, 0.2, -0.15, 0.1])
    state = {'base_pos': np.array([0.1, -0.2, 0.35]), 'base_quat': quat / np.linalg.norm(quat),
             'base_lin_vel_world': np.array([0.3, -0.2, 0.1]),
             'base_ang_vel_body': np.array([0.5, -0.7, 0.9]),
             'joint_pos': np.clip(robot.default_joint_pos + rng.uniform(-0.2, 0.2, 12),
                                  robot.joint_lower, robot.joint_upper),
             'joint_vel': rng.uniform(-2.0, 2.0, 12)}
    return state


def observation(robot, joint_names, joint_pos, joint_vel, imu_xyzw, gyro):
    """The policy node's observation of one state (JointOrder by name, imu_arrays, the
    robot's own ObservationLayout) with a fixed command, last action and gait phase."""
    pos, vel = JointOrder(robot).joint_arrays(joint_names, joint_pos, joint_vel)
    quat, gyro = imu_arrays(imu_xyzw, gyro)
    assembler = ObservationAssembler(robot)
    assembler.set_command(np.array([0.5, 0.1, -0.2]))
    assembler.advance(np.linspace(-0.5, 0.5, 12))
    return assembler.observe(pos, vel, quat, gyro)


# ----------------------------------------------------------------------------- joint mapping
def test_joints_are_mapped_by_name_whatever_the_spec_order(robot):
    order = [5, 0, 11, 3, 8, 1, 10, 2, 7, 4, 9, 6]
    shuffled = permuted(robot, order)
    with BulletWorld(shuffled, fixed_base=True) as world:
        urdf = pybullet_joints(world)
        assert world.joint_index == {name: urdf[name] for name in shuffled.joint_names}
        assert world.joints != sorted(world.joints)  # not the URDF's order
        # Distinct positions and speeds, set in the shuffled spec order, land on the URDF
        # joint of that name.
        span = shuffled.joint_upper - shuffled.joint_lower
        q = shuffled.joint_lower + span * (np.arange(12) + 1) / 14
        qd = np.arange(12) * 0.1 - 0.55
        world.set_state([0, 0, HANGING_HEIGHT], [1, 0, 0, 0], np.zeros(3), np.zeros(3), q, qd)
        for name, value, speed in zip(shuffled.joint_names, q, qd):
            pos, vel = pybullet.getJointState(world.body, urdf[name],
                                              physicsClientId=world.client)[:2]
            assert pos == pytest.approx(value, abs=1e-6) and vel == pytest.approx(speed,
                                                                                  abs=1e-6)
        state = world.state()
        assert state.joint_names == tuple(shuffled.joint_names)
        np.testing.assert_allclose(state.joint_pos, q, atol=1e-6)
        # The policy node's JointOrder of the original robot puts them back by name.
        pos, _ = JointOrder(robot).joint_arrays(state.joint_names, state.joint_pos,
                                                state.joint_vel)
        np.testing.assert_allclose(pos[order], q, atol=1e-6)
        # Gains and limits follow the names: far targets saturate each joint at its own
        # effort limit (28 N m calves, 18 N m the others).
        q0 = shuffled.default_joint_pos
        far = np.where(shuffled.joint_upper - q0 > q0 - shuffled.joint_lower,
                       shuffled.joint_upper, shuffled.joint_lower)
        world.set_state([0, 0, HANGING_HEIGHT], [1, 0, 0, 0], np.zeros(3), np.zeros(3), q0,
                        np.zeros(12))
        tau = world.drive(far)
        np.testing.assert_array_equal(np.abs(tau), shuffled.effort_limit)
        assert {n: e for n, e in zip(shuffled.joint_names, np.abs(tau))} == \
            {n: e for n, e in zip(robot.joint_names, robot.effort_limit)}


def test_a_model_for_another_joint_order_is_refused(robot, model):
    with pytest.raises(SpecMismatchError, match='joint_names'):
        run_episodes(model, permuted(robot, list(range(11, -1, -1))), duration_s=0.1)


# ------------------------------------------------------------------- parity with MuJoCo
def test_the_observation_of_one_state_matches_mujoco(robot):
    s = tilted_moving_state(robot)
    physics = BatchedPhysics(robot, 1)
    try:
        physics.qpos[0, 0:3], physics.qpos[0, 3:7] = s['base_pos'], s['base_quat']
        physics.qpos[0, physics.qadr] = s['joint_pos']
        # MuJoCo's free joint: world linear velocity, body angular velocity.
        physics.qvel[0, 0:3], physics.qvel[0, 3:6] = s['base_lin_vel_world'], \
            s['base_ang_vel_body']
        physics.qvel[0, physics.vadr] = s['joint_vel']
        # Sensors at this state (mj_forward): no trailing physics step.
        physics.forward(np.array([0]), s['joint_pos'][None])
        mj_quat, mj_gyro, _ = physics.imu()
        mj_obs = observation(robot, robot.joint_names, physics.qpos[0, physics.qadr],
                             physics.qvel[0, physics.vadr], mj_quat[0, [1, 2, 3, 0]],
                             mj_gyro[0])
        mj_body_vel = np.empty(3)
        conj = np.empty(4)
        mujoco.mju_negQuat(conj, s['base_quat'])
        mujoco.mju_rotVecQuat(mj_body_vel, s['base_lin_vel_world'], conj)
    finally:
        physics.close()
    with BulletWorld(robot) as world:
        world.set_state(**s)
        b = world.state()
    pb_obs = observation(robot, b.joint_names, b.joint_pos, b.joint_vel, b.imu_orientation,
                         b.imu_angular_velocity)
    assert mj_obs.shape == pb_obs.shape == (robot.policy_obs.dim,)
    np.testing.assert_allclose(pb_obs, mj_obs, atol=OBS_TOL, rtol=0)
    # The readings themselves (the IMU is the trunk's frame here, turning at 1.2 rad/s).
    np.testing.assert_allclose(b.imu_orientation[[3, 0, 1, 2]], mj_quat[0], atol=1e-6)
    np.testing.assert_allclose(b.imu_angular_velocity, mj_gyro[0], atol=1e-6)
    np.testing.assert_allclose(b.base_lin_vel_body, mj_body_vel, atol=1e-6)
    np.testing.assert_allclose(b.base_ang_vel_body, s['base_ang_vel_body'], atol=1e-6)
    assert b.base_height == pytest.approx(s['base_pos'][2], abs=1e-6)


def joint_accelerations(world, joint):
    """[J] joint and [3] trunk (body axes) accelerations of the free-floating robot at rest in
    the default pose without gravity or joint friction, from a unit torque on ``joint``: the
    first step's velocities / dt (semi-implicit Euler)."""
    c, r = world.client, world.robot
    pybullet.setGravity(0, 0, 0, physicsClientId=c)
    pybullet.setJointMotorControlArray(world.body, world.joints, pybullet.VELOCITY_CONTROL,
                                       forces=[0.0] * 12, physicsClientId=c)
    world.set_state([0, 0, 1.0], [1, 0, 0, 0], np.zeros(3), np.zeros(3), r.default_joint_pos,
                    np.zeros(12))
    tau = np.zeros(12)
    tau[joint] = 1.0
    pybullet.setJointMotorControlArray(world.body, world.joints, pybullet.TORQUE_CONTROL,
                                       forces=tau.tolist(), physicsClientId=c)
    pybullet.stepSimulation(physicsClientId=c)
    state = world.state()
    return state.joint_vel / world.physics_dt, state.base_ang_vel_body / world.physics_dt


def test_the_rotor_inertia_gives_mujocos_joint_accelerations(robot):
    """MuJoCo's armature is on the diagonal of its mass matrix; PyBullet's geared rotors
    (N = 30) must give the same M^-1: within 2 % on the driven joint, 4 % (of that) on the
    others, 10 % on the trunk (the rotors' armature / N couplings that MuJoCo leaves out).
    Without them the joints are up to 6x too quick."""
    physics = BatchedPhysics(robot, 1)
    try:
        model = physics.model
        data = mujoco.MjData(model)
        data.qpos[:] = physics.standing_qpos
        data.qpos[2] = 1.0
        mujoco.mj_forward(model, data)
        full = np.zeros((model.nv, model.nv))
        mujoco.mj_fullM(model, data, full)
        inverse = np.linalg.inv(full)
        vadr = physics.vadr
    finally:
        physics.close()
    assert model.dof_armature[vadr] == pytest.approx(robot.armature)
    with BulletWorld(robot) as geared, BulletWorld(robot, armature=False) as bare:
        for j in range(12):
            ref, ref_base = inverse[vadr, vadr[j]], inverse[3:6, vadr[j]]
            acc, base = joint_accelerations(geared, j)
            assert acc[j] == pytest.approx(ref[j], rel=0.02), robot.joint_names[j]
            assert np.abs(acc - ref).max() < 0.04 * abs(ref[j]), robot.joint_names[j]
            assert np.abs(base - ref_base).max() < 0.10 * np.abs(ref_base).max()
            without, _ = joint_accelerations(bare, j)
            assert without[j] > 1.25 * ref[j]  # no rotor: a lighter joint


# ---------------------------------------------------------------------------- the PD law
def test_the_pd_torque_is_explicit_clipped_and_uses_kp_on_the_error(robot):
    with BulletWorld(robot, fixed_base=True, drive_rate_hz=1000) as world:
        q0 = robot.default_joint_pos
        # Unsaturated: 30 x 0.1 - 0.75 x 2 = 1.5 N m; Kp and Kd swapped: 0.075 - 60 -> -18.
        world.set_state([0, 0, HANGING_HEIGHT], [1, 0, 0, 0], np.zeros(3), np.zeros(3), q0,
                        np.full(12, 2.0))
        pos, vel = world.joint_state()
        tau = world.drive(q0 + 0.1)
        expected = np.clip(robot.kp * (q0 + 0.1 - pos) - robot.kd * vel, -robot.effort_limit,
                           robot.effort_limit)
        np.testing.assert_allclose(tau, expected, atol=1e-9)
        np.testing.assert_allclose(tau, 1.5, atol=1e-4)
        np.testing.assert_array_equal(world.state().joint_effort, tau)
        # Saturated: the farther joint limit is > 0.6 rad away: Kp x error > effort.
        far = np.where(robot.joint_upper - q0 > q0 - robot.joint_lower, robot.joint_upper,
                       robot.joint_lower)
        world.set_state([0, 0, HANGING_HEIGHT], [1, 0, 0, 0], np.zeros(3), np.zeros(3), q0,
                        np.zeros(12))
        tau = world.drive(far + np.sign(far - q0))  # beyond the limits: clamped to them
        np.testing.assert_array_equal(tau, np.sign(far - q0) * robot.effort_limit)
        # The torque acted on the joint of that name: it turns towards its target.
        assert (np.sign(world.joint_state()[1]) == np.sign(far - q0)).all()


def test_a_dc_motor_robot_is_driven_by_its_torque_speed_line(robot):
    dc = dataclasses.replace(robot, actuator=dataclasses.replace(
        robot.actuator, model='dc_motor', saturation_torque=np.full(12, 30.0),
        no_load_speed=np.full(12, 25.0)))
    with BulletWorld(dc, fixed_base=True, drive_rate_hz=1000) as world:
        q0 = robot.default_joint_pos
        # Spinning at 12.5 rad/s towards a target 0.5 rad ahead: the line allows 15 N m.
        q, qd = q0, np.full(12, 12.5)
        tau = world.pd_torque(q0 + 0.5, q, qd)
        np.testing.assert_allclose(tau, np.minimum(robot.kp * 0.5 - robot.kd * 12.5, 15.0))
    net = dataclasses.replace(robot, actuator=dataclasses.replace(robot.actuator,
                                                                  model='network'))
    with pytest.raises(ValueError, match="actuator.model = 'network'.*ideal_pd or dc_motor"):
        BulletWorld(net)


def test_a_hanging_leg_tracks_a_target_step(robot):
    thigh = robot.joint_names.index('FL_thigh_joint')
    with BulletWorld(robot, fixed_base=True, drive_rate_hz=1000) as world:
        world.reset()
        target = robot.default_joint_pos.copy()
        target[thigh] += 0.3
        for _ in range(25):  # 0.5 s: the PD's time constant is ~0.03 s (Kd / Kp)
            world.step(target)
        pos, vel = world.joint_state()
    # The rest error is the leg's weight over Kp (~0.03 rad at most for a 1.3 kg leg on a
    # 0.2 m lever at 30 N m/rad); with Kp and Kd swapped (time constant 40 s) the thigh would
    # not have moved 0.05 rad.
    assert pos[thigh] == pytest.approx(target[thigh], abs=0.04)
    assert np.abs(pos - target).max() < 0.1 and np.abs(vel).max() < 0.05


# ------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize('rate', [0, -1000.0, float('nan'), float('inf'), 333.0, 25.0, 75.0,
                                  True, '1000'])
def test_a_drive_rate_that_does_not_divide_the_control_period_is_refused(robot, rate):
    with pytest.raises(ValueError, match=re.escape(f'drive_rate_hz = {rate!r}')):
        drive_steps_per_control(robot, rate)
    with pytest.raises(ValueError, match='drive_rate_hz'):
        BulletWorld(robot, drive_rate_hz=rate)


def test_drive_rates_that_divide_the_control_period_are_taken(robot):
    assert robot.control_dt == pytest.approx(0.02)
    assert drive_steps_per_control(robot, 1000) == 20
    assert drive_steps_per_control(robot, 1.0 / robot.sim_dt) == robot.decimation
    assert drive_steps_per_control(robot, 50.0) == 1
    with BulletWorld(robot, drive_rate_hz=200) as world:
        assert world.drive_dt == pytest.approx(robot.sim_dt)


def test_the_refusal_names_the_field_and_a_fix(robot):
    with pytest.raises(ValueError) as err:
        drive_steps_per_control(robot, 333.0)
    text = str(err.value)
    assert '6.66 drive steps per control period of 20 ms' in text
    assert 'whole multiple of the control rate 50 Hz' in text
    with pytest.raises(ValueError, match='ground_friction = 0'):
        BulletWorld(robot, ground_friction=0)
    with pytest.raises(ValueError, match='rotor_gear_ratio = 0.5'):
        BulletWorld(robot, rotor_gear_ratio=0.5)


# ---------------------------------------------------------------------- closed loop
def check_episode(episode, robot, steps, settle_steps):
    assert isinstance(episode, Episode)
    done = int(episode.params['steps'])
    assert episode.params['engine'] == ENGINE and 1 <= done <= steps
    assert episode.joint_pos.shape == episode.effort.shape == (done, robot.num_joints)
    if not episode.fell:
        assert done == steps and episode.velocity.shape == (steps - settle_steps + 1, 3)
    for values in (episode.velocity, episode.joint_pos, episode.effort):
        assert np.isfinite(values).all()
    assert (np.abs(episode.effort) <= robot.effort_limit + 1e-9).all()


def test_the_trained_walker_runs_closed_loop_into_the_gate_summary(robot):
    episodes = run_episodes(WALKER, robot, episodes=1, duration_s=2.0, drive_rate_hz=200,
                            seed=3)
    assert len(episodes) == 1
    check_episode(episodes[0], robot, steps=100, settle_steps=50)
    # A trained student stays upright for 2 s (walking quality is the gate's, not this test's).
    assert not episodes[0].fell and episodes[0].params['fault'] == ''
    summary = summarize(episodes, drive_rate_hz=200, command_vx=0.5)
    assert set(summary) == {'engine', 'drive_rate_hz', 'vx_error', 'falls', 'episodes',
                            'fall_rate', 'max_vx_error', 'max_fall_rate', 'passed'}
    assert summary['engine'] == 'pybullet' and summary['episodes'] == 1
    assert summary['falls'] == 0 and math.isfinite(summary['vx_error'])
    assert summary['passed'] == (summary['vx_error'] <= summary['max_vx_error'])
    # The same seed is the same episode (PyBullet is deterministic).
    again = run_episodes(WALKER, robot, episodes=1, duration_s=2.0, drive_rate_hz=200,
                         seed=3)[0]
    np.testing.assert_array_equal(again.joint_pos, episodes[0].joint_pos)


def test_an_untrained_student_runs_at_the_default_drive_rate(robot, model):
    episodes = run_episodes(model, robot, episodes=2, duration_s=1.0, seed=1)
    assert len(episodes) == 2
    for episode in episodes:
        check_episode(episode, robot, steps=50, settle_steps=50)
        assert episode.params['drive_rate_hz'] == '1000.0'
    # Episode i draws its own reset pose.
    assert not np.array_equal(episodes[0].joint_pos[0], episodes[1].joint_pos[0])
    summary = summarize(episodes, drive_rate_hz=1000)
    assert summary['episodes'] == 2 and isinstance(summary['passed'], bool)


def test_the_summary_uses_the_gates_limits():
    upright = Episode(fell=False, velocity=np.array([[0.4, 0.0, 0.0], [0.6, 0.0, 0.0],
                                                     [0.3, 0.0, 0.0]]),
                      joint_pos=np.zeros((3, 12)), effort=np.zeros((3, 12)))
    fallen = Episode(fell=True, velocity=np.zeros((0, 3)), joint_pos=np.zeros((1, 12)),
                     effort=np.zeros((1, 12)))
    # |0.5 - vx| = 0.1, 0.1, 0.2: mean 0.133 <= 0.15, but 1 fall in 2 is not below 10 %.
    summary = summarize([upright, fallen], drive_rate_hz=200)
    assert summary['vx_error'] == pytest.approx(0.4 / 3)
    assert summary['falls'] == 1 and summary['fall_rate'] == 0.5
    assert summary['max_vx_error'] == 0.15 and summary['max_fall_rate'] == 0.1
    assert summary['passed'] is False
    assert summarize([upright], drive_rate_hz=200)['passed'] is True
    assert summarize([fallen], drive_rate_hz=200)['vx_error'] is None
