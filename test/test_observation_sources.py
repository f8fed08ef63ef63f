"""Where observations come from (issue 7, defects 2, 3, 6): the IMU sensors, the state after
pushes and resets, and a noise-free copy of the policy group for the critic."""

import dataclasses

import numpy as np
import torch

from claw_rl_ros.core.config import from_dict
from claw_rl_ros.core.math_utils import gravity_in_body, quat_mul, quat_rotate_inverse
from claw_rl_ros.core.learning.networks import ActorCritic
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from claw_rl_ros.core.sim.env_config import EnvConfig


def rotated_imu_robot(robot, tmp_path):
    """The claw quadruped with its IMU mounted upside down and turned 90 degrees."""
    text = robot.model_path.read_text().replace(
        '<child link="imu_link"/>\n    <origin xyz="0 0 0" rpy="0 0 0"/>',
        '<child link="imu_link"/>\n    <origin xyz="0.05 0 0.02" rpy="3.14159265 0 1.57079633"/>')
    assert 'rpy="3.14159265 0 1.57079633"' in text
    urdf = tmp_path / 'rotated_imu.urdf'
    urdf.write_text(text)
    return dataclasses.replace(robot, model_path=urdf)


def offset_quat():
    # rpy (pi, 0, pi/2) as w, x, y, z: Rz(pi/2) * Rx(pi).
    rz = np.array([[np.cos(np.pi / 4), 0.0, 0.0, np.sin(np.pi / 4)]])
    rx = np.array([[0.0, 1.0, 0.0, 0.0]])
    return quat_mul(rz, rx)


def quiet_env(robot, **extra):
    cfg = from_dict(EnvConfig, {'num_envs': 3, 'randomization': {'enabled': False},
                                'noise': {'enabled': False}, **extra})
    return VecLocomotionEnv(cfg, robot)


def slice_of(robot, group, term):
    layout = robot.policy_obs if group == 'policy' else robot.privileged_obs
    s = next(s for s in layout.slices if s.name == term)
    return slice(s.start, s.start + s.size), s.scale


def test_policy_observation_is_built_from_the_imu_sensors(robot, tmp_path):
    """Defect 6: a rotated IMU changes the observation exactly as a sensor_msgs/Imu would."""
    rotated = rotated_imu_robot(robot, tmp_path)
    env = quiet_env(rotated)
    try:
        obs, _ = env.reset(seed=3)
        p = env.physics
        p.qvel[:, 3:6] = [[0.3, -0.2, 0.5], [0.0, 0.4, 0.0], [-0.1, 0.0, 0.2]]
        p.forward(np.arange(3), env.targets)
        obs = env._observe(env.robot_state())
        trunk_quat = p.qpos[:, 3:7]
        imu_quat, gyro, _ = p.imu()
        # The IMU frame is the trunk frame turned by the mounting offset.
        expected = quat_mul(trunk_quat, np.tile(offset_quat(), (3, 1)))
        np.testing.assert_allclose(np.abs(np.sum(imu_quat * expected, axis=1)), 1.0, atol=1e-6)
        # Gyro: the trunk's body rates seen in the IMU frame.
        np.testing.assert_allclose(gyro, quat_rotate_inverse(np.tile(offset_quat(), (3, 1)),
                                                             p.qvel[:, 3:6]), atol=1e-6)
        ang, ang_scale = slice_of(rotated, 'policy', 'base_ang_vel')
        grav, _ = slice_of(rotated, 'policy', 'projected_gravity')
        np.testing.assert_allclose(obs['policy'][:, ang], gyro * ang_scale, rtol=1e-5)
        np.testing.assert_allclose(obs['policy'][:, grav], gravity_in_body(imu_quat), atol=1e-6)
        # Upside down: an upright trunk's IMU sees gravity along its own +z.
        assert (obs['policy'][:, grav][:, 2] > 0.9).all()
        # Standing on the floor, the accelerometer reads +g along the IMU's "up": its -z here.
        for _ in range(50):
            env.step(np.zeros((3, 12)))
        assert (p.imu()[2][:, 2] < -8.0).all()
    finally:
        env.close()


def test_imu_of_a_reset_world_reads_its_new_state(make_env):
    env = make_env(num_envs=2, randomization={'enabled': False}, noise={'enabled': False})
    env.reset(seed=0)
    env.step(np.zeros((2, 12)))
    env.physics.sensordata[:] = 0.0          # whatever the worlds read before
    env._reset_worlds(np.array([1]))
    quat, _, _ = env.physics.imu()
    assert np.all(quat[0] == 0.0)            # untouched world keeps its (zeroed) reading
    np.testing.assert_allclose(np.abs(np.sum(quat[1] * env.physics.qpos[1, 3:7])), 1.0,
                               atol=1e-6)


