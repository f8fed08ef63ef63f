"""The MuJoCo model built from the URDF: compiles, matches the robot spec, and stands."""

import dataclasses

import mujoco
import numpy as np
import pytest

from claw_rl_ros.core.config import ConfigError
from claw_rl_ros.core.sim.demo import hold_default_pose
from claw_rl_ros.core.sim.robot import load_robot, per_joint, spec_from_config
from claw_rl_ros.core.sim.robot_spec import RobotConfig
from claw_rl_ros.core.config import load_yaml, from_dict
from claw_rl_ros.core import paths
from claw_rl_ros.core.sim.scene import build_model, IMU_SITE, sensor_slices
from claw_rl_ros.core.sim.urdf import load_urdf


def robot_config():
    raw = load_yaml(paths.config_path('robots/claw_quadruped.yaml'))['robot']
    return from_dict(RobotConfig, raw)


def test_model_compiles_with_actuators_sensors_and_free_base(robot):
    m = build_model(robot)
    assert m.nu == robot.num_joints == 12
    assert m.nq == 7 + 12 and m.nv == 6 + 12
    assert m.opt.timestep == pytest.approx(0.005)
    assert m.site(IMU_SITE).bodyid == m.body(robot.imu_body).id
    assert sensor_slices(robot).termination_contact[1] == m.nsensordata
    kinds = {mujoco.mjtSensor(t).name for t in m.sensor_type}
    assert {'mjSENS_FRAMEQUAT', 'mjSENS_GYRO', 'mjSENS_ACCELEROMETER',
            'mjSENS_CONTACT'} <= kinds


def test_actuators_follow_spec_order_gains_and_limits(robot):
    m = build_model(robot)
    for i, name in enumerate(robot.joint_names):
        act = m.actuator(i)
        assert act.name == name
        assert m.joint(m.actuator_trnid[i, 0]).name == name
        # tau = Kp * ctrl - Kp * q - Kd * qd, clamped to the URDF effort limit.
        assert m.actuator_gainprm[i, 0] == pytest.approx(robot.kp[i])
        np.testing.assert_allclose(m.actuator_biasprm[i, :3], [0, -robot.kp[i], -robot.kd[i]])
        np.testing.assert_allclose(m.actuator_forcerange[i], [-robot.effort_limit[i],
                                                              robot.effort_limit[i]])
        np.testing.assert_allclose(m.actuator_ctrlrange[i], [robot.joint_lower[i],
                                                             robot.joint_upper[i]])


def test_urdf_and_robot_spec_agree(robot):
    urdf = load_urdf(robot.model_path)
    m = build_model(robot)
    for i, name in enumerate(robot.joint_names):
        joint = urdf.joints[name]
        assert joint.type == 'revolute'
        assert (robot.joint_lower[i], robot.joint_upper[i]) == (joint.lower, joint.upper)
        np.testing.assert_allclose(m.jnt_range[m.joint(name).id], [joint.lower, joint.upper])
        assert robot.joint_lower[i] <= robot.default_joint_pos[i] <= robot.joint_upper[i]
    # Legs in order FL, FR, RL, RR, each hip abduction, hip pitch, knee.
    assert robot.joint_names[:3] == ['FL_hip_joint', 'FL_thigh_joint', 'FL_calf_joint']
    assert [n.split('_')[0] for n in robot.joint_names[::3]] == ['FL', 'FR', 'RL', 'RR']
    assert [urdf.joints[n].axis for n in robot.joint_names[:3]] == [(1, 0, 0), (0, 1, 0),
                                                                    (0, 1, 0)]
    for foot in robot.foot_bodies:
        assert foot in urdf.links
    assert m.body_subtreemass[m.body(robot.base_body).id] == pytest.approx(urdf.total_mass)


