"""Replay of ticks the command shaping cut: the controller (the policy node's own code) driven
in-process under a tight rate limit, its inputs and commands as a recording, replayed offline.
Without ROS, so the shaped ticks are there on every run."""

import dataclasses

import numpy as np

from claw_rl_ros.core.replay import action_replay as replay, recording_events as events
from claw_rl_ros.core.control.command_shaping import CommandShaper
from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
from claw_rl_ros.core.control.policy_controller import PolicyController
from control_models import good_model


def controller_recording(robot, model, ticks=200, seed=0, stamps=None):
    """A Recording of ``ticks`` controller ticks on random measured poses near the default
    (the inputs change every tick, so do the actions and the cuts), stamped ``stamps`` [s]
    (None: one control period apart from 10 s)."""
    ctrl = PolicyController(robot)
    ctrl.load_path(model)
    rng = np.random.default_rng(seed)
    rec = events.Recording(robot=robot.name, joints=list(robot.joint_names))
    if stamps is None:
        stamps = 10.0 + np.arange(ticks) * robot.control_dt
    for k in range(ticks):
        t, ns = float(stamps[k]), (k + 1) * 1000
        pos = robot.default_joint_pos + rng.normal(0.0, 0.2, robot.num_joints)
        vel = rng.normal(0.0, 1.0, robot.num_joints)
        ctrl.on_imu(t, (0.0, 0.0, 0.0, 1.0), (0.0, 0.0, 0.0), t)
        target = ctrl.on_joint_state(t, robot.joint_names, pos, vel, t)
        rec.imus.append((ns, t, (0.0, 0.0, 0.0, 1.0), (0.0, 0.0, 0.0)))
        rec.states.append((ns + 1, t, list(robot.joint_names), pos, vel))
        rec.commands.append((ns + 2, np.asarray(target, dtype=np.float64)))
        if k == 0:
            rec.safety.append((ns + 1, ctrl.safety.state))
    return rec


def test_replay_reproduces_ticks_cut_by_the_rate_limit(robot, tmp_path):
    # 2 % of the URDF velocity limit: the rate limit cuts most ticks.
    slow = dataclasses.replace(robot, velocity_limit=robot.velocity_limit * 0.02)
    model = good_model(robot, tmp_path / 'a.onnx', seed=0)
    rec = controller_recording(slow, model)
    sent = np.array([c for _, c in rec.commands])
    cut = np.isclose(np.abs(np.diff(sent, axis=0)), CommandShaper(slow).max_delta).any(axis=1)
    assert rec.safety[0][1] == 'RL' and cut.mean() > 0.3, (rec.safety, cut.mean())
    out = replay.replay_actions(rec, slow, OnnxPolicy(model))
    assert out.kind.count('compared') == len(rec.commands), out.format()
    assert out.phase_offset == 0
    assert not out.differing.any(), out.format()
    # Another model under the same shaping is not accepted: after a cut tick it differs from,
    # its last action is unknown, so few (or no) ticks can be judged; claw-rl replay fails
    # both a differing tick and a replay with nothing compared.
    other = replay.replay_actions(rec, slow, OnnxPolicy(good_model(robot, tmp_path / 'b.onnx',
                                                                   seed=1)))
    assert other.differing.any() or not other.compared.any(), other.format()
    assert 'identical' not in other.format()
