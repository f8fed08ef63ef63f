"""runner.selection: snapshots of the student once per period, the validation set refused when
it is not its own, and the best of the last students exported with its own counters (offline
and live)."""

import json
import math

import numpy as np
import pytest
import torch

from claw_rl_ros.cli import main
from claw_rl_ros.core.config import ConfigError
from claw_rl_ros.core.evaluation import selection
from claw_rl_ros.core.evaluation.final_student import export_and_evaluate
from claw_rl_ros.core.export.onnx_export import export_checkpoint
from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
from claw_rl_ros.core.learning import checkpoint as ckpt
from claw_rl_ros.core.learning.learner import load_policy
from claw_rl_ros.core.learning.runner import OnPolicyRunner
from claw_rl_ros.core.learning.train_config import load_train_config
from test_live_trainer import Clock, iterate_with_one_actor, make_trainer
from test_training import tiny_config

# tiny_config's runner.seed is 5: the end-of-run table is at env seed 6.
SELECT = {'candidates': 3, 'every_s': 10.0, 'env_seeds': [8, 9]}


def robot_extra(runner):
    return lambda: {'robot': runner.env.robot.to_metadata()}


@pytest.mark.parametrize('selection_cfg, field, match', [
    ({'env_seeds': [2]}, 'env_seeds', 'end-of-run table'),  # runner.seed 1 -> table at 2
    ({'env_seeds': []}, 'env_seeds', 'one or more distinct'),
    ({'env_seeds': [5, 5]}, 'env_seeds', 'one or more distinct'),
    ({'terrain_seed': 1000}, 'terrain_seed', 'evaluation map'),
    ({'terrain_seed': 0}, 'terrain_seed', r'training map \(env.terrain.seed\)'),
])
def test_a_validation_set_that_is_not_its_own_is_refused_by_name(selection_cfg, field, match):
    overrides = {'runner': {'selection': {'candidates': 3, **selection_cfg}}}
    with pytest.raises(ConfigError, match=f'runner.selection.{field}: .*{match}'):
        load_train_config('train_rough.yaml', overrides)
    # The same values with selection off are nobody's business.
    overrides['runner']['selection']['candidates'] = 0
    load_train_config('train_rough.yaml', overrides)


def test_a_privileged_actor_cannot_be_selected_for_export():
    with pytest.raises(ConfigError, match='runner.selection.candidates: 3, .*height_scan'):
        load_train_config('train_rough_teacher.yaml', {'runner': {'selection': {'candidates': 3}}})


def test_a_snapshot_is_kept_once_per_period_the_newest_ones_only(tmp_path):
    run_dir = tmp_path / 'run'
    runner = OnPolicyRunner(tiny_config(runner={'selection': SELECT, 'max_iterations': 100}),
                            run_dir)
    learner, weights = runner.learner, {}
    first = next(learner.policy.parameters())
    for iteration, elapsed, due in [(1, 5.0, False), (2, 10.0, True), (3, 19.9, False),
                                    (4, 35.0, True), (5, 41.0, True), (6, 50.0, True),
                                    (7, 50.5, False)]:
        learner.iteration, learner.elapsed_s = iteration, elapsed
        with torch.no_grad():
            first.add_(1.0)  # every iteration its own weights
        weights[iteration] = first.detach().clone()
        path = learner.save_candidate(run_dir, robot_extra(runner))
        assert (path is not None) == due, (iteration, elapsed)
    kept = ckpt.checkpoints_by_iteration(run_dir, ckpt.CANDIDATES)
    assert [it for it, _ in kept] == [4, 5, 6]  # 2 pruned, 3 newest kept
    for iteration, path in kept:
        policy, cfg, payload = load_policy(path)
        assert payload['iteration'] == iteration
        assert torch.equal(next(policy.parameters()), weights[iteration])
    # A snapshot exports like a checkpoint (robot checked, its counters in the metadata).
    exported = OnnxPolicy(export_checkpoint(kept[0][1], tmp_path / 'snap.onnx'))
    assert exported.metadata['iteration'] == '4'
    # A checkpoint with a non-finite training time is no crash.
    learner.load_state_dict({**learner.state_dict(), 'elapsed_s': float('inf')}, 'test')
    # Resumed at 45 s of training, the next snapshot is due at 50 s, not at once.
    learner.load_state_dict({**learner.state_dict(), 'elapsed_s': 45.0}, 'test')
    learner.elapsed_s = 48.0
    assert learner.save_candidate(run_dir, robot_extra(runner)) is None
    learner.elapsed_s = 50.0
    assert learner.save_candidate(run_dir, robot_extra(runner)) is not None
    runner.close()


