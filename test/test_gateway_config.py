"""Gateway config: formats, key precedence, validation messages, URL joining, masking."""

from __future__ import annotations

import json
from pathlib import Path

from claw_rl_ros.gateway.gateway_config import (
    candidate_paths, chat_completions_url, config_from_mapping, DEFAULT_TIMEOUT, find_config_file,
    GatewayConfig, load_gateway_config, make_config, normalize_base_url)
from claw_rl_ros.gateway.errors import GatewayConfigError, GatewayError, mask_key, redact
from gateway_server import KEY, KEY_MASKED, write_config
import pytest

# Every test without the developer's key, config or proxy variables, in a tmp CWD and HOME.
pytestmark = pytest.mark.usefixtures('clean_env')

REPO = Path(__file__).resolve().parents[1]
BASE = {'base_url': 'https://gw.test/v1', 'teacher_model': 'big-1', 'student_model': 'small-1'}


def fields(**extra):
    return {**BASE, **extra}


def config_error(data: dict, env: dict | None = None) -> GatewayConfigError:
    with pytest.raises(GatewayConfigError) as info:
        config_from_mapping(data, source='cfg.json', env=env or {})
    assert info.value.exit_code == 2
    assert KEY not in str(info.value)
    return info.value


# ------------------------------------------------------------------------------------ masking
@pytest.mark.parametrize('key, shown', [
    (KEY, KEY_MASKED), ('sk-abcdefghijkl', 'sk-...ijkl'), ('short-key', '***'), ('', '<empty>'),
    (None, '<empty>')])
def test_mask_key(key, shown):
    assert mask_key(key) == shown


def test_redact_replaces_every_occurrence():
    text = f'got {KEY} and again {KEY}!'
    assert redact(text, [KEY]) == f'got {KEY_MASKED} and again {KEY_MASKED}!'
    assert redact(text, [None, '']) == text


def test_error_redacted_copy_keeps_status():
    error = GatewayError(f'bad {KEY}', f'fix {KEY}', status=401, latency_s=0.5, attempts=2)
    clean = error.redacted([KEY])
    assert KEY not in str(clean) and KEY_MASKED in clean.message and KEY_MASKED in clean.hint
    assert (clean.status, clean.latency_s, clean.attempts) == (401, 0.5, 2)


def test_config_repr_masks_key():
    config = make_config('https://gw.test', KEY, 'big-1', 'small-1')
    for text in (repr(config), str(config), f'{config}', repr([config])):
        assert KEY not in text and KEY_MASKED in text
    assert config.api_key == KEY


# ------------------------------------------------------------------------------- URL joining
@pytest.mark.parametrize('base, url', [
    ('https://gw.test', 'https://gw.test/v1/chat/completions'),
    ('https://gw.test/', 'https://gw.test/v1/chat/completions'),
    ('https://gw.test/v1', 'https://gw.test/v1/chat/completions'),
    ('https://gw.test/v1/', 'https://gw.test/v1/chat/completions'),
    ('https://gw.test/v1///', 'https://gw.test/v1/chat/completions'),
    ('https://gw.test//v1', 'https://gw.test/v1/chat/completions'),
    ('https://gw.test/api/v1', 'https://gw.test/api/v1/chat/completions'),
    ('https://gw.test/api/v1/', 'https://gw.test/api/v1/chat/completions'),
    ('https://gw.test/api', 'https://gw.test/api/v1/chat/completions'),
    ('http://127.0.0.1:8080/v1/chat/completions', 'http://127.0.0.1:8080/v1/chat/completions'),
    ('https://gw.test/v1/chat/completions/', 'https://gw.test/v1/chat/completions'),
    ('  https://gw.test/v1 ', 'https://gw.test/v1/chat/completions'),
    ('HTTPS://gw.test:8443/v1', 'https://gw.test:8443/v1/chat/completions'),
])
def test_chat_url_has_exactly_one_v1(base, url):
    assert chat_completions_url(base) == url
    assert url.count('/v1') == 1 and '//' not in url.split('://', 1)[1]


