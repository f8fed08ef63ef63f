"""The reality-gap gate: ``claw-rl verify --suite transfer``, a table of perturbation cells.

The sim2sim gate (:mod:`.gate_scoring`) checks the student under the mild mix of draws a real
robot may show; this suite asks how far each kind of model error may go before it stops
walking. Each :class:`Cell` is one family at one level (:data:`CELLS`): env.randomization
overrides (a value may be a function of the RobotSpec: a delay in ms, a payload in robot masses),
other ``env:`` keys (the contact solver) and/or RobotSpec fields (``dataclasses.replace``: the
physics step). Every other range is pinned at its nominal point (:func:`nominal_randomization`),
pushes are off, sensor noise and the reset-pose noise are ``config/verify.yaml``'s.

It runs in process (no DDS; the ROS path is the normal gate's): per episode a fresh
:class:`~..sim.sim_session.SimSession` of the cell's env and robot (the sim node's world) and a
fresh :class:`~..control.policy_controller.PolicyController` (the policy node's own code, fed as
the node feeds it: cmd_vel, IMU, then the joint state, stamped in sim time), the verify
config's command for ``episode_s``; an episode ends at a fall. Episode i of every cell draws
from (seed, i), so a result does not depend on which episode or cell ran before. Episodes are
recorded as the sim node records them and scored by :func:`.gate_scoring.score` with the gate's
limits; the policy latency rows are the ROS gate's and left out (the controller's inference
deadline is lifted so machine load cannot change an episode). A cell passes when every other
row does; a cell that cannot be built (a config key this version lacks) fails, with its error.

A robot with a robot overlay merged (``claw-rl verify --suite transfer --robot-overlay``,
:mod:`..sim.robot_overlay`) is what every cell perturbs, in MuJoCo and in the second engine:
its gains, joint friction, damping and rotor inertia, and its nominal command delay the
overlay's fitted one (the delay cells stay absolute).

Engines other than MuJoCo add cells through :data:`EXTRA_CELLS` (:class:`ExtraCell`: a function
giving the cell's episodes, scored the same way): PyBullet (:mod:`.second_engine`) with explicit
PD at a 1 kHz drive and at the MuJoCo physics rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..config import from_dict
from ..control.policy_controller import PolicyController
from ..control.safety import SafetyConfig
from ..export.policy_card import transfer_path
from ..io import atomic_write_bytes
from ..sim.env_config import EnvConfig
from ..sim.robot_overlay import load_overlay
from ..sim.robot_spec import ActuatorSpec, RobotSpec
from ..sim.sim_session import SimSession
from .episode_record import episode_steps, EpisodeRecorder, read_episode, ROW_DIM
from .gate_scoring import Episode, episode_of, Row, score, score_terrain, VerifyConfig
from .second_engine import run_episodes

Value = Any  # a config value, or a function of the RobotSpec giving one


@dataclass(frozen=True)
class Cell:
    """One family at one level: ``randomization`` (env.randomization keys), ``env`` (other
    env keys) and ``robot`` (RobotSpec fields) overrides."""

    family: str
    level: str
    randomization: Mapping[str, Value] = field(default_factory=dict)
    env: Mapping[str, Value] = field(default_factory=dict)
    robot: Mapping[str, Value] = field(default_factory=dict)


def _delay(ms: float) -> Callable[[RobotSpec], list[int]]:
    """action_latency_substeps of ``ms`` [ms] at the robot's physics step."""
    return lambda robot: [round(ms * 1e-3 / robot.sim_dt)] * 2


def _dc_motor(robot: RobotSpec) -> ActuatorSpec:
    """The robot's actuator as a DC motor (the line from its URDF limits unless it gives one)."""
    return replace(robot.actuator, model='dc_motor', network_path=None)


def _payload(fraction: float) -> Callable[[RobotSpec], list[float]]:
    """added_mass of ``fraction`` x the robot's total mass [kg]."""
    return lambda robot: [fraction * robot.total_mass] * 2


