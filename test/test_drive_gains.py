"""The drives' gains are checked, not assumed (core/control/drive_gains.py, no ROS): sent gains
are the serving model's metadata (a swap changes them; Kp = 0 in PASSIVE) and need a listener;
declared gains are compared with the model's within gain_tolerance, the refusal naming both;
nothing sent and nothing declared refuses RL with the fix; every bad parameter refuses by name,
in one line; the self-check leaves a record beside the model that the policy card shows."""

import dataclasses
import json
import math

import numpy as np
import pytest

from claw_rl_ros.core.control.drive_gains import DriveGains, gain_check, write_drive_record
from claw_rl_ros.core.control.policy_controller import PolicyController
from claw_rl_ros.core.control.safety import PASSIVE, RL, SafetyConfig
from claw_rl_ros.core.export.drive_record import drive_path, read_drive_record
from claw_rl_ros.core.export.policy_card import policy_card
from claw_rl_ros.core.params.node_config import PolicyParams
from control_models import good_model
from test_deploy_checks import standing
from test_safety import Robot


def controller(robot, drive=None, **kwargs):
    return PolicyController(robot, safety=SafetyConfig(autostart=False, stand_up_s=0.0),
                            drive_gains=drive, **kwargs)


@pytest.fixture(scope='module')
def model(robot, tmp_path_factory):
    return good_model(robot, tmp_path_factory.mktemp('drive') / 'student.onnx')


def check(robot, drive, kp, kd, sent=None, listeners=None):
    """gain_check of a declared (or sent) set against the robot's own metadata."""
    declared = None if drive.source == 'sent' or not drive.kp else \
        (np.broadcast_to(kp, (12,)).astype(float), np.broadcast_to(kd, (12,)).astype(float))
    return gain_check(drive, robot.to_metadata(), robot.joint_names, declared,
                      sent or (robot.kp, robot.kd), listeners, '/joint_gains')


def test_declared_gains_that_differ_refuse_rl_naming_both_sets(robot, model):
    ctrl = controller(robot, DriveGains('declared', (25.0,), (0.75,)))
    ctrl.load_path(model)
    feed = standing(ctrl, robot)
    ok, message = ctrl.request('rl', feed.t)
    assert not ok and message == (
        'rl refused by the self-check (1 mismatch(es)): drive gains: Kp differs from the '
        "model's by more than gain_tolerance 5 %: model metadata 30 vs drives 25 (-16.7 %) at "
        "every joint; set drive_kp to the gains the drives hold, put the model's into the "
        'drives, or send them to a driver that takes gains (gains_source sent)')
    assert ctrl.drive_verdict == 'differs' and ctrl.safety.state != RL
    # Declared right: RL. The check is by joint, both values named for the joints that differ.
    ctrl.drive = DriveGains('declared', (30.0,), (0.75,))
    ctrl._declared = (robot.kp.copy(), robot.kd.copy())
    assert ctrl.request('rl', feed.t) == (True, RL)
    kd = robot.kd.copy()
    kd[[2, 5]] = 1.0
    verdict, lines = check(robot, DriveGains('declared', (30.0,), tuple(kd)), robot.kp, kd)
    assert verdict == 'differs' and lines == [
        "drive gains: Kd differs from the model's by more than gain_tolerance 5 %: model "
        'metadata 0.75 vs drives 1 (+33.3 %) at [FL_calf_joint, FR_calf_joint]; set drive_kd '
        "to the gains the drives hold, put the model's into the drives, or send them to a "
        'driver that takes gains (gains_source sent)']


def test_a_declaration_per_joint_is_in_joints_order(robot, model):
    joints = list(reversed(robot.joint_names))
    kp = [30.0] * 12
    kp[0] = 20.0  # joints[0]: RR_calf_joint
    ctrl = controller(robot, DriveGains('declared', tuple(kp), (0.75,)), output_joints=joints,
                      command_joints=joints)
    ctrl.load_path(model)
    problems = ctrl.check()
    assert [p for p in problems if p.startswith('drive gains')] == [problems[-1]]
    assert 'model metadata 30 vs drives 20 (-33.3 %) at [RR_calf_joint]' in problems[-1]


