"""The robot's left/right mirror: joints, feet, gait clock and every observation term.

A mirror is the reflection ``y -> -y`` of the base frame (the sagittal plane). The robot YAML
names it by a name swap (``mirror.swap: {FL_: FR_, RL_: RR_}``); everything else is derived from
the model built from the URDF at its zero pose and checked there: joint ``i`` maps onto the
joint whose name the swap gives, with sign +1 when its axis is the reflected axis of ``i``
(``a_j = -M a_i``: an axial vector) and -1 when it is its opposite, anchors, link masses and
centres of mass must mirror, and limits, default pose, gains and the gait offsets must agree.
A robot whose YAML or URDF is not symmetric is refused with the field and the joint or link
that breaks it.

The mirror of a state ``s`` is ``s'`` with joint value ``q'_i = sign_i q_{index_i}``, foot
values ``f'_k = f_{foot_index_k}``, and gait phase ``phase + gait_shift``; an observation term
mirrors by its kind (``observations.MIRROR_KINDS``). Each map is a signed permutation, its own
inverse (mirroring twice is the identity).
"""

from __future__ import annotations

from typing import Any

import mujoco
import numpy as np

from ..config import ConfigError
from .mirror import RobotMirror, SignedPermutation
from .observations import HEIGHT_SCAN, POLICY, POLICY_NOISE_FREE, PRIVILEGED
from .robot_spec import RobotSpec
from .scene import build_model, IMU_SITE, joint_addresses
from .terrain import scan_offsets

# The reflection of the sagittal plane (base frame).
REFLECT = np.diag([1.0, -1.0, 1.0])
# How far mirrored anchors and centres of mass may lie apart [m], relative values may differ.
POSITION_TOL = 1e-3
VALUE_TOL = 1e-5


def scan_mirror(offsets: np.ndarray) -> SignedPermutation:
    """Mirror of a height scan over [K, 2] points (x, y) in the base's yaw frame: point k takes
    the height at (x_k, -y_k), which must be a point of the grid."""
    mirrored = offsets * np.array([1.0, -1.0])
    dist = np.linalg.norm(offsets[None, :, :] - mirrored[:, None, :], axis=-1)
    index = dist.argmin(axis=1)
    scale = max(float(np.abs(offsets).max()), 1.0)
    if np.any(dist[np.arange(len(offsets)), index] > 1e-6 * scale):
        raise ValueError('the height scan grid is not symmetric about the base x axis; centre it '
                         'on the base (terrain.height_scan width / spacing)')
    return SignedPermutation(index.astype(np.int64), np.ones(len(offsets), np.float32))


def env_group_mirrors(robot: RobotSpec, env_cfg: Any) -> dict[str, SignedPermutation]:
    """{group: mirror} of every observation group the env built from ``env_cfg`` returns
    (``observations.observation_dims``); ValueError when the robot has no mirror."""
    mirror = robot.mirror
    if mirror is None:
        raise ValueError(f'robot {robot.name!r} declares no mirror; add mirror.swap (left/right '
                         'name parts, e.g. {FL_: FR_, RL_: RR_}) to its YAML')
    policy = mirror.layout(robot.policy_obs)
    # A history window mirrors frame by frame.
    out = {POLICY: SignedPermutation.concat([policy] * env_cfg.policy_history),
           POLICY_NOISE_FREE: policy,
           PRIVILEGED: mirror.layout(robot.privileged_obs)}
    scan = env_cfg.terrain.height_scan
    if env_cfg.terrain.enabled and scan.enabled:
        out[HEIGHT_SCAN] = scan_mirror(scan_offsets(scan, robot.standing_height))
    return out


def swap_name(name: str, swap: dict[str, str]) -> str:
    """``name`` with its first left/right part swapped both ways (``FL_hip`` <-> ``FR_hip``);
    names with none of them (``trunk``) mirror onto themselves."""
    for left, right in swap.items():
        if left in name:
            return name.replace(left, right)
        if right in name:
            return name.replace(right, left)
    return name


def _check_swap(swap: dict[str, str], source: str) -> None:
    parts = list(swap) + list(swap.values())
    if any(not isinstance(p, str) or not p for p in parts) or len(set(parts)) != len(parts):
        raise ConfigError(source, 'mirror.swap', f'{swap} must map distinct, non-empty name '
                          'parts (left: right), e.g. {FL_: FR_, RL_: RR_}')


