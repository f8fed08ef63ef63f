"""MCAP recording and replay: schemas as rosbag2 writes them, a recorder_node run of a real
lockstep sim_node + policy_node loop, actions recomputed offline (identical for the serving
model, different for another), robustness to lost messages and a late start, and the MuJoCo
replay picture."""

import hashlib
import json
from pathlib import Path
import re
import subprocess
import sys

from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import Twist
from mcap.reader import make_reader
import numpy as np
from PIL import Image
import pytest
from rclpy.serialization import serialize_message
from sensor_msgs.msg import JointState
from std_srvs.srv import SetBool

from claw_rl_ros import cli
from claw_rl_ros.core.replay import action_replay as replay, recording_events as events
from claw_rl_ros.core.replay import sim_comparison
from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
from claw_rl_ros.core.replay.recording import (message_definition, msg_file, read_messages,
                                               read_metadata, Recorder, SEPARATOR)
from control_models import good_model
from ros_helpers import NodeProcess, stop_all

ROOT = Path(__file__).resolve().parents[1]
TYPES = {'/joint_states': 'sensor_msgs/msg/JointState', '/imu': 'sensor_msgs/msg/Imu',
         '/cmd_vel': 'geometry_msgs/msg/Twist',
         '/joint_commands': 'std_msgs/msg/Float64MultiArray',
         '/policy/model_version': 'std_msgs/msg/String', '/odom': 'nav_msgs/msg/Odometry'}


def test_definition_is_the_msg_text_then_each_dependency_once():
    text = message_definition('sensor_msgs/msg/JointState')
    own = msg_file('sensor_msgs/msg/JointState').read_text()
    assert text.startswith(own.rstrip('\n') + '\n' + SEPARATOR + '\nMSG: std_msgs/msg/Header\n')
    assert text.count('MSG: ') == 2 and '\nMSG: builtin_interfaces/msg/Time\n' in text
    assert all(len(line) == 80 for line in text.splitlines() if line.startswith('='))
    # Constants (byte OK=0) are no types; same-package types (KeyValue) get their package.
    diag = message_definition('diagnostic_msgs/msg/DiagnosticArray')
    assert [line[5:] for line in diag.splitlines() if line.startswith('MSG: ')] == [
        'std_msgs/msg/Header', 'diagnostic_msgs/msg/DiagnosticStatus',
        'builtin_interfaces/msg/Time', 'diagnostic_msgs/msg/KeyValue']


def test_recorder_writes_cdr_that_the_ros2_decoder_reads(tmp_path):
    msg = JointState(name=['a', 'b'], position=[1.5, -2.0], velocity=[0.25, 0.0])
    msg.header.stamp.sec, msg.header.frame_id = 7, 'base'
    rec = Recorder(tmp_path / 'x.mcap', {'robot': 'r'})
    channel = rec.add_topic('/joint_states', 'sensor_msgs/msg/JointState')
    rec.write(channel, '/joint_states', serialize_message(msg), 2_000, 1_000)
    assert not (tmp_path / 'x.mcap').exists() and (tmp_path / 'x.mcap.part').exists()
    rec.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['x.mcap']
    [(topic, log, pub, out)] = list(read_messages(tmp_path / 'x.mcap'))
    assert (topic, log, pub) == ('/joint_states', 2_000, 1_000)
    assert out.name == ['a', 'b'] and list(out.position) == [1.5, -2.0]
    assert out.header.stamp.sec == 7 and out.header.frame_id == 'base'
    assert read_metadata(tmp_path / 'x.mcap') == {'robot': 'r'}


