"""Gateway configuration: base URL, API key, teacher and student model ids, limits.

Read from one JSON, TOML or YAML file. The key may (and should) come from the environment
instead: ``CLAW_LLM_API_KEY`` wins over ``TAOTOKEN_API_KEY``, which wins over ``api_key`` in
the file. Everything is validated before any request, each piece with its own message, and
:func:`secrets_in` lists every secret a config holds so output can mask it before validation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
import difflib
import ipaddress
import json
import os
from pathlib import Path
import re
from typing import Any, Callable, Mapping, Optional
from urllib.parse import unquote_plus, urlsplit

from .errors import GatewayConfigError, mask_key

# Environment variables holding the key, strongest first.
KEY_ENV_VARS = ('CLAW_LLM_API_KEY', 'TAOTOKEN_API_KEY')
# Proxy variables requests reads (lower case wins over upper case, as in urllib).
PROXY_VARS = ('https_proxy', 'HTTPS_PROXY', 'http_proxy', 'HTTP_PROXY', 'all_proxy', 'ALL_PROXY')
# Environment variable naming the config file.
CONFIG_ENV_VAR = 'CLAW_LLM_CONFIG'
CONFIG_STEM = 'llm_gateway'
CONFIG_SUFFIXES = ('.json', '.toml', '.yaml', '.yml')
# Default lookup names: exactly the ones .gitignore keeps out of git (no .yml).
LOOKUP_SUFFIXES = ('.json', '.toml', '.yaml')
EXAMPLE_NAME = 'llm_gateway.example.json'
DEFAULT_TIMEOUT = 120.0
MAX_TIMEOUT = 3600.0
# Longest wait between two attempts (Retry-After or backoff), seconds.
RETRY_WAIT_CAP = 30.0
CHAT_PATH = '/chat/completions'
# A path that already names an OpenAI-compatible root: /v1, /api/paas/v4, /v1beta/openai.
_VERSION_ROOT = re.compile(r'/v\d+[a-z0-9]*(?:/openai)?$', re.IGNORECASE)

_NO_FALLBACK = ('claw-rl needs all three pieces (base URL, key, model id) and never falls back '
                'to a default provider or an OAuth login')


@dataclass(frozen=True, repr=False)
class GatewayConfig:
    """A validated gateway configuration; requests go to ``chat_url``."""

    # API root: as given when it names a version (/v1, /v4, /v1beta/openai), else + /v1.
    base_url: str
    api_key: str  # The unified key (better: leave it out of the file and set CLAW_LLM_API_KEY).
    teacher_model: str  # Model id of the teacher, exactly as the gateway lists it.
    student_model: str  # Model id of the student, exactly as the gateway lists it.
    # Seconds for one whole attempt: connect, wait and read the body.
    timeout: float = DEFAULT_TIMEOUT
    temperature: float = 0.0  # Sampling temperature sent with every request.
    max_attempts: int = 3  # Attempts per request when the gateway answers 429/5xx.
    retry_backoff: float = 1.0  # First retry delay in seconds (doubles each retry, at most 30 s).
    max_body_bytes: int = 8 << 20  # Largest answer body accepted, after decompression.
    source: str = '<arguments>'
    key_source: str = 'arguments'
    warnings: tuple[str, ...] = field(default=())

    @property
    def chat_url(self) -> str:
        """The one endpoint this client calls: ``{base_url}/chat/completions``."""
        return self.base_url + CHAT_PATH

    @property
    def worst_case_s(self) -> float:
        """Longest one request can take: every attempt timing out, every wait at its cap."""
        return self.max_attempts * self.timeout + (self.max_attempts - 1) * RETRY_WAIT_CAP

    @property
    def masked_key(self) -> str:
        return mask_key(self.api_key)

    def __repr__(self) -> str:
        return (f'GatewayConfig(base_url={self.base_url!r}, api_key={self.masked_key!r}, '
                f'teacher_model={self.teacher_model!r}, student_model={self.student_model!r}, '
                f'timeout={self.timeout!r}, source={self.source!r}, '
                f'key_source={self.key_source!r})')

    __str__ = __repr__

    def with_overrides(self, **overrides: Any) -> 'GatewayConfig':
        """A copy with command-line overrides (``None`` values are ignored), re-validated."""
        values = {k: v for k, v in overrides.items() if v is not None}
        for key, value in values.items():
            check = _check_model if key.endswith('_model') else _check_number
            values[key] = check(value, key, 'the command line')
        return replace(self, **values)


# The keys a config file may hold, with their defaults.
DEFAULTS = {f.name: f.default for f in fields(GatewayConfig)
            if f.name not in ('source', 'key_source', 'warnings')}
# (lowest, highest, lowest allowed) of each numeric option.
_RANGES = {'timeout': (0.0, MAX_TIMEOUT, False), 'temperature': (0.0, 2.0, True),
           'max_attempts': (1, 10, True), 'retry_backoff': (0.0, 60.0, True),
           'max_body_bytes': (1024, 1 << 30, True)}


def make_config(base_url: str, api_key: str, teacher_model: str, student_model: str,
                **options: Any) -> GatewayConfig:
    """Build a validated config from values (no file, no environment)."""
    data = {'base_url': base_url, 'api_key': api_key, 'teacher_model': teacher_model,
            'student_model': student_model, **options}
    return config_from_mapping(data, source='<arguments>', env={})


# ------------------------------------------------------------------------------------ secrets
def secrets_in(data: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """Every secret in a parsed config and the environment: keys, URL credentials, queries."""
    keys = [v for v in [data.get('api_key')] + [env.get(v) for v in KEY_ENV_VARS]
            if isinstance(v, str)]
    found = keys + [t for k in keys for t in k.split() if t.lower() != 'bearer']
    for url in [data.get('base_url')] + [env.get(v) for v in PROXY_VARS]:
        if isinstance(url, str):
            found += url_secrets(url)
    return found


def url_secrets(url: str) -> list[str]:
    """The user:password (or lone user) and the ?query and #fragment values of a URL.

    Raw and decoded. A value may itself hold ``&`` or ``=`` (a key pasted unencoded), so every
    rest of the query after a separator is a secret too.
    """
    rest = url.strip().split('://', 1)[-1]
    user = rest.rpartition('@')[0]  # the last @: a password may hold / ? or # unencoded
    raw = [user, user.partition(':')[2] or user] if user else []
    tail = re.match(r'[^?#]*(.*)', rest, re.S)[1]
    raw += [tail[m.end():] for m in re.finditer('[?#=&;]', tail)]
    raw += [p.partition('=')[2] or p for p in re.split('[?#&;]', tail)]
    return [v for r in raw for v in (r, unquote_plus(r))]


# ------------------------------------------------------------------------------------ URLs
def normalize_base_url(url: Any, source: str = '<arguments>') -> tuple[str, list[str]]:
    """Validate ``url`` and return (API root, warnings).

    A path that names a version root (``/v1``, ``/api/paas/v4``, ``/v1beta/openai``) is used
    as given, a pasted full endpoint ``.../chat/completions`` too; any other path gets ``/v1``.
    """
    where = f'base_url in {source}'
    if not isinstance(url, str):
        raise GatewayConfigError(f'{where} must be a string, got {type(url).__name__}',
                                 'write it in quotes, e.g. "https://gateway.example.com/v1"')
    warnings = []
    text = url.strip()
    if not text:
        raise GatewayConfigError(f'{where} is empty; {_NO_FALLBACK}',
                                 'set it to the API root your gateway documents for the '
                                 'OpenAI SDK, e.g. "https://gateway.example.com/v1"')
    if text != url:
        warnings.append(f'{where} had surrounding whitespace; it was stripped')
    _reject_placeholder(text, 'base_url', source)
    try:
        parts = urlsplit(text)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # an invalid port or a broken [IPv6] host
        parts, port_ok = urlsplit('invalid://'), False
    root = '"https://<gateway host>/v1"'
    for failed, problem, hint in (
            (any(ch.isspace() for ch in text), f'contains a space: {text!r}',
             'remove the spaces (URLs cannot contain them)'),
            ('://' not in text, f'has no scheme: {text!r}', f'write it as "https://{text}"'),
            (parts.scheme not in ('http', 'https', 'invalid'),
             f'uses the scheme {parts.scheme!r}: {text!r}', 'use an http:// or https:// URL'),
            (not port_ok, f'has an invalid port or [IPv6] host: {text!r}',
             f'write it as {root}, a port from 1 to 65535 after a colon'),
            (not parts.hostname, f'has no host name: {text!r}', f'write it as {root}'),
            (parts.username or parts.password, 'contains user credentials (user:password@)',
             'remove them from the URL; put the key in CLAW_LLM_API_KEY'),
            (parts.query or parts.fragment, f'contains a ?query or #fragment: {text!r}',
             f'give only scheme, host and path, e.g. {root}')):
        if failed:
            raise GatewayConfigError(f'{where} {problem}', hint)
    if parts.scheme == 'http' and not _is_loopback(parts.hostname):
        warnings.append(f'{where} is http:// to {parts.hostname}: the key would cross the '
                        'network unencrypted; use https:// unless this is a trusted link')
    path = re.sub(r'/+', '/', parts.path).rstrip('/')
    if path.endswith(CHAT_PATH):
        path = path[:-len(CHAT_PATH)]
    elif not _VERSION_ROOT.search(path):
        path += '/v1'
    return f'{parts.scheme}://{parts.netloc}{path}', warnings


def chat_completions_url(base_url: str) -> str:
    """The request URL for ``base_url`` (see :func:`normalize_base_url` for the rule)."""
    return normalize_base_url(base_url)[0] + CHAT_PATH


def _is_loopback(host: str) -> bool:
    if host == 'localhost' or host.endswith('.localhost'):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ------------------------------------------------------------------------------ file lookup
def candidate_paths(cwd: Optional[Path] = None, home: Optional[Path] = None) -> list[Path]:
    """Where a config is looked for when neither --config nor CLAW_LLM_CONFIG is given."""
    cwd = Path.cwd() if cwd is None else cwd
    home = Path.home() if home is None else home
    return [folder / f'{CONFIG_STEM}{s}' for folder in
            (cwd / 'config', home / '.config' / 'claw_rl_ros') for s in LOOKUP_SUFFIXES]


def example_path() -> Optional[Path]:
    """The committed example config, when the package data can be found."""
    try:
        from ..core import paths
        candidate = paths.share_dir() / 'config' / EXAMPLE_NAME
    except (ImportError, OSError):
        return None
    return candidate if candidate.is_file() else None


def find_config_file(explicit: Optional[str] = None,
                     env: Optional[Mapping[str, str]] = None) -> tuple[Path, list[str]]:
    """Return (config path, warnings): --config, else $CLAW_LLM_CONFIG, else the defaults."""
    env = os.environ if env is None else env
    from_env = (env.get(CONFIG_ENV_VAR) or '').strip()
    if explicit or from_env:
        path = Path(explicit or from_env).expanduser()
        if not path.is_file():
            raise GatewayConfigError(
                f'config file {explicit} (--config) does not exist' if explicit else
                f'config file {path} (from ${CONFIG_ENV_VAR}) does not exist',
                ('' if explicit else f'fix or unset {CONFIG_ENV_VAR}; ') + _create_hint(path))
        return path, []
    candidates = candidate_paths()
    found = [p for p in candidates if p.is_file()]
    if not found:
        looked = ', '.join(str(p.parent / f'{CONFIG_STEM}.{{json,toml,yaml}}')
                           for p in (candidates[0], candidates[-1]))
        raise GatewayConfigError(f'no gateway config found (looked in {looked}; no --config, '
                                 f'no ${CONFIG_ENV_VAR})',
                                 _create_hint(Path('config') / f'{CONFIG_STEM}.json'))
    return found[0], [f'{other} is ignored: {found[0]} comes first' for other in found[1:]]


def _create_hint(target: Path) -> str:
    example = example_path()
    source = str(example) if example else f'config/{EXAMPLE_NAME}'
    return (f'copy {source} to {target}, fill in base_url, teacher_model and student_model, '
            'and export CLAW_LLM_API_KEY=<your key> (or pass --config FILE)')


# --------------------------------------------------------------------------- file parsing
def read_config_file(path: Path) -> dict:
    """Parse a JSON, TOML or YAML file into a mapping (errors name line and column only).

    Parser messages can quote the offending line, which may hold the key, so only the problem
    and its position are reported.
    """
    suffix = path.suffix.lower()
    if suffix not in CONFIG_SUFFIXES:
        raise GatewayConfigError(f'{path}: unknown config format {suffix or "(no suffix)"!r}',
                                 'name the file *.json, *.toml or *.yaml')
    try:
        text = path.read_bytes().decode('utf-8-sig')
    except OSError as exc:
        raise GatewayConfigError(f'{path}: cannot be read ({exc.strerror})',
                                 'check the path and its permissions') from None
    except UnicodeDecodeError:
        raise GatewayConfigError(f'{path}: not UTF-8 text', 'save it as UTF-8') from None
    problem = None
    if suffix == '.json':
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            problem = f'not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}'
    elif suffix == '.toml':
        import tomllib
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            problem = f'not valid TOML: {str(exc).splitlines()[0]}'
    else:
        import yaml
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, 'problem_mark', None)
            where = f' at line {mark.line + 1}, column {mark.column + 1}' if mark else ''
            problem = f'not valid YAML: {getattr(exc, "problem", None) or "error"}{where}'
    if problem is None and not isinstance(data, (dict, type(None))):
        problem = f'the top level must be a mapping of keys, got {type(data).__name__}'
    if problem:
        raise GatewayConfigError(f'{path}: {problem}', f'compare it with config/{EXAMPLE_NAME}')
    return data or {}


# -------------------------------------------------------------------------------- loading
def load_gateway_config(path: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                        learn: Optional[Callable[..., None]] = None) -> GatewayConfig:
    """Find, read and validate the config; the key from the environment overrides the file.

    ``learn`` is called with every secret found (see :func:`secrets_in`) before validation.
    """
    env = os.environ if env is None else env
    learn = learn or (lambda *secrets: None)
    learn(*secrets_in({}, env))
    config_path, warnings = find_config_file(path, env)
    data = read_config_file(config_path)
    learn(*secrets_in(data, env))
    config = config_from_mapping(data, source=str(config_path), env=env)
    if config.key_source.startswith('file') and _readable_by_others(config_path):
        warnings.append(f'{config_path} holds the API key and is readable by other users; run '
                        f'chmod 600 {config_path}, or move the key to CLAW_LLM_API_KEY')
    return replace(config, warnings=tuple(warnings) + config.warnings)


def config_from_mapping(data: Mapping[str, Any], source: str = '<arguments>',
                        env: Optional[Mapping[str, str]] = None) -> GatewayConfig:
    """Validate a parsed mapping (unknown keys, types, the three pieces) into a GatewayConfig."""
    env = os.environ if env is None else env
    unknown = [str(k) for k in data if k not in DEFAULTS]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(DEFAULTS), n=1)
        raise GatewayConfigError(f'{source}: unknown key {unknown[0]!r}',
                                 f'did you mean {close[0]!r}?' if close
                                 else f'allowed keys: {", ".join(DEFAULTS)}')
    if data.get('base_url') is None:
        raise GatewayConfigError(f'base_url is missing in {source}; {_NO_FALLBACK}',
                                 'add "base_url": "https://<gateway host>/v1" (the API root '
                                 'your gateway documents for the OpenAI SDK)')
    base_url, warnings = normalize_base_url(data['base_url'], source)
    api_key, key_source = resolve_api_key(data.get('api_key'), source, env, warnings)
    values = {}
    for role in ('teacher_model', 'student_model'):
        if data.get(role) is None:
            raise GatewayConfigError(f'{role} is missing in {source}; {_NO_FALLBACK}',
                                     f'add "{role}": "<model id exactly as the gateway lists '
                                     'it>"')
        values[role] = _check_model(data[role], role, source, warnings)
    if values['teacher_model'] == values['student_model']:
        warnings.append(f'teacher_model and student_model are both {values["teacher_model"]!r}'
                        ': the comparison shows one model twice')
    for key in _RANGES:
        values[key] = _check_number(data.get(key, DEFAULTS[key]), key, source)
    return GatewayConfig(base_url=base_url, api_key=api_key, source=source,
                         key_source=key_source, warnings=tuple(warnings), **values)


def resolve_api_key(file_key: Any, source: str, env: Mapping[str, str],
                    warnings: list[str]) -> tuple[str, str]:
    """Return (key, where it came from): CLAW_LLM_API_KEY > TAOTOKEN_API_KEY > file.

    An environment variable that is set but empty or blank is an error: it would otherwise
    send an empty ``Bearer`` and earn a confusing 401. The fix names the source used instead.
    """
    for index, var in enumerate(KEY_ENV_VARS):
        if var not in env:
            continue
        if not env[var].strip():
            later = [f'the key from {v}' for v in KEY_ENV_VARS[index + 1:] if v in env]
            later += [f'api_key from {source}'] if file_key is not None else []
            then = f'to use {later[0]}' if later else '(then no key is left: add one)'
            raise GatewayConfigError(
                f'{var} is set but empty (or only whitespace); an empty override is not '
                f'used silently', f'export {var}=<your key>, or unset {var} {then}')
        if file_key is not None:
            warnings.append(f'the key from {var} overrides api_key in {source}')
        return _check_key(env[var], f'env {var}', warnings), f'env {var}'
    if file_key is None or (isinstance(file_key, str) and not file_key.strip()):
        raise GatewayConfigError(f'no API key: {" and ".join(KEY_ENV_VARS)} are not set and '
                                 f'{source} has no api_key; {_NO_FALLBACK}',
                                 'export CLAW_LLM_API_KEY=<your key> (keeps the key out of '
                                 'files), or add "api_key" to the config')
    if not isinstance(file_key, str):
        raise GatewayConfigError(f'api_key in {source} must be a string, got '
                                 f'{type(file_key).__name__}', 'write the key in quotes')
    _reject_placeholder(file_key, 'api_key', source,
                        hint='export CLAW_LLM_API_KEY=<your key>, or put the real key in the '
                        'file')
    return _check_key(file_key, f'file {source}', warnings), f'file {source}'


def _check_key(raw: str, where: str, warnings: list[str]) -> str:
    """Strip surrounding whitespace and a pasted ``Bearer`` word; reject broken characters."""
    key = raw.strip()
    if key != raw:
        warnings.append(f'the API key from {where} had surrounding whitespace (e.g. a trailing '
                        'newline); it was stripped')
    if key.lower().startswith('bearer') and key[6:7].isspace():
        key = key[6:].strip()
        warnings.append(f'the API key from {where} started with "Bearer "; claw-rl sends '
                        '"Authorization: Bearer <key>" itself, so the extra word was removed')
    if not key:
        raise GatewayConfigError(f'the API key from {where} is empty',
                                 'set it to the key the gateway issued')
    for position, char in enumerate(key):
        if char.isspace() or not char.isprintable():
            raise GatewayConfigError(
                f'the API key from {where} contains whitespace or a control character at '
                f'position {position}', 'copy the key again as one unbroken line')
        if not char.isascii():
            raise GatewayConfigError(
                f'the API key from {where} contains the non-ASCII character U+{ord(char):04X} '
                f'at position {position} (a copy-paste artefact?)', 'copy the key again')
    if key[0] == key[-1] and key[0] in '"\'':
        raise GatewayConfigError(f'the API key from {where} is wrapped in quote characters',
                                 'remove the quotes that became part of the value')
    return key


def _check_model(value: Any, role: str, source: str, warnings: Optional[list] = None) -> str:
    if not isinstance(value, str):
        raise GatewayConfigError(f'{role} in {source} must be a string, got '
                                 f'{type(value).__name__}', 'write the model id in quotes')
    model = value.strip()
    if not model:
        raise GatewayConfigError(f'{role} in {source} is empty; {_NO_FALLBACK}',
                                 'set it to a model id the gateway lists (GET <base_url>/models)')
    if model != value and warnings is not None:
        warnings.append(f'{role} in {source} had surrounding whitespace; it was stripped')
    _reject_placeholder(model, role, source)
    if any(ch.isspace() or not ch.isprintable() for ch in model):
        raise GatewayConfigError(f'{role} in {source} contains whitespace: {model!r}',
                                 'copy the model id exactly as the gateway lists it')
    return model


def _check_number(value: Any, key: str, source: str) -> float | int:
    low, high, low_allowed = _RANGES[key]
    example = f'e.g. "{key}": {DEFAULTS[key]}'
    if isinstance(DEFAULTS[key], int):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise GatewayConfigError(f'{key} in {source} must be an integer from {low} to '
                                     f'{high}, got {value!r}', example)
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise GatewayConfigError(f'{key} in {source} must be a number, got {value!r}', example)
    if value < low or (value == low and not low_allowed) or value > high:
        bound = f'>= {low:g}' if low_allowed else f'> {low:g}'
        raise GatewayConfigError(f'{key} in {source} is {value!r}; allowed: {bound} and '
                                 f'<= {high:g}', example)
    return float(value)


def _reject_placeholder(value: str, key: str, source: str, hint: str = '') -> None:
    if '<' in value and '>' in value:
        shown = repr(value) if key != 'api_key' else 'a <...> placeholder'
        raise GatewayConfigError(f'{key} in {source} is still the placeholder from '
                                 f'{EXAMPLE_NAME} ({shown})',
                                 hint or f'replace it with your real {key}')


def _readable_by_others(path: Path) -> bool:
    try:
        return os.name == 'posix' and bool(path.stat().st_mode & 0o077)
    except OSError:
        return False
