"""Evaluation, gait rendering and the export -> eval command line, end to end; on terrain tiles
too (every world on the tile, the criterion table, the heightfield in the picture)."""

import dataclasses
import hashlib
import json
import os
from pathlib import Path
import subprocess
import sys

import mujoco
import numpy as np
import pytest
import torch
import yaml

from claw_rl_ros import cli
from claw_rl_ros.core.evaluation import render
from claw_rl_ros.core.config import ConfigError, from_dict
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.sim.terrain import base_yaw
from claw_rl_ros.core.evaluation.evaluator import (eval_env_config, evaluate, evaluate_terrains,
                                                   evaluation_tiles, side_by_side,
                                                   TerrainEvaluation, torch_policy_fn)
from claw_rl_ros.core.export.onnx_export import export_onnx
from claw_rl_ros.core.learning.networks import ActorCritic
from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
from claw_rl_ros.core.learning.runner import OnPolicyRunner
from claw_rl_ros.core.learning.train_config import TrainConfig

SHORT = {'episode_length_s': 1.0, 'num_threads': 1}


def env_cfg(**overrides):
    return from_dict(EnvConfig, {**SHORT, **overrides}, source='test')


def zeros(obs):
    return np.zeros((len(obs), 12))


def flailing(obs):
    """Full-range alternating targets: the robot throws itself over within a second."""
    return np.tile([10.0, -10.0, 10.0, -10.0, -10.0, 10.0] * 2, (len(obs), 1))


def test_standing_policy_does_not_fall(robot):
    report = evaluate(zeros, env_cfg(), robot, episodes=4, seed=0, settle_s=0.5)
    assert report.episodes == 4 and report.falls == 0 and report.fall_rate == 0.0
    assert report.mean_length_s == pytest.approx(1.0)
    assert report.mean_return > 0.0
    errors = [report.tracking_error_vx, report.tracking_error_vy, report.tracking_error_yaw]
    assert all(np.isfinite(e) and 0.0 <= e < 2.0 for e in errors)
    assert abs(report.mean_forward_speed) < 0.1
    json.dumps(report.to_dict(), allow_nan=False)
    assert 'falls 0/4' in report.format()


def test_falls_are_counted_once_per_world(robot):
    # Worlds fall after ~0.3 s and fall again after auto-reset: only the first episode counts.
    report = evaluate(flailing, env_cfg(), robot, episodes=4, seed=0)
    assert report.falls == 4 and report.fall_rate == 1.0
    assert report.mean_length_s < 0.6
    data = report.to_dict()
    assert data['tracking_error_vx'] is None  # fell before settle_s: nothing was measured
    json.dumps(data, allow_nan=False)


def command_recorder(robot, seen):
    """A standing policy that records the command part of every observation it gets."""
    part = next(s for s in robot.policy_obs.slices if s.name == 'velocity_commands')

    def policy(obs):
        seen.append(obs[:, part.start:part.start + part.size] / part.scale)
        return zeros(obs)
    return policy


def test_fixed_command_is_fixed_for_the_whole_episode(robot):
    # The config would resample every 0.1 s and make every command "stand": both overridden.
    cfg = env_cfg(commands={'resample_time_s': 0.1, 'standing_probability': 1.0,
                            'min_speed': 1.0})
    seen = []
    report = evaluate(command_recorder(robot, seen), cfg, robot, episodes=3,
                      command=(0.4, -0.1, 0.3), settle_s=0.5)
    commands = np.concatenate(seen)
    assert len(seen) == 50
    np.testing.assert_allclose(commands, np.tile([0.4, -0.1, 0.3], (150, 1)), atol=1e-6)
    assert report.command == [0.4, -0.1, 0.3]
    # Standing still against a 0.4 m/s command: the x error is about the command.
    assert 0.3 < report.tracking_error_vx < 0.5
    assert 'fixed vx=0.40 m/s' in report.format()


