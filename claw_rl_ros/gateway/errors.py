"""Gateway errors and key masking.

Every error names the cause and the fix in plain words. None of them ever holds the API key,
request headers or a requests exception (whose request object carries the headers): messages
are built from known facts and passed through :func:`redact` before they are stored.
"""

from __future__ import annotations

from typing import Iterable, Optional

# Keys shorter than this are masked completely: showing 7 characters of them reveals too much.
_MIN_MASKED_LEN = 12


def mask_key(key: Optional[str]) -> str:
    """Return a printable stand-in for a secret, e.g. ``sk-...abcd`` (``***`` when short)."""
    if not key:
        return '<empty>'
    if len(key) < _MIN_MASKED_LEN:
        return '***'
    return f'{key[:3]}...{key[-4:]}'


def redact(text: str, secrets: Iterable[Optional[str]]) -> str:
    """Replace every occurrence of each secret in ``text`` by its masked form."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        if len(secret) >= 4 and secret in text:
            text = text.replace(secret, mask_key(secret))
    return text


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
        secrets = list(secrets)
        return type(self)(redact(self.message, secrets), redact(self.hint, secrets),
                          status=self.status, latency_s=self.latency_s,
                          attempts=self.attempts)


class GatewayConfigError(GatewayError):
    """The configuration is missing or wrong (exit status 2); nothing was sent."""

    exit_code = 2


class GatewayAuthError(GatewayError):
    """401/403: the gateway did not accept the key."""


class GatewayModelError(GatewayError):
    """404 or an 'unknown model' answer: the model id (or the URL path) is wrong."""


class GatewayRateLimitError(GatewayError):
    """429 after every allowed attempt."""


class GatewayServerError(GatewayError):
    """5xx after every allowed attempt."""


class GatewayHTTPError(GatewayError):
    """Any other HTTP error status."""


class GatewayResponseError(GatewayError):
    """A 2xx answer that is not a chat completion (not JSON, no ``choices``, no content)."""


class GatewayConnectionError(GatewayError):
    """No HTTP answer: connection refused, unknown host, TLS failure."""


class GatewayProxyError(GatewayConnectionError):
    """The proxy from the environment could not be used."""


class GatewayTimeoutError(GatewayError):
    """Connecting or waiting for the answer took longer than the configured timeout."""
