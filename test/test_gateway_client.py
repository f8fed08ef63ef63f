"""GatewayClient against a real local HTTP server: success, every error path, retries, masking."""

from __future__ import annotations

import logging

from claw_rl_ros.gateway.client import (
    GatewayClient, mentions_unknown_model, parse_retry_after, sanitize_proxy)
from claw_rl_ros.gateway.gateway_config import make_config
from claw_rl_ros.gateway.errors import (
    GatewayAuthError, GatewayConnectionError, GatewayError, GatewayHTTPError, GatewayModelError,
    GatewayProxyError, GatewayRateLimitError, GatewayResponseError, GatewayServerError,
    GatewayTimeoutError)
from gateway_server import (
    CHAT_PATH, closed_port, completion, KEY, KEY_MASKED, Reply, STUDENT, TEACHER)
import pytest

# Every test without the developer's key, config or proxy variables, in a tmp CWD and HOME.
pytestmark = pytest.mark.usefixtures('clean_env')


def make_client(base_url: str, key: str = KEY, sleeps: list | None = None, **options):
    options.setdefault('retry_backoff', 0.01)
    options.setdefault('timeout', 5)
    config = make_config(base_url, key, TEACHER, STUDENT, **options)
    recorder = sleeps if sleeps is not None else []
    return GatewayClient(config, sleep=recorder.append, retry_after_cap=0.5)


def failure(client: GatewayClient, model: str = TEACHER, cls: type = GatewayError,
            prompt: str = 'hi') -> GatewayError:
    with pytest.raises(cls) as info:
        client.chat(model, prompt, role='teacher_model')
    error = info.value
    assert KEY not in str(error) and KEY not in repr(error)
    assert error.__cause__ is None and error.__context__ is None
    return error


# ------------------------------------------------------------------------------------ success
def test_both_models_answer_and_request_is_exact(gateway):
    client = make_client(gateway.url, temperature=0.3)
    teacher = client.chat(TEACHER, 'same prompt')
    student = client.chat(STUDENT, 'same prompt')
    assert teacher.content.startswith(f'{TEACHER} heard 11 chars')
    assert student.content.startswith(f'{STUDENT} heard 11 chars')
    assert (teacher.status, teacher.attempts, teacher.finish_reason) == (200, 1, 'stop')
    assert 0 < teacher.latency_s < 5
    assert len(gateway.requests) == 2
    for request, model in zip(gateway.requests, (TEACHER, STUDENT)):
        assert request.method == 'POST' and request.path == CHAT_PATH
        assert request.headers['authorization'] == f'Bearer {KEY}'
        assert request.headers['content-type'] == 'application/json'
        assert request.body == {'model': model, 'temperature': 0.3, 'stream': False,
                                'messages': [{'role': 'user', 'content': 'same prompt'}]}


@pytest.mark.parametrize('suffix', ['', '/', '/v1', '/v1/', '/v1//', '/v1/chat/completions'])
def test_base_url_variants_hit_one_endpoint(gateway, suffix):
    client = make_client(gateway.url + suffix)
    assert client.chat(STUDENT, 'x').status == 200
    assert [r.path for r in gateway.requests] == [CHAT_PATH]


def test_content_parts_are_joined(gateway):
    body = completion(TEACHER, '')
    body['choices'][0]['message']['content'] = [{'type': 'text', 'text': 'one '},
                                                {'type': 'text', 'text': 'two'}]
    gateway.queue(Reply(200, body))
    assert make_client(gateway.url).chat(TEACHER, 'x').content == 'one two'


def test_netrc_does_not_replace_the_bearer_header(gateway, tmp_path):
    (tmp_path / '.netrc').write_text('machine 127.0.0.1 login someone password netrcpass\n')
    (tmp_path / '.netrc').chmod(0o600)
    make_client(gateway.url).chat(TEACHER, 'x')
    assert gateway.requests[0].headers['authorization'] == f'Bearer {KEY}'


# ----------------------------------------------------------------------------------- 401/403
def test_401_names_key_source_and_bearer_and_masks_the_echoed_key(gateway):
    client = make_client(gateway.url, key='sk-wrong-key-000000000000')
    error = failure(client, cls=GatewayAuthError)
    assert error.status == 401 and error.attempts == 1
    assert 'rejected the key' in error.message and 'sk-...0000' in error.message
    assert 'Incorrect API key provided: Bearer sk-...0000' in error.message
    assert 'sk-wrong-key-000000000000' not in str(error)
    assert 'Bearer' in error.hint and 'arguments' in error.hint
    assert len(gateway.requests) == 1


