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
  in); every target is shaped (:mod:`.command_shaping`: joint limits, maximum change per
  tick). Under ``autostart`` a complete state enters RL at once (with no model: the default
  pose);
* a joint state or IMU reading that is stale, non-finite, misnamed, incomplete or of the wrong
  length is dropped and counted by cause; the tick is a fault: PASSIVE, damping (the target is
  the last measured pose);
* :meth:`PolicyController.watchdog` (called every control period) faults to PASSIVE (damping
  at the last measured pose) while the last state is older than ``stale_after_periods``
  control periods;
* targets are in the order of the ``joints`` parameter;
* in ``training`` mode (the control loop as an actor; never on a robot) the policy acts with
  ``a ~ N(mu, sigma)`` around the model's mean (``sigma``: its ``action_std`` metadata, so only
  trainer exports are accepted), through the same safety and shaping path, and every RL tick
  leaves a :class:`~..learning.loop_record.PolicyRecord` for :meth:`take_record`.

Models are swapped with :meth:`offer` (validate bytes as they arrive) and :meth:`activate`
(by sha256); the swap replaces one reference, so it is atomic between two ticks as long as the
caller serialises calls (one ROS executor thread does).
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
import time
from typing import Sequence

import numpy as np

from ..learning.loop_record import GaussianSampler, PolicyRecord
from .command_shaping import CommandShaper
from .control_stats import Counters
from .model_swap import (DEFAULT_MAX_MODEL_BYTES, ModelCache, ModelRejected, read_model_file,
                         version_of)
from .onnx_policy import OnnxPolicy
from .safety import PASSIVE, RL, SafetyConfig, SafetyMachine
from .self_check import self_check
from ..sim.robot import RobotSpec
from .state_input import (BadInput, check_fresh, command_array, DROP_CAUSES, imu_arrays,
                          IMU_SYNC_PERIODS, JointOrder, ObservationAssembler)
from .verification import verification_blocker

HOLD_REASONS = ('bad_input', 'no_model', 'stale')
# Input drop cause -> safety fault (stale is told apart by topic).
FAULT_OF = {'non_finite': 'non_finite', 'missing_joint': 'bad_input',
            'unknown_joint': 'bad_input', 'wrong_length': 'bad_input', 'bad_imu': 'bad_input'}
Targets = np.ndarray


