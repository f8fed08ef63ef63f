"""The sim2sim gate's scoring: episodes measured through the ROS path -> a pass/fail table.

``claw-rl verify`` runs the exported student in the real sim_node + policy_node (one process,
or two) under the perturbations of ``config/verify.yaml`` (its ``env:`` section is the sim
node's env config) and hands the measurements of each episode to this module, which knows no
ROS. The thresholds (``verify:`` section, :class:`VerifyConfig`) and why they are where they
are:

* tracking error at ``command_vx`` (mean |command - body velocity| after ``settle_s``, episodes
  without a fall): vx <= 0.15 m/s (30 % of 0.5 m/s; the trained student is ~0.05 under the
  same perturbations in process), vy <= 0.15 m/s, yaw rate <= 0.3 rad/s (no drift into a turn);
* fall rate < 10 % (a fall is the sim's own failure test: tilt, trunk height, trunk contact);
* torque peaks: the 99th percentile over ticks of the worst joint's |effort| / effort limit
  <= 0.9, so 10 % headroom is left for motors weaker than simulated (the PD law saturates at
  the URDF effort limit, so the plain maximum says little);
* joint-limit margin: the closest any joint came to a URDF limit >= 0.05 rad (hard stops);
* latency p99 of the policy node (joint state in -> command out, its /diagnostics) <= 50 % of
  the control period, so the command lands well before the next state.

With terrain tiles (``claw-rl verify --terrain``) the gate runs the same graph again with the
sim node's world on each tile (:class:`TerrainRow`, one line per tile): fall rate below
``max_fall_rate`` and vx tracking error within ``max_vx_error``, the flat limits. ``claw-rl
verify`` makes each tile long enough for ``episode_s`` at ``command_vx`` (``tile_walk``); on a
shorter tile an episode would end before the robot reaches the map's edge
(:func:`terrain_episode_s`).

The verdict is written beside the model as ``<model stem>.verify.json``:
``{"model_sha256", "passed", "table", "created"}`` and, with terrain tiles, ``"terrain"`` (the
rows of :class:`TerrainRow`); ``passed`` covers both. The deploy path reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..config import param
from ..export.verification_record import verification_path
from ..io import atomic_write_bytes
from ..sim.robot_spec import RobotSpec
from ..sim.terrain import Terrain


@dataclass
class VerifyConfig:
    """The gate's protocol and pass thresholds (``verify:`` section of config/verify.yaml)."""

    command_vx: float = param(0.5, 'forward velocity command of every episode [m/s]')
    episodes: int = param(10, 'episodes, each with fresh perturbation draws', ge=1, le=10000)
    episode_s: float = param(10.0, 'simulated seconds per episode', gt=0)
    settle_s: float = param(1.0, 'tracking is measured from this time into an episode [s]',
                            ge=0)
    max_vx_error: float = param(0.15, 'mean |vx command - vx| [m/s]', ge=0)
    max_vy_error: float = param(0.15, 'mean |vy| [m/s]', ge=0)
    max_yaw_error: float = param(0.3, 'mean |yaw rate| [rad/s]', ge=0)
    max_fall_rate: float = param(0.1, 'falls / episodes must stay below this', ge=0, le=1)
    max_torque_p99: float = param(0.9, "p99 over ticks of the worst joint's |effort| / limit",
                                  gt=0)
    min_joint_margin: float = param(0.05, 'closest approach to a joint limit [rad]', ge=0)
    max_latency_fraction: float = param(0.5, 'policy latency p99 / control period', gt=0)


