"""Policy inputs from message-level arrays: validation with drop causes, and observation assembly.

Everything a policy node receives (``JointState``, ``Imu``, ``Twist`` contents as plain arrays)
is checked here before it can reach the policy; a bad message raises :class:`BadInput` with
one of :data:`DROP_CAUSES` and a message naming the field, the value and the fix. The valid
state is turned into the policy observation by the robot's own ``ObservationLayout`` (the code
path the env uses), with the node's own last action and gait clock. No ROS imports.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..sim.observations import RobotState
from ..sim.robot import RobotSpec
from ..sim.env_config import EnvConfig

# Why an input message was dropped (counted per cause in the diagnostics).
DROP_CAUSES = ('non_finite', 'missing_joint', 'unknown_joint', 'wrong_length', 'bad_imu',
               'stale', 'no_model')
# The env clips actions to +-clip_actions before they become the last_action observation.
CLIP_ACTIONS = EnvConfig().clip_actions
# An IMU reading counts as "the same tick" as a joint state up to half a control period older.
IMU_SYNC_PERIODS = 0.5


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
        pos = np.asarray(position, dtype=np.float64)
        vel = np.asarray(velocity, dtype=np.float64)
        if pos.shape != (len(names),) or vel.shape != (len(names),):
            raise BadInput('wrong_length', f'{topic}: {len(names)} names but {pos.size} '
                           f'positions and {vel.size} velocities; give one of each per name')
        index = self.message_index(topic, names)
        pos, vel = pos[index], vel[index]
        _finite(topic, 'position', pos, self.spec)
        _finite(topic, 'velocity', vel, self.spec)
        return pos, vel


def imu_arrays(orientation_xyzw: Sequence[float], angular_velocity: Sequence[float],
               topic: str = 'imu') -> tuple[np.ndarray, np.ndarray]:
    """Validated ([4] unit quaternion w, x, y, z; [3] gyro rad/s) from Imu fields (ROS x,y,z,w)."""
    q = np.asarray(orientation_xyzw, dtype=np.float64)
    gyro = np.asarray(angular_velocity, dtype=np.float64)
    if q.shape != (4,) or gyro.shape != (3,):
        raise BadInput('wrong_length', f'{topic}: orientation has {q.size} values and '
                       f'angular_velocity {gyro.size}; expected 4 and 3')
    _finite(topic, 'orientation', q)
    _finite(topic, 'angular_velocity', gyro)
    norm = float(np.linalg.norm(q))
    if not 0.9 < norm < 1.1:
        raise BadInput('bad_imu', f'{topic}: orientation {q.tolist()} has norm {norm:.3g}; a '
                       'unit quaternion (x, y, z, w) is required')
    # ROS orders quaternions (x, y, z, w); MuJoCo and RobotState use (w, x, y, z).
    return np.array([q[3], q[0], q[1], q[2]]) / norm, gyro


def command_array(linear_x: float, linear_y: float, angular_z: float,
                  topic: str = 'cmd_vel') -> np.ndarray:
    """Validated [3] velocity command (vx m/s, vy m/s, yaw rate rad/s)."""
    cmd = np.array([linear_x, linear_y, angular_z], dtype=np.float64)
    _finite(topic, '(linear.x, linear.y, angular.z)', cmd)
    return cmd


def check_fresh(topic: str, stamp: float, now: float, max_age: float) -> None:
    """BadInput('stale') when a message stamped ``stamp`` is older than ``max_age`` at ``now``."""
    age = now - stamp
    if age > max_age:
        raise BadInput('stale', f'{topic}: stamp {stamp:.3f} s is {age * 1e3:.1f} ms old at '
                       f'{now:.3f} s (limit {max_age * 1e3:.1f} ms = stale_after_periods x '
                       'control period); check the publisher and use_sim_time')


class ObservationAssembler:
    """The policy observation from measured arrays, plus the node's own last action and clock.

    Mirrors the env: ``obs_t`` reads the gait phase and the previous action; after acting,
    :meth:`advance` stores the action and moves the phase on by one control period.
    """

    def __init__(self, robot: RobotSpec):
        self.robot = robot
        self.commands = np.zeros((1, 3))
        self.last_action = np.zeros((1, robot.num_joints))
        self.gait_phase = np.zeros(1)

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

    def advance(self, action: np.ndarray | None) -> None:
        """After a control tick: remember [J] ``action`` (None = default pose = action 0) and
        advance the gait clock by one control period."""
        r = self.robot
        if action is None:
            self.last_action[0] = 0.0
        else:
            self.last_action[0] = np.clip(action, -CLIP_ACTIONS, CLIP_ACTIONS)
        if r.gait_period > 0:
            self.gait_phase = (self.gait_phase + r.control_dt / r.gait_period) % 1.0

    def reset(self) -> None:
        """Forget the last action and restart the gait clock."""
        self.last_action[:] = 0.0
        self.gait_phase[:] = 0.0
