"""A real policy_node in RL under thousands of mixed valid and malformed messages (issue 20):
hostile doubles (nan, +-inf, +-1e39, subnormals), wrong lengths, random names, future and
backward stamps, undecodable bytes, on joint_states, imu and cmd_vel. Afterwards, on valid
input only, the process is alive, back in RL and commanding, and no command it ever published
was unsafe."""

from __future__ import annotations

import math
import time

from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import Twist
import numpy as np
import pytest
from rclpy.serialization import serialize_message
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Float64MultiArray

from claw_rl_ros.core.control.safety import FAULTS
from claw_rl_ros.nodes.ros_io import COMMAND_QOS, SENSOR_QOS
from control_models import good_model
from ros_helpers import NodeProcess, publish_state
from test_nodes_loop import status

HOSTILE = [math.nan, math.inf, -math.inf, 1e39, -1e39, 5e-324, 1e308, -1e308, 3.5e38]
MESSAGES = 3000


class Fuzzer:
    """Valid (IMU, joint state) pairs on the probe's wall clock, or a malformed message."""

    def __init__(self, probe, robot, seed=0):
        self.probe, self.robot = probe, robot
        self.rng = np.random.default_rng(seed)
        self.sent = self.malformed = 0
        self.poses: set[tuple[float, ...]] = set()  # 12-joint positions sent (spec order)

    def now(self) -> float:
        return self.probe.node.get_clock().now().nanoseconds * 1e-9

    def pair(self, stamp=None, pos=None, vel=None, names=None, quat=(0.0, 0.0, 0.0, 1.0),
             gyro=(0.0, 0.0, 0.0)) -> None:
        stamp = self.now() if stamp is None else stamp
        r = self.robot
        position = [float(v) for v in (r.default_joint_pos + self.rng.uniform(
            -0.05, 0.05, 12) if pos is None else pos)]
        if len(position) == 12:
            self.poses.add(tuple(position))
        publish_state(self.probe, r.joint_names if names is None else names, stamp, position,
                      np.zeros(12) if vel is None else vel, quat, gyro)
        self.sent += 2

    def bad(self) -> None:
        """One malformed message of a random kind (its partner is healthy)."""
        rng, r = self.rng, self.robot
        kind = int(rng.integers(0, 9))
        hostile = float(rng.choice(HOSTILE))
        one = np.zeros(12)
        one[int(rng.integers(0, 12))] = hostile
        self.malformed += 1
        if kind == 0:  # a hostile joint position or velocity
            self.pair(pos=r.default_joint_pos + one if rng.random() < 0.5 else None,
                      vel=one if rng.random() < 0.5 else None)
        elif kind == 1:  # a hostile gyro or orientation
            gyro = [0.0, 0.0, 0.0]
            gyro[int(rng.integers(0, 3))] = hostile
            self.pair(gyro=gyro if rng.random() < 0.5 else (0, 0, 0),
                      quat=(0, 0, hostile, 1.0) if rng.random() < 0.5 else (0, 0, 0, 1.0))
        elif kind == 2:  # wrong lengths
            n = int(rng.integers(0, 15))
            self.pair(pos=np.zeros(n), vel=np.zeros(int(rng.integers(0, 15))))
        elif kind == 3:  # random names
            names = list(rng.choice(list(r.joint_names) + ['x', '', 'FR_thigh'], size=12))
            self.pair(names=names)
        elif kind == 4:  # a future stamp (up to a minute ahead)
            self.pair(stamp=self.now() + float(rng.choice([0.2, 5.0, 60.0])))
        elif kind == 5:  # a backward stamp
            self.pair(stamp=self.now() - float(rng.choice([0.1, 5.0, 1e6])))
        elif kind == 6:  # a hostile cmd_vel
            cmd = Twist()
            cmd.linear.x, cmd.angular.z = hostile, float(rng.choice(HOSTILE))
            self.probe.publish('cmd_vel', cmd)
            self.sent += 1
        elif kind == 7:  # a stamp from another clock (sim time on a wall-time node)
            self.pair(stamp=float(rng.uniform(0.0, 100.0)))
        else:  # bytes that are not the message (a raw publisher on the typed topic)
            self.garbage()

    def garbage(self) -> None:
        """Undecodable bytes on joint_states or imu: a valid message cut short, random bytes
        under a CDR header, a count set huge, or another encoding's header."""
        rng, topic = self.rng, str(self.rng.choice(['joint_states', 'imu']))
        msg = JointState(name=list(self.robot.joint_names), position=[0.0] * 12,
                         velocity=[0.0] * 12) if topic == 'joint_states' else Imu()
        data = serialize_message(msg)
        kind = int(rng.integers(0, 4))
        if kind == 0:
            data = data[:int(rng.integers(0, 40))]
        elif kind == 1:
            data = b'\x00\x01\x00\x00' + rng.bytes(int(rng.integers(0, 64)))
        elif kind == 2:
            data = data[:16] + b'\xff\xff\xff\x7f' + data[20:]
        else:
            data = b'\x00\x00' + data[2:]
        self.probe.publish(topic, data)
        self.sent += 1