@dataclass
class Episode:
    """What one episode showed. ``velocity`` [T, 3] body (vx, vy, yaw rate) after settling;
    ``joint_pos`` and ``effort`` [T', J] in spec order over the whole episode."""

    fell: bool
    velocity: np.ndarray
    joint_pos: np.ndarray
    effort: np.ndarray
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    """One table line; ``limit`` None means informative only (never fails)."""

    check: str
    value: Optional[float]
    limit: Optional[float]
    op: str
    unit: str

    @property
    def passed(self) -> bool:
        if self.limit is None:
            return True
        if self.value is None or not math.isfinite(self.value):
            return False  # nothing measured (every episode fell) is not a pass
        return {'<=': self.value <= self.limit, '<': self.value < self.limit,
                '>=': self.value >= self.limit}[self.op]

    def to_dict(self) -> dict[str, Any]:
        value = self.value if self.value is not None and math.isfinite(self.value) else None
        return {'check': self.check, 'value': value, 'limit': self.limit, 'op': self.op,
                'unit': self.unit, 'passed': self.passed}


def _stack(parts: list[np.ndarray], width: int) -> np.ndarray:
    parts = [p for p in parts if len(p)]
    return np.concatenate(parts) if parts else np.zeros((0, width))


DRAWS = ('friction', 'mass_scale', 'motor_strength', 'latency_ms')  # said per episode


def episode_of(table, steps: int, settle_s: float, fell: bool,
               status: dict[str, str]) -> Episode:
    """The Episode of a sim's record (:class:`.episode_record.EpisodeTable`: the reset state
    and ``steps`` steps; ValueError for another length): body velocity after ``settle_s``,
    joints over every step but the reset pose, the draws the sim said in ``status``."""
    if len(table.t) != steps + 1:
        raise ValueError(f'the record holds {len(table.t)} states, not the reset state and '
                         f'{steps} steps')
    settled = table.t - table.t[0] >= settle_s - 1e-9
    return Episode(fell=fell, velocity=table.velocity[settled], joint_pos=table.joint_pos[1:],
                   effort=table.effort[1:], params={k: status[k] for k in DRAWS if k in status})


def episode_end(status: dict[str, str], steps0: int, steps1: int) -> dict[str, str] | None:
    """The sim's status once it has paused by itself after an episode that began at step
    ``steps0`` (None while it has not); ValueError if it paused at another step than
    ``steps1`` (its pause_after_s is not the episode's length)."""
    if status.get('paused') != 'True' or int(status['steps']) <= steps0:
        return None
    if int(status['steps']) != steps1:
        raise ValueError(f'paused at step {status["steps"]}, not at the episode end {steps1}: '
                         'is its pause_after_s the episode length?')
    return dict(status)


def latency_of(policy: dict[str, str], sim: dict[str, str]) -> dict[str, float]:
    """Policy latency p99/p50 and the sim's state -> command round trip p99 [ms] from their
    /diagnostics statuses (keyword arguments of :func:`score`)."""
    return {'latency_p99_ms': float(policy['latency_p99_ms']),
            'latency_p50_ms': float(policy['latency_p50_ms']),
            'round_trip_p99_ms': float(sim['command_latency_p99_ms'])}


def measured_latency(policy: dict[str, str]) -> bool:
    """Whether a policy status carries a measured latency (a finite p99: it has acted on a
    state since it started); not one said before its first tick, nor an unreadable one."""
    try:
        return math.isfinite(float(policy.get('latency_p99_ms', 'nan')))
    except (TypeError, ValueError):
        return False


def worst_latency(reports: list[dict[str, float]]) -> dict[str, float]:
    """The worst (largest) of each latency over graphs that ran side by side; a graph that
    measured none (NaN) does not hide another's number, and none at all stays NaN (a FAIL)."""
    keys = sorted({k for r in reports for k in r})
    worst = {}
    for k in keys:
        values = [float(r[k]) for r in reports if k in r and math.isfinite(float(r[k]))]
        worst[k] = max(values) if values else float('nan')
    return worst


