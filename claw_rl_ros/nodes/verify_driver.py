"""verify_driver: the ``claw-rl verify`` side of the ROS graph (thin glue, spun in a thread).

Drives a lockstep sim_node + policy_node pair episode by episode through their standard
interfaces: ``cmd_vel`` (the command), the sim's ``episode_seed`` parameter (set to the episode
number: its draws), ``<sim>/pause`` and ``<sim>/reset`` (std_srvs; the sim pauses by itself an
episode after the reset, its ``pause_after_s``, and says so on /diagnostics at once). It reads
``<sim>/episode`` (the episode's states as one record: body velocity, joint positions and
efforts), ``/diagnostics`` (the sim's fall counter and draws, the policy's latency) and
``policy/model_version``. It hears nothing per control step: the loop keeps the 2 cores, and
no state is lost to a best-effort drop under load. Measurements are handed to
:mod:`claw_rl_ros.core.verify.gate_scoring` as arrays.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import Twist
import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rcl_interfaces.srv import SetParameters
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import SetBool, Trigger

from ..core.verify.episode_record import episode_steps, read_episode
from ..core.verify.status_board import GraphGone, StatusBoard
from ..core.verify.gate_scoring import (Episode, episode_end, episode_of, latency_of,
                                        measured_latency)
from ..core.sim.robot_spec import RobotSpec
from .ros_io import STATE_QOS, steady_timer
from .sim.sim_state_io import episode_layout


CMD_VEL_PERIOD_S = 0.1
RESEND_S = 2.0  # a first request without a reply is sent again after this


class VerifyDriver:
    """An rclpy node in its own context and thread; ``episode()`` runs one measured episode.
    What it hears goes to a :class:`~..core.verify.status_board.StatusBoard`, which its waits
    read."""

    def __init__(self, robot: RobotSpec, alive: Callable[[], bool], sim: str = '/sim_node',
                 policy: str = '/policy_node', timeout_s: float = 60.0,
                 domain_id: int | None = None, name: str = 'verify_driver'):
        self.robot, self.sim, self.policy = robot, sim, policy
        self.board = StatusBoard(alive, timeout_s)
        self.context = Context()
        rclpy.init(context=self.context, **({} if domain_id is None else
                                            {'domain_id': domain_id}))
        self.node = n = Node(name, context=self.context)
        self.closed = False
        self.paused_status: dict[str, str] = {}
        self.answered: set[str] = set()  # services that have replied to this driver
        # The sim's services' clients, made now: their discovery runs while the nodes start.
        self.clients = {f'{sim}/{service}': n.create_client(srv_type, f'{sim}/{service}')
                        for srv_type, service in ((SetBool, 'pause'), (Trigger, 'reset'),
                                                  (SetParameters, 'set_parameters'))}
        n.create_subscription(Float64MultiArray, f'{sim}/episode',
                              lambda m: self.board.put_record(episode_layout(m)), STATE_QOS)
        n.create_subscription(DiagnosticArray, '/diagnostics', self.on_diagnostics, 50)
        n.create_subscription(String, 'policy/model_version',
                              lambda m: self.board.put_version(m.data), STATE_QOS)
        self.pub_cmd = n.create_publisher(Twist, 'cmd_vel', 10)
        # Re-sent at 10 Hz (wall), as a teleop does: the policy node zeroes a cmd_vel older
        # than its cmd_vel_timeout_s.
        self.cmd: Twist | None = None
        steady_timer(n, CMD_VEL_PERIOD_S, self._resend_command)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(n)
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _spin(self) -> None:
        try:
            while self.context.ok():
                self.executor.spin_once(timeout_sec=0.05)
        except Exception:  # noqa: BLE001 - the context was shut down under the executor
            pass

    def on_diagnostics(self, msg: DiagnosticArray) -> None:
        for s in msg.status:
            self.board.put_status(s.hardware_id, {kv.key: kv.value for kv in s.values})

    def call(self, srv_type, name: str, request):
        """The reply of service ``name``. Until a client's first reply the request is sent
        again every RESEND_S: a service that has not yet discovered the client's reply reader
        drops the reply ("failed to send response"), seen on a loaded machine. Every first
        call here is one that may be repeated (pause true, reset to a seeded episode, a
        parameter); pause false is never a first call (start() pauses first)."""
        client = self.clients.get(name) or self.node.create_client(srv_type, name)
        self.clients[name] = client
        self.board.wait(f'service {name}', lambda: client.service_is_ready())
        futures: list = []
        sent = [-float('inf')]

        def reply():
            done = next((f for f in futures if f.done()), None)
            if done is None and (not futures or name not in self.answered) and \
                    time.monotonic() - sent[0] > RESEND_S:
                futures.append(client.call_async(request))
                futures[-1].add_done_callback(self.board.notify)  # wakes the wait
                sent[0] = time.monotonic()
            return done
        result = self.board.wait(f'a reply from {name}', reply).result()
        self.answered.add(name)
        return result

    # --------------------------------------------------------------------------- protocol
    def start(self, command_vx: float, model_version: str) -> None:
        """Wait until the loop runs with this model, then give both nodes the command."""
        board = self.board  # (model_version is latched: said once the model is checked)
        board.wait(f'policy/model_version {model_version}', lambda: board.version ==
                   model_version)
        board.wait('cmd_vel subscribers', lambda: self.pub_cmd.get_subscription_count() >= 2)
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
        seq = self.board.count(self.sim)  # the sim says its status in the service call
        self.call(SetBool, f'{self.sim}/pause', SetBool.Request(data=on))
        if on:
            self.paused_status = self.board.next_status(
                self.sim, lambda v: v['paused'] == 'True', seq)
        return self.paused_status

    def episode(self, seconds: float, settle_s: float, index: int) -> Episode:
        """Reset with the draws of episode ``index`` (the sim's episode_seed), run ``seconds``
        of sim time (the sim pauses by itself then, its ``pause_after_s``: the same steps on
        any machine); one Episode from the sim's record of it."""
        falls0, steps0 = int(self.paused_status['falls']), int(self.paused_status['steps'])
        steps1 = steps0 + episode_steps(seconds, self.robot.control_dt)  # (a reset: no step)
        board, records = self.board, self.board.records
        seed = Parameter('episode_seed', Parameter.Type.INTEGER, index).to_parameter_msg()
        result = self.call(SetParameters, f'{self.sim}/set_parameters',
                           SetParameters.Request(parameters=[seed])).results[0]
        if not result.successful:
            raise GraphGone(f'{self.sim} refused episode_seed {index}: {result.reason}')
        reply = self.call(Trigger, f'{self.sim}/reset', Trigger.Request())
        if not reply.success:
            raise GraphGone(f'{self.sim}/reset refused: {reply.message}')
        seq = board.count(self.sim)
        self.pause(False)
        try:
            # A stall only fails it: the sim's step count, said on /diagnostics, stands still.
            status = self.paused_status = board.wait(
                'the sim pausing at the episode end', lambda: board.count(self.sim) > seq and
                episode_end(board.status[self.sim], steps0, steps1),
                lambda: board.status.get(self.sim, {}).get('steps'))
            record = board.wait(f'{self.sim}/episode', lambda: board.records > records and
                                board.record)
            return episode_of(read_episode(*record, self.robot.joint_names), steps1 - steps0,
                              settle_s, int(status['falls']) > falls0, status)
        except ValueError as exc:
            raise GraphGone(f'{self.sim}: {exc}') from None

    def latency(self, since: int | None = None) -> dict[str, float]:
        """core.verify.gate_scoring.score's latency rows: the policy's newest status once one with
        a measured latency came after its ``since``-th (:meth:`StatusBoard.count` taken as the
        last episode began, so usually one said during it: no wait; default: the next one),
        the sim's as the last episode ended. The policy's figures cover its last 3,000 ticks."""
        return latency_of(self.board.next_status(self.policy, measured_latency, seq=since),
                          self.paused_status)

    def close(self) -> None:
        """Stop spinning and destroy the node (once; later calls do nothing)."""
        if self.closed:
            return
        self.closed = True
        self.context.try_shutdown()
        self.thread.join(timeout=5)
        self.node.destroy_node()
