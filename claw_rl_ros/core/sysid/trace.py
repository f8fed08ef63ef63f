"""A system-identification recording as arrays (:class:`Trace`): read from a recorder_node MCAP
(:func:`load_trace`) or simulated (:mod:`.hidden_robot`), and the checks that refuse a recording
that cannot identify the drive (:func:`check_trace`), each by name.

Sample k is a recorded ``joint_states`` (stamp ``t[k]``, positions, velocities, efforts when the
driver gives them); ``target[k]`` is the command in force from sample k to sample k + 1: the
last ``joint_commands`` published after state k and before state k + 1 (by publish time: the
command that answers state k), else the one before it (zero-order hold). The trace starts at
the state the first command answers. A lockstep sim re-sends an unanswered state under its
stamp: such a repeat counts once. The excitation is the run of samples the policy node spent
in EXCITE (``safety/state``); a recording without that state is taken whole. The variant
(stand or ground) is the policy node's excitation record's (``policy/excitation``), else the
recording metadata's; odometry (``odom``) with every sample gives the trunk's state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
import json
from pathlib import Path
from typing import Optional

import numpy as np

from ..config import ConfigError, param
from ..replay.recording import read_messages, read_metadata
from ..sim.robot_spec import RobotSpec

# Nanoseconds to seconds.
NS = 1e-9
# Samples before the excitation the fit may read (the longest delay it fits, and more).
HISTORY_PERIODS = 25
# The safety state of the excitation (core/control/safety.py's EXCITE).
EXCITE = 'EXCITE'
# The trace's channels checked for NaN / inf, by the recorded field's name.
FIELDS = (('q', 'joint_states.position'), ('qd', 'joint_states.velocity'),
          ('effort', 'joint_states.effort'), ('target', 'joint_commands'))


@dataclass
class Trace:
    """A recording's samples, joints in the robot's order.

    ``t`` [T] state stamps [s]; ``q``, ``qd`` [T, J] positions [rad] and velocities [rad/s];
    ``effort`` [T, J] measured drive torques [N m] (None: not recorded); ``target`` [T, J]
    the command in force from sample k to k + 1 [rad]; ``window`` (i0, i1) the excitation's
    samples; ``base_quat`` [4] (w, x, y, z) the trunk's orientation at sample 0 (the IMU's;
    None: not recorded); ``base`` [T, 13] the trunk's state (odometry: position, quaternion
    w x y z, world linear and body angular velocity, as MuJoCo's free joint holds them; None:
    not recorded); ``variant`` 'stand', 'ground' or '' (unknown); ``source`` its file.
    """

    joints: list[str]
    t: np.ndarray
    q: np.ndarray
    qd: np.ndarray
    effort: Optional[np.ndarray]
    target: np.ndarray
    window: tuple[int, int]
    base_quat: Optional[np.ndarray] = None
    base: Optional[np.ndarray] = None
    variant: str = ''
    source: str = '<trace>'

    @property
    def num_samples(self) -> int:
        return len(self.t)

    def excitation_s(self) -> float:
        """Seconds the excitation window spans."""
        i0, i1 = self.window
        return float(self.t[i1 - 1] - self.t[i0]) if i1 - i0 > 1 else 0.0

    def without_effort(self) -> 'Trace':
        """The same trace as a driver that reports no effort gives it."""
        return replace(self, effort=None)


@dataclass
class TraceLimits:
    """What a recording needs to identify every parameter (``claw-rl sysid`` refuses less)."""

    min_excitation_s: float = param(5.0, 'shortest excitation [s]', gt=0, le=3600)
    min_target_range: float = param(0.02, "least peak-to-peak of a joint's commands over the "
                                          'excitation [rad]', gt=0, le=1)
    min_motion: float = param(0.005, "least peak-to-peak of a joint's position over the "
                                     'excitation [rad]', gt=0, le=1)
    saturation: float = param(0.98, 'an effort at this fraction of the limit is saturated',
                              gt=0, le=1)
    max_saturated: float = param(0.05, 'largest fraction of saturated samples per joint', ge=0,
                                 le=1)
    max_gap_periods: float = param(3.0, 'largest gap between two states [control periods]',
                                   gt=1, le=1000)


def _roles(meta: dict[str, str]) -> dict[str, str]:
    """{recorded topic: role's last name} (recorder_node's ``roles`` metadata)."""
    try:
        return {k: v.split('/')[-1] for k, v in json.loads(meta.get('roles', '{}')).items()}
    except (ValueError, AttributeError):
        return {}


def _stamp(header) -> float:
    return header.stamp.sec + header.stamp.nanosec * NS


def _read(path: Path, roles: dict[str, str]) -> tuple[list, list, list, dict, dict, str]:
    """(states, commands, safety) of an MCAP by role, each in publish order, the IMU
    orientations and odometry by their stamps, and the excitation's variant ('' unknown)."""
    states, commands, safety, imus, odom, variant = [], [], [], {}, {}, ''
    for topic, _, pub, m in read_messages(path):
        role = roles.get(topic, topic.rstrip('/').split('/')[-1])
        if role == 'joint_states':
            states.append((pub, _stamp(m.header), list(m.name),
                           np.asarray(m.position, dtype=np.float64),
                           np.asarray(m.velocity, dtype=np.float64),
                           np.asarray(m.effort, dtype=np.float64)))
        elif role == 'joint_commands':
            commands.append((pub, np.asarray(m.data, dtype=np.float64)))
        elif role == 'state' and (topic in roles or topic.rstrip('/').endswith('safety/state')):
            safety.append((pub, m.data))
        elif role == 'imu':
            o = m.orientation
            imus[_stamp(m.header)] = np.array([o.w, o.x, o.y, o.z])
        elif role == 'odom':
            p, o = m.pose.pose.position, m.pose.pose.orientation
            v, w = m.twist.twist.linear, m.twist.twist.angular
            quat = np.array([o.w, o.x, o.y, o.z])
            # The free joint's velocity: linear in the world frame, angular in the body's.
            linear = rotation(quat) @ np.array([v.x, v.y, v.z])
            odom[_stamp(m.header)] = np.concatenate([[p.x, p.y, p.z], quat, linear,
                                                     [w.x, w.y, w.z]])
        elif role == 'excitation':
            # The policy node's record of the run (JSON): its config names the variant.
            try:
                variant = str(json.loads(m.data)['config']['variant'])
            except (ValueError, KeyError, TypeError):
                pass
    for part in (states, commands, safety):
        part.sort(key=lambda e: e[0])
    return states, commands, safety, imus, odom, variant


