"""actor_node: N MuJoCo worlds + the pushed student -> rollout chunks (thin ROS glue).

Acts with :class:`~claw_rl_ros.core.live.batched_actor.BatchedActor` (stochastic actions
around the ONNX student's mean, std from the model's metadata) and publishes one encoded
:mod:`rollout chunk <claw_rl_ros.core.live.rollout_chunk>` per ``num_steps_per_env`` steps
on ``chunk_topic`` (``std_msgs/UInt8MultiArray``, reliable). Models arrive exactly as at the
policy node: bytes on ``policy/model`` (validated on arrival by the same ModelCache), activated
by setting parameter ``model_sha256``; the reply says success or the exact reason. The active
model's sha256 prefix (``none`` before the first) is latched on the actor's own
``~/model_version`` (e.g. ``/actor_0/model_version``: one publisher per topic, so a late
joiner reads this actor's current value). Until a model is active the actor waits. A chunk
is always acted by one model: swaps happen between chunks.
The actor is at most ``chunks_in_flight`` chunks ahead of the trainer (BatchedActor's credit:
a chunk spends one, a newer model gives one back): 1 is synchronous PPO (no stale chunk at the
trainer's max_policy_lag 0); 2 collects the next chunk while the trainer learns from the last.
Chunks are collected only while ``chunk_topic`` has a subscriber (a chunk published before the
trainer's subscription is matched would be lost, and with it the credit); one that is lost
anyway is made up for after ``credit_timeout_s`` without a new model.

Parameters: :class:`~..core.params.node_config.ActorParams` (``ros2 param describe``; all but
``model_sha256`` read-only).
"""

from __future__ import annotations

import array
from typing import NoReturn

from rcl_interfaces.msg import SetParametersResult
from rclpy.node import Node
from std_msgs.msg import String, UInt8MultiArray

from ..core.control.model_swap import ModelCache, ModelNotReceived, ModelRejected
from ..core.learning.train_config import load_train_config, split_overrides
from ..core.live.batched_actor import BatchedActor, OnnxBehaviour
from ..core.live.chunk_encoding import encode
from ..core.sim.env import VecLocomotionEnv
from ..core.params.node_config import ActorParams
from .node_params import declare
from .ros_io import COMMAND_QOS, exit_without_teardown, presigned, spin, STATE_QOS


class ActorNode(Node):
    """A batched actor; see the module docstring."""

    env: VecLocomotionEnv | None = None  # None: __init__ refused before it was built

    def __init__(self):
        super().__init__('actor')
        p = declare(self, ActorParams)
        cfg = load_train_config(p.config, split_overrides(p.overrides, 'overrides'))
        if p.robot:
            cfg.env.robot = p.robot
        if p.robot_overlay:
            cfg.env.robot_overlay = p.robot_overlay
        if p.num_envs:
            cfg.env.num_envs = p.num_envs
        if p.physics_threads:
            cfg.env.num_threads = p.physics_threads
        cfg.env.seed = p.seed
        self.env = VecLocomotionEnv(cfg.env)
        self.models = ModelCache(self.env.robot, p.max_model_bytes)
        self.actor = BatchedActor(self.env, None, cfg.runner.num_steps_per_env,
                                  self.get_fully_qualified_name(), seed=p.seed,
                                  chunks_in_flight=p.chunks_in_flight,
                                  credit_timeout_s=p.credit_timeout_s)
        self.chunk_encoding = p.chunk_encoding
        self.pub_chunk = self.create_publisher(UInt8MultiArray, p.chunk_topic, COMMAND_QOS)
        self.pub_version = self.create_publisher(String, '~/model_version', STATE_QOS)
        self.create_subscription(UInt8MultiArray, 'policy/model', self.on_model, STATE_QOS)
        self.add_on_set_parameters_callback(self.on_set_parameters)
        self.told_no_subscriber = False
        self.create_timer(0.005, presigned(self.on_tick))
        self.pub_version.publish(String(data='none'))  # tells the trainer: no model yet
        self.get_logger().info(f'{self.env.num_envs} worlds x {self.actor.num_steps} steps per '
                               f'chunk on {p.chunk_topic} ({p.chunk_encoding}); waiting for a '
                               'model')

    def on_model(self, msg: UInt8MultiArray) -> None:
        sha, verdict = self.models.offer(bytes(msg.data))
        if isinstance(verdict, ModelRejected):
            self.get_logger().warning(f'model {sha[:12]} received and rejected: {verdict}')

    def on_set_parameters(self, params) -> SetParametersResult:
        for p in params:
            if p.name == 'model_sha256' and p.value:
                try:
                    behaviour = OnnxBehaviour(self.models.get(p.value))
                except (ModelRejected, ValueError) as exc:
                    # Bytes still in flight: the requester has the reason and retries. (One
                    # severity per call site: rclpy refuses a logger call that changes it.)
                    if isinstance(exc, ModelNotReceived):
                        self.get_logger().debug(f'hot swap rejected: {exc}')
                    else:
                        self.get_logger().warning(f'hot swap rejected: {exc}')
                    return SetParametersResult(successful=False, reason=str(exc))
                self.actor.use_behaviour(behaviour)
                self.pub_version.publish(String(data=behaviour.model_sha))
        return SetParametersResult(successful=True, reason=f'acting with {self.actor.model_sha}')

    def on_tick(self) -> None:
        if self.pub_chunk.get_subscription_count() == 0:
            # Nobody to learn from it yet: the chunk would be lost.
            if self.actor.model_sha and not self.told_no_subscriber:
                self.told_no_subscriber = True
                self.get_logger().info(f'model active; waiting for a subscriber on '
                                       f'{self.pub_chunk.topic_name} (the trainer)')
            return
        regrants = self.actor.regrants
        if not self.actor.may_collect():
            return
        if self.actor.regrants > regrants:
            self.get_logger().warning(
                f'no new model {self.actor.credit_timeout_s:g} s after the last chunk: '
                'collecting one more (a chunk was lost, or the trainer is slow)')
        payload = encode(self.actor.collect(), self.chunk_encoding)
        self.pub_chunk.publish(UInt8MultiArray(data=array.array('B', payload)))

    def destroy_node(self) -> None:
        if self.env is not None:
            self.env.close()
        super().destroy_node()


def main(args=None) -> NoReturn:
    exit_without_teardown(spin(ActorNode, args))


if __name__ == '__main__':
    main()
