"""Start-up self-check (model spec vs robot config vs live robot, by name), the verification
gate of the deploy path, and the worked ros2_control example's joint order."""

import copy
import json

import numpy as np
import pytest
import yaml

from claw_rl_ros.core import paths
from claw_rl_ros.core.control.policy_controller import PolicyController
from claw_rl_ros.core.control.safety import PASSIVE, RL, SafetyConfig
from claw_rl_ros.core.control.self_check import controller_joints, self_check
from claw_rl_ros.core.export.verification_record import (verification_blocker, verification_path)
from claw_rl_ros.core.sim.robot import load_robot
from control_models import good_model
from test_safety import DT, Robot

EXAMPLE = paths.config_path('ros2_control_claw_quadruped.yaml')


def live(robot, **overrides):
    """Keyword arguments of a healthy live robot (50 Hz state and IMU, spec-order commands)."""
    return {'output_joints': robot.joint_names, 'joint_state_names': robot.joint_names,
            'joint_state_period': DT, 'imu_period': DT, 'command_joints': robot.joint_names,
            **overrides}


def spec_with(robot, **changes):
    spec = copy.deepcopy(robot.to_metadata())
    spec.update(changes)
    return spec


def test_a_matching_model_and_robot_pass(robot):
    assert self_check(robot, robot.to_metadata(), **live(robot)) == []


def test_permuted_joint_order_is_named(robot):
    names = list(robot.joint_names)
    names[3], names[6] = names[6], names[3]
    problems = self_check(robot, spec_with(robot, joint_names=names), **live(robot))
    assert problems == [f'joint order: the model has RL_hip_joint at index 3 where robot '
                        f"'claw_quadruped' has FR_hip_joint (the model: {names}; robot "
                        f"'claw_quadruped': {robot.joint_names})"]
    # The command interface in another order than the node publishes: named by joint.
    problems = self_check(robot, robot.to_metadata(), **live(robot, command_joints=names))
    assert len(problems) == 1 and problems[0].startswith(
        'command interface joint order: the command controller has RL_hip_joint at index 3 '
        "where the policy node's joints parameter has FR_hip_joint")
    # /joint_states in any order is fine: matched by name.
    assert self_check(robot, robot.to_metadata(), **live(robot, joint_state_names=names)) == []


def test_missing_joint_is_named_wherever_it_is_missing(robot):
    names = robot.joint_names[:-1]
    problems = self_check(robot, spec_with(robot, joint_names=names), **live(
        robot, joint_state_names=names, command_joints=names))
    assert problems[0] == ("missing joint: the model lacks ['RR_calf_joint'] (of robot "
                           "'claw_quadruped')")
    assert "missing joint: /joint_states lacks ['RR_calf_joint']" in problems[1]
    assert problems[2].startswith('command interface missing joint: the command controller '
                                  "lacks ['RR_calf_joint']")
    extra = self_check(robot, robot.to_metadata(), **live(
        robot, joint_state_names=robot.joint_names + ['gripper_joint']))
    assert extra == ["unknown joint: /joint_states has ['gripper_joint'], not joints of robot "
                     "'claw_quadruped'"]


def test_control_dt_action_scale_gains_and_observation_scales_are_named(robot):
    spec = spec_with(robot, control_dt=0.025, action_scale=0.5, kp=[35.0] * 12)
    spec['observation'][4]['scale'] = [0.1] * 12  # joint_vel
    problems = self_check(robot, spec, **live(robot))
    assert problems[0] == 'gains: model has kp = ' + repr([35.0] * 12) + \
        ", robot 'claw_quadruped' has " + repr([30.0] * 12)
    assert problems[1] == ('action scale: model has action_scale = 0.5, robot '
                           "'claw_quadruped' has 0.25")
    assert problems[2] == ('control dt: model has control_dt = 0.025, robot '
                           "'claw_quadruped' has 0.02")
    assert problems[3].startswith('observation scales: joint_vel model [0.1, ')
    assert len(problems) == 4  # every mismatch at once, not the first


def test_live_rates_and_missing_data(robot):
    problems = self_check(robot, None, **live(robot, joint_state_period=0.01, imu_period=0.04,
                                              joint_state_names=None))
    assert problems == [
        'model: none loaded', 'missing joint: no /joint_states received yet',
        '/joint_states rate: 100.0 Hz, the model was trained at 50 Hz (control dt 0.02 s); '
        "set the broadcaster's update_rate to 50",
        'imu rate: 25.0 Hz, the model was trained at 50 Hz (control dt 0.02 s); set the '
        "broadcaster's update_rate to 50 or more"]
    # A faster IMU is fine; no timing yet is a problem.
    assert self_check(robot, robot.to_metadata(), **live(robot, imu_period=0.005)) == []
    assert self_check(robot, robot.to_metadata(), **live(robot, imu_period=None))[0].startswith(
        'imu rate: no timing yet')


