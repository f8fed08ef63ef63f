"""Env maths at the loop level: time-out vs termination, episode bookkeeping, reward terms and
the reward sum on crafted StepData, observation layouts (order, scales, errors)."""

import math

import numpy as np
import pytest

from claw_rl_ros.core.config import ConfigError
from claw_rl_ros.core.sim import rewards as R
from claw_rl_ros.core.sim.observations import ObservationLayout, RobotState

J = 12
ZEROS = np.zeros((3, J))


def quiet_env(make_env, n=3, **kw):
    """Deterministic worlds: no randomisation, no noise, standing commands."""
    kw.setdefault('randomization', {'enabled': False})
    kw.setdefault('noise', {'enabled': False})
    kw.setdefault('commands', {'standing_probability': 1.0})
    env = make_env(num_envs=n, **kw)
    env.reset(seed=0)
    return env


def flip(env, i):
    """Turn world i upside down just above the floor: a failure at the next step."""
    env.physics.qpos[i, 3:7] = [0.0, 1.0, 0.0, 0.0]
    env.physics.qpos[i, 2] = 0.1


# --------------------------------------------------------------------------- episode ends
def test_episode_length_rounds_up_to_whole_control_steps(make_env):
    env = quiet_env(make_env, episode_length_s=0.21)
    assert env.max_episode_length == 11      # ceil(0.21 / 0.02)
    for step in range(10):
        _, _, terminated, truncated, extras = env.step(ZEROS)
        assert not truncated.any() and 'final_obs' not in extras, step
    _, _, terminated, truncated, extras = env.step(ZEROS)
    assert truncated.all() and not terminated.any()
    assert extras['time_outs'] is truncated


def test_env_loads_its_robot_from_the_config_and_returns_float32_rewards():
    from claw_rl_ros.core.config import from_dict
    from claw_rl_ros.core.sim.env import VecLocomotionEnv
    from claw_rl_ros.core.sim.env_config import EnvConfig
    env = VecLocomotionEnv(from_dict(EnvConfig, {'num_envs': 2}))
    try:
        assert env.robot.name == 'claw_quadruped' and env.num_actions == J
        env.reset(seed=0)
        _, reward, *_ = env.step(np.zeros((2, J)))
        assert reward.dtype == np.float32 and reward.shape == (2,)
    finally:
        env.close()


@pytest.mark.parametrize('interval, enabled, expected', [
    (0.02, True, [[0, 1, 2]] * 3),     # every step, every world
    (0.04, True, [[], [0, 1, 2], []]),
    (0.04, False, []),                 # randomisation off: no pushes
    (0.0, True, []),                   # interval 0: no pushes
])
def test_pushes_come_every_interval_to_worlds_past_their_first_step(make_env, monkeypatch,
                                                                    interval, enabled,
                                                                    expected):
    env = make_env(num_envs=3, randomization={'enabled': enabled, 'push_interval_s': interval})
    env.reset(seed=0)
    pushed = []
    monkeypatch.setattr(env, '_push', lambda ids: pushed.append(sorted(ids.tolist())))
    for _ in range(3):
        env.step(np.zeros((3, J)))
    assert pushed == expected
    # A world that just reset (episode step 0) is not pushed in that step.
    pushed.clear()
    env.episode_step[1] = env.max_episode_length - 1
    env.step(np.zeros((3, J)))
    if interval == 0.02 and enabled:
        assert pushed == [[0, 2]]


def test_a_world_that_fails_on_its_last_step_is_terminated_not_truncated(make_env):
    env = quiet_env(make_env, episode_length_s=0.1)
    for _ in range(4):
        env.step(ZEROS)
    flip(env, 1)
    _, _, terminated, truncated, extras = env.step(ZEROS)
    # World 1 both hit the time limit and fell: the fall wins, no bootstrap.
    assert terminated.tolist() == [False, True, False]
    assert truncated.tolist() == [True, False, True]
    assert extras['time_outs'].tolist() == [True, False, True]
    assert sorted(extras['episode']['env_ids'].tolist()) == [0, 1, 2]


def test_truncation_is_never_set_for_a_terminated_world_over_a_random_rollout(make_env):
    env = make_env(num_envs=6, episode_length_s=0.3)
    env.reset(seed=3)
    rng = np.random.default_rng(1)
    seen_terminal = seen_truncated = 0
    for _ in range(60):
        _, _, terminated, truncated, _ = env.step(rng.normal(0, 3.0, (6, J)))
        assert not (terminated & truncated).any()
        seen_terminal += terminated.sum()
        seen_truncated += truncated.sum()
    assert seen_terminal > 0 and seen_truncated > 0


def test_final_obs_and_episode_log_of_a_failed_world(make_env):
    env = quiet_env(make_env, n=2)
    for _ in range(3):
        env.step(np.zeros((2, J)))
    returns = env.episode_return.copy()
    sums = {k: v.copy() for k, v in env.reward_manager.episode_sums.items()}
    flip(env, 0)
    obs, reward, terminated, truncated, extras = env.step(np.zeros((2, J)))
    assert terminated.tolist() == [True, False]
    log = extras['episode']
    assert log['env_ids'].tolist() == [0]
    assert log['length_s'].tolist() == pytest.approx([4 * env.control_dt])
    assert log['return'].tolist() == pytest.approx([returns[0] + reward[0]])
    assert set(log) == {'env_ids', 'length_s', 'return'} | {f'reward/{k}' for k in sums}
    assert env.reward_manager.episode_sums['tracking_lin_vel'][1] > 0
    for k in sums:
        assert log[f'reward/{k}'].shape == (1,)
        # The finished world's sums restart at 0; the other world's keep counting.
        assert env.reward_manager.episode_sums[k][0] == 0.0
    assert env.episode_return[0] == 0.0 and env.episode_return[1] != 0.0
    # final_obs holds the upside-down world; obs the fresh start (gravity z up vs down).
    assert extras['final_obs']['policy'].shape == obs['policy'].shape
    assert extras['final_obs']['policy'][0, 5] > 0.5 and obs['policy'][0, 5] < -0.99


def test_reset_clears_every_per_world_buffer(make_env):
    env = quiet_env(make_env, n=2)
    for _ in range(5):
        env.step(np.full((2, J), 0.3))
    env.feet_air_time[:] = 0.7
    flip(env, 1)
    env.step(np.full((2, J), 0.3))
    assert env.episode_step.tolist() == [6, 0]
    for name in ('actions', 'last_actions', 'last_joint_vel'):
        assert (getattr(env, name)[1] == 0).all(), name
        assert (getattr(env, name)[0] != 0).any(), name
    assert (env.feet_air_time[1] == 0).all()
    assert not env.last_contacts[1].any() and not env.foot_contact[1].any()
    np.testing.assert_allclose(env.targets[1], env.robot.default_joint_pos)
    assert 0.0 <= env.gait_phase[1] < 1.0


