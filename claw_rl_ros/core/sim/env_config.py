"""Typed configuration of the locomotion environment (the ``env:`` section of a YAML file)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from ..config import ConfigError, MAX_THREADS, param
from .observations import (HEIGHT_SCAN, MAX_HISTORY, POLICY, POLICY_NOISE_FREE, PRIVILEGED,
                           TERMS as OBS_TERMS)
from .rewards import TERMS as REWARD_TERMS
from .robot_spec import MAX_DELAY_STEPS
from .terrain import scan_offsets, TerrainConfig


# MuJoCo's constraint solvers and friction cones an env config may name.
SOLVERS = ('newton', 'cg')
# Physics engines of the batched env, and the devices they step on.
ENGINES = ('mujoco', 'mujoco_warp')
DEVICES = ('cpu', 'cuda')
CONES = ('pyramidal', 'elliptic')


def robot_sized(override, robot_value):
    """An env config value that may override a robot-sized constant: None means the robot's."""
    return robot_value if override is None else override


@dataclass
class CommandConfig:
    """Velocity commands (body frame), sampled per episode and resampled in-episode."""

    resample_time_s: float = param(10.0, 'seconds between command resamples', gt=0)
    lin_vel_x: tuple[float, float] = param((-0.5, 1.0), 'forward velocity range [m/s]',
                                           ordered=True)
    lin_vel_y: tuple[float, float] = param((-0.3, 0.3), 'lateral velocity range [m/s]',
                                           ordered=True)
    ang_vel_yaw: tuple[float, float] = param((-1.0, 1.0), 'yaw rate range [rad/s]', ordered=True)
    standing_probability: float = param(0.05, 'chance a sampled command is zero', ge=0, le=1)
    min_speed: float = param(0.1, 'planar commands slower than this become 0 [m/s]', ge=0)
    heading_command: bool = param(False, 'sample a heading instead of a yaw rate and steer '
                                  'to it (legged_gym rough terrain): worlds walk straight, so '
                                  'the terrain curriculum sees how far they get')
    heading: tuple[float, float] = param((-math.pi, math.pi), 'heading target range, world '
                                         'frame [rad]', ordered=True, ge=-math.pi, le=math.pi)
    heading_stiffness: float = param(0.5, 'yaw-rate command per rad of heading error [1/s] '
                                     '(clipped to ang_vel_yaw)', gt=0, le=100)


DEFAULT_REWARD_SCALES = {
    'tracking_lin_vel': 1.0,
    'tracking_ang_vel': 0.5,
    'lin_vel_z': -2.0,
    'ang_vel_xy': -0.05,
    'orientation': -1.0,
    'base_height': -10.0,
    'torques': -2e-4,
    'dof_acc': -2.5e-7,
    'action_rate': -0.01,
    'dof_pos_limits': -10.0,
    'collision': -1.0,
    'feet_air_time': 0.0,
    'stand_still': -0.5,
    'termination': 0.0,
    # Gait terms need the robot's gait clock (robot YAML gait.period_s > 0).
    'gait_contact': 0.5,
    'feet_clearance': 0.5,
    # Transfer terms (MuJoCo Playground's): feet sliding on the ground, mechanical power.
    'feet_slip': 0.0,
    'energy': 0.0,
}
GAIT_REWARDS = ('gait_contact', 'feet_clearance')


@dataclass
class RewardConfig:
    """Reward term scales (per second; multiplied by the control dt) and their constants."""

    scales: dict[str, float] = param(DEFAULT_REWARD_SCALES, 'term name -> scale (0 disables)')
    tracking_sigma: float = param(0.25, 'width of the exp tracking kernels [(m/s)^2]', gt=0)
    base_height_target: Optional[float] = param(None, 'desired trunk height [m] (None: the '
                                                      "robot's)", gt=0)
    feet_air_time_target: float = param(0.3, 'rewarded swing duration [s]', ge=0)
    moving_command_threshold: float = param(0.1, 'planar [m/s] and yaw [rad/s] commands both '
                                            'below this mean stand', ge=0)
    swing_height_target: Optional[float] = param(None, 'foot lift rewarded by feet_clearance '
                                                       "[m] (None: the robot's swing_height)",
                                                 gt=0)
    soft_joint_limit: float = param(0.9, 'fraction of the joint range without penalty',
                                    gt=0, le=1)
    only_positive: bool = param(True, 'clip the total reward at 0 (termination excepted)')


