"""Real installs: a non-editable pip install into a fresh venv, and a colcon workspace build.

Both must give the ROS layout: the ament index marker, share/claw_rl_ros/{package.xml, launch,
config, urdf} and the executables in lib/claw_rl_ros, so ros2 run/launch can find them. Every
installed executable must run with the ``--ros-args -r __node:=x`` tail launch_ros appends (the
process itself is checked: ``ros2 launch`` exits 0 even when its node died).
"""

import json
import os
from pathlib import Path
import shutil
import signal
import subprocess
import sys
import sysconfig

from diagnostic_msgs.msg import DiagnosticArray
import pytest

from claw_rl_ros.launch_graph import EXECUTABLES, GRAPHS

ROOT = Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns('.venv', '.git', 'build', 'install', 'log', 'runs', '*.egg-info',
                              '__pycache__', '.pytest_cache', '.gl', '.whl')
PY = f'python{sys.version_info.major}.{sys.version_info.minor}'


def copy_source(dest: Path) -> Path:
    shutil.copytree(ROOT, dest, ignore=SKIP)
    return dest


def run(cmd, **kw):
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert result.returncode == 0, f'{cmd} failed:\n{result.stdout}\n{result.stderr}'
    return result


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ('PYTHONPATH', 'AMENT_PREFIX_PATH', 'CLAW_RL_SHARE_DIR')}
    env.update(extra)
    return env


def assert_ros_layout(prefix: Path):
    share = prefix / 'share' / 'claw_rl_ros'
    assert (prefix / 'share/ament_index/resource_index/packages/claw_rl_ros').is_file()
    assert (share / 'package.xml').is_file()
    for graph in GRAPHS:
        assert (share / 'launch' / f'{graph}.launch.py').is_file()
    assert (share / 'config' / 'robots' / 'claw_quadruped.yaml').is_file()
    assert (share / 'urdf' / 'claw_quadruped.urdf').is_file()
    for name in EXECUTABLES:
        exe = prefix / 'lib' / 'claw_rl_ros' / name
        assert exe.is_file() and os.access(exe, os.X_OK), exe


def assert_nodes_take_ros_args(probe, commands: dict[str, list[str]], env, cwd):
    """Start each node command with ``--ros-args -r __node:=<key>``: it runs under that name
    until SIGINT, then exits 0 (so launch_ros can start it)."""
    if '/diagnostics' not in probe.messages:
        probe.subscribe('/diagnostics', DiagnosticArray, 50)
    procs = {name: subprocess.Popen([*cmd, '--ros-args', '-r', f'__node:={name}'], cwd=cwd,
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True) for name, cmd in commands.items()}
    try:
        for name, proc in procs.items():
            # Its 1 Hz /diagnostics come from the spinning node, named as we renamed it.
            probe.wait_for('/diagnostics', lambda m, fqn=f'/{name}': any(
                s.hardware_id == fqn for s in m.status), timeout=60)
        for proc in procs.values():
            proc.send_signal(signal.SIGINT)
        for name, proc in procs.items():
            code = proc.wait(timeout=30)
            assert code == 0, f'{name} exit {code}:\n{proc_output(proc)}'
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def proc_output(proc) -> str:
    return proc.stdout.read() if proc.poll() is not None else '(still running)'


@pytest.fixture(scope='module')
def pip_prefix(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('pip')
    src = copy_source(tmp / 'src')
    venv = tmp / 'venv'
    run([getattr(sys, '_base_executable', sys.executable), '-m', 'venv', str(venv)])
    # What `pip install .` does, in two steps so no network is needed: build the wheel with
    # the project's setuptools, then install it (non-editable) into the fresh venv.
    run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation',
         '-w', str(tmp / 'dist'), str(src)])
    wheel = next((tmp / 'dist').glob('claw_rl_ros-*.whl'))
    run([str(venv / 'bin' / 'python'), '-m', 'pip', 'install', '-q', '--no-deps', '--no-index',
         str(wheel)])
    # Dependencies (numpy, mujoco, ...) come from the project venv, after the venv's own
    # site-packages, so claw_rl_ros itself is imported from this install.
    site = venv / 'lib' / PY / 'site-packages'
    (site / 'project_deps.pth').write_text(sysconfig.get_paths()['purelib'] + '\n')
    return venv


def test_pip_install_places_ros_layout_in_the_venv_prefix(pip_prefix):
    assert_ros_layout(pip_prefix)
    for script in ('claw-rl', 'claw-rl-sim-node', 'claw-rl-policy-node',
                   'claw-rl-recorder-node'):
        assert (pip_prefix / 'bin' / script).is_file(), script


