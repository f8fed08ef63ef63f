"""Sphinx directives that render the typed configuration from its dataclasses at build time.

The descriptions live once, in the code (``param(default, doc, ...)``); these directives read
them, so the reference pages cannot drift from what the loader accepts:

``.. config-reference:: module:Class`` (in MyST: a ``{config-reference}`` fence)
    One table per dataclass: the dotted YAML key, its type, its default (as YAML), its allowed
    range and its description. A field whose type is a dataclass (or a list of one) gets a
    table of its own after its parent's. ``:prefix:`` sets the dotted key prefix
    (e.g. ``env``).

``.. node-parameters:: module``
    One table per node of the module's ``PARAMETERS`` mapping (node executable -> parameter
    dataclass): the parameter, its ROS type, its default, read-only or not, the values it may
    take, and its description.
"""

from __future__ import annotations

import dataclasses
import importlib
import types
import typing
from typing import Any, Literal, Union

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective
import yaml

# ROS 2 parameter type names (rcl_interfaces/msg/ParameterType) of the node dataclasses' hints.
ROS_TYPES = {bool: 'bool', int: 'integer', float: 'double', str: 'string',
             list[str]: 'string_array', list[float]: 'double_array',
             list[int]: 'integer_array', list[bool]: 'bool_array'}


def load(target: str) -> Any:
    """The object named ``module:attribute`` (or the module itself for ``module``)."""
    module_name, _, attribute = target.partition(':')
    module = importlib.import_module(module_name)
    return getattr(module, attribute) if attribute else module


def type_name(tp: Any) -> str:
    """A short, YAML-minded name of a type annotation."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return 'null'
    if origin in (Union, types.UnionType):
        return ' | '.join(type_name(a) for a in args)
    if origin is Literal:
        return ' | '.join(repr(a) for a in args)
    if origin in (list, tuple, dict):
        inner = ', '.join('...' if a is Ellipsis else type_name(a) for a in args)
        return f'{origin.__name__}[{inner}]'
    if tp is typing.Any:
        return 'any'
    return getattr(tp, '__name__', str(tp))


def yaml_value(value: Any) -> str:
    """A default as it would be written in YAML, on one line."""
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    value = plain(value)
    if value == '':
        return "''"
    text = yaml.safe_dump(value, default_flow_style=True, width=10 ** 6, sort_keys=False)
    return text.strip().removesuffix('...').strip()


def plain(value: Any) -> Any:
    """Tuples as lists and numpy-free builtins, for yaml.safe_dump."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    return value


def default_of(field: dataclasses.Field) -> Any:
    """A field's default (a fresh one for mutable defaults), or MISSING."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def bounds(meta: typing.Mapping) -> str:
    """The allowed range written by ``param(..., ge=, gt=, le=, lt=, ordered=)``."""
    parts = [f'{sign} {meta[key]:g}' for key, sign in
             (('ge', '>='), ('gt', '>'), ('le', '<='), ('lt', '<')) if meta.get(key) is not None]
    if meta.get('ordered'):
        parts.append('low <= high')
    return ', '.join(parts)


def nested_class(tp: Any) -> type | None:
    """The dataclass a field holds (itself, or the items of a list of it), else None."""
    if dataclasses.is_dataclass(tp):
        return tp
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        if dataclasses.is_dataclass(item):
            return item
    return None


def text_cell(text: str, literal: bool = False) -> nodes.entry:
    """A table cell holding one paragraph (or inline literal) of ``text``."""
    para = nodes.paragraph()
    if text:
        para += nodes.literal(text, text) if literal else nodes.Text(text)
    entry = nodes.entry()
    entry += para
    return entry


def table(headers: list[str], rows: list[list[nodes.entry]], widths: list[int]) -> nodes.table:
    """A docutils table with a header row."""
    group = nodes.tgroup(cols=len(headers))
    for width in widths:
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    row = nodes.row()
    for header in headers:
        row += text_cell(header)
    head += row
    group += head
    body = nodes.tbody()
    for cells in rows:
        row = nodes.row()
        for cell in cells:
            row += cell
        body += row
    group += body
    result = nodes.table(classes=['config-reference'])
    result += group
    return result


def first_line(obj: Any) -> str:
    """The first paragraph of an object's docstring, on one line."""
    doc = (obj.__doc__ or '').strip().split('\n\n')[0]
    return ' '.join(doc.split())


