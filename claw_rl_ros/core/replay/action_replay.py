"""Offline replay of an MCAP recording (recorder_node): every tick's action recomputed from
what the policy node saw, and compared with the command it sent (``claw-rl replay --model``).
The recorded commands replayed in MuJoCo are :mod:`.sim_comparison`'s; the recording read as
typed events is :mod:`.recording_events`'s.

**Actions** (:func:`replay_actions`). Every recorded command is one tick of the policy node.
Messages are taken in the order they were published (the publishers' source timestamps), so the
inputs of a tick are the last ``joint_states`` and ``cmd_vel`` published before its command, and
the IMU reading the node pairs with that state (below). The observation is rebuilt with the policy
node's own code (:class:`~..control.state_input.JointOrder`,
:func:`~..control.state_input.imu_arrays`, :class:`~..control.state_input.ObservationAssembler`:
joints by name, the IMU, the command, the last action, the gait clock), the model computes the
action, clipped to the model's ``action_clip`` as the node clips it (the action and the last-action
observation; :data:`~..control.state_input.CLIP_ACTIONS` only for a policy object without
``action_clip``), and the target ``q0 + scale * a`` (clamped, in the command's joint order) is
compared with the recorded command. A matching tick goes on with its own action as the next last
action; a differing one with the action read back from the recorded command (what the robot was
sent), so a difference is reported where it happens and does not propagate. A recorded default-pose
hold is a hold (last action 0). A ``cmd_vel`` reaches the policy node some ticks after it was
published: until a tick shows the new command in effect, ticks are tried with the new one, then the
one before. The gait clock runs from the policy's first output by the stamps (below); if the
recording started later, the clock offset is inferred in control periods (the offset whose first
ticks match best) and reported (so such a recording of states at another rate than the control
rate, or with jitter, does not match: the offset is no whole number of periods); a first tick
that does not match is skipped (the last action before it is unknown). With a ``safety/state``
topic, only ticks in a state named ``RL...`` are compared (the others are shaped by the safety
layer, not the model).

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
no other time, by the time the command stands for (``PolicyController._tick_elapsed``; the
default rate limit, ``CommandShaper.step_limit``, follows it too): a command that answers a
state, the time since the state before it (the one the previous command answered, or a
superseded one skipped since), by their stamps; the first command, a hold that answers no new
state (the watchdog's or a dropped state's, at the last accepted pose; a state without an IMU
reading of its tick) and the command after it, one control period. Replay passes the same time
to the clock, the rate limit and the test of a command on a shaping bound. A command that
answered a state the recording lost (below), of unknown stamp, stands for the typical interval
of the recorded stamps (their median nearby), and so does the command after it: exact at a
steady rate (48 or 52 Hz), close under jitter. A gap of more than 1.5 control periods before a
tick's state is the robot's (the tick stands for it) unless that tick or the next one matches
only as if it stood for the typical interval (the recording lost a superseded state in the
gap). Publish order alone cannot tell the three ways a recorded state can lack a command, so
the rule is:

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

**Code.** :func:`~.recording_events.recording_events` turns a :class:`~.recording_events.Recording`
into typed events in publish order; :class:`Replayer` holds what the node holds and takes them one
method per kind (``on_state`` ... ``on_command``); each command is one tick, tried under the
stories above (``_Story``: observation, velocity bookkeeping, rate-limit origin, the time the
tick stands for).
"""

from __future__ import annotations

from collections import deque
import copy
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Optional

import numpy as np

from ..control.command_shaping import CommandShaper
from ..control.model_swap import policy_clip
from ..control.policy_controller import IMU_READINGS
from ..control.safety import SafetyConfig
from ..control.state_input import (BadInput, CLIP_ACTIONS, IMU_SYNC_PERIODS, imu_arrays,
                                   JointOrder, ObservationAssembler)
from .recording_events import (CmdVelEvent, CommandEvent, ImuEvent, NS, Recording,
                               recording_events, SafetyEvent, StateEvent)
from ..sim.observations import bounded_elapsed
from ..sim.robot_spec import RobotSpec

# Publish and receive times differ by the messages' latencies (a reliable cmd_vel may wait for
# a repair, a state may queue behind a busy node): this close to the cmd_vel timeout, a tick is
# tried with both the zero command and the last cmd_vel [s].
TIMEOUT_SLACK_S = 0.1
# Recorded states further apart than this many control periods: states were lost between, by
# the robot or by the recording.
GAP_PERIODS = 1.5


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


