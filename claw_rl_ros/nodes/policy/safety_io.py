"""The policy node's safety wiring (thin ROS glue around core/control/safety.py).

* parameters of the state machine, command shaping, verification gate and self-check
  (:class:`~...core.params.node_config.SafetyParams`) -> PolicyController arguments
  (:func:`safety_kwargs`);
* operator requests: ``~/operator`` (``std_msgs/String``: stand_up, rl, sit_down, passive,
  estop, reset) and one ``std_srvs/Trigger`` service per request (``~/stand_up`` ...), plus
  ``~/self_check`` (the start-up self-check report, success when nothing mismatches);
* ``safety/state`` (``std_msgs/String``, latched): the current state, on every transition;
  every transition is logged and triggers a ``/diagnostics`` message at once;
* ``joint_gains`` (``std_msgs/Float64MultiArray`` [Kp x J, Kd x J], ``joints`` order) with
  every command when ``publish_gains`` is true, for drivers that take gains (Kp = 0 in PASSIVE).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Trigger

from ...core.control.safety import REQUESTS, SafetyConfig
from ...core.control.self_check import controller_joints
from ...core.params.node_config import SafetyParams
from ..ros_io import COMMAND_QOS, doubles, LATCHED_QOS, now_sec, publisher, SENSOR_QOS

# QoS of the joint_states / imu subscriptions by parameter state_qos.
QOS = {'sensor_data': SENSOR_QOS, 'reliable': COMMAND_QOS}


def safety_kwargs(p: SafetyParams) -> dict[str, Any]:
    """PolicyController keyword arguments from the safety parameters."""
    fields = {name: getattr(p, name) for name in SafetyConfig.__dataclass_fields__}
    fields['sit_pose'] = tuple(p.sit_pose)
    return {'safety': SafetyConfig(**fields), 'cmd_vel_timeout_s': p.cmd_vel_timeout_s,
            'wall_stale_after_s': p.wall_stale_after_s,
            'max_delta_per_tick': p.max_delta_per_tick,
            'require_verification': p.require_verification,
            'command_joints': controller_joints(p.controllers_file, p.command_controller)
            if p.controllers_file else None}


class SafetyIO:
    """Operator requests in; state, transitions and gains out (see the module docstring)."""

    def __init__(self, node, ctrl):
        self.node, self.ctrl = node, ctrl
        self.log = node.get_logger()
        self.pub_state = publisher(node, String, 'safety/state', LATCHED_QOS)
        self.pub_gains = None
        if node.get_parameter('publish_gains').value:
            self.pub_gains = publisher(node, Float64MultiArray, 'joint_gains', COMMAND_QOS)
        node.create_subscription(String, '~/operator', self.on_operator, 10)
        for name in REQUESTS:
            node.create_service(Trigger, f'~/{name}', partial(self.on_service, name))
        node.create_service(Trigger, '~/self_check', self.on_self_check)
        self.pub_state.publish(String(data=ctrl.safety.state))

    def on_operator(self, msg: String) -> None:
        self.handle(msg.data.strip().lower())

    def on_service(self, name: str, request, response):
        response.success, response.message = self.handle(name)
        return response

    def on_self_check(self, request, response):
        problems = self.ctrl.check()
        response.success = not problems
        response.message = '; '.join(problems) if problems else 'all checks passed'
        return response

    def handle(self, name: str) -> tuple[bool, str]:
        ok, message = self.ctrl.request(name, now_sec(self.node))
        # (rclpy refuses two severities from one call site: one call per severity)
        if ok:
            self.log.info(f'operator {name}: {message}')
        else:
            self.log.warning(f'operator {name}: {message}')
        self.flush()
        return ok, message

    def after_tick(self) -> None:
        """After a command went out: its gains, then any transitions of the tick."""
        if self.pub_gains is not None:
            kp, kd = self.ctrl.last_gains
            self.pub_gains.publish(Float64MultiArray(data=doubles(kp) + doubles(kd)))
        self.flush()

    def flush(self) -> None:
        """Log the new alerts (once each: clock mismatch, restart, exceptions) and log and
        publish the transitions since the last call."""
        for _, text in self.ctrl.alerts.drain():
            self.log.error(text)
        transitions = self.ctrl.safety.drain()
        for t in transitions:
            if t.reason.startswith('fault'):
                self.log.warning(f'safety: {t}')
            else:
                self.log.info(f'safety: {t}')
        if transitions:
            self.pub_state.publish(String(data=self.ctrl.safety.state))
            self.node.publish_diagnostics()
