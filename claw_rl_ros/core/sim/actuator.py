"""Actuator models: how a joint position target becomes a joint torque, at the physics rate.

The robot YAML's ``actuator:`` section names the model (``robot_spec.ActuatorConfig``):

- ``ideal_pd``: MuJoCo's position actuator. The PD law runs inside the physics step (its
  damping integrated implicitly) with a constant torque clip::

      tau = clip(Kp (target - q) - Kd qd, -effort, effort)

- ``dc_motor``: the same law at a DC motor's voltage limit (Isaac Lab's DCMotor, mjlab's
  DcMotorActuator, MuJoCo's DC motor note): with stall torque ``tau_s`` and no-load speed
  ``w0``, the torque-speed lines bound it, and the effort limit bounds the sum::

      c = tau_s / w0    (the back-EMF damping)
      tau = clip(clip(Kp (target - q) - Kd qd, -tau_s - c qd, tau_s - c qd), -effort, effort)

  so a joint that spins fast along its torque has less of it (none at w0), and past w0 the
  motor brakes. It also runs inside MuJoCo's step (core/sim/scene.py: a position actuator with
  damping Kd - c saturating at +-tau_s plus a back-EMF damper -c qd, their sum clamped on the
  joint), exactly this law at every physics step; :class:`DcMotor` states it for engines that
  drive the joints themselves (the transfer gate's PyBullet).
- ``network``: a learned actuator (Hwangbo et al. 2019): an ONNX MLP from the history of the
  position error and the joint velocity at the physics rate to the torque, clipped to the
  effort limit (:class:`LearnedActuator` states the file's contract); evaluated between
  physics steps.

Every model shares the command -> motor delay (``delay_steps``, drawn per world; the delay
line is in :class:`~.physics.BatchedPhysics`) and the rotor inertia (``armature``, added to
each joint by the scene).
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort

from ..config import ConfigError
from .robot_spec import RobotSpec

# metadata_props key of a learned actuator's ONNX file: JSON {'history': H, 'physics_dt': s}.
ACTUATOR_NET_KEY = 'claw_rl_actuator'
ACTUATOR_NET_INPUT, ACTUATOR_NET_OUTPUT = 'history', 'torque'
MAX_NET_HISTORY = 64


class DcMotor:
    """The PD law at a DC motor's voltage limit (module docstring), for an engine that computes
    the joint torques itself."""

    def __init__(self, robot: RobotSpec):
        act = robot.actuator
        self.effort = robot.effort_limit
        self.saturation = act.saturation_torque
        self.no_load_speed = act.no_load_speed

    def torque(self, error: np.ndarray, qd: np.ndarray, kp: np.ndarray,
               kd: np.ndarray) -> np.ndarray:
        """[N, J] torques from [N, J] position errors (target - q), joint velocities and
        the worlds' gains."""
        tau = kp * error - kd * qd
        # The torque-speed lines at the voltage limit, then the effort limit.
        emf = self.saturation / self.no_load_speed * qd
        tau = np.clip(tau, -self.saturation - emf, self.saturation - emf)
        return np.clip(tau, -self.effort, self.effort)


