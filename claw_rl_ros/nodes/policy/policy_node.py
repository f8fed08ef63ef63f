"""policy_node: joint_states + imu + cmd_vel -> ONNX student -> joint_commands (thin ROS glue).

All logic is in :class:`~claw_rl_ros.core.control.policy_controller.PolicyController`: joints
matched by name, the env's ObservationLayout, stale/NaN/misnamed/short input dropped and counted,
default pose (or nothing before the first complete state) instead of a command from bad input.

Hot swap (two standard steps; wiring in :mod:`.model_swap_io`, measured in
bench/ros_control.py): the model bytes go on ``policy/model`` and are validated on arrival;
setting parameter ``model_sha256`` activates that version between two ticks, or says why not
and leaves the old one serving. Serialising 600 KB as a ``uint8[]`` field takes < 1.5 ms, as a
BYTE_ARRAY parameter ~230 ms (rclpy converts it byte by byte), hence bytes on a topic and
activation by hash.

Safety (never optional; wiring in :mod:`.safety_io`, logic in core/control/safety.py): every
command comes from the state machine PASSIVE -> STAND_UP -> RL -> SIT_DOWN, shaped to the joint
limits and a maximum change per tick. ``autostart`` (default true: simulation and training)
enters RL at the first complete fresh state and re-arms after a fault; the deploy graph sets it
false: the operator drives ``~/operator`` or the ``~/stand_up`` ... Trigger services, and
``rl`` needs a passing self-check and (``require_verification``) a passing
``<model stem>.verify.json``. ``excite`` runs system identification's excitation from a
finished STAND_UP (state EXCITE, no model needed; :mod:`.excitation_io`).

Robustness (core/control/policy_controller.py): no message, stamp or call crashes the node or
yields a command from bad input; an exception in a tick (publishing included) is a named
``exception`` fault, PASSIVE. The watchdog polls 4 times per control period on the steady
clock; ``cmd_vel`` older than ``cmd_vel_timeout_s`` is a zero command; a clock mismatch is
logged once at ERROR with its fix. A node whose previous process died (:mod:`run_marker`)
starts with a ``restarted`` fault, latched under the deploy graph (no autostart).

Training mode (``training``, default false; never in the deploy graph): the control loop as an
actor (:mod:`..sim.loop_actor_io`): actions sampled around the mean (``seed``), one record per RL
tick on ``policy/training_step``; only trainer exports (``action_std`` metadata) are served.
"""

from __future__ import annotations

import time

from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import Twist
from rclpy.node import Node
from sensor_msgs.msg import Imu, JointState
from std_msgs.msg import Float64MultiArray

from ...core.control.control_stats import LatencyStats, RateMeter
from ...core.control.policy_controller import PolicyController, WATCHDOG_POLLS
from ...core.control.run_marker import RunMarker
from ...core.wire_format import Float64ArrayWriter
from ...core.sim.robot import load_robot
from ..training_record_io import record_msg, RECORD_TOPIC
from ...core.params.node_config import PolicyParams
from .excitation_io import excitation_config, ExcitationIO
from .model_swap_io import ModelSwapIO
from ..node_params import declare
from ..ros_io import (COMMAND_QOS, diagnostics, exit_without_teardown, now_sec, publisher,
                      spin, steady_timer, take_queued)
from .safety_io import QOS, safety_kwargs, SafetyIO
from ..wire_io import StateDecoder, WireError


