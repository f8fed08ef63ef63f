"""Build the MuJoCo model from the robot's URDF: free base, floor, PD actuators and sensors.

The floor is a plane, or a heightfield of a generated :class:`~.terrain.Terrain`.

MuJoCo loads the URDF directly (``MjSpec.from_file``); everything a simulation needs on top of
it is added on the spec here, from the RobotSpec, so there is no hand-written duplicate MJCF.
With the ``ideal_pd`` actuator the PD law runs inside MuJoCo at the physics rate as a position
actuator::

    tau = clip(Kp * (target - q) - Kd * qd, -effort, effort)

``dc_motor`` is the same law at a DC motor's voltage limit (core/sim/actuator.py), also inside
MuJoCo's step: a position actuator with damping Kd - c saturating at the stall torque tau_s,
plus the back-EMF damper -c qd (c = tau_s / no-load speed), their sum clamped to the effort limit
on the joint. ``network`` gets a torque motor per joint (ctrl = the learned actuator's torque,
computed between physics steps). Each joint carries the robot's rotor inertia (``armature``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
import xml.etree.ElementTree as ET

import mujoco
import numpy as np

from .ground import GROUND_BOX
from .robot_spec import RobotSpec
from .terrain import Terrain

FLOOR = 'floor'
# Name suffix of a dc_motor joint's back-EMF damper (the second actuator on the joint).
BACK_EMF = '_back_emf'
TERRAIN_HFIELD = 'terrain'
ROOT_JOINT = 'floating_base'
# The weld equality of a robot on a stand, and how many reset heights up the stand holds it.
STAND = 'stand'
STAND_LIFT = 3.0
# Inertia added to the trunk's free joint on a stand [kg, kg m^2].
STAND_ARMATURE = 1e4
IMU_SITE = 'imu'
CONTACT_DATA = (1 << int(mujoco.mjtConDataField.mjCONDATA_FOUND)) | \
    (1 << int(mujoco.mjtConDataField.mjCONDATA_FORCE))
REDUCE_NETFORCE = 3


@dataclass(frozen=True)
class SensorSlices:
    """Column ranges of named sensor groups inside ``sensordata`` (start, stop)."""

    framequat: tuple[int, int]
    gyro: tuple[int, int]
    accelerometer: tuple[int, int]
    foot_pos: tuple[int, int]
    joint_torque: tuple[int, int]
    foot_contact: tuple[int, int]
    penalised_contact: tuple[int, int]
    termination_contact: tuple[int, int]


def _add_contact_sensor(spec: mujoco.MjSpec, body: str, group: str) -> None:
    # Net contact force between one body and the ground: [found, fx, fy, fz]. Robot geoms
    # touch nothing but the ground (the floor, or the ground boxes of ground.py).
    sensor = spec.add_sensor(name=f'{group}_{body}', type=mujoco.mjtSensor.mjSENS_CONTACT,
                             objtype=mujoco.mjtObj.mjOBJ_BODY, objname=body)
    sensor.intprm[0:3] = [CONTACT_DATA, REDUCE_NETFORCE, 1]


def scene_urdf(path: Path) -> str:
    """The URDF's text with the MuJoCo compiler settings a simulation scene needs.

    MuJoCo's URDF defaults drop visual geoms (meshes and the floor texture look lost) and fuse
    every link hanging on a fixed joint into its parent (an IMU or foot link that sensors sit
    on disappears). Whatever the file's own ``<mujoco><compiler>`` block says, visuals are kept
    and static links are not fused, and every mesh file is resolved to an absolute path
    (:func:`resolve_mesh`), so any URDF loads the same way from any working directory.
    """
    root = ET.fromstring(path.read_text())
    block = root.find('mujoco')
    if block is None:
        block = ET.SubElement(root, 'mujoco')
    compiler = block.find('compiler')
    if compiler is None:
        compiler = ET.SubElement(block, 'compiler')
    compiler.set('discardvisual', 'false')
    compiler.set('fusestatic', 'false')
    compiler.set('strippath', 'false')
    meshdir = path.parent / compiler.attrib.pop('meshdir', '.')
    for mesh in root.iter('mesh'):
        if mesh.get('filename'):
            mesh.set('filename', str(resolve_mesh(mesh.get('filename'), path, meshdir)))
    return ET.tostring(root, encoding='unicode')


def resolve_mesh(filename: str, urdf: Path, meshdir: Path) -> Path:
    """An absolute mesh path for a URDF ``<mesh filename>``.

    ``package://PKG/REL`` is looked up in PKG's ament share folder when ROS knows it, then
    next to the URDF and in its parent folders (a package's ``urdf/`` and ``meshes/`` sit side
    by side); ``file://`` and absolute paths are taken as they are; other relative paths are
    taken from the ``meshdir`` of the URDF's ``<mujoco><compiler>`` block, else its folder.
    """
    if filename.startswith('file://'):
        filename = filename[len('file://'):]
    if filename.startswith('package://'):
        package, _, rel = filename[len('package://'):].partition('/')
        roots = [*_ament_share(package), urdf.parent, urdf.parent.parent,
                 urdf.parent.parent.parent]
        candidates = [root / rel for root in roots]
    else:
        candidates = [Path(filename) if Path(filename).is_absolute() else meshdir / filename]
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    raise ValueError(f'{urdf}: mesh {filename!r} not found (looked at '
                     f'{", ".join(str(c) for c in candidates)})')


def _ament_share(package: str) -> list[Path]:
    try:
        from ament_index_python.packages import get_package_share_directory
        return [Path(get_package_share_directory(package))]
    except Exception:  # noqa: BLE001 - no ROS, or the package is not installed
        return []


def _add_floor(spec: mujoco.MjSpec, robot: RobotSpec, terrain: Terrain | None,
               textured: bool) -> None:
    """The ground: the geom FLOOR (a plane, or the terrain's heightfield) and, with box ground
    (terrain collision 'boxes', ground.py), the heightfield's other parts and the pool of
    ground boxes; all with the same contacts.

    The floor's priority makes its friction the contact friction (randomised per world).
    ``textured``: a checker texture makes motion visible in rendered gaits. Its 192 KiB of
    pixels are 4/5 of a compiled model, and a batch holds a model per world: 256 of them span
    60 MiB instead of 12 MiB, past this machine's 32 MiB L3 cache (bench/env_throughput.py
    --visuals).
    """
    contact = dict(name=FLOOR, contype=1, conaffinity=0, priority=1,
                   friction=[robot.foot_friction, 0.005, 0.0001])
    if textured:
        spec.add_texture(name='grid', type=mujoco.mjtTexture.mjTEXTURE_2D,
                         builtin=mujoco.mjtBuiltin.mjBUILTIN_CHECKER, width=256, height=256,
                         rgb1=[0.32, 0.36, 0.32], rgb2=[0.42, 0.47, 0.42])
        grid = spec.add_material(name='grid', texrepeat=[8, 8], texuniform=True)
        grid.textures[int(mujoco.mjtTextureRole.mjTEXROLE_RGB)] = 'grid'
        contact['material'] = 'grid'
    if terrain is None:
        spec.worldbody.add_geom(type=mujoco.mjtGeom.mjGEOM_PLANE, size=[0, 0, 0.05], **contact)
        return
    pool = terrain.max_ground_boxes()
    if pool and textured:
        # A picture shows the true heights (boxes exist only around the robot), the collision
        # geoms stay in group 3 (hidden).
        _add_heightfield(spec, terrain, terrain.heights, 'terrain_visual', contype=0,
                         conaffinity=0, material=contact['material'], name='terrain_visual')
        contact['group'] = 3
    strips = terrain.heightfield_strips()
    if not strips:
        # All ground is boxes: the floor is a plane below it all, that no robot reaches.
        spec.worldbody.add_geom(type=mujoco.mjtGeom.mjGEOM_PLANE, size=[0, 0, 0.05],
                                pos=[0, 0, float(terrain.heights.min()) - terrain.footprint],
                                **contact)
    step = terrain.heightfield_stride
    for k, (i0, i1, j0, j1) in enumerate(strips):
        # The floor, then its other parts (all of them ground: physics.ground_geoms).
        part = {**contact, 'name': FLOOR if k == 0 else f'{FLOOR}_{k}'}
        _add_heightfield(spec, terrain, terrain.heights[i0:i1 + 1:step, j0:j1 + 1:step],
                         TERRAIN_HFIELD if k == 0 else f'{TERRAIN_HFIELD}_{k}',
                         origin=terrain.origin + np.array([i0, j0]) * terrain.cell,
                         cell=step * terrain.cell, **part)
    # The pool of ground boxes, one static body each (ground.py fills them around the robot).
    for k in range(pool):
        body = spec.worldbody.add_body(name=f'{GROUND_BOX}{k}', pos=[k * terrain.cell, 0, -10.0])
        body.add_geom(type=mujoco.mjtGeom.mjGEOM_BOX, size=[0.5 * terrain.cell] * 3,
                      **{**contact, 'name': f'{GROUND_BOX}{k}', 'group': 3})
    # A heightfield cell is two triangular prisms. MuJoCo's native CCD returns the smallest
    # penetration of each prism, which for a claw tip pressed a few mm into the ground can be
    # through an internal (vertical) prism face: the normal turns horizontal and the tip sinks
    # through the step. libccd's MPR pushes out along the prism-to-tip direction instead
    # (test_terrain.py: claws on stairs stay above the surface). Only heightfield pairs use CCD.
    spec.option.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_NATIVECCD)


def is_ground(name: str) -> bool:
    """A geom that is ground: the floor, its other heightfield parts, the ground boxes."""
    return name == FLOOR or name.startswith(f'{FLOOR}_') or name.startswith(GROUND_BOX)


def _add_heightfield(spec: mujoco.MjSpec, terrain: Terrain, heights: np.ndarray, hfield: str,
                     origin: np.ndarray | None = None, cell: float | None = None,
                     **geom) -> None:
    # MuJoCo stores elevations in [0, 1] x size[2] above the geom; its rows run along y.
    low, high = float(heights.min()), float(heights.max())
    elevation = max(high - low, 1e-3)
    half = 0.5 * (np.asarray(heights.shape) - 1) * (terrain.cell if cell is None else cell)
    origin = terrain.origin if origin is None else origin
    spec.add_hfield(name=hfield, size=[half[0], half[1], elevation, max(elevation, 0.1)],
                    nrow=heights.shape[1], ncol=heights.shape[0],
                    userdata=((heights.T - low) / elevation).ravel().tolist())
    spec.worldbody.add_geom(type=mujoco.mjtGeom.mjGEOM_HFIELD, hfieldname=hfield,
                            pos=[*(origin + half), low], **geom)


def build_spec(robot: RobotSpec, *, terrain: Terrain | None = None, solver_iterations: int = 4,
               solver_ls_iterations: int = 6, noslip_iterations: int = 0,
               visuals: bool = True, solver: str = 'newton',
               cone: str = 'pyramidal', stand: bool = False) -> mujoco.MjSpec:
    """The robot on a flat floor (or on ``terrain``'s heightfield), ready to compile.

    ``visuals=False`` leaves out the geoms that only show the robot (no contact) on links whose
    mass and inertia the URDF gives: the same dynamics bit for bit with half the geoms to pose
    every physics step (what a batch of worlds wants; a renderer wants them).
    ``stand``: the trunk held on a stand, upright, ``STAND_LIFT`` reset heights above the floor
    with the legs hanging free (system identification's excitation): a weld equality named
    ``STAND`` of the trunk to the world; the free joint (and the qpos layout) stays.
    """
    spec = mujoco.MjSpec.from_string(scene_urdf(Path(robot.model_path)))
    spec.option.timestep = robot.sim_dt
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    spec.option.iterations = solver_iterations
    spec.option.ls_iterations = solver_ls_iterations
    # MuJoCo's contacts are soft: under a steady sideways load friction creeps at any
    # coefficient. The noslip pass after the main solver removes that creep (0: off).
    spec.option.noslip_iterations = noslip_iterations
    spec.option.cone = {'pyramidal': mujoco.mjtCone.mjCONE_PYRAMIDAL,
                        'elliptic': mujoco.mjtCone.mjCONE_ELLIPTIC}[cone]
    spec.option.solver = {'newton': mujoco.mjtSolver.mjSOL_NEWTON,
                          'cg': mujoco.mjtSolver.mjSOL_CG}[solver]

    base = spec.body(robot.base_body)
    # (init_base_height is 0 while the standing height is computed.)
    base.pos = [0.0, 0.0, robot.init_base_height * (STAND_LIFT if stand else 1.0)]
    root = base.add_freejoint(name=ROOT_JOINT)
    if stand:
        if terrain is not None:
            raise ValueError('a robot on a stand has no terrain under it; give one or the other')
        # The trunk welded where qpos0 puts it (stiff: a time constant of two physics steps),
        # and too heavy for the legs to rock it: a real stand is rigid.
        weld = spec.add_equality(name=STAND, type=mujoco.mjtEq.mjEQ_WELD,
                                 objtype=mujoco.mjtObj.mjOBJ_BODY, name1=robot.base_body)
        weld.solref = [2 * robot.sim_dt, 1.0]
        weld.solimp = [0.99, 0.999, 0.001, 0.5, 2.0]
        root.armature = STAND_ARMATURE

    _add_floor(spec, robot, terrain, textured=visuals)
    spec.worldbody.add_light(pos=[0, 0, 3], dir=[0, 0, -1], castshadow=False)
    # Robot collision geoms touch the floor only (no self-collision).
    for geom in spec.geoms:
        if not is_ground(geom.name) and geom.contype:
            geom.contype, geom.conaffinity = 0, 1
    if not visuals:
        drop_visual_geoms(spec)

    model = robot.actuator.model
    back_emf = back_emf_damping(robot)
    armature = np.broadcast_to(robot.armature, (robot.num_joints,))
    for i, (name, kp, kd, effort, lo, hi, c) in enumerate(zip(
            robot.joint_names, robot.kp, robot.kd, robot.effort_limit, robot.joint_lower,
            robot.joint_upper, back_emf)):
        joint = spec.joint(name)
        joint.armature = float(armature[i])
        # The URDF's joint friction and damping, unless the robot (an overlay) gives its own.
        if robot.joint_frictionloss is not None:
            joint.frictionloss = float(robot.joint_frictionloss[i])
        if robot.joint_damping is not None:
            # (MuJoCo 4's joint damping is a polynomial in speed: the linear term only.)
            joint.damping = [float(robot.joint_damping[i]), 0.0, 0.0]
        act = spec.add_actuator(name=name, target=name, trntype=mujoco.mjtTrn.mjTRN_JOINT,
                                gaintype=mujoco.mjtGain.mjGAIN_FIXED,
                                biastype=mujoco.mjtBias.mjBIAS_AFFINE)
        act.forcelimited = mujoco.mjtLimited.mjLIMITED_TRUE
        act.forcerange = [-effort, effort]
        act.ctrllimited = mujoco.mjtLimited.mjLIMITED_TRUE
        if model == 'network':
            # A torque motor: ctrl is the torque the learned actuator computed.
            act.gainprm[0] = 1.0
            act.biastype = mujoco.mjtBias.mjBIAS_NONE
            act.ctrlrange = [-effort, effort]
            continue
        act.gainprm[0] = kp
        act.biasprm[0:3] = [0.0, -kp, -(kd - c)]
        act.ctrlrange = [lo, hi]
        if model == 'dc_motor':
            # PD + c qd saturates at the stall torque; the joint's total at the effort limit.
            sat = robot.actuator.saturation_torque[robot.joint_names.index(name)]
            act.forcerange = [-sat, sat]
            joint.actfrclimited = mujoco.mjtLimited.mjLIMITED_TRUE
            joint.actfrcrange = [-effort, effort]
    if model == 'dc_motor':
        # The back-EMF: -c qd on each joint, unsaturated (a second actuator without input).
        for name, c in zip(robot.joint_names, back_emf):
            emf = spec.add_actuator(name=f'{name}{BACK_EMF}', target=name,
                                    trntype=mujoco.mjtTrn.mjTRN_JOINT,
                                    gaintype=mujoco.mjtGain.mjGAIN_FIXED,
                                    biastype=mujoco.mjtBias.mjBIAS_AFFINE)
            emf.gainprm[0] = 0.0
            emf.biasprm[0:3] = [0.0, 0.0, -c]

    spec.body(robot.imu_body).add_site(name=IMU_SITE, size=[0.01, 0.01, 0.01])
    site = mujoco.mjtObj.mjOBJ_SITE
    spec.add_sensor(name='imu_quat', type=mujoco.mjtSensor.mjSENS_FRAMEQUAT, objtype=site,
                    objname=IMU_SITE)
    spec.add_sensor(name='imu_gyro', type=mujoco.mjtSensor.mjSENS_GYRO, objtype=site,
                    objname=IMU_SITE)
    spec.add_sensor(name='imu_acc', type=mujoco.mjtSensor.mjSENS_ACCELEROMETER, objtype=site,
                    objname=IMU_SITE)
    for foot in robot.foot_bodies:
        spec.add_sensor(name=f'pos_{foot}', type=mujoco.mjtSensor.mjSENS_FRAMEPOS,
                        objtype=mujoco.mjtObj.mjOBJ_XBODY, objname=foot)
    for name in robot.joint_names:
        # Every actuator's force on the joint, after the joint's limit (dc_motor: two).
        spec.add_sensor(name=f'torque_{name}', type=mujoco.mjtSensor.mjSENS_JOINTACTFRC,
                        objtype=mujoco.mjtObj.mjOBJ_JOINT, objname=name)
    for group, bodies in (('foot', robot.foot_bodies),
                          ('penalised', robot.penalised_contact_bodies),
                          ('termination', robot.termination_contact_bodies)):
        for body in bodies:
            _add_contact_sensor(spec, body, group)
    return spec


def back_emf_damping(robot: RobotSpec) -> np.ndarray:
    """[J] a dc_motor's back-EMF damping c = stall torque / no-load speed [N m s/rad]; 0 for
    the other actuator models."""
    act = robot.actuator
    if act.model != 'dc_motor':
        return np.zeros(robot.num_joints)
    return act.saturation_torque / act.no_load_speed


def drop_visual_geoms(spec: mujoco.MjSpec) -> None:
    """Delete the geoms that never collide from bodies with an explicit inertial (theirs does
    not come from geoms, unless the compiler is told to take it from them)."""
    if spec.compiler.inertiafromgeom == mujoco.mjtInertiaFromGeom.mjINERTIAFROMGEOM_TRUE:
        return
    for body in spec.bodies:
        if body.name == 'world' or not body.explicitinertial:
            continue
        for geom in list(body.geoms):
            if not geom.contype and not geom.conaffinity:
                spec.delete(geom)


def build_model(robot: RobotSpec, **options) -> mujoco.MjModel:
    """Compile the scene; see :func:`build_spec` (``terrain``, solver options, ``visuals``)."""
    model = build_spec(robot, **options).compile()
    if robot.actuator.model != 'network':
        # The PD damping term as given: MuJoCo's compiler reads a positive biasprm[2] (a
        # dc_motor whose back-EMF c exceeds Kd) as a damping ratio and would replace it.
        j = robot.num_joints
        model.actuator_biasprm[:j, 2] = -(robot.kd - back_emf_damping(robot))
    return model


def lowest_foot_points(model: mujoco.MjModel, data: mujoco.MjData,
                       robot: RobotSpec) -> np.ndarray:
    """[F] world height of each foot body's lowest collision point (after kinematics)."""
    out = []
    for foot in robot.foot_bodies:
        body = model.body(foot).id
        geoms = [g for g in range(model.ngeom)
                 if model.geom_bodyid[g] == body and model.geom_conaffinity[g]]
        if not geoms:
            raise ValueError(f'foot body {foot!r} has no collision geometry')
        out.append(min(data.geom_xpos[g, 2] - model.geom_rbound[g] for g in geoms))
    return np.asarray(out)


def standing_height(robot: RobotSpec) -> float:
    """Height [m] of the trunk origin above the ground when the robot stands on its feet at
    the default pose (upright): what robot-sized defaults are derived from."""
    model = build_model(robot)
    data = mujoco.MjData(model)
    data.qpos[:] = standing_qpos(model, robot)
    data.qpos[2] = 0.0
    mujoco.mj_kinematics(model, data)
    return float(-lowest_foot_points(model, data, robot).min())


def sensor_slices(robot: RobotSpec) -> SensorSlices:
    """Where each sensor group sits in ``sensordata`` (sensors are added in this order)."""
    sizes = [('framequat', 4), ('gyro', 3), ('accelerometer', 3),
             ('foot_pos', 3 * len(robot.foot_bodies)), ('joint_torque', robot.num_joints),
             ('foot_contact', 4 * len(robot.foot_bodies)),
             ('penalised_contact', 4 * len(robot.penalised_contact_bodies)),
             ('termination_contact', 4 * len(robot.termination_contact_bodies))]
    out, start = {}, 0
    for name, size in sizes:
        out[name] = (start, start + size)
        start += size
    return SensorSlices(**out)


def joint_addresses(model: mujoco.MjModel, robot: RobotSpec) -> tuple[np.ndarray, np.ndarray]:
    """qpos and qvel indices of the actuated joints, in robot order."""
    ids = [model.joint(name).id for name in robot.joint_names]
    return model.jnt_qposadr[ids].copy(), model.jnt_dofadr[ids].copy()


def on_stand(model: mujoco.MjModel) -> bool:
    """Whether the model holds its trunk on a stand (:func:`build_spec`'s ``stand``)."""
    return mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_EQUALITY, STAND) >= 0


def standing_qpos(model: mujoco.MjModel, robot: RobotSpec) -> np.ndarray:
    """qpos with the base at its reset height (on a stand: where the stand holds it), upright,
    joints at the default pose."""
    qpos = model.qpos0.copy()
    qpos[0:3] = [0.0, 0.0, robot.init_base_height * (STAND_LIFT if on_stand(model) else 1.0)]
    qpos[3:7] = [1.0, 0.0, 0.0, 0.0]
    qadr, _ = joint_addresses(model, robot)
    qpos[qadr] = robot.default_joint_pos
    return qpos
