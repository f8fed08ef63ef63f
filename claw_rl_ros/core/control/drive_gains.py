"""The drives' gains: sent with every command, or declared and checked against the model's.

A student acts through the PD law of the drives it was trained with (the model's metadata
``kp`` / ``kd``). A driver with gains of its own runs it at whatever it holds, and holds
PASSIVE's measured pose at those gains (position hold, not damping). So the policy node never
assumes them; parameter ``gains_source`` says which of two ways the drives get them:

* ``sent`` (default): the serving model's metadata Kp / Kd go on ``joint_gains`` with every
  command ([Kp x J, Kd x J] in ``joints`` order; Kp = 0 in PASSIVE: damping). A swap to
  another model sends that model's gains from its first command. The self-check checks that
  what is sent is the model's and that something subscribes to it (a driver that reads them);
* ``declared``: the driver takes no gains; ``drive_kp`` / ``drive_kd`` declare the ones the
  drives hold (one number for every joint, or one per joint in ``joints`` order), and the
  self-check compares them with the model's joint by joint: a difference of more than
  ``gain_tolerance`` (relative, default 5 %) refuses RL, naming both.

Declared but empty (nothing sent, nothing declared) refuses RL with the fix. Bad values
(non-finite, negative, the wrong number, a tolerance outside [0, 0.5], values with ``sent``)
refuse the node's start, naming the parameter (:class:`DriveGains`, :func:`declared_gains`).
"""

from __future__ import annotations

from dataclasses import dataclass
import datetime
import json
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..export.drive_record import drive_path
from ..export.policy_card import card_path, write_policy_card
from ..io import atomic_write_bytes

GAINS_SOURCES = ('sent', 'declared')
DEFAULT_GAIN_TOLERANCE = 0.05
MAX_GAIN_TOLERANCE = 0.5
# Sent gains are the model's metadata as doubles: equal up to float rounding.
SENT_TOLERANCE = 1e-9
# A declared gain exactly gain_tolerance away still passes (float rounding of 30 x 1.05).
BOUNDARY_SLACK = 1e-9
# Record verdicts (core/export/drive_record.py).
VERDICTS = ('sent', 'not received', 'within', 'differs', 'not declared')
DECLARE_FIX = ('declare the gains your drives hold (gains_source declared, drive_kp, drive_kd: '
               'one number or one per joint in joints order)')


@dataclass(frozen=True)
class DriveGains:
    """Parameters ``gains_source``, ``drive_kp``, ``drive_kd``, ``gain_tolerance``; a bad one
    is a ValueError naming it (the node refuses to start)."""

    source: str = 'sent'
    kp: tuple[float, ...] = ()
    kd: tuple[float, ...] = ()
    tolerance: float = DEFAULT_GAIN_TOLERANCE

    def __post_init__(self):
        if self.source not in GAINS_SOURCES:
            raise ValueError(f'parameter gains_source = {self.source!r}; use one of '
                             f'{GAINS_SOURCES} (sent: the model\'s gains go with every command; '
                             'declared: drive_kp / drive_kd say what the drives hold)')
        if not _number(self.tolerance) or not 0.0 <= self.tolerance <= MAX_GAIN_TOLERANCE:
            raise ValueError(f'parameter gain_tolerance = {self.tolerance!r}; use a relative '
                             f'difference from 0 to {MAX_GAIN_TOLERANCE:g} (default '
                             f'{DEFAULT_GAIN_TOLERANCE:g}: 5 %)')
        for name, values, unit in (('drive_kp', self.kp, 'N m/rad'),
                                   ('drive_kd', self.kd, 'N m s/rad')):
            bad = [v for v in values if not (_number(v) and math.isfinite(v) and v >= 0)]
            if bad:
                raise ValueError(f'parameter {name} = {list(values)!r}: {bad[0]!r} is no gain; '
                                 f'give finite numbers >= 0 [{unit}]')
        if self.source == 'sent' and (self.kp or self.kd):
            raise ValueError('parameter drive_kp / drive_kd given with gains_source sent (the '
                             "model's gains go with every command); set gains_source declared "
                             'for a driver that holds its own gains, or leave both empty')
        if bool(self.kp) != bool(self.kd):
            given, missing = ('drive_kp', 'drive_kd') if self.kp else ('drive_kd', 'drive_kp')
            raise ValueError(f'parameter {missing} is empty but {given} is given; declare '
                             'both gains the drives hold')


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and not math.isnan(value)


