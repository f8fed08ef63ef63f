"""The import map of ``claw_rl_ros`` read from the source (``ast``; nothing is imported, no ROS).

``core/`` is layered, low to high: its own modules (config, paths, math_utils, io) <- sim <-
learning <- deploy <- live. A core package imports only lower layers (and its own modules),
never rclpy or a ROS message package, and never nodes/, commands/, launch_graph/, gateway/ or
the CLI, which import core freely. No module imports another module's private (``_x``) name.
"""

from __future__ import annotations

import ast
from pathlib import Path
import re

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = 'claw_rl_ros'
# Layer of each core package ('' = the modules directly in core/): imports go to lower ones.
LAYERS = {'': 0, 'sim': 1, 'learning': 2, 'deploy': 3, 'live': 4}
# claw_rl_ros packages above core: they may import core, core may not import them.
ABOVE_CORE = ('nodes', 'commands', 'launch_graph', 'gateway', 'cli')
# ROS client libraries, launch and ROS interface packages (std_msgs, rcl_interfaces, ...).
ROS_NAMES = re.compile(r'^(rclpy|rcl\w*|rosidl\w*|launch|launch_ros|launch_testing\w*|'
                       r'message_filters|tf2\w*|rosbag2\w*|\w+_(msgs|srvs|actions|interfaces))$')


def module_name(path: Path, root: Path = ROOT) -> str:
    """Dotted module name of a source file (a package's ``__init__.py`` names the package)."""
    parts = list(path.relative_to(root).with_suffix('').parts)
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """{dotted name: path} of every module of the package below ``root``."""
    return {module_name(p, root): p for p in sorted((root / PACKAGE).rglob('*.py'))}


def imports(path: Path, name: str, known: dict[str, Path]) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) of every import in the file, lazy and
    TYPE_CHECKING ones included; relative imports resolved, ``from pkg import module``
    counted as an import of that module."""
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parent = package.split('.')[:len(package.split('.')) - (node.level - 1)]
                base = '.'.join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f'{base}.{alias.name}'
                if sub in known:
                    out.append((sub, [], node.lineno))
                else:
                    out.append((base, [alias.name], node.lineno))
    return out


def layer_of(name: str) -> str | None:
    """The core package of a module ('' for core's own modules), None outside core."""
    parts = name.split('.')
    if parts[:2] != [PACKAGE, 'core']:
        return None
    return parts[2] if len(parts) > 3 else ''


def core_arrows(root: Path = ROOT) -> dict[tuple[str, str], list[str]]:
    """{(from package, to package): ['module -> module Lline', ...]} between core packages."""
    known = modules(root)
    arrows: dict[tuple[str, str], list[str]] = {}
    for name, path in known.items():
        source = layer_of(name)
        for target, _, line in imports(path, name, known):
            dest = layer_of(target)
            if source is not None and dest is not None and dest != source:
                arrows.setdefault((source, dest), []).append(f'{name} -> {target} L{line}')
    return arrows


def find_cycle(edges: list[tuple[str, str]]) -> list[str] | None:
    """One cycle [a, b, ..., a] of the directed graph ``edges``, or None."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in graph.get(node, ()):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def layer_violations(root: Path = ROOT) -> list[str]:
    """Every import in core that is not to a lower layer (or a package not in LAYERS)."""
    out = []
    for (source, dest), where in sorted(core_arrows(root).items()):
        unknown = [p for p in (source, dest) if p not in LAYERS]
        if unknown:
            out.append(f'core package(s) {unknown} have no layer: add them to LAYERS '
                       f'({where[0]})')
        elif LAYERS[dest] >= LAYERS[source]:
            out += [f'{source or "core"} -> {dest or "core"} runs back: {w}' for w in where]
    return out


def ros_imports(root: Path = ROOT) -> list[str]:
    """Every import in core of a ROS package or of the claw_rl_ros layers above core."""
    known = modules(root)
    out = []
    for name, path in known.items():
        if layer_of(name) is None:
            continue
        for target, _, line in imports(path, name, known):
            top, parts = target.split('.')[0], target.split('.')
            above = parts[0] == PACKAGE and len(parts) > 1 and parts[1] in ABOVE_CORE
            if ROS_NAMES.match(top) or above:
                out.append(f'{name} L{line} imports {target}')
    return out


def private_imports(root: Path = ROOT, folders=(PACKAGE, 'test', 'bench', 'tools')) -> list[str]:
    """Every ``from claw_rl_ros... import _name`` in ``folders`` and, in the package, every
    ``module._name`` read through a name an import bound to a claw_rl_ros module."""
    known = modules(root)
    out = []
    for folder in folders:
        for path in sorted((root / folder).rglob('*.py')):
            name = module_name(path, root)
            found = imports(path, name, known)
            for target, names, line in found:
                for private in names:
                    if target.startswith(PACKAGE) and _private(private):
                        out.append(f'{name} L{line}: from {target} import {private}')
            if folder == PACKAGE:
                out += _private_attributes(path, name, known)
    return out


def _private(name: str) -> bool:
    return name.startswith('_') and not name.startswith('__')


def _private_attributes(path: Path, name: str, known: dict[str, Path]) -> list[str]:
    """``alias._x`` uses in a module, ``alias`` bound by ``from pkg import module [as alias]``
    or ``import claw_rl_ros.x as alias`` to one of the package's modules."""
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    tree = ast.parse(path.read_text(), str(path))
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parent = package.split('.')[:len(package.split('.')) - (node.level - 1)]
                base = '.'.join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                if f'{base}.{alias.name}' in known:
                    aliases[alias.asname or alias.name] = f'{base}.{alias.name}'
        elif isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names
                            if a.asname and a.name in known})
    return [f'{name} L{node.lineno}: {node.value.id}.{node.attr} ({aliases[node.value.id]})'
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in aliases and _private(node.attr)]


