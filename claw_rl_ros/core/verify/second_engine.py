"""The sim2sim gate's second, independent physics engine: the exported student in PyBullet.

A student that only walks in the engine it was trained in has learned that engine. This module
runs the exported ONNX student closed-loop in PyBullet (Bullet's Featherstone multibody with a
constraint solver for contacts and joint limits: another integrator, another contact model
than MuJoCo's soft convex contacts), loading the robot's own URDF, and scores the episodes
with the gate's own limits (:mod:`.gate_scoring`).

The policy side is the policy node's own code, in the node's own order
(:mod:`..control.policy_controller`): the joint state goes through :class:`JointOrder` by
joint name, the IMU reading (ROS order x, y, z, w; gyro in the IMU frame) through
:func:`imu_arrays`, the command through :func:`command_array`; the frame is built by
:class:`ObservationAssembler` (its last action and gait clock), the model's input by
``model_input``, the model is run by :class:`OnnxPolicy` (refusing another robot's), its
action clipped to the model's ``action_clip`` and turned into ``q0 + action_scale * a``
shaped by the node's :class:`CommandShaper` (joint limits, rate limit), then ``advance``.

The robot side (:class:`BulletWorld`) is the URDF in a headless (DIRECT) PyBullet client:

* joints are found by name, never by URDF index, and kept in the robot spec's order;
* PyBullet's default velocity motors (which would hold every joint still) are given the URDF
  joint ``friction`` as their force limit at target velocity 0: dry joint friction, solved as
  a constraint, as MuJoCo's ``frictionloss`` (which its URDF importer reads from the same
  field); the URDF joint ``damping`` PyBullet applies itself (``-damping * qd``), as MuJoCo;
  PyBullet's default link damping (0.04) is switched off (MuJoCo has none);
* the PD law is explicit, at ``drive_rate_hz``, held constant over the drive period::

      tau = clip(Kp (target - q) - Kd qd, -effort, effort)

  with the robot spec's gains and URDF effort limits, targets clamped to the joint limits
  (MuJoCo's position actuators run the same law at the physics rate 1/sim_dt, with Kd
  integrated implicitly); the policy still acts every control period (``control_dt``), so the
  drive rate must divide it;
* rotor inertia (``armature``): PyBullet has no armature parameter, and adding it to the
  child link's inertia would model a rotor turning with the link (geared 1:1): free-floating,
  the hip's acceleration under a torque was then 1.9x MuJoCo's, the trunk's roll 3.8x. The
  rotor is modelled as what it is instead: a link of inertia ``armature / N^2`` on the joint's
  parent link, on the joint's axis, turning ``N`` times as fast as the joint (a PyBullet gear
  constraint, ratio ``rotor_gear_ratio`` N). Its reflected inertia at the joint is exactly
  ``armature``; it also adds ``armature / N`` to the couplings with the parent's motion and
  ``armature / N^2`` to the parent, which MuJoCo leaves out (its armature is the N -> infinity
  limit: the joint's own diagonal of the mass matrix and nothing else). Measured against
  MuJoCo's mass matrix (a unit torque on each joint of the free-floating robot, one step): at
  the default N = 30 the joint's own acceleration within 1.3 %, the other joints' within 3 %
  of it, the trunk's within 7 % (N = 100: 0.5 %, 1 %, 3 %; N = 10: 4 %, 8 %, 17 %; no rotor:
  up to 6.4x); a real actuator's N (6-10) is a physical choice too. Each rotor adds a degree of
  freedom and a constraint row, and 0.1 g of mass (1.2 g in all, 0.013 % of the claw's);
  ``armature=False`` leaves the rotors out, to measure how much they matter;
* the ground is a plane whose friction is ``ground_friction`` (Bullet multiplies the two
  bodies' coefficients; the robot's links are given 1, so the floor's is the contact's, as the
  MuJoCo floor's priority makes it); no self-collision (as in MuJoCo's scene);
* the IMU is read at the current state (MuJoCo's sensors trail the state by one physics step).

An episode ends in a fall by the sim node's own test (:meth:`~..sim.sim_session.SimSession.fallen`,
the env's termination config): trunk tilt beyond ``max_tilt``, trunk height below the robot's
``min_base_height``, a termination body pushing the ground harder than ``contact_force``, or a
joint faster than ``max_joint_vel`` (a diverged simulation). Its record is the sim node's
episode record (:class:`~.episode_record.EpisodeRecorder`), turned into the gate's
:class:`~.gate_scoring.Episode` by :func:`~.gate_scoring.episode_of`, so the gate's settle time,
tracking error and fall rate apply unchanged (:func:`summarize`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
import math
from numbers import Real
from pathlib import Path
import tempfile
from typing import Any, Sequence
import xml.etree.ElementTree as ET

import numpy as np
import pybullet

from ..control.command_shaping import CommandShaper
from ..control.model_swap import policy_clip
from ..control.state_input import (BadInput, command_array, imu_arrays, JointOrder,
                                   ObservationAssembler)
from ..export.onnx_policy import OnnxPolicy
from ..sim.actuator import DcMotor
from ..sim.env_config import robot_sized, TerminationConfig
from ..sim.robot_spec import RobotSpec
from ..sim.scene import scene_urdf
from .episode_record import episode_steps, EpisodeRecorder, read_episode, ROW_DIM
from .gate_scoring import Episode, episode_of, score_terrain, VerifyConfig

ENGINE = 'pybullet'
# MuJoCo's default gravity [m/s^2] (the scene keeps it).
GRAVITY = 9.81
# A drive rate is a whole number of drive steps per control period up to this rounding.
RATE_TOL = 1e-6
# Robot links' friction coefficient: Bullet multiplies it with the floor's, which is then the
# contact's.
ROBOT_LINK_FRICTION = 1.0
# Rotor model of the armature: gear ratio N (rotor speed / joint speed), the rotor link's mass
# [kg] (a rotor's mass sits in the URDF's links already: this is only what PyBullet needs for
# a link), the gear constraint's force bound [N m] (never reached: the joint feels armature x
# joint acceleration), the rotor's speed bound [rad/s] (PyBullet's default is 100).
ROTOR_GEAR_RATIO = 30.0
ROTOR_MASS = 1e-4
GEAR_MAX_FORCE = 1e4
MAX_JOINT_SPEED = 1e5
ROTOR_SUFFIX = '__rotor'
# The reset pose noise of config/verify.yaml (env.randomization.init_joint_pos_noise) [rad].
INIT_JOINT_NOISE = 0.05
# Where a fixed-base (hanging) robot's trunk is held [m]: its feet clear the floor.
HANGING_HEIGHT = 1.0
# The gate's protocol defaults (episode length, settle time, limits).
GATE_DEFAULTS = VerifyConfig()


@dataclass
class BulletState:
    """What the policy node receives, and the ground truth the gate scores.

    Joint arrays are [J] in the robot spec's order (``joint_names``). ``imu_orientation`` [4]
    is the IMU link's orientation in the world as a ``sensor_msgs/Imu`` carries it (x, y, z,
    w); ``imu_angular_velocity`` [3] rad/s in the IMU link's frame. ``base_pos`` [3] is the
    base link's frame origin in the world, ``base_quat`` [4] its orientation (w, x, y, z, the
    MuJoCo order), ``base_lin_vel_world`` / ``base_lin_vel_body`` [3] m/s the velocity of that
    origin in world / base axes, ``base_ang_vel_body`` [3] rad/s, ``base_height`` [m] above
    the (flat) ground. ``joint_effort`` [J] N m is the PD torque of the last drive period.
    """

    time: float
    joint_names: tuple[str, ...]
    joint_pos: np.ndarray
    joint_vel: np.ndarray
    joint_effort: np.ndarray
    imu_orientation: np.ndarray
    imu_angular_velocity: np.ndarray
    base_pos: np.ndarray
    base_quat: np.ndarray
    base_lin_vel_world: np.ndarray
    base_lin_vel_body: np.ndarray
    base_ang_vel_body: np.ndarray
    base_height: float


def drive_steps_per_control(robot: RobotSpec, drive_rate_hz: float) -> int:
    """Drive steps per control period at ``drive_rate_hz``; ValueError naming the field, the
    value and a fix when it is not a rate > 0 that divides the control period."""
    period_ms = robot.control_dt * 1e3
    examples = f'e.g. {1.0 / robot.sim_dt:g} (the MuJoCo physics rate) or 1000'
    if isinstance(drive_rate_hz, bool) or not isinstance(drive_rate_hz, Real) or \
            not math.isfinite(drive_rate_hz) or drive_rate_hz <= 0:
        raise ValueError(f'drive_rate_hz = {drive_rate_hz!r}: give a finite rate > 0 [Hz] that '
                         f'divides the control period of {period_ms:g} ms, {examples}')
    per_control = float(drive_rate_hz) * robot.control_dt
    steps = round(per_control)
    if steps < 1 or abs(per_control - steps) > RATE_TOL * max(1.0, per_control):
        near = max(1, steps) / robot.control_dt
        raise ValueError(f'drive_rate_hz = {drive_rate_hz!r} gives {per_control:.4g} drive steps '
                         f'per control period of {period_ms:g} ms (robot {robot.name!r}: sim_dt '
                         f'x decimation); give a whole multiple of the control rate '
                         f'{1.0 / robot.control_dt:g} Hz, e.g. {near:g}, {examples}')
    return steps


def _rotation(quat_xyzw: Sequence[float]) -> np.ndarray:
    """[3, 3] rotation matrix (body -> world) of a PyBullet quaternion (x, y, z, w)."""
    return np.array(pybullet.getMatrixFromQuaternion(quat_xyzw)).reshape(3, 3)


def rotor_urdf(robot: RobotSpec, gear_ratio: float) -> str:
    """The robot's URDF text (meshes resolved: :func:`~..sim.scene.scene_urdf`) with a rotor
    per actuated joint: link ``<joint>__rotor`` of inertia ``armature / gear_ratio^2`` about
    every axis on the joint's parent, at the joint's origin, turning on joint
    ``<joint>__rotor`` about the joint's axis (the gear itself is a constraint added after
    loading)."""
    root = ET.fromstring(scene_urdf(Path(robot.model_path)))
    joints = {j.get('name'): j for j in root.findall('joint')}
    taken = {e.get('name') for e in root if e.tag in ('link', 'joint')}
    for name, armature in zip(robot.joint_names, np.broadcast_to(robot.armature,
                                                                 (robot.num_joints,))):
        inertia = repr(float(armature / gear_ratio ** 2))
        rotor = f'{name}{ROTOR_SUFFIX}'
        if rotor in taken:
            raise ValueError(f'{robot.model_path.name}: has a link or joint {rotor!r} already; '
                             'rename it (the PyBullet gate adds rotors by that name)')
        joint = joints[name]
        # URDF defaults: origin at the parent's frame, axis x.
        origin = getattr(joint.find('origin'), 'attrib', {})
        axis = getattr(joint.find('axis'), 'attrib', {})
        link = ET.SubElement(root, 'link', name=rotor)
        inertial = ET.SubElement(link, 'inertial')
        ET.SubElement(inertial, 'origin', xyz='0 0 0', rpy='0 0 0')
        ET.SubElement(inertial, 'mass', value=repr(ROTOR_MASS))
        ET.SubElement(inertial, 'inertia', ixx=inertia, iyy=inertia, izz=inertia, ixy='0',
                      ixz='0', iyz='0')
        mount = ET.SubElement(root, 'joint', name=rotor, type='continuous')
        ET.SubElement(mount, 'parent', link=joint.find('parent').get('link'))
        ET.SubElement(mount, 'child', link=rotor)
        ET.SubElement(mount, 'origin', xyz=origin.get('xyz', '0 0 0'),
                      rpy=origin.get('rpy', '0 0 0'))
        ET.SubElement(mount, 'axis', xyz=axis.get('xyz', '1 0 0'))
    return ET.tostring(root, encoding='unicode')


class BulletWorld:
    """One robot on a flat floor in a headless PyBullet client, driven by explicit PD.

    ``drive_rate_hz``: rate of the PD law (a whole multiple of the control rate);
    ``physics_steps_per_drive``: PyBullet steps per drive period (its time step is
    1 / (drive_rate_hz x physics_steps_per_drive)); ``ground_friction``: the floor's sliding
    friction; ``fixed_base``: the trunk is held in the air at :data:`HANGING_HEIGHT` (PD tests);
    ``armature``: model the robot's rotor inertia by geared rotors of ``rotor_gear_ratio``
    (see the module docstring); ``termination``: the fall test's thresholds (default: the
    env's). Close with :meth:`close` (or ``with``).

    ``joint_index`` maps each spec joint name to its PyBullet joint index (found by name).
    """

    def __init__(self, robot: RobotSpec, *, drive_rate_hz: float = 1000.0,
                 physics_steps_per_drive: int = 1, ground_friction: float = 1.0,
                 fixed_base: bool = False, armature: bool = True,
                 rotor_gear_ratio: float = ROTOR_GEAR_RATIO,
                 termination: TerminationConfig | None = None):
        self.robot = robot
        actuator = getattr(getattr(robot, 'actuator', None), 'model', 'ideal_pd')
        if actuator == 'network':
            raise ValueError(f'robot {robot.name!r} actuator.model = {actuator!r}: a learned '
                             'actuator is fitted at the MuJoCo physics step, not at a drive '
                             'rate; verify this student with actuator.model ideal_pd or '
                             'dc_motor')
        # dc_motor: the PD law clipped by the torque-speed line, as in MuJoCo.
        self.motor = DcMotor(robot) if actuator == 'dc_motor' else None
        self.drive_per_control = drive_steps_per_control(robot, drive_rate_hz)
        if isinstance(physics_steps_per_drive, bool) or \
                not isinstance(physics_steps_per_drive, int) or physics_steps_per_drive < 1:
            raise ValueError(f'physics_steps_per_drive = {physics_steps_per_drive!r}: give a '
                             'whole number >= 1 of PyBullet steps per drive period')
        if isinstance(ground_friction, bool) or not isinstance(ground_friction, Real) or \
                not math.isfinite(ground_friction) or ground_friction <= 0:
            raise ValueError(f'ground_friction = {ground_friction!r}: give a finite sliding '
                             'friction coefficient > 0 (e.g. 1.0; config/verify.yaml draws '
                             '0.4 to 1.25)')
        if isinstance(rotor_gear_ratio, bool) or not isinstance(rotor_gear_ratio, Real) or \
                not math.isfinite(rotor_gear_ratio) or rotor_gear_ratio < 1:
            raise ValueError(f'rotor_gear_ratio = {rotor_gear_ratio!r}: give a finite gear ratio '
                             f'>= 1 (rotor speed / joint speed; default {ROTOR_GEAR_RATIO:g})')
        self.drive_rate_hz = float(drive_rate_hz)
        self.drive_dt = robot.control_dt / self.drive_per_control
        self.physics_steps_per_drive = physics_steps_per_drive
        self.physics_dt = self.drive_dt / physics_steps_per_drive
        self.ground_friction = float(ground_friction)
        self.fixed_base = fixed_base
        self.gear_ratio = float(rotor_gear_ratio) if armature and np.any(robot.armature > 0) \
            else 0.0
        self.termination = termination if termination is not None else TerminationConfig()
        self.min_base_height = robot_sized(self.termination.min_base_height,
                                           robot.min_base_height)
        self.rotors: list[int] = []
        self.client = pybullet.connect(pybullet.DIRECT)
        try:
            self._build()
        except Exception:
            self.close()
            raise
        self.time = 0.0
        self.joint_effort = np.zeros(robot.num_joints)
        self.targets = robot.default_joint_pos.copy()
        self.touched_termination = False

    # ----------------------------------------------------------------------------- building
    def _call(self, function, *args, **kwargs):
        """A PyBullet call on this world's client."""
        return function(*args, physicsClientId=self.client, **kwargs)

    def _load(self, height: float) -> int:
        """Load the URDF (with rotors when the armature is modelled) at ``height``."""
        r = self.robot
        text = rotor_urdf(r, self.gear_ratio) if self.gear_ratio else \
            scene_urdf(Path(r.model_path))
        flags = pybullet.URDF_USE_INERTIA_FROM_FILE  # (else PyBullet takes it from shapes)
        with tempfile.TemporaryDirectory(prefix='claw_bullet_') as folder:
            path = Path(folder) / Path(r.model_path).name
            path.write_text(text)
            return self._call(pybullet.loadURDF, str(path), [0.0, 0.0, height],
                              useFixedBase=self.fixed_base, flags=flags)

    def _build(self) -> None:
        r, call = self.robot, self._call
        call(pybullet.setGravity, 0.0, 0.0, -GRAVITY)
        call(pybullet.setTimeStep, self.physics_dt)
        call(pybullet.setPhysicsEngineParameter, numSubSteps=0, deterministicOverlappingPairs=1)
        # The floor: a static plane through the origin.
        plane = call(pybullet.createCollisionShape, pybullet.GEOM_PLANE)
        self.floor = call(pybullet.createMultiBody, 0.0, plane)
        call(pybullet.changeDynamics, self.floor, -1, lateralFriction=self.ground_friction,
             restitution=0.0)
        self.body = self._load(HANGING_HEIGHT if self.fixed_base else r.init_base_height)
        root = call(pybullet.getBodyInfo, self.body)[0].decode()
        if root != r.base_body:
            raise ValueError(f'{r.model_path.name}: the URDF root link is {root!r}, robot '
                             f'{r.name!r} has base_body {r.base_body!r}; PyBullet floats the '
                             'root: make base_body the root link')
        num_joints = call(pybullet.getNumJoints, self.body)
        infos = [call(pybullet.getJointInfo, self.body, i) for i in range(num_joints)]
        by_name = {info[1].decode(): info for info in infos}
        link_of = {info[12].decode(): info[0] for info in infos}
        link_of[root] = -1
        missing = [n for n in r.joint_names if n not in by_name or
                   by_name[n][2] != pybullet.JOINT_REVOLUTE]
        if missing:
            raise ValueError(f'{r.model_path.name}: joints {missing} of robot {r.name!r} are not '
                             'revolute joints of the URDF PyBullet loaded')
        # Spec order -> PyBullet joint index, by name (a joint's index is its child link's).
        self.joint_index = {name: int(by_name[name][0]) for name in r.joint_names}
        self.joints = [self.joint_index[name] for name in r.joint_names]
        self.imu_link = link_of[r.imu_body]
        self.termination_links = {link_of[name] for name in r.termination_contact_bodies}
        self._base_inertial = call(pybullet.getDynamicsInfo, self.body, -1)[3:5]
        for link in [-1, *range(num_joints)]:
            call(pybullet.changeDynamics, self.body, link, linearDamping=0.0,
                 angularDamping=0.0, lateralFriction=ROBOT_LINK_FRICTION,
                 maxJointVelocity=MAX_JOINT_SPEED)
        # Default motors off: a velocity motor at 0 with the URDF joint friction as its force
        # limit is dry friction (none on rotors); the PD torque is added every drive step.
        # The robot's own joint friction and damping (a robot overlay) replace the URDF's.
        friction = {i: float(infos[i][7]) for i in range(num_joints)}
        damping = {self.joint_index[n]: float(by_name[n][6]) for n in r.joint_names}
        if r.joint_frictionloss is not None:
            friction.update(zip(self.joints, map(float, r.joint_frictionloss)))
        if r.joint_damping is not None:
            damping.update(zip(self.joints, map(float, r.joint_damping)))
            for joint, value in damping.items():
                call(pybullet.changeDynamics, self.body, joint, jointDamping=value)
        movable = [i for i, info in enumerate(infos) if info[2] != pybullet.JOINT_FIXED]
        call(pybullet.setJointMotorControlArray, self.body, movable, pybullet.VELOCITY_CONTROL,
             targetVelocities=[0.0] * len(movable), forces=[friction[i] for i in movable])
        self.joint_damping = np.array([damping[j] for j in self.joints])
        self.joint_friction = np.array([friction[j] for j in self.joints])
        if self.gear_ratio:
            self.rotors = [int(by_name[f'{n}{ROTOR_SUFFIX}'][0]) for n in r.joint_names]
            for joint, rotor in zip(self.joints, self.rotors):
                self._gear(joint, rotor)

    def _gear(self, joint: int, rotor: int) -> None:
        """Rotor speed = N x joint speed: Bullet's gear row is qd_joint + ratio qd_rotor = 0."""
        gear = self._call(pybullet.createConstraint, self.body, joint, self.body, rotor,
                          pybullet.JOINT_GEAR, [1.0, 0.0, 0.0], [0.0, 0.0, 0.0],
                          [0.0, 0.0, 0.0])
        # No position correction (erp 0): a rotor's angle does not matter, only its speed.
        self._call(pybullet.changeConstraint, gear, gearRatio=-1.0 / self.gear_ratio,
                   maxForce=GEAR_MAX_FORCE, erp=0.0)

    def close(self) -> None:
        """Disconnect the client (once)."""
        if self.client is not None and self.client >= 0:
            pybullet.disconnect(physicsClientId=self.client)
        self.client = None

    def __enter__(self) -> BulletWorld:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------------------------------- state
    def _base_link_pose(self) -> tuple[np.ndarray, tuple, np.ndarray]:
        """(base link origin [3], its orientation (x, y, z, w), its CoM [3]) in the world."""
        com, orn = self._call(pybullet.getBasePositionAndOrientation, self.body)
        inv_pos, inv_orn = pybullet.invertTransform(*self._base_inertial)
        # PyBullet's base pose is its CoM frame: link frame = CoM frame * inertial^-1.
        pos, orn = pybullet.multiplyTransforms(com, orn, inv_pos, inv_orn)
        return np.array(pos), orn, np.array(com)

    def joint_state(self) -> tuple[np.ndarray, np.ndarray]:
        """([J] positions rad, [J] velocities rad/s) in spec order."""
        states = self._call(pybullet.getJointStates, self.body, self.joints)
        return (np.array([s[0] for s in states]), np.array([s[1] for s in states]))

    def state(self) -> BulletState:
        """The readings after the last step (see :class:`BulletState`)."""
        pos, vel = self.joint_state()
        base_pos, base_orn, com = self._base_link_pose()
        com_vel, ang_vel = (np.array(v) for v in
                            self._call(pybullet.getBaseVelocity, self.body))
        # Velocity of the base link's origin: v_com + w x (origin - com).
        lin_vel = com_vel + np.cross(ang_vel, base_pos - com)
        base_rot = _rotation(base_orn)
        if self.imu_link < 0:
            imu_orn, imu_ang_vel = base_orn, ang_vel
        else:
            link = self._call(pybullet.getLinkState, self.body, self.imu_link,
                              computeLinkVelocity=1, computeForwardKinematics=1)
            imu_orn, imu_ang_vel = link[5], np.array(link[7])
        # The gyro measures the angular velocity in its own frame: R_imu^T w_world.
        gyro = _rotation(imu_orn).T @ imu_ang_vel
        x, y, z, w = base_orn
        return BulletState(
            time=self.time, joint_names=tuple(self.robot.joint_names), joint_pos=pos,
            joint_vel=vel, joint_effort=self.joint_effort.copy(),
            imu_orientation=np.array(imu_orn), imu_angular_velocity=gyro, base_pos=base_pos,
            base_quat=np.array([w, x, y, z]), base_lin_vel_world=lin_vel,
            base_lin_vel_body=base_rot.T @ lin_vel, base_ang_vel_body=base_rot.T @ ang_vel,
            base_height=float(base_pos[2]))

    def set_state(self, base_pos: Sequence[float], base_quat: Sequence[float],
                  base_lin_vel_world: Sequence[float], base_ang_vel_body: Sequence[float],
                  joint_pos: Sequence[float], joint_vel: Sequence[float]) -> None:
        """Put the robot in a state, in MuJoCo's free-joint terms (its ``qpos``/``qvel``):
        ``base_pos`` [3] the base link origin, ``base_quat`` [4] (w, x, y, z),
        ``base_lin_vel_world`` [3] m/s of that origin in world axes, ``base_ang_vel_body``
        [3] rad/s in base axes, ``joint_pos`` / ``joint_vel`` [J] in spec order. A fixed base
        is moved but keeps no velocity. The PD holds the given pose until the next targets."""
        base_pos = np.asarray(base_pos, dtype=np.float64)
        w, x, y, z = (float(v) for v in base_quat)
        norm = math.sqrt(w * w + x * x + y * y + z * z)
        orn = (x / norm, y / norm, z / norm, w / norm)
        joint_pos = np.asarray(joint_pos, dtype=np.float64)
        joint_vel = np.asarray(joint_vel, dtype=np.float64)
        n = self.robot.num_joints
        if joint_pos.shape != (n,) or joint_vel.shape != (n,):
            raise ValueError(f'joint_pos {joint_pos.shape} and joint_vel {joint_vel.shape}: give '
                             f'[{n}] values each, in the spec order {self.robot.joint_names}')
        # The CoM frame PyBullet places: link frame * inertial frame.
        com, com_orn = pybullet.multiplyTransforms(base_pos.tolist(), orn,
                                                   *self._base_inertial)
        self._call(pybullet.resetBasePositionAndOrientation, self.body, com, com_orn)
        ang_world = _rotation(orn) @ np.asarray(base_ang_vel_body, dtype=np.float64)
        # Velocity of the CoM: v_origin + w x (com - origin).
        com_vel = np.asarray(base_lin_vel_world, dtype=np.float64) + \
            np.cross(ang_world, np.array(com) - base_pos)
        self._call(pybullet.resetBaseVelocity, self.body, com_vel.tolist(), ang_world.tolist())
        for index, q, qd in zip(self.joints, joint_pos, joint_vel):
            self._call(pybullet.resetJointState, self.body, index, float(q), float(qd))
        # Rotors turn with their joints (else the gear would trade the joints' speed away).
        for rotor, qd in zip(self.rotors, joint_vel):
            self._call(pybullet.resetJointState, self.body, rotor, 0.0,
                       float(self.gear_ratio * qd))
        self.targets = joint_pos.copy()
        self.joint_effort = np.zeros(n)
        self.touched_termination = False

    def reset(self, joint_pos: Sequence[float] | None = None) -> None:
        """Standing: upright at the robot's reset height, at rest, joints at ``joint_pos``
        (default: the default pose); time restarts."""
        r = self.robot
        q = r.default_joint_pos if joint_pos is None else np.asarray(joint_pos, np.float64)
        height = HANGING_HEIGHT if self.fixed_base else r.init_base_height
        self.set_state([0.0, 0.0, height], [1.0, 0.0, 0.0, 0.0], np.zeros(3), np.zeros(3), q,
                       np.zeros(r.num_joints))
        self.time = 0.0

    # ----------------------------------------------------------------------------- stepping
    def pd_torque(self, targets: np.ndarray, joint_pos: np.ndarray,
                  joint_vel: np.ndarray) -> np.ndarray:
        """[J] tau = clip(Kp (target - q) - Kd qd, -effort, effort), targets clamped to the
        joint limits (the MuJoCo actuators' control range); all [J] in spec order."""
        r = self.robot
        target = np.clip(targets, r.joint_lower, r.joint_upper)
        if self.motor is not None:
            return self.motor.torque((target - joint_pos)[None], joint_vel[None], r.kp[None],
                                     r.kd[None])[0]
        # Explicit PD on the measured state, saturated at the URDF effort limit.
        tau = r.kp * (target - joint_pos) - r.kd * joint_vel
        return np.clip(tau, -r.effort_limit, r.effort_limit)

    def drive(self, targets: np.ndarray) -> np.ndarray:
        """One drive period: the PD torque of the current state, held over the period's
        physics steps; returns it ([J] N m, spec order)."""
        pos, vel = self.joint_state()
        tau = self.pd_torque(targets, pos, vel)
        forces = tau.tolist()
        for _ in range(self.physics_steps_per_drive):
            # Applied torques last one PyBullet step: given again before each.
            self._call(pybullet.setJointMotorControlArray, self.body, self.joints,
                       pybullet.TORQUE_CONTROL, forces=forces)
            self._call(pybullet.stepSimulation)
            if self.termination_links and not self.touched_termination:
                self.touched_termination = self._termination_contact()
        self.time += self.drive_dt
        self.joint_effort = tau
        return tau

    def step(self, targets: np.ndarray) -> None:
        """One control period with [J] targets (spec order) at the drive rate."""
        self.targets = np.asarray(targets, dtype=np.float64).copy()
        self.touched_termination = False
        for _ in range(self.drive_per_control):
            self.drive(self.targets)

    def _termination_contact(self) -> bool:
        """Whether a termination body pushes the floor harder than ``contact_force`` (the net
        force per body, as MuJoCo's contact sensors sum it)."""
        net: dict[int, np.ndarray] = {}
        for c in self._call(pybullet.getContactPoints, self.body, self.floor):
            link = c[3]
            if link not in self.termination_links:
                continue
            # Normal force along the normal plus both friction forces along their directions.
            force = c[9] * np.array(c[7]) + c[10] * np.array(c[11]) + c[12] * np.array(c[13])
            net[link] = net.get(link, 0.0) + force
        limit = self.termination.contact_force ** 2
        return any(float(f @ f) > limit for f in net.values())

    def fallen(self, state: BulletState | None = None) -> bool:
        """The sim node's failure test: tilt, trunk height, a termination-body contact during
        the last control period, or a diverged simulation (non-finite, or a joint faster than
        ``max_joint_vel``)."""
        s = self.state() if state is None else state
        term = self.termination
        if not (np.isfinite(s.joint_pos).all() and np.isfinite(s.joint_vel).all() and
                np.isfinite(s.base_quat).all()) or \
                np.abs(s.joint_vel).max() > term.max_joint_vel:
            return True
        w, x, y, z = s.base_quat
        # cos(tilt) = 1 - 2 (x^2 + y^2) for a unit quaternion (the sim node's test).
        return bool(1.0 - 2.0 * (x * x + y * y) < math.cos(term.max_tilt) or
                    s.base_height < self.min_base_height or self.touched_termination)


