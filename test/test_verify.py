"""The sim2sim gate: simulated action latency, the scoring table, and ``claw-rl verify`` through
real sim_node + policy_node processes (a walking student passes, random weights fail), with a
row per terrain tile.

The walking student is test/fixtures/walker.onnx (167 KB, the model ``make train`` exported on
main; training one takes ~10 minutes, too long for the suite). If the robot spec changes, the
fixture is refused with the mismatch named: re-export it from a fresh ``make train``.
"""

import hashlib
import json
import math
from pathlib import Path
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml

from claw_rl_ros import cli
from claw_rl_ros.commands.verify import verify_nodes
from claw_rl_ros.core.config import from_dict
from claw_rl_ros.core.export.policy_card import card_path, write_policy_card
from claw_rl_ros.core.export.verification_record import verification_blocker
from claw_rl_ros.core.verify.episode_record import EpisodeTable
from claw_rl_ros.core.verify.status_board import GraphGone, StatusBoard
from claw_rl_ros.core.verify.gate_scoring import (Episode, episode_of, format_table,
                                                  measured_latency, passed,
                                                  result_path, score, score_terrain,
                                                  terrain_episode_s, VerifyConfig, worst_latency,
                                                  write_result)
from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.sim.sim_session import SimSession, terrain_tile
from claw_rl_ros.core.sim.terrain import generate_terrain, TerrainConfig
from control_models import good_model

WALKER = Path(__file__).parent / 'fixtures' / 'walker.onnx'
ROOT = Path(__file__).resolve().parents[1]


def fixed_latency_session(robot, substeps):
    """One world, every draw pinned except the action latency (``substeps`` physics steps)."""
    cfg = from_dict(EnvConfig, {'num_envs': 1, 'randomization': {
        'friction': [1.0, 1.0], 'added_mass': [0.0, 0.0], 'link_mass_scale': [1.0, 1.0],
        'com_offset': [0.0, 0.0], 'motor_strength': [1.0, 1.0], 'init_joint_pos_noise': 0.0,
        'action_latency_substeps': [substeps, substeps], 'push_interval_s': 0.0}},
        source='test')
    return SimSession(robot, cfg, randomization=True)


def test_latency_longer_than_a_control_period_is_a_delay_line(robot):
    # 6 substeps = one control period (4) + 2: the same physics as 2 substeps late with every
    # command given one period later.
    rng = np.random.default_rng(0)
    commands = [robot.default_joint_pos + rng.uniform(-0.3, 0.3, 12) for _ in range(8)]
    late, early = fixed_latency_session(robot, 6), fixed_latency_session(robot, 2)
    assert late.episode_params['latency_ms'] == pytest.approx(30.0)
    # The late world's last command has not reached its actuators when the loop ends.
    for late_cmd, early_cmd in zip(commands + [robot.joint_upper],
                                   [early.physics.delayed_targets[0, 0].copy()] + commands):
        late.step(late_cmd)
        early.step(early_cmd)
    np.testing.assert_array_equal(late.physics.state, early.physics.state)
    undelayed = fixed_latency_session(robot, 0)
    undelayed.step(undelayed.physics.delayed_targets[0, 0].copy())
    for cmd in commands:
        undelayed.step(cmd)
    assert np.abs(undelayed.physics.qpos - late.physics.qpos).max() > 1e-3
    for s in (late, early, undelayed):
        s.close()


def episode(fell=False, vx=0.5, q=None, tau=1.0, n=50):
    q = np.tile(np.array([0.05, 0.8, -1.5] * 4), (n, 1)) if q is None else q
    return Episode(fell=fell, velocity=np.tile([vx, 0.0, 0.0], (n, 1)), joint_pos=q,
                   effort=np.full((n, 12), tau))


