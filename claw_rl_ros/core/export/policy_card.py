"""The policy card: a human-readable page beside an exported model (``student.card.md``).

Everything on it is read back from the model file itself (the embedded robot spec and export
metadata) and, when present, from the verification record beside it
(``student.verify.json``, written by ``claw-rl verify``): robot, joint order with pose,
limits and gains, observation layout and scales, control period, action scale and clip,
training run, the terrain it was trained on (the export metadata's ``terrain``: the train
config's ``env.terrain``) and verified on (the record's flat table and terrain rows),
verification results, the reality-gap cells (``student.transfer.json``, written by ``claw-rl
verify --suite transfer``), how a robot's drives got the gains (``student.drive.json``, written
by the policy node's self-check: sent with every command, or declared and within tolerance or
not), sha256. Regenerate it after a verification with :func:`write_policy_card` (the self-check
does, when the card is there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..io import atomic_write_bytes
from .drive_record import drive_path, read_drive_record
from .onnx_policy import OnnxPolicy
from .verification_record import read_verification

RUN_KEYS = ('checkpoint', 'iteration', 'total_steps', 'algorithm', 'run')


def card_path(model: str | Path) -> Path:
    """``runs/x/student.onnx`` -> ``runs/x/student.card.md``."""
    return Path(model).with_suffix('.card.md')


def transfer_path(model: str | Path) -> Path:
    """``runs/x/student.onnx`` -> ``runs/x/student.transfer.json`` (the transfer suite's
    record, core/verify/transfer_suite.py)."""
    return Path(model).with_suffix('.transfer.json')


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f'{value:.6g}'
    if isinstance(value, list):
        return ', '.join(_fmt(v) for v in value)
    return str(value)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    return lines + ['| ' + ' | '.join(_fmt(v) for v in row) + ' |' for row in rows]


def _joints(spec: dict[str, Any]) -> list[str]:
    keys = ('default_joint_pos', 'joint_lower', 'joint_upper', 'kp', 'kd', 'effort_limit')
    rows = [[i, name, *(spec.get(k, ['?'] * (i + 1))[i] for k in keys)]
            for i, name in enumerate(spec['joint_names'])]
    return _table(['#', 'joint', 'default [rad]', 'lower [rad]', 'upper [rad]',
                   'Kp [N m/rad]', 'Kd [N m s/rad]', 'effort [N m]'], rows)


def _observation(spec: dict[str, Any]) -> list[str]:
    rows, start = [], 0
    for term in spec.get('observation', []):
        size = int(term['size'])
        scales = sorted(set(term['scale']))
        rows.append([term['name'], f'[{start}:{start + size}]', size,
                     _fmt(scales[0]) if len(scales) == 1 else _fmt(term['scale'])])
        start += size
    return _table(['term', 'slice', 'size', 'scale'], rows)


def _verification(model: Path, sha256: str) -> list[str]:
    try:
        found = read_verification(model)
    except ValueError as exc:
        return [f'Unreadable verification record: {exc}']
    if found is None:
        return ['Not verified: no verification record beside the model. Run `claw-rl verify '
                f'--model {model.name}`; the deploy graph refuses RL until a passing one '
                'exists.']
    path, record = found
    other = str(record.get('model_sha256'))[:12]
    same = 'yes' if record.get('model_sha256') == sha256 else \
        f'NO: it verifies another model (sha256 {other})'
    lines = [f'- record: `{path.name}`, created {record.get("created", "?")}',
             f'- result: **{"PASSED" if record.get("passed") is True else "FAILED"}**',
             f'- for this model: {same}']
    table = record.get('table') or []
    if table and all(isinstance(row, dict) for row in table):
        header = list(dict.fromkeys(k for row in table for k in row))
        lines += [''] + _table(header, [[row.get(k, '') for k in header] for row in table])
    return lines


def _transfer(model: Path, sha256: str) -> list[str]:
    """The reality-gap section: each cell's vx error, falls and verdict."""
    path = transfer_path(model)
    if not path.is_file():
        return [f'Not measured: `claw-rl verify --suite transfer --model {model.name}` runs '
                'the student under one model error at a time.']
    try:
        record = json.loads(path.read_text())
        cells = [c for c in record['cells'] if isinstance(c, dict)]
        rows = [[c.get('family'), c.get('level'), 'n/a' if c.get('vx_error') is None else
                 f'{float(c["vx_error"]):.3f}', f'{c.get("falls")}/{c.get("episodes")}',
                 'PASS' if c.get('passed') is True else
                 'FAIL: ' + '; '.join(str(f) for f in c.get('failed') or [])] for c in cells]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f'Unreadable transfer record `{path.name}` ({exc}); re-run `claw-rl verify '
                '--suite transfer`']
    same = 'yes' if record.get('model_sha256') == sha256 else \
        f'NO: it measured another model (sha256 {str(record.get("model_sha256"))[:12]})'
    failed = sum(c.get('passed') is not True for c in cells)
    lines = [f'- record: `{path.name}`, created {record.get("created", "?")}: '
             f'{record.get("episodes", "?")} episode(s) of {record.get("episode_s", "?")} s '
             f'per cell at {record.get("command_vx", "?")} m/s, seed {record.get("seed", "?")}',
             f'- result: **{"PASSED" if record.get("passed") is True else "FAILED"}** '
             f'({len(cells) - failed} of {len(cells)} cells pass)',
             f'- for this model: {same}', '']
    return lines + _table(['family', 'level', 'vx error [m/s]', 'falls', 'result'], rows)


