"""policy_node configured as the deploy graph configures it (autostart off, verification and
self-check required), fed by this test's own 50 Hz "robot" over real DDS: nothing is published
before a state arrives; PASSIVE damping; the operator steps it up (topic and services); an
e-stop is latched until reset; a tilt falls back to damping; gains follow the state (sent by
default: the self-check hears this test's subscriber and leaves its record beside the model)."""

import hashlib
import json
import math
import threading
import time

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
import numpy as np
import pytest
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Trigger

from claw_rl_ros.core import paths
from claw_rl_ros.core.export.drive_record import drive_path, read_drive_record
from claw_rl_ros.core.export.verification_record import verification_path
from claw_rl_ros.nodes.ros_io import COMMAND_QOS, LATCHED_QOS, to_stamp
from control_models import good_model
from ros_helpers import NodeProcess, stop_all
from test_nodes_loop import status

DEPLOY = {'use_sim_time': False, 'autostart': False, 'require_verification': True,
          'stand_up_s': 0.4, 'fade_in_s': 0.2, 'tilt_limit': 0.8, 'gains_source': 'sent',
          'controllers_file': str(paths.config_path('ros2_control_claw_quadruped.yaml')),
          # Wiring, not thresholds, is tested here (test_safety.py has those): on a loaded
          # machine a niced process may see 60 ms old state, so allow 10 periods.
          'stale_after_periods': 10.0}


@pytest.fixture(scope='module')
def nodes(ros_env, probe, robot, tmp_path_factory):
    d = tmp_path_factory.mktemp('deploy')
    model = good_model(robot, d / 'student.onnx')
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    verification_path(model).write_text(json.dumps({
        'model_sha256': sha, 'passed': True, 'table': [], 'created': '2026-11-30T23:00:00Z'}))
    for topic, msg_type, qos in (('joint_commands', Float64MultiArray, COMMAND_QOS),
                                 ('joint_gains', Float64MultiArray, COMMAND_QOS),
                                 ('safety/state', String, LATCHED_QOS),
                                 ('/diagnostics', DiagnosticArray, 10)):
        probe.subscribe(topic, msg_type, qos)
    deploy = NodeProcess('policy_node', ros_env, d, {**DEPLOY, 'model_path': str(model)})
    # The sim default (autostart) must be as silent without state.
    auto = NodeProcess('policy_node', ros_env, d, {
        'use_sim_time': False, 'model_path': str(model)}, name='auto')
    yield deploy, auto, model
    codes = stop_all(deploy, auto)
    assert codes == {'policy_node': 0, 'auto': 0}, deploy.log + auto.log


class Feeder:
    """A 50 Hz robot: Imu + JointState from a thread on a fixed schedule, stamped with the
    scheduled (wall) time as ros2_control's update loop stamps its state."""

    def __init__(self, probe, robot):
        self.probe, self.names, self.control_dt = probe, list(robot.joint_names), robot.control_dt
        self.pos = robot.default_joint_pos + np.where(np.arange(12) % 3 == 2, -0.6, 0.3)
        self.tilt = 0.0
        self.stop = threading.Event()
        self.send(time.time())  # creates the publishers on this thread, before the loop
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        t = time.time()
        while not self.stop.is_set():
            # A late slot is skipped, not bunched.
            t = max(t + self.control_dt, time.time() - self.control_dt)
            if self.stop.wait(max(0.0, t - time.time())):
                break
            self.send(t)

    def send(self, t):
        stamp = to_stamp(t)
        imu = Imu()
        imu.header.stamp = stamp
        imu.orientation.x, imu.orientation.w = math.sin(self.tilt / 2), math.cos(self.tilt / 2)
        js = JointState(name=self.names, position=[float(v) for v in self.pos],
                        velocity=[0.0] * 12)
        js.header.stamp = stamp
        self.probe.publish('imu', imu)
        self.probe.publish('joint_states', js)


def state_is(probe, name, timeout=10.0):
    probe.wait_for('safety/state', lambda m: m.data == name, timeout,
                   start=max(0, probe.count('safety/state') - 1))


def trigger(probe, name):
    reply = probe.call(Trigger, f'/policy_node/{name}', Trigger.Request())
    return reply.success, reply.message


def until_ok(probe, name, retry_on=('no fresh', 'rate', 'not reached')):
    """Trigger ``name`` until it succeeds; refusals for timing (a loaded machine delays the
    feeder past the freshness limit, or the stand-up is under way) are retried."""
    for _ in range(100):
        ok, message = trigger(probe, name)
        if ok or not any(word in message for word in retry_on):
            return ok, message
        probe.wait_count('joint_commands', probe.count('joint_commands') + 3)
    return ok, message


