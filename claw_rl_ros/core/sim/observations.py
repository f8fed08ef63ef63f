"""Observation terms and the observation layout shared by env, nodes and the exported model.

A layout is an ordered list of named terms with per-element scales. The ``policy`` group may only
use terms a real robot measures (IMU, encoders, the command, its own last action); ``privileged``
terms (true base velocity, contacts, randomised physics) exist only in simulation.
"""

from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Any, Callable, Optional

import numpy as np

from ..math_utils import gravity_in_body

# Observation groups every env returns. ``policy`` is what the student (and the robot) gets,
# with sensor noise in training (with ``env.policy_history`` H > 1: its last H frames, see
# :class:`ObservationHistory`); ``policy_noise_free`` holds the same terms without noise, for
# the critic and privileged teachers (legged_gym / IsaacLab keep critic inputs uncorrupted);
# ``privileged`` is simulation-only truth. ``height_scan`` (ground heights around the base, also
# simulation-only) exists only when the env's terrain has its height scan on.
POLICY, POLICY_NOISE_FREE, PRIVILEGED = 'policy', 'policy_noise_free', 'privileged'
HEIGHT_SCAN = 'height_scan'
OBS_GROUPS = (POLICY, POLICY_NOISE_FREE, PRIVILEGED, HEIGHT_SCAN)


# The measured time a tick stands for (between the stamps of two acted-on states) is bounded to
# this range of control periods: states at 0.5x to 2x the control rate (a robot at 48 or 52 Hz,
# jitter, one lost state) are followed exactly, while a repeated stamp (0 s) still moves the
# gait clock by half a tick instead of freezing it and a stall cannot jump it by more than the
# two ticks one lost state explains (the env moves it by the same rule under control jitter).
ELAPSED_BOUNDS_PERIODS = (0.5, 2.0)


def bounded_elapsed(elapsed: float | None, control_dt: float) -> float:
    """Seconds a tick stands for: measured ``elapsed`` [s] bounded to
    :data:`ELAPSED_BOUNDS_PERIODS` x ``control_dt``; None, non-finite or negative (no previous
    state, a clock that went back) -> ``control_dt``, the nominal period; never raises."""
    try:
        elapsed = float(elapsed)
    except (TypeError, ValueError):  # None (or no number at all): nothing measured
        return control_dt
    if not (math.isfinite(elapsed) and elapsed >= 0.0):
        return control_dt
    # Clamp into [low, high] control periods.
    low, high = ELAPSED_BOUNDS_PERIODS
    return min(max(elapsed, low * control_dt), high * control_dt)


@dataclass
class RobotState:
    """What observation terms read, batched over N robots. Privileged fields may be None.

    ``base_quat`` and ``base_ang_vel`` are IMU readings (the IMU frame's orientation and its
    gyro), in simulation from the model's IMU sensors and on the robot from sensor_msgs/Imu, so
    both build the policy observation the same way whatever the IMU's mounting offset.

    Shapes: base_quat [N, 4] (w, x, y, z), base_ang_vel [N, 3] (IMU frame, gyro),
    joint_pos / joint_vel / last_action [N, J], commands [N, 3] (vx, vy, yaw rate),
    base_lin_vel [N, 3] (body frame), base_height [N], foot_contact [N, F],
    friction / added_mass / motor_strength [N], com_offset [N, 3], gait_phase [N] in [0, 1)
    (the robot's own gait clock).
    """

    base_quat: np.ndarray
    base_ang_vel: np.ndarray
    joint_pos: np.ndarray
    joint_vel: np.ndarray
    commands: np.ndarray
    last_action: np.ndarray
    base_lin_vel: Optional[np.ndarray] = None
    base_height: Optional[np.ndarray] = None
    foot_contact: Optional[np.ndarray] = None
    friction: Optional[np.ndarray] = None
    added_mass: Optional[np.ndarray] = None
    com_offset: Optional[np.ndarray] = None
    motor_strength: Optional[np.ndarray] = None
    gait_phase: Optional[np.ndarray] = None


# How a term changes under the robot's left/right mirror (reflection y -> -y of the base
# frame, ``symmetry.RobotMirror``): polar vectors flip y, axial vectors (angular velocity) flip
# x and z, a command (vx, vy, yaw rate) flips vy and yaw rate, joint terms permute and sign per
# joint, foot terms permute, scalars stay, and the gait clock shifts by the mirror's phase.
MIRROR_KINDS = ('polar', 'axial', 'command', 'joints', 'feet', 'scalar', 'phase')


