"""N MuJoCo worlds of one robot, stepped together by ``mujoco.rollout`` on a thread pool.

Each world has its own MjModel copy (so domain randomisation can change masses, friction and
gains per world) and a row of the full physics state ``[N, nstate]``; one rollout call runs
``decimation`` physics steps for every world in C++, with the GIL released.
"""

from __future__ import annotations

import copy
import os

import mujoco
from mujoco import rollout
import numpy as np

from .ground import GroundPool, pool_geoms
from .robot_spec import RobotSpec
from .scene import (build_model, FLOOR, is_ground, joint_addresses, lowest_foot_points,
                    sensor_slices, standing_qpos)
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
    geoms that only show the robot (scene.build_spec), for a renderer.
    """

    def __init__(self, robot: RobotSpec, num_envs: int, *, num_threads: int = 0,
                 solver_iterations: int = 4, solver_ls_iterations: int = 6,
                 noslip_iterations: int = 0, terrain: Terrain | None = None,
                 visuals: bool = False, num_models: int | None = None):
        self.robot = robot
        self.num_envs = num_envs
        self.decimation = robot.decimation
        # Without the robot's visual geoms unless asked (a renderer): the same dynamics, and
        # ~5 % faster (no poses of geoms that only show the robot, every physics step).
        self.model = build_model(robot, terrain=terrain, solver_iterations=solver_iterations,
                                 solver_ls_iterations=solver_ls_iterations,
                                 noslip_iterations=noslip_iterations, visuals=visuals)
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
        self.models = [self.copies[i % len(self.copies)] for i in range(num_envs)]
        self.num_threads = resolve_threads(num_threads, num_envs)
        self._datas = [mujoco.MjData(m) for _ in range(max(1, self.num_threads))]
        self._rollout = rollout.Rollout(nthread=self.num_threads)
        # Worlds per thread-pool task: 16 tasks per thread balance worlds of unequal cost
        # (contacts); 8 worlds a task at 256 worlds on 2 threads ran 4-10 % faster than 32
        # (bench/env_throughput.py --chunks).
        self._chunk = max(1, num_envs // max(1, 16 * self.num_threads))

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
        self._gain0 = m.actuator_gainprm[:, 0].copy()
        self._bias0 = m.actuator_biasprm[:, 1:3].copy()

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

    def set_physical_params(self, copy_id: int, friction: float, added_mass: float,
                            mass_scale: float, com_offset: np.ndarray,
                            motor_strength: float) -> None:
        """Write randomised parameters into model copy ``copy_id`` (from the nominal ones): a
        world's own, unless worlds share copies."""
        m = self.copies[copy_id]
        m.geom_friction[self.ground_geoms, 0] = friction
        # Scale every link's mass and inertia together, then add the payload to the trunk.
        m.body_mass[:] = self._mass0 * mass_scale
        m.body_inertia[:] = self._inertia0 * mass_scale
        base = self.base_body
        m.body_mass[base] += added_mass
        m.body_inertia[base] *= m.body_mass[base] / (self._mass0[base] * mass_scale)
        m.body_ipos[base] = self._ipos0[base] + com_offset
        # Motor strength scales the whole PD law: tau = s (Kp (target - q) - Kd qd).
        m.actuator_gainprm[:, 0] = self._gain0 * motor_strength
        m.actuator_biasprm[:, 1:3] = self._bias0 * motor_strength

    def step(self, targets: np.ndarray, prev_targets: np.ndarray,
             latency: np.ndarray) -> np.ndarray:
        """Advance every world ``decimation`` physics steps.

        Args:
            targets: [N, J] joint position targets of this control step.
            prev_targets: [N, J] targets of the previous control step.
            latency: [N] int, physics steps during which prev_targets still apply.

        Returns:
            [N, decimation, nsensordata] sensor readings of every physics step.
        """
        self.update_ground()
        ctrl = self._ctrl
        ctrl[:] = targets[:, None, :]
        late = np.arange(self.decimation)[None, :] < latency[:, None]
        if late.any():
            ctrl[late] = np.broadcast_to(prev_targets[:, None, :], ctrl.shape)[late]
        expected_time = self.state[:, 0] + self.decimation * self.model.opt.timestep
        self._rollout.rollout(self.models, self._datas, self.state, ctrl, skip_checks=True,
                              nstep=self.decimation, control_spec=CTRL_SPEC,
                              state=self._out_state, sensordata=self.sensordata,
                              chunk_size=self._chunk)
        self.state[:] = self._out_state[:, -1]
        # MuJoCo resets a world whose accelerations blow up (and warns); its clock restarts.
        self._auto_reset = np.abs(self.state[:, 0] - expected_time) > 1e-6
        return self.sensordata

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
        for k, i in enumerate(ids):
            model = self.models[i]
            mujoco.mj_setState(model, data, self.state[i], STATE_SPEC)
            # Actuators are in robot joint order (scene.build_spec), as in step().
            data.ctrl[:] = targets[k]
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
