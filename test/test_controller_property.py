"""Property-based test of the ROS-free policy controller: random interleavings of joint states,
IMU readings, cmd_vel, clock moves (forward, backward, stalled) and operator requests, with any
float64 (nan, +-inf, +-1e39, subnormals, huge), random and backward stamps, random names and
lengths. Whatever arrives, the controller never raises, never needs its exception guard, and
every command it returns is safe (see :func:`check_command`). The same for the excitation of
system identification (EXCITE) over random excitation parameters: every command is the
shaped ``q0 + offset(t)`` inside the limits and the rate, damping within 3 periods."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings, strategies as st
import numpy as np
import pytest

from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
from claw_rl_ros.core.config import ConfigError
from claw_rl_ros.core.control.excitation import (Excitation, ExcitationConfig, PATTERNS,
                                                 VARIANTS)
from claw_rl_ros.core.control.policy_controller import PolicyController
from claw_rl_ros.core.control.safety import (EXCITE, PASSIVE, REQUESTS, RL, SafetyConfig,
                                             SIT_DOWN, STAND_UP)
from control_models import good_model

DT = 0.02
MAX_AGE = 3 * DT
CFG = dict(autostart=False, stand_up_s=0.1, sit_down_s=0.1, fade_in_s=0.2)
HOSTILE = [math.nan, math.inf, -math.inf, 1e39, -1e39, 5e-324, -5e-324, 1e308, -1e308, -0.0,
           3.5e38, 1e30, 1e-30]
any_float = st.one_of(st.sampled_from(HOSTILE), st.floats(allow_nan=True, allow_infinity=True),
                      st.floats(-2.0, 2.0))


class Recorded:
    """The real ONNX student, remembering its last action (the invariants recompute targets)."""

    def __init__(self, policy: OnnxPolicy):
        self.policy, self.last = policy, None
        self.spec, self.sha256, self.action_clip = policy.spec, policy.sha256, policy.action_clip

    def __call__(self, obs):
        self.last = self.policy(obs)
        return self.last


class Clock:
    """The node clock (can step back or stall) and the monotonic receive clock (never back)."""

    def __init__(self):
        self.now, self.mono = 100.0, 0.0


def one_bad(base) -> st.SearchStrategy:
    """``base`` (a list of healthy values) with one element replaced by any float."""
    return st.tuples(st.integers(0, len(base) - 1), any_float).map(
        lambda iv: [iv[1] if k == iv[0] else b for k, b in enumerate(base)])


def events(robot):
    names = st.one_of(st.just(list(robot.joint_names)),
                      st.permutations(list(robot.joint_names)),
                      st.lists(st.sampled_from(list(robot.joint_names) + ['x', '']),
                               max_size=14))
    # Right-length fields with one hostile value reach the policy; any list tests lengths.
    joints = st.one_of(st.just(None), st.lists(any_float, max_size=14),
                       one_bad(list(robot.default_joint_pos)), one_bad([0.0] * 12))
    stamp = st.one_of(st.just(0.0), st.sampled_from([-1e-3, -DT, -0.5, 60.0, -60.0, 0.011]),
                      any_float)
    return st.lists(st.one_of(
        st.tuples(st.just('good'), st.floats(0.0, 2 * DT)),  # a healthy pair, then time
        # A tick (time moves on by a period) with a hostile joint state or IMU reading and
        # its healthy partner, or the hostile message alone.
        st.tuples(st.just('state'), stamp, names, joints, joints, st.booleans()),
        st.tuples(st.just('imu'), stamp,
                  st.one_of(st.lists(any_float, max_size=5), one_bad([0.0, 0.0, 0.0, 1.0])),
                  st.one_of(st.lists(any_float, max_size=4), one_bad([0.0, 0.0, 0.0])),
                  st.booleans()),
        st.tuples(st.just('cmd'), any_float, any_float, any_float),
        st.tuples(st.just('time'), st.sampled_from([DT, DT / 4, 5 * DT, 0.0]),
                  st.sampled_from([DT, DT / 4, 5 * DT, 0.0, -10.0, 1e6, -100.0])),
        st.tuples(st.just('watchdog')),
        st.tuples(st.just('request'), st.sampled_from(list(REQUESTS) * 3 + ['bogus', '']))),
        min_size=1, max_size=60)


class Checker:
    """Drives a controller and checks every output against the safety invariants."""

    def __init__(self, robot, policy, excitation: ExcitationConfig | None = None):
        self.robot, self.clock = robot, Clock()
        self.ctrl = PolicyController(robot, safety=SafetyConfig(**CFG),
                                     monotonic=lambda: self.clock.mono, excitation=excitation)
        # The plan, built here: EXCITE's commands are checked against it.
        self.plan = Excitation(robot, excitation or ExcitationConfig())
        self.excite_t0: float | None = None  # stamp of the first state a run answered
        self.seen = {'excite_ticks': 0, 'excite_done': 0, 'excite_faults': 0}
        self.ctrl.policy = policy
        self.ctrl.assembler.action_clip = policy.action_clip
        self.ctrl._unverified = None
        self.policy = policy
        self.prev: np.ndarray | None = None  # previous command (spec order) and its state
        self.prev_passive = True
        self.outputs = 0
        self.latched = False
        self.rl_since: float | None = None

    def run(self, event) -> None:
        kind, c = event[0], self.clock
        accepted, outputs = self.ctrl.last_accepted_at, self.outputs
        r = self.robot
        if kind == 'good':
            c.now += DT
            c.mono += DT
            self.out(self.ctrl.on_imu(c.now, [0, 0, 0, 1], [0, 0, 0], c.now))
            self.out(self.ctrl.on_joint_state(c.now, r.joint_names, r.default_joint_pos,
                                              np.zeros(r.num_joints), c.now))
            c.mono += event[1]
        elif kind == 'state':
            _, offset, names, pos, vel, tick = event
            names = list(r.joint_names) if pos is not None and len(pos) == 12 and \
                len(names) != 12 else names
            pos = r.default_joint_pos if pos is None else pos
            vel = np.zeros(r.num_joints) if vel is None else vel
            if tick:
                c.now += DT
                c.mono += DT
                self.out(self.ctrl.on_imu(c.now, [0, 0, 0, 1], [0, 0, 0], c.now))
            self.out(self.ctrl.on_joint_state(c.now + offset, names, pos, vel, c.now))
        elif kind == 'imu':
            if event[4]:
                c.now += DT
                c.mono += DT
            self.out(self.ctrl.on_imu(c.now + event[1], event[2], event[3], c.now))
            if event[4]:
                self.out(self.ctrl.on_joint_state(c.now, r.joint_names, r.default_joint_pos,
                                                  np.zeros(r.num_joints), c.now))
        elif kind == 'cmd':
            self.ctrl.on_command(*event[1:])
        elif kind == 'time':
            c.mono += event[1]
            c.now += event[2]
        elif kind == 'watchdog':
            self.out(self.ctrl.watchdog(c.now))
        else:
            ok, message = self.ctrl.request(event[1], c.now)
            assert isinstance(ok, bool) and isinstance(message, str)
            if ok and event[1] == 'excite':
                self.excite_t0 = None
            if ok and event[1] == 'estop':
                self.latched = True
            elif ok and event[1] == 'reset':
                self.latched = False
        if self.ctrl.last_accepted_at != accepted:  # every accepted state is answered
            assert self.outputs > outputs, 'a state was accepted without a command'
        self.after_event()

    def out(self, targets) -> None:
        if targets is None:
            return
        self.outputs += 1
        self.check_command(self.ctrl.order.from_output(np.asarray(targets)))

    def check_command(self, cmd: np.ndarray) -> None:
        """Finite; PASSIVE: the measured pose itself (no push); otherwise inside the joint
        limits and within max_delta of the previous command (or of the clamped pose when it
        leaves PASSIVE); in RL exactly the faded, clipped, shaped policy target."""
        r, ctrl = self.robot, self.ctrl
        assert cmd.shape == (r.num_joints,) and np.isfinite(cmd).all(), cmd
        if ctrl.safety.state == PASSIVE:
            np.testing.assert_array_equal(cmd, ctrl.measured_pose)
        else:
            assert not self.latched, 'a command other than damping while e-stop is latched'
            lo, hi = r.joint_lower, r.joint_upper
            assert (cmd >= lo - 1e-12).all() and (cmd <= hi + 1e-12).all(), cmd
            base = np.clip(ctrl.measured_pose, lo, hi) if self.prev_passive else self.prev
            d = ctrl.shaper.max_delta
            assert (np.abs(cmd - base) <= d + 1e-9).all(), (cmd, base)
            if ctrl.safety.state == RL:
                self.check_rl(cmd, base, d)
            if ctrl.safety.state == EXCITE:
                self.check_excite(cmd, base, d)
        self.prev, self.prev_passive = cmd, ctrl.safety.state == PASSIVE

    def check_excite(self, cmd, base, d) -> None:
        """EXCITE: exactly ``q0 + offset(t)`` clamped to the limits and rate-limited from the
        previous command by one step fraction shared by every joint (a tick that stood for
        less than a period gets a smaller step), ``t`` by the stamps since the run's first."""
        r, stamp = self.robot, self.ctrl._last_state_stamp
        if self.excite_t0 is None:
            self.excite_t0 = stamp
        t = stamp - self.excite_t0
        assert 0 <= t < self.plan.duration, (t, self.plan.duration)
        raw = np.clip(r.default_joint_pos + self.plan.offset(t), r.joint_lower, r.joint_upper)
        cut = np.abs(cmd - raw) > 1e-9
        fraction = 1.0
        if cut.any():
            fractions = np.abs(cmd - base)[cut] / d[cut]
            fraction = float(fractions[0])
            np.testing.assert_allclose(fractions, fraction, rtol=0, atol=1e-9)
            assert 0 < fraction <= 1 + 1e-9, fraction
            # A cut joint moved towards its target, never past it.
            assert (np.sign(cmd - base)[cut] == np.sign(raw - base)[cut]).all(), (cmd, raw)
        assert (np.abs(raw - base)[~cut] <= fraction * d[~cut] + 1e-9).all(), (cmd, raw, base)
        self.seen['excite_ticks'] += 1

    def check_rl(self, cmd, base, d) -> None:
        r = self.robot
        fade = min(1.0, max(0.0, (self.clock.now - self.rl_since) / CFG['fade_in_s']))
        clip = self.policy.action_clip
        raw = r.default_joint_pos + fade * r.action_scale * np.clip(self.policy.last, -clip,
                                                                    clip)
        expected = np.clip(raw, np.maximum(r.joint_lower, base - d),
                           np.minimum(r.joint_upper, base + d))
        np.testing.assert_allclose(cmd, expected, rtol=0, atol=1e-9)

    def after_event(self) -> None:
        ctrl, c = self.ctrl, self.clock
        assert ctrl.guard.counts.total == 0, f'the exception guard fired: {ctrl.guard.last}'
        for t in ctrl.safety.drain():
            if t.target == RL:  # only from a finished STAND_UP, by the operator
                assert t.source == STAND_UP and t.reason == 'operator rl', t
                self.rl_since = t.stamp
            if t.target == STAND_UP:
                assert not self.latched
            if t.target == EXCITE:  # only from a finished STAND_UP, by the operator
                assert t.source == STAND_UP and t.reason == 'operator excite', t
            if t.source == EXCITE:
                assert (t.target, t.reason) in ((STAND_UP, 'operator excite_stop'),
                                                (STAND_UP, 'excitation done'),
                                                (SIT_DOWN, 'operator sit_down'),
                                                (PASSIVE, 'operator passive')) or \
                    (t.target == PASSIVE and t.reason.startswith('fault')), t
                if t.reason == 'excitation done':  # at its end, by the stamps
                    assert ctrl._last_state_stamp - self.excite_t0 >= self.plan.duration
                    self.seen['excite_done'] += 1
                elif t.reason.startswith('fault'):
                    self.seen['excite_faults'] += 1
        if ctrl.safety.state != PASSIVE and ctrl.last_accepted_at is not None and \
                c.mono - ctrl.last_accepted_at > MAX_AGE:
            # Damping within stale_after_periods periods of the last good state.
            self.out(ctrl.watchdog(c.now))
            assert ctrl.safety.state == PASSIVE, 'no damping after 3 periods without a state'


