"""The policy node's gait clock follows the state stamps (issue 54 item 3): a robot whose states
come at 48 or 52 Hz instead of the nominal 50 keeps its gait in phase, a gap or a repeated
stamp moves the clock by at most its bound and never to NaN, and the rate limit follows the
measured time too. The controller is driven with synthetic stamps (no sleeps, no timing)."""

import math

import numpy as np
import pytest

from claw_rl_ros.core.control.command_shaping import CommandShaper
from claw_rl_ros.core.control.policy_controller import PolicyController
from claw_rl_ros.core.control.safety import RL, SafetyConfig
from claw_rl_ros.core.control.state_input import ObservationAssembler
from claw_rl_ros.core.sim.observations import bounded_elapsed, ELAPSED_BOUNDS_PERIODS

UPRIGHT = [0.0, 0.0, 0.0, 1.0]  # ROS x, y, z, w


class PhaseProbe:
    """A stand-in policy (the robot's own spec, a settable action) that keeps, per call, the
    gait phase it observed: the assembler's float64 clock and the sin/cos term of its input."""

    sha256 = 'e' * 64

    def __init__(self, ctrl, robot, action=None):
        self.ctrl, self.spec = ctrl, robot.to_metadata()
        self.action = np.zeros(robot.num_joints) if action is None else action
        [term] = [s for s in robot.policy_obs.slices if s.name == 'gait_phase']
        self.term = slice(term.start, term.start + term.size)
        self.scale = term.scale
        self.clock: list[float] = []  # the float64 phase each observation was built from
        self.seen: list[float] = []  # the phase decoded from the observation (float32)

    def __call__(self, obs):
        self.clock.append(float(self.ctrl.assembler.gait_phase[0]))
        sin, cos = np.asarray(obs[self.term], dtype=np.float64) / self.scale
        self.seen.append(math.atan2(sin, cos) / (2.0 * math.pi) % 1.0)
        return np.asarray(self.action, dtype=np.float32)


def probed(robot, **safety):
    """An autostart controller serving a PhaseProbe (RL from the first complete state)."""
    ctrl = PolicyController(robot, safety=SafetyConfig(**safety))
    probe = PhaseProbe(ctrl, robot)
    ctrl.policy, ctrl._unverified = probe, None
    return ctrl, probe


def tick(ctrl, robot, stamp, pos=None):
    """One (IMU, joint state) pair stamped ``stamp``, received at node time ``stamp``."""
    ctrl.on_imu(stamp, UPRIGHT, [0.0, 0.0, 0.0], stamp)
    pos = robot.default_joint_pos if pos is None else pos
    return ctrl.on_joint_state(stamp, robot.joint_names, pos, np.zeros(robot.num_joints), stamp)


def circular(a, b):
    """Distance between phases in [0, 1) on the circle."""
    d = (np.asarray(a) - np.asarray(b)) % 1.0
    return np.minimum(d, 1.0 - d)


@pytest.mark.parametrize('rate_hz', [52.0, 48.0])
def test_the_gait_clock_follows_states_at_48_and_52_hz(robot, rate_hz):
    """10 s of states at 48 or 52 Hz: the phase the policy observes at each command is the sum
    of the stamp intervals over the gait period (the first command after the start: one
    control period), not one nominal period per command."""
    ctrl, probe = probed(robot)
    stamps = 100.0 + np.arange(int(10 * rate_hz)) / rate_hz
    for stamp in stamps:
        assert tick(ctrl, robot, stamp) is not None
    assert ctrl.safety.state == RL and ctrl.ticks == len(stamps)
    dt, period = robot.control_dt, robot.gait_period
    # Expected at command k: (nominal first step + intervals of commands 1..k-1) / period.
    elapsed = np.concatenate([[0.0], dt + (stamps[:-1] - stamps[0])])
    expected = (elapsed / period) % 1.0
    observed = np.array(probe.clock)
    assert circular(observed, expected).max() < 1e-9
    # Each step is the stamp interval over the period (after the first, nominal one).
    steps = np.diff(observed) % 1.0
    np.testing.assert_allclose(steps[1:], (1.0 / rate_hz) / period, rtol=0, atol=1e-9)
    # The policy sees it: the sin/cos term decodes to the same phase (float32 precision).
    assert circular(probe.seen, expected).max() < 1e-5
    # One nominal step per command would be out of phase by up to half a cycle here.
    nominal = (np.arange(len(stamps)) * dt / period) % 1.0
    assert circular(observed, nominal).max() > 0.25
    assert sum(ctrl.safety.faults.values()) == 0