class PolicyController:
    """Validated inputs in, [J] joint position targets (``joints`` order) or None out.

    ``last_gains`` holds ([J] Kp, [J] Kd) in ``joints`` order for the last target (Kp = 0 in
    PASSIVE), for drivers that take gains.
    """

    def __init__(self, robot: RobotSpec, *, stale_after_periods: float = 3.0,
                 output_joints: Sequence[str] | None = None,
                 max_model_bytes: int = DEFAULT_MAX_MODEL_BYTES,
                 safety: SafetyConfig | None = None, max_delta_per_tick: float = 0.0,
                 require_verification: bool = False,
                 command_joints: Sequence[str] | None = None, training: bool = False,
                 seed: int = 0):
        if not stale_after_periods > 0:
            raise ValueError(f'stale_after_periods = {stale_after_periods}; must be > 0')
        self.robot = robot
        self.dt = robot.control_dt
        self.max_age = stale_after_periods * self.dt
        self.order = JointOrder(robot, output_joints)
        self.assembler = ObservationAssembler(robot)
        self.models = ModelCache(robot, max_model_bytes)
        self.policy: OnnxPolicy | None = None
        self.safety = SafetyMachine(robot, safety or SafetyConfig(), self._rl_blocker)
        self.shaper = CommandShaper(robot, max_delta_per_tick)
        self.require_verification = require_verification
        self.command_joints = list(command_joints) if command_joints is not None else None
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
        # (stamp, [4] quat w,x,y,z, [3] gyro); quat None marks a dropped reading (gyro = cause).
        self._imu: tuple[float, np.ndarray | None, object] | None = None
        self._pending: tuple[float, np.ndarray, np.ndarray] | None = None
        self._pose: np.ndarray | None = None  # [J] last measured pose of a complete state
        self._last_state_stamp: float | None = None
        self._last_output: float | None = None
        self._stamps = {'joint_states': deque(maxlen=21), 'imu': deque(maxlen=21)}
        self._names: tuple[str, ...] | None = None

    # ------------------------------------------------------------------------------ inputs
    def on_joint_state(self, stamp: float, names: Sequence[str], position: Sequence[float],
                       velocity: Sequence[float], now: float,
                       superseded: bool = False) -> Targets | None:
        """A JointState (stamp [s], names, [n] position, [n] velocity) received at ``now``.

        ``superseded``: a newer state was already waiting behind this one (a backlog). It is
        still validated (a bad one is dropped, counted and faults as ever) but, when valid,
        skipped without a command and without a stale verdict: its age is the node's own
        backlog, and judging it against a clock that has moved on (``/clock`` keeps only the
        newest) faulted and re-armed the loop over and over under load. The newest state
        of the backlog is judged as usual.
        """
        if self._last_state_stamp is not None and stamp <= self._last_state_stamp:
            self.drops.add('stale')  # this tick was answered already
            return None
        self._stamps['joint_states'].append(stamp)
        self._names = tuple(names)
        try:
            pos, vel = self.order.joint_arrays(names, position, velocity)
            if superseded:
                self.superseded += 1
                return None
            check_fresh('joint_states', stamp, now, self.max_age)
        except BadInput as exc:
            self._pending = None
            return self._drop(exc, 'stale_joint_states', now)
        self._pending = (stamp, pos, vel)
        return self._try_tick(now)

    def on_imu(self, stamp: float, orientation_xyzw: Sequence[float],
               angular_velocity: Sequence[float], now: float) -> Targets | None:
        """An Imu reading; completes a pending joint state of the same tick."""
        self._stamps['imu'].append(stamp)
        try:
            quat, gyro = imu_arrays(orientation_xyzw, angular_velocity)
            check_fresh('imu', stamp, now, self.max_age)
        except BadInput as exc:
            self.drops.add(exc.cause)
            self.last_drop = str(exc)
            fault = 'stale_imu' if exc.cause == 'stale' else FAULT_OF[exc.cause]
            self._imu = (stamp if np.isfinite(stamp) else now, None, (fault, str(exc)))
            return self._try_tick(now)
        self._imu = (stamp, quat, gyro)
        return self._try_tick(now)

    def on_command(self, linear_x: float, linear_y: float, angular_z: float) -> None:
        """A cmd_vel; a non-finite one is dropped (the previous command stays)."""
        try:
            self.assembler.set_command(command_array(linear_x, linear_y, angular_z))
        except BadInput as exc:
            self.drops.add(exc.cause)
            self.last_drop = str(exc)

    def watchdog(self, now: float) -> Targets | None:
        """Fault to PASSIVE (damping) when started, the last state is stale and nothing went
        out this tick."""
        if not self.started or self._last_state_stamp is None:
            return None
        if now - self._last_state_stamp <= self.max_age:
            return None
        if self._last_output is not None and now - self._last_output < 0.9 * self.dt:
            return None
        self.holds.add('stale')
        age = f'{(now - self._last_state_stamp) * 1e3:.0f} ms without a complete state'
        self.safety.fault('stale_imu' if self._pending else 'stale_joint_states', now, age)
        return self._hold(now)

    def request(self, name: str, now: float) -> tuple[bool, str]:
        """An operator request (:data:`.safety.REQUESTS`); 'rl' runs the self-check first."""
        fresh = self._last_state_stamp is not None and \
            now - self._last_state_stamp <= self.max_age
        if name == 'rl' and self.safety.state != RL:
            problems = self.check()
            if problems:
                return False, f'rl refused by the self-check ({len(problems)} mismatch(es)): ' \
                    + '; '.join(problems)
        return self.safety.request(name, now, self._pose if fresh else None)

    def check(self) -> list[str]:
        """The start-up self-check (:func:`.self_check.self_check`) on what was received."""
        return self_check(self.robot, self.policy.spec if self.policy else None,
                          output_joints=self.order.output, joint_state_names=self._names,
                          joint_state_period=self._period('joint_states'),
                          imu_period=self._period('imu'), command_joints=self.command_joints)

    def _period(self, topic: str) -> float | None:
        stamps = np.asarray(self._stamps[topic])
        return float(np.median(np.diff(stamps))) if stamps.size >= 3 else None

    # ------------------------------------------------------------------------------- ticks
    def _try_tick(self, now: float) -> Targets | None:
        if self._pending is None or self._imu is None:
            return None
        stamp, pos, vel = self._pending
        imu_stamp, quat, gyro = self._imu
        if imu_stamp < stamp - IMU_SYNC_PERIODS * self.dt:
            return None  # the IMU reading of this tick has not arrived yet
        self._pending = None
        try:
            check_fresh('joint_states', stamp, now, self.max_age)  # it may have waited
        except BadInput as exc:
            return self._drop(exc, 'stale_imu', now)
        self.started = True
        self._last_state_stamp = self._stamp = stamp
        self._pose = pos
        if quat is None:
            self.holds.add('bad_input')
            self.safety.fault(gyro[0], now, gyro[1])
            return self._hold(now)
        if self.safety.state == PASSIVE:
            self.shaper.restart(pos)  # leaving PASSIVE starts from the measured pose
        if self.safety.check_state(now, pos, quat):
            self.safety.advance(now, pos)
        return self._command(now, pos, vel, quat, gyro)

    def _command(self, now: float, pos: np.ndarray, vel: np.ndarray, quat: np.ndarray,
                 gyro: np.ndarray) -> Targets:
        safety = self.safety
        if safety.state == RL:
            target = self._act(now, pos, vel, quat, gyro)
            if target is not None:
                return target
        if safety.state == PASSIVE:
            return self._hold(now)
        if self.policy is None:
            self.drops.add('no_model')
            self.holds.add('no_model')
        target, _ = self.shaper.shape(safety.target(now, pos))
        return self._out(now, target, None)

    def _act(self, now: float, pos: np.ndarray, vel: np.ndarray, quat: np.ndarray,
             gyro: np.ndarray) -> Targets | None:
        """RL: obs -> action -> faded, shaped target; None when a fault fired."""
        obs = self.assembler.observe(pos, vel, quat, gyro)
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
        # target = q0 + fade * scale * a, then joint limits and rate limit.
        q0 = self.robot.default_joint_pos
        raw = q0 + self.safety.fade(now) * self.robot.action_scale * action
        target, cut = self.shaper.shape(raw)
        self.safety.note_policy_tick(now, self.inference_s, cut > self.safety.cfg.saturation_tol)
        if self.safety.state != RL:
            return None
        self.ticks += 1
        if self.sampler is not None:  # before _out moves the memory on
            a = self.assembler
            self.record = self.sampler.record(self._stamp, a.gait_phase[0], log_prob, obs,
                                              action, mean, a.last_action[0],
                                              self.order.to_output(target))
        return self._out(now, target, action)

    def take_record(self) -> PolicyRecord | None:
        """The training-mode record of the last RL tick, once (None: none since)."""
        record, self.record = self.record, None
        return record

    def _out(self, now: float, target: np.ndarray, action: np.ndarray | None) -> Targets:
        self.assembler.advance(action)
        self._last_output = now
        self._passive_gains = self.safety.state == PASSIVE
        return self.order.to_output(target)

    @property
    def last_gains(self) -> tuple[np.ndarray, np.ndarray]:
        """([J] Kp, [J] Kd) of the last target in ``joints`` order (built when asked: most
        drivers take no gains)."""
        kp, kd = self.shaper.gains(self._passive_gains)
        return self.order.to_output(kp), self.order.to_output(kd)

    def _drop(self, exc: BadInput, stale_fault: str, now: float) -> Targets | None:
        self.drops.add(exc.cause)
        self.last_drop = str(exc)
        fault = stale_fault if exc.cause == 'stale' else FAULT_OF[exc.cause]
        self.safety.fault(fault, now, str(exc))
        if not self.started:
            return None
        self.holds.add('bad_input')
        return self._hold(now)

    def _hold(self, now: float) -> Targets | None:
        """PASSIVE: damping, the target is the last measured pose."""
        if not self.started:
            return None
        return self._out(now, self.shaper.restart(self._pose), None)

    # --------------------------------------------------------------------------- hot swap
    @property
    def version(self) -> str:
        """sha256 prefix of the serving model, or 'none'."""
        return version_of(self.policy.sha256) if self.policy is not None else 'none'

    def offer(self, data: bytes) -> tuple[str, str | None]:
        """Validate offered model bytes now; returns (sha256, rejection reason or None)."""
        sha, result = self.models.offer(bytes(data))
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
        sha, _ = self.offer(data)
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

    def _rl_blocker(self) -> str | None:
        """Why the policy may not act now (None: it may)."""
        if self.policy is None:
            return 'no model loaded (set model_path or push one on policy/model)'
        return self._unverified if self.require_verification else None

    # ------------------------------------------------------------------------ diagnostics
    def diagnostics(self) -> dict[str, object]:
        """Flat key/value fields: model version, last swap, drops and holds by cause."""
        out: dict[str, object] = {'model_version': self.version, 'last_swap': self.last_swap,
                                  'policy_ticks': self.ticks, 'started': self.started,
                                  'superseded_states': self.superseded,
                                  'training': self.training,
                                  'last_drop': self.last_drop}
        out.update(self.drops.summary('dropped'))
        out.update(self.holds.summary('holds'))
        out['verified'] = self._unverified is None
        out['inference_ms'] = self.inference_s * 1e3
        out.update(self.safety.diagnostics())
        return out
