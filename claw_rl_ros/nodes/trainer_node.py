"""trainer_node: rollout chunks in, PPO (+ OPD) updates, the new student pushed out (thin glue).

Chunks arrive on ``chunk_topic`` (``std_msgs/UInt8MultiArray``, any number of actors in any
namespace). :class:`~claw_rl_ros.core.live.live_trainer.LiveTrainer` decodes, validates and
lag-filters them (``max_policy_lag`` older versions allowed, drops counted per cause), learns
every ``chunks_per_iteration`` chunks (or when the oldest pending chunk waited
``batch_timeout_s``: an actor died), logs metrics.csv / TensorBoard and checkpoints atomically.
Then the student is exported to ONNX (policy version and action std in its metadata) and
pushed through the policy node's hot-swap mechanism to every node in ``push_targets``: bytes on
``<namespace>/policy/model`` (latched), then ``model_sha256`` through
``<node>/set_parameters``; replies are logged with their reason and a refusal does not stop
training. Targets that are not up yet are retried every 0.5 s, and a target whose version
topic reports another model (e.g. restarted) is sent the current one again: an actor's own
``<actor>/model_version``, else its namespace's ``policy/model_version`` (the policy node's).
With ``device_worlds`` > 0 the trainer also acts itself
(:class:`~claw_rl_ros.core.live.device_actor.DeviceActor`: the config's env on its engine and
device, one chunk per pushed student, handed to the trainer without DDS).
Metrics go to ``trainer/metrics/<name>`` (``std_msgs/Float32``) every iteration, the chunk
counters also once a second with ``/diagnostics``. At ``max_iterations`` or the time budget the
node writes student.onnx, its evaluation, learning_curve.png and summary.json and exits 0;
Ctrl-C writes the curve and summary (the checkpoint of the last iteration is already on disk).

Parameters: :class:`~..core.params.node_config.TrainerParams` (``ros2 param describe``; all
read-only).
"""

from __future__ import annotations

import array
import hashlib
import time
from typing import NoReturn

from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import Parameter as ParameterMsg, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
import rclpy
from rclpy.node import Node
from std_msgs.msg import Float32, String, UInt8MultiArray

from ..core.config import merge
from ..core.learning.train_config import load_train_config, split_overrides, with_teacher
from ..core.live.device_actor import check_worlds, DeviceActor
from ..core.live.live_trainer import LiveTrainer
from ..core.sim.robot import load_robot
from ..core.params.node_config import TrainerParams
from .node_params import declare
from .ros_io import (COMMAND_QOS, diagnostics, exit_without_teardown, log_events, presigned,
                     spin, STATE_QOS, steady_timer)


# A target that has not answered an activation within this time (e.g. killed mid-call) is
# asked again.
REPLY_TIMEOUT_S = 5.0


def _namespace(node_name: str) -> str:
    return node_name.rsplit('/', 1)[0] or '/'


