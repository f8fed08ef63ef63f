"""The batched locomotion env: shapes, rewards, terminations, resets, determinism, DR, NaN
guard, gait clock."""

import math

import numpy as np
import pytest

from claw_rl_ros.core.sim import rewards as R
from claw_rl_ros.core.math_utils import quat_rotate, quat_rotate_inverse, yaw_quat


def random_actions(rng, env, scale=1.0):
    return rng.normal(0.0, scale, (env.num_envs, env.num_actions))


def test_shapes_and_finiteness_over_1000_random_steps(make_env):
    env = make_env(num_envs=8, episode_length_s=2.0)
    obs, _ = env.reset(seed=1)
    assert obs['policy'].shape == (8, 47) and obs['policy'].dtype == np.float32
    assert obs['privileged'].shape == (8, env.privileged_dim)
    rng = np.random.default_rng(0)
    dones = 0
    for _ in range(1000):
        obs, reward, terminated, truncated, extras = env.step(random_actions(rng, env))
        assert obs['policy'].shape == (8, 47) and reward.shape == (8,)
        assert terminated.shape == truncated.shape == (8,) and terminated.dtype == bool
        assert np.isfinite(obs['policy']).all() and np.isfinite(obs['privileged']).all()
        assert np.isfinite(reward).all()
        assert not (terminated & truncated).any()
        dones += int((terminated | truncated).sum())
    # 2 s episodes over 20 s of control: every world finished several episodes.
    assert dones >= 8 * 5
    assert env.diverged_count == 0


def crafted_step():
    """Two worlds with hand-picked values."""
    n, j = 2, 12
    return R.StepData(
        base_quat=np.tile([1.0, 0, 0, 0], (n, 1)),
        base_ang_vel=np.full((n, 3), np.nan),  # the IMU's reading: rewards must not use it
        trunk_ang_vel=np.array([[0.1, -0.2, 0.5], [0.0, 0.0, 0.0]]),
        joint_pos=np.zeros((n, j)), joint_vel=np.full((n, j), 2.0),
        commands=np.array([[0.5, 0.0, 0.3], [0.0, 0.0, 0.0]]),
        last_action=np.full((n, j), 0.5),
        base_lin_vel=np.array([[0.3, 0.1, 0.2], [0.0, 0.0, -0.1]]),
        base_height=np.array([0.20, 0.25]),
        projected_gravity=np.array([[0.1, 0.2, -0.97], [0.0, 0.0, -1.0]]),
        joint_acc=np.full((n, j), 10.0), joint_torque=np.full((n, j), 3.0),
        previous_action=np.zeros((n, j)),
        foot_air_time=np.array([[0.5, 0.1, 0.0, 0.0], [0.4, 0.0, 0.0, 0.0]]),
        first_contact=np.array([[True, True, False, False], [True, False, False, False]]),
        penalised_contact=np.array([[True, False] + [False] * 6, [False] * 8]),
        terminated=np.array([False, True]))


def params(**kw):
    base = dict(tracking_sigma=0.25, base_height_target=0.25, feet_air_time_target=0.3,
                moving_command_threshold=0.1, default_joint_pos=np.full(12, 0.1),
                soft_joint_lower=np.full(12, -0.5), soft_joint_upper=np.full(12, 0.5))
    base.update(kw)
    return R.RewardParams(**base)


