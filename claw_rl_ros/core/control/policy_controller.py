"""The policy node's logic without ROS: inputs -> validated observation -> safe joint targets.

Contract (what the node publishes on ``joint_commands``):

* one command per joint-state message, computed only when that state and an IMU reading of
  the same tick (stamp at most half a control period older) are both valid and fresh; a state
  not newer than the last answered one (a re-sent or out-of-order message) gets no command, so
  a lockstep simulator never sees two answers to one state; nor does a valid state the node
  found a newer one queued behind (``superseded``: a backlog is worked off at its newest);
* before the first complete state nothing is published;
* what a tick publishes is decided by the safety state machine (:mod:`.safety`): damping in
  PASSIVE, the stand-up / sit-down interpolation, or in RL ``q0 + action_scale * a`` (faded
  in), or in EXCITE ``q0 + offset(t)`` (:mod:`.excitation`; ``t`` by the accepted states'
  stamps since the first one the run answered; no model needed); every target is shaped
  (:mod:`.command_shaping`: joint limits, maximum change per tick). Under ``autostart`` a
  complete state enters RL at once (with no model: the default pose);
* a joint state or IMU reading that is stale, stamped ahead of the node's clock, non-finite,
  outside its plausible range, misnamed, incomplete or of the wrong length is dropped and
  counted by cause; the tick is a fault: PASSIVE, damping. PASSIVE never pushes: its target is
  the last measured pose itself (not clamped into the limits), so a position-only PD driver
  applies ``Kp (q - q) = 0``; the IMU reading of a tick is the newest one stamped within half a
  control period of the joint state (either side), never a reading from another tick;
* time: a state or reading more than ``stale_after_periods`` control periods ahead of the node's
  clock is a ``future_stamp`` fault (it is never accepted, so it cannot make later healthy
  states look old); the node's clock going back (a ``/clock`` restart, an NTP step) is a
  ``clock_step_back`` fault that forgets every stamp, so the node re-arms once time is sane
  again; stamps of another clock than the node's (a ``use_sim_time`` mismatch) are a
  ``clock_mismatch`` fault whose message names the fix (raised once in :attr:`alerts`);
* the gait clock and the default rate limit follow the stamps: a command that answers an
  accepted state stands for the time since the state before it (the one the previous command
  answered, or a superseded one skipped since: a backlog's stall is not counted), by their
  stamps (the node's clock, as the watchdog reads them), bounded to
  :data:`~claw_rl_ros.core.sim.observations.ELAPSED_BOUNDS_PERIODS` control periods, so a
  robot whose states come at 48 or 52 Hz keeps its gait in phase; the first command after the
  start or a clock step back, and a command that answers no new state (a watchdog or fault
  hold) and the one after it, stand for one control period;
* :meth:`PolicyController.watchdog` (called 4 times per control period) faults to PASSIVE when
  the last accepted state is older than ``stale_after_periods`` control periods by the node's
  clock or by the monotonic time it was received (``wall_stale_after_s``), so damping starts
  within that many periods of the last good state even when the node's clock stalls or steps;
* ``cmd_vel`` goes stale: ``cmd_vel_timeout_s`` (monotonic) after the last one the command is
  zero (counted, in the diagnostics), until the next one;
* nothing raises out of the controller: an exception anywhere in a tick is an ``exception``
  fault counted by stage (:mod:`.tick_guard`): PASSIVE, damping, re-armed only the normal way;
* targets are in the order of the ``joints`` parameter;
* in ``training`` mode (the control loop as an actor; never on a robot) the policy acts with
  ``a ~ N(mu, sigma)`` around the model's mean (``sigma``: its ``action_std`` metadata, so only
  trainer exports are accepted), through the same safety and shaping path, and every RL tick
  leaves a :class:`~.loop_record.PolicyRecord` for :meth:`take_record`.

Models are swapped with :meth:`offer` (validate bytes as they arrive) and :meth:`activate`
(by sha256); the swap replaces one reference, so it is atomic between two ticks as long as the
caller serialises calls (one ROS executor thread does).
"""

from __future__ import annotations

from collections import deque
import functools
from pathlib import Path
import time
from typing import Callable, Sequence

import numpy as np

from .command_shaping import CommandShaper
from .control_stats import Counters
from .drive_gains import declared_gains, DriveGains, drive_record, gain_check
from ..export.onnx_policy import OnnxPolicy
from ..export.verification_record import verification_blocker
from .loop_record import GaussianSampler, PolicyRecord
from .model_swap import (DEFAULT_MAX_MODEL_BYTES, ModelCache, ModelRejected, policy_clip,
                         read_model_file, version_of)
from .excitation import Excitation, ExcitationConfig
from .safety import EXCITE, PASSIVE, RL, SafetyConfig, SafetyMachine
from .self_check import self_check
from ..sim.robot_spec import RobotSpec
from .state_input import (BadInput, check_fresh, command_array, DROP_CAUSES, imu_arrays,
                          IMU_SYNC_PERIODS, JointOrder, ObservationAssembler)
