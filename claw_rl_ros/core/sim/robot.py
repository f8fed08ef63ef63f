"""Load a robot: a robot YAML (``config/robots/*.yaml``) plus the URDF it names -> RobotSpec.

Joint limits come from the URDF alone; the sizes the YAML leaves out (standing height, gait
offsets, the mirror) come from the robot's kinematics in the scene. Env, sim node, policy node
and the exported ONNX metadata all use the result (:mod:`.robot_spec` holds its types).
"""

from __future__ import annotations

import math
from pathlib import Path

import mujoco
import numpy as np

from .. import paths
from ..config import ConfigError, from_dict, load_yaml
from .observations import ObservationLayout
from .robot_overlay import load_overlay, merge_overlay
from .robot_spec import (ACTUATOR_MODELS, ActuatorSpec, REFERENCE_GAIT_PERIOD_S,
                         REFERENCE_STANDING_HEIGHT, RobotConfig, RobotSpec)
from .scene import build_model, standing_height, standing_qpos
from .symmetry import derive_mirror
from .urdf import load_urdf, UrdfError


def per_joint(gains: dict[str, float], joints: list[str], what: str, source: str,
              default: float | None = None) -> np.ndarray:
    """[J] values from {joint name or part of one: value}: a key equal to the joint's name
    wins, else the one key that is a substring of it. A joint no key matches (unless there is
    a ``default``), or that two substring keys match alike (key "1" and key "10" for joint
    "10" without a key "10" of its own would be one such), is refused naming the joint and the
    keys; the YAML's key order never decides."""
    out = []
    for joint in joints:
        if joint in gains:
            out.append(gains[joint])
            continue
        keys = [k for k in gains if k in joint]
        if not keys and default is not None:
            out.append(default)
            continue
        if not keys:
            raise ConfigError(source, what, f'no entry matches joint {joint!r}; add a key that '
                              f'is its name or a part of it (have {sorted(gains)})')
        if len(keys) > 1:
            raise ConfigError(source, what, f'joint {joint!r} is matched alike by keys '
                              f'{sorted(keys)} (each a part of its name); give it a key of its '
                              'exact name, or keys that match one each')
        out.append(gains[keys[0]])
    return np.asarray(out, dtype=np.float64)


def _optional_per_joint(values: dict[str, float], joints: list[str], what: str,
                        source: str) -> np.ndarray | None:
    """[J] values of a map every joint must match, or None for an empty map."""
    return per_joint(values, joints, what, source) if values else None


def load_robot(name_or_path: str | Path = 'claw_quadruped', sizes: bool = True,
               overlay: str | Path = '') -> RobotSpec:
    """Load ``config/robots/<name>.yaml`` (or a YAML path) and its URDF into a RobotSpec.

    ``sizes`` false leaves the robot-sized constants unresolved (zero): for tools that look
    for a default pose (``claw-rl stand-pose``), where the YAML's may not stand yet.
    ``overlay``: a robot overlay (``claw-rl sysid --out``) merged onto the YAML
    (:mod:`.robot_overlay`); the spec's ``source['overlay']`` names it."""
    path = Path(name_or_path)
    if path.suffix not in ('.yaml', '.yml'):
        path = paths.config_path(f'robots/{name_or_path}.yaml')
        if not path.is_file():
            known = sorted(p.stem for p in path.parent.glob('*.yaml'))
            raise ConfigError('robot', str(name_or_path), f'no robot of that name in '
                              f'{path.parent} (have: {", ".join(known) or "none"}); for a robot '
                              'outside the package pass the path of its YAML, e.g. --robot '
                              'path/to/my_robot.yaml')
    else:
        path = paths.config_path(str(name_or_path))
    source = str(path)
    raw = load_yaml(path)
    cfg = from_dict(RobotConfig, raw.get('robot', raw), source=source,
                    prefix='robot' if 'robot' in raw else '')
    if not overlay:
        return spec_from_config(cfg, source, sizes)
    fit = load_overlay(overlay)
    # Every joint is matched by one group of the overlay (refused naming it otherwise).
    per_joint({k: 0.0 for k in fit.joint_groups}, cfg.joint_names, 'joint_groups', fit.source)
    return spec_from_config(merge_overlay(cfg, fit), source, sizes, overlay=fit.source)


