"""Regression tests of the deploy path's worst inputs (issue 20), without ROS: each reproduces a
defect that crashed, wedged or misled the policy node, and checks the fix."""

from __future__ import annotations

import os

import numpy as np
import pytest

from claw_rl_ros.core.control.model_swap import ModelRejected, validate_model
from claw_rl_ros.core.control.policy_controller import PolicyController
from claw_rl_ros.core.control.run_marker import RunMarker
from claw_rl_ros.core.control.safety import PASSIVE, RL, SafetyConfig
from control_models import clip_model, wrong_spec_model

DT = 0.02


class Feed:
    """One (IMU, joint state) pair per period on a node clock and a monotonic clock."""

    def __init__(self, robot, ctrl, t=100.0):
        self.robot, self.ctrl, self.t, self.mono = robot, ctrl, t, 0.0

    def tick(self, stamp=None, vel=None, gyro=(0.0, 0.0, 0.0), imu_stamp=None, imu=True):
        self.t += DT
        self.mono += DT
        stamp = self.t if stamp is None else stamp
        if imu:
            self.ctrl.on_imu(stamp if imu_stamp is None else imu_stamp, [0, 0, 0, 1], gyro,
                             self.t)
        r = self.robot
        return self.ctrl.on_joint_state(stamp, r.joint_names, r.default_joint_pos,
                                        np.zeros(12) if vel is None else vel, self.t)


def autostart(robot, model, **kw):
    """A controller in RL under autostart, with a fake monotonic clock."""
    box = {}
    ctrl = PolicyController(robot, monotonic=lambda: box['feed'].mono, **kw)
    ctrl.load_path(model)
    feed = box['feed'] = Feed(robot, ctrl)
    assert feed.tick() is not None and ctrl.safety.state == RL
    return ctrl, feed


@pytest.mark.parametrize('where', ['velocity', 'gyro', 'cmd_vel'])
def test_a_double_beyond_float32_is_refused_not_a_crash(robot, model, where):
    """1e39 is a finite float64 but inf in the float32 observation: it used to reach
    OnnxPolicy, raise, and kill the node in RL. Now it is dropped by cause, and the node goes
    on (the command keeps its last valid value until it times out)."""
    ctrl, feed = autostart(robot, model)
    if where == 'cmd_vel':
        ctrl.on_command(1e39, 0.0, 0.0)
        assert ctrl.drops['out_of_range'] == 1
        assert feed.tick() is not None and ctrl.safety.state == RL
    else:
        vel = np.zeros(12)
        vel[3] = 1e39
        out = feed.tick(vel=vel if where == 'velocity' else None,
                        gyro=(0.0, 1e39, 0.0) if where == 'gyro' else (0.0, 0.0, 0.0))
        assert ctrl.safety.state == PASSIVE and ctrl.drops['out_of_range'] == 1
        assert 'plausible range' in ctrl.last_drop and '1e+39' in ctrl.last_drop
        if where == 'velocity':  # the tick is answered with damping at the measured pose
            np.testing.assert_array_equal(out, robot.default_joint_pos)
        assert feed.tick() is not None and ctrl.safety.state == RL  # re-armed (autostart)
    assert ctrl.guard.counts.total == 0


def test_an_exception_inside_a_tick_is_a_named_fault(robot, model):
    ctrl, feed = autostart(robot, model)

    class Session:
        def run(self, *args):
            raise RuntimeError('onnxruntime went away')
    ctrl.policy._session = Session()
    out = feed.tick()
    np.testing.assert_array_equal(out, robot.default_joint_pos)  # damping, not a crash
    assert ctrl.safety.state == PASSIVE and ctrl.safety.faults['exception'] >= 1
    d = ctrl.diagnostics()
    assert d['exceptions_policy'] >= 1 and 'onnxruntime went away' in d['last_exception']
    assert [k for k, _ in ctrl.alerts.drain()] == ['exception_policy']  # logged once


def test_a_future_stamp_no_longer_wedges_the_node(robot, model):
    """One state stamped +60 s used to become the "last answered" stamp: every later healthy
    state was dropped as stale, the watchdog never fired, and the state stayed RL."""
    ctrl, feed = autostart(robot, model)
    assert feed.tick(stamp=feed.t + DT + 60.0) is not None  # damping
    assert ctrl.safety.state == PASSIVE and ctrl.safety.faults['future_stamp'] >= 1
    assert 'ahead of the node clock' in ctrl.last_drop
    assert feed.tick() is not None and ctrl.safety.state == RL  # healthy states count again
    assert ctrl.drops['stale'] == 0