@dataclass(frozen=True)
class ObsTerm:
    """size(num_joints, num_feet) -> int; compute(state, default_joint_pos) -> [N, size];
    ``mirror`` one of :data:`MIRROR_KINDS`."""

    size: Callable[[int, int], int]
    compute: Callable[[RobotState, np.ndarray], np.ndarray]
    privileged: bool
    doc: str
    mirror: str

    def __post_init__(self):
        if self.mirror not in MIRROR_KINDS:
            raise ValueError(f'ObsTerm mirror {self.mirror!r}: expected one of {MIRROR_KINDS}')


def _column(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).reshape(-1, 1)


def _phase(phase: np.ndarray) -> np.ndarray:
    angle = 2.0 * np.pi * np.asarray(phase).reshape(-1, 1)
    return np.concatenate([np.sin(angle), np.cos(angle)], axis=1)


TERMS: dict[str, ObsTerm] = {
    'base_ang_vel': ObsTerm(lambda j, f: 3, lambda s, q0: s.base_ang_vel, False,
                            'gyro, body frame [rad/s]', 'axial'),
    'projected_gravity': ObsTerm(lambda j, f: 3, lambda s, q0: gravity_in_body(s.base_quat),
                                 False, 'unit gravity in the body frame (IMU orientation)',
                                 'polar'),
    'velocity_commands': ObsTerm(lambda j, f: 3, lambda s, q0: s.commands, False,
                                 'commanded vx [m/s], vy [m/s], yaw rate [rad/s]', 'command'),
    'joint_pos': ObsTerm(lambda j, f: j, lambda s, q0: s.joint_pos - q0, False,
                         'joint positions minus the default pose [rad]', 'joints'),
    'joint_vel': ObsTerm(lambda j, f: j, lambda s, q0: s.joint_vel, False,
                         'joint velocities [rad/s]', 'joints'),
    'last_action': ObsTerm(lambda j, f: j, lambda s, q0: s.last_action, False,
                           'the policy output of the previous control step', 'joints'),
    'gait_phase': ObsTerm(lambda j, f: 2, lambda s, q0: _phase(s.gait_phase), False,
                          'sin and cos of the gait clock phase', 'phase'),
    'base_lin_vel': ObsTerm(lambda j, f: 3, lambda s, q0: s.base_lin_vel, True,
                            'true base linear velocity, body frame [m/s]', 'polar'),
    'base_height': ObsTerm(lambda j, f: 1, lambda s, q0: _column(s.base_height), True,
                           'trunk height above the floor [m]', 'scalar'),
    'foot_contact': ObsTerm(lambda j, f: f, lambda s, q0: s.foot_contact, True,
                            '1 where a foot touches the ground', 'feet'),
    'friction': ObsTerm(lambda j, f: 1, lambda s, q0: _column(s.friction), True,
                        'randomised foot friction coefficient', 'scalar'),
    'added_mass': ObsTerm(lambda j, f: 1, lambda s, q0: _column(s.added_mass), True,
                          'randomised payload on the trunk [kg]', 'scalar'),
    'com_offset': ObsTerm(lambda j, f: 3, lambda s, q0: s.com_offset, True,
                          'randomised trunk centre-of-mass shift [m]', 'polar'),
    'motor_strength': ObsTerm(lambda j, f: 1, lambda s, q0: _column(s.motor_strength), True,
                              'randomised PD gain multiplier', 'scalar'),
}


@dataclass(frozen=True)
class ObsSlice:
    """One term's place in a flat observation vector."""

    name: str
    start: int
    size: int
    scale: np.ndarray


