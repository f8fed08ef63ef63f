"""The robot spec: the one source of truth for joints, pose, gains, limits and observations.

Loaded from a robot YAML (``config/robots/*.yaml``) plus the URDF it names (joint limits come
from the URDF alone). Env, sim node, policy node and the exported ONNX metadata all use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import math
from pathlib import Path
from typing import Any, Optional, TYPE_CHECKING

import numpy as np

from .. import paths
from ..config import ConfigError, from_dict, load_yaml, param
from .observations import ObservationLayout
from .urdf import load_urdf, UrdfError

if TYPE_CHECKING:  # symmetry derives the mirror from a RobotSpec
    from .symmetry import RobotMirror

SPEC_VERSION = 1
# Key of the JSON robot spec in an exported ONNX model's metadata_props.
METADATA_KEY = 'claw_rl_spec'


@dataclass
class ObsTermConfig:
    """One observation term of a group."""

    name: str = param('', 'term name (claw_rl_ros.core.sim.observations.TERMS)')
    scale: float | list[float] = param(1.0, 'multiplier applied to the term (one or per element)')


@dataclass
class ObservationConfig:
    """Observation groups: what the student sees and what only simulation knows."""

    policy: list[ObsTermConfig] = param([], 'terms a real robot measures (the student input)')
    privileged: list[ObsTermConfig] = param([], 'simulation-only terms (critic and teacher)')


# The derived gait clock's period: the claw quadruped's tuned 0.4 s trot at its standing
# height, scaled to another robot's height H at equal Froude number (T ~ sqrt(H / g)).
REFERENCE_GAIT_PERIOD_S, REFERENCE_STANDING_HEIGHT = 0.4, 0.266


@dataclass
class GaitConfig:
    """The gait clock: a phase the policy observes and gait rewards refer to. Left out, it is
    derived from the robot: a trot (diagonal feet in phase) with a period from its height."""

    period_s: Optional[float] = param(None, 'gait cycle period [s] (None: 0.4 s x sqrt(H / '
                                            '0.266 m); 0 = no gait clock)', ge=0, le=10)
    duty: float = param(0.5, 'fraction of the cycle each foot is in stance', gt=0, lt=1)
    offsets: list[float] = param([], 'phase offset of each foot (foot_bodies order), in [0, 1) '
                                     '(empty: a trot derived from where the feet stand)',
                                 ge=0, lt=1)


@dataclass
class MirrorConfig:
    """The left/right mirror (symmetry augmentation, ``ppo.symmetry``), derived from the URDF."""

    swap: dict[str, str] = param({}, 'name parts of mirrored joints and links, left: right '
                                     '(e.g. {FL_: FR_, RL_: RR_}); empty = no mirror')


@dataclass
class RobotConfig:
    """A legged robot described by YAML + its URDF; no robot-specific code anywhere else."""

    name: str = param('', 'robot name, written into exported models')
    model_file: str = param('', 'URDF path (absolute, or relative to the package share dir)')
    base_body: str = param('trunk', 'floating-base link that gets the free joint')
    imu_body: str = param('trunk', 'link carrying the IMU site')
    foot_bodies: list[str] = param([], 'links whose ground contact counts as a foot contact')
    joint_names: list[str] = param([], 'actuated joints in policy/action order')
    default_joint_pos: list[float] = param([], 'default pose q0 [rad], one per joint')
    stiffness: dict[str, float] = param({}, 'PD Kp [N m/rad] by joint-name substring', ge=0)
    damping: dict[str, float] = param({}, 'PD Kd [N m s/rad] by joint-name substring', ge=0)
    action_scale: float = param(0.25, 'target = q0 + action_scale * action [rad]', gt=0)
    armature: float = param(0.01, 'reflected rotor inertia per joint [kg m^2]', ge=0)
    sim_dt: float = param(0.005, 'physics step [s]', gt=0, le=0.02)
    decimation: int = param(4, 'physics steps per control step', ge=1, le=50)
    init_base_height: Optional[float] = param(None, 'trunk height at reset [m] (default: the '
                                                    'standing height + 2 cm)', gt=0)
    foot_friction: float = param(1.0, 'nominal sliding friction of foot geoms', gt=0)
    penalised_contact_bodies: list[str] = param([], 'links whose ground contact is penalised')
    termination_contact_bodies: list[str] = param([], 'links whose ground contact ends an '
                                                      'episode')
    observations: ObservationConfig = param(ObservationConfig(), 'observation groups')
    gait: GaitConfig = param(GaitConfig(), 'gait clock (period 0 = none)')
    mirror: MirrorConfig = param(MirrorConfig(), 'left/right mirror (symmetry)')
    # Robot-sized constants of rewards, failures and randomisation; each defaults to a value
    # derived from the URDF (standing height H at the default pose, total mass M).
    base_height_target: Optional[float] = param(None, 'trunk height rewarded by base_height '
                                                      '[m] (default: H)', gt=0)
    swing_height: Optional[float] = param(None, 'foot lift rewarded by feet_clearance [m] '
                                                '(default: 0.2 H)', gt=0)
    min_base_height: Optional[float] = param(None, 'trunk height below which an episode fails '
                                                   '[m] (default: 0.3 H)', ge=0)
    payload_range: Optional[tuple[float, float]] = param(
        None, 'randomised trunk payload [kg] (default: [-0.05 M, 0.15 M])', ordered=True)
    com_offset_range: Optional[tuple[float, float]] = param(
        None, 'randomised trunk CoM shift per axis [m] (default: +-0.12 H)', ordered=True)


@dataclass
class RobotSpec:
    """Resolved robot description. Arrays are [J] in ``joint_names`` order."""

    name: str
    model_path: Path
    base_body: str
    imu_body: str
    foot_bodies: list[str]
    joint_names: list[str]
    default_joint_pos: np.ndarray
    joint_lower: np.ndarray
    joint_upper: np.ndarray
    effort_limit: np.ndarray
    velocity_limit: np.ndarray
    kp: np.ndarray
    kd: np.ndarray
    action_scale: float
    armature: float
    sim_dt: float
    decimation: int
    init_base_height: float
    foot_friction: float
    penalised_contact_bodies: list[str]
    termination_contact_bodies: list[str]
    policy_obs: ObservationLayout
    privileged_obs: ObservationLayout
    total_mass: float
    standing_height: float = 0.0
    base_height_target: float = 0.0
    swing_height: float = 0.0
    min_base_height: float = 0.0
    payload_range: tuple[float, float] = (0.0, 0.0)
    com_offset_range: tuple[float, float] = (0.0, 0.0)
    gait_period: float = 0.0
    gait_duty: float = 0.5
    gait_offsets: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mirror: Optional['RobotMirror'] = None
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def num_joints(self) -> int:
        return len(self.joint_names)

    @property
    def control_dt(self) -> float:
        return self.sim_dt * self.decimation

    def action_to_target(self, action: np.ndarray) -> np.ndarray:
        """[N, J] policy actions -> [N, J] joint position targets, clamped to joint limits."""
        target = self.default_joint_pos + self.action_scale * action
        return np.clip(target, self.joint_lower, self.joint_upper)

    def to_metadata(self) -> dict[str, Any]:
        """JSON-able spec written into exported models and compared on load."""
        return {
            'spec_version': SPEC_VERSION,
            'robot': self.name,
            'joint_names': list(self.joint_names),
            'default_joint_pos': self.default_joint_pos.tolist(),
            'joint_lower': self.joint_lower.tolist(),
            'joint_upper': self.joint_upper.tolist(),
            'effort_limit': self.effort_limit.tolist(),
            'kp': self.kp.tolist(),
            'kd': self.kd.tolist(),
            'action_scale': self.action_scale,
            'control_dt': self.control_dt,
            'obs_dim': self.policy_obs.dim,
            'action_dim': self.num_joints,
            'observation': self.policy_obs.to_metadata(),
            'gait': {'period_s': self.gait_period, 'duty': self.gait_duty,
                     'offsets': self.gait_offsets.tolist()},
        }

    def mismatches(self, metadata: dict[str, Any], tol: float = 1e-6) -> list[str]:
        """Differences between this robot and a model's metadata (empty when they agree)."""
        kind = metadata.get('kind', 'robot')
        if kind != 'robot':
            return [f'kind: the model was exported for a {kind} task '
                    f'{metadata.get("env_id")!r}, not for robot {self.name!r}']
        return spec_mismatches(self.to_metadata(), metadata, tol, owner='robot')