def test_off_keeps_no_snapshot(tmp_path):
    runner = OnPolicyRunner(tiny_config(), tmp_path / 'run')
    runner.learner.elapsed_s = 1e6
    assert runner.learner.save_candidate(tmp_path / 'run') is None
    assert not (tmp_path / 'run' / ckpt.CANDIDATES).exists()
    runner.close()


def test_the_rank_prefers_fewer_failed_seeds_then_the_worst_error_then_the_newest():
    def score(iteration, failed, worst):
        return selection.CandidateScore(iteration, 0.0, 0, False, failed, worst)

    def best(*scores):
        return min(scores, key=lambda s: s.rank()).iteration

    assert best(score(1, 0, 0.14), score(2, 1, 0.01)) == 1
    assert best(score(1, 1, 0.14), score(2, 1, 0.12)) == 2
    assert best(score(1, 0, 0.12), score(2, 0, 0.14)) == 1
    assert best(score(1, 0, 0.12), score(2, 0, 0.12)) == 2
    assert best(score(1, 0, math.inf), score(2, 0, 0.9)) == 2


def scripted_scores(monkeypatch, expected_actions, obs, table):
    """validation_score replaced by ``table`` {iteration: (failed, worst)}; it checks that the
    policy it is given is that iteration's student (its actions on ``obs``)."""
    seen = []

    def fake(policy_fn, cfg, robot, score):
        np.testing.assert_allclose(policy_fn(obs), expected_actions[score.iteration],
                                   atol=1e-5, err_msg=f'iteration {score.iteration}')
        score.failed_seeds, score.worst_vx_error = table[score.iteration]
        score.falls, score.episodes = 0, 40
        seen.append(score.iteration)
        return score

    monkeypatch.setattr(selection, 'validation_score', fake)
    return seen


def actions_of(policy, obs):
    with torch.no_grad():
        return policy.act_inference({'policy': torch.from_numpy(obs)}).numpy()


def test_the_best_student_on_validation_is_exported_with_its_own_counters(
        tmp_path, monkeypatch, capsys):
    cfg = tiny_config(runner={'selection': SELECT, 'eval_episodes': 0, 'max_iterations': 100})
    run_dir = tmp_path / 'run'
    runner = OnPolicyRunner(cfg, run_dir)
    learner = runner.learner
    obs = np.random.default_rng(0).normal(size=(5, learner.obs_dims['policy'])).astype(
        np.float32)
    expected = {}
    for i in range(1, 6):
        runner.train_one_epoch()
        learner.elapsed_s = 10.0 * i  # one snapshot per iteration, the last 3 kept
        if i < 5:
            assert learner.save_candidate(run_dir, robot_extra(runner)) is not None
        expected[i] = actions_of(learner.policy, obs)
    # A damaged snapshot is skipped; one from a discarded future (after a resume from an
    # earlier checkpoint) does not compete.
    ckpt.checkpoint_path(run_dir, 3, ckpt.CANDIDATES).write_bytes(b'not a checkpoint')
    future = ckpt.checkpoint_path(run_dir, 9, ckpt.CANDIDATES)
    future.write_bytes(ckpt.checkpoint_path(run_dir, 4, ckpt.CANDIDATES).read_bytes())
    seen = scripted_scores(monkeypatch, expected, obs, {2: (0, 0.14), 4: (0, 0.12),
                                                        5: (1, 0.05)})
    summary = export_and_evaluate(learner, runner.env.robot, run_dir)
    assert seen == [2, 4, 5]
    student = OnnxPolicy(run_dir / 'student.onnx', runner.env.robot)
    np.testing.assert_allclose(student(obs), expected[4], atol=1e-5)
    assert student.metadata['iteration'] == '4' and student.metadata['final_iteration'] == '5'
    assert int(student.metadata['total_steps']) == 4 * 16 * 8
    sel = summary['selection']
    assert sel['picked_iteration'] == 4 and sel['final_iteration'] == 5
    assert sel['env_seeds'] == [8, 9] and sel['terrain_seed'] == 1001
    assert [c['iteration'] for c in sel['candidates']] == [2, 4, 5]
    assert [c['final'] for c in sel['candidates']] == [False, False, True]
    assert sel['candidates'][1]['wall_time_s'] == 40.0
    out = capsys.readouterr().out
    assert 'skipped' in out and 'model_3.pt' in out
    assert [line.split()[0] for line in out.splitlines() if '<- picked' in line] == ['4']
    # The learner is untouched: its final weights stay the checkpoint's.
    np.testing.assert_allclose(actions_of(learner.policy, obs), expected[5])
    runner.close()


