"""The sim node's published state: joint_states, imu, odom, /clock, and the episode record.

The messages are made once and refilled each step; ``send()`` publishes what ``fill()`` put in,
so an unanswered lockstep state is re-sent unchanged. joint_states goes out last: the policy acts
on it, after everything it needs. joint_states, imu and /clock go out as their CDR bytes,
refilled in place (:mod:`...core.wire_format`): no message object converted per step. The
episode record (:mod:`...core.verify.episode_record`) goes out on ``~/episode``, latched, once per
episode.
"""

from __future__ import annotations

import array
import math
import time

from nav_msgs.msg import Odometry
import numpy as np
from rclpy.node import Node
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Float64MultiArray, MultiArrayDimension

from ...core.verify.episode_record import EpisodeRecorder, ROW_DIM
from ...core.wire_format import ClockWriter, ImuWriter, JointStateWriter
from ...core.sim.robot_spec import RobotSpec
from ..ros_io import publisher, STATE_QOS, to_stamp

# Seconds between two looks at odom's subscriber count: a new listener (a probe, rqt, the
# sim2sim gate's recorder) gets ground truth within this long of its discovery.
ODOM_RECHECK_S = 0.25


class SimStateIO:
    """Publishers and reused messages of one sim node's state (``qos``: of the state topics)."""

    def __init__(self, node: Node, robot: RobotSpec, qos, publish_clock: bool):
        self.publish_clock = publish_clock
        self.js = JointStateWriter(robot.joint_names)
        self.imu = ImuWriter(robot.imu_body)
        self.clock = ClockWriter()
        self.odom = Odometry(child_frame_id=robot.base_body)
        self.odom.header.frame_id = 'odom'
        self.odom_filled, self.stamp_s = False, 0.0
        self.pub_js = publisher(node, JointState, 'joint_states', qos)
        self.pub_imu = publisher(node, Imu, 'imu', qos)
        self.pub_odom = publisher(node, Odometry, 'odom', qos)
        self.pub_clock = publisher(node, Clock, '/clock', qos)
        # Whether anyone reads odom, asked of the DDS at most every ODOM_RECHECK_S (a call
        # into the middleware per step otherwise).
        self.odom_listened, self.odom_checked = False, -math.inf
        self.node, self.pub_episode = node, None

    def fill(self, r, stamp_s: float) -> None:
        """Put the sim's readings ``r`` under stamp ``stamp_s`` [s] into the messages."""
        self.restamp(stamp_s)
        self.imu.fill(r.imu_quat, r.imu_gyro, r.imu_acc)
        self.js.fill(r.joint_pos, r.joint_vel, r.joint_effort)
        self.readings, self.odom_filled = r, False

    def restamp(self, stamp_s: float) -> None:
        """Put stamp ``stamp_s`` [s] on the state's messages (also a wall-clock state sent
        again)."""
        self.stamp_s = stamp_s
        self.imu.set_stamp(stamp_s)
        self.js.set_stamp(stamp_s)
        self.clock.set_stamp(stamp_s)

    def _fill_odom(self) -> None:
        """Ground truth, filled only for a state someone listens to (at its first send)."""
        r, pose, twist = self.readings, self.odom.pose.pose, self.odom.twist.twist
        pose.position.x, pose.position.y, pose.position.z = r.base_pos.tolist()
        q = pose.orientation
        q.w, q.x, q.y, q.z = r.base_quat.tolist()
        twist.linear.x, twist.linear.y, twist.linear.z = r.base_lin_vel.tolist()
        twist.angular.x, twist.angular.y, twist.angular.z = r.base_ang_vel.tolist()
        self.odom_filled = True

    def send(self) -> None:
        """Publish the filled state, joint_states last."""
        if self.publish_clock:
            self.pub_clock.publish(self.clock.payload())
        now = time.monotonic()
        if now - self.odom_checked > ODOM_RECHECK_S:
            self.odom_listened = self.pub_odom.get_subscription_count() > 0
            self.odom_checked = now
        if self.odom_listened:  # ground truth only when listened to
            if not self.odom_filled:
                self._fill_odom()
            self.odom.header.stamp = to_stamp(self.stamp_s)  # (a re-sent state: restamped)
            self.pub_odom.publish(self.odom)
        self.pub_imu.publish(self.imu.payload())
        self.pub_js.publish(self.js.payload())

    def send_episode(self, recorder: EpisodeRecorder) -> None:
        """The record on ``~/episode`` (Float64MultiArray [T, C], latched: a gate that asks
        late still reads the last one); dimension labels ``state`` and the column names."""
        if self.pub_episode is None:
            self.pub_episode = publisher(self.node, Float64MultiArray, '~/episode', STATE_QOS)
        table = recorder.table()
        msg = Float64MultiArray()
        rows, width = table.shape
        msg.layout.dim = [MultiArrayDimension(label=ROW_DIM, size=rows, stride=rows * width),
                          MultiArrayDimension(label=','.join(recorder.columns), size=width,
                                              stride=width)]
        msg.data = array.array('d', np.ascontiguousarray(table).tobytes())
        self.pub_episode.publish(msg)


def episode_layout(msg: Float64MultiArray) -> tuple[list[str], list[int], np.ndarray]:
    """(labels, sizes, data) of a received record, for core's ``read_episode``."""
    return ([d.label for d in msg.layout.dim], [d.size for d in msg.layout.dim],
            np.frombuffer(msg.data, dtype=np.float64) if len(msg.data) else np.zeros(0))
