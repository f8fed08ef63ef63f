"""The control loop as an actor: ROS glue of sim_node's and policy_node's training mode.

policy_node (``training: true``) publishes one record per RL tick on ``policy/training_step``
(:mod:`..training_record_io`), just before the command it belongs to.

sim_node (``training: true``) runs :class:`~claw_rl_ros.core.sim.training_session.
TrainingSession` (a 1-world env of the train config's ``env:``) through :class:`LoopActorIO`:
before every state it publishes the env's velocity command on ``cmd_vel`` (so the policy node
observes the command the env rewards), it pairs each control step with the policy's record
(:class:`~claw_rl_ros.core.live.loop_actor.ControlLoopActor`) and publishes every
``runner.num_steps_per_env``-step chunk on ``chunk_topic`` (actor id
``<namespace>/control_loop``), like the batched actors. Discarded chunks are counted by cause
in its ``/diagnostics``.
"""

from __future__ import annotations

import array

from geometry_msgs.msg import Twist
import numpy as np
from rclpy.node import Node
from std_msgs.msg import Float64MultiArray, UInt8MultiArray

from ...core.learning.train_config import load_train_config, split_overrides
from ...core.live.loop_actor import ControlLoopActor
from ...core.live.rollout_chunk import encode_chunk
from ...core.sim.robot_spec import RobotSpec
from ...core.params.node_config import SimParams
from ...core.sim.training_session import TrainingSession
from ..ros_io import COMMAND_QOS, publisher
from ..training_record_io import msg_record, RECORD_TOPIC


class LoopActorIO:
    """sim_node's training mode; ``session`` is the node's world (module docstring).

    The policy node publishes a record before its command, so the events executor takes the
    record first (arrival order); for the single_threaded one this is created before the node
    subscribes to joint_commands (subscription order).
    """

    def __init__(self, node: Node, robot: RobotSpec, p: SimParams):
        cfg = load_train_config(p.env_config or 'train_ppo.yaml',
                                split_overrides(p.overrides, 'overrides'))
        self.node, self.robot = node, robot
        self.session = TrainingSession(robot, cfg.env, randomization=p.randomization,
                                       pushes=p.pushes, noise=p.noise, seed=p.seed,
                                       command_timeout_s=p.command_timeout_s)
        actor_id = f'{node.get_namespace().rstrip("/")}/control_loop'
        self.actor = ControlLoopActor(self.session, cfg.runner.num_steps_per_env, actor_id)
        self.bad_records = 0
        node.create_subscription(Float64MultiArray, RECORD_TOPIC, self.on_record, COMMAND_QOS)
        self.pub_cmd = publisher(node, Twist, 'cmd_vel', 10)
        self.pub_chunk = publisher(node, UInt8MultiArray, p.chunk_topic, COMMAND_QOS)
        node.get_logger().info(f'training: chunks of {cfg.runner.num_steps_per_env} steps as '
                               f'{actor_id} on {p.chunk_topic}')

    def on_record(self, msg: Float64MultiArray) -> None:
        try:
            record = msg_record(msg, self.robot.policy_obs.dim, self.robot.num_joints)
        except ValueError as exc:
            self.bad_records += 1
            self.node.get_logger().warning(f'{RECORD_TOPIC} dropped: {exc}',
                                           throttle_duration_sec=2.0)
            return
        record.target = self.node.order.from_output(record.target)
        self.actor.add_record(record)

    def before_state(self) -> None:
        """The env's velocity command, for the policy node's next observation."""
        msg = Twist()
        msg.linear.x, msg.linear.y, msg.angular.z = (float(v) for v in self.session.commands)
        self.pub_cmd.publish(msg)

    def step(self, stamp: float, targets: np.ndarray) -> bool:
        """One env step with [J] targets answering the state stamped ``stamp``; publishes a
        completed chunk. False: the env resets ended episodes itself."""
        chunk = self.actor.step(stamp, targets)
        if chunk is not None:
            self.pub_chunk.publish(UInt8MultiArray(data=array.array('B', encode_chunk(chunk))))
        return False

    def diagnostics(self) -> dict[str, object]:
        return {'training': True, 'episodes': self.session.episodes,
                'bad_records': self.bad_records, **self.actor.diagnostics()}
