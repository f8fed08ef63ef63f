"""The policy node's logic without ROS: inputs -> validated observation -> safe joint targets.

Contract (what the node publishes on ``joint_commands``):

* one command per joint-state message, computed only when that state and an IMU reading of
  the same tick (stamp at most half a control period older) are both valid and fresh; a state
  not newer than the last answered one (a re-sent or out-of-order message) gets no command, so
  a lockstep simulator never sees two answers to one state;
* a joint state or IMU reading that is stale, non-finite, misnamed, incomplete or of the wrong
  length is dropped and counted by cause, and the tick publishes the default pose instead;
* before the first complete state nothing is published; with no model, the default pose;
* :meth:`PolicyController.watchdog` (called every control period) publishes the default pose
  while the last state is older than ``stale_after_periods`` control periods;
* targets are ``q0 + action_scale * a`` clamped to the joint limits (``RobotSpec``), in the
  order of the ``joints`` parameter.

Models are swapped with :meth:`offer` (validate bytes as they arrive) and :meth:`activate`
(by sha256); the swap replaces one reference, so it is atomic between two ticks as long as the
caller serialises calls (one ROS executor thread does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from .control_stats import Counters
from .model_swap import (DEFAULT_MAX_MODEL_BYTES, ModelCache, ModelRejected, read_model_file,
                         version_of)
from .onnx_policy import OnnxPolicy
from ..sim.robot import RobotSpec
from .state_input import (BadInput, check_fresh, command_array, DROP_CAUSES, imu_arrays,
                          IMU_SYNC_PERIODS, JointOrder, ObservationAssembler)

HOLD_REASONS = ('bad_input', 'no_model', 'stale')
Targets = np.ndarray


class PolicyController:
    """Validated inputs in, [J] joint position targets (``joints`` order) or None out."""

    def __init__(self, robot: RobotSpec, *, stale_after_periods: float = 3.0,
                 output_joints: Sequence[str] | None = None,
                 max_model_bytes: int = DEFAULT_MAX_MODEL_BYTES):
        if not stale_after_periods > 0:
            raise ValueError(f'stale_after_periods = {stale_after_periods}; must be > 0')
        self.robot = robot
        self.dt = robot.control_dt
        self.max_age = stale_after_periods * self.dt
        self.order = JointOrder(robot, output_joints)
        self.assembler = ObservationAssembler(robot)
        self.models = ModelCache(robot, max_model_bytes)
        self.policy: OnnxPolicy | None = None
        self.drops = Counters(DROP_CAUSES)
        self.holds = Counters(HOLD_REASONS)
        self.ticks = 0
        self.started = False
        self.last_swap = 'none'
        self.last_drop = ''
        self.hold_targets = self.order.to_output(robot.default_joint_pos)
        # (stamp, [4] quat w,x,y,z, [3] gyro); quat None marks a dropped reading of that stamp.
        self._imu: tuple[float, np.ndarray | None, np.ndarray | None] | None = None
        self._pending: tuple[float, np.ndarray, np.ndarray] | None = None
        self._last_state_stamp: float | None = None
        self._last_output: float | None = None

    # ------------------------------------------------------------------------------ inputs
    def on_joint_state(self, stamp: float, names: Sequence[str], position: Sequence[float],
                       velocity: Sequence[float], now: float) -> Targets | None:
        """A JointState (stamp [s], names, [n] position, [n] velocity) received at ``now``."""
        if self._last_state_stamp is not None and stamp <= self._last_state_stamp:
            self.drops.add('stale')  # this tick was answered already
            return None
        try:
            pos, vel = self.order.joint_arrays(names, position, velocity)
            check_fresh('joint_states', stamp, now, self.max_age)
        except BadInput as exc:
            self._pending = None
            return self._drop(exc, now)
        self._pending = (stamp, pos, vel)
        return self._try_tick(now)

    def on_imu(self, stamp: float, orientation_xyzw: Sequence[float],
               angular_velocity: Sequence[float], now: float) -> Targets | None:
        """An Imu reading; completes a pending joint state of the same tick."""
        try:
            quat, gyro = imu_arrays(orientation_xyzw, angular_velocity)
            check_fresh('imu', stamp, now, self.max_age)
        except BadInput as exc:
            self.drops.add(exc.cause)
            self.last_drop = str(exc)
            self._imu = (stamp if np.isfinite(stamp) else now, None, None)
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
        """Default pose when started, the last state is stale and nothing went out this tick."""
        if not self.started or self._last_state_stamp is None:
            return None
        if now - self._last_state_stamp <= self.max_age:
            return None
        if self._last_output is not None and now - self._last_output < 0.9 * self.dt:
            return None
        self.holds.add('stale')
        return self._hold(now)

    # ------------------------------------------------------------------------------- ticks
    def _try_tick(self, now: float) -> Targets | None:
        if self._pending is None or self._imu is None:
            return None
        stamp, pos, vel = self._pending
        imu_stamp, quat, gyro = self._imu
        if imu_stamp < stamp - IMU_SYNC_PERIODS * self.dt:
            return None  # the IMU reading of this tick has not arrived yet
        self._pending = None
        self.started = True
        self._last_state_stamp = stamp
        if quat is None:
            self.holds.add('bad_input')
            return self._hold(now)
        if self.policy is None:
            self.drops.add('no_model')
            self.holds.add('no_model')
            return self._hold(now)
        # obs -> action -> target = q0 + scale * a, clamped to the joint limits.
        action = self.policy(self.assembler.observe(pos, vel, quat, gyro))
        self.assembler.advance(action)
        self.ticks += 1
        self._last_output = now
        return self.order.to_output(self.robot.action_to_target(action[None])[0])

    def _drop(self, exc: BadInput, now: float) -> Targets | None:
        self.drops.add(exc.cause)
        self.last_drop = str(exc)
        if not self.started:
            return None
        self.holds.add('bad_input')
        return self._hold(now)

    def _hold(self, now: float) -> Targets | None:
        if not self.started:
            return None
        self.assembler.advance(None)
        self._last_output = now
        return self.hold_targets.copy()

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
        try:
            policy = self.models.get(sha256)
        except ModelRejected as exc:
            self.last_swap = f'rejected {version_of(sha256)}: {exc}'
            raise
        self.policy = policy
        self.last_swap = f'ok {self.version}'
        return self.version

    def load_path(self, path: str | Path) -> str:
        """Validate and serve a model file (for humans); ModelRejected as :meth:`activate`."""
        try:
            data = read_model_file(path, self.models.max_bytes)
        except ModelRejected as exc:
            self.last_swap = f'rejected {path}: {exc}'
            raise
        sha, _ = self.offer(data)
        return self.activate(sha)

    # ------------------------------------------------------------------------ diagnostics
    def diagnostics(self) -> dict[str, object]:
        """Flat key/value fields: model version, last swap, drops and holds by cause."""
        out: dict[str, object] = {'model_version': self.version, 'last_swap': self.last_swap,
                                  'policy_ticks': self.ticks, 'started': self.started,
                                  'last_drop': self.last_drop}
        out.update(self.drops.summary('dropped'))
        out.update(self.holds.summary('holds'))
        return out
