"""The reality-gap gate, ``claw-rl verify --suite transfer`` (core/verify/transfer_suite.py):
each cell's perturbation reaches the physics, cells are scored by the gate's limits in process,
episodes are seeded per (seed, index), the JSON and the exit codes, and the refusals.

The runs here use a few cells (the table patched), 1-2 episodes of 2 s: the full table with the
walking student (test/fixtures/walker.onnx) takes ~11 s with 2 episodes of 10 s per cell.
"""

from __future__ import annotations

from dataclasses import fields
import json
import math
from pathlib import Path
import re
import shutil

import numpy as np
import pytest
import yaml

from claw_rl_ros import cli
from claw_rl_ros.core.export.policy_card import card_path, transfer_path, write_policy_card
from claw_rl_ros.core.sim.env_config import RandomizationConfig
from claw_rl_ros.core.verify import transfer_suite as suite
from claw_rl_ros.core.verify.gate_scoring import VerifyConfig
from claw_rl_ros.core.verify.transfer_suite import Cell, ExtraCell
from control_models import good_model

ROOT = Path(__file__).resolve().parents[1]
WALKER = Path(__file__).parent / 'fixtures' / 'walker.onnx'
ENV = yaml.safe_load((ROOT / 'config' / 'verify.yaml').read_text())['env']
REQUIRED = ['episodes', 'falls', 'family', 'level', 'passed', 'vx_error']
SHORT = VerifyConfig(episodes=1, episode_s=2.0, settle_s=0.5)
# Cells whose keys exist since the first version of the suite, and the physics step variant.
SMALL = (Cell('nominal', '-'), Cell('Kp', '-30 %', {'kp_scale': [0.7, 0.7]}),
         Cell('payload', '+30 %', {'added_mass': suite._payload(0.3)}),
         Cell('physics step', '1 ms', robot={'sim_dt': 0.001, 'decimation': 20}))


def by_name(family: str, level: str) -> Cell:
    return next(c for c in suite.CELLS if (c.family, c.level) == (family, level))


def session_of(cell: Cell, robot):
    return suite.cell_session(cell, robot, suite.cell_env(cell, robot, ENV))


def test_every_cell_of_the_table_builds_its_env_config_and_robot(robot):
    """Every cell parses through from_dict(EnvConfig, ...) (the keys control_jitter_substeps,
    imu_gyro_bias, imu_tilt_offset, encoder_offset, contact_timeconst, cone and solver came
    with the sensor model and solver options) and keeps the policy's control period."""
    labels = [suite.label(c) for c in suite.CELLS]
    assert len(set(labels)) == len(labels) == 26
    for cell in suite.CELLS:
        env = suite.cell_env(cell, robot, ENV)
        assert env.num_envs == 1 and env.randomization.enabled
        assert suite.cell_robot(cell, robot).control_dt == pytest.approx(robot.control_dt)
    delays = [by_name('delay', f'{ms} ms') for ms in (0, 10, 20, 30, 40)]
    assert [suite.cell_env(c, robot, ENV).randomization.action_latency_substeps
            for c in delays] == [(k, k) for k in (0, 2, 4, 6, 8)]


def test_every_range_but_the_cells_own_is_pinned(robot):
    """The nominal cell draws nothing: every (low, high) range of env.randomization is one
    point (a key added with a range default must be pinned in nominal_randomization), no
    pushes; the sensor noise and the reset-pose noise are verify.yaml's."""
    env = suite.cell_env(by_name('nominal', '-'), robot, ENV)
    dr = env.randomization
    for f in fields(RandomizationConfig):
        value = getattr(dr, f.name)
        if isinstance(value, tuple) and len(value) == 2:
            assert value[0] == value[1], f'{f.name} = {value} is not pinned'
    assert dr.push_interval_s == 0.0 and dr.friction == (robot.foot_friction,) * 2
    assert dr.init_joint_pos_noise == ENV['randomization']['init_joint_pos_noise']
    assert env.noise.enabled is ENV['noise']['enabled']
    kp = suite.cell_env(by_name('Kp', '-30 %'), robot, ENV).randomization
    assert kp.kp_scale == (0.7, 0.7) and kp.motor_strength == (1.0, 1.0)


