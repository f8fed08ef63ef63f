"""Control-loop core without ROS: observation parity with the env, input validation, the policy
controller's safety contract, hot-swap validation and timing statistics."""

import numpy as np
import pytest

from claw_rl_ros.core.control.control_stats import (Counters, LatencyStats, RateMeter,
                                                    StallDeadline, TickMonitor)
from claw_rl_ros.core.control.model_swap import (ModelCache, ModelRejected, read_model_file,
                                                 validate_model)
from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
from claw_rl_ros.core.control.policy_controller import PolicyController
from claw_rl_ros.core.control.state_input import (BadInput, check_fresh, command_array,
                                                  imu_arrays, JointOrder, ObservationAssembler)
from control_models import (corrupted_model, good_model, nan_model, wrong_shape_model,
                            wrong_spec_model)

DT = 0.02


@pytest.fixture(scope='module')
def models(robot, tmp_path_factory):
    d = tmp_path_factory.mktemp('models')
    good = good_model(robot, d / 'a.onnx', seed=0)
    return {'a': good, 'b': good_model(robot, d / 'b.onnx', seed=1),
            'big': good_model(robot, d / 'big.onnx', seed=2, hidden=(256, 256)),
            'wrong_spec': wrong_spec_model(robot, d / 'spec.onnx'),
            'wrong_shape': wrong_shape_model(robot, d / 'shape.onnx'),
            'nan': nan_model(robot, d / 'nan.onnx'),
            'corrupted': corrupted_model(robot, d / 'bad.onnx', good)}


def xyzw(quat_wxyz):
    return [quat_wxyz[1], quat_wxyz[2], quat_wxyz[3], quat_wxyz[0]]


def test_observation_matches_the_env_step_by_step(make_env, robot, models):
    """Message-level arrays (joints shuffled, ROS quaternion order) -> the env's exact obs,
    with the node's own last action and gait clock, over 30 closed-loop steps."""
    env = make_env(num_envs=1, noise={'enabled': False}, randomization={'enabled': False},
                   commands={'lin_vel_x': [0.4, 0.4], 'lin_vel_y': [0.1, 0.1],
                             'ang_vel_yaw': [0.2, 0.2], 'standing_probability': 0.0,
                             'min_speed': 0.0})
    policy = OnnxPolicy(models['a'], robot)
    obs, _ = env.reset()
    order = JointOrder(robot)
    assembler = ObservationAssembler(robot)
    assembler.gait_phase[:] = env.gait_phase  # the env starts its clock at a random phase
    perm = np.random.default_rng(0).permutation(robot.num_joints)
    names = [robot.joint_names[i] for i in perm]
    for _ in range(30):
        s = env.robot_state()
        pos, vel = order.joint_arrays(names, s.joint_pos[0, perm], s.joint_vel[0, perm])
        quat, gyro = imu_arrays(xyzw(s.base_quat[0]), s.base_ang_vel[0])
        assembler.set_command(command_array(*env.commands[0]))
        mine = assembler.observe(pos, vel, quat, gyro)
        np.testing.assert_allclose(mine, obs['policy'][0], rtol=1e-6, atol=1e-6)
        action = policy(mine)
        assembler.advance(action)
        obs, *_ = env.step(action[None])
    assert np.abs(obs['policy'][0, -2:]).max() > 0  # the gait clock is part of the check


@pytest.mark.parametrize('names, pos, vel, cause', [
    (None, 'nan', None, 'non_finite'),
    (None, None, 'inf', 'non_finite'),
    ('missing', None, None, 'wrong_length'),
    ('drop_one_both', None, None, 'missing_joint'),
    ('rename', None, None, 'unknown_joint'),
    ('duplicate', None, None, 'unknown_joint'),
    (None, 'short', None, 'wrong_length'),
])
def test_bad_joint_states_are_refused_with_their_cause(robot, names, pos, vel, cause):
    order = JointOrder(robot)
    n = list(robot.joint_names)
    p, v = list(robot.default_joint_pos), [0.0] * len(n)
    if names == 'missing':
        n = n[:-1]
    elif names == 'drop_one_both':
        n, p, v = n[:-1], p[:-1], v[:-1]
    elif names == 'rename':
        n[4] = 'FR_thigh'
    elif names == 'duplicate':
        n[4] = n[3]
    if pos == 'nan':
        p[2] = float('nan')
    elif pos == 'short':
        p = p[:-2]
    if vel == 'inf':
        v[7] = float('inf')
    with pytest.raises(BadInput) as info:
        order.joint_arrays(n, p, v)
    assert info.value.cause == cause
    assert 'joint_states' in str(info.value)


