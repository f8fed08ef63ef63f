"""Declare a node's parameters from its dataclass in core/params/node_config.py.

:func:`declare` declares every field of such a dataclass on a node with a
``ParameterDescriptor`` (its description, read-only flag and choices) and returns the
dataclass holding what the node got (the default, then ``--params-file`` YAML, then ``-p``).
``ros2 param describe <node> <name>`` shows the description and the read-only flag; rclpy
itself refuses ``set_parameters`` on a read-only one.

Every parameter has a value, so ``get_parameters`` (``ros2 param get`` / ``dump``) answers for
each: rclpy answers a whole request with an empty list when one name in it has none. A list
parameter that is empty (its default, or ``[]`` given in a file or with ``-p``, which rcl reads
as NOT_SET) holds an empty list of its element type (``STRING_ARRAY`` ...): the dataclass
reads ``[]``, 'not given'.
"""

from __future__ import annotations

import dataclasses
import typing

from rcl_interfaces.msg import ParameterDescriptor
from rclpy.exceptions import InvalidParameterTypeException
from rclpy.node import Node
from rclpy.parameter import Parameter

from ..core.params.node_config import default_of

T = typing.TypeVar('T')
TYPES = {bool: Parameter.Type.BOOL, int: Parameter.Type.INTEGER, float: Parameter.Type.DOUBLE,
         str: Parameter.Type.STRING, list[bool]: Parameter.Type.BOOL_ARRAY,
         list[int]: Parameter.Type.INTEGER_ARRAY, list[float]: Parameter.Type.DOUBLE_ARRAY,
         list[str]: Parameter.Type.STRING_ARRAY}


def ros_type(cls: type, name: str) -> Parameter.Type:
    """The ROS parameter type of field ``name`` of ``cls`` (from its annotation)."""
    hint = typing.get_type_hints(cls)[name]
    if hint not in TYPES:
        raise TypeError(f'{cls.__name__}.{name}: type {hint} is not a ROS parameter type; use '
                        'bool, int, float, str or a list of one of them')
    return TYPES[hint]


def declare_one(node: Node, name: str, default, kind: Parameter.Type,
                descriptor: ParameterDescriptor):
    """Declare parameter ``name`` with ``descriptor``; its value (None: not set, a scalar's
    refusal). A list one that got no value (an empty default says nothing of its element
    type, and rcl reads ``[]`` as NOT_SET) is then set to an empty list of ``kind``: declared
    writable first, as rclpy sets and re-describes only a writable parameter (nothing is
    spun in between, and no callback of the node's is registered yet)."""
    if not isinstance(default, list):
        return node.declare_parameter(name, default, descriptor).value
    writable = ParameterDescriptor(description=descriptor.description)
    value = node.declare_parameter(name, kind if default == [] else default, writable).value
    if value is None:
        node.set_parameters([Parameter(name, kind, [])])
    descriptor.type = kind.value
    node.set_descriptor(name, descriptor)
    return value


def declare(node: Node, cls: type[T]) -> T:
    """Declare every field of dataclass ``cls`` on ``node``; the values it got, as a ``cls``.

    A value outside the field's choices is a ValueError naming parameter, value and choices.
    """
    values = {}
    for f in dataclasses.fields(cls):
        default, kind, choices = default_of(f), ros_type(cls, f.name), f.metadata['choices']
        descriptor = ParameterDescriptor(
            description=f.metadata['doc'], read_only=f.metadata['read_only'],
            additional_constraints=f'one of {choices}' if choices else '')
        try:
            value = declare_one(node, f.name, default, kind, descriptor)
        except InvalidParameterTypeException as exc:  # e.g. time_budget_s:=120 for a double
            raise ValueError(f'parameter {f.name}: {exc.args[0]}; give a value of its type '
                             f'(default {f.name}:={default!r})') from None
        if value is None and not isinstance(default, list):  # e.g. [] in a file: no type
            raise ValueError(f'parameter {f.name}: no value (an empty list?); give a value of '
                             f'its type (default {f.name}:={default!r})')
        if choices and value not in choices:
            raise ValueError(f'parameter {f.name} = {value!r}; use one of {choices}')
        values[f.name] = list(value or ()) if isinstance(default, list) else value
    return cls(**values)