def test_a_gap_advances_the_clock_by_at_most_the_bound(robot):
    """A 1 s gap between two states (no watchdog in between): the command after it moves the
    clock by the upper bound, not by 50 periods."""
    ctrl, probe = probed(robot)
    dt, period = robot.control_dt, robot.gait_period
    stamps = list(100.0 + dt * np.arange(5)) + [100.0 + 4 * dt + 1.0, 100.0 + 5 * dt + 1.0]
    for stamp in stamps:
        assert tick(ctrl, robot, stamp) is not None
    # steps[k]: the step command k made (seen by command k + 1); command 5 follows the gap.
    steps = np.diff(probe.clock) % 1.0
    upper = ELAPSED_BOUNDS_PERIODS[1] * dt / period
    assert steps[5] == pytest.approx(upper, abs=1e-12)  # the gap's step: the bound
    assert steps.max() <= upper + 1e-12
    np.testing.assert_allclose(np.delete(steps, 5), dt / period, atol=1e-9)


def test_a_backlog_steps_the_clock_by_the_answered_states_own_interval(robot):
    """A backlog worked off at its newest state (the older one superseded, as the replay
    models it): the answered state's step is its interval since the skipped one, the stall's
    time is not counted."""
    ctrl, probe = probed(robot)
    period, stamps = robot.gait_period, 100.0 + np.arange(6) / 52.0
    for stamp in stamps[:3]:
        tick(ctrl, robot, stamp)
    now = stamps[4]  # the node was busy: states 3 and 4 wait in its queue
    for stamp in stamps[3:5]:
        ctrl.on_imu(stamp, UPRIGHT, [0.0, 0.0, 0.0], now)
    still, names = np.zeros(robot.num_joints), robot.joint_names
    assert ctrl.on_joint_state(stamps[3], names, robot.default_joint_pos, still, now,
                               True) is None
    assert ctrl.on_joint_state(stamps[4], names, robot.default_joint_pos, still, now) \
        is not None
    tick(ctrl, robot, stamps[5])
    assert ctrl.superseded == 1 and len(probe.clock) == 5
    # steps[k]: the step command k made; command 3 answered state 4, one interval after 3.
    steps = np.diff(probe.clock) % 1.0
    np.testing.assert_allclose(steps[1:], 1.0 / 52.0 / period, atol=1e-9)


def test_watchdog_holds_through_a_stall_step_within_the_bounds(robot):
    """A stall the watchdog damps (one hold per period) and the re-armed loop after it: every
    command moves the clock by a step within the bounds, and the phase stays finite."""
    ctrl, _ = probed(robot)
    dt, period = robot.control_dt, robot.gait_period
    phases = []
    t = 100.0
    for _ in range(5):
        tick(ctrl, robot, t)
        phases.append(float(ctrl.assembler.gait_phase[0]))
        t += dt
    for poll in np.arange(1, 201) * dt / 4:  # the watchdog polled 4x per period for 1 s
        if ctrl.watchdog(t + poll) is not None:
            phases.append(float(ctrl.assembler.gait_phase[0]))
    assert ctrl.holds['stale'] > 0 and ctrl.safety.state != RL
    for k in range(5):
        assert tick(ctrl, robot, t + 1.0 + k * dt) is not None
        phases.append(float(ctrl.assembler.gait_phase[0]))
    assert ctrl.safety.state == RL and np.isfinite(phases).all()
    steps = np.diff(phases) % 1.0
    low, high = (bound * dt / period for bound in ELAPSED_BOUNDS_PERIODS)
    assert steps.min() >= low - 1e-12 and steps.max() <= high + 1e-12


def test_a_repeated_stamp_never_freezes_jumps_or_breaks_the_clock(robot):
    """The assembler: elapsed 0 (a repeated stamp) -> the lower bound; negative, NaN, inf or
    None -> one control period; the phase is never NaN. The controller answers a repeated
    stamp not at all, so its clock does not move."""
    dt, period = robot.control_dt, robot.gait_period
    asm = ObservationAssembler(robot)
    expect = {0.0: ELAPSED_BOUNDS_PERIODS[0] * dt, 1e-12: ELAPSED_BOUNDS_PERIODS[0] * dt,
              -0.01: dt, float('nan'): dt, float('inf'): dt, -float('inf'): dt, None: dt,
              1.0: ELAPSED_BOUNDS_PERIODS[1] * dt, 0.019: 0.019}
    for elapsed, seconds in expect.items():
        assert bounded_elapsed(elapsed, dt) == pytest.approx(seconds, abs=1e-15)
        before = float(asm.gait_phase[0])
        asm.advance(np.zeros(robot.num_joints), None, elapsed)
        assert np.isfinite(asm.gait_phase).all() and 0.0 <= asm.gait_phase[0] < 1.0
        assert (asm.gait_phase[0] - before) % 1.0 == pytest.approx(seconds / period, abs=1e-12)
    ctrl, probe = probed(robot)
    tick(ctrl, robot, 100.0)
    phase = ctrl.assembler.gait_phase.copy()
    assert tick(ctrl, robot, 100.0) is None  # answered already: no command, no clock step
    np.testing.assert_array_equal(ctrl.assembler.gait_phase, phase)
    assert ctrl.drops['stale'] == 1 and len(probe.clock) == 1


