"""A small, provider-neutral client for an OpenAI-compatible chat-completions gateway.

One endpoint (``POST {base_url}/v1/chat/completions``), one key (``Authorization: Bearer``),
bounded retries for 429/5xx, and errors that name the cause and the fix. Every error message is
redacted before it is raised, and no requests exception (whose request object holds the headers)
is chained to the errors raised here.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.utils import parsedate_to_datetime
import logging
import os
import re
import time
from typing import Any, Callable, Mapping, Optional
from urllib.parse import urlsplit

import requests

from .config import GatewayConfig
from .errors import (
    GatewayAuthError, GatewayConnectionError, GatewayError, GatewayHTTPError,
    GatewayModelError, GatewayProxyError, GatewayRateLimitError, GatewayResponseError,
    GatewayServerError, GatewayTimeoutError, mask_key)

logger = logging.getLogger(__name__)

# Proxy variables requests reads (lower case wins over upper case, as in urllib).
PROXY_VARS = ('https_proxy', 'HTTPS_PROXY', 'http_proxy', 'HTTP_PROXY', 'all_proxy', 'ALL_PROXY')
RETRY_AFTER_CAP = 30.0
_EXCERPT = 300
_UNKNOWN_MODEL = re.compile(
    r'model_not_found|model[_ ]?(?:id )?not[_ ]found|(?:unknown|invalid|unsupported|no such)'
    r'[ _]model|model\b[^.;\n]{0,80}?\b(?:does not exist|not found|not exist|is not available|'
    r'is not supported|unavailable|not allowed)', re.IGNORECASE)

# Called before each retry with (model, status, next attempt, delay in seconds).
RetryHook = Callable[[str, int, int, float], None]


@dataclass(frozen=True)
class ChatReply:
    """A successful chat completion: the text plus HTTP status, latency and attempts used."""

    model: str
    content: str
    status: int
    latency_s: float
    attempts: int
    finish_reason: Optional[str] = None


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
                 retry_after_cap: float = RETRY_AFTER_CAP):
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
                   'temperature': cfg.temperature}
        for attempt in range(1, cfg.max_attempts + 1):
            logger.debug('POST %s model=%s attempt %d/%d', cfg.chat_url, model, attempt,
                         cfg.max_attempts)
            start = time.monotonic()
            response, failure = self._post(payload, model, attempt)
            latency = time.monotonic() - start
            if failure is not None:
                failure.latency_s = latency
                raise failure
            status = response.status_code
            logger.debug('model=%s HTTP %d in %.0f ms', model, status, latency * 1000)
            if _retryable(status) and attempt < cfg.max_attempts:
                delay = self._retry_delay(response, attempt)
                response.close()
                logger.info('model=%s HTTP %d; retry %d/%d in %.2f s', model, status,
                            attempt + 1, cfg.max_attempts, delay)
                if self._on_retry is not None:
                    self._on_retry(model, status, attempt + 1, delay)
                self._sleep(delay)
                continue
            return self._finish(response, model, role, latency, attempt)
        raise AssertionError('unreachable: the last attempt always returns or raises')

    # ----------------------------------------------------------------------------- transport
    def _post(self, payload: dict, model: str,
              attempt: int) -> tuple[Optional[requests.Response], Optional[GatewayError]]:
        """POST once; a transport failure comes back as an error (no exception chaining)."""
        cfg = self.config
        try:
            response = self._session.post(
                cfg.chat_url, json=payload, auth=self._auth, timeout=cfg.timeout,
                allow_redirects=False, headers={'Accept': 'application/json'})
        except (requests.RequestException, ValueError) as exc:
            # ValueError: urllib3 rejects some proxy URLs without wrapping the error.
            error = transport_error(exc, cfg, model)
            error.attempts = attempt
            return None, error
        return response, None

    def _retry_delay(self, response: requests.Response, attempt: int) -> float:
        """Retry-After (seconds or HTTP date, capped) when given, else exponential backoff."""
        after = parse_retry_after(response.headers.get('Retry-After'))
        if after is not None:
            return min(after, self._retry_after_cap)
        return self.config.retry_backoff * 2 ** (attempt - 1)

    # ------------------------------------------------------------------------------ replies
    def _finish(self, response: requests.Response, model: str, role: Optional[str],
                latency: float, attempts: int) -> ChatReply:
        status = response.status_code
        if 300 <= status < 400:
            location = response.headers.get('Location', '(no Location header)')
            raise GatewayHTTPError(
                f'{model}: HTTP {status} redirect from {self.config.chat_url} to {location}',
                'set base_url to the address the gateway redirects to (often https:// instead '
                'of http://); claw-rl does not follow redirects, which would drop the key or '
                'turn the POST into a GET', status=status, latency_s=latency, attempts=attempts)
        failed = False
        try:
            response.raise_for_status()
        except requests.HTTPError:
            failed = True
        if failed:
            raise self._status_error(response, model, role, latency, attempts)
        return self._parse(response, model, role, latency, attempts)

    def _status_error(self, response: requests.Response, model: str, role: Optional[str],
                      latency: float, attempts: int) -> GatewayError:
        """Turn an HTTP error status into an error naming the cause and the fix."""
        cfg = self.config
        status = response.status_code
        said = gateway_message(response)
        says = f'; gateway says: {said}' if said else ''
        reason = f'HTTP {status} {response.reason or ""}'.strip()
        role_key = f'{role} in {cfg.source}' if role else f'the model id in {cfg.source}'
        info = {'status': status, 'latency_s': latency, 'attempts': attempts}
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
                f'check base_url in {cfg.source}: it must be the OpenAI-compatible API root '
                f'(claw-rl appends /v1/chat/completions); if it is right, check {role_key}',
                **info)
        if status == 429:
            return GatewayRateLimitError(
                f'{model}: {reason} (rate limited) after {attempts} attempt(s){says}',
                'wait and run again, lower the request rate, or check the quota/balance of the '
                f'key; retries are set by max_attempts and retry_backoff in {cfg.source}', **info)
        if status >= 500:
            return GatewayServerError(
                f'{model}: {reason} (server error) after {attempts} attempt(s){says}',
                'the gateway or the provider behind it failed; try again later, try another '
                f'model id, or raise max_attempts in {cfg.source}', **info)
        return GatewayHTTPError(f'{model}: {reason}{says}',
                                'read the gateway message; check the request fields it names '
                                f'(model id, temperature in {cfg.source})', **info)

    def _parse(self, response: requests.Response, model: str, role: Optional[str],
               latency: float, attempts: int) -> ChatReply:
        """A checked read of ``choices[0].message.content``."""
        cfg = self.config
        status = response.status_code
        info = {'status': status, 'latency_s': latency, 'attempts': attempts}
        body = _json_or_none(response)
        if body is None:
            raise GatewayResponseError(
                f'{model}: HTTP {status} but the body is not JSON '
                f'({response.headers.get("Content-Type", "no Content-Type")}: '
                f'{body_excerpt(response)})',
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
            cls = GatewayModelError if mentions_unknown_model(said) else GatewayResponseError
            raise cls(
                f'{model}: HTTP {status} but the answer has no "choices" (what a bare '
                f"['choices'] read reports as KeyError: 'choices'); gateway says: {said}",
                f'check {role_key} (an unknown model id is the usual cause) and the gateway '
                'message above', **info)
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


# ---------------------------------------------------------------------------------- helpers
def _retryable(status: int) -> bool:
    return status == 429 or 500 <= status <= 599


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """Seconds from a Retry-After header (delta seconds or HTTP date); None if absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            moment = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if moment is None:
            return None
        seconds = moment.timestamp() - time.time()
    if seconds != seconds:
        return None
    return max(0.0, seconds)