def derive_mirror(robot: RobotSpec, swap: dict[str, str], source: str) -> RobotMirror:
    """The mirror named by ``swap``, derived from and checked against the robot's model.

    A robot with an overlay (identified drives, ``robot.source['overlay']``) is mirrored by its
    geometry, limits and pose alone: a real robot's drives may differ left and right."""
    _check_swap(swap, source)
    model = build_model(robot)
    data = mujoco.MjData(model)
    index = []
    for name in robot.joint_names:
        partner = swap_name(name, swap)
        if partner not in robot.joint_names:
            raise ConfigError(source, 'mirror.swap', f'joint {name!r} mirrors to {partner!r}, '
                              'which is not in joint_names; every actuated joint needs its '
                              'mirrored partner (or a name without a swapped part)')
        index.append(robot.joint_names.index(partner))
    joint_index = np.asarray(index, np.int64)
    if np.array_equal(joint_index, np.arange(len(index))):
        raise ConfigError(source, 'mirror.swap', f'{swap} matches no joint name (joints: '
                          f'{robot.joint_names[0]!r}, ...); give the name parts that tell left '
                          'from right')
    # The zero pose with the base at the origin: axes and anchors in the base frame.
    data.qpos[:] = model.qpos0
    data.qpos[0:7] = [0, 0, 0, 1, 0, 0, 0]
    mujoco.mj_kinematics(model, data)
    ids = [model.joint(n).id for n in robot.joint_names]
    axes, anchors = data.xaxis[ids].copy(), data.xanchor[ids].copy()
    sign = np.zeros(len(ids))
    for i, j in enumerate(joint_index):
        a, b = robot.joint_names[i], robot.joint_names[j]
        # A joint axis is an axial vector: the mirror of axis a is -M a.
        reflected = -REFLECT @ axes[i]
        if np.allclose(axes[j], reflected, atol=1e-3):
            sign[i] = 1.0
        elif np.allclose(axes[j], -reflected, atol=1e-3):
            sign[i] = -1.0
        else:
            raise ConfigError(source, 'mirror.swap', f'joint {b!r} axis {axes[j].round(3)} is '
                              f'not the mirror of joint {a!r} axis {axes[i].round(3)} '
                              f'(expected +-{reflected.round(3)}) in the URDF')
        if np.linalg.norm(anchors[j] - REFLECT @ anchors[i]) > POSITION_TOL:
            raise ConfigError(source, 'mirror.swap', f'joint {b!r} anchor {anchors[j].round(4)} '
                              f'[m] is not the mirror of joint {a!r} anchor '
                              f'{anchors[i].round(4)} in the URDF (more than 1 mm apart)')
    # The IMU's gyro and orientation mirror as the base's when its frame is symmetric itself:
    # x and z axes in the sagittal plane (M R M = R).
    imu = data.site_xmat[model.site(IMU_SITE).id].reshape(3, 3)
    if not np.allclose(REFLECT @ imu @ REFLECT, imu, atol=1e-3):
        raise ConfigError(source, 'imu_body', f'the IMU frame of {robot.imu_body!r} (rotation '
                          f'{imu.round(3).tolist()} in the base frame) is not symmetric about '
                          'the sagittal plane, so its readings do not mirror like the base\'s; '
                          'remove mirror.swap for this robot')
    dofs = model.jnt_dofadr[ids]
    _check_joint_values(robot, joint_index, sign, source,
                        {'joint damping (URDF)': model.dof_damping[dofs],
                         'joint friction (URDF)': model.dof_frictionloss[dofs]},
                        drives='overlay' not in robot.source)
    foot_index = _mirror_bodies(robot, model, data, swap, source)
    qadr, _ = joint_addresses(model, robot)
    data.qpos[qadr] = robot.default_joint_pos
    mujoco.mj_kinematics(model, data)
    feet = np.array([data.xpos[model.body(f).id] for f in robot.foot_bodies])
    for k, m in enumerate(foot_index):
        if np.linalg.norm(feet[m] - REFLECT @ feet[k]) > POSITION_TOL:
            raise ConfigError(source, 'default_joint_pos', f'at the default pose foot '
                              f'{robot.foot_bodies[m]!r} is not the mirror of '
                              f'{robot.foot_bodies[k]!r} (more than 1 mm apart)')
    return RobotMirror(joint_index, sign, foot_index, _gait_shift(robot, foot_index, source))


def _check_joint_values(robot: RobotSpec, index: np.ndarray, sign: np.ndarray, source: str,
                        dynamics: dict[str, np.ndarray], drives: bool = True) -> None:
    """Limits, default pose, gains and joint dynamics [J] of mirrored joints must agree
    (gains and dynamics only when ``drives``)."""
    lower, upper = robot.joint_lower, robot.joint_upper
    # Sign -1 mirrors [lo, hi] onto [-hi, -lo].
    mirrored_lower = np.where(sign > 0, lower[index], -upper[index])
    mirrored_upper = np.where(sign > 0, upper[index], -lower[index])
    checks = [('joint limits (URDF lower)', lower, mirrored_lower),
              ('joint limits (URDF upper)', upper, mirrored_upper),
              ('default_joint_pos', robot.default_joint_pos,
               sign * robot.default_joint_pos[index]),
              ('effort limit (URDF)', robot.effort_limit, robot.effort_limit[index]),
              ('velocity limit (URDF)', robot.velocity_limit, robot.velocity_limit[index])]
    if drives:
        checks += [('stiffness', robot.kp, robot.kp[index]),
                   ('damping', robot.kd, robot.kd[index])]
        checks += [(what, values, values[index]) for what, values in dynamics.items()]
    for what, values, mirrored in checks:
        bad = np.flatnonzero(~np.isclose(values, mirrored, rtol=VALUE_TOL, atol=VALUE_TOL,
                                         equal_nan=True))
        if len(bad):
            i = bad[0]
            raise ConfigError(source, 'mirror.swap', f'{what}: joint {robot.joint_names[i]!r} '
                              f'has {values[i]:g}, its mirror {robot.joint_names[index[i]]!r} '
                              f'gives {mirrored[i]:g} (sign {sign[i]:+g}); make the robot '
                              'symmetric or remove mirror.swap')


