"""The deploy safety path without ROS: every state-machine transition, every fall-back trigger
through the policy controller, command shaping on crafted commands, and nothing published
before a complete, fresh state."""

import math

import numpy as np
import pytest

from claw_rl_ros.core.math_utils import gravity_in_body
from claw_rl_ros.core.control.command_shaping import CommandShaper
from claw_rl_ros.core.control.policy_controller import PolicyController
from claw_rl_ros.core.control.safety import (FAULTS, PASSIVE, RL, SafetyConfig, SafetyMachine,
                                             SIT_DOWN, STAND_UP, tilt_of)

DT = 0.02
DEPLOY = dict(autostart=False, stand_up_s=1.0, sit_down_s=0.5, fade_in_s=0.4)


class Crafted:
    """A stand-in policy that returns ``action`` (settable) and the robot's own spec."""

    sha256 = 'c' * 64

    def __init__(self, robot, action=None):
        self.spec = robot.to_metadata()
        self.action = np.zeros(robot.num_joints) if action is None else action

    def __call__(self, obs):
        assert obs.shape == (47,) and np.isfinite(obs).all()
        return np.asarray(self.action, dtype=np.float32)


class Robot:
    """Feeds a controller one consistent (IMU, joint state) pair per control period."""

    def __init__(self, ctrl, robot, t=100.0):
        self.ctrl, self.robot, self.t = ctrl, robot, t
        self.pos = robot.default_joint_pos.copy()
        self.quat = [0.0, 0.0, 0.0, 1.0]  # x, y, z, w: upright

    def tick(self, pos=None, names=None, quat=None, age=0.0, imu=True):
        self.t += DT
        pos = self.pos if pos is None else pos
        if imu:
            self.ctrl.on_imu(self.t - age, quat or self.quat, [0, 0, 0], self.t)
        return self.ctrl.on_joint_state(self.t - age, names or self.robot.joint_names, pos,
                                        np.zeros(len(pos)), self.t)


def deploy_controller(robot, action=None, **cfg):
    ctrl = PolicyController(robot, safety=SafetyConfig(**{**DEPLOY, **cfg}))
    ctrl.policy = Crafted(robot, action)
    ctrl._unverified = None
    return ctrl


def to_rl(ctrl, feed):
    """PASSIVE -> STAND_UP -> RL through operator requests; returns the feed time at RL."""
    feed.tick()
    assert ctrl.request('stand_up', feed.t) == (True, STAND_UP)
    for _ in range(int(ctrl.safety.cfg.stand_up_s / DT) + 1):
        feed.tick()
    assert ctrl.request('rl', feed.t) == (True, RL)
    return feed.t