def test_observation_after_a_push_is_the_pushed_state_whatever_other_worlds_do(robot):
    """Defect 3: a push shows in that world's observation whether or not another world reset.

    (The two runs draw different push velocities, since a reset consumes random numbers
    first; each must observe its own pushed state.)
    """
    for force_reset in (False, True):
        env = quiet_env(robot, randomization={'enabled': True, 'push_interval_s': 0.04,
                                              'push_velocity': 2.0,
                                              'action_latency_substeps': [0, 0]})
        try:
            env.reset(seed=5)
            env.step(np.zeros((3, 12)))
            if force_reset:
                env.episode_step[2] = env.max_episode_length - 1   # world 2 times out now
            obs, _, _, truncated, _ = env.step(np.zeros((3, 12)))   # step 2 pushes 0 and 1
            assert truncated[2] == force_reset
            lin, scale = slice_of(robot, 'privileged', 'base_lin_vel')
            true = quat_rotate_inverse(env.physics.qpos[:, 3:7], env.physics.qvel[:, 0:3])
            assert np.abs(true[:2, :2]).max() > 0.3                  # the push happened
            np.testing.assert_allclose(obs['privileged'][:2, lin], true[:2] * scale, rtol=1e-5,
                                       atol=1e-6)
        finally:
            env.close()


def test_critic_reads_noise_free_observations_consistently(make_env):
    """Defect 2: one input distribution for the value function, in steps and in bootstraps."""
    env = make_env(num_envs=4, episode_length_s=0.1, randomization={'enabled': False})
    obs, _ = env.reset(seed=0)
    assert not np.allclose(obs['policy'], obs['policy_noise_free'])      # noise is on
    assert np.abs(obs['policy'] - obs['policy_noise_free']).max() <= env.noise_vec.max() + 1e-6
    final = None
    for _ in range(10):
        obs, _, _, truncated, extras = env.step(np.zeros((4, 12)))
        if truncated.any():
            final = extras['final_obs']
            break
    assert final is not None and set(final) == set(obs) == set(env.obs_dims)
    policy = ActorCritic(env.obs_dim, env.obs_dim + env.privileged_dim, 12,
                         actor_hidden_dims=[8], critic_hidden_dims=[8])
    assert policy.critic_obs_groups == ['policy_noise_free', 'privileged']
    t = {k: torch.as_tensor(v) for k, v in final.items()}
    before = policy.evaluate(t)
    t['policy'] = t['policy'] + 100.0        # the noisy group never reaches the critic
    torch.testing.assert_close(policy.evaluate(t), before)


def test_env_and_policy_node_build_the_same_observation_from_the_same_sensors(robot, tmp_path):
    """Defect 6: the env's policy observation equals what the policy node builds from the
    JointState (joints shuffled: matched by name) and Imu (x, y, z, w) messages of the same
    physics state, with a rotated IMU."""
    from claw_rl_ros.core.control.state_input import imu_arrays, JointOrder, ObservationAssembler
    rotated = rotated_imu_robot(robot, tmp_path)
    env = quiet_env(rotated, commands={'standing_probability': 0.0})
    try:
        env.reset(seed=4)
        rng = np.random.default_rng(0)
        for _ in range(30):
            obs, *_ = env.step(rng.normal(0.0, 0.5, (3, 12)))
        p = env.physics
        quat, gyro, _ = p.imu()
        order = rng.permutation(12)
        names = [rotated.joint_names[i] for i in order]
        joints = JointOrder(rotated)
        pos, vel = joints.joint_arrays(names, p.qpos[0, p.qadr][order],
                                       p.qvel[0, p.vadr][order])
        xyzw = [quat[0, 1], quat[0, 2], quat[0, 3], quat[0, 0]]
        base_quat, base_ang_vel = imu_arrays(xyzw, gyro[0])
        node = ObservationAssembler(rotated)
        node.set_command(env.commands[0])
        node.last_action[0] = env.actions[0]
        node.gait_phase[0] = env.gait_phase[0]
        from_messages = node.observe(pos, vel, base_quat, base_ang_vel)
        np.testing.assert_allclose(from_messages, obs['policy'][0], rtol=1e-5, atol=1e-5)
    finally:
        env.close()