class StudentDriver:
    """The policy node's tick without ROS or its safety machine (in RL, fade 1): joint state
    by name, IMU, command -> observation -> model -> clipped action -> shaped target; the gait
    clock and the rate limit follow the states' stamps, as the node's do."""

    def __init__(self, robot: RobotSpec, policy: OnnxPolicy, max_delta_per_tick: float = 0.0):
        self.robot = robot
        self.policy = policy
        self.order = JointOrder(robot)
        self.assembler = ObservationAssembler(robot, policy_clip(policy))
        self.assembler.set_history(policy.obs_history)
        self.shaper = CommandShaper(robot, max_delta_per_tick)
        self._last_stamp: float | None = None

    def start(self, command: Sequence[float], joint_pos: np.ndarray) -> None:
        """A new episode: forget the last action and window, restart the gait clock and the
        rate limit at the measured pose, take the (vx, vy, yaw rate) command."""
        self.assembler.reset()
        self.assembler.set_command(command_array(*command))
        self.shaper.restart(joint_pos)
        self._last_stamp = None

    def tick(self, state: BulletState) -> np.ndarray:
        """[J] joint targets (spec order) for a state; BadInput or ValueError when the node
        would fault instead (bad input, a non-finite observation or action)."""
        pos, vel = self.order.joint_arrays(state.joint_names, state.joint_pos, state.joint_vel)
        quat, gyro = imu_arrays(state.imu_orientation, state.imu_angular_velocity)
        a = self.assembler
        frame = a.observe(pos, vel, quat, gyro)
        if not np.isfinite(frame.astype(np.float32)).all():
            raise ValueError('the observation is not finite as float32')
        action = self.policy(a.model_input(frame))
        if not np.isfinite(action).all():
            raise ValueError(f'policy action {action.tolist()} is not finite')
        # The time this tick stands for: since the previous state (None: one control period).
        elapsed = None if self._last_stamp is None else state.time - self._last_stamp
        self._last_stamp = state.time
        # The trained action range, then q0 + scale * a through the node's shaping.
        action = np.clip(action, -a.action_clip, a.action_clip)
        raw = self.robot.default_joint_pos + self.robot.action_scale * action
        target, _ = self.shaper.shape(raw, elapsed)
        a.advance(action, frame, elapsed)
        return target


