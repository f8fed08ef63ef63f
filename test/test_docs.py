"""The README and the docs site stay true: the site builds without a warning, every relative
link and image points at a file (and heading) that exists, every ``claw-rl`` command they show
parses with the real CLI, and the README stays a short front door.

The docs build needs ``sphinx`` and ``myst-parser`` (pinned in requirements.txt): without them
the test fails, it does not skip.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path
import re
import shlex
import subprocess
import sys

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / 'docs'
README = ROOT / 'README.md'
README_MAX_LINES = 250
README_MAX_COLUMNS = 300

FENCE = re.compile(r'^\s*(```|~~~)')
HEADING = re.compile(r'^(#{1,6})\s+(.*?)\s*#*\s*$')
LINK = re.compile(r'!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
INLINE_CODE = re.compile(r'(`+)(.+?)\1')
SCHEME = re.compile(r'^[a-z][a-z0-9+.-]*:', re.I)
# Info strings of the fenced blocks whose every line is a shell line.
SHELL_BLOCKS = {'bash', 'sh', 'shell', 'console', 'zsh'}
PLACEHOLDER = re.compile(r'<[^<>\s][^<>]*>')
# What ends a command on a shell line.
SHELL_OPERATORS = {'|', '||', '&&', ';', '&', '>', '>>', '<', '2>', '2>&1', '&>'}


def markdown_files() -> list[Path]:
    """README.md and every Markdown page of docs/ (not the build output)."""
    pages = [p for p in sorted(DOCS.rglob('*.md')) if '_build' not in p.parts]
    return [README, *pages]


def split_fences(text: str) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(the lines outside code fences, blanked inside them; (info string, lines) of each
    fenced block)."""
    prose, blocks, block, info = [], [], None, ''
    for line in text.split('\n'):
        match = FENCE.match(line)
        if match:
            if block is None:
                block, info = [], line.strip()[3:].strip()
            else:
                blocks.append((info, block))
                block = None
            prose.append('')
        elif block is not None:
            block.append(line)
            prose.append('')
        else:
            prose.append(line)
    return prose, blocks


def slug(title: str) -> str:
    """The anchor GitHub and MyST (``myst_heading_anchors``) give a heading's text."""
    text = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', title)
    text = text.replace('`', '').replace('*', '')
    return re.sub(r'[^\w\- ]', '', text.lower().replace(' ', '-'))


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, duplicates numbered as GitHub does."""
    seen: set[str] = set()
    for line in split_fences(path.read_text())[0]:
        match = HEADING.match(line)
        if match:
            base = slug(match[2])
            name, n = base, 1
            while name in seen:
                name, n = f'{base}-{n}', n + 1
            seen.add(name)
    return seen


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every link and image outside code (fenced or inline)."""
    out = []
    for number, line in enumerate(split_fences(path.read_text())[0], 1):
        line = INLINE_CODE.sub(lambda m: ' ' * len(m[0]), line)
        out += [(number, m[1]) for m in LINK.finditer(line)]
    return out