class LearnedActuator:
    """A learned actuator network run for every joint of every world at the physics rate.

    The ONNX file's contract (what system identification writes): input ``history`` float32
    ``[B, 2 H]``, the joint's position error (target - q) then its velocity, each newest first
    over the last H physics steps; output ``torque`` ``[B, 1]`` [N m]; metadata_props
    ``claw_rl_actuator`` = JSON ``{"history": H, "physics_dt": seconds}``, whose step must be
    the robot's ``sim_dt``. The robot's Kp/Kd do not enter: the network learned the drive's.
    """

    def __init__(self, robot: RobotSpec, num_envs: int):
        path = robot.actuator.network_path
        field = 'actuator.network_file'
        source = robot.source.get('config', 'robot')
        try:
            self.session = ort.InferenceSession(str(path), providers=['CPUExecutionProvider'])
        except Exception as exc:  # onnxruntime raises its own types for unreadable files
            raise ConfigError(source, field, f'{path}: not a loadable ONNX model ({exc}); '
                              'give a learned actuator of the contract in '
                              'core/sim/actuator.py') from None
        meta = self.session.get_modelmeta().custom_metadata_map
        try:
            info = json.loads(meta[ACTUATOR_NET_KEY])
            history, dt = int(info['history']), float(info['physics_dt'])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(source, field, f'{path.name} has no valid {ACTUATOR_NET_KEY!r} '
                              'metadata ({"history": H, "physics_dt": s}); give a learned '
                              'actuator of the contract in core/sim/actuator.py') from None
        if not 1 <= history <= MAX_NET_HISTORY:
            raise ConfigError(source, field, f'{path.name}: history {history} is outside '
                              f'[1, {MAX_NET_HISTORY}] physics steps')
        if abs(dt - robot.sim_dt) > 1e-9:
            raise ConfigError(source, field, f'{path.name} was fitted at a physics step of '
                              f'{dt} s, the robot steps {robot.sim_dt} s; fit it again at '
                              'the robot\'s sim_dt')
        inputs = {i.name: i.shape for i in self.session.get_inputs()}
        outputs = [o.name for o in self.session.get_outputs()]
        if ACTUATOR_NET_INPUT not in inputs or outputs != [ACTUATOR_NET_OUTPUT] or \
                inputs[ACTUATOR_NET_INPUT][-1] != 2 * history:
            raise ConfigError(source, field, f'{path.name} takes {inputs} and gives {outputs}; '
                              f'expected input {ACTUATOR_NET_INPUT!r} [B, {2 * history}] and '
                              f'output {ACTUATOR_NET_OUTPUT!r} [B, 1]')
        self.history = history
        self.effort = robot.effort_limit
        j = robot.num_joints
        # [N, J, 2 H]: position errors then velocities, newest first.
        self.window = np.zeros((num_envs, j, 2 * history), dtype=np.float32)

    def reset(self, ids: np.ndarray, error: np.ndarray, qd: np.ndarray) -> None:
        """Worlds ``ids`` restart their history at [K, J] error and velocity (held still)."""
        h = self.history
        self.window[ids, :, :h] = error[:, :, None]
        self.window[ids, :, h:] = qd[:, :, None]

    def torque(self, error: np.ndarray, qd: np.ndarray, kp: np.ndarray,
               kd: np.ndarray) -> np.ndarray:
        """[N, J] torques: the network on each joint's history, clipped to the effort limit."""
        h, w = self.history, self.window
        # Move both histories on by one physics step and put the newest sample first.
        w[:, :, 1:h] = w[:, :, 0:h - 1]
        w[:, :, h + 1:] = w[:, :, h:2 * h - 1]
        w[:, :, 0], w[:, :, h] = error, qd
        n, j, _ = w.shape
        tau = self.session.run(None, {ACTUATOR_NET_INPUT: w.reshape(n * j, 2 * h)})[0]
        return np.clip(np.nan_to_num(tau.reshape(n, j).astype(np.float64)), -self.effort,
                       self.effort)


def make_actuator(robot: RobotSpec, num_envs: int) -> LearnedActuator | None:
    """The actuator computed between physics steps for ``num_envs`` worlds (``network``);
    None where MuJoCo runs the law inside its step (``ideal_pd``, ``dc_motor``)."""
    if robot.actuator.model == 'network':
        return LearnedActuator(robot, num_envs)
    return None


def actuator_net_metadata(history: int, physics_dt: float) -> dict[str, str]:
    """The metadata_props a learned actuator's ONNX file carries."""
    return {ACTUATOR_NET_KEY: json.dumps({'history': int(history),
                                          'physics_dt': float(physics_dt)})}
