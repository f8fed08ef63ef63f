"""Offline replay of an MCAP recording (recorder_node): actions recomputed, and the recorded
commands replayed in MuJoCo.

**Actions** (:func:`replay_actions`). Every recorded command is one tick of the policy node.
Messages are taken in the order they were published (the publishers' source timestamps), so
the inputs of a tick are the last ``joint_states`` and ``cmd_vel`` published before its
command, and the IMU reading the node pairs with that state (below). The observation is
rebuilt with the policy node's own code (:class:`~.state_input.JointOrder`,
:func:`~.state_input.imu_arrays`, :class:`~.state_input.ObservationAssembler`: joints by name,
the IMU, the command, the last action, the gait clock), the model computes the action, clipped
to the model's ``action_clip`` as the node clips it (the action and the last-action
observation; :data:`~.state_input.CLIP_ACTIONS` only for a policy object without
``action_clip``), and the target ``q0 + scale * a`` (clamped, in the command's joint order) is
compared with the recorded command. A matching tick goes on with its own action as the next
last action; a differing one with the action read back from the recorded command (what the
robot was sent), so a difference is reported where it happens and does not propagate. A
recorded default-pose hold is a hold (last action 0). A ``cmd_vel`` reaches the policy node
some ticks after it was published: until a tick shows the new command in effect, ticks are
tried with the new one, then the one before. The gait clock counts ticks from the policy's
first output; if the recording started later, the clock offset is inferred (the offset whose
first ticks match best) and reported; a first tick that does not match is skipped (the last
action before it is unknown). With a ``safety/state`` topic, only ticks in a state named
``RL...`` are compared (the others are shaped by the safety layer, not the model).

**IMU pairing.** As the node (``PolicyController._imu_for``), a joint state is paired with the
newest IMU reading stamped within ``IMU_SYNC_PERIODS`` control periods of its stamp, either
side, among the last ``IMU_READINGS`` published before its command; never with a reading of
another tick. A state with none (newer readings came, none of its tick) or with a bad one is a
fault on the node: PASSIVE, its command the last accepted pose (damping). Such a tick is
``no_imu``: not compared, last action 0, and the next tick's rate limit starts from its
measured pose (the node leaves PASSIVE there). A command that is not that hold answered a
reading the recording lost: ``skipped``. (The node's clock is not recorded, so readings it
dropped as stale or stamped ahead are not told apart.)

**cmd_vel timeout.** The node zeroes the velocity command once the last ``cmd_vel`` is older
than its ``cmd_vel_timeout_s`` (on its monotonic receive clock) and keeps zero until the next
one. The recorder records no parameter of the policy node, so the value is an argument
(``cmd_vel_timeout_s``, ``claw-rl replay --cmd-vel-timeout``, default the node's 0.5 s; 0: off).
Replay measures the age on publish times (the state's minus the cmd_vel's), which differ from
receive times by the messages' latencies: from :data:`TIMEOUT_SLACK_S` before the timeout,
ticks are tried with the zero command and with the last cmd_vel (the zero one first once the
timeout has passed) until one matches under zero (only a match shows it in effect: a tick that
differs anyway keeps both open); ticks whose commands the recording lost may have gone zero at
any of their states in that window. A tick more than that slack past the timeout that still
matches only under the last cmd_vel shows the node's timeout was longer or off (a recording
made with ``cmd_vel_timeout_s: 0``): it is compared under it and counted
(:attr:`ActionReplay.held_past_timeout`, in the report with the fix).

**Gait clock, superseded states, lost messages.** The node moves its gait clock (and its last
action) once per command it publishes (an answer, a hold, a stand-up target, damping) and at
no other time. Publish order alone cannot tell the three ways a recorded state can lack a
command, so the rule is:

* *Superseded* (the default): recorded states followed by a newer recorded state with no
  command between (a run) are states the node skipped for a newer one queued behind them (a
  backlog worked off at its newest, ``superseded_states`` in its diagnostics): no tick, no
  clock advance, last action and rate-limit origin unchanged. Counted
  (:attr:`ActionReplay.superseded`), not ticks. This is the default because the recorder
  takes commands reliably (depth 1000) and states best effort: a recording loses states, not
  commands.
* *Lost command* (on evidence only): the run is taken as ticks the node answered with commands
  the recording lost (``missing``: the clock advances once per state, the last action is the
  recomputed one, with the cmd_vel in effect or the pending one) only when that reproduces the
  next recorded command and the superseded story does not. A run mixing both, or one followed
  by a hold or a skipped tick, is taken as superseded.
* *Lost state*: a command with no new recorded state since the last command answered a state
  the recording lost: ``skipped`` (the clock advances; the next last action is what was sent).
  A superseded state the recording lost changes nothing (the node did nothing with it). A
  command that matches no story, when the recording lost a state after its state (the next
  recorded stamp is more than 1.5 control periods later), may answer that lost state (the
  newest of a backlog): ``skipped`` too, not judged. Otherwise a tick that matches no story is
  judged as the node's own (superseded) story: a difference.

**Sim** (:func:`compare_sim`). From the first recorded state (joints from ``joint_states``,
trunk from ``odom`` when recorded, else the IMU orientation at the standing height), the
recorded commands drive a nominal MuJoCo world one control period each; the simulated and
recorded joint trajectories are plotted side by side (PNG) with their RMS difference.
"""

