"""Policy inputs from message-level arrays: validation with drop causes, and observation assembly.

Everything a policy node receives (``JointState``, ``Imu``, ``Twist`` contents as plain arrays)
is checked here before it can reach the policy; a bad message raises :class:`BadInput` with
one of :data:`DROP_CAUSES` and a message naming the field, the value and the fix. Finite is not
enough: a float64 beyond the float32 range (1e39) is finite but becomes inf in the float32
observation, so every value must also lie in a physically plausible range
(:data:`JOINT_POSITION_MARGIN` beyond the URDF limits, :data:`JOINT_SPEED_FACTOR` x the
URDF velocity limit, :data:`GYRO_LIMIT`, :data:`COMMAND_LIMIT`). The valid state is turned
into the policy observation by the robot's own ``ObservationLayout`` (the code path the env
uses), with the node's own last action and gait clock. No ROS imports.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..sim.env_config import EnvConfig
from ..sim.observations import bounded_elapsed, ObservationHistory, RobotState
from ..sim.robot_spec import RobotSpec

# Why an input message was dropped (counted per cause in the diagnostics).
DROP_CAUSES = ('non_finite', 'out_of_range', 'missing_joint', 'unknown_joint', 'wrong_length',
               'bad_imu', 'bad_stamp', 'stale', 'future_stamp', 'clock_mismatch',
               'unsynced_imu', 'no_model', 'malformed')
# The env clips actions to +-clip_actions before they become the last_action observation.
CLIP_ACTIONS = EnvConfig().clip_actions
# An IMU reading counts as "the same tick" as a joint state up to half a control period older.
IMU_SYNC_PERIODS = 0.5
# Plausible ranges: a joint reported further than this beyond its URDF limits [rad] is a sensor
# fault, not a pose (joints have hard stops); joint speeds up to this multiple of the URDF
# velocity limit; gyro rates [rad/s] (a 2000 deg/s MEMS gyro saturates at 35 rad/s); velocity
# commands [m/s, rad/s].
JOINT_POSITION_MARGIN = np.pi
JOINT_SPEED_FACTOR = 10.0
GYRO_LIMIT = 100.0
COMMAND_LIMIT = 10.0
# Stamps and clocks [s]: ROS time beyond this looks like wall time since 1970 (1e8 s is 1973);
# a simulated clock stays below it.
EPOCH_LIKE_S = 1e8


class BadInput(ValueError):
    """An input message that must not reach the policy; ``cause`` is one of DROP_CAUSES."""

    def __init__(self, cause: str, message: str):
        assert cause in DROP_CAUSES, cause
        self.cause = cause
        super().__init__(message)


def _finite(topic: str, field: str, values: np.ndarray, names: Sequence[str] = ()) -> None:
    if np.isfinite(values).all():  # the every-tick path: one ufunc, no index search
        return
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        i = int(bad[0])
        where = f'{field}[{i}]' + (f' ({names[i]})' if i < len(names) else '')
        raise BadInput('non_finite', f'{topic}: {where} = {values[i]!r}; every value must be '
                       'finite')


def _within(topic: str, field: str, values: np.ndarray, low, high, unit: str,
            names: Sequence[str] = ()) -> None:
    """BadInput('out_of_range') naming the first value outside [low, high] (finite values)."""
    if (values >= low).all() and (values <= high).all():
        return
    low, high = np.broadcast_to(low, values.shape), np.broadcast_to(high, values.shape)
    i = int(np.flatnonzero((values < low) | (values > high))[0])
    where = f'{field}[{i}]' + (f' ({names[i]})' if i < len(names) else '')
    raise BadInput('out_of_range', f'{topic}: {where} = {values[i]!r} {unit} is outside the '
                   f'plausible range [{low[i]:.4g}, {high[i]:.4g}]; check the driver (units, '
                   'joint mapping, sensor fault)')


class JointOrder:
    """Maps message joint names onto the spec order, by name (never by index).

    ``output`` is the joint order of published commands (the ``joints`` parameter, a
    permutation of the spec joints); ``to_output`` reorders a [J] spec-order array.
    """

    def __init__(self, robot: RobotSpec, output_joints: Sequence[str] | None = None):
        self.spec = list(robot.joint_names)
        self._index = {name: i for i, name in enumerate(self.spec)}
        output = list(output_joints) if output_joints else list(self.spec)
        if sorted(output) != sorted(self.spec):
            missing = sorted(set(self.spec) - set(output))
            extra = sorted(set(output) - set(self.spec))
            raise ValueError(f'joints parameter {output} must list each joint of robot '
                             f'{robot.name!r} exactly once (missing {missing}, unknown or '
                             f'repeated {extra or "duplicates"}); spec order: {self.spec}')
        self.output = output
        self.output_index = np.array([self._index[n] for n in output])
        self.pos_low = robot.joint_lower - JOINT_POSITION_MARGIN
        self.pos_high = robot.joint_upper + JOINT_POSITION_MARGIN
        self.max_speed = JOINT_SPEED_FACTOR * robot.velocity_limit
        self._cached_names: tuple[str, ...] | None = None
        self._cached_index: np.ndarray | None = None

    def to_output(self, spec_values: np.ndarray) -> np.ndarray:
        """[J] values in spec order -> [J] values in ``output`` order."""
        return spec_values[self.output_index]

    def from_output(self, output_values: np.ndarray) -> np.ndarray:
        """[J] values in ``output`` order -> [J] values in spec order."""
        out = np.empty_like(output_values)
        out[self.output_index] = output_values
        return out

    def message_index(self, topic: str, names: Sequence[str]) -> np.ndarray:
        """[J] index into the message arrays of each spec joint; BadInput for bad names."""
        key = tuple(names)
        if key == self._cached_names:
            return self._cached_index
        unknown = [n for n in key if n not in self._index]
        repeated = sorted({n for n in key if key.count(n) > 1})
        if unknown or repeated:
            raise BadInput('unknown_joint', f'{topic}: name has joints {unknown + repeated} '
                           f'that are unknown or repeated; robot joints are {self.spec}')
        missing = [n for n in self.spec if n not in key]
        if missing:
            raise BadInput('missing_joint', f'{topic}: name lacks joints {missing}; publish '
                           f'every joint of {self.spec}')
        index = np.array([key.index(n) for n in self.spec])
        self._cached_names, self._cached_index = key, index
        return index

    def joint_arrays(self, names: Sequence[str], position: Sequence[float],
                     velocity: Sequence[float], topic: str = 'joint_states'
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Validated ([J] position, [J] velocity) in spec order from JointState fields."""
        pos, vel = _floats(topic, 'position', position), _floats(topic, 'velocity', velocity)
        if pos.shape != (len(names),) or vel.shape != (len(names),):
            raise BadInput('wrong_length', f'{topic}: {len(names)} names but {pos.size} '
                           f'positions and {vel.size} velocities; give one of each per name')
        index = self.message_index(topic, names)
        pos, vel = pos[index], vel[index]
        _finite(topic, 'position', pos, self.spec)
        _finite(topic, 'velocity', vel, self.spec)
        _within(topic, 'position', pos, self.pos_low, self.pos_high, 'rad', self.spec)
        _within(topic, 'velocity', vel, -self.max_speed, self.max_speed, 'rad/s', self.spec)
        return pos, vel