def test_a_clock_that_steps_back_is_a_fault_and_the_node_recovers(robot, model):
    ctrl, feed = autostart(robot, model)
    feed.t = 0.0  # /clock restarts from 0 (a sim restart) or an NTP step back
    assert feed.tick() is not None
    assert ctrl.safety.faults['clock_step_back'] == 1
    assert ctrl.safety.state == RL  # the same tick's healthy state re-armed (autostart)
    assert feed.tick() is not None and ctrl.drops['stale'] == 0


def test_damping_within_three_periods_when_the_node_clock_stalls(robot, model):
    """The watchdog compares monotonic receive times too: a node clock that stands still
    (a stalled /clock) or steps back cannot hide a dead state stream."""
    ctrl, feed = autostart(robot, model)
    stuck = feed.t
    for k in range(1, 13):  # polled 4 times per period, node clock frozen
        feed.mono += DT / 4
        out = ctrl.watchdog(stuck)
        if ctrl.safety.state == PASSIVE:
            break
    assert ctrl.safety.state == PASSIVE and k * DT / 4 <= 3 * DT
    np.testing.assert_array_equal(out, robot.default_joint_pos)


def test_an_imu_reading_is_paired_only_with_its_own_tick(robot, model):
    """An IMU reading stamped ahead of the joint states used to be reused for every later
    state: a stalled, separately clocked IMU froze the orientation the policy saw."""
    ctrl, feed = autostart(robot, model)
    feed.tick(imu_stamp=feed.t + DT + 2.5 * DT)  # the IMU clock is 2.5 periods ahead
    assert ctrl.safety.state == PASSIVE and ctrl.drops['unsynced_imu'] == 1
    # The IMU stalls: its last reading, ahead of the states, must not pair with them.
    outs = [feed.tick(imu=False) for _ in range(2)]
    assert ctrl.drops['unsynced_imu'] == 3 and ctrl.safety.state == PASSIVE
    assert all(o is not None for o in outs)  # each answered with damping, none with RL
    feed.tick()
    assert ctrl.safety.state == RL  # a reading of its own tick: healthy again


def test_cmd_vel_goes_stale(robot, model):
    """One 1.0 m/s command, then silence: after cmd_vel_timeout_s the command is zero."""
    ctrl, feed = autostart(robot, model, cmd_vel_timeout_s=0.5)
    ctrl.on_command(1.0, 0.0, 0.0)
    feed.tick()
    assert ctrl.assembler.commands[0, 0] == 1.0 and not ctrl.diagnostics()['command_timed_out']
    for _ in range(int(0.5 / DT) + 1):
        feed.tick()
    assert ctrl.assembler.commands[0].tolist() == [0.0, 0.0, 0.0]
    d = ctrl.diagnostics()
    assert d['command_timed_out'] and d['cmd_vel_timeouts'] == 1
    ctrl.on_command(0.3, 0.0, 0.0)  # a new one takes over at once
    feed.tick()
    assert ctrl.assembler.commands[0, 0] == 0.3 and not ctrl.command_timed_out
    off, feed_off = autostart(robot, model, cmd_vel_timeout_s=0.0)
    off.on_command(1.0, 0.0, 0.0)
    for _ in range(100):
        feed_off.tick()
    assert off.assembler.commands[0, 0] == 1.0  # 0 = off


@pytest.mark.parametrize('clock, stamp, now, fix', [
    ('wall', 12.3, 1.7e9, 'set use_sim_time true on this node'),
    ('sim', 1.7e9, 12.3, 'set use_sim_time false on this node'),
    ('sim', 5.0, 0.0, 'has received none'),
])
def test_a_clock_mismatch_is_named_with_its_fix_and_fails_the_self_check(robot, model, clock,
                                                                         stamp, now, fix):
    mono = [0.0]
    ctrl = PolicyController(robot, clock=clock, monotonic=lambda: mono[0])
    ctrl.load_path(model)
    for k in range(60):
        t = now + k * DT if now else 0.0  # no /clock: the node's time stays 0
        mono[0] = k * DT
        ctrl.on_imu(stamp + k * DT, [0, 0, 0, 1], [0, 0, 0], t)
        assert ctrl.on_joint_state(stamp + k * DT, robot.joint_names, robot.default_joint_pos,
                                   np.zeros(12), t) is None
        if k == 45:  # 0.9 s: a start-up race (a state before the first /clock) is not named
            assert not ctrl.alerts.pending
    assert ctrl.drops['clock_mismatch'] == 120
    alerts = ctrl.alerts.drain()
    assert len(alerts) == 1 and fix in alerts[0][1]  # logged once, with the fix
    assert fix in ctrl.diagnostics()['clock_problem']
    problems = ctrl.check()  # judged on usable states, not on received ones
    assert any(p.startswith('usable states: 0 of the last 50') for p in problems), problems


