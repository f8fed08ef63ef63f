"""``claw-rl gateway check`` end to end against a local server (in-process and as a subprocess)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
import shutil
import subprocess
import sys

from claw_rl_ros.cli import main
from claw_rl_ros.core.sim.robot import load_robot
from claw_rl_ros.core.sim.robot_spec import METADATA_KEY
from gateway_server import (
    assert_no_key, closed_port, completion, FakeGateway, KEY, KEY_MASKED, Reply, server_config,
    STUDENT, TEACHER)
import pytest

# Every test without the developer's key, config or proxy variables, in a tmp CWD and HOME.
pytestmark = pytest.mark.usefixtures('clean_env')


def check(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``claw-rl gateway check ARGV``; return (status, stdout, stderr)."""
    status = main(['gateway', 'check', *argv])
    out, err = capsys.readouterr()
    assert 'Traceback' not in out + err
    assert_no_key(out, err)
    return status, out, err


def prompts(gateway: FakeGateway) -> list[str]:
    return [r.body['messages'][0]['content'] for r in gateway.requests]


def write_onnx(path: Path, meta: dict | None) -> Path:
    """A tiny Identity model carrying ``meta`` as the exported-model robot spec."""
    import onnx
    from onnx import helper, TensorProto
    dim = meta['obs_dim'] if meta else 4
    graph = helper.make_graph(
        [helper.make_node('Identity', ['obs'], ['actions'])], 'student',
        [helper.make_tensor_value_info('obs', TensorProto.FLOAT, [1, dim])],
        [helper.make_tensor_value_info('actions', TensorProto.FLOAT, [1, dim])])
    model = helper.make_model(graph)
    if meta is not None:
        helper.set_model_props(model, {METADATA_KEY: json.dumps(meta)})
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope='module')
def spec_meta() -> dict:
    return load_robot().to_metadata()


# ------------------------------------------------------------------------------------ success
def test_check_prints_both_answers_side_by_side(capsys, gateway, tmp_path):
    config = server_config(tmp_path, gateway)
    status, out, err = check(capsys, '--config', str(config), '--prompt', 'Say hi.')
    assert status == 0
    assert prompts(gateway) == ['Say hi.', 'Say hi.']
    assert [r.body['model'] for r in gateway.requests] == [TEACHER, STUDENT]
    assert all(r.headers['authorization'] == f'Bearer {KEY}' for r in gateway.requests)
    lines = out.splitlines()
    assert any(line.startswith('model') and TEACHER in line and STUDENT in line
               for line in lines)
    status_line = next(line for line in lines if line.startswith('status'))
    assert status_line.count('200 OK') == 2
    latency = next(line for line in lines if line.startswith('latency'))
    assert latency.count(' ms') == 2
    assert f'{TEACHER} heard 7 chars: Say hi.' in out and f'{STUDENT} heard 7 chars' in out
    assert f'POST {gateway.url}/v1/chat/completions' in out
    assert f'{KEY_MASKED} (from file {config})' in out
    assert 'result: both models answered' in out


def test_default_prompt_and_key_from_env(capsys, gateway, tmp_path, monkeypatch):
    config = server_config(tmp_path, gateway, api_key=None)
    monkeypatch.setenv('CLAW_LLM_API_KEY', KEY)
    status, out, _ = check(capsys, '--config', str(config))
    assert status == 0 and 'built-in test prompt' in out
    assert f'{KEY_MASKED} (from env CLAW_LLM_API_KEY)' in out
    assert prompts(gateway)[0].startswith('In one sentence')


@pytest.mark.parametrize('fmt', ['toml', 'yaml'])
def test_config_found_through_env_var_and_cwd(capsys, gateway, tmp_path, monkeypatch, fmt):
    config = server_config(tmp_path / 'elsewhere', gateway, fmt)
    monkeypatch.setenv('CLAW_LLM_CONFIG', str(config))
    assert check(capsys, '--prompt', 'a')[0] == 0
    monkeypatch.delenv('CLAW_LLM_CONFIG')
    local = server_config(tmp_path / 'config', gateway, fmt)
    status, out, _ = check(capsys, '--prompt', 'b')
    assert status == 0 and f'config   {local}' in out


