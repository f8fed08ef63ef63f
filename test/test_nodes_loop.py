"""sim_node + policy_node as real processes on loopback DDS (realtime, sim time): commands flow,
the default-pose fallback stands, hot swaps (good and each kind of bad), diagnostics, and the
sim holding the default pose after the policy node dies."""

import hashlib

from diagnostic_msgs.msg import DiagnosticArray
from nav_msgs.msg import Odometry
import numpy as np
import pytest
from std_msgs.msg import Float64MultiArray, String, UInt8MultiArray

from claw_rl_ros.nodes.ros_io import COMMAND_QOS, LATCHED_QOS, SENSOR_QOS
from control_models import (corrupted_model, good_model, wrong_shape_model,
                            wrong_spec_model)
from ros_helpers import NodeProcess, stop_all

CAP = 200_000  # policy max_model_bytes: the 256x256 student (~330 KB) is oversized


@pytest.fixture(scope='module')
def models(robot, tmp_path_factory):
    d = tmp_path_factory.mktemp('models')
    a = good_model(robot, d / 'a.onnx', seed=0)
    return {'a': a, 'b': good_model(robot, d / 'b.onnx', seed=1),
            'oversized': good_model(robot, d / 'big.onnx', seed=2, hidden=(256, 256)),
            'wrong_spec': wrong_spec_model(robot, d / 'spec.onnx'),
            'wrong_shape': wrong_shape_model(robot, d / 'shape.onnx'),
            'corrupted': corrupted_model(robot, d / 'bad.onnx', a)}


@pytest.fixture(scope='module')
def graph(ros_env, probe, tmp_path_factory):
    logs = tmp_path_factory.mktemp('logs')
    for topic, msg_type, qos in (('joint_commands', Float64MultiArray, COMMAND_QOS),
                                 ('odom', Odometry, SENSOR_QOS),
                                 ('/diagnostics', DiagnosticArray, 10),
                                 ('policy/model_version', String, LATCHED_QOS)):
        probe.subscribe(topic, msg_type, qos)
    sim = NodeProcess('sim_node', ros_env, logs, {'mode': 'realtime', 'command_timeout_s': 0.25})
    policy = NodeProcess('policy_node', ros_env, logs,
                         {'use_sim_time': True, 'max_model_bytes': CAP})
    yield {'sim': sim, 'policy': policy}
    codes = stop_all(policy, sim)
    assert codes == {'policy_node': 0, 'sim_node': 0}, sim.log + policy.log


def status(probe, node, predicate=lambda v: True, timeout=10.0, start=0):
    """The key/values of the next /diagnostics status of ``node`` that satisfies predicate."""
    def match(msg):
        return any(s.name.startswith(node) and predicate(values(s)) for s in msg.status)

    def values(s):
        return {kv.key: kv.value for kv in s.values}
    msg = probe.wait_for('/diagnostics', match, timeout, start)
    return next(values(s) for s in msg.status if s.name.startswith(node))


def commands(probe, start):
    return [np.asarray(m.data) for m in probe.since('joint_commands', start)]


