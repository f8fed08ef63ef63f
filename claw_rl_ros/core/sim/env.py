"""The batched locomotion environment (rsl_rl vec-env contract, numpy batches).

``step(actions [N, J]) -> obs, reward [N], terminated [N], truncated [N], extras`` where
``obs = {'policy': [N, obs_dim], 'policy_noise_free': [N, obs_dim], 'privileged':
[N, privileged_dim]}`` (float32; ``obs_dims`` names the sizes). The policy group is built from
the IMU sensors and encoders exactly as the policy node builds it from sensor_msgs messages,
plus configured noise; ``policy_noise_free`` is the same without noise (critic, teachers).
Worlds that finish are reset inside ``step``; ``extras['final_obs']`` holds the observation they
ended in (for time-out bootstrapping) and ``extras['episode']`` their logs. Every observation is
built from the state the policy acts from (after resets and pushes), so a world's observation
never depends on what other worlds did. Nothing here is specific to one robot: the RobotSpec
(YAML + URDF) describes it.

With ``env.terrain`` on, each world resets on its tile (:mod:`.terrain_curriculum`) of a
heightfield, base and foot heights are taken above the ground under them, reaching the map's
edge is a time-out, ``extras['terrain_level']`` is {type: mean level}, and a scan on adds
``obs['height_scan']`` [N, K] (ground heights around the base, simulation-only).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any
import warnings

import numpy as np

from .env_config import (EnvConfig, GAIT_REWARDS, observation_windows, RandomizationConfig,
                         robot_sized,
                         solver_options)
from ..math_utils import gravity_in_body, quat_mul, quat_rotate_inverse, yaw_quat
from .model_variants import ModelVariants
from .observations import (ELAPSED_BOUNDS_PERIODS, HEIGHT_SCAN, ObservationHistory, POLICY,
                           POLICY_NOISE_FREE, PRIVILEGED, RobotState)
from .physics import BatchedPhysics
from .randomization import (delay_range, draw_params, nominal_params, PER_JOINT, PHYSICAL,
                            ramp_fraction, ramped)
from .rewards import is_moving, RewardManager, RewardParams, StepData
from .robot import load_robot
from .robot_overlay import recentred_randomization
from .robot_spec import RobotSpec
from .sensor_model import SensorModel, sensor_model_wanted
from .terrain import base_yaw
from .terrain_curriculum import TerrainPlacement
from .warp_physics import WarpPhysics


class GaitRewardsOff(UserWarning):
    """Gait reward terms were switched off because the robot has no gait clock."""


class VecLocomotionEnv:
    """N independent worlds of a legged robot tracking random velocity commands.

    ``visuals=True`` keeps the geoms that only show the robot (for a renderer); the dynamics
    are the same without them.
    """

    def __init__(self, cfg: EnvConfig, robot: RobotSpec | None = None, *,
                 visuals: bool = False):
        self.robot = robot if robot is not None else load_robot(cfg.robot,
                                                                overlay=cfg.robot_overlay)
        # An overlay re-centres the delay range on its fit (and may bring ranges of its own).
        self.cfg = cfg = dataclasses.replace(cfg, randomization=recentred_randomization(
            cfg.randomization, self.robot.source.get('overlay', ''), self.robot.sim_dt))
        r = self.robot
        self.num_envs = n = cfg.num_envs
        self.num_actions = j = r.num_joints
        self.num_feet = f = len(r.foot_bodies)
        self.obs_dim = r.policy_obs.dim
        self.privileged_dim = r.privileged_obs.dim
        self.obs_dims = {POLICY: self.obs_dim * cfg.policy_history,
                         POLICY_NOISE_FREE: self.obs_dim, PRIVILEGED: self.privileged_dim}
        # The student's memory (env.policy_history > 1): its last frames, with their noise.
        self.history = ObservationHistory(n, cfg.policy_history, self.obs_dim) \
            if cfg.policy_history > 1 else None
        # {group: H} of the groups that are windows (rollout chunks send them as frames).
        self.obs_windows = observation_windows(cfg)
        self.control_dt = r.control_dt
        self.max_episode_length = int(math.ceil(cfg.episode_length_s / self.control_dt))
        self.rng = np.random.default_rng(cfg.seed)
        self._build_terrain()
        # Worlds share randomised model copies when the config says so (model_variants.py).
        share = cfg.randomization.worlds_per_model
        self.variants = ModelVariants(n, share) if share > 1 else None
        # The engine: MuJoCo on the CPU's cores, or the same physics in MuJoCo Warp.
        engine, device = (BatchedPhysics, {}) if cfg.physics == 'mujoco' else (
            WarpPhysics, {'device': cfg.device})
        self.physics = engine(
            r, n, num_threads=cfg.num_threads, **device, **solver_options(cfg),
            terrain=self.terrain, visuals=visuals,
            num_models=None if self.variants is None else self.variants.size,
            max_delay_steps=max(delay_range(cfg.randomization, r)[1],
                                r.actuator.nominal_delay_steps))

        # What the robot's sensors report (offsets, biases, delays, control jitter), if any.
        dr = cfg.randomization
        # Control steps per world so far (legged_gym's common_step_counter): it widens the
        # transfer ranges when randomization.transfer_ramp_steps asks for a ramp.
        self.common_step_counter = 0
        self._ramp = (None, dr)
        self.sensor_model = SensorModel(dr, n, j, r.decimation) \
            if dr.enabled and sensor_model_wanted(dr) else None
        scales = self._reward_scales()
        self._resample_steps = max(1, round(cfg.commands.resample_time_s / self.control_dt))
        self._push_steps = round(cfg.randomization.push_interval_s / self.control_dt)
        half_range = 0.5 * (r.joint_upper - r.joint_lower) * cfg.rewards.soft_joint_limit
        mid = 0.5 * (r.joint_upper + r.joint_lower)
        # Robot-sized constants: the env config may override the robot's.
        rw, dr = cfg.rewards, cfg.randomization
        self.min_base_height = robot_sized(cfg.termination.min_base_height, r.min_base_height)
        self.payload_range = robot_sized(dr.added_mass, r.payload_range)
        self.com_offset_range = robot_sized(dr.com_offset, r.com_offset_range)
        self.reward_manager = RewardManager(
            scales, RewardParams(
                tracking_sigma=cfg.rewards.tracking_sigma,
                base_height_target=robot_sized(rw.base_height_target, r.base_height_target),
                feet_air_time_target=cfg.rewards.feet_air_time_target,
                moving_command_threshold=cfg.rewards.moving_command_threshold,
                default_joint_pos=r.default_joint_pos,
                soft_joint_lower=mid - half_range, soft_joint_upper=mid + half_range,
                swing_height_target=robot_sized(rw.swing_height_target, r.swing_height)),
            self.control_dt, n, cfg.rewards.only_positive)
        noise = cfg.noise
        self.noise_vec = (r.policy_obs.term_vector(noise.levels) * r.policy_obs.scale
                          * noise.scale) if noise.enabled else None

        # Per-world buffers.
        self.commands = np.zeros((n, 3))
        # Heading mode: each world's target heading [rad] (NaN: its yaw rate is left as set).
        self.heading_target = np.full(n, np.nan)
        self.actions = np.zeros((n, j))
        self.last_actions = np.zeros((n, j))
        self.targets = np.tile(r.default_joint_pos, (n, 1))
        self.last_joint_vel = np.zeros((n, j))
        self.episode_step = np.zeros(n, dtype=np.int64)
        self.episode_return = np.zeros(n)
        self.feet_air_time = np.zeros((n, f))
        self.last_contacts = np.zeros((n, f), dtype=bool)
        self.foot_contact = np.zeros((n, f), dtype=bool)
        self.gait_phase = np.zeros(n)
        self.latency = np.zeros(n, dtype=np.int64)
        self.friction = np.full(n, r.foot_friction)
        self.added_mass = np.zeros(n)
        self.mass_scale = np.ones(n)
        self.com_offset = np.zeros((n, 3))
        self.motor_strength = np.ones(n)
        self.contact_timeconst = np.zeros(n)
        self.torsional_friction = np.zeros(n)
        # Per joint: the drive's Kp and Kd scales, the joints' friction, damping and armature.
        for name in PER_JOINT:
            setattr(self, name, np.ones((n, j)))
        if self.variants is not None:
            # The physical parameters of each shared copy (its worlds hold them too), nominal
            # until it is drawn.
            self._copy_params = {name: np.repeat(getattr(self, name)[:1], self.variants.size,
                                                 axis=0) for name in self._PHYSICAL}
        self.diverged_count = 0
        self.reset()

    def _build_terrain(self) -> None:
        """With env.terrain on: the map, each world's tile and (scan on) the scan's size."""
        cfg = self.cfg
        self.placement = TerrainPlacement(cfg.terrain, self.robot, self.num_envs, self.control_dt,
                                          cfg.episode_length_s, self.rng) \
            if cfg.terrain.enabled else None
        self.terrain = self.placement.terrain if self.placement else None
        self.scan = cfg.terrain.height_scan.enabled
        if self.scan:
            self.obs_dims[HEIGHT_SCAN] = len(self.terrain.scan_offsets)

    def _reward_scales(self) -> dict[str, float]:
        """The configured reward scales, gait terms switched off (with a warning) for a robot
        without a gait clock."""
        r, scales = self.robot, dict(self.cfg.rewards.scales)
        if r.gait_period == 0:
            off = [name for name in GAIT_REWARDS if scales.get(name, 0.0) != 0.0]
            if off:
                warnings.warn(f'robot {r.name!r} has no gait clock: reward terms '
                              f'{", ".join(off)} are switched off (add gait: {{period_s, duty, '
                              'offsets} to the robot YAML to use them)', GaitRewardsOff,
                              stacklevel=3)
                for name in off:
                    scales[name] = 0.0
        return scales

    # ----------------------------------------------------------------------------- public API
    def seed(self, seed: int) -> None:
        """Restart the env's random stream (commands, resets, randomisation, noise)."""
        self.rng = np.random.default_rng(seed)

    def reset(self, seed: int | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Reset every world; returns (obs, extras)."""
        if seed is not None:
            self.seed(seed)
        self._reset_worlds(np.arange(self.num_envs))
        self._steer_to_heading()
        obs = self._observe(self.robot_state())
        if self.history is not None:
            obs[POLICY] = self.history.restart(obs[POLICY])
        return obs, {}

    def step(self, actions: np.ndarray, targets: np.ndarray | None = None):
        """Apply [N, J] actions for one control step; see the module docstring for outputs.

        ``targets`` [N, J] (optional): joint targets to apply instead of the actions' own (a
        deployment path that shapes commands, e.g. the control-loop actor); the actions still
        feed the last-action observation and the action reward terms.
        """
        cfg, r = self.cfg, self.robot
        actions = np.asarray(actions, dtype=np.float64).reshape(self.num_envs, self.num_actions)
        bad_action = ~np.isfinite(actions).all(axis=1)
        actions = np.clip(np.nan_to_num(actions, nan=0.0, posinf=0.0, neginf=0.0),
                          -cfg.clip_actions, cfg.clip_actions)
        # Safety path: targets are clamped to the joint limits before they reach the motors.
        targets = r.action_to_target(actions) if targets is None else np.clip(
            np.asarray(targets, dtype=np.float64).reshape(actions.shape), r.joint_lower,
            r.joint_upper)
        sm = self.sensor_model
        latency = self.latency
        self.common_step_counter += 1
        if sm is not None and sm.jitter:
            # Sampled early by control jitter: the command reaches the motors as much earlier.
            jitter = self.randomization_now().control_jitter_substeps
            latency = np.maximum(latency - sm.next_jitter(self.rng, jitter), 0)
        sensordata = self.physics.step(targets, latency)
        if sm is not None:
            sm.record(*self.physics.substep_readings())
        self.targets = targets
        self.actions = actions
        self.episode_step += 1
        if r.gait_period > 0:
            # The gait clock moves by the time between samples, as the policy node's does.
            low, high = (b * self.control_dt for b in ELAPSED_BOUNDS_PERIODS)
            elapsed = self.control_dt if sm is None or not sm.jitter else np.clip(
                sm.elapsed_substeps() * r.sim_dt, low, high)
            self.gait_phase = (self.gait_phase + elapsed / r.gait_period) % 1.0

        diverged = self.physics.diverged(cfg.termination.max_joint_vel) | bad_action
        if diverged.any():
            self._sanitise(diverged)
        data = self._step_data(sensordata, diverged)
        reward, _ = self.reward_manager.compute(data)
        reward[diverged] = 0.0
        self.episode_return += reward
        terminated = data.terminated
        truncated = self.episode_step >= self.max_episode_length
        if self.placement is not None:
            self.placement.accumulate(self.commands)
            truncated |= self.placement.out_of_bounds(self.physics.qpos[:, 0:2])
        truncated &= ~terminated
        self.last_actions[:] = actions
        self.last_joint_vel[:] = data.joint_vel

        extras: dict[str, Any] = {'diverged': int(diverged.sum()), 'time_outs': truncated,
                                  'tracking_error': self._tracking_error(data)}
        done = terminated | truncated
        if done.any():
            ids = np.flatnonzero(done)
            extras['final_obs'] = final = self._observe(data)
            if self.history is not None:
                # Only the finished worlds' rows are read: each ends on its own window.
                window = self.history.flat()
                window[ids] = self.history.with_newest(final[POLICY][ids], ids)
                final[POLICY] = window
            extras['episode'] = self._episode_log(ids)
            if self.placement is not None:
                self.placement.finish(ids, self.physics.qpos[ids, 0:2], self.episode_step[ids],
                                      diverged[ids], self.rng)
            self._reset_worlds(ids)
        if self.placement is not None:
            extras['terrain_level'] = self.placement.level_stats()
        self._resample_commands(np.flatnonzero(self.episode_step % self._resample_steps == 0))
        if self._push_steps > 0 and cfg.randomization.enabled:
            self._push(np.flatnonzero((self.episode_step % self._push_steps == 0)
                                      & (self.episode_step > 0)))
        self._steer_to_heading()
        # Always from the current state: resets and pushes changed it after `data` was read.
        obs = self._observe(self.robot_state())
        if self.history is not None:
            # Reset worlds start a window of their first frame, the rest move theirs on.
            obs[POLICY] = self.history.push(obs[POLICY], ids if done.any() else None)
        return obs, reward.astype(np.float32), terminated, truncated, extras

    def randomization_now(self) -> RandomizationConfig:
        """The ranges draws use now: the config's, narrowed while a transfer ramp runs."""
        dr = self.cfg.randomization
        fraction = ramp_fraction(dr, self.common_step_counter)
        if self._ramp[0] != fraction:
            self._ramp = (fraction, ramped(dr, self.robot, fraction))
        return self._ramp[1]

    def observe(self) -> dict[str, np.ndarray]:
        """The observation groups of the current state, as reset() and step() return them
        (with a history, ``policy`` is the window step() returned: nothing moves on)."""
        obs = self._observe(self.robot_state())
        if self.history is not None:
            obs[POLICY] = self.history.flat()
        return obs

    def close(self) -> None:
        self.physics.close()

    _BUFFERS = ('commands', 'actions', 'last_actions', 'targets', 'last_joint_vel',
                'episode_step', 'episode_return', 'feet_air_time', 'last_contacts',
                'foot_contact', 'gait_phase', 'latency', 'friction', 'added_mass',
                'mass_scale', 'com_offset', 'motor_strength', 'heading_target',
                'contact_timeconst', 'torsional_friction') + tuple(PER_JOINT)
    # Buffers a state saved before they existed may lack (restored to their reset value).
    _NEW_BUFFERS = {'heading_target': np.nan, 'contact_timeconst': 0.0,
                    'torsional_friction': 0.0, **{name: 1.0 for name in PER_JOINT}}

    def get_state(self) -> dict[str, Any]:
        """Everything needed to continue bit-for-bit: physics, buffers, RNG, episode sums."""
        state = {
            'physics': self.physics.state.copy(),
            'buffers': {k: getattr(self, k).copy() for k in self._BUFFERS},
            'episode_sums': {k: v.copy() for k, v in self.reward_manager.episode_sums.items()},
            'rng': self.rng.bit_generator.state,
            'diverged_count': self.diverged_count,
            'common_step_counter': self.common_step_counter,
            'delay_line': self.physics.delayed_targets.copy(),
        }
        window = getattr(self.physics.actuator, 'window', None)
        if window is not None:
            state['actuator_window'] = window.copy()
        if self.sensor_model is not None:
            state['sensor_model'] = self.sensor_model.get_state()
        if self.placement is not None:
            state['terrain'] = self.placement.get_state()
        if self.history is not None:
            state['policy_history'] = self.history.frames.copy()
        if self.variants is not None:
            state['model_copies'] = {**self.variants.get_state(), 'params': {
                k: v.copy() for k, v in self._copy_params.items()}}
        return state

    def _check_copy_params(self, saved: Any) -> None:
        """ValueError unless ``saved`` holds every randomised parameter of every model copy."""
        if not isinstance(saved, dict):
            raise ValueError('saved model copies lack params: the checkpoint is damaged; resume '
                             'from another one')
        for name, values in self._copy_params.items():
            shape = np.shape(saved[name]) if name in saved else None
            if shape != values.shape:
                raise ValueError(f'saved model copies hold no {name} of shape {values.shape} '
                                 f'(found {shape}): the checkpoint is damaged; resume from '
                                 'another one')

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` output (from an env with the same config)."""
        if state['physics'].shape != self.physics.state.shape:
            raise ValueError(f'saved env state has shape {state["physics"].shape}, this env '
                             f'{self.physics.state.shape}: num_envs or robot differ')
        saved_history = state.get('policy_history')
        if self.history is not None and getattr(saved_history, 'shape', None) != \
                self.history.frames.shape:
            raise ValueError('saved env state holds no policy history of shape '
                             f'{self.history.frames.shape}: it was saved with another '
                             'env.policy_history')
        if self.variants is not None:
            # Checked before anything changes: a refused state leaves the env as it was.
            self.variants.check_state(state.get('model_copies'))
            self._check_copy_params(state['model_copies'].get('params'))
        self.physics.state[:] = state['physics']
        buffers = {**self._NEW_BUFFERS, **state['buffers']}
        for k in self._BUFFERS:
            getattr(self, k)[...] = buffers[k]
        for k, v in state['episode_sums'].items():
            self.reward_manager.episode_sums[k][:] = v
        self.rng.bit_generator.state = state['rng']
        self.diverged_count = int(state['diverged_count'])
        self.common_step_counter = int(state.get('common_step_counter', 0))
        # The delay line (a state saved before it existed, or with a shorter one: every
        # world's motors hold its last targets).
        line = state.get('delay_line')
        if getattr(line, 'shape', None) == self.physics.delayed_targets.shape:
            self.physics.delayed_targets[:] = line
        else:
            self.physics.hold(np.arange(self.num_envs), self.targets)
        window = getattr(self.physics.actuator, 'window', None)
        if window is not None and getattr(state.get('actuator_window'), 'shape',
                                          None) == window.shape:
            window[:] = state['actuator_window']
        if self.sensor_model is not None and 'sensor_model' in state:
            self.sensor_model.set_state(state['sensor_model'])
        if self.placement is not None:
            self.placement.set_state(state['terrain'])
        if self.history is not None:
            self.history.frames[:] = saved_history
        if self.variants is None:
            params = self._world_params()
            for i in range(self.num_envs):
                self._write_copy(i, params, i)
            return
        # Shared copies: who steps with which, and each copy's parameters.
        self.variants.set_state(state['model_copies'])
        for name in self._PHYSICAL:
            self._copy_params[name][:] = state['model_copies']['params'][name]
        for c in range(self.variants.size):
            self._write_copy(c, self._copy_params, c)
        self.physics.use_copies(np.arange(self.num_envs), self.variants.of_world)

    # ------------------------------------------------------------------------------ internals
    def robot_state(self) -> RobotState:
        """Observation inputs: IMU sensors, encoders, command, last action; privileged truth."""
        p = self.physics
        qpos, qvel = p.qpos, p.qvel
        imu_quat, imu_gyro, _ = p.imu()
        return RobotState(
            base_quat=imu_quat, base_ang_vel=imu_gyro,
            joint_pos=qpos[:, p.qadr], joint_vel=qvel[:, p.vadr], commands=self.commands,
            last_action=self.actions,
            base_lin_vel=quat_rotate_inverse(qpos[:, 3:7], qvel[:, 0:3]),
            base_height=self._above_ground(qpos[:, 0:3]),
            foot_contact=self.foot_contact.astype(np.float64), friction=self.friction,
            added_mass=self.added_mass, com_offset=self.com_offset,
            motor_strength=self.motor_strength, gait_phase=self.gait_phase)

    def body_velocity(self) -> np.ndarray:
        """[N, 3] the trunk's true (vx, vy, yaw rate) in its body frame."""
        qpos, qvel = self.physics.qpos, self.physics.qvel
        # A free joint's linear velocity is in the world frame, its angular one in the body's.
        lin = quat_rotate_inverse(qpos[:, 3:7], qvel[:, 0:3])
        return np.concatenate([lin[:, :2], qvel[:, 5:6]], axis=1)

    @staticmethod
    def _tracking_error(s: StepData) -> dict[str, float]:
        # Mean absolute velocity-tracking errors over the batch (body frame).
        err = np.abs(s.commands - np.concatenate([s.base_lin_vel[:, :2],
                                                  s.trunk_ang_vel[:, 2:]], axis=1))
        return {'lin_vel_x': float(err[:, 0].mean()), 'lin_vel_y': float(err[:, 1].mean()),
                'ang_vel_yaw': float(err[:, 2].mean())}

    def _contacts(self, sensordata: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """[N, decimation, nsensordata] -> (feet [N, F] in contact at the last physics step,
        penalised [N, P] and termination [N, T] bodies in contact at any physics step).

        Contact sensors give [found, fx, fy, fz] per body, the three groups side by side
        (scene.sensor_slices); a contact needs a force above termination.contact_force.
        """
        sensors = self.physics.sensors
        lo, hi = sensors.foot_contact[0], sensors.termination_contact[1]
        raw = sensordata[:, :, lo:hi].reshape(sensordata.shape[0], sensordata.shape[1], -1, 4)
        force = raw[..., 1:4]
        # |f| > threshold, compared squared (no square root over every body and step).
        threshold = self.cfg.termination.contact_force
        touching = (raw[..., 0] > 0) & \
            (np.einsum('ndkc,ndkc->ndk', force, force) > threshold ** 2)

        def group(name):
            a, b = getattr(sensors, name)
            return touching[:, :, (a - lo) // 4:(b - lo) // 4]
        return (group('foot_contact')[:, -1], group('penalised_contact').any(axis=1),
                group('termination_contact').any(axis=1))

    def _step_data(self, sensordata: np.ndarray, diverged: np.ndarray) -> StepData:
        cfg = self.cfg
        s = self.robot_state()
        contact, penalised, term_contact = self._contacts(sensordata)
        # Feet air time as legged_gym: a touchdown is the first contact after a swing.
        contact_filt = contact | self.last_contacts
        self.last_contacts = contact
        self.foot_contact = contact
        first_contact = (self.feet_air_time > 0) & contact_filt
        self.feet_air_time += self.control_dt
        air_time = self.feet_air_time.copy()
        self.feet_air_time *= ~contact_filt
        # Rewards and failures judge the trunk itself (true state), not the IMU's reading of it.
        trunk_quat = self.physics.qpos[:, 3:7]
        gravity = gravity_in_body(trunk_quat)
        lo, hi = self.physics.sensors.joint_torque
        torque_sq_mean = np.mean(np.square(sensordata[:, :, lo:hi]), axis=1)
        torque_steps = sensordata[:, :, lo:hi]
        tilted = gravity[:, 2] > -math.cos(cfg.termination.max_tilt)
        low = s.base_height < self.min_base_height
        terminated = term_contact.any(axis=1) | tilted | low | diverged
        s.foot_contact = contact.astype(np.float64)
        lo, hi = self.physics.sensors.foot_pos
        feet = sensordata[:, -2:, lo:hi].reshape(self.num_envs, -1, self.num_feet, 3)
        foot_z = self._above_ground(feet[:, -1])
        foot_velocity = power = None
        scales = self.reward_manager.scales
        if 'feet_slip' in scales and feet.shape[1] > 1:
            # Feet velocity over the last physics step (sensors read each step's start).
            foot_velocity = (feet[:, -1] - feet[:, 0]) / self.robot.sim_dt
        elif 'feet_slip' in scales:
            foot_velocity = np.zeros_like(feet[:, -1])
        if 'energy' in scales:
            # Joint power: |torque x velocity| summed over joints, averaged over physics steps.
            joint_vel_steps = self.physics.substep_readings()[1]
            power = np.abs(torque_steps * joint_vel_steps).sum(axis=2).mean(axis=1)
        return StepData(
            **vars(s), projected_gravity=gravity,
            trunk_ang_vel=self.physics.qvel[:, 3:6].copy(),  # free joint: body-frame rates
            joint_acc=(s.joint_vel - self.last_joint_vel) / self.control_dt,
            joint_torque=np.sqrt(torque_sq_mean), previous_action=self.last_actions.copy(),
            foot_air_time=air_time, first_contact=first_contact,
            penalised_contact=penalised,
            terminated=terminated, desired_stance=self._desired_stance(s.commands),
            foot_height=foot_z - self.physics.foot_ground_offset,
            foot_velocity=foot_velocity, joint_power=power)

    def _above_ground(self, pos: np.ndarray) -> np.ndarray:
        """[..., 3] world points -> [...] their height above the ground under them."""
        if self.terrain is None:
            return pos[..., 2].copy()
        return pos[..., 2] - self.terrain.height_at(pos[..., 0], pos[..., 1])

    def _desired_stance(self, commands: np.ndarray) -> np.ndarray:
        """[N, F] feet the gait clock wants on the ground (all of them when standing)."""
        r = self.robot
        stance = np.ones((self.num_envs, self.num_feet), dtype=bool)
        if r.gait_period > 0:
            foot_phase = (self.gait_phase[:, None] + r.gait_offsets[None, :]) % 1.0
            moving = is_moving(commands, self.cfg.rewards.moving_command_threshold)
            stance[moving] = foot_phase[moving] < r.gait_duty
        return stance

    def _observe(self, state: RobotState) -> dict[str, np.ndarray]:
        r = self.robot
        if self.sensor_model is not None:
            # The policy terms read what the sensors report; the privileged ones the truth.
            pos, vel, quat, gyro = self.sensor_model.measured(
                state.joint_pos, state.joint_vel, state.base_quat, state.base_ang_vel)
            measured = dataclasses.replace(state, joint_pos=pos, joint_vel=vel, base_quat=quat,
                                           base_ang_vel=gyro)
            clean = r.policy_obs.compute(measured, r.default_joint_pos)
        else:
            clean = r.policy_obs.compute(state, r.default_joint_pos)
        policy = clean.copy()
        if self.noise_vec is not None:
            # Uniform sensor noise in [-level, level] per element, on the student's input only.
            policy += (2.0 * self.rng.random(policy.shape, dtype=np.float32) - 1.0) * \
                self.noise_vec
        privileged = r.privileged_obs.compute(state, r.default_joint_pos)
        obs = {POLICY: policy, POLICY_NOISE_FREE: clean, PRIVILEGED: privileged}
        if self.scan:
            # The trunk's true pose (the physics state the observation is built from).
            qpos = self.physics.qpos
            obs[HEIGHT_SCAN] = self.terrain.height_scan(qpos[:, 0:3], base_yaw(qpos[:, 3:7]))
        return obs

    def _episode_log(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Per finished world: return, length [s], and each reward term's episode sum."""
        log = {f'reward/{k}': v for k, v in self.reward_manager.pop_episode_sums(ids).items()}
        log['return'] = self.episode_return[ids].copy()
        log['length_s'] = self.episode_step[ids] * self.control_dt
        log['env_ids'] = ids
        return log

    def _sanitise(self, ids: np.ndarray) -> None:
        # A diverged world gets a finite placeholder state; it is reset at the end of step().
        self.diverged_count += int(ids.sum())
        self.physics.state[ids] = 0.0
        self.physics.qpos[ids] = self.physics.standing_qpos
        self.physics.sensordata[ids] = 0.0

    def _reset_worlds(self, ids: np.ndarray) -> None:
        if len(ids) == 0:
            return
        cfg, r, rng, p = self.cfg, self.robot, self.rng, self.physics
        k = len(ids)
        self._randomise(ids)
        # Default pose with noise, random heading, small random base velocity.
        qpos = np.tile(p.standing_qpos, (k, 1))
        noise = cfg.randomization.init_joint_pos_noise if cfg.randomization.enabled else 0.0
        joints = r.default_joint_pos + rng.uniform(-noise, noise, (k, self.num_actions))
        qpos[:, p.qadr] = np.clip(joints, r.joint_lower, r.joint_upper)
        qpos[:, 3:7] = quat_mul(yaw_quat(rng.uniform(-np.pi, np.pi, k)),
                                np.tile([1.0, 0.0, 0.0, 0.0], (k, 1)))
        if self.placement is not None:
            # On its tile: the reset height above the ground there.
            qpos[:, 0:3] += self.placement.spawn(ids, rng)
        vel = cfg.randomization.init_base_vel_noise if cfg.randomization.enabled else 0.0
        qvel = np.zeros((k, p.model.nv))
        qvel[:, 0:6] = rng.uniform(-vel, vel, (k, 6))
        p.state[ids] = 0.0
        p.qpos[ids] = qpos
        p.qvel[ids] = qvel
        self.targets[ids] = qpos[:, p.qadr]
        self.actions[ids] = 0.0
        self.last_actions[ids] = 0.0
        self.last_joint_vel[ids] = 0.0
        self.feet_air_time[ids] = 0.0
        self.last_contacts[ids] = False
        self.foot_contact[ids] = False
        self.gait_phase[ids] = rng.random(k) if r.gait_period > 0 else 0.0
        self.episode_step[ids] = 0
        self.episode_return[ids] = 0.0
        self._resample_commands(ids)
        # Until their first command arrives, the motors hold the reset pose.
        p.hold(ids, self.targets[ids])
        # The IMU of a reset world reads its new state, not the one it ended in.
        p.forward(ids, self.targets[ids])
        if self.sensor_model is not None:
            self.sensor_model.draw(ids, rng, self.randomization_now())
            quat, gyro, _ = p.imu()
            self.sensor_model.restart(ids, p.qpos[ids][:, p.qadr], p.qvel[ids][:, p.vadr],
                                      quat[ids], gyro[ids])

    _PHYSICAL = PHYSICAL

    def _randomise(self, ids: np.ndarray) -> None:
        """Physical parameters and action latency of the worlds ``ids`` that reset."""
        if self.variants is None:
            # Each world its own model copy, drawn anew at every reset.
            for name, value in self._draw(len(ids)).items():
                getattr(self, name)[ids] = value
            params = self._world_params()
            for i in ids:
                self._write_copy(i, params, i)
            return
        # Shared copies: the worlds join copies; a copy no world used is drawn anew.
        copies, fresh = self.variants.assign(ids)
        drawn = self._draw(len(fresh))
        for name in self._PHYSICAL:
            self._copy_params[name][fresh] = drawn[name]
            getattr(self, name)[ids] = self._copy_params[name][copies]
        for c in fresh:
            self._write_copy(c, self._copy_params, c)
        self.physics.use_copies(ids, copies)
        self.latency[ids] = self._draw(len(ids))['latency']

    def _world_params(self) -> dict[str, np.ndarray]:
        """{name: [N, ...]} the worlds' physical parameters (views)."""
        return {name: getattr(self, name) for name in self._PHYSICAL}

    def _write_copy(self, copy_id: int, params: dict[str, np.ndarray], row: int) -> None:
        """Model copy ``copy_id`` gets row ``row`` of the physical parameters ``params``."""
        self.physics.set_physical_params(copy_id, {name: params[name][row]
                                                   for name in self._PHYSICAL})

    def _draw(self, k: int) -> dict[str, np.ndarray]:
        """k draws of the physical parameters and the action latency (nominal values with
        randomisation off)."""
        dr = self.cfg.randomization
        if not dr.enabled:
            return nominal_params(self.robot, k)
        return draw_params(self.randomization_now(), self.robot, self.rng, k, self.payload_range,
                           self.com_offset_range)

    def _resample_commands(self, ids: np.ndarray) -> None:
        if len(ids) == 0:
            return
        c, rng = self.cfg.commands, self.rng
        k = len(ids)
        cmd = np.stack([rng.uniform(*c.lin_vel_x, k), rng.uniform(*c.lin_vel_y, k),
                        rng.uniform(*c.ang_vel_yaw, k)], axis=1)
        # Slow planar commands become 0; some commands are "stand still".
        cmd[np.linalg.norm(cmd[:, :2], axis=1) < c.min_speed, :2] = 0.0
        standing = rng.random(k) < c.standing_probability
        cmd[standing] = 0.0
        self.commands[ids] = cmd
        if c.heading_command:
            # Heading mode: a target heading replaces the yaw rate (standing worlds keep 0).
            heading = rng.uniform(*c.heading, k)
            self.heading_target[ids] = np.where(standing, np.nan, heading)

    def _steer_to_heading(self) -> None:
        """Heading mode: yaw-rate command = stiffness x heading error wrapped to [-pi, pi),
        clipped to the yaw-rate range (legged_gym), for worlds with a heading target."""
        c = self.cfg.commands
        if not c.heading_command:
            return
        steered = np.isfinite(self.heading_target)
        yaw = base_yaw(self.physics.qpos[:, 3:7])
        error = np.remainder(self.heading_target - yaw + math.pi, 2 * math.pi) - math.pi
        self.commands[:, 2] = np.where(
            steered, np.clip(c.heading_stiffness * np.nan_to_num(error), *c.ang_vel_yaw),
            self.commands[:, 2])

    def _push(self, ids: np.ndarray) -> None:
        if len(ids) == 0:
            return
        v = self.cfg.randomization.push_velocity
        self.physics.qvel[ids, 0:2] += self.rng.uniform(-v, v, (len(ids), 2))
