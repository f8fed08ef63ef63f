"""trainer_node: rollout chunks in, PPO (+ OPD) updates, the new student pushed out (thin glue).

Chunks arrive on ``chunk_topic`` (``std_msgs/UInt8MultiArray``, any number of actors in any
namespace). :class:`~claw_rl_ros.core.learning.chunk_filter.ChunkGate` decodes and validates
them and keeps only those acted by the current model (``max_policy_lag`` older versions
allowed); drops are counted per cause and logged. Every ``chunks_per_iteration`` accepted
chunks, :class:`~claw_rl_ros.core.learning.chunk_learner.ChunkLearner` runs the learning half
of ``train_one_epoch``; then the student is exported to ONNX (policy version and action std in
its metadata), checkpointed atomically, and pushed through the policy node's hot-swap mechanism
to every node in ``push_targets``: bytes on ``<namespace>/policy/model`` (latched), then
``model_sha256`` through ``<node>/set_parameters``; replies are logged with their reason and a
refusal does not stop training. Targets that are not up yet are retried every 0.5 s, and a
target whose ``policy/model_version`` reports another model (e.g. restarted) is sent the
current one again. Metrics
go to ``trainer/metrics/<name>`` (``std_msgs/Float32``). On start it resumes from the newest
checkpoint in ``run_dir``.

Parameters: config (train YAML), run_dir, push_targets (node names; relative ones are in the
trainer's namespace), chunk_topic,
chunks_per_iteration, max_policy_lag.
"""

from __future__ import annotations

import array
import hashlib
from pathlib import Path

from rcl_interfaces.msg import Parameter as ParameterMsg, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from rclpy.node import Node
from std_msgs.msg import Float32, String, UInt8MultiArray

from ..core.learning import checkpoint as ckpt
from ..core.learning.chunk_filter import ChunkGate, PolicyLagFilter
from ..core.learning.chunk_learner import ChunkLearner
from ..core.learning.train_config import load_train_config
from ..core.sim.observations import POLICY, POLICY_NOISE_FREE, PRIVILEGED
from ..core.sim.robot import load_robot
from .ros_io import COMMAND_QOS, LATCHED_QOS, spin


def _namespace(node_name: str) -> str:
    return node_name.rsplit('/', 1)[0] or '/'