@dataclass
class TerminationConfig:
    """When an episode fails (time-outs are reported separately, for bootstrapping)."""

    max_tilt: float = param(1.0, 'trunk tilt from upright that ends an episode [rad]', gt=0,
                            le=3.2)
    min_base_height: Optional[float] = param(None, 'trunk height below which the episode ends '
                                                   "[m] (None: the robot's)", ge=0)
    contact_force: float = param(1.0, 'contact force that counts as a contact [N]', ge=0)
    max_joint_vel: float = param(200.0, 'joint speed treated as a diverged simulation [rad/s]',
                                 gt=0)


@dataclass
class RandomizationConfig:
    """Domain randomisation, sampled per world at every reset; each part can be switched off.
    A range whose ends are equal is not drawn (it costs no random numbers)."""

    enabled: bool = param(True, 'master switch for everything below')
    friction: tuple[float, float] = param((0.4, 1.25), 'ground friction range', ge=0.01, le=10,
                                          ordered=True)
    added_mass: Optional[tuple[float, float]] = param(None, 'payload on the trunk [kg] (None: '
                                                      "the robot's payload_range)", ordered=True)
    link_mass_scale: tuple[float, float] = param((0.9, 1.1), 'every link mass x this', gt=0,
                                                 le=10, ordered=True)
    com_offset: Optional[tuple[float, float]] = param(None, 'trunk CoM shift per axis [m] '
                                                      "(None: the robot's com_offset_range)",
                                                      ordered=True)
    motor_strength: tuple[float, float] = param((0.9, 1.1), 'the whole PD law (Kp and Kd '
                                                'together) x this', gt=0, le=10, ordered=True)
    kp_scale: tuple[float, float] = param((1.0, 1.0), "the drive's Kp x this, per joint "
                                          '(drawn apart from Kd)', gt=0, le=10, ordered=True)
    kd_scale: tuple[float, float] = param((1.0, 1.0), "the drive's Kd x this, per joint", ge=0,
                                          le=10, ordered=True)
    joint_friction_scale: tuple[float, float] = param((1.0, 1.0), "each joint's Coulomb "
                                                      'friction (the URDF friction, MuJoCo '
                                                      'frictionloss) x this', ge=0, le=100,
                                                      ordered=True)
    joint_damping_scale: tuple[float, float] = param((1.0, 1.0), "each joint's viscous damping "
                                                     '(the URDF damping) x this', ge=0, le=100,
                                                     ordered=True)
    armature_scale: tuple[float, float] = param((1.0, 1.0), "each joint's rotor inertia (the "
                                                "robot's armature) x this", ge=0, le=100,
                                                ordered=True)
    push_interval_s: float = param(8.0, 'seconds between random pushes (0 = no pushes)', ge=0)
    push_velocity: float = param(0.5, 'max planar velocity kick of a push [m/s]', ge=0)
    action_latency_substeps: Optional[tuple[int, int]] = param(
        None, 'physics steps a new target takes to reach the motors, drawn per world (may '
        "exceed a control period; None: the robot's actuator.delay_steps)", ge=0,
        le=MAX_DELAY_STEPS, ordered=True)
    joint_state_delay_substeps: tuple[int, int] = param((0, 0), 'physics steps the joint '
                                                        'states are old when the policy reads '
                                                        'them, drawn per world', ge=0, le=20,
                                                        ordered=True)
    imu_delay_substeps: tuple[int, int] = param((0, 0), 'physics steps the IMU reading is old '
                                                'when the policy reads it, drawn per world',
                                                ge=0, le=20, ordered=True)
    control_jitter_substeps: int = param(0, 'every control step the loop samples 0..this '
                                         'physics steps early (the control period +- this; '
                                         'the gait clock follows the samples)', ge=0, le=4)
    encoder_offset: tuple[float, float] = param((0.0, 0.0), 'constant offset of each measured '
                                                'joint position [rad]', ge=-0.5, le=0.5,
                                                ordered=True)
    imu_gyro_bias: tuple[float, float] = param((0.0, 0.0), 'constant bias of each gyro axis '
                                               '[rad/s]', ge=-1.0, le=1.0, ordered=True)
    imu_tilt_offset: tuple[float, float] = param((0.0, 0.0), "the IMU's mounting tilt, roll "
                                                 'and pitch each [rad]', ge=-0.3, le=0.3,
                                                 ordered=True)
    contact_timeconst: Optional[tuple[float, float]] = param(
        None, 'contact softness: MuJoCo solref time constant of every contact [s] (larger: '
        'softer; None: the model\'s 0.02 s; at least 2 physics steps)', ge=0.002, le=0.5,
        ordered=True)
    torsional_friction: Optional[tuple[float, float]] = param(
        None, "torsional friction of the ground's contacts (the feet's) [m] (None: off, "
        "MuJoCo's 3-D contacts; a range: 4-D contacts, a foot spinning on the ground resisted)",
        ge=0, le=0.1, ordered=True)
    transfer_ramp_steps: int = param(0, 'control steps per world over which the transfer '
                                     'ranges (drive gains, joint friction, damping and rotor '
                                     'inertia, delays, jitter, sensor offsets, contacts) widen '
                                     'linearly from the nominal robot to the ranges above, as '
                                     "legged_gym's curricula count steps; friction, masses and "
                                     'motor strength are full from the start; evaluation always '
                                     'draws the full ranges (0: no ramp)', ge=0, le=10_000_000)
    init_joint_pos_noise: float = param(0.1, 'reset pose noise per joint [rad]', ge=0)
    init_base_vel_noise: float = param(0.3, 'reset base velocity noise [m/s, rad/s]', ge=0)
    worlds_per_model: int = param(1, 'worlds that share one randomised model copy (1: each '
                                  'world its own; more: fewer copies, which stay in the CPU '
                                  'cache; core/sim/model_variants.py)', ge=1, le=64)


