"""The excitation on a real graph: sim_node (realtime, sim time) as the robot, policy_node as
the deploy graph runs it (operator-driven, no model) and recorder_node, over loopback DDS.
``~/excite`` is refused in PASSIVE, runs from STAND_UP (``safety/state`` EXCITE, commands
moving around the default pose by the ground variant's amplitude), ends by itself back in
STAND_UP, and ``~/excite_stop`` stops a second run; the recording holds the efforts, the
gains sent and the run's record. A parameter the robot cannot run refuses the start."""

import json
import subprocess
import sys

from diagnostic_msgs.msg import DiagnosticArray
import numpy as np
import pytest
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Trigger

from claw_rl_ros.core.replay.recording import read_messages
from claw_rl_ros.nodes.ros_io import COMMAND_QOS, LATCHED_QOS
from ros_helpers import node_module, NodeProcess, ROOT, ros_value, stop_all

# 3 groups x (0.1 settle + 1.0 chirp + 3 x 0.2 steps) = 5.1 s, on the ground (0.08 rad).
EXCITE = {'excite_variant': 'ground', 'excite_chirp_s': 1.0, 'excite_ramp_s': 0.2,
          'excite_step_hold_s': 0.2, 'excite_settle_s': 0.1}
# Wiring, not thresholds (test_excitation.py has those): a loaded machine may starve a node.
POLICY = {'use_sim_time': True, 'autostart': False, 'stand_up_s': 0.4,
          'stale_after_periods': 10.0, **EXCITE}
RECORDED = ('joint_states', 'joint_commands', 'safety/state', 'joint_gains',
            'policy/excitation')


@pytest.fixture(scope='module')
def graph(ros_env, probe, tmp_path_factory):
    d = tmp_path_factory.mktemp('excite')
    for topic, msg_type, qos in (('joint_commands', Float64MultiArray, COMMAND_QOS),
                                 ('safety/state', String, LATCHED_QOS),
                                 ('policy/excitation', String, LATCHED_QOS),
                                 ('/diagnostics', DiagnosticArray, 50)):
        probe.subscribe(topic, msg_type, qos)
    rec = NodeProcess('recorder_node', ros_env, d, {'path': str(d / 'run.mcap')})
    sim = NodeProcess('sim_node', ros_env, d, {'mode': 'realtime'})
    policy = NodeProcess('policy_node', ros_env, d, POLICY)
    procs = {'rec': rec, 'sim': sim, 'policy': policy, 'mcap': d / 'run.mcap'}
    yield procs
    stop_all(policy, sim, rec)


def recorder_hears(probe, topic):
    """Wait for the recorder's diagnostics to count a publisher of ``topic``."""
    probe.wait_for('/diagnostics', lambda m: any(
        s.hardware_id == '/recorder_node' and any(
            kv.key == f'publishers /{topic}' and int(kv.value) >= 1 for kv in s.values)
        for s in m.status), timeout=60)


def state_is(probe, name, timeout=20.0):
    probe.wait_for('safety/state', lambda m: m.data == name, timeout,
                   start=max(0, probe.count('safety/state') - 1))


def trigger(probe, name):
    reply = probe.call(Trigger, f'/policy_node/{name}', Trigger.Request(), 30)
    return reply.success, reply.message


def until_ok(probe, name):
    """Trigger ``name`` until it succeeds; refusals for timing (the stand-up under way, a
    starved feed: stale, rate, usable) are retried after a few commands."""
    for _ in range(60):
        ok, message = trigger(probe, name)
        if ok or not any(w in message for w in ('not reached', 'no fresh', 'rate', 'usable')):
            return ok, message
        probe.wait_count('joint_commands', probe.count('joint_commands') + 5, timeout=20)
    return ok, message


def test_excite_runs_from_stand_ends_stops_and_is_recorded(graph, probe, robot):
    q0 = robot.default_joint_pos
    for topic in RECORDED:
        recorder_hears(probe, topic)
    state_is(probe, 'PASSIVE')
    probe.wait_count('joint_commands', 5, timeout=60)
    assert trigger(probe, 'excite') == (False, 'excite refused in PASSIVE; allowed from '
                                        'STAND_UP')
    assert until_ok(probe, 'stand_up') == (True, 'STAND_UP')
    ok, message = until_ok(probe, 'excite')
    assert (ok, message) == (True, 'EXCITE'), message
    state_is(probe, 'EXCITE')
    start = probe.count('joint_commands')
    # It ends by itself after its 5.1 s (sim time), back in STAND_UP.
    state_is(probe, 'STAND_UP', timeout=60)
    run = np.array([m.data for m in probe.since('joint_commands', start)])
    offsets = np.abs(run - q0).max(axis=0)
    assert (offsets <= 0.08 + 1e-9).all() and (offsets > 0.07).all(), offsets  # every joint
    record = json.loads(probe.wait_for('policy/excitation', lambda m: json.loads(
        m.data)['start_stamp'] is not None).data)
    assert record['config']['variant'] == 'ground' and record['config']['amplitude'] == 0.08
    assert record['duration_s'] == pytest.approx(5.1)
    assert [s['label'] for s in record['segments']] == ['hip', 'thigh', 'calf']
    assert record['parameters']['excite_chirp_s'] == 1.0 and record['node'] == '/policy_node'
    # A second run, stopped by the operator: STAND_UP again.
    ok, message = until_ok(probe, 'excite')
    assert ok, message
    state_is(probe, 'EXCITE')
    probe.wait_count('joint_commands', probe.count('joint_commands') + 10, timeout=20)
    assert trigger(probe, 'excite_stop') == (True, 'STAND_UP')
    state_is(probe, 'STAND_UP')
    codes = stop_all(graph['policy'], graph['sim'], graph['rec'])
    assert codes == {'policy_node': 0, 'sim_node': 0, 'recorder_node': 0}, \
        graph['policy'].log + graph['sim'].log + graph['rec'].log
    # The recording: states with efforts, the gains sent, EXCITE, both runs' records.
    got: dict[str, list] = {}
    for topic, _, _, msg in read_messages(graph['mcap']):
        got.setdefault(topic, []).append(msg)
    assert all(len(m.effort) == 12 and np.isfinite(m.effort).all()
               for m in got['/joint_states'])
    assert max(np.abs(m.effort).max() for m in got['/joint_states']) > 0.1
    gains = np.array([m.data for m in got['/joint_gains']])
    assert gains.shape[1] == 24 and (gains[:, :12] == robot.kp).all(axis=1).any()
    assert [m.data for m in got['/safety/state']].count('EXCITE') == 2
    runs = [json.loads(m.data) for m in got['/policy/excitation']]
    assert runs[0]['start_stamp'] is None and len(runs) == 3
    assert runs[1]['start_stamp'] < runs[2]['start_stamp']


def test_a_parameter_the_robot_cannot_run_refuses_the_start(ros_env):
    cmd = [sys.executable, '-m', node_module('policy_node'), '--ros-args',
           '-p', f'excite_f_end:={ros_value(14.0)}']
    result = subprocess.run(cmd, cwd=ROOT, env=ros_env, capture_output=True, text=True,
                            timeout=180)
    fatal = [line for line in result.stderr.splitlines() if line.startswith('[FATAL]')]
    assert result.returncode == 1 and len(fatal) == 1, result.stderr
    assert fatal[0] == ('[FATAL] refusing to start: policy_node parameters: excite_f_end: 14.0 '
                        'Hz is above a quarter of the 50 Hz control rate (12.5 Hz); lower it')
    assert 'Traceback' not in result.stderr + result.stdout
