"""Typed configuration: dataclasses loaded from YAML with strict validation.

Every field is declared with :func:`param`, which carries a one-line doc and optional bounds.
Mappings given for a field whose default is a mapping (reward scales, noise levels) are merged
into that default key by key, so overriding one entry keeps the others. :func:`from_dict`
rejects unknown keys, wrong types and out-of-range values with a :class:`ConfigError` naming the
file, the dotted key, the value and what is allowed.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
from pathlib import Path
import types
import typing
from typing import Any, Literal, Union

import yaml


class ConfigError(ValueError):
    """A configuration value is wrong; the message names file, key, value and the fix."""

    def __init__(self, source: str, key: str, message: str):
        self.source = source
        self.key = key
        self.detail = message
        where = f'{source}: {key}' if key else str(source)
        super().__init__(f'{where}: {message}')


def param(default: Any, doc: str, *, ge: float | None = None, gt: float | None = None,
          le: float | None = None, lt: float | None = None, ordered: bool = False) -> Any:
    """Declare a config field with its one-line doc and bounds.

    Bounds apply to the number, or to every number of a list/tuple/dict value. ``ordered``
    marks a ``(low, high)`` range that must satisfy ``low <= high``.
    """
    meta = {'doc': doc, 'ge': ge, 'gt': gt, 'le': le, 'lt': lt, 'ordered': ordered}
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# The most threads a config or graph argument may ask for (physics or torch): a larger number
# is a typo, and would make that many OS threads.
MAX_THREADS = 256

# libyaml's parser where PyYAML has it (the same safe constructor, ~8x faster: every node
# process parses its configs at start-up), else PyYAML's own.
SAFE_LOADER = getattr(yaml, 'CSafeLoader', yaml.SafeLoader)


def load_yaml(path: str | Path) -> dict:
    """Read a YAML file whose top level is a mapping (an empty file is an empty mapping)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), '', 'file not found; pass an existing YAML file')
    try:
        data = yaml.load(path.read_text(), Loader=SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), '', f'not valid YAML ({exc})') from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), '', f'not UTF-8 text ({exc}); give a YAML file') from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), '', f'top level must be a mapping, got {type(data).__name__}')
    return data


def load_config(cls: type, path: str | Path, section: str | None = None):
    """Load ``cls`` from a YAML file (optionally from one top-level section of it)."""
    data = load_yaml(path)
    if section is not None:
        if section not in data:
            raise ConfigError(str(path), section, 'missing section; add it to the file')
        data = data[section]
    return from_dict(cls, data, source=str(path), prefix=section or '')


def from_dict(cls: type, data: Any, *, source: str = '<dict>', prefix: str = ''):
    """Build dataclass ``cls`` from a mapping, validating every key against its declaration."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        raise ConfigError(source, prefix, f'expected a mapping, got {_show(data)}')
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(str(key), fields, n=1)
        hint = f'did you mean {close[0]!r}?' if close else f'allowed keys: {", ".join(fields)}'
        raise ConfigError(source, _join(prefix, key), f'unknown key; {hint}')
    kwargs = {}
    for name, value in data.items():
        field = fields[name]
        key = _join(prefix, name)
        default = _default(field)
        if isinstance(default, dict) and isinstance(value, dict):
            # A partial mapping (one reward scale, one noise level) patches the defaults.
            value = merge(default, value)
        kwargs[name] = _convert(hints[name], value, source, key)
        _check_bounds(field.metadata, kwargs[name], source, key)
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        if exc.source:
            raise
        # Raised by a __post_init__ check, which knows the key but not the file.
        raise ConfigError(source, _join(prefix, exc.key), exc.detail) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(source, prefix, str(exc)) from None


def to_dict(obj: Any) -> Any:
    """Plain YAML/JSON-able data (tuples become lists) from a config dataclass."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def merge(base: dict, overrides: dict) -> dict:
    """Recursive dict merge: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def describe(cls: type, prefix: str = '') -> list[str]:
    """One line per field: dotted key, default and doc (for ``claw-rl config --help``)."""
    lines = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = _join(prefix, f.name)
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            lines += describe(tp, key)
            continue
        default = _default(f)
        lines.append(f'{key} = {default!r}  # {f.metadata.get("doc", "")}')
    return lines


def _default(field: dataclasses.Field) -> Any:
    """A field's default value (a fresh copy for mutable defaults), or MISSING."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _join(prefix: str, key: Any) -> str:
    return f'{prefix}.{key}' if prefix else str(key)