# ------------------------------------------------------------------------ the machine alone
def test_every_transition_of_the_state_machine(robot):
    m = SafetyMachine(robot, SafetyConfig(**DEPLOY))
    q0 = robot.default_joint_pos
    lying = q0 + np.where(np.arange(12) % 3 == 2, -1.0, 0.4)  # folded legs
    assert m.state == PASSIVE
    np.testing.assert_array_equal(m.target(0.0, lying), lying)  # damping: the measured pose
    assert m.request('rl', 0.0, lying) == (False, 'rl refused in PASSIVE; allowed from STAND_UP')
    assert m.request('stand_up', 0.0, None)[0] is False  # no fresh state: refused
    assert m.request('stand_up', 10.0, lying) == (True, STAND_UP)
    # Linear interpolation from the measured pose to the default pose over stand_up_s.
    np.testing.assert_allclose(m.target(10.5, q0), lying + 0.5 * (q0 - lying))
    np.testing.assert_allclose(m.target(12.0, q0), q0)
    assert m.request('rl', 10.5, q0)[1] == 'rl refused: STAND_UP has not reached the default ' \
        'pose yet'
    assert m.request('rl', 11.0, q0) == (True, RL)
    assert [m.fade(t) for t in (11.0, 11.2, 11.4, 12.0)] == pytest.approx([0, 0.5, 1, 1])
    with pytest.raises(ValueError, match='policy gives'):
        m.target(11.0, q0)
    assert m.request('stand_up', 11.5, q0)[0] is False  # only from PASSIVE or SIT_DOWN
    assert m.request('sit_down', 12.0, q0) == (True, SIT_DOWN)
    # Sit down to the pose the stand-up began at, over sit_down_s, then PASSIVE by itself.
    np.testing.assert_allclose(m.target(12.25, q0), q0 + 0.5 * (lying - q0))
    m.advance(12.4, q0)
    assert m.state == SIT_DOWN
    m.advance(12.5, lying)
    assert m.state == PASSIVE
    # SIT_DOWN -> STAND_UP, STAND_UP -> SIT_DOWN, then passive from STAND_UP and from RL.
    assert m.request('stand_up', 13.0, lying)[0] and m.request('sit_down', 13.1, q0)[0]
    assert m.request('stand_up', 13.2, q0)[0] and m.request('passive', 13.3, q0)[0]
    assert m.state == PASSIVE
    assert m.request('stand_up', 14.0, q0)[0] and m.request('rl', 15.0, q0)[0]
    assert m.request('passive', 15.1, q0) == (True, PASSIVE)
    # Every change was recorded once, with its reason, for the node to publish.
    transitions = m.drain()
    assert [(t.source, t.target) for t in transitions] == [
        (PASSIVE, STAND_UP), (STAND_UP, RL), (RL, SIT_DOWN), (SIT_DOWN, PASSIVE),
        (PASSIVE, STAND_UP), (STAND_UP, SIT_DOWN), (SIT_DOWN, STAND_UP), (STAND_UP, PASSIVE),
        (PASSIVE, STAND_UP), (STAND_UP, RL), (RL, PASSIVE)]
    assert str(transitions[3]) == 'SIT_DOWN -> PASSIVE (sit_down done)'
    assert m.drain() == [] and m.diagnostics()['transitions'] == 11
    known = 'stand_up, rl, sit_down, passive, estop, reset, excite, excite_stop'
    assert m.request('jump', 16.0, q0) == (False, f"unknown request 'jump'; use one of {known}")


def test_estop_is_latched_until_reset_in_passive(robot):
    m = SafetyMachine(robot, SafetyConfig(autostart=True))
    q0 = robot.default_joint_pos
    m.advance(0.0, q0)
    assert m.state == RL  # autostart: straight to RL (the gate lets it)
    assert m.request('estop', 1.0, q0) == (True, 'e-stop: PASSIVE, latched until reset')
    assert m.state == PASSIVE and m.latched and m.faults['estop'] == 1
    m.advance(1.1, q0)
    assert m.state == PASSIVE  # autostart does not re-arm after an e-stop
    assert m.request('stand_up', 1.2, q0) == (False, 'stand_up refused: e-stop latched; '
                                                     'request reset first')
    assert m.diagnostics()['estop_latched'] is True
    assert m.request('reset', 1.3, q0) == (True, 'e-stop latch cleared')
    m.advance(1.4, q0)
    assert m.state == RL
    assert m.request('reset', 1.5, q0)[0] is False  # reset only in PASSIVE


def test_autostart_holds_the_default_pose_until_the_gate_opens(robot):
    blocked = ['no model']
    m = SafetyMachine(robot, SafetyConfig(), rl_gate=lambda: blocked[0])
    q0 = robot.default_joint_pos
    m.advance(0.0, q0 + 0.3)
    assert m.state == STAND_UP
    np.testing.assert_array_equal(m.target(0.0, q0 + 0.3), q0)  # at once, no interpolation
    blocked[0] = None
    m.advance(0.02, q0)
    assert m.state == RL and m.fade(0.02) == 1.0


