"""Terrain through the one training stack: the runner and the live actor + learner learn the
same from a terrain env with a privileged height scan, log the curriculum levels, and a
teacher that reads the scan distils into a blind student that exports."""

import numpy as np
import pytest
import torch

from claw_rl_ros.core.config import ConfigError
from claw_rl_ros.core.export.onnx_export import export_onnx
from claw_rl_ros.core.learning.runner import OnPolicyRunner
from claw_rl_ros.core.learning.train_config import load_train_config
from test_chunk_learning import LocalActorLearner
from test_training import params_of, tiny_config

SCAN = 'height_scan'
TERRAIN = {'enabled': True, 'types': ['flat', 'rough', 'stairs_up'],
           'proportions': [0.25, 0.5, 0.25], 'num_levels': 3, 'max_init_level': 2,
           'curriculum': True, 'height_scan': {'enabled': True}}
# Short episodes: the curriculum moves worlds at their resets within a few iterations.
ENV = {'env': {'episode_length_s': 0.2, 'terrain': TERRAIN},
       'policy': {'critic_obs_groups': ['policy_noise_free', 'privileged', SCAN]}}
TEACHER = {'env': ENV['env'],
           'policy': {'actor_obs_groups': ['policy_noise_free', 'privileged', SCAN],
                      'critic_obs_groups': ['policy_noise_free', 'privileged', SCAN]}}


def test_runner_and_live_path_learn_the_same_on_terrain_and_log_its_levels(tmp_path):
    runner = OnPolicyRunner(tiny_config(**ENV), tmp_path)
    assert SCAN in runner.obs_dims and runner.obs_dims[SCAN] > 0
    offline = [runner.train_one_epoch() for _ in range(2)]
    live = LocalActorLearner(tiny_config(**ENV))
    assert live.learner.obs_dims == runner.obs_dims
    online = [live.iteration() for _ in range(2)]
    assert torch.equal(params_of(runner), params_of(live.learner))
    levels = [k for k in offline[-1] if k.startswith('terrain_level/')]
    assert sorted(levels) == ['terrain_level/flat', 'terrain_level/mean',
                              'terrain_level/rough', 'terrain_level/stairs_up']
    for off, on in zip(offline, online):
        for key in levels + ['mean_reward', 'value_loss']:
            assert off[key] == on[key], key
    # The columns are what the env's placement holds at the rollout's end.
    stats = runner.env.placement.level_stats()
    for name, value in stats.items():
        assert offline[-1][f'terrain_level/{name}'] == value
    assert offline[-1]['terrain_level/mean'] == pytest.approx(np.mean(list(stats.values())))
    runner.close()
    live.close()


def test_a_teacher_that_reads_the_scan_distils_into_a_blind_student_that_exports(
        tmp_path, robot):
    teacher_run = OnPolicyRunner(tiny_config(**TEACHER), tmp_path / 'teacher')
    teacher_run.train_one_epoch()
    path = teacher_run.save()
    with pytest.raises(ValueError, match=SCAN):
        export_onnx(teacher_run.policy, robot, tmp_path / 'teacher.onnx')
    teacher_run.close()
    frozen = {'teacher_mode': 'frozen', 'alpha': 1.0, 'teacher_checkpoint': str(path)}
    student = OnPolicyRunner(tiny_config(**ENV, distillation=frozen), tmp_path / 'student')
    assert student.policy.actor_obs_groups == ['policy']
    assert student.alg.teacher.actor_obs_groups == ['policy_noise_free', 'privileged', SCAN]
    metrics = [student.train_one_epoch() for _ in range(2)]
    assert all(m['kl_to_teacher'] > 0 and np.isfinite(m['distillation_loss']) for m in metrics)
    export_onnx(student.policy, robot, tmp_path / 'student.onnx')
    assert (tmp_path / 'student.onnx').is_file()
    student.close()


def test_observation_dims_without_building_the_env_are_the_envs(robot):
    from claw_rl_ros.core.sim.env import VecLocomotionEnv
    from claw_rl_ros.core.sim.env_config import observation_dims
    for overrides in ({}, ENV):
        cfg = tiny_config(**overrides).env
        cfg.num_envs = 2
        env = VecLocomotionEnv(cfg)
        assert observation_dims(robot, cfg) == env.obs_dims
        env.close()


@pytest.mark.parametrize('key', ['actor_obs_groups', 'critic_obs_groups'])
def test_a_height_scan_group_without_the_scan_is_refused_by_name(key):
    groups = ['policy', SCAN] if key == 'actor_obs_groups' else ['policy_noise_free', SCAN]
    with pytest.raises(ConfigError, match=rf'policy.{key}.*height_scan.*no height scan'):
        tiny_config(policy={key: groups})


