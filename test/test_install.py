"""Real installs: a non-editable pip install into a fresh venv, and a colcon workspace build.

Both must give the ROS layout: the ament index marker, share/claw_rl_ros/{package.xml, launch,
config, urdf} and the executables in lib/claw_rl_ros, so ros2 run/launch can find them.
"""

import json
import os
from pathlib import Path
import shutil
import subprocess
import sys
import sysconfig

import pytest

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
    assert (share / 'launch' / 'stand.launch.py').is_file()
    assert (share / 'config' / 'robots' / 'claw_quadruped.yaml').is_file()
    assert (share / 'urdf' / 'claw_quadruped.urdf').is_file()
    exe = prefix / 'lib' / 'claw_rl_ros' / 'claw_rl'
    assert exe.is_file() and os.access(exe, os.X_OK)


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
    assert (pip_prefix / 'bin' / 'claw-rl').is_file()


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


def test_colcon_build_installs_the_ros_layout(tmp_path):
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
    out = run([str(prefix / 'lib' / 'claw_rl_ros' / 'claw_rl'), 'spec'], cwd=tmp_path,
              env={**env, 'PATH': f'{Path(sys.executable).parent}:{env["PATH"]}'}).stdout
    assert json.loads(out)['joint_names'][0] == 'FL_hip_joint'
    code = 'import claw_rl_ros.core.paths as p; print(p.__file__); print(p.share_dir())'
    out = run([sys.executable, '-c', code], cwd=tmp_path, env=env).stdout.split('\n')
    assert out[0].startswith(str(prefix)) and out[1] == str(prefix / 'share' / 'claw_rl_ros')
