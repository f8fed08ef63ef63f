"""Lockstep sim_node + policy_node on sim time: one control step per command, /clock, and the
std_srvs reset / pause / step services."""

from nav_msgs.msg import Odometry
import pytest
from rosgraph_msgs.msg import Clock
from std_srvs.srv import SetBool, Trigger

from claw_rl_ros.nodes.ros_io import SENSOR_QOS, to_sec
from control_models import good_model
from ros_helpers import NodeProcess, probe, ros_env  # noqa: F401 - pytest fixtures


@pytest.fixture(scope='module')
def loop(ros_env, probe, robot, tmp_path_factory):  # noqa: F811
    d = tmp_path_factory.mktemp('lockstep')
    probe.subscribe('/clock', Clock, SENSOR_QOS)
    probe.subscribe('odom', Odometry, SENSOR_QOS)
    sim = NodeProcess('sim_node', ros_env, d, {'mode': 'lockstep', 'command_timeout_s': 0.2})
    policy = NodeProcess('policy_node', ros_env, d, {
        'use_sim_time': True, 'model_path': str(good_model(robot, d / 'a.onnx'))})
    yield sim, policy
    for proc in (policy, sim):
        assert proc.stop() == 0, proc.log


def clock(probe):  # noqa: F811
    return to_sec(probe.since('/clock', probe.count('/clock') - 1)[0].clock)


def test_lockstep_steps_once_per_command_and_services_work(loop, probe, robot):  # noqa: F811
    dt = robot.control_dt
    probe.wait_count('/clock', 200, timeout=30)
    ticks = [to_sec(m.clock) for m in probe.since('/clock', 0)]
    steps = [round((b - a) / dt, 6) for a, b in zip(ticks, ticks[1:])]
    # Every state is answered by one command and one step: /clock advances by exactly dt
    # (0: the start-up state re-sent before the policy joined; 2: a best-effort message the
    # probe missed under load).
    assert set(steps) <= {0.0, 1.0, 2.0} and steps.count(1.0) >= 0.95 * len(steps)
    refused = probe.call(Trigger, '/sim_node/step', Trigger.Request())
    assert not refused.success and 'pause first' in refused.message
    assert probe.call(SetBool, '/sim_node/pause', SetBool.Request(data=True)).success
    paused_at = probe.count('/clock')
    before = clock(probe)
    reply = probe.call(Trigger, '/sim_node/step', Trigger.Request())
    assert reply.success
    stepped = to_sec(probe.wait_for('/clock', lambda m: to_sec(m.clock) > before,
                                    start=paused_at).clock)
    reply = probe.call(Trigger, '/sim_node/step', Trigger.Request())
    probe.wait_for('/clock', lambda m: to_sec(m.clock) > stepped + dt / 2, start=paused_at)
    assert clock(probe) == pytest.approx(stepped + dt, abs=1e-6)
    reply = probe.call(Trigger, '/sim_node/reset', Trigger.Request())
    assert reply.success and 'reset' in reply.message
    odom = probe.wait_for('odom', lambda m: abs(m.pose.pose.position.z -
                                                robot.init_base_height) < 1e-9)
    assert odom.pose.pose.position.x == 0.0
    assert probe.call(SetBool, '/sim_node/pause', SetBool.Request(data=False)).success
    resumed = probe.count('/clock')
    probe.wait_count('/clock', resumed + 50, timeout=20)  # the loop runs on by itself