def spec_mismatches(expected: dict[str, Any], metadata: dict[str, Any], tol: float = 1e-6,
                    owner: str = 'env') -> list[str]:
    """One line per key of ``expected`` that ``metadata`` lacks or holds another value for."""
    problems = []
    for key, value in expected.items():
        if key not in metadata:
            problems.append(f'{key}: missing from the model ({owner} has {value!r})')
        elif not metadata_match(value, metadata[key], tol):
            problems.append(f'{key}: model has {metadata[key]!r}, {owner} has {value!r}')
    return problems


def metadata_match(a: Any, b: Any, tol: float) -> bool:
    """Two metadata values agree: dicts with the same keys and lists of the same length agree
    item by item, numbers differ by at most ``tol * max(1, |a|)``, the rest (bools) are equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(metadata_match(a[k], b[k], tol) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(metadata_match(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
            and not isinstance(a, bool) and not isinstance(b, bool):
        return abs(float(a) - float(b)) <= tol * max(1.0, abs(float(a)))
    return a == b


def _per_joint(gains: dict[str, float], joints: list[str], what: str, source: str) -> np.ndarray:
    """Expand {substring: value} to one value per joint; every joint must match."""
    out = []
    for joint in joints:
        hits = [v for k, v in gains.items() if k in joint]
        if not hits:
            raise ConfigError(source, what, f'no entry matches joint {joint!r}; add a key that '
                              f'is a substring of it (have {sorted(gains)})')
        out.append(hits[0])
    return np.asarray(out, dtype=np.float64)


def load_robot(name_or_path: str | Path = 'claw_quadruped') -> RobotSpec:
    """Load ``config/robots/<name>.yaml`` (or a YAML path) and its URDF into a RobotSpec."""
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
    return spec_from_config(cfg, source)


def resolve_model_file(model_file: str, source: str) -> Path:
    """The URDF a robot YAML names: absolute, or relative to the YAML's own folder, the
    package's share folder, or the working directory (the first that exists)."""
    if not model_file:
        raise ConfigError(source, 'model_file', 'empty; give the URDF path (relative to this '
                          'YAML file or absolute)')
    path = Path(model_file).expanduser()
    candidates = [path] if path.is_absolute() else [
        Path(source).parent / path, paths.share_dir() / path, Path.cwd() / path]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise ConfigError(source, 'model_file', f'file not found: {model_file!r} (looked at '
                      f'{", ".join(str(c) for c in candidates)}); give a path relative to the '
                      'robot YAML or an absolute one')


