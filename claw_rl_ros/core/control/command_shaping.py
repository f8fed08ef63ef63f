"""Command shaping of the deployed policy: joint limits, a maximum change per tick, Kp/Kd.

Every target the policy node publishes passes :meth:`CommandShaper.shape` (except PASSIVE's
damping target, which must act at once and restarts the rate limit at the measured pose):
clamped to the URDF joint limits, then to ``max_delta`` [rad] from the previous command. How
much the raw command was cut is returned, so persisting saturation can fault the policy.

The default maximum change is a velocity (the URDF velocity limit) times the measured time the
tick stands for, at most one control period: states faster than the control rate (52 Hz) get
proportionally smaller steps, so the target never moves faster than the velocity limit, and a
late state (48 Hz, a lost one) earns no larger step than a punctual one.
"""

from __future__ import annotations

import numpy as np

from ..sim.robot_spec import RobotSpec
from ..sim.observations import bounded_elapsed

# A tick within this fraction of the control period counts as a whole one: float64 stamps of
# wall time (~1.7e9 s) resolve 0.24 us, 1.2e-5 of a 20 ms period, and that noise must not make
# the bound of a punctual tick wobble below max_delta (replays recognise a bound by it).
STAMP_NOISE = 1e-4


class CommandShaper:
    """Raw [J] targets (spec order) -> clamped, rate-limited [J] targets.

    ``max_delta_per_tick`` <= 0 means the URDF velocity limit times the control period
    (``max_delta``), scaled down for a tick that stood for less (:meth:`shape`'s ``elapsed``);
    a given ``max_delta_per_tick`` is per tick, whatever the rate.
    """

    def __init__(self, robot: RobotSpec, max_delta_per_tick: float = 0.0):
        if not np.isfinite(max_delta_per_tick):
            raise ValueError(f'max_delta_per_tick = {max_delta_per_tick!r}; give a finite '
                             'number of rad (<= 0: velocity limit x control period)')
        self.lower, self.upper = robot.joint_lower, robot.joint_upper
        self.control_dt = robot.control_dt
        # Only the velocity-derived limit follows the measured time of a tick.
        self.velocity_derived = max_delta_per_tick <= 0
        if max_delta_per_tick > 0:
            self.max_delta = np.full(robot.num_joints, float(max_delta_per_tick))
        else:
            self.max_delta = robot.velocity_limit * robot.control_dt
        self.kp, self.kd = robot.kp.copy(), robot.kd.copy()
        self.last: np.ndarray | None = None

    def restart(self, pose: np.ndarray) -> np.ndarray:
        """Take [J] ``pose`` (clamped to the limits) as the command now; returns it."""
        self.last = np.clip(np.asarray(pose, dtype=np.float64), self.lower, self.upper)
        return self.last.copy()

    def step_limit(self, elapsed: float | None = None) -> np.ndarray:
        """[J] largest change [rad] for a tick that stood for ``elapsed`` [s] (the measured
        time since the previous state; None: one control period)."""
        if not self.velocity_derived or elapsed is None:
            return self.max_delta
        # velocity limit x bounded elapsed, never more than one control period's worth.
        fraction = bounded_elapsed(elapsed, self.control_dt) / self.control_dt
        return self.max_delta if fraction >= 1.0 - STAMP_NOISE else self.max_delta * fraction

    def shape(self, raw: np.ndarray, elapsed: float | None = None) -> tuple[np.ndarray, float]:
        """(shaped [J] target, max |raw - shaped| [rad]); raw must be finite; ``elapsed``:
        the measured time [s] this tick stands for (None: one control period)."""
        raw = np.asarray(raw, dtype=np.float64)
        lo, hi = self.lower, self.upper
        # Rate limit: at most the step limit from the previous command, per joint, inside the
        # limits (np.minimum / np.maximum: several times faster than np.clip on 12 values).
        if self.last is not None:
            step = self.step_limit(elapsed)
            lo = np.maximum(lo, self.last - step)
            hi = np.minimum(hi, self.last + step)
        target = np.minimum(np.maximum(raw, lo), hi)
        self.last = target
        return target.copy(), float(np.abs(raw - target).max())

    def use_gains(self, kp, kd) -> None:
        """Send these [J] gains (spec order) from now on: the serving model's metadata."""
        self.kp = np.array(kp, dtype=np.float64)
        self.kd = np.array(kd, dtype=np.float64)

    def gains(self, passive: bool) -> tuple[np.ndarray, np.ndarray]:
        """([J] Kp, [J] Kd) for drivers that take gains: Kp = 0 (damping only) when passive."""
        return (np.zeros_like(self.kp) if passive else self.kp.copy()), self.kd.copy()