def _gains(values: Any) -> str:
    """Declared gains: one number when every joint has it, else the list."""
    if isinstance(values, list) and values and all(v == values[0] for v in values):
        return _fmt(values[0])
    return f'[{_fmt(values)}]' if isinstance(values, list) else '?'


def _drive(model: Path, sha256: str) -> list[str]:
    """The drive-gains section: how a robot's drives got the gains above at its last
    self-check (``<stem>.drive.json``), or that none checked them yet."""
    try:
        record = read_drive_record(model)
    except ValueError as exc:
        return [f'Unreadable drive-gains record: {exc}']
    if record is None:
        return ['Not checked on a robot yet: before RL the deploy graph\'s self-check checks '
                'that the gains above are sent with every command (`gains_source: sent`) or '
                'that the drives\' declared ones (`drive_kp`, `drive_kd`) are within '
                f'`gain_tolerance` of them, and writes `{drive_path(model).name}` '
                '(docs/deploy.md, "Drive gains").']
    verdict, tolerance = record.get('verdict'), record.get('tolerance', '?')
    tol = f'{float(tolerance) * 100:g} %' if isinstance(tolerance, (int, float)) else '?'
    if record.get('source') == 'sent':
        heard = '' if verdict == 'sent' else ': nothing subscribed, RL refused'
        text = f'sent with every command (the Kp / Kd above on `{record.get("topic", "?")}`, ' \
            f'Kp = 0 in PASSIVE){heard}'
    elif verdict == 'not declared':
        text = 'not declared and not sent: RL refused'
    else:
        state = f'within tolerance {tol}' if verdict == 'within' else \
            f'differs by more than {tol}: RL refused'
        text = f'declared: Kp {_gains(record.get("kp"))}, Kd {_gains(record.get("kd"))} ' \
            f'({state})'
    same = 'yes' if record.get('model_sha256') == sha256 else \
        f'NO: it checked another model (sha256 {str(record.get("model_sha256"))[:12]})'
    problems = record.get('problems') if isinstance(record.get('problems'), list) else []
    return [f'- drive gains: {text}',
            f'- checked by `{record.get("node", "?")}`, {record.get("created", "?")}; for this '
            f'model: {same}', *(f'- {p}' for p in problems)]


# How the flat, stairs and obstacle tiles were built (env.terrain.collision).
_GROUND = {'heightfield': 'heightfield ramps (one cell wide)', 'boxes': 'boxes (vertical risers)'}


def _trained_on(meta: dict[str, str]) -> str:
    """The ground of the training run, from the export metadata's ``terrain`` (env.terrain)."""
    if 'terrain' not in meta:
        return 'not recorded in the model'
    t = json.loads(meta['terrain'])
    if not isinstance(t, dict) or not t.get('enabled'):
        return 'the flat plane (env.terrain off)'
    shares = ', '.join(f'{kind} {share:g}' for kind, share in
                       zip(t.get('types', []), t.get('proportions', [])) if share > 0)
    curriculum = f'curriculum on, from levels <= {t.get("max_init_level")}' \
        if t.get('curriculum') else 'curriculum off'
    return (f'terrain tiles ({shares}), {t.get("num_levels")} levels, {curriculum}, seed '
            f'{t.get("seed")}; top level: rough {_fmt(t.get("rough_height"))} H, slopes '
            f'{_fmt(t.get("slope_deg"))} deg, steps {_fmt(t.get("step_height"))} H, obstacles '
            f'{_fmt(t.get("obstacle_height"))} H (H: standing height); steps as '
            f'{_GROUND.get(t.get("collision", "heightfield"), "?")}')


def _verified_on(model: Path) -> list[str]:
    """The ground of the verification record: the flat table, then each terrain row."""
    try:
        found = read_verification(model)
    except ValueError:
        return ['- verified on: unreadable verification record (below)']
    if found is None:
        return ['- verified on: nothing yet (no verification record)']
    rows = found[1].get('terrain') or []
    lines = ['- verified on: the flat plane (the table below)' +
             (', and terrain tiles:' if rows else '; no terrain tiles (`claw-rl verify '
              '--terrain all` adds them)')]
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict):
            vx = row.get('vx_error')
            lines.append(f'  - {row.get("terrain")} (seed {row.get("seed")}): falls '
                         f'{row.get("falls")}/{row.get("episodes")}, vx error '
                         f'{"n/a" if vx is None else _fmt(float(vx))} m/s: '
                         f'{"PASS" if row.get("passed") is True else "FAIL"}')
    return lines


