"""Gateway configuration: base URL, API key, teacher and student model ids, timeout.

Read from one JSON, TOML or YAML file. The key may (and should) come from the environment
instead: ``CLAW_LLM_API_KEY`` wins over ``TAOTOKEN_API_KEY``, which wins over ``api_key`` in
the file. Everything is validated before any request, each piece with its own message; the key
only ever leaves this module in masked form (``sk-...abcd``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
import difflib
import json
import os
from pathlib import Path
import re
from typing import Any, Mapping, Optional
from urllib.parse import urlsplit

from .errors import GatewayConfigError, mask_key

# Environment variables holding the key, strongest first.
KEY_ENV_VARS = ('CLAW_LLM_API_KEY', 'TAOTOKEN_API_KEY')
# Environment variable naming the config file.
CONFIG_ENV_VAR = 'CLAW_LLM_CONFIG'
CONFIG_STEM = 'llm_gateway'
CONFIG_SUFFIXES = ('.json', '.toml', '.yaml', '.yml')
# Default lookup names: exactly the ones .gitignore keeps out of git (no .yml).
LOOKUP_SUFFIXES = ('.json', '.toml', '.yaml')
EXAMPLE_NAME = 'llm_gateway.example.json'
DEFAULT_TIMEOUT = 120.0
MAX_TIMEOUT = 3600.0
CHAT_PATH = '/chat/completions'

_NO_FALLBACK = ('claw-rl needs all three pieces (base URL, key, model id) and never falls back '
                'to a default provider or an OAuth login')


@dataclass(frozen=True)
class _Field:
    """One config key: its type check, default and doc (for messages and docs)."""

    kind: str
    default: Any
    doc: str


FIELDS: dict[str, _Field] = {
    'base_url': _Field('str', None, 'API root of the OpenAI-compatible gateway, e.g. '
                       'https://gateway.example.com/v1'),
    'api_key': _Field('str', None, 'the unified key (better: leave it out and set '
                      'CLAW_LLM_API_KEY)'),
    'teacher_model': _Field('str', None, 'model id of the teacher, as the gateway lists it'),
    'student_model': _Field('str', None, 'model id of the student, as the gateway lists it'),
    'timeout': _Field('float', DEFAULT_TIMEOUT, 'seconds to connect and to wait for an answer'),
    'temperature': _Field('float', 0.0, 'sampling temperature sent with every request'),
    'max_attempts': _Field('int', 3, 'attempts per request when the gateway answers 429/5xx'),
    'retry_backoff': _Field('float', 1.0, 'first retry delay in seconds (doubles each retry)'),
}


@dataclass(frozen=True, repr=False)
class GatewayConfig:
    """A validated gateway configuration; ``base_url`` is the API root ending in ``/v1``."""

    base_url: str
    api_key: str
    teacher_model: str
    student_model: str
    timeout: float = DEFAULT_TIMEOUT
    temperature: float = 0.0
    max_attempts: int = 3
    retry_backoff: float = 1.0
    source: str = '<arguments>'
    key_source: str = 'arguments'
    warnings: tuple[str, ...] = field(default=())

    @property
    def chat_url(self) -> str:
        """The one endpoint this client calls: ``{base_url}/chat/completions``."""
        return self.base_url + CHAT_PATH

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
            if key in ('teacher_model', 'student_model'):
                values[key], _ = _check_model(value, key, 'the command line')
            elif key == 'timeout':
                values[key] = _check_number(value, 'timeout', 'the command line',
                                            low=0.0, high=MAX_TIMEOUT)
        return replace(self, **values)


def make_config(base_url: str, api_key: str, teacher_model: str, student_model: str,
                **options: Any) -> GatewayConfig:
    """Build a validated config from values (no file, no environment)."""
    data = {'base_url': base_url, 'api_key': api_key, 'teacher_model': teacher_model,
            'student_model': student_model, **options}
    return config_from_mapping(data, source='<arguments>', env={})


# ------------------------------------------------------------------------------------ URLs
def normalize_base_url(url: Any, source: str = '<arguments>') -> tuple[str, list[str]]:
    """Validate ``url`` and return (API root ending in exactly one ``/v1``, warnings).

    Accepts ``https://host``, ``https://host/``, ``https://host/v1/``, ``https://host/api/v1``
    and a pasted full endpoint ``.../v1/chat/completions``.
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
    if any(ch.isspace() for ch in text):
        raise GatewayConfigError(f'{where} contains a space: {text!r}',
                                 'remove the spaces (URLs cannot contain them)')
    parts = urlsplit(text)
    if parts.scheme not in ('http', 'https'):
        if '://' not in text:
            raise GatewayConfigError(f'{where} has no scheme: {text!r}',
                                     f'write it as "https://{text}"')
        raise GatewayConfigError(f'{where} uses the scheme {parts.scheme!r}: {text!r}',
                                 'use an http:// or https:// URL')
    if not parts.hostname:
        raise GatewayConfigError(f'{where} has no host name: {text!r}',
                                 'write it as "https://<gateway host>/v1"')
    if parts.username or parts.password:
        raise GatewayConfigError(f'{where} contains user credentials (user:password@)',
                                 'remove them from the URL; put the key in CLAW_LLM_API_KEY')
    if parts.query or parts.fragment:
        raise GatewayConfigError(f'{where} contains a ?query or #fragment: {text!r}',
                                 'give only scheme, host and path, e.g. '
                                 '"https://gateway.example.com/v1"')
    try:
        parts.port
    except ValueError:
        raise GatewayConfigError(f'{where} has an invalid port: {text!r}',
                                 'use a number from 1 to 65535 after the colon') from None
    path = re.sub(r'/+', '/', parts.path).rstrip('/')
    if path.endswith(CHAT_PATH):
        path = path[:-len(CHAT_PATH)].rstrip('/')
        warnings.append(f'{where} is the full endpoint; claw-rl appends {CHAT_PATH} itself, so '
                        f'base_url should end before it')
    if not path.endswith('/v1'):
        path += '/v1'
    return f'{parts.scheme}://{parts.netloc}{path}', warnings


