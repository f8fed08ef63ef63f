"""Replay models what the policy node did: the model's action_clip, the cmd_vel timeout and the
IMU reading the node pairs with a joint state. Each recording is made by driving the node's own
controller (PolicyController) in-process as policy_node drives it, every message with a
publish time (what the recorder stores) and a receive time (the controller's monotonic clock
and node clock), then replayed offline. Without ROS, so the timings are the same on every run."""

import numpy as np
import pytest

from claw_rl_ros import cli
from claw_rl_ros.core.replay import action_replay as replay, recording_events as events
from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
from claw_rl_ros.core.control.policy_controller import PolicyController
from claw_rl_ros.core.control.state_input import CLIP_ACTIONS
from control_models import clip_model, good_model
from test_replay_backlog import drop

UPRIGHT = (0.0, 0.0, 0.0, 1.0)


class Loop:
    """PolicyController fed messages in receive order, recorded as recorder_node records them:
    each input at its publish time, each command just after the call that produced it and the
    safety state after that command when the call changed it (policy_node's order)."""

    def __init__(self, robot, model, **kwargs):
        self.robot, self.mono = robot, 0.0
        self.ctrl = PolicyController(robot, monotonic=lambda: self.mono, **kwargs)
        self.ctrl.load_path(model)
        self.rec = events.Recording(robot=robot.name, joints=list(robot.joint_names))
        self.messages = []  # (receive [s], publish [s], topic, payload)

    def imu(self, publish, receive, stamp, quat, gyro):
        self.messages.append((receive, publish, 'imu', (stamp, tuple(quat), tuple(gyro))))
        self.rec.imus.append((ns(publish), stamp, tuple(quat), tuple(gyro)))

    def state(self, publish, receive, stamp, pos, vel):
        self.messages.append((receive, publish, 'state', (stamp, pos, vel)))
        self.rec.states.append((ns(publish), stamp, list(self.robot.joint_names), pos, vel))

    def cmd_vel(self, publish, receive, cmd):
        self.messages.append((receive, publish, 'cmd_vel', np.asarray(cmd, dtype=np.float64)))
        self.rec.cmd_vel.append((ns(publish), np.asarray(cmd, dtype=np.float64)))

    def run(self):
        """Deliver every message; returns the recording."""
        names = list(self.robot.joint_names)
        for receive, _, topic, m in sorted(self.messages, key=lambda x: (x[0], x[1])):
            self.mono = receive  # the monotonic clock, and the node's own (now)
            if topic == 'imu':
                out = self.ctrl.on_imu(*m, receive)
            elif topic == 'state':
                out = self.ctrl.on_joint_state(m[0], names, m[1], m[2], receive)
            else:
                out = self.ctrl.on_command(*m)
            if out is not None:
                self.rec.commands.append((ns(receive) + 1000, np.asarray(out, np.float64)))
            if self.ctrl.safety.drain():
                self.rec.safety.append((ns(receive) + 2000, self.ctrl.safety.state))
        for part in (self.rec.imus, self.rec.states, self.rec.cmd_vel):
            part.sort(key=lambda e: e[0])
        return self.rec


def ns(seconds):
    return round(seconds * 1e9)


def state_at(robot, rng, speed=1.0):
    """A random measured pose near the default and joint speeds [rad/s] of scale ``speed``."""
    return (robot.default_joint_pos + rng.normal(0.0, 0.2, robot.num_joints),
            rng.normal(0.0, speed, robot.num_joints))


def assert_all_match(out, ticks, **kinds):
    """Every tick compared and matching, except ``kinds`` (kind -> count)."""
    assert len(out.kind) == ticks, out.format()
    for kind, count in kinds.items():
        assert out.kind.count(kind) == count, (kind, out.format())
    assert out.kind.count('compared') == ticks - sum(kinds.values()), out.format()
    assert not out.differing.any() and 'identical' in out.format(), out.format()


