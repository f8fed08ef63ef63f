"""`claw-rl train` as a real process: artifacts, Ctrl-C, and SIGKILL + --resume."""

import csv
import json
import os
from pathlib import Path
import signal
import subprocess
import sys
import time

import pytest
import yaml

TINY = {
    'env': {'num_envs': 16, 'episode_length_s': 1.0, 'num_threads': 1},
    'policy': {'actor_hidden_dims': [32, 32], 'critic_hidden_dims': [32, 32]},
    'ppo': {'num_learning_epochs': 2, 'num_mini_batches': 2},
    'runner': {'num_steps_per_env': 8, 'max_iterations': 8, 'save_interval': 1, 'seed': 3,
               'eval_episodes': 2, 'torch_threads': 1},
}
DETERMINISTIC = ('total_steps', 'mean_reward', 'value_loss', 'surrogate_loss', 'entropy',
                 'learning_rate', 'tracking_error/lin_vel_x')
CLAW_RL = [sys.executable, '-m', 'claw_rl_ros.cli']


@pytest.fixture
def tiny_yaml(tmp_path):
    path = tmp_path / 'tiny.yaml'
    path.write_text(yaml.safe_dump(TINY))
    return path


def rows(run_dir):
    with open(Path(run_dir) / 'metrics.csv', newline='') as f:
        return list(csv.DictReader(f))


def wait_for(path, proc, timeout=120):
    start = time.time()
    while not Path(path).exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() - start < timeout, f'{path} never appeared'
        time.sleep(0.05)


def test_train_writes_all_artifacts(tiny_yaml, tmp_path):
    run = tmp_path / 'run'
    result = subprocess.run(CLAW_RL + ['train', '--config', str(tiny_yaml), '--run-dir', str(run)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert 'it     8/8' in result.stdout and 'ETA' in result.stdout
    for name in ('config.yaml', 'metrics.csv', 'learning_curve.png', 'student.onnx',
                 'summary.json'):
        assert (run / name).is_file(), name
    assert list(run.glob('events.out.tfevents.*'))
    assert (run / 'checkpoints' / 'model_8.pt').is_file()
    assert [int(r['iteration']) for r in rows(run)] == list(range(1, 9))
    # Episode and per-term reward columns exist from the first row on (empty until the first
    # episodes end) and fill in once 1 s episodes have finished.
    last = rows(run)[-1]
    for key in ('mean_episode_return', 'mean_episode_length_s', 'reward/tracking_lin_vel'):
        assert key in rows(run)[0] and float(last[key]) == float(last[key]), key
    summary = json.loads((run / 'summary.json').read_text())
    assert summary['iterations'] == 8 and summary['total_steps'] == 8 * 16 * 8
    assert 'fall_rate' in json.dumps(summary['eval_forward_0.5'])
    # The resolved config round-trips into a new run.
    assert yaml.safe_load((run / 'config.yaml').read_text())['env']['num_envs'] == 16


def test_sigkill_then_resume_continues_the_same_curve(tiny_yaml, tmp_path):
    straight = tmp_path / 'straight'
    subprocess.run(CLAW_RL + ['train', '--config', str(tiny_yaml), '--run-dir', str(straight),
                              '--no-export'], check=True, capture_output=True, timeout=300)
    killed = tmp_path / 'killed'
    proc = subprocess.Popen(CLAW_RL + ['train', '--config', str(tiny_yaml), '--run-dir',
                                       str(killed), '--no-export'],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for(killed / 'checkpoints' / 'model_3.pt', proc)
    time.sleep(0.13)  # somewhere inside a later iteration or checkpoint write
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    resumed = subprocess.run(CLAW_RL + ['train', '--resume', str(killed), '--no-export'],
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert 'resumed' in resumed.stdout
    a, b = rows(straight), rows(killed)
    assert [int(r['iteration']) for r in b] == list(range(1, 9))
    for ra, rb in zip(a, b):
        for key in DETERMINISTIC:
            assert ra[key] == rb[key], (ra['iteration'], key)


def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(tiny_yaml, tmp_path):
    run = tmp_path / 'run'
    proc = subprocess.Popen(CLAW_RL + ['train', '--config', str(tiny_yaml), '--run-dir', str(run),
                                       '--set', 'runner.max_iterations=100000',
                                       '--set', 'runner.save_interval=1000'],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(run / 'metrics.csv', proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert 'Ctrl-C' in out and 'saved checkpoint' in out
    summary = json.loads((run / 'summary.json').read_text())
    assert summary['stopped_by_user'] is True
    saved = sorted(run.glob('checkpoints/model_*.pt'))
    assert len(saved) == 1 and int(saved[0].stem.split('_')[1]) == summary['iterations']
    assert not (run / 'student.onnx').exists()


def test_train_refuses_to_overwrite_a_run(tiny_yaml, tmp_path):
    run = tmp_path / 'run'
    (run / 'checkpoints').mkdir(parents=True)
    (run / 'checkpoints' / 'model_1.pt').write_bytes(b'x')
    result = subprocess.run(CLAW_RL + ['train', '--config', str(tiny_yaml), '--run-dir',
                                       str(run)], capture_output=True, text=True, timeout=120,
                            env={**os.environ})
    assert result.returncode == 2
    assert 'use --resume' in result.stderr and len(result.stderr.strip().splitlines()) == 1