def test_ament_index_finds_the_pip_install(pip_prefix, tmp_path):
    code = ('from ament_index_python.packages import get_package_share_directory as g; '
            'import claw_rl_ros, claw_rl_ros.core.paths as p; '
            'print(g("claw_rl_ros")); print(claw_rl_ros.__file__); print(p.share_dir())')
    out = run([str(pip_prefix / 'bin' / 'python'), '-c', code], cwd=tmp_path,
              env=clean_env(AMENT_PREFIX_PATH=str(pip_prefix))).stdout.split('\n')
    share = str(pip_prefix / 'share' / 'claw_rl_ros')
    assert out[0] == share
    assert out[1].startswith(str(pip_prefix))
    assert out[2] == share


def test_installed_ros_executable_and_console_script_run(pip_prefix, tmp_path):
    env = clean_env(AMENT_PREFIX_PATH=str(pip_prefix))
    out = run([str(pip_prefix / 'lib' / 'claw_rl_ros' / 'claw_rl'), 'spec'], cwd=tmp_path,
              env=env).stdout
    assert json.loads(out)['robot'] == 'claw_quadruped'
    out = run([str(pip_prefix / 'bin' / 'claw-rl'), 'stand', '--seconds', '0.5',
               '--num-envs', '2'], cwd=tmp_path, env=env).stdout
    assert 'fell:               0' in out


def test_installed_executables_accept_a_ros_args_tail(pip_prefix, probe, tmp_path):
    env = clean_env(AMENT_PREFIX_PATH=str(pip_prefix))
    lib = pip_prefix / 'lib' / 'claw_rl_ros'
    out = run([str(lib / 'claw_rl'), 'spec', '--ros-args', '-r', '__node:=x'], cwd=tmp_path,
              env=env).stdout
    assert json.loads(out)['robot'] == 'claw_quadruped'
    bin_dir = pip_prefix / 'bin'
    # One kind at a time: this checks the command line, not a sim + policy loop
    # (test_graph_runner).
    assert_nodes_take_ros_args(probe, {'pip_lib_sim': [str(lib / 'sim_node')],
                                       'pip_bin_sim': [str(bin_dir / 'claw-rl-sim-node')]},
                               env, tmp_path)
    assert_nodes_take_ros_args(probe, {
        'pip_lib_policy': [str(lib / 'policy_node')],
        'pip_bin_policy': [str(bin_dir / 'claw-rl-policy-node')]}, env, tmp_path)
    # The recorder finds the .msg files from the install (schemas) and leaves a whole file.
    assert_nodes_take_ros_args(probe, {'pip_lib_recorder': [
        str(lib / 'recorder_node'), '--ros-args', '-p', f'path:={tmp_path / "r.mcap"}']},
        env, tmp_path)
    assert (tmp_path / 'r.mcap').stat().st_size > 0


def test_up_uses_the_installed_share_folder(pip_prefix, tmp_path):
    env = clean_env(AMENT_PREFIX_PATH=str(pip_prefix))
    out = run([str(pip_prefix / 'bin' / 'claw-rl'), 'up', 'control', '--print'], cwd=tmp_path,
              env=env).stdout
    share = pip_prefix / 'share' / 'claw_rl_ros' / 'config'
    assert f'--params-file {share / "sim_node.yaml"}' in out
    assert f'--params-file {share / "policy_node.yaml"}' in out


def test_colcon_build_installs_the_ros_layout(tmp_path, probe):
    colcon = Path(sys.executable).parent / 'colcon'
    assert colcon.is_file(), 'colcon is part of requirements.txt; run make venv'
    copy_source(tmp_path / 'ws' / 'src' / 'claw_rl_ros')
    run([str(colcon), 'build', '--base-paths', 'src'], cwd=tmp_path / 'ws',
        env=clean_env(COLCON_HOME=str(tmp_path / 'colcon_home')))
    prefix = tmp_path / 'ws' / 'install' / 'claw_rl_ros'
    assert_ros_layout(prefix)
    assert (prefix / 'lib' / 'claw_rl_ros' / 'claw-rl').is_file()
    env = clean_env(AMENT_PREFIX_PATH=str(prefix),
                    PYTHONPATH=str(prefix / 'lib' / PY / 'site-packages'))
    env['PATH'] = f'{Path(sys.executable).parent}:{env["PATH"]}'
    lib = prefix / 'lib' / 'claw_rl_ros'
    out = run([str(lib / 'claw_rl'), 'spec', '--ros-args', '-r', '__node:=x'], cwd=tmp_path,
              env=env).stdout
    assert json.loads(out)['joint_names'][0] == 'FL_hip_joint'
    for node in ('sim_node', 'policy_node'):
        assert_nodes_take_ros_args(probe, {f'colcon_{node}': [str(lib / node)]}, env, tmp_path)
    code = 'import claw_rl_ros.core.paths as p; print(p.__file__); print(p.share_dir())'
    out = run([sys.executable, '-c', code], cwd=tmp_path, env=env).stdout.split('\n')
    assert out[0].startswith(str(prefix)) and out[1] == str(prefix / 'share' / 'claw_rl_ros')
