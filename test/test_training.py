"""The training loop: alpha = 0 is PPO to the bit, checkpoints are atomic and resume exactly,
a short seeded run improves, and bad configs exit 2 with one line."""

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from claw_rl_ros.cli import main
from claw_rl_ros.core.learning import checkpoint as ckpt
from claw_rl_ros.core.config import ConfigError, from_dict, merge
from claw_rl_ros.core.learning.learner import load_teacher
from claw_rl_ros.core.learning.runner import OnPolicyRunner
from claw_rl_ros.core.learning.train_config import TrainConfig

TINY = {
    'env': {'num_envs': 16, 'episode_length_s': 2.0, 'num_threads': 1},
    'policy': {'actor_hidden_dims': [32, 32], 'critic_hidden_dims': [32, 32]},
    'ppo': {'num_learning_epochs': 2, 'num_mini_batches': 2},
    'runner': {'num_steps_per_env': 8, 'max_iterations': 3, 'save_interval': 1, 'seed': 5,
               'eval_episodes': 0},
}


def tiny_config(**overrides) -> TrainConfig:
    return from_dict(TrainConfig, merge(TINY, overrides), source='test')


def params_of(runner):
    return torch.cat([p.detach().flatten() for p in runner.policy.parameters()])


def run_iterations(cfg, run_dir, n):
    runner = OnPolicyRunner(cfg, run_dir)
    metrics = [runner.train_one_epoch() for _ in range(n)]
    return runner, metrics


def test_alpha_zero_is_ppo_to_the_bit(tmp_path):
    ppo, _ = run_iterations(tiny_config(), tmp_path / 'ppo', 3)
    ppo.save()
    ema, _ = run_iterations(tiny_config(distillation={'teacher_mode': 'ema', 'alpha': 0.0}),
                            tmp_path / 'ema', 3)
    frozen_cfg = tiny_config(distillation={
        'teacher_mode': 'frozen', 'alpha': 0.0,
        'teacher_checkpoint': str(ckpt.latest_checkpoint(tmp_path / 'ppo'))})
    frozen, _ = run_iterations(frozen_cfg, tmp_path / 'frozen', 3)
    assert torch.equal(params_of(ppo), params_of(ema))
    assert torch.equal(params_of(ppo), params_of(frozen))
    # ...while the EMA teacher did follow the student, and alpha > 0 changes the student.
    assert not torch.equal(params_of(ema), torch.cat([p.flatten() for p in
                                                      ema.alg.teacher.parameters()]))
    opd, metrics = run_iterations(tiny_config(distillation={'teacher_mode': 'ema',
                                                            'alpha': 1.0}), tmp_path / 'opd', 3)
    assert not torch.equal(params_of(ppo), params_of(opd))
    assert metrics[-1]['distillation_loss'] > 0
    for runner in (ppo, ema, frozen, opd):
        runner.close()


def test_frozen_teacher_pulls_the_student_towards_it(tmp_path):
    teacher_runner, _ = run_iterations(tiny_config(), tmp_path / 'teacher', 4)
    path = teacher_runner.save()
    teacher_runner.close()
    cfg = tiny_config(distillation={'teacher_mode': 'frozen', 'alpha': 100.0,
                                    'teacher_checkpoint': str(path)},
                      ppo={'schedule': 'fixed', 'learning_rate': 3e-3}, runner={'seed': 9})
    student, metrics = run_iterations(cfg, tmp_path / 'student', 6)
    kls = [m['kl_to_teacher'] for m in metrics]
    assert kls[-1] < 0.5 * kls[0]
    teacher_params = torch.cat([p.flatten() for p in student.alg.teacher.parameters()])
    student.close()
    teacher = load_teacher(student.cfg, student.obs_dims, student.env.num_actions)
    reloaded = torch.cat([p.flatten() for p in teacher.parameters()])
    assert torch.equal(teacher_params, reloaded)  # the frozen teacher never changed


