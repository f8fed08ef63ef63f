"""The excitation routine of system identification: chirps and steps around the default pose.

A schedule of segments, each moving a set of joints (one joint, one leg, or one joint group
of every leg) while the others hold the default pose: a linear chirp from ``f_start`` to
``f_end`` Hz of ``amplitude`` rad (faded in and out over ``ramp_s``), then steps to +amplitude,
-amplitude and back to 0, each held ``step_hold_s``; ``settle_s`` of rest between segments.
:meth:`Excitation.offset` is the [J] target offset from the default pose at a time since the
start; the deploy path adds it to the default pose and shapes it as it shapes RL's targets
(clamps, rate limit). The defaults are safe for the claw: at most 0.2 rad, 0.5-8 Hz.

Two variants: ``stand`` (the robot on a stand, trunk fixed, legs in the air; 0.15 rad) and
``ground`` (standing on its feet; 0.08 rad by default, at most :data:`GROUND_MAX_AMPLITUDE`).
Both default to ``per_group``: on the ground every leg moves alike (all hips, all thighs, all
calves), so the trunk stays over its four feet instead of leaning onto three. The policy
node's ``excite_*`` parameters are these fields (:func:`from_params`: an amplitude of 0 takes
the variant's), and :meth:`Excitation.describe` is the record the node publishes on
``policy/excitation`` when a run starts, so system identification can rebuild the plan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
import math
from typing import Any, Mapping

import numpy as np

from ..config import ConfigError, from_dict, param
from ..sim.robot_spec import RobotSpec

# Which joints move together in a segment.
PATTERNS = ('per_joint', 'per_leg', 'per_group')
# The joint-group name parts (robot YAML gain keys) a per_group pattern uses, in order.
DEFAULT_GROUPS = ('hip', 'thigh', 'calf')
# The variants: on a stand (trunk fixed, legs in the air) or on the ground (standing).
VARIANTS = ('stand', 'ground')
# Each variant's defaults of the fields that differ (an amplitude of 0 in from_params).
VARIANT_DEFAULTS = {'stand': {'amplitude': 0.15}, 'ground': {'amplitude': 0.08}}
# The largest amplitude the ground variant runs (the trunk is not held) [rad].
GROUND_MAX_AMPLITUDE = 0.15


@dataclass
class ExcitationConfig:
    """A bounded excitation (defaults safe for the claw on a stand)."""

    variant: str = param('stand', 'stand (robot on a stand, trunk fixed, legs in the air) or '
                         f'ground (standing; amplitude at most {GROUND_MAX_AMPLITUDE} rad)')
    pattern: str = param('per_group', 'joints moved together: per_joint (one at a time), '
                                      'per_leg (a leg at a time) or per_group (one joint group, '
                                      'e.g. every hip, at a time)')
    amplitude: float = param(0.15, 'chirp and step amplitude around the default pose [rad]',
                             gt=0, le=0.5)
    f_start: float = param(0.5, 'chirp start frequency [Hz]', gt=0, le=20)
    f_end: float = param(8.0, 'chirp end frequency [Hz] (at most a quarter of the control '
                              'rate is refused above)', gt=0, le=20)
    chirp_s: float = param(6.0, 'chirp length per segment [s]', ge=0, le=120)
    step_hold_s: float = param(0.5, 'hold of each step (+a, -a, 0) [s]; 0 = no steps', ge=0,
                               le=10)
    ramp_s: float = param(0.3, 'chirp fade-in and fade-out [s]', ge=0, le=10)
    settle_s: float = param(0.5, 'rest at the default pose before each segment [s]', ge=0,
                            le=10)

    def validate(self, robot: RobotSpec, source: str = 'excitation', prefix: str = '') -> None:
        """Refuse by name (``prefix`` + field) what the robot cannot run: an unknown pattern
        or variant, a number out of its bounds or not finite, a band above a quarter of the
        control rate or inverted, a chirp shorter than its fades, an amplitude too large for
        the ground, targets (default pose +- amplitude) beyond a joint's limits."""
        def refuse(key: str, message: str) -> ConfigError:
            return ConfigError(source, prefix + key, message)
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise refuse(f.name, f'{value!r}; give a finite number')
        try:
            from_dict(ExcitationConfig, asdict(self), source=source)  # the bounds
        except ConfigError as exc:
            raise refuse(exc.key, exc.detail) from None
        for key, value, allowed in (('pattern', self.pattern, PATTERNS),
                                    ('variant', self.variant, VARIANTS)):
            if value not in allowed:
                raise refuse(key, f'{value!r}; use one of {", ".join(allowed)}')
        if self.variant == 'ground' and self.amplitude > GROUND_MAX_AMPLITUDE:
            raise refuse('amplitude', f'{self.amplitude} rad on the ground (the trunk is not '
                         f'held); give at most {GROUND_MAX_AMPLITUDE} or put the robot on a '
                         'stand (variant stand)')
        nyquist = 0.25 / robot.control_dt
        if self.f_end > nyquist:
            raise refuse('f_end', f'{self.f_end} Hz is above a quarter of the '
                         f'{1 / robot.control_dt:g} Hz control rate ({nyquist:g} Hz); lower it')
        if self.f_start > self.f_end:
            raise refuse('f_start', f'{self.f_start} Hz is above f_end '
                         f'({self.f_end} Hz); give f_start <= f_end')
        if self.chirp_s and 2 * self.ramp_s > self.chirp_s:
            raise refuse('ramp_s', f'{self.ramp_s} s fades in and out over more '
                         f'than the {self.chirp_s} s chirp; give ramp_s <= chirp_s / 2')
        if self.chirp_s == 0 and self.step_hold_s == 0:
            raise refuse('chirp_s', '0 with step_hold_s 0: nothing to excite; '
                         'give a chirp or steps')
        # Every planned target inside the joint limits: q0 +- amplitude.
        q0, a = robot.default_joint_pos, self.amplitude
        out = (q0 - a < robot.joint_lower) | (q0 + a > robot.joint_upper)
        if out.any():
            j = int(np.flatnonzero(out)[0])
            raise refuse('amplitude', f'{a} rad around the default pose leaves '
                         f'{robot.joint_names[j]}\'s limits [{robot.joint_lower[j]:g}, '
                         f'{robot.joint_upper[j]:g}] (default {q0[j]:g}); lower it')


