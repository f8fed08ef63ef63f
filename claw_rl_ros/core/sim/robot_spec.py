"""The robot spec's data types: the robot YAML's sections and the resolved :class:`RobotSpec`.

The one source of truth for joints, pose, gains, limits and observations. These are plain data
(and the metadata comparison an exported model is checked with); :mod:`.robot` builds them from
a robot YAML and its URDF, with the scene's kinematics for the sizes the YAML leaves out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import hashlib
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..config import param
from .mirror import RobotMirror
from .observations import ObservationLayout


SPEC_VERSION = 1
# Key of the JSON robot spec in an exported ONNX model's metadata_props.
METADATA_KEY = 'claw_rl_spec'
# Metadata keys a model's robot need not match: the actuator model and the robot overlay it
# was trained on are facts about training (shown by claw-rl spec and the policy card), not
# about the interface (an overlay's gains are compared as kp / kd).
INFORMATIONAL_KEYS = ('actuator', 'robot_overlay')


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


# The actuator models a robot YAML may name (core/sim/actuator.py runs them).
ACTUATOR_MODELS = ('ideal_pd', 'dc_motor', 'network')
# The longest command -> motor delay a robot or env config may ask for [physics steps]: 0.5 s
# at a 5 ms step; more is a typo (and a history buffer of that many control periods).
MAX_DELAY_STEPS = 100


@dataclass
class ActuatorConfig:
    """How a joint position target becomes a joint torque (core/sim/actuator.py)."""

    model: str = param('ideal_pd', 'ideal_pd (PD inside the physics step, constant torque '
                                   'clip), dc_motor (PD with the torque-speed line of a DC '
                                   'motor) or network (a learned actuator from network_file)')
    saturation_torque: Optional[float] = param(None, 'dc_motor: stall torque of the torque-'
                                                     "speed line [N m] (None: each joint's "
                                                     'URDF effort limit)', gt=0, le=1e4)
    no_load_speed: Optional[float] = param(None, 'dc_motor: speed where the line reaches 0 '
                                                 "torque [rad/s] (None: each joint's URDF "
                                                 'velocity limit)', ge=0.1, le=1e4)
    delay_steps: tuple[int, int] = param((0, 2), 'command -> motor delay [physics steps], '
                                         'drawn per world at each reset (env.randomization.'
                                         'action_latency_substeps overrides it)', ge=0,
                                         le=MAX_DELAY_STEPS, ordered=True)
    nominal_delay_steps: int = param(0, 'the delay the robot runs with when nothing is '
                                        'randomised [physics steps] (a robot overlay sets the '
                                        'fitted one)', ge=0, le=MAX_DELAY_STEPS)
    network_file: str = param('', 'network: the learned actuator (ONNX, the contract of '
                                  'core/sim/actuator.py), relative to this YAML or absolute')


@dataclass
class ActuatorSpec:
    """The resolved actuator model; arrays are [J] in joint order."""

    model: str
    saturation_torque: np.ndarray
    no_load_speed: np.ndarray
    delay_steps: tuple[int, int]
    network_path: Optional[Path] = None
    nominal_delay_steps: int = 0  # the delay without randomisation [physics steps]

    def to_metadata(self, armature: np.ndarray) -> dict[str, Any]:
        """What an exported model records of the actuator it was trained on (shown, not
        compared on load: a student may be verified on another actuator model)."""
        meta = {'model': self.model, 'armature': armature_metadata(armature),
                'delay_steps': [int(x) for x in self.delay_steps]}
        if self.model == 'dc_motor':
            meta.update(saturation_torque=self.saturation_torque.tolist(),
                        no_load_speed=self.no_load_speed.tolist())
        if self.network_path is not None:
            meta['network_file'] = self.network_path.name
        if self.nominal_delay_steps:
            meta['nominal_delay_steps'] = int(self.nominal_delay_steps)
        return meta


def _listed(values: Optional[np.ndarray]) -> Optional[list[float]]:
    return None if values is None else np.asarray(values, dtype=np.float64).tolist()


def armature_metadata(armature: np.ndarray) -> float | list[float]:
    """[J] rotor inertias as metadata: one number when every joint has the same."""
    values = np.atleast_1d(np.asarray(armature, dtype=np.float64))
    if values.size and np.all(values == values[0]):
        return float(values[0])
    return values.tolist()


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
    stiffness: dict[str, float] = param({}, 'PD Kp [N m/rad] by joint name or a part of it (an '
                                        'exact name wins)', ge=0)
    damping: dict[str, float] = param({}, 'PD Kd [N m s/rad] by joint name or a part of it '
                                      '(an exact name wins)', ge=0)
    action_scale: float = param(0.25, 'target = q0 + action_scale * action [rad]', gt=0)
    armature: float = param(0.01, 'reflected rotor inertia per joint [kg m^2] (the URDF '
                                  'cannot carry it; every engine adds it)', ge=0, le=10)
    joint_armature: dict[str, float] = param({}, 'rotor inertia [kg m^2] by joint name or a '
                                             'part of it, over armature (a robot overlay '
                                             'sets it)', ge=0, le=10)
    joint_frictionloss: dict[str, float] = param({}, 'Coulomb joint friction [N m] by joint '
                                                 "name or a part of it (empty: the URDF's)",
                                                 ge=0, le=1e3)
    joint_damping: dict[str, float] = param({}, 'viscous joint damping [N m s/rad] by joint '
                                            "name or a part of it (empty: the URDF's)", ge=0,
                                            le=1e3)
    actuator: ActuatorConfig = param(ActuatorConfig(), 'actuator model and its delay')
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
    armature: np.ndarray  # [J] reflected rotor inertia [kg m^2]
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
    mirror: Optional[RobotMirror] = None
    actuator: ActuatorSpec = field(default_factory=lambda: ActuatorSpec(
        'ideal_pd', np.zeros(0), np.zeros(0), (0, 0)))
    # [J] joint friction [N m] and damping [N m s/rad]; None: the URDF's (a robot overlay or
    # the YAML's joint_frictionloss / joint_damping set them).
    joint_frictionloss: Optional[np.ndarray] = None
    joint_damping: Optional[np.ndarray] = None
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
            'actuator': self.actuator.to_metadata(self.armature),
            **({'robot_overlay': self.overlay_metadata()} if self.source.get('overlay') else {}),
        }

    def overlay_metadata(self) -> dict[str, Any]:
        """The robot overlay merged onto this robot, as an exported model records it: the
        file's sha256 (None if it is gone) and the [J] joint friction and damping it set (its
        gains are ``kp`` / ``kd``, its rotor inertia and delay the ``actuator``'s)."""
        path = Path(self.source['overlay'])
        sha = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        return {'sha256': sha, 'joint_frictionloss': _listed(self.joint_frictionloss),
                'joint_damping': _listed(self.joint_damping)}

    def training_sizes(self) -> dict[str, Any]:
        """What training sizes to this robot and a model's metadata leaves out (``claw-rl
        spec`` prints it after the metadata): total mass [kg], standing height [m] at the
        default pose, the robot-sized constants by their robot-YAML keys ([m], payload [kg]),
        rounded to 0.1 mm / 0.1 g, ``derived``: the keys the YAML left out (derived from the
        URDF), and the contact links."""
        def mm(x: float) -> float:
            return round(float(x), 4)
        return {
            'total_mass': mm(self.total_mass), 'standing_height': mm(self.standing_height),
            'init_base_height': mm(self.init_base_height),
            'base_height_target': mm(self.base_height_target),
            'swing_height': mm(self.swing_height), 'min_base_height': mm(self.min_base_height),
            'payload_range': [mm(x) for x in self.payload_range],
            'com_offset_range': [mm(x) for x in self.com_offset_range],
            'derived': list(self.source.get('derived', [])),
            'foot_bodies': list(self.foot_bodies),
            'penalised_contact_bodies': list(self.penalised_contact_bodies),
            'termination_contact_bodies': list(self.termination_contact_bodies),
        }

    def mismatches(self, metadata: dict[str, Any], tol: float = 1e-6) -> list[str]:
        """Differences between this robot and a model's metadata (empty when they agree)."""
        kind = metadata.get('kind', 'robot')
        if kind != 'robot':
            return [f'kind: the model was exported for a {kind} task '
                    f'{metadata.get("env_id")!r}, not for robot {self.name!r}']
        expected = {k: v for k, v in self.to_metadata().items() if k not in INFORMATIONAL_KEYS}
        return spec_mismatches(expected, metadata, tol, owner='robot')


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
