"""Actuator models (ideal_pd, dc_motor, network), the delay line and the drive and joint
parameters randomised per world: each checked against its formula, so breaking the physics
on purpose (the delay one step short, Kp and Kd swapped, the torque-speed line ignored, the
network's history in the wrong order) fails here."""

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
from onnx import helper, TensorProto
import pytest

from claw_rl_ros.core.config import ConfigError, from_dict, load_yaml
from claw_rl_ros.core import paths
from claw_rl_ros.core.sim import scene
from claw_rl_ros.core.sim.actuator import (actuator_net_metadata, DcMotor, LearnedActuator,
                                           make_actuator)
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.sim.physics import BatchedPhysics
from claw_rl_ros.core.sim.robot import spec_from_config
from claw_rl_ros.core.sim.robot_spec import ActuatorSpec, RobotConfig

PINNED = {'friction': [1.0, 1.0], 'added_mass': [0.0, 0.0], 'link_mass_scale': [1.0, 1.0],
          'com_offset': [0.0, 0.0], 'motor_strength': [1.0, 1.0], 'init_joint_pos_noise': 0.0,
          'init_base_vel_noise': 0.0, 'push_interval_s': 0.0, 'action_latency_substeps': [0, 0]}


def with_actuator(robot, model, *, saturation=None, speed=None, network=None, delay=(0, 0)):
    sat = robot.effort_limit.copy() if saturation is None else np.full(12, saturation)
    w0 = robot.velocity_limit.copy() if speed is None else np.full(12, speed)
    return dataclasses.replace(robot, actuator=ActuatorSpec(model, sat, w0, delay, network))


def robot_yaml(tmp_path, **actuator):
    """A copy of the claw robot's YAML with ``actuator`` fields, loaded as a RobotConfig."""
    raw = load_yaml(paths.config_path('robots/claw_quadruped.yaml'))['robot']
    raw['model_file'] = str(paths.share_dir() / raw['model_file'])
    raw['actuator'] = {**raw.get('actuator', {}), **actuator}
    return from_dict(RobotConfig, raw, source=str(tmp_path / 'r.yaml'), prefix='robot')


def make(robot, n=2, **randomization):
    cfg = from_dict(EnvConfig, {'num_envs': n, 'randomization': {**PINNED, **randomization}},
                    source='test')
    return VecLocomotionEnv(cfg, robot)


def linear_actuator_net(path, weights, history, dt=0.005):
    """An ONNX actuator network torque = history @ weights (weights [2 H])."""
    w = helper.make_tensor('w', TensorProto.FLOAT, [2 * history, 1],
                           np.asarray(weights, np.float32).tolist())
    graph = helper.make_graph(
        [helper.make_node('MatMul', ['history', 'w'], ['torque'])], 'net',
        [helper.make_tensor_value_info('history', TensorProto.FLOAT, ['B', 2 * history])],
        [helper.make_tensor_value_info('torque', TensorProto.FLOAT, ['B', 1])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid('', 17)])
    for key, value in actuator_net_metadata(history, dt).items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(model, str(path))
    return Path(path)


# ------------------------------------------------------------------------------ the delay line
@pytest.mark.parametrize('latency', [0, 1, 3, 4, 5, 8, 9])
def test_each_target_reaches_the_motors_exactly_latency_physics_steps_late(robot, latency):
    p = BatchedPhysics(robot, 2, max_delay_steps=9)
    held = np.full((2, 12), -1.0)
    p.hold(np.arange(2), held)
    lat = np.array([latency, 0])
    for k in range(6):
        ctrl = p.delayed_ctrl(np.full((2, 12), float(k)), lat)
        for s in range(4):
            # Physics step t = 4 k + s sees the command of control step floor((t - L) / 4).
            given = (4 * k + s - latency) // 4
            assert ctrl[0, s, 0] == (given if given >= 0 else -1.0), (k, s)
            assert ctrl[1, s, 0] == k
    p.close()


