"""Every node's parameters, declared once: one dataclass per node, a description per field.

Plain Python (no ROS): ``nodes/node_params.py`` declares these on a node. A field made with
:func:`param` carries its default, its description, whether it is read-only after start-up
and the values it may take. The safety state machine's limits are not restated here:
:data:`SafetyLimits` takes their names, defaults and descriptions from
:class:`~..control.safety.SafetyConfig`. config/*.yaml and launch_graph/graphs.py state only
what differs from these defaults; test/test_node_params.py checks every key they give is a
field here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import math
import typing

from ..control.drive_gains import DEFAULT_GAIN_TOLERANCE, DriveGains, GAINS_SOURCES
from ..control.excitation import ExcitationConfig, PATTERNS, VARIANT_DEFAULTS, VARIANTS
from ..control.model_swap import DEFAULT_MAX_MODEL_BYTES
from ..control.safety import SafetyConfig
from ..sim.terrain import TERRAIN_TYPES
from ..verify.episode_record import MAX_EPISODE_S

# Executors (parameter ``executor``): rclpy's C++ EventsExecutor takes each message as it
# arrives; the Python SingleThreadedExecutor rebuilds its wait set on every wake-up (measured
# in bench/ros_control.py: it doubled the realtime joint_states -> command latency).
EXECUTORS = ('events', 'single_threaded')
# The recorder's: rclpy's EventsExecutor fails (SystemError) on the first message to a
# subscription whose callback takes the message info, which the recorder's do (it records each
# message's source timestamp): the events executor is refused for it, by name.
RECORDER_EXECUTORS = ('single_threaded',)
# How an actor's chunks travel (core/live/chunk_encoding.py encodes each).
CHUNK_ENCODINGS = ('raw', 'zstd', 'zstd_f16')


def param(default, doc: str, read_only: bool = True, choices: tuple = ()):
    """A parameter field: ``default``, its one-line description, read-only after start-up
    unless ``read_only`` is false, and the values it may take (empty: any of its type)."""
    if not doc.strip():
        raise ValueError('param: give every parameter a description')
    metadata = {'doc': doc, 'read_only': read_only, 'choices': choices}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def default_of(f: dataclasses.Field):
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def _safety_limits() -> type:
    """SafetyConfig's fields as parameter fields (a sequence becomes a list of floats)."""
    hints = typing.get_type_hints(SafetyConfig)
    fields = []
    for f in dataclasses.fields(SafetyConfig):
        sequence = hints[f.name] == typing.Sequence[float]
        fields.append((f.name, list[float] if sequence else hints[f.name],
                       param(list(f.default) if sequence else f.default, f.metadata['doc'])))
    return dataclasses.make_dataclass('SafetyLimits', fields, frozen=True)


SafetyLimits = _safety_limits()
# The policy node's excitation parameters: excite_ + an ExcitationConfig field.
EXCITE = 'excite_'


def _excitation_limits() -> type:
    """ExcitationConfig's fields as ``excite_<name>`` parameters (an amplitude of 0 takes the
    variant's); checked against the robot by ``excitation.from_params``."""
    hints = typing.get_type_hints(ExcitationConfig)
    fields = []
    for f in dataclasses.fields(ExcitationConfig):
        default, doc = f.default, f'EXCITE: {f.metadata["doc"]}'
        if f.name in VARIANT_DEFAULTS['ground']:
            default = 0.0
            doc += '; 0: the variant\'s (' + ', '.join(
                f'{v} {d[f.name]}' for v, d in VARIANT_DEFAULTS.items()) + ')'
        choices = {'pattern': PATTERNS, 'variant': VARIANTS}.get(f.name, ())
        fields.append((EXCITE + f.name, hints[f.name], param(default, doc, choices=choices)))
    return dataclasses.make_dataclass('ExcitationLimits', fields, frozen=True)


ExcitationLimits = _excitation_limits()


def excitation_values(p) -> dict[str, object]:
    """The ``excite_*`` parameters of ``p`` keyed by ExcitationConfig field."""
    return {f.name: getattr(p, EXCITE + f.name) for f in dataclasses.fields(ExcitationConfig)}


