"""N MuJoCo worlds of one robot, stepped together by ``mujoco.rollout`` on a thread pool.

Each world has its own MjModel copy (so domain randomisation can change masses, friction, gains
and joint parameters per world) and a row of the full physics state ``[N, nstate]``. With the
``ideal_pd`` and ``dc_motor`` actuators (inside MuJoCo's step, core/sim/scene.py) one rollout
call runs ``decimation`` physics steps for every world in C++, with the GIL released; the
learned ``network`` actuator (core/sim/actuator.py) computes the torques between physics steps,
one rollout call per physics step.

The command -> motor delay is a delay line of the last targets: a world with a delay of L
physics steps applies, at physics step s of a control period, the targets given
``ceil((L - s) / decimation)`` periods ago (L may exceed a control period).
"""

from __future__ import annotations

import copy
import os
from typing import Mapping

import mujoco
from mujoco import rollout
import numpy as np

from .actuator import make_actuator
from .ground import GroundPool, pool_geoms
from .robot_spec import RobotSpec
from .scene import (back_emf_damping, build_model, FLOOR, is_ground, joint_addresses,
                    lowest_foot_points, sensor_slices, standing_qpos)
from .terrain import Terrain

STATE_SPEC = mujoco.mjtState.mjSTATE_FULLPHYSICS
CTRL_SPEC = int(mujoco.mjtState.mjSTATE_CTRL)


def resolve_threads(requested: int, num_envs: int) -> int:
    """Physics threads: requested, or one per core; 0 (calling thread) for a single world."""
    if num_envs == 1:
        return 0
    threads = requested or os.cpu_count() or 1
    return max(1, min(threads, num_envs))