def test_the_tolerance_is_relative_and_its_boundary_passes(robot):
    for tol in (0.05, 0.1, 0.0, 0.5):
        at = DriveGains('declared', (30.0 * (1 + tol),), (0.75 * (1 - tol),), tol)
        assert check(robot, at, 30.0 * (1 + tol), 0.75 * (1 - tol)) == ('within', [])
        past = dataclasses.replace(at, kp=(30.0 * (1 + tol) + 1e-3,))
        verdict, lines = check(robot, past, 30.0 * (1 + tol) + 1e-3, 0.75 * (1 - tol))
        assert verdict == 'differs' and len(lines) == 1 and lines[0].startswith(
            f"drive gains: Kp differs from the model's by more than gain_tolerance "
            f'{tol * 100:g} %: model metadata 30 vs drives {30 * (1 + tol) + 1e-3:.6g}')
    # 5 % below is as far as 5 % above; Kd 5.1 % off fails on its own.
    assert check(robot, DriveGains('declared', (28.5,), (0.75,)), 28.5, 0.75)[0] == 'within'
    verdict, lines = check(robot, DriveGains('declared', (30.0,), (0.75 * 1.051,)), 30.0,
                           0.75 * 1.051)
    assert verdict == 'differs' and lines[0].startswith('drive gains: Kd differs')


def test_nothing_declared_and_nothing_sent_refuses_rl_with_the_fix(robot, model):
    ctrl = controller(robot, DriveGains('declared'))
    ctrl.load_path(model)
    ok, message = ctrl.request('rl', standing(ctrl, robot).t)
    assert not ok and message.endswith(
        'drive gains: not declared and not sent; the model was trained at Kp 30, Kd 0.75: '
        'declare the gains your drives hold (gains_source declared, drive_kp, drive_kd: one '
        "number or one per joint in joints order), or send the model's to a driver that takes "
        'gains (gains_source sent, gains_topic)')
    assert ctrl.drive_verdict == 'not declared'


def test_sent_gains_need_a_listener_and_are_the_models(robot, model):
    ctrl = controller(robot)  # gains_source sent: the default
    ctrl.load_path(model)
    feed = standing(ctrl, robot)
    ctrl.gains_listeners, ctrl.gains_topic = (lambda: 0), '/fwd/gains'
    ok, message = ctrl.request('rl', feed.t)
    assert not ok and 'drive gains: sent on /fwd/gains, but nothing subscribes to it; remap ' \
        'joint_gains to the topic your driver reads gains from' in message
    assert ctrl.drive_verdict == 'not received'
    ctrl.gains_listeners = lambda: 1
    assert ctrl.check() == [] and ctrl.drive_verdict == 'sent'
    # What goes out is checked against the model's metadata, both named when they differ.
    ctrl.shaper.kp = ctrl.shaper.kp * 1.2
    assert ctrl.check() == ['drive gains: the node sends Kp 36, Kd 0.75, not the model\'s '
                            'metadata Kp 30, Kd 0.75; reload the model (model_path)']
    ctrl.load_path(model)
    assert ctrl.request('rl', feed.t) == (True, RL)


def test_passive_sends_kp_zero_and_the_models_kd(robot, model):
    ctrl = controller(robot)
    ctrl.load_path(model)
    feed = Robot(ctrl, robot)
    assert feed.tick() is not None and ctrl.safety.state == PASSIVE
    kp, kd = ctrl.last_gains
    assert np.array_equal(kp, np.zeros(12)) and np.array_equal(kd, robot.kd)
    assert ctrl.request('stand_up', feed.t)[0]
    feed.tick()
    kp, kd = ctrl.last_gains
    assert np.array_equal(kp, robot.kp) and np.array_equal(kd, robot.kd)
    ctrl.request('passive', feed.t)
    feed.tick()
    assert np.array_equal(ctrl.last_gains[0], np.zeros(12))


def test_a_swap_sends_the_new_models_metadata_gains(robot, model, tmp_path):
    # A model whose metadata gains differ from the robot YAML's by less than the spec check's
    # 1e-6: served, and from then on its gains, not the YAML's, go with every command.
    scale = 1 + 5e-7
    other = good_model(dataclasses.replace(robot, kp=robot.kp * scale, kd=robot.kd * scale),
                       tmp_path / 'other.onnx', seed=4)
    joints = list(reversed(robot.joint_names))
    ctrl = controller(robot, output_joints=joints)
    ctrl.load_path(model)
    feed = standing(ctrl, robot)
    kp, kd = ctrl.last_gains
    assert np.array_equal(kp, robot.kp[::-1]) and np.array_equal(kd, robot.kd[::-1])
    ctrl.load_path(other)
    feed.tick()
    meta = ctrl.policy.spec
    kp, kd = ctrl.last_gains
    assert np.array_equal(kp, np.asarray(meta['kp'])[::-1]) and not np.array_equal(
        kp, robot.kp[::-1])
    assert np.array_equal(kd, np.asarray(meta['kd'])[::-1])
    assert not any(p.startswith('drive gains') for p in ctrl.check())
    ctrl.load_path(model)  # and back
    feed.tick()
    assert np.array_equal(ctrl.last_gains[0], robot.kp[::-1])