def resolve_model_file(model_file: str, source: str, field: str = 'model_file') -> Path:
    """The file (the URDF) a robot YAML names: absolute, or relative to the YAML's own folder,
    the package's share folder, or the working directory (the first that exists)."""
    if not model_file:
        raise ConfigError(source, field, 'empty; give the URDF path (relative to this '
                          'YAML file or absolute)')
    path = Path(model_file).expanduser()
    candidates = [path] if path.is_absolute() else [
        Path(source).parent / path, paths.share_dir() / path, Path.cwd() / path]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise ConfigError(source, field, f'file not found: {model_file!r} (looked at '
                      f'{", ".join(str(c) for c in candidates)}); give a path relative to the '
                      'robot YAML or an absolute one')


def spec_from_config(cfg: RobotConfig, source: str = '<robot config>',
                     sizes: bool = True, overlay: str = '') -> RobotSpec:
    """Validate a RobotConfig against its URDF and resolve it into a RobotSpec (``sizes``:
    see :func:`load_robot`; ``overlay``: the overlay file merged into ``cfg``, if any)."""
    model_path = resolve_model_file(cfg.model_file, source)
    try:
        urdf = load_urdf(model_path)
    except UrdfError as exc:
        raise ConfigError(source, 'model_file', str(exc)) from None
    joints = cfg.joint_names
    if not joints:
        raise ConfigError(source, 'joint_names', 'empty; list the actuated joints in order')
    for joint in joints:
        if joint not in urdf.joints or urdf.joints[joint].type != 'revolute':
            raise ConfigError(source, 'joint_names', f'{joint!r} is not a revolute joint (with '
                              f'limits) of {model_path.name}')
    if len(set(joints)) != len(joints):
        raise ConfigError(source, 'joint_names', 'a joint is listed twice')
    if len(cfg.default_joint_pos) != len(joints):
        raise ConfigError(source, 'default_joint_pos', f'has {len(cfg.default_joint_pos)} values '
                          f'for {len(joints)} joints')
    for key in ('base_body', 'imu_body'):
        if getattr(cfg, key) not in urdf.links:
            raise ConfigError(source, key, f'{getattr(cfg, key)!r} is not a link of the URDF')
    for key in ('foot_bodies', 'penalised_contact_bodies', 'termination_contact_bodies'):
        for link in getattr(cfg, key):
            if link not in urdf.links:
                raise ConfigError(source, key, f'{link!r} is not a link of the URDF')
    if not cfg.foot_bodies:
        raise ConfigError(source, 'foot_bodies', 'empty; name the foot links')
    lower = np.array([urdf.joints[j].lower for j in joints])
    upper = np.array([urdf.joints[j].upper for j in joints])
    q0 = np.asarray(cfg.default_joint_pos, dtype=np.float64)
    outside = [(j, v) for j, v, lo, hi in zip(joints, q0, lower, upper) if not lo <= v <= hi]
    if outside:
        raise ConfigError(source, 'default_joint_pos', f'{outside[0][0]} = {outside[0][1]} is '
                          'outside the URDF joint limits')
    num_feet = len(cfg.foot_bodies)
    gait = cfg.gait
    if gait.period_s and gait.period_s < 2 * cfg.sim_dt * cfg.decimation:
        raise ConfigError(source, 'gait.period_s', f'{gait.period_s} s is shorter than two '
                          f'control steps ({2 * cfg.sim_dt * cfg.decimation:g} s): the clock '
                          'would alias; give a longer period, or 0 for no gait clock')
    if gait.period_s != 0 and gait.offsets and len(gait.offsets) != num_feet:
        raise ConfigError(source, 'gait.offsets', f'has {len(gait.offsets)} values for '
                          f'{num_feet} feet')
    policy_terms = [(t.name, t.scale) for t in cfg.observations.policy]
    if gait.period_s is None and 'gait_phase' not in [name for name, _ in policy_terms]:
        # A derived clock the policy could not see would ask for contacts it cannot time.
        policy_terms.append(('gait_phase', 1.0))
    try:
        policy = ObservationLayout(policy_terms, len(joints), num_feet, 'policy')
        privileged = ObservationLayout([(t.name, t.scale) for t in cfg.observations.privileged],
                                       len(joints), num_feet, 'privileged')
    except ValueError as exc:
        raise ConfigError(source, 'observations', str(exc)) from None
    if gait.period_s == 0 and 'gait_phase' in policy.names + privileged.names:
        raise ConfigError(source, 'observations', 'term gait_phase needs a gait clock; set '
                          'gait.period_s > 0')
    if policy.dim == 0:
        raise ConfigError(source, 'observations.policy', 'empty; list the policy terms')
    effort = np.array([urdf.joints[j].effort for j in joints])
    velocity = np.array([urdf.joints[j].velocity for j in joints])
    spec = RobotSpec(
        name=cfg.name or urdf.name, model_path=model_path, base_body=cfg.base_body,
        imu_body=cfg.imu_body, foot_bodies=list(cfg.foot_bodies), joint_names=list(joints),
        default_joint_pos=q0, joint_lower=lower, joint_upper=upper,
        effort_limit=effort, velocity_limit=velocity,
        kp=per_joint(cfg.stiffness, joints, 'stiffness', source),
        kd=per_joint(cfg.damping, joints, 'damping', source),
        action_scale=cfg.action_scale, sim_dt=cfg.sim_dt,
        armature=per_joint(cfg.joint_armature, joints, 'joint_armature', source, cfg.armature),
        joint_frictionloss=_optional_per_joint(cfg.joint_frictionloss, joints,
                                               'joint_frictionloss', source),
        joint_damping=_optional_per_joint(cfg.joint_damping, joints, 'joint_damping', source),
        decimation=cfg.decimation, init_base_height=cfg.init_base_height or 0.0,
        foot_friction=cfg.foot_friction,
        penalised_contact_bodies=list(cfg.penalised_contact_bodies),
        termination_contact_bodies=list(cfg.termination_contact_bodies),
        policy_obs=policy, privileged_obs=privileged, total_mass=urdf.total_mass,
        gait_period=gait.period_s or 0.0, gait_duty=gait.duty,
        gait_offsets=np.asarray(gait.offsets, dtype=np.float64),
        actuator=resolve_actuator(cfg, effort, velocity, joints, source),
        source={'config': source, **({'overlay': overlay} if overlay else {})})
    return _resolve_sizes(spec, cfg, source) if sizes else spec