def test_stands_on_default_pose_for_five_seconds():
    report = hold_default_pose(seconds=5.0, num_envs=4)
    assert report.fell == 0
    assert report.max_tilt_deg < 5.0
    assert 0.20 < report.mean_height < 0.30
    assert report.feet_in_contact > 0.95
    assert report.max_joint_error < 0.15


def test_spec_metadata_round_trip_and_mismatch(robot):
    meta = robot.to_metadata()
    assert robot.mismatches(meta) == []
    assert meta['obs_dim'] == 47 and meta['action_dim'] == 12
    swapped = dict(meta, joint_names=meta['joint_names'][3:6] + meta['joint_names'][:3]
                   + meta['joint_names'][6:])
    problems = robot.mismatches(swapped)
    assert len(problems) == 1 and problems[0].startswith('joint_names:')
    stiff = dict(meta, kp=[k * 2 for k in meta['kp']])
    assert robot.mismatches(stiff)[0].startswith('kp:')
    missing = {k: v for k, v in meta.items() if k != 'observation'}
    assert 'observation: missing' in robot.mismatches(missing)[0]


def test_action_to_target_clamps_to_joint_limits(robot):
    huge = np.full((2, 12), 100.0)
    huge[1] *= -1
    targets = robot.action_to_target(huge)
    np.testing.assert_array_equal(targets[0], robot.joint_upper)
    np.testing.assert_array_equal(targets[1], robot.joint_lower)


@pytest.mark.parametrize('change, key', [
    ({'joint_names': ['FL_hip_joint', 'FL_foot_joint']}, 'joint_names'),
    ({'default_joint_pos': [0.0] * 11}, 'default_joint_pos'),
    ({'stiffness': {'hip': 20.0}}, 'stiffness'),
    ({'foot_bodies': ['FL_paw']}, 'foot_bodies'),
    ({'observations': {'policy': [{'name': 'base_lin_vel'}]}}, 'observations'),
    ({'observations': {'policy': [{'name': 'joint_pos', 'scale': [1.0, 2.0]}]}}, 'observations'),
    ({'model_file': 'urdf/missing.urdf'}, 'model_file'),
])
def test_bad_robot_config_is_rejected(change, key):
    cfg = dataclasses.replace(robot_config(), **{
        k: (from_dict(type(getattr(robot_config(), k)), v) if k == 'observations' else v)
        for k, v in change.items()})
    with pytest.raises(ConfigError) as err:
        spec_from_config(cfg, 'robot.yaml')
    assert f'robot.yaml: {key}' in str(err.value)


def test_a_gain_key_of_the_joints_exact_name_wins_whatever_the_yaml_order():
    # The exact keys listed after the partial one that also matches them still win (front hips
    # both, so the robot stays mirror-symmetric).
    exact = {'FL_hip_joint': 20.0, 'FR_hip_joint': 20.0}
    for stiffness in ({'hip': 30.0, 'thigh': 31.0, 'calf': 32.0, **exact},
                      {**exact, 'hip': 30.0, 'thigh': 31.0, 'calf': 32.0}):
        spec = spec_from_config(dataclasses.replace(robot_config(), stiffness=stiffness),
                                'robot.yaml')
        np.testing.assert_array_equal(spec.kp, [20.0, 31.0, 32.0, 20.0, 31.0, 32.0,
                                                30.0, 31.0, 32.0, 30.0, 31.0, 32.0])


def test_numbered_joints_take_their_own_gains_not_a_prefix_keys():
    # Joints named '0'..'11' (a held-out robot): key '1' is a part of '10' and '11', but a
    # joint with a key of its own name takes that; one without takes its only partial match.
    joints = [str(i) for i in range(12)]
    gains = {'1': 1.0, '10': 10.0, **{str(i): float(i) for i in (0, 2, 3, 4, 5, 6, 7, 8, 9)}}
    np.testing.assert_array_equal(per_joint(gains, joints, 'stiffness', 'r.yaml'),
                                  [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1])


