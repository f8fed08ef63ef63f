"""``claw-rl stand``: the robot holds its default pose under PD control; prints a summary.

The tilt is the trunk's (the base body's orientation), not the IMU's: an IMU may be mounted
at any angle (upside down on the porting example), and its reading says nothing of how the
robot stands.
"""

from __future__ import annotations

from dataclasses import dataclass
import time

import numpy as np

from ..config import from_dict
from .env import VecLocomotionEnv
from .env_config import EnvConfig
from ..math_utils import gravity_in_body


@dataclass
class StandReport:
    """What holding the default pose looked like, over all worlds."""

    seconds: float
    num_envs: int
    fell: int
    mean_height: float
    min_height: float
    max_tilt_deg: float  # the trunk's angle from upright
    max_joint_error: float
    feet_in_contact: float
    steps_per_second: float


def trunk_tilt_deg(trunk_quat: np.ndarray) -> np.ndarray:
    """[N] angle [deg] between the trunk's z axis and the world's up, from [N, 4] (w, x, y, z)
    base body orientations."""
    return np.degrees(np.arccos(np.clip(-gravity_in_body(trunk_quat)[:, 2], -1.0, 1.0)))


def stand_env(robot: str, num_envs: int, seed: int = 0) -> VecLocomotionEnv:
    """An env without randomisation, noise or pushes, commanded to stand still."""
    cfg = from_dict(EnvConfig, {
        'robot': robot, 'num_envs': num_envs, 'seed': seed, 'episode_length_s': 1e6,
        'randomization': {'enabled': False}, 'noise': {'enabled': False},
        'commands': {'standing_probability': 1.0}}, source='stand')
    return VecLocomotionEnv(cfg)


def hold_default_pose(robot: str = 'claw_quadruped', seconds: float = 5.0,
                      num_envs: int = 16, seed: int = 0) -> StandReport:
    """Step zero actions (targets = default pose) and measure how well the robot stands."""
    env = stand_env(robot, num_envs, seed)
    try:
        steps = int(round(seconds / env.control_dt))
        zeros = np.zeros((num_envs, env.num_actions))
        fell = np.zeros(num_envs, dtype=bool)
        heights, tilts, errors, contacts = [], [], [], []
        start = time.perf_counter()
        for _ in range(steps):
            _, _, terminated, _, _ = env.step(zeros)
            fell |= terminated
            state = env.robot_state()
            heights.append(state.base_height.copy())
            tilts.append(trunk_tilt_deg(env.physics.qpos[:, 3:7]))
            errors.append(np.abs(state.joint_pos - env.robot.default_joint_pos).max(axis=1))
            contacts.append(env.foot_contact.mean(axis=1))
        elapsed = time.perf_counter() - start
        # Judge the pose once the drop from the reset height has settled (after 1 s).
        settled = slice(min(steps - 1, int(1.0 / env.control_dt)), None)
        h = np.array(heights)
        return StandReport(
            seconds=steps * env.control_dt, num_envs=num_envs, fell=int(fell.sum()),
            mean_height=float(h[settled].mean()), min_height=float(h.min()),
            max_tilt_deg=float(np.max(tilts)), max_joint_error=float(np.max(errors[settled])),
            feet_in_contact=float(np.mean(contacts[settled])),
            steps_per_second=steps * num_envs / elapsed)
    finally:
        env.close()


def run_stand(robot: str, seconds: float, num_envs: int) -> int:
    """CLI entry: print the report; exit 1 if any world fell."""
    report = hold_default_pose(robot, seconds, num_envs)
    print(f'stand: {report.num_envs} worlds x {report.seconds:.1f} s simulated, '
          f'{report.steps_per_second:,.0f} env steps/s')
    print(f'  fell:               {report.fell}')
    print(f'  trunk height:       mean {report.mean_height:.3f} m, min {report.min_height:.3f} m')
    print(f'  max trunk tilt:     {report.max_tilt_deg:.2f} deg')
    print(f'  max joint error:    {report.max_joint_error:.3f} rad (PD sag under gravity)')
    print(f'  feet in contact:    {100 * report.feet_in_contact:.0f} %')
    return 1 if report.fell else 0