def test_reset_and_a_clock_step_back_restart_the_clock(robot):
    """ObservationAssembler.reset: phase 0 at the next observation. A node clock that steps
    back forgets the stamps: the first command after it moves the clock one control period,
    the ones after follow the stamps again."""
    dt, period = robot.control_dt, robot.gait_period
    asm = ObservationAssembler(robot)
    for _ in range(7):
        asm.advance(None, None, 0.019)
    assert asm.gait_phase[0] > 0
    asm.reset()
    assert asm.gait_phase[0] == 0.0
    frame = asm.observe(robot.default_joint_pos, np.zeros(robot.num_joints),
                        np.array([1.0, 0.0, 0.0, 0.0]), np.zeros(3))
    np.testing.assert_array_equal(frame[-2:], [0.0, 1.0])  # sin 0, cos 0
    ctrl, probe = probed(robot)
    rate = 52.0
    for k in range(5):
        tick(ctrl, robot, 100.0 + k / rate)
    ctrl.assembler.reset()
    tick(ctrl, robot, 100.0 + 5 / rate)
    assert probe.clock[-1] == 0.0  # the policy observes the restarted clock
    for k in range(6):  # /clock restarted: the node clock goes back to 5 s
        tick(ctrl, robot, 5.0 + k / rate)
    assert ctrl.safety.faults['clock_step_back'] == 1
    # steps[k]: the step command k made (seen by command k + 1); step 4 is the reset's.
    steps = np.diff(probe.clock) % 1.0
    assert steps[0] == pytest.approx(dt / period, abs=1e-12)  # the first after the start
    np.testing.assert_allclose(steps[[1, 2, 3, 5]], 1.0 / rate / period, atol=1e-9)
    # Command 6 answers the first state after the step back: one control period; then stamps.
    assert steps[6] == pytest.approx(dt / period, abs=1e-12)
    np.testing.assert_allclose(steps[7:], 1.0 / rate / period, atol=1e-9)


@pytest.mark.parametrize('rate_hz', [52.0, 48.0])
def test_the_rate_limit_follows_the_measured_time(robot, rate_hz):
    """The default rate limit is the velocity limit times the measured tick, at most one
    control period: 52 Hz states get smaller steps, 48 Hz ones no larger steps than 50 Hz."""
    ctrl, probe = probed(robot, saturation_ticks=1000)
    probe.action = np.full(robot.num_joints, 10.0)
    targets = []
    for k in range(12):
        probe.action = -probe.action  # swing between the limits: every step is rate limited
        targets.append(tick(ctrl, robot, 100.0 + k / rate_hz))
    # The first tick's step (from the measured pose) is nominal; every later one is measured.
    steps = np.abs(np.diff(np.array(targets), axis=0))
    per_tick = robot.velocity_limit * min(1.0 / rate_hz, robot.control_dt)
    np.testing.assert_allclose(steps.max(axis=0), per_tick, rtol=1e-9)
    assert (steps <= per_tick * (1 + 1e-9)).all()


def test_the_shaper_step_limit(robot):
    """Velocity-derived: scaled by the bounded measured tick, capped at one control period,
    float noise of a punctual tick ignored; an explicit max_delta_per_tick stays per tick."""
    dt = robot.control_dt
    shaper = CommandShaper(robot)
    full = robot.velocity_limit * dt
    np.testing.assert_array_equal(shaper.step_limit(None), full)
    np.testing.assert_array_equal(shaper.step_limit(0.1020 - 0.0820), full)  # 0.02 +- noise
    np.testing.assert_array_equal(shaper.step_limit(1.0 / 48), full)
    np.testing.assert_allclose(shaper.step_limit(1.0 / 52), robot.velocity_limit / 52)
    np.testing.assert_allclose(shaper.step_limit(0.0), full * ELAPSED_BOUNDS_PERIODS[0])
    np.testing.assert_array_equal(shaper.step_limit(float('nan')), full)
    fixed = CommandShaper(robot, max_delta_per_tick=0.1)
    np.testing.assert_array_equal(fixed.step_limit(1.0 / 52), 0.1)