class ObservationLayout:
    """Ordered observation terms with scales: builds ``[N, dim]`` float32 observations."""

    def __init__(self, terms: list[tuple[str, float | list[float]]], num_joints: int,
                 num_feet: int, group: str):
        self.group = group
        self.slices: list[ObsSlice] = []
        start = 0
        for name, scale in terms:
            if name not in TERMS:
                raise ValueError(f'observation group {group!r}: unknown term {name!r}; '
                                 f'available: {", ".join(TERMS)}')
            term = TERMS[name]
            if group == 'policy' and term.privileged:
                raise ValueError(f'observation group policy: term {name!r} is simulation-only; '
                                 'move it to the privileged group (the student must run on '
                                 'the real robot)')
            size = term.size(num_joints, num_feet)
            scale_arr = np.broadcast_to(np.asarray(scale, dtype=np.float32), (size,)).copy() \
                if np.ndim(scale) == 0 or len(scale) == size else None
            if scale_arr is None:
                raise ValueError(f'observation group {group!r}: term {name!r} has {size} values '
                                 f'but {len(scale)} scales; give one scale or {size}')
            self.slices.append(ObsSlice(name, start, size, scale_arr))
            start += size
        self.dim = start
        self._terms = [TERMS[s.name].compute for s in self.slices]
        self.scale = np.concatenate([s.scale for s in self.slices]) if self.slices \
            else np.zeros(0, np.float32)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.slices]

    def compute(self, state: RobotState, default_joint_pos: np.ndarray) -> np.ndarray:
        """[N, dim] float32 observation (each term times its scale)."""
        # Each term cast to float32 into its slice, then scaled in place: the bits of
        # concatenate-then-multiply without the temporaries (the policy node runs this per
        # tick).
        out = np.empty((len(state.joint_pos), self.dim), np.float32)
        for s, term in zip(self.slices, self._terms):
            out[:, s.start:s.start + s.size] = term(state, default_joint_pos)
        out *= self.scale
        return out

    def term_vector(self, values: dict[str, float]) -> np.ndarray:
        """[dim] vector holding values[name] on each term's elements (0 for absent terms)."""
        out = np.zeros(self.dim, np.float32)
        for s in self.slices:
            out[s.start:s.start + s.size] = values.get(s.name, 0.0)
        return out

    def to_metadata(self) -> list[dict]:
        """JSON-able description: name, size and scale per term, in order."""
        return [{'name': s.name, 'size': s.size, 'scale': [float(v) for v in s.scale]}
                for s in self.slices]


MAX_HISTORY = 100


def check_history(length: Any, what: str) -> int:
    """``length`` as a history length in 1..MAX_HISTORY; ValueError naming ``what`` if not."""
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) \
            or not 1 <= int(length) <= MAX_HISTORY:
        raise ValueError(f'{what} = {length!r}: expected a whole number of control steps in '
                         f'1..{MAX_HISTORY} (1 = the current observation only)')
    return int(length)


class ObservationHistory:
    """The last ``length`` policy frames of N robots, flattened oldest first, newest last.

    The one definition of the student's memory, shared by the env (batched, frames with noise)
    and the policy node (N = 1, measured frames): ``input [N, length * dim] = frame_{t-length+1}
    .. frame_t``. A robot that starts (an env reset, the node starting to act) sees its first
    frame repeated over the whole window, so the first input is already in the trained range.
    """

    def __init__(self, num: int, length: int, dim: int):
        self.length = check_history(length, 'history length')
        self.dim = dim
        self.frames = np.zeros((num, self.length, dim), np.float32)

    def restart(self, frames: np.ndarray, ids: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Fill the windows of robots ``ids`` with their [k, dim] ``frames``; returns the whole
        [N, length * dim] input."""
        self.frames[ids] = np.asarray(frames, np.float32)[:, None, :]
        return self.flat()

    def push(self, frames: np.ndarray, restart: np.ndarray | None = None) -> np.ndarray:
        """Move every window on by one step with the newest [N, dim] ``frames`` (the robots
        ``restart`` instead start theirs on it); returns the [N, length * dim] input."""
        # Shift left by one frame in place, then write the newest frame last.
        self.frames[:, :-1] = self.frames[:, 1:]
        self.frames[:, -1] = frames
        if restart is not None:
            self.frames[restart] = self.frames[restart, -1:]
        return self.flat()

    def with_newest(self, frames: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """[k, length * dim] inputs of robots ``ids`` had [k, dim] ``frames`` been pushed,
        without changing the windows (the observation a world ended in)."""
        window = np.concatenate([self.frames[ids, 1:], np.asarray(frames, np.float32)[:, None]],
                                axis=1)
        return window.reshape(len(window), -1)

    def flat(self) -> np.ndarray:
        """[N, length * dim] copy of the current inputs."""
        return self.frames.reshape(len(self.frames), -1).copy()
