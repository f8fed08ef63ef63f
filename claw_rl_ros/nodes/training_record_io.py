"""The policy node's training records on the wire: one per RL tick on ``policy/training_step``.

policy_node (``training: true``) publishes a ``std_msgs/Float64MultiArray`` whose fields are
labelled in ``layout.dim`` (:mod:`~claw_rl_ros.core.control.loop_record`) just before the
command it belongs to; sim_node's training mode (:mod:`.sim.loop_actor_io`) pairs it with the step.
"""

from __future__ import annotations

import numpy as np
from std_msgs.msg import Float64MultiArray, MultiArrayDimension, MultiArrayLayout

from ..core.control.loop_record import pack_record, PolicyRecord, unpack_record
from .ros_io import doubles

RECORD_TOPIC = 'policy/training_step'


def record_msg(record: PolicyRecord) -> Float64MultiArray:
    """A policy record as a labelled Float64MultiArray."""
    layout, data = pack_record(record)
    dims = [MultiArrayDimension(label=name, size=size, stride=size) for name, size in layout]
    return Float64MultiArray(layout=MultiArrayLayout(dim=dims), data=doubles(data))


def msg_record(msg: Float64MultiArray, obs_dim: int, num_actions: int) -> PolicyRecord:
    """The record in a message; ValueError naming what does not fit."""
    layout = [(d.label, d.size) for d in msg.layout.dim]
    return unpack_record(layout, np.frombuffer(msg.data, np.float64) if len(msg.data) else (),
                         obs_dim, num_actions)