def test_base_url_whitespace_warns_and_pasted_endpoint_is_accepted():
    root, warnings = normalize_base_url(' https://gw.test/v1/chat/completions', 'f.json')
    assert root == 'https://gw.test/v1'
    assert [w for w in warnings if 'whitespace' in w] == warnings and len(warnings) == 1


@pytest.mark.parametrize('base, url', [
    ('https://gw.test/api/paas/v4', 'https://gw.test/api/paas/v4/chat/completions'),
    ('https://gw.test/api/paas/v4/', 'https://gw.test/api/paas/v4/chat/completions'),
    ('https://gw.test/v1beta/openai/', 'https://gw.test/v1beta/openai/chat/completions'),
    ('https://gw.test/openai/v2', 'https://gw.test/openai/v2/chat/completions'),
    ('https://gw.test/chat/completions', 'https://gw.test/chat/completions'),
    ('https://gw.test/api/paas/v4/chat/completions',
     'https://gw.test/api/paas/v4/chat/completions'),
    ('https://gw.test/v1x2', 'https://gw.test/v1x2/chat/completions'),
    ('https://gw.test/version', 'https://gw.test/version/v1/chat/completions'),
    ('https://gw.test/openai', 'https://gw.test/openai/v1/chat/completions'),
])
def test_a_version_root_or_full_endpoint_is_used_as_given(base, url):
    assert chat_completions_url(base) == url


@pytest.mark.parametrize('base, warns', [
    ('http://gw.example.com/v1', True), ('http://10.0.0.5:8000/v1', True),
    ('http://127.0.0.1:8000/v1', False), ('http://localhost/v1', False),
    ('http://[::1]:8080', False), ('http://my.localhost/v1', False),
    ('https://gw.example.com/v1', False)])
def test_clear_text_http_to_another_host_warns(base, warns):
    _, warnings = normalize_base_url(base, 'f.json')
    assert any('unencrypted' in w for w in warnings) is warns


@pytest.mark.parametrize('base, words', [
    ('', 'is empty'), ('   ', 'is empty'), ('gw.test/v1', 'has no scheme'),
    ('ftp://gw.test/v1', "scheme 'ftp'"), ('file:///etc/passwd', "scheme 'file'"),
    ('https://gw test/v1', 'contains a space'), ('https://gw.test/my v1', 'contains a space'),
    ('https:///v1', 'no host name'), ('https://user:pw@gw.test/v1', 'user credentials'),
    ('https://gw.test/v1?key=1', '?query'), ('https://gw.test:99999/v1', 'invalid port'),
    ('https://[::1/v1', 'invalid port or [IPv6] host'), ('http://gw.test:0/v1', 'invalid port'),
    ('https://<your-gateway-host>/v1', 'placeholder'), (42, 'must be a string'),
])
def test_bad_base_url_is_rejected_with_its_own_message(base, words):
    error = config_error(fields(base_url=base, api_key=KEY))
    assert 'base_url' in error.message and words in error.message
    assert error.hint


# ------------------------------------------------------------------------------- file formats
@pytest.mark.parametrize('fmt', ['json', 'toml', 'yaml'])
def test_formats_load_the_same_config(tmp_path, fmt):
    path = write_config(tmp_path, fmt, api_key=KEY, timeout=30, temperature=0.5, **BASE)
    config = load_gateway_config(str(path))
    assert (config.base_url, config.api_key, config.teacher_model, config.student_model) == (
        'https://gw.test/v1', KEY, 'big-1', 'small-1')
    assert (config.timeout, config.temperature, config.source) == (30.0, 0.5, str(path))
    assert config.key_source == f'file {path}'


def test_defaults(tmp_path):
    config = load_gateway_config(str(write_config(tmp_path, api_key=KEY, **BASE)))
    assert config.timeout == DEFAULT_TIMEOUT == 120.0
    assert (config.temperature, config.max_attempts, config.retry_backoff) == (0.0, 3, 1.0)