def _memory(policy: OnnxPolicy) -> str:
    """What a model with an observation window reads ('' for one observation)."""
    if policy.obs_history == 1:
        return ''
    return (f': the last {policy.obs_history} observations of {policy.frame_dim} values, '
            'oldest first (memory)')


def _actuator(spec: dict) -> str:
    """The actuator model the student was trained on (the robot YAML's, in the metadata)."""
    act = spec.get('actuator')
    if not isinstance(act, dict):
        return 'not recorded (exported before actuator models: ideal_pd)'
    steps = act.get('delay_steps')
    # Metadata is the model file's word: anything but a [min, max] pair reads as unknown.
    delay = '-'.join(_fmt(x) for x in steps) if isinstance(steps, list) and len(steps) == 2 \
        else '?'
    text = (f'`{act.get("model", "?")}`, armature {_fmt(act.get("armature", "?"))} kg m^2, '
            f'command delay {delay} physics steps')
    if act.get('model') == 'dc_motor':
        text += (f'; stall torque {_fmt(act.get("saturation_torque", []))} N m, no-load speed '
                 f'{_fmt(act.get("no_load_speed", []))} rad/s')
    return text


def _overlay(spec: dict) -> str:
    """The robot overlay (claw-rl sysid) the student was trained with, from the metadata."""
    fit = spec.get('robot_overlay')
    if fit is None:
        return 'none (the robot YAML as it is)'
    if not isinstance(fit, dict):
        return '? (unreadable metadata)'

    def per_joint(values: Any) -> str:  # one number when every joint has it
        if not isinstance(values, list) or not values:
            return '?'
        return _fmt(values[0]) if all(v == values[0] for v in values) else f'[{_fmt(values)}]'
    return (f'sha256 `{str(fit.get("sha256") or "?")[:12]}` (the run directory\'s '
            f'robot_overlay.yaml; the gains above are its): joint friction '
            f'{per_joint(fit.get("joint_frictionloss"))} N m, joint damping '
            f'{per_joint(fit.get("joint_damping"))} N m s/rad; the policy node needs the same '
            'file as robot_overlay')


def policy_card(model: str | Path) -> str:
    """The markdown card of an exported model file."""
    model = Path(model)
    policy = OnnxPolicy(model)
    spec, meta = policy.spec, policy.metadata
    extras = {k: json.loads(meta[k]) for k in RUN_KEYS if k in meta}
    control_dt = float(spec.get('control_dt', 0.0))
    gait = spec.get('gait') or {}
    period = f'{control_dt:g} s ({1 / control_dt:g} Hz)' if control_dt > 0 else '?'
    lines = [
        f'# Policy card: {model.name}', '',
        f'- sha256: `{policy.sha256}`',
        f'- size: {model.stat().st_size} bytes; exported {meta.get("exported_at", "?")} '
        f'(format {meta.get("claw_rl_format", "?")}); onnxruntime vs torch max abs diff '
        f'{meta.get("parity_max_abs_diff", "?")} ({meta.get("parity_max_scaled_diff", "?")} per '
        'unit of activation scale)',
        f'- input `obs` [batch, {policy.obs_dim}] -> output `actions` [batch, '
        f'{policy.num_actions}]' + _memory(policy), '',
        '## Robot and control', '',
        f'- robot: `{spec.get("robot")}` (spec version {spec.get("spec_version")})',
        f'- control period: {period}: one action per /joint_states message',
        f'- action: target = default + {spec.get("action_scale")} x action, action clipped '
        f'to +-{spec.get("action_clip", "?")} in the graph, then to the joint limits',
        f'- gait clock: period {gait.get("period_s", 0)} s, duty {gait.get("duty", "?")}, '
        f'offsets {_fmt(gait.get("offsets", []))}',
        f'- trained on actuator: {_actuator(spec)}',
        f'- robot overlay: {_overlay(spec)}', '',
        '## Joint order (commands and the forward_command_controller `joints`)', '',
        *_joints(spec), '',
        f'## Observation layout ({policy.frame_dim} values per observation)', '',
        *_observation(spec), '',
        '## Training run', '',
        *([f'- {k}: {_fmt(v)}' for k, v in extras.items()] or ['- not recorded']), '',
        '## Terrain', '', f'- trained on: {_trained_on(meta)}', *_verified_on(model), '',
        '## Verification', '', *_verification(model, policy.sha256), '',
        '## Reality gap (transfer suite)', '', *_transfer(model, policy.sha256), '',
        '## Drive gains', '', *_drive(model, policy.sha256), '',
        '## Deploying', '',
        f'`claw-rl up deploy --model {model.name}` (docs/deploy.md: deploying to a real robot).',
        '']
    return '\n'.join(lines)


def write_policy_card(model: str | Path) -> Path:
    """Write :func:`policy_card` beside the model, atomically; returns the card's path."""
    path = card_path(model)
    atomic_write_bytes(path, policy_card(model).encode())
    return path
