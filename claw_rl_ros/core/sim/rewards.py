"""Reward terms: small named functions, scaled from YAML, logged one by one (as legged_gym).

Each term maps a :class:`StepData` batch to ``[N]`` and is multiplied by its YAML scale and the
control dt; a term with scale 0 is not computed. Positive scales reward, negative penalise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from .observations import RobotState


@dataclass
class StepData(RobotState):
    """Everything reward terms read for one control step, batched over N worlds.

    Beyond RobotState (whose last_action is the action just applied, as the policy sees it):
    projected_gravity [N, 3] and trunk_ang_vel [N, 3] (the trunk's true gravity direction and
    angular velocity in its body frame: rewards judge the trunk, not the IMU), joint_acc /
    joint_torque / previous_action [N, J], foot_air_time [N, F] (seconds in the air before this
    step's touchdown), first_contact [N, F] (touchdown this step), penalised_contact [N, P],
    terminated [N] (bool), foot_velocity [N, F, 3] (each foot's world velocity over the last
    physics step), joint_power [N] (sum over joints of |torque x velocity| [W], averaged over
    the control step's physics steps).
    """

    projected_gravity: Optional[np.ndarray] = None
    trunk_ang_vel: Optional[np.ndarray] = None
    joint_acc: Optional[np.ndarray] = None
    joint_torque: Optional[np.ndarray] = None
    previous_action: Optional[np.ndarray] = None
    foot_air_time: Optional[np.ndarray] = None
    first_contact: Optional[np.ndarray] = None
    penalised_contact: Optional[np.ndarray] = None
    terminated: Optional[np.ndarray] = None
    desired_stance: Optional[np.ndarray] = None
    foot_height: Optional[np.ndarray] = None
    foot_velocity: Optional[np.ndarray] = None
    joint_power: Optional[np.ndarray] = None


@dataclass(frozen=True)
class RewardParams:
    """Constants reward terms need: from the reward config and the robot spec."""

    tracking_sigma: float
    base_height_target: float
    feet_air_time_target: float
    moving_command_threshold: float
    default_joint_pos: np.ndarray
    soft_joint_lower: np.ndarray
    soft_joint_upper: np.ndarray
    swing_height_target: float = 0.05


def _sum(x: np.ndarray) -> np.ndarray:
    return np.sum(x, axis=1)


def is_moving(commands: np.ndarray, threshold: float) -> np.ndarray:
    """[N, 3] commands (vx, vy, yaw rate) -> [N] bool: asked to walk or to turn.

    The one definition of "moving" shared by the gait clock and every reward term, so a
    turn-in-place command is a moving command everywhere.
    """
    return (np.linalg.norm(commands[:, :2], axis=1) > threshold) | \
        (np.abs(commands[:, 2]) > threshold)


def _moving(s: StepData, p: RewardParams) -> np.ndarray:
    return is_moving(s.commands, p.moving_command_threshold)


def tracking_lin_vel(s: StepData, p: RewardParams) -> np.ndarray:
    """exp(-|v_cmd_xy - v_xy|^2 / sigma): follow the commanded planar velocity (body frame)."""
    return np.exp(-_sum(np.square(s.commands[:, :2] - s.base_lin_vel[:, :2])) / p.tracking_sigma)


def tracking_ang_vel(s: StepData, p: RewardParams) -> np.ndarray:
    """exp(-(w_cmd - w_z)^2 / sigma): follow the commanded yaw rate."""
    return np.exp(-np.square(s.commands[:, 2] - s.trunk_ang_vel[:, 2]) / p.tracking_sigma)


def lin_vel_z(s: StepData, p: RewardParams) -> np.ndarray:
    """Vertical base velocity squared (bouncing)."""
    return np.square(s.base_lin_vel[:, 2])


def ang_vel_xy(s: StepData, p: RewardParams) -> np.ndarray:
    """Roll and pitch rates squared."""
    return _sum(np.square(s.trunk_ang_vel[:, :2]))


def orientation(s: StepData, p: RewardParams) -> np.ndarray:
    """Planar part of gravity in the body frame squared: 0 when the trunk is level."""
    return _sum(np.square(s.projected_gravity[:, :2]))


def base_height(s: StepData, p: RewardParams) -> np.ndarray:
    """(h - h_target)^2."""
    return np.square(s.base_height - p.base_height_target)


def torques(s: StepData, p: RewardParams) -> np.ndarray:
    """Sum of joint torques squared."""
    return _sum(np.square(s.joint_torque))


def dof_vel(s: StepData, p: RewardParams) -> np.ndarray:
    """Sum of joint velocities squared."""
    return _sum(np.square(s.joint_vel))


def dof_acc(s: StepData, p: RewardParams) -> np.ndarray:
    """Sum of joint accelerations squared."""
    return _sum(np.square(s.joint_acc))


def action_rate(s: StepData, p: RewardParams) -> np.ndarray:
    """Sum of (a_t - a_{t-1})^2: smooth commands."""
    return _sum(np.square(s.last_action - s.previous_action))


def dof_pos_limits(s: StepData, p: RewardParams) -> np.ndarray:
    """How far joints are past their soft limits (rad, summed)."""
    below = np.clip(p.soft_joint_lower - s.joint_pos, 0.0, None)
    above = np.clip(s.joint_pos - p.soft_joint_upper, 0.0, None)
    return _sum(below + above)


def collision(s: StepData, p: RewardParams) -> np.ndarray:
    """Number of penalised links (thighs, calves) touching the ground."""
    return _sum(s.penalised_contact.astype(np.float64))


def termination(s: StepData, p: RewardParams) -> np.ndarray:
    """1 on a failure termination (not on a time-out)."""
    return s.terminated.astype(np.float64)


def feet_air_time(s: StepData, p: RewardParams) -> np.ndarray:
    """Sum over touchdowns of (air time - target): rewards steps of a useful length."""
    steps = _sum((s.foot_air_time - p.feet_air_time_target) * s.first_contact)
    return steps * _moving(s, p)


def stand_still(s: StepData, p: RewardParams) -> np.ndarray:
    """Distance from the default pose while commanded to stand."""
    return _sum(np.abs(s.joint_pos - p.default_joint_pos)) * ~_moving(s, p)


def gait_contact(s: StepData, p: RewardParams) -> np.ndarray:
    """Fraction of feet whose ground contact matches the gait clock's stance/swing plan."""
    return np.mean((s.foot_contact > 0.5) == s.desired_stance, axis=1)


def feet_clearance(s: StepData, p: RewardParams) -> np.ndarray:
    """Mean lift of the feet the gait wants in swing, as a fraction of the target height."""
    swing = ~s.desired_stance
    lifted = np.clip(s.foot_height / p.swing_height_target, 0.0, 1.0)
    return _sum(swing * lifted) / np.maximum(_sum(swing), 1)


def feet_slip(s: StepData, p: RewardParams) -> np.ndarray:
    """Sum over feet on the ground of their planar speed squared [(m/s)^2]: a claw that
    stands slides (MuJoCo Playground's feet_slip)."""
    planar = np.sum(np.square(s.foot_velocity[:, :, :2]), axis=2)
    return _sum(planar * (s.foot_contact > 0.5))


def energy(s: StepData, p: RewardParams) -> np.ndarray:
    """Mechanical power of the joints, sum of |torque x velocity| [W] (Playground's energy)."""
    return s.joint_power


TERMS: dict[str, Callable[[StepData, RewardParams], np.ndarray]] = {
    fn.__name__: fn for fn in (
        tracking_lin_vel, tracking_ang_vel, lin_vel_z, ang_vel_xy, orientation, base_height,
        torques, dof_vel, dof_acc, action_rate, dof_pos_limits, collision, termination,
        feet_air_time, stand_still, gait_contact, feet_clearance, feet_slip, energy)
}


class RewardManager:
    """Weighted sum of named terms; keeps per-term episode sums for logging."""

    def __init__(self, scales: dict[str, float], params: RewardParams, control_dt: float,
                 num_envs: int, only_positive: bool):
        unknown = sorted(set(scales) - set(TERMS))
        if unknown:
            raise ValueError(f'unknown reward term {unknown[0]!r}; available: '
                             f'{", ".join(TERMS)}')
        # Scales are per second: times control_dt, rewards do not depend on the control rate.
        self.scales = {k: v * control_dt for k, v in scales.items() if v != 0.0}
        self.params = params
        self.only_positive = only_positive
        self.episode_sums = {k: np.zeros(num_envs) for k in self.scales}

    def compute(self, s: StepData) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """([N] total reward, {term: [N] scaled value}) for one step."""
        terms = {name: TERMS[name](s, self.params) * scale for name, scale in self.scales.items()}
        total = np.zeros(len(s.commands))
        for name, value in terms.items():
            if name != 'termination':
                total += value
        if self.only_positive:
            # legged_gym's trick: no negative total, so dying early is no way out; the
            # termination penalty is added after the clip.
            total = np.clip(total, 0.0, None)
        if 'termination' in terms:
            total += terms['termination']
        for name, value in terms.items():
            self.episode_sums[name] += value
        return total, terms

    def pop_episode_sums(self, env_ids: np.ndarray) -> dict[str, np.ndarray]:
        """Per-term episode sums of the given worlds, zeroed for their next episode."""
        out = {}
        for name, sums in self.episode_sums.items():
            out[name] = sums[env_ids].copy()
            sums[env_ids] = 0.0
        return out