def test_action_clip_metadata_is_checked_and_applied(robot, tmp_path):
    with pytest.raises(ModelRejected, match=r'action_clip metadata = None'):
        validate_model(clip_model(robot, tmp_path / 'none.onnx', None).read_bytes(), robot)
    with pytest.raises(ModelRejected, match=r'action_clip metadata = -1'):
        validate_model(clip_model(robot, tmp_path / 'neg.onnx', -1).read_bytes(), robot)
    # A graph that does not clip to what its metadata says (0.01 x probe inputs up to ~30).
    with pytest.raises(ModelRejected, match=r'beyond the model\'s action_clip 0.1'):
        validate_model(clip_model(robot, tmp_path / 'lie.onnx', 0.1, 1.0).read_bytes(), robot)
    # The node applies the model's clip to the action and the last-action observation.
    ctrl = PolicyController(robot)
    ctrl.load_path(clip_model(robot, tmp_path / 'c3.onnx', 3.0, 0.0))
    assert ctrl.assembler.action_clip == 3.0
    ctrl.assembler.advance(np.full(12, 5.0))
    assert ctrl.assembler.last_action.max() == 3.0
    assert ctrl.diagnostics()['action_clip'] == 3.0


def test_a_model_set_by_path_is_named_by_its_path(robot, tmp_path):
    path = wrong_spec_model(robot, tmp_path / 'other_robot.onnx')
    ctrl = PolicyController(robot)
    with pytest.raises(ModelRejected) as info:
        ctrl.load_path(path)
    assert str(path) in str(info.value) and '<model bytes>' not in str(info.value)
    assert str(path) in ctrl.last_swap


def test_a_restart_after_a_crash_is_a_latched_fault_under_the_operator(robot, model, tmp_path):
    marker = RunMarker('/robot/policy_node', tmp_path)
    assert marker.claim() is None  # first start
    marker.release()
    assert marker.claim() is None  # after a clean stop
    marker.path.write_text('999999999')  # a process that died holding the marker
    detail = marker.claim()
    assert 'without a clean stop' in detail and int(marker.path.read_text()) == os.getpid()
    ctrl = PolicyController(robot, safety=SafetyConfig(autostart=False))
    ctrl.load_path(model)
    ctrl.restarted(detail)
    feed = Feed(robot, ctrl)
    feed.tick()
    ok, message = ctrl.request('stand_up', feed.t)
    assert not ok and 'restart latched' in message
    assert ctrl.request('reset', feed.t)[0] and ctrl.request('stand_up', feed.t)[0]
    auto = PolicyController(robot)  # autostart (simulation): counted, not latched
    auto.restarted(detail)
    assert not auto.safety.latched and auto.safety.faults['restarted'] == 1


@pytest.mark.parametrize('kwargs, words', [
    ({'stale_after_periods': 1e39}, r'stale_after_periods = 1e\+39; must be in \[1.5, 100\]'),
    ({'stale_after_periods': float('nan')}, 'stale_after_periods = nan'),
    ({'cmd_vel_timeout_s': float('nan')}, 'cmd_vel_timeout_s = nan'),
    ({'cmd_vel_timeout_s': -1.0}, 'cmd_vel_timeout_s = -1.0'),
    ({'wall_stale_after_s': float('inf')}, 'wall_stale_after_s = inf'),
])
def test_timing_parameters_refuse_their_worst_values_by_name(robot, kwargs, words):
    """A watchdog limit of 1e39 periods would leave a dead robot undamped: refused."""
    with pytest.raises(ValueError, match=words):
        PolicyController(robot, **kwargs)
