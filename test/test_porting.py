"""Bringing another robot (docs/porting.md): a structurally different robot description
(test/robots/strider: 8 joints, no gait clock in its YAML, point feet on their own links, an IMU
mounted upside down, a mesh, no <mujoco> block in the URDF) loads, trains, exports and evaluates
with no code change, and the mistakes a new user makes get errors that say what to do."""

from pathlib import Path
import shutil
import subprocess
import sys

import numpy as np
import pytest

from claw_rl_ros.core.config import ConfigError
from claw_rl_ros.core.sim.robot import load_robot
from claw_rl_ros.core.sim.scene import build_model

STRIDER = Path(__file__).parent / 'robots' / 'strider' / 'strider.yaml'
CLAW_RL = [sys.executable, '-m', 'claw_rl_ros.cli']


@pytest.fixture(scope='module')
def strider():
    return load_robot(STRIDER)


def test_robot_sized_constants_are_derived_from_the_urdf(strider):
    # Standing at the default pose: hips 0.6 rad, knees -1.2 rad, 0.14 m links, 0.018 m feet.
    expected_h = 0.14 * np.cos(0.6) + 0.14 * np.cos(0.6) + 0.018
    assert strider.standing_height == pytest.approx(expected_h, abs=1e-3)
    h, m = strider.standing_height, strider.total_mass
    assert strider.init_base_height == pytest.approx(h + 0.02)
    assert strider.base_height_target == pytest.approx(h)
    assert strider.swing_height == pytest.approx(0.2 * h)
    assert strider.min_base_height == pytest.approx(0.3 * h)
    assert strider.payload_range == pytest.approx((-0.05 * m, 0.15 * m))
    assert strider.com_offset_range == pytest.approx((-0.12 * h, 0.12 * h))


def test_a_robot_without_a_gait_gets_a_trot_sized_from_its_height(strider):
    # Diagonal pairs (lf + rh, then rf + lh) half a cycle apart, the period at equal Froude
    # number with the claw quadruped's 0.4 s at 0.266 m.
    assert strider.gait_offsets.tolist() == [0.0, 0.5, 0.5, 0.0]
    assert strider.gait_period == pytest.approx(0.4 * np.sqrt(strider.standing_height / 0.266),
                                                abs=1e-3)
    assert strider.gait_duty == 0.5
    # The policy observes the clock it is rewarded for following (appended to its layout).
    assert strider.policy_obs.names[-1] == 'gait_phase'
    assert strider.to_metadata()['gait']['period_s'] == strider.gait_period


def _strider_variant(tmp_path, edit):
    import yaml
    raw = yaml.safe_load(STRIDER.read_text())
    edit(raw['robot'])
    shutil.copy(STRIDER.parent / 'strider.urdf', tmp_path / 'strider.urdf')
    shutil.copytree(STRIDER.parent / 'meshes', tmp_path / 'meshes', dirs_exist_ok=True)
    path = tmp_path / 'strider.yaml'
    path.write_text(yaml.safe_dump(raw))
    return load_robot(path)


def test_the_trot_comes_from_where_the_feet_stand_and_no_gait_stays_a_choice(tmp_path):
    # Feet listed in another order get the same trot, by position, not by name or order.
    shuffled = _strider_variant(tmp_path, lambda r: r.update(
        foot_bodies=['rh_foot', 'lf_foot', 'lh_foot', 'rf_foot']))
    assert shuffled.gait_offsets.tolist() == [0.0, 0.0, 0.5, 0.5]
    none = _strider_variant(tmp_path, lambda r: r.update(gait={'period_s': 0}))
    assert none.gait_period == 0 and 'gait_phase' not in none.policy_obs.names
    # An explicit period keeps the derived trot offsets; explicit offsets are kept as given.
    pace = _strider_variant(tmp_path, lambda r: r.update(
        gait={'period_s': 0.5, 'offsets': [0.0, 0.5, 0.0, 0.5]}))
    assert pace.gait_period == 0.5 and pace.gait_offsets.tolist() == [0.0, 0.5, 0.0, 0.5]
    # A period shorter than two control steps (0.02 s each) would alias: refused.
    with pytest.raises(ConfigError, match=r'gait\.period_s.*two control steps'):
        _strider_variant(tmp_path, lambda r: r.update(gait={'period_s': 1e-300}))
    # A foot on the midline has no side: deriving a trot is refused with what to write instead.
    with pytest.raises(ConfigError, match=r'gait\.offsets.*midline.*period_s: 0'):
        _strider_variant(tmp_path, lambda r: r.update(foot_bodies=['body', 'lf_foot']))