def _is_rl(safety: Optional[str]) -> bool:
    return safety is not None and safety.strip().upper().startswith('RL')


def _shaped(robot: RobotSpec, sent: np.ndarray, last_sent: Optional[np.ndarray],
            elapsed: Optional[float] = None) -> bool:
    """Whether [J] ``sent`` (spec order) sits on a shaping bound: a joint limit or the maximum
    change from ``last_sent`` for a tick that stood for ``elapsed`` [s] (None: one control
    period); then the action that produced it is not ``sent``'s."""
    eps = 1e-9
    bound = (sent <= robot.joint_lower + eps) | (sent >= robot.joint_upper - eps)
    if last_sent is not None:
        bound |= np.abs(sent - last_sent) >= CommandShaper(robot).step_limit(elapsed) - eps
    return bool(bound.any())


def _clone(asm: ObservationAssembler) -> ObservationAssembler:
    """A copy of ``asm`` (command, last action, gait clock) to try another story on."""
    out = copy.copy(asm)
    out.commands, out.last_action = asm.commands.copy(), asm.last_action.copy()
    out.gait_phase = asm.gait_phase.copy()
    out.history = copy.deepcopy(asm.history)
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


@dataclass(frozen=True)
class _Measured:
    """A joint state as the node takes it: header ``stamp`` [s], ``position`` and ``velocity``
    [J] in spec order, publish time ``t`` [ns]."""

    stamp: float
    position: np.ndarray
    velocity: np.ndarray
    t: int


@dataclass(frozen=True)
class _Reading:
    """An IMU reading as the node keeps it: ``stamp`` [s], ``quat`` [4] wxyz and ``gyro`` [3];
    both None for a bad reading (the node keeps it: its tick faults)."""

    stamp: float
    quat: Optional[np.ndarray]
    gyro: Optional[np.ndarray]


class Pairing(Enum):
    """A joint state without an IMU reading of its tick to pair with."""

    WAITING = 'waiting'  # no new state, or no reading stamped near it came yet (the node waits)
    MISSED = 'missed'  # newer readings came, none of its tick (the node faults)


def _valid(reading: _Reading | Pairing) -> Optional[_Reading]:
    """``reading`` if it is a good one (None: none, or a bad one)."""
    return reading if isinstance(reading, _Reading) and reading.quat is not None else None


@dataclass(frozen=True)
class _Unanswered:
    """A recorded state that got no recorded command (superseded, or answered by a command the
    recording lost) and the valid IMU reading the node pairs with it (None: none)."""

    state: _Measured
    imu: Optional[_Reading]


@dataclass(frozen=True)
class _Option:
    """A velocity ``command`` [3] a tick may have seen, by ``label``: 'new' (a cmd_vel not yet
    seen in effect), 'held' (the one in effect) or 'zero' (gone zero by the timeout)."""

    label: str
    command: np.ndarray


@dataclass(frozen=True)
class _Outcome:
    """What the model does on a tick: ``action`` [J] and ``target`` [J] in command order,
    from observation ``frame`` [obs_dim] (the newest of the model's window)."""

    action: np.ndarray
    target: np.ndarray
    frame: np.ndarray


@dataclass
class _Story:
    """One account of the node before a tick: its observation (velocity command, last action,
    gait clock), its velocity bookkeeping, the cmd_vel published but not yet seen in effect
    (None: none), the rate limit's ``origin`` ([J] spec order, None: unknown) and the time the
    tick stands for, ``elapsed`` [s] (None: one control period)."""

    asm: ObservationAssembler
    vel: _Velocity
    pending: Optional[CmdVelEvent]
    origin: Optional[np.ndarray]
    elapsed: Optional[float] = None


@dataclass(frozen=True)
class _Trial:
    """A story tried on a tick: the velocity ``options`` (the node's own story first), the
    outcome under each, and the indices of those that reproduce the recorded command."""

    options: list[_Option]
    outcomes: list[_Outcome]
    hits: list[int]

    @property
    def pick(self) -> int:
        """The option the tick shows (or, when nothing matches, the node's own)."""
        return self.hits[0] if self.hits else 0