@pytest.fixture(scope='module')
def policy(ros_env, probe, robot, tmp_path_factory):
    d = tmp_path_factory.mktemp('fuzz')
    probe.subscribe('joint_commands', Float64MultiArray, COMMAND_QOS)
    probe.subscribe('/diagnostics', DiagnosticArray, 50)
    proc = NodeProcess('policy_node', ros_env, d,
                       {'model_path': str(good_model(robot, d / 'a.onnx'))})
    yield proc
    assert proc.stop() == 0, proc.log


def test_fuzzed_policy_node_stays_alive_and_never_commands_unsafely(
        policy, probe, robot):
    fuzz = Fuzzer(probe, robot, seed=20)
    fuzz.pair()  # creates the publishers
    probe.wait_subscribers('joint_states')
    probe.wait_subscribers('imu')
    for _ in range(200):  # best effort: until the first command comes back
        fuzz.pair()
        if probe.wait_for('joint_commands', timeout=0.1, fail=False) is not None:
            break
    status(probe, 'policy_node', lambda v: v['safety_state'] == 'RL')
    probe.publish('cmd_vel', Twist())
    for _ in range(MESSAGES):  # mixed: about one in two malformed
        fuzz.bad() if fuzz.rng.random() < 0.5 else fuzz.pair()
        # Paced by the node's answer (at most 5 ms), so it reads most of them: a best-effort
        # queue of 5 would drop a burst.
        probe.wait_for('joint_commands', timeout=0.005, start=probe.count('joint_commands'),
                       fail=False)
    assert policy.alive(), policy.log
    # Valid input only: the node re-arms (autostart) and commands again, in RL.
    start, dstart = probe.count('joint_commands'), probe.count('/diagnostics')

    def in_rl(msg):
        return any(s.name.endswith('policy') and {kv.key: kv.value for kv in s.values}.get(
            'safety_state') == 'RL' for s in msg.status)
    diag, deadline = None, time.monotonic() + 30.0
    # Until a report says RL (at the diagnostics period), however fast the node answers.
    while time.monotonic() < deadline:
        fuzz.pair()
        # Paced by the node's answer (or 20 ms), not by a bare sleep.
        probe.wait_for('joint_commands', timeout=0.02, start=probe.count('joint_commands'),
                       fail=False)
        if probe.count('joint_commands') > start + 20 and \
                probe.wait_for('/diagnostics', in_rl, timeout=0.0, start=dstart, fail=False):
            diag = status(probe, 'policy_node', lambda v: v['safety_state'] == 'RL',
                          start=dstart)
            break
    assert diag is not None, policy.log
    assert policy.alive(), policy.log
    commands = [np.asarray(m.data) for m in probe.since('joint_commands', 0)]
    lo, hi = robot.joint_lower, robot.joint_upper
    # Safe: finite, 12 long, and inside the joint limits, or else damping at a pose that was
    # measured (sent) itself: PASSIVE never pushes a joint back into its limits.
    unsafe = [c for c in commands if c.shape != (12,) or not np.isfinite(c).all()
              or (((c < lo - 1e-9).any() or (c > hi + 1e-9).any())
                  and tuple(c.tolist()) not in fuzz.poses)]
    faults = {f: int(diag[f'faults_{f}']) for f in FAULTS if int(diag[f'faults_{f}'])}
    print(f'\nfuzz: {fuzz.sent} messages sent, {fuzz.malformed} malformed, {len(commands)} '
          f'commands, {len(unsafe)} unsafe; faults {faults}; exceptions '
          f'{diag["exceptions_total"]}; dropped {diag["dropped_total"]}')
    assert not unsafe, unsafe[:3]
    assert int(diag['exceptions_total']) == 0, diag['last_exception']
    assert sum(faults.values()) > 50 and int(diag['dropped_out_of_range']) > 0
    assert int(diag['dropped_malformed']) > 20  # undecodable bytes: counted, never a crash
    assert probe.count('joint_commands') > start  # commands resumed


def test_undecodable_joint_states_are_dropped_counted_and_named(
        policy, probe, robot):
    js = serialize_message(JointState(name=list(robot.joint_names), position=[0.0] * 12,
                                      velocity=[0.0] * 12))
    probe.publish('joint_states', js[:30], SENSOR_QOS, msg_type=JointState)
    probe.wait_subscribers('joint_states')
    before = int(status(probe, 'policy_node')['dropped_malformed'])
    start = probe.count('/diagnostics')
    for _ in range(20):  # cut short in the names (best effort: some may be lost)
        probe.publish('joint_states', js[:30])
        probe.wait_for('joint_commands', timeout=0.005, start=probe.count('joint_commands'),
                       fail=False)
    # Wait for this test's cause: a late drop of the fuzz test before (its best-effort
    # messages may still be queued) also raises the count, with its own cause.
    v = status(probe, 'policy_node', lambda v: int(v['dropped_malformed']) > before
               and 'joint_states: undecodable message' in v['last_drop'], start=start)
    assert 'joint_states: undecodable message' in v['last_drop'], v['last_drop']
    assert policy.alive(), policy.log