def _mirror_bodies(robot: RobotSpec, model: mujoco.MjModel, data: mujoco.MjData,
                   swap: dict[str, str], source: str) -> np.ndarray:
    """Foot permutation [F]; every link must have a mirrored partner of the same mass, centre
    of mass mirrored (zero pose), and the contact lists must be closed under the mirror."""
    for b in range(1, model.nbody):
        name = model.body(b).name
        partner = swap_name(name, swap)
        try:
            p = model.body(partner).id
        except KeyError:
            raise ConfigError(source, 'mirror.swap', f'link {name!r} mirrors to {partner!r}, '
                              'which is not a link of the URDF') from None
        if not np.isclose(model.body_mass[b], model.body_mass[p], rtol=1e-3, atol=1e-6) or \
                np.linalg.norm(data.xipos[p] - REFLECT @ data.xipos[b]) > POSITION_TOL:
            raise ConfigError(source, 'mirror.swap', f'link {partner!r} (mass '
                              f'{model.body_mass[p]:g} kg, centre of mass '
                              f'{data.xipos[p].round(4)}) is not the mirror of {name!r} (mass '
                              f'{model.body_mass[b]:g} kg, {data.xipos[b].round(4)}) in the '
                              'URDF')
    for key in ('penalised_contact_bodies', 'termination_contact_bodies'):
        bodies = getattr(robot, key)
        for body in bodies:
            if swap_name(body, swap) not in bodies:
                raise ConfigError(source, key, f'{body!r} is listed but its mirror '
                                  f'{swap_name(body, swap)!r} is not; list both')
    feet = robot.foot_bodies
    missing = [f for f in feet if swap_name(f, swap) not in feet]
    if missing:
        raise ConfigError(source, 'foot_bodies', f'{missing[0]!r} is listed but its mirror '
                          f'{swap_name(missing[0], swap)!r} is not; list both')
    return np.array([feet.index(swap_name(f, swap)) for f in feet], np.int64)


def _gait_shift(robot: RobotSpec, foot_index: np.ndarray, source: str) -> float:
    """Phase shift of the mirrored gait clock: phase' + offset_k = phase + offset_(index k) for
    every foot k; mirroring twice is the identity, so the shift is 0 or 0.5."""
    if robot.gait_period == 0:
        return 0.0
    offsets = robot.gait_offsets
    shift = (offsets[foot_index] - offsets) % 1.0
    for candidate in (0.0, 0.5):
        # Circular distance of every foot's shift to the candidate.
        gap = np.abs((shift - candidate + 0.5) % 1.0 - 0.5)
        if np.all(gap < 1e-6):
            return candidate
    raise ConfigError(source, 'gait.offsets', f'{offsets.tolist()} are not mirror-symmetric: '
                      'mirrored feet must be in phase or half a cycle apart, the same for '
                      'every pair (e.g. a trot [0, 0.5, 0.5, 0])')


def mirror_physics_state(qpos: np.ndarray, qvel: np.ndarray, qadr: np.ndarray,
                         vadr: np.ndarray, mirror: RobotMirror) -> tuple[np.ndarray, np.ndarray]:
    """The mirrored physics state of a floating-base robot: qpos [N, nq], qvel [N, nv] with the
    free joint first; the world is reflected about its xz plane."""
    qpos, qvel = qpos.copy(), qvel.copy()
    qpos[:, 1] *= -1.0
    # R' = M R M: quaternion (w, x, y, z) -> (w, -x, y, -z).
    qpos[:, 4] *= -1.0
    qpos[:, 6] *= -1.0
    # Linear velocity is polar, angular velocity (body frame) axial.
    qvel[:, 1] *= -1.0
    qvel[:, 3] *= -1.0
    qvel[:, 5] *= -1.0
    qpos[:, qadr] = qpos[:, qadr[mirror.joint_index]] * mirror.joint_sign
    qvel[:, vadr] = qvel[:, vadr[mirror.joint_index]] * mirror.joint_sign
    return qpos, qvel