def test_sampled_commands_cover_the_configured_range(robot):
    seen = []
    cfg = env_cfg(commands={'standing_probability': 0.0, 'min_speed': 0.0})
    evaluate(command_recorder(robot, seen), cfg, robot, episodes=6, seed=3)
    first = seen[0]
    assert len(np.unique(first[:, 0])) == 6
    assert (first[:, 0] >= -0.5).all() and (first[:, 0] <= 1.0).all()


def test_torch_policy_fn_is_the_deterministic_action(robot):
    policy = ActorCritic(47, 60, 12, actor_hidden_dims=[16], critic_hidden_dims=[16])
    obs = np.random.default_rng(0).normal(size=(5, 47)).astype(np.float32)
    with torch.no_grad():
        expected = policy.act_inference({'policy': torch.from_numpy(obs)}).numpy()
    np.testing.assert_array_equal(torch_policy_fn(policy)(obs), expected)


def test_evaluate_rejects_zero_episodes(robot):
    with pytest.raises(ValueError, match='episodes must be >= 1'):
        evaluate(zeros, env_cfg(), robot, episodes=0)


RENDER_SCRIPT = '''
import sys
import numpy as np
from claw_rl_ros.core.evaluation.render import render_gait
from claw_rl_ros.core.sim.robot import load_robot
rng = np.random.default_rng(0)
robot = load_robot('claw_quadruped')
policy = lambda obs: rng.normal(0.0, 1.0, (len(obs), robot.num_joints))
render_gait(policy, robot, sys.argv[1], seconds=1.0, fps=10, width=160, height=120)
render_gait(policy, robot, sys.argv[2], seconds=1.0, width=160, height=120)
'''


