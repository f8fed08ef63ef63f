"""The policy node's excitation wiring (thin ROS glue around core/control/excitation.py).

* parameters ``excite_*`` (:data:`~...core.params.node_config.ExcitationLimits`: variant,
  pattern, amplitude, band, lengths) -> the run's :class:`ExcitationConfig`, checked against
  the robot at start-up: a value it cannot run refuses the start, naming the parameter
  (:func:`excitation_config`);
* the operator starts and stops it like the other requests (:mod:`.safety_io`): ``~/excite``
  and ``~/excite_stop`` (``std_srvs/Trigger``) or ``excite`` / ``excite_stop`` on
  ``~/operator``; ``safety/state`` says ``EXCITE`` while it runs;
* ``policy/excitation`` (``std_msgs/String``, latched): JSON of the run (config, duration,
  segments with their joints, ``start_stamp``: the stamp of the first state it answered, its
  time 0) and the node's parameters; published at start-up (``start_stamp`` null) and when a
  run starts, for the recorder (system identification rebuilds the plan from it).
"""

from __future__ import annotations

import dataclasses
import json

from std_msgs.msg import String

from ...core.control.excitation import ExcitationConfig, from_params
from ...core.params.node_config import EXCITE, excitation_values, PolicyParams
from ...core.sim.robot_spec import RobotSpec
from ..ros_io import LATCHED_QOS, publisher


def excitation_config(p: PolicyParams, robot: RobotSpec) -> ExcitationConfig:
    """The ``excite_*`` parameters as a config the robot can run (ConfigError, a ValueError,
    naming the parameter: the node refuses to start)."""
    return from_params(excitation_values(p), robot, 'policy_node parameters', EXCITE)


class ExcitationIO:
    """The run's record out (see the module docstring)."""

    def __init__(self, node, ctrl, p: PolicyParams):
        self.node, self.ctrl = node, ctrl
        self.parameters = dataclasses.asdict(p)
        self.pub = publisher(node, String, 'policy/excitation', LATCHED_QOS)
        self.publish(None)

    def publish(self, start_stamp: float | None) -> None:
        record = {'node': self.node.get_fully_qualified_name(),
                  'robot': self.ctrl.robot.name, 'command_joints': list(self.ctrl.order.output),
                  **self.ctrl.excitation.describe(start_stamp), 'parameters': self.parameters}
        self.pub.publish(String(data=json.dumps(record)))

    def after_tick(self) -> None:
        """After a command went out: the run's record when it just started."""
        start = self.ctrl.take_excitation_start()
        if start is not None:
            self.publish(start)
            self.node.get_logger().info(
                f'excitation started: {self.ctrl.excitation.cfg.variant} variant, '
                f'{self.ctrl.excitation.cfg.pattern}, {self.ctrl.excitation.duration:g} s')
