"""What real ROS tools see of sim_node + policy_node (real processes, loopback DDS): the sim's
state reaches a subscriber written the usual way (reliable, depth 10); every /diagnostics stamp
is on one clock; a late joiner of a latched topic gets the newest value only."""

import hashlib
import subprocess
import sys
import time

from diagnostic_msgs.msg import DiagnosticArray
from nav_msgs.msg import Odometry
import pytest
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import String, UInt8MultiArray

from claw_rl_ros.nodes.ros_io import STATE_QOS, to_sec
from control_models import good_model
from ros_helpers import _STARTED, NodeProcess, Probe, ROOT, stop_all

# A reader of a latched topic as ``ros2 topic echo --qos-durability transient_local`` is one:
# its own depth (10) is larger than the publisher's, so a late joiner gets the publisher's
# history, and every change after.
READER_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE,
                        durability=DurabilityPolicy.TRANSIENT_LOCAL)


@pytest.fixture(scope='module')
def models(robot, tmp_path_factory):
    d = tmp_path_factory.mktemp('models')
    return [good_model(robot, d / f'{k}.onnx', seed=k) for k in range(4)]


@pytest.fixture(scope='module')
def graph(ros_env, probe, tmp_path_factory):
    """sim_node (realtime, its default state QoS) + policy_node on sim time, as in the
    control graph; the probe listens from the start."""
    logs = tmp_path_factory.mktemp('logs')
    for topic, msg_type in (('joint_states', JointState), ('imu', Imu), ('odom', Odometry),
                            ('/clock', Clock), ('/diagnostics', DiagnosticArray)):
        probe.subscribe(topic, msg_type, 10)  # reliable, volatile, keep last 10
    for topic in ('policy/model_version', 'safety/state'):
        probe.subscribe(topic, String, READER_QOS)
    sim = NodeProcess('sim_node', ros_env, logs, {'mode': 'realtime'})
    policy = NodeProcess('policy_node', ros_env, logs, {'use_sim_time': True})
    yield {'sim': sim, 'policy': policy, 'logs': logs}
    codes = stop_all(policy, sim)
    assert codes == {'policy_node': 0, 'sim_node': 0}, sim.log + policy.log


def test_a_plain_reliable_subscriber_receives_the_sims_state(graph, probe):
    """``create_subscription(JointState, 'joint_states', 10)`` got nothing from a best-effort
    sim; it now publishes joint_states, imu, odom and /clock reliable, as ros2_control does."""
    for topic in ('joint_states', 'imu', 'odom', '/clock'):
        probe.wait_count(topic, 20, timeout=60)
    stamps = [to_sec(m.header.stamp) for m in probe.since('joint_states', 0)]
    assert stamps == sorted(stamps) and stamps[-1] > stamps[0]
    # The policy node's best-effort subscriptions read the reliable publisher too: it acts.
    assert 'sim_node: command timeout' not in graph['sim'].log


def test_every_diagnostics_stamp_is_wall_time(graph, probe):
    """sim_node (wall clock) and policy_node (use_sim_time) stamped /diagnostics with their
    own clocks: one topic, two clocks 1.8e9 s apart. Both now stamp wall time."""
    def latest(node):
        msg = probe.wait_for('/diagnostics', lambda m: any(
            s.name.startswith(f'{node}:') for s in m.status), timeout=60,
            start=probe.count('/diagnostics'))
        return to_sec(msg.header.stamp), time.time()

    for node in ('sim_node', 'policy_node'):
        stamp, now = latest(node)
        assert abs(stamp - now) < 60.0, (node, stamp, now)  # sim time here would be ~1e1 s
    clock = to_sec(probe.wait_for('/clock', start=probe.count('/clock')).clock)
    assert clock < 1e6  # (the sim clock runs from 0: a node stamping with it would differ)