def test_joints_are_matched_by_name_and_output_order_follows_the_parameter(robot):
    rev = list(reversed(robot.joint_names))
    order = JointOrder(robot, rev)
    pos, _ = order.joint_arrays(rev, 0.1 * np.arange(12.0)[::-1], np.zeros(12))
    np.testing.assert_array_equal(pos, 0.1 * np.arange(12.0))  # back in spec order
    np.testing.assert_array_equal(order.to_output(np.arange(12.0)), np.arange(12.0)[::-1])
    np.testing.assert_array_equal(order.from_output(order.to_output(np.arange(12.0))),
                                  np.arange(12.0))
    with pytest.raises(ValueError, match='exactly once'):
        JointOrder(robot, rev[:-1] + [rev[0]])


def test_imu_conversion_stale_and_bad_quaternion():
    quat, gyro = imu_arrays([0.0, 0.0, 0.6, 0.8], [0.1, 0.2, 0.3])
    np.testing.assert_allclose(quat, [0.8, 0.0, 0.0, 0.6])  # ROS x,y,z,w -> w,x,y,z
    with pytest.raises(BadInput, match='norm') as info:
        imu_arrays([0.0, 0.0, 0.0, 0.0], [0, 0, 0])
    assert info.value.cause == 'bad_imu'
    with pytest.raises(BadInput) as info:
        imu_arrays([0.0, 0.0, 0.0, 1.0], [0, float('nan'), 0])
    assert info.value.cause == 'non_finite'
    check_fresh('imu', 10.0, 10.0 + 3 * DT - 1e-6, 3 * DT)
    with pytest.raises(BadInput, match='old') as info:
        check_fresh('imu', 10.0, 10.0 + 3 * DT + 1e-3, 3 * DT)
    assert info.value.cause == 'stale'


class Feed:
    """Drives a PolicyController with one consistent standing state per tick."""

    def __init__(self, ctrl, robot):
        self.ctrl, self.robot, self.t = ctrl, robot, 100.0

    def tick(self, pos=None, names=None, imu=True, dt=DT):
        self.t += dt
        if imu:
            out = self.ctrl.on_imu(self.t, [0, 0, 0, 1], [0, 0, 0], self.t)
            assert out is None  # an IMU reading with no state waiting produces nothing
        pos = self.robot.default_joint_pos if pos is None else pos
        return self.ctrl.on_joint_state(self.t, names or self.robot.joint_names, pos,
                                        np.zeros(12), self.t)


def test_controller_safety_contract(robot, models):
    ctrl = PolicyController(robot)
    feed = Feed(ctrl, robot)
    bad = robot.default_joint_pos.copy()
    bad[0] = np.nan
    assert feed.tick(pos=bad) is None  # before the first complete state: nothing
    assert feed.tick(imu=False) is None  # no IMU yet: incomplete, waits for it
    # The IMU completes the waiting state: the first complete state, no model -> hold.
    out = ctrl.on_imu(feed.t, [0, 0, 0, 1], [0, 0, 0], feed.t)
    np.testing.assert_array_equal(out, robot.default_joint_pos)
    assert ctrl.drops['no_model'] == 1 and ctrl.drops['non_finite'] == 1
    ctrl.load_path(models['a'])
    policy = OnnxPolicy(models['a'])
    out = feed.tick()
    assert np.abs(out - robot.default_joint_pos).max() > 1e-3  # the policy acts
    # The command is q0 + scale * a clamped, from the observation the env would build.
    expected = ObservationAssembler(robot)
    expected.advance(None)  # the one tick so far (the hold) moved the gait clock on
    action = policy(expected.observe(robot.default_joint_pos, np.zeros(12),
                                     np.array([1.0, 0, 0, 0]), np.zeros(3)))
    np.testing.assert_allclose(out, robot.action_to_target(action[None])[0], atol=1e-6)
    # Every kind of bad input -> the default pose, counted by cause, never a policy command.
    for kwargs, cause, count in (({'pos': bad}, 'non_finite', 2),
                                 ({'names': robot.joint_names[:-1] + ['x']}, 'unknown_joint', 1)):
        np.testing.assert_array_equal(feed.tick(**kwargs), robot.default_joint_pos)
        assert ctrl.drops[cause] == count
    out = ctrl.on_joint_state(feed.t + DT, robot.joint_names, robot.default_joint_pos,
                              np.zeros(12), feed.t + 1.0)  # newer than the last, but old
    np.testing.assert_array_equal(out, robot.default_joint_pos)
    assert ctrl.drops['stale'] == 1
    assert ctrl.holds['bad_input'] == 3