@dataclass
class _Ticks:
    """Per tick ``kind``, ``stamp`` [s] of its state and ``diff`` [J]; and the counts (see
    :class:`ActionReplay`)."""

    num_joints: int
    kind: list[str] = field(default_factory=list)
    stamp: list[float] = field(default_factory=list)
    diff: list[np.ndarray] = field(default_factory=list)
    superseded: int = 0
    timeouts: int = 0
    held_past_timeout: int = 0

    def add(self, kind: str, stamp: float, diff: Optional[np.ndarray] = None) -> None:
        self.kind.append(kind)
        self.stamp.append(stamp)
        self.diff.append(np.full(self.num_joints, np.nan) if diff is None else diff)

    def diffs(self) -> np.ndarray:
        """[N, J] |recomputed - recorded| (NaN where not compared)."""
        return np.array(self.diff).reshape(-1, self.num_joints)


def _zero_froms(run: list[_Unanswered], start: _Velocity, timeout: float
                ) -> list[Optional[int]]:
    """Where in ``run`` (states published with the cmd_vel ``start`` in effect) the command may
    have gone zero by the timeout: the node's story first (the first state past it), then
    none (held), then each other state within TIMEOUT_SLACK_S of it or past it."""
    ages = [start.age(u.state.t) for u in run]
    near = [k for k, age in enumerate(ages) if timeout > 0 and age is not None and
            age > timeout - TIMEOUT_SLACK_S]
    past = [k for k in near if ages[k] > timeout][:1]
    return past + [None] + [k for k in near if k not in past]


