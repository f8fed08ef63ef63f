"""Docstrings point at what exists: every Sphinx cross-reference to one of the package's objects
(``:class:`~..core.params.node_config.SimParams```, ``:func:`claw_rl_ros.x.f```, relative or
absolute) names a module that exists and, in it, the object it names.

A module is read, not imported (its top-level classes, functions, assignments and imports, and
a class's own methods and attributes), so the check needs no ROS and no ``launch``.
"""

from __future__ import annotations

import ast
from pathlib import Path
import re

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = 'claw_rl_ros'
ROLE = re.compile(r':(?:class|func|meth|mod|data|attr|exc):`~?([\w.]+)`')


def module_path(name: str, root: Path) -> Path | None:
    """The source file of a dotted module name of the package, None if there is none."""
    base = root.joinpath(*name.split('.'))
    for path in (base.with_suffix('.py'), base / '__init__.py'):
        if path.is_file():
            return path
    return None


def names_in(node: ast.AST) -> dict[str, ast.AST]:
    """{name: node} of what a module or class body defines or imports."""
    out: dict[str, ast.AST] = {}
    for item in getattr(node, 'body', []):
        if isinstance(item, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            out[item.name] = item
        elif isinstance(item, (ast.Import, ast.ImportFrom)):
            out.update({(a.asname or a.name).split('.')[0]: item for a in item.names})
        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        out[leaf.id] = item
        elif isinstance(item, (ast.If, ast.Try)):
            out.update(names_in(item))
    return out


def resolves(ref: str, root: Path) -> bool:
    """A dotted reference names a module of the package, or an object defined in one."""
    parts = ref.split('.')
    for cut in range(len(parts), 0, -1):
        path = module_path('.'.join(parts[:cut]), root)
        if path is None:
            continue
        node: ast.AST = ast.parse(path.read_text(), str(path))
        for attr in parts[cut:]:
            found = names_in(node).get(attr)
            if found is None:
                # An attribute set in a method (self.x = ...) or a dataclass field.
                return isinstance(node, ast.ClassDef) and any(
                    isinstance(n, ast.Attribute) and n.attr == attr for n in ast.walk(node))
            node = found
        return True
    return False


def broken_references(root: Path = ROOT) -> list[str]:
    """``file:line: reference`` for every cross-reference to the package that does not
    resolve (bare names, which Sphinx reads in the current scope, are not checked)."""
    out = []
    for path in sorted((root / PACKAGE).rglob('*.py')):
        parts = list(path.relative_to(root).with_suffix('').parts)
        package = '.'.join(parts[:-1])
        text = path.read_text()
        for match in ROLE.finditer(text):
            ref = match.group(1)
            if ref.startswith('.'):
                dots = len(ref) - len(ref.lstrip('.'))
                base = package.split('.')
                ref = '.'.join(base[:len(base) - (dots - 1)] + [ref[dots:]])
            elif not ref.startswith(f'{PACKAGE}.'):
                continue
            if not resolves(ref, root):
                line = text.count('\n', 0, match.start()) + 1
                out.append(f'{path.relative_to(root)}:{line}: {match.group(0)} ({ref})')
    return out


def test_every_docstring_reference_names_what_exists():
    assert broken_references() == []


def test_the_check_sees_references_and_finds_a_planted_stale_one(tmp_path):
    # The check reads the references it should: a stale path planted in a copy is named.
    copy = tmp_path / PACKAGE
    for path in (ROOT / PACKAGE).rglob('*.py'):
        target = copy / path.relative_to(ROOT / PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(path.read_text())
    node = copy / 'nodes' / 'sim' / 'sim_node.py'
    node.write_text(node.read_text()
                    + '\n"""See :class:`~..core.deploy.node_config.SimParams`."""\n'
                    '"""And :meth:`~..core.params.node_config.SimParams.nothing_here`."""\n')
    found = broken_references(tmp_path)
    assert len(found) == 2 and all('nodes/sim/sim_node.py' in f for f in found), found
    assert resolves('claw_rl_ros.core.params.node_config.SimParams', ROOT)
    assert resolves('claw_rl_ros.core.control.policy_controller.PolicyController.on_imu', ROOT)