def chat_completions_url(base_url: str) -> str:
    """``{base_url}/v1/chat/completions`` with no double slash and no duplicated ``/v1``."""
    root, _ = normalize_base_url(base_url)
    return root + CHAT_PATH


# ------------------------------------------------------------------------------ file lookup
def candidate_paths(cwd: Optional[Path] = None, home: Optional[Path] = None) -> list[Path]:
    """Where a config is looked for when neither --config nor CLAW_LLM_CONFIG is given."""
    cwd = Path.cwd() if cwd is None else cwd
    home = Path.home() if home is None else home
    local = [cwd / 'config' / f'{CONFIG_STEM}{s}' for s in LOOKUP_SUFFIXES]
    user = [home / '.config' / 'claw_rl_ros' / f'{CONFIG_STEM}{s}' for s in LOOKUP_SUFFIXES]
    return local + user


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
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise GatewayConfigError(f'config file {explicit} (--config) does not exist',
                                     _create_hint(path))
        return path, []
    from_env = env.get(CONFIG_ENV_VAR)
    if from_env is not None and from_env.strip():
        path = Path(from_env.strip()).expanduser()
        if not path.is_file():
            raise GatewayConfigError(f'config file {path} (from ${CONFIG_ENV_VAR}) does not '
                                     'exist', f'fix or unset {CONFIG_ENV_VAR}; '
                                     + _create_hint(path))
        return path, []
    candidates = candidate_paths()
    found = [p for p in candidates if p.is_file()]
    if not found:
        looked = ', '.join(str(p.parent / f'{CONFIG_STEM}.{{json,toml,yaml}}')
                           for p in (candidates[0], candidates[len(LOOKUP_SUFFIXES)]))
        raise GatewayConfigError(f'no gateway config found (looked in {looked}; no --config, '
                                 f'no ${CONFIG_ENV_VAR})',
                                 _create_hint(Path('config') / f'{CONFIG_STEM}.json'))
    warnings = [f'{other} is ignored: {found[0]} comes first' for other in found[1:]]
    return found[0], warnings


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
        raw = path.read_bytes()
    except OSError as exc:
        raise GatewayConfigError(f'{path}: cannot be read ({exc.strerror})',
                                 'check the path and its permissions') from None
    problem = None
    data: Any = None
    if suffix == '.json':
        try:
            data = json.loads(raw.decode('utf-8-sig'))
        except UnicodeDecodeError:
            problem = 'not UTF-8 text'
        except json.JSONDecodeError as exc:
            problem = f'not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}'
    elif suffix == '.toml':
        import tomllib
        try:
            data = tomllib.loads(raw.decode('utf-8-sig'))
        except UnicodeDecodeError:
            problem = 'not UTF-8 text'
        except tomllib.TOMLDecodeError as exc:
            problem = f'not valid TOML: {str(exc).splitlines()[0]}'
    else:
        import yaml
        try:
            data = yaml.safe_load(raw.decode('utf-8-sig'))
        except UnicodeDecodeError:
            problem = 'not UTF-8 text'
        except yaml.YAMLError as exc:
            problem = f'not valid YAML: {_yaml_problem(exc)}'
    if problem:
        raise GatewayConfigError(f'{path}: {problem}', f'compare it with config/{EXAMPLE_NAME}')
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise GatewayConfigError(f'{path}: the top level must be a mapping of keys, got '
                                 f'{type(data).__name__}',
                                 f'compare it with config/{EXAMPLE_NAME}')
    return data


