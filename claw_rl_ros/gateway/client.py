"""A small, provider-neutral client for an OpenAI-compatible chat-completions gateway.

One endpoint (``POST {chat_url}``), one key (``Authorization: Bearer``), bounded retries for
429/5xx, and errors that name the cause and the fix. Each attempt is bounded as a whole:
``timeout`` covers connecting, waiting and reading the body (the exchange runs in a worker
thread that is given up at the deadline), and the body is read in chunks, decompressed by us
and refused past ``max_body_bytes``. Every error is redacted before it is raised, and no
requests exception (whose request object holds the headers) is chained to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
import json
import logging
import os
import re
import threading
import time
from typing import Any, Callable, Mapping, Optional
from urllib.parse import urlsplit
import zlib

import requests
import urllib3

from .errors import (
    GatewayAuthError, GatewayConnectionError, GatewayError, GatewayHTTPError,
    GatewayModelError, GatewayProxyError, GatewayRateLimitError, GatewayResponseError,
    GatewayServerError, GatewayTimeoutError, mask_key)
from .gateway_config import GatewayConfig, PROXY_VARS, RETRY_WAIT_CAP

logger = logging.getLogger(__name__)

_CHUNK = 64 << 10
# Only this much of a non-JSON body is searched for an HTML <title>.
_TITLE_WINDOW = 64 << 10
_EXCERPT = 300
_ENCODINGS = {'': None, 'identity': None, 'gzip': 47, 'x-gzip': 47, 'deflate': 47}
_UNKNOWN_MODEL = re.compile(
    r'model_not_found|model[_ ]?(?:id )?not[_ ]found|(?:unknown|invalid|unsupported|no such)'
    r'[ _]model|model\b[^.;\n]{0,80}?\b(?:does not exist|not found|not exist|is not available|'
    r'is not supported|unavailable|not allowed)', re.IGNORECASE)
_NO_BALANCE = re.compile(r'balance|quota|credit|billing|insufficient.fund|payment|arrear',
                         re.IGNORECASE)

# Called before each retry with (model, status, next attempt, delay in seconds).
RetryHook = Callable[[str, int, int, float], None]


@dataclass(frozen=True)
class ChatReply:
    """A successful chat completion: the text plus HTTP status, latency and attempts used.

    ``latency_s`` runs from the first attempt to the answer, retries and their waits included.
    """

    model: str
    content: str
    status: int
    latency_s: float
    attempts: int
    finish_reason: Optional[str] = None


@dataclass
class Answer:
    """One HTTP answer as read: status, headers, decoded body (at most ``max_body_bytes``)."""

    status: Optional[int] = None
    reason: str = ''
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b''
    received: int = 0
    cancelled: bool = False

    def text(self, limit: Optional[int] = None) -> str:
        """The body (or its first ``limit`` bytes) as text, in the declared charset."""
        found = re.search(r'charset="?([\w.:-]+)', self.headers.get('Content-Type', ''))
        try:
            return self.body[:limit].decode(found[1] if found else 'utf-8', 'replace')
        except LookupError:
            return self.body[:limit].decode('utf-8', 'replace')

    def json(self) -> Any:
        """The body as JSON, or None (also for hostile nesting)."""
        try:
            return json.loads(self.body)
        except (ValueError, RecursionError):
            return None


class BearerAuth(requests.auth.AuthBase):
    """Sets ``Authorization: Bearer <key>``; also stops requests from using ~/.netrc."""

    def __init__(self, key: str):
        self._key = key

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers['Authorization'] = f'Bearer {self._key}'
        return request

    def __repr__(self) -> str:
        return f'BearerAuth({mask_key(self._key)!r})'


class GatewayClient:
    """Chat with any model id behind one gateway; see :meth:`chat`."""

    def __init__(self, config: GatewayConfig, *, session: Optional[requests.Session] = None,
                 sleep: Callable[[float], None] = time.sleep,
                 on_retry: Optional[RetryHook] = None,
                 retry_after_cap: float = RETRY_WAIT_CAP):
        self.config = config
        self._session = session if session is not None else requests.Session()
        self._owns_session = session is None
        self._auth = BearerAuth(config.api_key)
        self._sleep = sleep
        self._on_retry = on_retry
        self._retry_after_cap = retry_after_cap

    def __repr__(self) -> str:
        return f'GatewayClient({self.config!r})'

    def __enter__(self) -> 'GatewayClient':
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP session if this client created it."""
        if self._owns_session:
            self._session.close()

    # ---------------------------------------------------------------------------- public API
    def chat(self, model: str, prompt: str, *, role: Optional[str] = None) -> ChatReply:
        """Send ``prompt`` as one user message to ``model`` and return the answer text.

        ``role`` (``teacher_model``/``student_model``) only makes error hints name the config
        key. Raises a :class:`GatewayError` subclass on every failure.
        """
        try:
            return self._chat(model, prompt, role)
        except GatewayError as exc:
            error = exc.redacted([self.config.api_key])
        raise error

    def _chat(self, model: str, prompt: str, role: Optional[str]) -> ChatReply:
        cfg = self.config
        if not model or not model.strip():
            raise GatewayModelError(f'no model id given for {role or "this request"}',
                                    f'set {role or "the model id"} in {cfg.source}')
        payload = {'model': model, 'messages': [{'role': 'user', 'content': prompt}],
                   'temperature': cfg.temperature, 'stream': False}
        start = time.monotonic()
        for attempt in range(1, cfg.max_attempts + 1):
            logger.debug('POST %s model=%s attempt %d/%d', cfg.chat_url, model, attempt,
                         cfg.max_attempts)
            try:
                answer = self._attempt(payload, model)
            except GatewayError as exc:
                exc.latency_s, exc.attempts = time.monotonic() - start, attempt
                raise
            if (answer.status == 429 or 500 <= answer.status < 600) and attempt < cfg.max_attempts:
                # Retry-After (seconds or HTTP date) when given, else exponential backoff
                after = parse_retry_after(answer.headers.get('Retry-After'))
                delay = min(cfg.retry_backoff * 2 ** (attempt - 1) if after is None else after,
                            self._retry_after_cap)
                if self._on_retry is not None:
                    self._on_retry(model, answer.status, attempt + 1, delay)
                self._sleep(delay)
                continue
            return self._finish(answer, model, role, time.monotonic() - start, attempt)
        raise AssertionError('unreachable: the last attempt always returns or raises')

    # ----------------------------------------------------------------------------- transport
    def _attempt(self, payload: dict, model: str) -> Answer:
        """One POST, bounded as a whole by ``timeout`` (connect, wait, body) and by size."""
        answer, failure = Answer(), []
        deadline = time.monotonic() + self.config.timeout

        def work() -> None:
            try:
                self._exchange(payload, model, answer, deadline)
            except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
                failure.append(exc)

        worker = threading.Thread(target=work, name='gateway-request', daemon=True)
        worker.start()
        worker.join(max(0.0, deadline - time.monotonic()) + 0.05)
        if worker.is_alive():
            answer.cancelled = True  # the worker stops at its next chunk or socket timeout
            raise self._timeout_error(model, answer)
        if not failure:
            return answer
        if isinstance(failure[0], GatewayError):
            raise failure[0]
        if isinstance(failure[0], requests.exceptions.Timeout):
            raise self._timeout_error(model, answer)
        raise transport_error(failure[0], self.config, model)

    def _exchange(self, payload: dict, model: str, answer: Answer, deadline: float) -> None:
        """POST and read the body chunk by chunk, filling ``answer`` (runs in the worker)."""
        cfg = self.config
        left = max(deadline - time.monotonic(), 0.001)
        response = self._session.post(
            cfg.chat_url, json=payload, auth=self._auth, timeout=(left, left), stream=True,
            allow_redirects=False,
            headers={'Accept': 'application/json', 'Accept-Encoding': 'gzip, deflate'})
        with response:
            answer.status, answer.reason = response.status_code, response.reason or ''
            answer.headers = response.headers
            said = f'{model}: HTTP {answer.status}'
            encoding = answer.headers.get('Content-Encoding', '').strip().lower()
            if encoding not in _ENCODINGS:
                raise GatewayResponseError(
                    f'{said} with an unsupported Content-Encoding {encoding!r}',
                    'the gateway must answer uncompressed, gzip or deflate (claw-rl asks for '
                    'those)', status=answer.status)
            inflate = zlib.decompressobj(_ENCODINGS[encoding]) if _ENCODINGS[encoding] else None
            chunks, size = [], 0
            try:
                while chunk := response.raw.read1(_CHUNK, decode_content=False):
                    if answer.cancelled or time.monotonic() > deadline:
                        raise requests.exceptions.ReadTimeout()
                    answer.received += len(chunk)
                    room = cfg.max_body_bytes - size
                    # at most one byte past the cap is ever decompressed
                    chunk = inflate.decompress(chunk, room + 1) if inflate else chunk
                    if len(chunk) > room:
                        raise GatewayResponseError(
                            f'{said}: the answer is larger than {cfg.max_body_bytes} bytes '
                            f'({"after decompressing " if inflate else ""}'
                            f'{answer.received} bytes received); reading stopped there',
                            'check that base_url points at a chat-completions API; if such '
                            f'answers are expected, raise "max_body_bytes" in {cfg.source}',
                            status=answer.status)
                    chunks.append(chunk)
                    size += len(chunk)
            except (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError, TimeoutError):
                raise requests.exceptions.ReadTimeout() from None
            except zlib.error:
                raise GatewayResponseError(f'{said}: the {encoding} body cannot be decompressed',
                                           'the gateway sent a broken compressed body; run '
                                           'again or report it to the gateway operator',
                                           status=answer.status) from None
            except (OSError, urllib3.exceptions.HTTPError) as exc:
                raise GatewayConnectionError(
                    f'{said} came, then the connection broke after {answer.received} bytes of '
                    f'the body ({_reason(str(exc))})',
                    'the gateway (or a proxy on the way) dropped the answer midway; run again, '
                    'and if it repeats check the gateway status', status=answer.status) from None
            answer.body = b''.join(chunks)

    def _timeout_error(self, model: str, answer: Answer) -> GatewayTimeoutError:
        cfg = self.config
        used = _proxy_for(cfg.chat_url)
        via = f' through {used[0]}={used[1]}' if used else ''
        got = (f'HTTP {answer.status} came but the body was still arriving ({answer.received} '
               'bytes)' if answer.status else f'no answer from {_where(cfg)}{via}')
        return GatewayTimeoutError(
            f'{model}: timeout: {got} within {cfg.timeout:g} s (the "timeout" setting of '
            f'{cfg.source} bounds connecting, waiting and reading the body together)',
            f'large models can take minutes to answer: raise "timeout" in {cfg.source} (now '
            f'{cfg.timeout:g} s, default 120 s), e.g. "timeout": 300, or pass --timeout 300; '
            'if no connection is made, check the network, VPN and firewall; timeouts are not '
            'retried', status=answer.status)

    # ------------------------------------------------------------------------------ replies
    def _finish(self, answer: Answer, model: str, role: Optional[str], latency: float,
                attempts: int) -> ChatReply:
        cfg = self.config
        status = answer.status
        info = {'status': status, 'latency_s': latency, 'attempts': attempts}
        if 300 <= status < 400:
            location = answer.headers.get('Location', '(no Location header)')
            raise GatewayHTTPError(
                f'{model}: HTTP {status} redirect from {cfg.chat_url} to {location}',
                'set base_url to the address the gateway redirects to (often https:// instead '
                'of http://); claw-rl does not follow redirects, which would drop the key or '
                'turn the POST into a GET', **info)
        if not 200 <= status < 300:
            raise self._status_error(answer, model, role, info)
        body = answer.json()
        if body is None and (b'data:' in answer.body[:_CHUNK]
                             or 'event-stream' in answer.headers.get('Content-Type', '')):
            body = fold_events(answer.text())
        if body is None:
            raise GatewayResponseError(
                f'{model}: HTTP {status} but the body is not JSON '
                f'({answer.headers.get("Content-Type", "no Content-Type")}: '
                f'{body_excerpt(answer)})',
                f'base_url ({cfg.base_url}) probably points at a web page or another API; use '
                'the API root your gateway documents for the OpenAI SDK', **info)
        if not isinstance(body, dict):
            raise GatewayResponseError(
                f'{model}: HTTP {status} but the JSON body is a {type(body).__name__}, not an '
                'object', 'check base_url: it must point at an OpenAI-compatible API', **info)
        choices = body.get('choices')
        if choices is None:
            said = error_message(body) or _shorten(_compact_json(body))
            role_key = f'{role} in {cfg.source}' if role else 'the model id'
            cls, hint = GatewayResponseError, ('read the gateway message: a wrong model id or '
                                               'an empty balance are the usual causes')
            if mentions_unknown_model(said):
                cls, hint = GatewayModelError, f'check {role_key}: the gateway does not know it'
            elif _NO_BALANCE.search(said):
                cls, hint = GatewayRateLimitError, _BALANCE_HINT
            raise cls(
                f'{model}: HTTP {status} but the answer has no "choices" (what a bare '
                f"['choices'] read reports as KeyError: 'choices'); gateway says: {said}",
                hint, **info)
        if not isinstance(choices, list) or not choices:
            raise GatewayResponseError(
                f'{model}: HTTP {status} but "choices" is {_shorten(repr(choices), 80)}',
                'the gateway returned no completion; try again or try another model', **info)
        first = choices[0] if isinstance(choices[0], dict) else {}
        message = first.get('message')
        content = _text(message.get('content')) if isinstance(message, dict) else None
        finish = first.get('finish_reason')
        if content is None:
            raise GatewayResponseError(
                f'{model}: HTTP {status} but choices[0].message.content is missing or empty '
                f'(finish_reason={finish!r})',
                'the model returned no text (a refusal, a tool call or a length limit); try '
                'another prompt or model', **info)
        return ChatReply(model=model, content=content, status=status, latency_s=latency,
                         attempts=attempts, finish_reason=finish)

    def _status_error(self, answer: Answer, model: str, role: Optional[str],
                      info: dict) -> GatewayError:
        """Turn an HTTP error status into an error naming the cause and the fix."""
        cfg = self.config
        status = answer.status
        said = gateway_message(answer)
        says = f'; gateway says: {said}' if said else ''
        reason = f'HTTP {status} {answer.reason}'.strip()
        role_key = f'{role} in {cfg.source}' if role else f'the model id in {cfg.source}'
        if status in (401, 403):
            what = ('rejected the key' if status == 401
                    else f'accepted the key but refused model {model!r}')
            return GatewayAuthError(
                f'{model}: {reason}: the gateway {what} ({cfg.masked_key} from '
                f'{cfg.key_source}){says}',
                f'check the key is read from where you expect ({cfg.key_source}), belongs to '
                f'this gateway ({cfg.base_url}), is not expired or out of quota, and has no '
                'stray quotes or spaces; claw-rl sends "Authorization: Bearer <key>", so do not '
                'add "Bearer" yourself' + (f'; or check that the key may use {model!r}'
                                           if status == 403 else ''), **info)
        if mentions_unknown_model(said) and status in (400, 404, 422):
            return GatewayModelError(
                f'{model}: {reason}: the gateway does not know model id {model!r}{says}',
                f'fix {role_key}: use an id exactly as the gateway lists it '
                f'(GET {cfg.base_url}/models)', **info)
        if status == 404:
            return GatewayModelError(
                f'{model}: {reason} for {cfg.chat_url}: no such endpoint (or no model '
                f'{model!r}){says}',
                f'check base_url in {cfg.source}: give the API root the gateway documents for '
                'the OpenAI SDK (a path ending in a version such as /v1, /v4 or /v1beta/openai '
                'is used as given, any other gets /v1), or the full .../chat/completions URL; '
                f'if it is right, check {role_key}', **info)
        if status == 429:
            return GatewayRateLimitError(
                f'{model}: {reason} (rate limited) after {info["attempts"]} attempt(s){says}',
                'wait and run again, lower the request rate, or check the quota/balance of the '
                f'key; retries are set by max_attempts and retry_backoff in {cfg.source}', **info)
        if 500 <= status < 600:
            return GatewayServerError(
                f'{model}: {reason} (server error) after {info["attempts"]} attempt(s){says}',
                'the gateway or the provider behind it failed; try again later, try another '
                f'model id, or raise max_attempts in {cfg.source}', **info)
        if status == 402 or _NO_BALANCE.search(said):
            return GatewayRateLimitError(f'{model}: {reason}{says}', _BALANCE_HINT, **info)
        return GatewayHTTPError(f'{model}: {reason}{says}',
                                'read the gateway message; check the request fields it names '
                                f'(model id, temperature in {cfg.source})', **info)