def test_the_parser_sees_the_arrows_it_checks():
    # A parser that found nothing would pass every test below.
    arrows = core_arrows()
    assert ('live', 'learning') in arrows and ('deploy', 'sim') in arrows
    assert ('learning', '') in arrows  # learning -> checkpoint -> core.config / core.io
    assert set(p for arrow in arrows for p in arrow) == set(LAYERS)


def test_core_imports_no_ros_and_nothing_above_core():
    # ament_index_python (a lookup with a fallback, no ROS graph) is the one ROS import allowed.
    assert ros_imports() == []


def test_core_arrows_run_one_way():
    assert layer_violations() == []


def test_no_import_cycle_between_core_packages():
    assert find_cycle(list(core_arrows())) is None


def test_no_private_name_imported_across_modules():
    assert private_imports() == []


def test_find_cycle_names_the_cycle():
    assert find_cycle([('a', 'b'), ('b', 'c'), ('c', 'a'), ('c', 'd')]) == ['a', 'b', 'c', 'a']
    assert find_cycle([('a', 'b'), ('b', 'c'), ('a', 'c')]) is None


@pytest.mark.parametrize('package, module, line, check, expected', [
    ('learning', 'ppo', 'from ..live import rollout_chunk', layer_violations,
     'learning -> live runs back: claw_rl_ros.core.learning.ppo -> '
     'claw_rl_ros.core.live.rollout_chunk'),
    ('sim', 'env', 'from ..deploy.export import export_onnx', layer_violations,
     'sim -> deploy runs back: claw_rl_ros.core.sim.env -> claw_rl_ros.core.deploy.export'),
    ('deploy', 'safety', '    import rclpy', ros_imports, 'claw_rl_ros.core.deploy.safety L'),
    ('sim', 'robot', 'from std_msgs.msg import String', ros_imports, 'imports std_msgs.msg'),
    ('learning', 'ppo', 'from ...nodes import ros_io', ros_imports,
     'imports claw_rl_ros.nodes.ros_io'),
    ('live', 'loop_actor', 'from ..learning.runner import _helper', private_imports,
     'from claw_rl_ros.core.learning.runner import _helper'),
    ('live', 'loop_actor', 'from ..learning import checkpoint as ckpt\nckpt._NAME',
     private_imports, 'ckpt._NAME (claw_rl_ros.core.learning.checkpoint)'),
])
def test_each_check_fails_on_a_planted_import(tmp_path, package, module, line, check,
                                              expected):
    # A copy of the package with one bad import planted: the check names it.
    copy = tmp_path / PACKAGE
    for path in (ROOT / PACKAGE).rglob('*.py'):
        target = copy / path.relative_to(ROOT / PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    planted = copy / 'core' / package / f'{module}.py'
    planted.write_text(planted.read_text() + f'\n\ndef _planted():\n{_indent(line)}\n')
    for folder in ('test', 'bench', 'tools'):
        (tmp_path / folder).mkdir()
    found = check(tmp_path)
    assert any(expected in f for f in found), found


def test_a_new_core_package_must_be_given_a_layer(tmp_path):
    copy = tmp_path / PACKAGE / 'core'
    for name, body in [('__init__.py', ''), ('config.py', ''), ('extra/__init__.py', ''),
                       ('extra/thing.py', 'from ..config import x\n')]:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_text(body)
    assert layer_violations(tmp_path)[0].startswith("core package(s) ['extra'] have no layer")


def test_a_planted_back_arrow_makes_a_cycle(tmp_path):
    copy = tmp_path / PACKAGE / 'core'
    for name, body in [('__init__.py', ''), ('sim/__init__.py', ''), ('learning/__init__.py', ''),
                       ('sim/env.py', 'from ..learning import ppo\n'),
                       ('learning/ppo.py', 'from ..sim import env\n')]:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_text(body)
    cycle = find_cycle(list(core_arrows(tmp_path)))
    assert cycle in (['learning', 'sim', 'learning'], ['sim', 'learning', 'sim'])


def _indent(text: str) -> str:
    return '\n'.join('    ' + t.strip() for t in text.split('\n'))
