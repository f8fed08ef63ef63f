"""``claw-rl gateway check``: the same prompt to the teacher and the student model, side by side.

Exit status: 0 when both models answered, 1 when a call failed (both results are still shown),
2 for a configuration problem (nothing was sent). Errors are one message plus a fix on stderr,
never a traceback, and the key only ever appears masked.
"""

from __future__ import annotations

import argparse
from http import HTTPStatus
import itertools
import logging
import shutil
import sys
import textwrap
from typing import Optional, TextIO, TYPE_CHECKING, Union

from .errors import GatewayError, Redactor, show
from .gateway_config import CONFIG_ENV_VAR, GatewayConfig, KEY_ENV_VARS, load_gateway_config

if TYPE_CHECKING:
    from .client import ChatReply, GatewayClient

DEFAULT_PROMPT = ('In one sentence: what does a quadruped robot need to sense to keep its '
                  'balance while walking?')
ANSWER_LIMIT = 400
_PREFIX = 'claw-rl gateway'
_LABEL_WIDTH = 9

_EPILOG = f'''\
config lookup: --config FILE, else ${CONFIG_ENV_VAR}, else config/llm_gateway.{{json,toml,yaml}}
in the current folder, else ~/.config/claw_rl_ros/llm_gateway.{{json,toml,yaml}}.
The key: {KEY_ENV_VARS[0]} wins over {KEY_ENV_VARS[1]}, which wins over api_key in the file:
  export {KEY_ENV_VARS[0]}=<your key>
  claw-rl gateway check --prompt 'Say hello in five words.'
exit status: 0 both answered, 1 a call failed, 2 configuration problem.'''