EXECUTOR = ("callback executor: events (rclpy's EventsExecutor, each message as it arrives) "
            'or single_threaded (the Python SingleThreadedExecutor)')
MODES = ('realtime', 'lockstep')
STATE_QOS = ('reliable', 'sensor_data')
ROBOT = 'robot name (config/robots/<name>.yaml) or the path of a robot YAML'
JOINTS = 'joint_commands element order (empty: the spec order)'
OVERLAY = ('robot overlay merged onto the robot (claw-rl sysid --out: identified gains, joint '
           'friction, damping, rotor inertia, delay); empty: none')
TRAIN_CONFIG = 'train YAML (config/<name> or a path)'
OVERRIDES = ('config overrides KEY=VALUE separated by spaces, as claw-rl train --set takes '
             "them (the train graph's set)")
CHUNK_TOPIC = 'topic of the rollout chunks (std_msgs/UInt8MultiArray)'
DIAGNOSTICS_PERIOD = ('period of /diagnostics [s, steady clock], 0.05 to 60 (claw-rl verify '
                      "runs 0.1: it waits for the policy node's status at the end)")
MODEL_SHA = ('set it to the sha256 (or a prefix) of model bytes received on policy/model to '
             'act with that model (the hot swap); the reply says why not')


EPISODE_SEED = ('-1: every draw (perturbations, noise, pushes) from one stream seeded by seed; '
                'n >= 0: each ~/reset reseeds it with (seed, n), so that episode draws the same '
                'whatever ran before it (claw-rl verify sets it to the episode index before each '
                'reset, on any number of graphs)')


def check_episode_seed(value: int) -> None:
    """ValueError naming the parameter unless value >= -1."""
    if value < -1:
        raise ValueError(f'parameter episode_seed = {value!r}; use -1 (one stream) or an '
                         'episode number >= 0')


def check_model_bytes(value: int) -> None:
    """ValueError naming the parameter unless 1 <= value <= 2 GiB (protobuf's own limit): a
    cap below 1 would refuse every model, at the first push instead of at start-up."""
    if not 1 <= value <= 2 ** 31:
        raise ValueError(f'parameter max_model_bytes = {value!r}; use a size cap of 1 to '
                         f'{2 ** 31} bytes (default {DEFAULT_MAX_MODEL_BYTES})')


def check_diagnostics_period(value: float) -> None:
    """ValueError naming the parameter unless 0.05 <= value <= 60 (NaN and inf too)."""
    if not 0.05 <= value <= 60.0:
        raise ValueError(f'parameter diagnostics_period_s = {value!r}; use 0.05 to 60 s '
                         '(default 1.0)')


