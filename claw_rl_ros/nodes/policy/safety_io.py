"""The policy node's safety wiring (thin ROS glue around core/control/safety.py).

* parameters of the state machine, command shaping, verification gate and self-check
  (:class:`~...core.params.node_config.SafetyParams`) -> PolicyController arguments
  (:func:`safety_kwargs`);
* operator requests: ``~/operator`` (``std_msgs/String``: stand_up, rl, sit_down, passive,
  estop, reset, excite, excite_stop) and one ``std_srvs/Trigger`` service per request
  (``~/stand_up`` ...), plus ``~/self_check`` (the start-up self-check report, success
  when nothing mismatches);
* ``safety/state`` (``std_msgs/String``, latched): the current state, on every transition;
  every transition is logged and triggers a ``/diagnostics`` message at once;
* ``joint_gains`` (``std_msgs/Float64MultiArray`` [Kp x J, Kd x J], ``joints`` order) with
  every command under ``gains_source: sent`` (the default), for drivers that take gains: the
  serving model's metadata gains, Kp = 0 in PASSIVE (published while something subscribes;
  the self-check refuses RL while nothing does, core/control/drive_gains.py);
* after each self-check of a model loaded from a file: ``<model stem>.drive.json`` beside it
  (how the drives got their gains; the policy card shows it), written on a thread of its own.
"""

from __future__ import annotations

from functools import partial
import threading
from typing import Any

from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Trigger

from ...core.control.drive_gains import write_drive_record
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
            'require_verification': p.require_verification, 'drive_gains': p.drive_gains(),
            'command_joints': controller_joints(p.controllers_file, p.command_controller)
            if p.controllers_file else None}


class SafetyIO:
    """Operator requests in; state, transitions and gains out (see the module docstring)."""

    def __init__(self, node, ctrl):
        self.node, self.ctrl = node, ctrl
        self.log = node.get_logger()
        self.pub_state = publisher(node, String, 'safety/state', LATCHED_QOS)
        self.pub_gains = None
        if ctrl.drive.source == 'sent':
            self.pub_gains = publisher(node, Float64MultiArray, 'joint_gains', COMMAND_QOS)
            ctrl.gains_listeners = self.pub_gains.get_subscription_count
            ctrl.gains_topic = self.pub_gains.topic_name
        self._record_lock = threading.Lock()
        self._last_record: tuple | None = None  # (report, model path) last written
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
        self.record_drive()
        return response

    def record_drive(self) -> None:
        """Write the last self-check's drive-gains record beside the model (and its card) on
        a thread of its own, when it changed: the executor thread runs the control ticks."""
        report, model = self.ctrl.drive_report(self.node.get_fully_qualified_name()), \
            self.ctrl.model_path
        if report is None or (report, model) == self._last_record:
            return
        self._last_record = (report, model)
        threading.Thread(target=self._write_record, args=(model, report), daemon=True).start()

    def _write_record(self, model, report) -> None:
        with self._record_lock:
            try:
                path = write_drive_record(model, report)
            except Exception as exc:  # noqa: BLE001 - a record is never worth a fault
                self.log.warning(f'drive gains: could not write the record beside {model}: '
                                 f'{exc}')
                return
        self.log.info(f'drive gains: {report["verdict"]}; wrote {path}')

    def handle(self, name: str) -> tuple[bool, str]:
        ok, message = self.ctrl.request(name, now_sec(self.node))
        if name == 'rl':
            self.record_drive()  # the rl request ran the self-check
        # (rclpy refuses two severities from one call site: one call per severity)
        if ok:
            self.log.info(f'operator {name}: {message}')
        else:
            self.log.warning(f'operator {name}: {message}')
        self.flush()
        return ok, message

    def after_tick(self) -> None:
        """After a command went out: its gains, then any transitions of the tick."""
        if self.pub_gains is not None and self.pub_gains.get_subscription_count():
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