def test_403_says_the_model_is_refused(gateway):
    gateway.queue(Reply(403, {'error': {'message': f'key {KEY} may not use this model'}}))
    error = failure(make_client(gateway.url), cls=GatewayAuthError)
    assert error.status == 403 and f'refused model {TEACHER!r}' in error.message
    assert KEY_MASKED in error.message


# ----------------------------------------------------------------------------------------- 404
def test_unknown_model_names_the_model_and_config_key(gateway):
    error = failure(make_client(gateway.url), model='no-such-model', cls=GatewayModelError)
    assert error.status == 404
    assert "does not know model id 'no-such-model'" in error.message
    assert 'does not exist' in error.message
    assert 'teacher_model in <arguments>' in error.hint and '/v1/models' in error.hint


def test_wrong_path_404_points_at_base_url(gateway):
    gateway.queue(Reply(404, '<html><title>404 Not Found</title></html>'))
    error = failure(make_client(gateway.url + '/api'), cls=GatewayModelError)
    assert 'no such endpoint' in error.message and '/api/v1/chat/completions' in error.message
    assert "'404 Not Found'" in error.message and 'base_url' in error.hint


def test_400_unknown_model_is_a_model_error_other_400_is_not(gateway):
    gateway.queue(Reply(400, {'error': {'message': 'Invalid model: gpt-nope'}}),
                  Reply(400, {'error': {'message': 'temperature is not supported with this '
                                        'model'}}))
    client = make_client(gateway.url)
    assert failure(client, cls=GatewayModelError).status == 400
    error = failure(client, cls=GatewayHTTPError)
    assert 'temperature is not supported' in error.message
    assert len(gateway.requests) == 2


# ----------------------------------------------------------------------------------- retries
def test_429_is_retried_with_exponential_backoff_then_succeeds(gateway):
    sleeps = []
    gateway.queue(Reply(429, {'error': {'message': 'slow down'}}), Reply(429, {}))
    reply = make_client(gateway.url, sleeps=sleeps).chat(STUDENT, 'x')
    assert reply.status == 200 and reply.attempts == 3
    assert sleeps == [0.01, 0.02]
    assert len(gateway.requests) == 3


def test_429_gives_up_after_max_attempts(gateway):
    sleeps = []
    gateway.queue(*[Reply(429, {'error': {'message': 'rate limit reached'}})] * 5)
    client = make_client(gateway.url, sleeps=sleeps, max_attempts=4)
    error = failure(client, cls=GatewayRateLimitError)
    assert error.status == 429 and error.attempts == 4 and len(gateway.requests) == 4
    assert sleeps == [0.01, 0.02, 0.04]
    assert 'after 4 attempt(s)' in error.message and 'rate limit reached' in error.message
    assert 'max_attempts' in error.hint


def test_retry_after_is_honoured_and_capped(gateway):
    sleeps = []
    gateway.queue(Reply(503, {}, {'Retry-After': '0.2'}), Reply(429, {}, {'Retry-After': '90'}))
    assert make_client(gateway.url, sleeps=sleeps).chat(TEACHER, 'x').attempts == 3
    assert sleeps == [0.2, 0.5]


@pytest.mark.parametrize('status', [500, 502, 503, 504])
def test_5xx_is_retried_then_reported(gateway, status):
    sleeps = []
    gateway.queue(*[Reply(status, {'error': {'message': 'upstream exploded'}})] * 3)
    error = failure(make_client(gateway.url, sleeps=sleeps), cls=GatewayServerError)
    assert error.status == status and len(gateway.requests) == 3 and len(sleeps) == 2
    assert 'server error' in error.message and 'upstream exploded' in error.message


def test_max_attempts_one_never_retries(gateway):
    gateway.queue(Reply(500, 'oops'))
    sleeps = []
    failure(make_client(gateway.url, sleeps=sleeps, max_attempts=1), cls=GatewayServerError)
    assert sleeps == [] and len(gateway.requests) == 1


def test_other_4xx_is_not_retried(gateway):
    gateway.queue(Reply(400, {'error': {'message': 'messages must not be empty'}}))
    sleeps = []
    error = failure(make_client(gateway.url, sleeps=sleeps), cls=GatewayHTTPError)
    assert sleeps == [] and len(gateway.requests) == 1 and error.status == 400
    assert 'messages must not be empty' in error.message


def test_redirect_is_not_followed(gateway):
    gateway.queue(Reply(301, '', {'Location': 'https://elsewhere.test/v1/chat/completions'}))
    error = failure(make_client(gateway.url), cls=GatewayHTTPError)
    assert error.status == 301 and 'https://elsewhere.test' in error.message
    assert 'https://' in error.hint and len(gateway.requests) == 1