@pytest.mark.parametrize('fmt, text, words', [
    ('json', '{"base_url": "https://gw.test",\n "api_key": "sk-abc",,}', 'line 2'),
    ('toml', 'base_url = "https://gw.test"\napi_key = sk-not-quoted\n', 'line 2'),
    ('yaml', 'base_url: https://gw.test\napi_key: "sk-secret-unterminated\n', 'line'),
    ('json', '["a", "b"]', 'must be a mapping'),
])
def test_unparsable_file_names_position_not_content(tmp_path, fmt, text, words):
    path = tmp_path / f'llm_gateway.{fmt}'
    path.write_text(text)
    with pytest.raises(GatewayConfigError) as info:
        load_gateway_config(str(path))
    assert str(path) in info.value.message and words in info.value.message
    for secret in ('sk-abc', 'sk-not-quoted', 'sk-secret'):
        assert secret not in str(info.value)


def test_unknown_format(tmp_path):
    path = tmp_path / 'gw.ini'
    path.write_text('x=1')
    with pytest.raises(GatewayConfigError, match='unknown config format'):
        load_gateway_config(str(path))


def test_unknown_key_is_an_error_with_suggestion():
    error = config_error(fields(api_key=KEY, timout=10))
    assert "unknown key 'timout'" in error.message and "'timeout'" in error.hint


# -------------------------------------------------------------------------- the three pieces
@pytest.mark.parametrize('missing', ['base_url', 'teacher_model', 'student_model'])
def test_each_missing_piece_has_its_own_message(missing):
    data = fields(api_key=KEY)
    del data[missing]
    error = config_error(data)
    assert error.message.startswith(f'{missing} is missing in cfg.json')
    assert 'never falls back' in error.message and missing in error.hint


def test_missing_key_names_both_variables_and_the_file():
    error = config_error(fields())
    assert 'CLAW_LLM_API_KEY' in error.message and 'TAOTOKEN_API_KEY' in error.message
    assert 'cfg.json has no api_key' in error.message
    assert 'export CLAW_LLM_API_KEY' in error.hint


@pytest.mark.parametrize('role', ['teacher_model', 'student_model'])
@pytest.mark.parametrize('value, words', [
    ('', 'is empty'), ('  ', 'is empty'), ('gpt 4', 'contains whitespace'),
    ('<teacher-model-id>', 'placeholder'), (7, 'must be a string')])
def test_bad_model_ids(role, value, words):
    error = config_error(fields(api_key=KEY, **{role: value}))
    assert role in error.message and words in error.message


def test_model_whitespace_is_stripped_with_warning():
    config = config_from_mapping(fields(api_key=KEY, teacher_model=' big-1\n'), 'c', {})
    assert config.teacher_model == 'big-1'
    assert any('teacher_model' in w and 'whitespace' in w for w in config.warnings)


def test_same_teacher_and_student_warns():
    config = config_from_mapping(fields(api_key=KEY, student_model='big-1'), 'c', {})
    assert any('both' in w for w in config.warnings)


@pytest.mark.parametrize('key, value, words', [
    ('timeout', 0, 'allowed'), ('timeout', -1, 'allowed'), ('timeout', '120', 'number'),
    ('timeout', True, 'number'), ('timeout', 99999, 'allowed'),
    ('temperature', 3, 'allowed'), ('max_attempts', 0, 'integer'),
    ('max_attempts', 2.5, 'integer'), ('retry_backoff', -0.1, 'allowed')])
def test_bad_options(key, value, words):
    error = config_error(fields(api_key=KEY, **{key: value}))
    assert key in error.message and words in error.message