def rotation(quat: np.ndarray) -> np.ndarray:
    """[3, 3] the rotation of a unit quaternion (w, x, y, z)."""
    w, x, y, z = quat
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def _names_check(source: str, field: str, names: list[str], robot: RobotSpec) -> None:
    """Refuse joint names that are not exactly the robot's (naming them)."""
    unknown = [n for n in names if n not in robot.joint_names]
    missing = [n for n in robot.joint_names if n not in names]
    if unknown:
        raise ConfigError(source, field, f'joints {unknown} are not joints of robot '
                          f'{robot.name!r} ({", ".join(robot.joint_names)}); record this '
                          'robot, or give its --robot')
    if missing:
        raise ConfigError(source, field, f'joints {missing} of robot {robot.name!r} are not '
                          'recorded; record every joint')
    if len(set(names)) != len(names):
        raise ConfigError(source, field, 'a joint is named twice')


def load_trace(path: str | Path, robot: RobotSpec) -> Trace:
    """Read a recorder_node MCAP into a :class:`Trace` (see the module doc); a recording that
    is empty, names other joints or is no MCAP is refused by name (ConfigError)."""
    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise ConfigError(source, 'recording', 'no such file; give an MCAP file written by '
                          'recorder_node (record:=run.mcap)')
    try:
        meta = read_metadata(path)
        states, commands, safety, imus, odom, variant = _read(path, _roles(meta))
    except Exception as exc:  # noqa: BLE001 - mcap raises its own errors on a damaged file
        raise ConfigError(source, 'recording', f'not a readable MCAP recording '
                          f'({type(exc).__name__}: {exc})') from None
    if not states:
        raise ConfigError(source, 'joint_states', 'none recorded; record the robot while it '
                          'runs the excitation (the policy node in EXCITE)')
    if not commands:
        raise ConfigError(source, 'joint_commands', 'none recorded; record the policy node\'s '
                          'commands during the excitation')
    order = [j for j in meta.get('joints', '').split(',') if j] or list(robot.joint_names)
    _names_check(source, 'metadata joints (joint_commands order)', order, robot)
    cmd_index = [order.index(j) for j in robot.joint_names]
    # Repeats of a state under its stamp (a lockstep sim re-sending it) count once.
    kept = [states[0]] + [s for prev, s in zip(states, states[1:])
                          if not (s[1] == prev[1] and np.array_equal(s[3], prev[3]))]
    names = kept[0][2]
    _names_check(source, 'joint_states.name', names, robot)
    state_index = [names.index(j) for j in robot.joint_names]
    j = robot.num_joints
    for pub, stamp, n, pos, vel, eff in kept:
        if n != names:
            raise ConfigError(source, 'joint_states.name', f'changes at t = {stamp:.3f} s '
                              f'({n} after {names}); record one driver\'s joint_states')
        if len(pos) != j or len(vel) != j or len(eff) not in (0, j):
            raise ConfigError(source, 'joint_states', f'at t = {stamp:.3f} s has '
                              f'{len(pos)} positions, {len(vel)} velocities, {len(eff)} efforts '
                              f'for {j} joints')
    for _, data in commands:
        if len(data) != j:
            raise ConfigError(source, 'joint_commands', f'a command has {len(data)} values for '
                              f'{j} joints')
    pubs = np.array([s[0] for s in kept])
    t = np.array([s[1] for s in kept])
    q = np.array([s[3][state_index] for s in kept])
    qd = np.array([s[4][state_index] for s in kept])
    has_effort = all(len(s[5]) for s in kept)
    effort = np.array([s[5][state_index] for s in kept]) if has_effort else None
    # The command in force after each state: the last one published before the next state.
    cmd_pub = np.array([c[0] for c in commands])
    cmd = np.array([c[1][cmd_index] for c in commands])
    last = np.searchsorted(cmd_pub, np.append(pubs[1:], np.iinfo(np.int64).max)) - 1
    first = int(np.searchsorted(pubs, cmd_pub[0], side='right')) - 1
    first = max(first, 0)
    target = cmd[np.maximum(last, 0)]
    window = (0, len(t))
    if any(text == EXCITE for _, text in safety):
        # The samples published while the last safety state was EXCITE: the longest run.
        spub = np.array([s[0] for s in safety])
        at = np.searchsorted(spub, pubs, side='right') - 1
        inside = np.array([a >= 0 and safety[a][1] == EXCITE for a in at])
        window = _longest_run(inside)
    i0 = max(window[0], first)
    i1 = max(window[1], i0)
    sl = slice(first, len(t))
    # The IMU's orientation at the first sample (or the first reading); the trunk's state
    # where odometry came with every sample.
    quat = imus.get(t[first], next(iter(imus.values()), None))
    base = np.array([odom[s] for s in t[sl]]) if all(s in odom for s in t[sl]) else None
    return Trace(list(robot.joint_names), t[sl], q[sl], qd[sl],
                 effort[sl] if effort is not None else None, target[sl],
                 (i0 - first, i1 - first), quat, base, variant or meta.get('variant', ''),
                 source)