_BALANCE_HINT = ('the gateway speaks of balance, quota or billing: top up or check the plan of '
                 'the key in the gateway console (the model id is not the problem)')


# ---------------------------------------------------------------------------------- helpers
def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """Seconds from a Retry-After header (delta seconds or HTTP date); None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, AttributeError):
            return None
    return None if seconds != seconds else max(0.0, seconds)


def fold_events(text: str) -> Optional[dict]:
    """A streamed (``text/event-stream``) answer as one chat-completion body (or its error)."""
    parts, finish, seen = [], None, False
    for line in text.splitlines():
        data = line[5:].strip() if line.startswith('data:') else '[DONE]'
        try:
            event = json.loads(data) if data != '[DONE]' else None
        except (ValueError, RecursionError):
            event = None
        if not isinstance(event, dict):
            continue
        if not isinstance(event.get('choices'), list):
            return event  # an error event
        seen = True
        for choice in event['choices'][:1]:
            choice = choice if isinstance(choice, dict) else {}
            delta = choice.get('delta') or choice.get('message') or {}
            content = delta.get('content') if isinstance(delta, dict) else None
            parts.append(content if isinstance(content, str) else '')
            finish = choice.get('finish_reason') or finish
    if not seen:
        return None
    return {'choices': [{'message': {'content': ''.join(parts)}, 'finish_reason': finish}]}


def _text(content: Any) -> Optional[str]:
    """Message content as text: a string, or the text parts of a content list."""
    if isinstance(content, list):
        parts = [p.get('text') for p in content if isinstance(p, dict)]
        content = ''.join(p for p in parts if isinstance(p, str))
    if isinstance(content, str) and content.strip():
        return content
    return None


def error_message(body: Any) -> str:
    """The gateway's own error text from a JSON body (OpenAI, FastAPI and plain shapes)."""
    if not isinstance(body, dict):
        return ''
    error = body.get('error')
    if isinstance(error, dict):
        parts = [str(error[k]) for k in ('message', 'code', 'type') if error.get(k)]
        if parts:
            return _shorten(' | '.join(dict.fromkeys(parts)))
    if isinstance(error, str) and error.strip():
        return _shorten(error)
    for key in ('message', 'detail', 'msg', 'error_msg'):
        value = body.get(key)
        if isinstance(value, str) and value.strip():
            return _shorten(value)
        if value:
            return _shorten(_compact_json(value))
    return ''


