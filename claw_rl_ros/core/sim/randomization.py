"""Per-world physical parameters: their nominal values and their draws from the env config.

One list for the batched env and the sim node's session, so both randomise the same things the
same way (:meth:`~.physics.BatchedPhysics.set_physical_params` writes them into a model copy).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .env_config import RandomizationConfig, robot_sized
from .robot_spec import RobotSpec

# Scalars per world, then [3] per world (the CoM shift), then [J] per world (per joint).
PHYSICAL = ('friction', 'added_mass', 'mass_scale', 'com_offset', 'motor_strength',
            'contact_timeconst', 'torsional_friction', 'kp_scale', 'kd_scale',
            'frictionloss_scale', 'joint_damping_scale', 'armature_scale')
PER_JOINT = {'kp_scale': 'kp_scale', 'kd_scale': 'kd_scale',
             'frictionloss_scale': 'joint_friction_scale',
             'joint_damping_scale': 'joint_damping_scale', 'armature_scale': 'armature_scale'}


def draw_range(rng: np.random.Generator, low_high: Any, shape: Any) -> np.ndarray:
    """Uniform draws of ``shape`` from (low, high); a range with equal ends is that value and
    costs no random numbers (so adding such a range replays the draws made without it)."""
    a, b = low_high
    return rng.uniform(a, b, shape) if a < b else np.full(shape, float(a))


def draw_steps(rng: np.random.Generator, low_high: Any, k: int) -> np.ndarray:
    """k whole numbers from [low, high] (physics steps), as :func:`draw_range` draws."""
    a, b = low_high
    return rng.integers(a, b + 1, k) if a < b else np.full(k, int(a))


def delay_range(dr: RandomizationConfig, robot: RobotSpec) -> tuple[int, int]:
    """(min, max) command -> motor delay [physics steps]: the env config's, or the robot's."""
    return tuple(int(x) for x in robot_sized(dr.action_latency_substeps,
                                             robot.actuator.delay_steps))


# MuJoCo's default contact time constant (solref[0]) [s]: the model's own contact softness.
MODEL_CONTACT_TIMECONST = 0.02
# What a transfer ramp widens: the ranges a real robot adds to the classic friction / mass /
# motor-strength family, each with its nominal value (the centre it widens from).
RAMPED_RANGES = {'kp_scale': 1.0, 'kd_scale': 1.0, 'joint_friction_scale': 1.0,
                 'joint_damping_scale': 1.0, 'armature_scale': 1.0, 'encoder_offset': 0.0,
                 'imu_gyro_bias': 0.0, 'imu_tilt_offset': 0.0,
                 'contact_timeconst': MODEL_CONTACT_TIMECONST, 'torsional_friction': 0.0}
RAMPED_STEPS = ('joint_state_delay_substeps', 'imu_delay_substeps')


def ramp_fraction(dr: RandomizationConfig, control_steps: int) -> float:
    """How far the transfer ranges have widened after ``control_steps`` steps per world: 0 at
    the start, 1 (full) from ``transfer_ramp_steps`` on, linear between; 1 without a ramp."""
    ramp = dr.transfer_ramp_steps
    return 1.0 if ramp <= 0 else min(1.0, max(0.0, control_steps / ramp))


def ramped(dr: RandomizationConfig, robot: RobotSpec, fraction: float) -> RandomizationConfig:
    """``dr`` with every transfer range (RAMPED_RANGES, the sensor delays, the action delay and
    the control jitter) shrunk to ``fraction`` of its width about its nominal value (moved into
    the range when the range leaves it out): fraction 0 trains on the nominal robot, 1 is ``dr``.
    Whole-step ranges round their ends; the classic ranges are left as they are."""
    if fraction >= 1.0:
        return dr

    # Each end moves from the nominal value n towards its configured value: n + f (end - n).
    def shrink(low_high, nominal, whole=False):
        if low_high is None:
            return None
        n = min(max(nominal, low_high[0]), low_high[1])
        ends = [n + fraction * (end - n) for end in low_high]
        return tuple(int(round(e)) for e in ends) if whole else tuple(ends)

    changes = {name: shrink(getattr(dr, name), nominal)
               for name, nominal in RAMPED_RANGES.items()}
    changes.update({name: shrink(getattr(dr, name), 0, whole=True) for name in RAMPED_STEPS})
    changes['action_latency_substeps'] = shrink(
        delay_range(dr, robot), robot.actuator.nominal_delay_steps, whole=True)
    changes['control_jitter_substeps'] = int(round(fraction * dr.control_jitter_substeps))
    return dataclasses.replace(dr, **changes)


def nominal_params(robot: RobotSpec, k: int) -> dict[str, np.ndarray]:
    """k worlds' nominal parameters and the robot's own delay (randomisation off)."""
    j = robot.num_joints
    params = {'friction': np.full(k, robot.foot_friction), 'added_mass': np.zeros(k),
              'mass_scale': np.ones(k), 'com_offset': np.zeros((k, 3)),
              'motor_strength': np.ones(k), 'contact_timeconst': np.zeros(k),
              'torsional_friction': np.zeros(k)}
    params.update({name: np.ones((k, j)) for name in PER_JOINT})
    params['latency'] = np.full(k, robot.actuator.nominal_delay_steps, dtype=np.int64)
    return params


def draw_params(dr: RandomizationConfig, robot: RobotSpec, rng: np.random.Generator, k: int,
                payload_range: Any, com_offset_range: Any) -> dict[str, np.ndarray]:
    """k worlds' draws of every name in PHYSICAL, and their delay ``latency`` [physics steps].

    The first five are drawn in a fixed order whatever the ranges; a later range whose ends are
    equal is not drawn, so a config without them replays the same random numbers.
    ``contact_timeconst`` 0 means the model's own contact softness, ``torsional_friction`` 0
    MuJoCo's 3-D contacts at the feet."""
    j = robot.num_joints
    params = {'friction': rng.uniform(*dr.friction, k),
              'added_mass': rng.uniform(*payload_range, k),
              'mass_scale': rng.uniform(*dr.link_mass_scale, k),
              'com_offset': rng.uniform(*com_offset_range, (k, 3)),
              'motor_strength': rng.uniform(*dr.motor_strength, k)}
    lo, hi = delay_range(dr, robot)
    params['latency'] = rng.integers(lo, hi + 1, k)
    for name, key in PER_JOINT.items():
        params[name] = draw_range(rng, getattr(dr, key), (k, j))
    # Contact softness (0: the model's own) and the feet's torsional friction (0: off).
    for name in ('contact_timeconst', 'torsional_friction'):
        params[name] = draw_range(rng, getattr(dr, name) or (0.0, 0.0), k)
    return params