def shown(path: Path) -> str:
    """A path as the failure messages show it: relative to the repository when inside it."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return path.name


def broken_links(path: Path) -> list[str]:
    """Every relative link or image of ``path`` whose file or heading does not exist."""
    problems = []
    for number, target in links(path):
        if SCHEME.match(target):
            continue
        file_part, _, anchor = target.partition('#')
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f'{shown(path)}:{number}: {target}'
        if not dest.exists():
            problems.append(f'{where}: no such file')
        elif anchor and dest.suffix == '.md' and anchor not in anchors(dest):
            problems.append(f'{where}: no heading #{anchor} in {shown(dest)}')
        elif anchor and dest.suffix != '.md':
            problems.append(f'{where}: an anchor into a file that is not Markdown')
    return problems


def logical_lines(lines: list[str]) -> list[str]:
    """Shell lines with their ``\\`` continuations joined."""
    out, pending = [], ''
    for line in lines:
        if line.rstrip().endswith('\\'):
            pending += line.rstrip()[:-1] + ' '
        else:
            out.append(pending + line)
            pending = ''
    if pending:
        out.append(pending)
    return out


def claw_rl_argv(line: str) -> list[str] | None:
    """The arguments of the ``claw-rl`` command on a shell line (None: there is none).

    ``make ...`` lines are not claw-rl commands. The command ends at a comment or a shell
    operator; usage brackets (``[--teacher CKPT]``) and a closing ``...`` meaning "and so on"
    are dropped, so a synopsis parses as the full command it stands for. A placeholder in
    angle brackets is one value, spaces and all (``runs/<offline run>``).
    """
    line = PLACEHOLDER.sub(lambda m: m[0].replace(' ', '_'), line)
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote: not a shell line
        return None
    if not tokens or tokens[0] == 'make':
        return None
    starts = [i for i, t in enumerate(tokens) if t == 'claw-rl' or t.endswith('/claw-rl')]
    if not starts:
        return None
    argv = []
    for token in tokens[starts[0] + 1:]:
        if token in SHELL_OPERATORS or token.startswith(('>', '2>')):
            break
        if token.startswith('['):
            token = token[1:]
        if token.count(']') > token.count('['):
            token = token[:-1]
        if token:
            argv.append(token)
    if argv[-1:] == ['...'] and not (len(argv) > 1 and argv[-2].startswith('-')):
        argv = argv[:-1]  # "and so on", not the value of an option (--prompt '...')
    return argv


def commands(path: Path) -> list[tuple[str, list[str]]]:
    """(kind, argv) of every claw-rl command in code blocks ('block': every line of a shell
    block, ``$ `` lines of the others) and inline code ('inline')."""
    prose, blocks = split_fences(path.read_text())
    out = []
    for info, block in blocks:
        shell = info.split(' ')[0] in SHELL_BLOCKS
        for line in logical_lines(block):
            line = line.strip()
            if not shell and not line.startswith('$ '):
                continue  # a layout, a table, program output: no command unless prompted
            argv = claw_rl_argv(line.removeprefix('$ '))
            if argv is not None:
                out.append(('block', argv))
    for match in INLINE_CODE.finditer(' '.join(prose)):
        argv = claw_rl_argv(match[2].strip())
        if argv:  # a bare `claw-rl` or `bin/claw-rl` names the program
            out.append(('inline', argv))
    return out


def parse(argv: list[str]) -> str:
    """The CLI parser's error for ``argv`` ('' when it parses, ``--help`` included)."""
    from claw_rl_ros.cli import build_parser
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code:
            return err.getvalue().strip().splitlines()[-1]
    return ''


def parse_mention(argv: list[str]) -> str:
    """Like :func:`parse`, for inline code that may name a command or an option without the
    values it needs (`claw-rl verify`, `claw-rl up GRAPH`, `claw-rl train --set`): those are
    filled in, nothing else is."""
    for _ in range(6):
        error = parse(argv)
        required = re.search(r'the following arguments are required: (.*)$', error)
        one_of = re.search(r'one of the arguments (\S+) .* is required$', error)
        no_value = re.search(r'argument (\S+): expected (one|at least one) argument$', error)
        placeholder = re.search(r"invalid choice: '([A-Z][A-Z_]*)'", error)
        if placeholder:  # `claw-rl up GRAPH --help`: a sub-command named by its metavar
            return ''
        if no_value:
            option = no_value[1].split('/')[0]
            at = max(i for i, token in enumerate(argv) if token == option)
            argv = argv[:at + 1] + ['x'] + argv[at + 1:]
        elif required:
            names = [n.strip() for n in required[1].split(',')]
            if any(n.isupper() for n in names):  # a sub-command group named, not called
                return ''
            for name in names:
                argv = argv + ([name, 'x'] if name.startswith('-') else ['x'])
        elif one_of:
            argv = argv + [one_of[1], 'x']
        else:
            return error
    return error


def bad_commands(path: Path) -> list[str]:
    """Every claw-rl command of ``path`` the real parser refuses, with its error."""
    problems = []
    for kind, argv in commands(path):
        error = parse(argv) if kind == 'block' else parse_mention(argv)
        if error:
            problems.append(f'{shown(path)} ({kind}): claw-rl {shlex.join(argv)}: '
                            f'{error}')
    return problems


