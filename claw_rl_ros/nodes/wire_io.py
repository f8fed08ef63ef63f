"""The control loop's hot topics read from their bytes (raw subscriptions; thin ROS glue).

Plain little-endian CDR, what every rmw on x86 sends, is read by
:mod:`..core.wire_format` into numpy views, without the message object rclpy would build
(bench/ros_control.py measures the step with and without). Another encoding goes to rclpy's
own deserialisation. Bytes that are neither raise :class:`WireError` naming the topic and what
is wrong: a raw publisher can send anything on a typed topic, and such bytes are dropped and
counted by the node, never a crash.
"""

from __future__ import annotations

import numpy as np
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Float64MultiArray

from ..core.wire_format import (ForeignEncoding, JointStateReader, read_float64_array,
                                read_imu, WireError)
from .ros_io import to_sec

__all__ = ['StateDecoder', 'command_data', 'WireError']


def _deserialize(data: bytes, msg_type: type, topic: str):
    try:
        return deserialize_message(data, msg_type)
    except Exception as exc:  # noqa: BLE001 - any failure is bytes that are not the message
        raise WireError(f'{topic}: not plain CDR and rclpy cannot deserialise it either '
                        f'({type(exc).__name__})') from None


class StateDecoder:
    """joint_states and imu bytes -> the arrays the policy controller takes."""

    def __init__(self):
        self._joint_states = JointStateReader()

    def joint_state(self, data: bytes
                    ) -> tuple[float, tuple[str, ...], np.ndarray, np.ndarray]:
        """(stamp [s], names, [n] position, [n] velocity)."""
        try:
            return self._joint_states.read(data)[:4]
        except ForeignEncoding:
            m = _deserialize(data, JointState, 'joint_states')
            return to_sec(m.header.stamp), tuple(m.name), np.asarray(m.position, float), \
                np.asarray(m.velocity, float)

    @staticmethod
    def imu(data: bytes) -> tuple[float, np.ndarray, np.ndarray]:
        """(stamp [s], [4] orientation x y z w, [3] angular velocity)."""
        try:
            return read_imu(data)
        except ForeignEncoding:
            m = _deserialize(data, Imu, 'imu')
            q, w = m.orientation, m.angular_velocity
            return to_sec(m.header.stamp), np.array([q.x, q.y, q.z, q.w]), \
                np.array([w.x, w.y, w.z])


def command_data(data: bytes) -> np.ndarray:
    """[n] data of a Float64MultiArray command's bytes."""
    try:
        return read_float64_array(data)
    except ForeignEncoding:
        m = _deserialize(data, Float64MultiArray, 'joint_commands')
        return np.asarray(m.data, float)
