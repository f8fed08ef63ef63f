"""``claw-rl stand-pose``: a default pose that stands the trunk at a given height with each foot
under its hip, printed as YAML for the robot YAML's ``default_joint_pos``.

The robot is the MuJoCo scene built from its URDF, the trunk upright with its origin at the
asked height (as the standing height is measured). A foot's hip is the anchor of the first
joint on its leg, from the trunk, that pitches the leg (axis within 45 degrees of the trunk's
y axis), else of the leg's first joint. Each foot gives three equations: its collision geoms'
centre under its hip in x and y, its lowest point on the ground. The legs' joints are solved
together by damped Gauss-Newton (Levenberg-Marquardt, finite-difference Jacobian) within their
URDF limits, from the robot YAML's own default pose, so the knees bend the way they bend there;
joints on no leg keep their default. A height the feet cannot reach is refused, naming the
height the legs get nearest to.
"""

from __future__ import annotations

from dataclasses import dataclass
import math
import textwrap

import mujoco
import numpy as np

from ..config import ConfigError
from .robot_spec import RobotSpec
from .scene import build_model, joint_addresses, lowest_foot_points, standing_qpos

# The highest trunk height asked about [m]: far above any legged robot, and low enough that
# the solver's distances keep their precision (at 1e308 m the reach was printed as 0 m).
MAX_HEIGHT_M = 100.0
# A foot this far [m] from its target at the solution is out of reach.
REACH_TOL_M = 1e-3
PITCH_AXIS_COS = math.cos(math.radians(45.0))


@dataclass
class StandPose:
    """A solved stand pose: joint angles [J] in ``joint_names`` order, the trunk height [m] and
    how far [m] each foot (``foot_bodies`` order) ended from under its hip (x, y) and from the
    ground (z): [F, 3]."""

    robot: str
    height: float
    joint_names: list[str]
    joint_pos: np.ndarray
    foot_bodies: list[str]
    foot_error: np.ndarray

    def to_yaml(self) -> str:
        """The pose as a robot-YAML line (wrapped at 99 columns), after a comment naming it."""
        head = 'default_joint_pos: ['
        values = ', '.join(f'{round(v, 4) + 0.0:.4f}' for v in self.joint_pos) + ']'
        body = textwrap.fill(values, width=99, initial_indent=head,
                             subsequent_indent=' ' * len(head), break_long_words=False)
        notes = ''.join(
            f'# {foot}: {1000 * np.hypot(*e[:2]):.0f} mm from under its hip (its leg cannot '
            'move it there)\n' for foot, e in zip(self.foot_bodies, self.foot_error)
            if np.hypot(*e[:2]) > REACH_TOL_M)
        return (f'# {self.robot}: trunk origin {self.height:.3f} m above the ground, each foot '
                f'under its hip\n# (claw-rl stand-pose; joint order: joint_names)\n{notes}'
                f'{body}')


class _Legs:
    """The scene at trunk height ``height``: the legs' joints and each foot's residual."""

    def __init__(self, robot: RobotSpec, height: float):
        self.robot, self.model = robot, build_model(robot)
        self.data = mujoco.MjData(self.model)
        self.qpos = standing_qpos(self.model, robot)
        self.qpos[0:3] = [0.0, 0.0, height]
        self.qadr, _ = joint_addresses(self.model, robot)
        self.joint_ids = [self.model.joint(n).id for n in robot.joint_names]
        self.chains = [self._chain(foot) for foot in robot.foot_bodies]
        self.free = np.unique(np.concatenate(self.chains)).astype(int)
        self.feet_geoms = [self._collision_geoms(foot) for foot in robot.foot_bodies]
        self.kinematics(robot.default_joint_pos)
        self.hips = [self._hip(chain) for chain in self.chains]

    def _chain(self, foot: str) -> np.ndarray:
        """Indices (robot joint order) of the joints between the trunk and ``foot``, trunk
        first."""
        m, base = self.model, self.model.body(self.robot.base_body).id
        index = {j: i for i, j in enumerate(self.joint_ids)}
        chain, body = [], m.body(foot).id
        while body not in (0, base):
            adr, num = m.body_jntadr[body], m.body_jntnum[body]
            chain[:0] = [index[j] for j in range(adr, adr + num) if j in index]
            body = m.body_parentid[body]
        if not chain:
            raise ConfigError(self.robot.source.get('config', 'robot'), 'foot_bodies',
                              f'{foot!r}: no joint of joint_names moves it; name the foot links')
        return np.asarray(chain)

    def _collision_geoms(self, foot: str) -> np.ndarray:
        m, body = self.model, self.model.body(foot).id
        return np.array([g for g in range(m.ngeom)
                         if m.geom_bodyid[g] == body and m.geom_conaffinity[g]])

    def _hip(self, chain: np.ndarray) -> int:
        """The model joint id of the leg's first pitching joint (else its first joint)."""
        for i in chain:
            if abs(self.data.xaxis[self.joint_ids[i], 1]) >= PITCH_AXIS_COS:
                return self.joint_ids[i]
        return self.joint_ids[chain[0]]

    def kinematics(self, q: np.ndarray) -> None:
        self.qpos[self.qadr] = q
        self.data.qpos[:] = self.qpos
        mujoco.mj_kinematics(self.model, self.data)

    def errors(self, q: np.ndarray) -> np.ndarray:
        """[F, 3] each foot's (x, y) from under its hip and its lowest point's height."""
        self.kinematics(q)
        d = self.data
        low = lowest_foot_points(self.model, d, self.robot)
        out = np.empty((len(self.hips), 3))
        for f, (hip, geoms) in enumerate(zip(self.hips, self.feet_geoms)):
            out[f, :2] = d.geom_xpos[geoms, :2].mean(axis=0) - d.xanchor[hip, :2]
            out[f, 2] = low[f]
        return out