def spec_from_config(cfg: RobotConfig, source: str = '<robot config>') -> RobotSpec:
    """Validate a RobotConfig against its URDF and resolve it into a RobotSpec."""
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
    spec = RobotSpec(
        name=cfg.name or urdf.name, model_path=model_path, base_body=cfg.base_body,
        imu_body=cfg.imu_body, foot_bodies=list(cfg.foot_bodies), joint_names=list(joints),
        default_joint_pos=q0, joint_lower=lower, joint_upper=upper,
        effort_limit=np.array([urdf.joints[j].effort for j in joints]),
        velocity_limit=np.array([urdf.joints[j].velocity for j in joints]),
        kp=_per_joint(cfg.stiffness, joints, 'stiffness', source),
        kd=_per_joint(cfg.damping, joints, 'damping', source),
        action_scale=cfg.action_scale, armature=cfg.armature, sim_dt=cfg.sim_dt,
        decimation=cfg.decimation, init_base_height=cfg.init_base_height or 0.0,
        foot_friction=cfg.foot_friction,
        penalised_contact_bodies=list(cfg.penalised_contact_bodies),
        termination_contact_bodies=list(cfg.termination_contact_bodies),
        policy_obs=policy, privileged_obs=privileged, total_mass=urdf.total_mass,
        gait_period=gait.period_s or 0.0, gait_duty=gait.duty,
        gait_offsets=np.asarray(gait.offsets, dtype=np.float64), source={'config': source})
    return _resolve_sizes(spec, cfg, source)


def trot_offsets(spec: RobotSpec, source: str) -> np.ndarray:
    """[F] phase offsets of a trot from where the feet stand at the default pose: on each side
    (left y > 0, right y < 0) the feet alternate front to back, and the right side starts half
    a cycle on (a quadruped: FL + RR, then FR + RL; a biped: left, right; a hexapod: tripods)."""
    from .scene import build_model, standing_qpos  # scene builds on RobotSpec
    import mujoco
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


def _resolve_sizes(spec: RobotSpec, cfg: RobotConfig, source: str) -> RobotSpec:
    """Fill the robot-sized constants the YAML leaves out from the URDF's geometry and mass."""
    from .scene import standing_height  # scene builds on RobotSpec: import at use
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
        from .symmetry import derive_mirror
        spec.mirror = derive_mirror(spec, cfg.mirror.swap, source)
    return spec
