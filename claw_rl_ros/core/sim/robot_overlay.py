"""A robot overlay: identified actuator numbers merged onto a robot YAML.

``claw-rl sysid`` writes one from a recording of the real robot; ``--robot-overlay`` (train,
eval, verify, the train graph) and the ``robot_overlay`` parameter (sim node, policy node) read
it. The file is exactly::

    joint_groups:            # keyed like the robot YAML's stiffness/damping maps
      hip:   {kp: 30.0, kd: 0.75, frictionloss: 0.02, damping: 0.05, armature: 0.01}
      thigh: {...}
      calf:  {...}
    action_delay_s: 0.0

and more keys may follow (the fit's report under ``fit``; ``randomization``: env randomisation
ranges re-centred on the fit, merged over the env config's by :func:`recentred_randomization`).
Group keys match joints as the robot YAML's gain maps do (an exact joint name wins, else the
one key that is a part of it); every joint must be matched. Merging replaces the robot's Kp, Kd,
rotor inertia and the URDF's joint friction and damping; the fitted delay becomes the robot's
delay without randomisation (``actuator.nominal_delay_steps``) and the centre of its command ->
motor delay range (same width, clipped at 0). The env's multiplicative
ranges (kp_scale, joint_friction_scale, ...) scale the merged values, so they re-centre too.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
import math
from pathlib import Path
from typing import Any

import yaml

from ..config import ConfigError, from_dict, load_yaml, param
from ..io import atomic_write_bytes

# The fields of one joint group, in file order.
GROUP_FIELDS = ('kp', 'kd', 'frictionloss', 'damping', 'armature')
# The overlay keys that must be there (more may follow).
REQUIRED_KEYS = ('joint_groups', 'action_delay_s')


@dataclass
class GroupParams:
    """The identified actuator of one joint group."""

    kp: float = param(0.0, "the drive's effective Kp [N m/rad]", ge=0, le=1e4)
    kd: float = param(0.0, "the drive's effective Kd [N m s/rad]", ge=0, le=1e3)
    frictionloss: float = param(0.0, 'Coulomb joint friction (MuJoCo frictionloss) [N m]',
                                ge=0, le=1e3)
    damping: float = param(0.0, 'viscous joint damping [N m s/rad]', ge=0, le=1e3)
    armature: float = param(0.0, 'reflected rotor inertia [kg m^2]', ge=0, le=10)


@dataclass
class RobotOverlay:
    """A parsed overlay: its groups, the fitted delay and the keys that follow them."""

    joint_groups: dict[str, GroupParams]
    action_delay_s: float
    extra: dict[str, Any]
    source: str = '<overlay>'

    def to_dict(self) -> dict[str, Any]:
        """The overlay as written: the required keys first, then the others."""
        groups = {name: {f: float(getattr(g, f)) for f in GROUP_FIELDS}
                  for name, g in self.joint_groups.items()}
        return {'joint_groups': groups, 'action_delay_s': float(self.action_delay_s),
                **self.extra}


def load_overlay(path: str | Path) -> RobotOverlay:
    """Read and check an overlay file; every bad field is refused by name."""
    path = Path(path).expanduser()
    source = str(path)
    if not path.is_file():
        raise ConfigError('--robot-overlay', source, 'file not found; give the overlay '
                          'claw-rl sysid wrote (--out)')
    raw = load_yaml(path)
    return overlay_from_dict(raw, source)


def overlay_from_dict(raw: Any, source: str = '<overlay>') -> RobotOverlay:
    """Check a parsed overlay mapping (see the module doc) and return it."""
    if not isinstance(raw, dict):
        raise ConfigError(source, '(top level)', 'expected a mapping with joint_groups and '
                          'action_delay_s')
    for key in REQUIRED_KEYS:
        if key not in raw:
            raise ConfigError(source, key, 'missing; an overlay has joint_groups {group: '
                              '{kp, kd, frictionloss, damping, armature}} and action_delay_s')
    groups_raw = raw['joint_groups']
    if not isinstance(groups_raw, dict) or not groups_raw:
        raise ConfigError(source, 'joint_groups', 'expected a non-empty mapping {group: '
                          '{kp, kd, frictionloss, damping, armature}}')
    groups = {}
    for name, values in groups_raw.items():
        key = f'joint_groups.{name}'
        if not isinstance(values, dict):
            raise ConfigError(source, key, f'expected a mapping of {", ".join(GROUP_FIELDS)}')
        missing = [f for f in GROUP_FIELDS if f not in values]
        if missing:
            raise ConfigError(source, f'{key}.{missing[0]}', 'missing; every group gives '
                              f'{", ".join(GROUP_FIELDS)}')
        groups[str(name)] = from_dict(GroupParams, values, source=source, prefix=key)
    delay = raw['action_delay_s']
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) \
            or not math.isfinite(delay) or not 0 <= delay <= 1.0:
        raise ConfigError(source, 'action_delay_s', f'{delay!r}: give the command -> motion '
                          'delay in seconds, 0 to 1')
    extra = {k: v for k, v in raw.items() if k not in REQUIRED_KEYS}
    if 'randomization' in extra and not isinstance(extra['randomization'], dict):
        raise ConfigError(source, 'randomization', 'expected a mapping of env.randomization '
                          'ranges')
    return RobotOverlay(groups, float(delay), extra, source)


def write_overlay(path: str | Path, overlay: RobotOverlay, header: str = '') -> Path:
    """Write ``overlay`` atomically (a comment ``header`` first); returns the path."""
    path = Path(path)
    text = yaml.safe_dump(overlay.to_dict(), sort_keys=False, default_flow_style=None)
    comment = ''.join(f'# {line}\n' if line else '#\n' for line in header.splitlines())
    atomic_write_bytes(path, (comment + text).encode())
    return path


def merge_overlay(cfg: Any, overlay: RobotOverlay) -> Any:
    """A RobotConfig with the overlay's numbers: gains, joint friction, damping and rotor
    inertia by group, and the delay range re-centred on the fitted delay (its width kept)."""
    groups = overlay.joint_groups
    steps = overlay.action_delay_s / cfg.sim_dt
    if steps > 100:
        raise ConfigError(overlay.source, 'action_delay_s', f'{overlay.action_delay_s} s is '
                          f'{steps:.0f} physics steps of {cfg.sim_dt} s; at most 100')
    lo, hi = cfg.actuator.delay_steps
    width = int(hi) - int(lo)
    start = max(0, int(round(steps)) - width // 2)
    actuator = replace(cfg.actuator, delay_steps=(start, start + width),
                       nominal_delay_steps=int(round(steps)))
    return replace(
        cfg, stiffness={k: g.kp for k, g in groups.items()},
        damping={k: g.kd for k, g in groups.items()},
        joint_frictionloss={k: g.frictionloss for k, g in groups.items()},
        joint_damping={k: g.damping for k, g in groups.items()},
        joint_armature={k: g.armature for k, g in groups.items()}, actuator=actuator)


def recentred_randomization(randomization: Any, overlay_path: str, sim_dt: float) -> Any:
    """The env's randomisation config re-centred on an overlay's fit: the command -> motor
    delay range (``action_latency_substeps``, when the env sets one) shifted so its middle is
    the fitted delay (width kept, clipped at 0), then the overlay's own ``randomization``
    ranges (if any) merged over it. ``overlay_path`` empty returns it unchanged."""
    if not overlay_path:
        return randomization
    overlay = load_overlay(overlay_path)
    merged = _as_dict(randomization)
    latency = merged.get('action_latency_substeps')
    if latency is not None:
        lo, hi = (int(x) for x in latency)
        start = max(0, int(round(overlay.action_delay_s / sim_dt)) - (hi - lo) // 2)
        merged['action_latency_substeps'] = [start, start + hi - lo]
    merged.update(overlay.extra.get('randomization') or {})
    return from_dict(type(randomization), merged, source=overlay.source,
                     prefix='randomization')


def _as_dict(dc: Any) -> dict[str, Any]:
    return {f.name: getattr(dc, f.name) for f in fields(dc)}
