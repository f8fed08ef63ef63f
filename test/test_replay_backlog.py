"""Replay of a recording made under load: the policy node's own controller (PolicyController)
driven in-process as the node drives it when states queue up (a backlog worked off at its
newest state, the older ones superseded: no command, no gait-clock advance), its inputs and
commands as a recording, replayed offline. Without ROS, so the backlogs are there on every run.
Also: commands and states lost from such a recording."""

import numpy as np
import pytest

from claw_rl_ros.core.replay import action_replay as replay, recording_events as events
from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
from claw_rl_ros.core.control.policy_controller import PolicyController
from control_models import good_model

MS = 1_000_000  # ns
# Tick index -> backlog length: the node stalled for that many periods, then worked the queue
# off (2 or 3 states: within stale_after_periods, so the queued IMU readings are not stale).
BACKLOGS = {5: 2, 12: 3, 19: 2, 33: 3, 47: 2, 60: 2, 62: 3, 90: 3, 121: 2, 150: 3}


def backlog_recording(robot, model, ticks=180, seed=0, backlogs=BACKLOGS, period=None):
    """A Recording of a real-time loop: each period (``period`` [s], None: the control period;
    a list: the periods taken in turn) the robot publishes an IMU reading then a joint state
    (random poses near the default, so every action differs), and every 5th period a teleop
    cmd_vel comes between them (changed at tick 80); the node answers at once, except from
    each tick in ``backlogs``, where it stalled for n periods and then took its queues as the
    policy node does (policy_node.on_imu / on_joint_state with ``take_queued``, callbacks in
    arrival order): the IMU readings, the cmd_vels, then the states, all but the newest
    superseded. Returns (recording, controller)."""
    ctrl = PolicyController(robot)
    ctrl.load_path(model)
    rng = np.random.default_rng(seed)
    rec = events.Recording(robot=robot.name, joints=list(robot.joint_names))
    dt, names = period or robot.control_dt, list(robot.joint_names)
    steps = np.resize(dt, ticks - 1) if isinstance(dt, list) else None
    imus, cmds, states = [], [], []  # what waits in the node's queues
    until = -1  # the last tick of the current stall
    for k in range(ticks):
        t = 10.0 + (k * dt if steps is None else float(steps[:k].sum()))
        ns = 10_000 * MS + round((t - 10.0) * 1e9)
        imu = ((0.0, 0.0, 0.0, 1.0), tuple(rng.normal(0.0, 0.3, 3)))
        rec.imus.append((ns, t, *imu))
        imus.append((t, imu))
        if k % 5 == 0:
            cmd = np.array([0.4, 0.0, 0.3] if k < 80 else [0.2, 0.1, -0.2])
            rec.cmd_vel.append((ns + 1, cmd))
            cmds.append(cmd)
        pos = robot.default_joint_pos + rng.normal(0.0, 0.2, robot.num_joints)
        vel = rng.normal(0.0, 1.0, robot.num_joints)
        rec.states.append((ns + 2, t, names, pos, vel))
        states.append((t, pos, vel))
        if k in backlogs:
            until = k + backlogs[k] - 1
        if k < until:
            continue  # the node is busy: the messages wait in its queues
        now = t + 1e-4
        outs = [ctrl.on_imu(s, *i, now) for s, i in imus]
        for cmd in cmds:
            ctrl.on_command(*cmd)
        outs += [ctrl.on_joint_state(s, names, p, v, now, j < len(states) - 1)
                 for j, (s, p, v) in enumerate(states)]
        [target] = [o for o in outs if o is not None]
        rec.commands.append((ns + MS // 10, np.asarray(target, dtype=np.float64)))
        if k == 0:
            rec.safety.append((ns + 3, ctrl.safety.state))
        imus, cmds, states = [], [], []
    return rec, ctrl


def drop(rec, states=(), commands=()):
    """A copy of ``rec`` without the states and commands at these indices."""
    out = events.Recording(robot=rec.robot, joints=rec.joints, imus=rec.imus,
                           cmd_vel=rec.cmd_vel, safety=rec.safety)
    out.states = [s for i, s in enumerate(rec.states) if i not in states]
    out.commands = [c for i, c in enumerate(rec.commands) if i not in commands]
    return out


# The robot's state period [s]: the control period, and states at 52 and 48 Hz (the node's
# gait clock and rate limit follow the stamps, the replay too).
PERIODS = pytest.mark.parametrize('period', [None, 1 / 52, 1 / 48], ids=['50Hz', '52Hz', '48Hz'])


@pytest.mark.parametrize('period', [None, 1 / 52, 1 / 48, [0.015, 0.025]],
                         ids=['50Hz', '52Hz', '48Hz', 'jitter'])
def test_a_backlog_worked_off_at_its_newest_state_replays_identically(robot, tmp_path, period):
    model = good_model(robot, tmp_path / 'a.onnx', seed=0)
    rec, ctrl = backlog_recording(robot, model, period=period)
    queued = sum(n - 1 for n in BACKLOGS.values())
    # The premise: the node superseded those states and answered every other one.
    assert ctrl.superseded == queued and ctrl.diagnostics()['superseded_states'] == queued
    assert len(rec.commands) == len(rec.states) - queued and rec.safety[0][1] == 'RL'
    out = replay.replay_actions(rec, robot, OnnxPolicy(model))
    assert out.kind.count('compared') == len(rec.commands), out.format()
    assert not out.differing.any(), out.format()
    assert out.phase_offset == 0 and out.superseded == queued
    text = out.format()
    assert 'identical' in text and f'{queued} states superseded' in text, text
    # Another model is still told apart after every backlog.
    other = good_model(robot, tmp_path / 'b.onnx', seed=1)
    other = replay.replay_actions(rec, robot, OnnxPolicy(other))
    assert other.differing.sum() == other.compared.sum() >= 0.9 * len(rec.commands)


@PERIODS
def test_lost_commands_and_lost_states_are_told_from_superseded_ones(robot, tmp_path, period):
    model = good_model(robot, tmp_path / 'a.onnx', seed=0)
    policy = OnnxPolicy(model)
    rec, _ = backlog_recording(robot, model, period=period)
    queued = sum(n - 1 for n in BACKLOGS.values())
    # The state each command answered: the last one published before it.
    answered = np.searchsorted([s[0] for s in rec.states], [c[0] for c in rec.commands]) - 1
    # Commands the recording lost (their states answered, away from any backlog; state 80 is
    # the first under the new cmd_vel): the node acted, so its clock moved on; found by the
    # next tick matching that way only.
    lost = [i for i, a in enumerate(answered[:-1]) if a in range(80, 180, 9) and
            answered[i] - answered[i - 1] == answered[i + 1] - answered[i] == 1]
    assert answered[lost[0]] == 80
    deaf = replay.replay_actions(drop(rec, commands=lost), robot, policy)
    assert deaf.kind.count('missing') == len(lost) >= 8, deaf.format()
    assert not deaf.differing.any() and deaf.superseded == queued, deaf.format()
    assert deaf.compared.sum() == len(rec.commands) - len(lost)
    # The newest state of a backlog lost (best effort): its command is not judged against
    # the superseded state before it; a superseded state lost changes nothing.
    newest = [answered[i] for i in range(len(answered)) if i and
              answered[i] - answered[i - 1] > 1]
    older = [n - 1 for n in newest]
    lossy = replay.replay_actions(drop(rec, states=newest[:4] + older[4:]), robot, policy)
    assert not lossy.differing.any(), lossy.format()
    # Each lost newest state leaves its backlog one superseded state short (the one its
    # command is now attributed to); so does each superseded state lost.
    assert lossy.kind.count('skipped') == 4
    assert lossy.superseded == queued - 4 - len(older[4:]), lossy.format()
    assert lossy.compared.sum() == len(rec.commands) - 4
