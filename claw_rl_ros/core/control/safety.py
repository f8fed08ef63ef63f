"""The deployed policy's safety state machine (plain Python, no ROS).

States and what each one commands (joint position targets, spec order)::

    PASSIVE --stand_up--> STAND_UP --rl--> RL --sit_down--> SIT_DOWN --(done)--> PASSIVE
       ^                   |    ^                                                   |
       |            excite |    | excite_stop / (done)        (sit_down from EXCITE too)
       |                   v    |                                                   |
       |                   EXCITE                                                   |
       +------------- passive / estop / any fault, from every state ----------------+

* PASSIVE: damping only. The target is the measured pose, so a PD joint gives
  ``tau = Kp (q - q) - Kd qd = -Kd qd``; a driver that takes gains gets ``Kp = 0``.
* STAND_UP: from the pose measured at the request to the default pose, linearly over
  ``stand_up_s``; stays at the default pose when done.
* RL: the policy acts; its command fades in from the default pose over ``fade_in_s``.
* EXCITE: the excitation of system identification (:mod:`.excitation`: chirps and steps
  around the default pose), only from a finished STAND_UP ("STAND"); ``excite_stop`` or its
  end go back to STAND_UP (the given pose -> default pose over ``stand_up_s``; the controller
  gives its last command, so the target does not jump), faults to PASSIVE as from RL. The
  controller gives its target; ``excite_gate()`` (the live part of the self-check) is asked
  on entry.
* SIT_DOWN: from the pose measured at the request to the sit pose over ``sit_down_s``, then
  PASSIVE by itself.

Faults (:data:`FAULTS`) move every state to PASSIVE at once. ``estop`` is latched: nothing
but ``reset`` (in PASSIVE) clears it; so is ``restarted`` (the node came back after its
previous process died) when the operator drives the machine (no ``autostart``). With
``autostart`` (simulation, training) the operator steps are skipped: a healthy complete state
takes PASSIVE to STAND_UP (done at once, the default pose) and, with a model that may act, to
RL (no fade-in); after a fault the machine re-arms the same way once the state is healthy
again, except after an e-stop. Every
transition is kept as a :class:`Transition` for the node to log and publish.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
import math
from typing import Sequence

import numpy as np

from ..sim.robot_spec import RobotSpec

PASSIVE, STAND_UP, RL, SIT_DOWN = 'PASSIVE', 'STAND_UP', 'RL', 'SIT_DOWN'
EXCITE = 'EXCITE'
STATES = (PASSIVE, STAND_UP, RL, SIT_DOWN, EXCITE)
REQUESTS = ('stand_up', 'rl', 'sit_down', 'passive', 'estop', 'reset', 'excite', 'excite_stop')
# The states each operator request is accepted in (the others: passive, estop, reset).
ALLOWED_FROM = {'stand_up': (PASSIVE, SIT_DOWN), 'rl': (STAND_UP,), 'excite': (STAND_UP,),
                'sit_down': (STAND_UP, RL, EXCITE), 'excite_stop': (EXCITE,)}
# Automatic fall-backs to PASSIVE (counted by cause in the diagnostics).
FAULTS = ('tilt', 'stale_joint_states', 'stale_imu', 'non_finite', 'bad_input',
          'inference_overrun', 'saturation', 'joint_limit', 'future_stamp', 'clock_step_back',
          'clock_mismatch', 'exception', 'restarted', 'estop')
# Faults that latch (nothing but an operator ``reset`` in PASSIVE clears them); ``restarted``
# latches only when the machine is operator-driven (no autostart).
LATCHING = ('estop', 'restarted')


def limit(default, doc: str):
    """A SafetyConfig field: its default and the description the policy node's parameter of
    the same name shows (core/params/node_config.py)."""
    return field(default=default, metadata={'doc': doc})


@dataclass
class SafetyConfig:
    """Limits and timings of the state machine (ROS parameters of the policy node)."""

    autostart: bool = limit(True, 'skip the operator steps: enter RL at the first complete '
                            'fresh state, re-arm after a fault (not after an e-stop); false: '
                            'the operator drives ~/operator or the services')
    stand_up_s: float = limit(2.0, 'STAND_UP: measured pose -> default pose in this time [s]')
    sit_down_s: float = limit(2.0, 'SIT_DOWN: measured pose -> sit_pose in this time [s]')
    fade_in_s: float = limit(1.0, 'RL command fade-in from the default pose [s]')
    tilt_limit: float = limit(1.0, 'trunk tilt from upright that faults to PASSIVE (damping) '
                              '[rad]')
    joint_limit_margin: float = limit(0.1, 'a measured joint this far beyond its URDF limit '
                                      'faults to PASSIVE [rad]')
    saturation_tol: float = limit(0.05, 'a command clipped by more than this is saturated '
                                  '[rad]')
    saturation_ticks: int = limit(50, 'saturated RL ticks in a row that fault to PASSIVE')
    inference_deadline_s: float = limit(0.0, 'policy time that counts as an overrun [s] (0: '
                                        'half a control period)')
    overrun_ticks: int = limit(3, 'overruns in a row that fault to PASSIVE')
    sit_pose: Sequence[float] = limit((), 'SIT_DOWN target, spec joint order [rad] (empty: the '
                                      'pose STAND_UP began at)')

    def validate(self, num_joints: int) -> None:
        """Raise ValueError naming the field, the value and the fix."""
        for name in ('stand_up_s', 'sit_down_s', 'fade_in_s', 'joint_limit_margin',
                     'saturation_tol', 'inference_deadline_s'):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f'{name} = {value!r}; must be a finite number >= 0')
        if not 0 < self.tilt_limit <= math.pi:
            raise ValueError(f'tilt_limit = {self.tilt_limit!r} rad; must be in (0, pi]')
        for name in ('saturation_ticks', 'overrun_ticks'):
            if int(getattr(self, name)) < 1:
                raise ValueError(f'{name} = {getattr(self, name)!r}; must be >= 1 tick')
        if len(self.sit_pose) not in (0, num_joints):
            raise ValueError(f'sit_pose has {len(self.sit_pose)} values; give {num_joints} '
                             '(spec joint order) or none')


@dataclass(frozen=True)
class Transition:
    """One state change: at ``stamp`` [s] from ``source`` to ``target`` because ``reason``."""

    stamp: float
    source: str
    target: str
    reason: str

    def __str__(self) -> str:
        return f'{self.source} -> {self.target} ({self.reason})'


def tilt_of(quat_wxyz: np.ndarray) -> float:
    """Trunk tilt from upright [rad] of a [4] unit quaternion (w, x, y, z).

    The body z axis in the world frame has z component 1 - 2 (x^2 + y^2) = cos(tilt); closed
    form, about 30x cheaper than rotating the gravity vector with numpy for one quaternion.
    """
    x, y = float(quat_wxyz[1]), float(quat_wxyz[2])
    return math.acos(min(1.0, max(-1.0, 1.0 - 2.0 * (x * x + y * y))))


class SafetyMachine:
    """The state, its transitions and the fault checks; see the module docstring.

    ``rl_gate()`` returns None when the policy may act, else the reason it may not (no model,
    no passing verification, a failed self-check); it is asked on every entry into RL.
    ``excite_gate()`` likewise on every entry into EXCITE.
    """

    def __init__(self, robot: RobotSpec, cfg: SafetyConfig, rl_gate=lambda: None,
                 excite_gate=lambda: None):
        cfg.validate(robot.num_joints)
        self.robot, self.cfg, self.rl_gate = robot, cfg, rl_gate
        self.excite_gate = excite_gate
        self.q0 = robot.default_joint_pos
        self.deadline = cfg.inference_deadline_s or robot.control_dt / 2
        self.state = PASSIVE
        self.latched = False
        self.latch_cause = ''  # 'e-stop' or 'restart' while latched
        self.last_fault = ''
        self.faults = {cause: 0 for cause in FAULTS}
        self.history: deque[Transition] = deque(maxlen=100)
        self.pending: list[Transition] = []  # not yet published by the node
        self.count = 0
        self._since = 0.0        # stamp of the last transition
        self._from: np.ndarray | None = None  # [J] pose an interpolation starts at
        self._rest: np.ndarray | None = None  # [J] pose STAND_UP began at (sit default)
        self._saturated = 0
        self._overruns = 0

    # --------------------------------------------------------------------------- changes
    def _go(self, target: str, now: float, reason: str, pose: np.ndarray | None) -> None:
        t = Transition(now, self.state, target, reason)
        self.state, self._since = target, now
        self._from = None if pose is None else np.array(pose, dtype=np.float64)
        self._saturated = self._overruns = 0
        self.history.append(t)
        self.pending.append(t)
        self.count += 1

    def fault(self, cause: str, now: float, detail: str = '') -> None:
        """Fall back to PASSIVE (from any state but PASSIVE) and count the cause."""
        assert cause in FAULTS, cause
        self.faults[cause] += 1
        self.last_fault = f'{cause}: {detail}' if detail else cause
        if cause == 'estop' or (cause == 'restarted' and not self.cfg.autostart):
            self.latched, self.latch_cause = True, 'e-stop' if cause == 'estop' else 'restart'
        if self.state != PASSIVE:
            self._go(PASSIVE, now, f'fault {self.last_fault}', None)

    def request(self, name: str, now: float, pose: np.ndarray | None) -> tuple[bool, str]:
        """An operator request at ``now`` with the measured [J] ``pose`` (None: no fresh
        complete state); returns (accepted, message naming the reason)."""
        if name not in REQUESTS:
            return False, f'unknown request {name!r}; use one of {", ".join(REQUESTS)}'
        if name == 'estop':
            self.fault('estop', now, 'operator e-stop (latched until reset)')
            return True, 'e-stop: PASSIVE, latched until reset'
        if name == 'reset':
            if self.state != PASSIVE:
                return False, f'reset is for PASSIVE; now {self.state}: request passive first'
            was, self.latched, self.last_fault = self.latched, False, ''
            return True, 'e-stop latch cleared' if was else 'nothing latched'
        if name == 'passive':
            if self.state != PASSIVE:
                self._go(PASSIVE, now, 'operator passive', None)
            return True, 'PASSIVE'
        if self.latched:
            return False, f'{name} refused: {self.latch_cause} latched; request reset first'
        if pose is None:
            return False, f'{name} refused: no fresh complete joint state and IMU reading'
        allowed = ALLOWED_FROM[name]
        if self.state not in allowed:
            return False, f'{name} refused in {self.state}; allowed from {" or ".join(allowed)}'
        if name == 'stand_up':
            self._rest = np.array(pose, dtype=np.float64)
            self._go(STAND_UP, now, 'operator stand_up', pose)
        elif name in ('rl', 'excite'):
            if not self.stood_up(now):
                return False, f'{name} refused: STAND_UP has not reached the default pose yet'
            blocked = (self.rl_gate if name == 'rl' else self.excite_gate)()
            if blocked:
                return False, f'{name} refused: {blocked}'
            self._go(RL if name == 'rl' else EXCITE, now, f'operator {name}', None)
        elif name == 'excite_stop':
            self._go(STAND_UP, now, 'operator excite_stop', pose)
        else:
            self._go(SIT_DOWN, now, 'operator sit_down', pose)
        return True, self.state

    # ----------------------------------------------------------------------------- ticks
    def check_state(self, now: float, pos: np.ndarray, quat_wxyz: np.ndarray) -> bool:
        """Faults from a complete, finite state: [J] ``pos`` (spec order), [4] base
        orientation (w, x, y, z); True when healthy."""
        tilt = tilt_of(quat_wxyz)
        if tilt > self.cfg.tilt_limit:
            self.fault('tilt', now, f'{tilt:.3f} rad > tilt_limit {self.cfg.tilt_limit:g}')
            return False
        margin = self.cfg.joint_limit_margin
        low = pos < self.robot.joint_lower - margin
        high = pos > self.robot.joint_upper + margin
        if low.any() or high.any():
            j = int(np.flatnonzero(low | high)[0])
            self.fault('joint_limit', now, f'{self.robot.joint_names[j]} at {pos[j]:.3f} rad, '
                       f'limits [{self.robot.joint_lower[j]:g}, {self.robot.joint_upper[j]:g}] '
                       f'+- {margin:g}')
            return False
        return True

    def advance(self, now: float, pose: np.ndarray) -> None:
        """Time-driven changes after a healthy tick: SIT_DOWN done; autostart re-arming."""
        if self.state == SIT_DOWN and now - self._since >= self.cfg.sit_down_s:
            self._go(PASSIVE, now, 'sit_down done', None)
            return
        if not self.cfg.autostart or self.latched:
            return
        if self.state == PASSIVE:
            self._rest = np.array(pose, dtype=np.float64)
            self._go(STAND_UP, now, 'autostart', pose)
        if self.state == STAND_UP and self.rl_gate() is None:
            self._go(RL, now, 'autostart', None)

    def end_excitation(self, now: float, pose: np.ndarray) -> None:
        """The excitation ran to its end: back to STAND_UP from the [J] ``pose`` (the last
        command)."""
        if self.state == EXCITE:
            self._go(STAND_UP, now, 'excitation done', pose)

    def stood_up(self, now: float) -> bool:
        return self.state == STAND_UP and (self.cfg.autostart or
                                           now - self._since >= self.cfg.stand_up_s)

    def target(self, now: float, pose: np.ndarray) -> np.ndarray:
        """[J] target of PASSIVE, STAND_UP and SIT_DOWN (spec order) at ``now``."""
        if self.state == PASSIVE:
            return np.array(pose, dtype=np.float64)
        if self.state == STAND_UP:
            duration, goal = (0.0 if self.cfg.autostart else self.cfg.stand_up_s), self.q0
        elif self.state == SIT_DOWN:
            duration, goal = self.cfg.sit_down_s, self.sit_pose()
        else:
            giver = 'policy' if self.state == RL else 'excitation'
            raise ValueError(f'in {self.state} the {giver} gives the target')
        # Linear interpolation from the pose at entry to the goal, s in [0, 1].
        s = 1.0 if duration <= 0 else min(1.0, max(0.0, (now - self._since) / duration))
        return goal.copy() if s >= 1.0 else self._from + s * (goal - self._from)

    def sit_pose(self) -> np.ndarray:
        if len(self.cfg.sit_pose):
            return np.asarray(self.cfg.sit_pose, dtype=np.float64)
        return self._rest if self._rest is not None else self.q0

    def fade(self, now: float) -> float:
        """RL fade-in factor in [0, 1] (1 under autostart)."""
        if self.cfg.autostart or self.cfg.fade_in_s <= 0:
            return 1.0
        return min(1.0, max(0.0, (now - self._since) / self.cfg.fade_in_s))

    def note_policy_tick(self, now: float, inference_s: float, saturated: bool) -> None:
        """An RL tick: fault after ``overrun_ticks`` overruns or ``saturation_ticks``
        saturated commands in a row."""
        self._overruns = self._overruns + 1 if inference_s > self.deadline else 0
        self._saturated = self._saturated + 1 if saturated else 0
        if self._overruns >= self.cfg.overrun_ticks:
            self.fault('inference_overrun', now, f'{self._overruns} policy calls in a row over '
                       f'the {self.deadline * 1e3:.1f} ms deadline (last '
                       f'{inference_s * 1e3:.1f} ms)')
        elif self._saturated >= self.cfg.saturation_ticks:
            self.fault('saturation', now, f'command clipped by more than '
                       f'{self.cfg.saturation_tol:g} rad for {self._saturated} ticks in a row')

    def drain(self) -> list[Transition]:
        """Transitions since the last call (for the node to log and publish)."""
        out, self.pending = self.pending, []
        return out

    def diagnostics(self) -> dict[str, object]:
        """Flat fields: state, latch, last fault and transition, fault counts."""
        out: dict[str, object] = {
            'safety_state': self.state, 'estop_latched': self.latched,
            'last_fault': self.last_fault or 'none',
            'last_transition': str(self.history[-1]) if self.history else 'none',
            'transitions': self.count}
        out.update({f'faults_{k}': v for k, v in self.faults.items()})
        return out