def test_undecodable_messages_are_dropped_by_name_and_fault_a_started_loop(robot, models):
    ctrl = PolicyController(robot)
    ctrl.load_path(models['a'])
    # Before the loop started: counted and named, no command and no fault.
    assert ctrl.on_malformed('imu', 'cut short', 99.0) is None
    assert ctrl.drops['malformed'] == 1 and sum(ctrl.safety.faults.values()) == 0
    assert 'imu' in ctrl.last_drop and 'sensor_msgs/msg/Imu' in ctrl.last_drop
    feed = Feed(ctrl, robot)
    assert np.abs(feed.tick() - robot.default_joint_pos).max() > 1e-3  # the policy acts
    # In RL: undecodable joint_states bytes are that tick's bad input, held, never a command.
    out = ctrl.on_malformed('joint_states', 'a string without its NUL', feed.t + DT)
    np.testing.assert_array_equal(out, robot.default_joint_pos)
    assert ctrl.drops['malformed'] == 2 and ctrl.holds['bad_input'] == 1
    assert ctrl.safety.faults['bad_input'] == 1 and ctrl.safety.state == 'PASSIVE'
    assert 'NUL' in ctrl.last_drop and 'sensor_msgs/msg/JointState' in ctrl.last_drop
    # An undecodable IMU reading of a started loop faults it too.
    ctrl.on_malformed('imu', 'random bytes', feed.t + 2 * DT)
    assert ctrl.safety.faults['bad_input'] == 2 and ctrl.drops['malformed'] == 3
    assert ctrl.diagnostics()['exceptions_total'] == 0


def test_controller_waits_for_the_imu_of_the_same_tick(robot, models):
    ctrl = PolicyController(robot)
    ctrl.load_path(models['a'])
    t = 5.0
    ctrl.on_imu(t, [0, 0, 0, 1], [0, 0, 0], t)
    ctrl.on_joint_state(t, robot.joint_names, robot.default_joint_pos, np.zeros(12), t)
    # Next tick: the joint state comes first and waits; the IMU of its tick completes it.
    assert ctrl.on_joint_state(t + DT, robot.joint_names, robot.default_joint_pos,
                               np.zeros(12), t + DT) is None
    assert ctrl.on_imu(t + DT, [0, 0, 0, 1], [0, 0, 0], t + DT) is not None
    # A bad IMU reading of a tick turns that tick into a hold.
    assert ctrl.on_joint_state(t + 2 * DT, robot.joint_names, robot.default_joint_pos,
                               np.zeros(12), t + 2 * DT) is None
    out = ctrl.on_imu(t + 2 * DT, [0, 0, 0, 0], [0, 0, 0], t + 2 * DT)
    np.testing.assert_array_equal(out, robot.default_joint_pos)
    assert ctrl.drops['bad_imu'] == 1 and ctrl.ticks == 2