def test_score_rows_pass_and_fail_on_their_limits(robot):
    cfg = VerifyConfig()
    rows = score(cfg, robot, [episode(), episode(vx=0.4)], latency_p99_ms=1.0)
    assert passed(rows)
    by = {r.check.split(' (')[0]: r for r in rows}
    assert by['tracking error vx at 0.5 m/s'].value == pytest.approx(0.05)
    assert by['torque peak p99'].value == pytest.approx(1.0 / 18.0)  # hip/thigh limit 18 N m
    near = np.tile(np.array([0.05, 0.8, -1.5] * 4), (50, 1))
    near[10, 2] = robot.joint_upper[2] - 0.01  # a calf 0.01 rad from its stop
    bad = score(cfg, robot, [episode(q=near), episode(vx=0.2)], latency_p99_ms=11.0)
    failed = {r.check.split(' (')[0] for r in bad if not r.passed}
    assert failed == {'tracking error vx at 0.5 m/s', 'joint-limit margin', 'policy latency p99'}
    one_fall = score(cfg, robot, [episode(fell=True)] + [episode()] * 9, 1.0)
    assert not passed(one_fall)  # 1/10 is not below 10 %
    assert passed(score(cfg, robot, [episode(fell=True)] + [episode()] * 10, 1.0))
    all_fell = score(cfg, robot, [episode(fell=True)], 1.0)
    assert all_fell[0].value != all_fell[0].value and not all_fell[0].passed  # NaN: fail
    assert 'n/a' in format_table(all_fell) and 'verdict: FAIL' in format_table(all_fell)


def test_result_file_names_the_model_bytes(robot, tmp_path):
    model = tmp_path / 'm.onnx'
    model.write_bytes(b'model bytes')
    sha = hashlib.sha256(b'model bytes').hexdigest()
    path = write_result(model, score(VerifyConfig(), robot, [episode()], 1.0))
    # Written where the deploy path reads it (verification_blocker), the one check.
    assert path == result_path(model) == tmp_path / 'm.verify.json'
    data = json.loads(path.read_text())
    assert sorted(data) == ['created', 'model_sha256', 'passed', 'table']
    assert data['model_sha256'] == sha
    assert data['passed'] is True and len(data['table']) == 9
    assert sorted(p.name for p in tmp_path.iterdir()) == ['m.onnx', 'm.verify.json']
    assert verification_blocker(model, sha) is None
    retrained = hashlib.sha256(b'retrained').hexdigest()  # the verdict belongs to the old bytes
    assert 'verifies model' in verification_blocker(model, retrained)
    write_result(model, score(VerifyConfig(), robot, [episode(vx=0.0)], 1.0))
    assert 'did not pass' in verification_blocker(model, sha)
    result_path(model).unlink()
    assert 'no m.verify.json beside' in verification_blocker(model, sha)


@pytest.fixture(scope='module')
def short_config(tmp_path_factory):
    """config/verify.yaml with 2 episodes of 3 s and a push every 1.5 s. The latency limit is
    lifted: the suite runs niced next to other jobs, and the model is on trial here, not the
    machine (the row itself is checked to be measured)."""
    data = yaml.safe_load((ROOT / 'config' / 'verify.yaml').read_text())
    data['verify'].update({'episodes': 2, 'episode_s': 3.0, 'max_latency_fraction': 100.0})
    data['env']['randomization']['push_interval_s'] = 1.5
    path = tmp_path_factory.mktemp('verify') / 'verify.yaml'
    path.write_text(yaml.safe_dump(data))
    return path