def test_a_delay_over_the_config_maximum_is_clamped_to_the_line(robot):
    p = BatchedPhysics(robot, 1, max_delay_steps=2)
    p.hold(np.arange(1), np.zeros((1, 12)))
    ctrl = p.delayed_ctrl(np.ones((1, 12)), np.array([50]))
    assert ctrl[0, :, 0].tolist() == [0.0, 0.0, 1.0, 1.0]
    p.close()


def test_env_state_round_trip_keeps_a_delay_over_a_period(robot):
    env = make(robot, 3, action_latency_substeps=[5, 7])
    env.reset(seed=0)
    rng = np.random.default_rng(1)
    for _ in range(3):
        env.step(rng.uniform(-1, 1, (3, 12)))
    saved = env.get_state()
    actions = rng.uniform(-1, 1, (4, 3, 12))
    first = [env.step(a)[0]['policy'] for a in actions]
    env.set_state(saved)
    again = [env.step(a)[0]['policy'] for a in actions]
    np.testing.assert_array_equal(np.array(first), np.array(again))
    env.close()


# ------------------------------------------------------------------------ drive gains, ideal_pd
def torque_at_first_substep(env, targets):
    """[N, J] the actuator torques MuJoCo applied in the first physics step of one env step."""
    lo, hi = env.physics.sensors.joint_torque
    env.step(np.zeros((env.num_envs, 12)), targets)
    return env.physics.sensordata[:, 0, lo:hi].copy()


def test_kp_and_kd_are_drawn_apart_and_reach_the_drive(robot):
    env = make(robot, 2, kp_scale=[1.5, 1.5], kd_scale=[0.5, 0.5])
    env.reset(seed=0)
    p = env.physics
    m = p.models[0]
    np.testing.assert_allclose(m.actuator_gainprm[:, 0], 1.5 * robot.kp)
    np.testing.assert_allclose(m.actuator_biasprm[:, 1:3],
                               np.stack([-1.5 * robot.kp, -0.5 * robot.kd], 1))
    # The torque law with a moving joint: Kp' (target - q) - Kd' qd, not the other way round.
    p.qvel[:, p.vadr] = 3.0
    q, qd = p.qpos[:, p.qadr].copy(), p.qvel[:, p.vadr].copy()
    targets = q + 0.05
    tau = torque_at_first_substep(env, targets)
    expected = np.clip(1.5 * robot.kp * 0.05 - 0.5 * robot.kd * qd, -robot.effort_limit,
                       robot.effort_limit)
    np.testing.assert_allclose(tau, expected, atol=1e-9)
    # Drawn per joint and per world within the ranges.
    env2 = make(robot, 8, kp_scale=[0.7, 1.0], kd_scale=[1.0, 1.5])
    assert env2.kp_scale.shape == (8, 12) and np.ptp(env2.kp_scale[0]) > 0
    assert ((env2.kp_scale >= 0.7) & (env2.kp_scale <= 1.0)).all()
    assert ((env2.kd_scale >= 1.0) & (env2.kd_scale <= 1.5)).all()
    for i in range(8):
        np.testing.assert_allclose(env2.physics.models[i].actuator_biasprm[:, 2],
                                   -robot.kd * env2.kd_scale[i])
    env.close()
    env2.close()


def test_joint_friction_damping_and_armature_are_randomised_per_joint(robot):
    env = make(robot, 6, joint_friction_scale=[0.0, 5.0], joint_damping_scale=[0.5, 2.0],
               armature_scale=[0.3, 3.0])
    p = env.physics
    nominal = p.model
    assert nominal.dof_armature[p.vadr] == pytest.approx(np.full(12, robot.armature))
    for i in range(6):
        m = p.models[i]
        np.testing.assert_allclose(m.dof_frictionloss[p.vadr],
                                   nominal.dof_frictionloss[p.vadr] * env.frictionloss_scale[i])
        np.testing.assert_allclose(m.dof_damping[p.vadr],
                                   nominal.dof_damping[p.vadr] * env.joint_damping_scale[i])
        np.testing.assert_allclose(m.dof_armature[p.vadr],
                                   robot.armature * env.armature_scale[i])
    assert ((env.armature_scale >= 0.3) & (env.armature_scale <= 3.0)).all()
    assert np.ptp(env.frictionloss_scale[:, 0]) > 0 and np.ptp(env.armature_scale[0]) > 0
    # The base joint (free) keeps its own parameters.
    assert (p.models[0].dof_armature[:6] == nominal.dof_armature[:6]).all()
    env.close()