def _yaml_problem(exc: Exception) -> str:
    mark = getattr(exc, 'problem_mark', None)
    problem = getattr(exc, 'problem', None) or type(exc).__name__
    if mark is not None:
        return f'{problem} at line {mark.line + 1}, column {mark.column + 1}'
    return str(problem)


# -------------------------------------------------------------------------------- loading
def load_gateway_config(path: Optional[str] = None,
                        env: Optional[Mapping[str, str]] = None) -> GatewayConfig:
    """Find, read and validate the config; the key from the environment overrides the file."""
    env = os.environ if env is None else env
    config_path, warnings = find_config_file(path, env)
    data = read_config_file(config_path)
    config = config_from_mapping(data, source=str(config_path), env=env)
    if config.key_source.startswith('file') and _readable_by_others(config_path):
        warnings.append(f'{config_path} holds the API key and is readable by other users; run '
                        f'chmod 600 {config_path}, or move the key to CLAW_LLM_API_KEY')
    return replace(config, warnings=tuple(warnings) + config.warnings)


def config_from_mapping(data: Mapping[str, Any], source: str = '<arguments>',
                        env: Optional[Mapping[str, str]] = None) -> GatewayConfig:
    """Validate a parsed mapping (unknown keys, types, the three pieces) into a GatewayConfig."""
    env = os.environ if env is None else env
    unknown = [k for k in data if k not in FIELDS]
    if unknown:
        key = str(unknown[0])
        close = difflib.get_close_matches(key, list(FIELDS), n=1)
        hint = f'did you mean {close[0]!r}?' if close else f'allowed keys: {", ".join(FIELDS)}'
        raise GatewayConfigError(f'{source}: unknown key {key!r}', hint)
    warnings: list[str] = []
    base_url = data.get('base_url')
    if base_url is None:
        raise GatewayConfigError(f'base_url is missing in {source}; {_NO_FALLBACK}',
                                 'add "base_url": "https://<gateway host>/v1" (the API root '
                                 'your gateway documents for the OpenAI SDK)')
    base_url, url_warnings = normalize_base_url(base_url, source)
    warnings += url_warnings
    api_key, key_source, key_warnings = resolve_api_key(data.get('api_key'), source, env)
    warnings += key_warnings
    models = {}
    for role in ('teacher_model', 'student_model'):
        if data.get(role) is None:
            raise GatewayConfigError(f'{role} is missing in {source}; {_NO_FALLBACK}',
                                     f'add "{role}": "<model id exactly as the gateway lists '
                                     'it>"')
        models[role], model_warnings = _check_model(data[role], role, source)
        warnings += model_warnings
    if models['teacher_model'] == models['student_model']:
        warnings.append(f'teacher_model and student_model are both {models["teacher_model"]!r}: '
                        'the comparison shows one model twice')
    options = {
        'timeout': _check_number(data.get('timeout', DEFAULT_TIMEOUT), 'timeout', source,
                                 low=0.0, high=MAX_TIMEOUT),
        'temperature': _check_number(data.get('temperature', 0.0), 'temperature', source,
                                     low=0.0, high=2.0, inclusive_low=True),
        'max_attempts': _check_int(data.get('max_attempts', 3), 'max_attempts', source, 1, 10),
        'retry_backoff': _check_number(data.get('retry_backoff', 1.0), 'retry_backoff', source,
                                       low=0.0, high=60.0, inclusive_low=True),
    }
    return GatewayConfig(base_url=base_url, api_key=api_key, source=source,
                         key_source=key_source, warnings=tuple(warnings), **models, **options)