def test_overrides_and_prompt_file(capsys, gateway, tmp_path):
    gateway.models.add('other-teacher')
    prompt = tmp_path / 'prompt.txt'
    prompt.write_text('From a file.\n')
    config = server_config(tmp_path, gateway)
    status, out, _ = check(capsys, '--config', str(config), '--prompt-file', str(prompt),
                           '--teacher', 'other-teacher', '--timeout', '9')
    assert status == 0 and prompts(gateway) == ['From a file.'] * 2
    assert gateway.requests[0].body['model'] == 'other-teacher' and 'timeout  9 s' in out


def test_long_answers_are_cut_unless_full(capsys, gateway, tmp_path):
    config = server_config(tmp_path, gateway)
    long = 'word ' * 200
    gateway.queue(Reply(200, completion(TEACHER, long)), model=TEACHER)
    status, out, _ = check(capsys, '--config', str(config))
    assert status == 0 and '[1000 chars; --full]' in out
    gateway.queue(Reply(200, completion(TEACHER, long)), model=TEACHER)
    status, out, _ = check(capsys, '--config', str(config), '--full')
    assert '--full]' not in out and out.count('word') >= 200


def test_retries_are_reported_on_stderr(capsys, gateway, tmp_path):
    config = server_config(tmp_path, gateway)
    gateway.queue(Reply(503, {}), model=STUDENT)
    status, out, err = check(capsys, '--config', str(config))
    assert status == 0
    assert f'{STUDENT}: HTTP 503, retry 2/3 in 0.01 s' in err and '(2 attempts)' in out


# ------------------------------------------------------------------------------------ failures
def test_one_model_failing_still_shows_both_and_exits_1(capsys, gateway, tmp_path):
    config = server_config(tmp_path, gateway, student_model='no-such-student')
    status, out, err = check(capsys, '--config', str(config))
    assert status == 1
    assert '200 OK' in out and '404 Not Found' in out and f'{TEACHER} heard' in out
    assert 'result: student failed' in out
    assert 'student (no-such-student) failed: no-such-student: HTTP 404' in err
    assert f'fix: fix student_model in {config}' in err


def test_wrong_key_fails_both_with_401(capsys, gateway, tmp_path, monkeypatch):
    config = server_config(tmp_path, gateway)
    monkeypatch.setenv('TAOTOKEN_API_KEY', 'sk-other-gateway-key-9999')
    status, out, err = check(capsys, '--config', str(config))
    assert status == 1 and out.count('401 Unauthorized') == 2
    assert err.count('rejected the key (sk-...9999 from env TAOTOKEN_API_KEY)') == 2
    assert 'sk-other-gateway-key-9999' not in out + err
    assert 'result: teacher and student failed' in out


def test_timeout_and_refused(capsys, gateway, tmp_path):
    config = server_config(tmp_path, gateway, timeout=0.3)
    gateway.queue(Reply(stall=True), model=TEACHER)
    status, out, err = check(capsys, '--config', str(config))
    assert status == 1 and 'no HTTP answer' in out and 'timeout: no answer from' in err
    assert '--timeout 300' in err
    config = server_config(tmp_path, gateway, base_url=f'http://127.0.0.1:{closed_port()}')
    status, out, err = check(capsys, '--config', str(config))
    assert status == 1 and err.count('connection refused') == 2


@pytest.mark.parametrize('setup, words', [
    ({}, 'no gateway config found'),
    ({'api_key': None}, 'no API key'),
    ({'base_url': None}, 'base_url is missing'),
    ({'teacher_model': ''}, 'teacher_model in'),
    ({'student_model': None}, 'student_model is missing'),
    ({'base_url': 'ftp://x'}, "scheme 'ftp'"),
    ({'tiemout': 3}, "unknown key 'tiemout'"),
    ({'env': ''}, 'CLAW_LLM_API_KEY is set but empty'),
])
def test_config_problems_exit_2_before_sending(capsys, gateway, tmp_path, monkeypatch, setup,
                                               words):
    argv = []
    if setup:
        overrides = {k: v for k, v in setup.items() if k != 'env'}
        argv = ['--config', str(server_config(tmp_path, gateway, **overrides))]
    if 'env' in setup:
        monkeypatch.setenv('CLAW_LLM_API_KEY', setup['env'])
    status, out, err = check(capsys, *argv)
    assert status == 2 and out == '' and gateway.requests == []
    assert err.startswith('claw-rl gateway: error: ') and words in err and '  fix: ' in err


