"""The import map of ``claw_rl_ros`` read from the source (``ast``; nothing is imported, no ROS).

``core/`` is layered, low to high: its own modules (config, paths, math_utils, io,
wire_format) <- sim <- learning <- export <- evaluation | control <- verify | replay <- params
| sysid <- live (packages of one layer do not import each other). A core package imports only
lower layers (and its own modules), never rclpy or a ROS message package, and never nodes/,
commands/, launch_graph/, gateway/ or the CLI, which import core freely. No module imports
another module's private (``_x``) name. No package has an import cycle among its modules, and
the packages have none among themselves; in ``core/`` and ``nodes/`` every import of the
package's own modules is at module level (a circle held apart by an import inside a function
is still a circle). The CLI's lazy dispatch to its sub-commands (``cli.py``, ``commands/``)
keeps ``claw-rl --help`` fast and may import inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path
import re

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = 'claw_rl_ros'
# Layer of each core package ('' = the modules directly in core/): imports go to lower ones.
LAYERS = {'': 0, 'sim': 1, 'learning': 2, 'export': 3, 'evaluation': 4, 'control': 4,
          'verify': 5, 'replay': 5, 'params': 6, 'sysid': 6, 'live': 7}
# claw_rl_ros packages above core: they may import core, core may not import them.
ABOVE_CORE = ('nodes', 'commands', 'launch_graph', 'gateway', 'cli')
# Folders whose modules import the package's own modules at module level only.
NO_LAZY_IMPORTS = ('core', 'nodes')
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


def package_of(name: str, known: dict[str, Path]) -> str:
    """The package a module sits in (a package's ``__init__`` sits in that package)."""
    return name if known[name].name == '__init__.py' else name.rpartition('.')[0]


def module_edges(root: Path = ROOT) -> list[tuple[str, str]]:
    """(importer, imported) for every import of one of the package's modules by another."""
    known = modules(root)
    return sorted({(name, target) for name, path in known.items()
                   for target, _, _ in imports(path, name, known)
                   if target in known and target != name})


def package_cycles(root: Path = ROOT) -> list[str]:
    """A cycle among the modules of each package, and one among the packages (an arrow from
    package A to package B for each import of a module of B by a module of A, a package's
    ``__init__`` counted in it; a sub-package's arrows to its parent are arrows too)."""
    known = modules(root)
    edges = module_edges(root)
    out = []
    for package in sorted({package_of(n, known) for n in known}):
        inside = [(a, b) for a, b in edges
                  if package_of(a, known) == package == package_of(b, known)]
        if cycle := find_cycle(inside):
            out.append(f'inside {package}: {" -> ".join(cycle)}')
    between = sorted({(package_of(a, known), package_of(b, known)) for a, b in edges
                      if package_of(a, known) != package_of(b, known)
                      and not package_of(a, known).startswith(package_of(b, known) + '.')
                      and not package_of(b, known).startswith(package_of(a, known) + '.')})
    if cycle := find_cycle(between):
        out.append(f'between packages: {" -> ".join(cycle)}')
    return out


def lazy_imports(root: Path = ROOT, folders=NO_LAZY_IMPORTS) -> list[str]:
    """Every import of one of the package's modules inside a function (or a method) in
    ``folders`` (relative to the package)."""
    known = modules(root)
    out = []
    for folder in folders:
        for path in sorted((root / PACKAGE / folder).rglob('*.py')):
            name = module_name(path, root)
            tree = ast.parse(path.read_text(), str(path))
            for func in ast.walk(tree):
                if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    continue
                for node in ast.walk(func):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        own = [t for t, _, _ in imports_of(node, path, name, known)
                               if t.split('.')[0] == PACKAGE]
                        out += [f'{name} L{node.lineno} imports {t} inside a function'
                                for t in own]
    return sorted(set(out))


def imports_of(node: ast.AST, path: Path, name: str,
               known: dict[str, Path]) -> list[tuple[str, list[str], int]]:
    """:func:`imports` of one import statement."""
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    if isinstance(node, ast.Import):
        return [(alias.name, [], node.lineno) for alias in node.names]
    base = node.module or ''
    if node.level:
        parent = package.split('.')[:len(package.split('.')) - (node.level - 1)]
        base = '.'.join(parent + ([node.module] if node.module else []))
    return [(f'{base}.{a.name}', [], node.lineno) if f'{base}.{a.name}' in known
            else (base, [a.name], node.lineno) for a in node.names]


def test_the_parser_sees_the_arrows_it_checks():
    # A parser that found nothing would pass every test below.
    arrows = core_arrows()
    assert ('live', 'learning') in arrows and ('control', 'sim') in arrows
    assert ('learning', '') in arrows  # learning -> checkpoint -> core.config / core.io
    assert set(p for arrow in arrows for p in arrow) == set(LAYERS)


def test_core_imports_no_ros_and_nothing_above_core():
    # ament_index_python (a lookup with a fallback, no ROS graph) is the one ROS import allowed.
    assert ros_imports() == []


def test_core_arrows_run_one_way():
    assert layer_violations() == []


def test_no_import_cycle_between_core_packages():
    assert find_cycle(list(core_arrows())) is None


def test_no_import_cycle_inside_or_between_any_packages():
    assert package_cycles() == []


def test_no_import_of_own_modules_inside_functions_in_core_and_nodes():
    assert lazy_imports() == []


def test_the_graph_checks_see_imports():
    # Parsers that found nothing would pass the two tests above.
    edges = module_edges()
    assert ('claw_rl_ros.core.sim.robot', 'claw_rl_ros.core.sim.scene') in edges
    assert ('claw_rl_ros.nodes.policy.policy_node', 'claw_rl_ros.nodes.ros_io') in edges
    assert lazy_imports(folders=('commands',)), 'the CLI\'s lazy dispatch is not seen'


def test_no_private_name_imported_across_modules():
    assert private_imports() == []


def test_find_cycle_names_the_cycle():
    assert find_cycle([('a', 'b'), ('b', 'c'), ('c', 'a'), ('c', 'd')]) == ['a', 'b', 'c', 'a']
    assert find_cycle([('a', 'b'), ('b', 'c'), ('a', 'c')]) is None


@pytest.mark.parametrize('package, module, line, check, expected', [
    ('learning', 'ppo', 'from ..live import rollout_chunk', layer_violations,
     'learning -> live runs back: claw_rl_ros.core.learning.ppo -> '
     'claw_rl_ros.core.live.rollout_chunk'),
    ('sim', 'env', 'from ..export.onnx_export import export_onnx', layer_violations,
     'sim -> export runs back: claw_rl_ros.core.sim.env -> claw_rl_ros.core.export.onnx_export'),
    ('control', 'safety', 'from ..evaluation import evaluator', layer_violations,
     'control -> evaluation runs back'),
    ('control', 'safety', '    import rclpy', ros_imports, 'claw_rl_ros.core.control.safety L'),
    ('sim', 'terrain', 'from .robot import load_robot', lazy_imports,
     'claw_rl_ros.core.sim.terrain L'),
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


@pytest.mark.parametrize('files, expected', [
    # A circle inside a package, held apart by an import inside a function.
    ({'core/sim/robot.py': 'def load():\n    from .scene import build\n',
      'core/sim/scene.py': 'from .robot import load\n'},
     'inside claw_rl_ros.core.sim: claw_rl_ros.core.sim.'),
    # A circle inside nodes/.
    ({'nodes/a_io.py': 'from . import b_io\n', 'nodes/b_io.py': 'from .a_io import x\n'},
     'inside claw_rl_ros.nodes: claw_rl_ros.nodes.'),
    # A circle between packages outside core (core's layers are checked above).
    ({'nodes/a_io.py': 'from ..launch_graph import graphs\n',
      'launch_graph/graphs.py': 'from ..nodes import a_io\n'},
     'between packages: claw_rl_ros.'),
])
def test_a_planted_cycle_is_found(tmp_path, files, expected):
    copy = tmp_path / PACKAGE
    for name, body in {'__init__.py': '', 'core/__init__.py': '', 'core/sim/__init__.py': '',
                       'nodes/__init__.py': '', 'launch_graph/__init__.py': '',
                       **files}.items():
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        (copy / name).write_text(body)
    found = package_cycles(tmp_path)
    assert any(f.startswith(expected) for f in found), found


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