@dataclass(frozen=True)
class SimParams:
    """sim_node (the MuJoCo robot)."""

    robot: str = param('claw_quadruped', ROBOT)
    robot_overlay: str = param('', OVERLAY)
    mode: str = param('realtime', 'realtime (steady-clock timer at the control rate) or '
                      'lockstep (one control step per command)', choices=MODES)
    real_time_factor: float = param(1.0, 'realtime mode: sim seconds per wall second (> 0; '
                                    '1.0 = realtime)')
    randomization: bool = param(False, "domain randomisation from the env config's "
                                'randomization section, drawn at every reset')
    pushes: bool = param(False, 'random planar pushes every randomization.push_interval_s')
    noise: bool = param(False, "sensor noise at the env config's observation-noise levels")
    command_timeout_s: float = param(0.25, 'realtime: no command for this long holds the '
                                     'default pose (damped); lockstep: the state is re-sent '
                                     'after this long without an answer [s]')
    publish_clock: bool = param(True, 'publish /clock and stamp the state with sim time '
                                '(the other nodes then run with use_sim_time)')
    seed: int = param(0, 'seed of resets, randomisation, pushes and noise')
    env_config: str = param('', 'train YAML whose env: section is used (empty: the env '
                            'defaults; training: the whole config, empty = train_ppo.yaml)')
    overrides: str = param('', OVERRIDES + ', applied to env_config')
    reset_on_fall: bool = param(True, "reset when the env's failure conditions hit")
    on_stand: bool = param(False, 'the trunk held on a stand in the air, legs free (system '
                           "identification's excitation): it never falls nor resets by a fall")
    terrain: str = param('', 'stand the world on one terrain tile: TYPE[:LEVEL], TYPE one of '
                         f'{", ".join(TERRAIN_TYPES)}, LEVEL 0..env_config\'s '
                         'env.terrain.num_levels - 1 (default the top); empty or flat: the plane')
    terrain_seed: int = param(1000, 'seed of the tile\'s heights (the training configs use 0: '
                              'another map)')
    training: bool = param(False, 'the control loop as an actor: step the train env and '
                           'publish rollout chunks of the policy node\'s records')
    chunk_topic: str = param('/rollout_chunks', 'training: ' + CHUNK_TOPIC)
    state_qos: str = param('reliable', 'QoS of joint_states, imu, odom and /clock: reliable '
                           "(as ros2_control's joint_state_broadcaster) or sensor_data "
                           '(best effort)', choices=STATE_QOS)
    joints: list[str] = param([], JOINTS)
    executor: str = param('events', EXECUTOR, choices=EXECUTORS)
    diagnostics_period_s: float = param(1.0, DIAGNOSTICS_PERIOD)
    start_paused: bool = param(False, 'start paused (~/pause false runs it): nothing is '
                               'stepped, drawn or timed out before the first command of a user')
    pause_after_s: float = param(0.0, 'pause by itself this much sim time after each ~/reset '
                                 "(0: never; at most 600): claw-rl verify's episodes, each "
                                 'exactly that long, recorded and sent on ~/episode')
    episode_seed: int = param(-1, EPISODE_SEED, read_only=False)

    def __post_init__(self):
        check_diagnostics_period(self.diagnostics_period_s)
        if not 0.0 <= self.pause_after_s <= MAX_EPISODE_S:  # (NaN fails too)
            raise ValueError(f'parameter pause_after_s = {self.pause_after_s!r}; use 0 (never) '
                             f'or the sim seconds after a reset, at most {MAX_EPISODE_S:g}')
        check_episode_seed(self.episode_seed)
        if self.seed < 0:
            raise ValueError(f'parameter seed = {self.seed!r}; use an integer >= 0 (numpy '
                             'seeds are non-negative)')
        if not 0 < self.real_time_factor < math.inf:  # (NaN fails too)
            raise ValueError(f'parameter real_time_factor = {self.real_time_factor!r}; use sim '
                             'seconds per wall second > 0 (1.0 = realtime)')
        # NaN would never time a command out (a stale target held for ever), <= 0 would
        # always do (and is no timer period in lockstep).
        if not 0 < self.command_timeout_s <= 60.0:
            raise ValueError(f'parameter command_timeout_s = {self.command_timeout_s!r}; use '
                             'seconds > 0, at most 60 (default 0.25)')
        if self.training and self.terrain:
            raise ValueError(f'parameter terrain = {self.terrain!r} with training: the train '
                             "config's env.terrain places the world; set it there and leave "
                             'terrain empty')
        if self.on_stand and (self.training or self.terrain):
            raise ValueError('parameter on_stand with ' + ('training' if self.training else
                             f'terrain = {self.terrain!r}') + ': a robot on a stand neither '
                             'trains nor stands on terrain; leave on_stand false')