@pytest.mark.parametrize('value, seconds', [
    ('3', 3.0), (' 1.5 ', 1.5), ('-4', 0.0), ('soon', None), ('', None), (None, None),
    ('Wed, 21 Oct 2015 07:28:00 GMT', 0.0)])
def test_parse_retry_after(value, seconds):
    assert parse_retry_after(value) == seconds


# --------------------------------------------------------------------------- malformed bodies
def test_body_without_choices_prints_the_gateway_message(gateway):
    gateway.queue(Reply(200, {'error': {'message': 'upstream said no', 'code': 'E42'}}))
    error = failure(make_client(gateway.url), cls=GatewayResponseError)
    assert 'no "choices"' in error.message and "KeyError: 'choices'" in error.message
    assert 'upstream said no | E42' in error.message and 'model id' in error.hint


def test_body_without_choices_about_balance_blames_the_balance(gateway):
    gateway.queue(Reply(200, {'error': {'message': 'insufficient balance', 'code': 'quota'}}))
    error = failure(make_client(gateway.url), cls=GatewayRateLimitError)
    assert 'insufficient balance' in error.message and 'top up' in error.hint
    assert 'teacher_model' not in error.hint and 'model id is not the problem' in error.hint


def test_body_without_choices_about_the_model_is_a_model_error(gateway):
    gateway.queue(Reply(200, {'code': 40004, 'msg': 'model not found: teacher-large-v1'}))
    error = failure(make_client(gateway.url), cls=GatewayModelError)
    assert 'model not found' in error.message


@pytest.mark.parametrize('body, words', [
    ({'choices': []}, '"choices" is []'),
    ({'choices': [{'message': {'content': None}, 'finish_reason': 'length'}]},
     "finish_reason='length'"),
    ({'choices': [{'message': {'content': '   '}}]}, 'missing or empty'),
    ({'choices': [{'text': 'legacy completion'}]}, 'missing or empty'),
    ([1, 2], 'JSON body is a list'),
])
def test_malformed_completions(gateway, body, words):
    gateway.queue(Reply(200, body))
    error = failure(make_client(gateway.url), cls=GatewayResponseError)
    assert words in error.message and error.status == 200


def test_non_json_body(gateway):
    gateway.queue(Reply(200, '<html><head><title>Gateway Console Login</title></head></html>'))
    error = failure(make_client(gateway.url), cls=GatewayResponseError)
    assert 'not JSON' in error.message and 'Gateway Console Login' in error.message
    assert 'text/html' in error.message and 'base_url' in error.hint


def test_plain_text_error_body(gateway):
    gateway.queue(Reply(502, 'Bad gateway: upstream timed out'), Reply(502, 'again'),
                  Reply(502, 'still down'))
    error = failure(make_client(gateway.url), cls=GatewayServerError)
    assert "'still down'" in error.message


@pytest.mark.parametrize('text, unknown', [
    ('The model `x` does not exist or you do not have access to it.', True),
    ('model_not_found', True), ('Unknown model: x', True), ('Invalid model id', True),
    ('model x not found', True), ('No such model', True),
    ('temperature is not supported with this model', False), ('rate limit exceeded', False),
    ('Invalid API key', False), ('', False)])
def test_mentions_unknown_model(text, unknown):
    assert mentions_unknown_model(text) is unknown


# ---------------------------------------------------------------------------------- transport
def test_connection_refused():
    port = closed_port()
    error = failure(make_client(f'http://127.0.0.1:{port}'), cls=GatewayConnectionError)
    assert f'connection refused by 127.0.0.1:{port}' in error.message
    assert error.status is None and 'base_url' in error.hint


def test_read_timeout_says_which_timeout_and_how_to_raise_it(gateway):
    gateway.queue(Reply(stall=True))
    sleeps = []
    client = make_client(gateway.url, sleeps=sleeps, timeout=0.3)
    error = failure(client, cls=GatewayTimeoutError)
    assert 'timeout: no answer from 127.0.0.1' in error.message
    assert 'within 0.3 s' in error.message and '"timeout" setting of <arguments>' in error.message
    assert '"timeout": 300' in error.hint and '--timeout 300' in error.hint
    assert 0.25 < error.latency_s < 3
    assert len(gateway.requests) == 1 and sleeps == []