def test_tracking_error_is_the_mean_absolute_body_frame_error(make_env):
    env = quiet_env(make_env, n=2)
    s = R.StepData(base_quat=None, base_ang_vel=np.full((2, 3), np.nan),
                   trunk_ang_vel=np.array([[0, 0, 0.5], [0, 0, -1.0]]),
                   joint_pos=None, joint_vel=None, last_action=None,
                   commands=np.array([[1.0, 0.0, 0.0], [0.0, 0.5, 1.0]]),
                   base_lin_vel=np.array([[0.5, 0.2, 9.0], [0.1, 0.1, 9.0]]))
    err = env._tracking_error(s)
    assert err == pytest.approx({'lin_vel_x': (0.5 + 0.1) / 2, 'lin_vel_y': (0.2 + 0.4) / 2,
                                 'ang_vel_yaw': (0.5 + 2.0) / 2})


def test_command_sampling_zeroes_slow_planar_commands_and_stands(make_env):
    env = quiet_env(make_env, n=200, commands={'min_speed': 0.3, 'standing_probability': 0.25,
                                               'lin_vel_x': [-0.5, 0.5],
                                               'lin_vel_y': [-0.5, 0.5],
                                               'ang_vel_yaw': [0.5, 1.0]})
    c = env.commands
    speed = np.linalg.norm(c[:, :2], axis=1)
    # Planar commands are either 0 or at least min_speed; the yaw rate survives that.
    assert ((speed == 0) | (speed >= 0.3)).all()
    slow = (speed == 0) & (c[:, 2] != 0)
    assert slow.sum() > 25 and (np.abs(c[slow, 2]) >= 0.5).all()
    standing = (c == 0).all(axis=1)
    assert 30 < standing.sum() < 70         # about 25 % of 200
    assert (c[:, 0] >= -0.5).all() and (c[:, 0] <= 0.5).all()


def test_rewards_of_a_step_use_the_configured_scales_times_dt(make_env):
    env = quiet_env(make_env, n=2, rewards={'scales': {'termination': -50.0},
                                            'only_positive': False})
    env.step(np.zeros((2, J)))
    flip(env, 1)
    _, reward, terminated, _, _ = env.step(np.zeros((2, J)))
    assert terminated.tolist() == [False, True]
    # The failed world pays termination * dt on top of the other terms.
    manager = env.reward_manager
    assert manager.scales['termination'] == pytest.approx(-50.0 * env.control_dt)
    assert reward[1] < reward[0] - 0.9


# ----------------------------------------------------------------------------- reward terms
def step_data(n=2):
    return R.StepData(
        base_quat=np.tile([1.0, 0, 0, 0], (n, 1)), base_ang_vel=np.full((n, 3), np.nan),
        trunk_ang_vel=np.zeros((n, 3)),
        joint_pos=np.zeros((n, 4)), joint_vel=np.zeros((n, 4)),
        commands=np.array([[0.6, 0.0, 0.0], [0.0, 0.0, 0.0]]), last_action=np.zeros((n, 4)),
        base_lin_vel=np.zeros((n, 3)), base_height=np.array([0.3, 0.1]),
        projected_gravity=np.tile([0.0, 0.0, -1.0], (n, 1)), joint_acc=np.zeros((n, 4)),
        joint_torque=np.zeros((n, 4)), previous_action=np.zeros((n, 4)),
        foot_air_time=np.zeros((n, 2)), first_contact=np.zeros((n, 2), bool),
        penalised_contact=np.zeros((n, 3), bool), terminated=np.array([False, False]),
        foot_contact=np.zeros((n, 2)), desired_stance=np.ones((n, 2), bool),
        foot_height=np.zeros((n, 2)))


def rparams(**kw):
    base = dict(tracking_sigma=0.5, base_height_target=0.2, feet_air_time_target=0.25,
                moving_command_threshold=0.2, default_joint_pos=np.array([0.1, -0.1, 0.2, 0.0]),
                soft_joint_lower=np.array([-1.0, -1.0, -1.0, -1.0]),
                soft_joint_upper=np.array([1.0, 1.0, 0.5, 1.0]), swing_height_target=0.1)
    base.update(kw)
    return R.RewardParams(**base)


def test_tracking_kernels_use_sigma_and_the_planar_or_yaw_parts_only():
    s, p = step_data(), rparams()
    s.base_lin_vel[:] = [[0.2, 0.3, 5.0], [0.0, 0.0, -5.0]]
    s.trunk_ang_vel[:] = [[7.0, 7.0, 0.4], [0.0, 0.0, 0.0]]
    s.commands[1] = [0.0, 0.0, -0.6]
    # (0.6 - 0.2)^2 + 0.3^2 = 0.25 -> exp(-0.25 / 0.5); world 1 tracks zero planar velocity.
    np.testing.assert_allclose(R.tracking_lin_vel(s, p), [math.exp(-0.5), 1.0])
    np.testing.assert_allclose(R.tracking_ang_vel(s, p), [math.exp(-0.16 / 0.5),
                                                          math.exp(-0.36 / 0.5)])


def test_pose_and_limit_terms_by_hand():
    s, p = step_data(), rparams()
    np.testing.assert_allclose(R.base_height(s, p), [0.01, 0.01])
    s.joint_pos[0] = [-1.5, 0.0, 0.8, 1.25]     # 0.5 below, 0.3 and 0.25 above
    np.testing.assert_allclose(R.dof_pos_limits(s, p), [1.05, 0.0])
    s.joint_acc[1] = [1.0, -2.0, 0.0, 0.0]
    s.joint_vel[1] = [0.0, 3.0, 0.0, 0.0]
    np.testing.assert_allclose(R.dof_acc(s, p), [0.0, 5.0])
    np.testing.assert_allclose(R.dof_vel(s, p), [0.0, 9.0])
    s.last_action[0] = [1.0, 0.0, 0.0, 0.0]
    s.previous_action[0] = [0.5, 0.0, -2.0, 0.0]
    np.testing.assert_allclose(R.action_rate(s, p), [4.25, 0.0])