def test_option_misuse_exits_2(capsys, gateway, tmp_path):
    config = str(server_config(tmp_path, gateway))
    status, _, err = check(capsys, '--config', config, '--state', 'x.json')
    assert status == 2 and 'only apply with --observation' in err
    status, _, err = check(capsys, '--config', config, '--prompt', '  ')
    assert status == 2 and 'prompt is empty' in err
    with pytest.raises(SystemExit) as info:
        main(['gateway', 'check', '--prompt', 'a', '--prompt-file', 'b'])
    assert info.value.code == 2
    assert gateway.requests == []


def test_help_lists_the_options(capsys):
    with pytest.raises(SystemExit) as info:
        main(['gateway', 'check', '--help'])
    out = capsys.readouterr().out
    assert info.value.code == 0
    for option in ('--config', '--prompt', '--observation', '--model', '--state', '--full',
                   'CLAW_LLM_API_KEY', 'TAOTOKEN_API_KEY', 'CLAW_LLM_CONFIG'):
        assert option in out


# --------------------------------------------------------------------------------- observation
def test_observation_from_simulation(capsys, gateway, tmp_path, spec_meta):
    config = server_config(tmp_path, gateway)
    status, out, _ = check(capsys, '--config', str(config), '--observation', '--steps', '3')
    assert status == 0
    sent = prompts(gateway)
    assert sent[0] == sent[1]
    prompt = sent[0]
    assert 'Robot: claw_quadruped, 12 actuated joints' in prompt
    assert ', '.join(spec_meta['joint_names']) in prompt
    assert 'simulation, 3 control steps of zero action' in prompt
    for term in spec_meta['observation']:
        assert f'- {term["name"]} (' in prompt
    assert 'gyro, body frame [rad/s]' in prompt and 'trunk tilt from upright' in prompt
    assert prompt.endswith("Question: In one sentence, describe the robot's posture and motion.")
    assert 'observation summary (spec of robot claw_quadruped' in out


def test_observation_from_model_and_recorded_list(capsys, gateway, tmp_path, spec_meta):
    meta = dict(spec_meta, robot='exported_dog')
    model = write_onnx(tmp_path / 'student.onnx', meta)
    state = [0.0] * meta['obs_dim']
    offsets = {}
    start = 0
    for term in meta['observation']:
        offsets[term['name']] = (start, term['scale'])
        start += term['size']
    joint_vel, scales = offsets['joint_vel']
    state[joint_vel] = 2.0 * scales[0]  # recorded (scaled) value of 2 rad/s on the first joint
    gyro, _ = offsets['base_ang_vel']
    state[gyro + 2] = 0.25 * 0.8  # yaw rate 0.8 rad/s, scale 0.25
    path = tmp_path / 'state.json'
    path.write_text(json.dumps([state]))
    config = server_config(tmp_path, gateway)
    status, out, _ = check(capsys, '--config', str(config), '--observation', '--model',
                           str(model), '--state', str(path), '--prompt', 'Is it spinning?')
    assert status == 0
    prompt = prompts(gateway)[0]
    assert 'Robot: exported_dog' in prompt and 'recorded observation state.json' in prompt
    assert 'FL_hip=+2.000' in prompt and 'z=+0.800' in prompt
    assert prompt.endswith('Question: Is it spinning?')
    assert f'spec from {model}' in out


def test_observation_from_recorded_terms(capsys, gateway, tmp_path, spec_meta):
    values = {t['name']: [0.0] * t['size'] for t in spec_meta['observation']}
    values['projected_gravity'] = [0.0, 0.5, -0.866]
    values['velocity_commands'] = [0.7, 0.0, 0.0]
    path = tmp_path / 'terms.json'
    path.write_text(json.dumps(values))
    config = server_config(tmp_path, gateway)
    status, _, _ = check(capsys, '--config', str(config), '--observation', '--state', str(path))
    assert status == 0
    prompt = prompts(gateway)[0]
    assert 'vx=+0.700, vy=+0.000, yaw_rate=+0.000' in prompt
    assert 'trunk tilt from upright 30.0 deg' in prompt