def _show(value: Any) -> str:
    return f'{value!r} ({type(value).__name__})'


def _convert(tp: Any, value: Any, source: str, key: str) -> Any:
    """Check ``value`` against annotation ``tp`` and return it converted (int -> float etc)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(option, value, source, key)
            except ConfigError as exc:
                errors.append(exc.detail)
        raise ConfigError(source, key, ' or '.join(dict.fromkeys(errors)))
    if origin is Literal:
        if value not in args:
            raise ConfigError(source, key, f'{value!r} is not allowed; choose one of '
                              f'{", ".join(repr(a) for a in args)}')
        return value
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, source=source, prefix=key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(source, key, f'expected true or false, got {_show(value)}')
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(source, key, f'expected an integer, got {_show(value)}')
        return value
    if tp is float:
        return _to_float(value, source, key)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(source, key, f'expected a string, got {_show(value)}')
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(source, key, f'expected a list, got {_show(value)}')
        return [_convert(args[0], v, source, f'{key}[{i}]') for i, v in enumerate(value)]
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(source, key, f'expected a list of {len(args)}, got {_show(value)}')
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, source, f'{key}[{i}]') for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(source, key, f'expected {len(args)} values, got {len(value)}: '
                              f'{list(value)!r}')
        return tuple(_convert(a, v, source, f'{key}[{i}]')
                     for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(source, key, f'expected a mapping, got {_show(value)}')
        return {_convert(args[0], k, source, key): _convert(args[1], v, source, f'{key}.{k}')
                for k, v in value.items()}
    raise TypeError(f'unsupported config annotation {tp!r} at {key}')


def _to_float(value: Any, source: str, key: str) -> float:
    # PyYAML reads `1e-3` (no dot) as a string: accept numeric strings for float fields.
    if isinstance(value, bool):
        raise ConfigError(source, key, f'expected a number, got {_show(value)}')
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(source, key, f'expected a number, got {_show(value)}') from None
    if not isinstance(value, (int, float)):
        raise ConfigError(source, key, f'expected a number, got {_show(value)}')
    if math.isnan(value):
        raise ConfigError(source, key, 'NaN is not allowed; give a number')
    if math.isinf(value):  # (keys that can mean "no limit" say so with 0, e.g. max_grad_norm)
        raise ConfigError(source, key, f'{value} is not allowed; give a finite number')
    return float(value)


def _numbers(value: Any):
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _numbers(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)


def _check_bounds(meta: Any, value: Any, source: str, key: str) -> None:
    ge, gt, le, lt = (meta.get(k) for k in ('ge', 'gt', 'le', 'lt'))
    allowed = ', '.join(s for s in (
        f'>= {ge}' if ge is not None else '', f'> {gt}' if gt is not None else '',
        f'<= {le}' if le is not None else '', f'< {lt}' if lt is not None else '') if s)
    for number in _numbers(value):
        bad = ((ge is not None and number < ge) or (gt is not None and number <= gt)
               or (le is not None and number > le) or (lt is not None and number >= lt))
        if bad:
            raise ConfigError(source, key, f'{value!r} is out of range; allowed: {allowed}')
    if meta.get('ordered') and isinstance(value, (list, tuple)) and len(value) == 2:
        if value[0] > value[1]:
            raise ConfigError(source, key, f'{list(value)!r} is not a range; write [low, high] '
                              'with low <= high')