@dataclass(frozen=True)
class SafetyParams(SafetyLimits):
    """The policy node's safety parameters (wiring in nodes/policy/safety_io.py): the state
    machine's limits above, then the node's own."""

    gains_source: str = param('sent', "how the drives get the model's Kp / Kd: sent (on "
                              'joint_gains with every command, [Kp x J, Kd x J] in joints '
                              'order, Kp = 0 in PASSIVE; the self-check needs a subscriber) or '
                              'declared (the driver holds its own: drive_kp / drive_kd, '
                              "compared with the model's)", choices=GAINS_SOURCES)
    drive_kp: list[float] = param([], 'gains_source declared: the Kp the drives hold [N m/rad], '
                                  'one number for every joint or one per joint in joints order '
                                  '(empty: not declared, the self-check refuses RL)')
    drive_kd: list[float] = param([], 'gains_source declared: the Kd the drives hold [N m s/'
                                  'rad], one number for every joint or one per joint in joints '
                                  'order (empty: not declared, the self-check refuses RL)')
    gain_tolerance: float = param(DEFAULT_GAIN_TOLERANCE, 'largest relative difference of a '
                                  "declared drive gain from the model's, 0 to 0.5 (0.05: 5 %); "
                                  'more refuses RL, naming both')
    controllers_file: str = param('', 'ros2_control controllers YAML: the self-check compares '
                                  "command_controller's joints with joints (empty: skip)")
    command_controller: str = param('forward_position_controller', 'the '
                                    'forward_command_controller in controllers_file')
    cmd_vel_timeout_s: float = param(0.5, 'cmd_vel older than this [s, monotonic] is a zero '
                                     'command (0: never stale)')
    wall_stale_after_s: float = param(0.0, 'wall time without an accepted state that faults '
                                      '[s] (0: the stale limit; 1 s under use_sim_time, where '
                                      'a paced or lockstep simulator may be slower)')
    max_delta_per_tick: float = param(0.0, 'largest target change per tick [rad] (0: the '
                                      'velocity limit x control dt)')
    require_verification: bool = param(False, 'enter RL only with a passing <model stem>.'
                                       'verify.json of this model (claw-rl verify)')
    state_qos: str = param('sensor_data', 'QoS of the joint_states / imu subscriptions: '
                           'sensor_data (best effort, matches any publisher) or reliable',
                           choices=STATE_QOS)

    def __post_init__(self):
        self.drive_gains()  # a bad gain parameter refuses the start, by name

    def drive_gains(self) -> DriveGains:
        """gains_source, drive_kp, drive_kd, gain_tolerance, checked (ValueError by name; the
        number of values is checked against the robot by the controller)."""
        return DriveGains(self.gains_source, tuple(self.drive_kp), tuple(self.drive_kd),
                          self.gain_tolerance)


@dataclass(frozen=True)
class PolicyParams(ExcitationLimits, SafetyParams):
    """policy_node (the ONNX student); the safety and excitation parameters above, then its
    own."""

    robot: str = param('claw_quadruped', ROBOT + "; must match the model's embedded spec")
    robot_overlay: str = param('', OVERLAY + "; the model's spec must match the merged robot")
    model_path: str = param('', 'exported student .onnx to serve (empty: hold the default '
                            'pose); set it to load another', read_only=False)
    model_sha256: str = param('', MODEL_SHA, read_only=False)
    stale_after_periods: float = param(3.0, 'a state or IMU reading this many control periods '
                                       'old faults to PASSIVE (damping); a stamp this far '
                                       'ahead is a future_stamp fault; 1.5 to 100')
    joints: list[str] = param([], JOINTS)
    max_model_bytes: int = param(DEFAULT_MAX_MODEL_BYTES, 'size cap of a model [bytes]')
    training: bool = param(False, 'the control loop as an actor: actions sampled around the '
                           'mean, one record per RL tick on policy/training_step (never on a '
                           'robot)')
    seed: int = param(0, "seed of the training mode's action sampling")
    executor: str = param('events', EXECUTOR, choices=EXECUTORS)
    diagnostics_period_s: float = param(1.0, DIAGNOSTICS_PERIOD)

    def __post_init__(self):
        super().__post_init__()
        check_diagnostics_period(self.diagnostics_period_s)
        check_model_bytes(self.max_model_bytes)