def test_each_cells_perturbation_reaches_the_physics(robot):
    nominal = session_of(by_name('nominal', '-'), robot)
    p0, m0 = nominal.physics, nominal.physics.models[0]
    base = p0.base_body
    sessions = []

    def world(family, level):
        sessions.append(session_of(by_name(family, level), robot))
        return sessions[-1].physics

    p = world('Kp', '-30 %')
    np.testing.assert_allclose(p.copy_kp[0], 0.7 * robot.kp)
    np.testing.assert_allclose(p.copy_kd[0], robot.kd)
    if p.actuator is None:  # MuJoCo's position actuators carry the gains themselves
        np.testing.assert_allclose(p.models[0].actuator_gainprm[:, 0], 0.7 * robot.kp)
    np.testing.assert_allclose(world('Kd', '+50 %').copy_kd[0], 1.5 * robot.kd)
    np.testing.assert_allclose(world('motor strength', '-30 %').copy_kp[0], 0.7 * robot.kp)
    vadr = p0.vadr
    np.testing.assert_allclose(world('joint friction', 'x5').models[0].dof_frictionloss[vadr],
                               5 * m0.dof_frictionloss[vadr])
    np.testing.assert_allclose(world('armature', 'x3').models[0].dof_armature[vadr],
                               3 * m0.dof_armature[vadr])
    ground = p0.ground_geoms
    np.testing.assert_allclose(world('ground friction', '0.3').models[0].geom_friction[ground, 0],
                               0.3)
    assert world('payload', '+30 %').models[0].body_mass[base] == \
        pytest.approx(m0.body_mass[base] + 0.3 * robot.total_mass)
    np.testing.assert_allclose(world('contact', 'soft 0.05 s').models[0].geom_solref[:, 0], 0.05)
    twist = world('contact', 'torsional 0.01 m').models[0]
    assert (twist.geom_condim[ground] == 4).all()
    assert (twist.geom_friction[ground, 1] == 0.01).all()
    delayed = session_of(by_name('delay', '20 ms'), robot)
    sessions.append(delayed)
    assert delayed.latency_substeps == 4 and nominal.latency_substeps == 0
    dc = world('actuator', 'dc_motor')
    assert dc.model.nu == 24 and (dc.model.actuator_biasprm[12:, 2] < 0).all()
    fine = world('physics step', '1 ms')
    assert fine.model.opt.timestep == 0.001 and fine.decimation == 20
    assert p0.model.opt.timestep == robot.sim_dt and p0.decimation == robot.decimation
    for s in (nominal, *sessions):
        s.close()


def test_episodes_are_seeded_by_seed_and_index(robot):
    """Episode i of a cell draws from (seed, i): the same run twice is the same to the bit,
    episode 1 alone is episode 1 of two, another seed is another episode."""
    cell = by_name('Kp', '-30 %')
    env = suite.cell_env(cell, robot, ENV)
    cfg = VerifyConfig(episodes=2, episode_s=1.0, settle_s=0.2)

    def episode(seed, index):
        session = suite.cell_session(cell, robot, env, seed, index)
        try:
            return suite.run_episode(str(WALKER), robot, session, cfg)
        finally:
            session.close()

    two = suite.run_cell(cell, str(WALKER), robot, cfg, ENV, seed=3)
    again = suite.run_cell(cell, str(WALKER), robot, cfg, ENV, seed=3)
    for a, b in zip(two.episodes, again.episodes):
        np.testing.assert_array_equal(a.velocity, b.velocity)
        np.testing.assert_array_equal(a.joint_pos, b.joint_pos)
    alone = episode(3, 1)
    np.testing.assert_array_equal(alone.velocity, two.episodes[1].velocity)
    assert not np.array_equal(two.episodes[0].velocity, two.episodes[1].velocity)
    assert not np.array_equal(episode(4, 1).velocity, alone.velocity)
    assert two.vx_error == again.vx_error and len(two.episodes) == 2