def score(cfg: VerifyConfig, robot: RobotSpec, episodes: list[Episode],
          latency_p99_ms: float, round_trip_p99_ms: float = float('nan'),
          latency_p50_ms: float = float('nan')) -> list[Row]:
    """The table rows for ``episodes`` and the policy node's latency p99 [ms] (the p50 and
    the sim's state -> command round trip are informative rows)."""
    n = robot.num_joints
    upright = [e for e in episodes if not e.fell]
    vel = _stack([e.velocity for e in upright], 3)
    target = np.array([cfg.command_vx, 0.0, 0.0])
    # Mean |command - measured| per axis over every settled sample of the upright episodes.
    err = np.abs(vel - target).mean(axis=0) if len(vel) else np.full(3, np.nan)
    q = _stack([e.joint_pos for e in episodes], n)
    tau = _stack([e.effort for e in episodes], n)
    # Worst joint per tick as a fraction of its effort limit, then the 99th percentile.
    torque = float(np.percentile(np.abs(tau / robot.effort_limit).max(axis=1), 99)) \
        if len(tau) else float('nan')
    # Distance to the nearer joint limit, minimum over joints and ticks.
    margin = float(np.minimum(q - robot.joint_lower, robot.joint_upper - q).min()) \
        if len(q) else float('nan')
    falls = sum(e.fell for e in episodes)
    period_ms = robot.control_dt * 1e3
    return [
        Row(f'tracking error vx at {cfg.command_vx:g} m/s', float(err[0]), cfg.max_vx_error,
            '<=', 'm/s'),
        Row('tracking error vy', float(err[1]), cfg.max_vy_error, '<=', 'm/s'),
        Row('tracking error yaw rate', float(err[2]), cfg.max_yaw_error, '<=', 'rad/s'),
        Row(f'fall rate ({falls}/{len(episodes)})', falls / max(1, len(episodes)),
            cfg.max_fall_rate, '<', ''),
        Row('torque peak p99 (worst joint / effort limit)', torque, cfg.max_torque_p99, '<=',
            ''),
        Row('joint-limit margin (min)', margin, cfg.min_joint_margin, '>=', 'rad'),
        Row('policy latency p99 (/diagnostics)', latency_p99_ms,
            cfg.max_latency_fraction * period_ms, '<=', 'ms'),
        Row('policy latency p50 (/diagnostics)', latency_p50_ms, None, '', 'ms'),
        Row('state -> command round trip p99 (sim)', round_trip_p99_ms, None, '', 'ms'),
    ]


@dataclass
class TerrainRow:
    """One terrain tile's episodes through the ROS path: falls and the vx tracking error
    (mean |command - vx| after ``settle_s`` over the episodes without a fall; NaN: all fell)."""

    terrain: str
    seed: int
    episodes: int
    episode_s: float
    falls: int
    vx_error: float
    max_fall_rate: float
    max_vx_error: float

    @property
    def fall_rate(self) -> float:
        return self.falls / max(1, self.episodes)

    @property
    def passed(self) -> bool:
        return bool(self.fall_rate < self.max_fall_rate and math.isfinite(self.vx_error)
                    and self.vx_error <= self.max_vx_error)

    def to_dict(self) -> dict[str, Any]:
        vx = self.vx_error if math.isfinite(self.vx_error) else None
        return {'terrain': self.terrain, 'seed': self.seed, 'episodes': self.episodes,
                'episode_s': self.episode_s, 'falls': self.falls, 'fall_rate': self.fall_rate,
                'max_fall_rate': self.max_fall_rate, 'vx_error': vx,
                'max_vx_error': self.max_vx_error, 'passed': self.passed}


def terrain_episode_s(cfg: VerifyConfig, terrain: Terrain, robot: RobotSpec) -> float:
    """``episode_s``, or the time walking at ``command_vx`` along +x (the sim node's heading)
    from the tile's centre (+- the spawn jitter) takes to come within 1.5 standing heights of
    the map's edge, where the sim would put the robot back: whichever is shorter."""
    start = terrain.tile_origins[0, 0, 0] + terrain.spawn_jitter
    room = terrain.extent[1, 0] - 1.5 * robot.standing_height - start
    return float(min(cfg.episode_s, max(room, 0.0) / max(abs(cfg.command_vx), 1e-6)))