@dataclass(frozen=True)
class TrainerParams:
    """trainer_node (the live trainer)."""

    config: str = param('train_ppo.yaml', TRAIN_CONFIG)
    robot: str = param('', ROBOT + " (empty: the config's env.robot)")
    robot_overlay: str = param('', OVERLAY + " (empty: the config's env.robot_overlay)")
    run_dir: str = param('runs/live', 'run directory: checkpoints, students, metrics, summary')
    resume: bool = param(False, "continue run_dir's newest checkpoint (false refuses a run_dir "
                         'that has one)')
    teacher: str = param('', 'checkpoint of a frozen OPD teacher (empty: the config\'s '
                         'distillation settings)')
    time_budget_s: float = param(0.0, "training wall time [s] (0: the config's)")
    max_iterations: int = param(0, "iterations to train (0: the config's)")
    torch_threads: int = param(1, 'torch intra-op threads for learning (0 = one per core)')
    push_targets: list[str] = param(['policy_node'], 'nodes to push every new student to '
                                    "(relative names: in the trainer's namespace)")
    chunk_topic: str = param('/rollout_chunks', 'the batched actors\' ' + CHUNK_TOPIC)
    loop_chunk_topic: str = param('', "the control-loop actor's own chunk topic, so its rate "
                                  "cannot evict the batched actors' chunks (empty: none)")
    chunks_per_iteration: int = param(1, 'chunks that make one learning iteration')
    max_policy_lag: int = param(0, 'policy versions a chunk may be behind (older: dropped)')
    batch_timeout_s: float = param(10.0, 'learn from fewer chunks once the oldest pending one '
                                   'waited this long (an actor died) [s]')
    min_chunk_envs: int = param(1, 'only chunks of at least this many worlds count towards '
                                'chunks_per_iteration and the timeout (smaller ones are learnt '
                                'from but start no iteration)')
    device_worlds: int = param(0, "worlds of the config's env stepped in this process on its "
                               'engine and device (env.physics, env.device) with each new '
                               'student, one chunk each; their chunks skip DDS and count '
                               'towards chunks_per_iteration (0: none; at most 65536)')
    device_seed: int = param(0, "the device actor's env and action-sampling seed")
    overrides: str = param('', OVERRIDES)
    executor: str = param('single_threaded', EXECUTOR, choices=EXECUTORS)


@dataclass(frozen=True)
class ActorParams:
    """actor_node (N MuJoCo worlds and the pushed student)."""

    config: str = param('train_ppo.yaml', TRAIN_CONFIG + ': env, num_steps_per_env')
    overrides: str = param('', OVERRIDES)
    robot: str = param('', ROBOT + " (empty: the config's env.robot)")
    robot_overlay: str = param('', OVERLAY + " (empty: the config's env.robot_overlay)")
    num_envs: int = param(0, "MuJoCo worlds (0: the config's env.num_envs)")
    seed: int = param(0, 'env and action-sampling seed')
    chunk_topic: str = param('/rollout_chunks', CHUNK_TOPIC)
    chunk_encoding: str = param('raw', 'chunks on the wire: raw, zstd (lossless, ~0.65 of raw) '
                                'or zstd_f16 (float16 observations, ~0.4; not bit-identical) '
                                'for slow links', choices=CHUNK_ENCODINGS)
    max_model_bytes: int = param(DEFAULT_MAX_MODEL_BYTES, 'size cap of a model [bytes]')
    physics_threads: int = param(1, "physics threads (0: the config's env.num_threads)")
    chunks_in_flight: int = param(1, 'chunks the actor may be ahead of the trainer (1: '
                                  'synchronous PPO)')
    credit_timeout_s: float = param(30.0, 'collect one more chunk after this long without a '
                                    'new model (a chunk was lost) [s]')
    model_sha256: str = param('', MODEL_SHA, read_only=False)
    executor: str = param('single_threaded', EXECUTOR, choices=EXECUTORS)

    def __post_init__(self):
        check_model_bytes(self.max_model_bytes)


@dataclass(frozen=True)
class RecorderParams:
    """recorder_node (MCAP recording)."""

    path: str = param('', 'MCAP file to write (required; <path>.part until shutdown)')
    topics: list[str] = param([], 'topics to record, a subset of recorder_node.TOPICS '
                              '(empty: all of them)')
    robot: str = param('claw_quadruped', ROBOT)
    joints: list[str] = param([], 'the command element order, stored as metadata (empty: the '
                              'spec order)')
    executor: str = param('single_threaded', 'callback executor: single_threaded only (rclpy\'s '
                          'EventsExecutor fails on callbacks that take the message info)',
                          choices=RECORDER_EXECUTORS)


# Each node executable's parameters (the nodes use the same classes).
PARAMETERS = {'sim_node': SimParams, 'policy_node': PolicyParams,
              'trainer_node': TrainerParams, 'actor_node': ActorParams,
              'recorder_node': RecorderParams}