def test_with_no_snapshot_yet_the_final_student_is_exported_unevaluated(tmp_path, monkeypatch):
    runner = OnPolicyRunner(tiny_config(runner={'selection': SELECT, 'max_iterations': 100}),
                            tmp_path / 'run')
    runner.train_one_epoch()
    seen = scripted_scores(monkeypatch, {}, None, {})
    summary = export_and_evaluate(runner.learner, runner.env.robot, tmp_path / 'run')
    assert seen == [] and summary['selection']['picked_iteration'] == 1
    assert summary['selection']['candidates'] == []
    runner.close()


def test_a_lowered_candidates_count_leaves_the_older_snapshots_out(tmp_path, monkeypatch):
    runner = OnPolicyRunner(tiny_config(runner={'selection': SELECT, 'max_iterations': 100}),
                            tmp_path / 'run')
    for i in range(1, 5):
        runner.train_one_epoch()
        runner.learner.elapsed_s = 10.0 * i
        runner.learner.save_candidate(tmp_path / 'run', robot_extra(runner))
    runner.train_one_epoch()
    runner.learner.cfg.runner.selection.candidates = 1  # e.g. resumed with a smaller count
    seen = []

    def fake(policy_fn, cfg, robot, score):
        seen.append(score.iteration)
        score.failed_seeds, score.worst_vx_error = 0, 0.1
        return score

    monkeypatch.setattr(selection, 'validation_score', fake)
    summary = export_and_evaluate(runner.learner, runner.env.robot, tmp_path / 'run')
    assert seen == [4, 5] and summary['selection']['picked_iteration'] == 5  # tie: the newest
    runner.close()


def test_the_validation_evaluation_is_the_selection_set_and_its_worst_row(
        tmp_path, monkeypatch, robot):
    """validation_score evaluates on selection.terrain_seed with each of selection.env_seeds,
    on the trained terrain types, and keeps the worst row of all."""
    real = selection.evaluate_terrains
    calls = []

    def spy(policy_fn, env_cfg, robot_, terrains, **kwargs):
        calls.append((tuple(terrains), kwargs['seed'], kwargs['terrain_seed'],
                      kwargs['episodes']))
        table = real(policy_fn, env_cfg, robot_, ('flat',), episodes=2, seed=kwargs['seed'],
                     terrain_seed=kwargs['terrain_seed'])
        # Seed 7 measures a tile with nothing in it (every world fell): the worst there is.
        table.reports[0].tracking_error_vx = math.nan if kwargs['seed'] == 7 else 0.1 + \
            kwargs['seed'] / 100
        return table

    monkeypatch.setattr(selection, 'evaluate_terrains', spy)
    cfg = load_train_config('train_rough.yaml', {'runner': {'selection': {
        'candidates': 2, 'env_seeds': [5, 6], 'terrain_seed': 1234}, 'eval_episodes': 3}})
    zero = lambda obs: np.zeros((len(obs), robot.num_joints), np.float32)  # noqa: E731
    score = selection.validation_score(zero, cfg, robot, selection.CandidateScore(
        1, 0.0, 0, True))
    assert calls == [(tuple(cfg.env.terrain.columns), 5, 1234, 3),
                     (tuple(cfg.env.terrain.columns), 6, 1234, 3)]
    assert score.worst_vx_error == pytest.approx(0.16) and score.episodes == 4
    cfg.runner.selection.env_seeds = [5, 7]
    score = selection.validation_score(zero, cfg, robot, score)
    assert score.worst_vx_error == math.inf
    assert selection.to_json(score)['worst_vx_error'] is None


