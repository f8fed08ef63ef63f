"""A trace's commands replayed open loop in N MuJoCo worlds, each with its own drive and joint
parameters and command delay: what system identification compares with the recording.

The scene is the sim's (core/sim/scene.py: the robot's actuator model, the env's solver with
its iterations raised to convergence), on a stand (the trunk welded in the air) or on the
ground. A world with a delay of L physics steps applies at physics step i the command in force
at step i - L, as the sim's delay line does (core/sim/physics.py), held at the first command
before the recording. Each world starts from the first sample: on a stand the joints where
they were; on the ground the trunk is put on its feet (upright, or the recorded IMU
orientation) at the first sample's joint angles and settles ``settle_s`` holding the first
command. Every ``resync`` control periods the joints are put back where the recording has them
(a short horizon: stick-slip friction makes a long open-loop replay drift). Outputs are read
as the sim node reads them: positions and velocities after each control period, the drive
torque sensors (JOINTACTFRC) of its last physics step."""

from __future__ import annotations

import copy

import mujoco
from mujoco import rollout
import numpy as np

from ..sim.env_config import EnvConfig, solver_options
from ..sim.physics import CTRL_SPEC, resolve_threads, STATE_SPEC
from ..sim.robot_spec import RobotSpec
from ..sim.scene import (back_emf_damping, build_model, joint_addresses, lowest_foot_points,
                         sensor_slices, standing_qpos)
from .trace import Trace

# The parameters a world takes, each [N, J].
PARAMS = ('kp', 'kd', 'frictionloss', 'damping', 'armature')
# Control periods per rollout call and world (bounds the memory of the per-step outputs).
CHUNK_PERIODS = 50
# Control periods per rollout call of a stand's windows (all of them side by side).
WINDOW_PERIODS = 200
# The replay's solver runs to convergence: with the env's iteration caps (4, line search 6)
# the joints' friction leaves the solver unconverged on some steps, and the replay jumps by
# millimetres when a parameter moves by 1e-9 (no derivative for the fit to follow).
CONVERGED = {'solver_iterations': 30, 'solver_ls_iterations': 50}


