"""policy_node as a process, for what the deploy path must say the truth about (issue 20): a
clock mismatch (use_sim_time true, wall-time stamps) is logged once at ERROR with its fix, shown
as an ERROR in /diagnostics and fails the self-check; a node whose previous process was killed
starts with a latched ``restarted`` fault that only an operator reset clears."""

from __future__ import annotations

import signal

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rosgraph_msgs.msg import Clock
from std_srvs.srv import Trigger

from claw_rl_ros.nodes.ros_io import SENSOR_QOS, to_stamp
from ros_helpers import NodeProcess, publish_state
from test_nodes_loop import status

FIX = 'set use_sim_time false on this node'


def send_pair(probe, robot, stamp: float) -> None:
    publish_state(probe, robot.joint_names, stamp, robot.default_joint_pos, [0.0] * 12)


def test_a_use_sim_time_mismatch_is_named_once_and_fails_the_self_check(
        ros_env, probe, robot, model, tmp_path):
    probe.subscribe('/diagnostics', DiagnosticArray, 50)
    node = NodeProcess('policy_node', ros_env, tmp_path, {'model_path': str(model),
                                                          'use_sim_time': True})
    try:
        send_pair(probe, robot, 1.0)
        probe.wait_subscribers('joint_states')
        probe.publish('/clock', Clock(clock=to_stamp(12.0)), SENSOR_QOS)
        wall = probe.node.get_clock().now().nanoseconds * 1e-9
        sim = 12.0
        # A sim-time node fed wall-time stamps (the sim.launch + policy.launch mismatch).
        for k in range(200):
            sim += 0.02
            probe.publish('/clock', Clock(clock=to_stamp(sim)), SENSOR_QOS)
            send_pair(probe, robot, wall + 0.02 * k)
            if probe.wait_for('/diagnostics', lambda m: any(
                    s.level == DiagnosticStatus.ERROR and FIX in s.message for s in m.status),
                    timeout=0.02, fail=False):
                break
        diag = status(probe, 'policy_node', lambda v: FIX in v['clock_problem'])
        assert int(diag['dropped_clock_mismatch']) > 20 and diag['safety_state'] == 'PASSIVE'
        reply = probe.call(Trigger, '/policy_node/self_check', Trigger.Request())
        assert not reply.success and 'usable states: 0 of the last' in reply.message
        assert node.log.count(FIX) == 1, node.log  # logged once, not once per message
        assert '[ERROR]' in next(line for line in node.log.splitlines() if FIX in line)
    finally:
        assert node.stop() == 0, node.log


def test_a_killed_node_restarts_with_a_latched_restarted_fault(ros_env, probe, robot, model,
                                                               tmp_path):
    probe.subscribe('/diagnostics', DiagnosticArray, 50)
    params = {'model_path': str(model), 'autostart': False}
    first = NodeProcess('policy_node', ros_env, tmp_path, params, name='deploy_policy')
    status(probe, 'deploy_policy', timeout=30)
    assert first.stop() == 0, first.log  # a clean stop: the next start is no restart
    second = NodeProcess('policy_node', ros_env, tmp_path, params, name='deploy_policy')
    diag = status(probe, 'deploy_policy', timeout=30, start=probe.count('/diagnostics'))
    assert diag['faults_restarted'] == '0' and diag['estop_latched'] == 'False'
    second.proc.send_signal(signal.SIGKILL)  # dies without a clean stop
    second.wait_exit(10)
    third = NodeProcess('policy_node', ros_env, tmp_path, params, name='deploy_policy')
    try:
        diag = status(probe, 'deploy_policy', lambda v: v['faults_restarted'] == '1',
                      timeout=30, start=probe.count('/diagnostics'))
        assert diag['estop_latched'] == 'True' and 'without a clean stop' in diag['last_fault']
        # The status line says it too (what rqt_runtime_monitor shows first).
        assert probe.wait_for('/diagnostics', lambda m: any(
            s.name.startswith('deploy_policy') and s.level == DiagnosticStatus.ERROR and
            'restart latched' in s.message for s in m.status), timeout=10)
        wall = probe.node.get_clock().now().nanoseconds * 1e-9
        send_pair(probe, robot, wall)
        probe.wait_subscribers('joint_states')
        reply = None
        for k in range(100):  # until a fresh state has arrived: then refused by the latch
            send_pair(probe, robot, probe.node.get_clock().now().nanoseconds * 1e-9)
            reply = probe.call(Trigger, '/deploy_policy/stand_up', Trigger.Request())
            if 'latched' in reply.message:
                break
        assert not reply.success and 'restart latched' in reply.message, reply.message
        assert probe.call(Trigger, '/deploy_policy/reset', Trigger.Request()).success
        assert 'restart' in third.log and '[ERROR]' in third.log
    finally:
        assert third.stop() == 0, third.log


def test_a_native_crash_prints_every_threads_python_stack(ros_env, probe, model,
                                                          tmp_path):
    """A segfault in a library (MuJoCo, onnxruntime, the DDS) leaves the node's Python stacks
    on stderr: the launcher's log names the callback, not only the signal. (rclpy's
    EventsExecutor turns Python's fault handler on by itself; the trainer's and the actor's
    single-threaded executor does not.)"""
    probe.subscribe('/diagnostics', DiagnosticArray, 50)
    node = NodeProcess('policy_node', ros_env, tmp_path, {
        'model_path': str(model), 'autostart': False, 'executor': 'single_threaded'},
        name='crashing')
    status(probe, 'crashing', timeout=30)  # spinning
    node.proc.send_signal(signal.SIGSEGV)
    assert node.wait_exit(10) == -signal.SIGSEGV  # still dies of it (no swallowed crash)
    log = node.log
    assert 'Fatal Python error: Segmentation fault' in log, log
    # The main thread's stack reaches the node's spin loop.
    assert 'ros_io.py' in log and 'in spin' in log, log