def test_unset_per_joint_ranges_cost_no_random_numbers(robot):
    """A config without the new ranges replays the draws it made before they existed."""
    a, b = make(robot, 4), make(robot, 4, kp_scale=[1.0, 1.0], armature_scale=[1.0, 1.0])
    np.testing.assert_array_equal(a.friction, b.friction)
    np.testing.assert_array_equal(a.physics.state, b.physics.state)
    a.close()
    b.close()


# -------------------------------------------------------------------------------- dc_motor
def test_dc_motor_torque_follows_the_speed_line():
    motor = DcMotor(SimpleNamespace(effort_limit=np.array([20.0]), actuator=SimpleNamespace(
        saturation_torque=np.array([30.0]), no_load_speed=np.array([25.0]))))
    kp, kd = np.array([[30.0]]), np.array([[0.75]])

    def tau(error, qd):
        return motor.torque(np.array([[error]]), np.array([[qd]]), kp, kd)[0, 0]

    # Standing still: the PD law within the effort limit.
    assert tau(0.1, 0.0) == pytest.approx(3.0)
    assert tau(5.0, 0.0) == pytest.approx(20.0)
    # Spinning along the torque: at most 30 (1 - qd / 25); against it the full effort.
    assert tau(5.0, 12.5) == pytest.approx(15.0)
    assert tau(5.0, 25.0) == pytest.approx(0.0)
    assert tau(5.0, -10.0) == pytest.approx(20.0)
    assert tau(-5.0, -12.5) == pytest.approx(-15.0)
    assert tau(-5.0, 10.0) == pytest.approx(-20.0)
    # Past the no-load speed the back-EMF brakes: 30 (1 - 40 / 25) = -18 N m.
    assert tau(5.0, 40.0) == pytest.approx(-18.0)
    # Within the lines the PD law is untouched, damping included.
    assert tau(0.1, 2.0) == pytest.approx(3.0 - 1.5)


def test_dc_motor_in_the_physics_applies_the_line_at_every_physics_step(robot):
    dc = with_actuator(robot, 'dc_motor', saturation=30.0, speed=25.0)
    env = make(dc, 2)
    env.reset(seed=0)
    p = env.physics
    # Inside MuJoCo's step: the PD actuators, then the back-EMF dampers (no explicit path).
    assert p.actuator is None and p.model.nu == 24
    np.testing.assert_allclose(p.model.actuator_biasprm[12:, 2], -30.0 / 25.0)
    p.qvel[:, p.vadr] = 12.5
    q = p.qpos[:, p.qadr].copy()
    targets = np.clip(q + 1.0, robot.joint_lower, robot.joint_upper)
    tau = torque_at_first_substep(env, targets)
    # The PD law up to the line: 30 (1 - 12.5 / 25) = 15 N m along the motion (under the
    # 18/28 N m efforts: the line, not the clip, limits every joint).
    pd = robot.kp * (targets - q) - robot.kd * 12.5
    np.testing.assert_allclose(tau, np.minimum(pd, 15.0), atol=1e-9)
    assert np.isclose(tau, 15.0).sum() >= 12
    # Every physics step of the period ran with the state's own velocity: torques change.
    lo, hi = p.sensors.joint_torque
    assert np.ptp(p.sensordata[0, :, lo:hi], axis=0).max() > 0.1
    # Braking (spinning against the torque) the line would allow more than the effort limit;
    # the joint's clamp holds it there.
    env.reset(seed=0)
    p.qvel[:, p.vadr] = -10.0
    q = p.qpos[:, p.qadr].copy()
    tau = torque_at_first_substep(env, np.clip(q + 1.0, robot.joint_lower, robot.joint_upper))
    far = (robot.joint_upper - q) > 0.5
    np.testing.assert_allclose(tau[far], np.broadcast_to(robot.effort_limit, q.shape)[far])
    # Kp and Kd drawn apart reach the PD actuators; the back-EMF stays the motor's.
    env2 = make(dc, 2, kp_scale=[0.5, 0.5], kd_scale=[2.0, 2.0])
    m = env2.physics.models[0]
    np.testing.assert_allclose(m.actuator_gainprm[:12, 0], 0.5 * robot.kp)
    np.testing.assert_allclose(m.actuator_biasprm[:12, 2], -(2.0 * robot.kd - 1.2))
    np.testing.assert_allclose(m.actuator_biasprm[12:, 2], -1.2)
    env.close()
    env2.close()


