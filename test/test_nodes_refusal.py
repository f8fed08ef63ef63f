"""A node that refuses its configuration says why in one line and exits 1 (real processes).

The trainer's refusal of a run directory with checkpoints (no resume) printed the right
``[FATAL] refusing to start`` line and then a 30-line traceback: rclpy's shutdown destroyed the
half-built node, whose destroy_node used what __init__ never made. The other nodes that
override destroy_node (actor, recorder) had the same pattern.
"""

import subprocess
import sys

import pytest

from ros_helpers import node_module, ROOT, ros_value


def refusal(tmp_path):
    """(node, parameters, words of the reason) per node."""
    run_dir = tmp_path / 'run'
    (run_dir / 'checkpoints').mkdir(parents=True)
    (run_dir / 'checkpoints' / 'model_3.pt').write_bytes(b'')
    return {
        'trainer_node': ({'run_dir': str(run_dir)}, 'set resume to true'),
        'actor_node': ({'config': str(tmp_path / 'nope.yaml')}, 'nope.yaml'),
        'recorder_node': ({}, 'parameter path is empty'),
        # rclpy's EventsExecutor fails on the recorder's subscriptions: refused, not a crash.
        'recorder_node events': ({'path': str(tmp_path / 'r.mcap'), 'executor': 'events'},
                                 "executor = 'events'"),
        'sim_node': ({'mode': 'fast'}, "mode = 'fast'"),
    }


@pytest.mark.parametrize('case', ['trainer_node', 'actor_node', 'recorder_node',
                                  'recorder_node events', 'sim_node'])
def test_a_refusal_is_one_line_and_exit_status_1(ros_env, tmp_path, case):
    node = case.split()[0]
    params, words = refusal(tmp_path)[case]
    cmd = [sys.executable, '-m', node_module(node), '--ros-args']
    for key, value in params.items():
        cmd += ['-p', f'{key}:={ros_value(value)}']
    result = subprocess.run(cmd, cwd=ROOT, env=ros_env, capture_output=True, text=True,
                            timeout=180)
    fatal = [line for line in result.stderr.splitlines() if line.startswith('[FATAL]')]
    assert result.returncode == 1, result.stderr
    assert len(fatal) == 1 and fatal[0].startswith('[FATAL] refusing to start: '), result.stderr
    assert words in fatal[0], fatal
    assert 'Traceback' not in result.stderr + result.stdout, result.stderr