def from_params(values: Mapping[str, Any], robot: RobotSpec, source: str = 'excitation',
                prefix: str = '') -> ExcitationConfig:
    """The config of ``values`` keyed by field name (the policy node's ``excite_*``
    parameters without ``prefix``), validated for ``robot``; an amplitude of 0 is the
    variant's (:data:`VARIANT_DEFAULTS`). ConfigError names ``prefix`` + the field."""
    data = dict(values)
    variant = data.get('variant', 'stand')
    for key, default in VARIANT_DEFAULTS.get(variant, {}).items():
        if data.get(key) == 0:
            data[key] = default
    try:
        cfg = from_dict(ExcitationConfig, data, source=source)
    except ConfigError as exc:
        raise ConfigError(source, prefix + exc.key, exc.detail) from None
    cfg.validate(robot, source, prefix)
    return cfg


@dataclass
class Segment:
    """One segment: the joints it moves ([J] bool), a label, its start and length [s]."""

    moving: np.ndarray
    label: str
    start: float
    length: float


def joint_sets(robot: RobotSpec, pattern: str) -> list[tuple[str, np.ndarray]]:
    """(label, [J] bool) of the joints each segment moves, in order."""
    names = robot.joint_names
    j = len(names)
    if pattern == 'per_joint':
        return [(name, np.arange(j) == i) for i, name in enumerate(names)]
    if pattern == 'per_group':
        groups = [g for g in DEFAULT_GROUPS if any(g in n for n in names)]
        sets = [(g, np.array([g in n for n in names])) for g in groups]
        left = ~np.any([m for _, m in sets], axis=0) if sets else np.ones(j, bool)
        # Joints of no named group move one at a time.
        return sets + [(names[i], np.arange(j) == i) for i in np.flatnonzero(left)]
    # per_leg: a leg is the joints sharing a name prefix up to the first underscore.
    legs: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        legs.setdefault(name.split('_')[0], []).append(i)
    return [(leg, np.isin(np.arange(j), idx)) for leg, idx in legs.items()]


class Excitation:
    """The schedule of one excitation run; ``offset(t)`` gives the [J] targets' offsets."""

    def __init__(self, robot: RobotSpec, cfg: ExcitationConfig):
        cfg.validate(robot)
        self.cfg, self.num_joints = cfg, robot.num_joints
        self.joint_names = list(robot.joint_names)
        per_segment = cfg.settle_s + cfg.chirp_s + 3 * cfg.step_hold_s
        self.segments = [Segment(mask, label, k * per_segment, per_segment)
                         for k, (label, mask) in enumerate(joint_sets(robot, cfg.pattern))]
        self.duration = per_segment * len(self.segments)

    def segment_at(self, t: float) -> Segment | None:
        """The segment running at ``t`` [s] since the start (None before or after)."""
        if not 0 <= t < self.duration:
            return None
        return self.segments[min(int(t // self.segments[0].length), len(self.segments) - 1)]

    def offset(self, t: float) -> np.ndarray:
        """[J] target offset from the default pose [rad] at ``t`` [s] since the start (zeros
        outside the run and on joints the segment does not move)."""
        out = np.zeros(self.num_joints)
        seg = self.segment_at(t)
        if seg is None:
            return out
        out[seg.moving] = self._signal(t - seg.start)
        return out

    def _signal(self, tau: float) -> float:
        """The scalar signal ``tau`` [s] into a segment: rest, chirp, then steps."""
        cfg = self.cfg
        tau -= cfg.settle_s
        if tau < 0:
            return 0.0
        if tau < cfg.chirp_s:
            # Linear chirp: phase 2 pi (f0 t + (f1 - f0) t^2 / 2T), faded at both ends.
            phase = 2 * math.pi * (cfg.f_start * tau +
                                   (cfg.f_end - cfg.f_start) * tau ** 2 / (2 * cfg.chirp_s))
            fade = 1.0 if cfg.ramp_s == 0 else min(1.0, tau / cfg.ramp_s,
                                                   (cfg.chirp_s - tau) / cfg.ramp_s)
            return cfg.amplitude * fade * math.sin(phase)
        tau -= cfg.chirp_s
        if cfg.step_hold_s == 0:
            return 0.0
        level = (1.0, -1.0, 0.0)[min(int(tau // cfg.step_hold_s), 2)]
        return cfg.amplitude * level

    def describe(self, start_stamp: float | None = None) -> dict[str, Any]:
        """The run as plain data (JSON): the config, its duration [s], each segment (label,
        start and length [s], the joints it moves) and the stamp [s] its time 0 is at (the
        first excitation tick's state; None: not started)."""
        return {'config': asdict(self.cfg), 'duration_s': self.duration,
                'start_stamp': start_stamp, 'joints': self.joint_names,
                'segments': [{'label': s.label, 'start_s': s.start, 'length_s': s.length,
                              'joints': [n for n, m in zip(self.joint_names, s.moving) if m]}
                             for s in self.segments]}
