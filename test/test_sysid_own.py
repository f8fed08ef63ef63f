"""System identification of a hidden robot of our own (every joint group different, a 15 ms
delay) on a stand, through a recorder_node MCAP and ``claw-rl sysid``: exit 0, the report, an
overlay the robot loader merges (on the ground: test_sysid_ground.py); and recordings that
cannot identify a parameter exit 2 with one line naming what is wrong."""

from __future__ import annotations

from dataclasses import replace
import hashlib
import json

from mcap.reader import make_reader
from nav_msgs.msg import Odometry
import numpy as np
import pytest
from rclpy.serialization import serialize_message
from std_msgs.msg import String

from claw_rl_ros import cli
from claw_rl_ros.core.replay.recording import Recorder
from claw_rl_ros.core.sim.robot import load_robot
from claw_rl_ros.core.sim.robot_overlay import GroupParams, load_overlay
from claw_rl_ros.core.sysid import fit, hidden_robot
from claw_rl_ros.core.config import ConfigError
from claw_rl_ros.core.sysid.trace import check_trace, load_trace, rotation
from test_sysid import simulate_hidden

# Every group different, a stiffer and lighter drive than the claw's, 15 ms (3 physics steps).
OWN = {'hip': GroupParams(kp=36.0, kd=0.5, frictionloss=0.1, damping=0.15, armature=0.02),
       'thigh': GroupParams(kp=33.0, kd=0.9, frictionloss=0.2, damping=0.1, armature=0.015),
       'calf': GroupParams(kp=40.0, kd=0.6, frictionloss=0.15, damping=0.2, armature=0.025)}
OWN_DELAY = 3


@pytest.fixture(scope='module')
def stand_trace(tmp_path_factory):
    return simulate_hidden(tmp_path_factory.mktemp('own'), OWN, OWN_DELAY, stand=True)