def test_claw_values_in_its_yaml_win_over_derived_ones(robot):
    assert robot.base_height_target == 0.25 and robot.payload_range == (-0.5, 1.5)
    assert robot.standing_height == pytest.approx(0.2655, abs=1e-3)


def test_scene_keeps_static_links_visual_meshes_and_the_offset_imu(strider):
    model = build_model(strider)
    names = {model.body(i).name for i in range(model.nbody)}
    # Links on fixed joints (feet, IMU) survive: sensors and contacts sit on them.
    assert {'imu', 'lf_foot', 'rh_foot'} <= names
    assert model.nmesh == 1 and model.mesh(0).name


def test_mesh_and_model_file_paths_resolve_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                       # not the repository
    assert load_robot(STRIDER).model_path == STRIDER.with_suffix('.urdf').resolve()
    copy = tmp_path / 'elsewhere'
    shutil.copytree(STRIDER.parent, copy)
    (copy / 'meshes' / 'body.obj').unlink()
    with pytest.raises(ValueError, match="mesh 'package://strider/meshes/body.obj' not found"):
        load_robot(copy / 'strider.yaml')
    (copy / 'strider.urdf').unlink()
    with pytest.raises(ConfigError, match="model_file: file not found: 'strider.urdf'"):
        load_robot(copy / 'strider.yaml')


def test_unknown_robot_name_says_how_to_pass_a_path():
    with pytest.raises(ConfigError) as err:
        load_robot('strider')
    assert 'claw_quadruped' in str(err.value) and '--robot path/to/my_robot.yaml' in str(err.value)


def test_strider_trains_exports_and_evaluates_through_the_cli(tmp_path):
    """The worked example of docs/porting.md, end to end, a few iterations."""
    config = tmp_path / 'train_strider.yaml'
    config.write_text(
        f'env:\n  robot: {STRIDER}\n  num_envs: 16\n  episode_length_s: 2.0\n'
        '  num_threads: 1\n'
        'policy:\n  actor_hidden_dims: [32, 32]\n  critic_hidden_dims: [32, 32]\n'
        'runner:\n  num_steps_per_env: 8\n  max_iterations: 3\n  eval_episodes: 2\n'
        '  torch_threads: 1\n')
    run = tmp_path / 'run'
    done = subprocess.run(CLAW_RL + ['train', '--config', str(config), '--run-dir', str(run)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    # Strider's YAML gives no gait: it trains with the derived trot, the gait terms stay on.
    assert 'no gait clock' not in done.stderr
    model = run / 'student.onnx'
    assert model.is_file()
    evaluated = subprocess.run(CLAW_RL + ['eval', '--model', str(model), '--robot', str(STRIDER),
                                          '--episodes', '2'],
                               capture_output=True, text=True, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert 'robot strider' in evaluated.stdout
    # Without --robot, the model's robot name is not a packaged robot: the error says what to do.
    lost = subprocess.run(CLAW_RL + ['eval', '--model', str(model), '--episodes', '2'],
                          capture_output=True, text=True, timeout=300)
    assert lost.returncode == 2 and '--robot path/to/my_robot.yaml' in lost.stderr
    # A claw quadruped model is refused for strider, naming the differences.
    wrong = subprocess.run(CLAW_RL + ['eval', '--model', str(model), '--robot', 'claw_quadruped'],
                           capture_output=True, text=True, timeout=300)
    assert wrong.returncode == 2 and 'joint_names' in wrong.stderr