def gateway_message(answer: Answer) -> str:
    """What the gateway said in an error answer: its JSON error message or a text excerpt."""
    body = answer.json()
    if body is not None:
        return error_message(body) or _shorten(_compact_json(body))
    return body_excerpt(answer)


def body_excerpt(answer: Answer) -> str:
    """A short, one-line view of a non-JSON body: the <title> of an HTML page, or its start.

    Only the first 64 KiB are searched, with plain ``find`` calls (linear time).
    """
    text = answer.text(_TITLE_WINDOW)
    lower = text.lower()
    start = lower.find('>', lower.find('<title') + 1) if '<title' in lower else -1
    end = lower.find('</title', start) if start >= 0 else -1
    if end >= 0:
        return f'HTML page titled {_shorten(text[start + 1:end], 120)!r}'
    text = _shorten(text[:4 * _EXCERPT], 160)
    return repr(text) if text else '(empty body)'


def mentions_unknown_model(text: str) -> bool:
    """True when an error text says the model id is unknown or unusable."""
    return bool(_UNKNOWN_MODEL.search(text or ''))


def _compact_json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(',', ':'))
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _shorten(text: str, limit: int = _EXCERPT) -> str:
    text = ' '.join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + '...'


# ----------------------------------------------------------------------- transport errors
def proxy_settings(env: Optional[Mapping[str, str]] = None) -> list[tuple[str, str]]:
    """(variable, proxy without user:password) for every proxy variable that is set."""
    env = os.environ if env is None else env
    return [(name, sanitize_proxy(env[name])) for name in PROXY_VARS if env.get(name)]


