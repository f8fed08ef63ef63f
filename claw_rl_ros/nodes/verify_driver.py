"""verify_driver: the ``claw-rl verify`` side of the ROS graph (thin glue, spun in a thread).

Drives a lockstep sim_node + policy_node pair episode by episode through their standard
interfaces: ``cmd_vel`` (the command), ``<sim>/pause`` and ``<sim>/reset`` (std_srvs: a reset
draws fresh perturbations; the sim pauses by itself an episode after it, its
``pause_after_s``, and says so on /diagnostics at once), and reads ``odom`` (body velocity),
``joint_states`` (positions, efforts) and ``/diagnostics`` (the sim's fall counter, the
policy's latency). Measurements are
handed to :mod:`claw_rl_ros.core.deploy.verify` as arrays.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import Twist
from nav_msgs.msg import Odometry
import numpy as np
import rclpy
from rclpy.clock import Clock, ClockType
from rclpy.context import Context
from rclpy.experimental import EventsExecutor
from rclpy.task import Future
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_srvs.srv import SetBool, Trigger

from ..core.deploy.control_stats import StallDeadline
from ..core.deploy.state_input import JointOrder
from ..core.deploy.verify import Episode
from ..core.sim.robot import RobotSpec
from .ros_io import SENSOR_QOS, SPIN_SLICE_S, to_sec


class GraphGone(RuntimeError):
    """The graph under test stopped answering (a node died or never came up)."""


CMD_VEL_PERIOD_S = 0.1


class VerifyDriver:
    """An rclpy node in its own context and thread; ``episode()`` runs one measured episode."""

    def __init__(self, robot: RobotSpec, alive: Callable[[], bool], sim: str = '/sim_node',
                 policy: str = '/policy_node', timeout_s: float = 60.0):
        self.robot, self.alive, self.sim, self.policy = robot, alive, sim, policy
        self.timeout_s = timeout_s
        self.order = JointOrder(robot)
        self.context = Context()
        rclpy.init(context=self.context)
        self.node = Node('verify_driver', context=self.context)
        self.cond = threading.Condition()
        self.odom: list[tuple[float, np.ndarray]] = []
        self.states: list[tuple[float, np.ndarray, np.ndarray]] = []
        self.status: dict[str, dict[str, str]] = {}
        self.status_seq: dict[str, int] = {}
        self.paused_status: dict[str, str] = {}
        self.clients: dict[str, object] = {}
        n = self.node
        n.create_subscription(Odometry, 'odom', self.on_odom, SENSOR_QOS)
        n.create_subscription(JointState, 'joint_states', self.on_joint_state, SENSOR_QOS)
        n.create_subscription(DiagnosticArray, '/diagnostics', self.on_diagnostics, 50)
        self.pub_cmd = n.create_publisher(Twist, 'cmd_vel', 10)
        # Re-sent at 10 Hz (wall), as a teleop does: the policy node zeroes a cmd_vel older
        # than its cmd_vel_timeout_s.
        self.cmd: Twist | None = None
        n.create_timer(CMD_VEL_PERIOD_S, self._resend_command,
                       clock=Clock(clock_type=ClockType.STEADY_TIME))
        # The EventsExecutor, as the nodes: a callback costs less of the 2 cores the lockstep
        # loop shares with this process (it hears two messages per control step).
        self.executor = EventsExecutor(context=self.context)
        self.executor.add_node(n)
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _spin(self) -> None:
        try:
            never = Future()
            while self.context.ok():
                self.executor.spin_until_future_complete(never, SPIN_SLICE_S)
        except Exception:  # noqa: BLE001 - the context was shut down under the executor
            pass

    # ---------------------------------------------------------------------------- inputs
    def on_odom(self, msg: Odometry) -> None:
        v, w = msg.twist.twist.linear, msg.twist.twist.angular
        with self.cond:
            self.odom.append((to_sec(msg.header.stamp), np.array([v.x, v.y, w.z])))
            self.cond.notify_all()

    def on_joint_state(self, msg: JointState) -> None:
        index = self.order.message_index('joint_states', msg.name)
        pos = np.asarray(msg.position)[index]
        effort = np.asarray(msg.effort)[index] if len(msg.effort) else \
            np.full(len(index), np.nan)
        with self.cond:
            self.states.append((to_sec(msg.header.stamp), pos, effort))

    def on_diagnostics(self, msg: DiagnosticArray) -> None:
        with self.cond:
            for s in msg.status:
                self.status[s.hardware_id] = {kv.key: kv.value for kv in s.values}
                self.status_seq[s.hardware_id] = self.status_seq.get(s.hardware_id, 0) + 1
            self.cond.notify_all()

    # ----------------------------------------------------------------------------- waits
    def wait(self, what: str, ready: Callable[[], object],
             progress: Callable[[], object] = lambda: None):
        """Block until ``ready()`` (called under the lock) is truthy; GraphGone when a node
        stopped, or when ``progress()`` (e.g. the newest sim time) stood still for timeout_s."""
        deadline = StallDeadline(self.timeout_s, time.monotonic())
        with self.cond:
            while True:
                value = ready()
                if value:
                    return value
                if not self.alive():
                    raise GraphGone(f'a node of the graph stopped while waiting for {what}')
                if deadline.expired(progress(), time.monotonic()):
                    raise GraphGone(f'no {what}: nothing moved for {self.timeout_s:g} s')
                self.cond.wait(0.2)

    def status_count(self, node: str) -> int:
        with self.cond:
            return self.status_seq.get(node, 0)

    def diagnostics(self, node: str, predicate=lambda v: True, seq: int | None = None,
                    progress: Callable[[], object] = lambda: None) -> dict[str, str]:
        """The key/values of the next /diagnostics status of ``node`` (fully qualified name)
        that satisfies predicate, received after this call (or after the ``seq``-th status of
        the node, :meth:`status_count`, taken before an action whose status may come early)."""
        if seq is None:
            seq = self.status_count(node)
        return self.wait(f'/diagnostics of {node}', lambda: self.status_seq.get(node, 0) > seq
                         and predicate(self.status[node]) and dict(self.status[node]), progress)

    def call(self, srv_type, name: str, request):
        """The reply of service ``name``; its client is made once (a new client waits for
        discovery: hundreds of ms per call)."""
        client = self.clients.get(name)
        if client is None:
            client = self.clients[name] = self.node.create_client(srv_type, name)
        self.wait(f'service {name}', lambda: client.service_is_ready())
        future = client.call_async(request)
        self.wait(f'a reply from {name}', future.done)
        return future.result()

    # --------------------------------------------------------------------------- protocol
    def start(self, command_vx: float, model_version: str) -> None:
        """Wait until the loop runs with this model, then give both nodes the command."""
        self.diagnostics(self.policy, lambda v: v.get('model_version') == model_version and
                         int(v.get('policy_ticks', 0)) > 0)
        self.wait('cmd_vel subscribers', lambda: self.pub_cmd.get_subscription_count() >= 2)
        cmd = Twist()
        cmd.linear.x = float(command_vx)
        self.pub_cmd.publish(cmd)
        self.cmd = cmd
        self.pause(True)

    def _resend_command(self) -> None:
        if self.cmd is not None:
            self.pub_cmd.publish(self.cmd)

    def pause(self, on: bool) -> dict[str, str]:
        """Pause or resume the sim; paused, returns its diagnostics from after the pause."""
        seq = self.status_count(self.sim)  # the sim says its status in the service call
        self.call(SetBool, f'{self.sim}/pause', SetBool.Request(data=on))
        if on:
            self.paused_status = self.diagnostics(self.sim, lambda v: v['paused'] == 'True',
                                                  seq)
        return self.paused_status

    def episode(self, seconds: float, settle_s: float) -> Episode:
        """Reset (fresh perturbations), run ``seconds`` of sim time, pause; one Episode."""
        falls0 = int(self.paused_status['falls'])
        with self.cond:
            first_odom = len(self.odom)
        reply = self.call(Trigger, f'{self.sim}/reset', Trigger.Request())
        if not reply.success:
            raise GraphGone(f'{self.sim}/reset refused: {reply.message}')
        # The reset re-publishes the state (paused): its stamp starts the episode.
        t0 = self.wait('the reset state', lambda: len(self.odom) > first_odom and
                       (self.odom[first_odom][0],))[0]
        with self.cond:
            first_state = len(self.states)
        # The sim pauses by itself ``seconds`` after the reset (its pause_after_s): the episode
        # is that long to the step, whatever the machine's speed, and says so at once.
        steps0 = int(self.paused_status['steps'])  # a reset does not step
        steps1 = steps0 + round(seconds / self.robot.control_dt)
        end = t0 + seconds - 1e-6

        def paused_at_end():
            status = self.status.get(self.sim, {})
            if self.status_seq.get(self.sim, 0) > seq and status.get('paused') == 'True' and \
                    int(status['steps']) > steps0:
                if int(status['steps']) != steps1:
                    raise GraphGone(f'{self.sim} paused at step {status["steps"]}, not at the '
                                    f'episode end {steps1}: is its pause_after_s {seconds:g}?')
                return dict(status)
            if self.odom and self.odom[-1][0] > end + 1.0:
                raise GraphGone(f'{self.sim} ran past the episode end without pausing: is its '
                                f'pause_after_s {seconds:g}?')
            return None
        seq = self.status_count(self.sim)
        self.pause(False)
        # A loaded machine slows lockstep down, it does not stop it: fail on a stall only.
        status = self.paused_status = self.wait('the sim pausing at the episode end',
                                                paused_at_end, lambda: self.odom[-1][0])
        # The last state's messages may come after the status (another topic).
        self.wait('the last state of the episode', lambda: self.odom[-1][0] >= end and
                  self.states and self.states[-1][0] >= end, lambda: self.odom[-1][0])
        with self.cond:
            odom = [(t, v) for t, v in self.odom[first_odom:] if t0 + settle_s <= t <= t0 +
                    seconds]
            states = [(t, q, e) for t, q, e in self.states[first_state:] if t <= t0 + seconds]
        vel = np.array([v for _, v in odom]).reshape(-1, 3)
        q = np.array([s[1] for s in states]).reshape(-1, self.robot.num_joints)
        tau = np.array([s[2] for s in states]).reshape(-1, self.robot.num_joints)
        params = {k: status[k] for k in ('friction', 'mass_scale', 'motor_strength',
                                         'latency_ms') if k in status}
        return Episode(fell=int(status['falls']) > falls0, velocity=vel, joint_pos=q,
                       effort=tau, params=params)

    def latency(self) -> dict[str, float]:
        """Policy latency p99 and p50, sim state -> command round trip p99 [ms], from
        /diagnostics (keyword arguments of core.deploy.verify.score)."""
        pol = self.diagnostics(self.policy)
        sim = self.diagnostics(self.sim)
        return {'latency_p99_ms': float(pol['latency_p99_ms']),
                'latency_p50_ms': float(pol['latency_p50_ms']),
                'round_trip_p99_ms': float(sim['command_latency_p99_ms'])}

    def close(self) -> None:
        self.context.try_shutdown()
        self.thread.join(timeout=5)
        self.node.destroy_node()
