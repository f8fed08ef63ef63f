"""Lint as a test, as ament_flake8 does for ROS 2 packages (config in setup.cfg)."""

from pathlib import Path
import subprocess
import sys

ROOT = Path(__file__).resolve().parents[1]


def test_flake8_is_clean():
    result = subprocess.run([sys.executable, '-m', 'flake8', 'claw_rl_ros', 'test', 'bench',
                             'launch', 'tools', 'setup.py'], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, f'flake8 found problems:\n{result.stdout}{result.stderr}'
