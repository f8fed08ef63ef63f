"""The claw-rl CLI as a ROS executable: a ``--ros-args`` tail (launch_ros, ros2 run) is ignored.

launch_ros appends ``--ros-args -r __node:=<name>`` to every Node's command line; argparse
alone rejects it (exit 2, "unrecognized arguments"), which killed stand.launch.py.
"""

import json
import subprocess
import sys


def test_claw_rl_ignores_a_ros_args_tail_and_imports_rclpy_only_then(tmp_path):
    code = ('import json, sys; from claw_rl_ros import cli; '
            'rc = cli.main(sys.argv[1:]); print(json.dumps(["rclpy" in sys.modules, rc]))')
    for tail, uses_rclpy in (([], False), (['--ros-args', '-r', '__node:=x'], True)):
        result = subprocess.run([sys.executable, '-c', code, 'spec', *tail], cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout.splitlines()[-1]) == [uses_rclpy, 0]
        assert '"robot": "claw_quadruped"' in result.stdout
    bad = subprocess.run([sys.executable, '-m', 'claw_rl_ros.cli', 'spec', '--ros-args', '-r'],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.startswith('claw-rl: error: command line: --ros-args: ')
    assert 'Traceback' not in bad.stderr