def test_a_state_is_answered_once(robot, models):
    """A re-sent or out-of-order state gets no second command (lockstep safety)."""
    ctrl = PolicyController(robot)
    ctrl.load_path(models['a'])
    feed = Feed(ctrl, robot)
    assert feed.tick() is not None
    again = ctrl.on_joint_state(feed.t, robot.joint_names, robot.default_joint_pos,
                                np.zeros(12), feed.t)
    assert again is None and ctrl.drops['stale'] == 1
    assert feed.tick() is not None


def test_a_backlog_is_worked_off_at_its_newest_state_without_stale_faults(robot, models):
    """Under load, states queue up (depth-5 subscriptions) while /clock (depth 1) moves on.
    Judged one by one against the newest clock the old ones faulted stale, and autostart
    re-armed at the next one: the stale_joint_states fault flapped. The node now hands the
    controller a backlog's older states as superseded."""
    q0, names, still = robot.default_joint_pos, robot.joint_names, np.zeros(12)

    def backlog(superseded):
        ctrl = PolicyController(robot, stale_after_periods=3)
        ctrl.load_path(models['a'])
        feed = Feed(ctrl, robot)
        assert feed.tick() is not None and ctrl.safety.state == 'RL'
        now = feed.t + 5 * DT  # the clock is 5 ticks on; their states wait in the queue
        ctrl.on_imu(now, [0, 0, 0, 1], [0, 0, 0], now)
        outs = [ctrl.on_joint_state(feed.t + k * DT, names, q0, still, now,
                                    superseded and k < 5) for k in range(1, 6)]
        return ctrl, outs

    old, outs = backlog(superseded=False)  # the per-message handling before the fix
    assert old.safety.faults['stale_joint_states'] == 1 and old.drops['stale'] == 1
    assert [t.target for t in old.safety.history][-3:] == ['PASSIVE', 'STAND_UP', 'RL']
    ctrl, outs = backlog(superseded=True)
    assert outs[:4] == [None] * 4 and outs[4] is not None  # the newest state is answered
    assert ctrl.superseded == 4 and ctrl.drops['stale'] == 0
    assert ctrl.safety.faults['stale_joint_states'] == 0 and ctrl.safety.state == 'RL'
    assert ctrl.ticks == 2  # the policy acted on it
    # A bad state inside a backlog is never skipped: dropped, counted, a hold, a fault.
    bad = q0.copy()
    bad[2] = np.inf
    t = ctrl._last_state_stamp
    out = ctrl.on_joint_state(t + DT, names, bad, still, t + 2 * DT, True)
    np.testing.assert_array_equal(out, q0)
    assert ctrl.drops['non_finite'] == 1 and ctrl.safety.faults['non_finite'] == 1
    assert ctrl.safety.state == 'PASSIVE' and ctrl.superseded == 4
    # So is a state that repeats an answered stamp (a lockstep re-send).
    assert ctrl.on_joint_state(t, names, q0, still, t + 2 * DT, True) is None
    assert ctrl.drops['stale'] == 1 and ctrl.superseded == 4


def test_watchdog_holds_the_default_pose_on_stale_state(robot, models):
    rev = list(reversed(robot.joint_names))
    ctrl = PolicyController(robot, stale_after_periods=3, output_joints=rev)
    ctrl.load_path(models['a'])
    assert ctrl.watchdog(0.0) is None  # never started
    feed = Feed(ctrl, robot)
    assert feed.tick() is not None
    assert ctrl.watchdog(feed.t + 2.5 * DT) is None
    out = ctrl.watchdog(feed.t + 3.5 * DT)
    np.testing.assert_array_equal(out, robot.default_joint_pos[::-1])  # in `joints` order
    assert ctrl.holds['stale'] == 1
    assert ctrl.watchdog(feed.t + 3.6 * DT) is None  # at most one command per period


def test_model_validation_names_each_reason(robot, models):
    data = {k: p.read_bytes() for k, p in models.items()}
    assert validate_model(data['a'], robot).num_actions == 12
    reasons = {'wrong_spec': 'spec mismatch: .*kp: model has',
               'wrong_shape': "invalid model: .*'obs' is tensor.*52.*47",
               'nan': 'non-finite action',
               'corrupted': 'invalid model: .*not a loadable ONNX model'}
    for key, pattern in reasons.items():
        with pytest.raises(ModelRejected, match=pattern):
            validate_model(data[key], robot)
    with pytest.raises(ModelRejected, match='over the size cap of 100000 bytes'):
        validate_model(data['big'], robot, max_bytes=100_000)
    with pytest.raises(ModelRejected, match='cannot read'):
        read_model_file(models['a'].parent / 'missing.onnx')