def test_a_joint_two_partial_keys_match_is_refused_naming_both():
    stiffness = {'hip': 30.0, 'FL': 25.0, 'thigh': 30.0, 'calf': 30.0}
    with pytest.raises(ConfigError) as err:
        spec_from_config(dataclasses.replace(robot_config(), stiffness=stiffness), 'robot.yaml')
    assert "robot.yaml: stiffness: joint 'FL_hip_joint' is matched alike by keys ['FL', 'hip']" \
        in str(err.value)


def test_default_pose_outside_limits_is_rejected():
    cfg = robot_config()
    cfg.default_joint_pos = list(cfg.default_joint_pos)
    cfg.default_joint_pos[2] = 0.5  # knee limit is [-2.6, -0.6]
    with pytest.raises(ConfigError, match='FL_calf_joint = 0.5 is outside'):
        spec_from_config(cfg, 'robot.yaml')


def test_load_robot_by_path_equals_by_name():
    by_path = load_robot(paths.config_path('robots/claw_quadruped.yaml'))
    assert by_path.to_metadata() == load_robot('claw_quadruped').to_metadata()


def stepped(model, robot, terrain=None, steps=600):
    """(qpos, qvel, sensordata) after ``steps`` physics steps of noisy targets from standing."""
    from claw_rl_ros.core.sim.scene import standing_qpos
    data = mujoco.MjData(model)
    data.qpos[:] = standing_qpos(model, robot)
    if terrain is not None:
        data.qpos[0:2] = terrain.tile_origins[1, 4, :2]
        data.qpos[2] += terrain.tile_origins[1, 4, 2]
    rng = np.random.default_rng(1)
    for _ in range(steps):
        data.ctrl[:] = robot.default_joint_pos + rng.normal(0, 0.4, robot.num_joints)
        mujoco.mj_step(model, data)
    return data.qpos.copy(), data.qvel.copy(), data.sensordata.copy()


def test_worlds_without_visual_geoms_move_exactly_as_with_them(robot):
    # The batched worlds leave out the geoms that only show the robot and the floor's texture:
    # fewer geoms, the same masses, and the same trajectory bit for bit, on the plane and on
    # stairs and slopes.
    from claw_rl_ros.core.sim.env import VecLocomotionEnv
    from claw_rl_ros.core.sim.env_config import EnvConfig
    from claw_rl_ros.core.sim.terrain import generate_terrain, TerrainConfig
    terrain = generate_terrain(TerrainConfig(enabled=True, num_levels=2), robot)
    for ground in (None, terrain):
        full, lean = (build_model(robot, terrain=ground, visuals=v) for v in (True, False))
        assert lean.ngeom < full.ngeom
        assert (lean.geom_contype | lean.geom_conaffinity).all()  # every geom left collides
        # No floor texture either: a fifth of the bytes per world's model (cache, not RAM).
        assert (lean.ntex, lean.nmat, full.ntex) == (0, 0, 1)
        assert lean.nbuffer - (0 if ground is None else lean.hfield_data.nbytes) < 100_000
        np.testing.assert_array_equal(lean.body_mass, full.body_mass)
        np.testing.assert_array_equal(lean.body_inertia, full.body_inertia)
        for a, b in zip(stepped(full, robot, ground), stepped(lean, robot, ground)):
            np.testing.assert_array_equal(a, b)
    from claw_rl_ros.core.evaluation.render import render_env
    env = VecLocomotionEnv(EnvConfig(num_envs=2, num_threads=1), robot)
    shown = render_env(robot, 1.0, (0.5, 0.0, 0.0), 0)  # a renderer's world shows the robot
    try:
        assert env.physics.model.ngeom == build_model(robot, visuals=False).ngeom
        assert shown.physics.model.ngeom == build_model(robot).ngeom
    finally:
        env.close()
        shown.close()