@pytest.mark.parametrize('field, value, words', [
    ('tilt_limit', 0.0, 'tilt_limit'), ('stand_up_s', -1.0, 'stand_up_s'),
    ('saturation_ticks', 0, 'saturation_ticks'), ('sit_pose', (0.1, 0.2), 'sit_pose has 2'),
    ('fade_in_s', math.nan, 'fade_in_s')])
def test_bad_safety_config_is_named(robot, field, value, words):
    with pytest.raises(ValueError, match=words):
        SafetyMachine(robot, SafetyConfig(**{field: value}))


def test_tilt_of_the_base_orientation_agrees_with_projected_gravity():
    rng = np.random.default_rng(0)
    for quat in [np.array([1.0, 0, 0, 0]), np.array([0.0, 1, 0, 0])] + list(
            rng.normal(size=(50, 4))):
        quat = quat / np.linalg.norm(quat)
        gravity = gravity_in_body(quat[None])[0]  # the env's projected-gravity term
        assert tilt_of(quat) == pytest.approx(math.acos(-gravity[2]), abs=1e-6)
    yaw = np.array([math.cos(1.0), 0, 0, math.sin(1.0)])  # yaw alone is no tilt
    assert tilt_of(yaw) == pytest.approx(0.0)
    assert tilt_of(np.array([math.cos(0.35), math.sin(0.35), 0, 0])) == pytest.approx(0.7)


# ------------------------------------------------------------- the controller with the machine
def test_deploy_sequence_commands_through_the_controller(robot):
    action = np.full(12, 0.4)
    ctrl = deploy_controller(robot, action)
    feed = Robot(ctrl, robot)
    q0 = robot.default_joint_pos
    feed.pos = q0 + 0.2
    out = feed.tick()
    np.testing.assert_allclose(out, feed.pos)  # PASSIVE: damping at the measured pose
    kp, kd = ctrl.last_gains
    assert not kp.any() and np.array_equal(kd, robot.kd)
    assert ctrl.request('stand_up', feed.t)[0]
    outs = [feed.tick() for _ in range(50)]
    np.testing.assert_allclose(outs[24], feed.pos + 0.5 * (q0 - feed.pos), atol=1e-9)
    np.testing.assert_allclose(outs[-1], q0)
    assert np.array_equal(ctrl.last_gains[0], robot.kp)
    feed.pos = q0
    feed.tick()
    start = feed.t
    assert ctrl.request('rl', start) == (True, RL)
    outs = [feed.tick() for _ in range(30)]
    # Fade-in: q0 + fade * scale * a, fade = elapsed / fade_in_s.
    for k in (4, 9, 25):
        fade = min(1.0, (start + (k + 1) * DT - start) / 0.4)
        np.testing.assert_allclose(outs[k], q0 + fade * robot.action_scale * action, atol=1e-9)
    assert ctrl.ticks == 30
    assert ctrl.request('sit_down', feed.t)[0]
    outs = [feed.tick() for _ in range(30)]
    assert ctrl.safety.state == PASSIVE
    # Sit down: from the measured pose to the pose the stand-up began at, over sit_down_s.
    np.testing.assert_allclose(outs[12], q0 + 0.52 * 0.2, atol=1e-9)
    np.testing.assert_allclose(outs[-1], q0)  # then PASSIVE: damping at the measured pose
    assert [t.reason for t in ctrl.safety.drain()] == [
        'operator stand_up', 'operator rl', 'operator sit_down', 'sit_down done']


def in_rl(robot, action=None, **cfg):
    ctrl = deploy_controller(robot, action, **cfg)
    feed = Robot(ctrl, robot)
    to_rl(ctrl, feed)
    assert feed.tick() is not None and ctrl.safety.state == RL
    ctrl.safety.drain()
    return ctrl, feed


def names_without_last(robot):
    return robot.joint_names[:-1]


