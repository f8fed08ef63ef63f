"""The Layout section of docs/architecture.md names every package and module of claw_rl_ros,
so it cannot drift from the tree (a module added, moved or renamed without its line fails
here)."""

from pathlib import Path
import re

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'claw_rl_ros'
PAGE = ROOT / 'docs' / 'architecture.md'
LABEL = 'the Layout of docs/architecture.md'


def layout_block() -> str:
    text = PAGE.read_text()
    assert '## Layout\n\n```\n' in text, f'{PAGE} has no "## Layout" code block'
    return text.split('## Layout\n\n```\n', 1)[1].split('```', 1)[0]


def test_every_module_and_package_is_named_in_the_layout():
    block = layout_block()
    words = set(re.findall(r'[A-Za-z_][A-Za-z0-9_]*', block))
    modules = sorted(f for f in PACKAGE.rglob('*.py') if f.name != '__init__.py')
    missing = [str(f.relative_to(ROOT)) for f in modules if f.stem not in words]
    assert not missing, f'{LABEL} lacks {missing}: add each with its one-line purpose'
    packages = sorted(d for d in PACKAGE.rglob('*') if (d / '__init__.py').is_file())
    unnamed = [str(d.relative_to(ROOT)) for d in packages
               if d != PACKAGE and f'{d.name}/' not in block]
    assert not unnamed, f'{LABEL} lacks the packages {unnamed}'


def test_the_layout_names_nothing_that_is_gone():
    """Every ``claw_rl_ros/...`` path and every sub-package the Layout lists exists (an
    indented ``name/`` is a sub-package of the ``claw_rl_ros/...`` line above it)."""
    block = layout_block()
    paths = re.findall(r'claw_rl_ros/[a-z_/]*[a-z_]', block)
    gone = [p for p in paths if not (ROOT / p).is_dir() and not (ROOT / f'{p}.py').is_file()]
    parent, subs = None, []
    for line in block.split('\n'):
        if top := re.match(r'^(claw_rl_ros/[a-z_/]*[a-z_])', line):
            parent = top.group(1)
        elif (sub := re.match(r'^  ([a-z_]+)/', line)) and parent:
            subs.append(f'{parent}/{sub.group(1)}')
    gone += [s for s in subs if not (ROOT / s).is_dir()]
    assert paths and subs and not gone, f'{LABEL} lists what does not exist: {gone}'