@dataclass
class NoiseConfig:
    """Uniform observation noise on the policy group: level x scale, per term."""

    enabled: bool = param(True, 'add noise to the policy observation')
    scale: float = param(1.0, 'multiplier on every level', ge=0)
    levels: dict[str, float] = param({'base_ang_vel': 0.2, 'projected_gravity': 0.05,
                                      'joint_pos': 0.01, 'joint_vel': 1.5},
                                     'term -> noise amplitude in its own units', ge=0)


@dataclass
class EnvConfig:
    """The batched locomotion environment."""

    robot: str = param('claw_quadruped', 'robot name (config/robots/<name>.yaml) or YAML path')
    robot_overlay: str = param('', 'a robot overlay merged onto the robot (claw-rl sysid --out: '
                                   'identified gains, joint friction, damping, rotor inertia and '
                                   'delay; the delay range re-centred on the fit); empty: none')
    num_envs: int = param(256, 'worlds stepped together', ge=1, le=65536)
    episode_length_s: float = param(20.0, 'episode time-out [s]', gt=0)
    seed: int = param(0, 'seed of every random draw in the env', ge=0)
    num_threads: int = param(0, 'physics threads (0 = one per CPU core)', ge=0,
                             le=MAX_THREADS)
    clip_actions: float = param(10.0, 'policy actions are clipped to +-this', gt=0)
    policy_history: int = param(1, 'control steps of policy observations the student reads, '
                                'oldest first (1 = the current one only): memory for a blind '
                                'student, e.g. to feel slippery ground', ge=1,
                                le=MAX_HISTORY)
    solver_iterations: int = param(4, 'MuJoCo Newton iterations per step', ge=1, le=100)
    solver_ls_iterations: int = param(6, 'MuJoCo line-search iterations', ge=1, le=100)
    physics: str = param('mujoco', 'the engine that steps the worlds: mujoco (MuJoCo on the '
                         "CPU's cores, mujoco.rollout) or mujoco_warp (the same physics in "
                         "MuJoCo Warp's kernels, on env.device; docs/gpu.md)")
    device: str = param('cpu', 'where mujoco_warp steps the worlds: cpu (Warp\'s CPU kernels: '
                        'development and the agreement test) or cuda (an NVIDIA GPU)')
    solver: str = param('newton', "MuJoCo's constraint solver: newton or cg")
    cone: str = param('pyramidal', "MuJoCo's friction cone: pyramidal or elliptic")
    noslip_iterations: int = param(0, "MuJoCo noslip iterations per step (0: off). MuJoCo's "
                                   'soft contacts let friction creep under a steady sideways '
                                   'load: a standing robot slides ~1.2 cm/s down 10 deg at any '
                                   'friction; 3 stop it', ge=0, le=100)
    commands: CommandConfig = param(CommandConfig(), 'velocity commands')
    rewards: RewardConfig = param(RewardConfig(), 'reward terms')
    termination: TerminationConfig = param(TerminationConfig(), 'failure conditions')
    randomization: RandomizationConfig = param(RandomizationConfig(), 'domain randomisation')
    noise: NoiseConfig = param(NoiseConfig(), 'observation noise')
    terrain: TerrainConfig = param(TerrainConfig(), 'heightfield terrain (off: a flat plane)')

    def __post_init__(self):
        for key, allowed in (('solver', SOLVERS), ('cone', CONES), ('physics', ENGINES),
                             ('device', DEVICES)):
            if getattr(self, key) not in allowed:
                raise ConfigError('', key, f'{getattr(self, key)!r}: use one of '
                                  f'{", ".join(allowed)}')
        if self.device != 'cpu' and self.physics != 'mujoco_warp':
            raise ConfigError('', 'device', f'{self.device!r} with physics {self.physics!r}: '
                              'MuJoCo steps on the CPU cores; set env.physics: mujoco_warp '
                              'to step on the GPU')
        if self.physics == 'mujoco_warp':
            self._check_warp()
        for name in self.rewards.scales:
            if name not in REWARD_TERMS:
                raise ConfigError('', f'rewards.scales.{name}', 'unknown reward term; '
                                  f'available: {", ".join(REWARD_TERMS)}')
        for name in self.noise.levels:
            if name not in OBS_TERMS:
                raise ConfigError('', f'noise.levels.{name}', 'unknown observation term; '
                                  f'available: {", ".join(OBS_TERMS)}')

    def _check_warp(self) -> None:
        """What MuJoCo Warp cannot batch per world is refused by name."""
        if self.terrain.enabled and self.terrain.collision == 'boxes':
            raise ConfigError('', 'terrain.collision', "'boxes' with physics mujoco_warp: each "
                              "world's own window of ground boxes needs a model per world; "
                              'set env.terrain.collision: heightfield')
        torsion = self.randomization.torsional_friction
        if self.randomization.enabled and torsion is not None and torsion[1] > 0:
            raise ConfigError('', 'randomization.torsional_friction', f'{list(torsion)} with '
                              'physics mujoco_warp: MuJoCo Warp cannot give worlds their own '
                              'contact dimension; leave it unset (null) or use physics mujoco')