def test_the_live_trainer_takes_terrain_chunks_with_the_scan(tmp_path, robot):
    from claw_rl_ros.core.live.live_trainer import LiveTrainer
    from test_live_trainer import Actor, Clock, push
    clock = Clock()
    trainer = LiveTrainer(tiny_config(**ENV), robot, tmp_path / 'run', clock=clock,
                          tensorboard=False)
    assert SCAN in trainer.learner.obs_dims
    actor = Actor(trainer)
    assert trainer.offer(actor.chunk(trainer, push(trainer))) is None  # not wrong_size
    clock.now += 1.0
    metrics = trainer.iterate()
    actor.env.close()
    assert 'terrain_level/rough' in metrics and metrics['accepted'] == 1
    trainer.finish(stopped=True)


def test_a_teacher_keeps_the_distillation_overrides_beside_it(tmp_path):
    """--teacher with --set distillation.alpha=...: the alpha of the set stays (the trainer
    node replaced the whole distillation section with the teacher's two keys)."""
    from claw_rl_ros.core.learning.train_config import split_overrides, with_teacher
    teacher = tmp_path / 'teacher.pt'
    overrides = with_teacher(split_overrides('distillation.alpha=0.7 runner.seed=4'), teacher)
    assert overrides == {'distillation': {'alpha': 0.7, 'teacher_mode': 'frozen',
                                          'teacher_checkpoint': str(teacher.resolve())},
                         'runner': {'seed': 4}}


def test_a_terrain_run_ends_with_the_terrain_table_and_its_ground_in_the_model(
        tmp_path, robot):
    """The end of training on terrain evaluates on every type's top-level tile (not the
    training map, where all worlds start on the easiest level), and a live student's export
    names the terrain it learnt on (for the policy card)."""
    import json
    from claw_rl_ros.core.evaluation.final_student import export_and_evaluate
    from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
    from claw_rl_ros.core.live.chunk_learner import ChunkLearner
    cfg = tiny_config(**ENV, runner={'eval_episodes': 2})
    runner = OnPolicyRunner(cfg, tmp_path / 'run')
    runner.train_one_epoch()
    out = export_and_evaluate(runner.learner, robot, tmp_path / 'run')
    runner.close()
    rows = out['eval_terrain']['rows']
    assert [r['terrain'] for r in rows] == ['flat', 'rough:2', 'stairs_up:2']
    assert out['eval_forward_0.5']['terrain'] == 'flat'
    learner = ChunkLearner(cfg, runner.obs_dims, runner.env.num_actions)
    learner.export_student(robot, tmp_path / 'live.onnx')
    meta = OnnxPolicy(tmp_path / 'live.onnx', robot).metadata
    terrain = meta['terrain'] if isinstance(meta['terrain'], dict) else json.loads(meta['terrain'])
    assert terrain['enabled'] is True and terrain['types'] == TERRAIN['types']


def test_a_teacher_run_ends_with_its_torch_evaluation_and_no_student_file(tmp_path, robot):
    from claw_rl_ros.core.evaluation.final_student import export_and_evaluate
    runner = OnPolicyRunner(tiny_config(**TEACHER, runner={'eval_episodes': 2}),
                            tmp_path / 'teacher')
    runner.train_one_epoch()
    out = export_and_evaluate(runner.learner, robot, tmp_path / 'teacher')
    runner.close()
    assert 'student_onnx' not in out and not (tmp_path / 'teacher' / 'student.onnx').exists()
    assert out['eval_policy'] == 'privileged actor in torch (not exported)'
    rows = out['eval_terrain']['rows']
    assert [r['terrain'] for r in rows] == ['flat', 'rough:2', 'stairs_up:2']
    assert all(r['episodes'] == 2 for r in rows)


def test_the_blind_students_swing_clears_the_top_riser_it_cannot_see(robot):
    """feet_clearance stops rewarding lift at its target: below the top stairs' riser, a blind
    foot would be taught to stop under the edge (the config's choice; its measured effect is
    within seed spread, docs/changelog.md). The teacher, which sees the steps, keeps the robot's
    own."""
    student = load_train_config('config/train_rough.yaml').env
    teacher = load_train_config('config/train_rough_teacher.yaml').env
    riser = student.terrain.step_height * robot.standing_height
    assert student.rewards.swing_height_target >= 1.4 * riser
    # None: the env takes the robot's swing_height (test_math_env).
    assert teacher.rewards.swing_height_target is None and robot.swing_height < riser