def test_the_cells_are_scored_by_the_gates_limits_without_the_latency_rows(robot):
    result = suite.run_cell(by_name('nominal', '-'), str(WALKER), robot, SHORT, ENV)
    checks = [r.check for r in result.rows]
    assert len(checks) == 6 and not any('latency' in c for c in checks)
    assert checks[0] == 'tracking error vx at 0.5 m/s' and checks[3].startswith('fall rate')
    assert result.passed and result.falls == 0
    assert result.vx_error == pytest.approx(result.rows[0].value, rel=1e-12)
    weak = suite.run_cell(Cell('motor strength', 'x0.1', {'motor_strength': [0.1, 0.1]}),
                          str(WALKER), robot, SHORT, ENV)
    assert not weak.passed and weak.failed


def run_cli(monkeypatch, tmp_path, model, *extra, cells=SMALL, extras=()):
    """claw-rl verify --suite transfer with the table patched (1 episode of 2 s per cell)."""
    monkeypatch.setattr(suite, 'CELLS', tuple(cells))
    monkeypatch.setattr(suite, 'EXTRA_CELLS', list(extras))
    config = tmp_path / 'verify.yaml'
    data = yaml.safe_load((ROOT / 'config' / 'verify.yaml').read_text())
    data['verify']['settle_s'] = 0.5
    config.write_text(yaml.safe_dump(data))
    return cli.main(['verify', '--suite', 'transfer', '--model', str(model), '--config',
                     str(config), '--episodes', '1', '--seconds', '2', *extra])


def test_the_walker_passes_and_the_json_has_the_cells(monkeypatch, tmp_path, capsys, robot):
    model = shutil.copy(WALKER, tmp_path / 'student.onnx')
    write_policy_card(model)

    def nominal_twice(model_path, robot_spec, cfg, seed):  # another engine's cell
        cell = suite.CELLS[0]
        env = suite.cell_env(cell, robot_spec, ENV)
        return [suite.run_episode(model_path, robot_spec,
                                  suite.cell_session(cell, robot_spec, env, seed, i), cfg)
                for i in range(cfg.episodes)]

    out = tmp_path / 'cells.json'
    code = run_cli(monkeypatch, tmp_path, model, '--json', str(out),
                   extras=[ExtraCell('engine', 'other', nominal_twice)])
    text = capsys.readouterr().out
    assert code == 0, text
    cells = json.loads(out.read_text())
    assert [(c['family'], c['level']) for c in cells] == \
        [(c.family, c.level) for c in SMALL] + [('engine', 'other')]
    for c in cells:
        assert set(REQUIRED) <= set(c), c
        assert c['passed'] is True and c['falls'] == 0 and c['episodes'] == 1
        assert isinstance(c['vx_error'], float) and c['vx_error'] <= 0.15
    assert cells[1]['perturbation'] == {'randomization.kp_scale': [0.7, 0.7]}
    assert 'verdict: PASS (5 of 5 cells pass)' in text
    assert re.search(r'^physics step +1 ms +0\.\d{3} <= 0\.150 +0/1 +PASS$', text, re.M), text
    record = json.loads(transfer_path(model).read_text())
    assert record['passed'] is True and len(record['cells']) == 5
    card = card_path(model).read_text()
    assert '## Reality gap (transfer suite)' in card and '(5 of 5 cells pass)' in card
    assert '| Kp | -30 % |' in card and f'updated {card_path(model)}' in text


def test_a_failing_cell_fails_the_suite(monkeypatch, tmp_path, capsys, robot):
    model = shutil.copy(WALKER, tmp_path / 'student.onnx')
    weak = Cell('motor strength', 'x0.1', {'motor_strength': [0.1, 0.1]})
    assert run_cli(monkeypatch, tmp_path, model, cells=(SMALL[0], weak)) == 1
    text = capsys.readouterr().out
    assert 'verdict: FAIL (1 of 2 cells pass)' in text
    record = json.loads(transfer_path(model).read_text())
    assert [c['passed'] for c in record['cells']] == [True, False]
    # A cell that cannot be built (a key this version lacks) fails with the reason.
    bogus = Cell('bogus', 'x', {'no_such_key': 1})
    assert run_cli(monkeypatch, tmp_path, model, cells=(SMALL[0], bogus)) == 1
    text = capsys.readouterr().out
    assert 'FAIL  (transfer cell bogus x: env.randomization.no_such_key: unknown key' in text


