"""The policy card `claw-rl export` writes beside the model: read back from the model file and
its verification record (the terrain it was trained and verified on too), atomically written."""

import hashlib
import json

import pytest

from claw_rl_ros import cli
from claw_rl_ros.core.config import from_dict, to_dict
from claw_rl_ros.core.export import policy_card as card_module
from claw_rl_ros.core.export.onnx_export import export_onnx
from claw_rl_ros.core.export.policy_card import card_path, policy_card, write_policy_card
from claw_rl_ros.core.export.verification_record import verification_path
from claw_rl_ros.core.learning.networks import ActorCritic
from claw_rl_ros.core.sim.terrain import TerrainConfig
from test_export import fake_checkpoint


@pytest.fixture(scope='module')
def exported(robot, tmp_path_factory):
    d = tmp_path_factory.mktemp('card')
    fake_checkpoint(robot, d / 'run' / 'checkpoints' / 'model_3.pt')
    out = d / 'student.onnx'
    assert cli.main(['export', '--run-dir', str(d / 'run'), '--out', str(out)]) == 0
    return out


def test_export_writes_the_card_beside_the_model(exported, robot, capsys):
    path = card_path(exported)
    assert path == exported.parent / 'student.card.md' and path.is_file()
    text = path.read_text()
    sha = hashlib.sha256(exported.read_bytes()).hexdigest()
    assert text.startswith('# Policy card: student.onnx')
    assert f'- sha256: `{sha}`' in text
    assert '- robot: `claw_quadruped`' in text
    assert '- control period: 0.02 s (50 Hz)' in text
    assert 'target = default + 0.25 x action, action clipped to +-10' in text
    # Joint order with pose, limits and gains, one row per joint in the spec order.
    rows = [line for line in text.splitlines() if line.startswith('| ') and '_joint |' in line]
    assert [row.split(' | ')[1] for row in rows] == robot.joint_names
    assert rows[2] == '| 2 | FL_calf_joint | -1.5 | -2.6 | -0.6 | 30 | 0.75 | 28 |'
    # Observation layout: slices and scales.
    assert '| base_ang_vel | [0:3] | 3 | 0.25 |' in text
    assert '| velocity_commands | [6:9] | 3 | 2, 2, 0.25 |' in text
    assert '| joint_vel | [21:33] | 12 | 0.05 |' in text
    # Training run from the export metadata.
    assert '- checkpoint: model_3.pt' in text and '- iteration: 3' in text
    assert '- total_steps: 96' in text
    assert 'Not verified' in text
    # The actuator model it was trained on, from the metadata.
    assert '- trained on actuator: `ideal_pd`, armature 0.01 kg m^2, command delay 0-2 physics ' \
        'steps' in text


def test_the_card_names_a_dc_motor_and_an_old_model_without_actuator():
    dc = {'actuator': {'model': 'dc_motor', 'armature': 0.02, 'delay_steps': [1, 8],
                       'saturation_torque': [18.0, 28.0], 'no_load_speed': [25.0, 25.0]}}
    assert card_module._actuator(dc) == '`dc_motor`, armature 0.02 kg m^2, command delay 1-8 ' \
        'physics steps; stall torque 18, 28 N m, no-load speed 25, 25 rad/s'
    assert card_module._actuator({}).startswith('not recorded')
    # A hand-edited model's odd metadata reads as unknown, never a crash of the card.
    for odd in ({'delay_steps': 3}, {'delay_steps': None}, {'delay_steps': [1, 2, 3]}):
        assert 'command delay ? physics steps' in card_module._actuator({'actuator': odd})


