"""The package's graphs: the one description behind launch/*.launch.py and ``claw-rl up``.

Parameter files must key their section so it applies in any namespace (``/**/sim_node:``):
rcl silently skips a section keyed ``sim_node`` for ``/robot1/sim_node``, and
:func:`.description.resolve` refuses such a file with that fix (config/sim_node.yaml and
config/policy_node.yaml use ``/**/sim_node:`` and ``/**/policy_node:``; checked by
test_graph.py::test_package_parameter_files_apply_to_their_nodes_in_any_namespace).

Adding a graph is one entry in :data:`GRAPHS`; a graph with N of something builds N entries,
e.g. a training graph (``trainer`` + ``actors`` argument -> ``actor_0`` ... ``actor_{N-1}``)::

    Graph('train', 'trainer + N actors', (ROBOT, Argument('actors', '2', 'actor processes'),
          NAMESPACE), lambda v: [trainer(v)] + [actor(v, i) for i in range(int(v['actors']))])
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

from ..core import paths
from ..core.config import ConfigError, MAX_THREADS
from ..core.control.drive_gains import DriveGains, GAINS_SOURCES
from ..core.learning.train_config import load_train_config, split_overrides
from .description import (Argument, composed, existing_path, Graph, NodeEntry, overlay_argument,
                          robot_argument, to_bool)

ROBOT = Argument('robot', 'claw_quadruped',
                 'robot name (config/robots/<name>.yaml) or the path of a robot YAML')
ROBOT_OVERLAY = Argument('robot_overlay', '', 'robot overlay merged onto the robot (claw-rl '
                         'sysid --out: identified gains, joint friction, damping, rotor '
                         'inertia, delay); a model trained with one needs the same; empty: '
                         'none')
MODEL = Argument('model', '', 'ONNX student to serve (claw-rl export); empty: no model, the '
                 'policy node holds the default pose')
MODE = Argument('mode', 'realtime', 'sim pacing: realtime (wall-clock control rate) or '
                'lockstep (one control step per command)', ('realtime', 'lockstep'))
NAMESPACE = Argument('namespace', '', 'namespace of the nodes and their relative topics '
                     '(/clock and /diagnostics stay global)')
SECONDS = Argument('seconds', '5.0', 'simulated seconds')
RECORD = Argument('record', '', 'MCAP file to record what the policy saw and did '
                  '(recorder_node); empty: no recording')


def use_sim_time(default: str) -> Argument:
    return Argument('use_sim_time', default, 'run on the simulator clock: sim_node publishes '
                    '/clock and stamps state with it, policy_node reads time from /clock',
                    ('true', 'false'))


def overlay(values: Mapping[str, str], source: str, robot: str | None = None) -> dict:
    """``{'robot_overlay': absolute path}`` of a checked ``robot_overlay`` argument (for
    ``robot``, default the ``robot`` argument), or nothing when it is empty."""
    path = overlay_argument(values['robot_overlay'], values['robot'] if robot is None else robot,
                            source)
    return {'robot_overlay': path} if path else {}


def sim_node(values: Mapping[str, str], source: str) -> NodeEntry:
    """The MuJoCo robot (config/sim_node.yaml, then robot, robot_overlay, mode,
    publish_clock)."""
    return NodeEntry('sim_node', 'sim_node', param_files=('sim_node.yaml',), parameters={
        'robot': robot_argument(values['robot']), **overlay(values, source),
        'mode': values['mode'], 'publish_clock': to_bool(values, 'use_sim_time', source)})


def recorder(values: Mapping[str, str]) -> list[NodeEntry]:
    """recorder_node writing ``record`` (absolute), or nothing when it is empty."""
    if not values['record']:
        return []
    return [NodeEntry('recorder_node', 'recorder_node', parameters={
        'path': os.path.abspath(os.path.expanduser(values['record'])),
        'robot': robot_argument(values['robot'])})]


def policy_node(values: Mapping[str, str], source: str) -> NodeEntry:
    """The ONNX student (config/policy_node.yaml, then robot, robot_overlay, model_path,
    use_sim_time)."""
    return NodeEntry('policy_node', 'policy_node', param_files=('policy_node.yaml',),
                     parameters={'robot': robot_argument(values['robot']),
                                 **overlay(values, source),
                                 'model_path': existing_path(values, 'model', source),
                                 'use_sim_time': to_bool(values, 'use_sim_time', source)})


COMPOSED = Argument('composed', 'false', 'run sim_node and policy_node in one process '
                    '(node_container, one executor): the lockstep loop ~1.35x faster; for '
                    'simulation, a robot runs the policy node in its own process',
                    ('true', 'false'))


def control_loop(values: Mapping[str, str], source: str) -> list[NodeEntry]:
    """sim_node + policy_node: two processes, or one ``control_container`` (``composed``)."""
    nodes = [sim_node(values, source), policy_node(values, source)]
    return [composed('control_container', nodes)] if to_bool(values, 'composed', source) \
        else nodes


CONFIG = Argument('config', 'train_ppo.yaml', 'train YAML (config/<name> or a path): env, '
                  'networks, PPO, distillation and rollout length, shared by trainer and actors')
ACTORS = Argument('actors', '2', 'batched actor processes (actor_0 ... actor_<N-1>)')
NUM_ENVS = Argument('num_envs', '0', "MuJoCo worlds per actor (0 = the config's env.num_envs)")
DEVICE_WORLDS = Argument('device_worlds', '0', "worlds the trainer steps itself on the config's "
                         'engine and device (env.physics: mujoco_warp, env.device: cuda for a '
                         'GPU), one chunk per student, without DDS; with it, actors may be 0 '
                         '(0 = none)')
RUN_DIR = Argument('run_dir', 'runs/live', 'trainer run directory: checkpoints, exported '
                   'students, metrics.csv, TensorBoard, learning_curve.png, summary.json')
RESUME = Argument('resume', 'false', "continue run_dir's newest checkpoint (false refuses a "
                  'run_dir that has one)', ('true', 'false'))
TEACHER = Argument('teacher', '', 'checkpoint of a frozen OPD teacher (empty: the config\'s '
                   'distillation settings)')
SET = Argument('set', '', 'config overrides as `claw-rl train --set` takes them, KEY=VALUE '
               'separated by spaces (e.g. runner.seed=2 env.num_envs=64, shell quotes for a '
               'value with spaces); checked once here, applied by the trainer, the actors and '
               'the control loop alike')
TIME_BUDGET = Argument('time_budget', '0', "training wall time in seconds (0 = the config's "
                       'runner.time_budget_s)')
TRAIN_ROBOT = Argument('robot', '', 'robot name or robot YAML path for trainer, actors and the '
                       "control loop (empty: the config's env.robot)")
TRAIN_OVERLAY = Argument('robot_overlay', '', 'robot overlay (claw-rl sysid --out) for trainer, '
                         "actors and the control loop (empty: the config's env.robot_overlay, "
                         'none by default); the exported students record it')
CONTROL_LOOP = Argument('control_loop', 'true', 'also run sim_node + policy_node in realtime: the '
                        'policy node receives every new student like the actors (watch training '
                        'in rqt, /joint_states, /diagnostics)', ('true', 'false'))
CONTROL_ACTOR = Argument('control_actor', 'false', 'the control loop is an actor too: sim_node '
                         'steps the training env (randomisation, pushes, noise) and pairs each '
                         'step with the policy node, which samples around its mean; their '
                         'chunks join the batched actors\' (needs control_loop true and actors '
                         'of >= 2 worlds)', ('true', 'false'))
LOOP_SPEED = Argument('real_time_factor', '0.5', "the control loop's sim seconds per wall "
                      "second in realtime mode; half sim_node's own default (1.0 = realtime) "
                      'on purpose: the loop costs about half a core at 1.0, which a 2-core '
                      'machine needs for learning')
OVERLAP = Argument('overlap', 'auto', 'true: actors collect the next chunk while the trainer '
                   'learns (chunks lag up to 2 versions, corrected by importance weights); '
                   'false: synchronous PPO, actors wait for each new model (lag 0); auto: '
                   'false for PPO (on 2 cores 2 actors x 128 worlds walked at 31 s instead of 50 '
                   's: fresh chunks, and the trainer learns on every core), true for SAC (off-'
                   'policy: its replay buffer holds older data anyway)', ('auto', 'true', 'false'))
TRAINER_THREADS = Argument('trainer_threads', 'auto', "the trainer's torch threads for "
                           'learning: a number (0 = one per core), or auto: 1 with overlap (the '
                           'actors collect on the other cores meanwhile), one per core without '
                           '(they wait)')


LOOP_CHUNK_TOPIC = '/control_loop/rollout_chunks'


def _count(values: Mapping[str, str], name: str, source: str, minimum: int) -> int:
    """A whole-number argument >= minimum; anything else is a ConfigError."""
    try:
        value = int(values[name])
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ConfigError(source, name, f'{values[name]!r} is not a whole number >= {minimum}')
    return value


def _number(values: Mapping[str, str], name: str, source: str, ok, what: str) -> float:
    """A numeric argument for which ``ok(value)`` holds; anything else is a ConfigError."""
    try:
        value = float(values[name])
    except ValueError:
        value = float('nan')
    if not ok(value):
        raise ConfigError(source, name, f'{values[name]!r} is not {what}')
    return value


def _threads(value: str, source: str, auto: int) -> int:
    """The trainer_threads argument: ``auto`` or a whole number 0-MAX_THREADS (0: one per
    core)."""
    if value == 'auto':
        return auto
    try:
        threads = int(value)
    except ValueError:
        threads = -1
    if not 0 <= threads <= MAX_THREADS:
        raise ConfigError(source, 'trainer_threads', f'{value!r} is neither a whole number '
                          f'from 0 to {MAX_THREADS} nor auto')
    return threads


def _train(values: Mapping[str, str]) -> list[NodeEntry]:
    """trainer_node + N actor_nodes; the trainer pushes every new student to each actor."""
    source = "graph 'train'"
    device_worlds = _count(values, 'device_worlds', source, 0)
    # The trainer's own worlds may replace the actor processes.
    actors = _count(values, 'actors', source, 0 if device_worlds else 1)
    num_envs = _count(values, 'num_envs', source, 0)
    config = paths.config_path(values['config'])
    overrides = values['set'].strip()
    train_cfg = load_train_config(config, split_overrides(overrides))  # refused here, by key
    # Overlap: each actor runs one chunk ahead, collecting while the trainer learns (lag 1);
    # lag 2 leaves one version of slack for an actor that started late or is slower.
    overlap = train_cfg.algorithm == 'sac' if values['overlap'] == 'auto' \
        else to_bool(values, 'overlap', source)
    in_flight = 2 if overlap else 1
    lag = 0 if in_flight == 1 else 2
    # auto: one thread while the actors collect on the other cores, every core while they wait.
    trainer_threads = _threads(values['trainer_threads'], source, 1 if in_flight > 1 else 0)
    budget = _number(values, 'time_budget', source, lambda v: v >= 0,
                     'a number of seconds >= 0')
    names = [f'actor_{i}' for i in range(actors)]
    loop = to_bool(values, 'control_loop', source)
    robot = robot_argument(values['robot']) if values['robot'] else train_cfg.env.robot
    # Every node gets the overlay by path: the control loop's nodes do not read the config's.
    fit = overlay({'robot_overlay': values['robot_overlay'] or train_cfg.env.robot_overlay},
                  source, robot)
    actor_loop = _control_actor(values, source, loop, num_envs or train_cfg.env.num_envs,
                                train_cfg.algorithm, train_cfg.env.policy_history)
    # The trainer ends the graph when its budget is spent (exit 0 is not a failure).
    trainer = NodeEntry('trainer_node', 'trainer', exits=True, parameters={
        'config': values['config'], 'run_dir': values['run_dir'], 'robot': robot, **fit,
        'push_targets': names + ['policy_node'] * loop,
        'chunks_per_iteration': actors + (device_worlds > 0), 'max_policy_lag': lag,
        'time_budget_s': budget, 'device_worlds': device_worlds,
        'device_seed': actor_seed(train_cfg.runner.seed, actors),
        'torch_threads': trainer_threads,
        # The loop's 1-world chunks are learnt from but never start an iteration; they come
        # on their own topic (lockstep makes hundreds a second: in a shared queue they would
        # evict the batched actors' chunks while the trainer exports).
        'min_chunk_envs': 2 if actor_loop else 1,
        'loop_chunk_topic': LOOP_CHUNK_TOPIC if actor_loop else '',
        'resume': to_bool(values, 'resume', source),
        'teacher': existing_path(values, 'teacher', source), 'overrides': overrides})
    nodes = [trainer] + [NodeEntry('actor_node', name, parameters={
        'config': values['config'], 'robot': robot, **fit, 'num_envs': num_envs,
        'seed': actor_seed(train_cfg.runner.seed, i), 'overrides': overrides,
        'chunks_in_flight': in_flight},
        # An actor holds no learning state: one that dies (a native crash) is started again,
        # the trainer pushes it the current student, and the run goes on.
        respawn=True, respawn_delay=RESPAWN_DELAY_S) for i, name in enumerate(names)]
    if loop:
        # The control loop as in deployment, on the training env (randomisation and noise as
        # configured), serving each pushed student from the first one on.
        # As an actor (training mode) it also pushes, as the env does, and samples actions.
        # Only what differs from the nodes' defaults (node_params.py): publish_clock is on.
        nodes += [NodeEntry('sim_node', 'sim_node', param_files=('sim_node.yaml',), parameters={
            'robot': robot, **fit, 'mode': values['mode'],
            'env_config': str(config.resolve()), 'overrides': overrides,
            'randomization': True, 'noise': True,
            'training': actor_loop, 'pushes': actor_loop, 'chunk_topic': LOOP_CHUNK_TOPIC,
            'real_time_factor': _number(
                values, 'real_time_factor', source, lambda v: v > 0,
                'a number > 0 (sim seconds per wall second; 1.0 = realtime)')}),
            NodeEntry('policy_node', 'policy_node', param_files=('policy_node.yaml',),
                      parameters={'robot': robot, **fit, 'use_sim_time': True,
                                  'training': actor_loop})]
    return nodes


def _control_actor(values: Mapping[str, str], source: str, loop: bool, num_envs: int,
                   algorithm: str, history: int = 1) -> bool:
    """The control_actor argument, checked against the graph and algorithm it needs."""
    actor_loop = to_bool(values, 'control_actor', source)
    if actor_loop and history > 1:
        raise ConfigError(source, 'control_actor', f'true needs env.policy_history 1 (the '
                          f'config has {history}): the loop pairs its steps with the env one '
                          'observation at a time; train a student with memory on the batched '
                          'actors (control_actor false)')
    if actor_loop and algorithm != 'ppo':
        raise ConfigError(source, 'control_actor', f'true needs algorithm ppo (the config has '
                          f'{algorithm!r}): the control loop samples PPO\'s Gaussian; SAC\'s '
                          'squashed Gaussian is sampled by the batched actors only')
    if actor_loop and not loop:
        raise ConfigError(source, 'control_actor', 'true needs control_loop true (the loop that '
                          'acts)')
    if actor_loop and num_envs < 2:
        raise ConfigError(source, 'control_actor', f'true needs batched actors of >= 2 worlds '
                          f'(num_envs {num_envs}): their chunks start iterations, the loop\'s '
                          '1-world chunks only join them')
    return actor_loop


def actor_seed(run_seed: int, index: int) -> int:
    """The env seed of actor ``index`` in a run seeded ``run_seed`` (the config's
    ``runner.seed``): distinct per actor, and per run seed for up to ACTOR_SEED_STRIDE actors,
    so runs of different seeds never share an actor's env randomness."""
    return run_seed * ACTOR_SEED_STRIDE + index