def test_stand_still_and_air_time_switch_on_the_moving_command():
    s, p = step_data(), rparams()
    s.joint_pos[:] = [0.3, -0.1, 0.2, 0.5]       # |q - q0| = 0.2 + 0 + 0 + 0.5
    s.foot_air_time[:] = [[0.45, 0.05], [0.45, 0.05]]
    s.first_contact[:] = [[True, True], [True, False]]
    # World 0 walks: air time counts ((0.2) + (-0.2)), stand_still does not; world 1 stands.
    np.testing.assert_allclose(R.stand_still(s, p), [0.0, 0.7])
    np.testing.assert_allclose(R.feet_air_time(s, p), [0.0, 0.0], atol=1e-12)
    s.first_contact[0, 1] = False
    np.testing.assert_allclose(R.feet_air_time(s, p), [0.2, 0.0])
    # The threshold is strict: a command exactly at it is standing.
    s.commands[0] = [0.2, 0.0, 0.0]
    np.testing.assert_allclose(R.stand_still(s, p), [0.7, 0.7])
    s.commands[0] = [0.0, 0.0, -0.25]
    np.testing.assert_allclose(R.stand_still(s, p), [0.0, 0.7])


def test_is_moving_combines_planar_speed_and_yaw_rate():
    c = np.array([[0.12, 0.16, 0.0], [0.1, 0.1, 0.0], [0.0, 0.0, -0.3], [0.0, 0.0, 0.2],
                  [0.0, 0.0, 0.0], [0.12, 0.0, 0.15]])
    assert R.is_moving(c, 0.19).tolist() == [True, False, True, True, False, False]
    assert R.is_moving(c, 0.2).tolist() == [False, False, True, False, False, False]


def test_gait_terms_clip_the_lift_and_count_only_swing_feet():
    s, p = step_data(), rparams()
    s.desired_stance[:] = [[False, False], [True, False]]
    s.foot_height[:] = [[0.25, -0.05], [0.3, 0.04]]
    s.foot_contact[:] = [[1.0, 0.0], [0.6, 0.5]]
    # World 0: both swing, lifts clipped to 1 and 0; world 1: one swing foot at 0.4.
    np.testing.assert_allclose(R.feet_clearance(s, p), [0.5, 0.4])
    # Contact > 0.5 is "down" (0.5 is not): world 0 matches on foot 1 only; world 1 on both.
    np.testing.assert_allclose(R.gait_contact(s, p), [0.5, 1.0])


def test_feet_slip_counts_planar_speed_of_feet_on_the_ground_and_energy_the_power():
    s, p = step_data(), rparams()
    s.foot_contact[:] = [[1.0, 0.0], [0.4, 1.0]]
    s.foot_velocity = np.array([[[0.3, 0.4, 5.0], [2.0, 0.0, 0.0]],
                                [[1.0, 1.0, 0.0], [0.0, -0.1, -3.0]]])
    # World 0: foot 0 down at 0.5 m/s planar (its vertical 5 m/s is no slip); world 1: foot 1.
    np.testing.assert_allclose(R.feet_slip(s, p), [0.25, 0.01])
    s.joint_power = np.array([3.0, 7.5])
    np.testing.assert_allclose(R.energy(s, p), [3.0, 7.5])


def test_env_feet_slip_and_energy_read_the_physics(make_env):
    env = make_env(num_envs=2, rewards={'scales': {'feet_slip': -1.0, 'energy': -1e-3}},
                   randomization={'enabled': False})
    env.reset(seed=0)
    for _ in range(5):
        _, _, _, _, extras = env.step(np.ones((2, 12)))
    p = env.physics
    captured = {}
    original = env.reward_manager.compute

    def spy(data):
        captured['data'] = data
        return original(data)
    env.reward_manager.compute = spy
    env.step(-np.ones((2, 12)))
    data = captured['data']
    lo, hi = p.sensors.joint_torque
    power = np.abs(p.sensordata[:, :, lo:hi] * p.substep_readings()[1]).sum(2).mean(1)
    np.testing.assert_allclose(data.joint_power, power)
    assert (data.joint_power > 0).all()
    lo, hi = p.sensors.foot_pos
    feet = p.sensordata[:, :, lo:hi].reshape(2, 4, -1, 3)
    np.testing.assert_allclose(data.foot_velocity, (feet[:, -1] - feet[:, -2]) / 0.005)


def test_reward_manager_without_clip_sums_every_term_and_accumulates_episodes():
    s, p = step_data(), rparams()
    s.terminated[:] = [True, False]
    s.penalised_contact[0] = [True, True, False]
    manager = R.RewardManager({'collision': -1.0, 'termination': -10.0, 'base_height': 0.0,
                               'tracking_lin_vel': 2.0}, p, control_dt=0.1, num_envs=2,
                              only_positive=False)
    assert set(manager.scales) == {'collision', 'termination', 'tracking_lin_vel'}
    total, terms = manager.compute(s)
    lin = np.exp(-np.array([0.36, 0.0]) / 0.5) * 0.2
    np.testing.assert_allclose(terms['collision'], [-0.2, 0.0])
    np.testing.assert_allclose(terms['termination'], [-1.0, 0.0])
    np.testing.assert_allclose(total, lin + [-0.2 - 1.0, 0.0])
    manager.compute(s)
    np.testing.assert_allclose(manager.episode_sums['termination'], [-2.0, 0.0])
    popped = manager.pop_episode_sums(np.array([1]))
    np.testing.assert_allclose(popped['tracking_lin_vel'], [2 * lin[1]])
    np.testing.assert_allclose(manager.episode_sums['tracking_lin_vel'], [2 * lin[0], 0.0])
    with pytest.raises(ValueError, match="unknown reward term 'fly'; available: "
                                         'tracking_lin_vel, tracking_ang_vel, lin_vel_z'):
        R.RewardManager({'fly': 1.0, 'collision': 1.0}, p, 0.1, 2, False)


def test_clipped_total_adds_termination_after_the_clip():
    s, p = step_data(), rparams()
    s.terminated[:] = [True, True]
    s.penalised_contact[:, 0] = True
    manager = R.RewardManager({'collision': -30.0, 'termination': -1.0,
                               'tracking_lin_vel': 1.0}, p, control_dt=0.1, num_envs=2,
                              only_positive=True)
    total, _ = manager.compute(s)
    # The positive part is outweighed by the collision: clipped to 0, then -0.1 added.
    np.testing.assert_allclose(total, [-0.1, -0.1])
    manager = R.RewardManager({'collision': -30.0, 'tracking_lin_vel': 1.0}, p, control_dt=0.1,
                              num_envs=2, only_positive=True)
    np.testing.assert_allclose(manager.compute(s)[0], [0.0, 0.0])