def test_dc_motor_is_slower_than_the_ideal_actuator_on_a_fast_swing(robot):
    """Legs swung hard in the air: the torque-speed line (no-load speed 6 rad/s) keeps the
    joints slow, where the ideal PD actuator keeps its full torque (~30 rad/s)."""
    top = {}
    for name, r in (('ideal', robot), ('dc', with_actuator(robot, 'dc_motor', speed=6.0))):
        env = make(r, 1)
        env.reset(seed=0)
        p = env.physics
        speeds = []
        for _ in range(10):
            p.qpos[0, 0:3] = [0.0, 0.0, 1.0]  # held high: the legs swing freely
            p.qvel[0, 0:6] = 0.0
            targets = np.clip(p.qpos[:, p.qadr] + 2.0, robot.joint_lower, robot.joint_upper)
            env.step(np.zeros((1, 12)), targets)
            speeds.append(np.abs(p.qvel[0, p.vadr]).max())
        top[name] = max(speeds)
        env.close()
    assert top['dc'] < 12.0 and top['ideal'] > 3 * top['dc'], top


# -------------------------------------------------------------------------------- network
def test_network_actuator_reads_its_history_newest_first(robot, tmp_path):
    h = 3
    weights = np.zeros(2 * h)
    weights[h - 1] = 4.0  # 4 x the oldest position error
    weights[h] = -1.0  # minus the newest velocity
    net = linear_actuator_net(tmp_path / 'net.onnx', weights, h)
    act = LearnedActuator(with_actuator(robot, 'network', network=net), 1)
    act.reset(np.arange(1), np.full((1, 12), 0.5), np.zeros((1, 12)))
    kp = np.zeros((1, 12))
    out = [act.torque(np.full((1, 12), float(e)), np.full((1, 12), 0.1 * e), kp, kp)[0, 0]
           for e in (1, 2, 3, 4)]
    # Oldest error: the reset's 0.5 twice, then 1 and 2.
    assert out == pytest.approx([2.0 - 0.1, 2.0 - 0.2, 4.0 - 0.3, 8.0 - 0.4])


def test_a_linear_pd_network_drives_like_the_pd_law(robot, tmp_path):
    """A network that is Kp e - Kd qd moves the robot as the PD law computed outside it."""
    kp, kd = float(robot.kp[0]), float(robot.kd[0])
    net = linear_actuator_net(tmp_path / 'pd.onnx', [kp, -kd], 1)
    env = make(with_actuator(robot, 'network', network=net), 1)
    env.reset(seed=0)
    p = env.physics
    q, qd = p.qpos[:, p.qadr].copy(), p.qvel[:, p.vadr].copy()
    targets = q + 0.1
    tau = torque_at_first_substep(env, targets)
    np.testing.assert_allclose(tau, np.clip(kp * 0.1 - kd * qd, -robot.effort_limit,
                                            robot.effort_limit), atol=1e-4)
    env.close()


def test_network_files_that_do_not_fit_are_refused_by_name(robot, tmp_path):
    good = linear_actuator_net(tmp_path / 'good.onnx', [1.0, 0.0], 1)

    def refused(path, match):
        with pytest.raises(ConfigError, match=match):
            make_actuator(with_actuator(robot, 'network', network=path), 1)

    refused(linear_actuator_net(tmp_path / 'dt.onnx', [1.0, 0.0], 1, dt=0.001),
            r'actuator.network_file.*0.001 s.*0.005 s')
    junk = tmp_path / 'junk.onnx'
    junk.write_bytes(b'not a model')
    refused(junk, r'actuator.network_file.*not a loadable ONNX model')
    bare = onnx.load(str(good))
    del bare.metadata_props[:]
    onnx.save(bare, str(tmp_path / 'bare.onnx'))
    refused(tmp_path / 'bare.onnx', r"no valid 'claw_rl_actuator' metadata")
    wrong = onnx.load(str(good))
    wrong.metadata_props[0].value = json.dumps({'history': 2, 'physics_dt': 0.005})
    onnx.save(wrong, str(tmp_path / 'wrong.onnx'))
    refused(tmp_path / 'wrong.onnx', r"expected input 'history' \[B, 4\]")
    assert make_actuator(with_actuator(robot, 'network', network=good), 3).window.shape == \
        (3, 12, 2)