ACTOR_SEED_STRIDE = 1000


# The deploy graph: the policy node alone on a real robot's ros2_control controllers.
DEPLOY_ARGUMENTS = (
    ROBOT, ROBOT_OVERLAY, MODEL, NAMESPACE, RECORD,
    Argument('joint_states_topic', '/joint_states', 'sensor_msgs/JointState of the robot '
             '(joint_state_broadcaster); joints matched by name'),
    Argument('imu_topic', '/imu_sensor_broadcaster/imu', 'sensor_msgs/Imu of the trunk IMU '
             '(imu_sensor_broadcaster)'),
    Argument('command_topic', '/forward_position_controller/commands', 'std_msgs/'
             'Float64MultiArray position targets (forward_command_controller ~/commands)'),
    Argument('cmd_vel_topic', '/cmd_vel', 'geometry_msgs/Twist velocity command source '
             '(teleop, republishing); nothing published for cmd_vel_timeout_s: stand in '
             'place'),
    Argument('gains_source', 'sent', "how the drives get the model's Kp / Kd: sent (on "
             'gains_topic with every command, Kp = 0 in PASSIVE: a driver that takes gains) or '
             'declared (a driver that holds its own: drive_kp, drive_kd)', GAINS_SOURCES),
    Argument('gains_topic', '', 'gains_source sent: the topic your driver reads [Kp x J, Kd x '
             'J] from (empty: joint_gains in the namespace)'),
    Argument('drive_kp', '', 'gains_source declared: the Kp your drives hold [N m/rad], one '
             'number or one per joint in joints order, comma-separated (empty: not declared)'),
    Argument('drive_kd', '', 'gains_source declared: the Kd your drives hold [N m s/rad], as '
             'drive_kp'),
    Argument('state_qos', 'sensor_data', 'QoS of the joint_states / imu subscriptions',
             ('sensor_data', 'reliable')),
    Argument('controllers_file', 'ros2_control_claw_quadruped.yaml', 'ros2_control '
             'controllers YAML (config/<name> or a path); the self-check compares the command '
             "controller's joints with the policy's order (empty: skip)"),
    Argument('command_controller', 'forward_position_controller', 'name of the '
             'forward_command_controller in controllers_file'),
    Argument('require_verification', 'true', 'enter RL only with a passing '
             '<model stem>.verify.json of this model (claw-rl verify)', ('true', 'false')),
)