CELLS: tuple[Cell, ...] = (
    Cell('nominal', '-'),
    Cell('motor strength', '-30 %', {'motor_strength': [0.7, 0.7]}),
    Cell('Kp', '-30 %', {'kp_scale': [0.7, 0.7]}),
    Cell('Kd', '+50 %', {'kd_scale': [1.5, 1.5]}),
    Cell('joint friction', 'x5', {'joint_friction_scale': [5.0, 5.0]}),
    Cell('armature', 'x0.3', {'armature_scale': [0.3, 0.3]}),
    Cell('armature', 'x3', {'armature_scale': [3.0, 3.0]}),
    *(Cell('delay', f'{ms} ms', {'action_latency_substeps': _delay(ms)})
      for ms in (0, 10, 20, 30, 40)),  # may exceed a control period (a delay line)
    Cell('control jitter', '+-20 %', {'control_jitter_substeps': 1}),
    Cell('IMU bias', 'gyro 0.05 rad/s', {'imu_gyro_bias': [0.05, 0.05]}),
    Cell('IMU bias', 'tilt 0.03 rad', {'imu_tilt_offset': [0.03, 0.03]}),
    Cell('encoder offset', '+-0.03 rad', {'encoder_offset': [-0.03, 0.03]}),
    Cell('contact', 'soft 0.05 s', {'contact_timeconst': [0.05, 0.05]}),  # MuJoCo solref
    Cell('contact', 'stiff 0.01 s', {'contact_timeconst': [0.01, 0.01]}),
    Cell('contact', 'torsional 0.01 m', {'torsional_friction': [0.01, 0.01]}),
    Cell('ground friction', '0.3', {'friction': [0.3, 0.3]}),
    Cell('ground friction', '1.5', {'friction': [1.5, 1.5]}),
    Cell('payload', '+30 %', {'added_mass': _payload(0.3)}),
    Cell('physics step', '1 ms', robot={'sim_dt': 0.001, 'decimation': 20}),  # 50 Hz policy
    Cell('actuator', 'dc_motor', robot={'actuator': _dc_motor}),  # the URDF's torque-speed line
    Cell('solver', 'elliptic cone', env={'cone': 'elliptic'}),
    Cell('solver', 'cg', env={'solver': 'cg'}),
)


@dataclass(frozen=True)
class ExtraCell:
    """A cell another engine measures: ``run(model, robot, cfg, seed)`` gives its
    ``cfg.episodes`` episodes (episode i from (seed, i)) as the gate's Episodes."""

    family: str
    level: str
    run: Callable[[str, RobotSpec, VerifyConfig, int], list[Episode]]


def _second_engine(rate: str) -> Callable[[str, RobotSpec, VerifyConfig, int], list[Episode]]:
    """The student in PyBullet (:mod:`.second_engine`): explicit PD at 1 kHz, a drive's rate
    (``rate`` 'drive'), or at the MuJoCo physics rate (``rate`` 'physics')."""
    def run(model: str, robot: RobotSpec, cfg: VerifyConfig, seed: int) -> list[Episode]:
        hz = 1000.0 if rate == 'drive' else 1.0 / robot.sim_dt
        return run_episodes(model, robot, episodes=cfg.episodes,
                            command=(cfg.command_vx, 0.0, 0.0), duration_s=cfg.episode_s,
                            drive_rate_hz=hz, seed=seed, settle_s=cfg.settle_s)
    return run


# A second, independent engine: the URDF in PyBullet with the robot's gains, torque limits
# and rotor inertia, through the policy node's own observation and action code.
EXTRA_CELLS: list[ExtraCell] = [
    ExtraCell('second engine', 'PyBullet 1 kHz PD', _second_engine('drive')),
    ExtraCell('second engine', 'PyBullet PD at physics rate', _second_engine('physics')),
]

# Rows of gate_scoring.score the in-process run does not measure (the ROS gate's).
NOT_MEASURED = ('latency', 'round trip')
# The controller's inference deadline here [s]: wall-clock overruns are the ROS gate's row.
NO_DEADLINE_S = 3600.0


