"""The README's Layout section names every package and module of claw_rl_ros, so it cannot
drift from the tree (a module added, moved or renamed without its line fails here)."""

from pathlib import Path
import re

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'claw_rl_ros'


def layout_block() -> str:
    text = (ROOT / 'README.md').read_text()
    assert '## Layout\n\n```\n' in text, 'README.md has no "## Layout" code block'
    return text.split('## Layout\n\n```\n', 1)[1].split('```', 1)[0]


def test_every_module_and_package_is_named_in_the_readme_layout():
    block = layout_block()
    words = set(re.findall(r'[A-Za-z_][A-Za-z0-9_]*', block))
    modules = sorted(f for f in PACKAGE.rglob('*.py') if f.name != '__init__.py')
    missing = [str(f.relative_to(ROOT)) for f in modules if f.stem not in words]
    assert not missing, f'README Layout lacks {missing}: add each with its one-line purpose'
    packages = sorted(d for d in PACKAGE.rglob('*') if (d / '__init__.py').is_file())
    unnamed = [str(d.relative_to(ROOT)) for d in packages
               if d != PACKAGE and f'{d.name}/' not in block]
    assert not unnamed, f'README Layout lacks the packages {unnamed}'


def test_the_layout_names_nothing_that_is_gone():
    """Every ``claw_rl_ros/...`` path and every core sub-package the Layout lists exists."""
    block = layout_block()
    paths = re.findall(r'claw_rl_ros/[a-z_/]*[a-z_]', block)
    gone = [p for p in paths if not (ROOT / p).is_dir() and not (ROOT / f'{p}.py').is_file()]
    core = re.findall(r'^  ([a-z_]+)/', block, re.M)  # indented: sub-packages of core
    gone += [f'core/{name}' for name in core if not (PACKAGE / 'core' / name).is_dir()]
    assert paths and core and not gone, f'README Layout lists what does not exist: {gone}'