class ConfigReference(SphinxDirective):
    """Tables of a config dataclass and every dataclass nested in it."""

    required_arguments = 1
    option_spec = {'prefix': directives.unchanged}

    def run(self) -> list[nodes.Node]:
        cls = load(self.arguments[0])
        if not dataclasses.is_dataclass(cls):
            raise self.error(f'{self.arguments[0]} is not a dataclass')
        out: list[nodes.Node] = []
        self.render(cls, self.options.get('prefix', ''), out, {})
        return out

    def render(self, cls: type, prefix: str, out: list[nodes.Node], seen: dict) -> None:
        """Append the table of ``cls`` (keys under ``prefix``), then those nested in it; a
        list item class already shown (``seen``: class -> its table) is referred to."""
        seen.setdefault(cls, prefix)
        hints = typing.get_type_hints(cls)
        rows, nested = [], []
        for field in dataclasses.fields(cls):
            if not field.init:
                continue
            key = f'{prefix}.{field.name}' if prefix else field.name
            inner = nested_class(hints[field.name])
            doc = field.metadata.get('doc', '')
            if inner is not None and typing.get_origin(hints[field.name]) is not list:
                nested.append((inner, key))
                doc = f'{doc} (the table {key} below)' if doc else f'the table {key} below'
                default = ''
            else:
                if inner is not None:
                    if inner in seen:
                        doc = f'{doc} (each item: the table {seen[inner]} above)'
                    else:
                        seen[inner] = f'{key}[]'
                        nested.append((inner, f'{key}[]'))
                        doc = f'{doc} (each item: the table {key}[] below)'
                default = yaml_value(default_of(field))
            rows.append([text_cell(key, literal=True), text_cell(type_name(hints[field.name])),
                         text_cell(default, literal=bool(default)),
                         text_cell(bounds(field.metadata)), text_cell(doc)])
        rubric = nodes.rubric('', '')
        if prefix:
            rubric += nodes.literal(prefix, prefix)
            rubric += nodes.Text(f' ({cls.__name__}): {first_line(cls)}')
        else:
            rubric += nodes.Text(f'{cls.__name__}: {first_line(cls)}')
        out.append(rubric)
        out.append(table(['key', 'type', 'default', 'allowed', 'description'], rows,
                         [22, 14, 16, 10, 38]))
        for inner, key in nested:
            self.render(inner, key, out, seen)


class NodeParameters(SphinxDirective):
    """Tables of every node's ROS parameters, from their dataclasses."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        module = load(self.arguments[0])
        out: list[nodes.Node] = []
        for node_name, cls in module.PARAMETERS.items():
            hints = typing.get_type_hints(cls)
            rows = []
            for field in dataclasses.fields(cls):
                meta = field.metadata
                ros_type = ROS_TYPES.get(hints[field.name], type_name(hints[field.name]))
                choices = ', '.join(str(c) for c in meta.get('choices', ()))
                rows.append([text_cell(field.name, literal=True), text_cell(ros_type),
                             text_cell(yaml_value(default_of(field)), literal=True),
                             text_cell('yes' if meta.get('read_only', True) else 'no'),
                             text_cell(choices), text_cell(meta.get('doc', ''))])
            rubric = nodes.rubric(node_name, '')
            rubric += nodes.literal(node_name, node_name)
            rubric += nodes.Text(f' ({cls.__name__}): {first_line(cls)}')
            out.append(rubric)
            out.append(table(['parameter', 'type', 'default', 'read-only', 'choices',
                              'description'], rows, [20, 10, 14, 7, 12, 37]))
        return out


def setup(app) -> dict:
    """Register the directives."""
    app.add_directive('config-reference', ConfigReference)
    app.add_directive('node-parameters', NodeParameters)
    return {'version': '1', 'parallel_read_safe': True, 'parallel_write_safe': True}