# ------------------------------------------------------------------------- robot YAML fields
def test_robot_yaml_actuator_fields_resolve_and_bad_ones_are_refused(robot, tmp_path):
    spec = spec_from_config(robot_yaml(tmp_path, model='dc_motor', saturation_torque=24.0),
                            str(tmp_path / 'r.yaml'), sizes=False)
    assert spec.actuator.model == 'dc_motor'
    np.testing.assert_allclose(spec.actuator.saturation_torque, 24.0)
    np.testing.assert_allclose(spec.actuator.no_load_speed, robot.velocity_limit)
    meta = spec.to_metadata()['actuator']
    assert meta['model'] == 'dc_motor' and meta['armature'] == robot.armature[0]
    assert meta['saturation_torque'] == [24.0] * 12
    # The actuator is shown in the metadata, not a reason to refuse a model.
    assert robot.mismatches(spec.to_metadata()) == []
    assert robot.to_metadata()['actuator'] == {'model': 'ideal_pd', 'armature': 0.01,
                                               'delay_steps': [0, 2]}

    def refused(match, **fields):
        with pytest.raises(ConfigError, match=match):
            spec_from_config(robot_yaml(tmp_path, **fields), str(tmp_path / 'r.yaml'),
                             sizes=False)

    refused(r"actuator.model: 'dcmotor' is not an actuator model; use one of ideal_pd, "
            r'dc_motor, network', model='dcmotor')
    refused(r'actuator.network_file: empty', model='network')
    refused(r"actuator.network_file: file not found: 'nowhere.onnx'", model='network',
            network_file='nowhere.onnx')
    refused(r"actuator.network_file: 'x.onnx' is given but actuator.model is 'ideal_pd'",
            network_file='x.onnx')
    for field, value in (('delay_steps', [0, 101]), ('delay_steps', [3, 1]),
                         ('saturation_torque', -1.0), ('no_load_speed', 0.0),
                         ('no_load_speed', 0.05), ('saturation_torque', float('nan'))):
        with pytest.raises(ConfigError, match=rf'actuator.{field}'):
            robot_yaml(tmp_path, **{field: value})


def test_env_ranges_out_of_bounds_are_refused_by_name():
    for field, value in (('kp_scale', [0.0, 1.0]), ('kd_scale', [1.0, 11.0]),
                         ('joint_friction_scale', [-1.0, 1.0]), ('armature_scale', [2.0, 1.0]),
                         ('joint_damping_scale', [0.0, 101.0]), ('motor_strength', [1.0, 20.0]),
                         ('action_latency_substeps', [0, 101])):
        with pytest.raises(ConfigError, match=rf'randomization.{field}'):
            from_dict(EnvConfig, {'randomization': {field: value}}, source='test')


def test_dc_motor_whose_back_emf_exceeds_kd_compiles_as_given(robot):
    """c = stall / no-load > Kd makes the PD's damping term positive; MuJoCo's compiler reads
    a positive biasprm[2] as a damping ratio unless the scene writes it back after compiling."""
    spec = dataclasses.replace(robot, actuator=dataclasses.replace(
        robot.actuator, model='dc_motor', saturation_torque=np.full(robot.num_joints, 28.0),
        no_load_speed=np.full(robot.num_joints, 10.0)))
    model = scene.build_model(spec)
    j = robot.num_joints
    assert np.all(2.8 > robot.kd)
    np.testing.assert_allclose(model.actuator_biasprm[:j, 2], -(robot.kd - 2.8))