# ------------------------------------------------------------------------ observation layout
def robot_state(n=2, j=3):
    return RobotState(
        base_quat=np.tile([1.0, 0.0, 0.0, 0.0], (n, 1)),
        base_ang_vel=np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]),
        joint_pos=np.array([[0.5, 0.6, 0.7], [0.1, 0.2, 0.3]]),
        joint_vel=np.array([[7.0, 8.0, 9.0], [1.0, 1.0, 1.0]]),
        commands=np.array([[0.4, -0.2, 0.3], [0.0, 0.0, 1.0]]),
        last_action=np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]),
        base_lin_vel=np.array([[0.9, 0.8, 0.7], [0.0, 0.0, 0.0]]),
        base_height=np.array([0.25, 0.3]), foot_contact=np.array([[1.0, 0.0], [0.0, 1.0]]),
        friction=np.array([0.8, 1.1]), added_mass=np.array([1.0, 2.0]),
        com_offset=np.zeros((n, 3)), motor_strength=np.array([0.9, 1.1]),
        gait_phase=np.array([0.25, 0.5]))


def test_policy_layout_order_sizes_and_scales():
    q0 = np.array([0.5, 0.5, 0.5])
    layout = ObservationLayout([('velocity_commands', [2.0, 2.0, 0.25]), ('joint_pos', 1.0),
                                ('base_ang_vel', 0.25), ('joint_vel', 0.05),
                                ('gait_phase', 1.0), ('last_action', 3.0)],
                               num_joints=3, num_feet=2, group='policy')
    assert layout.names == ['velocity_commands', 'joint_pos', 'base_ang_vel', 'joint_vel',
                            'gait_phase', 'last_action']
    assert layout.dim == 3 + 3 + 3 + 3 + 2 + 3
    assert [(s.start, s.size) for s in layout.slices] == \
        [(0, 3), (3, 3), (6, 3), (9, 3), (12, 2), (14, 3)]
    obs = layout.compute(robot_state(), q0)
    assert obs.dtype == np.float32 and obs.shape == (2, 17)
    np.testing.assert_allclose(obs[0], [0.8, -0.4, 0.075, 0.0, 0.1, 0.2, 0.25, 0.5, 0.75,
                                        0.35, 0.4, 0.45, 1.0, 0.0, 0.3, 0.6, 0.9], atol=1e-6)
    np.testing.assert_allclose(obs[1, 12:14], [0.0, -1.0], atol=1e-6)
    np.testing.assert_allclose(layout.scale, [2, 2, 0.25, 1, 1, 1, 0.25, 0.25, 0.25, 0.05,
                                              0.05, 0.05, 1, 1, 3, 3, 3])
    meta = layout.to_metadata()
    assert meta[0] == {'name': 'velocity_commands', 'size': 3, 'scale': [2.0, 2.0, 0.25]}
    assert [m['name'] for m in meta] == layout.names and meta[-1]['scale'] == [3.0] * 3
    assert all(type(v) is float for m in meta for v in m['scale'])


def test_privileged_layout_and_term_vector():
    layout = ObservationLayout([('base_height', 2.0), ('foot_contact', 1.0),
                                ('motor_strength', 1.0), ('projected_gravity', 1.0)],
                               num_joints=3, num_feet=2, group='privileged')
    obs = layout.compute(robot_state(), np.zeros(3))
    np.testing.assert_allclose(obs, [[0.5, 1.0, 0.0, 0.9, 0.0, 0.0, -1.0],
                                     [0.6, 0.0, 1.0, 1.1, 0.0, 0.0, -1.0]], atol=1e-6)
    vec = layout.term_vector({'foot_contact': 0.5, 'projected_gravity': 2.0, 'other': 9.0})
    assert vec.dtype == np.float32
    assert vec.tolist() == [0.0, 0.5, 0.5, 0.0, 2.0, 2.0, 2.0]
    assert layout.group == 'privileged'
    empty = ObservationLayout([], 3, 2, 'privileged')
    assert empty.dim == 0 and empty.scale.shape == (0,) and empty.term_vector({}).shape == (0,)
    assert empty.scale.dtype == np.float32 and empty.names == []


def test_layout_errors_name_group_term_and_fix():
    with pytest.raises(ValueError, match="observation group 'policy': unknown term 'gps'; "
                                         'available: base_ang_vel, projected_gravity'):
        ObservationLayout([('gps', 1.0)], 3, 2, 'policy')
    with pytest.raises(ValueError, match=r"observation group policy: term 'base_lin_vel' is "
                                         r'simulation-only; move it to the privileged group '
                                         r'\(the student must run on the real robot\)'):
        ObservationLayout([('base_lin_vel', 1.0)], 3, 2, 'policy')
    with pytest.raises(ValueError, match=r"observation group 'privileged': term 'com_offset' "
                                         r'has 3 values but 2 scales; give one scale or 3'):
        ObservationLayout([('com_offset', [1.0, 2.0])], 3, 2, 'privileged')
    # A privileged term is fine in the privileged group.
    assert ObservationLayout([('base_lin_vel', 1.0)], 3, 2, 'privileged').dim == 3


# ------------------------------------------------------------------ construction and state
def test_constructor_derives_rates_limits_and_noise_from_the_config(make_env, robot):
    env = make_env(num_envs=2, commands={'resample_time_s': 0.05},
                   randomization={'push_interval_s': 0.09},
                   rewards={'soft_joint_limit': 0.5, 'tracking_sigma': 0.3,
                            'base_height_target': 0.2, 'feet_air_time_target': 0.4,
                            'moving_command_threshold': 0.15, 'swing_height_target': 0.07},
                   noise={'scale': 2.0, 'levels': {'joint_vel': 1.0, 'base_ang_vel': 0.0,
                                                   'projected_gravity': 0.0, 'joint_pos': 0.0}})
    assert env._resample_steps == 2 and env._push_steps == 4      # rounded to control steps
    assert make_env(num_envs=1, commands={'resample_time_s': 0.001})._resample_steps == 1
    p = env.reward_manager.params
    assert (p.tracking_sigma, p.base_height_target, p.feet_air_time_target,
            p.moving_command_threshold, p.swing_height_target) == (0.3, 0.2, 0.4, 0.15, 0.07)
    lo, hi = robot.joint_lower, robot.joint_upper
    # Soft limits: the middle half of each joint's range.
    np.testing.assert_allclose(p.soft_joint_lower, 0.75 * lo + 0.25 * hi)
    np.testing.assert_allclose(p.soft_joint_upper, 0.25 * lo + 0.75 * hi)
    np.testing.assert_array_equal(p.default_joint_pos, robot.default_joint_pos)
    assert env.reward_manager.only_positive is True
    # Noise amplitude per element: level x term scale x global scale (joint_vel scale 0.05).
    vel = next(s for s in robot.policy_obs.slices if s.name == 'joint_vel')
    expected = np.zeros(robot.policy_obs.dim, np.float32)
    expected[vel.start:vel.start + vel.size] = 1.0 * 0.05 * 2.0
    np.testing.assert_allclose(env.noise_vec, expected)
    assert make_env(num_envs=1, noise={'enabled': False}).noise_vec is None
    assert env.obs_dims == {'policy': 47, 'policy_noise_free': 47,
                            'privileged': robot.privileged_obs.dim}
    assert (env.num_envs, env.num_actions, env.num_feet, env.control_dt) == (2, 12, 4, 0.02)