def test_hot_swap_activates_by_hash_and_rejects_keep_the_old_model(robot, models):
    ctrl = PolicyController(robot, max_model_bytes=100_000)
    version_a = ctrl.load_path(models['a'])
    feed = Feed(ctrl, robot)
    out_a = feed.tick()
    for key in ('wrong_spec', 'wrong_shape', 'nan', 'corrupted', 'big'):
        sha, reason = ctrl.offer(models[key].read_bytes())
        assert reason
        with pytest.raises(ModelRejected) as info:
            ctrl.activate(sha)
        assert str(info.value) == reason
        assert ctrl.version == version_a and ctrl.last_swap.startswith('rejected')
    with pytest.raises(ModelRejected, match='no model with sha256'):
        ctrl.activate('0123456789abcdef')
    sha_b, reason = ctrl.offer(models['b'].read_bytes())
    assert reason is None
    assert ctrl.activate(sha_b[:10]) == sha_b[:12] != version_a
    assert ctrl.last_swap == f'ok {sha_b[:12]}'
    # Same observation, new weights: the command of model b, not of model a.
    obs = ctrl.assembler.observe(robot.default_joint_pos, np.zeros(12),
                                 np.array([1.0, 0, 0, 0]), np.zeros(3))
    out_b = feed.tick()
    target = {k: robot.action_to_target(OnnxPolicy(models[k])(obs)[None])[0] for k in 'ab'}
    np.testing.assert_allclose(out_b, target['b'], atol=1e-6)
    assert np.abs(out_b - target['a']).max() > 1e-3 and out_a is not None


def test_model_cache_is_bounded(robot, models):
    cache = ModelCache(robot, capacity=2)
    sha_a, _ = cache.offer(models['a'].read_bytes())
    cache.offer(models['b'].read_bytes())
    cache.offer(models['nan'].read_bytes())
    with pytest.raises(ModelRejected, match='no model'):
        cache.get(sha_a)


def test_statistics():
    lat = LatencyStats(window=100)
    for ms in range(1, 201):
        lat.add(ms * 1e-3)
    s = lat.summary('x')
    assert s['x_p50_ms'] == pytest.approx(150.5) and s['x_max_ms'] == pytest.approx(200)
    assert s['x_p99_ms'] == pytest.approx(199.01)
    ticks = TickMonitor(0.02)
    for t in (0.0, 0.02, 0.04, 0.10, 0.12):
        ticks.tick(t)
    assert ticks.missed == 2
    rate = RateMeter(window=1.0)
    for k in range(101):
        rate.tick(k * 0.01)
    assert rate.rate(1.0) == pytest.approx(100.0)
    counters = Counters(('a', 'b'))
    counters.add('b', 2)
    assert counters.summary('d') == {'d_a': 0, 'd_b': 2, 'd_total': 2}


def test_stall_deadline_expires_on_a_stall_not_on_slow_progress():
    """claw-rl verify waited for N s of sim time with a fixed 60 s deadline, which a lockstep
    loop slowed by a second test suite on 2 cores missed while it still moved."""
    deadline = StallDeadline(60.0, now=0.0)
    for k in range(60):  # 0.05 s of sim time per 10 s of wall time: slow, 590 s in all
        assert not deadline.expired(0.05 * k, 10.0 * k)
    last = 0.05 * 59  # seen at 590 s
    assert not deadline.expired(last, 649.0)  # the same sim time for 59 s: still fine
    assert deadline.expired(last, 651.0)  # ... for 61 s: stalled
    assert not deadline.expired(last + 0.02, 652.0)  # moving again
    assert StallDeadline(60.0, now=0.0).expired(None, 60.5)  # never any progress
