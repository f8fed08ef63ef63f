"""recorder_node: what the policy saw and did, to an MCAP file ``ros2 bag`` and Foxglove open.

Thin glue over :class:`claw_rl_ros.core.replay.recording.Recorder`: raw subscriptions (the
serialised CDR bytes as DDS delivered them, never re-encoded) to ``joint_states``, ``imu``,
``cmd_vel``, ``joint_commands``, ``policy/model_version``, ``safety/state``, ``odom``,
``joint_gains`` (the gains sent with each command) and ``policy/excitation`` (the policy
node's excitation and parameters, JSON: system identification cuts the ``EXCITE`` segment of
``safety/state`` and rebuilds its plan) (relative names: a namespace or remapping moves them;
a topic nobody publishes just stays empty). ``joint_states`` are recorded as published,
``effort`` included when the driver gives it. The QoS matches each publisher's (sensor data
best effort; commands reliable; the model version and the excitation latched).
``publish_time`` is the publisher's source timestamp, so replay can order states and commands
causally. Parameters: :class:`~..core.params.node_config.RecorderParams`
(``path`` is required). The file is complete after Ctrl-C (written as ``<path>.part``, renamed
on shutdown). Diagnostics count the messages written and the publishers matched per topic
(``publishers /joint_commands``: a graph can wait for the recorder to hear a node before
letting it act).
"""

from __future__ import annotations

import json
import time

from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import Twist
from nav_msgs.msg import Odometry
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Float64MultiArray, String

from ..core.replay.recording import Recorder
from ..core.sim.robot import load_robot
from ..core.params.node_config import RecorderParams
from .node_params import declare
from .ros_io import diagnostics, SENSOR_QOS, spin, steady_timer

# Deep queues: a recorder that falls behind for a moment (a loaded machine) catches up
# instead of losing messages; the QoS policies stay compatible with each publisher's.
RELIABLE = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
SENSOR_DEEP = QoSProfile(depth=1000, reliability=ReliabilityPolicy.BEST_EFFORT,
                         durability=SENSOR_QOS.durability)
# The latched version (publisher depth 1): the current one on joining, then every change.
LATCHED_DEEP = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                          durability=DurabilityPolicy.TRANSIENT_LOCAL)
TOPICS = {'joint_states': (JointState, SENSOR_DEEP), 'imu': (Imu, SENSOR_DEEP),
          'cmd_vel': (Twist, RELIABLE), 'joint_commands': (Float64MultiArray, RELIABLE),
          'policy/model_version': (String, LATCHED_DEEP), 'safety/state': (String, RELIABLE),
          'odom': (Odometry, SENSOR_DEEP), 'joint_gains': (Float64MultiArray, RELIABLE),
          'policy/excitation': (String, LATCHED_DEEP)}


def type_name(msg_type) -> str:
    """``pkg/msg/Type`` of a generated message class."""
    return f'{msg_type.__module__.split(".")[0]}/msg/{msg_type.__name__}'


class RecorderNode(Node):
    """Parameters: :class:`~..core.params.node_config.RecorderParams` (``ros2 param describe``)."""

    rec: Recorder | None = None  # None: __init__ refused before it was built

    def __init__(self, **node_options):  # (rclpy Node options: node_container)
        super().__init__('recorder_node', **node_options)
        p = declare(self, RecorderParams)
        path, topics = p.path, p.topics or list(TOPICS)
        robot = load_robot(p.robot)
        joints = p.joints or list(robot.joint_names)
        if not path:
            raise ValueError('parameter path is empty; give the MCAP file to write, e.g. '
                             '-p path:=run.mcap (graphs: record:=run.mcap)')
        unknown = sorted(set(topics) - set(TOPICS))
        if unknown:
            raise ValueError(f'parameter topics has {unknown}; record a subset of '
                             f'{list(TOPICS)}')
        # Each topic's role by its resolved (remapped) name, e.g. /forward_position_controller/
        # commands is joint_commands on a ros2_control robot: replay reads it from here.
        names = {topic: self.resolve_topic_name(topic) for topic in topics}
        self.rec = Recorder(path, {'robot': robot.name, 'joints': ','.join(joints),
                                   'control_dt': robot.control_dt,
                                   'roles': json.dumps({n: t for t, n in names.items()})})
        self.subs = {}
        for topic in topics:
            msg_type, qos = TOPICS[topic]
            name = names[topic]
            channel = self.rec.add_topic(name, type_name(msg_type))
            self.subs[name] = self.create_subscription(msg_type, topic, self.writer(channel, name),
                                                       qos, raw=True)
        self.pub_diag = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        steady_timer(self, 1.0, self.publish_diagnostics)
        self.get_logger().info(f'recording {", ".join(topics)} to {path}')

    def writer(self, channel: int, topic: str):
        def on_message(data: bytes, info) -> None:
            received = info['received_timestamp'] or time.time_ns()
            self.rec.write(channel, topic, data, received,
                           info['source_timestamp'] or received)
        return on_message

    def publish_diagnostics(self) -> None:
        fields = {'path': str(self.rec.path), 'bytes': self.rec.bytes,
                  **{f'messages {t}': n for t, n in self.rec.counts.items()},
                  **{f'publishers {t}': s.get_publisher_count() for t, s in self.subs.items()}}
        self.pub_diag.publish(diagnostics(self, 'recorder', 'ok', 'recording', fields))

    def destroy_node(self) -> None:
        if self.rec is not None:
            self.rec.close()
        super().destroy_node()


def main(args=None) -> int:
    return spin(RecorderNode, args)


if __name__ == '__main__':
    raise SystemExit(main())