@pytest.fixture(scope='module')
def onnx_student(robot, tmp_path_factory):
    return OnnxPolicy(good_model(robot, tmp_path_factory.mktemp('p') / 'a.onnx'), robot)


# Operator scripts that bring the machine up: a healthy tick, a stand-up (done after 5
# ticks), RL or the excitation.
SCRIPT = {'good': [('good', 0.0)], 'stand': [('request', 'stand_up')] + [('good', 0.0)] * 6,
          'rl': [('request', 'rl'), ('good', 0.0)],
          'excite': [('request', 'excite'), ('good', 0.0)]}
STEPS = list(SCRIPT)
# An excitation that moves within a few ticks of its start (the default rests 0.5 s first).
MOVING = ExcitationConfig(settle_s=0.04, chirp_s=1.0, ramp_s=0.1, step_hold_s=0.1)


def test_controller_survives_any_input_and_every_command_is_safe(robot, onnx_student):
    @settings(max_examples=1000, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(events(robot), st.one_of(st.just(['good', 'stand', 'rl']),
                                    st.just(['good', 'stand', 'excite']),
                                    st.lists(st.sampled_from(STEPS), max_size=12)))
    def run(evts, prefix):
        checker = Checker(robot, Recorded(onnx_student), MOVING)
        # A prefix that often reaches RL or EXCITE, so the hostile events also hit them.
        for step in prefix:
            for event in SCRIPT[step]:
                checker.run(event)
        for event in evts:
            checker.run(event)
    run()


def test_the_checker_sees_a_pushing_passive_target(robot, onnx_student, monkeypatch):
    """The invariants bite: PASSIVE clamped into the limits (the old damping target) fails."""
    checker = Checker(robot, Recorded(onnx_student))
    real = checker.ctrl.shaper.restart
    monkeypatch.setattr(checker.ctrl, '_hold', lambda now: checker.ctrl._out(
        now, real(checker.ctrl.measured_pose), None))
    beyond = robot.default_joint_pos.copy()
    beyond[2] = robot.joint_upper[2] + 0.3
    checker.run(('good', 0.0))
    with pytest.raises(AssertionError):
        checker.run(('state', 0.0, list(robot.joint_names), list(beyond), [0.0] * 12, True))


@st.composite
def runnable_configs(draw) -> ExcitationConfig:
    """Excitation parameters this robot runs: short runs, so many end inside an example."""
    variant = draw(st.sampled_from(VARIANTS))
    f_end = draw(st.floats(0.1, 12.5))
    chirp_s = draw(st.one_of(st.just(0.0), st.floats(0.05, 0.4)))
    return ExcitationConfig(
        variant=variant, pattern=draw(st.sampled_from(PATTERNS)),
        amplitude=draw(st.floats(1e-3, 0.15 if variant == 'ground' else 0.5)),
        f_start=draw(st.floats(0.1, f_end)), f_end=f_end, chirp_s=chirp_s,
        step_hold_s=draw(st.floats(0.02 if chirp_s == 0 else 0.0, 0.1)),
        ramp_s=draw(st.floats(0.0, chirp_s / 2)), settle_s=draw(st.floats(0.0, 0.1)))


def excitation_configs() -> st.SearchStrategy:
    """Random excitation parameters: mostly runnable, the rest anything, often out of their
    bounds or not runnable on this robot (refused by name)."""
    def number(low, high, bad=()):
        return st.one_of(st.floats(low, high), st.sampled_from(list(bad) + [low, high]))
    anything = st.builds(
        ExcitationConfig, variant=st.sampled_from(VARIANTS + ('air',)),
        pattern=st.sampled_from(PATTERNS + ('per_arm',)),
        amplitude=number(1e-3, 0.5, (0.0, 0.7, math.nan, math.inf)),
        f_start=number(0.1, 14.0, (0.0, -1.0)), f_end=number(0.1, 14.0, (30.0, math.nan)),
        chirp_s=number(0.0, 0.6, (-1.0,)), step_hold_s=number(0.0, 0.1, (math.inf,)),
        ramp_s=number(0.0, 0.3), settle_s=number(0.0, 0.1))
    return st.one_of(runnable_configs(), runnable_configs(), runnable_configs(), anything)


def test_the_excitation_never_leaves_the_safety_envelope(robot, onnx_student):
    """Random excitation parameters, then random faults on a running excitation (stale and
    out-of-range states, e-stop, clock steps, operator requests): a config the robot cannot
    run is refused by name; every command of a runnable one is within the joint limits and
    the rate limit, EXCITE's exactly the planned target shaped, damping within 3 periods of
    the last accepted state; the run ends by itself back in STAND_UP."""
    seen = {'refused': 0, 'excite_ticks': 0, 'excite_done': 0, 'excite_faults': 0}

    @settings(max_examples=300, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(excitation_configs(), events(robot),
           st.integers(0, 150))
    def run(cfg, evts, healthy):
        try:
            checker = Checker(robot, Recorded(onnx_student), cfg)
        except ConfigError as exc:
            field = exc.key
            assert field in ExcitationConfig.__dataclass_fields__, exc
            seen['refused'] += 1
            return
        for step in ('good', 'stand', 'excite'):
            for event in SCRIPT[step]:
                checker.run(event)
        assert checker.ctrl.safety.state == EXCITE
        # Healthy ticks first (a run may end), then the hostile events.
        for event in [('good', 0.0)] * healthy + evts:
            checker.run(event)
        for key, value in checker.seen.items():
            seen[key] += value
    run()
    # The examples reached what they test: refusals, runs, ends and faults while exciting.
    assert all(n >= 10 for n in seen.values()), seen
