"""The graph model: arguments, node entries, and their resolution into concrete processes.

A :class:`Graph` names its arguments (string values with defaults, as launch arguments are) and
a ``build`` function that turns the argument values into :class:`NodeEntry` objects. Resolving
gives :class:`ResolvedNode` objects: the executable, node name, absolute namespace, parameter
files and inline parameters, remappings and extra arguments of one process. Both consumers read
only resolved nodes: ``claw-rl up`` (:mod:`.graph_runner`) starts them as processes, and the launch
files (:mod:`.ros_launch`) turn them into ``launch_ros.actions.Node`` actions. The command line
:func:`ros_command` builds is the one launch_ros builds for the same Node.

Plain Python: no rclpy, no launch import, so it is tested without ROS.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import json
import os
from pathlib import Path
import re
from typing import Any, Callable, Mapping

import yaml

from ..core import paths
from ..core.config import ConfigError, SAFE_LOADER

PACKAGE = 'claw_rl_ros'
# Installed executable (lib/claw_rl_ros/<name>, a scripts/ launcher) -> the module it runs.
EXECUTABLES = {
    'claw_rl': 'claw_rl_ros.cli',
    'sim_node': 'claw_rl_ros.nodes.sim.sim_node',
    'policy_node': 'claw_rl_ros.nodes.policy.policy_node',
    'actor_node': 'claw_rl_ros.nodes.actor_node',
    'trainer_node': 'claw_rl_ros.nodes.trainer_node',
    'recorder_node': 'claw_rl_ros.nodes.recorder_node',
    'node_container': 'claw_rl_ros.nodes.node_container',
}
_NAME = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')
_TRUE, _FALSE = ('true', 'True', '1'), ('false', 'False', '0')


@dataclass(frozen=True)
class Argument:
    """One graph argument: ``name:=value`` for ros2 launch, ``--name value`` for claw-rl up."""

    name: str
    default: str
    description: str
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeEntry:
    """One node as a graph's build function writes it.

    ``param_files`` are file names under the package's ``config/`` (or absolute paths), loaded
    in order; ``parameters`` override them. ``exits`` marks a one-shot task (``claw_rl stand``)
    whose normal exit ends the graph without being a failure. ``respawn``: a node that dies is
    started again after ``respawn_delay`` seconds instead of ending the graph (launch_ros
    ``Node(respawn=True, respawn_delay=...)``; the runner restarts it after an abnormal exit).
    """

    executable: str
    name: str
    param_files: tuple[str, ...] = ()
    parameters: Mapping[str, Any] = field(default_factory=dict)
    remappings: tuple[tuple[str, str], ...] = ()
    arguments: tuple[str, ...] = ()
    exits: bool = False
    respawn: bool = False
    respawn_delay: float = 1.0
    # A node_container's nodes (see :func:`composed`): each resolved on its own, then hosted.
    hosts: tuple['NodeEntry', ...] = ()


def composed(name: str, entries: list[NodeEntry]) -> NodeEntry:
    """One ``node_container`` process named ``name`` hosting ``entries`` under their own
    names (:mod:`claw_rl_ros.nodes.node_container`)."""
    return NodeEntry('node_container', name, hosts=tuple(entries))


@dataclass(frozen=True)
class ResolvedNode:
    """A node ready to start: every value concrete, every path absolute and existing."""

    executable: str
    name: str
    namespace: str
    param_files: tuple[str, ...]
    parameters: Mapping[str, Any]
    remappings: tuple[tuple[str, str], ...]
    arguments: tuple[str, ...]
    exits: bool
    respawn: bool = False
    respawn_delay: float = 1.0
    hosts: tuple[str, ...] = ()  # a container's nodes (full names); it renames none of them

    @property
    def fqn(self) -> str:
        """Fully qualified node name, e.g. ``/robot1/sim_node``."""
        return self.namespace.rstrip('/') + '/' + self.name

    @property
    def module(self) -> str:
        """The Python module the installed executable runs (``python -m <module>``)."""
        return EXECUTABLES[self.executable]


@dataclass(frozen=True)
class Graph:
    """A named set of nodes built from argument values (``build(values) -> [NodeEntry]``)."""

    name: str
    description: str
    arguments: tuple[Argument, ...]
    build: Callable[[Mapping[str, str]], list[NodeEntry]]
    namespaced: bool = True

    def defaults(self) -> dict[str, str]:
        return {arg.name: arg.default for arg in self.arguments}


def resolve(graph: Graph, values: Mapping[str, str] | None = None) -> list[ResolvedNode]:
    """The graph's processes for these argument values (missing ones take their defaults).

    Raises ConfigError naming the graph, the argument or node, the value and the fix.
    """
    source = f'graph {graph.name!r}'
    known = graph.defaults()
    unknown = sorted(set(values or {}) - set(known))
    if unknown:
        raise ConfigError(source, unknown[0], f'unknown argument; this graph takes '
                          f'{", ".join(known) or "no arguments"}')
    merged = {**known, **{k: str(v) for k, v in (values or {}).items()}}
    for arg in graph.arguments:
        if arg.choices and merged[arg.name] not in arg.choices:
            raise ConfigError(source, arg.name, f'{merged[arg.name]!r} is not one of '
                              f'{", ".join(arg.choices)}')
    namespace = normalize_namespace(merged.get('namespace', ''), source)
    nodes = [_resolve_node(entry, namespace, source) for entry in graph.build(merged)]
    names = [node.fqn for node in nodes]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(source, 'nodes', f'node name {duplicates[0]} is used twice; give '
                          'each entry its own name')
    return nodes


def _resolve_node(entry: NodeEntry, namespace: str, source: str) -> ResolvedNode:
    if entry.hosts:
        return _resolve_container(entry, namespace, source)
    where = f'{source} node {entry.name!r}'
    if entry.executable not in EXECUTABLES:
        raise ConfigError(where, 'executable', f'{entry.executable!r} is not installed by '
                          f'{PACKAGE}; use one of {", ".join(EXECUTABLES)}')
    if not _NAME.match(entry.name):
        raise ConfigError(where, 'name', 'a node name is letters, digits and _, not starting '
                          'with a digit')
    if entry.respawn and entry.exits:
        raise ConfigError(where, 'respawn', 'a one-shot node (exits) is not restarted; set one '
                          'of respawn and exits')
    if entry.respawn and not entry.respawn_delay >= 0:
        raise ConfigError(where, 'respawn_delay', f'{entry.respawn_delay!r} is not a number of '
                          'seconds >= 0')
    node = ResolvedNode(entry.executable, entry.name, namespace, (), dict(entry.parameters),
                        tuple(entry.remappings), tuple(str(a) for a in entry.arguments),
                        entry.exits, entry.respawn, float(entry.respawn_delay))
    files = tuple(str(_param_file(name, node, where)) for name in entry.param_files)
    return ResolvedNode(**{**node.__dict__, 'param_files': files})


def _resolve_container(entry: NodeEntry, namespace: str, source: str) -> ResolvedNode:
    """A node_container: its nodes resolved (and their parameter files checked) one by one,
    then hosted (:func:`host`)."""
    return host(entry.name, [_resolve_node(h, namespace, source) for h in entry.hosts],
                f'{source} node {entry.name!r}')


def host(name: str, hosted: list[ResolvedNode], where: str = 'node_container') -> ResolvedNode:
    """One ``node_container`` process named ``name`` for resolved nodes of one namespace: each
    passed as ``--node EXECUTABLE JSON``. Its ``--ros-args`` reach every node, so it renames
    none, and a hosted node may not carry what would reach the others."""
    for node in hosted:
        extra = [k for k in ('remappings', 'arguments', 'exits', 'respawn', 'hosts')
                 if getattr(node, k)]
        if extra or node.name != node.executable:
            raise ConfigError(where, 'hosts', f'{node.fqn} cannot be hosted: '
                              f'{extra[0] if extra else "a renamed node"} would apply to every '
                              'node of the process; start it as a process of its own')
    if len({n.executable for n in hosted}) != len(hosted) or \
            len({n.namespace for n in hosted}) != 1:
        raise ConfigError(where, 'hosts', 'a container hosts each node once, all in one '
                          'namespace')
    arguments = tuple(a for n in hosted for a in
                      ('--node', n.executable, json.dumps(dict(n.parameters), sort_keys=True)))
    files = tuple(dict.fromkeys(f for n in hosted for f in n.param_files))
    return ResolvedNode('node_container', name, hosted[0].namespace, files, {}, (), arguments,
                        False, hosts=tuple(n.fqn for n in hosted))


def _param_file(name: str, node: ResolvedNode, where: str) -> Path:
    """Absolute path of a parameter file, checked to hold a section that applies to the node.

    rcl applies a ``<key>: ros__parameters:`` section only when the key matches the node's
    fully qualified name (``/**`` and ``*`` are wildcards); a file keyed ``sim_node`` silently
    does nothing to ``/robot1/sim_node``. That mistake is an error here.
    """
    path = paths.config_path(name).resolve()
    if not path.is_file():
        raise ConfigError(where, 'param_files', f'{path} does not exist; install the package '
                          '(its config/ folder) or give an existing file')
    data = yaml.load(path.read_text(), Loader=SAFE_LOADER) or {}
    keys = [k for k, v in data.items() if isinstance(v, dict) and 'ros__parameters' in v]
    if not any(node_pattern_matches(key, node.fqn) for key in keys):
        raise ConfigError(str(path), 'node names', f'no section applies to {node.fqn} (keys: '
                          f'{", ".join(keys) or "none"}); key it "/**/{node.name}" so it '
                          'applies in any namespace')
    return path