def sanitize_proxy(value: str) -> str:
    """``scheme://host:port`` of a proxy URL, dropping any user:password."""
    text = value.strip()
    parts = urlsplit(text if '://' in text else f'http://{text}')
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        return '<unparsable proxy URL>'
    if not host:
        return '<unparsable proxy URL>'
    shown = f'[{host}]' if ':' in host else host
    shown = f'{shown}:{port}' if port else shown
    return f'{parts.scheme}://{shown}' if '://' in text else shown


def _proxy_for(url: str) -> Optional[tuple[str, str]]:
    """The proxy variable requests uses for ``url`` (lower case first, then ALL_PROXY)."""
    scheme = urlsplit(url).scheme
    for name in (f'{scheme}_proxy', f'{scheme.upper()}_PROXY', 'all_proxy', 'ALL_PROXY'):
        if os.environ.get(name):
            return name, sanitize_proxy(os.environ[name])
    return None


def _where(config: GatewayConfig) -> str:
    parts = urlsplit(config.chat_url)
    return f'{parts.hostname}:{parts.port or (443 if parts.scheme == "https" else 80)}'


def _proxy_error(config: GatewayConfig, model: str, detail: str) -> GatewayProxyError:
    settings = proxy_settings()
    used = _proxy_for(config.chat_url)
    named = (f'{used[0]}={used[1]}' if used else ', '.join(f'{n}={v}' for n, v in settings)
             or 'a proxy from the system settings')
    others = [n for n, _ in settings if not used or n != used[0]]
    also = f' (also set: {", ".join(others)})' if others else ''
    same = [n for n, _ in settings if used and n.lower() == used[0].lower()]
    names = ' '.join(same or [n for n, _ in settings]) or 'HTTPS_PROXY'
    hint = (f'the proxy variable is probably stale: start that proxy, or unset it (unset '
            f'{names}), or exempt the gateway with NO_PROXY={urlsplit(config.chat_url).hostname}')
    if 'socks' in detail.lower():
        hint = 'a socks:// proxy needs PySocks (pip install "requests[socks]"); or ' + hint
    return GatewayProxyError(
        f'{model}: the proxy could not be used: {named} is set{also} and {detail}', hint)


