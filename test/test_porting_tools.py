"""What a user porting a robot runs (docs/porting.md): ``claw-rl spec`` prints the sizes training
derives and the mass, ``claw-rl stand-pose`` finds a default pose that stands at a given height
with each foot under its hip, and ``claw-rl stand`` reports the trunk's tilt whatever the IMU's
mounting (the worked example's IMU is upside down)."""

from __future__ import annotations

import json
from pathlib import Path
import shutil

import mujoco
import numpy as np
import pytest
import yaml

from claw_rl_ros.cli import main
from claw_rl_ros.core.math_utils import gravity_in_body
from claw_rl_ros.core.sim.demo import hold_default_pose, stand_env
from claw_rl_ros.core.sim.robot import load_robot
from claw_rl_ros.core.sim.scene import build_model, lowest_foot_points, standing_qpos

STRIDER = Path(__file__).parent / 'robots' / 'strider' / 'strider.yaml'
# Each robot's hip (the leg's pitch joint) per foot, named here, not found by the tool.
HIPS = {'strider': ['lf_hip_pitch', 'rf_hip_pitch', 'lh_hip_pitch', 'rh_hip_pitch'],
        'claw_quadruped': ['FL_thigh_joint', 'FR_thigh_joint', 'RL_thigh_joint',
                           'RR_thigh_joint']}


def test_spec_prints_the_derived_sizes_and_the_mass(capsys):
    robot = load_robot(STRIDER)
    assert main(['spec', '--robot', str(STRIDER)]) == 0
    out = json.loads(capsys.readouterr().out)
    h, m = robot.standing_height, robot.total_mass
    sizes = out['training']
    assert sizes['total_mass'] == pytest.approx(m, abs=1e-4) and m > 1
    assert sizes['standing_height'] == pytest.approx(h, abs=1e-4)
    assert sizes['init_base_height'] == pytest.approx(h + 0.02, abs=1e-4)
    assert sizes['base_height_target'] == pytest.approx(h, abs=1e-4)
    assert sizes['swing_height'] == pytest.approx(0.2 * h, abs=1e-4)
    assert sizes['min_base_height'] == pytest.approx(0.3 * h, abs=1e-4)
    assert sizes['payload_range'] == pytest.approx([-0.05 * m, 0.15 * m], abs=1e-4)
    assert sizes['com_offset_range'] == pytest.approx([-0.12 * h, 0.12 * h], abs=1e-4)
    # Strider's YAML gives none of them: all derived; it names its contact links.
    assert set(sizes['derived']) == {'init_base_height', 'base_height_target', 'swing_height',
                                     'min_base_height', 'payload_range', 'com_offset_range',
                                     'gait.period_s', 'gait.offsets'}
    assert sizes['termination_contact_bodies'] == ['body']
    assert sizes['penalised_contact_bodies'] == ['lf_thigh', 'rf_thigh', 'lh_thigh', 'rh_thigh']
    # The gait clock and the dimensions, as the model's metadata carries them.
    assert out['gait']['period_s'] == pytest.approx(robot.gait_period)
    assert out['gait']['offsets'] == [0.0, 0.5, 0.5, 0.0]
    assert (out['obs_dim'], out['action_dim']) == (robot.policy_obs.dim, 8)
    # Everything else is the model's metadata, unchanged.
    assert {k: v for k, v in out.items() if k != 'training'} == robot.to_metadata()


def test_spec_names_no_size_derived_that_the_yaml_gives(capsys):
    assert main(['spec']) == 0
    sizes = json.loads(capsys.readouterr().out)['training']
    assert sizes['derived'] == [] and sizes['base_height_target'] == 0.25