def declared_gains(drive: DriveGains,
                   joints: Sequence[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """([J] Kp, [J] Kd) declared, in ``joints`` order (one number: every joint); None when
    nothing is declared. A list of another length is a ValueError naming the parameter."""
    if drive.source != 'declared' or not drive.kp:
        return None
    out = []
    for name, values in (('drive_kp', drive.kp), ('drive_kd', drive.kd)):
        if len(values) not in (1, len(joints)):
            raise ValueError(f'parameter {name} has {len(values)} values; give 1 (every joint) '
                             f'or {len(joints)}, one per joint in joints order '
                             f'({", ".join(joints)})')
        out.append(np.broadcast_to(np.asarray(values, dtype=np.float64), (len(joints),)).copy())
    return out[0], out[1]


def _fmt(values: np.ndarray) -> str:
    """One number when all joints agree, else the list (spec order)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size and np.all(values == values[0]):
        return f'{values[0]:.6g}'
    return '[' + ', '.join(f'{v:.6g}' for v in values) + ']'


def _change(drive: float, model: float) -> str:
    return f'{(drive - model) / model * 100:+.1f} %' if model else 'model 0'


def _differences(label: str, param: str, drive: np.ndarray, model: np.ndarray,
                 tolerance: float, joints: Sequence[str]) -> list[str]:
    """One line naming both values of every joint whose declared gain is out of tolerance,
    joints of equal (model, drive) values grouped."""
    # |drive - model| <= tolerance x |model| per joint (relative; a model gain of 0 needs 0).
    bad = np.abs(drive - model) > (tolerance + BOUNDARY_SLACK) * np.abs(model)
    if not bad.any():
        return []
    groups: dict[tuple[float, float], list[str]] = {}
    for j in np.flatnonzero(bad):
        groups.setdefault((float(model[j]), float(drive[j])), []).append(joints[j])
    parts = [f'model metadata {m:.6g} vs drives {d:.6g} ({_change(d, m)}) at '
             + ('every joint' if len(names) == len(joints) else '[' + ', '.join(names) + ']')
             for (m, d), names in groups.items()]
    return [f'drive gains: {label} differs from the model\'s by more than gain_tolerance '
            f'{tolerance * 100:g} %: ' + ', '.join(parts) + f'; set {param} to the gains the '
            "drives hold, put the model's into the drives, or send them to a driver that takes "
            'gains (gains_source sent)']


def gain_check(drive: DriveGains, model_spec: dict[str, Any] | None, joints: Sequence[str],
               declared: tuple[np.ndarray, np.ndarray] | None,
               sent: tuple[np.ndarray, np.ndarray], listeners: int | None,
               topic: str) -> tuple[str, list[str]]:
    """(verdict, one line per problem) of the drives' gains against the model's metadata.

    ``joints``: spec order, as ``declared`` ([J] Kp, Kd or None) and ``sent`` (the gains the
    node sends outside PASSIVE); ``listeners``: subscriptions of the gains topic (None:
    unknown, not checked). No model: ('', []) (the self-check names that already).
    """
    if model_spec is None:
        return '', []
    try:
        model = (np.asarray(model_spec['kp'], dtype=np.float64),
                 np.asarray(model_spec['kd'], dtype=np.float64))
        if model[0].shape != (len(joints),) or model[1].shape != (len(joints),):
            raise ValueError
    except (KeyError, TypeError, ValueError):
        return 'differs', [f'drive gains: the model\'s metadata has no kp / kd of {len(joints)} '
                           'numbers; re-export it (claw-rl export)']
    trained = f'Kp {_fmt(model[0])}, Kd {_fmt(model[1])}'
    if drive.source == 'sent':
        lines = []
        # What goes out outside PASSIVE must be the serving model's metadata, joint by joint.
        if not all(np.allclose(s, m, rtol=SENT_TOLERANCE, atol=0.0) for s, m in zip(sent, model)):
            lines.append(f'drive gains: the node sends Kp {_fmt(sent[0])}, Kd {_fmt(sent[1])}, '
                         f"not the model's metadata {trained}; reload the model (model_path)")
        if listeners == 0:
            lines.append(f'drive gains: sent on {topic}, but nothing subscribes to it; remap '
                         'joint_gains to the topic your driver reads gains from (the deploy '
                         "graph's gains_topic), or, for a driver that takes no gains (a "
                         f'forward_position_controller), {DECLARE_FIX}')
        verdict = 'not received' if listeners == 0 else 'sent'
        return verdict, lines
    if declared is None:
        return 'not declared', [f'drive gains: not declared and not sent; the model was '
                                f'trained at {trained}: {DECLARE_FIX}, or send the model\'s to '
                                'a driver that takes gains (gains_source sent, gains_topic)']
    lines = _differences('Kp', 'drive_kp', declared[0], model[0], drive.tolerance, joints) + \
        _differences('Kd', 'drive_kd', declared[1], model[1], drive.tolerance, joints)
    return ('differs' if lines else 'within'), lines


def drive_record(drive: DriveGains, verdict: str, problems: Sequence[str],
                 declared: tuple[np.ndarray, np.ndarray] | None, joints: Sequence[str],
                 sha256: str, topic: str, node: str) -> dict[str, Any]:
    """The ``<model stem>.drive.json`` record (core/export/drive_record.py) of one check;
    ``declared`` and ``joints`` in ``joints`` order."""
    record: dict[str, Any] = {'model_sha256': sha256, 'source': drive.source,
                              'verdict': verdict, 'joints': list(joints),
                              'tolerance': drive.tolerance, 'problems': list(problems),
                              'node': node}
    if drive.source == 'sent':
        record['topic'] = topic
    if declared is not None:
        record['kp'], record['kd'] = declared[0].tolist(), declared[1].tolist()
    return record


def write_drive_record(model: str | Path, record: dict[str, Any]) -> Path:
    """Write ``record`` (stamped ``created``) beside ``model``, atomically, and rewrite the
    policy card there when there is one; returns the record's path."""
    created = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')
    path = drive_path(model)
    atomic_write_bytes(path, json.dumps({**record, 'created': created}, indent=1).encode())
    if card_path(model).is_file():
        write_policy_card(model)
    return path