def transport_error(exc: BaseException, config: GatewayConfig, model: str) -> GatewayError:
    """Map a failure before any HTTP answer to an error that names the cause and the fix."""
    where, text = _where(config), str(exc)
    if isinstance(exc, requests.exceptions.ProxyError):
        return _proxy_error(config, model, f'connecting through it failed ({_reason(text)})')
    if isinstance(exc, requests.exceptions.SSLError):
        return GatewayConnectionError(
            f'{model}: TLS failed with {where} ({_reason(text)})',
            'check the scheme and port in base_url (http vs https); behind a TLS-inspecting '
            'proxy set REQUESTS_CA_BUNDLE to its CA certificate file')
    proxy_problem = isinstance(exc, (requests.exceptions.InvalidSchema,
                                     requests.exceptions.InvalidProxyURL)) \
        or not isinstance(exc, requests.RequestException) or 'proxy' in text.lower()
    if proxy_problem and proxy_settings():
        return _proxy_error(config, model, f'requests cannot use it ({_reason(text)})')
    lowered = text.lower()
    if isinstance(exc, requests.exceptions.ConnectionError) and 'refused' in lowered:
        return GatewayConnectionError(
            f'{model}: connection refused by {where}: nothing accepts connections there',
            f'check host and port of base_url in {config.source} and that the gateway '
            'is running and reachable from this machine')
    if any(s in lowered for s in ('name or service not known', 'failed to resolve',
                                  'nodename nor servname', 'getaddrinfo failed',
                                  'temporary failure in name resolution',
                                  'no address associated')):
        return GatewayConnectionError(
            f'{model}: the host name {urlsplit(config.chat_url).hostname!r} could not be '
            'resolved', f'check the spelling of base_url in {config.source}, and DNS/VPN')
    if isinstance(exc, requests.exceptions.ConnectionError):
        return GatewayConnectionError(
            f'{model}: the connection to {where} failed ({_reason(text)})',
            'check base_url (scheme http vs https, host, port) and the network')
    return GatewayConnectionError(
        f'{model}: the request failed: {type(exc).__name__}: {_reason(text)}',
        f'check base_url in {config.source} and the proxy variables')


def _reason(text: str) -> str:
    """The innermost readable reason of a requests/urllib3 error string."""
    for pattern in (r'\[Errno -?\d+\]\s*([^"\')\]]+)', r'(\[SSL: [^\]]+\][^"\']*)'):
        found = re.findall(pattern, text)
        if found:
            return _shorten(found[-1].strip(), 160)
    reason = text.split('Caused by ', 1)[-1]
    reason = re.sub(r'<[\w.]+ object at 0x[0-9a-f]+>:?', '', reason)
    reason = re.sub(r'\b\w+\(host=[^)]*\):?', '', reason)
    reason = re.sub(r'\b[A-Z]\w*\(', '', reason)
    reason = re.sub(r'[()\'"]', '', reason)
    return _shorten(reason.strip(' :,'), 160)
