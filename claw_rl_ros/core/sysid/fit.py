"""System identification: the drive's Kp and Kd, the joints' Coulomb friction (MuJoCo
frictionloss), viscous damping and rotor inertia (armature) per joint group (or per joint), and
the command -> motion delay, fitted by replaying a recording's commands in MuJoCo
(:class:`~.sim_replay.Replayer`: N worlds with their own parameters side by side).

The replay restarts from the recording every ``resync_s`` (two control periods by default):
each short window starts from a recorded sample (on a stand, or on the ground with the trunk's
odometry, every window at once; else one after the other, the trunk as simulated). Short
horizons keep the fit near convex, and stick-slip friction cannot make the replay drift off.

Stages, each a standard solver:

1. With efforts recorded, the drive's law ``effort = Kp (target - q) - Kd qd`` is linear in
   Kp and Kd: per group, least squares (``numpy.linalg.lstsq``) on the unsaturated samples for
   each delay of whole control periods, the best kept. The torque sensors read the state one
   physics step before the sample (MuJoCo evaluates sensors at the start of a step): q and qd
   there come from the cubic Hermite through the samples.
2. The delay in physics steps. A delay and the rotor inertia trade (both lag the motion), so
   each candidate (with efforts: the steps of the period stage 1 found, the three most
   promising by their cost at the start; without: every one) gets its own least-squares fit of
   one multiplier per parameter shared by every group, on every second window; the least
   cost wins.
3. ``scipy.optimize.least_squares`` (trust region, bounds) per group at that delay, on the
   logarithms of the parameters; the residuals are the replay's positions, velocities and
   (when recorded) efforts against the recording, each joint's channel divided by its recorded
   spread over the excitation (the efforts weighted 3: they measure the drive's law itself).
   The Jacobian is forward differences, every column a world of one replay.
4. Uncertainty: the covariance ``s^2 (J^T J)^-1`` at the optimum, inflated for the residuals'
   correlation in time (the AR(1) factor (1 + r) / (1 - r) of their lag-one correlation r); in
   log parameters, so its square root is a relative error.

Without efforts the drive's Kd and the joint's viscous damping act alike (both a torque
-c qd, until the drive saturates): the fit says so, identifies their sum, and splits it by a
stated rule: the damping keeps its prior (the robot YAML's joint_damping, else the URDF's) and
Kd is the rest. The fit is written as a robot overlay (:mod:`~..sim.robot_overlay`).

The efforts are compared as the sim node publishes them (the torque sensor of a period's last
physics step, which reads the state one physics step before the sample); a driver that reports
the torque at the sample itself would bias Kd by about Kp sim_dt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import time
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from ..config import ConfigError, load_yaml, param
from ..sim.robot_overlay import GroupParams, RobotOverlay
from ..sim.robot_spec import RobotSpec
from .sim_replay import PARAMS, Replayer
from .trace import check_trace, Trace, TraceLimits

# Each parameter's bounds (absolute) and floor for its starting value, in its unit.
BOUNDS = {'kp': (0.1, 1e4), 'kd': (1e-3, 1e3), 'frictionloss': (1e-4, 1e3),
          'damping': (1e-4, 1e3), 'armature': (1e-6, 10.0)}
UNITS = {'kp': 'N m/rad', 'kd': 'N m s/rad', 'frictionloss': 'N m', 'damping': 'N m s/rad',
         'armature': 'kg m^2'}
# Floors of each channel's scale (its recorded spread): position, velocity, effort; and the
# channels' weights: the efforts measure the drive's law itself, and pin Kp and Kd where the
# motion alone lets Kd trade with the joint's damping.
SCALE_FLOOR = {'q': 1e-3, 'qd': 1e-2, 'effort': 1e-2}
CHANNEL_WEIGHT = {'q': 1.0, 'qd': 1.0, 'effort': 3.0}
# Stage 2: how many candidate delays are fitted (with efforts), and which windows it replays
# where a sample is the whole state (every second).
COARSE_DELAYS = 3
COARSE_EVERY = 2
# Forward-difference step of the Jacobian, in log parameters (0.1 %).
FD_STEP = 1e-3


@dataclass
class SysidConfig:
    """What ``claw-rl sysid`` fits and how hard it tries."""

    per_joint: bool = param(False, 'fit every joint on its own (default: per joint group, the '
                                   "robot YAML's stiffness keys)")
    max_delay_s: float = param(0.04, 'longest command -> motion delay tried [s]', ge=0, le=0.5)
    settle_s: float = param(1.0, 'on the ground: seconds the replay settles on its feet '
                                 'before the recording', ge=0, le=10)
    max_evaluations: int = param(30, 'most residual evaluations of the least-squares fit per '
                                     'group', ge=2, le=10000)
    coarse_evaluations: int = param(10, 'most residual evaluations of the fit of each '
                                        'candidate delay', ge=2, le=10000)
    resync_s: float = param(0.04, 'the replay starts again from the recording this often [s] '
                                  '(0: never): short horizons keep the fit near convex and '
                                  'stick-slip friction from drifting', ge=0, le=3600)
    num_threads: int = param(0, 'physics threads (0: one per core)', ge=0, le=256)
    limits: TraceLimits = param(TraceLimits(), 'what a recording needs (refused otherwise)')


def joint_groups(robot: RobotSpec, per_joint: bool) -> dict[str, np.ndarray]:
    """{group: joint indices}: the robot YAML's stiffness keys (an exact joint name wins, else
    the one key that is part of it), or one group per joint."""
    names = robot.joint_names
    if per_joint:
        return {n: np.array([i]) for i, n in enumerate(names)}
    raw = load_yaml(robot.source['config']) if robot.source.get('config') else {}
    keys = list((raw.get('robot', raw) or {}).get('stiffness', {})) or list(names)
    out: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        key = name if name in keys else next(k for k in keys if k in name)
        out.setdefault(key, []).append(i)
    return {k: np.array(v) for k, v in out.items()}


@dataclass
class FitResult:
    """A finished fit: per group its parameters and relative uncertainties, the delay, the
    tracking error before (the robot as configured) and after, and what was said."""

    robot: str
    variant: str
    groups: dict[str, np.ndarray]
    values: dict[str, dict[str, float]]
    sigma: dict[str, dict[str, float]]
    delay_steps: int
    sim_dt: float
    delay_costs: dict[int, float]
    rms_before: np.ndarray
    rms_after: np.ndarray
    effort_rms_before: np.ndarray | None
    effort_rms_after: np.ndarray | None
    joints: list[str]
    with_effort: bool
    fitted: list[str] = field(default_factory=lambda: list(PARAMS))
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    evaluations: int = 0

    @property
    def delay_s(self) -> float:
        return self.delay_steps * self.sim_dt

    def format(self) -> str:
        """The report: per joint the RMS tracking error (open loop) before and after, per
        group every parameter +- its uncertainty, the delay, the notes."""
        wj = max(len(n) for n in self.joints) + 2
        wg = max(len(g) for g in self.groups) + 2
        lines = [f'system identification of {self.robot} ({self.variant}), '
                 f'{self.evaluations} replays in {self.seconds:.1f} s',
                 f'{"joint":<{wj}}{"group":<{wg}}{"q RMS before":>14}{"after":>10} [rad]' +
                 (f'{"effort RMS before":>19}{"after":>8} [N m]' if self.with_effort else '')]
        group_of = {int(i): g for g, idx in self.groups.items() for i in idx}
        for j, name in enumerate(self.joints):
            line = (f'{name:<{wj}}{group_of[j]:<{wg}}{self.rms_before[j]:>14.4f}'
                    f'{self.rms_after[j]:>10.4f}')
            if self.with_effort:
                line += f'{self.effort_rms_before[j]:>19.3f}{self.effort_rms_after[j]:>8.3f}'
            lines.append(line)
        lines.append(f'{"group":<{wg}}' + ''.join(f'{f:>22}' for f in PARAMS))
        for g, values in self.values.items():
            cells = [f'{values[f]:.4g} +- {100 * self.sigma[g][f]:.1f} %' if f in self.fitted
                     else f'{values[f]:.4g} (prior)' for f in PARAMS]
            lines.append(f'{g:<{wg}}' + ''.join(f'{c:>22}' for c in cells))
        lines.append('units: ' + ', '.join(f'{f} [{UNITS[f]}]' for f in PARAMS))
        costs = ', '.join(f'{k}: {v:.4g}' for k, v in sorted(self.delay_costs.items()))
        lines.append(f'command -> motion delay: {self.delay_steps} physics steps = '
                     f'{1e3 * self.delay_s:.1f} ms (replay cost at {costs})')
        lines += self.notes
        return '\n'.join(lines)

    def report(self) -> dict[str, Any]:
        """The fit as plain data (the overlay's ``fit`` key)."""
        return {'robot': self.robot, 'variant': self.variant, 'with_effort': self.with_effort,
                'delay_steps': int(self.delay_steps), 'fitted': list(self.fitted),
                'groups': {g: [self.joints[i] for i in idx] for g, idx in self.groups.items()},
                'relative_sigma': {g: {f: round(float(s), 6) for f, s in v.items()}
                                   for g, v in self.sigma.items()},
                'rms_before': {n: round(float(v), 6) for n, v in zip(self.joints,
                                                                     self.rms_before)},
                'rms_after': {n: round(float(v), 6) for n, v in zip(self.joints,
                                                                    self.rms_after)},
                'notes': list(self.notes)}

    def overlay(self) -> RobotOverlay:
        """The robot overlay of this fit (the report under ``fit``)."""
        groups = {g: GroupParams(**{f: float(v[f]) for f in PARAMS})
                  for g, v in self.values.items()}
        return RobotOverlay(groups, float(self.delay_s), {'fit': self.report()})


class _Problem:
    """The replay's residuals of one trace as a function of a point: the logarithms of the
    fitted parameters, each a multiplier of ``base`` on some joints (:meth:`configure`), and
    the delay in physics steps as the last entry when it is free."""

    def __init__(self, robot: RobotSpec, trace: Trace, cfg: SysidConfig, max_worlds: int):
        self.robot, self.trace = robot, trace
        self.replayer = Replayer(robot, trace, max_worlds, stand=trace.variant == 'stand',
                                 settle_s=cfg.settle_s, num_threads=cfg.num_threads)
        # [J] values of the parameters not fitted: the robot as configured.
        self.fixed = nominal_params(self.replayer, robot)
        i0, i1 = trace.window
        self.window = np.arange(max(i0, 1), i1)  # (sample 0 has no effort)
        self.with_effort = trace.effort is not None
        # Each joint's channels divided by their recorded spread (and weighted).
        self.scale = {c: np.maximum(np.std(getattr(trace, c)[self.window], axis=0),
                                    SCALE_FLOOR[c]) / CHANNEL_WEIGHT[c]
                      for c in ('q', 'qd', 'effort') if getattr(trace, c) is not None}
        self.resync = int(round(cfg.resync_s / robot.control_dt))
        self.max_delay = int(round(cfg.max_delay_s / robot.sim_dt))
        self.evaluations = 0.0
        self._cache: tuple[bytes, np.ndarray] | None = None
        self.configure([], {}, 1)

    def configure(self, layout: list[tuple[np.ndarray, str]], base: dict[str, np.ndarray],
                  every: int) -> None:
        """Fit ``layout``: entry p sets field f on joints idx to ``base[f][idx] exp(x[p])``;
        the rest stay at ``fixed``. On a stand only every ``every``-th window is replayed."""
        self.layout, self.base = layout, base
        self.every = every if self.replayer.known_state and self.resync else 1
        k = self.window
        self.rows = k[((k - 1) // max(self.resync, 1)) % self.every == 0]
        self._cache = None

    def params(self, xs: np.ndarray) -> dict[str, np.ndarray]:
        """[N, P] points (without a delay) -> {field: [N, J]} values."""
        out = {f: np.tile(self.fixed[f], (len(xs), 1)) for f in PARAMS}
        for p, (idx, f) in enumerate(self.layout):
            out[f][:, idx] = self.base[f][idx] * np.exp(xs[:, p])[:, None]
        return out

    def simulate(self, xs: np.ndarray, delays: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q, qd, effort [N, T, J] of N parameter sets [N, P] and delays [N]."""
        self.evaluations += len(xs) / self.every
        return self.replayer.run(self.params(xs), delays, self.resync, self.every)

    def residuals(self, xs: np.ndarray, delays: np.ndarray) -> np.ndarray:
        """[N, M] scaled residuals of N parameter sets and delays, time-major ([R, C, J])."""
        q, qd, effort = self.simulate(xs, delays)
        tr, rows = self.trace, self.rows
        parts = [(q[:, rows] - tr.q[rows]) / self.scale['q'],
                 (qd[:, rows] - tr.qd[rows]) / self.scale['qd']]
        if self.with_effort:
            parts.append((effort[:, rows] - tr.effort[rows]) / self.scale['effort'])
        out = np.concatenate(parts, axis=2).reshape(len(xs), -1)
        # A diverged replay is far off, not NaN (the solver steps back from it).
        return np.nan_to_num(out, nan=1e3, posinf=1e3, neginf=-1e3)

    def costs(self, xs: np.ndarray, delays) -> np.ndarray:
        """[N] 0.5 |r|^2 of N points at N delays (one world each)."""
        r = self.residuals(xs, np.asarray(delays, dtype=np.float64))
        return 0.5 * np.sum(r * r, axis=1)

    def fun(self, x: np.ndarray, delay: float) -> np.ndarray:
        """[M] residuals of one point (the last one is cached for :meth:`jac`)."""
        key = x.tobytes() + repr(delay).encode()
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, self.residuals(x[None], np.array([float(delay)]))[0])
        return self._cache[1]

    def jac(self, x: np.ndarray, delay: float) -> np.ndarray:
        """[M, P] forward differences, one world per column (a step down at an upper
        bound)."""
        _, hi = self.bounds()
        steps = np.where(x + FD_STEP <= hi, FD_STEP, -FD_STEP)
        r = self.residuals(x[None] + np.diag(steps), np.full(len(x), float(delay)))
        return ((r - self.fun(x, delay)[None]) / steps[:, None]).T

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Lower and upper bounds of a point (BOUNDS over the base values)."""
        base = [float(np.mean(self.base[f][idx])) for idx, f in self.layout]
        return (np.array([np.log(BOUNDS[f][0] / b) for b, (_, f) in zip(base, self.layout)]),
                np.array([np.log(BOUNDS[f][1] / b) for b, (_, f) in zip(base, self.layout)]))

    def solve(self, x: np.ndarray, delay: float, max_nfev: int):
        """scipy's least squares from ``x`` at ``delay`` [physics steps]."""
        lo, hi = self.bounds()
        return least_squares(self.fun, np.clip(x, lo, hi), jac=self.jac, bounds=(lo, hi),
                             args=(delay,), method='trf', x_scale=1.0, max_nfev=max_nfev)

    def close(self) -> None:
        self.replayer.close()


def hermite(trace: Trace, k: np.ndarray, back: float) -> tuple[np.ndarray, np.ndarray]:
    """[K, J] positions and velocities ``back`` seconds before samples ``k`` (>= 1, back at
    most one sample period): the cubic Hermite through the samples' positions with their
    velocities as slopes."""
    dt = trace.t[k] - trace.t[k - 1]
    s = (1.0 - back / dt)[:, None]
    q0, q1 = trace.q[k - 1], trace.q[k]
    v0, v1 = trace.qd[k - 1] * dt[:, None], trace.qd[k] * dt[:, None]
    # The basis polynomials at s and their derivatives (per unit of s).
    q = (2 * s**3 - 3 * s**2 + 1) * q0 + (s**3 - 2 * s**2 + s) * v0 + \
        (3 * s**2 - 2 * s**3) * q1 + (s**3 - s**2) * v1
    qd = (6 * s**2 - 6 * s) * q0 + (3 * s**2 - 4 * s + 1) * v0 + \
        (6 * s - 6 * s**2) * q1 + (3 * s**2 - 2 * s) * v1
    return q, qd / dt[:, None]


def _linear_gains(trace: Trace, robot: RobotSpec, groups: dict[str, np.ndarray],
                  max_periods: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Stage 1: [J] Kp and Kd per group from the efforts, and the delay [control periods]."""
    i0, i1 = trace.window
    k = np.arange(max(i0, 1 + max_periods), i1)
    # The sensors' state: one physics step before the sample.
    q, qd = hermite(trace, k, robot.sim_dt)
    effort = trace.effort[k]
    free = np.abs(effort) < 0.95 * robot.effort_limit
    best = (np.inf, robot.kp.copy(), robot.kd.copy(), 0)
    for d in range(max_periods + 1):
        error = trace.target[k - 1 - d] - q
        kp, kd, total = robot.kp.copy(), robot.kd.copy(), 0.0
        for idx in groups.values():
            rows = free[:, idx].ravel()
            a = np.stack([error[:, idx].ravel(), -qd[:, idx].ravel()], axis=1)[rows]
            b = effort[:, idx].ravel()[rows]
            if len(b) < 10:
                continue
            sol = np.linalg.lstsq(a, b, rcond=None)[0]
            kp[idx], kd[idx] = sol
            total += float(np.sum((a @ sol - b) ** 2))
        if total < best[0]:
            best = (total, kp, kd, d)
    _, kp, kd, d = best
    return np.maximum(kp, BOUNDS['kp'][0]), np.maximum(kd, BOUNDS['kd'][0]), d


def _correlation_factor(series: np.ndarray) -> float:
    """(1 + rho) / (1 - rho) of the mean lag-one correlation in time of [R, C] residual
    series (>= 1)."""
    a, b = series[:-1], series[1:]
    den = np.sqrt(np.sum(a * a, axis=0) * np.sum(b * b, axis=0))
    rho = np.sum(a * b, axis=0)[den > 0] / den[den > 0]
    rho = float(np.clip(np.mean(rho), 0.0, 0.99)) if len(rho) else 0.0
    return (1 + rho) / (1 - rho)


def nominal_params(replayer: Replayer, robot: RobotSpec) -> dict[str, np.ndarray]:
    """{field: [J]} of the robot as configured (the joints' friction, damping and rotor
    inertia as its model has them: the robot YAML's, else the URDF's)."""
    m = replayer.model
    return {'kp': robot.kp.copy(), 'kd': robot.kd.copy(),
            'frictionloss': m.dof_frictionloss[replayer.vadr].copy(),
            'damping': m.dof_damping[replayer.vadr].copy(),
            'armature': m.dof_armature[replayer.vadr].copy()}


def identify(trace: Trace, robot: RobotSpec, cfg: SysidConfig | None = None,
             log=print) -> FitResult:
    """Fit ``trace`` (refused by name when it cannot identify a parameter: ConfigError)."""
    cfg = cfg or SysidConfig()
    start = time.perf_counter()
    if trace.variant not in ('stand', 'ground'):
        raise ConfigError(trace.source, 'variant', f'{trace.variant!r}; say whether the robot '
                          'was on a stand or on the ground (--variant stand|ground)')
    if robot.actuator.model not in ('ideal_pd', 'dc_motor'):
        raise ConfigError(robot.source.get('config', 'robot'), 'actuator.model',
                          f'{robot.actuator.model!r}: system identification fits a PD drive; '
                          'identify with ideal_pd or dc_motor (claw-rl actuator-net learns a '
                          'network)')
    check_trace(trace, robot, cfg.limits)
    groups = joint_groups(robot, cfg.per_joint)
    with_effort = trace.effort is not None
    free = list(PARAMS) if with_effort else [f for f in PARAMS if f != 'damping']
    max_delay = int(round(cfg.max_delay_s / robot.sim_dt))
    problem = _Problem(robot, trace, cfg, max(len(groups) * len(free), max_delay + 1,
                                              3 * len(free), 2))
    try:
        nominal = problem.fixed
        start_values = {f: v.copy() for f, v in nominal.items()}
        notes = []
        candidates = list(range(max_delay + 1))
        if with_effort:
            kp, kd, periods = _linear_gains(trace, robot, groups,
                                            -(-max_delay // robot.decimation))
            start_values['kp'], start_values['kd'] = kp, kd
            # The efforts see the delay in whole control periods; the motion resolves the
            # physics step within the period.
            dec = robot.decimation
            candidates = [d for d in candidates if dec * periods <= d < dec * (periods + 1)]
            log(f'stage 1 (efforts, linear least squares): Kp, Kd per group; the delay in '
                f'control period {periods}')
        else:
            notes.append(
                'no efforts recorded: the drive\'s Kd and the joint\'s viscous damping act alike '
                '(a torque -c qd each, until the drive saturates), so their sum is identified; '
                'rule: the damping keeps its prior (the robot YAML\'s joint_damping, else the '
                'URDF\'s) and Kd is the sum less it')
        for f in PARAMS:
            start_values[f] = np.maximum(start_values[f], BOUNDS[f][0])
        delay, scales = _coarse(problem, start_values, free, candidates, cfg, log)
        current = {f: start_values[f] * scales[f] for f in PARAMS}
        # Stage 3: every group's parameters at that delay (per joint: from the groups' fit).
        stages = [('group', joint_groups(robot, False))] + \
            ([('joint', groups)] if cfg.per_joint else [])
        for what, fitted_groups in stages:
            problem.fixed = current
            problem.configure([(idx, f) for idx in fitted_groups.values() for f in free],
                              {f: np.ones(robot.num_joints) for f in PARAMS}, 1)
            x = np.array([np.log(np.mean(current[f][idx])) for idx, f in problem.layout])
            fit = problem.solve(x, delay, cfg.max_evaluations)
            x = fit.x
            current = {f: v[0] for f, v in problem.params(x[None]).items()}
            log(f'stage 3 (least squares per {what} at delay {delay}): cost {fit.cost:.4g} in '
                f'{fit.nfev} evaluations')
        around = list(range(max(0, delay - 1), min(max_delay, delay + 1) + 1))
        costs = dict(zip(around, problem.costs(np.tile(x, (len(around), 1)), around)))
        sigma = _uncertainty(problem.jac(x, delay), problem.fun(x, delay), len(problem.rows))
        fitted = current
        values = {g: {f: float(fitted[f][idx[0]]) for f in PARAMS} for g, idx in groups.items()}
        rel = {g: {f: 0.0 for f in PARAMS} for g in groups}
        names = {tuple(idx): g for g, idx in groups.items()}
        for p, (idx, f) in enumerate(problem.layout):
            rel[names[tuple(idx)]][f] = float(sigma[p])
        if not with_effort:
            for g in groups:
                total = values[g]['kd'] + values[g]['damping']
                notes.append(f'{g}: Kd + damping = {total:.4g} N m s/rad +- '
                             f'{100 * rel[g]["kd"] * values[g]["kd"] / total:.1f} % -> damping '
                             f'{values[g]["damping"]:.4g} (prior), Kd {values[g]["kd"]:.4g}')
        before = _rms(problem, nominal, robot.actuator.nominal_delay_steps)
        after = _rms(problem, fitted, delay)
        return FitResult(robot.name, trace.variant, groups, values, rel, delay, robot.sim_dt,
                         costs, before[0], after[0], before[1], after[1],
                         list(robot.joint_names), with_effort, free, notes,
                         time.perf_counter() - start, int(round(problem.evaluations)))
    finally:
        problem.close()


def _coarse(problem: _Problem, start: dict[str, np.ndarray], free: list[str],
            candidates: list[int], cfg: SysidConfig, log) -> tuple[int, dict[str, float]]:
    """Stage 2: the delay. A delay and the rotor inertia trade (both lag the motion), so each
    of the ``COARSE_DELAYS`` most promising candidates (by their cost at the start) gets its
    own fit of one multiplier per parameter, shared by every group, on every
    ``COARSE_EVERY``-th window of a stand; the least cost wins. Returns the delay and the
    multipliers of ``start``."""
    problem.configure([(np.arange(problem.robot.num_joints), f) for f in free], start,
                      COARSE_EVERY)
    zero = np.zeros(len(free))
    first = problem.costs(np.tile(zero, (len(candidates), 1)), candidates)
    ranked = [candidates[i] for i in np.argsort(first)]
    if problem.with_effort:
        ranked = ranked[:COARSE_DELAYS]
    best = (np.inf, ranked[0], zero)
    for delay in ranked:
        result = problem.solve(zero, delay, cfg.coarse_evaluations)
        log(f'stage 2 (delay {delay} physics steps, one multiplier per parameter): cost '
            f'{result.cost:.4g} in {result.nfev} evaluations')
        if result.cost < best[0]:
            best = (result.cost, delay, result.x)
    _, delay, x = best
    scales = {f: 1.0 for f in PARAMS}
    scales.update({f: float(np.exp(v)) for f, v in zip(free, x)})
    return delay, scales


def _uncertainty(jac: np.ndarray, r: np.ndarray, rows: int) -> np.ndarray:
    """[P] standard deviations of the log parameters (relative errors) at the optimum, from
    the Jacobian [M, P] and residuals [M] of ``rows`` samples in time."""
    m, n = jac.shape
    s2 = float(r @ r) / max(m - n, 1) * _correlation_factor(r.reshape(rows, -1))
    cov = np.linalg.pinv(jac.T @ jac) * s2
    return np.sqrt(np.maximum(np.diag(cov), 0.0))


def _rms(problem: _Problem, values: dict[str, np.ndarray], delay: int
         ) -> tuple[np.ndarray, np.ndarray | None]:
    """[J] RMS position error [rad] and (with efforts) effort error [N m] over the excitation
    of ``values`` ({field: [J]}): the recorded commands replayed open loop from the first
    sample (what a simulation with these numbers would do)."""
    problem.evaluations += 1
    q, _, effort = problem.replayer.run({f: v[None] for f, v in values.items()},
                                        np.array([float(delay)]))
    tr, rows = problem.trace, problem.window
    q_rms = np.sqrt(np.mean((q[0, rows] - tr.q[rows]) ** 2, axis=0))
    if tr.effort is None:
        return q_rms, None
    return q_rms, np.sqrt(np.mean((effort[0, rows] - tr.effort[rows]) ** 2, axis=0))