def test_an_untrained_student_fails(monkeypatch, tmp_path, capsys, robot):
    model = good_model(robot, tmp_path / 'random.onnx', seed=4)
    out = tmp_path / 'cells.json'
    assert run_cli(monkeypatch, tmp_path, model, '--json', str(out), cells=SMALL[:1]) == 1
    cell = json.loads(out.read_text())[0]
    assert cell['passed'] is False and cell['failed']
    assert cell['falls'] == 1 or cell['vx_error'] is None or cell['vx_error'] > 0.15
    assert 'verdict: FAIL' in capsys.readouterr().out


def test_usage_errors_exit_2_with_one_line(monkeypatch, tmp_path, capsys):
    junk = tmp_path / 'junk.onnx'
    junk.write_bytes(b'\x00junk')
    strider = ROOT / 'test' / 'robots' / 'strider' / 'strider.yaml'
    afile = tmp_path / 'afile'
    afile.write_text('')
    walker = shutil.copy(WALKER, tmp_path / 'student.onnx')
    monkeypatch.setattr(suite, 'CELLS', SMALL[:1])
    cases = [(['--episodes', '0'], 'episodes: 0 is out of range'),
             (['--episodes', '-1'], 'episodes: -1 is out of range'),
             (['--episodes', str(10 ** 20)], 'is out of range; allowed: >= 1, <= 10000'),
             (['--seconds', '1e9'], '--seconds: 1e+09: give at most 600 s per episode'),
             (['--seconds', '0'], 'episode_s: 0.0 is out of range'),
             (['--json', str(tmp_path)], '--json'),
             (['--json', str(tmp_path / 'no' / 'dir' / 'x.json')], 'cannot write a file there'),
             (['--json', str(afile / 'x.json')], 'cannot write a file there'),
             (['--robot', str(strider)], '--model'),
             (['--terrain', 'rough'], '--terrain: the transfer suite runs on the flat plane')]
    for argv, message in cases:
        assert cli.main(['verify', '--suite', 'transfer', '--model', str(walker), *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count('\n') == 1, (argv, err)
    for model, message in ((junk, 'not a loadable ONNX model'),
                           (tmp_path / 'none.onnx', 'model file not found')):
        assert cli.main(['verify', '--suite', 'transfer', '--model', str(model)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count('\n') == 1, err
    assert cli.main(['verify', '--model', str(walker), '--json', 'x.json']) == 2
    assert '--json: the cells of --suite transfer' in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['afile', 'junk.onnx', 'student.onnx']


def test_the_table_says_na_when_every_episode_fell(robot):
    fell = suite.score_cell('x', 'y', SHORT, robot, [])
    assert not fell.passed and math.isnan(fell.vx_error)
    row = suite.TableFormat(SHORT, [fell]).row(fell)
    assert 'n/a <= 0.150' in row and row.split()[-1] != 'PASS'
    assert fell.to_dict()['vx_error'] is None


def test_the_second_engine_cells_run_the_student_in_pybullet_at_both_rates(robot):
    cells = {(c.family, c.level): c for c in suite.EXTRA_CELLS}
    assert set(cells) == {('second engine', 'PyBullet 1 kHz PD'),
                          ('second engine', 'PyBullet PD at physics rate')}
    results = suite.run_suite(str(WALKER), robot, SHORT, ENV, cells=[])
    assert [(r.family, r.level) for r in results] == list(cells)
    for r, hz in zip(results, (1000.0, 1.0 / robot.sim_dt)):
        assert not r.error and len(r.episodes) == 1 and r.falls == 0, r.failed
        assert float(r.episodes[0].params['drive_rate_hz']) == pytest.approx(hz)
        assert math.isfinite(r.vx_error)