def build_docs(out: Path) -> subprocess.CompletedProcess:
    """sphinx-build of docs/ into ``out``, warnings as errors."""
    for module in ('sphinx', 'myst_parser'):
        if importlib.util.find_spec(module) is None:
            pytest.fail(f'{module} is not installed in {sys.prefix}: the docs cannot be built; '
                        'run make venv (requirements.txt pins sphinx and myst-parser)')
    command = [sys.executable, '-m', 'sphinx', '-W', '--keep-going', '-q', '-b', 'html',
               '-d', str(out / 'doctrees'), str(DOCS), str(out / 'html')]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.fixture(scope='module')
def site(tmp_path_factory) -> Path:
    """The built site's html folder (one build for the tests of this file)."""
    out = tmp_path_factory.mktemp('docs')
    result = build_docs(out)
    assert result.returncode == 0, f'sphinx-build -W failed:\n{result.stdout}{result.stderr}'
    return out / 'html'


def test_the_docs_build_without_a_warning(site):
    for page in ('index', 'getting_started', 'training', 'terrain', 'deploy', 'inspecting',
                 'porting', 'scale_out', 'benchmarks', 'changelog', 'architecture',
                 'config_reference', 'gateway', 'ppo_parity', 'sac_results'):
        assert (site / f'{page}.html').is_file(), f'docs/{page}.md was not built'


def test_the_config_reference_is_generated_from_the_dataclasses(site):
    """Every train, robot and node key shows on the built reference page."""
    from claw_rl_ros.core.learning.train_config import TrainConfig
    from claw_rl_ros.core.params.node_config import PARAMETERS
    page = (site / 'config_reference.html').read_text()
    expected = ['env.num_envs', 'ppo.desired_kl', 'distillation.alpha_final',
                'runner.selection.candidates', 'env.terrain.height_scan', 'default_joint_pos',
                'gait.period_s', 'verify.episodes']
    for cls in PARAMETERS.values():
        expected += [name for name in cls.__dataclass_fields__]
    expected += [name for name in TrainConfig.__dataclass_fields__]
    missing = [key for key in expected if f'>{key}<' not in page]
    assert not missing, f'the config reference lacks {missing}'


def test_every_relative_link_and_image_points_at_something_that_exists():
    problems = [p for path in markdown_files() for p in broken_links(path)]
    assert not problems, 'broken links:\n' + '\n'.join(problems)


def test_every_claw_rl_command_shown_parses_with_the_real_cli():
    found = {path: commands(path) for path in markdown_files()}
    assert sum(len(c) for c in found.values()) > 50, 'the command scan found almost nothing'
    problems = [p for path in found for p in bad_commands(path)]
    assert not problems, 'commands the CLI refuses:\n' + '\n'.join(problems)


def test_the_readme_is_a_front_door():
    lines = README.read_text().split('\n')
    assert len(lines) <= README_MAX_LINES, f'README.md has {len(lines)} lines; at most ' \
        f'{README_MAX_LINES}: move detail to a docs/ page'
    long = [n for n, line in enumerate(lines, 1) if len(line) > README_MAX_COLUMNS]
    assert not long, f'README.md lines over {README_MAX_COLUMNS} characters: {long}'
    text = README.read_text()
    assert 'make train' in text and 'make test' in text and 'docs/gait.png' in text


def test_the_link_and_command_checks_catch_what_they_are_for(tmp_path):
    """The checks themselves, on planted breaks."""
    page = tmp_path / 'page.md'
    page.write_text('# Title\n\n## A heading\n\n[ok](#a-heading) [gone](#no-heading)\n'
                    '[missing](nowhere.md) ![img](nothing.png) `[not a link](x.md)`\n'
                    '```bash\n.venv/bin/claw-rl eval --model m.onnx \\\n  --no-such-flag\n```\n'
                    '`claw-rl verify` `claw-rl train --set` `make train TRAIN_ARGS=x`\n'
                    '`claw-rl verify --modle x.onnx` `claw-rl up GRAPH --help`\n')
    problems, bad = broken_links(page), bad_commands(page)
    assert [p.split(': ', 1)[1] for p in problems] == [
        '#no-heading: no heading #no-heading in page.md', 'nowhere.md: no such file',
        'nothing.png: no such file'], problems
    assert len(bad) == 2 and 'unrecognized arguments: --no-such-flag' in bad[0] \
        and 'unrecognized arguments: --modle x.onnx' in bad[1], bad
