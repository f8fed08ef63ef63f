"""Gateway errors, secret masking and safe display of text that came from a server.

Every error names the cause and the fix in plain words. :class:`Redactor` masks every form in
which a secret can show up (as is, URL-encoded, JSON-escaped, inside base64); :func:`show`
escapes what a terminal would execute (control characters, lone surrogates, bidi overrides).
"""

from __future__ import annotations

import base64
import json
import re
from typing import Iterable, Optional
from urllib.parse import quote, quote_plus

# Keys shorter than this are masked completely: showing 7 characters of them reveals too much.
_MIN_MASKED_LEN = 12
# Shorter strings are not learnt as secrets: masking them would garble ordinary words.
_MIN_SECRET_LEN = 4
# C0 (but tab and newline), DEL, C1, bidi overrides and lone surrogates.
_UNSAFE = re.compile('[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e'
                     '\u2066-\u2069\ud800-\udfff]')


def mask_key(key: Optional[str]) -> str:
    """Return a printable stand-in for a secret, e.g. ``sk-...abcd`` (``***`` when short)."""
    if not key:
        return '<empty>'
    if len(key) < _MIN_MASKED_LEN:
        return '***'
    return f'{key[:3]}...{key[-4:]}'


def secret_forms(secret: str) -> set[str]:
    """Every way ``secret`` can appear in text: raw, URL-encoded, JSON-escaped, in base64."""
    forms = {secret, quote(secret, safe=''), quote_plus(secret), json.dumps(secret)[1:-1]}
    forms |= {re.sub('%[0-9A-F]{2}', lambda m: m.group().lower(), f) for f in forms}
    raw = secret.encode('utf-8', 'surrogatepass')
    for shift in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            text = encode(b'\0' * shift + raw).decode()
            # keep only the characters whose 6 bits all come from the secret's bytes
            forms.add(text[-(-8 * shift // 6):8 * (shift + len(raw)) // 6])
    return {f for f in forms if len(f) >= _MIN_SECRET_LEN}


class Redactor:
    """Masks every form of every secret it has learnt; call it on text."""

    def __init__(self, secrets: Iterable[Optional[str]] = ()):
        self._masks: dict[str, str] = {}
        self._pattern: Optional[re.Pattern] = None
        self.learn(*secrets)

    def learn(self, *secrets: Optional[str]) -> None:
        """Remember secrets (and their stripped forms); non-strings and short ones are skipped."""
        for secret in secrets:
            if not isinstance(secret, str):
                continue
            for value in {secret, secret.strip()}:
                if len(value) >= _MIN_SECRET_LEN:
                    self._masks.update((f, mask_key(value)) for f in secret_forms(value))
        if self._masks:
            forms = sorted(self._masks, key=len, reverse=True)
            self._pattern = re.compile('|'.join(map(re.escape, forms)))

    def __call__(self, text: str) -> str:
        if self._pattern is None:
            return text
        return self._pattern.sub(lambda m: self._masks[m.group()], text)


def redact(text: str, secrets: Iterable[Optional[str]]) -> str:
    """Replace every form of each secret in ``text`` by its masked form."""
    return Redactor(secrets)(text)


def show(text: str) -> str:
    """``text`` safe for a terminal: control characters and lone surrogates as ``\\x1b``."""
    return _UNSAFE.sub(lambda m: ascii(m.group())[1:-1], text)


class GatewayError(Exception):
    """A gateway problem with a one-line cause and a fix; ``exit_code`` is the CLI status."""

    exit_code = 1

    def __init__(self, message: str, hint: str = '', *, status: Optional[int] = None,
                 latency_s: Optional[float] = None, attempts: int = 0):
        self.message = message
        self.hint = hint
        self.status = status
        self.latency_s = latency_s
        self.attempts = attempts
        super().__init__(self.describe())

    def describe(self) -> str:
        """The message followed by the fix (when there is one)."""
        return f'{self.message}; fix: {self.hint}' if self.hint else self.message

    def redacted(self, secrets: Iterable[Optional[str]]) -> 'GatewayError':
        """A copy of this error with every secret masked in its message and hint."""
        clean = Redactor(secrets)
        return type(self)(clean(self.message), clean(self.hint), status=self.status,
                          latency_s=self.latency_s, attempts=self.attempts)


class GatewayConfigError(GatewayError):
    """The configuration is missing or wrong (exit status 2); nothing was sent."""

    exit_code = 2


class GatewayAuthError(GatewayError):
    """401/403: the gateway did not accept the key."""


class GatewayModelError(GatewayError):
    """404 or an 'unknown model' answer: the model id (or the URL path) is wrong."""


class GatewayRateLimitError(GatewayError):
    """429 after every allowed attempt, or an answer about quota or balance."""


class GatewayServerError(GatewayError):
    """5xx after every allowed attempt."""


class GatewayHTTPError(GatewayError):
    """Any other HTTP error status."""


class GatewayResponseError(GatewayError):
    """A 2xx answer that is not a chat completion (not JSON, no ``choices``, too big, cut)."""


class GatewayConnectionError(GatewayError):
    """No HTTP answer: connection refused, unknown host, TLS failure."""


class GatewayProxyError(GatewayConnectionError):
    """The proxy from the environment could not be used."""


class GatewayTimeoutError(GatewayError):
    """No complete answer (connect, wait and body) within the configured timeout."""