def test_reward_terms_match_hand_computed_values():
    s, p = crafted_step(), params()
    # |(0.5, 0) - (0.3, 0.1)|^2 = 0.05 -> exp(-0.05 / 0.25)
    np.testing.assert_allclose(R.tracking_lin_vel(s, p), [math.exp(-0.2), math.exp(0.0)])
    np.testing.assert_allclose(R.tracking_ang_vel(s, p), [math.exp(-0.04 / 0.25), 1.0])
    np.testing.assert_allclose(R.lin_vel_z(s, p), [0.04, 0.01])
    np.testing.assert_allclose(R.ang_vel_xy(s, p), [0.05, 0.0])
    np.testing.assert_allclose(R.orientation(s, p), [0.05, 0.0])
    np.testing.assert_allclose(R.base_height(s, p), [0.0025, 0.0])
    np.testing.assert_allclose(R.torques(s, p), [108.0, 108.0])
    np.testing.assert_allclose(R.dof_vel(s, p), [48.0, 48.0])
    np.testing.assert_allclose(R.dof_acc(s, p), [1200.0, 1200.0])
    np.testing.assert_allclose(R.action_rate(s, p), [3.0, 3.0])
    np.testing.assert_allclose(R.collision(s, p), [1.0, 0.0])
    np.testing.assert_allclose(R.termination(s, p), [0.0, 1.0])
    # World 0 moves: touchdowns after 0.5 s and 0.1 s -> (0.2) + (-0.2); world 1 stands: 0.
    np.testing.assert_allclose(R.feet_air_time(s, p), [0.0, 0.0], atol=1e-12)
    s.foot_air_time[0, 1] = 0.4
    np.testing.assert_allclose(R.feet_air_time(s, p), [0.3, 0.0])
    # Standing world 1 is 0.1 rad from the default pose on 12 joints.
    np.testing.assert_allclose(R.stand_still(s, p), [0.0, 1.2])
    s.joint_pos[0, :2] = [0.7, -0.6]
    np.testing.assert_allclose(R.dof_pos_limits(s, p), [0.3, 0.0])


def test_turn_in_place_is_moving_for_every_term():
    """Defect 5: stand_still and the gait terms agree that a yaw-only command is "moving"."""
    s, p = crafted_step(), params()
    s.commands[:] = [[0.0, 0.0, 0.8], [0.0, 0.0, 0.05]]
    assert R.is_moving(s.commands, 0.1).tolist() == [True, False]
    s.joint_pos[:] = 0.3
    # Turning world 0 is not penalised for leaving the default pose; standing world 1 is.
    np.testing.assert_allclose(R.stand_still(s, p), [0.0, 12 * 0.2])
    s.foot_air_time[0, 1] = 0.4
    np.testing.assert_allclose(R.feet_air_time(s, p), [0.3, 0.0])


def test_gait_clock_uses_the_same_moving_definition(make_env):
    env = make_env(num_envs=2, randomization={'enabled': False}, noise={'enabled': False})
    env.gait_phase[:] = 0.75
    stance = env._desired_stance(np.array([[0.0, 0.0, 0.8], [0.0, 0.0, 0.05]]))
    # Turning: the trot's swing feet are lifted; standing: all four feet down.
    assert not stance[0].all() and stance[1].all()


def test_reward_manager_scales_by_dt_clips_and_logs():
    s = crafted_step()
    manager = R.RewardManager({'tracking_lin_vel': 1.0, 'collision': -10.0, 'termination': -5.0,
                               'torques': 0.0}, params(), control_dt=0.02, num_envs=2,
                              only_positive=True)
    total, terms = manager.compute(s)
    assert set(terms) == {'tracking_lin_vel', 'collision', 'termination'}
    lin = np.array([math.exp(-0.2), 1.0]) * 0.02
    np.testing.assert_allclose(terms['collision'], [-0.2, 0.0])
    # World 0: clip(lin - 0.2) = 0; world 1: lin + termination -5 * 0.02 after the clip.
    np.testing.assert_allclose(total, [0.0, lin[1] - 0.1])
    sums = manager.pop_episode_sums(np.array([0]))
    np.testing.assert_allclose(sums['collision'], [-0.2])
    assert manager.episode_sums['collision'][0] == 0.0
    with pytest.raises(ValueError, match='unknown reward term'):
        R.RewardManager({'fly': 1.0}, params(), 0.02, 2, True)