def test_latency_over_a_control_period_is_simulated_and_its_bound_refused(make_env):
    with pytest.raises(ConfigError, match=r'randomization.action_latency_substeps'):
        make_env(num_envs=1, randomization={'action_latency_substeps': [0, 101]})
    env = make_env(num_envs=1, randomization={'action_latency_substeps': [9, 9]})
    assert env.physics.max_delay_steps == 9 and env.physics.delayed_targets.shape[0] == 4


def test_state_round_trip_continues_bit_for_bit(make_env):
    a = make_env(num_envs=3, seed=4)
    a.reset()
    rng = np.random.default_rng(0)
    for _ in range(7):
        a.step(rng.normal(0, 0.5, (3, J)))
    state = a.get_state()
    actions = rng.normal(0, 0.5, (30, 3, J))
    ref = [a.step(act) for act in actions]
    b = make_env(num_envs=3, seed=99)
    b.reset()
    b.step(np.ones((3, J)))
    b.set_state(state)
    assert b.diverged_count == state['diverged_count']
    for k in b._BUFFERS:
        np.testing.assert_array_equal(getattr(b, k), state['buffers'][k])
    for (obs_a, r_a, te_a, tr_a, _), act in zip(ref, actions):
        obs_b, r_b, te_b, tr_b, _ = b.step(act)
        for g in obs_a:
            np.testing.assert_array_equal(obs_a[g], obs_b[g])
        np.testing.assert_array_equal(r_a, r_b)
        assert (te_a == te_b).all() and (tr_a == tr_b).all()
    for k, v in a.reward_manager.episode_sums.items():
        np.testing.assert_array_equal(v, b.reward_manager.episode_sums[k])
    # The state is a copy: stepping on does not change what was saved.
    assert not np.array_equal(state['physics'], a.physics.state)
    for i in range(3):
        assert b.physics.models[i].geom_friction[b.physics.floor_geom, 0] == \
            pytest.approx(a.friction[i])
    with pytest.raises(ValueError, match=r'saved env state has shape \(3, \d+\), this env '
                                         r'\(2, \d+\): num_envs or robot differ'):
        make_env(num_envs=2).set_state(state)


def test_seed_restarts_the_random_stream(make_env):
    env = make_env(num_envs=4)
    first, _ = env.reset(seed=11)
    cmds = env.commands.copy()
    env.step(np.zeros((4, J)))
    env.seed(11)
    again, _ = env.reset()
    np.testing.assert_array_equal(env.commands, cmds)
    np.testing.assert_array_equal(first['policy'], again['policy'])


def test_body_velocity_is_body_frame_planar_velocity_and_yaw_rate(make_env):
    env = quiet_env(make_env, n=2)
    p = env.physics
    # World 0 faces +y (yaw 90 deg) and moves along world +y: forward in its body frame.
    p.qpos[0, 3:7] = [math.cos(math.pi / 4), 0.0, 0.0, math.sin(math.pi / 4)]
    p.qvel[0, 0:6] = [0.0, 1.5, 0.2, 0.1, 0.2, 0.7]
    p.qpos[1, 3:7] = [1.0, 0.0, 0.0, 0.0]
    p.qvel[1, 0:6] = [0.3, -0.4, 0.0, 0.0, 0.0, -0.2]
    np.testing.assert_allclose(env.body_velocity(), [[1.5, 0.0, 0.7], [0.3, -0.4, -0.2]],
                               atol=1e-12)


def test_push_adds_a_uniform_planar_kick_to_the_chosen_worlds_only(make_env):
    env = quiet_env(make_env, n=4, randomization={'enabled': False, 'push_velocity': 0.8})
    p = env.physics
    p.qvel[:, 0:6] = [0.1, -0.2, 0.05, 0.0, 0.0, 0.3]
    before = p.qvel.copy()
    twin = np.random.default_rng()
    twin.bit_generator.state = env.rng.bit_generator.state
    env._push(np.array([1, 3]))
    kick = twin.uniform(-0.8, 0.8, (2, 2))
    np.testing.assert_array_equal(p.qvel[[1, 3], 0:2], before[[1, 3], 0:2] + kick)
    np.testing.assert_array_equal(np.delete(p.qvel, [1, 3], axis=0),
                                  np.delete(before, [1, 3], axis=0))
    np.testing.assert_array_equal(p.qvel[:, 2:], before[:, 2:])
    # One world is pushed too; none is a no-op that draws nothing.
    env._push(np.array([2]))
    assert (p.qvel[2, 0:2] != before[2, 0:2]).all()
    state = env.rng.bit_generator.state
    env._push(np.array([], dtype=np.int64))
    assert env.rng.bit_generator.state == state


def test_pushes_over_many_worlds_fill_the_configured_range(make_env):
    env = quiet_env(make_env, n=1)
    kicks = []
    for _ in range(300):
        env.physics.qvel[:] = 0.0
        env._push(np.array([0]))
        kicks.append(env.physics.qvel[0, 0:2].copy())
    kicks = np.array(kicks)
    v = env.cfg.randomization.push_velocity
    assert (np.abs(kicks) <= v).all() and kicks.min() < -0.8 * v and kicks.max() > 0.8 * v


def test_actions_are_clipped_both_ways_and_a_diverged_world_gets_a_finite_placeholder(
        make_env):
    env = quiet_env(make_env, n=3, clip_actions=0.5)
    actions = np.zeros((3, J))
    actions[0, :2] = [2.0, -3.0]
    actions[1, 0] = np.inf
    _, reward, terminated, _, extras = env.step(actions)
    assert env.last_actions[0, :2].tolist() == [0.5, -0.5]
    np.testing.assert_allclose(env.targets[0, :2],
                               np.clip(env.robot.default_joint_pos[:2]
                                       + env.robot.action_scale * np.array([0.5, -0.5]),
                                       env.robot.joint_lower[:2], env.robot.joint_upper[:2]))
    # World 1 sent a non-finite action: a divergence, zero reward, finite final observation.
    assert terminated.tolist() == [False, True, False] and reward[1] == 0.0
    assert extras['diverged'] == 1 and env.diverged_count == 1
    for group in extras['final_obs'].values():
        assert np.isfinite(group).all()
    env.physics.qvel[2, 7] = np.nan
    env.step(np.zeros((3, J)))
    assert env.diverged_count == 2