@pytest.mark.parametrize('var', ['HTTP_PROXY', 'http_proxy', 'ALL_PROXY'])
def test_stale_proxy_names_the_variable_without_credentials(gateway, monkeypatch, var):
    port = closed_port()
    monkeypatch.setenv(var, f'http://proxyuser:proxypass@127.0.0.1:{port}')
    error = failure(make_client(gateway.url), cls=GatewayProxyError)
    assert f'{var}=http://127.0.0.1:{port} is set' in error.message
    assert 'proxyuser' not in str(error) and 'proxypass' not in str(error)
    assert f'unset {var}' in error.hint and 'NO_PROXY=127.0.0.1' in error.hint
    assert gateway.requests == []


def test_other_proxy_variables_are_listed(gateway, monkeypatch):
    port = closed_port()
    monkeypatch.setenv('HTTP_PROXY', f'http://127.0.0.1:{port}')
    monkeypatch.setenv('HTTPS_PROXY', 'http://10.9.9.9:3128')
    error = failure(make_client(gateway.url), cls=GatewayProxyError)
    assert 'HTTP_PROXY=' in error.message and 'also set: HTTPS_PROXY' in error.message


def test_no_proxy_bypasses_a_stale_proxy(gateway, monkeypatch):
    monkeypatch.setenv('HTTP_PROXY', f'http://127.0.0.1:{closed_port()}')
    monkeypatch.setenv('NO_PROXY', '127.0.0.1')
    assert make_client(gateway.url).chat(TEACHER, 'x').status == 200


@pytest.mark.parametrize('value, shown', [
    ('http://u:p@proxy.corp:8080', 'http://proxy.corp:8080'),
    ('proxy.corp:3128', 'proxy.corp:3128'), ('socks5://[::1]:1080', 'socks5://[::1]:1080'),
    ('http://:bad', '<unparsable proxy URL>')])
def test_sanitize_proxy(value, shown):
    assert sanitize_proxy(value) == shown


# ------------------------------------------------------------------------------------ masking
def test_key_never_appears_in_errors_reprs_or_logs(gateway, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    texts = []
    client = make_client(gateway.url, timeout=0.3)
    texts += [repr(client), str(client), repr(client.config), repr(client._auth)]
    replies = [
        Reply(401, {'error': {'message': f'bad key {KEY}'}}),
        Reply(403, {'error': f'forbidden for {KEY}'}),
        Reply(404, {'detail': f'no model for {KEY}'}),
        Reply(400, f'<html><title>{KEY}</title></html>'),
        Reply(200, {'error': {'message': f'no choices, key={KEY}'}}),
        Reply(200, f'not json {KEY}'),
        Reply(500, {'message': KEY}), Reply(500, {'message': KEY}), Reply(500, {'message': KEY}),
        Reply(301, '', {'Location': f'https://x.test/?k={KEY}'}),
        Reply(stall=True),
    ]
    gateway.queue(*replies)
    for _ in range(9):
        with pytest.raises(GatewayError) as info:
            client.chat(TEACHER, 'x')
        texts += [str(info.value), repr(info.value), info.value.message, info.value.hint]
    monkeypatch.setenv('HTTP_PROXY', f'http://127.0.0.1:{closed_port()}')
    with pytest.raises(GatewayProxyError) as info:
        client.chat(TEACHER, 'x')
    texts.append(str(info.value))
    joined = '\n'.join(texts + [r.getMessage() for r in caplog.records] + [caplog.text])
    assert KEY not in joined and 'RAWKEY' not in joined
    assert KEY_MASKED in joined
    assert len(gateway.requests) == 11


def test_https_to_a_plain_http_server_is_a_tls_error(gateway):
    port = gateway.url.rsplit(':', 1)[1]
    error = failure(make_client(f'https://127.0.0.1:{port}'), cls=GatewayConnectionError)
    assert 'TLS failed with 127.0.0.1' in error.message and 'http vs https' in error.hint


@pytest.mark.parametrize('proxy, words', [
    ('socks5://127.0.0.1:1', 'PySocks'), ('ftp://127.0.0.1:1', 'unsupported scheme')])
def test_unusable_proxy_urls(gateway, monkeypatch, proxy, words):
    monkeypatch.setenv('HTTP_PROXY', proxy)
    error = failure(make_client(gateway.url), cls=GatewayProxyError)
    assert f'HTTP_PROXY={proxy} is set' in error.message and words in error.describe()


def test_both_spellings_of_a_proxy_variable_are_named(gateway, monkeypatch):
    port = closed_port()
    monkeypatch.setenv('http_proxy', f'http://127.0.0.1:{port}')
    monkeypatch.setenv('HTTP_PROXY', 'http://10.9.9.9:3128')
    error = failure(make_client(gateway.url), cls=GatewayProxyError)
    assert f'http_proxy=http://127.0.0.1:{port} is set' in error.message
    assert 'unset http_proxy HTTP_PROXY' in error.hint
