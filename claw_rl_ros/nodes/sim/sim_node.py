"""sim_node: the MuJoCo robot as a ROS 2 node (thin glue over core.sim.sim_session.SimSession).

Publishes ``joint_states``, ``imu`` (the model's imu-site sensors), ``odom`` (ground truth),
``/clock`` and ``/diagnostics``; takes ``joint_commands`` (Float64MultiArray, element i =
``joints[i]``) and ``cmd_vel``; services ``~/reset``, ``~/pause`` (SetBool), ``~/step``.
Modes: ``realtime`` (steady-clock timer at the control rate; a command older than
``command_timeout_s`` -> default pose hold) and ``lockstep`` (one control step per command
answering the last published state; the state is re-sent after ``command_timeout_s`` without
an answer, so a late policy can join; ``~/step`` works while paused). Stamps are sim time
when ``publish_clock`` is on; a reset re-sends the state under the same stamp. ``training``:
the control loop as an actor (:mod:`.loop_actor_io`; ``env_config`` is then the train YAML).
``state_qos`` is the QoS of joint_states, imu, odom and /clock (reliable by default: a
subscriber written the usual way, reliable and depth 10, reads only a reliable publisher).
``terrain`` (``TYPE[:LEVEL]``, with ``terrain_seed``) stands the world on one tile of the terrain
generator (:func:`~claw_rl_ros.core.sim.sim_session.terrain_tile`); ``on_stand`` holds the trunk
on a stand in the air (system identification's excitation; never a fall).
With ``pause_after_s`` the sim pauses by itself that long after each ``~/reset`` and sends the
episode's states as one record on ``~/episode`` (:mod:`.sim_episode_io`, with ``~/reset`` and
``episode_seed``): the sim2sim gate's episodes, read without listening to every state.
"""

from __future__ import annotations

import time

from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import Twist
import numpy as np
from rclpy.node import Node
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import SetBool, Trigger

from ...core.control.control_stats import Counters, LatencyStats, RateMeter, TickMonitor
from ...core.control.state_input import JointOrder
from ...core.learning.train_config import split_overrides
from ...core.sim.robot import load_robot
from ...core.sim.sim_session import env_section, SimSession, terrain_tile
from .loop_actor_io import LoopActorIO
from ...core.params.node_config import SimParams
from ..node_params import declare
from ..ros_io import (COMMAND_QOS, diagnostics, exit_without_teardown, now_sec, publisher,
                      RELIABLE_STATE_QOS, SENSOR_QOS, spin, steady_timer)
from .sim_episode_io import SimEpisodeIO
from .sim_state_io import SimStateIO
from ..wire_io import command_data, WireError

STATE_PUBLISH_QOS = {'reliable': RELIABLE_STATE_QOS, 'sensor_data': SENSOR_QOS}