def nominal_delay_steps(robot: RobotSpec) -> int:
    """The robot's nominal command -> motor delay [physics steps]: its robot overlay's fitted
    delay, 0 without one."""
    path = robot.source.get('overlay')
    return round(load_overlay(path).action_delay_s / robot.sim_dt) if path else 0


def nominal_randomization(robot: RobotSpec) -> dict[str, Any]:
    """env.randomization with every range at its nominal point and no pushes (randomisation on,
    so a cell's pinned range is applied as drawn)."""
    one = [1.0, 1.0]
    return {'enabled': True, 'friction': [robot.foot_friction] * 2, 'added_mass': [0.0, 0.0],
            'link_mass_scale': one, 'com_offset': [0.0, 0.0], 'motor_strength': one,
            'kp_scale': one, 'kd_scale': one, 'joint_friction_scale': one,
            'joint_damping_scale': one, 'armature_scale': one,
            'action_latency_substeps': [nominal_delay_steps(robot)] * 2, 'push_interval_s': 0.0}


def _resolve(values: Mapping[str, Value], robot: RobotSpec) -> dict[str, Any]:
    return {k: v(robot) if callable(v) else v for k, v in values.items()}


def cell_env(cell: Cell, robot: RobotSpec, env_section: Mapping[str, Any]) -> EnvConfig:
    """The cell's EnvConfig: ``env_section`` (the verify YAML's ``env:``) with its
    randomisation replaced by the nominal one, its reset-pose noise kept, and the cell's
    overrides; ConfigError for a key this version lacks."""
    base = dict(env_section.get('randomization') or {})
    # (the nominal delay in the physics steps of the cell's robot)
    randomization = {**nominal_randomization(cell_robot(cell, robot)),
                     **{k: base[k] for k in ('init_joint_pos_noise',) if k in base},
                     **_resolve(cell.randomization, robot)}
    section = {**env_section, 'num_envs': 1, **_resolve(cell.env, robot),
               'randomization': randomization}
    return from_dict(EnvConfig, section, source=f'transfer cell {label(cell)}', prefix='env')


def cell_robot(cell: Cell, robot: RobotSpec) -> RobotSpec:
    """The robot the cell's physics steps (the policy keeps ``robot``); its control period
    must stay the robot's."""
    variant = replace(robot, **_resolve(cell.robot, robot)) if cell.robot else robot
    if not math.isclose(variant.control_dt, robot.control_dt, rel_tol=1e-9):
        raise ValueError(f'{label(cell)}: control period {variant.control_dt:g} s, not the '
                         f"policy's {robot.control_dt:g} s")
    return variant


def label(cell: Cell | ExtraCell) -> str:
    return f'{cell.family} {cell.level}'


def cell_session(cell: Cell, robot: RobotSpec, env: EnvConfig, seed: int = 0,
                 index: int = 0) -> SimSession:
    """A fresh world of the cell reset with the draws of episode ``index``."""
    session = SimSession(cell_robot(cell, robot), env, randomization=True,
                         noise=env.noise.enabled, seed=seed, command_timeout_s=0.2)
    session.rng = np.random.default_rng([seed, index])
    session.reset()
    return session