def test_offline_train_exports_the_picked_student(tmp_path, capsys):
    """claw-rl train with selection on, real validation evaluations (every_s 1 ms, below any
    iteration's time: a snapshot after iterations 1-3, the last two kept)."""
    run_dir = tmp_path / 'run'
    assert main(['train', '--run-dir', str(run_dir), '--set', 'env.num_envs=16',
                 '--set', 'runner.max_iterations=4', '--set', 'runner.num_steps_per_env=8',
                 '--set', 'runner.eval_episodes=2', '--set', 'runner.selection.candidates=2',
                 '--set', 'runner.selection.every_s=0.001',
                 '--set', 'policy.actor_hidden_dims=[32,32]']) == 0
    summary = json.loads((run_dir / 'summary.json').read_text())
    sel = summary['selection']
    # The last iteration's student competes as the final one, never as a snapshot.
    kept = [it for it, _ in ckpt.checkpoints_by_iteration(run_dir, ckpt.CANDIDATES)]
    assert kept and kept[-1] < 4 and len(kept) <= 2
    assert [c['iteration'] for c in sel['candidates']] == kept + [4]
    assert all(c['episodes'] == 2 * 2 and c['worst_vx_error'] > 0 for c in sel['candidates'])
    picked = sel['picked_iteration']
    source = ckpt.checkpoint_path(run_dir, picked, ckpt.CANDIDATES) if picked < 4 else \
        ckpt.latest_checkpoint(run_dir)
    reference = OnnxPolicy(export_checkpoint(source, tmp_path / 'reference.onnx'))
    student = OnnxPolicy(run_dir / 'student.onnx')
    obs = np.random.default_rng(1).normal(size=(4, student.obs_dim)).astype(np.float32)
    np.testing.assert_allclose(student(obs), reference(obs), atol=1e-6)
    assert student.metadata['iteration'] == str(picked)
    assert 'selection of the deployed student' in capsys.readouterr().out


def test_the_live_trainer_keeps_snapshots_and_exports_the_pick(tmp_path, robot, monkeypatch):
    clock = Clock()
    trainer = make_trainer(tmp_path, robot, clock, cfg={'runner': {
        'max_iterations': 4, 'eval_episodes': 0,
        'selection': {'candidates': 1, 'every_s': 1.5, 'env_seeds': [8]}}})
    iterate_with_one_actor(trainer, clock, 4)
    # Training time at the iterations' ends: 1, 2, 3, 4 s -> snapshots at 2 and 3 s, one kept.
    assert [it for it, _ in ckpt.checkpoints_by_iteration(trainer.run_dir, ckpt.CANDIDATES)] \
        == [3]
    seen = []

    def fake(policy_fn, cfg, robot_, score):
        seen.append(score.iteration)
        score.failed_seeds, score.worst_vx_error = (0, 0.1) if score.iteration == 3 else (0, 0.2)
        return score

    monkeypatch.setattr(selection, 'validation_score', fake)
    summary = trainer.finish(stopped=False)
    assert seen == [3, 4] and summary['selection']['picked_iteration'] == 3
    assert OnnxPolicy(trainer.run_dir / 'student.onnx').metadata['iteration'] == '3'


@pytest.mark.parametrize('text, expected', [
    ('{"selection": {"picked_iteration": 937, "final_iteration": 987}}', 937),
    ('{"selection": {"picked_iteration": 987, "final_iteration": 987}}', None),
    ('{"iterations": 987}', None),  # selection off
    ('{"selection": null}', None),
    ('{"selection": {"picked_iteration": "x", "final_iteration": 987}}', None),
    ('{"selection": {"picked_iteration": [1], "final_iteration": 987}}', None),
    ('{"selection": [937]}', None),
    ('{"selection": {"picked_iteration": 1e400, "final_iteration": 987}}', None),  # inf
    ('{"selection": {"picked_iteration": -5, "final_iteration": 987}}', None),
    ('[1, 2]', None),
    ('not json', None),
    (None, None),  # no summary.json: the run did not finish
])
def test_the_picked_snapshot_is_read_from_the_summary_and_hostile_ones_are_none(
        tmp_path, text, expected):
    if text is not None:
        (tmp_path / 'summary.json').write_text(text)
    found = selection.picked_snapshot(tmp_path)
    assert found == (None if expected is None else
                     ckpt.checkpoint_path(tmp_path, expected, ckpt.CANDIDATES))


def test_export_of_a_run_dir_says_when_student_onnx_is_another_iteration(tmp_path, capsys):
    runner = OnPolicyRunner(tiny_config(), tmp_path / 'run')
    runner.train_one_epoch()
    runner.save()
    runner.close()
    argv = ['export', '--run-dir', str(tmp_path / 'run'), '--out', str(tmp_path / 'a.onnx')]
    assert main(argv) == 0
    assert 'note:' not in capsys.readouterr().out
    (tmp_path / 'run' / 'summary.json').write_text(json.dumps(
        {'selection': {'picked_iteration': 0, 'final_iteration': 1}}))
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert 'note: ' in out and 'candidates/model_0.pt' in out and 'model_1.pt' in out