from .tick_guard import Alerts, TickGuard

HOLD_REASONS = ('bad_input', 'no_model', 'stale', 'exception')
# Input drop cause -> safety fault (stale and unsynced are told apart by topic).
FAULT_OF = {'non_finite': 'non_finite', 'out_of_range': 'bad_input',
            'missing_joint': 'bad_input', 'unknown_joint': 'bad_input',
            'wrong_length': 'bad_input', 'bad_imu': 'bad_input', 'bad_stamp': 'bad_input',
            'future_stamp': 'future_stamp', 'clock_mismatch': 'clock_mismatch',
            'malformed': 'bad_input'}
# The message type each state topic must carry (named when its bytes do not decode).
MESSAGE_TYPES = {'joint_states': 'sensor_msgs/msg/JointState', 'imu': 'sensor_msgs/msg/Imu'}
# The longest stale_after_periods accepted (at 50 Hz: 2 s without a state before damping).
MAX_STALE_PERIODS = 100.0
# The watchdog is polled this many times per control period (policy_node's timer).
WATCHDOG_POLLS = 4
# Under use_sim_time a paced or lockstep simulator may take this long in wall time between
# two states (wall_stale_after_s = 0 then means this) [s].
SIM_WALL_STALE_S = 1.0
# A clock mismatch is named (logged, diagnostics ERROR) once it lasted this long [s].
CLOCK_ALERT_AFTER_S = 1.0
# Keep this many IMU readings to pair with the joint state of their tick.
IMU_READINGS = 8
Targets = np.ndarray


def guarded(stage: str, fallback=None):
    """Run a controller entry point so that nothing raises out of it: an exception is an
    ``exception`` fault (counted at the stage it came from) and the tick holds PASSIVE."""
    def wrap(method):
        @functools.wraps(method)
        def inner(self, *args, **kwargs):
            self.guard.stage = stage
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - every exception becomes a named fault
                return self.internal_fault(exc, fallback)
        return inner
    return wrap


