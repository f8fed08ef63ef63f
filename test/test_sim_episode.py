"""The sim node's recorded episodes: with ``pause_after_s`` a ``~/reset`` starts an episode that
ends, paused, exactly that much sim time later, and its states arrive as one record on
``~/episode`` (what the sim2sim gate reads instead of listening to every state)."""

from diagnostic_msgs.msg import DiagnosticArray
import numpy as np
import pytest
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import SetBool, Trigger

from claw_rl_ros.core.verify.episode_record import episode_steps, EpisodeRecorder, read_episode
from claw_rl_ros.nodes.ros_io import RELIABLE_STATE_QOS, STATE_QOS, to_sec
from claw_rl_ros.nodes.sim.sim_state_io import episode_layout
from control_models import good_model
from ros_helpers import NodeProcess, stop_all

EPISODE_S = 1.0


@pytest.fixture(scope='module')
def loop(ros_env, probe, robot, tmp_path_factory):
    d = tmp_path_factory.mktemp('episode')
    probe.subscribe('/sim_node/episode', Float64MultiArray, STATE_QOS)
    probe.subscribe('joint_states', JointState, RELIABLE_STATE_QOS)
    probe.subscribe('/diagnostics', DiagnosticArray, 50)
    sim = NodeProcess('sim_node', ros_env, d, {
        'mode': 'lockstep', 'command_timeout_s': 0.2, 'start_paused': True,
        'pause_after_s': EPISODE_S, 'diagnostics_period_s': 0.2, 'randomization': True,
        'noise': True})
    policy = NodeProcess('policy_node', ros_env, d, {
        'use_sim_time': True, 'model_path': str(good_model(robot, d / 'a.onnx'))})
    yield sim, policy
    codes = stop_all(policy, sim)
    assert codes == {'policy_node': 0, 'sim_node': 0}, sim.log + policy.log


def sim_status(probe, predicate=lambda v: True, start=0):
    def values(msg):
        return next(({kv.key: kv.value for kv in s.values} for s in msg.status
                     if s.hardware_id == '/sim_node'), None)
    msg = probe.wait_for('/diagnostics', lambda m: values(m) is not None and
                         predicate(values(m)), timeout=30, start=start)
    return values(msg)


def run_episode(probe):
    """Reset, resume; (the record, the sim's status once it paused by itself, steps before)."""
    records, diags = probe.count('/sim_node/episode'), probe.count('/diagnostics')
    assert probe.call(Trigger, '/sim_node/reset', Trigger.Request(), timeout=30).success
    steps0 = int(sim_status(probe, lambda v: v['paused'] == 'True', diags)['steps'])
    diags = probe.count('/diagnostics')
    assert probe.call(SetBool, '/sim_node/pause', SetBool.Request(data=False)).success
    end = sim_status(probe, lambda v: v['paused'] == 'True' and int(v['steps']) > steps0, diags)
    msg = probe.wait_for('/sim_node/episode', timeout=30, start=records)
    return msg, end, steps0


def test_a_reset_runs_one_recorded_episode_that_pauses_at_its_end(
        loop, probe, robot):
    dt, steps = robot.control_dt, round(EPISODE_S / robot.control_dt)
    first, end, steps0 = run_episode(probe)
    # Paused exactly pause_after_s of control steps after the reset, on any machine.
    assert int(end['steps']) == steps0 + steps
    table = read_episode(*episode_layout(first), robot.joint_names)
    assert table.joint_pos.shape == table.effort.shape == (steps + 1, robot.num_joints)
    assert table.velocity.shape == (steps + 1, 3)
    assert np.diff(table.t) == pytest.approx(np.full(steps, dt), abs=1e-6)
    # The rows are the states the sim published: every joint_states message heard in the
    # episode is in the record under its stamp, positions and efforts bit for bit.
    heard = [m for m in probe.since('joint_states', 0)
             if table.t[1] <= to_sec(m.header.stamp) <= table.t[-1] + 1e-9]
    assert len(heard) >= steps // 2  # (reliable: all of them, unless the probe lagged)
    rows = {round(t / dt): i for i, t in enumerate(table.t)}
    for m in heard:
        i = rows[round(to_sec(m.header.stamp) / dt)]
        assert np.array_equal(np.asarray(m.position), table.joint_pos[i])
        assert np.array_equal(np.asarray(m.effort), table.effort[i])
    assert np.isfinite(table.velocity).all() and np.abs(table.velocity).max() < 10.0
    # Paused: nothing moves until the next reset; that one is a record of its own.
    assert int(sim_status(probe, start=probe.count('/diagnostics'))['steps']) == steps0 + steps
    second, end2, steps2 = run_episode(probe)
    assert steps2 == steps0 + steps and int(end2['steps']) == steps2 + steps
    table2 = read_episode(*episode_layout(second), robot.joint_names)
    assert table2.t[0] >= table.t[-1] and len(table2.t) == steps + 1


def test_a_record_is_read_by_column_name_and_a_foreign_one_is_refused(
        loop, probe, robot):
    msg = probe.since('/sim_node/episode', probe.count('/sim_node/episode') - 1)[0]
    labels, sizes, data = episode_layout(msg)
    names = list(robot.joint_names)
    table = read_episode(labels, sizes, data, names)
    # Another joint order on the reader's side picks the same columns by name.
    flipped = read_episode(labels, sizes, data, names[::-1])
    assert np.array_equal(flipped.joint_pos, table.joint_pos[:, ::-1])
    with pytest.raises(ValueError, match='lacks columns'):
        read_episode(labels, sizes, data, names[:-1] + ['tail_joint'])
    with pytest.raises(ValueError, match='not a record'):
        read_episode(labels, sizes, data[:-1], names)
    with pytest.raises(ValueError, match='layout'):
        read_episode(labels[::-1], sizes, data, names)


def test_the_recorder_keeps_every_row_past_its_announced_size():
    rec = EpisodeRecorder(['hip', 'knee'], start_step=7, steps=1)  # room for 2 rows
    assert rec.end_step == 8
    for k in range(5):
        rec.add(0.02 * k, np.array([k, -k, 9.0]), np.array([7.0, 8.0, 0.5 * k]),
                np.array([k, k + 0.5]), np.array([-k, 2.0 * k]))
    table = read_episode(('state', ','.join(rec.columns)), rec.table().shape,
                         rec.table().ravel(), ['hip', 'knee'])
    assert rec.columns == ('t', 'vx', 'vy', 'wz', 'q/hip', 'q/knee', 'effort/hip',
                           'effort/knee')
    assert table.t == pytest.approx([0.0, 0.02, 0.04, 0.06, 0.08])
    assert table.velocity[3].tolist() == [3.0, -3.0, 1.5]  # vx, vy from linear; wz angular
    assert table.joint_pos[4].tolist() == [4.0, 4.5] and table.effort[2].tolist() == [-2.0, 4.0]


def test_the_episode_seed_is_set_at_run_time_and_a_bad_one_refused(loop, probe):
    refused = probe.set_parameter('/sim_node', 'episode_seed', -5)
    assert not refused.successful
    assert 'parameter episode_seed = -5; use -1 (one stream)' in refused.reason
    assert probe.set_parameter('/sim_node', 'episode_seed', 3).successful
    assert not probe.set_parameter('/sim_node', 'pause_after_s', 2.0).successful  # read-only


def test_an_episode_is_a_whole_number_of_steps_and_never_none():
    assert episode_steps(10.0, 0.02) == 500 and episode_steps(4.2, 0.02) == 210
    assert episode_steps(0.029, 0.02) == 1 and episode_steps(0.001, 0.02) == 1