def test_a_late_joiner_gets_only_the_newest_version_and_safety_state(
        graph, probe, models):
    """Depth 4 handed a late ``echo --once`` the oldest of four values (a model no longer
    served, PASSIVE while in RL); depth 1 hands it the current one, and nothing older."""
    shas = []
    for path in models[:3]:
        result = probe.set_parameter('/policy_node', 'model_path', str(path))
        assert result.successful, result.reason
        shas.append(hashlib.sha256(path.read_bytes()).hexdigest()[:12])
        probe.wait_for('policy/model_version', lambda m, s=shas[-1]: m.data == s, timeout=30)
    # With a model and the sim running, the safety state machine leaves PASSIVE.
    probe.wait_for('safety/state', lambda m: m.data != 'PASSIVE', timeout=60)
    states = probe.count('safety/state')
    late = Probe('late')
    try:
        for topic in ('policy/model_version', 'safety/state'):
            late.subscribe(topic, String, READER_QOS)
        first = late.wait_for('policy/model_version', timeout=30).data
        assert first == shas[-1], (first, shas)
        state = late.wait_for('safety/state', timeout=30).data
        # The newest state when the late one joined (or one the node moved to since).
        assert state in [m.data for m in probe.since('safety/state', states - 1)], (
            state, [m.data for m in probe.since('safety/state', 0)])
        # One more swap: everything the late joiner got before it is the history it was
        # handed (reliable delivery keeps the order): exactly one value.
        result = probe.set_parameter('/policy_node', 'model_path', str(models[3]))
        assert result.successful, result.reason
        newest = hashlib.sha256(models[3].read_bytes()).hexdigest()[:12]
        late.wait_for('policy/model_version', lambda m: m.data == newest, timeout=30)
        assert [m.data for m in late.since('policy/model_version', 0)] == [shas[-1], newest]
    finally:
        late.close()


def test_a_late_policy_node_gets_the_newest_model_bytes_only(
        ros_env, graph, probe, models, tmp_path):
    """Model bytes are latched with depth 1 too: a node joining later still gets the newest
    bytes (what a trainer activates), and no older ones."""
    ns = '/late_joiner'
    blobs = [path.read_bytes() for path in models[:2]]
    for data in blobs:
        probe.publish(f'{ns}/policy/model', UInt8MultiArray(data=data), STATE_QOS)
    oldest, newest = (hashlib.sha256(b).hexdigest() for b in blobs)
    policy = LatePolicy(ros_env, graph['logs'], ns)
    try:
        # Activate the newest by hash, paced by the node's replies: "no model with sha256"
        # until its bytes have arrived (the late joiner's latched delivery), then success.
        deadline = time.monotonic() + 90
        while True:
            result = probe.set_parameter(f'{ns}/policy_node', 'model_sha256', newest,
                                         timeout=30, resend_every=5)
            if result.successful or time.monotonic() > deadline or not policy.alive():
                break
            assert 'no model with sha256' in result.reason, result.reason
        assert result.successful, (result.reason, policy.log)
        assert f'model {newest[:12]} received and validated' in policy.log
        # The older bytes, published before the newest, would have arrived before them.
        result = probe.set_parameter(f'{ns}/policy_node', 'model_sha256', oldest)
        assert not result.successful and 'no model with sha256' in result.reason, result
        assert f'model {oldest[:12]} received' not in policy.log
        # Bytes not (yet) received: the requester has the reason and retries, the node's log
        # stays quiet (DEBUG); a model that is wrong is a warning.
        assert '[WARN]' not in policy.log and '[DEBUG]' in policy.log, policy.log
        missing = tmp_path / 'missing.onnx'
        result = probe.set_parameter(f'{ns}/policy_node', 'model_path', str(missing))
        assert not result.successful, result
        # (Logged before the reply is sent, to unbuffered stderr: in the file by now.)
        warnings = [line for line in policy.log.splitlines() if '[WARN]' in line]
        assert len(warnings) == 1 and 'hot swap rejected: ' in warnings[0] and \
            str(missing) in warnings[0], policy.log
    finally:
        code = policy.stop()
    assert code == 0, policy.log


class LatePolicy(NodeProcess):
    """policy_node (sim time) in namespace ``ns``."""

    def __init__(self, env, log_dir, ns):
        self.name = 'late_policy'
        self.log_path = log_dir / f'{self.name}.log'
        self._log = open(self.log_path, 'w')
        self.proc = subprocess.Popen(
            [sys.executable, '-m', 'claw_rl_ros.nodes.policy.policy_node', '--ros-args', '-r',
             f'__ns:={ns}', '-p', 'use_sim_time:=true',
             # DEBUG: the "received and validated" line the test waits for.
             '--log-level', f'{ns.strip("/").replace("/", ".")}.policy_node:=debug'],
            cwd=ROOT, env=env,
            stdout=self._log, stderr=subprocess.STDOUT)
        _STARTED.append(self)  # stopped by ros_env's safety net if the test fails early