@pytest.mark.parametrize('fault', FAULTS)
def test_every_fall_back_trigger_goes_to_damping(robot, fault):
    """From RL, each trigger: PASSIVE at once, damping at the last measured pose, counted,
    and the transition names the cause."""
    cfg = {'inference_overrun': {'inference_deadline_s': 1e-9},
           'saturation': {'saturation_ticks': 5}}.get(fault, {})
    action = np.full(12, 10.0) if fault == 'saturation' else None  # the clip: +-10
    ctrl, feed = in_rl(robot, None, **cfg)
    ctrl.policy.action = np.zeros(12) if action is None else action
    q = robot.default_joint_pos + 0.01
    feed.pos = q
    feed.tick()  # a healthy tick at q
    beyond = q.copy()
    beyond[2] = robot.joint_upper[2] + 0.2
    tilted = [math.sin(0.6), 0.0, 0.0, math.cos(0.6)]  # 1.2 rad about x
    outs = []
    if fault == 'tilt':
        outs.append(feed.tick(quat=tilted))
    elif fault == 'stale_joint_states':
        outs.append(ctrl.watchdog(feed.t + 3.5 * DT))
    elif fault == 'stale_imu':
        feed.t += DT  # a joint state waits for an IMU reading that never comes
        assert ctrl.on_joint_state(feed.t, robot.joint_names, q, np.zeros(12), feed.t) is None
        outs.append(ctrl.watchdog(feed.t + 3.5 * DT))
    elif fault == 'non_finite':
        ctrl.policy.action = np.full(12, np.nan)
        outs.append(feed.tick())
    elif fault == 'bad_input':
        outs.append(feed.tick(pos=q[:-1], names=names_without_last(robot)))
    elif fault == 'joint_limit':
        outs.append(feed.tick(pos=beyond))
    elif fault == 'estop':
        assert ctrl.request('estop', feed.t)[0]
        outs.append(feed.tick())
    elif fault == 'future_stamp':  # a joint state stamped 1 s ahead of the node's clock
        outs.append(feed.tick(age=-1.0, imu=False))
    elif fault == 'clock_step_back':  # /clock restarted 10 s earlier, then a fresh state
        feed.t -= 10.0
        outs.append(feed.tick())
    elif fault == 'clock_mismatch':  # a wall-time stamp on a node running on sim time
        outs.append(ctrl.on_joint_state(1.7e9, robot.joint_names, q, np.zeros(12), feed.t))
    elif fault == 'exception':  # the policy raises inside the tick
        ctrl.policy.action = 'not a number'
        outs.append(feed.tick())
    elif fault == 'restarted':  # the node came back after its previous process died
        ctrl.restarted('previous process ended without a clean stop')
        outs.append(feed.tick())
    else:  # inference_overrun, saturation: persisting over several ticks
        outs += [feed.tick() for _ in range(12)]
    assert ctrl.safety.state == PASSIVE
    assert ctrl.safety.faults[fault] == 1
    transition, = ctrl.safety.drain()
    assert (transition.source, transition.target) == (RL, PASSIVE)
    assert transition.reason.startswith(f'fault {fault}')
    # Damping: the measured pose itself, Kp = 0; beyond a limit too (a position-only driver
    # must not be pulled back into the limit by Kp (limit - q)).
    last = {'joint_limit': beyond}.get(fault, q)
    np.testing.assert_allclose(outs[-1], last)
    assert not ctrl.last_gains[0].any()
    # Deploy mode stays PASSIVE on healthy state: the operator has to stand it up again.
    np.testing.assert_allclose(feed.tick(), q)
    assert ctrl.safety.state == PASSIVE