def run_verify(model, config, env, *extra):
    domain = env['ROS_DOMAIN_ID']
    return subprocess.run([sys.executable, '-m', 'claw_rl_ros.cli', 'verify', '--model',
                           str(model), '--config', str(config), '--domain-id', domain,
                           '--verbose', *extra], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def episode_draws(stdout: str) -> dict[str, str]:
    """{'episode 1': 'friction 0.94, ...'} from the --verbose lines."""
    lines = [line.split(': ', 1) for line in stdout.splitlines()
             if line.strip().startswith('episode ')]
    return {name.strip(): rest.split(' ', 1)[1] for name, rest in lines}


def measured_rows(stdout: str) -> dict[str, str]:
    """{check: value} of the table's rows the robot's motion decides (not the latency rows)."""
    rows = [re.split(r'\s{2,}', line.strip()) for line in stdout.splitlines()
            if re.match(r'^(tracking|fall|torque|joint-limit)', line)]
    return {row[0]: row[1] for row in rows}


def test_an_episode_draws_the_same_perturbations_on_any_number_of_graphs(
        ros_env, short_config, tmp_path):
    """--jobs shares the episodes among graphs; episode i's draws come from (seed, i), so the
    same episodes are tested whatever the number (episode 2 runs on the second graph), and
    whether the nodes share a process (the default) or not (--processes): the same table."""
    model = shutil.copy(WALKER, tmp_path / 'student.onnx')
    one = run_verify(model, short_config, ros_env, '--jobs', '1', '--episodes', '3')
    two = run_verify(model, short_config, ros_env, '--jobs', '2', '--episodes', '3')
    apart = run_verify(model, short_config, ros_env, '--jobs', '1', '--episodes', '3',
                       '--processes')
    for run in (one, two, apart):
        assert run.returncode == 0, run.stdout + run.stderr
    assert '(lockstep, one process)' in one.stdout
    assert '(lockstep, two processes)' in apart.stdout
    assert sorted(episode_draws(one.stdout)) == ['episode 1', 'episode 2', 'episode 3']
    assert episode_draws(two.stdout) == episode_draws(one.stdout)
    # Lockstep on sim time: the same episodes on the same graphs end the same (to the digit
    # here; the margin is for a stall longer than the sim's command timeout on a loaded machine).
    assert episode_draws(apart.stdout) == episode_draws(one.stdout)
    rows, rows_apart = measured_rows(one.stdout), measured_rows(apart.stdout)
    assert len(rows) == 6 and rows_apart.keys() == rows.keys()
    assert all(abs(float(rows_apart[k]) - float(rows[k])) <= 0.005 for k in rows), \
        (rows, rows_apart)
    assert len(set(episode_draws(one.stdout).values())) == 3  # each episode its own draws
    other_seed = run_verify(model, short_config, ros_env, '--jobs', '2', '--episodes', '3',
                            '--seed', '1')
    assert set(episode_draws(other_seed.stdout).values()).isdisjoint(
        episode_draws(one.stdout).values())


def test_verify_passes_the_walking_student(ros_env, short_config, tmp_path):
    model = shutil.copy(WALKER, tmp_path / 'student.onnx')
    result = run_verify(model, short_config, ros_env)
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(result_path(model).read_text())
    assert data['passed'] is True
    assert data['model_sha256'] == hashlib.sha256(Path(model).read_bytes()).hexdigest()
    rows = {r['check']: r for r in data['table']}
    assert rows['tracking error vx at 0.5 m/s']['value'] < 0.15
    assert rows['fall rate (0/2)']['value'] == 0.0
    assert 0 < rows['policy latency p99 (/diagnostics)']['value'] < 1000
    assert result.stdout.count('episode ') == 2 and 'latency_ms' in result.stdout
    assert 'verdict: PASS' in result.stdout
    # It says where its time went: 2 episodes of 3 s at 50 Hz after the graphs came up.
    assert re.search(r'graphs running after [\d.]+-[\d.]+ s, 300 steps in the next [\d.]+ s '
                     r'= [\d,]+ steps/s\)', result.stdout), result.stdout


def test_verify_fails_a_random_weights_model(ros_env, short_config, robot,
                                             tmp_path):
    model = good_model(robot, tmp_path / 'random.onnx', seed=4)
    result = run_verify(model, short_config, ros_env)
    assert result.returncode == 1, result.stdout + result.stderr
    data = json.loads(result_path(model).read_text())
    assert data['passed'] is False
    failed = {r['check'].split(' (')[0] for r in data['table'] if not r['passed']}
    # It does not walk: no forward tracking (or it falls); latency is not what fails it.
    assert failed & {'tracking error vx at 0.5 m/s', 'fall rate'}, data['table']
    assert 'policy latency p99' not in failed
    assert 'verdict: FAIL' in result.stdout


def test_verify_usage_errors_exit_2(tmp_path, capsys):
    junk = tmp_path / 'junk.onnx'
    junk.write_bytes(b'\x00junk')
    for argv, message in (([str(junk)], 'not a loadable ONNX model'),
                          ([str(tmp_path / 'none.onnx')], 'model file not found')):
        assert cli.main(['verify', '--model', *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count('\n') == 1, err
    for argv, message in ((['--domain-id', '-3'], '--domain-id: -3: use 0 to 231'),
                          (['--domain-id', '232', '--jobs', '2'],
                           '--domain-id: 232: use 0 to 231'),
                          (['--jobs', '33'], '--jobs: 33: use 1 to 32 graphs')):
        assert cli.main(['verify', '--model', str(WALKER), *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count('\n') == 1, err
    with pytest.raises(SystemExit) as exit_info:  # argparse's own usage error
        cli.main(['verify', '--model', str(WALKER), '--jobs', '0'])
    assert exit_info.value.code == 2
    assert "argument --jobs: '0' is not a whole number >= 1" in capsys.readouterr().err


def test_terrain_rows_score_each_tile_and_gate_the_verdict(robot, tmp_path):
    cfg = VerifyConfig()
    ok = score_terrain(cfg, 'stairs_up:9', 1000, [episode(vx=0.45)] * 10, 4.2)
    assert (ok.falls, ok.episodes, ok.passed) == (0, 10, True)
    assert ok.vx_error == pytest.approx(0.05)
    # The fallen episode's velocity does not count; 1 fall in 10 is not below 10 %.
    one_fall = score_terrain(cfg, 'rough:9', 1000, [episode(fell=True, vx=-3.0)] +
                             [episode(vx=0.4)] * 9, 4.2)
    assert one_fall.vx_error == pytest.approx(0.1) and not one_fall.passed
    slow = score_terrain(cfg, 'slope_up:9', 1000, [episode(vx=0.3)] * 10, 4.2)
    assert slow.fall_rate == 0.0 and not slow.passed
    all_fell = score_terrain(cfg, 'obstacles:9', 1000, [episode(fell=True)], 4.2)
    assert all_fell.to_dict()['vx_error'] is None and not all_fell.passed
    rows = score(cfg, robot, [episode()], 1.0)
    assert passed(rows) and passed(rows, [ok]) and not passed(rows, [ok, slow])
    text = format_table(rows, [ok, slow, all_fell])
    lines = text.splitlines()
    terrain = lines[lines.index('') + 1:-1]
    assert terrain[0].split()[:3] == ['terrain', 'seed', 'episodes']
    assert [line.split()[0] for line in terrain[1:]] == ['stairs_up:9', 'slope_up:9',
                                                         'obstacles:9']
    assert terrain[1].endswith('PASS') and terrain[2].endswith('FAIL')
    assert '10 x 4.2s' in terrain[1] and '0.050 <= 0.150' in terrain[1] and 'n/a' in terrain[3]
    assert lines[-1] == 'verdict: FAIL'
    assert format_table(rows).splitlines()[-2].startswith('state -> command')  # as before
    model = tmp_path / 'm.onnx'
    model.write_bytes(b'model bytes')
    data = json.loads(write_result(model, rows, [ok, slow]).read_text())
    assert data['passed'] is False and len(data['table']) == 9
    assert [(t['terrain'], t['passed']) for t in data['terrain']] == [
        ('stairs_up:9', True), ('slope_up:9', False)]
    assert data['terrain'][0]['episode_s'] == 4.2 and data['terrain'][0]['seed'] == 1000


def test_a_terrain_episode_ends_before_the_robot_reaches_the_maps_edge(robot):
    tile = terrain_tile('stairs_down', TerrainConfig(), 1000)
    t = generate_terrain(tile.config, robot)
    cfg = VerifyConfig()
    seconds = terrain_episode_s(cfg, t, robot)
    # From the centre (+ the jitter) to 1.5 standing heights from the edge at 0.5 m/s.
    room = t.extent[1, 0] - 1.5 * robot.standing_height - t.tile_origins[0, 0, 0] - \
        t.spawn_jitter
    assert seconds == pytest.approx(room / 0.5) and 3.0 < seconds < cfg.episode_s
    assert type(seconds) is float  # a sim node parameter: a numpy float broke its YAML
    assert terrain_episode_s(VerifyConfig(command_vx=0.1), t, robot) == cfg.episode_s


def test_verify_tiles_are_long_enough_for_a_whole_episode(robot, tmp_path):
    # claw-rl verify sizes each tile for episode_s at command_vx and hands that size to the
    # sim node, which builds the same ground from its parameters.
    from claw_rl_ros.commands.verify import verify_config
    from claw_rl_ros.core.sim.sim_session import env_section
    from claw_rl_ros.core.learning.train_config import split_overrides
    args = cli.build_parser().parse_args(['verify', '--model', 'm.onnx', '--terrain',
                                          'stairs_down', '--seconds', '12'])
    cfg, path, tiles = verify_config(args)
    assert tiles[0].walk == pytest.approx(12 * cfg.command_vx)
    t = generate_terrain(tiles[0].config, robot)
    assert terrain_episode_s(cfg, t, robot) == cfg.episode_s
    sim = [n for n in verify_nodes(str(WALKER), 'claw_quadruped', path, 3, tiles[0])
           if n.executable == 'sim_node'][0].parameters
    env = env_section(sim['env_config'], split_overrides(sim['overrides'], 'overrides'))
    node_tile = terrain_tile(sim['terrain'], env.terrain, sim['terrain_seed'])
    np.testing.assert_array_equal(generate_terrain(node_tile.config, robot).heights, t.heights)


def test_the_verify_graph_stands_the_sim_on_the_tile(robot):
    tile = terrain_tile('rough:4', TerrainConfig(), 77)
    sims = [n for n in verify_nodes(str(WALKER), 'claw_quadruped', Path('v.yaml'), 3, tile)
            if n.executable == 'sim_node']
    assert len(sims) == 1 and sims[0].parameters['terrain'] == 'rough:4'
    assert sims[0].parameters['terrain_seed'] == 77 and sims[0].parameters['seed'] == 3
    flat = [n for n in verify_nodes(str(WALKER), 'claw_quadruped', Path('v.yaml'), 3)
            if n.executable == 'sim_node'][0]
    assert 'terrain' not in flat.parameters
    # Composed (claw-rl verify's default), the container carries the same sim parameters.
    box, = verify_nodes(str(WALKER), 'claw_quadruped', Path('v.yaml'), 3, tile, composed=True)
    args = list(box.arguments)
    assert box.executable == 'node_container' and args[1::3] == ['sim_node', 'policy_node']
    assert json.loads(args[2]) == dict(sims[0].parameters)


def test_verify_prints_a_row_per_terrain_tile(ros_env, short_config, tmp_path):
    model = shutil.copy(WALKER, tmp_path / 'student.onnx')
    write_policy_card(model)
    domain = ros_env['ROS_DOMAIN_ID']
    result = subprocess.run([sys.executable, '-m', 'claw_rl_ros.cli', 'verify', '--model',
                             str(model), '--config', str(short_config), '--domain-id', domain,
                             '--episodes', '1', '--terrain', 'stairs_down:0', 'obstacles:0',
                             '--terrain-seed', '5'], env=ros_env, cwd=ROOT,
                            capture_output=True, text=True, timeout=400)
    out = result.stdout
    data = json.loads(result_path(model).read_text())
    assert result.returncode == (0 if data['passed'] else 1), out + result.stderr
    lines = out.splitlines()
    rows = [line for line in lines if line.startswith(('stairs_down:0', 'obstacles:0'))]
    assert [r.split()[:2] for r in rows] == [['stairs_down:0', '5'], ['obstacles:0', '5']]
    assert lines[lines.index(rows[0]) - 1].startswith('terrain ')
    assert [t['terrain'] for t in data['terrain']] == ['stairs_down:0', 'obstacles:0']
    assert all(t['episodes'] == 1 and t['episode_s'] == 3.0 for t in data['terrain'])
    # Level 0 stairs are millimetre steps: the walking student walks them.
    assert data['terrain'][0]['passed'] is True and rows[0].endswith('PASS')
    assert data['passed'] == (all(r['passed'] for r in data['table']) and
                              all(t['passed'] for t in data['terrain']))
    card = card_path(model).read_text()
    assert f'updated {card_path(model)}' in out
    assert '  - stairs_down:0 (seed 5): falls 0/1' in card


def test_the_worst_latency_of_side_by_side_graphs_ignores_one_that_measured_nothing():
    nan = float('nan')
    a = {'latency_p99_ms': 0.4, 'latency_p50_ms': 0.2, 'round_trip_p99_ms': 1.5}
    b = {'latency_p99_ms': 0.9, 'latency_p50_ms': 0.1, 'round_trip_p99_ms': 1.1}
    idle = {'latency_p99_ms': nan, 'latency_p50_ms': nan, 'round_trip_p99_ms': nan}
    assert worst_latency([a, b]) == {'latency_p99_ms': 0.9, 'latency_p50_ms': 0.2,
                                     'round_trip_p99_ms': 1.5}
    assert worst_latency([idle, a]) == worst_latency([a, idle]) == a
    assert all(math.isnan(v) for v in worst_latency([idle]).values())


def test_the_latency_rows_wait_for_a_policy_status_that_measured_something():
    """The gate reads the policy's latency from a status said after its last episode began:
    one said before the policy's first tick (NaN) is passed over, one already there is taken
    at once."""
    board = StatusBoard(lambda: True, timeout_s=0.2)  # (a wait that sees nothing move fails)
    board.put_status('/policy_node', {'latency_p99_ms': '0.8', 'latency_p50_ms': '0.3'})
    since = board.count('/policy_node')  # the last episode begins
    board.put_status('/policy_node', {'latency_p99_ms': 'nan', 'latency_p50_ms': 'nan'})
    with pytest.raises(GraphGone, match='/diagnostics of /policy_node'):
        board.next_status('/policy_node', measured_latency, seq=since)
    board.put_status('/policy_node', {'latency_p99_ms': '0.9', 'latency_p50_ms': '0.2'})
    assert board.next_status('/policy_node', measured_latency, seq=since)['latency_p99_ms'] \
        == '0.9'
    for bad in ({}, {'latency_p99_ms': 'x'}, {'latency_p99_ms': 'inf'}, {'latency_p99_ms': None}):
        assert not measured_latency(bad)


def test_an_episode_is_the_sims_record_after_settling():
    rows = 11  # the reset state and 10 steps of 0.1 s
    t = 5.0 + 0.1 * np.arange(rows)
    table = EpisodeTable(t=t, velocity=np.arange(rows * 3.0).reshape(rows, 3),
                         joint_pos=np.arange(rows * 2.0).reshape(rows, 2),
                         effort=-np.arange(rows * 2.0).reshape(rows, 2), joint_names=('a', 'b'))
    status = {'friction': '0.9', 'latency_ms': '15', 'falls': '3', 'steps': '40'}
    ep = episode_of(table, 10, 0.3, True, status)
    # Velocity from 0.3 s after the reset on (rows 3..10); joints over the steps, not row 0.
    assert ep.velocity.tolist() == table.velocity[3:].tolist()
    assert ep.joint_pos.tolist() == table.joint_pos[1:].tolist()
    assert ep.effort.tolist() == table.effort[1:].tolist()
    assert ep.fell and ep.params == {'friction': '0.9', 'latency_ms': '15'}
    with pytest.raises(ValueError, match='holds 11 states, not the reset state and 12 steps'):
        episode_of(table, 12, 0.3, False, status)