def score_terrain(cfg: VerifyConfig, terrain: str, seed: int, episodes: list[Episode],
                  episode_s: float) -> TerrainRow:
    """The row of one tile (``terrain`` its TYPE:LEVEL label, ``seed`` its heights' seed)."""
    vel = _stack([e.velocity for e in episodes if not e.fell], 3)
    vx = float(np.abs(vel[:, 0] - cfg.command_vx).mean()) if len(vel) else float('nan')
    return TerrainRow(terrain, seed, len(episodes), episode_s, sum(e.fell for e in episodes),
                      vx, cfg.max_fall_rate, cfg.max_vx_error)


def passed(rows: list[Row], terrain: list[TerrainRow] = ()) -> bool:
    return all(r.passed for r in rows) and all(t.passed for t in terrain)


def format_terrain(rows: list[TerrainRow]) -> list[str]:
    """One aligned line per terrain tile: episodes, falls, vx error, PASS/FAIL."""
    width = max(len('terrain'), *(len(r.terrain) for r in rows))
    lines = [f'{"terrain":<{width}}  {"seed":>5}  {"episodes":>10}  {"falls":>5}  '
             f'{"fall rate":>12}  {"vx error":>16}  result']
    for r in rows:
        vx = 'n/a' if not math.isfinite(r.vx_error) else f'{r.vx_error:.3f}'
        episodes = f'{r.episodes} x {r.episode_s:.1f}s'
        lines.append(f'{r.terrain:<{width}}  {r.seed:>5}  {episodes:>10}  {r.falls:>5}  '
                     f'{r.fall_rate:>5.2f} < {r.max_fall_rate:<4.2f}  {vx:>7} <= '
                     f'{r.max_vx_error:<5.3f}  {"PASS" if r.passed else "FAIL"}')
    return lines


def format_table(rows: list[Row], terrain: list[TerrainRow] = ()) -> str:
    """Aligned text: check, measured value, limit, PASS/FAIL (or info); then a line per
    terrain tile, if any; then the verdict."""
    def num(v: Optional[float]) -> str:
        return 'n/a' if v is None or not math.isfinite(v) else f'{v:.3f}'
    width = max(len(r.check) for r in rows)
    lines = [f'{"check":<{width}}  {"value":>9}  {"limit":>11}  result']
    for r in rows:
        limit = '' if r.limit is None else f'{r.op} {num(r.limit)}'
        verdict = 'info' if r.limit is None else ('PASS' if r.passed else 'FAIL')
        lines.append(f'{r.check:<{width}}  {num(r.value):>9}  {limit:>11}  {verdict}'
                     f'{"  [" + r.unit + "]" if r.unit else ""}')
    if terrain:
        lines += ['', *format_terrain(list(terrain))]
    lines.append(f'verdict: {"PASS" if passed(rows, terrain) else "FAIL"}')
    return '\n'.join(lines)


def result_path(model: str | Path) -> Path:
    """The verification record beside the model (``student.onnx`` -> ``student.verify.json``),
    where the deploy path and the policy card read it."""
    return verification_path(model)


def write_result(model: str | Path, rows: list[Row], terrain: list[TerrainRow] = ()) -> Path:
    """Write the verdict for the model's current bytes atomically; returns its path."""
    data = {'model_sha256': hashlib.sha256(Path(model).read_bytes()).hexdigest(),
            'passed': passed(rows, terrain), 'table': [r.to_dict() for r in rows],
            'created': datetime.now(timezone.utc).isoformat(timespec='seconds')}
    if terrain:
        data['terrain'] = [t.to_dict() for t in terrain]
    path = result_path(model)
    atomic_write_bytes(path, (json.dumps(data, indent=2, allow_nan=False) + '\n').encode())
    return path
