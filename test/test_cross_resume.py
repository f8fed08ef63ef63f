"""One learner, one checkpoint layout: a checkpoint of the offline runner resumes in the live
trainer and the other way round, in-process and as the real commands (``claw-rl train`` and
``claw-rl up train`` with its ROS graph)."""

import csv
import json
from pathlib import Path
import subprocess
import sys

import pytest
import torch
import yaml

from claw_rl_ros.core.learning import checkpoint as ckpt
from claw_rl_ros.core.learning.runner import OnPolicyRunner
from claw_rl_ros.core.live.live_trainer import LiveTrainer
from test_live_trainer import Actor, Clock, iterate_with_one_actor, push
from test_training import params_of, tiny_config

CLAW_RL = [sys.executable, '-m', 'claw_rl_ros.cli']
CONFIG = {'env': {'episode_length_s': 0.2}}


def learner_state(learner) -> dict:
    """What must survive the change of loop: weights, optimiser, counters, episode logs."""
    alg = learner.alg.state_dict()
    return {'params': params_of(learner), 'iteration': learner.iteration,
            'policy_version': learner.policy_version, 'total_steps': learner.total_steps,
            'elapsed_s': learner.elapsed_s, 'lr': alg['learning_rate'],
            'adam_steps': [s['step'] for s in alg['optimizer']['state'].values()],
            'returns': list(learner.episodes.returns),
            'generator': learner.generator.get_state()}


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def test_an_offline_checkpoint_resumes_in_the_live_trainer(tmp_path, robot):
    runner = OnPolicyRunner(tiny_config(**CONFIG), tmp_path / 'run')
    for _ in range(2):
        runner.train_one_epoch()
    runner.save()
    saved = learner_state(runner.learner)
    assert saved['returns'], 'no episode ended: the episode logs are not checked'
    runner.close()
    clock = Clock()
    live = LiveTrainer(tiny_config(**CONFIG), robot, tmp_path / 'run', resume=True,
                       clock=clock, tensorboard=False)
    assert live.resumed_from == ckpt.checkpoint_path(tmp_path / 'run', 2)
    assert_same_state(saved, learner_state(live.learner))
    actor = Actor(live)
    live.offer(actor.chunk(live, push(live)))
    clock.now += 1.0
    metrics = live.iterate()
    actor.env.close()
    assert live.learner.iteration == 3 and metrics['total_steps'] == 3 * 16 * 8
    assert torch.isfinite(params_of(live.learner)).all()
    live.finish(stopped=True)


def test_a_live_checkpoint_resumes_in_the_offline_runner(tmp_path, robot):
    clock = Clock()
    live = LiveTrainer(tiny_config(**CONFIG), robot, tmp_path / 'run', clock=clock,
                       tensorboard=False)
    iterate_with_one_actor(live, clock, 2)
    live.finish(stopped=True)
    saved = learner_state(live.learner)
    runner = OnPolicyRunner(tiny_config(**CONFIG), tmp_path / 'offline')
    runner.load(ckpt.latest_checkpoint(tmp_path / 'run'))
    assert not runner.env_resumed  # a live checkpoint has no env: the worlds start anew
    assert_same_state(saved, learner_state(runner.learner))
    metrics = runner.train_one_epoch()
    assert runner.iteration == 3 and metrics['total_steps'] == 3 * 16 * 8
    runner.close()


@pytest.mark.parametrize('field, value, match', [
    ('algorithm', 'sac', 'trained with ppo, this run uses sac'),
    ('algorithm_state', None, 'predates the shared learner layout'),
])
def test_a_checkpoint_of_another_algorithm_or_layout_is_refused_by_name(
        tmp_path, field, value, match):
    runner = OnPolicyRunner(tiny_config(**CONFIG), tmp_path / 'a')
    runner.train_one_epoch()
    path = runner.save()
    runner.close()
    if field == 'algorithm':
        other = OnPolicyRunner(tiny_config(**CONFIG, algorithm='sac'), tmp_path / 'b')
    else:
        payload = ckpt.load_checkpoint(path)
        del payload[field]
        ckpt.save_checkpoint(path, payload)
        other = OnPolicyRunner(tiny_config(**CONFIG), tmp_path / 'b')
    with pytest.raises(Exception, match=match) as error:
        other.load(path)
    assert str(path) in str(error.value)
    other.close()


TINY = {'env': {'num_envs': 8, 'episode_length_s': 0.5, 'num_threads': 1},
        'policy': {'actor_hidden_dims': [32, 32], 'critic_hidden_dims': [32, 32]},
        'ppo': {'num_learning_epochs': 1, 'num_mini_batches': 2},
        'runner': {'num_steps_per_env': 8, 'seed': 3, 'keep_checkpoints': 2,
                   'eval_episodes': 0, 'torch_threads': 1}}


def iterations(run_dir: Path) -> list[int]:
    with open(run_dir / 'metrics.csv', newline='') as f:
        return [int(r['iteration']) for r in csv.DictReader(f)]


def test_claw_rl_train_and_the_train_graph_resume_each_other(ros_env, tmp_path):
    """claw-rl train (2 iterations) -> claw-rl up train --resume true (to 4) -> claw-rl train
    --resume (to 5): one run directory, one curve, the counters carried through both."""
    from test_graph_runner import gone, up
    config = tmp_path / 'tiny.yaml'
    config.write_text(yaml.safe_dump(TINY))
    run_dir = tmp_path / 'run'
    offline = subprocess.run(CLAW_RL + ['train', '--config', str(config), '--run-dir',
                                        str(run_dir), '--set', 'runner.max_iterations=2',
                                        '--no-export'],
                             capture_output=True, text=True, timeout=300, env=ros_env)
    assert offline.returncode == 0, offline.stdout + offline.stderr
    assert iterations(run_dir) == [1, 2]
    graph = up('train', '--config', str(config), '--actors', '1', '--run-dir', str(run_dir),
               '--resume', 'true', '--set', 'runner.max_iterations=4', env=ros_env,
               cwd=tmp_path)
    try:
        assert graph.finish(timeout=300) == 0, graph.text
    finally:
        graph.kill_leftovers()
    assert all(gone(pid) for pid in graph.pids().values())
    assert f'resumed from {ckpt.checkpoint_path(run_dir, 2)} (iteration 2)' in graph.text, \
        graph.text
    live = json.loads((run_dir / 'summary.json').read_text())
    # The terminal gets the numbers in one line; the tables stay in summary.json.
    done = [line for line in graph.lines if 'training done: ' in line]
    assert len(done) == 1 and "'iterations': 4" in done[0] and 'chunks' not in done[0], done
    assert 'chunks' in live
    assert live['iterations'] == 4 and live['stopped_by_user'] is False, live
    assert iterations(run_dir) == [1, 2, 3, 4]
    back = subprocess.run(CLAW_RL + ['train', '--resume', str(run_dir), '--set',
                                     'runner.max_iterations=5', '--no-export'],
                          capture_output=True, text=True, timeout=300, env=ros_env)
    assert back.returncode == 0, back.stdout + back.stderr
    assert 'at iteration 4' in back.stdout and 'start from a reset' in back.stdout, back.stdout
    final = json.loads((run_dir / 'summary.json').read_text())
    assert final['iterations'] == 5 and final['total_steps'] == live['total_steps'] + 8 * 8, final
    assert iterations(run_dir) == [1, 2, 3, 4, 5]