def run_episodes(model_path: str | Path, robot: RobotSpec, *, episodes: int = 1,
                 command: Sequence[float] = (0.5, 0.0, 0.0),
                 duration_s: float = GATE_DEFAULTS.episode_s,
                 drive_rate_hz: float = 1000.0, seed: int = 0, ground_friction: float = 1.0,
                 settle_s: float = GATE_DEFAULTS.settle_s,
                 init_joint_noise: float = INIT_JOINT_NOISE, armature: bool = True,
                 rotor_gear_ratio: float = ROTOR_GEAR_RATIO, physics_steps_per_drive: int = 1,
                 termination: TerminationConfig | None = None) -> list[Episode]:
    """Run the exported student closed-loop in PyBullet: ``episodes`` episodes of
    ``duration_s`` at ``command`` (vx m/s, vy m/s, yaw rate rad/s), each from the standing
    pose with its joints perturbed uniformly by +-``init_joint_noise`` rad (episode i draws
    from (seed, i)); an episode ends early at a fall.

    Returns the gate's :class:`~.gate_scoring.Episode` per episode: ``fell``, ``velocity``
    [T, 3] body (vx, vy, yaw rate) from ``settle_s`` on, ``joint_pos`` / ``effort`` [T', J]
    (spec order) of every control step, ``params`` (engine, drive rate, friction, steps run,
    and ``fault``: why the policy node would have stopped acting, if it would).
    """
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f'episodes = {episodes!r}: give a whole number >= 1')
    if not (isinstance(duration_s, Real) and math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f'duration_s = {duration_s!r}: give a finite episode length > 0 [s]')
    if len(command) != 3:
        raise ValueError(f'command = {command!r}: give (vx m/s, vy m/s, yaw rate rad/s)')
    if not (isinstance(settle_s, Real) and 0 <= settle_s < math.inf):
        raise ValueError(f'settle_s = {settle_s!r}: give a finite time >= 0 [s] from which '
                         'tracking is measured (the gate: verify.settle_s)')
    if not (isinstance(init_joint_noise, Real) and 0 <= init_joint_noise < math.inf):
        raise ValueError(f'init_joint_noise = {init_joint_noise!r}: give a finite noise >= 0 '
                         '[rad]')
    policy = OnnxPolicy(model_path, robot)
    driver = StudentDriver(robot, policy)
    steps = episode_steps(duration_s, robot.control_dt)
    out = []
    with BulletWorld(robot, drive_rate_hz=drive_rate_hz, ground_friction=ground_friction,
                     armature=armature, rotor_gear_ratio=rotor_gear_ratio,
                     physics_steps_per_drive=physics_steps_per_drive,
                     termination=termination) as world:
        for i in range(episodes):
            rng = np.random.default_rng([seed, i])
            noise = rng.uniform(-init_joint_noise, init_joint_noise, robot.num_joints)
            world.reset(np.clip(robot.default_joint_pos + noise, robot.joint_lower,
                                robot.joint_upper))
            out.append(_episode(world, driver, command, steps, settle_s))
    return out