def _longest_run(mask: np.ndarray) -> tuple[int, int]:
    """(start, stop) of the longest run of True in ``mask`` ((0, 0) for none)."""
    best, start = (0, 0), None
    for i, m in enumerate(np.append(mask, False)):
        if m and start is None:
            start = i
        elif not m and start is not None:
            if i - start > best[1] - best[0]:
                best = (start, i)
            start = None
    return best


def check_trace(trace: Trace, robot: RobotSpec, limits: TraceLimits | None = None) -> None:
    """Refuse (ConfigError, by name) a trace that cannot identify every parameter: NaN or inf
    in a field (the field, the joint, the time), a clock that goes back or jumps, too short an
    excitation, a joint without excitation, a joint saturated at its effort limit."""
    lim = limits or TraceLimits()
    src, names = trace.source, trace.joints
    for attr, field in FIELDS:
        values = getattr(trace, attr)
        if values is None:
            continue
        bad = ~np.isfinite(values)
        if bad.any():
            k, j = np.argwhere(bad)[0]
            raise ConfigError(src, field, f'{names[j]} is {values[k, j]} at t = '
                              f'{trace.t[k]:.3f} s; record a driver that reports finite values')
    if not np.isfinite(trace.t).all():
        raise ConfigError(src, 'joint_states.header.stamp', 'a stamp is not finite')
    dt = np.diff(trace.t)
    if (dt <= 0).any():
        k = int(np.argmax(dt <= 0))
        raise ConfigError(src, 'joint_states.header.stamp', f'the clock goes back (or stands) '
                          f'at t = {trace.t[k + 1]:.3f} s after {trace.t[k]:.3f} s; record '
                          'one run of one clock')
    # Lost states matter where the fit reads them: the excitation and the control periods
    # before it (the delay's history); a stretch lost while standing up before it does not.
    gap = lim.max_gap_periods * robot.control_dt
    i0, i1 = trace.window
    jumps = dt > gap
    jumps[:max(0, i0 - HISTORY_PERIODS)] = False
    jumps[max(0, i1 - 1):] = False
    if jumps.any():
        k = int(np.argmax(jumps))
        raise ConfigError(src, 'joint_states.header.stamp', f'the clock jumps {dt[k]:.3f} s '
                          f'at t = {trace.t[k]:.3f} s (more than {lim.max_gap_periods:g} control '
                          'periods without a state); record without pauses or lost states')
    seconds = trace.excitation_s()
    if seconds < lim.min_excitation_s:
        raise ConfigError(src, 'recording', f'too short: {seconds:.2f} s of excitation, at '
                          f'least {lim.min_excitation_s:g} s needed; record the whole excitation '
                          '(the policy node in EXCITE)')
    i0, i1 = trace.window
    span = np.ptp(trace.target[i0:i1], axis=0)
    idle = [n for n, s in zip(names, span) if s < lim.min_target_range]
    if idle:
        also = f' (also {", ".join(idle[1:])})' if len(idle) > 1 else ''
        raise ConfigError(src, idle[0], f'no excitation: its commands span '
                          f'{span[names.index(idle[0])]:.4f} rad (< {lim.min_target_range:g}) '
                          f'over the excitation{also}; excite every joint')
    moved = np.ptp(trace.q[i0:i1], axis=0)
    still = [n for n, s in zip(names, moved) if s < lim.min_motion]
    if still:
        raise ConfigError(src, still[0], f'did not move: its position spans '
                          f'{moved[names.index(still[0])]:.4f} rad (< {lim.min_motion:g}) while '
                          'commanded; is its drive on?')
    if trace.effort is not None:
        limit = robot.effort_limit * lim.saturation
        frac = np.mean(np.abs(trace.effort[i0:i1]) >= limit, axis=0)
        over = [n for n, f in zip(names, frac) if f > lim.max_saturated]
        if over:
            k = names.index(over[0])
            raise ConfigError(src, over[0], f'saturated: its effort is at the '
                              f'{robot.effort_limit[k]:g} N m limit in {100 * frac[k]:.0f} % of '
                              f'the excitation (at most {100 * lim.max_saturated:g} %); lower the '
                              'excitation amplitude or frequency')