def sysid(capsys, *argv):
    """(exit status, stdout, stderr) of ``claw-rl sysid ARGV``."""
    code = cli.main(['sysid', *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_claw_rl_sysid_on_a_stand_recording_writes_the_overlay(stand_trace, tmp_path, capsys):
    robot = load_robot('claw_quadruped')
    mcap = hidden_robot.write_recording(stand_trace, tmp_path / 'stand.mcap', robot)
    # Read back as it was recorded: the samples, the commands in force, the EXCITE window.
    back = load_trace(mcap, robot)
    assert back.window == stand_trace.window and back.variant == 'stand'
    assert np.array_equal(back.q, stand_trace.q)
    assert np.array_equal(back.effort, stand_trace.effort)
    assert np.array_equal(back.target[:-1], stand_trace.target[:-1])
    assert np.allclose(back.t, stand_trace.t, atol=1e-9)
    out = tmp_path / 'overlay.yaml'
    code, text, err = sysid(capsys, mcap, '--robot', 'claw_quadruped', '--out', out)
    assert code == 0, text + err
    for words in ('efforts recorded', 'q RMS before', 'command -> motion delay', f'wrote {out}'):
        assert words in text, text
    # Every joint's line of the table, and the tracking far better than the robot as given.
    assert all(f'\n{joint} ' in text for joint in robot.joint_names)
    overlay = load_overlay(out)
    assert overlay.extra['fit']['variant'] == 'stand'
    assert overlay.extra['fit']['recording'] == {
        'file': 'stand.mcap', 'sha256': hashlib.sha256(mcap.read_bytes()).hexdigest()}
    assert abs(overlay.action_delay_s / robot.sim_dt - OWN_DELAY) <= 1
    for group, truth in OWN.items():
        for name in fit.PARAMS:
            got, want = getattr(overlay.joint_groups[group], name), getattr(truth, name)
            assert abs(got / want - 1) <= 0.15, (group, name, got, want)
    merged = load_robot('claw_quadruped', overlay=out)
    assert merged.source['overlay'] == str(out)
    assert np.allclose(merged.kp[2::3], overlay.joint_groups['calf'].kp)


def test_odometry_and_the_excitation_record_are_read_from_a_recording(stand_trace, tmp_path):
    # The sim node's odom (body-frame twist) and the policy node's excitation record, added to
    # the hidden robot's recording as recorder_node stores them.
    robot = load_robot('claw_quadruped')
    plain = hidden_robot.write_recording(stand_trace, tmp_path / 'plain.mcap', robot)
    rec, channels = Recorder(tmp_path / 'odom.mcap', {'robot': 'claw_quadruped'}), {}
    with open(plain, 'rb') as f:
        for schema, channel, message in make_reader(f).iter_messages(log_time_order=True):
            if channel.topic not in channels:
                channels[channel.topic] = rec.add_topic(channel.topic, schema.name)
            rec.write(channels[channel.topic], channel.topic, message.data, message.log_time,
                      message.publish_time)
    odom_ch = rec.add_topic('/odom', 'nav_msgs/msg/Odometry')
    # A trunk tilted 30 degrees and moving (the loader checks no physics).
    trunk = stand_trace.base.copy()
    trunk[:, 3:7] = [np.cos(np.pi / 12), np.sin(np.pi / 12), 0.0, 0.0]
    trunk[:, 7:13] = np.random.default_rng(0).normal(size=(len(trunk), 6))
    for stamp, base in zip(stand_trace.t, trunk):
        msg = Odometry()
        msg.header.stamp.sec, msg.header.stamp.nanosec = int(stamp), round(stamp % 1 * 1e9)
        p, o = msg.pose.pose.position, msg.pose.pose.orientation
        p.x, p.y, p.z = base[0:3]
        o.w, o.x, o.y, o.z = base[3:7]
        linear = rotation(base[3:7]).T @ base[7:10]  # the twist is in the body frame
        v, w = msg.twist.twist.linear, msg.twist.twist.angular
        v.x, v.y, v.z = linear
        w.x, w.y, w.z = base[10:13]
        rec.write(odom_ch, '/odom', serialize_message(msg), 0, 0)
    record = String(data=json.dumps({'config': {'variant': 'ground'}}))
    rec.write(rec.add_topic('/policy/excitation', 'std_msgs/msg/String'), '/policy/excitation',
              serialize_message(record), 0, 0)
    back = load_trace(rec.close(), robot)
    assert back.variant == 'ground'  # the excitation record's, over the metadata's
    assert np.allclose(back.base, trunk, atol=1e-9)
    assert load_trace(plain, robot).base is None


def broken(trace, **arrays):
    """A copy of ``trace`` with some arrays changed by functions of a copy of them."""
    out = replace(trace)
    for name, change in arrays.items():
        value = np.array(getattr(trace, name), copy=True)
        change(value)
        setattr(out, name, value)
    return out


def test_states_lost_before_the_excitation_do_not_refuse_the_recording(stand_trace):
    """A stretch lost while the robot stood up (before the excitation and the periods the fit
    reads before it) is no harm; the same gap inside the excitation is refused."""
    robot = load_robot('claw_quadruped')
    n = len(stand_trace.t)
    jumped = broken(stand_trace, t=lambda t: t.__setitem__(slice(100, None), t[100:] + 5.0))
    check_trace(replace(jumped, window=(200, n)), robot)
    with pytest.raises(ConfigError, match='the clock jumps 5.020 s'):
        check_trace(replace(jumped, window=(110, n)), robot)  # within the delay's history
    with pytest.raises(ConfigError, match='the clock jumps 5.020 s'):
        check_trace(replace(jumped, window=(50, n)), robot)


def test_bad_recordings_exit_2_naming_what_is_wrong(stand_trace, tmp_path, capsys):
    robot = load_robot('claw_quadruped')
    j = robot.joint_names.index('FR_calf_joint')
    empty = tmp_path / 'empty.mcap'
    rec = Recorder(empty, {'robot': 'claw_quadruped'})
    rec.add_topic('/joint_states', 'sensor_msgs/msg/JointState')
    rec.close()
    junk = tmp_path / 'junk.mcap'
    junk.write_bytes(b'not an mcap file')
    cases = {
        'empty': (empty, 'joint_states: none recorded'),
        'junk': (junk, 'not a readable MCAP recording'),
        'missing': (tmp_path / 'none.mcap', 'no such file'),
        'nan_effort': (broken(stand_trace, effort=lambda e: e.__setitem__((700, j), np.nan)),
                       'joint_states.effort: FR_calf_joint is nan at t = 14.000 s'),
        'unexcited': (broken(stand_trace,
                             target=lambda t: t.__setitem__((slice(None), j), t[0, j])),
                      'FR_calf_joint: no excitation'),
        'clock_jump': (broken(stand_trace, t=lambda t: t.__setitem__(slice(600, None),
                                                                     t[600:] + 2.0)),
                       'the clock jumps 2.020 s at t = 11.980 s'),
        'wrong_names': (replace(stand_trace, joints=[n.replace('_joint', '') for n in
                                                     stand_trace.joints]),
                        "joints ['FL_hip', 'FL_thigh'"),
    }
    for name, (source, words) in cases.items():
        path = source if not hasattr(source, 'q') else \
            hidden_robot.write_recording(source, tmp_path / f'{name}.mcap', robot)
        code, text, err = sysid(capsys, path, '--robot', 'claw_quadruped', '--out',
                                tmp_path / f'{name}.yaml')
        assert code == 2 and words in err and err.count('\n') == 1, (name, err, text)
        assert not (tmp_path / f'{name}.yaml').exists()
    code, _, err = sysid(capsys, empty, '--out', tmp_path / 'x.yaml', '--max-delay-ms', '-5')
    assert code == 2 and '--max-delay-ms' in err and err.count('\n') == 1, err