@pytest.mark.parametrize('kwargs, words', [
    ({'source': 'both'}, "parameter gains_source = 'both'; use one of ('sent', 'declared')"),
    ({'tolerance': -0.01}, 'parameter gain_tolerance = -0.01; use a relative difference from 0 '
     'to 0.5'),
    ({'tolerance': 0.51}, 'parameter gain_tolerance = 0.51'),
    ({'tolerance': math.nan}, 'parameter gain_tolerance = nan'),
    ({'source': 'declared', 'kp': (30.0, math.nan), 'kd': (0.75,)},
     'parameter drive_kp = [30.0, nan]: nan is no gain; give finite numbers >= 0 [N m/rad]'),
    ({'source': 'declared', 'kp': (30.0,), 'kd': (-0.75,)},
     'parameter drive_kd = [-0.75]: -0.75 is no gain'),
    ({'source': 'declared', 'kp': (math.inf,), 'kd': (0.75,)}, 'parameter drive_kp = [inf]'),
    ({'source': 'declared', 'kp': (30.0,)}, 'parameter drive_kd is empty but drive_kp is given'),
    ({'kp': (30.0,), 'kd': (0.75,)}, 'parameter drive_kp / drive_kd given with gains_source '
     'sent'),
])
def test_bad_gain_parameters_refuse_by_name_in_one_line(kwargs, words):
    with pytest.raises(ValueError) as exc:
        DriveGains(**kwargs)
    assert str(exc.value).startswith(words) and '\n' not in str(exc.value)
    # The node's parameters refuse the same way (node_config; policy_node starts with them).
    params = {'gains_source': kwargs.get('source', 'sent'), 'drive_kp': list(kwargs.get(
        'kp', ())), 'drive_kd': list(kwargs.get('kd', ())),
        'gain_tolerance': kwargs.get('tolerance', 0.05)}
    with pytest.raises(ValueError, match='parameter (gains_source|gain_tolerance|drive_k)'):
        PolicyParams(**params)


def test_a_declaration_of_the_wrong_length_refuses_the_start(robot):
    with pytest.raises(ValueError) as exc:
        controller(robot, DriveGains('declared', (30.0,) * 5, (0.75,)))
    assert str(exc.value).startswith('parameter drive_kp has 5 values; give 1 (every joint) '
                                     'or 12, one per joint in joints order (FL_hip_joint')
    with pytest.raises(ValueError, match='parameter drive_kd has 2 values'):
        controller(robot, DriveGains('declared', (30.0,) * 12, (0.75, 0.75)))
    assert PolicyParams().drive_gains() == DriveGains()  # sent, 5 %


def test_the_self_check_leaves_a_record_the_card_shows(robot, tmp_path):
    model = good_model(robot, tmp_path / 'student.onnx')
    ctrl = controller(robot, DriveGains('declared', (30.0,), (0.75,)))
    ctrl.load_path(model)
    assert ctrl.drive_report('/policy_node') is None  # no check yet
    assert not [p for p in ctrl.check() if p.startswith('drive gains')]
    path = write_drive_record(model, ctrl.drive_report('/policy_node'))
    assert path == drive_path(model) == tmp_path / 'student.drive.json'
    record = read_drive_record(model)
    assert record['verdict'] == 'within' and record['kp'] == [30.0] * 12
    text = policy_card(model)
    assert '## Drive gains\n\n- drive gains: declared: Kp 30, Kd 0.75 (within tolerance 5 %)' \
        in text
    assert '- checked by `/policy_node`' in text and 'for this model: yes' in text
    ctrl.drive, ctrl._declared = DriveGains('declared', (24.0,), (0.75,)), \
        (np.full(12, 24.0), robot.kd.copy())
    ctrl._declared_out = ctrl._declared
    ctrl.check()
    write_drive_record(model, ctrl.drive_report('/policy_node'))
    text = policy_card(model)
    assert '- drive gains: declared: Kp 24, Kd 0.75 (differs by more than 5 %: RL refused)' \
        in text and '- drive gains: Kp differs from the model\'s' in text
    sent = controller(robot)
    sent.load_path(model)
    sent.gains_topic, sent.gains_listeners = '/fwd/gains', (lambda: 1)
    sent.check()
    write_drive_record(model, sent.drive_report('/policy_node'))
    assert '- drive gains: sent with every command (the Kp / Kd above on `/fwd/gains`, Kp = 0 ' \
        'in PASSIVE)\n' in policy_card(model)
    drive_path(model).write_text(json.dumps({**read_drive_record(model), 'model_sha256': 'ab'}))
    assert 'for this model: NO: it checked another model (sha256 ab)' in policy_card(model)
    drive_path(model).unlink()
    assert '- drive gains' not in policy_card(model) and 'Not checked on a robot yet' in \
        policy_card(model)