def test_render_writes_a_real_gif_and_png_strip(tmp_path):
    from PIL import Image, ImageSequence
    gif, png = tmp_path / 'gait.gif', tmp_path / 'gait.png'
    # MuJoCo picks its GL backend at import, so render in a fresh process with osmesa.
    env = {k: v for k, v in os.environ.items() if k != 'PYOPENGL_PLATFORM'}
    env['MUJOCO_GL'] = 'osmesa'
    result = subprocess.run([sys.executable, '-c', RENDER_SCRIPT, str(gif), str(png)],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    with Image.open(gif) as image:
        assert image.format == 'GIF' and image.size == (160, 120)
        assert image.info['loop'] == 0 and image.info['duration'] == 100
        frames = [np.asarray(f.convert('RGB'), dtype=np.int16)
                  for f in ImageSequence.Iterator(image)]
    assert len(frames) == 10
    assert all(f.std() > 10.0 for f in frames)  # not blank
    changes = [np.abs(a - b).mean() for a, b in zip(frames[:-1], frames[1:])]
    assert min(changes) > 0.05  # every frame differs from the previous one
    with Image.open(png) as strip:
        assert strip.size == (6 * 160, 120)


def test_render_reports_how_to_get_a_backend(robot, tmp_path, monkeypatch):
    def no_gl(*args, **kwargs):
        raise mujoco.FatalError('an OpenGL platform library has not been loaded')
    monkeypatch.setattr(mujoco, 'Renderer', no_gl)
    with pytest.raises(render.RenderUnavailable) as err:
        render.render_gait(zeros, robot, tmp_path / 'g.gif', seconds=0.1)
    assert 'apt-get install libosmesa6' in str(err.value)
    assert 'MUJOCO_GL=osmesa' in str(err.value) and 'MUJOCO_GL=egl' in str(err.value)
    with pytest.raises(ValueError, match='.gif'):
        render.render_gait(zeros, robot, tmp_path / 'g.mp4')


@pytest.fixture(scope='module')
def run_dir(tmp_path_factory):
    """A run directory with one checkpoint written by the real training runner."""
    path = tmp_path_factory.mktemp('run')
    cfg = from_dict(TrainConfig, {
        'env': {'num_envs': 2, 'num_threads': 1, 'episode_length_s': 1.0},
        'policy': {'actor_hidden_dims': [32, 32], 'critic_hidden_dims': [32]},
        'runner': {'num_steps_per_env': 4, 'max_iterations': 1, 'torch_threads': 1}})
    runner = OnPolicyRunner(cfg, path)
    runner.save()
    runner.close()
    return path


def test_cli_export_then_eval_end_to_end(run_dir, tmp_path, capsys):
    model = tmp_path / 'student.onnx'
    checkpoint = run_dir / 'checkpoints' / 'model_0.pt'
    assert cli.main(['export', '--checkpoint', str(checkpoint), '--out', str(model)]) == 0
    text = capsys.readouterr().out
    assert hashlib.sha256(model.read_bytes()).hexdigest() in text
    config = tmp_path / 'train.yaml'
    config.write_text(yaml.safe_dump({'env': SHORT}))
    report = tmp_path / 'eval.json'
    assert cli.main(['eval', '--model', str(model), '--episodes', '3', '--command', '0.3', '0',
                     '0', '--config', str(config), '--no-randomization', '--json',
                     str(report)]) == 0
    text = capsys.readouterr().out
    assert 'evaluation: 3 episodes of 1 s' in text and 'randomisation off' in text
    data = json.loads(report.read_text())
    assert data['sha256'] == OnnxPolicy(model).sha256 and data['robot'] == 'claw_quadruped'
    assert data['episodes'] == 3 and data['command'] == [0.3, 0.0, 0.0]
    assert data['mean_length_s'] == pytest.approx(1.0) and data['falls'] == 0


def test_cli_eval_refuses_a_latency_out_of_bounds_in_one_line(run_dir, tmp_path, capsys):
    """An env range out of its bounds, given through eval --config: one line naming the
    field, the value and the fix, exit 2, no traceback."""
    model = tmp_path / 'student.onnx'
    assert cli.main(['export', '--checkpoint', str(run_dir / 'checkpoints' / 'model_0.pt'),
                     '--out', str(model)]) == 0
    capsys.readouterr()
    config = tmp_path / 'train.yaml'
    config.write_text(yaml.safe_dump({'env': {
        **SHORT, 'randomization': {'action_latency_substeps': [5, 101]}}}))
    assert cli.main(['eval', '--model', str(model), '--episodes', '1',
                     '--config', str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'Traceback' not in err[0], err
    assert 'randomization.action_latency_substeps' in err[0] and '101' in err[0] \
        and '100' in err[0], err


def write_mismatched_model(robot, path):
    other = dataclasses.replace(robot, kp=robot.kp + 5.0)
    policy = ActorCritic(47, 60, 12, actor_hidden_dims=[16], critic_hidden_dims=[16])
    return export_onnx(policy, other, path)


def test_cli_eval_errors_are_one_line_exit_2(robot, tmp_path, capsys):
    junk = tmp_path / 'junk.onnx'
    junk.write_bytes(b'\x00garbage')
    mismatched = write_mismatched_model(robot, tmp_path / 'other.onnx')
    cases = [
        (['--model', str(tmp_path / 'missing.onnx')], 'model file not found'),
        (['--model', str(junk)], 'not a loadable ONNX model'),
        (['--model', str(mismatched)], 'kp: model has'),
        (['--model', str(mismatched), '--episodes', '0'], '--episodes'),
        (['--model', str(mismatched), '--gif', 'out.mp4'], '.gif'),
    ]
    for argv, message in cases:
        assert cli.main(['eval', *argv]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count('\n') == 1 and 'Traceback' not in err, err


def test_cli_eval_gif_without_gl_exits_2_with_the_fix(robot, tmp_path, capsys, monkeypatch):
    model = export_onnx(ActorCritic(47, 60, 12, actor_hidden_dims=[16], critic_hidden_dims=[16]),
                        robot, tmp_path / 'student.onnx')
    config = tmp_path / 'train.yaml'
    config.write_text(yaml.safe_dump({'env': SHORT}))

    def no_gl(*args, **kwargs):
        raise RuntimeError('no display')
    monkeypatch.setattr(mujoco, 'Renderer', no_gl)
    assert cli.main(['eval', '--model', str(model), '--episodes', '1', '--config', str(config),
                     '--gif', str(tmp_path / 'g.gif')]) == 2
    captured = capsys.readouterr()
    assert 'falls' in captured.out and 'libosmesa6' in captured.err
    assert not Path(tmp_path / 'g.gif').exists()


# --------------------------------------------------------------------------------- terrain
def test_every_world_of_a_tile_evaluation_stands_on_that_tile(robot):
    # A training config on the tiles with its curriculum: the evaluation puts all worlds on
    # the one tile asked for (curriculum off, its own seed, the config's tile sizes).
    base = env_cfg(terrain={'enabled': True, 'num_levels': 4, 'height_scan': {'enabled': True},
                            'tile_size': 2.4})
    tile = evaluation_tiles(base, ['stairs_down:2'])[0]
    cfg = eval_env_config(base, 6, (0.5, 0.0, 0.0), 0, tile)
    t = cfg.terrain
    assert (t.types, t.num_levels, t.curriculum, t.seed) == (['stairs_down'], 1, False, 1000)
    assert t.step_height == pytest.approx(0.2 * 3 / 4) and t.tile_size == 2.4
    env = VecLocomotionEnv(cfg, robot)
    try:
        assert env.obs_dims.keys() == {'policy', 'policy_noise_free', 'privileged'}
        centre = env.terrain.tile_origins[0, 0]
        xy = env.physics.qpos[:, :2]
        assert np.abs(xy - centre[:2]).max() <= env.terrain.spawn_jitter
        # Steps of level 2 of 4: 0.75 x 0.2 H high; a 2.4 m tile has room for two of them.
        steps = env.terrain.heights / (0.75 * 0.2 * robot.standing_height)
        np.testing.assert_allclose(steps, np.round(steps), atol=1e-4)
        assert steps.max() == pytest.approx(2.0, abs=1e-4)
    finally:
        env.close()
    flat = eval_env_config(base, 6, None, 0, evaluation_tiles(base, ['flat'])[0])
    assert not flat.terrain.enabled and not flat.terrain.height_scan.enabled
    with pytest.raises(ConfigError, match='terrain_seed: 0 is env.terrain.seed of the env '
                                          'config: the evaluation map would be the training'):
        evaluation_tiles(base, ['rough'], terrain_seed=0)


def test_no_evaluation_walk_ends_at_the_edge_of_its_tile(robot):
    # 20 s at 0.5 m/s is 10 m: every world can walk its whole episode, in its own heading,
    # without reaching the edge (the default 12 H tile ends after about 1.6 m).
    base = env_cfg(episode_length_s=20.0, terrain={'enabled': True})
    for spec in ('slope_up', 'obstacles'):
        tile = evaluation_tiles(base, [spec], command=(0.4, 0.3, 0.0))[0]
        assert tile.walk == pytest.approx(10.0)
        env = VecLocomotionEnv(eval_env_config(base, 8, (0.4, 0.3, 0.0), 0, tile), robot)
        try:
            yaw = base_yaw(env.physics.qpos[:, 3:7])
            t = np.linspace(0.0, 20.0, 81)[:, None]
            # The commanded body-frame velocity turned into the world by each world's heading.
            vx = 0.4 * np.cos(yaw) - 0.3 * np.sin(yaw)
            vy = 0.4 * np.sin(yaw) + 0.3 * np.cos(yaw)
            path = env.physics.qpos[None, :, :2] + t[..., None] * np.stack([vx, vy], -1)
            for xy in path:
                assert not env.placement.out_of_bounds(xy).any()
            if spec == 'slope_up':  # the slope goes on: 20 deg over ~9.6 m past the platform
                assert -env.terrain.heights.min() > 3.3
        finally:
            env.close()
    flat = evaluation_tiles(base, ['flat'])[0]
    scan = eval_env_config(base, 2, (0.5, 0.0, 0.0), 0, flat, height_scan=True)
    assert scan.terrain.tile_walk == pytest.approx(10.0)  # a teacher's flat heightfield too


def test_evaluate_terrains_reports_each_tile_against_the_criterion(robot):
    # Standing still against 0.5 m/s: no fall anywhere, but the vx error is the command.
    result = evaluate_terrains(zeros, env_cfg(), robot, ['flat', 'stairs_down:0', 'rough'],
                               episodes=2, settle_s=0.5)
    rows = result.rows()
    assert [r['terrain'] for r in rows] == ['flat', 'stairs_down:0', 'rough:9']
    assert [r.terrain_seed for r in result.reports] == [None, 1000, 1000]
    assert all(r['falls'] == 0 and r['episodes'] == 2 for r in rows)
    assert all(0.4 < r['vx_error'] < 0.6 and not r['passed'] for r in rows)
    assert not result.passed
    loose = TerrainEvaluation(result.reports, max_vx_error=1.0)
    assert loose.passed and all(r['passed'] for r in loose.rows())
    text = side_by_side({'standing': result, 'loose': loose})
    lines = text.splitlines()
    assert lines[0].split() == ['standing', 'loose'] and lines[1].split()[0] == 'terrain'
    assert lines[3].split()[0] == 'stairs_down:0' and lines[3].count('FAIL') == 1
    assert lines[3].count('PASS') == 1 and '0/2' in lines[3]
    assert lines[-1].endswith('on every tile: standing FAIL, loose PASS')
    json.dumps(result.to_dict(), allow_nan=False)
    with pytest.raises(ValueError, match='evaluate both on the same tiles'):
        side_by_side({'a': result, 'b': TerrainEvaluation(result.reports[:1])})


def test_a_privileged_actor_is_evaluated_on_its_groups_with_the_scan_on(robot):
    """A teacher reads the scan: evaluate hands it the groups, on every tile (flat too, as a
    flat heightfield), and its torch policy function acts on them."""
    groups = ['policy_noise_free', 'privileged', 'height_scan']
    from claw_rl_ros.core.sim.env_config import observation_dims
    dims = observation_dims(robot, env_cfg(terrain={'enabled': True,
                                                    'height_scan': {'enabled': True}}))
    width = sum(dims[g] for g in groups)
    teacher = ActorCritic(width, width, 12, actor_hidden_dims=[8], critic_hidden_dims=[8],
                          actor_obs_groups=groups, critic_obs_groups=groups)
    act = torch_policy_fn(teacher)

    def first_obs(tile):
        seen = []

        def recording(obs):
            seen.append({g: obs[g].copy() for g in groups})
            return act(obs)
        recording.obs_groups = act.obs_groups
        report = evaluate_terrains(recording, env_cfg(), robot, [tile], episodes=2,
                                   settle_s=0.5).reports[0]
        assert report.terrain in (tile, tile + ':9') and report.episodes == 2
        return seen[0]
    flat, rough = first_obs('flat'), first_obs('rough')
    assert flat['height_scan'].shape == (2, dims['height_scan'])
    # Flat ground: every scan point about a standing height below the base; rough: not.
    assert np.ptp(flat['height_scan'], axis=1).max() < 0.02
    assert np.ptp(rough['height_scan'], axis=1).min() > 0.02
    with torch.no_grad():
        expected = teacher.act_inference({g: torch.as_tensor(flat[g]) for g in groups}).numpy()
    np.testing.assert_allclose(act(flat), expected, rtol=1e-6)
    # A student still gets the policy vector alone.
    assert not hasattr(torch_policy_fn(ActorCritic(dims['policy'], width, 12,
                                                   actor_hidden_dims=[8],
                                                   critic_hidden_dims=[8])), 'obs_groups')


def test_cli_eval_on_terrain_prints_a_row_per_tile(run_dir, tmp_path, capsys, monkeypatch):
    model = tmp_path / 'student.onnx'
    assert cli.main(['export', '--checkpoint', str(run_dir / 'checkpoints' / 'model_0.pt'),
                     '--out', str(model)]) == 0
    config = tmp_path / 'train.yaml'
    config.write_text(yaml.safe_dump({'env': {**SHORT, 'terrain': {'num_levels': 3}}}))
    report = tmp_path / 'eval.json'
    capsys.readouterr()
    drawn = []
    monkeypatch.setattr(render, 'render_gait', lambda *a, **kw: drawn.append(kw) or 'g.png')
    assert cli.main(['eval', '--model', str(model), '--episodes', '2', '--config', str(config),
                     '--terrain', 'stairs_up', 'rough:0', '--terrain-seed', '7', '--json',
                     str(report), '--gif', 'g.png']) == 0
    out = capsys.readouterr().out
    assert [kw['terrain'].label for kw in drawn] == ['stairs_up:2']  # the picture's ground
    assert 'terrain stairs_up:2 (seed 7)' in out and 'terrain rough:0 (seed 7)' in out
    assert 'fixed vx=0.50 m/s' in out
    rows = [line.split()[0] for line in out.splitlines() if line.startswith(('stairs', 'rough'))]
    assert rows == ['stairs_up:2', 'rough:0']
    data = json.loads(report.read_text())
    assert [r['terrain'] for r in data['rows']] == ['stairs_up:2', 'rough:0']
    assert data['reports'][0]['terrain_seed'] == 7 and data['max_vx_error'] == 0.15
    for argv, words in ((['--terrain', 'lava'], "--terrain: 'lava': unknown terrain type"),
                        (['--terrain', 'rough:3'], 'level 3 is out of range; give rough:LEVEL '
                         'with LEVEL 0..2'),
                        (['--terrain', 'rough', '--terrain-seed', '0'],
                         '--terrain-seed: 0 is env.terrain.seed')):
        assert cli.main(['eval', '--model', str(model), '--config', str(config), *argv]) == 2
        err = capsys.readouterr().err
        assert words in err and err.count('\n') == 1, err


TERRAIN_RENDER_SCRIPT = '''
import json, sys
import mujoco
import numpy as np
from claw_rl_ros.core.evaluation.render import (open_renderer, render_env, render_gait,
                                               tracking_camera)
from claw_rl_ros.core.sim.robot import load_robot
from claw_rl_ros.core.sim.sim_session import terrain_tile
from claw_rl_ros.core.sim.terrain import TerrainConfig
robot = load_robot('claw_quadruped')
out = {}
for spec in ('flat', 'stairs_down'):
    tile = terrain_tile(spec, TerrainConfig(), 1000)
    env = render_env(robot, 1.0, (0.5, 0.0, 0.0), 0, tile)
    model = env.physics.model
    renderer = open_renderer(model, 160, 120)
    data = mujoco.MjData(model)
    mujoco.mj_setState(model, data, env.physics.state[0], mujoco.mjtState.mjSTATE_FULLPHYSICS)
    mujoco.mj_forward(model, data)
    renderer.update_scene(data, tracking_camera(model, robot, 0.0))
    scene = renderer.scene
    out[spec] = {'hfield': any(scene.geoms[i].type == mujoco.mjtGeom.mjGEOM_HFIELD
                               for i in range(scene.ngeom))}
    np.save(sys.argv[1] + spec + '.npy', renderer.render())
    renderer.close()
    env.close()
    render_gait(lambda obs: np.zeros((1, 12)), robot, sys.argv[1] + spec + '.png', seconds=0.5,
                width=160, height=120, terrain=tile)
print(json.dumps(out))
'''


def test_the_gait_picture_shows_the_terrain(tmp_path):
    from PIL import Image
    env = {k: v for k, v in os.environ.items() if k != 'PYOPENGL_PLATFORM'}
    env['MUJOCO_GL'] = 'osmesa'
    prefix = str(tmp_path / 'frame_')
    result = subprocess.run([sys.executable, '-c', TERRAIN_RENDER_SCRIPT, prefix], env=env,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    scenes = json.loads(result.stdout.splitlines()[-1])
    # The heightfield is drawn on the tile and absent on the plane; the pictures differ.
    assert scenes == {'flat': {'hfield': False}, 'stairs_down': {'hfield': True}}
    flat, stairs = (np.load(f'{prefix}{s}.npy').astype(np.int16) for s in ('flat', 'stairs_down'))
    assert stairs.std() > 10.0 and np.abs(stairs - flat).mean() > 5.0
    with Image.open(f'{prefix}stairs_down.png') as strip:
        assert strip.size == (6 * 160, 120)
