"""The policy node's safety wiring (thin ROS glue around core/deploy/safety.py).

* parameters of the state machine, command shaping, verification gate and self-check
  (:func:`declare_safety`);
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

from rclpy.node import Node
from rclpy.parameter import Parameter
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Trigger

from ..core.deploy.safety import REQUESTS, SafetyConfig
from ..core.deploy.self_check import controller_joints
from .ros_io import COMMAND_QOS, doubles, LATCHED_QOS, now_sec, publisher, SENSOR_QOS

QOS = {'sensor_data': SENSOR_QOS, 'reliable': COMMAND_QOS}
READ_ONLY = ('autostart', 'require_verification', 'publish_gains', 'controllers_file',
             'command_controller', 'state_qos', 'max_delta_per_tick', 'sit_pose',
             'cmd_vel_timeout_s', 'wall_stale_after_s', *SafetyConfig.__dataclass_fields__)


def declare_safety(node: Node) -> dict[str, Any]:
    """Declare the safety parameters; returns PolicyController keyword arguments."""
    node.declare_parameter('publish_gains', False)  # read by SafetyIO
    fields = {}
    for name, f in SafetyConfig.__dataclass_fields__.items():
        if name != 'sit_pose':
            fields[name] = node.declare_parameter(name, f.default).value
    sit = node.declare_parameter('sit_pose', Parameter.Type.DOUBLE_ARRAY).value
    fields['sit_pose'] = tuple(sit or ())
    path = node.declare_parameter('controllers_file', '').value
    controller = node.declare_parameter('command_controller', 'forward_position_controller').value
    return {'safety': SafetyConfig(**fields),
            # cmd_vel older than this [s, monotonic] is a zero command (0: never stale)
            'cmd_vel_timeout_s': node.declare_parameter('cmd_vel_timeout_s', 0.5).value,
            # wall time without an accepted state that faults (0: the stale limit; 1 s
            # under use_sim_time, where a paced or lockstep simulator may be slower)
            'wall_stale_after_s': node.declare_parameter('wall_stale_after_s', 0.0).value,
            'max_delta_per_tick': node.declare_parameter('max_delta_per_tick', 0.0).value,
            'require_verification': node.declare_parameter('require_verification', False).value,
            'command_joints': controller_joints(path, controller) if path else None}


def state_qos(node: Node):
    """QoS of the joint_states / imu subscriptions (parameter state_qos)."""
    name = node.declare_parameter('state_qos', 'sensor_data').value
    if name not in QOS:
        raise ValueError(f'state_qos = {name!r}; use sensor_data (best effort, matches any '
                         'publisher) or reliable')
    return QOS[name]


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