def standing(ctrl, robot):
    """A fed robot whose controller was asked to stand up (stand_up_s 0: done at once)."""
    feed = Robot(ctrl, robot)
    for _ in range(4):
        feed.tick()
    assert ctrl.request('stand_up', feed.t)[0]
    feed.tick()
    return feed


def test_rl_request_is_refused_with_the_report(robot, tmp_path):
    ctrl = PolicyController(robot, safety=SafetyConfig(autostart=False, stand_up_s=0.0),
                            command_joints=list(reversed(robot.joint_names)))
    ctrl.load_path(good_model(robot, tmp_path / 'a.onnx'))
    feed = standing(ctrl, robot)
    ok, message = ctrl.request('rl', feed.t)
    assert not ok and message.startswith('rl refused by the self-check (1 mismatch(es)): '
                                         'command interface joint order')
    ctrl.command_joints = list(robot.joint_names)
    assert ctrl.request('rl', feed.t) == (True, RL)


# ------------------------------------------------------------------------- verification
def write_verification(model, sha, passed=True):
    record = {'model_sha256': sha, 'passed': passed, 'table': [{'metric': 'fall_rate',
              'value': 0.0, 'limit': 0.1, 'passed': True}], 'created': '2026-11-30T23:00:00Z'}
    verification_path(model).write_text(json.dumps(record))


def test_verification_gate(robot, tmp_path):
    model = good_model(robot, tmp_path / 'student.onnx')
    ctrl = PolicyController(robot, safety=SafetyConfig(autostart=False, stand_up_s=0.0),
                            require_verification=True)
    sha = ctrl.models.offer(model.read_bytes())[0]
    assert verification_path(model) == tmp_path / 'student.verify.json'
    assert 'no student.verify.json beside' in verification_blocker(model, sha)
    ctrl.load_path(model)
    feed = standing(ctrl, robot)
    ok, message = ctrl.request('rl', feed.t)
    assert not ok and 'no student.verify.json beside' in message and 'claw-rl verify' in message
    write_verification(model, sha, passed=False)
    assert 'did not pass' in verification_blocker(model, sha)
    write_verification(model, 'f' * 64)
    assert 'verifies model ffffffffffff, not the served' in verification_blocker(model, sha)
    verification_path(model).write_text(json.dumps({'model_sha256': sha, 'table': []}))
    assert 'did not pass (passed = None)' in verification_blocker(model, sha)
    verification_path(model).write_text('[1, 2]')
    assert 'a JSON object is expected' in verification_blocker(model, sha)
    assert 'came as bytes' in verification_blocker(None, sha)
    write_verification(model, sha)
    assert verification_blocker(model, sha) is None
    ctrl.load_path(model)  # re-read when the model is (re)loaded
    assert ctrl.request('rl', feed.t) == (True, RL)
    # In RL, a hot swap to an unverified model is refused; the verified one keeps serving.
    other = good_model(robot, tmp_path / 'other.onnx', seed=5)
    with pytest.raises(ValueError, match='not verified, refused while in RL'):
        ctrl.load_path(other)
    assert ctrl.policy.sha256 == sha and ctrl.safety.state == RL
    ctrl.request('passive', feed.t)
    assert ctrl.safety.state == PASSIVE
    ctrl.load_path(other)  # outside RL it may be loaded; RL stays gated
    assert ctrl.diagnostics()['verified'] is False


# ------------------------------------------------------------------- ros2_control example
def test_example_controllers_yaml_joint_order_is_the_spec_order():
    spec = load_robot('claw_quadruped').joint_names
    data = yaml.safe_load(EXAMPLE.read_text())
    assert data['forward_position_controller']['ros__parameters']['joints'] == spec
    assert data['joint_state_broadcaster']['ros__parameters']['joints'] == spec
    types = {k: v['type'] for k, v in data['controller_manager']['ros__parameters'].items()
             if isinstance(v, dict)}
    assert types == {'joint_state_broadcaster': 'joint_state_broadcaster/JointStateBroadcaster',
                     'imu_sensor_broadcaster': 'imu_sensor_broadcaster/IMUSensorBroadcaster',
                     'forward_position_controller':
                         'forward_command_controller/ForwardCommandController'}
    # The broadcasters publish at the model's control rate (the self-check checks it live).
    robot = load_robot('claw_quadruped')
    for name in ('joint_state_broadcaster', 'imu_sensor_broadcaster'):
        assert data[name]['ros__parameters']['update_rate'] == round(1 / robot.control_dt)
    assert controller_joints(str(EXAMPLE), 'forward_position_controller') == spec


def test_controller_joints_errors_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match='no nope: ros__parameters: joints'):
        controller_joints(str(EXAMPLE), 'nope')
    with pytest.raises(ValueError, match='cannot read it'):
        controller_joints(str(tmp_path / 'missing.yaml'), 'x')
    keyed = tmp_path / 'c.yaml'
    keyed.write_text('/**/fwd:\n  ros__parameters:\n    joints: [a, b]\n')
    assert controller_joints(str(keyed), 'fwd') == ['a', 'b']
    np.testing.assert_array_equal(controller_joints(str(keyed), 'fwd'), ['a', 'b'])