from __future__ import annotations

from collections import deque
import copy
from dataclasses import dataclass, field
import io
import json
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..io import atomic_write_bytes
from ..sim.env_config import EnvConfig
from ..sim.robot import RobotSpec
from ..sim.sim_session import SimSession
from .command_shaping import CommandShaper
from .model_swap import policy_clip
from .policy_controller import IMU_READINGS
from .recording import read_messages, read_metadata
from .safety import SafetyConfig
from .state_input import (BadInput, CLIP_ACTIONS, IMU_SYNC_PERIODS, imu_arrays, JointOrder,
                          ObservationAssembler)

NS = 1e-9
# Publish and receive times differ by the messages' latencies (a reliable cmd_vel may wait for
# a repair, a state may queue behind a busy node): this close to the cmd_vel timeout, a tick is
# tried with both the zero command and the last cmd_vel [s].
TIMEOUT_SLACK_S = 0.1


def _stamp(header) -> float:
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
            rec.states.append((t, _stamp(m.header), list(m.name), np.asarray(m.position),
                               np.asarray(m.velocity)))
        elif name == 'imu':
            q, w = m.orientation, m.angular_velocity
            rec.imus.append((t, _stamp(m.header), (q.x, q.y, q.z, q.w), (w.x, w.y, w.z)))
        elif name == 'cmd_vel':
            rec.cmd_vel.append((t, np.array([m.linear.x, m.linear.y, m.angular.z])))
        elif name == 'joint_commands':
            rec.commands.append((t, np.asarray(m.data, dtype=np.float64)))
        elif name == 'odom':
            p, o = m.pose.pose.position, m.pose.pose.orientation
            v, w = m.twist.twist.linear, m.twist.twist.angular
            rec.odom.append((t, _stamp(m.header), np.array([p.x, p.y, p.z]),
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


@dataclass
class ActionReplay:
    """Per tick: ``kind`` ('compared', 'hold', 'skipped', 'missing', 'no_imu' or 'not_rl'),
    ``stamp`` [s] of its state, ``diff`` [J] |recomputed - recorded| (NaN when not compared).
    ``superseded``: recorded states the node skipped for a newer one queued behind (no tick);
    ``cmd_vel_timeout`` [s] the timeout modelled (0: off), ``timeouts`` how often the command
    went zero by it, ``held_past_timeout`` ticks well past it that saw the last cmd_vel still
    (the node's timeout was longer or off)."""

    kind: list[str]
    stamp: np.ndarray
    diff: np.ndarray
    joints: list[str]
    phase_offset: int
    tolerance: float
    recorded_versions: list[str]
    model_version: str
    superseded: int = 0
    cmd_vel_timeout: float = 0.5
    timeouts: int = 0
    held_past_timeout: int = 0

    @property
    def compared(self) -> np.ndarray:
        return np.array([k == 'compared' for k in self.kind])

    @property
    def differing(self) -> np.ndarray:
        """[N] bool: compared ticks whose largest joint difference exceeds the tolerance."""
        worst = np.where(self.compared, np.nan_to_num(self.diff, nan=0.0).max(axis=1), 0.0)
        return worst > self.tolerance

    def segments(self) -> list[tuple[int, int]]:
        """(first, last) tick index of each run of consecutive differing ticks."""
        out: list[tuple[int, int]] = []
        for i in np.flatnonzero(self.differing):
            if out and out[-1][1] == i - 1:
                out[-1] = (out[-1][0], int(i))
            else:
                out.append((int(i), int(i)))
        return out

    def format(self, limit: int = 10) -> str:
        n, c, d = len(self.kind), int(self.compared.sum()), int(self.differing.sum())
        counts = {k: self.kind.count(k) for k in ('hold', 'skipped', 'not_rl',
                                                  'missing', 'no_imu')}
        worst = np.nanmax(self.diff) if c else float('nan')
        # No compared tick is no evidence either way (the exit code is 1 then too).
        verdict = 'NOTHING COMPARED' if c == 0 else 'identical' if d == 0 else 'DIFFERENT'
        lines = [f'replay: {n} ticks, {c} compared ({counts["hold"]} default-pose holds, '
                 f'{counts["skipped"]} skipped: state not recorded or last action unknown, '
                 f'{counts["missing"]} without a '
                 f'recorded command, {counts["no_imu"]} without an IMU reading of their tick '
                 f'(the node damped), {counts["not_rl"]} outside RL); model '
                 f'{self.model_version}, recorded '
                 f'{", ".join(self.recorded_versions) or "no version"}',
                 f'  {self.superseded} states superseded (no command: the node answered a '
                 'newer one queued behind, its gait clock did not move)',
                 self._timeout_line(),
                 f'  gait clock offset {self.phase_offset} ticks; tolerance '
                 f'{self.tolerance:g} rad; max |recomputed - recorded| {worst:.3g} rad',
                 f'  {verdict}: {c - d} of {c} compared ticks match']
        for first, last in self.segments()[:limit]:
            seg = self.diff[first:last + 1]
            j = int(np.nanargmax(np.nanmax(seg, axis=0)))
            lines.append(f'  ticks {first}-{last} (t {self.stamp[first]:.2f}-'
                         f'{self.stamp[last]:.2f} s): max {np.nanmax(seg):.3g} rad at '
                         f'{self.joints[j]}')
        if len(self.segments()) > limit:
            lines.append(f'  ... {len(self.segments()) - limit} more differing stretches')
        return '\n'.join(lines)

    def _timeout_line(self) -> str:
        """The report's line on the cmd_vel timeout modelled and what the ticks showed."""
        if self.cmd_vel_timeout <= 0:
            return '  cmd_vel timeout off (--cmd-vel-timeout 0)'
        line = (f'  cmd_vel timeout {self.cmd_vel_timeout:g} s (the node\'s cmd_vel_timeout_s, '
                f'not recorded): the command went zero {self.timeouts} times')
        if self.held_past_timeout:
            line += (f'; {self.held_past_timeout} ticks more than {TIMEOUT_SLACK_S:g} s past it '
                     'still saw the last cmd_vel: the node\'s timeout was longer or off (give '
                     'it as --cmd-vel-timeout, 0: off)')
        return line


def _events(rec: Recording) -> list[tuple[int, int, Any]]:
    """(publish time, kind, payload) of every input and command, in publish order."""
    events = [(e[0], 0, e) for e in rec.states] + [(e[0], 1, e) for e in rec.imus]
    events += [(e[0], 2, e) for e in rec.cmd_vel] + [(e[0], 3, e) for e in rec.safety]
    events += [(e[0], 4, e) for e in rec.commands]
    return sorted(events, key=lambda e: (e[0], e[1]))


def _is_rl(safety: Optional[str]) -> bool:
    return safety is not None and safety.strip().upper().startswith('RL')


def _shaped(robot: RobotSpec, sent: np.ndarray, last_sent: Optional[np.ndarray]) -> bool:
    """Whether [J] ``sent`` (spec order) sits on a shaping bound: a joint limit or the maximum
    change from ``last_sent`` (then the action that produced it is not ``sent``'s)."""
    eps = 1e-9
    bound = (sent <= robot.joint_lower + eps) | (sent >= robot.joint_upper - eps)
    if last_sent is not None:
        bound |= np.abs(sent - last_sent) >= CommandShaper(robot).max_delta - eps
    return bool(bound.any())


def _act(asm: ObservationAssembler, robot: RobotSpec, policy, order: JointOrder, state, imu,
         command: np.ndarray, last_sent: Optional[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(action [J], target [J] in command order) for one tick under velocity ``command``;
    ``last_sent`` is the previous command sent ([J] spec order), the rate limit's origin."""
    saved = asm.commands.copy()
    asm.set_command(command)
    # obs -> action clipped to the model's action_clip -> target = q0 + scale * a, shaped
    # (joint limits, maximum change per tick) exactly as PolicyController does in RL (after
    # the fade-in).
    clip = asm.action_clip
    action = np.clip(policy(asm.observe(state[1], state[2], imu[1], imu[2])), -clip, clip)
    asm.commands[:] = saved
    shaper = CommandShaper(robot)
    if last_sent is not None:
        shaper.restart(last_sent)
    target, _ = shaper.shape(robot.default_joint_pos + robot.action_scale * action)
    return action, order.to_output(target)


def _clone(asm: ObservationAssembler) -> ObservationAssembler:
    """A copy of ``asm`` (command, last action, gait clock) to try another story on."""
    out = copy.copy(asm)
    out.commands, out.last_action = asm.commands.copy(), asm.last_action.copy()
    out.gait_phase = asm.gait_phase.copy()
    return out


@dataclass(frozen=True)
class _Velocity:
    """The node's velocity command bookkeeping: ``since`` the publish time [ns] of the cmd_vel
    in effect (None: none yet), ``timed_out`` whether it went zero by the timeout since."""

    since: Optional[int] = None
    timed_out: bool = False

    def age(self, t: int) -> Optional[float]:
        """[s] from the cmd_vel in effect to publish time ``t`` [ns] (None: no cmd_vel yet or
        already timed out)."""
        return None if self.since is None or self.timed_out else (t - self.since) * NS


def _imu_of(readings, stamp: float, sync: float):
    """The IMU reading the node pairs with the joint state stamped ``stamp`` (as
    ``PolicyController._imu_for``): of ``readings`` (stamp, [4] quat or None for a bad one, [3]
    gyro), oldest first, the newest stamped within +-``sync`` (a later one of equal stamp
    wins); None when none stamped after ``stamp - sync`` came yet (the node waits for it);
    False when none of this tick came although newer ones did (the node faults)."""
    if not readings or max(r[0] for r in readings) < stamp - sync:
        return None
    best = None
    for reading in readings:
        if abs(reading[0] - stamp) <= sync and (best is None or reading[0] >= best[0]):
            best = reading
    return False if best is None else best


def _answered(asm: ObservationAssembler, vel: _Velocity, robot: RobotSpec, policy,
              order: JointOrder, run: list, last_sent: Optional[np.ndarray], command,
              zero_from: Optional[int]
              ) -> tuple[ObservationAssembler, _Velocity, Optional[np.ndarray]]:
    """The story in which the node answered every (state, imu) of ``run`` and the recording
    lost those commands: a copy of ``asm`` (its velocity command ``command``, (publish time,
    [3]), from the run's first state on; None: the one in effect; zero by the cmd_vel timeout
    from the run's state ``zero_from`` on, None: not) moved on one tick per state with its
    recomputed action (0 when its IMU reading was not recorded), its velocity bookkeeping, and
    the last of those targets (the rate limit's origin; None: unknown)."""
    asm = _clone(asm)
    if command is not None:
        asm.set_command(command[1])
        vel = _Velocity(command[0])
    for k, (state, imu) in enumerate(run):
        if k == zero_from:
            asm.set_command(np.zeros(3))
            vel = _Velocity(vel.since, True)
        tried = None if imu is None else \
            _act(asm, robot, policy, order, state, imu, asm.commands[0], last_sent)
        asm.advance(None if tried is None else tried[0])
        last_sent = None if tried is None else order.from_output(tried[1])
    return asm, vel, last_sent


def _zero_froms(run: list, start: _Velocity, timeout: float) -> list[Optional[int]]:
    """Where in ``run`` (states published with the cmd_vel ``start`` in effect) the command may
    have gone zero by the timeout: the node's story first (the first state past it), then
    none (held), then each other state within TIMEOUT_SLACK_S of it or past it."""
    ages = [start.age(state[3]) for state, _ in run]
    near = [k for k, age in enumerate(ages) if timeout > 0 and age is not None and
            age > timeout - TIMEOUT_SLACK_S]
    past = [k for k in near if ages[k] > timeout][:1]
    return past + [None] + [k for k in near if k not in past]


def _run(rec: Recording, robot: RobotSpec, policy, order: JointOrder, phase_offset: int,
         tolerance: float = 1e-6, max_ticks: Optional[int] = None,
         clip: float = CLIP_ACTIONS, timeout: float = 0.5
         ) -> tuple[list[str], list[float], np.ndarray, dict[str, int]]:
    """Replay the ticks (actions clipped to ``clip``, cmd_vel ``timeout`` [s], 0: off);
    returns (kind, stamp, [N, J] diff) per tick and the counts ``superseded`` (states taken as
    superseded), ``timeouts`` and ``held_past_timeout`` (see the module docstring)."""
    asm = ObservationAssembler(robot, clip)
    if robot.gait_period > 0:
        asm.gait_phase[:] = (phase_offset * robot.control_dt / robot.gait_period) % 1.0
    hold = order.to_output(robot.default_joint_pos)
    sync = IMU_SYNC_PERIODS * robot.control_dt
    # Recorded state stamps, to see a state the recording lost (a gap of > 1.5 periods).
    recorded_stamps = np.sort(np.array([e[1] for e in rec.states], dtype=np.float64))
    state = None  # (stamp, [J] pos, [J] vel, publish time [ns]) of the last recorded state
    used_stamp, safety = None, None
    # (publish time [ns], [3]) a cmd_vel published but not yet seen in effect (asm.commands:
    # in effect, published at vel.since).
    pending = None
    vel = _Velocity()
    # The last IMU readings published, as the node keeps them to pair with a state.
    recent_imus: deque = deque(maxlen=IMU_READINGS)
    last_sent: Optional[np.ndarray] = None
    # [J] the pose of the last state the node accepted (its PASSIVE hold), None: unknown; and
    # whether the last tick was a fault hold (the node leaves PASSIVE from the measured pose).
    accepted, faulted = None, False
    # Whether the last action fed to the observation is the policy's own (not before the first
    # recorded tick: the recording may have started after the policy).
    known = False
    # The recording does not say whether the node faded in (deploy) or started at once
    # (autostart): up to fade_in_s after entering RL, a tick that differs is not compared.
    rl_since, fade_in_s = -np.inf, SafetyConfig().fade_in_s
    # (state, imu) of the states recorded since the last command that got none: superseded
    # (a backlog worked off at its newest) or answered by commands the recording lost.
    unanswered: list = []
    kinds, stamps, diffs = [], [], []
    counts = {'superseded': 0, 'timeouts': 0, 'held_past_timeout': 0}

    def options(story: ObservationAssembler, story_vel: _Velocity, new) -> list:
        """[(label, [3])] the velocity commands the tick may have seen, the node's own story
        first: ``new`` (a cmd_vel not yet seen in effect), then the one in effect, with zero
        from TIMEOUT_SLACK_S before the timeout on (first once it has passed)."""
        out = [] if new is None else [('new', new[1])]
        held = ('held', story.commands[0].copy())
        age = story_vel.age(state[3])
        if timeout > 0 and age is not None and age > timeout - TIMEOUT_SLACK_S:
            zero = ('zero', np.zeros(3))
            return out + ([zero, held] if age > timeout else [held, zero])
        return out + [held]

    def tries_under(story: ObservationAssembler, opts: list, origin):
        """[(action, target)] under each of ``opts``, and the indices of those matching the
        recorded command."""
        out = [_act(story, robot, policy, order, state, imu, c, origin) for _, c in opts]
        return out, [k for k, (_, tgt) in enumerate(out)
                     if np.abs(tgt - recorded).max() <= tolerance]

    def paired(s) -> Optional[tuple]:
        """The valid IMU reading the node pairs with state ``s`` (None: none or a bad one)."""
        reading = _imu_of(recent_imus, s[0], sync)
        return reading if isinstance(reading, tuple) and reading[1] is not None else None

    for t, kind, e in _events(rec):
        if kind == 0:
            if kinds and state is not None and state[0] != used_stamp and e[1] > state[0]:
                # A newer state came and the last one got no recorded command: which story
                # holds is decided at the next command.
                unanswered.append((state, paired(state)))
            try:
                state = (e[1], *order.joint_arrays(e[2], e[3], e[4]), t)
            except BadInput:
                state = None
        elif kind == 1:
            try:
                reading = (e[1], *imu_arrays(e[2], e[3]))
            except BadInput:
                reading = (e[1], None, None)  # the node keeps it: its tick faults
            if reading[1] is None or np.isfinite(e[1]):  # a bad stamp alone: not kept
                recent_imus.append(reading)
        elif kind == 2:
            pending = (t, np.array(e[1], dtype=np.float64))
        elif kind == 3:
            if e[1].strip().upper().startswith('RL') and not _is_rl(safety):
                rl_since = t  # the command fades in from here (autostart: no fade)
            safety = e[1]
        else:
            recorded, run, unanswered = e[1], unanswered, []
            diff = np.full(robot.num_joints, np.nan)
            lost = False  # whether the run's commands were lost (else it was superseded)
            # The policy node acts on a state and the IMU reading of its tick.
            new_state = state is not None and state[0] != used_stamp
            reading = _imu_of(recent_imus, state[0], sync) if new_state else None
            imu = reading if isinstance(reading, tuple) and reading[1] is not None else None
            # What the robot was sent, as an action (the next tick's last action).
            sent = (order.from_output(recorded) - robot.default_joint_pos) / robot.action_scale
            # Without an IMU reading of its tick (or with a bad one) the node faults and holds
            # the last accepted pose: this state's with a bad reading, the one before without.
            fault_pose = state[1] if isinstance(reading, tuple) else \
                accepted if reading is False else None
            if np.array_equal(recorded, hold):
                tick = 'hold'
                asm.advance(None)
                known = True  # after a hold the policy's last action is 0, as here
            elif imu is None and fault_pose is not None and \
                    np.abs(order.to_output(fault_pose) - recorded).max() <= tolerance:
                tick = 'no_imu'  # a fault hold (damping): no command from the model
                asm.advance(None)
                known = True
                accepted = fault_pose
            elif imu is None:
                tick = 'skipped'  # the state or reading this command answered was not recorded
                asm.advance(sent)
                known = not _shaped(robot, order.from_output(recorded), last_sent)
                accepted = state[1] if new_state and reading is not None else None
            else:
                # Leaving PASSIVE (the first command, after a fault), the rate limit starts
                # from the measured pose (PolicyController restarts its shaper there), else
                # from the last sent.
                passive = faulted or (safety or '').strip().upper().startswith('PASSIVE')
                pose = np.clip(state[1], robot.joint_lower, robot.joint_upper)
                if last_sent is None or passive:
                    last_sent = pose
                # A published cmd_vel reaches the policy node some time later (a reliable
                # message may wait for a repair): until a tick shows the new command in
                # effect, each tick is tried with the new one, then the one before it (and
                # around the cmd_vel timeout with zero).
                was_timed_out = vel.timed_out
                opts = options(asm, vel, pending)
                tries, hits = tries_under(asm, opts, last_sent)
                # Not as superseded: as answered (commands lost), if that reproduces this
                # command; a pending cmd_vel may have been in effect from the run's start, and
                # a run past the cmd_vel timeout may have seen zero or the command held.
                for effect in ([] if hits or not run else [None] if pending is None
                               else [None, pending]):
                    start = vel if effect is None else _Velocity(effect[0])
                    for zero_from in _zero_froms(run, start, timeout):
                        other, other_vel, origin = _answered(asm, vel, robot, policy, order,
                                                             run, last_sent, effect, zero_from)
                        origin = pose if origin is None or passive else origin
                        new = pending if effect is None else None
                        other_opts = options(other, other_vel, new)
                        other_tries, other_hits = tries_under(other, other_opts, origin)
                        if other_hits:
                            lost, asm, vel, last_sent = True, other, other_vel, origin
                            pending, opts, tries, hits = new, other_opts, other_tries, other_hits
                            break
                    if lost:
                        break
                matched = bool(hits)
                # The story the tick shows (or, when nothing matches, the node's own).
                pick = hits[0] if hits else 0
                action, target = tries[pick]
                label = opts[pick][0]
                age = vel.age(state[3])
                if label == 'new':
                    asm.set_command(pending[1])  # seen in effect (or nothing matches anyway)
                    vel, pending = _Velocity(pending[0]), None
                elif label == 'zero' and matched:
                    # Timed out: zero until the next cmd_vel (on evidence only: a tick that
                    # differs for another reason must not end the command for good).
                    asm.set_command(np.zeros(3))
                    vel = _Velocity(vel.since, True)
                elif matched and timeout > 0 and age is not None and \
                        age > timeout + TIMEOUT_SLACK_S:
                    counts['held_past_timeout'] += 1
                counts['timeouts'] += vel.timed_out and not was_timed_out
                # In the fade-in window a tick counts only if it matches unfaded (autostart).
                fading = t - rl_since < fade_in_s and not matched
                rl = safety is None or (_is_rl(safety) and not fading)
                # A recorded state more than 1.5 periods after this one: the recording lost
                # the state(s) between, and a command that does not match may answer one.
                later = recorded_stamps[np.searchsorted(recorded_stamps, state[0], 'right'):]
                gap = later.size > 0 and later[0] - state[0] > 1.5 * robot.control_dt
                if not matched and (not known or gap):
                    # The last action is not the policy's own (the first recorded tick, one
                    # after a command the shaping had cut) or the command may answer a state
                    # the recording lost: this tick cannot be judged.
                    tick = 'skipped'
                else:
                    tick = 'compared' if rl else 'not_rl'
                    if rl:
                        diff = np.abs(target - recorded)
                # A matching tick continues with its own action (exact, even when clamped),
                # a differing one with what was sent, so one difference does not propagate.
                asm.advance(action if matched else sent)
                known = matched or not _shaped(robot, order.from_output(recorded), last_sent)
                accepted = state[1]
            faulted = tick == 'no_imu'
            # The run before this command: ticks whose command was lost, or superseded states.
            if lost:
                kinds += ['missing'] * len(run)
                stamps += [s[0] for s, _ in run]
                diffs += [np.full(robot.num_joints, np.nan)] * len(run)
            else:
                counts['superseded'] += len(run)
            kinds.append(tick)
            stamps.append(state[0] if state is not None else float('nan'))
            diffs.append(diff)
            if state is not None:
                used_stamp = state[0]
            last_sent = order.from_output(recorded)
            if max_ticks is not None and len(kinds) >= max_ticks:
                break
    return kinds, stamps, np.array(diffs).reshape(-1, robot.num_joints), counts


def action_clip_of(policy) -> float:
    """The clip the policy node applies with ``policy`` (the action and the last-action
    observation): its ``action_clip`` metadata, checked as the node checks it (ModelRejected:
    the node refuses to serve such a model); CLIP_ACTIONS for a policy object without
    ``action_clip`` (a plain function)."""
    if not hasattr(policy, 'action_clip'):
        return CLIP_ACTIONS
    return policy_clip(policy)


def replay_actions(rec: Recording, robot: RobotSpec, policy, model_version: str = '',
                   tolerance: float = 1e-6, cmd_vel_timeout_s: float = 0.5) -> ActionReplay:
    """Recompute every tick's action with ``policy`` (obs [obs_dim] -> action [J]).

    ``cmd_vel_timeout_s``: the policy node's parameter of that name (0: off); recordings do
    not hold it (recorder_node records no parameters), so give the node's value.
    """
    if not (np.isfinite(cmd_vel_timeout_s) and cmd_vel_timeout_s >= 0):
        raise ValueError(f'cmd_vel_timeout_s = {cmd_vel_timeout_s!r}; give the policy node\'s '
                         'cmd_vel_timeout_s, a finite number >= 0 [s] (0: off)')
    order = JointOrder(robot, rec.joints or None)
    clip = action_clip_of(policy)
    offset = 0
    if robot.gait_period > 0:
        # The gait clock offset whose first ticks match the recording best (0 when the
        # recording holds the policy's first output).
        period = max(1, round(robot.gait_period / robot.control_dt))
        probe = 2 * period

        def matches(k: int) -> int:
            d = np.nan_to_num(_run(rec, robot, policy, order, k, tolerance, probe, clip,
                                   cmd_vel_timeout_s)[2], nan=1.0)
            return int((d.max(axis=1) <= tolerance).sum())
        # Most matching ticks wins; 0 unless another offset matches strictly better (a model
        # that never matches, e.g. another one, keeps the recording's own start).
        scores = [matches(k) for k in range(period)]
        offset = int(np.argmax(scores))
    kinds, stamps, diffs, counts = _run(rec, robot, policy, order, offset, tolerance, None,
                                        clip, cmd_vel_timeout_s)
    versions = list(dict.fromkeys(v for _, v in rec.versions))
    return ActionReplay(kinds, np.asarray(stamps), diffs, order.output, offset, tolerance,
                        versions, model_version, counts['superseded'], cmd_vel_timeout_s,
                        counts['timeouts'], counts['held_past_timeout'])


@dataclass
class SimComparison:
    """Recorded vs simulated joint positions [T, J] (spec order) at times ``t`` [T] s."""

    t: np.ndarray
    recorded: np.ndarray
    simulated: np.ndarray
    joints: list[str]

    def rms(self) -> np.ndarray:
        """[J] root-mean-square difference per joint [rad]."""
        return np.sqrt(np.mean((self.simulated - self.recorded) ** 2, axis=0))

    def format(self) -> str:
        rms = self.rms()
        worst = int(np.argmax(rms))
        return (f'sim vs recorded over {len(self.t)} ticks ({self.t[-1] - self.t[0]:.2f} s): '
                f'RMS joint error mean {rms.mean():.4f} rad, worst {rms[worst]:.4f} rad '
                f'({self.joints[worst]})')


def _initial_state(sim: SimSession, rec: Recording, order: JointOrder, first) -> None:
    """Write the recorded state ``first`` (and the odom/IMU trunk state) into the sim world."""
    p = sim.physics
    pos, vel = order.joint_arrays(first[2], first[3], first[4])
    qpos = p.standing_qpos.copy()
    qvel = np.zeros(p.qvel.shape[1])
    odom = [o for o in rec.odom if o[1] == first[1]]
    imu = [i for i in rec.imus if i[1] == first[1]]
    if odom:
        qpos[0:3], qpos[3:7] = odom[0][2], odom[0][3]
        # Free joint: world-frame linear velocity (rotate the body-frame one), body angular.
        w, x, y, z = odom[0][3]
        rot = np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])
        qvel[0:3], qvel[3:6] = rot @ odom[0][4], odom[0][5]
    elif imu:
        qpos[3:7] = imu_arrays(imu[0][2], imu[0][3])[0]
    qpos[p.qadr], qvel[p.vadr] = pos, vel
    sim.set_state(qpos, qvel)


def compare_sim(rec: Recording, robot: RobotSpec, seconds: Optional[float] = None
                ) -> SimComparison:
    """Drive a nominal MuJoCo world with the recorded commands from the first recorded state."""
    order = JointOrder(robot, rec.joints or None)
    events = _events(rec)
    first_cmd = next(i for i, e in enumerate(events) if e[1] == 4)
    first = [e[2] for e in events[:first_cmd] if e[1] == 0]
    if not first:
        raise ValueError('no joint_states recorded before the first command: nothing to start '
                         'the simulation from')
    start = first[-1]
    sim = SimSession(robot, EnvConfig(num_envs=1))
    try:
        _initial_state(sim, rec, order, start)
        t, recorded, simulated = [start[1]], [order.joint_arrays(*start[2:5])[0]], \
            [sim.readings().joint_pos]
        sent: list[np.ndarray] = []
        last = order.from_output(events[first_cmd][2][1])
        for _, kind, e in events[first_cmd:]:
            if kind == 4:
                sent.append(order.from_output(e[1]))
            elif kind == 0 and e[1] > t[-1] + 0.5 * robot.control_dt:
                # The next recorded state, n control periods later: n steps, each with the
                # next command sent meanwhile (the last one again if commands were lost).
                for k in range(max(1, round((e[1] - t[-1]) / robot.control_dt))):
                    last = sent[k] if k < len(sent) else last
                    sim.step(np.clip(last, robot.joint_lower, robot.joint_upper))
                sent = []
                t.append(e[1])
                recorded.append(order.joint_arrays(e[2], e[3], e[4])[0])
                simulated.append(sim.readings().joint_pos)
                if seconds is not None and t[-1] - t[0] >= seconds:
                    break
    finally:
        sim.close()
    return SimComparison(np.asarray(t), np.asarray(recorded), np.asarray(simulated),
                         list(robot.joint_names))


def plot_comparison(cmp: SimComparison, path: str | Path, title: str = '') -> Path:
    """A PNG: one panel per joint, recorded (solid) vs simulated (dashed) position [rad]."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    n = len(cmp.joints)
    cols = 3
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.2 * rows), sharex=True,
                             squeeze=False)
    t = cmp.t - cmp.t[0]
    rms = cmp.rms()
    for j, ax in enumerate(axes.flat):
        if j >= n:
            ax.axis('off')
            continue
        ax.plot(t, cmp.recorded[:, j], 'k-', lw=1.2, label='recorded')
        ax.plot(t, cmp.simulated[:, j], 'C1--', lw=1.2, label='MuJoCo replay')
        ax.set_title(f'{cmp.joints[j]} (RMS {rms[j]:.3f} rad)', fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel('time [s]', fontsize=8)
    fig.suptitle(title or 'joint position: recorded vs recorded commands replayed in MuJoCo',
                 fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format='png', dpi=90)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)