class Replayer:
    """The policy node replayed on a recording's events (the rules: the module docstring), one
    method per event kind; :meth:`run` returns the ticks. Actions clipped to ``clip``, the
    cmd_vel ``timeout`` [s] (0: off), the gait clock started ``phase_offset`` ticks in."""

    def __init__(self, rec: Recording, robot: RobotSpec, policy, order: JointOrder,
                 phase_offset: int = 0, tolerance: float = 1e-6, clip: float = CLIP_ACTIONS,
                 timeout: float = 0.5):
        self.rec, self.robot, self.policy, self.order = rec, robot, policy, order
        self.tolerance, self.timeout = tolerance, timeout
        self.hold = order.to_output(robot.default_joint_pos)
        self.sync = IMU_SYNC_PERIODS * robot.control_dt
        # Recorded state stamps, to see a state the recording lost (a gap of > 1.5 periods).
        self.recorded_stamps = np.sort(np.array([e[1] for e in rec.states], dtype=np.float64))
        # The node's story: observation, velocity bookkeeping (``asm.commands``: the cmd_vel in
        # effect, published at ``vel.since``) and a cmd_vel published, not yet seen in effect.
        self.asm = ObservationAssembler(robot, clip)
        self.asm.set_history(getattr(policy, 'obs_history', 1))
        if robot.gait_period > 0:
            self.asm.gait_phase[:] = (phase_offset * robot.control_dt / robot.gait_period) % 1.0
        self.vel, self.pending = _Velocity(), None
        self.state: Optional[_Measured] = None  # the last recorded state (None: a bad one)
        self.used_stamp: Optional[float] = None  # the stamp of the state the last tick acted on
        # The gait clock's reference (PolicyController._clock_stamp): the stamp the next
        # command's time counts from (None: none, one control period), or ``clock_lost``: the
        # last command answered a state the recording lost (the typical interval).
        self.clock: Optional[float] = None
        self.clock_lost = False
        # [phase] the last tick followed a gap: the next one may show it stood for the typical
        # interval (a superseded state the recording lost in the gap), by this much less.
        self.retime: Optional[float] = None
        self.safety: Optional[str] = None
        # The last IMU readings published, as the node keeps them to pair with a state.
        self.recent_imus: deque[_Reading] = deque(maxlen=IMU_READINGS)
        self.last_sent: Optional[np.ndarray] = None  # [J] the last command sent (spec order)
        # [J] the pose of the last state the node accepted (its PASSIVE hold), None: unknown;
        # and whether the last tick was a fault hold (the node leaves PASSIVE from the pose).
        self.accepted: Optional[np.ndarray] = None
        self.faulted = False
        # Whether the last action fed to the observation is the policy's own (not before the
        # first recorded tick: the recording may have started after the policy).
        self.known = False
        # The recording does not say whether the node faded in (deploy) or started at once
        # (autostart): up to fade_in_s after entering RL, a tick that differs is not compared.
        self.rl_since, self.fade_in_s = -np.inf, SafetyConfig().fade_in_s
        # The states recorded since the last command that got none: superseded (a backlog
        # worked off at its newest) or answered by commands the recording lost.
        self.unanswered: list[_Unanswered] = []
        self.ticks = _Ticks(robot.num_joints)

    def run(self, max_ticks: Optional[int] = None) -> _Ticks:
        """Replay the recording's events (stop after ``max_ticks`` ticks; None: all)."""
        handlers = {StateEvent: self.on_state, ImuEvent: self.on_imu,
                    CmdVelEvent: self.on_cmd_vel, SafetyEvent: self.on_safety,
                    CommandEvent: self.on_command}
        for event in recording_events(self.rec):
            handlers[type(event)](event)
            if isinstance(event, CommandEvent) and max_ticks is not None and \
                    len(self.ticks.kind) >= max_ticks:
                break
        return self.ticks

    def on_state(self, event: StateEvent) -> None:
        """A joint state: the node's next input (None when the node drops it as bad)."""
        last = self.state
        if self.ticks.kind and last is not None and last.stamp != self.used_stamp and \
                event.stamp > last.stamp:
            # A newer state came and the last one got no recorded command: which story holds
            # is decided at the next command.
            self.unanswered.append(_Unanswered(last, _valid(self._imu_of(last.stamp))))
        try:
            pos, vel = self.order.joint_arrays(event.names, event.position, event.velocity)
            self.state = _Measured(event.stamp, pos, vel, event.t)
        except BadInput:
            self.state = None

    def on_imu(self, event: ImuEvent) -> None:
        """An IMU reading, kept to pair with a state (a bad one too: its tick faults)."""
        try:
            reading = _Reading(event.stamp, *imu_arrays(event.orientation,
                                                        event.angular_velocity))
        except BadInput:
            reading = _Reading(event.stamp, None, None)
        if reading.quat is None or np.isfinite(event.stamp):  # a bad stamp alone: not kept
            self.recent_imus.append(reading)

    def on_cmd_vel(self, event: CmdVelEvent) -> None:
        """A cmd_vel: pending until a tick shows it in effect."""
        self.pending = CmdVelEvent(event.t, np.array(event.command, dtype=np.float64))

    def on_safety(self, event: SafetyEvent) -> None:
        """A safety state: only ticks in RL are the model's own."""
        if event.state.strip().upper().startswith('RL') and not _is_rl(self.safety):
            self.rl_since = event.t  # the command fades in from here (autostart: no fade)
        self.safety = event.state

    def on_command(self, event: CommandEvent) -> None:
        """A recorded command: one tick of the node, told by the story it shows, and logged."""
        recorded, state = event.targets, self.state
        run, self.unanswered = self.unanswered, []
        # The gait clock's reference with the run superseded (the node's own story); the one
        # before the run for the story in which the recording lost the run's commands.
        before = self.clock, self.clock_lost
        self.clock, self.clock_lost = self._reference(run)
        retime, self.retime = self.retime, None
        # The policy node acts on a state and the IMU reading of its tick.
        new_state = state is not None and state.stamp != self.used_stamp
        reading = self._imu_of(state.stamp) if new_state else Pairing.WAITING
        imu = _valid(reading)
        # What the robot was sent, as an action (the next tick's last action).
        robot = self.robot
        sent = (self.order.from_output(recorded) - robot.default_joint_pos) / robot.action_scale
        # Without an IMU reading of its tick (or with a bad one) the node faults and holds
        # the last accepted pose: this state's with a bad reading, the one before without.
        fault_pose = state.position if isinstance(reading, _Reading) else \
            self.accepted if reading is Pairing.MISSED else None
        diff, lost = None, False
        if np.array_equal(recorded, self.hold):
            kind = self._hold(recorded, new_state)
        elif imu is None and fault_pose is not None and \
                self._close(self.order.to_output(fault_pose), recorded):
            kind = self._fault_hold(fault_pose, reading)
        elif imu is None:
            kind = self._unanswerable(recorded, sent, reading, new_state)
        else:
            kind, diff, lost = self._answer(event, imu, sent, run, before, retime)
        self.faulted = kind == 'no_imu'
        self._log(kind, diff, run, lost)
        if state is not None:
            self.used_stamp = state.stamp
        self.last_sent = self.order.from_output(recorded)

    def _hold(self, recorded: np.ndarray, new_state: bool) -> str:
        """A recorded default-pose hold: no command from the model."""
        self.asm.advance(None, None, self._step(recorded, new_state))
        self.known = True  # after a hold the policy's last action is 0, as here
        return 'hold'

    def _fault_hold(self, pose: np.ndarray, reading: _Reading | Pairing) -> str:
        """A fault hold (damping) at ``pose``: no command from the model. With a bad reading
        the node accepted the state (its time counts); without one it answered none."""
        if isinstance(reading, _Reading):
            elapsed = self._step(None, True)
        else:
            elapsed, self.clock, self.clock_lost = None, None, False
        self.asm.advance(None, None, elapsed)
        self.known = True
        self.accepted = pose
        return 'no_imu'

    def _unanswerable(self, recorded: np.ndarray, sent: np.ndarray,
                      reading: _Reading | Pairing, new_state: bool) -> str:
        """A command that answered a state or reading the recording lost."""
        elapsed = self._step(recorded, new_state)
        self.asm.advance(sent, None, elapsed)
        self.known = not _shaped(self.robot, self.order.from_output(recorded), self.last_sent,
                                 elapsed)
        self.accepted = self.state.position if reading is not Pairing.WAITING else None
        return 'skipped'

    def _reference(self, run: list[_Unanswered]) -> tuple[Optional[float], bool]:
        """(self.clock, self.clock_lost) with ``run`` superseded: the node's clock then counts
        from the newest of them, unless it had no reference."""
        if not run or (self.clock is None and not self.clock_lost):
            return self.clock, self.clock_lost
        newest = max(unanswered.state.stamp for unanswered in run)
        return (newest if self.clock is None else max(self.clock, newest)), False

    def _elapsed(self, stamp: float, clock: Optional[float], lost: bool) -> Optional[float]:
        """[s] a command answering the state stamped ``stamp`` stands for, from the reference
        ``clock`` (None: none, one control period; ``lost``: a state the recording lost, the
        typical interval); None too for a stamp not after it (a clock that went back)."""
        if lost:
            return self._interval(stamp)
        return None if clock is None or not stamp > clock else stamp - clock

    def _step(self, recorded: Optional[np.ndarray], new_state: bool) -> Optional[float]:
        """[s] a command other than the model's answer stands for, the reference moved on:
        answering the new recorded state, the time since the reference; with no new state, a
        hold at the last accepted pose (the watchdog's, a dropped state's) answered none (one
        control period, and the next command too); another answered a state the recording
        lost (the typical interval, and the next command too)."""
        if new_state:
            elapsed = self._elapsed(self.state.stamp, self.clock, self.clock_lost)
            self.clock, self.clock_lost = self.state.stamp, False
            return elapsed
        if self.accepted is not None and \
                self._close(self.order.to_output(self.accepted), recorded):
            self.clock, self.clock_lost = None, False
            return None
        stamp = self.used_stamp if self.used_stamp is not None else -np.inf
        self.clock, self.clock_lost = None, True
        return self._interval(stamp)

    def _interval(self, stamp: float) -> Optional[float]:
        """[s] the typical interval of the recorded states around ``stamp``: the median of the
        positive differences of the 16 stamps nearest it, 8 either side (None: none)."""
        stamps = self.recorded_stamps
        end = int(np.searchsorted(stamps, stamp, 'right'))
        diffs = np.diff(stamps[max(0, end - 8):end + 8])
        diffs = diffs[diffs > 0]
        return float(np.median(diffs)) if diffs.size else None

    def _answer(self, event: CommandEvent, imu: _Reading, sent: np.ndarray,
                run: list[_Unanswered], before: tuple[Optional[float], bool],
                retime: Optional[float]) -> tuple[str, Optional[np.ndarray], bool]:
        """A tick the model answered: (kind, diff or None, whether the run's commands were lost)
        under the story that reproduces the command (the node's own, else the other account of
        a gap before it or before the last tick (``retime``, :meth:`_retimed`), else one in
        which the recording lost the run's commands, the gait clock's reference ``before`` the
        run; when none does, the node's own)."""
        recorded, state = event.targets, self.state
        # Leaving PASSIVE (the first command, after a fault), the rate limit starts from the
        # measured pose (PolicyController restarts its shaper there), else from the last sent.
        passive = self.faulted or (self.safety or '').strip().upper().startswith('PASSIVE')
        pose = np.clip(state.position, self.robot.joint_lower, self.robot.joint_upper)
        origin = pose if self.last_sent is None or passive else self.last_sent
        was_timed_out = self.vel.timed_out
        story = _Story(self.asm, self.vel, self.pending, origin,
                       self._elapsed(state.stamp, self.clock, self.clock_lost))
        trial = self._trial(story, imu, recorded)
        if not trial.hits:
            story, trial = self._retimed(story, trial, imu, recorded, retime)
        found = None if trial.hits or not run else \
            self._lost_commands(story, run, imu, recorded, pose, passive, before)
        if found is not None:
            story, trial = found
        self.asm, self.vel, self.pending = story.asm, story.vel, story.pending
        matched, outcome = bool(trial.hits), trial.outcomes[trial.pick]
        self._velocity_seen(trial.options[trial.pick].label, matched, state.t)
        self.ticks.timeouts += self.vel.timed_out and not was_timed_out
        kind, diff = self._judge(event, outcome.target, matched)
        # A matching tick continues with its own action (exact, even when clamped), a
        # differing one with what was sent, so one difference does not propagate; both with
        # the frame the node acted on (a model with memory keeps it in its window).
        self.asm.advance(outcome.action if matched else sent, outcome.frame, story.elapsed)
        self.known = matched or not _shaped(self.robot, self.order.from_output(recorded),
                                            story.origin, story.elapsed)
        self.accepted = state.position
        # A command that matches no story with a state lost after its own may answer that one
        # (of unknown stamp): the next command's time is the typical interval.
        self.clock, self.clock_lost = (None, True) if not matched and \
            self._lost_after(state.stamp) else (state.stamp, False)
        self.retime = self._gap_retime(story.elapsed, state.stamp)
        return kind, diff, found is not None

    def _retimed(self, story: _Story, trial: _Trial, imu: _Reading, recorded: np.ndarray,
                 retime: Optional[float]) -> tuple[_Story, _Trial]:
        """``story`` (whose ``trial`` reproduces nothing) as the other account of a gap, when
        one reproduces the command: a tick more than 1.5 control periods after the state before
        it (a gap the robot left, or a superseded state the recording lost in it) for the
        typical interval, its rate limit so; the tick after such a tick with its gait clock
        moved by ``retime`` [phase] (the gap's tick for the typical interval)."""
        if story.elapsed is not None and story.elapsed > GAP_PERIODS * self.robot.control_dt:
            alternative = replace(story, elapsed=self._interval(self.state.stamp))
            tried = self._trial(alternative, imu, recorded)
            if tried.hits:
                return alternative, tried
        if retime is not None:
            alternative = replace(story, asm=_clone(story.asm))
            alternative.asm.gait_phase = (alternative.asm.gait_phase + retime) % 1.0
            tried = self._trial(alternative, imu, recorded)
            if tried.hits:
                return alternative, tried
        return story, trial

    def _gap_retime(self, elapsed: Optional[float], stamp: float) -> Optional[float]:
        """[phase] the gait clock step a tick that stood for ``elapsed`` [s] (its state stamped
        ``stamp``) would have made less its own, had it stood for the typical interval; None
        unless it followed a gap (more than 1.5 control periods)."""
        dt, period = self.robot.control_dt, self.robot.gait_period
        if period <= 0 or elapsed is None or not elapsed > GAP_PERIODS * dt:
            return None
        return (bounded_elapsed(self._interval(stamp), dt) - bounded_elapsed(elapsed, dt)) / period

    def _lost_commands(self, own: _Story, run: list[_Unanswered], imu: _Reading,
                       recorded: np.ndarray, pose: np.ndarray, passive: bool,
                       before: tuple[Optional[float], bool]
                       ) -> Optional[tuple[_Story, _Trial]]:
        """Not as superseded: as answered (the recording lost the run's commands), the first
        such story that reproduces this command and its trial (None: none does). A pending
        cmd_vel may have been in effect from the run's start, and a run past the cmd_vel
        timeout may have seen zero or the command held."""
        for effect in [None] if own.pending is None else [None, own.pending]:
            start = own.vel if effect is None else _Velocity(effect.t)
            for zero_from in _zero_froms(run, start, self.timeout):
                story = self._answered(own, run, effect, zero_from, before)
                story.origin = pose if story.origin is None or passive else story.origin
                trial = self._trial(story, imu, recorded)
                if trial.hits:
                    return story, trial
        return None

    def _answered(self, own: _Story, run: list[_Unanswered], command: Optional[CmdVelEvent],
                  zero_from: Optional[int], before: tuple[Optional[float], bool]) -> _Story:
        """The story in which the node answered every state of ``run`` and the recording lost
        those commands: ``own`` copied (its velocity command ``command`` from the run's first
        state on, None: the one in effect; zero by the cmd_vel timeout from the run's state
        ``zero_from`` on, None: not) moved on one tick per state with its recomputed action (0
        when its IMU reading was not recorded), each for the time since the state before it
        (the first since the gait clock's reference ``before`` the run); its origin the last
        of those targets (None: unknown)."""
        asm, vel, origin = _clone(own.asm), own.vel, own.origin
        clock, lost = before
        if command is not None:
            asm.set_command(command.command)
            vel = _Velocity(command.t)
        for k, unanswered in enumerate(run):
            if k == zero_from:
                asm.set_command(np.zeros(3))
                vel = _Velocity(vel.since, True)
            elapsed = self._elapsed(unanswered.state.stamp, clock, lost)
            tried = None if unanswered.imu is None else \
                self._act(asm, unanswered.state, unanswered.imu, asm.commands[0], origin,
                          elapsed)
            asm.advance(None if tried is None else tried.action,
                        None if tried is None else tried.frame, elapsed)
            origin = None if tried is None else self.order.from_output(tried.target)
            clock, lost = unanswered.state.stamp, False
        return _Story(asm, vel, own.pending if command is None else None, origin,
                      self._elapsed(self.state.stamp, clock, lost))

    def _trial(self, story: _Story, imu: _Reading, recorded: np.ndarray) -> _Trial:
        """``story`` tried on this tick under each velocity command it may have seen."""
        options = self._options(story)
        outcomes = [self._act(story.asm, self.state, imu, option.command, story.origin,
                              story.elapsed) for option in options]
        hits = [k for k, out in enumerate(outcomes) if self._close(out.target, recorded)]
        return _Trial(options, outcomes, hits)

    def _options(self, story: _Story) -> list[_Option]:
        """The velocity commands this tick may have seen under ``story``, the node's own story
        first: the pending cmd_vel (a reliable message may wait for a repair), then the one in
        effect, with zero from TIMEOUT_SLACK_S before the timeout on (first once it passed)."""
        out = [] if story.pending is None else [_Option('new', story.pending.command)]
        held = _Option('held', story.asm.commands[0].copy())
        age = story.vel.age(self.state.t)
        if self.timeout > 0 and age is not None and age > self.timeout - TIMEOUT_SLACK_S:
            zero = _Option('zero', np.zeros(3))
            return out + ([zero, held] if age > self.timeout else [held, zero])
        return out + [held]

    def _act(self, asm: ObservationAssembler, state: _Measured, imu: _Reading,
             command: np.ndarray, origin: Optional[np.ndarray],
             elapsed: Optional[float] = None) -> _Outcome:
        """The model on one tick under velocity ``command``; ``origin`` the previous command
        sent ([J] spec order, None: unknown), the rate limit's origin; ``elapsed`` [s] the time
        the tick stands for (None: one control period), the rate limit's step."""
        saved = asm.commands.copy()
        asm.set_command(command)
        # obs -> action clipped to the model's action_clip -> target = q0 + scale * a, shaped
        # (joint limits, maximum change per tick) exactly as PolicyController does in RL
        # (after the fade-in).
        clip = asm.action_clip
        frame = asm.observe(state.position, state.velocity, imu.quat, imu.gyro)
        action = np.clip(self.policy(asm.model_input(frame)), -clip, clip)
        asm.commands[:] = saved
        shaper = CommandShaper(self.robot)
        if origin is not None:
            shaper.restart(origin)
        target, _ = shaper.shape(self.robot.default_joint_pos + self.robot.action_scale * action,
                                 elapsed)
        return _Outcome(action, self.order.to_output(target), frame)

    def _velocity_seen(self, label: str, matched: bool, t: int) -> None:
        """Move the velocity bookkeeping on by the option the tick shows (``label``), at the
        state's publish time ``t`` [ns]."""
        age = self.vel.age(t)
        if label == 'new':
            self.asm.set_command(self.pending.command)  # seen in effect (or nothing matches)
            self.vel, self.pending = _Velocity(self.pending.t), None
        elif label == 'zero' and matched:
            # Timed out: zero until the next cmd_vel (on evidence only: a tick that differs
            # for another reason must not end the command for good).
            self.asm.set_command(np.zeros(3))
            self.vel = _Velocity(self.vel.since, True)
        elif matched and self.timeout > 0 and age is not None and \
                age > self.timeout + TIMEOUT_SLACK_S:
            self.ticks.held_past_timeout += 1

    def _judge(self, event: CommandEvent, target: np.ndarray, matched: bool
               ) -> tuple[str, Optional[np.ndarray]]:
        """(kind, diff or None) of an answered tick whose model target is ``target``."""
        stamp = self.state.stamp
        # In the fade-in window a tick counts only if it matches unfaded (autostart).
        fading = event.t - self.rl_since < self.fade_in_s and not matched
        rl = self.safety is None or (_is_rl(self.safety) and not fading)
        if not matched and (not self.known or self._lost_after(stamp)):
            # The last action is not the policy's own (the first recorded tick, one after a
            # command the shaping had cut) or the command may answer a state the recording
            # lost: this tick cannot be judged.
            return 'skipped', None
        if not rl:
            return 'not_rl', None
        return 'compared', np.abs(target - event.targets)

    def _lost_after(self, stamp: float) -> bool:
        """Whether the next recorded state is more than 1.5 periods after the one stamped
        ``stamp``: the recording lost the state(s) between, and a command that does not match
        may answer one."""
        later = self.recorded_stamps[np.searchsorted(self.recorded_stamps, stamp, 'right'):]
        return later.size > 0 and later[0] - stamp > GAP_PERIODS * self.robot.control_dt

    def _log(self, kind: str, diff: Optional[np.ndarray], run: list[_Unanswered],
             lost: bool) -> None:
        """The tick, after the run before it: ticks whose command was lost, or superseded."""
        if lost:
            for unanswered in run:
                self.ticks.add('missing', unanswered.state.stamp)
        else:
            self.ticks.superseded += len(run)
        self.ticks.add(kind, self.state.stamp if self.state is not None else float('nan'), diff)

    def _imu_of(self, stamp: float) -> _Reading | Pairing:
        """The IMU reading the node pairs with the joint state stamped ``stamp`` (as
        ``PolicyController._imu_for``): of the recent readings, oldest first, the newest
        stamped within +-sync (a later one of equal stamp wins); WAITING when none stamped
        after ``stamp - sync`` came yet; MISSED when none of this tick came although newer
        ones did (the node faults)."""
        readings = self.recent_imus
        if not readings or max(r.stamp for r in readings) < stamp - self.sync:
            return Pairing.WAITING
        best = None
        for reading in readings:
            if abs(reading.stamp - stamp) <= self.sync and \
                    (best is None or reading.stamp >= best.stamp):
                best = reading
        return Pairing.MISSED if best is None else best

    def _close(self, target: np.ndarray, recorded: np.ndarray) -> bool:
        """Whether [J] ``target`` reproduces the recorded command within the tolerance."""
        return bool(np.abs(target - recorded).max() <= self.tolerance)


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

    def replayer(phase_offset: int) -> Replayer:
        return Replayer(rec, robot, policy, order, phase_offset, tolerance, clip,
                        cmd_vel_timeout_s)
    offset = 0
    if robot.gait_period > 0:
        # The gait clock offset whose first ticks match the recording best (0 when the
        # recording holds the policy's first output).
        period = max(1, round(robot.gait_period / robot.control_dt))

        def matches(k: int) -> int:
            d = np.nan_to_num(replayer(k).run(2 * period).diffs(), nan=1.0)
            return int((d.max(axis=1) <= tolerance).sum())
        # Most matching ticks wins; 0 unless another offset matches strictly better (a model
        # that never matches, e.g. another one, keeps the recording's own start).
        scores = [matches(k) for k in range(period)]
        offset = int(np.argmax(scores))
    ticks = replayer(offset).run()
    versions = list(dict.fromkeys(v for _, v in rec.versions))
    return ActionReplay(ticks.kind, np.asarray(ticks.stamp), ticks.diffs(), order.output, offset,
                        tolerance, versions, model_version, superseded=ticks.superseded,
                        cmd_vel_timeout=cmd_vel_timeout_s, timeouts=ticks.timeouts,
                        held_past_timeout=ticks.held_past_timeout)
