"""The excitation of system identification without ROS: its parameters (the variants, the
refusals by name, the policy node's ``excite_*`` parameters), the EXCITE state of the safety
state machine (only from a finished stand-up, stop and end back to STAND_UP, faults to
damping) and the controller's commands (default pose + offset, shaped, on the stamps' time)."""

import dataclasses
import json

import numpy as np
import pytest

from claw_rl_ros.core.config import ConfigError
from claw_rl_ros.core.control.excitation import (Excitation, ExcitationConfig, from_params,
                                                 GROUND_MAX_AMPLITUDE, VARIANT_DEFAULTS)
from claw_rl_ros.core.control.policy_controller import PolicyController
from claw_rl_ros.core.control.safety import (EXCITE, PASSIVE, RL, SafetyConfig, SafetyMachine,
                                             SIT_DOWN, STAND_UP)
from claw_rl_ros.core.params.node_config import excitation_values, PolicyParams

DT = 0.02
DEPLOY = dict(autostart=False, stand_up_s=0.2, sit_down_s=0.2, fade_in_s=0.2)
# A short run: 3 groups x (0.1 settle + 0.4 chirp + 3 x 0.1 steps) = 2.4 s.
SHORT = ExcitationConfig(chirp_s=0.4, ramp_s=0.1, step_hold_s=0.1, settle_s=0.1)


class Feed:
    """One consistent (IMU, joint state) pair per control period, stamped on the node clock."""

    def __init__(self, ctrl, robot, t=100.0):
        self.ctrl, self.robot, self.t = ctrl, robot, t
        self.pos = robot.default_joint_pos.copy()

    def tick(self, dt=DT, stamp_lag=0.0):
        self.t += dt
        stamp = self.t - stamp_lag
        self.ctrl.on_imu(stamp, [0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0], self.t)
        out = self.ctrl.on_joint_state(stamp, self.robot.joint_names, self.pos,
                                       np.zeros(self.robot.num_joints), self.t)
        return None if out is None else np.asarray(out)


def standing(robot, cfg=SHORT, **kwargs):
    """A deploy controller (no model) stood up at the default pose, and its feed."""
    ctrl = PolicyController(robot, safety=SafetyConfig(**DEPLOY), excitation=cfg, **kwargs)
    feed = Feed(ctrl, robot)
    for _ in range(5):
        feed.tick()
    assert ctrl.request('stand_up', feed.t) == (True, STAND_UP)
    for _ in range(int(DEPLOY['stand_up_s'] / DT) + 1):
        feed.tick()
    return ctrl, feed


# ---------------------------------------------------------------------------- parameters
def test_the_variants_defaults_and_the_refusals_name_the_parameter(robot):
    stand = from_params({}, robot)
    assert (stand.variant, stand.amplitude) == ('stand', 0.15) and stand == ExcitationConfig()
    ground = from_params({'variant': 'ground', 'amplitude': 0.0}, robot)
    assert ground.amplitude == VARIANT_DEFAULTS['ground']['amplitude'] == 0.08
    assert from_params({'variant': 'ground', 'amplitude': 0.1}, robot).amplitude == 0.1
    refusals = {
        (('amplitude', 0.7),): 'excite_amplitude: 0.7 is out of range; allowed: > 0, <= 0.5',
        (('amplitude', float('nan')),): 'excite_amplitude: NaN',
        (('variant', 'ground'), ('amplitude', 0.2)): 'excite_amplitude: 0.2 rad on the ground',
        (('variant', 'air'),): "excite_variant: 'air'; use one of stand, ground",
        (('pattern', 'per_arm'),): "excite_pattern: 'per_arm'; use one of per_joint",
        (('f_end', 14.0),): 'excite_f_end: 14.0 Hz is above a quarter of the 50 Hz control',
        (('f_start', 9.0),): 'excite_f_start: 9.0 Hz is above f_end (8.0 Hz)',
        (('ramp_s', 4.0),): 'excite_ramp_s: 4.0 s fades in and out over more than the 6.0 s',
        (('chirp_s', 0.0), ('step_hold_s', 0.0)): 'excite_chirp_s: 0 with step_hold_s 0',
        (('settle_s', -1.0),): 'excite_settle_s: -1.0 is out of range',
        (('bogus', 1.0),): 'excite_bogus: unknown key'}
    for given, message in refusals.items():
        with pytest.raises(ConfigError) as exc:
            from_params(dict(given), robot, 'policy_node parameters', 'excite_')
        assert str(exc.value).startswith(f'policy_node parameters: {message}'), exc.value
    # A run beyond a joint's limits is refused naming the joint (one near its upper limit).
    upper = robot.joint_upper.copy()
    upper[5] = robot.default_joint_pos[5] + 0.1
    tight = dataclasses.replace(robot, joint_upper=upper)
    with pytest.raises(ConfigError, match='amplitude: 0.15 rad around the default pose leaves '
                       'FR_calf_joint\'s limits'):
        Excitation(tight, ExcitationConfig())
    assert GROUND_MAX_AMPLITUDE < 0.2  # the safe bound, stricter on the ground