def _episode(world: BulletWorld, driver: StudentDriver, command: Sequence[float], steps: int,
             settle_s: float) -> Episode:
    """One episode from the world's current state: the sim node's record of it, as an
    Episode (early end at a fall or a fault)."""
    robot = world.robot
    recorder = EpisodeRecorder(robot.joint_names, 0, steps)

    def record(s: BulletState) -> None:
        recorder.add(s.time, s.base_lin_vel_body, s.base_ang_vel_body, s.joint_pos,
                     s.joint_effort)

    state = world.state()
    record(state)
    driver.start(command, state.joint_pos)
    fell, fault, done = False, '', 0
    while done < steps and not fell:
        try:
            targets = driver.tick(state)
        except (BadInput, ValueError) as exc:
            fell, fault = True, str(exc)  # the node would damp (PASSIVE): a failed episode
            break
        world.step(targets)
        done += 1
        state = world.state()
        record(state)
        fell = world.fallen(state)
    rows = recorder.table()
    table = read_episode((ROW_DIM, ','.join(recorder.columns)), rows.shape, rows.ravel(),
                         robot.joint_names)
    status = {'friction': repr(world.ground_friction), 'engine': ENGINE,
              'drive_rate_hz': repr(world.drive_rate_hz), 'steps': str(done),
              'fault': fault}
    episode = episode_of(table, done, settle_s, fell, status)
    episode.params.update({k: status[k] for k in ('engine', 'drive_rate_hz', 'steps', 'fault')})
    return episode