def test_default_pose_fallback_stands_and_diagnostics_carry_the_fields(graph, probe, robot):
    # No model yet: the policy answers each state with the default pose.
    q0 = robot.default_joint_pos
    probe.wait_for('joint_commands', lambda m: np.allclose(m.data, q0, atol=0), timeout=20)
    start = probe.count('odom')
    odom = probe.wait_count('odom', start + 100, timeout=20)[-1]  # 2 s of control steps
    assert odom.pose.pose.position.z > 0.18
    sent = commands(probe, 0)
    # A status published after every command collected: its fault counts cover them all.
    later = probe.count('/diagnostics')
    pol = status(probe, 'policy_node', lambda v: int(v['dropped_no_model']) > 10, start=later)
    # Every command is the default pose, unless a starved CPU delayed a state past its
    # freshness or its /clock: then the safety layer faults, damps (the measured pose) and
    # says so in its fault counts.
    others = [c for c in sent if not np.array_equal(c, q0)]
    faults = sum(int(v) for k, v in pol.items() if k.startswith('faults_'))
    assert not others or faults > 0, (len(others), pol)
    assert len(others) < 0.2 * len(sent)
    for key in ('state_rate_hz', 'command_rate_hz', 'latency_p50_ms', 'latency_p99_ms',
                'model_version', 'last_swap', 'dropped_non_finite', 'dropped_stale',
                'dropped_missing_joint', 'dropped_unknown_joint', 'dropped_wrong_length'):
        assert key in pol
    assert pol['model_version'] == 'none'
    assert 0 < float(pol['state_rate_hz']) < 60 and float(pol['latency_p50_ms']) > 0
    # The controller's own CPU time per command (thread time: > 0, below a whole period).
    assert 0 < float(pol['tick_cpu_p50_ms']) <= float(pol['tick_cpu_max_ms']) < 20
    sim = status(probe, 'sim_node', lambda v: v['command_timed_out'] == 'False')
    assert sim['mode'] == 'realtime' and int(sim['missed_ticks']) >= 0
    assert float(sim['command_latency_p50_ms']) > 0
    assert 0 < float(sim['step_cpu_p50_ms']) <= float(sim['step_cpu_max_ms'])
    assert 0 < float(sim['control_rate_hz']) < 60


def offer(probe, path):
    data = path.read_bytes()
    probe.publish('policy/model', UInt8MultiArray(data=data), LATCHED_QOS)
    return hashlib.sha256(data).hexdigest()


def test_hot_swap_changes_version_and_actions_and_bad_models_are_refused(graph, probe,
                                                                         models, robot):
    q0 = robot.default_joint_pos
    result = probe.set_parameter('/policy_node', 'model_path', str(models['a']))
    assert result.successful, result.reason
    sha_a = hashlib.sha256(models['a'].read_bytes()).hexdigest()
    probe.wait_for('policy/model_version', lambda m: m.data == sha_a[:12])
    start = probe.count('joint_commands')
    probe.wait_count('joint_commands', start + 20)
    acts_a = [c for c in commands(probe, start + 5) if not np.array_equal(c, q0)]
    assert len(acts_a) >= 10  # the model acts (a starved CPU may add a few stale holds)
    sha_b = offer(probe, models['b'])
    probe.wait_subscribers('policy/model')
    # The bytes are validated on arrival; activation retries until they have arrived.
    result = probe.activate_model('/policy_node', sha_b)
    assert result.successful, result.reason
    probe.wait_for('policy/model_version', lambda m: m.data == sha_b[:12])
    start = probe.count('joint_commands')
    probe.wait_count('joint_commands', start + 20)
    acts_b = [c for c in commands(probe, start + 5) if not np.array_equal(c, q0)]
    assert len(acts_b) >= 10
    # Same robot, same standing state, new weights: the commands move elsewhere.
    assert np.abs(np.mean(acts_b, axis=0) - np.mean(acts_a, axis=0)).max() > 1e-2
    reasons = {'corrupted': 'not a loadable ONNX model', 'wrong_spec': 'spec mismatch',
               'wrong_shape': "'obs' is tensor(float)", 'oversized': 'over the size cap'}
    for key, reason in reasons.items():
        result = probe.activate_model('/policy_node', offer(probe, models[key]))
        assert not result.successful and reason in result.reason, (key, result.reason)
    pol = status(probe, 'policy_node', lambda v: 'spec mismatch' not in v['last_swap'] and
                 v['last_swap'].startswith('rejected'))
    assert pol['model_version'] == sha_b[:12]  # the old model keeps serving
    start = probe.count('joint_commands')
    probe.wait_count('joint_commands', start + 20)
    assert sum(not np.array_equal(c, q0) for c in commands(probe, start)) >= 10


def test_killing_the_policy_node_makes_the_sim_hold_the_default_pose(graph, probe):
    assert graph['policy'].stop() == 0
    sim = status(probe, 'sim_node', lambda v: v['command_timed_out'] == 'True', timeout=10)
    assert sim['mode'] == 'realtime'
    start = probe.count('odom')
    odom = probe.wait_count('odom', start + 50, timeout=10)[-1]
    assert odom.pose.pose.position.z > 0.18  # standing on the damped default-pose hold
    assert graph['sim'].alive()
