"""Lockstep sim_node + policy_node on sim time: one control step per command, /clock, the
std_srvs reset / pause / step services, and undecodable command bytes."""

from diagnostic_msgs.msg import DiagnosticArray
import numpy as np
import pytest
from rclpy.serialization import serialize_message
from rosgraph_msgs.msg import Clock
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import SetBool, Trigger

from claw_rl_ros.nodes.ros_io import COMMAND_QOS, SENSOR_QOS, to_sec
from control_models import good_model
from ros_helpers import NodeProcess, stop_all
from test_nodes_loop import status


@pytest.fixture(scope='module')
def loop(ros_env, probe, robot, tmp_path_factory):
    d = tmp_path_factory.mktemp('lockstep')
    probe.subscribe('/clock', Clock, SENSOR_QOS)
    sim = NodeProcess('sim_node', ros_env, d, {'mode': 'lockstep', 'command_timeout_s': 0.2})
    policy = NodeProcess('policy_node', ros_env, d, {
        'use_sim_time': True, 'model_path': str(good_model(robot, d / 'a.onnx'))})
    yield sim, policy
    codes = stop_all(policy, sim)
    assert codes == {'policy_node': 0, 'sim_node': 0}, sim.log + policy.log


def test_lockstep_steps_once_per_command_and_services_work(loop, probe, robot):
    dt = robot.control_dt
    probe.wait_count('/clock', 200, timeout=30)
    ticks = [to_sec(m.clock) for m in probe.since('/clock', 0)]
    steps = [round((b - a) / dt, 6) for a, b in zip(ticks, ticks[1:])]
    # Every state is answered by one command and one step: /clock moves in whole control
    # periods (0: the start-up state re-sent before the policy joined; >1: best-effort
    # messages this probe missed on a loaded machine).
    assert all(k >= 0 and k == int(k) for k in steps)
    assert steps.count(1.0) >= 0.9 * len(steps)
    refused = probe.call(Trigger, '/sim_node/step', Trigger.Request())
    assert not refused.success and 'pause first' in refused.message
    assert probe.call(SetBool, '/sim_node/pause', SetBool.Request(data=True)).success
    # Paused: each ~/step advances exactly one control period (the reply names the time).
    times = []
    for _ in range(3):
        reply = probe.call(Trigger, '/sim_node/step', Trigger.Request())
        assert reply.success
        times.append(float(reply.message.split()[2]))
    assert np.diff(times) == pytest.approx([dt, dt], abs=2e-3)
    reply = probe.call(Trigger, '/sim_node/reset', Trigger.Request())
    assert reply.success and reply.message == 'reset #2'
    assert probe.call(SetBool, '/sim_node/pause', SetBool.Request(data=False)).success
    resumed = probe.count('/clock')
    probe.wait_count('/clock', resumed + 50, timeout=20)  # the loop runs on by itself
    later = to_sec(probe.since('/clock', probe.count('/clock') - 1)[0].clock)
    assert later > times[-1] + 40 * dt


def test_undecodable_command_bytes_are_dropped_and_counted_while_the_loop_runs(
        loop, probe, robot):
    probe.subscribe('/diagnostics', DiagnosticArray, 100)
    valid = serialize_message(Float64MultiArray(data=list(robot.default_joint_pos)))
    # Cut short, a data count past the end, big endian, random bytes under a CDR header.
    garbage = [valid[:11], valid[:12] + b'\xff\xff\xff\x7f' + valid[16:],
               b'\x00\x00' + valid[2:], b'\x00\x01\x00\x00' + bytes(range(40))]
    for data in garbage:  # a raw publisher may send any bytes on the typed topic
        probe.publish('joint_commands', data, COMMAND_QOS, msg_type=Float64MultiArray)
    before = probe.count('/clock')
    v = status(probe, 'sim_node', lambda v: int(v['dropped_malformed']) >= 4, timeout=30)
    assert int(v['dropped_malformed']) == 4 and int(v['dropped_wrong_length']) == 0
    probe.wait_count('/clock', before + 50, timeout=20)  # the loop runs on