# ------------------------------------------------------------------------------ key handling
def test_key_precedence_env_over_file(tmp_path):
    path = write_config(tmp_path, api_key='sk-from-the-file-000000', **BASE)
    env = {'TAOTOKEN_API_KEY': 'sk-from-taotoken-111111'}
    config = load_gateway_config(str(path), env=env)
    assert config.api_key == 'sk-from-taotoken-111111'
    assert config.key_source == 'env TAOTOKEN_API_KEY'
    assert any('overrides api_key' in w for w in config.warnings)
    env['CLAW_LLM_API_KEY'] = KEY
    config = load_gateway_config(str(path), env=env)
    assert (config.api_key, config.key_source) == (KEY, 'env CLAW_LLM_API_KEY')
    config = load_gateway_config(str(path), env={})
    assert (config.api_key, config.key_source) == ('sk-from-the-file-000000', f'file {path}')


def test_key_from_real_environment(tmp_path, monkeypatch):
    path = write_config(tmp_path, **BASE)
    monkeypatch.setenv('CLAW_LLM_API_KEY', KEY)
    config = load_gateway_config(str(path))
    assert (config.api_key, config.key_source) == (KEY, 'env CLAW_LLM_API_KEY')


@pytest.mark.parametrize('var', ['CLAW_LLM_API_KEY', 'TAOTOKEN_API_KEY'])
@pytest.mark.parametrize('value', ['', '   ', '\n'])
def test_empty_env_override_is_an_error_not_a_blank(var, value):
    error = config_error(fields(api_key='sk-from-the-file-000000'), env={var: value})
    assert f'{var} is set but empty' in error.message
    assert f'unset {var}' in error.hint


def test_empty_claw_var_is_an_error_even_with_taotoken_set():
    error = config_error(fields(), env={'CLAW_LLM_API_KEY': '', 'TAOTOKEN_API_KEY': KEY})
    assert 'CLAW_LLM_API_KEY is set but empty' in error.message


@pytest.mark.parametrize('raw', [f'  {KEY}\n', f'\t{KEY}', f'{KEY}\r\n'])
def test_key_whitespace_is_stripped_with_warning(raw):
    for data, env in ((fields(api_key=raw), {}), (fields(), {'CLAW_LLM_API_KEY': raw})):
        config = config_from_mapping(data, 'cfg.json', env)
        assert config.api_key == KEY
        warning = [w for w in config.warnings if 'surrounding whitespace' in w]
        assert warning and KEY not in ' '.join(config.warnings)


def test_pasted_bearer_prefix_is_removed_with_warning():
    config = config_from_mapping(fields(), 'c', {'CLAW_LLM_API_KEY': f'Bearer {KEY}'})
    assert config.api_key == KEY
    assert any('"Bearer "' in w for w in config.warnings)


@pytest.mark.parametrize('raw, words', [
    ('sk-abc def-0123456789', 'whitespace or a control character at position 6'),
    ('sk-abc\x00def-0123456789', 'control character'),
    ('sk-abc\u2026def-0123456789', 'non-ASCII character U+2026 at position 6'),
    ('"sk-abcdef-0123456789"', 'quote'),
    ('<set CLAW_LLM_API_KEY instead>', 'placeholder'),
    (12345, 'must be a string')])
def test_broken_keys_are_rejected_without_showing_them(raw, words):
    error = config_error(fields(api_key=raw))
    assert words in error.message
    if isinstance(raw, str) and len(raw) > 8:
        assert raw.strip('"<>') not in str(error)


def test_placeholder_key_in_file_is_fine_when_env_overrides():
    config = config_from_mapping(fields(api_key='<set CLAW_LLM_API_KEY instead>'), 'c',
                                 {'CLAW_LLM_API_KEY': KEY})
    assert config.api_key == KEY


def test_world_readable_file_with_key_warns(tmp_path):
    path = write_config(tmp_path, api_key=KEY, **BASE)
    path.chmod(0o644)
    assert any('chmod 600' in w for w in load_gateway_config(str(path)).warnings)
    path.chmod(0o600)
    assert not any('chmod 600' in w for w in load_gateway_config(str(path)).warnings)
    assert not any('chmod' in w for w in load_gateway_config(
        str(path), env={'CLAW_LLM_API_KEY': KEY}).warnings)


