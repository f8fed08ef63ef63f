"""One simulated robot for the sim node: joint targets in, sensor readings out, per control step.

Built on the env's :class:`BatchedPhysics` (one world; the same scene, PD actuators, sensors and
per-world randomisation as training). The IMU readings are the model's ``imu`` site sensors
(framequat, gyro, accelerometer) of the last physics step, the same slices the env reads. The
randomisation, pushes and sensor noise follow the ``env:`` config and can each be switched off.
A command older than ``command_timeout_s`` is replaced by the default pose (PD hold, damped).

Action latency is simulated in sim time, so it holds in lockstep too: a command reaches the
actuators ``L`` physics substeps after the control step it was given in (``L`` drawn per reset
from ``randomization.action_latency_substeps``, or the robot's ``actuator.delay_steps``), through
the physics' delay line of past targets (L may exceed a control period). The actuator model is
the robot's (core/sim/actuator.py), as in training.

With a :class:`TerrainTile` the floor is one tile of the terrain generator
(:func:`~.terrain.generate_terrain`; type, level and seed) inside its flat border: the world
spawns at the tile's centre on the ground there (+- the spawn jitter with randomisation on),
its trunk height is measured above the ground under it, and reaching the map's edge resets it
(counted in ``left_map``, not as a fall), as the env's out-of-bounds time-out does.
:func:`terrain_tile` reads a ``TYPE[:LEVEL]`` spec (the sim node's ``terrain`` parameter,
``claw-rl eval --terrain``, ``claw-rl verify --terrain``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
import math
from typing import Iterable, Optional

import mujoco
import numpy as np

from ..config import ConfigError, from_dict, load_yaml, merge
from .env_config import EnvConfig, robot_sized, solver_options
from .physics import BatchedPhysics, STATE_SPEC
from .randomization import delay_range, draw_params, nominal_params, PHYSICAL
from .robot_overlay import recentred_randomization
from .robot_spec import RobotSpec
from .sensor_model import SensorModel, sensor_model_wanted
from .terrain import difficulty, generate_terrain, Terrain, TERRAIN_TYPES, TerrainConfig


@dataclass(frozen=True)
class TerrainTile:
    """One tile of the terrain generator: type ``kind``, ``level`` of ``num_levels``
    (difficulty (level + 1) / num_levels), ``seed`` of its random heights. ``config`` is the
    one-tile TerrainConfig that generates it (None for flat: the plane, as without terrain);
    ``walk`` [m] how far a world walks from its spawn before the tile ends, at least (its
    ``tile_walk``)."""

    kind: str
    level: int
    num_levels: int
    seed: int
    config: Optional[TerrainConfig] = field(default=None, compare=False, repr=False)
    walk: float = field(default=0.0, compare=False)

    @property
    def label(self) -> str:
        """``flat`` or ``TYPE:LEVEL``."""
        return self.kind if self.config is None else f'{self.kind}:{self.level}'


def tile_config(base: TerrainConfig, kind: str, level: int, seed: int) -> TerrainConfig:
    """A map of one tile, ``kind`` at ``level`` of ``base``'s levels, in ``base``'s sizes.

    Every tile shape scales its top-level maximum by the difficulty, so one level of
    difficulty 1 with the maxima x (level + 1) / num_levels is the same shape as that row of
    the full map; curriculum and height scan off.
    """
    d = difficulty(level, base.num_levels)
    return replace(base, enabled=True, types=[kind], proportions=[1.0], num_levels=1,
                   curriculum=False, max_init_level=0, cleared_min_level=0, seed=seed,
                   rough_height=base.rough_height * d, slope_deg=base.slope_deg * d,
                   step_height=base.step_height * d, obstacle_height=base.obstacle_height * d,
                   height_scan=replace(base.height_scan, enabled=False))


def terrain_tile(spec: str, base: TerrainConfig, seed: int, name: str = 'terrain',
                 seed_name: str = 'terrain_seed', walk: float = 0.0) -> TerrainTile | None:
    """``TYPE[:LEVEL]`` (LEVEL default: the top one of ``base``) -> the tile; '' -> None.

    ``name`` / ``seed_name`` are what the user set (a parameter, an option): a bad value is a
    ConfigError naming it, the value and the valid choices. ``walk`` > 0 [m] (one episode at
    the command) sets the tile's ``tile_walk``, else ``base``'s applies.
    """
    spec = spec.strip()
    if not spec:
        return None
    kind, _, level_text = spec.partition(':')
    top = base.num_levels - 1
    levels = f'LEVEL 0..{top} (default {top}, the hardest; env.terrain.num_levels {top + 1})'
    if kind not in TERRAIN_TYPES:
        raise ConfigError(name, '', f'{spec!r}: unknown terrain type {kind!r}; use one of '
                          f'{", ".join(TERRAIN_TYPES)}, as TYPE or TYPE:LEVEL with {levels}')
    try:
        level = int(level_text) if level_text else top
    except ValueError:
        raise ConfigError(name, '', f'{spec!r}: level {level_text!r} is not an integer; give '
                          f'{kind}:LEVEL with {levels}') from None
    if not 0 <= level <= top:
        raise ConfigError(name, '', f'{spec!r}: level {level} is out of range; give {kind}:'
                          f'LEVEL with {levels}')
    if seed < 0:
        raise ConfigError(seed_name, '', f'{seed} is negative; give a seed >= 0')
    if walk > 0:
        base = replace(base, tile_walk=float(walk))
    return TerrainTile(kind, level, base.num_levels, seed, None if kind == 'flat' else
                       tile_config(base, kind, level, seed), base.tile_walk)


def terrain_tiles(specs: Iterable[str], base: TerrainConfig, seed: int, name: str = 'terrain',
                  seed_name: str = 'terrain_seed', include_flat: bool = True,
                  walk: float = 0.0) -> list[TerrainTile]:
    """Several specs (``all``: every type at its top level; without flat unless
    ``include_flat``) -> their tiles (``walk``: :func:`terrain_tile`), each once; a repeated
    or excluded one is refused."""
    expanded: list[str] = []
    for spec in specs:
        expanded += [t for t in TERRAIN_TYPES if include_flat or t != 'flat'] \
            if spec.strip() == 'all' else [spec]
    tiles = [terrain_tile(spec, base, seed, name, seed_name, walk) for spec in expanded]
    if None in tiles:
        raise ConfigError(name, '', f'an empty spec; give TYPE[:LEVEL] with TYPE one of '
                          f'{", ".join(TERRAIN_TYPES)}')
    labels = [t.label for t in tiles]
    for tile in tiles:
        if labels.count(tile.label) > 1:
            raise ConfigError(name, '', f'{tile.label!r} is given {labels.count(tile.label)} '
                              'times; give each TYPE[:LEVEL] once')
        if tile.kind == 'flat' and not include_flat:
            raise ConfigError(name, '', "'flat' is the main table already (the plane); drop "
                              'it, or give the other types')
    return tiles


def env_section(path: str, overrides: dict | None = None) -> EnvConfig:
    """The ``env:`` section of a train YAML (empty path: the defaults) for one world, patched
    by the ``env`` part of ``overrides`` (the train graph's ``set``)."""
    if not path:
        return EnvConfig(num_envs=1)
    section = merge(load_yaml(path).get('env', {}), (overrides or {}).get('env', {}))
    return from_dict(EnvConfig, section, source=path, prefix='env')


@dataclass
class SimReadings:
    """One control step's measurements. Joint arrays [J] in spec order; quaternions (w,x,y,z).

    ``imu_quat`` [4], ``imu_gyro`` [3] rad/s, ``imu_acc`` [3] m/s^2 (specific force, body
    frame) come from the IMU sensors; ``base_pos`` [3], ``base_quat`` [4], ``base_lin_vel`` [3]
    and ``base_ang_vel`` [3] (body frame) are privileged ground truth (odometry).
    """

    time: float
    joint_pos: np.ndarray
    joint_vel: np.ndarray
    joint_effort: np.ndarray
    imu_quat: np.ndarray
    imu_gyro: np.ndarray
    imu_acc: np.ndarray
    base_pos: np.ndarray
    base_quat: np.ndarray
    base_lin_vel: np.ndarray
    base_ang_vel: np.ndarray


class SimSession:
    """A single world stepped one control period at a time by joint position targets
    (``stand``: the trunk held on a stand, legs free, for system identification's excitation;
    it never falls)."""

    def __init__(self, robot: RobotSpec, cfg: EnvConfig, *, randomization: bool = False,
                 pushes: bool = False, noise: bool = False, seed: int = 0,
                 command_timeout_s: float = 0.5, physics: BatchedPhysics | None = None,
                 terrain: TerrainTile | None = None, stand: bool = False):
        self.robot = robot
        self.stand = stand  # the trunk held on a stand (legs in the air): it never falls
        # An overlaid robot re-centres the env's delay range on its fit, as the env does.
        self.cfg = cfg = replace(cfg, randomization=recentred_randomization(
            cfg.randomization, robot.source.get('overlay', ''), robot.sim_dt))
        self.randomization = randomization and cfg.randomization.enabled
        self.pushes = pushes and cfg.randomization.push_interval_s > 0
        self.noise = noise
        self.command_timeout_s = command_timeout_s
        self.control_dt = robot.control_dt
        self.rng = np.random.default_rng(seed)
        self.tile = terrain if terrain is not None and terrain.config is not None else None
        self.terrain: Terrain | None = generate_terrain(self.tile.config, robot) \
            if self.tile else None
        # One world; a subclass may bring its own (e.g. an env's, see training_session.py).
        self.physics = physics if physics is not None else BatchedPhysics(
            robot, 1, **solver_options(cfg), terrain=self.terrain, stand=stand,
            max_delay_steps=delay_range(cfg.randomization, robot)[1] if self.randomization
            else robot.actuator.nominal_delay_steps)
        self._data = mujoco.MjData(self.physics.models[0])
        # What the robot's sensors report (offsets, biases, delays, control jitter), if any.
        dr = cfg.randomization
        self.sensor_model = SensorModel(dr, 1, robot.num_joints, robot.decimation) \
            if self.randomization and sensor_model_wanted(dr) else None
        self._push_steps = max(1, round(cfg.randomization.push_interval_s / self.control_dt))
        self.time = 0.0
        self.steps = 0
        self.falls = 0
        self.resets = 0
        self.pushes_done = 0
        self.left_map = 0
        self.commands = np.zeros(3)
        self.targets = robot.default_joint_pos.copy()
        self._latency = np.zeros(1, dtype=np.int64)
        self.latency_substeps = 0
        self.episode_params: dict[str, float] = {}
        self._command_time: float | None = None
        self.timed_out = True
        self.reset()

    # ----------------------------------------------------------------------------- control
    def set_targets(self, targets: np.ndarray, now: float) -> None:
        """[J] joint position targets (spec order) received at wall/ROS time ``now`` [s]."""
        self.targets = np.clip(targets, self.robot.joint_lower, self.robot.joint_upper)
        self._command_time = now

    def active_targets(self, now: float) -> np.ndarray:
        """The targets to apply at ``now``: the last command, or q0 once it has timed out."""
        self.timed_out = self._command_time is None or \
            now - self._command_time > self.command_timeout_s
        return self.robot.default_joint_pos if self.timed_out else self.targets

    def step(self, targets: np.ndarray) -> bool:
        """Advance one control period with [J] targets; returns True if the robot fell."""
        p, sm = self.physics, self.sensor_model
        latency = self._latency
        if sm is not None and sm.jitter:
            # Sampled early by control jitter: the command reaches the motors as much earlier.
            latency = np.maximum(latency - sm.next_jitter(self.rng), 0)
        # Through the delay line: the motors see these targets latency_substeps later.
        p.step(np.asarray(targets, dtype=np.float64)[None], latency)
        if sm is not None:
            sm.record(*p.substep_readings())
        self.time += self.control_dt
        self.steps += 1
        if self.pushes and self.steps % self._push_steps == 0:
            v = self.cfg.randomization.push_velocity
            p.qvel[0, 0:2] += self.rng.uniform(-v, v, 2)
            self.pushes_done += 1
        fell = self.fallen() or bool(p.diverged(self.cfg.termination.max_joint_vel)[0])
        self.falls += int(fell)
        if not fell and self.terrain is not None and \
                not self.terrain.inside(p.qpos[:, 0:2], self.robot.standing_height)[0]:
            # At the map's edge (the heightfield ends there): back to the tile, not a fall.
            self.left_map += 1
            self.reset()
        return fell

    def fallen(self) -> bool:
        """The env's failure conditions: tilt, trunk height, or a termination-body contact
        (never on a stand)."""
        if self.stand:
            return False
        term = self.cfg.termination
        w, x, y, z = self.physics.qpos[0, 3:7].tolist()
        # cos(tilt) = -(gravity in the body frame)_z = 1 - 2 (x^2 + y^2) for a unit quaternion.
        if 1.0 - 2.0 * (x * x + y * y) < math.cos(term.max_tilt) or \
                self.base_height() < robot_sized(term.min_base_height,
                                                 self.robot.min_base_height):
            return True
        lo, hi = self.physics.sensors.termination_contact
        # Contact sensors give [found, fx, fy, fz] per body; a contact needs enough force
        # (compared squared: |f|^2 > contact_force^2).
        raw = self.physics.sensordata[0, :, lo:hi].reshape(self.physics.decimation, -1, 4)
        found = raw[..., 0] > 0
        if not found.any():  # (most steps: no termination body touches anything)
            return False
        force = raw[..., 1:4]
        return bool((found & ((force * force).sum(-1) > term.contact_force ** 2)).any())

    def base_height(self) -> float:
        """The trunk's height [m] above the ground under it."""
        x, y, z = self.physics.qpos[0, 0:3]
        return float(z) if self.terrain is None else float(z - self.terrain.height_at(x, y))

    # ------------------------------------------------------------------------------- reset
    def reset(self) -> None:
        """Standing pose (with the env's reset noise and fresh randomisation when enabled); the
        default pose is held until the next command."""
        r, p, rng, dr = self.robot, self.physics, self.rng, self.cfg.randomization
        if self.randomization:
            draws = draw_params(dr, r, rng, 1, robot_sized(dr.added_mass, r.payload_range),
                                robot_sized(dr.com_offset, r.com_offset_range))
        else:
            draws = nominal_params(r, 1)
        p.set_physical_params(0, {name: draws[name][0] for name in PHYSICAL})
        self.latency_substeps = latency = int(draws['latency'][0])
        self._latency[0] = latency
        self.episode_params = {'friction': float(draws['friction'][0]),
                               'added_mass': float(draws['added_mass'][0]),
                               'mass_scale': float(draws['mass_scale'][0]),
                               'motor_strength': float(draws['motor_strength'][0]),
                               'latency_ms': latency * self.robot.sim_dt * 1e3}
        noise = dr.init_joint_pos_noise if self.randomization else 0.0
        qpos = p.standing_qpos.copy()
        qpos[p.qadr] = np.clip(r.default_joint_pos + rng.uniform(-noise, noise, r.num_joints),
                               r.joint_lower, r.joint_upper)
        if self.terrain is not None:
            qpos[0:3] += self._spawn_point()
        p.state[:] = 0.0
        p.qpos[0] = qpos
        # Until the delay line fills, the actuators keep holding the reset pose.
        p.hold(np.zeros(1, dtype=np.int64), qpos[p.qadr][None])
        # A command given before the reset does not carry over: hold q0 until the next one.
        self.targets = r.default_joint_pos.copy()
        self._command_time = None
        self.resets += 1
        self._refresh_sensors()
        self._restart_sensors(draw=True)

    def _spawn_point(self) -> np.ndarray:
        """[3] the tile's centre (+- the spawn jitter with randomisation), on the highest ground
        under the robot's footprint there."""
        t = self.terrain
        jitter = t.spawn_jitter if self.randomization else 0.0
        xy = t.tile_origins[0, 0, 0:2] + self.rng.uniform(-jitter, jitter, 2)
        return np.append(xy, t.ground_under(xy[None])[0])

    def set_state(self, qpos: np.ndarray, qvel: np.ndarray) -> None:
        """Put the world in a given state (a replay's start): ``qpos`` [nq] (free joint
        position, quaternion w,x,y,z, joints), ``qvel`` [nv] (world linear, body angular,
        joints); the actuators hold the joints where they are until the next step."""
        p = self.physics
        p.state[:] = 0.0
        p.qpos[0], p.qvel[0] = qpos, qvel
        p.hold(np.zeros(1, dtype=np.int64), np.array(qpos[p.qadr], dtype=np.float64)[None])
        self._refresh_sensors()
        self._restart_sensors(draw=False)

    def _restart_sensors(self, draw: bool) -> None:
        """The sensor model's rings restart at the current readings (``draw``: with new
        offsets, biases and delays, at a reset)."""
        sm, p = self.sensor_model, self.physics
        if sm is None:
            return
        one = np.zeros(1, dtype=np.int64)
        if draw:
            sm.draw(one, self.rng)
        quat, gyro, _ = p.imu()
        sm.restart(one, p.qpos[:, p.qadr], p.qvel[:, p.vadr], quat, gyro)

    def sample_interval(self) -> float:
        """Seconds between the last two sensor samples: the control period, +- the control
        jitter's physics steps when it is on."""
        sm = self.sensor_model
        if sm is None or not sm.jitter:
            return self.control_dt
        return float(sm.elapsed_substeps()[0]) * self.robot.sim_dt

    def _refresh_sensors(self) -> None:
        """Sensor readings of the current state (after a reset no physics step has run)."""
        p = self.physics
        m, d = p.models[0], self._data
        mujoco.mj_setState(m, d, p.state[0], STATE_SPEC)
        # The actuators hold the delay line's newest targets.
        d.ctrl[:] = p.ctrl_for(np.zeros(1, dtype=np.int64), p.delayed_targets[0, :1])[0]
        mujoco.mj_forward(m, d)
        self.physics.sensordata[0, -1] = d.sensordata

    def status(self) -> dict[str, object]:
        """The session's counters and episode draws, for the sim node's /diagnostics."""
        return {'sim_time_s': self.time, 'steps': self.steps,
                'command_timed_out': self.timed_out, 'cmd_vel': self.commands.round(3).tolist(),
                'falls': self.falls, 'resets': self.resets, 'pushes': self.pushes_done,
                'randomization': self.randomization, 'noise': self.noise,
                'terrain': f'{self.tile.label} seed {self.tile.seed}' if self.tile else 'flat',
                'left_map': self.left_map, **self.episode_params}

    # ---------------------------------------------------------------------------- readings
    def readings(self) -> SimReadings:
        """Measurements after the last step (IMU from the imu site sensors), noisy if enabled."""
        p = self.physics
        sd = p.sensordata[0, -1]
        s = p.sensors
        qpos, qvel = p.qpos[0], p.qvel[0]
        out = SimReadings(
            time=self.time, joint_pos=qpos[p.qadr].copy(), joint_vel=qvel[p.vadr].copy(),
            joint_effort=sd[slice(*s.joint_torque)].copy(),
            imu_quat=sd[slice(*s.framequat)].copy(), imu_gyro=sd[slice(*s.gyro)].copy(),
            imu_acc=sd[slice(*s.accelerometer)].copy(), base_pos=qpos[0:3].copy(),
            base_quat=qpos[3:7].copy(),
            base_lin_vel=self._to_body(qpos[3:7], qvel[0:3]),
            base_ang_vel=qvel[3:6].copy())
        if self.sensor_model is not None:
            # Offsets, biases and delays of the robot's own sensors.
            pos, vel, quat, gyro = self.sensor_model.measured(
                out.joint_pos[None], out.joint_vel[None], out.imu_quat[None], out.imu_gyro[None])
            out.joint_pos, out.joint_vel, out.imu_quat, out.imu_gyro = \
                pos[0].copy(), vel[0].copy(), quat[0].copy(), gyro[0].copy()
        if self.noise:
            self._add_noise(out)
        return out

    @staticmethod
    def _to_body(quat: np.ndarray, vec: np.ndarray) -> np.ndarray:
        # R(q)^T v: rotate a world vector by the conjugate quaternion (MuJoCo's C helpers).
        conj, out = np.empty(4), np.empty(3)
        mujoco.mju_negQuat(conj, quat)
        mujoco.mju_rotVecQuat(out, vec, conj)
        return out

    def _add_noise(self, out: SimReadings) -> None:
        # Uniform noise with the env's per-term levels (joint_pos, joint_vel, gyro, gravity):
        # one draw for the four terms, the same numbers as a draw per term in this order.
        levels, scale = self.cfg.noise.levels, self.cfg.noise.scale
        n = self.robot.num_joints
        u = self.rng.uniform(-1, 1, 2 * n + 6)
        out.joint_pos += u[:n] * levels.get('joint_pos', 0.0) * scale
        out.joint_vel += u[n:2 * n] * levels.get('joint_vel', 0.0) * scale
        out.imu_gyro += u[2 * n:2 * n + 3] * levels.get('base_ang_vel', 0.0) * scale
        # Orientation: a small random rotation (half-angle vector) of the gravity noise level.
        half = 0.5 * u[2 * n + 3:] * levels.get('projected_gravity', 0.0) * scale
        dq = np.array([1.0, *half]) / math.sqrt(1.0 + float(half @ half))
        quat = np.empty(4)
        mujoco.mju_mulQuat(quat, out.imu_quat, dq)
        out.imu_quat = quat

    def close(self) -> None:
        self.physics.close()
