"""Replay of recordings whose states do not come at the control rate: the policy node's own
controller (PolicyController) driven in-process at 52 and 48 Hz and with a jittered rate, its
gait clock and rate limit following the state stamps, its inputs and commands as a recording,
replayed offline. Each is also replayed re-stamped one control period apart (the clock the
replay kept before it followed the stamps): that differs, so a match is the stamps' doing."""

import dataclasses

import numpy as np
import pytest

from claw_rl_ros.core.control.command_shaping import CommandShaper
from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
from claw_rl_ros.core.replay import action_replay as replay
from control_models import good_model
from test_replay_shaping import controller_recording


def rate_stamps(intervals, ticks=200):
    """``ticks`` stamps from 10 s, the intervals [s] between them taken in turn."""
    steps = np.resize(np.asarray(intervals, dtype=np.float64), ticks - 1)
    return 10.0 + np.concatenate([[0.0], np.cumsum(steps)])


def restamped(rec, stamps):
    """A copy of ``rec`` (one IMU reading per state, in order) with the k-th state and IMU
    reading stamped ``stamps[k]``."""
    out = dataclasses.replace(rec)
    out.imus = [(ns, float(t), *rest) for (ns, _, *rest), t in zip(rec.imus, stamps)]
    out.states = [(ns, float(t), *rest) for (ns, _, *rest), t in zip(rec.states, stamps)]
    return out


def nominal(rec, robot):
    """``rec`` re-stamped one control period apart: one nominal period per command."""
    return restamped(rec, 10.0 + np.arange(len(rec.states)) * robot.control_dt)


def assert_all_match(out, ticks):
    assert out.kind.count('compared') == ticks, out.format()
    assert not out.differing.any() and out.phase_offset == 0, out.format()
    assert 'identical' in out.format()


@pytest.mark.parametrize('rate_hz', [52.0, 48.0])
def test_states_at_52_and_48_hz_replay_identically(robot, tmp_path, rate_hz):
    model = good_model(robot, tmp_path / 'a.onnx', seed=0)
    stamps = rate_stamps([1.0 / rate_hz])
    rec = controller_recording(robot, model, stamps=stamps)
    assert rec.safety[0][1] == 'RL' and len(rec.commands) == len(stamps)
    policy = OnnxPolicy(model)
    assert_all_match(replay.replay_actions(rec, robot, policy), len(stamps))
    # One nominal period per command drifts off the node's gait clock: nearly every tick
    # differs (the first few, the clocks still close, and those the rate limit cut may not).
    drifted = replay.replay_actions(nominal(rec, robot), robot, policy)
    assert drifted.differing.sum() >= 0.8 * len(stamps), drifted.format()


def test_a_jittered_rate_replays_identically(robot, tmp_path):
    """Intervals alternating 15 and 25 ms (50 Hz on average): the gait clock and, on the
    15 ms ticks, the rate limit follow each interval."""
    model = good_model(robot, tmp_path / 'a.onnx', seed=0)
    stamps = rate_stamps([0.015, 0.025])
    rec = controller_recording(robot, model, stamps=stamps)
    policy = OnnxPolicy(model)
    assert_all_match(replay.replay_actions(rec, robot, policy), len(stamps))
    drifted = replay.replay_actions(nominal(rec, robot), robot, policy)
    # (Every other tick: two intervals make two control periods.)
    assert drifted.differing.sum() >= 0.45 * len(stamps), drifted.format()


@pytest.mark.parametrize('intervals', [[1.0 / 52], [0.015, 0.025]], ids=['52Hz', 'jitter'])
def test_the_rate_limit_of_short_ticks_replays_identically(robot, tmp_path, intervals):
    """Under a tight rate limit (10 % of the URDF velocity limit), ticks shorter than a
    control period get a proportionally smaller step: the replay shapes with it, and tells a
    command on that bound (its last action then unknown) from one inside it."""
    slow = dataclasses.replace(robot, velocity_limit=robot.velocity_limit * 0.1)
    model = good_model(robot, tmp_path / 'a.onnx', seed=0)
    stamps = rate_stamps(intervals)
    rec = controller_recording(slow, model, stamps=stamps)
    sent = np.array([c for _, c in rec.commands])
    step = np.abs(np.diff(sent, axis=0))
    # The premise: many ticks were cut, many of them short ones at less than the nominal step.
    limit = np.array([CommandShaper(slow).step_limit(dt) for dt in np.diff(stamps)])
    cut = (step >= limit - 1e-9).any(axis=1)
    short = np.diff(stamps) < slow.control_dt * 0.99
    assert (cut & short).sum() >= 20, (cut.mean(), (cut & short).sum())
    assert (step[short] < CommandShaper(slow).max_delta - 1e-9).all()
    assert_all_match(replay.replay_actions(rec, slow, OnnxPolicy(model)), len(stamps))
    # Another model differs on every tick: the one after a cut tick cannot be judged (its last
    # action is not the policy's own), every other one is compared and differs.
    other = replay.replay_actions(rec, slow, OnnxPolicy(good_model(robot, tmp_path / 'b.onnx',
                                                                   seed=1)))
    bound = cut | (sent[1:] <= slow.joint_lower + 1e-9).any(axis=1) | \
        (sent[1:] >= slow.joint_upper - 1e-9).any(axis=1)
    skipped = np.array([k == 'skipped' for k in other.kind])
    np.testing.assert_array_equal(skipped[2:], bound[:-1])
    assert (other.differing == other.compared).all() and other.compared.sum() > 100