def test_the_card_carries_the_verification_record(exported):
    sha = hashlib.sha256(exported.read_bytes()).hexdigest()
    record = {'model_sha256': sha, 'passed': True, 'created': '2026-11-30T23:59:00Z',
              'table': [{'metric': 'fall_rate', 'value': 0.0, 'limit': 0.1, 'passed': True},
                        {'metric': 'latency_p99_ms', 'value': 3.2, 'limit': 20.0,
                         'passed': True}]}
    verification_path(exported).write_text(json.dumps(record))
    try:
        text = policy_card(exported)
        assert '- result: **PASSED**' in text and '- for this model: yes' in text
        assert 'created 2026-11-30T23:59:00Z' in text
        assert '| metric | value | limit | passed |' in text
        assert '| latency_p99_ms | 3.2 | 20 | True |' in text
        verification_path(exported).write_text(json.dumps({**record, 'passed': False,
                                                           'model_sha256': 'ab' * 32}))
        text = policy_card(exported)
        assert '**FAILED**' in text and 'NO: it verifies another model (sha256 abababababab)' \
            in text
    finally:
        verification_path(exported).unlink()


def test_the_card_is_written_atomically(exported, monkeypatch):
    before = card_path(exported).read_text()

    def crash(path, data):
        raise OSError('disk full')
    monkeypatch.setattr(card_module, 'atomic_write_bytes', crash)
    with pytest.raises(OSError):
        write_policy_card(exported)
    assert card_path(exported).read_text() == before
    calls = []
    monkeypatch.setattr(card_module, 'atomic_write_bytes', lambda p, d: calls.append((p, d)))
    assert write_policy_card(exported) == card_path(exported)
    assert calls == [(card_path(exported), policy_card(exported).encode())]


def test_the_card_names_the_terrain_it_was_trained_and_verified_on(exported, robot, tmp_path):
    # claw-rl export records the checkpoint's env.terrain (off here: the plane).
    text = policy_card(exported)
    assert '- trained on: the flat plane (env.terrain off)' in text
    assert '- verified on: nothing yet (no verification record)' in text
    terrain = to_dict(from_dict(TerrainConfig, {
        'enabled': True, 'types': ['rough', 'flat', 'stairs_up'], 'seed': 3,
        'proportions': [0.25, 0.0, 0.75]}))  # no world on flat: not a trained type
    policy = ActorCritic(robot.policy_obs.dim, robot.policy_obs.dim, robot.num_joints,
                         actor_hidden_dims=[8], critic_hidden_dims=[8])
    model = export_onnx(policy, robot, tmp_path / 'rough.onnx',
                        extra_metadata={'terrain': terrain})
    verification_path(model).write_text(json.dumps({
        'model_sha256': hashlib.sha256(model.read_bytes()).hexdigest(), 'passed': False,
        'table': [], 'terrain': [
            {'terrain': 'stairs_up:9', 'seed': 1000, 'episodes': 10, 'falls': 0,
             'vx_error': 0.0812, 'passed': True},
            {'terrain': 'rough:9', 'seed': 1000, 'episodes': 10, 'falls': 4, 'vx_error': None,
             'passed': False}]}))
    text = policy_card(model)
    assert ('- trained on: terrain tiles (rough 0.25, stairs_up 0.75), 10 levels, curriculum '
            'on, from levels <= 0, seed 3; top level: rough 0.15 H, slopes 20 deg, steps 0.2 H, '
            'obstacles 0.25 H (H: standing height); steps as heightfield ramps (one cell '
            'wide)') in text
    assert '- verified on: the flat plane (the table below), and terrain tiles:' in text
    assert '  - stairs_up:9 (seed 1000): falls 0/10, vx error 0.0812 m/s: PASS' in text
    assert '  - rough:9 (seed 1000): falls 4/10, vx error n/a m/s: FAIL' in text
    boxes = export_onnx(policy, robot, tmp_path / 'boxes.onnx', extra_metadata={
        'terrain': to_dict(from_dict(TerrainConfig, {'enabled': True, 'collision': 'boxes'}))})
    assert '; steps as boxes (vertical risers)' in policy_card(boxes)
    plain = export_onnx(policy, robot, tmp_path / 'old.onnx')
    assert '- trained on: not recorded in the model' in policy_card(plain)