# A deploy policy node that dies is started again this long after (the controllers hold the
# last target meanwhile); it comes back PASSIVE.
RESPAWN_DELAY_S = 1.0


def _gain_list(values: Mapping[str, str], name: str, source: str) -> list[float]:
    """A comma- or space-separated list of numbers ('' -> []); anything else a ConfigError."""
    text = values[name].strip().strip('[]')
    try:
        return [float(v) for v in text.replace(',', ' ').split()]
    except ValueError:
        raise ConfigError(source, name, f'{values[name]!r}: give numbers, one or one per '
                          'joint, comma-separated (e.g. 30 or 30,30,...)') from None


def _drive_gains(values: Mapping[str, str], source: str) -> dict[str, Any]:
    """The policy node's gains_source, drive_kp and drive_kd, checked as the node checks
    them (the number of values against the robot: the node)."""
    kp, kd = _gain_list(values, 'drive_kp', source), _gain_list(values, 'drive_kd', source)
    try:
        DriveGains(values['gains_source'], tuple(kp), tuple(kd))
    except ValueError as exc:
        raise ConfigError(source, '', str(exc)) from None
    if values['gains_source'] == 'declared' and values['gains_topic'].strip():
        raise ConfigError(source, 'gains_topic', f'{values["gains_topic"]!r} with gains_source '
                          'declared: nothing is sent; leave it empty, or use gains_source sent '
                          'for a driver that takes gains')
    out: dict[str, Any] = {'gains_source': values['gains_source']}
    if kp:  # empty: the parameter files' (none by default), as rcl reads [] as not set
        out['drive_kp'], out['drive_kd'] = kp, kd
    return out


