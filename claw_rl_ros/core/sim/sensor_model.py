"""What a real robot's sensors report instead of the simulation's truth, per world.

Drawn at each reset from ``env.randomization`` (each off by default):

- ``encoder_offset``: a constant offset per joint [rad] on the measured joint positions
  (an encoder zeroed a little off);
- ``imu_gyro_bias``: a constant bias per gyro axis [rad/s];
- ``imu_tilt_offset``: the IMU mounted tilted by a roll and a pitch [rad] (its orientation,
  and the gravity direction the policy sees, rotated by them);
- ``joint_state_delay_substeps`` and ``imu_delay_substeps``: how many physics steps old the
  joint states and the IMU reading are when the policy reads them;
- ``control_jitter_substeps`` j: every control step the loop samples its sensors 0..j physics
  steps early (drawn per step), so the time between two samples is the control period +- j
  physics steps, and its command reaches the motors as much earlier (never before the
  control step begins). The gait clock moves by the time between samples, as the policy node's
  does (it follows the state stamps).

Readings are kept per physics step in a ring, newest first, as long as the longest delay; with
everything off nothing is kept and the env reads the physics directly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..math_utils import quat_mul, quat_rotate_inverse
from .env_config import RandomizationConfig
from .randomization import draw_range, draw_steps


def sensor_model_wanted(dr: RandomizationConfig) -> bool:
    """True when any part of the sensor model is on (else the env reads the physics)."""
    return bool(dr.control_jitter_substeps or dr.joint_state_delay_substeps[1]
                or dr.imu_delay_substeps[1]) or any(
        tuple(getattr(dr, name)) != (0.0, 0.0)
        for name in ('encoder_offset', 'imu_gyro_bias', 'imu_tilt_offset'))


def tilt_quat(roll: np.ndarray, pitch: np.ndarray) -> np.ndarray:
    """[K, 4] (w, x, y, z) rotations by ``roll`` about x, then ``pitch`` about y [rad]."""
    cr, sr = np.cos(0.5 * roll), np.sin(0.5 * roll)
    cp, sp = np.cos(0.5 * pitch), np.sin(0.5 * pitch)
    return np.stack([cr * cp, sr * cp, cr * sp, -sr * sp], axis=1)


class SensorModel:
    """Per-world sensor offsets, biases and delays (module docstring) for N worlds."""

    def __init__(self, dr: RandomizationConfig, num_envs: int, num_joints: int,
                 decimation: int):
        self.dr = dr
        self.decimation = decimation
        self.jitter = int(dr.control_jitter_substeps)
        self.max_delay = max(dr.joint_state_delay_substeps[1], dr.imu_delay_substeps[1]) + \
            self.jitter
        n, j = num_envs, num_joints
        self.encoder_offset = np.zeros((n, j))
        self.gyro_bias = np.zeros((n, 3))
        self.tilt = np.tile([1.0, 0.0, 0.0, 0.0], (n, 1))
        self.joint_delay = np.zeros(n, dtype=np.int64)
        self.imu_delay = np.zeros(n, dtype=np.int64)
        # Physics steps this control step's sample was taken early (control jitter), and the
        # previous step's (the time between samples is the period - their difference).
        self.early = np.zeros(n, dtype=np.int64)
        self.previous_early = np.zeros(n, dtype=np.int64)
        k = self.max_delay + 1
        # Rings of readings per physics step, newest first: joints [K, N, 2 J] (pos, vel),
        # IMU [K, N, 7] (quaternion, gyro).
        self.joint_ring = np.zeros((k, n, 2 * j)) if self.max_delay else None
        self.imu_ring = np.zeros((k, n, 7)) if self.max_delay else None
        self._rows = np.arange(n)

    def draw(self, ids: np.ndarray, rng: np.random.Generator,
             dr: RandomizationConfig | None = None) -> None:
        """New offsets, biases and delays for worlds ``ids`` from ``dr``'s ranges (default: the
        ranges this model was built with; narrower ones while a transfer ramp runs). A range
        with equal ends is not drawn, so the env's other draws stay what they were without it."""
        dr, k = dr or self.dr, len(ids)
        self.encoder_offset[ids] = draw_range(rng, dr.encoder_offset,
                                              (k, self.encoder_offset.shape[1]))
        self.gyro_bias[ids] = draw_range(rng, dr.imu_gyro_bias, (k, 3))
        tilt = draw_range(rng, dr.imu_tilt_offset, (k, 2))
        self.tilt[ids] = tilt_quat(tilt[:, 0], tilt[:, 1])
        self.joint_delay[ids] = draw_steps(rng, dr.joint_state_delay_substeps, k)
        self.imu_delay[ids] = draw_steps(rng, dr.imu_delay_substeps, k)
        self.early[ids] = 0
        self.previous_early[ids] = 0

    _STATE = ('encoder_offset', 'gyro_bias', 'tilt', 'joint_delay', 'imu_delay', 'early',
              'previous_early', 'joint_ring', 'imu_ring')

    def get_state(self) -> dict[str, np.ndarray]:
        """Copies of every per-world array (an env's checkpoint)."""
        return {k: getattr(self, k).copy() for k in self._STATE if getattr(self, k) is not None}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore :meth:`get_state` (arrays of another shape are left as they are)."""
        for k in self._STATE:
            mine = getattr(self, k)
            if mine is not None and getattr(state.get(k), 'shape', None) == mine.shape:
                mine[...] = state[k]

    def next_jitter(self, rng: np.random.Generator, jitter: int | None = None) -> np.ndarray:
        """[N] draw this control step's early sampling (0..j physics steps, j = ``jitter``, at
        most the built-in one) and return it."""
        j = self.jitter if jitter is None else min(int(jitter), self.jitter)
        self.previous_early = self.early
        self.early = rng.integers(0, j + 1, len(self.early)) if j else np.zeros_like(self.early)
        return self.early

    def elapsed_substeps(self) -> np.ndarray:
        """[N] physics steps between the last two samples (decimation +- the jitter)."""
        return self.decimation - (self.early - self.previous_early)

    def restart(self, ids: np.ndarray, joint_pos: np.ndarray, joint_vel: np.ndarray,
                imu_quat: np.ndarray, imu_gyro: np.ndarray) -> None:
        """Worlds ``ids`` (reset) fill their rings with their current [K, ...] readings."""
        if self.joint_ring is None:
            return
        self.joint_ring[:, ids] = np.concatenate([joint_pos, joint_vel], axis=1)[None]
        self.imu_ring[:, ids] = np.concatenate([imu_quat, imu_gyro], axis=1)[None]

    def record(self, joint_pos: np.ndarray, joint_vel: np.ndarray, imu_quat: np.ndarray,
               imu_gyro: np.ndarray) -> None:
        """This control step's readings of every physics step, oldest first: joint_pos /
        joint_vel [N, decimation, J], imu_quat [N, decimation, 4], imu_gyro [N, decimation,
        3]."""
        if self.joint_ring is None:
            return
        for ring, parts in ((self.joint_ring, (joint_pos, joint_vel)),
                            (self.imu_ring, (imu_quat, imu_gyro))):
            new = np.concatenate(parts, axis=2)[:, ::-1].transpose(1, 0, 2)  # newest first
            keep = min(len(ring), new.shape[0])
            ring[keep:] = ring[:len(ring) - keep].copy()
            ring[:keep] = new[:keep]

    def measured(self, joint_pos: np.ndarray, joint_vel: np.ndarray, imu_quat: np.ndarray,
                 imu_gyro: np.ndarray) -> tuple[Any, Any, Any, Any]:
        """What the sensors report, from the physics' current readings (used with no delay):
        joint_pos / joint_vel [N, J], imu_quat [N, 4] (w, x, y, z), imu_gyro [N, 3]."""
        if self.joint_ring is not None:
            j = joint_pos.shape[1]
            joint = self.joint_ring[np.minimum(self.joint_delay + self.early, self.max_delay),
                                    self._rows]
            joint_pos, joint_vel = joint[:, :j], joint[:, j:]
            imu = self.imu_ring[np.minimum(self.imu_delay + self.early, self.max_delay),
                                self._rows]
            imu_quat, imu_gyro = imu[:, :4], imu[:, 4:]
        # The IMU frame is the body's rotated by the mounting tilt: q_imu = q_body * q_tilt;
        # its gyro reads the same rate in that frame, plus the bias.
        gyro = quat_rotate_inverse(self.tilt, imu_gyro) + self.gyro_bias
        return joint_pos + self.encoder_offset, joint_vel, quat_mul(imu_quat, self.tilt), gyro
