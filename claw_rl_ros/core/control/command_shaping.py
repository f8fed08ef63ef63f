"""Command shaping of the deployed policy: joint limits, a maximum change per tick, Kp/Kd.

Every target the policy node publishes passes :meth:`CommandShaper.shape` (except PASSIVE's
damping target, which must act at once and restarts the rate limit at the measured pose):
clamped to the URDF joint limits, then to ``max_delta`` [rad] from the previous command. How
much the raw command was cut is returned, so persisting saturation can fault the policy.
"""

from __future__ import annotations

import numpy as np

from ..sim.robot_spec import RobotSpec


class CommandShaper:
    """Raw [J] targets (spec order) -> clamped, rate-limited [J] targets.

    ``max_delta_per_tick`` <= 0 means the URDF velocity limit times the control period.
    """

    def __init__(self, robot: RobotSpec, max_delta_per_tick: float = 0.0):
        if not np.isfinite(max_delta_per_tick):
            raise ValueError(f'max_delta_per_tick = {max_delta_per_tick!r}; give a finite '
                             'number of rad (<= 0: velocity limit x control period)')
        self.lower, self.upper = robot.joint_lower, robot.joint_upper
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

    def shape(self, raw: np.ndarray) -> tuple[np.ndarray, float]:
        """(shaped [J] target, max |raw - shaped| [rad]); raw must be finite."""
        raw = np.asarray(raw, dtype=np.float64)
        lo, hi = self.lower, self.upper
        # Rate limit: at most max_delta from the previous command, per joint, inside the limits
        # (np.minimum / np.maximum: several times faster than np.clip on 12 values).
        if self.last is not None:
            lo = np.maximum(lo, self.last - self.max_delta)
            hi = np.minimum(hi, self.last + self.max_delta)
        target = np.minimum(np.maximum(raw, lo), hi)
        self.last = target
        return target.copy(), float(np.abs(raw - target).max())

    def gains(self, passive: bool) -> tuple[np.ndarray, np.ndarray]:
        """([J] Kp, [J] Kd) for drivers that take gains: Kp = 0 (damping only) when passive."""
        return (np.zeros_like(self.kp) if passive else self.kp.copy()), self.kd.copy()