def _deploy(values: Mapping[str, str]) -> list[NodeEntry]:
    """policy_node on wall time, autostart off (the operator steps it up), remapped topics,
    restarted if it dies (respawn)."""
    source = "graph 'deploy'"
    for name in ('joint_states_topic', 'imu_topic', 'command_topic', 'cmd_vel_topic'):
        if not values[name].strip():
            raise ConfigError(source, name, 'empty; give the topic name')
    controllers = values['controllers_file']
    if controllers:
        path = paths.config_path(controllers)
        if not path.is_file():
            raise ConfigError(source, 'controllers_file', f'{controllers!r}: no such file '
                              '(looked in the working directory and config/); give the '
                              'controllers YAML of the robot, or empty to skip the check')
        controllers = str(path.resolve())
    gains = values['gains_topic'].strip()
    remap = [('joint_states', values['joint_states_topic']), ('imu', values['imu_topic']),
             ('joint_commands', values['command_topic']), ('cmd_vel', values['cmd_vel_topic'])]
    if gains:
        remap.append(('joint_gains', gains))
    # The recorder listens on the same remapped topics as the policy node.
    recorders = [dataclasses.replace(r, remappings=tuple(remap)) for r in recorder(values)]
    policy = NodeEntry('policy_node', 'policy_node',
                       param_files=('policy_node.yaml', 'deploy.yaml'), parameters={
                           'robot': robot_argument(values['robot']),
                           **overlay(values, source),
                           'model_path': existing_path(values, 'model', source),
                           'use_sim_time': False, 'autostart': False,
                           'require_verification': to_bool(values, 'require_verification',
                                                           source),
                           **_drive_gains(values, source), 'state_qos': values['state_qos'],
                           'controllers_file': controllers,
                           'command_controller': values['command_controller']},
                       remappings=tuple(remap), respawn=True, respawn_delay=RESPAWN_DELAY_S)
    return recorders + [policy]