def solver_options(cfg: EnvConfig) -> dict[str, int]:
    """The MuJoCo solver settings of ``cfg`` as BatchedPhysics takes them: one list for the
    training env and the sim node's session, so both step the same physics."""
    return {'solver_iterations': cfg.solver_iterations,
            'solver_ls_iterations': cfg.solver_ls_iterations,
            'noslip_iterations': cfg.noslip_iterations, 'solver': cfg.solver, 'cone': cfg.cone}


def observation_dims(robot: Any, env_cfg: Any) -> dict[str, int]:
    """{group: size} of the env built from ``env_cfg`` for ``robot``, without building it: the
    one source the env, the live trainer and the actors' chunk spec share (``policy`` holds
    ``env_cfg.policy_history`` frames; ``height_scan`` only with the terrain's scan on)."""
    dims = {POLICY: robot.policy_obs.dim * env_cfg.policy_history,
            POLICY_NOISE_FREE: robot.policy_obs.dim, PRIVILEGED: robot.privileged_obs.dim}
    scan = env_cfg.terrain.height_scan
    if env_cfg.terrain.enabled and scan.enabled:
        dims[HEIGHT_SCAN] = len(scan_offsets(scan, robot.standing_height))
    return dims


def observation_windows(env_cfg: Any) -> dict[str, int]:
    """{group: H} of the groups that are windows of H frames (``policy`` with
    ``env_cfg.policy_history`` > 1): the env and the trainer's chunk spec share it (rollout
    chunks send such windows as frames)."""
    return {POLICY: env_cfg.policy_history} if env_cfg.policy_history > 1 else {}