def test_gait_clock_wraps_and_tracking_error_is_reported_per_axis(make_env):
    env = quiet_env(make_env, n=2, commands={'standing_probability': 0.0,
                                             'lin_vel_x': [0.3, 0.6]})
    env.gait_phase[:] = [0.99, 0.5]
    _, _, _, _, extras = env.step(np.zeros((2, J)))
    # 0.02 s of a 0.4 s cycle: +0.05, modulo one cycle.
    np.testing.assert_allclose(env.gait_phase, [0.04, 0.55], atol=1e-12)
    err = np.abs(env.commands - env.body_velocity()).mean(axis=0)
    assert extras['tracking_error'] == pytest.approx(
        {'lin_vel_x': err[0], 'lin_vel_y': err[1], 'ang_vel_yaw': err[2]})
    assert extras['diverged'] == 0 and 'final_obs' not in extras


def test_a_robot_without_gait_clock_steps_with_a_still_phase(make_env, robot):
    import dataclasses
    from claw_rl_ros.core.config import from_dict, merge
    from claw_rl_ros.core.sim.env import VecLocomotionEnv
    from claw_rl_ros.core.sim.env_config import EnvConfig
    cfg = from_dict(EnvConfig, merge({'num_envs': 2, 'randomization': {'enabled': False}},
                                     {'rewards': {'scales': {'gait_contact': 0.0,
                                                             'feet_clearance': 0.0}}}))
    env = VecLocomotionEnv(cfg, dataclasses.replace(robot, gait_period=0.0))
    try:
        env.reset(seed=0)
        assert (env.gait_phase == 0.0).all()
        for _ in range(3):
            env.step(np.zeros((2, J)))
        assert (env.gait_phase == 0.0).all()
        assert env._desired_stance(np.ones((2, 3))).all()
    finally:
        env.close()


# ------------------------------------------------------- step data from crafted sensor readings
def blank_sensors(env):
    """A copy of the sensor buffer [N, substeps, n] with every contact and torque at 0."""
    sd = env.physics.sensordata.copy()
    s = env.physics.sensors
    for group in ('foot_contact', 'penalised_contact', 'termination_contact', 'joint_torque'):
        sd[:, :, slice(*getattr(s, group))] = 0.0
    return sd


def contact(env, sd, group, world, body, substeps, found, force):
    """Write one body's [found, fx, fy, fz] contact reading into the given substeps."""
    lo, _ = getattr(env.physics.sensors, group)
    sd[world, substeps, lo + 4 * body:lo + 4 * body + 4] = [found, *force]


def test_contacts_need_the_found_flag_and_more_than_the_force_threshold(make_env):
    env = quiet_env(make_env, n=2)
    sd = blank_sensors(env)
    last = env.physics.decimation - 1
    contact(env, sd, 'foot_contact', 0, 0, last, 1.0, (0.0, 0.0, 2.0))   # touching
    contact(env, sd, 'foot_contact', 0, 1, last, 1.0, (0.0, 0.0, 1.0))   # at the threshold
    contact(env, sd, 'foot_contact', 0, 2, last, 1.0, (3.0, 0.0, 0.0))   # sideways force
    contact(env, sd, 'foot_contact', 0, 3, last, 0.0, (0.0, 0.0, 5.0))   # no contact found
    contact(env, sd, 'foot_contact', 1, 0, 0, 1.0, (0.0, 0.0, 5.0))      # early substep only
    contact(env, sd, 'foot_contact', 1, 1, last - 1, 1.0, (0.0, 0.0, 5.0))  # one before last
    contact(env, sd, 'foot_contact', 1, 3, slice(None), 1.0, (0.0, 2.0, 0.0))
    feet, penalised, termination = env._contacts(sd)
    assert feet.tolist() == [[True, False, True, False], [False, False, False, True]]
    assert not penalised.any() and not termination.any()
    # Penalised and termination bodies count a contact at any substep, by the same test.
    sd = blank_sensors(env)
    contact(env, sd, 'penalised_contact', 1, 0, 0, 1.0, (0.0, 0.0, 5.0))         # early substep
    contact(env, sd, 'penalised_contact', 1, 1, last - 1, 1.0, (0.0, 0.0, 1.0))  # threshold
    contact(env, sd, 'penalised_contact', 1, 2, last, 1.0, (0.0, 1.5, 0.0))
    contact(env, sd, 'termination_contact', 0, 0, 1, 1.0, (0.0, 3.0, 0.0))
    contact(env, sd, 'termination_contact', 1, 0, 1, 0.0, (0.0, 3.0, 0.0))       # not found
    feet, penalised, termination = env._contacts(sd)
    assert not feet.any() and not penalised[0].any()
    assert penalised[1].tolist()[:4] == [True, False, True, False]
    assert termination[:, 0].tolist() == [True, False] and not termination[:, 1:].any()


def test_step_data_reads_contacts_torques_heights_and_failures_from_the_sensors(make_env):
    env = quiet_env(make_env, n=2)
    env.step(np.zeros((2, J)))
    s = env.physics.sensors
    sd = blank_sensors(env)
    last = env.physics.decimation - 1
    # Joint torque: the RMS over the control step's substeps (1, -1, 3, -3 -> sqrt(5)).
    lo, hi = s.joint_torque
    sd[0, :, lo] = [1.0, -1.0, 3.0, -3.0]
    # Foot heights: from the last substep.
    lo, hi = s.foot_pos
    sd[:, :, lo + 2:hi:3] = 0.5
    sd[0, last, lo + 2:hi:3] = env.physics.foot_ground_offset + [0.1, 0.0, 0.2, 0.0]
    # World 1: a trunk contact in the first substep only fails the episode.
    contact(env, sd, 'termination_contact', 1, 0, 0, 1.0, (0.0, 0.0, 9.0))
    contact(env, sd, 'penalised_contact', 0, 2, 1, 1.0, (0.0, 0.0, 9.0))
    # Feet: world 0 foot 1 touches in the last substep, world 1 foot 0 only before it.
    contact(env, sd, 'foot_contact', 0, 1, last, 1.0, (0.0, 0.0, 9.0))
    contact(env, sd, 'foot_contact', 1, 0, 0, 1.0, (0.0, 0.0, 9.0))
    env.last_joint_vel[:] = 0.5
    data = env._step_data(sd, np.zeros(2, bool))
    np.testing.assert_allclose(data.joint_acc, (data.joint_vel - 0.5) / env.control_dt)
    assert data.foot_contact.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0] * 4]
    assert data.joint_torque[0, 0] == pytest.approx(math.sqrt(5.0))
    assert data.joint_torque[1].tolist() == [0.0] * J
    np.testing.assert_allclose(data.foot_height[0], [0.1, 0.0, 0.2, 0.0], atol=1e-12)
    assert data.terminated.tolist() == [False, True]
    assert data.penalised_contact[0].tolist() == [False, False, True] + [False] * 5
    assert not data.penalised_contact[1].any()
    assert data.foot_contact.dtype == np.float64
    np.testing.assert_array_equal(data.trunk_ang_vel, env.physics.qvel[:, 3:6])


