"""`claw-rl train --env gym:<EnvId> --algorithm ppo|sac`: artifacts, resume, bad input."""

import csv
import json
from pathlib import Path

import pytest
import yaml

from claw_rl_ros.cli import main

TINY = ['--set', 'runner.max_iterations=2', '--set', 'runner.num_steps_per_env=50',
        '--set', 'runner.save_interval=1', '--set', 'runner.eval_episodes=1',
        '--set', 'runner.torch_threads=1', '--set', 'env.num_envs=2',
        '--set', 'policy.actor_hidden_dims=[16]', '--set', 'policy.critic_hidden_dims=[16]',
        '--set', 'sac.learning_starts=50', '--set', 'sac.utd_ratio=0.1',
        '--set', 'sac.batch_size=32', '--set', 'sac.buffer_size=1000',
        '--set', 'ppo.num_mini_batches=2']


def rows(run_dir):
    with open(Path(run_dir) / 'metrics.csv', newline='') as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize('algorithm, loss', [('sac', 'critic_loss'), ('ppo', 'value_loss')])
def test_train_a_gymnasium_env_from_the_command_line(algorithm, loss, tmp_path, capsys):
    run = tmp_path / 'run'
    assert main(['train', '--env', 'gym:Pendulum-v1', '--algorithm', algorithm,
                 '--run-dir', str(run), *TINY]) == 0
    out = capsys.readouterr().out
    assert f'training Pendulum-v1 with {algorithm}' in out and 'it     2/2' in out
    cfg = yaml.safe_load((run / 'config.yaml').read_text())
    assert cfg['algorithm'] == algorithm and cfg['gym_env'] == 'Pendulum-v1'
    # The per-task defaults file of the algorithm was used (CleanRL / SB3 values).
    assert cfg['policy']['activation'] == {'sac': 'relu', 'ppo': 'tanh'}[algorithm]
    table = rows(run)
    assert [r['total_steps'] for r in table] == ['100', '200'] and loss in table[0]
    assert (run / 'checkpoints' / 'model_2.pt').is_file()
    assert (run / 'learning_curve.png').is_file()
    summary = json.loads((run / 'summary.json').read_text())
    assert summary['eval']['episodes'] == 1 and summary['eval']['mean_return'] < 0
    # Resume continues the same run (for SAC with its replay buffer).
    assert main(['train', '--resume', str(run), '--set', 'runner.max_iterations=3']) == 0
    assert [r['total_steps'] for r in rows(run)] == ['100', '200', '300']
    # claw-rl eval runs the newest checkpoint on the run's env.
    report = tmp_path / 'eval.json'
    assert main(['eval', '--run-dir', str(run), '--episodes', '2', '--json', str(report)]) == 0
    result = json.loads(report.read_text())
    assert result['checkpoint'] == 'model_3.pt' and result['env'] == 'Pendulum-v1'
    assert result['algorithm'] == algorithm and -2000 < result['mean_return'] < 0


@pytest.mark.parametrize('env, match', [('gym:NoSuchEnv-v0', 'NoSuchEnv'),
                                        ('gym:CartPole-v1', 'not a Box'),
                                        ('mujoco:Ant', 'expected gym:<EnvId>')])
def test_bad_gymnasium_envs_exit_2_with_one_line(env, match, tmp_path, capsys):
    assert main(['train', '--env', env, '--run-dir', str(tmp_path / 'r'), *TINY]) == 2
    err = capsys.readouterr().err
    assert match in err and '--env' in err and 'Traceback' not in err


def test_eval_needs_a_model_or_a_gymnasium_run(tmp_path, capsys):
    assert main(['eval']) == 2
    assert 'give an exported .onnx student with --model' in capsys.readouterr().err
    assert main(['eval', '--run-dir', str(tmp_path)]) == 2
    assert 'no checkpoints' in capsys.readouterr().err