class BatchedPhysics:
    """State and per-world models of N worlds; ``step`` advances all of them one control step.

    ``state`` is ``[N, nstate]`` (mjSTATE_FULLPHYSICS: time, qpos, qvel, act, ...);
    ``qpos`` / ``qvel`` are writable views into it. With a ``terrain`` the floor is its
    heightfield (each world's model holds a copy of the height map). ``visuals``: keep the
    geoms that only show the robot (scene.build_spec), for a renderer. ``stand``: the trunk
    held on a stand, legs in the air (scene.build_spec).
    """

    def __init__(self, robot: RobotSpec, num_envs: int, *, num_threads: int = 0,
                 solver_iterations: int = 4, solver_ls_iterations: int = 6,
                 noslip_iterations: int = 0, terrain: Terrain | None = None,
                 visuals: bool = False, num_models: int | None = None,
                 max_delay_steps: int = 0, solver: str = 'newton', cone: str = 'pyramidal',
                 stand: bool = False):
        self.robot = robot
        self.num_envs = num_envs
        self.decimation = robot.decimation
        # Without the robot's visual geoms unless asked (a renderer): the same dynamics, and
        # ~5 % faster (no poses of geoms that only show the robot, every physics step).
        self.model = build_model(robot, terrain=terrain, solver_iterations=solver_iterations,
                                 solver_ls_iterations=solver_ls_iterations,
                                 noslip_iterations=noslip_iterations, visuals=visuals,
                                 solver=solver, cone=cone, stand=stand)
        m = self.model
        # Box ground (terrain collision 'boxes'): each world's model holds the window of boxes
        # around its robot (ground.py), so no two worlds may share a model.
        self.terrain = terrain
        self.ground = GroundPool(m, int(m.geom_contype[m.geom(FLOOR).id])) \
            if len(pool_geoms(m)) else None
        if self.ground is not None:
            self.ground.fill(m, np.zeros((0, 6)))
            if num_models is not None:
                raise ValueError('env.terrain.collision boxes gives each world the ground '
                                 'around its own robot; set env.randomization.worlds_per_model '
                                 '1 (or collision heightfield)')
        # The randomised copies (one per world unless ``num_models`` says fewer: worlds share
        # them, model_variants.py) and the copy each world steps with.
        self.copies = [copy.copy(m) for _ in range(num_envs if num_models is None
                                                   else num_models)]
        self.copy_of = np.arange(num_envs) % len(self.copies)
        self.models = [self.copies[c] for c in self.copy_of]
        self.num_threads = resolve_threads(num_threads, num_envs)
        self._datas = [mujoco.MjData(m) for _ in range(max(1, self.num_threads))]
        self._rollout = rollout.Rollout(nthread=self.num_threads)
        # Worlds per thread-pool task: 16 tasks per thread balance worlds of unequal cost
        # (contacts); 8 worlds a task at 256 worlds on 2 threads ran 4-10 % faster than 32
        # (bench/env_throughput.py --chunks).
        self._chunk = max(1, num_envs // max(1, 16 * self.num_threads))
        # An explicit actuator: one physics step per rollout call, the torques computed in
        # between (then a thread-pool task per thread: 4 calls with 16 tasks a thread cost
        # ~20 % more physics time than one, with 1 task a thread ~6 %).
        self.actuator = make_actuator(robot, num_envs)
        self._explicit_chunk = max(1, -(-num_envs // max(1, self.num_threads)))

        self.nstate = mujoco.mj_stateSize(m, STATE_SPEC)
        q0 = mujoco.mj_stateSize(m, mujoco.mjtState.mjSTATE_TIME)
        self.qpos_slice = slice(q0, q0 + m.nq)
        self.qvel_slice = slice(q0 + m.nq, q0 + m.nq + m.nv)
        self.qadr, self.vadr = joint_addresses(m, robot)
        self.sensors = sensor_slices(robot)
        if self.sensors.termination_contact[1] != m.nsensordata:
            raise RuntimeError('sensor layout does not match the compiled model')

        self.state = np.zeros((num_envs, self.nstate))
        self._ctrl = np.zeros((num_envs, self.decimation, m.nu))
        # The delay line: delayed_targets[k] = the targets given k control periods ago.
        self.max_delay_steps = int(max_delay_steps)
        periods = -(-self.max_delay_steps // self.decimation)
        self.delayed_targets = np.tile(robot.default_joint_pos, (periods + 1, num_envs, 1))
        self._substeps = np.arange(self.decimation)
        self._world_rows = np.arange(num_envs)[:, None]
        self._torque = np.zeros((num_envs, 1, m.nu))
        self._step_state = np.zeros((num_envs, 1, self.nstate))
        self._step_sensors = np.zeros((num_envs, 1, m.nsensordata))
        self._warmstart = np.zeros((num_envs, m.nv))
        self._out_state = np.zeros((num_envs, self.decimation, self.nstate))
        self.sensordata = np.zeros((num_envs, self.decimation, m.nsensordata))
        self.standing_qpos = standing_qpos(m, robot)
        self._auto_reset = np.zeros(num_envs, dtype=bool)

        self.foot_ground_offset = self._foot_ground_offset()

        # The window of ground boxes each world's model holds (-1: none yet).
        self._anchor = np.full((num_envs, 2), -1, dtype=np.int64)

        # Nominal physical parameters, restored before each world's randomisation.
        self.floor_geom = m.geom(FLOOR).id
        # Every geom that is ground (the floor and the ground boxes) takes a world's friction.
        self.ground_geoms = np.array([g for g in range(m.ngeom) if is_ground(m.geom(g).name)],
                                     dtype=np.int64)
        self.base_body = m.body(robot.base_body).id
        self._mass0 = m.body_mass.copy()
        self._inertia0 = m.body_inertia.copy()
        self._ipos0 = m.body_ipos.copy()
        # The robot's joints' actuators are the first J (dc_motor: then J back-EMF dampers).
        self._back_emf = back_emf_damping(robot)
        self._frictionloss0 = m.dof_frictionloss[self.vadr].copy()
        self._damping0 = m.dof_damping[self.vadr].copy()
        self._armature0 = m.dof_armature[self.vadr].copy()
        self._solref0 = m.geom_solref[:, 0].copy()
        self._ground_condim0 = m.geom_condim[self.ground_geoms].copy()
        self._ground_torsion0 = m.geom_friction[self.ground_geoms, 1].copy()
        # Each copy's drive gains [C, J] (an explicit actuator reads them per world).
        self.copy_kp = np.tile(robot.kp, (len(self.copies), 1))
        self.copy_kd = np.tile(robot.kd, (len(self.copies), 1))

    def _foot_ground_offset(self) -> np.ndarray:
        """[F] height of each foot body's origin above its lowest contact point, standing."""
        m = self.model
        d = mujoco.MjData(m)
        d.qpos[:] = self.standing_qpos
        mujoco.mj_kinematics(m, d)
        feet = [m.body(foot).id for foot in self.robot.foot_bodies]
        return d.xpos[feet, 2] - lowest_foot_points(m, d, self.robot)

    @property
    def qpos(self) -> np.ndarray:
        return self.state[:, self.qpos_slice]

    @property
    def qvel(self) -> np.ndarray:
        return self.state[:, self.qvel_slice]

    def use_copies(self, ids: np.ndarray, copies: np.ndarray) -> None:
        """Worlds ``ids`` step with model copies ``copies`` from now on."""
        for i, c in zip(ids, copies):
            self.models[i] = self.copies[c]
            self.copy_of[i] = c

    def set_physical_params(self, copy_id: int, params: Mapping[str, np.ndarray]) -> None:
        """Write randomised parameters into model copy ``copy_id`` (from the nominal ones): a
        world's own, unless worlds share copies. ``params`` (core/sim/randomization.py):
        friction, added_mass [kg], mass_scale, com_offset [3] [m], motor_strength,
        contact_timeconst [s], torsional_friction [m], and per joint [J]: kp_scale, kd_scale,
        frictionloss_scale, joint_damping_scale, armature_scale; a name left out keeps its
        nominal value (0 for the two contact ones)."""
        m = self.copies[copy_id]
        mass_scale = params.get('mass_scale', 1.0)
        m.geom_friction[self.ground_geoms, 0] = params.get('friction', self.robot.foot_friction)
        # Scale every link's mass and inertia together, then add the payload to the trunk.
        m.body_mass[:] = self._mass0 * mass_scale
        m.body_inertia[:] = self._inertia0 * mass_scale
        base = self.base_body
        m.body_mass[base] += params.get('added_mass', 0.0)
        m.body_inertia[base] *= m.body_mass[base] / (self._mass0[base] * mass_scale)
        m.body_ipos[base] = self._ipos0[base] + params.get('com_offset', 0.0)
        # Drive gains: motor strength scales the whole PD law, Kp and Kd scale apart.
        strength = params.get('motor_strength', 1.0)
        kp = self.robot.kp * strength * params.get('kp_scale', 1.0)
        kd = self.robot.kd * strength * params.get('kd_scale', 1.0)
        self.copy_kp[copy_id], self.copy_kd[copy_id] = kp, kd
        if self.actuator is None:
            # MuJoCo's position actuator: tau = Kp ctrl - Kp q - (Kd - c) qd (c: dc_motor's
            # back-EMF damping, its own actuator; 0 otherwise).
            j = self.robot.num_joints
            m.actuator_gainprm[:j, 0] = kp
            m.actuator_biasprm[:j, 1] = -kp
            m.actuator_biasprm[:j, 2] = -(kd - self._back_emf)
        # The joints' own friction, viscous damping and rotor inertia.
        m.dof_frictionloss[self.vadr] = self._frictionloss0 * params.get('frictionloss_scale',
                                                                         1.0)
        m.dof_damping[self.vadr] = self._damping0 * params.get('joint_damping_scale', 1.0)
        m.dof_armature[self.vadr] = self._armature0 * params.get('armature_scale', 1.0)
        # Contact softness: every geom's solref time constant (a contact takes its geoms').
        timeconst = params.get('contact_timeconst')
        m.geom_solref[:, 0] = self._solref0 if timeconst is None or not timeconst > 0 \
            else timeconst
        # Torsional friction on the ground: 4-D contacts, or the model's own (the ground's
        # priority gives a contact its condim and friction, as for the sliding friction).
        torsion = params.get('torsional_friction')
        on = torsion is not None and torsion > 0
        m.geom_condim[self.ground_geoms] = 4 if on else self._ground_condim0
        m.geom_friction[self.ground_geoms, 1] = torsion if on else self._ground_torsion0

    def hold(self, ids: np.ndarray, targets: np.ndarray) -> None:
        """Worlds ``ids`` (reset) start their delay line at [K, J] ``targets``: until their
        first command arrives, the motors hold them."""
        self.delayed_targets[:, ids] = targets[None]
        if self.actuator is not None:
            error = targets - self.qpos[ids][:, self.qadr]
            self.actuator.reset(ids, error, self.qvel[ids][:, self.vadr])

    def delayed_ctrl(self, targets: np.ndarray, latency: np.ndarray) -> np.ndarray:
        """[N, decimation, J] the targets the motors see at each physics step of this control
        period: ``targets`` [N, J] joins the delay line, and a world with a latency of L
        physics steps sees, at step s, the targets of ceil((L - s) / decimation) periods ago.
        """
        line = self.delayed_targets
        line[1:] = line[:-1].copy()
        line[0] = targets
        latency = np.minimum(latency, self.max_delay_steps)
        periods_ago = -(-(latency[:, None] - self._substeps[None, :]) // self.decimation)
        periods_ago = np.maximum(periods_ago, 0)
        self._ctrl[:, :, :line.shape[2]] = line[periods_ago, self._world_rows]
        return self._ctrl

    def step(self, targets: np.ndarray, latency: np.ndarray) -> np.ndarray:
        """Advance every world ``decimation`` physics steps.

        Args:
            targets: [N, J] joint position targets of this control step.
            latency: [N] int, physics steps the targets take to reach the motors (at most
                ``max_delay_steps``).

        Returns:
            [N, decimation, nsensordata] sensor readings of every physics step.
        """
        self.update_ground()
        ctrl = self.delayed_ctrl(targets, latency)
        expected_time = self.state[:, 0] + self.decimation * self.model.opt.timestep
        if self.actuator is None:
            self._rollout.rollout(self.models, self._datas, self.state, ctrl, skip_checks=True,
                                  nstep=self.decimation, control_spec=CTRL_SPEC,
                                  state=self._out_state, sensordata=self.sensordata,
                                  chunk_size=self._chunk)
            self.state[:] = self._out_state[:, -1]
        else:
            self._step_explicit(ctrl)
        # MuJoCo resets a world whose accelerations blow up (and warns); its clock restarts.
        self._auto_reset = np.abs(self.state[:, 0] - expected_time) > 1e-6
        return self.sensordata

    def _step_explicit(self, ctrl: np.ndarray) -> None:
        """One rollout call per physics step; the actuator's torques from each step's state."""
        kp, kd = self.copy_kp[self.copy_of], self.copy_kd[self.copy_of]
        dt = self.model.opt.timestep
        for s in range(self.decimation):
            q, qd = self.qpos[:, self.qadr], self.qvel[:, self.vadr]
            self._torque[:, 0] = self.actuator.torque(ctrl[:, s] - q, qd, kp, kd)
            qvel = self.qvel.copy()
            # The solver starts from the last step's accelerations (as inside one rollout
            # call), not cold: half the time per physics step.
            self._rollout.rollout(self.models, self._datas, self.state, self._torque,
                                  skip_checks=True, nstep=1, control_spec=CTRL_SPEC,
                                  initial_warmstart=self._warmstart, state=self._step_state,
                                  sensordata=self._step_sensors,
                                  chunk_size=self._explicit_chunk)
            self.state[:] = self._out_state[:, s] = self._step_state[:, 0]
            self.sensordata[:, s] = self._step_sensors[:, 0]
            np.subtract(self.qvel, qvel, out=self._warmstart)
            self._warmstart /= dt

    def ctrl_for(self, ids: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """[K, nu] the actuator inputs of worlds ``ids`` holding [K, J] ``targets`` at their
        current state: the targets (ideal_pd, dc_motor), or the explicit PD torque clipped to
        the effort limit (the learned actuator, without touching its history)."""
        if self.actuator is None:
            ctrl = np.zeros((len(targets), self.model.nu))
            ctrl[:, :targets.shape[1]] = targets
            return ctrl
        i = np.asarray(ids)
        error = targets - self.qpos[i][:, self.qadr]
        tau = self.copy_kp[self.copy_of[i]] * error \
            - self.copy_kd[self.copy_of[i]] * self.qvel[i][:, self.vadr]
        return np.clip(tau, -self.robot.effort_limit, self.robot.effort_limit)

    def substep_readings(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The last control step's readings at every physics step, oldest first: joint
        positions and velocities [N, decimation, J] after each step, IMU quaternion
        [N, decimation, 4] and gyro [N, decimation, 3] as :meth:`imu` reads the last one."""
        s = self.sensors
        states = self._out_state
        return (states[:, :, self.qpos_slice][:, :, self.qadr],
                states[:, :, self.qvel_slice][:, :, self.vadr],
                self.sensordata[:, :, slice(*s.framequat)],
                self.sensordata[:, :, slice(*s.gyro)])

    def imu(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The IMU site's readings after the last physics step, as a sensor_msgs/Imu carries them.

        Returns (orientation [N, 4] w, x, y, z of the IMU frame in the world, angular velocity
        [N, 3] rad/s in the IMU frame, linear acceleration [N, 3] m/s^2 in the IMU frame,
        gravity included as an accelerometer measures it). MuJoCo evaluates sensors at the start
        of a physics step, so they trail the state by one physics step (sim_dt), like a sensor's
        own latency; the sim node publishes these same numbers.
        """
        s, last = self.sensors, self.sensordata[:, -1]
        return (last[:, slice(*s.framequat)].copy(), last[:, slice(*s.gyro)].copy(),
                last[:, slice(*s.accelerometer)].copy())

    def forward(self, ids: np.ndarray, targets: np.ndarray) -> None:
        """Recompute the sensors of worlds ``ids`` at their current state (after a reset).

        Args:
            ids: [K] world indices.
            targets: [K, J] joint position targets the actuators hold in those worlds.
        """
        self.update_ground(ids)
        data = self._datas[0]
        ctrl = self.ctrl_for(ids, targets)
        for k, i in enumerate(ids):
            model = self.models[i]
            mujoco.mj_setState(model, data, self.state[i], STATE_SPEC)
            # Actuators are in robot joint order (scene.build_spec), as in step().
            data.ctrl[:] = ctrl[k]
            mujoco.mj_forward(model, data)
            self.sensordata[i, -1] = data.sensordata

    def update_ground(self, ids: np.ndarray | None = None) -> None:
        """Fill the ground boxes of worlds ``ids`` (default all) whose robot entered another
        window (ground.py); nothing without box ground."""
        if self.ground is None:
            return
        ids = np.arange(self.num_envs) if ids is None else np.asarray(ids, dtype=np.int64)
        # A diverged world's NaN position counts as the map's corner until it is reset.
        xy = np.nan_to_num(self.qpos[ids, 0:2], nan=0.0, posinf=0.0, neginf=0.0)
        anchor = self.terrain.window_anchor(xy)
        moved = (anchor != self._anchor[ids]).any(axis=1)
        for i, a in zip(ids[moved], anchor[moved]):
            self.ground.fill(self.models[i], self.terrain.ground_boxes(a))
            self._anchor[i] = a

    def diverged(self, max_joint_vel: float) -> np.ndarray:
        """[N] bool: worlds MuJoCo had to reset, or whose state/sensors are non-finite, or whose
        joints spin faster than max_joint_vel."""
        bad = self._auto_reset | ~np.isfinite(self.state).all(axis=1)
        bad |= ~np.isfinite(self.sensordata).all(axis=(1, 2))
        with np.errstate(invalid='ignore'):
            bad |= (np.abs(self.qvel[:, self.vadr]) > max_joint_vel).any(axis=1)
        return bad

    def close(self) -> None:
        if self._rollout is not None:
            self._rollout.close()
            self._rollout = None
