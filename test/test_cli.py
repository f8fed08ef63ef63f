"""The claw-rl command line: exit codes and one-line errors."""

import subprocess
import sys

from claw_rl_ros.cli import main


def test_stand_reports_and_exits_zero(capsys):
    assert main(['stand', '--seconds', '1.0', '--num-envs', '2']) == 0
    out = capsys.readouterr().out
    assert 'fell:               0' in out and 'trunk height' in out


def test_missing_robot_config_exits_2_with_one_line(capsys):
    assert main(['spec', '--robot', 'no_such_robot']) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert 'robot: no_such_robot: no robot of that name' in err and '--robot path/to' in err


def test_console_script_runs_as_module():
    result = subprocess.run([sys.executable, '-m', 'claw_rl_ros.cli', 'spec'],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and '"obs_dim": 47' in result.stdout