# One model's outcome: its reply, or the error that ended the call.
Outcome = Union['ChatReply', GatewayError]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``gateway`` (with its ``check`` sub-command) on the claw-rl parser."""
    gateway = subparsers.add_parser(
        'gateway', help='check an OpenAI-compatible LLM gateway (one key, teacher and student)',
        description='Talk to an OpenAI-compatible LLM gateway with one unified key.')
    commands = gateway.add_subparsers(dest='gateway_command', required=True,
                                      metavar='SUBCOMMAND')
    check = commands.add_parser(
        'check', help='send one prompt to the teacher and the student model and compare',
        description='Send the same prompt to the teacher and the student model and print both '
        'answers side by side with HTTP status and latency.', epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument('--config', metavar='FILE',
                       help='gateway config (.json, .toml or .yaml); see the lookup order below')
    what = check.add_mutually_exclusive_group()
    what.add_argument('--prompt', metavar='TEXT',
                      help='prompt to send (with --observation: the question at its end)')
    what.add_argument('--prompt-file', metavar='FILE', help='read the prompt from a file')
    check.add_argument('--observation', action='store_true',
                       help='send a summary of a robot observation instead of a text prompt')
    check.add_argument('--model', metavar='ONNX',
                       help='with --observation: take the robot spec from this exported model')
    check.add_argument('--state', metavar='JSON',
                       help='with --observation: a recorded observation (list of obs_dim '
                       'numbers, or {term: values}); default: a short simulation')
    check.add_argument('--robot', metavar='NAME',
                       help='with --observation: robot config name or YAML path '
                       '(default: claw_quadruped, or the robot named by --model)')
    check.add_argument('--steps', type=int, default=25, metavar='N',
                       help='with --observation and no --state: control steps to simulate')
    check.add_argument('--seed', type=int, default=0, help='seed of the simulated state')
    check.add_argument('--teacher', metavar='MODEL_ID', help='override teacher_model')
    check.add_argument('--student', metavar='MODEL_ID', help='override student_model')
    check.add_argument('--timeout', type=float, metavar='SECONDS',
                       help='override timeout (seconds per attempt: connect, wait and body)')
    check.add_argument('--full', action='store_true',
                       help=f'print whole answers (default: cut at {ANSWER_LIMIT} characters)')
    check.add_argument('--show-prompt', action='store_true', help='print the prompt sent')
    check.set_defaults(func=run_check)


def run_check(args: argparse.Namespace, out: Optional[TextIO] = None,
              err: Optional[TextIO] = None) -> int:
    """The ``gateway check`` command; returns the exit status.

    Everything it prints, log records and warnings included, goes through one :class:`Output`.
    """
    output = Output(sys.stdout if out is None else out, sys.stderr if err is None else err)
    handler, root = _LogLines(output), logging.getLogger()
    root.addHandler(handler)
    logging.captureWarnings(True)
    try:
        return _check(args, output)
    except Exception as exc:  # noqa: BLE001 - a bug must not print a traceback with secrets
        _print_error(output, GatewayError(f'unexpected {type(exc).__name__}: {exc}',
                                          'please report this as a claw-rl bug'))
        return 1
    finally:
        logging.captureWarnings(False)
        root.removeHandler(handler)


def _check(args: argparse.Namespace, output: 'Output') -> int:
    try:
        config = load_gateway_config(args.config, learn=output.learn)
        output.learn(config.api_key)
        config = config.with_overrides(teacher_model=args.teacher, student_model=args.student,
                                       timeout=args.timeout)
        prompt, prompt_source = build_prompt(args)
    except GatewayError as exc:
        _print_error(output, exc)
        return exc.exit_code
    for warning in config.warnings:
        output.print(f'{_PREFIX}: warning: {warning}', err=True)
    _print_header(output, config, prompt, prompt_source, args.show_prompt)
    results = run_both(config, prompt, output)
    print_results(output, results, full=args.full)
    failed = [(role, model, o) for role, model, o in results if isinstance(o, GatewayError)]
    for role, model, error in failed:
        _print_error(output, error, f'{role} ({model}) failed: ')
    output.print('result: ' + (' and '.join(r for r, _, _ in failed) + ' failed' if failed
                               else 'both models answered'))
    return 1 if failed else 0


class Output:
    """The one way out: every line is masked and made safe for a terminal before it is written.

    It learns secrets (keys, URL credentials and query values) as soon as they are read, before
    any validation can print; :meth:`clean` masks every form of them, then escapes control
    characters and lone surrogates; :meth:`print` writes in the stream's encoding, never failing.
    """

    def __init__(self, out: TextIO, err: TextIO):
        self.out, self.err = out, err
        self.redact = Redactor()
        self.learn = self.redact.learn

    def clean(self, text: object) -> str:
        return show(self.redact(str(text)))

    def print(self, text: object = '', err: bool = False) -> None:
        stream = self.err if err else self.out
        encoding = getattr(stream, 'encoding', None) or 'utf-8'
        stream.write(self.clean(text).encode(encoding, 'backslashreplace').decode(encoding)
                     + '\n')
        stream.flush()


class _LogLines(logging.Handler):
    """Log records (e.g. urllib3 on a malformed header) as one masked line, no traceback."""

    def __init__(self, output: Output):
        super().__init__(logging.WARNING)
        self.output = output

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.output.print(f'{_PREFIX}: {record.levelname.lower()}: {record.getMessage()}',
                              err=True)
        except Exception:  # noqa: BLE001 - logging must never break the command
            pass


def build_prompt(args: argparse.Namespace) -> tuple[str, str]:
    """Return (prompt, where it came from) from --prompt, --prompt-file or --observation."""
    from .errors import GatewayConfigError
    if not args.observation and (args.model or args.state or args.robot):
        raise GatewayConfigError('--model, --state and --robot only apply with --observation',
                                 'add --observation, or drop them')
    if args.steps < 0:
        raise GatewayConfigError(f'--steps is {args.steps}', 'give 0 or more control steps')
    question = args.prompt
    if args.prompt_file:
        try:
            with open(args.prompt_file, encoding='utf-8') as handle:
                question = handle.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise GatewayConfigError(f'--prompt-file {args.prompt_file} cannot be read ({exc})',
                                     'pass a readable UTF-8 text file') from None
    if question is not None and not question.strip():
        raise GatewayConfigError('the prompt is empty', 'pass a non-empty --prompt')
    if args.observation:
        from .observation import observation_prompt
        return observation_prompt(model=args.model, state=args.state, robot=args.robot,
                                  steps=args.steps, seed=args.seed, question=question)
    if question is None:
        return DEFAULT_PROMPT, 'built-in test prompt'
    return question, 'text prompt'


def run_both(config: GatewayConfig, prompt: str,
             output: Output) -> list[tuple[str, str, Outcome]]:
    """Ask the teacher, then the student: (role, model id, outcome) for each."""
    from .client import GatewayClient

    def on_retry(model: str, status: int, attempt: int, delay: float) -> None:
        output.print(f'{_PREFIX}: {model}: HTTP {status}, retry {attempt}/'
                     f'{config.max_attempts} in {delay:.2f} s', err=True)

    with GatewayClient(config, on_retry=on_retry) as client:
        return [(role, model, call_model(client, role, model, prompt)) for role, model in
                (('teacher', config.teacher_model), ('student', config.student_model))]


def call_model(client: 'GatewayClient', role: str, model: str, prompt: str) -> Outcome:
    """One chat call; every failure comes back as a GatewayError (none escapes)."""
    try:
        return client.chat(model, prompt, role=f'{role}_model')
    except GatewayError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - a bug must not print a traceback
        return GatewayError(f'{model}: unexpected {type(exc).__name__}: {exc}',
                            'please report this as a claw-rl bug')


# ----------------------------------------------------------------------------------- output
def _print_header(output: Output, config: GatewayConfig, prompt: str, prompt_source: str,
                  show_prompt: bool) -> None:
    first = prompt.strip().splitlines()[0] if prompt.strip() else ''
    lines = prompt.count('\n') + 1
    shown = first if len(first) <= 100 else first[:97] + '...'
    extra = f' ({lines} lines; --show-prompt prints it all)' if lines > 1 and not show_prompt \
        else ''
    rows = [('endpoint', f'POST {config.chat_url}'), ('config', config.source),
            ('key', f'{config.masked_key} (from {config.key_source})'),
            ('timeout', f'{config.timeout:g} s per attempt (connect, wait and body); '
                        f'{config.max_attempts} attempts and the waits between them: at most '
                        f'{config.worst_case_s:g} s per model'),
            ('prompt', f'{prompt_source}{extra}')]
    for label, value in rows:
        output.print(f'{label:<{_LABEL_WIDTH}}{value}')
    if show_prompt:
        output.print(textwrap.indent(prompt, '  | '))
    else:
        output.print(f'{"":<{_LABEL_WIDTH}}{shown!r}')
    output.print()


def _cells(outcome: Outcome, full: bool) -> list[str]:
    """The status, latency and answer cells of one outcome."""
    status, latency = outcome.status, outcome.latency_s
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ''
    cells = ['no HTTP answer' if status is None else f'{status} {phrase}'.strip(),
             '-' if latency is None else f'{latency * 1000:.0f} ms'
             + (f' ({outcome.attempts} attempts)' if outcome.attempts > 1 else '')]
    if isinstance(outcome, GatewayError):
        return cells + [f'FAILED: {type(outcome).__name__} (details below)']
    text = outcome.content
    if not full and len(text) > ANSWER_LIMIT:
        text = text[:ANSWER_LIMIT].rstrip() + f' ... [{len(outcome.content)} chars; --full]'
    return cells + [text]


def print_results(output: Output, results: list[tuple[str, str, Outcome]], full: bool = False,
                  width: Optional[int] = None) -> None:
    """Two aligned columns: role, model id, HTTP status, latency and answer."""
    width = width or max(80, min(160, shutil.get_terminal_size((100, 24)).columns))
    column = (width - _LABEL_WIDTH - 3) // 2
    cells = [_cells(outcome, full) for _, _, outcome in results]
    rows = [('', [r[0] for r in results]), ('model', [r[1] for r in results])]
    rows += [(label, [c[i] for c in cells]) for i, label in
             enumerate(('status', 'latency', 'answer'))]
    for label, texts in rows:
        # cleaned before wrapping, so that no secret is cut in two and escapes stay whole
        wrapped = [_wrap(output.clean(text), column) for text in texts]
        for index, parts in enumerate(itertools.zip_longest(*wrapped, fillvalue='')):
            output.print((f'{label if index == 0 else "":<{_LABEL_WIDTH}}'
                          + ' | '.join(f'{p:<{column}}' for p in parts)).rstrip())
    output.print()


def _wrap(text: str, width: int) -> list[str]:
    lines: list[str] = []
    for paragraph in text.splitlines() or ['']:
        lines += textwrap.wrap(paragraph, width, break_long_words=True,
                               break_on_hyphens=False) or ['']
    return lines


def _print_error(output: Output, exc: GatewayError, prefix: str = '') -> None:
    output.print(f'{_PREFIX}: error: {prefix}{exc.message}', err=True)
    if exc.hint:
        output.print(f'  fix: {exc.hint}', err=True)