def node_pattern_matches(key: str, fqn: str) -> bool:
    """rcl's rule: does parameter-file key ``key`` apply to the node named ``fqn``?

    A key without a leading ``/`` is absolute all the same; ``*`` matches one name segment,
    ``/**`` any number of leading segments (also none).
    """
    key = key if key.startswith('/') else '/' + key
    pattern = re.escape(key).replace(r'/\*\*', '(/[^/]+)*').replace(r'\*', '[^/]+')
    return re.fullmatch(pattern, fqn) is not None


def normalize_namespace(value: str, source: str = 'namespace') -> str:
    """``''`` -> ``/``; ``robot1`` -> ``/robot1``; validated like rcl validates namespaces."""
    value = value.strip()
    ns = '/' + value.strip('/') if value.strip('/') else '/'
    if ns != '/' and not all(_NAME.match(part) for part in ns[1:].split('/')):
        raise ConfigError(source, 'namespace', f'{value!r} is not a valid ROS namespace: '
                          'use names of letters, digits and _ separated by /')
    return ns


def to_bool(values: Mapping[str, str], name: str, source: str) -> bool:
    """A boolean argument (``true``/``false``); anything else is a ConfigError."""
    value = values[name]
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise ConfigError(source, name, f'{value!r} is not a boolean; use true or false')