def test_overrides_are_validated():
    config = make_config('https://gw.test', KEY, 'big-1', 'small-1')
    changed = config.with_overrides(teacher_model='big-2', student_model=None, timeout=5)
    assert (changed.teacher_model, changed.student_model, changed.timeout) == (
        'big-2', 'small-1', 5.0)
    with pytest.raises(GatewayConfigError, match='timeout'):
        config.with_overrides(timeout=0)
    with pytest.raises(GatewayConfigError, match='teacher_model'):
        config.with_overrides(teacher_model=' ')


# -------------------------------------------------------------------------------- file lookup
def test_lookup_order(tmp_path, monkeypatch):
    home_cfg = write_config(tmp_path / '.config' / 'claw_rl_ros', 'toml', **BASE)
    assert find_config_file()[0] == home_cfg
    local_yaml = write_config(tmp_path / 'config', 'yaml', **BASE)
    assert find_config_file()[0] == local_yaml
    local_json = write_config(tmp_path / 'config', 'json', **BASE)
    path, warnings = find_config_file()
    assert path == local_json
    assert any(str(local_yaml) in w and 'ignored' in w for w in warnings)
    named = write_config(tmp_path / 'elsewhere', 'yaml', name='mine', **BASE)
    monkeypatch.setenv('CLAW_LLM_CONFIG', str(named))
    assert find_config_file()[0] == named
    explicit = write_config(tmp_path, 'json', name='explicit', **BASE)
    assert find_config_file(str(explicit))[0] == explicit


def test_no_config_anywhere_says_where_it_looked_and_how_to_create_one(tmp_path):
    with pytest.raises(GatewayConfigError) as info:
        find_config_file()
    message, hint = info.value.message, info.value.hint
    assert 'no gateway config found' in message
    assert str(tmp_path / 'config' / 'llm_gateway.{json,toml,yaml}') in message
    assert str(tmp_path / '.config' / 'claw_rl_ros') in message and 'CLAW_LLM_CONFIG' in message
    assert 'llm_gateway.example.json' in hint and 'CLAW_LLM_API_KEY' in hint


def test_missing_explicit_and_env_config(tmp_path, monkeypatch):
    with pytest.raises(GatewayConfigError, match=r'nope\.json \(--config\) does not exist'):
        find_config_file('nope.json')
    monkeypatch.setenv('CLAW_LLM_CONFIG', str(tmp_path / 'gone.yaml'))
    with pytest.raises(GatewayConfigError, match=r'from \$CLAW_LLM_CONFIG'):
        find_config_file()


# -------------------------------------------------------------------------- committed files
def test_example_config_is_a_placeholder_that_refuses_to_run():
    example = REPO / 'config' / 'llm_gateway.example.json'
    data = json.loads(example.read_text())
    assert set(data) >= {'base_url', 'api_key', 'teacher_model', 'student_model', 'timeout'}
    assert data['timeout'] == 120
    assert '<' in data['api_key'] and not data['api_key'].startswith('sk-')
    with pytest.raises(GatewayConfigError, match='placeholder'):
        load_gateway_config(str(example), env={})
    with pytest.raises(GatewayConfigError, match='base_url .* placeholder'):
        load_gateway_config(str(example), env={'CLAW_LLM_API_KEY': KEY})


def test_every_default_config_name_is_ignored_by_git(tmp_path):
    ignored = (REPO / '.gitignore').read_text().splitlines()
    local = [p for p in candidate_paths(cwd=tmp_path, home=tmp_path / 'home')
             if p.parent == tmp_path / 'config']
    assert len(local) == 3
    for path in local:
        assert f'config/{path.name}' in ignored


def test_config_type_is_frozen():
    config = make_config('https://gw.test', KEY, 'big-1', 'small-1')
    assert isinstance(config, GatewayConfig)
    with pytest.raises(AttributeError):
        config.api_key = 'other'