class PolicyNode(Node):
    """Parameters: :class:`~...core.params.node_config.PolicyParams` (``ros2 param describe``;
    all but ``model_path`` and ``model_sha256`` read-only), use_sim_time."""

    def __init__(self, **node_options):  # (rclpy Node options: node_container)
        super().__init__('policy_node', **node_options)
        self.marker = None
        p = declare(self, PolicyParams)
        robot, training = load_robot(p.robot, overlay=p.robot_overlay), p.training
        qos = QOS[p.state_qos]
        sim_time = self.get_parameter('use_sim_time').value
        self.ctrl = PolicyController(robot, stale_after_periods=p.stale_after_periods,
                                     output_joints=p.joints, max_model_bytes=p.max_model_bytes,
                                     training=training, seed=p.seed,
                                     clock='sim' if sim_time else 'wall',
                                     monotonic=time.monotonic,
                                     excitation=excitation_config(p, robot), **safety_kwargs(p))
        if p.model_path:
            self.ctrl.load_path(p.model_path)  # refuses to start with the exact reason
        self.marker = RunMarker(self.get_fully_qualified_name())
        crashed = self.marker.claim()
        if crashed:
            self.ctrl.restarted(crashed)
        self.latency = LatencyStats()
        # Thread CPU time of the controller's calls (state checks, observation, network,
        # shaping) per command from a state, beside the wall-clock latency around them.
        self.tick_cpu, self.tick_work = LatencyStats(), 0.0
        self.state_rate, self.cmd_rate = RateMeter(), RateMeter()
        self.pub_cmd = publisher(self, Float64MultiArray, 'joint_commands', COMMAND_QOS)
        self.cmd = Float64ArrayWriter(len(self.ctrl.order.output))  # its bytes, refilled
        self.pub_record = publisher(self, Float64MultiArray, RECORD_TOPIC, COMMAND_QOS) \
            if training else None
        self.pub_diag = publisher(self, DiagnosticArray, '/diagnostics', 10)
        # A cmd_vel waiting with a state is taken before it: arrival order (events executor),
        # subscription order (single_threaded: cmd_vel subscribed first).
        self.create_subscription(Twist, 'cmd_vel', self.on_cmd_vel, 10)
        # The state arrives as its bytes, read into arrays by wire_io (no message objects).
        self.wire = StateDecoder()
        self.sub_js = self.create_subscription(JointState, 'joint_states', self.on_joint_state,
                                               qos, raw=True)
        self.sub_imu = self.create_subscription(Imu, 'imu', self.on_imu, qos, raw=True)
        self.swap = ModelSwapIO(self, self.ctrl)
        self.safety = SafetyIO(self, self.ctrl)
        self.excitation = ExcitationIO(self, self.ctrl, p)
        # Watchdog on the steady clock (compares stamps with the node's, maybe simulated, time).
        steady_timer(self, robot.control_dt / WATCHDOG_POLLS, self.on_watchdog)
        steady_timer(self, p.diagnostics_period_s, self.publish_diagnostics)
        self.safety.flush()  # a restart found above is logged now
        self.get_logger().info(f'serving model {self.ctrl.version} for {robot.name!r}, '
                               f'{robot.num_joints} joints at {1 / robot.control_dt:g} Hz'
                               + (', training: sampling actions' if training else ''))

    # ----------------------------------------------------------------------------- inputs
    def on_joint_state(self, data: bytes) -> None:
        # A backlog (a loaded machine) is worked off at its newest state: the older ones are
        # validated and counted, but neither answered nor judged stale (policy_controller).
        msgs = [data, *take_queued(self.sub_js)]
        for k, m in enumerate(msgs):
            start = time.perf_counter()
            self.state_rate.tick(start)
            try:
                state = self.wire.joint_state(m)
            except WireError as exc:
                self.send(self.ctrl.on_malformed('joint_states', str(exc), now_sec(self)), None)
                continue
            work = time.thread_time()
            targets = self.ctrl.on_joint_state(*state, now_sec(self), k < len(msgs) - 1)
            self.tick_work += time.thread_time() - work
            self.send(targets, start)

    def on_imu(self, data: bytes) -> None:
        for m in (data, *take_queued(self.sub_imu)):
            start = time.perf_counter()
            try:
                reading = self.wire.imu(m)
            except WireError as exc:
                self.send(self.ctrl.on_malformed('imu', str(exc), now_sec(self)), None)
                continue
            work = time.thread_time()
            targets = self.ctrl.on_imu(*reading, now_sec(self))
            self.tick_work += time.thread_time() - work
            self.send(targets, start)

    def on_cmd_vel(self, msg: Twist) -> None:
        self.ctrl.on_command(msg.linear.x, msg.linear.y, msg.angular.z)

    def on_watchdog(self) -> None:
        self.send(self.ctrl.watchdog(now_sec(self)), None)

    def send(self, targets, start: float | None) -> None:
        if targets is None:
            return self.safety.flush()
        try:
            record = self.ctrl.take_record()
            if record is not None:  # training mode: the record goes before its command
                self.pub_record.publish(record_msg(record))
            self.cmd.data[:] = targets
            self.pub_cmd.publish(self.cmd.payload())
        except Exception as exc:  # noqa: BLE001 - a failed publish is a fault, not a crash
            self.ctrl.guard.stage = 'publish'
            self.ctrl.internal_fault(exc, fallback=())
            return self.safety.flush()
        now = time.perf_counter()
        self.cmd_rate.tick(now)
        if start is not None:
            self.latency.add(now - start)
            self.tick_cpu.add(self.tick_work)  # the controller's CPU since the last command
            self.tick_work = 0.0
        self.safety.after_tick()
        self.excitation.after_tick()

    def publish_diagnostics(self) -> None:
        now = time.perf_counter()
        use_sim_time = self.get_parameter('use_sim_time').value
        fields = {'mode': 'sim_time' if use_sim_time else 'wall_time',
                  'state_rate_hz': self.state_rate.rate(now),
                  'command_rate_hz': self.cmd_rate.rate(now), **self.latency.summary('latency'),
                  **self.tick_cpu.summary('tick_cpu'),
                  **self.ctrl.diagnostics()}
        level = 'ok' if self.ctrl.policy is not None else 'warn'
        clock = self.ctrl.alerts.seen.get('clock_mismatch')
        level = 'error' if self.ctrl.safety.latched or clock else level
        message = f'serving {self.ctrl.version}' if self.ctrl.policy else 'no model: holding'
        safety = self.ctrl.safety
        state = f'{safety.state} ({safety.latch_cause} latched: reset to clear)' \
            if safety.latched else safety.state
        message = f'{state}, {message}' + (f'; {clock}' if clock else '')
        self.pub_diag.publish(diagnostics(self, 'policy', level, message, fields))

    def destroy_node(self) -> None:
        if self.marker is not None:
            self.marker.release()  # a clean stop: the next start is not a restart
        super().destroy_node()


def main(args=None) -> None:
    exit_without_teardown(spin(PolicyNode, args))  # no slow interpreter teardown after a stop


if __name__ == '__main__':
    main()
