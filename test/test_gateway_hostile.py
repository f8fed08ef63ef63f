"""``claw-rl gateway check`` under hostile answers and configs (issue 12), on 127.0.0.1 only.

Every test runs the command, asserts its exit status, and asserts that no stdout or stderr line
holds the key in any form (:func:`gateway_server.assert_no_key`). The key here has URL-special
characters, so its URL-encoded form differs from the raw one.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
import re
import struct
import subprocess
import sys
import time
import tracemalloc
from urllib.parse import quote
import zlib

from claw_rl_ros.cli import main
from gateway_server import (
    assert_no_key, completion, FakeGateway, Reply, server_config, STUDENT, TEACHER)
import pytest

# Every test without the developer's key, config or proxy variables, in a tmp CWD and HOME.
pytestmark = pytest.mark.usefixtures('clean_env')

KEY = 'sk-gw+test/RAW=KEY&0123456789abcdef'
KEY_MASKED = 'sk-...cdef'


@pytest.fixture
def gateway() -> FakeGateway:
    """conftest.py's ``gateway``, with this module's URL-special key."""
    server = FakeGateway(key=KEY).start()
    yield server
    server.stop()


def check(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``claw-rl gateway check ARGV``; return (status, stdout, stderr), leak-checked."""
    status = main(['gateway', 'check', *argv])
    out, err = capsys.readouterr()
    assert 'Traceback' not in out + err
    assert_no_key(out, err, key=KEY)
    return status, out, err


def config(tmp_path: Path, gateway: FakeGateway, **fields) -> str:
    fields.setdefault('api_key', KEY)
    return str(server_config(tmp_path, gateway, **fields))


def row(out: str, label: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(label))


def echo_headers(request) -> dict:
    """A completion whose answer is every request header, as the server saw it."""
    return completion(request.body['model'], json.dumps(request.headers))


# --------------------------------------------------------------------- 1: the key is printed
@pytest.mark.parametrize('base_url, words', [
    (f'https://gw.example.com/v1?key={quote(KEY, safe="")}', '?query'),
    (f'https://gw.example.com/v1?key={KEY}', '?query'),
    (f'https://gw.example.com/v1#{KEY}', '?query'),
    (f'ftp://gw.example.com/v1?key={quote(KEY, safe="")}', "scheme 'ftp'"),
    (f'https://user:{KEY} @gw.example.com/v1', 'contains a space'),
    (f'https://user:{quote(KEY, safe="")}@gw.example.com/v1', 'user credentials'),
])
@pytest.mark.parametrize('key_in', ['url only', 'env too'])
def test_1a_key_in_a_rejected_base_url_is_masked(capsys, gateway, tmp_path, monkeypatch,
                                                 base_url, words, key_in):
    if key_in == 'env too':
        monkeypatch.setenv('CLAW_LLM_API_KEY', KEY)
    path = config(tmp_path, gateway, base_url=base_url, api_key='sk-other-0000000000000')
    status, out, err = check(capsys, '--config', path)
    assert status == 2 and out == '' and words in err and gateway.requests == []


def test_1b_key_echoed_in_a_successful_answer_is_masked(capsys, gateway, tmp_path):
    gateway.queue(Reply(200, echo_headers), model=TEACHER)
    status, out, _ = check(capsys, '--config', config(tmp_path, gateway), '--full')
    assert status == 0 and f'Bearer {KEY_MASKED}' in out


def test_1c_proxy_password_in_a_basic_header_echoed_is_masked(capsys, gateway, tmp_path,
                                                              monkeypatch):
    # the gateway is reached as an HTTP proxy that needs the key as its password
    proxy = gateway.url.replace('http://', f'http://user:{quote(KEY, safe="")}@')
    monkeypatch.setenv('HTTP_PROXY', proxy)
    gateway.queue(Reply(200, echo_headers), Reply(200, echo_headers))
    path = config(tmp_path, gateway, base_url='http://gateway.test/v1', api_key=None)
    monkeypatch.setenv('TAOTOKEN_API_KEY', KEY)
    status, out, _ = check(capsys, '--config', path, '--full')
    basic = base64.b64encode(f'user:{KEY}'.encode()).decode()
    assert [r.headers['proxy-authorization'] for r in gateway.requests] == [f'Basic {basic}'] * 2
    assert status == 0 and out.count('Basic') == 2 and out.count(f'Bearer {KEY_MASKED}') == 2