def _floats(topic: str, field: str, values) -> np.ndarray:
    """A flat float64 array of a message field; BadInput('wrong_length') if it is none."""
    try:
        out = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise BadInput('wrong_length', f'{topic}: {field} is not a sequence of numbers '
                       f'({exc})') from None
    return out


def imu_arrays(orientation_xyzw: Sequence[float], angular_velocity: Sequence[float],
               topic: str = 'imu') -> tuple[np.ndarray, np.ndarray]:
    """Validated ([4] unit quaternion w, x, y, z; [3] gyro rad/s) from Imu fields (ROS x,y,z,w)."""
    q = _floats(topic, 'orientation', orientation_xyzw)
    gyro = _floats(topic, 'angular_velocity', angular_velocity)
    if q.shape != (4,) or gyro.shape != (3,):
        raise BadInput('wrong_length', f'{topic}: orientation has {q.size} values and '
                       f'angular_velocity {gyro.size}; expected 4 and 3')
    _finite(topic, 'orientation', q)
    _finite(topic, 'angular_velocity', gyro)
    _within(topic, 'angular_velocity', gyro, -GYRO_LIMIT, GYRO_LIMIT, 'rad/s')
    # A component beyond 1.1 fails the norm test anyway; checked first, the norm cannot overflow.
    norm = float(np.linalg.norm(q)) if np.abs(q).max() <= 1.1 else float('inf')
    if not 0.9 < norm < 1.1:
        raise BadInput('bad_imu', f'{topic}: orientation {q.tolist()} has norm {norm:.3g}; a '
                       'unit quaternion (x, y, z, w) is required')
    # ROS orders quaternions (x, y, z, w); MuJoCo and RobotState use (w, x, y, z).
    return np.array([q[3], q[0], q[1], q[2]]) / norm, gyro