@pytest.mark.parametrize('problem, words', [
    ('no_metadata', "has no 'claw_rl_spec' metadata"),
    ('not_onnx', 'is not a readable ONNX model'),
    ('missing', '(--model) does not exist'),
    ('short_state', 'the model expects obs_dim = 47'),
    ('bad_term', "'jiont_pos' is not an observation term"),
    ('nan_state', 'not a finite number'),
])
def test_observation_input_problems_exit_2(capsys, gateway, tmp_path, spec_meta, problem,
                                           words):
    model = write_onnx(tmp_path / 'm.onnx', spec_meta)
    state = tmp_path / 's.json'
    state.write_text(json.dumps([0.0] * spec_meta['obs_dim']))
    if problem == 'no_metadata':
        model = write_onnx(tmp_path / 'bare.onnx', None)
    elif problem == 'not_onnx':
        model.write_text('not a model')
    elif problem == 'missing':
        model = tmp_path / 'gone.onnx'
    elif problem == 'short_state':
        state.write_text('[1, 2, 3]')
    elif problem == 'bad_term':
        state.write_text(json.dumps({'jiont_pos': [0.0] * 12}))
    elif problem == 'nan_state':
        state.write_text('[NaN' + ', 0' * (spec_meta['obs_dim'] - 1) + ']')
    config = server_config(tmp_path, gateway)
    status, _, err = check(capsys, '--config', str(config), '--observation', '--model',
                           str(model), '--state', str(state))
    assert status == 2 and words in err and gateway.requests == []


def test_simulated_robot_must_match_the_model(capsys, gateway, tmp_path, spec_meta):
    meta = dict(spec_meta, observation=spec_meta['observation'][:2],
                obs_dim=sum(t['size'] for t in spec_meta['observation'][:2]))
    model = write_onnx(tmp_path / 'm.onnx', meta)
    config = server_config(tmp_path, gateway)
    status, _, err = check(capsys, '--config', str(config), '--observation', '--model',
                           str(model), '--steps', '0')
    assert status == 2 and 'but the model expects' in err and '--state' in err


# ------------------------------------------------------------------------------------- masking
def test_key_never_printed_on_any_path(capsys, caplog, gateway, tmp_path, monkeypatch):
    caplog.set_level(logging.DEBUG)
    echo = {'error': {'message': f'your key {KEY} is bad'}}
    config = server_config(tmp_path, gateway, timeout=0.3)
    gateway.queue(Reply(401, echo), Reply(403, echo), Reply(404, echo), Reply(400, echo),
                  Reply(200, echo), Reply(200, f'<p>{KEY}</p>'), Reply(422, echo),
                  Reply(stall=True))
    for _ in range(4):
        check(capsys, '--config', str(config))
    check(capsys, '--config', str(server_config(tmp_path, gateway, api_key=f' Bearer {KEY} ')))
    check(capsys, '--config', str(server_config(tmp_path, gateway, base_url='https://gw test')))
    monkeypatch.setenv('CLAW_LLM_API_KEY', KEY + '\u2026')
    check(capsys, '--config', str(config))
    monkeypatch.setenv('CLAW_LLM_API_KEY', KEY)
    monkeypatch.setenv('HTTP_PROXY', f'http://{KEY}@127.0.0.1:{closed_port()}')
    check(capsys, '--config', str(config))
    records = '\n'.join(r.getMessage() for r in caplog.records)
    assert KEY not in records and KEY not in caplog.text
    assert len(gateway.requests) == 10


# ----------------------------------------------------------------------------------- subprocess
def claw_rl() -> list[str]:
    script = shutil.which('claw-rl', path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, '-m', 'claw_rl_ros.cli']


def test_installed_command_against_local_server(gateway, tmp_path):
    config = server_config(tmp_path, gateway, api_key='<placeholder, key comes from env>')
    env = dict(os.environ, CLAW_LLM_API_KEY=KEY, PYTHONUNBUFFERED='1')
    done = subprocess.run([*claw_rl(), 'gateway', 'check', '--config', str(config),
                           '--prompt', 'ping'], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f'{TEACHER} heard 4 chars: ping' in done.stdout
    assert f'{STUDENT} heard 4 chars: ping' in done.stdout
    assert KEY not in done.stdout + done.stderr
    assert [r.path for r in gateway.requests] == ['/v1/chat/completions'] * 2

    env['CLAW_LLM_API_KEY'] = ' '
    done = subprocess.run([*claw_rl(), 'gateway', 'check', '--config', str(config)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and 'CLAW_LLM_API_KEY is set but empty' in done.stderr
    assert 'Traceback' not in done.stderr and len(gateway.requests) == 2