def test_feet_air_time_counts_swings_and_reports_the_touchdown(make_env):
    """legged_gym bookkeeping: a foot that touched in this or the last step is "in contact";
    air time accumulates while it is not, and is reported on the touchdown step."""
    env = quiet_env(make_env, n=1)
    env.feet_air_time[:] = 0.0
    env.last_contacts[:] = False
    last = env.physics.decimation - 1
    dt = env.control_dt
    # Foot 0 swings for two steps and lands on the third; foot 1 lifts after step 1.
    pattern = [[False, True, True, True], [False, False, True, True],
               [True, False, True, True], [True, False, True, True]]
    seen = []
    for down in pattern:
        sd = blank_sensors(env)
        for foot, touching in enumerate(down):
            if touching:
                contact(env, sd, 'foot_contact', 0, foot, last, 1.0, (0.0, 0.0, 10.0))
        data = env._step_data(sd, np.zeros(1, bool))
        seen.append((data.foot_air_time[0, :2].tolist(), data.first_contact[0, :2].tolist(),
                     data.foot_contact[0, :2].tolist()))
    assert seen[0] == ([dt, dt], [False, False], [0.0, 1.0])
    assert seen[1] == ([2 * dt, dt], [False, False], [0.0, 0.0])   # foot 1: filtered contact
    assert seen[2][1] == [True, False] and seen[2][0] == pytest.approx([3 * dt, dt])
    assert seen[3][1] == [False, False] and seen[3][0] == pytest.approx([dt, 2 * dt])
    assert env.feet_air_time[0, 0] == 0.0 and env.feet_air_time[0, 1] == pytest.approx(2 * dt)


def test_desired_stance_follows_each_foot_offset_and_the_duty(robot):
    import dataclasses
    from claw_rl_ros.core.config import from_dict
    from claw_rl_ros.core.sim.env import VecLocomotionEnv
    from claw_rl_ros.core.sim.env_config import EnvConfig
    walk = dataclasses.replace(robot, gait_offsets=np.array([0.0, 0.25, 0.5, 0.75]),
                               gait_duty=0.6)
    env = VecLocomotionEnv(from_dict(EnvConfig, {'num_envs': 3}), walk)
    try:
        env.gait_phase[:] = [0.1, 0.75, 0.75]
        moving = np.array([[0.5, 0.0, 0.0], [0.0, 0.0, 0.5], [0.0, 0.0, 0.0]])
        # Foot phases (phase + offset) mod 1 below the duty are stance:
        # 0.1 -> 0.1, 0.35, 0.6, 0.85; 0.75 -> 0.75, 0.0, 0.25, 0.5; standing: all down.
        assert env._desired_stance(moving).tolist() == [[True, True, False, False],
                                                        [False, True, True, True],
                                                        [True, True, True, True]]
    finally:
        env.close()


# ------------------------------------------------------------ resets, commands, noise
def twin(env):
    """A generator in the same state as the env's: it replays the env's next draws."""
    g = np.random.default_rng()
    g.bit_generator.state = env.rng.bit_generator.state
    return g


def test_command_resampling_replays_the_documented_draws(make_env):
    env = quiet_env(make_env, n=5, commands={'lin_vel_x': [-1.0, 1.0], 'lin_vel_y': [-0.4, 0.4],
                                             'ang_vel_yaw': [-2.0, 2.0], 'min_speed': 0.5,
                                             'standing_probability': 0.4})
    ids = np.array([0, 2, 3, 4])
    before = env.commands.copy()
    g = twin(env)
    env._resample_commands(ids)
    # vx, vy, yaw rate; slow planar commands become 0; some commands are all zero.
    cmd = np.stack([g.uniform(-1.0, 1.0, 4), g.uniform(-0.4, 0.4, 4), g.uniform(-2.0, 2.0, 4)],
                   axis=1)
    cmd[np.linalg.norm(cmd[:, :2], axis=1) < 0.5, :2] = 0.0
    cmd[g.random(4) < 0.4] = 0.0
    np.testing.assert_array_equal(env.commands[ids], cmd)
    np.testing.assert_array_equal(env.commands[1], before[1])
    state = env.rng.bit_generator.state
    env._resample_commands(np.array([], dtype=np.int64))
    assert env.rng.bit_generator.state == state
    env._resample_commands(np.array([1]))
    assert env.rng.bit_generator.state != state


def test_randomisation_replays_the_documented_draws_and_reaches_the_models(make_env):
    dr = {'friction': [0.5, 0.9], 'added_mass': [-0.5, 1.5], 'link_mass_scale': [0.9, 1.1],
          'com_offset': [-0.02, 0.03], 'motor_strength': [0.8, 1.2],
          'action_latency_substeps': [1, 3]}
    env = make_env(num_envs=6, randomization=dr)
    ids = np.array([1, 4, 5])
    g = twin(env)
    env._randomise(ids)
    np.testing.assert_array_equal(env.friction[ids], g.uniform(0.5, 0.9, 3))
    np.testing.assert_array_equal(env.added_mass[ids], g.uniform(-0.5, 1.5, 3))
    np.testing.assert_array_equal(env.mass_scale[ids], g.uniform(0.9, 1.1, 3))
    np.testing.assert_array_equal(env.com_offset[ids], g.uniform(-0.02, 0.03, (3, 3)))
    np.testing.assert_array_equal(env.motor_strength[ids], g.uniform(0.8, 1.2, 3))
    np.testing.assert_array_equal(env.latency[ids], g.integers(1, 4, 3))
    p = env.physics
    for i in ids:
        assert p.models[i].geom_friction[p.floor_geom, 0] == env.friction[i]
        assert p.models[i].body_mass[p.base_body] == pytest.approx(
            p.model.body_mass[p.base_body] * env.mass_scale[i] + env.added_mass[i])
    # Switched off: the nominal robot in every world.
    off = make_env(num_envs=2, randomization={'enabled': False})
    off.friction[:], off.added_mass[:], off.mass_scale[:] = 0.1, 3.0, 2.0
    off.com_offset[:], off.motor_strength[:], off.latency[:] = 0.5, 7.0, 2
    off._randomise(np.array([0, 1]))
    assert off.friction.tolist() == [off.robot.foot_friction] * 2
    assert off.added_mass.tolist() == [0.0, 0.0] and off.mass_scale.tolist() == [1.0, 1.0]
    assert (off.com_offset == 0).all() and off.motor_strength.tolist() == [1.0, 1.0]
    assert off.latency.tolist() == [0, 0]
    assert off.physics.models[1].body_mass[p.base_body] == \
        pytest.approx(p.model.body_mass[p.base_body])