def resolve_api_key(file_key: Any, source: str,
                    env: Mapping[str, str]) -> tuple[str, str, list[str]]:
    """Return (key, where it came from, warnings): CLAW_LLM_API_KEY > TAOTOKEN_API_KEY > file.

    An environment variable that is set but empty or blank is an error: it would otherwise
    send an empty ``Bearer`` and earn a confusing 401.
    """
    for var in KEY_ENV_VARS:
        if var in env:
            where = f'env {var}'
            if not env[var].strip():
                raise GatewayConfigError(
                    f'{var} is set but empty (or only whitespace); an empty override is not '
                    'used silently', f'export {var}=<your key>, or unset {var} to use the key '
                    f'from {source}')
            key, warnings = _check_key(env[var], where)
            if file_key is not None:
                warnings.insert(0, f'the key from {var} overrides api_key in {source}')
            return key, where, warnings
    where = f'file {source}'
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
    key, warnings = _check_key(file_key, where)
    return key, where, warnings


def _check_key(raw: str, where: str) -> tuple[str, list[str]]:
    """Strip surrounding whitespace and a pasted ``Bearer`` word; reject broken characters."""
    warnings = []
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
    if (key.startswith('"') and key.endswith('"')) or (key.startswith("'")
                                                       and key.endswith("'")):
        raise GatewayConfigError(f'the API key from {where} is wrapped in quote characters',
                                 'remove the quotes that became part of the value')
    return key, warnings


def _check_model(value: Any, role: str, source: str) -> tuple[str, list[str]]:
    if not isinstance(value, str):
        raise GatewayConfigError(f'{role} in {source} must be a string, got '
                                 f'{type(value).__name__}', 'write the model id in quotes')
    model = value.strip()
    warnings = []
    if not model:
        raise GatewayConfigError(f'{role} in {source} is empty; {_NO_FALLBACK}',
                                 'set it to a model id the gateway lists (GET <base_url>/models)')
    if model != value:
        warnings.append(f'{role} in {source} had surrounding whitespace; it was stripped')
    _reject_placeholder(model, role, source)
    if any(ch.isspace() or not ch.isprintable() for ch in model):
        raise GatewayConfigError(f'{role} in {source} contains whitespace: {model!r}',
                                 'copy the model id exactly as the gateway lists it')
    return model, warnings


def _check_number(value: Any, key: str, source: str, *, low: float, high: float,
                  inclusive_low: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise GatewayConfigError(f'{key} in {source} must be a number, got {value!r}',
                                 f'e.g. "{key}": {FIELDS[key].default}')
    too_low = value < low if inclusive_low else value <= low
    if too_low or value > high:
        bound = f'>= {low:g}' if inclusive_low else f'> {low:g}'
        raise GatewayConfigError(f'{key} in {source} is {value!r}; allowed: {bound} and '
                                 f'<= {high:g}', f'e.g. "{key}": {FIELDS[key].default}')
    return float(value)


def _check_int(value: Any, key: str, source: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise GatewayConfigError(f'{key} in {source} must be an integer from {low} to {high}, '
                                 f'got {value!r}', f'e.g. "{key}": {FIELDS[key].default}')
    return value


def _reject_placeholder(value: str, key: str, source: str, hint: str = '') -> None:
    if '<' in value and '>' in value:
        shown = repr(value) if key != 'api_key' else 'a <...> placeholder'
        raise GatewayConfigError(f'{key} in {source} is still the placeholder from '
                                 f'{EXAMPLE_NAME} ({shown})',
                                 hint or f'replace it with your real {key}')


def _readable_by_others(path: Path) -> bool:
    if os.name != 'posix':
        return False
    try:
        return bool(path.stat().st_mode & 0o077)
    except OSError:
        return False