# ---------------------------------------------------------------------------- action clip
def test_replay_clips_actions_to_the_models_action_clip(robot, tmp_path):
    # A linear graph (every action 0.02 x sum(obs), no clip inside) whose metadata says 1.2: it
    # passes the node's probe (inputs up to ~3 sigma: actions below 1.0), but the joint speeds
    # here (all joints the same way, up to 200 rad/s: 0.05 x 12 x 200 = 120 in the sum) push it
    # beyond 1.2, where the node clips the action and the last-action observation.
    clip, dt = 1.2, robot.control_dt
    model = clip_model(robot, tmp_path / 'clip.onnx', clip, weight=0.02)
    loop = Loop(robot, model)
    assert loop.ctrl.assembler.action_clip == clip
    rng = np.random.default_rng(0)
    ticks = 150
    for k in range(ticks):
        t = 10.0 + k * dt
        pos, _ = state_at(robot, rng)
        vel = np.full(robot.num_joints, rng.uniform(-200.0, 200.0))
        loop.imu(t, t + 1e-4, t, UPRIGHT, rng.normal(0.0, 0.3, 3))
        loop.state(t + 2e-4, t + 3e-4, t, pos, vel)
    rec = loop.run()
    # The premise: many targets sit at q0 +- scale * clip on every joint (a clipped action).
    offsets = np.abs(np.array([c for _, c in rec.commands]) - robot.default_joint_pos)
    clipped = np.isclose(offsets, robot.action_scale * clip).all(axis=1)
    assert len(rec.commands) == ticks and clipped.mean() > 0.3, clipped.mean()
    out = replay.replay_actions(rec, robot, OnnxPolicy(model))
    assert_all_match(out, ticks)
    # The same graph through a plain function (no action_clip: CLIP_ACTIONS, 10) differs.
    policy = OnnxPolicy(model)
    plain = replay.replay_actions(rec, robot, lambda obs: policy(obs))
    assert CLIP_ACTIONS > clip and plain.differing.sum() >= clipped.sum() // 2, plain.format()


# ------------------------------------------------------------------------ cmd_vel timeout
A, B, C = (0.4, 0.0, 0.3), (0.2, 0.1, -0.2), (0.3, -0.1, 0.1)


def timeout_recording(robot, model, ticks=180, **kwargs):
    """A 50 Hz loop (IMU then joint state each period, random poses) with a
    cmd_vel A at tick 2, B at tick 60 and C every 10 ticks from 100 to 140 (a teleop), silence
    between. Latencies (publish -> receive) put ticks on both sides of the timeout boundary as
    publish times see it: A waits 30 ms (a reliable repair), so the node times out one tick
    later than publish times say; from tick 60 to 99 joint states arrive 15 ms late (queued),
    so the node times out one tick earlier. Returns the Loop (run)."""
    dt = robot.control_dt
    loop = Loop(robot, model, **kwargs)
    rng = np.random.default_rng(1)
    for k in range(ticks):
        t = 10.0 + k * dt
        pos, vel = state_at(robot, rng)
        loop.imu(t, t + 1e-4, t, UPRIGHT, rng.normal(0.0, 0.3, 3))
        loop.state(t + 2e-4, t + (0.015 if 60 <= k < 100 else 1e-4) + 2e-4, t, pos, vel)
        if k in (2, 60) or (k >= 100 and k <= 140 and k % 10 == 0):
            late = 0.030 if k == 2 else 1e-4
            loop.cmd_vel(t + 5e-4, t + 5e-4 + late, A if k == 2 else B if k == 60 else C)
    loop.run()
    return loop


def test_replay_zeroes_the_command_after_the_cmd_vel_timeout(robot, tmp_path):
    model = good_model(robot, tmp_path / 'a.onnx', seed=0)
    loop = timeout_recording(robot, model)
    rec, ticks = loop.rec, 180
    # The premise: the node timed out three times (after A, after B, after the last C).
    assert loop.ctrl.cmd_vel_timeouts == 3 and loop.ctrl.command_timed_out
    assert len(rec.commands) == ticks and [s for _, s in rec.safety] == ['RL']
    policy = OnnxPolicy(model)
    out = replay.replay_actions(rec, robot, policy)
    assert_all_match(out, ticks)
    assert out.timeouts == 3 and out.held_past_timeout == 0, out.format()
    assert 'cmd_vel timeout 0.5 s' in out.format() and 'went zero 3 times' in out.format()
    # Without the timeout (the node's was on) every tick after each timeout differs.
    off = replay.replay_actions(rec, robot, policy, cmd_vel_timeout_s=0.0)
    assert off.differing.sum() >= 60, off.format()
    # A node whose timeout is off, replayed with the default: the ticks show the command
    # held and still match, and the report says the node's timeout was longer or off.
    held = timeout_recording(robot, model, cmd_vel_timeout_s=0.0)
    assert held.ctrl.cmd_vel_timeouts == 0
    out = replay.replay_actions(held.rec, robot, policy)
    assert_all_match(out, ticks)
    # Those are the ticks published more than the slack past the timeout after the cmd_vel
    # the node had received by then.
    cmds = [(r, p) for r, p, topic, _ in held.messages if topic == 'cmd_vel']
    ages = [p - max(c for r_c, c in cmds if r_c < r) for r, p, topic, _ in held.messages
            if topic == 'state' and any(r_c < r for r_c, _ in cmds)]
    late = sum(age > 0.5 + replay.TIMEOUT_SLACK_S for age in ages)
    assert out.timeouts == 0 and out.held_past_timeout == late > 40, (late, out.format())
    assert 'timeout was longer or off' in out.format()
    assert replay.replay_actions(held.rec, robot, policy, cmd_vel_timeout_s=0.0) \
        .held_past_timeout == 0
    # One command past the timeout that differs (here: corrupted) is reported where it is (and
    # at the next tick, whose last action is read back from it); it does not end the held
    # command for the ticks after it.
    glitch = events.Recording(**{**held.rec.__dict__, 'commands': list(held.rec.commands)})
    t, command = glitch.commands[45]
    glitch.commands[45] = (t, command + np.eye(robot.num_joints)[0] * 0.01)
    out = replay.replay_actions(glitch, robot, policy)
    assert np.flatnonzero(out.differing).tolist() == [45, 46], out.format()
    # Every 10th command lost (its tick answered all the same, near or past the timeout too):
    # the lost ticks are found whether the node's command went zero or was held.
    for recording in (rec, held.rec):
        lost = list(range(5, ticks, 10))
        deaf = replay.replay_actions(drop(recording, commands=lost), robot, policy)
        assert deaf.kind.count('missing') == len(lost) and deaf.superseded == 0, deaf.format()
        assert_all_match(deaf, ticks, missing=len(lost))
    with pytest.raises(ValueError, match=r'cmd_vel_timeout_s = -1.0; .* >= 0'):
        replay.replay_actions(rec, robot, policy, cmd_vel_timeout_s=-1.0)