def test_reset_pose_heading_and_velocity_noise(make_env, robot):
    env = make_env(num_envs=64, randomization={'init_joint_pos_noise': 0.2,
                                               'init_base_vel_noise': 0.4})
    env.reset(seed=2)
    p = env.physics
    q = p.qpos[:, p.qadr]
    offset = q - robot.default_joint_pos
    clipped = (q <= robot.joint_lower + 1e-9) | (q >= robot.joint_upper - 1e-9)
    # Joints: default +- noise, clipped to the limits, both signs drawn.
    assert (np.abs(offset[~clipped]) <= 0.2).all() and offset.min() < -0.15 \
        and offset.max() > 0.15
    assert (q >= robot.joint_lower).all() and (q <= robot.joint_upper).all()
    np.testing.assert_array_equal(env.targets, q)
    # Trunk: standing height, a pure random yaw, small random planar and angular velocity.
    np.testing.assert_allclose(p.qpos[:, 2], robot.init_base_height)
    quat = p.qpos[:, 3:7]
    np.testing.assert_allclose(quat[:, 1:3], 0.0, atol=1e-12)
    yaw = 2 * np.arctan2(quat[:, 3], quat[:, 0])
    yaw = (yaw + np.pi) % (2 * np.pi) - np.pi
    assert yaw.min() < -2.5 and yaw.max() > 2.5
    v = p.qvel[:, 0:6]
    assert (np.abs(v) <= 0.4).all() and v.min() < -0.3 and v.max() > 0.3
    assert (p.qvel[:, 6:] == 0).all()
    assert ((env.gait_phase >= 0) & (env.gait_phase < 1)).all() and np.ptp(env.gait_phase) > 0.5
    # Without randomisation: exactly the default pose at rest.
    quiet = quiet_env(make_env, n=3)
    qp = quiet.physics
    np.testing.assert_allclose(qp.qpos[:, qp.qadr], np.tile(robot.default_joint_pos, (3, 1)))
    assert (qp.qvel == 0).all()


def test_policy_noise_replays_the_documented_draw(make_env):
    env = make_env(num_envs=3, randomization={'enabled': False},
                   noise={'scale': 1.5, 'levels': {'joint_vel': 2.0, 'base_ang_vel': 0.4,
                                                   'projected_gravity': 0.0, 'joint_pos': 0.0}})
    env.reset(seed=1)
    state = env.robot_state()
    g = twin(env)
    obs = env._observe(state)
    clean = env.robot.policy_obs.compute(state, env.robot.default_joint_pos)
    # Uniform in [-1, 1] per element, times level x term scale x global scale.
    noise = (2.0 * g.random(clean.shape, dtype=np.float32) - 1.0) * env.noise_vec
    np.testing.assert_array_equal(obs['policy'], clean + noise)
    np.testing.assert_array_equal(obs['policy_noise_free'], clean)
    np.testing.assert_array_equal(obs['privileged'],
                                  env.robot.privileged_obs.compute(state,
                                                                   env.robot.default_joint_pos))
    assert obs['policy'].dtype == np.float32


def test_gait_rewards_without_a_gait_clock_are_switched_off_naming_the_fix(robot):
    import dataclasses
    from claw_rl_ros.core.sim.env import GaitRewardsOff, VecLocomotionEnv
    from claw_rl_ros.core.sim.env_config import EnvConfig
    with pytest.warns(GaitRewardsOff) as record:
        env = VecLocomotionEnv(EnvConfig(num_envs=1),
                               dataclasses.replace(robot, gait_period=0.0))
    env.close()
    assert str(record[0].message) == (
        "robot 'claw_quadruped' has no gait clock: reward terms gait_contact, feet_clearance "
        'are switched off (add gait: {period_s, duty, offsets} to the robot YAML to use them)')
    assert 'gait_contact' not in env.reward_manager.scales
    assert 'feet_clearance' not in env.reward_manager.scales
    assert 'stand_still' in env.reward_manager.scales


def test_robot_sized_constants_come_from_the_robot_unless_the_config_sets_them(make_env, robot):
    env = make_env(num_envs=1)
    p = env.reward_manager.params
    assert (p.base_height_target, p.swing_height_target) == (robot.base_height_target,
                                                             robot.swing_height)
    assert env.min_base_height == robot.min_base_height
    assert env.payload_range == robot.payload_range
    assert env.com_offset_range == robot.com_offset_range
    set_all = make_env(num_envs=1, termination={'min_base_height': 0.123},
                       randomization={'added_mass': [0.1, 0.2], 'com_offset': [-0.01, 0.02]},
                       rewards={'base_height_target': 0.31, 'swing_height_target': 0.09})
    p = set_all.reward_manager.params
    assert (p.base_height_target, p.swing_height_target) == (0.31, 0.09)
    assert set_all.min_base_height == 0.123
    assert tuple(set_all.payload_range) == (0.1, 0.2)
    assert tuple(set_all.com_offset_range) == (-0.01, 0.02)


def test_physics_settings_and_gait_scales_reach_the_env(make_env, robot):
    import dataclasses
    from claw_rl_ros.core.sim.env import GaitRewardsOff, VecLocomotionEnv
    from claw_rl_ros.core.config import from_dict
    from claw_rl_ros.core.sim.env_config import EnvConfig
    env = make_env(num_envs=4, num_threads=1, solver_iterations=7, solver_ls_iterations=3)
    assert env.physics.num_threads == 1
    assert (env.physics.model.opt.iterations, env.physics.model.opt.ls_iterations) == (7, 3)
    # Any non-zero gait scale is switched off on a robot without a gait clock, 1.0 included.
    cfg = from_dict(EnvConfig, {'num_envs': 1, 'rewards': {'scales': {'gait_contact': 1.0,
                                                                      'feet_clearance': 0.0}}})
    with pytest.warns(GaitRewardsOff, match='reward terms gait_contact are switched off'):
        VecLocomotionEnv(cfg, dataclasses.replace(robot, gait_period=0.0)).close()


def test_reset_pose_noise_is_clipped_to_both_joint_limits(make_env, robot):
    env = make_env(num_envs=16, randomization={'init_joint_pos_noise': 5.0})
    env.reset(seed=0)
    q = env.physics.qpos[:, env.physics.qadr]
    assert (q >= robot.joint_lower).all() and (q <= robot.joint_upper).all()
    assert (q == robot.joint_lower).any() and (q == robot.joint_upper).any()