def resolve_actuator(cfg: RobotConfig, effort: np.ndarray, velocity: np.ndarray,
                     joints: list[str], source: str) -> ActuatorSpec:
    """The robot's actuator model, its torque-speed line filled from the URDF's effort and
    velocity limits where the YAML leaves it out (dc_motor), its network file found."""
    act = cfg.actuator
    if act.model not in ACTUATOR_MODELS:
        raise ConfigError(source, 'actuator.model', f'{act.model!r} is not an actuator model; '
                          f'use one of {", ".join(ACTUATOR_MODELS)}')
    n = len(joints)
    sat = effort.copy() if act.saturation_torque is None else np.full(n, act.saturation_torque)
    speed = velocity.copy() if act.no_load_speed is None else np.full(n, act.no_load_speed)
    if act.model == 'dc_motor':
        # The line needs both ends: a URDF without velocity limits gives none.
        for what, values in (('no_load_speed', speed), ('saturation_torque', sat)):
            low = 0.1 if what == 'no_load_speed' else 0.0
            bad = [j for j, v in zip(joints, values) if not np.isfinite(v) or v <= low]
            if bad:
                raise ConfigError(source, f'actuator.{what}', f'joint {bad[0]!r} has no '
                                  f'URDF limit above {low:g} to take it from; give actuator.'
                                  f'{what} in the robot YAML')
    network = None
    if act.model == 'network':
        if not act.network_file:
            raise ConfigError(source, 'actuator.network_file', 'empty; actuator model network '
                              'needs the learned actuator: an ONNX file of the contract in '
                              'core/sim/actuator.py (LearnedActuator)')
        network = resolve_model_file(act.network_file, source, 'actuator.network_file')
    elif act.network_file:
        raise ConfigError(source, 'actuator.network_file', f'{act.network_file!r} is given but '
                          f'actuator.model is {act.model!r}; set model: network, or remove it')
    return ActuatorSpec(act.model, sat, speed, tuple(act.delay_steps), network,
                        int(act.nominal_delay_steps))