def run_episode(model: str, robot: RobotSpec, session: SimSession, cfg: VerifyConfig
                ) -> Episode:
    """One episode of ``session`` driven by a fresh controller serving ``model``, recorded as
    the sim node records it; it ends at a fall."""
    ctrl = PolicyController(robot, clock='sim',
                            safety=SafetyConfig(inference_deadline_s=NO_DEADLINE_S))
    ctrl.load_path(model)
    steps = episode_steps(cfg.episode_s, robot.control_dt)
    recorder = EpisodeRecorder(robot.joint_names, 0, steps)
    r = session.readings()
    recorder.add(r.time, r.base_lin_vel, r.base_ang_vel, r.joint_pos, r.joint_effort)
    done, fell = 0, False
    while done < steps and not fell:
        t = r.time  # stamped and received in sim time, as the lockstep graph does
        ctrl.on_command(cfg.command_vx, 0.0, 0.0)
        w, x, y, z = r.imu_quat
        ctrl.on_imu(t, (x, y, z, w), r.imu_gyro, t)
        targets = ctrl.on_joint_state(t, robot.joint_names, r.joint_pos, r.joint_vel, t)
        if targets is not None:  # (spec order: the controller's default output order)
            session.set_targets(targets, t)
        fell = session.step(session.active_targets(t))
        done += 1
        r = session.readings()
        recorder.add(r.time, r.base_lin_vel, r.base_ang_vel, r.joint_pos, r.joint_effort)
    rows = recorder.table()
    table = read_episode((ROW_DIM, ','.join(recorder.columns)), rows.shape, rows.ravel(),
                         robot.joint_names)
    status = {k: str(v) for k, v in session.episode_params.items()}
    return episode_of(table, done, cfg.settle_s, fell, status)


@dataclass
class CellResult:
    """A cell's episodes, its gate rows (those measured here) and verdict; ``error``: why the
    cell could not run (it fails)."""

    family: str
    level: str
    episodes: list[Episode]
    rows: list[Row]
    vx_error: float
    falls: int
    error: str = ''
    perturbation: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.rows) and all(r.passed for r in self.rows)

    @property
    def failed(self) -> list[str]:
        return [self.error] if self.error else [r.check for r in self.rows if not r.passed]

    def to_dict(self) -> dict[str, Any]:
        vx = self.vx_error if math.isfinite(self.vx_error) else None
        out = {'family': self.family, 'level': self.level, 'vx_error': vx,
               'falls': self.falls, 'episodes': len(self.episodes), 'passed': self.passed,
               'failed': self.failed, 'perturbation': self.perturbation,
               'table': [r.to_dict() for r in self.rows]}
        return {**out, 'error': self.error} if self.error else out


def score_cell(family: str, level: str, cfg: VerifyConfig, robot: RobotSpec,
               episodes: list[Episode], perturbation: dict | None = None) -> CellResult:
    """The gate's rows of ``episodes`` but the latency ones, vx error and falls."""
    rows = [r for r in score(cfg, robot, episodes, latency_p99_ms=math.nan)
            if r.limit is not None and not any(k in r.check for k in NOT_MEASURED)]
    vx = score_terrain(cfg, family, 0, episodes, cfg.episode_s)
    return CellResult(family, level, episodes, rows, vx.vx_error, vx.falls,
                      perturbation=perturbation or {})


def perturbation_of(cell: Cell, robot: RobotSpec) -> dict[str, Any]:
    """The cell's overrides as dotted keys (``randomization.kp_scale``: [0.7, 0.7]), JSON-able
    (an actuator as a model's metadata records it)."""
    def plain(v: Any) -> Any:
        return v.to_metadata(robot.armature) if isinstance(v, ActuatorSpec) else v
    return {f'{part}.{k}': plain(v) for part in ('randomization', 'env', 'robot')
            for k, v in _resolve(getattr(cell, part), robot).items()}


def run_cell(cell: Cell, model: str, robot: RobotSpec, cfg: VerifyConfig,
             env_section: Mapping[str, Any], seed: int = 0) -> CellResult:
    """``cfg.episodes`` episodes of one cell (episode i from (seed, i)); a cell that cannot
    be built or stepped fails with the reason."""
    perturbation, episodes = perturbation_of(cell, robot), []
    try:
        env = cell_env(cell, robot, env_section)
        for i in range(cfg.episodes):
            session = cell_session(cell, robot, env, seed, i)
            try:
                episodes.append(run_episode(model, robot, session, cfg))
            finally:
                session.close()
    except ValueError as exc:  # (ConfigError too: a key this version lacks)
        return CellResult(cell.family, cell.level, [], [], math.nan, 0, str(exc), perturbation)
    return score_cell(cell.family, cell.level, cfg, robot, episodes, perturbation)