def test_the_policy_node_declares_every_field_as_an_excite_parameter(robot):
    p = PolicyParams()
    fields = {f.name: f for f in dataclasses.fields(PolicyParams)}
    for name in ExcitationConfig.__dataclass_fields__:
        assert fields[f'excite_{name}'].metadata['doc'].startswith('EXCITE: ')
    assert fields['excite_variant'].metadata['choices'] == ('stand', 'ground')
    assert "0: the variant's (stand 0.15, ground 0.08)" in fields['excite_amplitude'].metadata[
        'doc']
    assert from_params(excitation_values(p), robot) == ExcitationConfig()
    ground = dataclasses.replace(p, excite_variant='ground', excite_f_end=6.0)
    assert from_params(excitation_values(ground), robot) == ExcitationConfig(
        variant='ground', amplitude=0.08, f_end=6.0)


def test_the_run_record_rebuilds_the_plan(robot):
    run = Excitation(robot, SHORT)
    record = json.loads(json.dumps(run.describe(123.5)))
    assert record['start_stamp'] == 123.5 and record['duration_s'] == pytest.approx(2.4)
    assert [s['label'] for s in record['segments']] == ['hip', 'thigh', 'calf']
    assert record['segments'][2]['joints'] == [n for n in robot.joint_names if 'calf' in n]
    again = Excitation(robot, ExcitationConfig(**record['config']))
    for t in np.linspace(0, 2.4, 50):
        np.testing.assert_array_equal(again.offset(t), run.offset(t))


# ------------------------------------------------------------------------- state machine
def test_excite_only_from_a_finished_stand_up(robot):
    q0 = robot.default_joint_pos
    m = SafetyMachine(robot, SafetyConfig(**DEPLOY))
    assert m.request('excite', 1.0, q0) == (
        False, 'excite refused in PASSIVE; allowed from STAND_UP')
    assert m.request('excite_stop', 1.0, q0) == (
        False, 'excite_stop refused in PASSIVE; allowed from EXCITE')
    assert m.request('stand_up', 1.0, q0)[0]
    assert m.request('excite', 1.1, q0) == (
        False, 'excite refused: STAND_UP has not reached the default pose yet')
    assert m.request('excite', 1.25, None) == (
        False, 'excite refused: no fresh complete joint state and IMU reading')
    assert m.request('excite', 1.25, q0) == (True, EXCITE)
    assert m.request('rl', 1.3, q0) == (False, 'rl refused in EXCITE; allowed from STAND_UP')
    with pytest.raises(ValueError, match='in EXCITE the excitation gives the target'):
        m.target(1.3, q0)
    # Stop: back to STAND_UP from the measured pose (the stand-up's interpolation again).
    bent = q0 + 0.1
    assert m.request('excite_stop', 1.4, bent) == (True, STAND_UP)
    np.testing.assert_allclose(m.target(1.4, bent), bent)
    np.testing.assert_allclose(m.target(1.5, bent), q0 + 0.05, atol=1e-12)
    assert m.request('excite', 1.5, q0)[1] == 'excite refused: STAND_UP has not reached ' \
        'the default pose yet'
    assert m.request('excite', 1.65, q0) == (True, EXCITE)
    m.end_excitation(2.0, q0)
    assert (m.state, m.history[-1].reason) == (STAND_UP, 'excitation done')
    # From RL: refused; from EXCITE: sit_down, passive and every fault leave it.
    assert m.request('rl', 2.3, q0) == (True, RL)
    assert m.request('excite', 2.3, q0) == (False, 'excite refused in RL; allowed from STAND_UP')
    for leave, expected in (('sit_down', SIT_DOWN), ('passive', PASSIVE), ('tilt', PASSIVE),
                            ('estop', PASSIVE)):
        m = SafetyMachine(robot, SafetyConfig(**DEPLOY))
        m.request('stand_up', 0.0, q0)
        assert m.request('excite', 0.5, q0) == (True, EXCITE)
        if leave in ('sit_down', 'passive', 'estop'):
            assert m.request(leave, 0.6, q0)[0]
        else:
            m.fault(leave, 0.6, 'test')
        assert m.state == expected, leave
    assert m.latched and m.request('stand_up', 0.7, q0)[0] is False  # the e-stop latches
    # The gate: a refusal names what the live self-check found.
    m = SafetyMachine(robot, SafetyConfig(**DEPLOY), excite_gate=lambda: 'imu rate: 9 Hz')
    m.request('stand_up', 0.0, q0)
    assert m.request('excite', 0.5, q0) == (False, 'excite refused: imu rate: 9 Hz')


