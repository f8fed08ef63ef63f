"""The policy card `claw-rl export` writes beside the model: read back from the model file and
its verification record, atomically written."""

import hashlib
import json

import pytest

from claw_rl_ros import cli
from claw_rl_ros.core.deploy import policy_card as card_module
from claw_rl_ros.core.deploy.policy_card import card_path, policy_card, write_policy_card
from claw_rl_ros.core.deploy.verification import verification_path
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