@pytest.fixture(scope='module')
def run(ros_env, probe, robot, tmp_path_factory):
    """>= 5 s of a lockstep loop recorded by recorder_node from the policy's first tick, cmd_vel
    changed after >= 100 ticks and kept for >= 150; returns (mcap path, model, another model).

    Deterministic start: the sim is paused before the policy starts, and resumes only once the
    recorder has matched every publisher (its diagnostics), so the recording holds the
    policy's first output.
    """
    d = tmp_path_factory.mktemp('record')
    model, other = good_model(robot, d / 'a.onnx', seed=0), good_model(robot, d / 'b.onnx', 1)
    probe.subscribe('/diagnostics', DiagnosticArray, 50)

    def recorder(key, n):
        return lambda m: any(s.hardware_id == '/recorder_node' and any(
            kv.key == key and int(kv.value) >= n for kv in s.values) for s in m.status)

    def recorded(topic, n):
        return recorder(f'messages /{topic}', n)
    rec = NodeProcess('recorder_node', ros_env, d, {'path': str(d / 'run.mcap')})
    probe.wait_for('/diagnostics', recorded('joint_commands', 0), timeout=60)
    sim = NodeProcess('sim_node', ros_env, d, {'mode': 'lockstep', 'command_timeout_s': 0.2})
    assert probe.call(SetBool, '/sim_node/pause', SetBool.Request(data=True), 60).success
    # One cmd_vel for the whole run, as a script gives it: the cmd_vel timeout is off.
    policy = NodeProcess('policy_node', ros_env, d, {'use_sim_time': True,
                                                     'model_path': str(model),
                                                     'cmd_vel_timeout_s': 0.0})
    for topic in ('joint_states', 'imu', 'joint_commands', 'policy/model_version',
                  'safety/state'):
        probe.wait_for('/diagnostics', recorder(f'publishers /{topic}', 1), timeout=60)
    assert probe.call(SetBool, '/sim_node/pause', SetBool.Request(data=False)).success
    probe.wait_for('/diagnostics', recorded('joint_commands', 100), timeout=60)
    probe.publish('cmd_vel', Twist())  # zero, as before: creates the publisher
    probe.wait_subscribers('cmd_vel', 3)  # sim, policy and recorder all get the next one
    cmd = Twist()
    cmd.linear.x, cmd.angular.z = 0.4, 0.3
    probe.publish('cmd_vel', cmd)
    walking = probe.wait_for('/diagnostics', recorded('cmd_vel', 2), timeout=30)
    # 150 ticks under the new command, however late it came (the loop's pace varies).
    before = max(int(kv.value) for s in walking.status for kv in s.values
                 if s.hardware_id == '/recorder_node' and kv.key == 'messages /joint_commands')
    probe.wait_for('/diagnostics', recorded('joint_commands', before + 150), timeout=60)
    codes = stop_all(policy, sim, rec)
    assert codes == {'policy_node': 0, 'sim_node': 0, 'recorder_node': 0}, \
        rec.log + sim.log + policy.log
    return d / 'run.mcap', model, other