# ---------------------------------------------------------------------------- controller
def test_commands_are_the_default_pose_plus_the_offset_shaped_on_the_stamps_time(robot):
    ctrl, feed = standing(robot)  # no model: an excitation needs none
    assert ctrl.policy is None and ctrl.request('excite', feed.t) == (True, EXCITE)
    feed.pos = robot.default_joint_pos - 0.05  # the joints sag under load
    assert ctrl.take_excitation_start() is None  # not before its first tick
    plan, d = Excitation(robot, SHORT), ctrl.shaper.max_delta
    q0, prev, t0, moved = robot.default_joint_pos, None, None, 0.0
    for k in range(200):
        # Stamps 0 or 5 ms behind the node clock: the run's time is the stamps'.
        lag = 0.005 * (k % 2)
        cmd = feed.tick(stamp_lag=lag)
        if t0 is None:
            t0 = feed.t - lag
            assert ctrl.take_excitation_start() == t0 and ctrl.take_excitation_start() is None
        if ctrl.safety.state != EXCITE:
            break
        t = feed.t - lag - t0
        diag = ctrl.diagnostics()
        assert diag['safety_state'] == EXCITE and diag['excitation'].endswith('/2.4 s')
        expected = np.clip(q0 + plan.offset(t), robot.joint_lower, robot.joint_upper)
        if prev is not None:
            expected = np.clip(expected, prev - d, prev + d)
        np.testing.assert_allclose(cmd, expected, rtol=0, atol=1e-12)
        np.testing.assert_allclose(ctrl.last_gains[0], robot.kp)  # full gains, not damping
        moved = max(moved, float(np.abs(cmd - q0).max()))
        prev = cmd
    assert moved == pytest.approx(SHORT.amplitude)  # the steps reach +-amplitude
    assert feed.t - lag - t0 == pytest.approx(plan.duration, abs=DT)
    assert str(ctrl.safety.history[-1]) == 'EXCITE -> STAND_UP (excitation done)'
    # STAND_UP goes on from the last command, not from the (sagging) measured pose.
    np.testing.assert_allclose(cmd, prev, atol=1e-12)
    assert ctrl.diagnostics()['excitation'] == 'idle'


