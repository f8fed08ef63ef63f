"""A local OpenAI-compatible chat-completions server and helpers for the gateway tests.

The server listens on 127.0.0.1 (port 0), records every request (path, headers, JSON body) and
answers like a real gateway: 401 for a wrong key (echoing the key it got, so masking is tested),
404 ``model_not_found`` for unknown models, a chat completion otherwise. Tests queue canned
replies (429, 5xx, non-JSON, stalls, dripped or cut bodies, raw header lines, ...) per model.
It also answers requests sent to it as an HTTP proxy (absolute URLs), for hosts other than
127.0.0.1 without leaving the loopback interface. :func:`assert_no_key` is the leak oracle.
Its fixtures (``gateway``, ``clean_env``) are in conftest.py.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import json
from pathlib import Path
import re
import socket
import struct
import threading
from typing import Any, Optional
from urllib.parse import unquote_plus, urlsplit

# A recognisable fake key: no test output may ever contain it.
KEY = 'sk-gwtest-RAWKEY-0123456789abcdef'
KEY_MASKED = 'sk-...cdef'
TEACHER = 'teacher-large-v1'
STUDENT = 'student-small-v1'
CHAT_PATH = '/v1/chat/completions'
ENV_VARS = ('CLAW_LLM_API_KEY', 'TAOTOKEN_API_KEY', 'CLAW_LLM_CONFIG', 'NO_PROXY', 'no_proxy',
            'HTTP_PROXY', 'http_proxy', 'HTTPS_PROXY', 'https_proxy', 'ALL_PROXY', 'all_proxy',
            'REQUESTS_CA_BUNDLE', 'CURL_CA_BUNDLE', 'NETRC')


@dataclass
class Reply:
    """A canned answer.

    ``body``: JSON (dict/list), text, raw bytes, or a function of the :class:`Recorded` request
    returning one of those. ``drip``: seconds between single body bytes. ``cut``: send only
    that many body bytes, then reset the connection. ``raw_headers``: header lines sent as is.
    """

    status: int = 200
    body: Any = None
    headers: dict = field(default_factory=dict)
    stall: bool = False
    drip: float = 0.0
    cut: Optional[int] = None
    raw_headers: tuple = ()
    reason: Optional[str] = None


@dataclass
class Recorded:
    """One request as the server saw it."""

    method: str
    path: str
    headers: dict
    body: Any
    target: str = ''


def completion(model: str, content: str) -> dict:
    """A chat-completions answer body."""
    return {'id': 'chatcmpl-test', 'object': 'chat.completion', 'model': model,
            'choices': [{'index': 0, 'finish_reason': 'stop',
                         'message': {'role': 'assistant', 'content': content}}],
            'usage': {'prompt_tokens': 5, 'completion_tokens': 5, 'total_tokens': 10}}


class FakeGateway:
    """The test server; ``url`` is its root, ``requests`` what it received."""

    def __init__(self, key: str = KEY, models: tuple[str, ...] = (TEACHER, STUDENT)):
        self.key = key
        self.models = set(models)
        self.chat_path = CHAT_PATH
        self.requests: list[Recorded] = []
        self.queued: dict[Optional[str], list[Reply]] = {}
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._server = _Server(('127.0.0.1', 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,),
                                        daemon=True)

    @property
    def url(self) -> str:
        return f'http://127.0.0.1:{self._server.server_address[1]}'

    def start(self) -> 'FakeGateway':
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()

    def queue(self, *replies: Reply, model: Optional[str] = None) -> None:
        """Answer the next requests (for ``model``, or any model) with these replies."""
        with self._lock:
            self.queued.setdefault(model, []).extend(replies)

    def chat_requests(self, model: Optional[str] = None) -> list[Recorded]:
        return [r for r in self.requests if model is None
                or (isinstance(r.body, dict) and r.body.get('model') == model)]

    def answer(self, request: Recorded) -> Reply:
        """Choose the reply: a queued one first, then the behaviour of a real gateway."""
        model = request.body.get('model') if isinstance(request.body, dict) else None
        with self._lock:
            for name in (model, None):
                if self.queued.get(name):
                    return self.queued[name].pop(0)
        if request.path != self.chat_path:
            return Reply(404, {'error': {'message': f'Invalid URL (POST {request.path})',
                                         'type': 'invalid_request_error'}})
        auth = request.headers.get('authorization', '')
        if auth != f'Bearer {self.key}':
            return Reply(401, {'error': {'message': f'Incorrect API key provided: {auth}',
                                         'type': 'invalid_request_error',
                                         'code': 'invalid_api_key'}})
        if model not in self.models:
            return Reply(404, {'error': {'message': f'The model `{model}` does not exist or '
                                         'you do not have access to it.',
                                         'code': 'model_not_found'}})
        prompt = request.body['messages'][-1]['content']
        return Reply(200, completion(model, f'{model} heard {len(prompt)} chars: '
                                            f'{prompt.splitlines()[0][:40]}'))


def _handler(gateway: FakeGateway) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = 'HTTP/1.1'
        disable_nagle_algorithm = True

        def do_POST(self) -> None:  # noqa: N802 - http.server naming
            length = int(self.headers.get('Content-Length') or 0)
            raw = self.rfile.read(length) if length else b''
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode('latin-1')
            request = Recorded('POST', urlsplit(self.path).path,
                               {k.lower(): v for k, v in self.headers.items()}, body, self.path)
            gateway.requests.append(request)
            self._send(gateway.answer(request), request)

        do_GET = do_POST  # noqa: N815

        def _send(self, reply: Reply, request: Recorded) -> None:
            if reply.stall:
                gateway.release.wait(10)
                return
            body = reply.body(request) if callable(reply.body) else reply.body
            if isinstance(body, (dict, list)):
                data, ctype = json.dumps(body).encode(), 'application/json'
            elif isinstance(body, bytes):
                data, ctype = body, 'application/octet-stream'
            else:
                data = (body or '').encode('utf-8', 'surrogatepass')
                ctype = 'text/html; charset=utf-8'
            self.send_response(reply.status, reply.reason)
            headers = {'Content-Type': ctype, **reply.headers}
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header('Content-Length', str(len(data)))
            for line in reply.raw_headers:
                self._headers_buffer.append(line.encode('utf-8') + b'\r\n')
            self.end_headers()
            data = data if reply.cut is None else data[:reply.cut]
            step = 1 if reply.drip else len(data) or 1
            for start in range(0, len(data), step):
                self.wfile.write(data[start:start + step])
                if reply.drip and gateway.release.wait(reply.drip):
                    return
            if reply.cut is not None:  # reset (RST), not a clean close
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack('ii', 1, 0))
                self.connection.close()
                self.close_connection = True

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that hang up (a deadline, a cap) are expected: no traceback on stderr."""