def summarize(episodes: list[Episode], drive_rate_hz: float, command_vx: float = 0.5,
              cfg: VerifyConfig | None = None, duration_s: float | None = None
              ) -> dict[str, Any]:
    """The second engine's verdict by the gate's limits (``cfg``, default
    :class:`~.gate_scoring.VerifyConfig`, its ``command_vx`` replaced by ``command_vx``): the
    gate's terrain-row rule (:func:`~.gate_scoring.score_terrain`): fall rate below
    ``max_fall_rate`` and the vx tracking error (mean |command - vx| after settling, episodes
    without a fall; None when all fell) within ``max_vx_error``.

    Returns {'engine', 'drive_rate_hz', 'vx_error', 'falls', 'episodes', 'fall_rate',
    'max_vx_error', 'max_fall_rate', 'passed'}.
    """
    cfg = replace(cfg if cfg is not None else VerifyConfig(), command_vx=float(command_vx))
    row = score_terrain(cfg, 'flat', 0, episodes,
                        cfg.episode_s if duration_s is None else duration_s)
    return {'engine': ENGINE, 'drive_rate_hz': float(drive_rate_hz),
            'vx_error': row.vx_error if math.isfinite(row.vx_error) else None,
            'falls': row.falls, 'episodes': row.episodes, 'fall_rate': row.fall_rate,
            'max_vx_error': row.max_vx_error, 'max_fall_rate': row.max_fall_rate,
            'passed': row.passed}