def _stand(values: Mapping[str, str]) -> list[NodeEntry]:
    return [NodeEntry('claw_rl', 'stand', exits=True, arguments=(
        'stand', '--robot', robot_argument(values['robot']), '--seconds', values['seconds']))]


GRAPHS: dict[str, Graph] = {graph.name: graph for graph in (
    Graph('stand', 'hold the default pose in simulation and print a summary (one-shot)',
          (ROBOT, SECONDS), _stand),
    Graph('sim', 'sim_node alone: joint_states, imu, odom, /clock; takes joint_commands',
          (ROBOT, ROBOT_OVERLAY, MODE, NAMESPACE, use_sim_time('true')),
          lambda v: [sim_node(v, "graph 'sim'")]),
    Graph('policy', 'policy_node alone, for a simulator or robot that is already running',
          (ROBOT, ROBOT_OVERLAY, MODEL, NAMESPACE, use_sim_time('false')),
          lambda v: [policy_node(v, "graph 'policy'")]),
    Graph('control', 'the control loop: sim_node + policy_node serving a model',
          (ROBOT, ROBOT_OVERLAY, MODEL, MODE, NAMESPACE, use_sim_time('true'), RECORD,
           COMPOSED),
          lambda v: recorder(v) + control_loop(v, "graph 'control'")),
    Graph('deploy', 'policy_node alone on a real robot: ros2_control topics, wall time, '
          'operator-driven safety state machine, verified model', DEPLOY_ARGUMENTS, _deploy),
    Graph('train', 'live training: trainer_node learning from N batched actor_nodes, pushing '
          'each new student back to them and to the realtime control loop (sim_node + '
          'policy_node)', (CONFIG, ACTORS, NUM_ENVS, DEVICE_WORLDS, RUN_DIR, RESUME, TEACHER,
                           TIME_BUDGET,
                           OVERLAP, TRAINER_THREADS, TRAIN_ROBOT, TRAIN_OVERLAY,
                           CONTROL_LOOP, LOOP_SPEED,
                           CONTROL_ACTOR, MODE, NAMESPACE, SET),
          _train),
)}
