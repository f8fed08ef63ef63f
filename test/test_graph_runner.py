"""``claw-rl up``: real processes, prefixed output, Ctrl-C shutdown, a dying node ends the graph.

The runner runs as its own process (as a user starts it) and is signalled like a terminal
would; its nodes are the real sim_node and policy_node on an isolated DDS domain.
"""

import os
from pathlib import Path
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from rcl_interfaces.srv import GetParameters
from std_msgs.msg import Float64MultiArray

from claw_rl_ros.core.export.onnx_export import export_onnx
from test_export import make_policy

ROOT = Path(__file__).resolve().parents[1]
STARTED = re.compile(r'^\[up\] started (\S+) \(pid (\d+)\)')


class Runner:
    """A runner process whose merged output is collected line by line."""

    def __init__(self, cmd, env, cwd):
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip('\n'))
                self._cond.notify_all()

    def wait_line(self, pattern: str, timeout: float = 30.0) -> re.Match:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    match = re.search(pattern, line)
                    if match:
                        return match
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    pytest.fail(f'no line matching {pattern!r}:\n' + '\n'.join(self.lines))
                self._cond.wait(min(left, 0.5))

    def finish(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail('runner still running after its deadline:\n' + self.text)
        self._reader.join(timeout=5)
        return code

    @property
    def text(self) -> str:
        with self._cond:
            return '\n'.join(self.lines)

    def pids(self) -> dict[str, int]:
        with self._cond:
            return {m[1]: int(m[2]) for m in map(STARTED.match, self.lines) if m}

    def kill_leftovers(self):
        for pid in self.pids().values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def up(*args, env, cwd) -> Runner:
    return Runner([sys.executable, '-m', 'claw_rl_ros.cli', 'up', *args], env, cwd)


@pytest.fixture(scope='module')
def exported_student(robot, tmp_path_factory):
    """test_export's policy (its observation normaliser fitted) exported to student.onnx."""
    path = tmp_path_factory.mktemp('model') / 'student.onnx'
    return export_onnx(make_policy(robot), robot, path)


def test_one_shot_graph_output_is_prefixed(ros_env, tmp_path):
    runner = up('stand', '--seconds', '0.2', env=ros_env, cwd=tmp_path)
    assert runner.finish(timeout=120) == 0, runner.text
    lines = [line for line in runner.lines if line.strip()]
    assert all(line.startswith(('[stand] ', '[up] ')) for line in lines), runner.text
    assert any(line.startswith('[stand]   fell:') for line in lines), runner.text
    assert lines[-1] == '[up] stand finished'


def test_control_graph_runs_the_nodes_and_stops_on_sigint(ros_env, probe, exported_student,
                                                          tmp_path):
    probe.subscribe('joint_commands', Float64MultiArray, 10)
    runner = up('control', '--model', str(exported_student), env=ros_env, cwd=tmp_path)
    try:
        probe.wait_for('joint_commands', timeout=60)  # sim -> policy -> commands: both are up
        pids = runner.pids()
        assert set(pids) == {'sim_node', 'policy_node'}
        # The graph's parameters reached the nodes (real parameter services).
        reply = probe.call(GetParameters, '/policy_node/get_parameters', GetParameters.Request(
            names=['model_path', 'use_sim_time']))
        assert [v.string_value for v in reply.values[:1]] == [str(exported_student)]
        assert reply.values[1].bool_value is True
        reply = probe.call(GetParameters, '/sim_node/get_parameters', GetParameters.Request(
            names=['mode', 'publish_clock']))
        assert (reply.values[0].string_value, reply.values[1].bool_value) == ('realtime', True)

        runner.proc.send_signal(signal.SIGINT)
        assert runner.finish(timeout=30) == 0, runner.text
    finally:
        runner.kill_leftovers()
    assert all(gone(pid) for pid in pids.values()), runner.text
    assert '[up] shutting down' in runner.text
    for name in ('sim_node', 'policy_node'):
        assert f'[up] {name} stopped (exit status 0)' in runner.text
        assert any(line.startswith(f'[{name}] ') for line in runner.lines), runner.text
    assert 'SIGTERM' not in runner.text  # SIGINT was enough


def test_a_node_that_dies_stops_the_graph_with_non_zero_status(ros_env, tmp_path):
    corrupt = tmp_path / 'corrupt.onnx'
    corrupt.write_bytes(b'this is not an ONNX model')
    runner = up('control', '--model', str(corrupt), '--mode', 'lockstep', env=ros_env,
                cwd=tmp_path)
    try:
        code = runner.finish(timeout=60)
    finally:
        runner.kill_leftovers()
    assert code == 1, runner.text
    assert re.search(r'^\[up\] policy_node died \(exit status 1\): stopping the graph$',
                     runner.text, re.M), runner.text
    assert '[policy_node] ' in runner.text  # its reason, relayed
    assert all(gone(pid) for pid in runner.pids().values()), runner.text


STUBBORN = '''
import signal
if IGNORE_SIGINT:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
print('ready', flush=True)
while True:
    signal.pause()
'''
DRIVER = '''
import sys
from claw_rl_ros.launch_graph import description, Graph, NodeEntry, resolve
from claw_rl_ros.launch_graph.graph_runner import GraphRunner
description.EXECUTABLES['stubborn'] = 'stubborn'
graph = Graph('g', 'test', (), lambda v: [NodeEntry('stubborn', 'stubborn')])
sys.exit(GraphRunner(resolve(graph), grace_s=1.0).run())
'''


def stubborn_graph(tmp_path, env, ignore_sigint: bool) -> Runner:
    """The runner with one tiny node that prints 'ready' and waits for signals."""
    (tmp_path / 'stubborn.py').write_text(f'IGNORE_SIGINT = {ignore_sigint}\n' + STUBBORN)
    (tmp_path / 'driver.py').write_text(DRIVER)
    runner = Runner([sys.executable, str(tmp_path / 'driver.py')],
                    {**env, 'PYTHONPATH': str(tmp_path)}, tmp_path)
    runner.wait_line(r'^\[stubborn\] ready$')
    return runner


def test_a_node_ignoring_sigint_gets_sigterm_after_the_grace_period(ros_env, tmp_path):
    runner = stubborn_graph(tmp_path, ros_env, ignore_sigint=True)
    try:
        runner.proc.send_signal(signal.SIGINT)
        code = runner.finish(timeout=30)
    finally:
        runner.kill_leftovers()
    assert code == 1, runner.text  # not a clean stop
    assert '[up] stubborn still running: sending SIGTERM' in runner.text
    assert '[up] stubborn stopped (killed by SIGTERM)' in runner.text
    assert all(gone(pid) for pid in runner.pids().values())


def test_sigterm_to_the_runner_stops_the_graph(ros_env, tmp_path):
    runner = stubborn_graph(tmp_path, ros_env, ignore_sigint=False)
    try:
        runner.proc.send_signal(signal.SIGTERM)
        code = runner.finish(timeout=30)
    finally:
        runner.kill_leftovers()
    # The node is sent SIGINT and dies of it (Python's KeyboardInterrupt): a stop on request.
    assert code == 0, runner.text
    assert '[up] stubborn stopped (killed by SIGINT)' in runner.text
    assert 'sending SIGTERM' not in runner.text
    assert all(gone(pid) for pid in runner.pids().values())


def test_a_closed_output_does_not_orphan_the_nodes(ros_env, tmp_path):
    """``claw-rl up ... | head`` : the reader goes away, Ctrl-C still stops every node."""
    (tmp_path / 'stubborn.py').write_text('IGNORE_SIGINT = False\n' + STUBBORN)
    (tmp_path / 'driver.py').write_text(DRIVER)
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([sys.executable, str(tmp_path / 'driver.py')], cwd=tmp_path,
                            env={**ros_env, 'PYTHONPATH': str(tmp_path)}, stdout=write_fd,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    os.close(write_fd)
    pid = None
    try:
        with os.fdopen(read_fd, 'r') as out:
            for line in out:  # the runner's first lines, up to the node's 'ready'
                match = STARTED.match(line)
                pid = int(match[2]) if match else pid
                if line.startswith('[stubborn] ready'):
                    break
        # The reader is gone: the runner's next writes hit a closed pipe.
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        if pid and not gone(pid):
            os.kill(pid, signal.SIGKILL)
    assert pid is not None and gone(pid)


CRASHER = '''
import sys
print('up and crashing', flush=True)
sys.exit(3)
'''
RESPAWN_DRIVER = '''
import sys
from claw_rl_ros.launch_graph import description, Graph, NodeEntry, resolve
from claw_rl_ros.launch_graph.graph_runner import GraphRunner
description.EXECUTABLES['crasher'] = 'crasher'
graph = Graph('g', 'test', (), lambda v: [NodeEntry('crasher', 'crasher', respawn=True,
                                                    respawn_delay=float(sys.argv[1]))])
sys.exit(GraphRunner(resolve(graph), grace_s=1.0).run())
'''


def crasher_graph(tmp_path, env, delay: float) -> Runner:
    """The runner with one respawning node that exits with status 3 as soon as it starts."""
    (tmp_path / 'crasher.py').write_text(CRASHER)
    (tmp_path / 'driver.py').write_text(RESPAWN_DRIVER)
    return Runner([sys.executable, str(tmp_path / 'driver.py'), str(delay)],
                  {**env, 'PYTHONPATH': str(tmp_path)}, tmp_path)


def test_a_respawning_node_that_keeps_dying_at_start_is_given_up(ros_env, tmp_path):
    """A node refusing its configuration would be restarted for ever: after three restarts
    that each died at once the runner stops the graph with the node's status."""
    from claw_rl_ros.launch_graph.graph_runner import RESPAWN_GIVE_UP
    runner = crasher_graph(tmp_path, ros_env, 0.1)
    try:
        code = runner.finish(timeout=120)
    finally:
        runner.kill_leftovers()
    assert code == 3, runner.text
    text = runner.text
    assert text.count('[up] started crasher (pid') == RESPAWN_GIVE_UP + 1, text
    assert text.count('[up] crasher died (exit status 3): restarting it in 0.1 s') == \
        RESPAWN_GIVE_UP, text
    assert f'within 10 s of starting {RESPAWN_GIVE_UP + 1} times in a row: not restarting' \
        in text


def test_no_restart_once_the_graph_is_shutting_down(ros_env, tmp_path):
    runner = crasher_graph(tmp_path, ros_env, 60.0)
    try:
        runner.wait_line(r'^\[up\] crasher died \(exit status 3\): restarting it in 60 s$')
        start = time.monotonic()
        runner.proc.send_signal(signal.SIGINT)
        code = runner.finish(timeout=30)
    finally:
        runner.kill_leftovers()
    assert time.monotonic() - start < 20, runner.text  # not after the 60 s delay
    assert code == 0, runner.text
    assert runner.text.count('[up] started crasher') == 1, runner.text


def test_deploy_graph_restarts_a_killed_policy_node(ros_env, probe, exported_student, tmp_path):
    """``claw-rl up deploy``: the policy node SIGKILLed comes back as a new process whose
    topics and services answer; Ctrl-C then stops the graph cleanly."""
    from rcl_interfaces.srv import GetParameters
    from std_msgs.msg import String
    from claw_rl_ros.nodes.ros_io import STATE_QOS
    probe.subscribe('/policy/model_version', String, STATE_QOS)
    runner = up('deploy', '--model', str(exported_student), env=ros_env, cwd=tmp_path)
    try:
        probe.wait_for('/policy/model_version', timeout=60)
        old = runner.pids()['policy_node']
        os.kill(old, signal.SIGKILL)
        runner.wait_line(r'^\[up\] policy_node died \(killed by SIGKILL\): restarting it in '
                         r'1 s$')
        new = int(runner.wait_line(rf'^\[up\] started policy_node \(pid (?!{old}\b)(\d+)\)',
                                   timeout=30)[1])
        mark = probe.count('/policy/model_version')
        probe.wait_for('/policy/model_version', timeout=60, start=mark)  # the new one's
        reply = probe.call(GetParameters, '/policy_node/get_parameters',
                           GetParameters.Request(names=['model_path']), timeout=30)
        assert reply.values[0].string_value == str(exported_student)
        assert gone(old) and not gone(new)
        runner.proc.send_signal(signal.SIGINT)
        code = runner.finish(timeout=60)
    finally:
        runner.kill_leftovers()
    assert code == 0, runner.text
    assert '[up] policy_node stopped (exit status 0)' in runner.text
    assert gone(new)


def test_log_level_reaches_each_nodes_own_logger_only(ros_env, tmp_path):
    """``claw-rl up --log-level debug``: the level each node's own logger gets, asked of real
    rclpy nodes of the same names in a namespace; rcl's logger keeps its default (its debug
    output would bury the nodes'). Without the option the command line is launch's."""
    import json
    from claw_rl_ros.launch_graph import GRAPHS, resolve
    from claw_rl_ros.launch_graph.description import ros_command
    from claw_rl_ros.launch_graph.graph_runner import command_line
    nodes = resolve(GRAPHS['train'], {'actors': '2', 'namespace': 'lab/one'})
    inline = str(tmp_path / 'lab__one__trainer.yaml')
    assert command_line(nodes[0], tmp_path, 'py') == \
        ['py', '-m', nodes[0].module, *ros_command(nodes[0], inline)]
    script = tmp_path / 'levels.py'
    script.write_text(
        'import json, sys\n'
        'import rclpy\n'
        'from rclpy.context import Context\n'
        'out = []\n'
        'for fqn, level_args in json.loads(sys.argv[1]):\n'
        '    ns, name = fqn.rsplit("/", 1)\n'
        '    ctx = Context()\n'
        '    rclpy.init(args=["x", "--ros-args", *level_args], context=ctx)\n'
        '    node = rclpy.create_node(name, namespace=ns, context=ctx)\n'
        '    out.append([int(node.get_logger().get_effective_level()),\n'
        '                int(rclpy.logging.get_logger("rcl").get_effective_level())])\n'
        '    node.destroy_node()\n'
        '    rclpy.shutdown(context=ctx)\n'
        'print(json.dumps(out))\n')
    cases = []
    for node in nodes:
        cmd = command_line(node, tmp_path, 'py', log_level='debug')
        assert cmd[-2] == '--log-level', cmd
        cases.append((node.fqn, cmd[-2:]))
    result = subprocess.run([sys.executable, str(script), json.dumps(cases)],
                            capture_output=True, text=True, timeout=60, env=ros_env)
    assert result.returncode == 0, result.stderr
    levels = json.loads(result.stdout.strip().splitlines()[-1])
    # rcutils severities: DEBUG 10, INFO 20 (the default).
    assert levels == [[10, 20]] * len(nodes), (cases, levels)
