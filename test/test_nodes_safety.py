"""policy_node alone, fed by the test over real DDS: bad JointState messages are dropped, counted
and never reach joint_commands; stale state -> default pose; a wrong-spec model at start-up is
refused with the differences named."""

from diagnostic_msgs.msg import DiagnosticArray
import numpy as np
import pytest
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Float64MultiArray

from claw_rl_ros.nodes.ros_io import COMMAND_QOS
from control_models import good_model, wrong_spec_model
from ros_helpers import NodeProcess
from test_nodes_loop import status


@pytest.fixture(scope='module')
def policy(ros_env, probe, robot, tmp_path_factory):
    d = tmp_path_factory.mktemp('safety')
    probe.subscribe('joint_commands', Float64MultiArray, COMMAND_QOS)
    probe.subscribe('/diagnostics', DiagnosticArray, 10)
    proc = NodeProcess('policy_node', ros_env, d,
                       {'model_path': str(good_model(robot, d / 'a.onnx')),
                        'stale_after_periods': 5.0})
    yield proc
    assert proc.stop() == 0, proc.log


class Robot:
    """Publishes Imu + JointState pairs stamped with the probe's (wall) clock."""

    def __init__(self, probe, robot):
        self.probe, self.robot = probe, robot

    def send(self, names=None, position=None, velocity=None, age=0.0):
        node = self.probe.node
        stamp = (node.get_clock().now().nanoseconds * 1e-9) - age
        sec = int(stamp)
        header = {'sec': sec, 'nanosec': int((stamp - sec) * 1e9)}
        imu = Imu()
        imu.header.stamp.sec, imu.header.stamp.nanosec = header['sec'], header['nanosec']
        imu.orientation.w = 1.0
        js = JointState(name=list(names or self.robot.joint_names))
        js.header.stamp = imu.header.stamp
        pos = self.robot.default_joint_pos if position is None else position
        js.position = [float(v) for v in pos]
        js.velocity = [0.0] * len(js.name) if velocity is None else velocity
        self.probe.publish('imu', imu)
        self.probe.publish('joint_states', js)


def test_bad_state_never_reaches_joint_commands(policy, probe, robot):
    q0 = robot.default_joint_pos
    feed = Robot(probe, robot)
    feed.send()
    probe.wait_subscribers('joint_states')
    probe.wait_subscribers('imu')
    nan = q0.copy()
    nan[3] = float('nan')
    feed.send(position=nan)  # before the first complete state: no command at all
    for _ in range(100):  # best-effort delivery: repeat until the first command comes back
        feed.send()
        if probe.wait_for('joint_commands', timeout=0.1, fail=False) is not None:
            break
    first = probe.since('joint_commands', 0)[0]
    assert np.abs(np.asarray(first.data) - q0).max() > 1e-3  # computed by the model
    start = probe.count('joint_commands')
    names = list(robot.joint_names)
    feed.send(position=nan)
    feed.send(names=names[:5] + ['FR_thigh'] + names[6:])  # misnamed
    feed.send(names=names[:-1], position=q0[:-1], velocity=[0.0] * 11)  # missing joint
    feed.send(position=q0[:-2])  # wrong length
    feed.send(age=1.0)  # stale
    diag = status(probe, 'policy_node', lambda v: int(v['dropped_non_finite']) >= 1 and
                  int(v['dropped_unknown_joint']) == 1 and int(v['dropped_missing_joint']) == 1
                  and int(v['dropped_wrong_length']) == 1 and int(v['dropped_stale']) >= 1)
    # (a stale state older than the last answered one gets no command at all)
    assert int(diag['holds_bad_input']) >= 4
    after = probe.since('joint_commands', start)
    assert len(after) >= 4
    assert all(np.array_equal(m.data, q0) for m in after)  # only the default pose
    # Then silence: the watchdog keeps holding the default pose.
    start = probe.count('joint_commands')
    held = probe.wait_count('joint_commands', start + 5)[start:]
    assert all(np.array_equal(m.data, q0) for m in held)
    status(probe, 'policy_node', lambda v: int(v['holds_stale']) > 3)


def test_wrong_spec_model_is_refused_at_start_up(ros_env, robot, tmp_path):
    proc = NodeProcess('policy_node', ros_env, tmp_path, {
        'model_path': str(wrong_spec_model(robot, tmp_path / 'w.onnx'))}, name='refuser')
    assert proc.wait_exit(timeout=30) == 1
    log = proc.log
    proc.stop()
    assert 'spec mismatch' in log and 'action_scale: model has 0.5, robot has 0.25' in log