class TrainerNode(Node):
    """The live trainer; see the module docstring."""

    def __init__(self):
        super().__init__('trainer')
        cfg = load_train_config(self.declare_parameter('config', 'train_ppo.yaml').value)
        self.run_dir = Path(self.declare_parameter('run_dir', 'runs/live').value)
        targets = [self._absolute(t) for t in
                   self.declare_parameter('push_targets', ['policy_node']).value]
        topic = self.declare_parameter('chunk_topic', '/rollout_chunks').value
        self.per_iteration = self.declare_parameter('chunks_per_iteration', 1).value
        lag = self.declare_parameter('max_policy_lag', 0).value
        self.cfg = cfg
        self.robot = load_robot(cfg.env.robot)
        dims = {POLICY: self.robot.policy_obs.dim, POLICY_NOISE_FREE: self.robot.policy_obs.dim,
                PRIVILEGED: self.robot.privileged_obs.dim}
        self.learner = ChunkLearner(cfg, dims, self.robot.num_joints,
                                    [f'reward/{k}' for k in sorted(cfg.env.rewards.scales)])
        latest = ckpt.latest_checkpoint(self.run_dir)
        if latest is not None:
            self.learner.load(latest)
            self.get_logger().info(f'resumed from {latest} (version '
                                   f'{self.learner.policy_version})')
        self.gate = ChunkGate(self.learner.spec, PolicyLagFilter(lag))
        self.pending = []
        self.sha = ''
        self.model_pubs = {ns: self.create_publisher(
            UInt8MultiArray, f'{ns.rstrip("/")}/policy/model', LATCHED_QOS)
            for ns in {_namespace(t) for t in targets}}
        self.targets = {t: {'client': self.create_client(SetParameters, f'{t}/set_parameters'),
                            'acked': '', 'busy': False} for t in targets}
        self.metric_pubs: dict[str, object] = {}
        # A target that reports another version (e.g. restarted, holding no model) gets the
        # current one again.
        for ns in self.model_pubs:
            self.create_subscription(String, f'{ns.rstrip("/")}/policy/model_version',
                                     lambda m, ns=ns: self.on_version(ns, m.data), LATCHED_QOS)
        self.create_subscription(UInt8MultiArray, topic, self.on_chunk, COMMAND_QOS)
        self.create_timer(0.5, self.activate_targets)
        self.push()

    def _absolute(self, name: str) -> str:
        """A target node name; relative names are in the trainer's namespace."""
        return name if name.startswith('/') else \
            f'{self.get_namespace().rstrip("/")}/{name}'

    # ----------------------------------------------------------------------------- chunks
    def on_chunk(self, msg: UInt8MultiArray) -> None:
        chunk, error = self.gate.admit_or_none(msg.data)
        if error is not None:
            self.get_logger().warning(f'chunk dropped: {error}', throttle_duration_sec=2.0)
            return
        self.pending.append(chunk)
        if len(self.pending) >= self.per_iteration:
            chunks, self.pending = self.pending, []
            metrics = self.learner.learn(chunks)
            actors = sorted({c.actor_id for c in chunks})
            self.get_logger().info(
                f'iteration {self.learner.iteration}: {len(chunks)} chunks from '
                f'{", ".join(actors)}, mean reward {metrics["mean_reward"]:.4f}, dropped '
                f'{self.gate.counters.dropped_fraction():.0%}')
            self.publish_metrics({**metrics, **self.gate.counters.as_dict()})
            self.learner.save(self.run_dir, self.cfg.runner.keep_checkpoints)
            self.push()

    def publish_metrics(self, metrics: dict) -> None:
        for name, value in metrics.items():
            if name not in self.metric_pubs:
                self.metric_pubs[name] = self.create_publisher(
                    Float32, f'trainer/metrics/{name}', 10)
            self.metric_pubs[name].publish(Float32(data=float(value)))

    # ---------------------------------------------------------------------------- pushing
    def push(self) -> None:
        """Export the current student and offer it to every target (activation follows)."""
        version = self.learner.policy_version
        data = self.learner.export_student(self.robot, self.run_dir / 'models' /
                                           f'student_v{version}.onnx')
        self.sha = hashlib.sha256(data).hexdigest()
        self.gate.lag_filter.publish(version, self.sha)
        for pub in self.model_pubs.values():
            pub.publish(UInt8MultiArray(data=array.array('B', data)))
        self.activate_targets()

    def activate_targets(self) -> None:
        for name, target in self.targets.items():
            if target['acked'] == self.sha or target['busy'] or \
                    not target['client'].service_is_ready():
                continue
            value = ParameterValue(type=ParameterType.PARAMETER_STRING, string_value=self.sha)
            request = SetParameters.Request(parameters=[ParameterMsg(name='model_sha256',
                                                                     value=value)])
            target['busy'] = True
            future = target['client'].call_async(request)
            future.add_done_callback(lambda f, n=name, s=self.sha: self.on_reply(n, s, f))

    def on_version(self, namespace: str, version: str) -> None:
        if self.sha and not self.sha.startswith(version or '-'):
            for name, target in self.targets.items():
                if _namespace(name) == namespace:
                    target['acked'] = ''

    def on_reply(self, name: str, sha: str, future) -> None:
        target = self.targets[name]
        target['busy'] = False
        response = future.result()
        if response is None:  # cancelled (shutting down)
            return
        result = response.results[0]
        if result.successful:
            target['acked'] = sha
            self.get_logger().info(f'{name} now acts with {sha[:12]}')
        else:
            # Retried at the next timer tick (e.g. the bytes had not arrived yet).
            self.get_logger().warning(f'{name} refused {sha[:12]}: {result.reason}',
                                      throttle_duration_sec=2.0)


def main(args=None) -> int:
    return spin(TrainerNode, args)


if __name__ == '__main__':
    raise SystemExit(main())