class SimNode(Node):
    """Parameters: :class:`~...core.params.node_config.SimParams` (``ros2 param describe``)."""

    def __init__(self, **node_options):  # (rclpy Node options: node_container)
        super().__init__('sim_node', **node_options)
        p = declare(self, SimParams)  # checked there
        robot = load_robot(p.robot, overlay=p.robot_overlay)
        self.params, self.robot = p, robot
        self.order = JointOrder(robot, p.joints)
        self.loop = LoopActorIO(self, robot, p) if p.training else None
        cfg = None if self.loop else env_section(p.env_config,
                                                 split_overrides(p.overrides, 'overrides'))
        self.sim = self.loop.session if self.loop else SimSession(
            robot, cfg, randomization=p.randomization, pushes=p.pushes, noise=p.noise,
            seed=p.seed, command_timeout_s=p.command_timeout_s,
            terrain=terrain_tile(p.terrain, cfg.terrain, p.terrain_seed, 'parameter terrain',
                                 'parameter terrain_seed'), stand=p.on_stand)
        self.lockstep = p.mode == 'lockstep'
        self.paused = p.start_paused
        self.awaiting: float | None = None  # perf_counter of the unanswered state publish
        self.latency, self.tick_rate, self.cmd_rate = LatencyStats(), RateMeter(), RateMeter()
        self.step_cpu = LatencyStats()  # thread CPU time of each step's physics and readings
        # Realtime: one control step every control_dt / real_time_factor wall seconds.
        self.ticks = TickMonitor(robot.control_dt / p.real_time_factor)
        self.drops = Counters(('wrong_length', 'non_finite', 'malformed', 'unanswered'))
        self.out = SimStateIO(self, robot, STATE_PUBLISH_QOS[p.state_qos], p.publish_clock)
        self.pub_diag = publisher(self, DiagnosticArray, '/diagnostics', 10)
        self.create_subscription(Float64MultiArray, 'joint_commands', self.on_command,
                                 COMMAND_QOS, raw=True)  # read from its bytes (wire_io)
        if not self.loop:  # in training the env commands (published on cmd_vel)
            self.create_subscription(Twist, 'cmd_vel', self.on_cmd_vel, 10)
        self.episodes = SimEpisodeIO(self)  # episode_seed, ~/reset, ~/episode
        self.create_service(SetBool, '~/pause', self.on_pause)
        self.create_service(Trigger, '~/step', self.on_step)
        period = p.command_timeout_s if self.lockstep else self.ticks.period
        steady_timer(self, period, self.on_wait if self.lockstep else self.on_tick)
        steady_timer(self, p.diagnostics_period_s, self.publish_diagnostics)
        self.publish_state()
        speed = '' if self.lockstep or p.real_time_factor == 1.0 else \
            f' x {p.real_time_factor:g} real time'
        self.get_logger().info(f'{robot.name}: {p.mode} at {1 / robot.control_dt:g} Hz{speed}, '
                               f'terrain {self.sim.status()["terrain"]}')

    # --------------------------------------------------------------------------- control
    def on_command(self, raw: bytes) -> None:
        now = time.perf_counter()
        try:
            data = command_data(raw)
        except WireError:
            self.drops.add('malformed')
            return
        if data.shape != (self.robot.num_joints,):
            self.drops.add('wrong_length')
            return
        if not np.isfinite(data).all():
            self.drops.add('non_finite')
            return
        self.cmd_rate.tick(now)
        self.sim.set_targets(self.order.from_output(data), now)
        answering = self.awaiting is not None
        if answering:
            self.latency.add(now - self.awaiting)
            self.awaiting = None
        if self.lockstep and answering and not self.paused:
            self.advance()

    def on_cmd_vel(self, msg: Twist) -> None:
        cmd = np.array([msg.linear.x, msg.linear.y, msg.angular.z])
        if np.isfinite(cmd).all():
            self.sim.commands = cmd

    def on_tick(self) -> None:
        self.ticks.tick(time.perf_counter())
        if not self.paused:
            self.advance()

    def on_wait(self) -> None:
        # Lockstep: re-send the state nobody answered (the policy may have joined late), as it
        # was (no new noise draw). Under wall-clock stamps it goes out stamped now: the policy
        # would drop the first stamp as stale every time. Paused, the sim stays silent.
        if self.awaiting is not None and not self.paused and \
                time.perf_counter() - self.awaiting > self.params.command_timeout_s:
            self.drops.add('unanswered')
            if not self.params.publish_clock:
                self.stamp = now_sec(self)
                self.out.restamp(self.stamp)
            self.send_state()

    def advance(self) -> None:
        targets = self.sim.active_targets(time.perf_counter())
        work_start = time.thread_time()
        fell = self.loop.step(self.stamp, targets) if self.loop else self.sim.step(targets)
        if fell and self.params.reset_on_fall:
            self.sim.reset()
        self.publish_state(work_start)
        if self.episodes.due():
            self.paused = True  # the episode's last state is out
            self.episodes.send()
            self.publish_diagnostics()

    def publish_state(self, work_start: float | None = None) -> None:
        """Read the sim and publish its state (``work_start``: thread time the step began)."""
        if self.loop:
            self.loop.before_state()
        r = self.sim.readings()
        if work_start is not None:
            self.step_cpu.add(time.thread_time() - work_start)
        self.stamp = r.time if self.params.publish_clock else now_sec(self)
        self.out.fill(r, self.stamp)
        self.episodes.record(self.stamp, r)
        self.send_state()

    def send_state(self) -> None:
        """Publish the filled state (again, for an unanswered lockstep state)."""
        self.out.send()
        self.awaiting = time.perf_counter()
        self.tick_rate.tick(self.awaiting)

    # -------------------------------------------------------------------------- services
    def on_pause(self, request, response):
        self.paused = bool(request.data)
        self.ticks.reset()
        if self.lockstep and not self.paused and self.awaiting is None:
            self.advance()  # the last state was answered while paused: go on
        self.publish_diagnostics()  # a state change is said at once, not at the next period
        response.success, response.message = True, 'paused' if self.paused else 'running'
        return response

    def on_step(self, request, response):
        response.success = self.paused
        if self.paused:
            self.advance()
        response.message = f'sim time {self.sim.time:.3f} s' if self.paused else \
            'running: pause first (~/pause true), then step'
        return response

    def publish_diagnostics(self) -> None:
        now, s = time.perf_counter(), self.sim
        self.sim.active_targets(now)
        fields = {'mode': self.params.mode, 'paused': self.paused, **s.status(),
                  'control_rate_hz': self.tick_rate.rate(now),
                  'command_rate_hz': self.cmd_rate.rate(now),
                  **self.latency.summary('command_latency'), 'missed_ticks': self.ticks.missed,
                  **self.step_cpu.summary('step_cpu'),
                  **self.drops.summary('dropped'),
                  **(self.loop.diagnostics() if self.loop else {})}
        level = 'warn' if s.timed_out and not self.lockstep else 'ok'
        msg = 'command timeout: holding the default pose' if level == 'warn' else 'running'
        self.pub_diag.publish(diagnostics(self, 'sim', level, msg, fields))


def main(args=None) -> None:
    exit_without_teardown(spin(SimNode, args))  # no slow interpreter teardown after a clean stop


if __name__ == '__main__':
    main()
