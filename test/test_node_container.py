"""node_container: the package's nodes in one process on one executor (the lockstep loop
without the hop between processes), its command line checked by name, and its clean stops."""

import signal
import subprocess
import sys

from diagnostic_msgs.msg import DiagnosticArray
import pytest
from rclpy.parameter import Parameter

from claw_rl_ros.nodes.node_container import hosted_nodes
from control_models import good_model
from ros_helpers import ROOT
from test_nodes_loop import status


def container(env, log_path, model, policy_extra: str = '') -> subprocess.Popen:
    """sim_node (lockstep) + policy_node serving ``model`` in one node_container process."""
    return subprocess.Popen(
        [sys.executable, '-m', 'claw_rl_ros.nodes.node_container',
         '--node', 'sim_node', '{"mode": "lockstep", "diagnostics_period_s": 0.1}',
         '--node', 'policy_node', f'{{"model_path": "{model}", "use_sim_time": true, '
         f'"diagnostics_period_s": 0.1{policy_extra}}}',
         '--ros-args', '--params-file', str(ROOT / 'config' / 'sim_node.yaml'),
         '--params-file', str(ROOT / 'config' / 'policy_node.yaml')],
        cwd=ROOT, env={**env, 'PYTHONUNBUFFERED': '1'}, stdout=open(log_path, 'w'),
        stderr=subprocess.STDOUT)


@pytest.mark.parametrize('stop', [signal.SIGINT, signal.SIGTERM], ids=['sigint', 'sigterm'])
def test_a_container_runs_the_lockstep_loop_and_stops_cleanly(
        ros_env, probe, robot, tmp_path, stop):
    """Both nodes answer each other, so the executor is never idle: the stop must still be
    seen (Ctrl-C and SIGTERM), between callbacks (no publish on a shut-down context), with the
    policy's clean-stop marker removed (the next start does not report a crash)."""
    probe.subscribe('/diagnostics', DiagnosticArray, 100)
    model = good_model(robot, tmp_path / 'm.onnx')
    for run in range(3):
        log, start = tmp_path / f'container_{run}.log', probe.count('/diagnostics')
        proc = container(ros_env, log, model, ', "joints": []')  # [] typed as declared
        try:
            sim = status(probe, 'sim_node', lambda v: int(v['steps']) >= 200, 60, start)
            policy = status(probe, 'policy_node', lambda v: v['safety_state'] == 'RL' and
                            int(v['policy_ticks']) > 0, 30, start)
        finally:
            proc.send_signal(stop)
            code = proc.wait(timeout=20)
        out = log.read_text()
        assert code == 0, out
        assert sim['mode'] == 'lockstep' and float(sim['command_rate_hz']) > 0, sim
        assert policy['model_version'], policy
        for bad in ('FATAL', 'Traceback', 'restarted'):  # (restarted: an unclean last stop)
            assert bad not in out, out


@pytest.mark.parametrize('extra, words', [
    (', "robot": "no_such_robot"', 'no_such_robot'),
    # rcl ignores a parameter no node declares; here it is a typo, said by name.
    (', "modle_path": "m.onnx"', "policy_node has no parameter 'modle_path'; its parameters "
     'are autostart,'),
    # [] is NOT_SET (as rcl reads it from a file): a scalar parameter has no value then.
    (', "seed": []', 'parameter seed: no value (an empty list?); give a value of its type'),
])
def test_a_hosted_node_that_refuses_its_configuration_ends_the_container_with_status_1(
        ros_env, robot, tmp_path, extra, words):
    log = tmp_path / 'refused.log'
    proc = container(ros_env, log, good_model(robot, tmp_path / 'm.onnx'), extra)
    assert proc.wait(timeout=60) == 1, log.read_text()
    assert '[FATAL] refusing to start' in log.read_text() and words in log.read_text()
    assert 'Traceback' not in log.read_text()


@pytest.mark.parametrize('argv, named', [
    ([], '--node'),
    (['--node', 'trainer_node', '{}'], "'trainer_node': not a hostable node"),
    (['--node', 'sim_node', '{}', '--node', 'sim_node', '{}'], "'sim_node' given twice"),
    (['--node', 'sim_node', '{mode'], "--node sim_node '{mode': not JSON"),
    (['--node', 'sim_node', '[1]'], "'[1]': not a JSON object"),
    (['--node', 'sim_node', '{"seed": {"a": 1}}'], "parameter seed = {'a': 1} is not a ROS"),
])
def test_the_container_command_line_is_refused_by_name(argv, named, capsys):
    with pytest.raises(SystemExit) as exit_info:
        hosted_nodes(argv)
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err


def test_hosted_parameters_keep_their_types():
    (exe, params), = hosted_nodes(['--node', 'sim_node',
                                   '{"mode": "lockstep", "seed": 3, "real_time_factor": 2.0, '
                                   '"pushes": false}'])
    assert exe == 'sim_node'
    assert {p.name: p.value for p in params} == {'mode': 'lockstep', 'seed': 3,
                                                 'real_time_factor': 2.0, 'pushes': False}


def test_an_empty_list_is_not_set_as_rcl_reads_it_from_a_parameter_file():
    # JSON [] says nothing of its elements; rclpy would make it a BYTE_ARRAY, which a typed
    # list parameter refuses (the run test above hosts a policy node with "joints": []).
    (_, params), = hosted_nodes(['--node', 'policy_node', '{"joints": [], "seed": 2}'])
    assert [(p.name, p.type_) for p in params] == [('joints', Parameter.Type.NOT_SET),
                                                   ('seed', Parameter.Type.INTEGER)]