def claw_rl(*argv):
    return subprocess.run([sys.executable, '-m', 'claw_rl_ros.cli', *map(str, argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_the_file_is_a_ros2_bag(run):
    path, model, _ = run
    with open(path, 'rb') as f:
        reader = make_reader(f)
        assert reader.get_header().profile == 'ros2'
        summary = reader.get_summary()
    channels = {c.topic: c for c in summary.channels.values()}
    assert set(TYPES) <= set(channels)
    for topic, type_name in TYPES.items():
        schema = summary.schemas[channels[topic].schema_id]
        assert channels[topic].message_encoding == 'cdr'
        assert (schema.name, schema.encoding) == (type_name, 'ros2msg')
        assert schema.data.decode() == message_definition(type_name)
    counts = summary.statistics.channel_message_counts
    assert counts[channels['/joint_commands'].id] >= 200
    versions = [m.data for t, _, _, m in read_messages(path) if t == '/policy/model_version']
    assert versions == [hashlib.sha256(model.read_bytes()).hexdigest()[:12]]


def test_replay_with_the_serving_model_is_identical(run):
    path, model, _ = run
    result = claw_rl('replay', path, '--model', model)
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'identical' in result.stdout and 'max |recomputed - recorded| 0 rad' in result.stdout
    rec = events.load_recording(path)
    assert len({tuple(c) for _, c in rec.cmd_vel}) == 2  # the command changed mid-run
    out = replay.replay_actions(rec, replay_robot(), OnnxPolicy(model))
    assert out.compared.sum() >= 0.9 * len(out.kind) and not out.differing.any()
    assert out.phase_offset == expected_offset(out) == 0  # recorded from the first tick


def expected_offset(out):
    """Gait clock ticks before the first recorded command: the lockstep sim starts at 0 s
    and the policy's first output answers that first state."""
    return round(out.stamp[0] / 0.02) % 20


def replay_robot():
    from claw_rl_ros.core.sim.robot import load_robot
    return load_robot('claw_quadruped')


def test_another_model_is_reported_as_differing(run):
    path, _, other = run
    result = claw_rl('replay', path, '--model', other)
    assert result.returncode == 1, result.stdout + result.stderr
    # From the first tick the policy acted in RL on (the autostart state machine may publish
    # its RL state one tick after the first command).
    assert 'DIFFERENT' in result.stdout and re.search(r'ticks [01]-', result.stdout)
    out = replay.replay_actions(events.load_recording(path), replay_robot(), OnnxPolicy(other))
    assert out.differing.sum() == out.compared.sum() >= 150  # every compared tick differs


def rewrite(src, dst, keep):
    """Copy a recording, keeping the messages for which keep(topic, index on topic) holds."""
    rec, seen, channels = Recorder(dst, read_metadata(src)), {}, {}
    with open(src, 'rb') as f:
        for schema, channel, message in make_reader(f).iter_messages(log_time_order=True):
            i = seen[channel.topic] = seen.get(channel.topic, -1) + 1
            if channel.topic not in channels:
                channels[channel.topic] = rec.add_topic(channel.topic, schema.name)
            if keep(channel.topic, i):
                rec.write(channels[channel.topic], channel.topic, message.data,
                          message.log_time, message.publish_time)
    return rec.close()


def test_lost_states_are_skipped_and_a_late_start_finds_the_gait_clock(run, robot, tmp_path):
    path, model, _ = run
    policy = OnnxPolicy(model)
    # Every 10th joint state lost (best effort): those ticks are skipped, the rest match.
    lossy = events.load_recording(rewrite(path, tmp_path / 'lossy.mcap', lambda t, i: not (
        t == '/joint_states' and i % 10 == 5)))
    out = replay.replay_actions(lossy, robot, policy)
    assert out.kind.count('skipped') >= 15 and not out.differing.any()
    # The sim replay steps once per control period between the states that were recorded.
    assert sim_comparison.compare_sim(lossy, robot).rms().max() < 1e-3
    # Every 10th command lost: the policy acted all the same (the clock moves on).
    deaf = events.load_recording(rewrite(path, tmp_path / 'deaf.mcap', lambda t, i: not (
        t == '/joint_commands' and i % 10 == 5)))
    out = replay.replay_actions(deaf, robot, policy)
    assert out.kind.count('missing') >= 15 and not out.differing.any()
    assert out.compared.sum() >= 0.8 * len(out.kind)
    # The recorder joined 7 ticks later: the clock offset is found, the ticks match.
    late = events.load_recording(rewrite(path, tmp_path / 'late.mcap', lambda t, i: i >= 7 or
                                         t in ('/policy/model_version', '/cmd_vel')))
    out = replay.replay_actions(late, robot, policy)
    assert out.phase_offset == expected_offset(out) and out.kind[0] == 'skipped'
    assert not out.differing.any() and out.compared.sum() > 150


def test_compare_sim_replays_the_commands_and_plots(run, tmp_path):
    path, _, _ = run
    png = tmp_path / 'cmp.png'
    result = claw_rl('replay', path, '--compare-sim', '--png', png)
    assert result.returncode == 0, result.stdout + result.stderr
    with Image.open(png) as image:
        assert image.format == 'PNG' and image.size[0] > 600
        assert np.asarray(image.convert('L')).std() > 10
    # The loop ran the nominal sim: replaying its commands there reproduces its joints.
    cmp = sim_comparison.compare_sim(events.load_recording(path), replay_robot())
    assert len(cmp.t) >= 200 and cmp.rms().max() < 1e-3
    assert np.ptp(cmp.recorded, axis=0).max() > 0.02  # the joints did move


def test_replay_usage_errors_exit_2(tmp_path, capsys):
    junk = tmp_path / 'junk.mcap'
    junk.write_bytes(b'not an mcap file')
    for argv, message in (([junk], 'nothing to do'), ([tmp_path / 'no.mcap', '--compare-sim'],
                                                      'no such file'),
                          ([junk, '--compare-sim'], 'not a readable MCAP recording')):
        assert cli.main(['replay', *map(str, argv)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count('\n') == 1, err


def test_remapped_topics_replay_by_their_recorded_roles(run, tmp_path):
    # A ros2_control robot: the same messages on the controllers' topic names.
    path, model, _ = run
    rename = {'/joint_states': '/joint_states', '/imu': '/imu_sensor_broadcaster/imu',
              '/joint_commands': '/forward_position_controller/commands'}
    for with_roles in (True, False):
        meta = dict(read_metadata(path))
        roles = json.loads(meta.pop('roles'))
        if with_roles:
            meta['roles'] = json.dumps({rename.get(t, t): r for t, r in roles.items()})
        dst = tmp_path / f'remapped_{with_roles}.mcap'
        rec, channels = Recorder(dst, meta), {}
        with open(path, 'rb') as f:
            for schema, channel, message in make_reader(f).iter_messages(log_time_order=True):
                topic = rename.get(channel.topic, channel.topic)
                if topic not in channels:
                    channels[topic] = rec.add_topic(topic, schema.name)
                rec.write(channels[topic], topic, message.data, message.log_time,
                          message.publish_time)
        rec.close()
        result = claw_rl('replay', dst, '--model', model)
        if with_roles:  # the same verdict, tick for tick, as under the original names
            original = claw_rl('replay', path, '--model', model)
            assert 'compared' in original.stdout, original.stdout + original.stderr
            assert (result.returncode, result.stdout) == (original.returncode, original.stdout)
        else:  # by last name alone, /forward_position_controller/commands is not a command
            assert result.returncode != 0 and 'no joint_commands recorded' in result.stderr