class TrainerNode(Node):
    """The live trainer; see the module docstring."""

    trainer: LiveTrainer | None = None  # None: __init__ refused before it was built
    device_actor: DeviceActor | None = None

    def __init__(self):
        super().__init__('trainer')
        p = declare(self, TrainerParams)
        runner = {'torch_threads': p.torch_threads}
        runner.update({k: getattr(p, k) for k in ('time_budget_s', 'max_iterations')
                       if getattr(p, k)})
        # The graph's `set` first, then what this node's own parameters say.
        overrides = merge(split_overrides(p.overrides, 'overrides'), {'runner': runner})
        if p.robot:
            overrides.setdefault('env', {})['robot'] = p.robot
        if p.robot_overlay:
            overrides.setdefault('env', {})['robot_overlay'] = p.robot_overlay
        if p.teacher:
            overrides = with_teacher(overrides, p.teacher)
        cfg = load_train_config(p.config, overrides)
        if p.device_worlds:
            check_worlds(p.device_worlds)  # before the run directory is written
        self.trainer = LiveTrainer(
            cfg, load_robot(cfg.env.robot, overlay=cfg.env.robot_overlay), p.run_dir,
            max_policy_lag=p.max_policy_lag,
            chunks_per_iteration=p.chunks_per_iteration,
            batch_timeout_s=p.batch_timeout_s, min_chunk_envs=p.min_chunk_envs,
            resume=p.resume)
        if self.trainer.resumed_from is not None:
            self.get_logger().info(f'resumed from {self.trainer.resumed_from} (iteration '
                                   f'{self.trainer.learner.iteration})')
        targets = [self._absolute(t) for t in p.push_targets]
        self.sha = ''
        self.model_pubs = {ns: self.create_publisher(
            UInt8MultiArray, f'{ns.rstrip("/")}/policy/model', STATE_QOS)
            for ns in {_namespace(t) for t in targets}}
        # 'own': the target reports on its own version topic (an actor), not its namespace's.
        self.targets = {t: {'client': self.create_client(SetParameters, f'{t}/set_parameters'),
                            'acked': '', 'asked_at': 0.0, 'own': False} for t in targets}
        self.metric_pubs: dict[str, object] = {}
        self.ended = False  # training done: summary written, shutting down
        self.pub_diag = self.create_publisher(DiagnosticArray, '/diagnostics', 10)
        # A target that reports another version (e.g. restarted, holding no model) gets the
        # current one again. One publisher per version topic: each actor has its own.
        for ns in self.model_pubs:
            self.create_subscription(String, f'{ns.rstrip("/")}/policy/model_version',
                                     lambda m, ns=ns: self.on_version(m.data, ns), STATE_QOS)
        for name in self.targets:
            self.create_subscription(String, f'{name}/model_version', lambda m, n=name:
                                     self.on_version(m.data, target=n), STATE_QOS)
        for topic in filter(None, (p.chunk_topic, p.loop_chunk_topic)):
            self.create_subscription(UInt8MultiArray, topic, self.on_chunk, COMMAND_QOS)
        self.create_timer(0.5, presigned(self.on_timer))
        # Imported now rather than for the curve at Ctrl-C (seconds on a loaded machine, inside
        # the launcher's grace period).
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot  # noqa: F401
        steady_timer(self, 1.0, self.publish_status)
        # The trainer's own actor (device_worlds): its chunks go straight to the trainer.
        self.device_actor = DeviceActor(cfg, p.device_worlds, p.device_seed,
                                        self.trainer.robot) if p.device_worlds else None
        if self.device_actor is not None:
            self.create_timer(0.005, presigned(self.on_device_tick))
            self.get_logger().info(f'device actor: {p.device_worlds} worlds on '
                                   f'{cfg.env.physics} ({cfg.env.device})')
        self.push()

    def _absolute(self, name: str) -> str:
        """A target node name; relative names are in the trainer's namespace."""
        return name if name.startswith('/') else \
            f'{self.get_namespace().rstrip("/")}/{name}'

    # ----------------------------------------------------------------------------- chunks
    def on_chunk(self, msg: UInt8MultiArray) -> None:
        error = self.trainer.offer(msg.data)
        if error is not None:
            self.get_logger().warning(f'chunk dropped: {error}', throttle_duration_sec=2.0)
        log_events(self, self.trainer.roster.drain())  # a join before its iteration
        self.maybe_iterate()
        log_events(self, self.trainer.roster.drain())

    def on_device_tick(self) -> None:
        """The device actor's chunk for the newest student, if it has not acted for it yet."""
        verdict = self.device_actor.offer_chunk(self.trainer)
        if verdict is False:
            return
        if verdict is not None:
            self.get_logger().warning(f'device chunk dropped: {verdict}',
                                      throttle_duration_sec=2.0)
        log_events(self, self.trainer.roster.drain())
        self.maybe_iterate()
        log_events(self, self.trainer.roster.drain())

    def on_timer(self) -> None:
        self.maybe_iterate()
        log_events(self, self.trainer.roster.drain())
        self.activate_targets()

    def maybe_iterate(self) -> None:
        if self.trainer.ready():
            actors = sorted({c.actor_id for c in self.trainer.pending})
            metrics = self.trainer.iterate()
            # Per iteration: DEBUG (the progress line, metrics and /diagnostics say it).
            self.get_logger().debug(
                f'iteration {self.trainer.learner.iteration}: {metrics["chunks"]} chunks from '
                f'{", ".join(actors)}, mean reward {metrics["mean_reward"]:.4f}, dropped '
                f'{metrics["dropped_fraction"]:.0%}')
            self.publish_metrics(metrics)
            if not self.trainer.done():
                self.push()
                return
        # Also when no chunk comes any more (every actor gone): the time budget still ends it.
        if self.trainer.done() and not self.ended:
            self.ended = True
            self.trainer.finish(stopped=False)
            # The numbers; the tables (chunk counters, evaluations) are in summary.json.
            brief = {k: v for k, v in self.trainer.summary.items() if not isinstance(v, dict)}
            self.get_logger().info(f'training done: {brief} (all of it: summary.json)')
            rclpy.try_shutdown(context=self.context)

    def publish_metrics(self, metrics: dict) -> None:
        for name, value in metrics.items():
            if name not in self.metric_pubs:
                self.metric_pubs[name] = self.create_publisher(
                    Float32, f'trainer/metrics/{name}', 10)
            self.metric_pubs[name].publish(Float32(data=float(value)))

    def publish_status(self) -> None:
        counters = self.trainer.gate.counters.as_dict()
        counters['received'] = counters['accepted'] + self.trainer.gate.counters.total_dropped
        counters['iteration'] = self.trainer.learner.iteration
        self.publish_metrics(counters)
        fields = {'policy_version': self.trainer.learner.policy_version,
                  'pending_chunks': len(self.trainer.pending), **counters,
                  'silent_actors': ', '.join(self.trainer.roster.silent()) or 'none',
                  **{f'acting {name}': t['acked'][:12] or 'none'
                     for name, t in self.targets.items()}}
        level = 'warn' if counters['dropped_fraction'] > 0.5 or self.trainer.roster.silent() \
            else 'ok'
        self.pub_diag.publish(diagnostics(self, 'trainer', level, f'iteration '
                                          f'{fields["iteration"]}', fields))

    # ---------------------------------------------------------------------------- pushing
    def push(self) -> None:
        """Export the current student and offer it to every target (activation follows)."""
        data = self.trainer.export()
        self.sha = hashlib.sha256(data).hexdigest()
        if self.device_actor is not None:
            self.device_actor.use(data)
        for pub in self.model_pubs.values():
            pub.publish(UInt8MultiArray(data=array.array('B', data)))
        self.activate_targets()

    def activate_targets(self) -> None:
        now = time.monotonic()
        for name, target in self.targets.items():
            if target['acked'] == self.sha or now - target['asked_at'] < REPLY_TIMEOUT_S or \
                    not target['client'].service_is_ready():
                continue
            value = ParameterValue(type=ParameterType.PARAMETER_STRING, string_value=self.sha)
            request = SetParameters.Request(parameters=[ParameterMsg(name='model_sha256',
                                                                     value=value)])
            target['asked_at'] = now
            future = target['client'].call_async(request)
            future.add_done_callback(lambda f, n=name, s=self.sha: self.on_reply(n, s, f))

    def on_version(self, version: str, namespace: str = '', target: str = '') -> None:
        """``<target>/model_version`` (an actor's own topic) or ``<namespace>/policy/
        model_version`` (for the targets there without one) reports ``version``."""
        if target:
            self.targets[target]['own'] = True
        if not self.sha or self.sha.startswith(version or '-'):
            return
        for name, t in self.targets.items():
            if name == target or not target and _namespace(name) == namespace and not t['own']:
                t['acked'] = ''

    def on_reply(self, name: str, sha: str, future) -> None:
        target = self.targets[name]
        target['asked_at'] = 0.0
        response = future.result()
        if response is None:  # cancelled (shutting down)
            return
        result = response.results[0]
        if result.successful:
            target['acked'] = sha
            self.get_logger().debug(f'{name} now acts with {sha[:12]}')
        else:
            # Retried at the next timer tick. The bytes racing the request is normal once per
            # push (DEBUG); a second refusal of the same model is worth a warning.
            again = target.get('refused') == sha
            target['refused'] = sha
            message = f'{name} refused {sha[:12]}: {result.reason}'
            if again:  # (one severity per logger call site: rclpy refuses a change)
                self.get_logger().warning(message, throttle_duration_sec=2.0)
            else:
                self.get_logger().debug(message)

    def destroy_node(self) -> None:
        # Ctrl-C or the end of training: logs closed, curve and summary written.
        if self.trainer is not None:
            self.trainer.finish(stopped=not self.trainer.done())
        if self.device_actor is not None:
            self.device_actor.close()
        super().destroy_node()


def main(args=None) -> NoReturn:
    # Everything is on disk (checkpoint, logs, summary) once spin returns.
    exit_without_teardown(spin(TrainerNode, args))


if __name__ == '__main__':
    main()
