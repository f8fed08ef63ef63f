"""A recorder_node MCAP as arrays (:class:`Recording`) and as typed events in publish order
(:func:`recording_events`: :class:`StateEvent`, :class:`ImuEvent`, :class:`CmdVelEvent`,
:class:`SafetyEvent`, :class:`CommandEvent`), the input of the action replay and the sim
comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import json
from pathlib import Path
from typing import Sequence, Union

import numpy as np

from .recording import read_messages, read_metadata

# Nanoseconds to seconds.
NS = 1e-9


def header_stamp(header) -> float:
    """A message header's stamp [s]."""
    return header.stamp.sec + header.stamp.nanosec * NS


@dataclass
class Recording:
    """A recording's messages as arrays, each list sorted by publish time [ns].

    ``states``: (t, stamp, names, [n] pos, [n] vel); ``imus``: (t, stamp, [4] xyzw, [3] gyro);
    ``cmd_vel``: (t, [3]); ``commands``: (t, [J] targets in ``joints`` order); ``odom``:
    (t, stamp, [3] position, [4] quat wxyz, [3] body linear velocity, [3] angular velocity);
    ``versions`` and ``safety``: (t, text).
    """

    robot: str
    joints: list[str]
    states: list = field(default_factory=list)
    imus: list = field(default_factory=list)
    cmd_vel: list = field(default_factory=list)
    commands: list = field(default_factory=list)
    odom: list = field(default_factory=list)
    versions: list = field(default_factory=list)
    safety: list = field(default_factory=list)


def load_recording(path: str | Path) -> Recording:
    """Read a recorder_node MCAP (topics by the recorded roles, else by their last name)."""
    meta = read_metadata(path)
    rec = Recording(robot=meta.get('robot', ''),
                    joints=[j for j in meta.get('joints', '').split(',') if j])
    # Roles by recorded topic name (remapped topics, e.g. a ros2_control robot's); recordings
    # without them fall back to the last name component.
    roles = {k: v.split('/')[-1] for k, v in json.loads(meta.get('roles', '{}')).items()}
    for topic, _, t, m in read_messages(path):
        name = roles.get(topic, topic.rstrip('/').split('/')[-1])
        if name == 'joint_states':
            rec.states.append((t, header_stamp(m.header), list(m.name), np.asarray(m.position),
                               np.asarray(m.velocity)))
        elif name == 'imu':
            q, w = m.orientation, m.angular_velocity
            rec.imus.append((t, header_stamp(m.header), (q.x, q.y, q.z, q.w), (w.x, w.y, w.z)))
        elif name == 'cmd_vel':
            rec.cmd_vel.append((t, np.array([m.linear.x, m.linear.y, m.angular.z])))
        elif name == 'joint_commands':
            rec.commands.append((t, np.asarray(m.data, dtype=np.float64)))
        elif name == 'odom':
            p, o = m.pose.pose.position, m.pose.pose.orientation
            v, w = m.twist.twist.linear, m.twist.twist.angular
            rec.odom.append((t, header_stamp(m.header), np.array([p.x, p.y, p.z]),
                             np.array([o.w, o.x, o.y, o.z]), np.array([v.x, v.y, v.z]),
                             np.array([w.x, w.y, w.z])))
        elif name == 'model_version':
            rec.versions.append((t, m.data))
        elif name == 'state' and (topic in roles or topic.rstrip('/').endswith('safety/state')):
            rec.safety.append((t, m.data))
    for part in (rec.states, rec.imus, rec.cmd_vel, rec.commands, rec.odom, rec.versions,
                 rec.safety):
        part.sort(key=lambda e: e[0])
    if not rec.commands:
        raise ValueError(f'{path}: no joint_commands recorded; record a running policy '
                         '(record:=run.mcap in the control graph)')
    return rec


@dataclass(frozen=True)
class StateEvent:
    """A recorded ``joint_states``: publish time ``t`` [ns], header ``stamp`` [s], the joint
    ``names`` and their ``position`` and ``velocity`` as published."""

    t: int
    stamp: float
    names: list[str]
    position: np.ndarray
    velocity: np.ndarray


@dataclass(frozen=True)
class ImuEvent:
    """A recorded ``imu``: publish time ``t`` [ns], header ``stamp`` [s], ``orientation``
    (x, y, z, w) and ``angular_velocity`` [3] as published."""

    t: int
    stamp: float
    orientation: Sequence[float]
    angular_velocity: Sequence[float]


@dataclass(frozen=True)
class CmdVelEvent:
    """A ``cmd_vel``: publish time ``t`` [ns], ``command`` [3] (vx, vy, yaw rate)."""

    t: int
    command: np.ndarray


@dataclass(frozen=True)
class SafetyEvent:
    """A recorded ``safety/state``: publish time ``t`` [ns], the ``state``'s name (RL...)."""

    t: int
    state: str


@dataclass(frozen=True)
class CommandEvent:
    """A recorded ``joint_commands``: publish time ``t`` [ns], ``targets`` [J] in the
    recording's joint order."""

    t: int
    targets: np.ndarray


Event = Union[StateEvent, ImuEvent, CmdVelEvent, SafetyEvent, CommandEvent]
# At equal publish times the inputs come first and the command they may have caused last.
EVENT_ORDER = (StateEvent, ImuEvent, CmdVelEvent, SafetyEvent, CommandEvent)


def recording_events(rec: Recording) -> list[Event]:
    """Every input and command of ``rec`` as a typed event, in publish order."""
    out: list[Event] = [StateEvent(*e) for e in rec.states] + [ImuEvent(*e) for e in rec.imus]
    out += [CmdVelEvent(*e) for e in rec.cmd_vel] + [SafetyEvent(*e) for e in rec.safety]
    out += [CommandEvent(*e) for e in rec.commands]
    return sorted(out, key=lambda e: (e.t, EVENT_ORDER.index(type(e))))