def test_1d_key_in_a_malformed_header_line_is_masked(capsys, gateway, tmp_path):
    # urllib3 logs a warning quoting the line it could not parse: it must pass the mask too
    gateway.queue(Reply(200, completion(TEACHER, 'ok'),
                        raw_headers=(f'X-Echo {KEY}\x1b[2J',)), model=TEACHER)
    status, _, err = check(capsys, '--config', config(tmp_path, gateway))
    assert status == 0 and '\x1b' not in err
    assert 'warning: Failed to parse headers' in err and 'X-Echo sk-...cdef\\x1b[2J' in err


def test_1e_key_echoed_url_encoded_and_in_base64_in_an_error_is_masked(capsys, gateway,
                                                                       tmp_path):
    said = (f'bad key {quote(KEY, safe="")} (base64 '
            f'{base64.b64encode(("x" + KEY).encode()).decode()}, urlsafe '
            f'{base64.urlsafe_b64encode(("yz" + KEY).encode()).decode()})')
    gateway.queue(Reply(401, {'error': {'message': said}}), model=STUDENT)
    status, out, err = check(capsys, '--config', config(tmp_path, gateway))
    assert status == 1 and '401 Unauthorized' in out and 'bad key' in err


# -------------------------------------------------------------------- 2: a real deadline
def test_2_timeout_bounds_the_whole_attempt_even_for_a_dripped_body(capsys, gateway, tmp_path):
    timeout = 2.0
    body = json.dumps(completion(TEACHER, 'slow ' * 40)).encode()  # ~330 bytes: ~80 s dripped
    gateway.queue(Reply(200, body, {'Content-Type': 'application/json'}, drip=0.25),
                  model=TEACHER)
    start = time.monotonic()
    status, out, err = check(capsys, '--config', config(tmp_path, gateway, timeout=timeout))
    elapsed = time.monotonic() - start
    assert status == 1
    assert timeout * 0.9 < elapsed < timeout + 3.0, elapsed  # generous margin, shared CPU
    assert f'{timeout:g} s per attempt (connect, wait and body)' in out
    assert 'at most 66 s per model' in out  # 3 attempts x 2 s + 2 waits x 30 s
    assert 'HTTP 200 came but the body was still arriving' in err
    assert 'result: teacher failed' in out and len(gateway.chat_requests(TEACHER)) == 1