def test_nan_in_state_and_imu_are_faults_too(robot):
    ctrl, feed = in_rl(robot)
    bad = robot.default_joint_pos.copy()
    bad[7] = np.inf
    feed.tick(pos=bad)
    assert ctrl.safety.faults['non_finite'] == 1 and ctrl.safety.state == PASSIVE
    ctrl, feed = in_rl(robot)
    feed.t += DT
    ctrl.on_imu(feed.t, [0, 0, np.nan, 1], [0, 0, 0], feed.t)
    out = ctrl.on_joint_state(feed.t, robot.joint_names, feed.pos, np.zeros(12), feed.t)
    np.testing.assert_allclose(out, feed.pos)
    assert ctrl.safety.faults['non_finite'] == 1 and ctrl.safety.state == PASSIVE


def test_saturation_and_overrun_must_persist(robot):
    ctrl, feed = in_rl(robot, saturation_ticks=5, inference_deadline_s=1e-9, overrun_ticks=50)
    ctrl.shaper.max_delta[:] = 100.0  # saturation by the joint limits alone
    ctrl.policy.action = np.full(12, 30.0)
    for _ in range(4):
        feed.tick()
    ctrl.policy.action = np.zeros(12)  # one unsaturated tick restarts the count
    feed.tick()
    ctrl.policy.action = np.full(12, 30.0)
    for _ in range(4):
        feed.tick()
    assert ctrl.safety.state == RL
    feed.tick()
    assert ctrl.safety.state == PASSIVE and ctrl.safety.faults['saturation'] == 1


def test_autostart_re_arms_after_a_fault_but_not_after_an_estop(robot, tmp_path):
    ctrl = PolicyController(robot)  # autostart is the default
    ctrl.policy, ctrl._unverified = Crafted(robot, np.full(12, 0.2)), None
    feed = Robot(ctrl, robot)
    q0 = robot.default_joint_pos
    np.testing.assert_allclose(feed.tick(), q0 + 0.05, atol=1e-6)  # RL at the first state
    feed.tick(quat=[math.sin(0.6), 0.0, 0.0, math.cos(0.6)])
    assert ctrl.safety.state == PASSIVE
    np.testing.assert_allclose(feed.tick(), q0 + 0.05, atol=1e-6)  # healthy: RL again
    assert [t.reason for t in ctrl.safety.drain()] == [
        'autostart', 'autostart', 'fault tilt: 1.200 rad > tilt_limit 1', 'autostart',
        'autostart']
    assert ctrl.request('estop', feed.t)[0]
    for _ in range(3):
        np.testing.assert_allclose(feed.tick(), q0)  # damping at the measured pose
    assert ctrl.safety.state == PASSIVE


def test_nothing_is_commanded_before_a_complete_fresh_state(robot):
    for autostart in (True, False):
        ctrl = deploy_controller(robot, autostart=autostart)
        feed = Robot(ctrl, robot)
        assert ctrl.watchdog(feed.t) is None  # nothing received
        assert ctrl.on_imu(feed.t, [0, 0, 0, 1], [0, 0, 0], feed.t) is None  # IMU alone
        assert feed.tick(age=0.5) is None  # stale state
        assert feed.tick(pos=robot.default_joint_pos[:-1],
                         names=names_without_last(robot)) is None  # incomplete
        assert feed.tick(imu=False) is None  # no IMU of this tick
        assert ctrl.watchdog(feed.t + 1.0) is None
        assert ctrl.request('stand_up', feed.t)[0] is False
        assert feed.tick() is not None  # the first complete, fresh state