def test_visual_geoms_stay_where_they_give_a_link_its_inertia():
    # A link without an inertial gets its mass from its geoms (MuJoCo's inertiafromgeom auto):
    # its visual geom stays; a link with one loses it; inertiafromgeom true keeps every geom.
    from claw_rl_ros.core.sim.scene import drop_visual_geoms
    xml = '''<mujoco><compiler inertiafromgeom="{mode}"/><worldbody>
      <body name="given"><inertial pos="0 0 0" mass="1" diaginertia="1 1 1"/>
        <geom name="given_visual" type="sphere" size="0.1" contype="0" conaffinity="0"/>
        <geom name="given_collision" type="sphere" size="0.1"/></body>
      <body name="from_geoms" pos="1 0 0">
        <geom name="geom_visual" type="box" size="0.1 0.1 0.1" contype="0" conaffinity="0"/>
      </body></worldbody></mujoco>'''
    spec = mujoco.MjSpec.from_string(xml.format(mode='auto'))
    mass = spec.compile().body('from_geoms').mass[0]
    drop_visual_geoms(spec)
    model = spec.compile()
    names = {model.geom(g).name for g in range(model.ngeom)}
    assert names == {'given_collision', 'geom_visual'}
    assert model.body('from_geoms').mass[0] == mass
    spec = mujoco.MjSpec.from_string(xml.format(mode='true'))
    drop_visual_geoms(spec)
    assert spec.compile().ngeom == 3


def creep_cm_s(robot, incline_deg: float, friction: float, noslip_iterations: int) -> float:
    """Downhill speed [cm/s] of the robot holding its default pose on an incline (gravity
    tilted about y), over 5 s after a 1 s settle."""
    from claw_rl_ros.core.sim.scene import FLOOR, standing_qpos
    m = build_model(robot, noslip_iterations=noslip_iterations, visuals=False)
    tilt = np.radians(incline_deg)
    m.opt.gravity[:] = [-9.81 * np.sin(tilt), 0.0, -9.81 * np.cos(tilt)]  # downhill is -x
    m.geom_friction[m.geom(FLOOR).id, 0] = friction
    d = mujoco.MjData(m)
    d.qpos[:] = standing_qpos(m, robot)
    d.ctrl[:] = robot.default_joint_pos
    mujoco.mj_step(m, d, nstep=round(1.0 / m.opt.timestep))
    x0 = d.qpos[0]
    mujoco.mj_step(m, d, nstep=round(5.0 / m.opt.timestep))
    assert d.qpos[3] ** 2 - d.qpos[4] ** 2 - d.qpos[5] ** 2 + d.qpos[6] ** 2 > 0.9  # upright
    return float(x0 - d.qpos[0]) / 5.0 * 100.0


@pytest.mark.parametrize('friction', [0.5, 1.0])
def test_noslip_iterations_stop_the_soft_contacts_creep_down_an_incline(robot, friction):
    """MuJoCo's soft contacts let a claw creep under a steady sideways load well inside the
    friction cone (tan 10 deg = 0.18): about 1.2 cm/s at friction 0.5 and at 1.0 alike.
    ``env.noslip_iterations`` 3 holds the robot where Coulomb friction would."""
    assert creep_cm_s(robot, 10.0, friction, 0) > 0.6
    assert abs(creep_cm_s(robot, 10.0, friction, 3)) < 0.15


def test_noslip_iterations_reach_the_env_and_the_sim_node_session(robot):
    from claw_rl_ros.core.sim.env import VecLocomotionEnv
    from claw_rl_ros.core.sim.env_config import EnvConfig
    from claw_rl_ros.core.sim.sim_session import SimSession
    cfg = EnvConfig(num_envs=2, noslip_iterations=3)
    env = VecLocomotionEnv(cfg)
    assert all(m.opt.noslip_iterations == 3 for m in env.physics.models)
    env.close()
    assert EnvConfig().noslip_iterations == 0  # the default physics is unchanged
    session = SimSession(robot, cfg)
    assert session.physics.model.opt.noslip_iterations == 3