def run_suite(model: str, robot: RobotSpec, cfg: VerifyConfig, env_section: Mapping[str, Any],
              seed: int = 0, cells: Sequence[Cell] | None = None,
              extra: Sequence[ExtraCell] | None = None,
              on_cell: Callable[[CellResult], None] | None = None) -> list[CellResult]:
    """Every cell of ``cells``, then of ``extra`` (defaults :data:`CELLS`,
    :data:`EXTRA_CELLS`), in order; ``on_cell`` is told each result as it comes."""
    results = []
    extra = EXTRA_CELLS if extra is None else extra
    for cell in [*(CELLS if cells is None else cells), *extra]:
        if isinstance(cell, ExtraCell):
            try:
                result = score_cell(cell.family, cell.level, cfg, robot,
                                    cell.run(model, robot, cfg, seed))
            except Exception as exc:  # noqa: BLE001 - another engine failing fails its cell
                result = CellResult(cell.family, cell.level, [], [], math.nan, 0,
                                    f'{type(exc).__name__}: {exc}')
        else:
            result = run_cell(cell, model, robot, cfg, env_section, seed)
        results.append(result)
        if on_cell is not None:
            on_cell(result)
    return results


def passed(results: Sequence[CellResult]) -> bool:
    return bool(results) and all(r.passed for r in results)


class TableFormat:
    """Aligned lines of the suite's table, one cell at a time (for printing as they finish)."""

    def __init__(self, cfg: VerifyConfig, cells: Sequence[Cell | ExtraCell]):
        self.cfg = cfg
        self.family = max([len('family'), *(len(c.family) for c in cells)])
        self.level = max([len('level'), *(len(c.level) for c in cells)])

    def header(self) -> str:
        return (f'{"family":<{self.family}}  {"level":<{self.level}}  '
                f'{"vx error":>8} <= {"limit":<5}  {"falls":>7}  result')

    def row(self, r: CellResult) -> str:
        vx = 'n/a' if not math.isfinite(r.vx_error) else f'{r.vx_error:.3f}'
        why = '' if r.passed else '  (' + '; '.join(r.failed) + ')'
        return (f'{r.family:<{self.family}}  {r.level:<{self.level}}  {vx:>8} <= '
                f'{self.cfg.max_vx_error:<5.3f}  {f"{r.falls}/{len(r.episodes)}":>7}  '
                f'{"PASS" if r.passed else "FAIL"}{why}')

    def verdict(self, results: Sequence[CellResult]) -> str:
        failed = sum(not r.passed for r in results)
        return f'verdict: {"PASS" if passed(results) else "FAIL"} ' \
            f'({len(results) - failed} of {len(results)} cells pass)'


def _json(data: Any) -> bytes:
    return (json.dumps(data, indent=2, allow_nan=False) + '\n').encode()


def write_json(path: str | Path, results: Sequence[CellResult]) -> Path:
    """The cells as a JSON list (``family``, ``level``, ``vx_error``, ``falls``,
    ``episodes``, ``passed`` and more), atomically."""
    atomic_write_bytes(Path(path), _json([r.to_dict() for r in results]))
    return Path(path)


def write_record(model: str | Path, cfg: VerifyConfig, seed: int,
                 results: Sequence[CellResult], overlay: str = '') -> Path:
    """``<model stem>.transfer.json`` beside the model (the policy card's summary):
    ``{"model_sha256", "passed", "episodes", "episode_s", "command_vx", "seed",
    "robot_overlay" (the overlay's path, '' none), "cells", "created"}``."""
    data = {'model_sha256': hashlib.sha256(Path(model).read_bytes()).hexdigest(),
            'passed': passed(results), 'episodes': cfg.episodes, 'episode_s': cfg.episode_s,
            'command_vx': cfg.command_vx, 'seed': seed, 'robot_overlay': str(overlay),
            'cells': [{k: v for k, v in r.to_dict().items() if k != 'table'} for r in results],
            'created': datetime.now(timezone.utc).isoformat(timespec='seconds')}
    path = transfer_path(model)
    atomic_write_bytes(path, _json(data))
    return path