class Replayer:
    """Up to ``max_worlds`` worlds replaying ``trace`` (``stand``: the trunk on a stand)."""

    def __init__(self, robot: RobotSpec, trace: Trace, max_worlds: int, stand: bool,
                 settle_s: float = 1.0, num_threads: int = 0):
        if robot.actuator.model not in ('ideal_pd', 'dc_motor'):
            raise ValueError(f'system identification fits a PD drive (ideal_pd, dc_motor), not '
                             f'the robot\'s {robot.actuator.model!r} actuator')
        self.robot, self.trace, self.stand = robot, trace, stand
        self.model = build_model(robot, stand=stand, visuals=False,
                                 **{**solver_options(EnvConfig(num_envs=1)), **CONVERGED})
        m = self.model
        if stand:
            # The feet hang far above the floor: no collision detection (a third faster).
            m.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
        self.models = [copy.copy(m) for _ in range(max_worlds)]
        self.nthread = resolve_threads(num_threads, max_worlds)
        self._datas = [mujoco.MjData(m) for _ in range(max(1, self.nthread))]
        self._rollout = rollout.Rollout(nthread=self.nthread)
        self.qadr, self.vadr = joint_addresses(m, robot)
        self.torque = slice(*sensor_slices(robot).joint_torque)
        self.nstate = mujoco.mj_stateSize(m, STATE_SPEC)
        q0 = mujoco.mj_stateSize(m, mujoco.mjtState.mjSTATE_TIME)
        self.qpos_at, self.qvel_at = q0, q0 + m.nq
        self._back_emf = back_emf_damping(robot)
        # A sample is the whole state on a stand, or on the ground with the trunk's recorded.
        self.known_state = stand or trace.base is not None
        self.settle_steps = 0 if self.known_state else int(round(settle_s / robot.sim_dt))
        self.initial = self._initial_state()

    def _initial_state(self) -> np.ndarray:
        """[nstate] the first sample's state (on the ground: standing on its feet)."""
        m, r, tr = self.model, self.robot, self.trace
        d = mujoco.MjData(m)
        d.qpos[:] = standing_qpos(m, r)
        d.qpos[self.qadr] = tr.q[0]
        if tr.base is not None:
            d.qpos[0:7], d.qvel[0:6] = tr.base[0, :7], tr.base[0, 7:]
        if self.known_state:
            d.qvel[self.vadr] = tr.qd[0]
        else:
            if tr.base_quat is not None:
                d.qpos[3:7] = tr.base_quat / np.linalg.norm(tr.base_quat)
            d.qpos[2] = 0.0
            mujoco.mj_kinematics(m, d)
            # The lowest foot on the ground.
            d.qpos[2] = -float(lowest_foot_points(m, d, r).min())
        state = np.zeros(self.nstate)
        mujoco.mj_getState(m, d, state, STATE_SPEC)
        return state

    def set_params(self, params: dict[str, np.ndarray]) -> None:
        """Write world i's parameters (``PARAMS``, each [N, J]) into its model."""
        j = self.robot.num_joints
        for i in range(len(params['kp'])):
            m = self.models[i]
            kp, kd = params['kp'][i], params['kd'][i]
            # MuJoCo's position actuator: tau = Kp ctrl - Kp q - (Kd - c) qd (scene.py).
            m.actuator_gainprm[:j, 0] = kp
            m.actuator_biasprm[:j, 1] = -kp
            m.actuator_biasprm[:j, 2] = -(kd - self._back_emf)
            m.dof_frictionloss[self.vadr] = params['frictionloss'][i]
            m.dof_damping[self.vadr] = params['damping'][i]
            m.dof_armature[self.vadr] = params['armature'][i]
            # The constants the compiler derives from them (the constraints' softness scales
            # with the inverse inertias): as a model compiled with these numbers has them.
            mujoco.mj_setConst(m, self._datas[0])

    def _controls(self, delays: np.ndarray) -> np.ndarray:
        """[N, settle + decimation (T - 1), J] each world's commands at every physics step."""
        tr, dec = self.trace, self.robot.decimation
        steps = dec * (tr.num_samples - 1)
        # The period whose command is in force at step i - L (before the first: the first).
        i = np.arange(steps)[None, :] - np.asarray(delays, dtype=np.int64)[:, None]
        ctrl = tr.target[np.maximum(i // dec, 0)]
        if self.settle_steps:
            hold = np.broadcast_to(tr.target[0], (len(delays), self.settle_steps,
                                                  tr.target.shape[1]))
            ctrl = np.concatenate([hold, ctrl], axis=1)
        return np.ascontiguousarray(ctrl)

    def run(self, params: dict[str, np.ndarray], delays: np.ndarray, resync: int = 0,
            every: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Replay with world i's ``params`` (each [N, J]) and ``delays`` [N] physics steps
        (integers). Every ``resync`` control periods (0: never) the
        joints are put back where the recording has them, positions and velocities: on a stand
        (the trunk fixed, so a sample is the whole state) every such window starts from its
        sample side by side with the others (only every ``every``-th window: the samples of
        the others are NaN); on the ground the trunk goes on as simulated.

        Returns:
            q [N, T, J], qd [N, T, J] joint positions and velocities at every sample, and the
            drive torques effort [N, T, J] (sample 0: NaN, nothing was stepped before it).
        """
        n = len(delays)
        self.set_params(params)
        tr, dec, j = self.trace, self.robot.decimation, self.robot.num_joints
        ctrl = self._controls(delays)
        settle, ctrl = ctrl[:, :self.settle_steps], ctrl[:, self.settle_steps:]
        models = self.models[:n]
        if self.known_state and resync:
            return self._windows(models, ctrl, resync, every)
        state = np.tile(self.initial, (n, 1))
        if self.settle_steps:
            state = self._step(models, state, settle)[0][:, -1]
        t = tr.num_samples
        q, qd = np.empty((n, t, j)), np.empty((n, t, j))
        effort = np.full((n, t, j), np.nan)
        q[:, 0] = state[:, self.qpos_at + self.qadr]
        qd[:, 0] = state[:, self.qvel_at + self.vadr]
        chunk = resync or CHUNK_PERIODS
        for start in range(0, t - 1, chunk):
            stop = min(start + chunk, t - 1)
            if resync and start:
                state[:, self.qpos_at + self.qadr] = tr.q[start]
                state[:, self.qvel_at + self.vadr] = tr.qd[start]
            states, sensors = self._step(models, state, ctrl[:, dec * start:dec * stop])
            # The state after each period's last physics step; the sensors of that step.
            last = states[:, dec - 1::dec]
            q[:, start + 1:stop + 1] = last[:, :, self.qpos_at + self.qadr]
            qd[:, start + 1:stop + 1] = last[:, :, self.qvel_at + self.vadr]
            effort[:, start + 1:stop + 1] = sensors[:, dec - 1::dec, self.torque]
            state = states[:, -1].copy()
        return q, qd, effort

    def _windows(self, models: list, ctrl: np.ndarray, width: int, every: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`run` where a sample is the whole state: windows of ``width`` periods, each
        from its sample."""
        tr, dec, j = self.trace, self.robot.decimation, self.robot.num_joints
        n, t = len(models), tr.num_samples
        starts = np.arange(0, t - 1, width)[::every]
        # Past the last sample the last command is held (those outputs are dropped).
        pad = max(0, dec * (starts[-1] + width) - ctrl.shape[1])
        ctrl = np.concatenate([ctrl, np.repeat(ctrl[:, -1:], pad, axis=1)], axis=1)
        q, qd, effort = (np.full((n, t, j), np.nan) for _ in range(3))
        q[:, 0], qd[:, 0] = tr.q[0], tr.qd[0]
        per_call = max(1, WINDOW_PERIODS // width)
        for first in range(0, len(starts), per_call):
            s = starts[first:first + per_call]
            state = np.tile(self.initial, (len(s), 1))
            if tr.base is not None:
                state[:, self.qpos_at:self.qpos_at + 7] = tr.base[s, :7]
                state[:, self.qvel_at:self.qvel_at + 6] = tr.base[s, 7:]
            state[:, self.qpos_at + self.qadr] = tr.q[s]
            state[:, self.qvel_at + self.vadr] = tr.qd[s]
            # [N, S, width dec, J]: every world's commands over every window.
            steps = dec * s[:, None] + np.arange(dec * width)[None]
            window_ctrl = ctrl[:, steps].reshape(n * len(s), dec * width, -1)
            states, sensors = self._step([m for m in models for _ in s],
                                         np.tile(state, (n, 1)), window_ctrl)
            # The state after each period's last physics step; the sensors of that step.
            last = states[:, dec - 1::dec].reshape(n, len(s) * width, -1)
            torque = sensors[:, dec - 1::dec, self.torque].reshape(n, len(s) * width, j)
            k = (s[:, None] + 1 + np.arange(width)[None]).ravel()
            keep = k < t
            q[:, k[keep]] = last[:, keep][:, :, self.qpos_at + self.qadr]
            qd[:, k[keep]] = last[:, keep][:, :, self.qvel_at + self.vadr]
            effort[:, k[keep]] = torque[:, keep]
        return q, qd, effort

    def _step(self, models: list, state: np.ndarray, ctrl: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
        """[N, steps, nstate] states and [N, steps, nsensordata] sensors of ``ctrl`` [N,
        steps, J] physics steps from ``state`` [N, nstate]."""
        n, steps = ctrl.shape[:2]
        full = np.zeros((n, steps, self.model.nu))
        full[:, :, :ctrl.shape[2]] = ctrl
        states = np.empty((n, steps, self.nstate))
        sensors = np.empty((n, steps, self.model.nsensordata))
        # Every world's solver starts cold: a thread's data would otherwise hand the warm
        # start of the world it ran before to the next, and a replay would depend on its batch.
        self._rollout.rollout(models, self._datas, np.ascontiguousarray(state), full,
                              skip_checks=True, nstep=steps, control_spec=CTRL_SPEC,
                              initial_warmstart=np.zeros((n, self.model.nv)), state=states,
                              sensordata=sensors, chunk_size=1)
        return states, sensors

    def close(self) -> None:
        if self._rollout is not None:
            self._rollout.close()
            self._rollout = None