def test_nothing_is_published_before_a_state_arrives(nodes, probe):
    state_is(probe, 'PASSIVE')
    # Three diagnostics rounds of each node (1 Hz) without any state: not a single command.
    for node in ('policy_node', 'auto'):
        for k in range(3):
            status(probe, node, lambda v, k=k: True, start=probe.count('/diagnostics'))
    ok, message = trigger(probe, 'stand_up')
    assert not ok and 'no fresh complete joint state' in message
    assert probe.count('joint_commands') == 0 and probe.count('joint_gains') == 0


def test_operator_steps_estop_and_tilt_fall_back(nodes, probe, robot):
    deploy, auto, model = nodes
    assert auto.stop() == 0  # from here on only the deploy node answers
    feed = Feeder(probe, robot)
    first = probe.wait_for('joint_commands', timeout=20)
    np.testing.assert_allclose(first.data, feed.pos)  # PASSIVE: damping at the measured pose
    gains = probe.wait_for('joint_gains')
    assert np.array_equal(gains.data[:12], np.zeros(12)) and np.allclose(gains.data[12:], 0.75)
    assert not trigger(probe, 'rl')[0]  # not from PASSIVE
    probe.publish('/policy_node/operator', String(data='stand_up'))
    probe.wait_subscribers('/policy_node/operator')
    probe.publish('/policy_node/operator', String(data='stand_up'))  # the first may be lost
    state_is(probe, 'STAND_UP')
    q0 = robot.default_joint_pos
    probe.wait_for('joint_commands', lambda m: np.allclose(m.data, q0),
                   start=probe.count('joint_commands'))
    ok, message = until_ok(probe, 'rl')
    assert ok, message
    state_is(probe, 'RL')
    # The rl request's self-check heard a subscriber of the gains (this probe) and wrote what
    # it found beside the model, on a thread of its own (the policy card shows it).
    for _ in range(100):
        if drive_path(model).is_file():
            break
        time.sleep(0.05)
    record = read_drive_record(model)
    assert (record['source'], record['verdict'], record['topic']) == ('sent', 'sent',
                                                                      '/joint_gains')
    assert record['model_sha256'] == hashlib.sha256(model.read_bytes()).hexdigest()
    start = probe.count('joint_commands')
    acting = probe.wait_count('joint_commands', start + 20)[start:]
    assert np.abs(np.asarray(acting[-1].data) - q0).max() > 1e-3  # the policy acts
    assert np.allclose(probe.since('joint_gains', probe.count('joint_gains') - 1)[0].data[:12],
                       robot.kp)
    # E-stop: PASSIVE at once, latched (diagnostics level ERROR), refused until reset.
    probe.publish('/policy_node/operator', String(data='estop'))
    state_is(probe, 'PASSIVE')
    diag = status(probe, 'policy_node', lambda v: v['estop_latched'] == 'True')
    assert diag['last_transition'].startswith('RL -> PASSIVE (fault estop')
    msg = probe.wait_for('/diagnostics', lambda m: any(
        s.name.startswith('policy_node') and s.level == DiagnosticStatus.ERROR
        for s in m.status))
    assert msg is not None
    start = probe.count('joint_commands')
    np.testing.assert_allclose(probe.wait_count('joint_commands', start + 3)[-1].data, feed.pos)
    ok, message = trigger(probe, 'stand_up')
    assert not ok and 'e-stop latched' in message
    assert trigger(probe, 'reset') == (True, 'e-stop latch cleared')
    # Up again, then a tilt beyond tilt_limit falls back to damping by itself.
    ok, message = until_ok(probe, 'stand_up')
    assert ok, message
    state_is(probe, 'STAND_UP')
    ok, message = until_ok(probe, 'rl')
    assert ok, message
    state_is(probe, 'RL')
    feed.tilt = 1.0
    state_is(probe, 'PASSIVE')
    diag = status(probe, 'policy_node', lambda v: int(v['faults_tilt']) == 1)
    assert diag['last_transition'].startswith('RL -> PASSIVE (fault tilt: 1.000 rad')
    assert diag['safety_state'] == 'PASSIVE' and 'latency_p99_ms' in diag
    # With nothing subscribed to the gains the self-check refuses RL (the node's real count).
    for sub in [s for s in probe.node.subscriptions if s.topic_name == '/joint_gains']:
        probe.node.destroy_subscription(sub)
    for _ in range(100):
        ok, message = trigger(probe, 'self_check')
        if 'nothing subscribes' in message:
            break
        time.sleep(0.05)
    assert not ok and 'drive gains: sent on /joint_gains, but nothing subscribes to it' in message
    feed.stop.set()
    feed.thread.join()
    assert 'safety: RL -> PASSIVE (fault tilt' in deploy.log