def test_resume_reproduces_the_next_iteration_exactly(tmp_path):
    straight, straight_metrics = run_iterations(tiny_config(), tmp_path / 'a', 3)
    resumed_from, _ = run_iterations(tiny_config(), tmp_path / 'b', 2)
    path = resumed_from.save()
    resumed_from.close()
    resumed = OnPolicyRunner(tiny_config(), tmp_path / 'b')
    resumed.load(path)
    third = resumed.train_one_epoch()
    assert torch.equal(params_of(straight), params_of(resumed))
    for key in ('mean_reward', 'value_loss', 'surrogate_loss', 'learning_rate'):
        assert third[key] == straight_metrics[2][key], key
    np.testing.assert_array_equal(straight.env.physics.state, resumed.env.physics.state)
    straight.close()
    resumed.close()


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    runner, _ = run_iterations(tiny_config(), tmp_path, 1)
    good = runner.save()
    before = good.read_bytes()

    def crash(*args, **kwargs):
        raise OSError('disk died mid-write')

    monkeypatch.setattr(os, 'replace', crash)
    with pytest.raises(OSError, match='mid-write'):
        ckpt.save_checkpoint(good, runner.state_dict())
    monkeypatch.undo()
    assert good.read_bytes() == before
    assert ckpt.load_checkpoint(good)['iteration'] == 1
    assert not [p for p in good.parent.iterdir() if '.tmp' in p.name]
    # A truncated file (as a crash without the rename would leave) is refused, not unpickled.
    broken = tmp_path / 'broken.pt'
    broken.write_bytes(before[: len(before) // 2])
    with pytest.raises(ConfigError, match='not a readable checkpoint'):
        ckpt.load_checkpoint(broken)
    runner.close()


def test_short_seeded_training_run_improves_reward(tmp_path):
    cfg = tiny_config(env={'num_envs': 32, 'episode_length_s': 4.0},
                      runner={'num_steps_per_env': 24, 'max_iterations': 40, 'seed': 2})
    runner = OnPolicyRunner(cfg, tmp_path)
    rewards = [runner.train_one_epoch()['mean_reward'] for _ in range(40)]
    runner.close()
    assert np.mean(rewards[-8:]) > 1.3 * np.mean(rewards[:8])


@pytest.mark.parametrize('yaml_text, expected', [
    ('ppo:\n  lerning_rate: 0.001\n', 'ppo.lerning_rate: unknown key; did you mean '
                                      "'learning_rate'?"),
    ('ppo:\n  learning_rate: -0.001\n', 'ppo.learning_rate: -0.001 is out of range; '
                                        'allowed: > 0'),
    ('ppo:\n  desired_kl: .inf\n', 'ppo.desired_kl: inf is not allowed; give a finite number'),
    ('distillation:\n  teacher_mode: frozen\n  teacher_checkpoint: /nonexistent/t.pt\n',
     't.pt: checkpoint not found'),
    ('distillation:\n  alpha: 0.5\n', 'teacher_mode is none'),
])
def test_bad_train_config_exits_2_with_one_line(tmp_path, capsys, yaml_text, expected):
    path = tmp_path / 'bad.yaml'
    path.write_text(yaml_text)
    assert main(['train', '--config', str(path), '--run-dir', str(tmp_path / 'run')]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert expected in err
    assert not (tmp_path / 'run' / 'checkpoints').exists()


def test_missing_teacher_flag_file_exits_2(tmp_path, capsys):
    assert main(['train', '--teacher', str(tmp_path / 'nope.pt')]) == 2
    assert 'teacher checkpoint not found' in capsys.readouterr().err


def test_set_override_parsing_errors(capsys):
    assert main(['train', '--set', 'runner.max_iterations']) == 2
    assert 'expected KEY=VALUE' in capsys.readouterr().err


def test_resume_of_a_directory_without_checkpoints_exits_2(tmp_path, capsys):
    assert main(['train', '--resume', str(tmp_path)]) == 2
    assert 'no checkpoint to resume from' in capsys.readouterr().err


def test_latest_checkpoint_and_pruning(tmp_path):
    for it in (1, 2, 10, 3):
        ckpt.save_checkpoint(ckpt.checkpoint_path(tmp_path, it), {'iteration': it})
    assert ckpt.latest_checkpoint(tmp_path).name == 'model_10.pt'
    ckpt.prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in (tmp_path / 'checkpoints').iterdir()) == [
        'model_10.pt', 'model_3.pt']
    assert ckpt.latest_checkpoint(Path(tmp_path) / 'missing') is None


def test_privileged_teacher_distils_into_a_deployable_student(tmp_path):
    from claw_rl_ros.core.export.onnx_export import export_onnx
    teacher_cfg = tiny_config(policy={'actor_obs_groups': ['policy_noise_free', 'privileged']})
    teacher, _ = run_iterations(teacher_cfg, tmp_path / 'teacher', 2)
    assert teacher.policy.actor[0].in_features == teacher.env.obs_dim + teacher.env.privileged_dim
    with pytest.raises(ValueError, match='privileged'):
        export_onnx(teacher.policy, teacher.env.robot, tmp_path / 'teacher.onnx')
    path = teacher.save()
    teacher.close()
    cfg = tiny_config(distillation={'teacher_mode': 'frozen', 'alpha': 100.0,
                                    'teacher_checkpoint': str(path)},
                      ppo={'schedule': 'fixed', 'learning_rate': 3e-3})
    student, metrics = run_iterations(cfg, tmp_path / 'student', 6)
    assert student.alg.teacher.actor_obs_groups == ['policy_noise_free', 'privileged']
    assert student.policy.actor_obs_groups == ['policy']
    assert metrics[-1]['kl_to_teacher'] < metrics[0]['kl_to_teacher']
    export_onnx(student.policy, student.env.robot, tmp_path / 'student.onnx')
    student.close()


def test_checkpoint_without_env_state_resumes_the_learner_and_resets_the_worlds(tmp_path):
    # The live trainer's checkpoints (and those of envs that cannot snapshot themselves) hold
    # no env state: the learner continues exactly, the worlds start from a reset.
    runner, _ = run_iterations(tiny_config(), tmp_path / 'a', 2)

    def no_state():
        raise NotImplementedError('this env cannot save its state')

    runner.env.get_state = no_state
    path = runner.save()
    assert ckpt.load_checkpoint(path)['env'] is None
    resumed = OnPolicyRunner(tiny_config(), tmp_path / 'b')
    reset_obs = {k: v.clone() for k, v in resumed.obs.items()}
    resumed.load(path)
    assert not resumed.env_resumed
    assert resumed.iteration == 2 and resumed.total_steps == runner.total_steps
    assert torch.equal(params_of(resumed), params_of(runner))
    for group, value in reset_obs.items():
        assert torch.equal(resumed.obs[group], value)  # not the checkpoint's observations
    assert not torch.equal(resumed.obs['policy'], runner.obs['policy'])
    assert resumed.train_one_epoch()['total_steps'] == runner.total_steps + 16 * 8
    runner.close()
    resumed.close()


def test_linear_schedule_anneals_the_learning_rate_to_zero_over_max_iterations(tmp_path):
    """CleanRL's anneal_lr: iteration i of n learns at lr0 (1 - i / n), in every mini-batch
    step of that iteration; the fixed schedule keeps lr0."""
    cfg = tiny_config(ppo={'schedule': 'linear', 'learning_rate': 4e-3},
                      runner={'max_iterations': 4})
    runner, metrics = run_iterations(cfg, tmp_path / 'linear', 4)
    assert [m['learning_rate'] for m in metrics] == pytest.approx([4e-3, 3e-3, 2e-3, 1e-3])
    assert runner.alg.optimizer.param_groups[0]['lr'] == pytest.approx(1e-3)
    _, fixed = run_iterations(tiny_config(ppo={'schedule': 'fixed', 'learning_rate': 4e-3}),
                              tmp_path / 'fixed', 2)
    assert [m['learning_rate'] for m in fixed] == [4e-3, 4e-3]
    with pytest.raises(ConfigError, match='ppo.schedule'):
        tiny_config(ppo={'schedule': 'cosine'})