def trot_offsets(spec: RobotSpec, source: str) -> np.ndarray:
    """[F] phase offsets of a trot from where the feet stand at the default pose: on each side
    (left y > 0, right y < 0) the feet alternate front to back, and the right side starts half
    a cycle on (a quadruped: FL + RR, then FR + RL; a biped: left, right; a hexapod: tripods)."""
    model = build_model(spec)
    data = mujoco.MjData(model)
    data.qpos[:] = standing_qpos(model, spec)
    mujoco.mj_kinematics(model, data)
    base = data.xpos[model.body(spec.base_body).id]
    feet = np.array([data.xpos[model.body(f).id] - base for f in spec.foot_bodies])
    tol = 0.05 * spec.standing_height
    if np.any(np.abs(feet[:, 1]) < tol):
        raise ConfigError(source, 'gait.offsets', f'cannot derive a trot: foot '
                          f'{spec.foot_bodies[int(np.abs(feet[:, 1]).argmin())]!r} stands on '
                          'the robot\'s midline; give gait: {period_s, duty, offsets}, or '
                          'period_s: 0 for no gait clock')
    offsets = np.zeros(len(feet))
    for side, right in ((feet[:, 1] > 0, 0), (feet[:, 1] < 0, 1)):
        ids = np.flatnonzero(side)
        # Rank front (largest x) to back on this side.
        for rank, i in enumerate(ids[np.argsort(-feet[ids, 0], kind='stable')]):
            offsets[i] = 0.5 * ((rank + right) % 2)
    return offsets


# The robot-sized constants a robot YAML may leave out (derived by _resolve_sizes).
SIZES = ('init_base_height', 'base_height_target', 'swing_height', 'min_base_height',
         'payload_range', 'com_offset_range')


def _resolve_sizes(spec: RobotSpec, cfg: RobotConfig, source: str) -> RobotSpec:
    """Fill the robot-sized constants the YAML leaves out from the URDF's geometry and mass;
    ``spec.source['derived']`` names them."""
    h = spec.standing_height = standing_height(spec)
    m = spec.total_mass
    if not h > 0:
        raise ConfigError(source, 'foot_bodies', f'the feet are not below the trunk at the '
                          f'default pose (standing height {h:.3f} m); check foot_bodies and '
                          'default_joint_pos')
    spec.init_base_height = cfg.init_base_height or h + 0.02
    spec.base_height_target = cfg.base_height_target or h
    spec.swing_height = cfg.swing_height or 0.2 * h
    spec.min_base_height = cfg.min_base_height if cfg.min_base_height is not None else 0.3 * h
    spec.payload_range = tuple(cfg.payload_range or (-0.05 * m, 0.15 * m))
    spec.com_offset_range = tuple(cfg.com_offset_range or (-0.12 * h, 0.12 * h))
    if cfg.gait.period_s is None:
        spec.gait_period = round(REFERENCE_GAIT_PERIOD_S * math.sqrt(
            h / REFERENCE_STANDING_HEIGHT), 3)
    if spec.gait_period > 0 and not cfg.gait.offsets:
        spec.gait_offsets = trot_offsets(spec, source)
    if cfg.mirror.swap:
        spec.mirror = derive_mirror(spec, cfg.mirror.swap, source)
    given = {key: getattr(cfg, key) for key in SIZES}
    given.update({'gait.period_s': cfg.gait.period_s,
                  'gait.offsets': cfg.gait.offsets or (None if spec.gait_period > 0 else [])})
    spec.source['derived'] = [key for key, value in given.items() if value is None]
    return spec