def _solve(legs: _Legs, q0: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """Levenberg-Marquardt on the legs' joints (``legs.free``), kept within their limits."""
    q, free, eps, lam = q0.copy(), legs.free, 1e-6, 1e-3

    def residual(x):
        return legs.errors(x).ravel()
    r = residual(q)
    for _ in range(200):
        if np.abs(r).max() < 1e-7:
            break
        jac = np.empty((r.size, free.size))
        for k, i in enumerate(free):  # central differences, one joint at a time
            step = np.zeros_like(q)
            step[i] = eps
            jac[:, k] = (residual(q + step) - residual(q - step)) / (2 * eps)
        # (J^T J + lam I) dq = -J^T r; a worse step raises the damping, a better one lowers it
        while lam < 1e8:
            dq = np.linalg.solve(jac.T @ jac + lam * np.eye(free.size), -jac.T @ r)
            trial = q.copy()
            trial[free] = np.clip(q[free] + dq, lower[free], upper[free])
            r_trial = residual(trial)
            if r_trial @ r_trial < r @ r:
                q, r, lam = trial, r_trial, max(lam / 3, 1e-9)
                break
            lam *= 4
        else:
            break  # no step lowers the error: as close as the limits allow
        if np.abs(dq).max() < 1e-10:
            break
    return q


def stand_pose(robot: RobotSpec, height: float) -> StandPose:
    """The pose with the trunk's origin ``height`` [m] above the ground and each foot under its
    hip; ConfigError naming ``--height`` when no pose within the joint limits reaches it."""
    if not 0 < height <= MAX_HEIGHT_M:
        raise ConfigError('command line', '--height', f'{height!r}; give the trunk origin\'s '
                          f'height above the ground in metres (> 0, <= {MAX_HEIGHT_M:g})')
    legs = _Legs(robot, height)
    # Start inside the limits, so a straight knee at a limit still knows which way it bends.
    margin = 0.01 * (robot.joint_upper - robot.joint_lower)
    start = np.clip(robot.default_joint_pos, robot.joint_lower + margin,
                    robot.joint_upper - margin)
    q = _solve(legs, start, robot.joint_lower, robot.joint_upper)
    error = legs.errors(q)
    f = int(np.abs(error[:, 2]).argmax())
    dz = float(error[f, 2])
    if abs(dz) > REACH_TOL_M:
        way = ('above the ground: the legs are stretched as far as their limits let them; try '
               f'at most {height - dz:.3f} m') if dz > 0 else (
            'below the ground: the legs fold no further within their limits; try at least '
            f'{height - dz:.3f} m')
        raise ConfigError('command line', '--height', f'{height:g} m is out of reach for '
                          f'{robot.name}: foot {robot.foot_bodies[f]!r} stays '
                          f'{abs(dz) * 1000:.0f} mm {way}')
    return StandPose(robot.name, height, list(robot.joint_names), q, list(robot.foot_bodies),
                     error)