def test_claw_rl_replay_refuses_a_bad_cmd_vel_timeout(tmp_path, capsys):
    junk = tmp_path / 'run.mcap'
    junk.write_bytes(b'not read: the option is checked first')
    for value in ('-0.1', 'nan'):
        assert cli.main(['replay', str(junk), '--model', 'x.onnx', '--cmd-vel-timeout',
                         value]) == 2
        err = capsys.readouterr().err
        assert '--cmd-vel-timeout' in err and 'finite number >= 0' in err, err


# ---------------------------------------------------------------------------- IMU pairing
# Ticks whose IMU readings within half a period either side were lost (the IMU stalled).
STALLS = (40, 77, 120)


def imu_recording(robot, model, ticks=160):
    """A 50 Hz loop with an IMU at 100 Hz stamped 0.3 and 0.8 periods after each joint state
    (each reading its own gyro), and joint states published 0.9 periods after their stamp: by
    then the reading 0.8 periods ahead (the next tick's) has come, and the node pairs the state
    with the one 0.3 periods ahead (the newest within half a period). Around each of STALLS the
    IMU lost both readings within half a period: the node faults on that state (damping) and
    autostart re-arms at the next one. Returns the Loop (run)."""
    dt = robot.control_dt
    loop = Loop(robot, model)
    rng = np.random.default_rng(2)
    for k in range(-1, ticks):
        t = 10.0 + k * dt
        for lead in (0.3, 0.8):
            # Each reading belongs to the tick it is within half a period of.
            tick = k + (lead > 0.5)
            tilt = rng.normal(0.0, 0.05, 2)
            quat = (tilt[0], tilt[1], 0.0, float(np.sqrt(1.0 - tilt @ tilt)))
            if tick not in STALLS:
                loop.imu(t + lead * dt, t + lead * dt + 1e-4, t + lead * dt, quat,
                         rng.normal(0.0, 0.5, 3))
        if k >= 0:
            pos, vel = state_at(robot, rng)
            loop.state(t + 0.9 * dt, t + 0.9 * dt + 1e-4, t, pos, vel)
    loop.run()
    return loop


def test_replay_pairs_each_state_with_the_imu_reading_the_node_took(robot, tmp_path):
    model = good_model(robot, tmp_path / 'a.onnx', seed=0)
    loop = imu_recording(robot, model)
    rec, ticks = loop.rec, 160
    # The premise: one command per state; each stall an unsynced-IMU fault, re-armed at once.
    assert len(rec.commands) == ticks and loop.ctrl.drops['unsynced_imu'] == len(STALLS)
    assert [s for _, s in rec.safety] == ['RL'] + ['PASSIVE', 'RL'] * len(STALLS)
    policy = OnnxPolicy(model)
    # The PASSIVE state is published after the hold, the RL one after the re-armed tick: the
    # tick after each stall is replayed as outside RL; all others are compared and match.
    out = replay.replay_actions(rec, robot, policy)
    assert_all_match(out, ticks, no_imu=len(STALLS), not_rl=len(STALLS))
    assert f'{len(STALLS)} without an IMU reading of their tick' in out.format()
    # Recorded without safety/state after the start: the re-armed ticks are compared too (their
    # rate limit starts from the measured pose, as the node leaves PASSIVE there).
    rec.safety = rec.safety[:1]
    out = replay.replay_actions(rec, robot, policy)
    assert_all_match(out, ticks, no_imu=len(STALLS))