def existing_path(values: Mapping[str, str], name: str, source: str) -> str:
    """An argument naming a file: '' stays '', anything else must exist (made absolute)."""
    value = values[name]
    if not value:
        return ''
    path = Path(os.path.expanduser(value))
    if not path.is_file():
        raise ConfigError(source, name, f'{value!r}: no such file (cwd {os.getcwd()}); give '
                          'the path of an exported model, e.g. claw-rl export --out student.onnx')
    return str(path.resolve())


def robot_argument(value: str) -> str:
    """A robot name stays a name; a YAML path is made absolute so every process finds it."""
    if value.endswith(('.yaml', '.yml')) and Path(value).is_file():
        return str(Path(value).resolve())
    return value


def overlay_argument(value: str, robot: str, source: str, key: str = 'robot_overlay') -> str:
    """An argument naming a robot overlay (``claw-rl sysid --out``): '' stays '', anything
    else must be an overlay file that fits ``robot`` (made absolute). A missing file, a
    directory or a bad overlay is a one-line ConfigError naming ``key``, the file and, for a
    bad field, the field."""
    if not value:
        return ''
    path = Path(os.path.expanduser(value))
    if not path.is_file():
        what = 'a directory' if path.is_dir() else f'no such file (cwd {os.getcwd()})'
        raise ConfigError(source, key, f'{value!r}: {what}; give the overlay file claw-rl '
                          'sysid wrote (--out)')
    path = path.resolve()
    from ..core.sim.robot import load_robot  # (mujoco: only when an overlay is given)
    try:
        load_robot(robot_argument(robot), overlay=path)
    except ConfigError as exc:
        if exc.source != str(path):  # the robot's own error, not the overlay's
            raise
        # (one line: a YAML parser's message spans several)
        detail = ' '.join((f'{exc.key}: {exc.detail}' if exc.key else exc.detail).split())
        raise ConfigError(source, key, f'{path}: {detail}') from None
    return str(path)


def inline_params_yaml(node: ResolvedNode) -> str:
    """The YAML file launch_ros writes for a Node's inline parameter dict (same key, same body)."""
    # (safe_dump: a value rcl could not read, e.g. a numpy float, fails here by name instead
    # of as a parse error in the node's process)
    return yaml.safe_dump({node.fqn: {'ros__parameters': dict(node.parameters)}},
                          default_flow_style=False)


def ros_command(node: ResolvedNode, inline_params_file: str | None) -> list[str]:
    """Arguments after the executable, in launch_ros's order.

    ``<arguments> --ros-args -r __node:=<name> -r __ns:=<ns> --params-file <f>...
    [--params-file <inline>] -r <from>:=<to>...``; ``inline_params_file`` holds
    :func:`inline_params_yaml` (None when the node has no inline parameters).
    """
    cmd = [*node.arguments, '--ros-args', *([] if node.hosts else ['-r', f'__node:={node.name}']),
           '-r', f'__ns:={node.namespace}']
    for path in node.param_files:
        cmd += ['--params-file', path]
    if node.parameters:
        if inline_params_file is None:
            raise ValueError(f'{node.fqn} has inline parameters: give their file')
        cmd += ['--params-file', inline_params_file]
    for src, dst in node.remappings:
        cmd += ['-r', f'{src}:={dst}']
    return cmd