def assert_no_key(*texts: str, key: str = KEY) -> None:
    """Assert no text holds ``key`` in any form.

    Checked: any 8 characters of the middle its masked form hides, raw or URL-decoded, and
    inside any base64 token (standard or URL-safe alphabet, any alignment).
    """
    middle = key[3:-4]
    windows = [middle[i:i + 8] for i in range(len(middle) - 7)]
    for text in texts:
        for variant in (text, unquote_plus(text), text.replace('\\', '')):
            found = [w for w in windows if w in variant]
            assert not found, f'key fragment {found[0]!r} in output:\n{text}'
        for token in re.findall(r'[A-Za-z0-9+/_-]{12,}', text):
            token = token.replace('-', '+').replace('_', '/')
            for shift in range(4):
                part = token[shift:][:(len(token) - shift) // 4 * 4]
                decoded = base64.b64decode(part).decode('latin-1')
                found = [w for w in windows if w in decoded]
                assert not found, f'key fragment {found[0]!r} base64-encoded in:\n{text}'


def closed_port() -> int:
    """A 127.0.0.1 port with nothing listening on it."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def write_config(folder: Path, fmt: str = 'json', name: str = 'llm_gateway', **fields: Any
                 ) -> Path:
    """Write a gateway config in JSON, TOML or YAML; ``None`` values are left out."""
    data = {k: v for k, v in fields.items() if v is not None}
    path = Path(folder) / f'{name}.{fmt}'
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == 'json':
        path.write_text(json.dumps(data, indent=2))
    elif fmt == 'toml':
        path.write_text(''.join(f'{k} = {json.dumps(v)}\n' for k, v in data.items()))
    else:
        import yaml
        path.write_text(yaml.safe_dump(data))
    return path


def server_config(folder: Path, gateway: FakeGateway, fmt: str = 'json', **overrides: Any
                  ) -> Path:
    """A config file for ``gateway`` (key in the file unless overridden), fast retries."""
    fields = {'base_url': gateway.url, 'api_key': KEY, 'teacher_model': TEACHER,
              'student_model': STUDENT, 'timeout': 5, 'retry_backoff': 0.01}
    fields.update(overrides)
    return write_config(folder, fmt, **fields)