# ------------------------------------------------------------------------------ shaping
def test_shaper_clamps_to_limits_and_rate_limits_crafted_commands(robot):
    shaper = CommandShaper(robot, max_delta_per_tick=0.1)
    q0 = robot.default_joint_pos
    lo, hi = robot.joint_lower, robot.joint_upper
    out, cut = shaper.shape(q0)
    np.testing.assert_array_equal(out, q0)  # the first command: no previous one to limit
    assert cut == 0
    raw = q0.copy()
    raw[0], raw[1] = hi[0] + 5.0, q0[1] - 0.05
    out, cut = shaper.shape(raw)
    assert out[0] == pytest.approx(q0[0] + 0.1) and out[1] == pytest.approx(q0[1] - 0.05)
    assert cut == pytest.approx(raw[0] - (q0[0] + 0.1))
    for _ in range(40):
        out, cut = shaper.shape(raw)
    assert out[0] == hi[0] and cut == pytest.approx(5.0)  # the joint limit, not beyond
    out, _ = shaper.shape(np.full(12, -50.0))
    np.testing.assert_allclose(out, np.maximum(lo, raw.clip(lo, hi) - 0.1))
    np.testing.assert_array_equal(shaper.restart(np.full(12, 9.0)), hi)  # clamped restart
    default = CommandShaper(robot)  # the URDF velocity limit x control period
    np.testing.assert_allclose(default.max_delta, robot.velocity_limit * DT)
    with pytest.raises(ValueError, match='max_delta_per_tick'):
        CommandShaper(robot, math.inf)


def test_controller_commands_are_rate_limited_and_clamped(robot):
    ctrl, feed = in_rl(robot, np.zeros(12), fade_in_s=0.0, saturation_ticks=1000)
    ctrl.shaper.max_delta[:] = 0.05
    ctrl.policy.action = np.full(12, 8.0)  # q0 + 2 rad: beyond several limits
    q0 = robot.default_joint_pos
    outs = np.array([feed.tick() for _ in range(60)])
    np.testing.assert_allclose(np.diff(outs, axis=0).max(), 0.05)
    np.testing.assert_allclose(outs[0], q0 + 0.05)
    np.testing.assert_allclose(outs[-1], np.minimum(q0 + 2.0, robot.joint_upper))


def test_faults_in_stand_up_and_sit_down_fall_back_too(robot):
    for state in ('stand_up', 'sit_down'):
        ctrl, feed = in_rl(robot) if state == 'sit_down' else (None, None)
        if ctrl is None:
            ctrl = deploy_controller(robot)
            feed = Robot(ctrl, robot)
            feed.tick()
        assert ctrl.request(state, feed.t)[0]
        feed.tick()
        low = feed.pos.copy()
        low[1] = robot.joint_lower[1] - 0.2  # the lower limit counts as much as the upper
        np.testing.assert_allclose(feed.tick(pos=low), low)  # damping where it is: no push
        assert ctrl.safety.state == PASSIVE and ctrl.safety.faults['joint_limit'] == 1


def test_a_state_that_waited_too_long_for_its_imu_is_not_answered(robot):
    ctrl, feed = in_rl(robot)
    feed.t += DT
    assert ctrl.on_joint_state(feed.t, robot.joint_names, feed.pos, np.zeros(12),
                               feed.t) is None
    late = feed.t + 5 * DT  # its IMU reading comes 100 ms later: the state is stale by then
    out = ctrl.on_imu(late, [0, 0, 0, 1], [0, 0, 0], late)
    np.testing.assert_allclose(out, feed.pos)  # damping, not a policy command
    assert ctrl.safety.faults['stale_imu'] == 1 and ctrl.drops['stale'] == 1


def test_leaving_passive_starts_the_rate_limit_at_the_measured_pose(robot):
    ctrl = PolicyController(robot, max_delta_per_tick=0.05)  # autostart
    ctrl.policy, ctrl._unverified = Crafted(robot, np.full(12, 2.0)), None
    feed = Robot(ctrl, robot)
    feed.pos = robot.default_joint_pos - 0.1
    np.testing.assert_allclose(feed.tick(), feed.pos + 0.05)  # not q0 + 0.5 at once


def test_operator_requests_need_a_fresh_state(robot):
    ctrl = deploy_controller(robot)
    feed = Robot(ctrl, robot)
    feed.tick()
    ok, message = ctrl.request('stand_up', feed.t + 4 * DT)  # the state is 80 ms old
    assert not ok and 'no fresh complete joint state' in message
    assert ctrl.request('stand_up', feed.t + DT)[0]