def feet_from_hips(robot, pose: list[float], height: float) -> np.ndarray:
    """[F, 3] each foot's collision centre (x, y) from its hip's anchor and its lowest point's
    height, with the trunk upright at ``height`` and the joints at ``pose``."""
    model = build_model(robot)
    data = mujoco.MjData(model)
    data.qpos[:] = standing_qpos(model, robot)
    data.qpos[2] = height
    for name, q in zip(robot.joint_names, pose):
        data.qpos[model.jnt_qposadr[model.joint(name).id]] = q
    mujoco.mj_kinematics(model, data)
    low = lowest_foot_points(model, data, robot)
    out = []
    for foot, hip, z in zip(robot.foot_bodies, HIPS[robot.name], low):
        body = model.body(foot).id
        geoms = [g for g in range(model.ngeom)
                 if model.geom_bodyid[g] == body and model.geom_conaffinity[g]]
        xy = data.geom_xpos[geoms, :2].mean(axis=0) - data.xanchor[model.joint(hip).id, :2]
        out.append([*xy, z])
    return np.array(out)


@pytest.mark.parametrize('robot_arg, height', [(str(STRIDER), 0.22), (str(STRIDER), 0.28),
                                               ('claw_quadruped', 0.23)])
def test_stand_pose_puts_each_foot_under_its_hip_at_the_height(
        capsys, tmp_path, robot_arg, height):
    assert main(['stand-pose', '--robot', robot_arg, '--height', str(height)]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    robot = load_robot(robot_arg)
    pose = printed['default_joint_pos']
    assert len(pose) == robot.num_joints
    assert np.all(np.array(pose) >= robot.joint_lower) and np.all(
        np.array(pose) <= robot.joint_upper)
    error = feet_from_hips(robot, pose, height)
    assert np.abs(error[:, :2]).max() < 2e-3, error  # under the hip (printed to 1e-4 rad)
    assert np.abs(error[:, 2]).max() < 1e-3, error   # on the ground
    if robot.name == 'strider':
        # Pasted into the robot YAML, the pose is what the robot then stands at.
        copy = tmp_path / 'strider'
        shutil.copytree(STRIDER.parent, copy)
        raw = yaml.safe_load((copy / 'strider.yaml').read_text())
        raw['robot']['default_joint_pos'] = pose
        (copy / 'strider.yaml').write_text(yaml.safe_dump(raw))
        assert load_robot(copy / 'strider.yaml').standing_height == pytest.approx(height,
                                                                                  abs=1e-3)


def test_stand_pose_of_the_tuned_height_finds_the_tuned_pose(capsys):
    # strider's hand-made pose stands its feet under its hips: found again from its height.
    robot = load_robot(STRIDER)
    assert main(['stand-pose', '--robot', str(STRIDER), '--height',
                 repr(robot.standing_height)]) == 0
    pose = yaml.safe_load(capsys.readouterr().out)['default_joint_pos']
    assert pose == pytest.approx(robot.default_joint_pos.tolist(), abs=2e-3)


@pytest.mark.parametrize('height, words', [
    ('0.5', ['--height: 0.5 m is out of reach for strider', 'above the ground',
             'try at most 0.29']),
    ('0.05', ['--height: 0.05 m is out of reach for strider', 'below the ground',
              'try at least']),
    ('0', ['--height: 0.0; give the trunk origin']),
    ('nan', ['--height: nan; give']),
    ('inf', ['--height: inf; give']),
    ('1e308', ['--height: 1e+308; give', '<= 100']),
    ('50', ['--height: 50 m is out of reach for strider', 'try at most 0.29']),
])
def test_stand_pose_refuses_an_unreachable_height_by_name(capsys, height, words):
    assert main(['stand-pose', '--robot', str(STRIDER), '--height', height]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == '' and len(err.splitlines()) == 1, err
    assert err.startswith('claw-rl: error: command line: --height: ')
    for w in words:
        assert w in err, err


def test_stand_reports_the_trunks_tilt_not_the_upside_down_imus():
    env = stand_env(str(STRIDER), 1)
    try:
        env.reset()
        # The worked example's IMU is mounted upside down: it reads gravity along its +z.
        assert gravity_in_body(env.robot_state().base_quat)[0, 2] > 0.99
    finally:
        env.close()
    report = hold_default_pose(str(STRIDER), seconds=1.5, num_envs=1)
    assert report.fell == 0 and report.max_tilt_deg < 5.0, report