def test_the_rate_limit_shapes_steps_larger_than_one_tick(robot):
    cfg = ExcitationConfig(amplitude=0.5, chirp_s=0.0, step_hold_s=0.1, settle_s=0.03)
    ctrl, feed = standing(robot, cfg, max_delta_per_tick=0.2)
    assert ctrl.request('excite', feed.t)[0]
    cmds = [feed.tick() for _ in range(12)]
    steps = np.abs(np.diff(np.array(cmds), axis=0)).max(axis=1)
    assert steps.max() == pytest.approx(0.2)  # +-0.5 and the 1.0 swing, 0.2 per tick
    hips = [c[0] - robot.default_joint_pos[0] for c in cmds]
    # Settle, the step to +0.5 in 0.2 rad ticks, held, then the swing to -0.5 likewise.
    assert hips == pytest.approx([0, 0, 0.2, 0.4, 0.5, 0.5, 0.5, 0.3, 0.1, -0.1, -0.3, -0.5])
    assert ctrl.safety.state == EXCITE and ctrl.holds.summary('holds')['holds_stale'] == 0


def test_stop_fault_and_stale_state_fall_back_as_from_rl(robot):
    q0 = robot.default_joint_pos
    # Stop: STAND_UP at once, from the last command (not the measured pose of a joint that
    # sags under load: no jump), back to the default pose within stand_up_s.
    ctrl, feed = standing(robot)
    ctrl.request('excite', feed.t)
    feed.pos = q0 - 0.05
    for _ in range(30):
        last = feed.tick()
    assert np.abs(last - q0).max() > 0.1
    assert ctrl.request('excite_stop', feed.t) == (True, STAND_UP)
    back = [feed.tick() for _ in range(int(DEPLOY['stand_up_s'] / DT) + 2)]
    np.testing.assert_allclose(back[0], last + DT / DEPLOY['stand_up_s'] * (q0 - last))
    np.testing.assert_allclose(back[-1], q0)
    feed.pos = q0.copy()
    # A fault (tilt): PASSIVE, damping at the measured pose, Kp = 0.
    ctrl.request('excite', feed.t + DT)
    feed.tick()
    assert ctrl.safety.state == EXCITE
    feed.t += DT
    ctrl.on_imu(feed.t, [0.0, 0.7, 0.0, 0.714], [0.0] * 3, feed.t)
    cmd = ctrl.on_joint_state(feed.t, robot.joint_names, feed.pos, np.zeros(12), feed.t)
    assert ctrl.safety.state == PASSIVE and ctrl.safety.last_fault.startswith('tilt')
    np.testing.assert_array_equal(cmd, feed.pos)
    assert not ctrl.last_gains[0].any()
    # Stale state: the watchdog (4 polls a period) damps within 3 periods of the last one.
    ctrl, feed = standing(robot)
    ctrl.request('excite', feed.t)
    for _ in range(30):
        feed.tick()
    last, now, held = feed.t, feed.t, None
    while held is None:
        now += DT / 4
        held = ctrl.watchdog(now)
        assert now - last <= 3 * DT + 1e-9, 'no damping within 3 periods'
    assert ctrl.safety.state == PASSIVE and ctrl.safety.last_fault.startswith(
        'stale_joint_states')
    np.testing.assert_array_equal(held, feed.pos)
    # An out-of-range state (a joint far beyond its limits): a fault of its tick, damping.
    ctrl, feed = standing(robot)
    ctrl.request('excite', feed.t)
    feed.tick()
    feed.pos = q0.copy()
    feed.pos[2] = 9.0
    cmd = feed.tick()
    assert ctrl.safety.state == PASSIVE and ctrl.safety.faults['bad_input'] == 1
    assert ctrl.request('excite', feed.t) == (
        False, 'excite refused in PASSIVE; allowed from STAND_UP')


def test_the_live_self_check_gates_the_excitation(robot):
    # The command controller's joints in another order: refused, the mismatch named.
    other = list(reversed(robot.joint_names))
    ctrl, feed = standing(robot, command_joints=other)
    ok, message = ctrl.request('excite', feed.t)
    assert not ok and message.startswith('excite refused: the self-check found 1 mismatch(es):'
                                         ' command interface joint order'), message
    # States at 25 Hz: the rate is named.
    ctrl, feed = standing(robot)
    for _ in range(25):
        feed.tick(dt=2 * DT)
    ok, message = ctrl.request('excite', feed.t)
    assert not ok and '/joint_states rate: 25.0 Hz' in message, message