class PolicyController:
    """Validated inputs in, [J] joint position targets (``joints`` order) or None out.

    ``last_gains`` holds ([J] Kp, [J] Kd) in ``joints`` order for the last target (Kp = 0 in
    PASSIVE), for drivers that take gains: the serving model's metadata gains (the robot's
    before a model is loaded). ``drive_gains`` says how the drives get theirs
    (:mod:`.drive_gains`); the self-check checks it, with ``gains_listeners`` (a callable
    counting the gains topic's subscriptions, set by the node; None: not counted).
    """

    def __init__(self, robot: RobotSpec, *, stale_after_periods: float = 3.0,
                 output_joints: Sequence[str] | None = None,
                 max_model_bytes: int = DEFAULT_MAX_MODEL_BYTES,
                 safety: SafetyConfig | None = None, max_delta_per_tick: float = 0.0,
                 require_verification: bool = False,
                 command_joints: Sequence[str] | None = None, training: bool = False,
                 drive_gains: DriveGains | None = None,
                 seed: int = 0, cmd_vel_timeout_s: float = 0.5, clock: str = 'unknown',
                 wall_stale_after_s: float = 0.0,
                 monotonic: Callable[[], float] | None = None,
                 excitation: ExcitationConfig | None = None):
        """``clock``: the node's (``sim`` under use_sim_time, ``wall``, ``unknown``), to name
        the fix of a clock mismatch; ``monotonic``: the receive clock of the watchdog and the
        cmd_vel timeout (None: the node's clock stands in for it, as in tests and replays)."""
        if not 1.5 <= stale_after_periods <= MAX_STALE_PERIODS:
            raise ValueError(f'stale_after_periods = {stale_after_periods!r}; must be in '
                             f'[1.5, {MAX_STALE_PERIODS:g}] control periods (a healthy state '
                             'arrives every period; more would leave a dead robot undamped)')
        for name, value in (('cmd_vel_timeout_s', cmd_vel_timeout_s),
                            ('wall_stale_after_s', wall_stale_after_s)):
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f'{name} = {value!r}; must be a finite number >= 0 (0: '
                                 + ('off)' if name == 'cmd_vel_timeout_s' else 'default)'))
        self.robot = robot
        self.control_dt = robot.control_dt
        self.max_age = stale_after_periods * self.control_dt
        self.clock = clock
        # The watchdog's limits: polled every control_dt / WATCHDOG_POLLS, it fires within max_age.
        self.stale_limit = self.max_age - self.control_dt / WATCHDOG_POLLS
        wall = wall_stale_after_s or (SIM_WALL_STALE_S if clock == 'sim' else self.max_age)
        self.wall_stale_limit = max(wall, self.max_age) - self.control_dt / WATCHDOG_POLLS
        self.cmd_vel_timeout = cmd_vel_timeout_s
        self._monotonic = monotonic
        self._mono = 0.0  # the receive time of the call being handled
        self.guard = TickGuard()
        self.alerts = Alerts()
        self.order = JointOrder(robot, output_joints)
        self.assembler = ObservationAssembler(robot)
        self.models = ModelCache(robot, max_model_bytes)
        self.policy: OnnxPolicy | None = None
        self.safety = SafetyMachine(robot, safety or SafetyConfig(), self._rl_blocker,
                                    self._excite_blocker)
        # EXCITE's run (ConfigError naming the field when the robot cannot run it); its time
        # 0 is the stamp of the first state it answers (None: not started since the request).
        self.excitation = Excitation(robot, excitation or ExcitationConfig())
        self.excite_t0: float | None = None
        self._excite_started: float | None = None  # a start not yet taken by the node
        self.shaper = CommandShaper(robot, max_delta_per_tick)
        self.require_verification = require_verification
        self.command_joints = list(command_joints) if command_joints is not None else None
        # The drives' gains: declared ones in joints order (for the record) and spec order.
        self.drive = drive_gains or DriveGains()
        self._declared_out = declared_gains(self.drive, self.order.output)
        self._declared = None if self._declared_out is None else \
            tuple(self.order.from_output(g) for g in self._declared_out)
        self.gains_listeners: Callable[[], int] | None = None
        self.gains_topic = 'joint_gains'
        self.drive_verdict = ''  # of the last self-check (drive_gains.VERDICTS)
        self._drive_problems: list[str] = []
        self.model_path: Path | None = None  # the serving model's file (None: pushed bytes)
        self.training = training
        self.sampler: GaussianSampler | None = None
        self.record: PolicyRecord | None = None
        self._rng = np.random.default_rng(seed)
        self._stamp = 0.0
        self._passive_gains = True  # the gains of the last target are PASSIVE's
        self.drops = Counters(DROP_CAUSES)
        self.holds = Counters(HOLD_REASONS)
        self.ticks = 0
        self.superseded = 0  # valid states skipped for a newer one waiting behind them
        self.started = False
        self.last_swap = 'none'
        self.last_drop = ''
        self.inference_s = 0.0
        self._unverified: str | None = 'no model loaded'
        # (stamp, [4] quat w,x,y,z, [3] gyro), newest last; quat None marks a dropped reading
        # (gyro = (fault, detail)).
        self._imus: deque[tuple[float, np.ndarray | None, object]] = deque(maxlen=IMU_READINGS)
        self._pending: tuple[float, np.ndarray, np.ndarray] | None = None
        self._pose: np.ndarray | None = None  # [J] last measured pose of a complete state
        self._last_state_stamp: float | None = None
        # The gait clock's stamps: of the accepted state the next command answers (None: it
        # answers none) and of the state before it (the one the last command answered, or a
        # superseded one skipped since; None: unknown, one control period).
        self._tick_stamp: float | None = None
        self._clock_stamp: float | None = None
        self._last_good_mono: float | None = None  # receive time of the last accepted state
        self._last_output: float | None = None  # monotonic time of the last command
        self._last_now: float | None = None  # the node clock at the previous call
        self._last_cmd_mono: float | None = None
        self.cmd_vel_timeouts = 0
        self.command_timed_out = False
        self._mismatch_since: float | None = None  # receive time a clock mismatch began
        # Stamps of accepted states and valid IMU readings (the self-check's rates), and
        # whether each of the last joint states was usable (accepted into a tick).
        self._stamps = {'joint_states': deque(maxlen=21), 'imu': deque(maxlen=21)}
        self._usable: deque[bool] = deque(maxlen=50)
        self._names: tuple[str, ...] | None = None
        self.excite_t = 0.0  # the excitation's time [s] at its last tick

    # ------------------------------------------------------------------------------ inputs
    @guarded('joint_state')
    def on_joint_state(self, stamp: float, names: Sequence[str], position: Sequence[float],
                       velocity: Sequence[float], now: float,
                       superseded: bool = False) -> Targets | None:
        """A JointState (stamp [s], names, [n] position, [n] velocity) received at ``now``.

        ``superseded``: a newer state was already waiting behind this one (a backlog). It is
        still validated (a bad one is dropped, counted and faults as ever) but, when valid,
        skipped without a command, without a stale verdict and without moving the gait clock:
        its age is the node's own backlog, and judging it against a clock that has moved on
        (``/clock`` keeps only the newest) faulted and re-armed the loop over and over under
        load. The newest state of the backlog is judged as usual; its command's gait clock
        step is its own interval since the skipped state before it (a stall's time is not
        the gait clock's, as before: the replay models it so).
        """
        self._clock(now)
        stamp = float(stamp)
        if self._last_state_stamp is not None and stamp <= self._last_state_stamp:
            self.drops.add('stale')  # this tick was answered already
            self._usable.append(False)
            return None
        self._names = tuple(str(n) for n in names)
        try:
            pos, vel = self.order.joint_arrays(names, position, velocity)
            if superseded:
                check_fresh('joint_states', stamp, stamp, self.max_age)  # finite stamp only
                self.superseded += 1
                if self._clock_stamp is not None:  # the next step counts from this stamp
                    self._clock_stamp = max(self._clock_stamp, stamp)
                return None
            check_fresh('joint_states', stamp, now, self.max_age, self.clock)
        except BadInput as exc:
            self._pending = None
            self._usable.append(False)
            return self._drop(exc, 'stale_joint_states', now)
        self._pending = (stamp, pos, vel)
        return self._try_tick(now)

    @guarded('imu')
    def on_imu(self, stamp: float, orientation_xyzw: Sequence[float],
               angular_velocity: Sequence[float], now: float) -> Targets | None:
        """An Imu reading; completes a pending joint state of the same tick."""
        self._clock(now)
        stamp = float(stamp)
        try:
            quat, gyro = imu_arrays(orientation_xyzw, angular_velocity)
            check_fresh('imu', stamp, now, self.max_age, self.clock)
        except BadInput as exc:
            self.drops.add(exc.cause)
            self.last_drop = str(exc)
            self._alert(exc)
            fault = 'stale_imu' if exc.cause == 'stale' else FAULT_OF[exc.cause]
            if exc.cause not in ('future_stamp', 'bad_stamp', 'clock_mismatch'):
                # A reading of this tick that is bad: the tick it pairs with is a fault.
                self._imus.append((stamp, None, (fault, str(exc))))
            elif self.started:
                self.safety.fault(fault, now, str(exc))
            return self._try_tick(now)
        self._stamps['imu'].append(stamp)
        self._imus.append((stamp, quat, gyro))
        return self._try_tick(now)

    @guarded('joint_state')
    def on_malformed(self, topic: str, reason: str, now: float) -> Targets | None:
        """A message on ``topic`` (``joint_states`` or ``imu``) whose bytes are not that message
        (``reason``: what is wrong with them): dropped as ``malformed``, a ``bad_input`` fault.
        A joint state is a fault of its tick at once; an IMU reading, having no stamp to pair
        it with a tick, faults a started loop."""
        self.guard.stage = 'joint_state' if topic == 'joint_states' else 'imu'
        self._clock(now)
        exc = BadInput('malformed', f'{topic}: undecodable message ({reason}); check that the '
                       f'publisher sends {MESSAGE_TYPES[topic]} (plain CDR)')
        if topic == 'joint_states':
            self._pending = None
            self._usable.append(False)
            return self._drop(exc, 'stale_joint_states', now)
        self.drops.add(exc.cause)
        self.last_drop = str(exc)
        if self.started:
            self.safety.fault(FAULT_OF[exc.cause], now, str(exc))
        return self._try_tick(now)

    @guarded('command')
    def on_command(self, linear_x: float, linear_y: float, angular_z: float) -> None:
        """A cmd_vel; a non-finite or implausible one is dropped (the previous command stays
        until it times out)."""
        try:
            self.assembler.set_command(command_array(linear_x, linear_y, angular_z))
        except BadInput as exc:
            self.drops.add(exc.cause)
            self.last_drop = str(exc)
            return
        # Without a receive clock and before any timed call, the age counts from the next one.
        self._last_cmd_mono = float('nan') if self._monotonic is None and \
            self._last_now is None else self._receive_time(self._last_now)
        self.command_timed_out = False

    @guarded('watchdog')
    def watchdog(self, now: float) -> Targets | None:
        """Fault to PASSIVE (damping) when started, the last accepted state is too old by the
        node's clock or by its monotonic receive time, and nothing went out this tick."""
        self._clock(now)
        if not self.started:
            return None
        # After a clock step back no stamp is known: the receive time alone judges.
        age = now - self._last_state_stamp if self._last_state_stamp is not None else 0.0
        wall_age = self._mono - self._last_good_mono
        if age <= self.stale_limit and wall_age <= self.wall_stale_limit:
            return None
        if self._last_output is not None and \
                self._mono - self._last_output < 0.9 * self.control_dt:
            return None
        self.holds.add('stale')
        what = (f'{age * 1e3:.0f} ms' if age > self.stale_limit else
                f'{wall_age * 1e3:.0f} ms of wall time (node clock: {age * 1e3:.0f} ms)')
        self.safety.fault('stale_imu' if self._pending else 'stale_joint_states', now,
                          f'{what} without a complete state')
        return self._hold(now)

    @guarded('request', fallback=(False, 'request failed inside the controller'))
    def request(self, name: str, now: float) -> tuple[bool, str]:
        """An operator request (:data:`.safety.REQUESTS`); 'rl' runs the self-check first."""
        self._clock(now)
        name = str(name)
        fresh = self._last_state_stamp is not None and \
            now - self._last_state_stamp <= self.max_age and \
            self._mono - self._last_good_mono <= self.wall_stale_limit
        if name == 'rl' and self.safety.state != RL:
            problems = self.check()
            if problems:
                return False, f'rl refused by the self-check ({len(problems)} mismatch(es)): ' \
                    + '; '.join(problems)
        if name == 'reset' and self.safety.latched:
            self.alerts.clear('restarted')
        pose = self._pose if fresh else None
        if name == 'excite_stop' and pose is not None and self.shaper.last is not None:
            pose = self.shaper.last  # STAND_UP goes on from the last command: no jump
        ok, message = self.safety.request(name, now, pose)
        if ok and name == 'excite':
            self.excite_t0, self.excite_t = None, 0.0  # it starts at the next state
        return ok, message

    def restarted(self, detail: str) -> None:
        """The previous process of this node died without a clean stop: a ``restarted`` fault
        (latched without autostart: the operator clears it with ``reset``)."""
        self.safety.fault('restarted', self._last_now or 0.0, detail)
        self.alerts.once('restarted', f'restarted: {detail}')

    def check(self) -> list[str]:
        """The start-up self-check (:func:`.self_check.self_check`) on usable states, then
        the drives' gains against the model's (:func:`.drive_gains.gain_check`)."""
        spec = self.policy.spec if self.policy else None
        problems = self_check(self.robot, spec, output_joints=self.order.output,
                              joint_state_names=self._names,
                              joint_state_period=self._period('joint_states'),
                              imu_period=self._period('imu'), command_joints=self.command_joints,
                              usable=(sum(self._usable), len(self._usable)),
                              last_drop=self.last_drop)
        listeners = self.gains_listeners() if self.gains_listeners is not None else None
        self.drive_verdict, gains = gain_check(
            self.drive, spec, self.robot.joint_names, self._declared,
            self.shaper.gains(passive=False), listeners, self.gains_topic)
        self._drive_problems = gains
        return problems + gains

    def drive_report(self, node: str) -> dict | None:
        """The drive-gains record of the last self-check (core/export/drive_record.py) for the
        serving model's file; None without one (pushed bytes) or before a check."""
        if self.policy is None or self.model_path is None or not self.drive_verdict:
            return None
        return drive_record(self.drive, self.drive_verdict, self._drive_problems,
                            self._declared_out, self.order.output, self.policy.sha256,
                            self.gains_topic, node)

    def _period(self, topic: str) -> float | None:
        stamps = np.asarray(self._stamps[topic])
        return float(np.median(np.diff(stamps))) if stamps.size >= 3 else None

    # ------------------------------------------------------------------------------- time
    def _receive_time(self, now: float) -> float:
        return self._monotonic() if self._monotonic is not None else now

    def _clock(self, now: float) -> None:
        """Every call: the receive time, and a fault when the node's clock went back."""
        now = float(now)
        self._mono = self._receive_time(now)
        if self._last_cmd_mono is not None and np.isnan(self._last_cmd_mono):
            self._last_cmd_mono = self._mono
        last, self._last_now = self._last_now, now
        if last is None or not now < last - self.max_age:
            return
        # The clock stepped back (a /clock restart, an NTP step): every stamp seen is from
        # another time line; forget them, so the node re-arms once states are fresh again.
        self._last_state_stamp, self._pending = None, None
        self._tick_stamp = self._clock_stamp = None
        self._imus.clear()
        for stamps in self._stamps.values():
            stamps.clear()
        self.safety.fault('clock_step_back', now, f'the node clock went from {last:.3f} s '
                          f'back to {now:.3f} s; stamps before it are forgotten')

    def _alert(self, exc: BadInput) -> None:
        """A clock mismatch that persists CLOCK_ALERT_AFTER_S is raised once (a sim-time node
        may get a state before its first /clock: that start-up race is no mismatch)."""
        if exc.cause != 'clock_mismatch':
            return
        if self._mismatch_since is None:
            self._mismatch_since = self._mono
        if self._mono - self._mismatch_since >= CLOCK_ALERT_AFTER_S:
            self.alerts.once('clock_mismatch', str(exc))

    # ------------------------------------------------------------------------------- ticks
    def _imu_for(self, stamp: float):
        """The IMU reading of the tick stamped ``stamp``: the newest within half a period
        either side; None: not arrived yet; False: none of this tick although newer exist."""
        tol = IMU_SYNC_PERIODS * self.control_dt
        if not self._imus or self._newest_imu() < stamp - tol:
            return None
        best = None
        for reading in self._imus:  # oldest first: a later one of equal stamp wins
            if abs(reading[0] - stamp) <= tol and (best is None or reading[0] >= best[0]):
                best = reading
        return False if best is None else best

    def _newest_imu(self) -> float:
        return max(reading[0] for reading in self._imus)

    def _try_tick(self, now: float) -> Targets | None:
        if self._pending is None:
            return None
        stamp, pos, vel = self._pending
        reading = self._imu_for(stamp)
        if reading is None:
            return None  # the IMU reading of this tick has not arrived yet
        self._pending = None
        try:
            check_fresh('joint_states', stamp, now, self.max_age, self.clock)  # it may have waited
            if reading is False:
                newest = self._newest_imu()
                raise BadInput('unsynced_imu', f'imu: no reading within {IMU_SYNC_PERIODS:g} '
                               f'control period of the joint state stamped {stamp:.3f} s (newest '
                               f'imu {newest:.3f} s, {(newest - stamp) * 1e3:.1f} ms ahead); the '
                               'IMU and joint clocks disagree, or the IMU stalled')
        except BadInput as exc:
            self._usable.append(False)
            return self._drop(exc, 'stale_imu', now)
        _, quat, gyro = reading
        self.started = True
        self._last_state_stamp = self._stamp = self._tick_stamp = stamp
        self._last_good_mono = self._mono
        self._pose = pos
        self._usable.append(quat is not None)
        if quat is None:
            self.holds.add('bad_input')
            self.safety.fault(gyro[0], now, gyro[1])
            return self._hold(now)
        self._stamps['joint_states'].append(stamp)
        self._mismatch_since = None
        self.alerts.clear('clock_mismatch')
        if self.safety.state == PASSIVE:
            self.shaper.restart(pos)  # leaving PASSIVE starts from the measured pose
        if self.safety.check_state(now, pos, quat):
            self.safety.advance(now, pos)
        return self._command(now, pos, vel, quat, gyro)

    def _command(self, now: float, pos: np.ndarray, vel: np.ndarray, quat: np.ndarray,
                 gyro: np.ndarray) -> Targets:
        safety = self.safety
        if safety.state == EXCITE:
            target = self._excite(now, pos)
            if target is not None:
                return target
        if safety.state == RL:
            target = self._act(now, pos, vel, quat, gyro)
            if target is not None:
                return target
        if safety.state == PASSIVE:
            return self._hold(now)
        if self.policy is None:
            self.drops.add('no_model')
            self.holds.add('no_model')
        self.guard.stage = 'shaping'
        target, _ = self.shaper.shape(safety.target(now, pos), self._tick_elapsed())
        return self._out(now, target, None)

    def _excite(self, now: float, pos: np.ndarray) -> Targets | None:
        """EXCITE: ``q0 + offset(t)``, shaped as RL's targets (joint limits, rate limit);
        ``t`` [s] since the first state the run answered, by the accepted states' stamps.
        None once the run is over (back to STAND_UP: the caller shapes its target)."""
        if self.excite_t0 is None:
            self.excite_t0 = self._excite_started = self._stamp
        self.excite_t = self._stamp - self.excite_t0
        if self.excite_t >= self.excitation.duration:
            # STAND_UP from the last command (not the measured pose: no jump by the tracking
            # error of a loaded joint).
            self.safety.end_excitation(now, self.shaper.last if self.shaper.last is not None
                                       else pos)
            return None
        self.guard.stage = 'shaping'
        raw = self.robot.default_joint_pos + self.excitation.offset(self.excite_t)
        target, _ = self.shaper.shape(raw, self._tick_elapsed())
        return self._out(now, target, None)

    def take_excitation_start(self) -> float | None:
        """The stamp [s] a run's time 0 is at, once, after its first tick (None: none since);
        for the node to publish the run (:meth:`.excitation.Excitation.describe`)."""
        started, self._excite_started = self._excite_started, None
        return started

    def _act(self, now: float, pos: np.ndarray, vel: np.ndarray, quat: np.ndarray,
             gyro: np.ndarray) -> Targets | None:
        """RL: obs -> action -> faded, shaped target; None when a fault fired."""
        self.guard.stage = 'observation'
        self._command_timeout()
        frame = self.assembler.observe(pos, vel, quat, gyro)
        finite = np.isfinite(frame.astype(np.float32))  # as the model will see it
        if not finite.all():
            i = int(np.flatnonzero(~finite)[0])
            self.safety.fault('non_finite', now, f'observation[{i}] = {frame[i]!r} is not a '
                              'finite float32')
            return None
        # With a model that reads past frames: the window of acted-on frames, this one newest.
        obs = self.assembler.model_input(frame)
        self.guard.stage = 'policy'
        start = time.perf_counter()
        action = mean = self.policy(obs)
        if self.sampler is not None:
            action, log_prob = self.sampler.sample(mean)
        self.inference_s = time.perf_counter() - start
        if not np.isfinite(action).all():
            j = int(np.flatnonzero(~np.isfinite(action))[0])
            self.safety.fault('non_finite', now, f'policy action {action[j]!r} for '
                              f'{self.robot.joint_names[j]}')
            return None
        # The trained action range (the model's action_clip), whatever the graph did.
        clip = self.assembler.action_clip
        action = np.clip(action, -clip, clip)
        self.guard.stage = 'shaping'
        # target = q0 + fade * scale * a, then joint limits and rate limit.
        q0 = self.robot.default_joint_pos
        raw = q0 + self.safety.fade(now) * self.robot.action_scale * action
        target, cut = self.shaper.shape(raw, self._tick_elapsed())
        self.safety.note_policy_tick(now, self.inference_s, cut > self.safety.cfg.saturation_tol)
        if self.safety.state != RL:
            return None
        self.ticks += 1
        if self.sampler is not None:  # before _out moves the memory on
            a = self.assembler
            self.record = self.sampler.record(self._stamp, a.gait_phase[0], log_prob, obs,
                                              action, mean, a.last_action[0],
                                              self.order.to_output(target))
        return self._out(now, target, action, frame)

    def _command_timeout(self) -> None:
        """Zero the velocity command once cmd_vel is older than cmd_vel_timeout_s."""
        if self.cmd_vel_timeout <= 0 or self._last_cmd_mono is None or self.command_timed_out:
            return
        if self._mono - self._last_cmd_mono > self.cmd_vel_timeout:
            self.assembler.set_command(np.zeros(3))
            self.command_timed_out = True
            self.cmd_vel_timeouts += 1

    def take_record(self) -> PolicyRecord | None:
        """The training-mode record of the last RL tick, once (None: none since)."""
        record, self.record = self.record, None
        return record

    def _tick_elapsed(self) -> float | None:
        """Measured time [s] the coming command stands for: the stamp of the accepted state it
        answers minus that of the state before it (the one the previous command answered, or a
        superseded one skipped since); None: either unknown, the gait clock and the rate limit
        then take one control period."""
        if self._tick_stamp is None or self._clock_stamp is None:
            return None
        return self._tick_stamp - self._clock_stamp

    def _out(self, now: float, target: np.ndarray, action: np.ndarray | None,
             frame: np.ndarray | None = None) -> Targets:
        # The gait clock moves on by the measured time; a command that answered no new state
        # (a hold) leaves the next one without a reference, so no time is counted twice.
        self.assembler.advance(action, frame, self._tick_elapsed())
        self._clock_stamp, self._tick_stamp = self._tick_stamp, None
        self._last_output = self._mono
        self._passive_gains = self.safety.state == PASSIVE
        return self.order.to_output(target)

    @property
    def last_accepted_at(self) -> float | None:
        """Monotonic receive time of the last accepted state (the watchdog's), or None."""
        return self._last_good_mono

    @property
    def measured_pose(self) -> np.ndarray | None:
        """[J] pose of the last accepted state (spec order; PASSIVE's target), or None."""
        return self._pose

    @property
    def last_gains(self) -> tuple[np.ndarray, np.ndarray]:
        """([J] Kp, [J] Kd) of the last target in ``joints`` order (built when asked: most
        drivers take no gains)."""
        kp, kd = self.shaper.gains(self._passive_gains)
        return self.order.to_output(kp), self.order.to_output(kd)

    def _drop(self, exc: BadInput, stale_fault: str, now: float) -> Targets | None:
        self.drops.add(exc.cause)
        self.last_drop = str(exc)
        self._alert(exc)
        fault = stale_fault if exc.cause in ('stale', 'unsynced_imu') else FAULT_OF[exc.cause]
        self.safety.fault(fault, now, str(exc))
        if not self.started:
            return None
        self.holds.add('bad_input')
        return self._hold(now)

    def _hold(self, now: float) -> Targets | None:
        """PASSIVE: damping. The target is the last measured pose itself (a position-only
        driver applies no Kp force); the rate limit restarts at it, clamped to the limits."""
        if not self.started:
            return None
        self.shaper.restart(self._pose)
        return self._out(now, self._pose.copy(), None)

    def internal_fault(self, exc: BaseException, fallback=None):
        """An exception inside a tick: the ``exception`` fault (counted by stage), then the
        PASSIVE hold when it can be computed (else nothing); ``fallback`` for requests."""
        detail = self.guard.caught(exc)
        now = self._last_now if self._last_now is not None else 0.0
        try:
            self.safety.fault('exception', now, detail)
            self.alerts.once(f'exception_{self.guard.stage}', f'exception caught, PASSIVE: '
                             f'{detail}')
            if fallback is not None:
                return fallback
            self.holds.add('exception')
            return self._hold(now)
        except Exception:  # noqa: BLE001 - the hold itself failed: publish nothing
            return fallback

    # --------------------------------------------------------------------------- hot swap
    @property
    def version(self) -> str:
        """sha256 prefix of the serving model, or 'none'."""
        return version_of(self.policy.sha256) if self.policy is not None else 'none'

    def offer(self, data: bytes, name: str | None = None) -> tuple[str, str | None]:
        """Validate offered model bytes now; returns (sha256, rejection reason or None)."""
        sha, result = self.models.offer(bytes(data), name)
        return sha, str(result) if isinstance(result, ModelRejected) else None

    def activate(self, sha256: str) -> str:
        """Serve the offered model with this hash (from the next tick); returns its version.

        Raises ModelRejected with the exact reason; the serving model is then unchanged.
        """
        return self._serve(sha256, None)

    def load_path(self, path: str | Path) -> str:
        """Validate and serve a model file (for humans); ModelRejected as :meth:`activate`."""
        try:
            data = read_model_file(path, self.models.max_bytes)
        except ModelRejected as exc:
            self.last_swap = f'rejected {path}: {exc}'
            raise
        sha, _ = self.offer(data, str(path))
        return self._serve(sha, path)

    def _serve(self, sha256: str, path: str | Path | None) -> str:
        """Serve a validated model; in RL under require_verification only a verified one."""
        try:
            policy = self.models.get(sha256)
            unverified = verification_blocker(path, policy.sha256)
            if self.require_verification and unverified and self.safety.state == RL:
                raise ModelRejected(f'not verified, refused while in RL: {unverified}')
            sampler = self._sampler(policy)
        except ModelRejected as exc:
            self.last_swap = f'rejected {version_of(sha256)}: {exc}'
            raise
        self.policy, self._unverified, self.sampler = policy, unverified, sampler
        self.model_path = Path(path) if path is not None else None
        # The gains sent from the next command on are this model's metadata, not the robot's.
        self.shaper.use_gains(policy.spec['kp'], policy.spec['kd'])
        self.drive_verdict = ''  # the last self-check was of the previous model
        self.assembler.action_clip = policy_clip(policy)
        self.assembler.set_history(policy.obs_history)
        self.last_swap = f'ok {self.version}'
        return self.version

    def _sampler(self, policy: OnnxPolicy) -> GaussianSampler | None:
        """Training mode: the model's behaviour distribution (ModelRejected without one)."""
        if not self.training:
            return None
        try:
            return GaussianSampler(policy, self._rng)
        except ValueError as exc:
            raise ModelRejected(f'training mode: {exc}') from None

    def _excite_blocker(self) -> str | None:
        """Why the excitation may not start (None: it may): the live half of the self-check
        (joint names, usable states, rates, command interface; the robot's own spec stands
        in for a model: an excitation needs none)."""
        problems = self_check(self.robot, self.robot.to_metadata(),
                              output_joints=self.order.output, joint_state_names=self._names,
                              joint_state_period=self._period('joint_states'),
                              imu_period=self._period('imu'),
                              command_joints=self.command_joints,
                              usable=(sum(self._usable), len(self._usable)),
                              last_drop=self.last_drop)
        return f'the self-check found {len(problems)} mismatch(es): ' + '; '.join(problems) \
            if problems else None

    def _rl_blocker(self) -> str | None:
        """Why the policy may not act now (None: it may)."""
        if self.policy is None:
            return 'no model loaded (set model_path or push one on policy/model)'
        return self._unverified if self.require_verification else None

    # ------------------------------------------------------------------------ diagnostics
    def _excite_status(self) -> str:
        """'idle', or the running segment and the run's time, e.g. 'calf 17.3/24.0 s'."""
        if self.safety.state != EXCITE:
            return 'idle'
        seg = self.excitation.segment_at(self.excite_t)
        return f'{seg.label if seg else "start"} {self.excite_t:.1f}/' \
            f'{self.excitation.duration:.1f} s'

    def diagnostics(self) -> dict[str, object]:
        """Flat key/value fields: model version, last swap, drops and holds by cause."""
        out: dict[str, object] = {'model_version': self.version, 'last_swap': self.last_swap,
                                  'policy_ticks': self.ticks, 'started': self.started,
                                  'superseded_states': self.superseded,
                                  'training': self.training,
                                  'last_drop': self.last_drop}
        out.update(self.drops.summary('dropped'))
        out.update(self.holds.summary('holds'))
        out.update(self.guard.counts.summary('exceptions'))
        out['last_exception'] = self.guard.last or 'none'
        out['cmd_vel_timeouts'] = self.cmd_vel_timeouts
        out['command_timed_out'] = self.command_timed_out
        out['clock_problem'] = self.alerts.seen.get('clock_mismatch', 'none')
        out['usable_states'] = f'{sum(self._usable)}/{len(self._usable)}'
        out['action_clip'] = self.assembler.action_clip
        out['verified'] = self._unverified is None
        out['inference_ms'] = self.inference_s * 1e3
        out['excitation'] = self._excite_status()
        out.update(self.safety.diagnostics())
        return out