def command_array(linear_x: float, linear_y: float, angular_z: float,
                  topic: str = 'cmd_vel') -> np.ndarray:
    """Validated [3] velocity command (vx m/s, vy m/s, yaw rate rad/s)."""
    try:
        cmd = np.array([linear_x, linear_y, angular_z], dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise BadInput('wrong_length', f'{topic}: not three numbers ({exc})') from None
    _finite(topic, '(linear.x, linear.y, angular.z)', cmd)
    _within(topic, '(linear.x, linear.y, angular.z)', cmd, -COMMAND_LIMIT, COMMAND_LIMIT,
            'm/s or rad/s')
    return cmd


def check_fresh(topic: str, stamp: float, now: float, max_age: float,
                clock: str = 'unknown') -> None:
    """BadInput when a message stamped ``stamp`` is not within ``max_age`` of ``now``.

    Causes: ``bad_stamp`` (not finite), ``clock_mismatch`` (one of the two looks like wall time
    and the other does not: a ``use_sim_time`` mismatch, named with the fix; ``clock`` is the
    node's: ``sim``, ``wall`` or ``unknown``), ``stale`` (too old), ``future_stamp`` (ahead
    of the node's clock by more than ``max_age``).
    """
    if not (np.isfinite(stamp) and np.isfinite(now)):
        raise BadInput('bad_stamp', f'{topic}: stamp {stamp!r} at node time {now!r}; stamps '
                       'must be finite')
    age = now - stamp
    if abs(age) <= max_age:
        return
    mismatch = clock_mismatch(topic, stamp, now, clock)
    if mismatch:
        raise BadInput('clock_mismatch', mismatch)
    if age > max_age:
        raise BadInput('stale', f'{topic}: stamp {stamp:.3f} s is {age * 1e3:.1f} ms old at '
                       f'{now:.3f} s (limit {max_age * 1e3:.1f} ms = stale_after_periods x '
                       'control period); check the publisher and use_sim_time')
    raise BadInput('future_stamp', f'{topic}: stamp {stamp:.3f} s is {-age * 1e3:.1f} ms ahead '
                   f'of the node clock {now:.3f} s (limit {max_age * 1e3:.1f} ms); the '
                   "publisher's clock is ahead of this node's (clock sync, use_sim_time)")


def clock_mismatch(topic: str, stamp: float, now: float, clock: str) -> str | None:
    """The fix when ``stamp`` and the node clock ``now`` run on different clocks, else None."""
    stamp_wall, now_wall = stamp > EPOCH_LIKE_S, now > EPOCH_LIKE_S
    if clock == 'sim' and now == 0.0:
        return (f'{topic}: stamp {stamp:.3f} s but this node runs on /clock (use_sim_time '
                'true) and has received none: start the simulator\'s /clock, or set '
                'use_sim_time false on this node')
    if stamp_wall == now_wall:
        return None
    kinds = ('wall time' if stamp_wall else 'simulated time', 'wall time' if now_wall
             else 'simulated time')
    fix = ('set use_sim_time false on this node (or stamp the state with /clock)' if stamp_wall
           else 'set use_sim_time true on this node (the publisher stamps with /clock)')
    return (f'{topic}: stamps are {kinds[0]} ({stamp:.3f} s) but this node\'s clock is '
            f'{kinds[1]} ({now:.3f} s, use_sim_time {clock == "sim"}): {fix}')


class ObservationAssembler:
    """The policy observation from measured arrays, plus the node's own last action and clock.

    Mirrors the env: ``obs_t`` reads the gait phase and the previous action; after acting,
    :meth:`advance` stores the action and moves the phase on by the time the tick stood for:
    the measured time since the previous acted-on state (bounded, :func:`bounded_elapsed`), so
    a robot whose states come at 48 or 52 Hz keeps its gait in phase with real time; one
    control period when that is unknown. A model that reads ``obs_history`` frames
    (:meth:`set_history`) gets its window from :meth:`model_input`, the env's
    :class:`~..sim.observations.ObservationHistory`: the frames it acted on, tick after tick; a
    tick it did not act on (hold, fault, no model) restarts the window at the next frame, as an
    env reset does.
    """

    def __init__(self, robot: RobotSpec, action_clip: float = CLIP_ACTIONS):
        self.robot = robot
        self.action_clip = action_clip  # the model's trained clip (its action_clip metadata)
        self.commands = np.zeros((1, 3))
        self.last_action = np.zeros((1, robot.num_joints))
        self.gait_phase = np.zeros(1)
        self.history: ObservationHistory | None = None
        self._fresh = True  # the next acted-on frame starts the window

    def set_history(self, length: int) -> None:
        """Serve a model reading ``length`` frames (its ``obs_history``); a new length starts
        a new window, the same one keeps it (a hot swap between students of one kind)."""
        current = 1 if self.history is None else self.history.length
        if length == current:
            return
        self.history = None if length == 1 else \
            ObservationHistory(1, length, self.robot.policy_obs.dim)
        self._fresh = True

    def model_input(self, frame: np.ndarray) -> np.ndarray:
        """[obs_history * obs_dim] float32 the model reads with [obs_dim] ``frame`` as the
        newest (the window is not moved on: :meth:`advance` does that for the acted-on one)."""
        history = self.history
        if history is None:
            return frame
        if self._fresh:
            return np.tile(frame, history.length)
        return history.with_newest(frame[None], np.zeros(1, np.int64))[0]

    def set_command(self, cmd: np.ndarray) -> None:
        """[3] (vx, vy, yaw rate) used by every following observation."""
        self.commands[0] = cmd

    def observe(self, joint_pos: np.ndarray, joint_vel: np.ndarray, base_quat: np.ndarray,
                base_ang_vel: np.ndarray) -> np.ndarray:
        """[obs_dim] float32 policy observation from [J] pos/vel (spec order), [4] quat
        (w, x, y, z) and [3] gyro, through the robot's ObservationLayout."""
        r = self.robot
        state = RobotState(base_quat=base_quat[None], base_ang_vel=base_ang_vel[None],
                           joint_pos=joint_pos[None], joint_vel=joint_vel[None],
                           commands=self.commands, last_action=self.last_action,
                           gait_phase=self.gait_phase)
        return r.policy_obs.compute(state, r.default_joint_pos)[0]

    def advance(self, action: np.ndarray | None, frame: np.ndarray | None = None,
                elapsed: float | None = None) -> None:
        """After a control tick: remember [J] ``action`` (None = default pose = action 0) and
        the [obs_dim] ``frame`` it was computed from (None with an action: unknown, the window
        restarts), and advance the gait clock by ``elapsed`` [s], the measured time since the
        previous acted-on state, bounded by :func:`bounded_elapsed` (None, non-finite or
        negative: one control period)."""
        r = self.robot
        if action is None:
            self.last_action[0] = 0.0
        else:
            self.last_action[0] = np.clip(action, -self.action_clip, self.action_clip)
        if self.history is not None:
            if action is None or frame is None:
                self._fresh = True
            elif self._fresh:
                self.history.restart(frame[None])
                self._fresh = False
            else:
                self.history.push(frame[None])
        if r.gait_period > 0:
            # phase += (bounded elapsed time) / gait period, wrapped into [0, 1).
            step = bounded_elapsed(elapsed, r.control_dt) / r.gait_period
            self.gait_phase = (self.gait_phase + step) % 1.0

    def reset(self) -> None:
        """Forget the last action and the observation window, and restart the gait clock."""
        self.last_action[:] = 0.0
        self.gait_phase[:] = 0.0
        self._fresh = True