def _json_or_none(response: requests.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


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


def gateway_message(response: requests.Response) -> str:
    """What the gateway said in an error answer: its JSON error message or a text excerpt."""
    body = _json_or_none(response)
    if body is not None:
        return error_message(body) or _shorten(_compact_json(body))
    return body_excerpt(response)


def body_excerpt(response: requests.Response) -> str:
    """A short, one-line view of a non-JSON body (the <title> of an HTML page)."""
    text = response.text or ''
    title = re.search(r'<title[^>]*>(.*?)</title>', text, re.IGNORECASE | re.DOTALL)
    if title:
        return f'HTML page titled {_shorten(" ".join(title.group(1).split()), 120)!r}'
    text = ' '.join(text.split())
    return repr(_shorten(text, 160)) if text else '(empty body)'


def mentions_unknown_model(text: str) -> bool:
    """True when an error text says the model id is unknown or unusable."""
    return bool(_UNKNOWN_MODEL.search(text or ''))


def _compact_json(value: Any) -> str:
    import json
    try:
        return json.dumps(value, ensure_ascii=False, separators=(',', ':'))
    except (TypeError, ValueError):
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
    scheme = parts.scheme if '://' in text else ''
    shown = f'[{host}]' if ':' in host else host
    shown = f'{shown}:{port}' if port else shown
    return f'{scheme}://{shown}' if scheme else shown


def _proxy_for(url: str, env: Optional[Mapping[str, str]] = None) -> Optional[tuple[str, str]]:
    """The proxy variable requests uses for ``url`` (lower case first, then ALL_PROXY)."""
    env = os.environ if env is None else env
    scheme = urlsplit(url).scheme
    for name in (f'{scheme}_proxy', f'{scheme.upper()}_PROXY', 'all_proxy', 'ALL_PROXY'):
        if env.get(name):
            return name, sanitize_proxy(env[name])
    return None


def _proxy_error(config: GatewayConfig, model: str, detail: str) -> GatewayProxyError:
    settings = proxy_settings()
    used = _proxy_for(config.chat_url)
    if used:
        named = f'{used[0]}={used[1]}'
    elif settings:
        named = ', '.join(f'{n}={v}' for n, v in settings)
    else:
        named = 'a proxy from the system settings'
    others = [n for n, _ in settings if not used or n != used[0]]
    also = f' (also set: {", ".join(others)})' if others else ''
    same = [n for n, _ in settings if used and n.lower() == used[0].lower()]
    names = ' '.join(same or [n for n, _ in settings]) or 'HTTPS_PROXY'
    host = urlsplit(config.chat_url).hostname
    hint = (f'the proxy variable is probably stale: start that proxy, or unset it (unset '
            f'{names}), or exempt the gateway with NO_PROXY={host}')
    if 'socks' in detail.lower():
        hint = ('a socks:// proxy needs PySocks (pip install "requests[socks]"); or ' + hint)
    return GatewayProxyError(
        f'{model}: the proxy could not be used: {named} is set{also} and {detail}', hint)


def transport_error(exc: Exception, config: GatewayConfig,
                    model: str) -> GatewayError:
    """Map a requests exception to an error that names the cause and the fix."""
    parts = urlsplit(config.chat_url)
    port = parts.port or (443 if parts.scheme == 'https' else 80)
    where = f'{parts.hostname}:{port}'
    text = str(exc)
    timeout = f'{config.timeout:g} s'
    timeout_hint = (f'raise "timeout" in {config.source} (now {timeout}, default 120 s), e.g. '
                    '"timeout": 300, or pass --timeout 300')
    if isinstance(exc, requests.exceptions.ProxyError):
        return _proxy_error(config, model, f'connecting through it failed ({_reason(text)})')
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        proxies = proxy_settings()
        via = f' (through {proxies[0][0]}={proxies[0][1]})' if proxies else ''
        return GatewayTimeoutError(
            f'{model}: connect timeout: no connection to {where}{via} within {timeout}',
            'check the network, VPN, firewall and the host in base_url; if the network is just '
            f'slow, {timeout_hint}')
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return GatewayTimeoutError(
            f'{model}: read timeout: {where} sent no answer within {timeout} (the "timeout" '
            f'setting of {config.source})',
            f'large models can take minutes to answer: {timeout_hint}; timeouts are not retried')
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
    if isinstance(exc, requests.exceptions.ConnectionError):
        lowered = text.lower()
        if 'refused' in lowered:
            return GatewayConnectionError(
                f'{model}: connection refused by {where}: nothing accepts connections there',
                f'check host and port of base_url in {config.source} and that the gateway '
                'is running and reachable from this machine')
        if any(s in lowered for s in ('name or service not known', 'failed to resolve',
                                      'nodename nor servname', 'getaddrinfo failed',
                                      'temporary failure in name resolution',
                                      'no address associated')):
            return GatewayConnectionError(
                f'{model}: the host name {parts.hostname!r} could not be resolved',
                f'check the spelling of base_url in {config.source}, and DNS/VPN')
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