def test_quaternion_helpers_round_trip():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(5, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    v = rng.normal(size=(5, 3))
    np.testing.assert_allclose(quat_rotate_inverse(q, quat_rotate(q, v)), v, atol=1e-12)
    # A 90 degree yaw turns world +x into body -y.
    np.testing.assert_allclose(quat_rotate_inverse(yaw_quat(np.array([np.pi / 2])),
                                                   np.array([[1.0, 0, 0]])), [[0, -1, 0]],
                               atol=1e-12)


def test_time_out_is_truncation_not_termination(make_env):
    env = make_env(num_envs=3, episode_length_s=0.2, randomization={'enabled': False},
                   commands={'standing_probability': 1.0})
    env.reset(seed=0)
    zeros = np.zeros((3, 12))
    for step in range(1, 10):
        _, _, terminated, truncated, extras = env.step(zeros)
        assert not terminated.any() and not truncated.any(), step
    obs, _, terminated, truncated, extras = env.step(zeros)
    assert truncated.all() and not terminated.any()
    assert extras['time_outs'].all()
    np.testing.assert_allclose(extras['episode']['length_s'], 0.2)
    assert (env.episode_step == 0).all()


def test_tilt_and_trunk_contact_terminate(make_env):
    env = make_env(num_envs=3, randomization={'enabled': False})
    env.reset(seed=0)
    p = env.physics
    # World 0 upside down on the floor; world 1 trunk dropped onto the floor; world 2 fine.
    p.qpos[0, 3:7] = [0.0, 1.0, 0.0, 0.0]
    p.qpos[0, 2] = 0.1
    p.qpos[1, 2] = 0.02
    _, _, terminated, truncated, _ = env.step(np.zeros((3, 12)))
    assert terminated.tolist() == [True, True, False]
    assert not truncated.any()


def test_auto_reset_restarts_finished_worlds_and_reports_final_obs(make_env):
    env = make_env(num_envs=2, randomization={'enabled': False}, noise={'enabled': False})
    env.reset(seed=0)
    for _ in range(20):
        env.step(np.zeros((2, 12)))
    env.physics.qpos[1, 3:7] = [0.0, 1.0, 0.0, 0.0]
    obs, _, terminated, _, extras = env.step(np.zeros((2, 12)))
    assert terminated.tolist() == [False, True]
    assert env.episode_step.tolist() == [21, 0]
    # The final observation shows the upside-down trunk; the returned one a fresh upright start.
    gravity = slice(3, 6)
    assert extras['final_obs']['policy'][1, gravity][2] > 0.5
    assert obs['policy'][1, gravity][2] < -0.99
    assert extras['episode']['env_ids'].tolist() == [1]
    assert env.physics.qpos[1, 2] == pytest.approx(env.robot.init_base_height)


def test_same_seed_same_rollout_different_seed_differs(make_env):
    def rollout(seed):
        env = make_env(num_envs=4, seed=seed)
        env.reset()
        rng = np.random.default_rng(7)
        out = []
        for _ in range(60):
            obs, reward, *_ = env.step(random_actions(rng, env, 0.5))
            out.append(np.concatenate([obs['policy'].ravel(), reward]))
        return np.array(out)

    a, b, c = rollout(3), rollout(3), rollout(4)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_domain_randomisation_stays_in_configured_ranges(make_env):
    dr = {'friction': [0.5, 0.6], 'added_mass': [1.0, 2.0], 'link_mass_scale': [0.8, 0.85],
          'com_offset': [-0.01, 0.01], 'motor_strength': [1.2, 1.3],
          'action_latency_substeps': [1, 2]}
    env = make_env(num_envs=32, randomization=dr)
    p = env.physics
    assert ((env.friction >= 0.5) & (env.friction <= 0.6)).all()
    assert ((env.added_mass >= 1.0) & (env.added_mass <= 2.0)).all()
    assert (np.abs(env.com_offset) <= 0.01).all()
    assert set(env.latency.tolist()) <= {1, 2} and len(set(env.latency.tolist())) == 2
    base = p.base_body
    for i in range(32):
        m = p.models[i]
        # The sampled values really are in each world's model.
        assert m.geom_friction[p.floor_geom, 0] == pytest.approx(env.friction[i])
        scale = env.mass_scale[i]
        assert 0.8 <= scale <= 0.85
        assert m.body_mass[base] == pytest.approx(p.model.body_mass[base] * scale
                                                  + env.added_mass[i])
        np.testing.assert_allclose(m.body_ipos[base], p.model.body_ipos[base] + env.com_offset[i])
        assert 1.2 <= m.actuator_gainprm[0, 0] / p.model.actuator_gainprm[0, 0] <= 1.3
    # Worlds differ from each other and from the nominal model.
    assert np.ptp(env.friction) > 0
    off = make_env(num_envs=4, randomization={'enabled': False})
    assert (off.friction == off.robot.foot_friction).all() and (off.latency == 0).all()
    assert off.physics.models[0].body_mass[base] == pytest.approx(p.model.body_mass[base])


def test_latency_holds_previous_target_for_first_substeps(make_env):
    env = make_env(num_envs=2, randomization={'action_latency_substeps': [2, 2]})
    env.reset(seed=0)
    before = env.targets.copy()
    env.step(np.ones((2, 12)))
    ctrl = env.physics._ctrl
    np.testing.assert_allclose(ctrl[:, :2], np.repeat(before[:, None], 2, axis=1))
    np.testing.assert_allclose(ctrl[:, 2:], np.repeat(env.targets[:, None], 2, axis=1))


def test_nan_guard_resets_a_diverged_world_without_crashing(make_env):
    env = make_env(num_envs=4)
    env.reset(seed=0)
    env.physics.qvel[2, 7] = np.nan
    env.physics.qvel[3, 8] = 1e9
    obs, reward, terminated, truncated, extras = env.step(np.zeros((4, 12)))
    assert extras['diverged'] == 2 and env.diverged_count == 2
    assert terminated.tolist() == [False, False, True, True]
    assert np.isfinite(obs['policy']).all() and np.isfinite(reward).all()
    assert np.isfinite(env.physics.state).all()
    # A NaN action is a divergence too, and the batch keeps running.
    actions = np.zeros((4, 12))
    actions[0, 0] = np.nan
    obs, reward, terminated, *_ , extras = env.step(actions)
    assert extras['diverged'] == 1 and terminated[0]
    for _ in range(5):
        obs, reward, *_ = env.step(np.zeros((4, 12)))
    assert np.isfinite(obs['policy']).all()


def test_commands_sampled_in_range_and_resampled(make_env):
    env = make_env(num_envs=64, commands={'resample_time_s': 0.1, 'lin_vel_x': [0.2, 0.8],
                                          'lin_vel_y': [-0.1, 0.1], 'ang_vel_yaw': [-0.5, 0.5],
                                          'standing_probability': 0.0, 'min_speed': 0.0})
    env.reset(seed=0)
    first = env.commands.copy()
    assert ((first[:, 0] >= 0.2) & (first[:, 0] <= 0.8)).all()
    assert (np.abs(first[:, 1]) <= 0.1).all() and (np.abs(first[:, 2]) <= 0.5).all()
    for _ in range(5):  # 0.1 s = 5 control steps
        env.step(np.zeros((64, 12)))
    assert not np.allclose(env.commands, first)


def test_observation_noise_is_bounded_by_configured_levels(make_env):
    env = make_env(num_envs=16, randomization={'enabled': False},
                   noise={'levels': {'joint_vel': 2.0, 'base_ang_vel': 0.0,
                                     'projected_gravity': 0.0, 'joint_pos': 0.0}})
    obs, _ = env.reset(seed=0)
    clean = obs['policy_noise_free']
    diff = obs['policy'] - clean
    vel = slice(21, 33)  # joint_vel block: scale 0.05 -> noise amplitude 0.1
    assert np.abs(diff[:, vel]).max() <= 0.1 + 1e-6 and np.abs(diff[:, vel]).max() > 0.05
    assert np.abs(np.delete(diff, np.r_[vel], axis=1)).max() == 0.0


def test_pushes_kick_the_base(make_env):
    env = make_env(num_envs=8, randomization={'push_interval_s': 0.04, 'push_velocity': 1.0})
    env.reset(seed=0)
    env.step(np.zeros((8, 12)))
    before = env.physics.qvel[:, 0:2].copy()
    env.step(np.zeros((8, 12)))  # second step is a push step
    assert np.abs(env.physics.qvel[:, 0:2] - before).max() > 0.2


def test_gait_clock_advances_and_plans_a_diagonal_trot(make_env):
    env = make_env(num_envs=2, randomization={'enabled': False}, noise={'enabled': False},
                   commands={'standing_probability': 0.0, 'min_speed': 0.0,
                             'lin_vel_x': [0.5, 0.5]})
    env.reset(seed=0)
    env.gait_phase[:] = [0.0, 0.3]
    obs, *_ = env.step(np.zeros((2, 12)))
    # 0.02 s of a 0.4 s cycle = 0.05 of a phase; the policy sees sin/cos of it.
    np.testing.assert_allclose(env.gait_phase, [0.05, 0.35])
    np.testing.assert_allclose(obs['policy'][:, -2:], np.stack(
        [np.sin(2 * np.pi * env.gait_phase), np.cos(2 * np.pi * env.gait_phase)], axis=1),
        atol=1e-6)
    stance = env._desired_stance(env.commands)
    # FL and RR step together, FR and RL half a cycle later.
    assert stance[0].tolist() == [True, False, False, True]
    env.commands[1] = 0.0
    assert env._desired_stance(env.commands)[1].tolist() == [True] * 4


def test_gait_rewards_match_hand_computed_values():
    s = crafted_step()
    s.foot_contact = np.array([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    s.desired_stance = np.array([[True, False, False, True], [True, True, True, True]])
    s.foot_height = np.array([[0.0, 0.06, 0.01, 0.0], [0.0, 0.0, 0.0, 0.0]])
    p = params(swing_height_target=0.05)
    np.testing.assert_allclose(R.gait_contact(s, p), [0.75, 1.0])
    # Swing feet FR (lifted past the target: 1) and RL (0.01 / 0.05); no swing feet: 0.
    np.testing.assert_allclose(R.feet_clearance(s, p), [(1.0 + 0.2) / 2, 0.0])


def test_gait_rewards_switch_off_with_a_notice_without_a_gait_clock(robot):
    import dataclasses
    from claw_rl_ros.core.sim.env import GaitRewardsOff, VecLocomotionEnv
    from claw_rl_ros.core.sim.env_config import EnvConfig
    no_gait = dataclasses.replace(robot, gait_period=0.0)
    with pytest.warns(GaitRewardsOff, match='gait_contact, feet_clearance are switched off'):
        env = VecLocomotionEnv(EnvConfig(num_envs=1), no_gait)
    try:
        assert 'gait_contact' not in env.reward_manager.scales
        assert 'tracking_lin_vel' in env.reward_manager.scales
        env.step(np.zeros((1, 12)))
    finally:
        env.close()


def test_foot_heights_are_zero_standing_and_positive_when_lifted(make_env):
    env = make_env(num_envs=1, randomization={'enabled': False}, noise={'enabled': False},
                   commands={'standing_probability': 1.0})
    env.reset(seed=0)
    for _ in range(50):
        env.step(np.zeros((1, 12)))
    lo, hi = env.physics.sensors.foot_pos
    z = env.physics.sensordata[0, -1, lo:hi].reshape(-1, 3)[:, 2]
    heights = z - env.physics.foot_ground_offset
    assert np.abs(heights).max() < 0.01