# --------------------------------------------------------------------- 3: unbounded answers
def gzip_bomb(mebibytes: int) -> bytes:
    """A valid gzip body of ~1 KiB per MiB of zeros it inflates to."""
    zeros = b'\0' * (1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    same = deflate.compress(zeros) + deflate.flush(zlib.Z_FULL_FLUSH)
    assert same == block  # a full flush makes every further MiB the same bytes
    crc = 0
    for _ in range(mebibytes):
        crc = zlib.crc32(zeros, crc)
    return (b'\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff' + block * mebibytes + deflate.flush()
            + struct.pack('<II', crc, (mebibytes << 20) & 0xffffffff))


def test_3_gzip_bomb_stops_at_the_decoded_size_cap(capsys, gateway, tmp_path):
    bomb = gzip_bomb(1900)  # ~1.9 MB on the wire, 1.9 GiB inflated
    assert len(bomb) < 2_100_000
    gateway.queue(Reply(200, bomb, {'Content-Encoding': 'gzip',
                                    'Content-Type': 'application/json'}), model=TEACHER)
    path = config(tmp_path, gateway)
    tracemalloc.start()
    try:
        status, out, err = check(capsys, '--config', path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert status == 1 and 'result: teacher failed' in out
    assert 'larger than 8388608 bytes (after decompressing' in err and 'max_body_bytes' in err
    assert peak < 48 << 20, f'peak {peak / 2**20:.0f} MiB'  # cap 8 MiB: chunks + one join


def test_3_the_cap_is_configurable(capsys, gateway, tmp_path):
    big = completion(TEACHER, 'x' * 70_000)
    gateway.queue(Reply(200, big), Reply(200, completion(STUDENT, 'y' * 60_000)))
    status, out, err = check(capsys, '--config', config(tmp_path, gateway,
                                                        max_body_bytes=65536))
    assert status == 1 and 'result: teacher failed' in out
    assert 'larger than 65536 bytes' in err and 'after decompressing' not in err


# --------------------------------------------------------------- 4 and 5: what is shown
def test_4_lone_surrogate_in_an_answer_is_shown_escaped(capsys, gateway, tmp_path):
    gateway.queue(Reply(200, completion(TEACHER, 'half an emoji: \ud83d!')), model=TEACHER)
    status, out, _ = check(capsys, '--config', config(tmp_path, gateway))
    assert status == 0 and 'half an emoji: \\ud83d!' in out
    assert f'{STUDENT} heard' in out and 'result: both models answered' in out


def test_4_no_crash_on_a_stdout_that_cannot_encode(gateway, tmp_path):
    gateway.queue(Reply(200, completion(TEACHER, 'emoji \U0001f600 and half \ud83d')),
                  model=TEACHER)
    env = dict(os.environ, PYTHONIOENCODING='ascii', HOME=str(tmp_path))
    done = subprocess.run([sys.executable, '-m', 'claw_rl_ros.cli', 'gateway', 'check',
                           '--config', config(tmp_path, gateway)], env=env, cwd=tmp_path,
                          capture_output=True, timeout=60)
    out, err = done.stdout.decode('ascii'), done.stderr.decode('ascii')
    assert done.returncode == 0 and 'Traceback' not in err
    assert 'emoji \\U0001f600 and half \\ud83d' in out and 'both models answered' in out
    assert_no_key(out, err, key=KEY)


def test_5_terminal_control_sequences_are_escaped(capsys, gateway, tmp_path):
    nasty = 'a\x1b[2Jb\x1b]0;owned\x07c\rd\x9b31me\u202ef\x00g'
    gateway.queue(Reply(200, completion(TEACHER, nasty)), model=TEACHER)
    gateway.queue(Reply(400, {'error': {'message': nasty}}, reason='Bad\x1b[2J'),
                  model=STUDENT)
    status, out, err = check(capsys, '--config', config(tmp_path, gateway))
    assert status == 1
    for text in (out, err):
        assert not re.search('[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]', text)
    for shown in ('a\\x1b[2Jb', '\\x1b]0;owned\\x07c\\rd\\x9b31me\\u202ef', '\\x00g'):
        assert shown in out
    assert 'Bad\\x1b[2J' in err and '\\x1b]0;owned' in err


# ------------------------------------------------------------------ 6: other version roots
@pytest.mark.parametrize('suffix, path', [
    ('/api/paas/v4', '/api/paas/v4/chat/completions'),
    ('/v1beta/openai/', '/v1beta/openai/chat/completions'),
    ('/api/paas/v4/chat/completions', '/api/paas/v4/chat/completions'),
    ('/custom/chat/completions', '/custom/chat/completions'),
    ('/proxy', '/proxy/v1/chat/completions'),
])
def test_6_a_version_root_or_full_endpoint_is_used_as_given(capsys, gateway, tmp_path, suffix,
                                                            path):
    gateway.chat_path = path
    status, out, err = check(capsys, '--config',
                             config(tmp_path, gateway, base_url=gateway.url + suffix))
    assert status == 0 and f'POST {gateway.url}{path}\n' in out and 'base_url' not in err
    assert [r.path for r in gateway.requests] == [path] * 2


def test_6_the_404_fix_can_be_followed(capsys, gateway, tmp_path):
    gateway.chat_path = '/api/paas/v4/chat/completions'
    status, _, err = check(capsys, '--config',
                           config(tmp_path, gateway, base_url=gateway.url + '/api/paas'))
    assert status == 1 and err.count('no such endpoint') == 2
    assert 'ending in a version such as /v1, /v4 or /v1beta/openai is used as given' in err


# ------------------------------------------------------------------ 7: bounded <title> search
@pytest.mark.parametrize('body', ['<title' * 200_000, '<title>' + 'x' * 1_200_000,
                                  '<TITLE >' * 150_000 + '</title>'])
def test_7_title_search_on_a_large_non_json_body_is_linear(capsys, gateway, tmp_path, body):
    gateway.queue(Reply(200, body), model=TEACHER)
    start = time.monotonic()
    status, _, err = check(capsys, '--config', config(tmp_path, gateway))
    assert status == 1 and 'the body is not JSON' in err
    assert time.monotonic() - start < 10  # the old regex needed 18 s for 112 KB


# ------------------------------------------------------------------------------ 8: smaller
def test_8a_reset_mid_body_after_200_is_not_no_answer(capsys, gateway, tmp_path):
    body = json.dumps(completion(TEACHER, 'cut ' * 100))
    gateway.queue(Reply(200, body, cut=40), model=TEACHER)
    status, out, err = check(capsys, '--config', config(tmp_path, gateway))
    assert status == 1 and row(out, 'status').count('200 OK') == 2
    assert 'HTTP 200 came, then the connection broke after 40 bytes of the body' in err
    assert 'no HTTP answer' not in out and 'proxy' not in err.replace('a proxy on the way', '')


def sse(*events: object) -> str:
    return ''.join(f'data: {json.dumps(e) if not isinstance(e, str) else e}\n\n'
                   for e in events)


def test_8b_streamed_answer_is_read_not_called_a_web_page(capsys, gateway, tmp_path):
    chunks = [{'choices': [{'delta': {'role': 'assistant'}}]},
              {'choices': [{'delta': {'content': 'Four legs, '}}]},
              {'choices': [{'delta': {'content': 'standing.'}, 'finish_reason': 'stop'}]},
              {'choices': [], 'usage': {'total_tokens': 9}}, '[DONE]']
    gateway.queue(Reply(200, sse(*chunks), {'Content-Type': 'text/event-stream'}),
                  model=TEACHER)
    status, out, err = check(capsys, '--config', config(tmp_path, gateway))
    assert status == 0 and 'Four legs, standing.' in out and 'web page' not in err
    assert all(r.body['stream'] is False for r in gateway.requests)


def test_8b_an_error_event_in_a_stream_is_reported(capsys, gateway, tmp_path):
    gateway.queue(Reply(200, sse({'error': {'message': 'stream failed upstream'}}),
                        {'Content-Type': 'text/event-stream'}), model=STUDENT)
    status, out, err = check(capsys, '--config', config(tmp_path, gateway))
    assert status == 1 and 'gateway says: stream failed upstream' in err
    assert 'web page' not in err and 'result: student failed' in out


def test_8c_latency_counts_every_attempt_and_wait(capsys, gateway, tmp_path):
    gateway.queue(Reply(503, {}, {'Retry-After': '0.5'}), model=TEACHER)
    status, out, err = check(capsys, '--config', config(tmp_path, gateway))
    teacher = row(out, 'latency').split('|')[0]
    assert status == 0 and '(2 attempts)' in teacher and 'retry 2/3 in 0.50 s' in err
    assert int(re.search(r'(\d+) ms', teacher)[1]) >= 500


@pytest.mark.parametrize('reply', [
    Reply(200, {'error': {'message': 'Insufficient account balance', 'code': 'arrearage'}}),
    Reply(402, {'error': {'message': 'Payment required'}}),
])
def test_8d_a_balance_error_does_not_blame_the_model_id(capsys, gateway, tmp_path, reply):
    gateway.queue(reply, model=STUDENT)
    status, _, err = check(capsys, '--config', config(tmp_path, gateway))
    assert status == 1 and 'top up' in err
    assert 'student_model' not in err and 'unknown model' not in err


def test_8e_warning_before_the_key_goes_in_clear_text(capsys, gateway, tmp_path, monkeypatch):
    monkeypatch.setenv('HTTP_PROXY', gateway.url)  # reach 'gateway.test' without leaving lo
    path = config(tmp_path, gateway, base_url='http://gateway.test/v1')
    status, _, err = check(capsys, '--config', path)
    assert status == 0 and gateway.requests[0].target.startswith('http://gateway.test/v1/')
    assert 'http:// to gateway.test: the key would cross the network unencrypted' in err
    monkeypatch.delenv('HTTP_PROXY')
    status, _, err = check(capsys, '--config', config(tmp_path, gateway))
    assert status == 0 and 'unencrypted' not in err


@pytest.mark.parametrize('taotoken, file_key, fallback', [
    (KEY, KEY, 'to use the key from TAOTOKEN_API_KEY'),
    (None, KEY, 'to use api_key from'),
    (None, None, '(then no key is left: add one)'),
])
def test_8f_empty_override_names_the_real_fallback(capsys, gateway, tmp_path, monkeypatch,
                                                   taotoken, file_key, fallback):
    monkeypatch.setenv('CLAW_LLM_API_KEY', '')
    if taotoken:
        monkeypatch.setenv('TAOTOKEN_API_KEY', taotoken)
    status, out, err = check(capsys, '--config', config(tmp_path, gateway, api_key=file_key))
    assert status == 2 and out == '' and gateway.requests == []
    assert 'CLAW_LLM_API_KEY is set but empty' in err
    assert f'unset CLAW_LLM_API_KEY {fallback}' in err


# --------------------------------------------------------------------------- more hostility
@pytest.mark.parametrize('reply, words', [
    (Reply(200, '[' * 200_000, {'Content-Type': 'application/json'}), 'not JSON'),
    (Reply(200, b'\x1f\x8b not gzip', {'Content-Encoding': 'gzip'}), 'cannot be decompressed'),
    (Reply(200, b'x', {'Content-Encoding': 'br'}), "unsupported Content-Encoding 'br'"),
    (Reply(200, b'\xff\xfe\x00garbage', {'Content-Type': 'text/plain; charset=nope'}),
     'not JSON'),
])
def test_hostile_bodies_end_in_a_message_not_a_traceback(capsys, gateway, tmp_path, reply,
                                                         words):
    gateway.queue(reply, model=TEACHER)
    status, out, err = check(capsys, '--config', config(tmp_path, gateway))
    assert status == 1 and words in err and 'result: teacher failed' in out
