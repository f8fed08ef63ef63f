"""ONNX export of Gymnasium runs: the same exporter and parity gate as the robot, the task's spec
in the metadata, per-dimension clipping in the graph, refusal across tasks, CLI export/eval."""

import json

import numpy as np
import onnx
import pytest
import torch

from claw_rl_ros.cli import main
from claw_rl_ros.core.export import onnx_export as E
from claw_rl_ros.core.export.onnx_policy import OnnxPolicy, SpecMismatchError
from claw_rl_ros.core.learning.networks import ActorCritic
from claw_rl_ros.core.learning.sac_networks import SACPolicy
from claw_rl_ros.core.sim.gym_spec import gym_task_spec, GymTaskSpec
from claw_rl_ros.core.sim.robot_spec import METADATA_KEY


def task(low=(-2.0, 0.0), high=(1.0, 3.0), obs_dim=5):
    """A two-action task with asymmetric, different bounds per action."""
    space = {'type': 'Box', 'shape': [2], 'dtype': 'float32', 'low': list(low),
             'high': list(high)}
    obs = {'type': 'Box', 'shape': [obs_dim], 'dtype': 'float64', 'low': [None] * obs_dim,
           'high': [None] * obs_dim}
    return GymTaskSpec('Toy-v0', obs_dim, 2, obs, space, np.asarray(low, dtype=float),
                       np.asarray(high, dtype=float), max_episode_steps=50)


def ppo_student(obs_dim=5, actions=2, seed=0):
    """Large-output actor (so clipping bites) with a fitted, non-identity normaliser."""
    torch.manual_seed(seed)
    policy = ActorCritic(obs_dim, obs_dim, actions, actor_hidden_dims=[32],
                         critic_hidden_dims=[8], critic_obs_groups=['policy'])
    with torch.no_grad():
        policy.actor[-1].weight.mul_(30.0)
    policy.actor_normalizer.update(torch.randn(512, obs_dim) * 3.0 + 2.0)
    return policy


def props(path):
    return {p.key: p.value for p in onnx.load(str(path)).metadata_props}


def test_the_graph_clips_each_action_to_its_own_bounds(tmp_path):
    spec = task()
    policy = ppo_student()
    path = E.export_onnx(policy, spec, tmp_path / 'toy.onnx', extra_metadata={'algorithm': 'ppo'})
    obs = E.random_observations(5, 500, seed=3)
    actions = OnnxPolicy(path, spec)(obs)
    with torch.no_grad():
        mean = policy.act_inference({'policy': torch.from_numpy(obs)}).numpy()
    # The clip is per dimension: [-2, 1] for action 0 and [0, 3] for action 1.
    np.testing.assert_allclose(actions, np.clip(mean, [-2.0, 0.0], [1.0, 3.0]), atol=1e-5)
    for j, (lo, hi) in enumerate([(-2.0, 1.0), (0.0, 3.0)]):
        assert (actions[:, j] == lo).any() and (actions[:, j] == hi).any()
        assert ((actions[:, j] > lo) & (actions[:, j] < hi)).any()
    assert E.verify_onnx(policy, path, action_clip=spec.action_bounds) < 1e-5
    # Without the clip the torch side differs: the parity gate compares the clipped action.
    assert E.verify_onnx(policy, path) > 0.5


def test_metadata_describes_the_task_and_the_output_has_a_fixed_width(tmp_path):
    spec = task()
    path = E.export_onnx(ppo_student(), spec, tmp_path / 'toy.onnx',
                         extra_metadata={'algorithm': 'ppo', 'iteration': 4})
    meta = props(path)
    described = json.loads(meta[METADATA_KEY])
    assert described['kind'] == 'gymnasium' and described['env_id'] == 'Toy-v0'
    assert described['obs_dim'] == 5 and described['action_dim'] == 2
    assert described['action_clip'] == {'low': [-2.0, 0.0], 'high': [1.0, 3.0]}
    assert described['action_space']['low'] == [-2.0, 0.0]
    assert described['observation_space']['low'] == [None] * 5
    assert json.loads(meta['algorithm']) == 'ppo' and json.loads(meta['iteration']) == 4
    assert float(meta['parity_max_abs_diff']) < E.PARITY_TOLERANCE
    output = onnx.load(str(path)).graph.output[0].type.tensor_type.shape.dim
    assert (output[0].dim_param, output[1].dim_value) == ('batch', 2)
    model = OnnxPolicy(path)
    assert model.kind == 'gymnasium' and model.action_clip['high'] == [1.0, 3.0]


def test_a_real_env_spec_reads_both_spaces():
    spec = gym_task_spec('Pendulum-v1')
    assert (spec.obs_dim, spec.num_actions, spec.max_episode_steps) == (3, 1, 200)
    np.testing.assert_array_equal(spec.action_bounds[0], [-2.0])
    assert spec.observation_space['high'] == [1.0, 1.0, 8.0]
    unbounded = gym_task_spec('InvertedPendulum-v5').observation_space
    assert unbounded['low'] == [None] * 4 and unbounded['dtype'] == 'float64'


def test_sac_student_exports_its_scaled_squashed_mean(tmp_path):
    spec = task(low=(-2.0, 0.0), high=(2.0, 3.0))
    torch.manual_seed(1)
    policy = SACPolicy(5, 5, 2, actor_hidden_dims=[16], critic_hidden_dims=[8],
                       critic_obs_groups=['policy'], action_low=torch.tensor([-2.0, 0.0]),
                       action_high=torch.tensor([2.0, 3.0]))
    path = E.export_onnx(policy, spec, tmp_path / 'sac.onnx')
    obs = E.random_observations(5, 100, seed=0)
    with torch.no_grad():
        mean, _ = policy.action_mean_std({'policy': torch.from_numpy(obs)})
    expected = np.array([0.0, 1.5]) + np.array([2.0, 1.5]) * np.tanh(mean.numpy())
    np.testing.assert_allclose(OnnxPolicy(path, spec)(obs), expected, atol=1e-5)


def test_models_are_refused_for_another_task_or_a_robot(tmp_path, robot):
    path = E.export_onnx(ppo_student(), task(), tmp_path / 'toy.onnx')
    with pytest.raises(SpecMismatchError, match=r"action_space: model has .*'high': "
                                                r"\[1.0, 3.0\]\}, env has .*'high': "
                                                r'\[1.0, 2.0\]\}'):
        OnnxPolicy(path, task(high=(1.0, 2.0)))
    with pytest.raises(SpecMismatchError, match='env_id: model has .Toy-v0., env has '
                                                '.Pendulum-v1.'):
        OnnxPolicy(path, gym_task_spec('Pendulum-v1'))
    with pytest.raises(SpecMismatchError, match='exported for a gymnasium task .Toy-v0., not '
                                                f'for robot {robot.name!r}'):
        OnnxPolicy(path, robot)
    robot_model = E.export_onnx(ppo_student(robot.policy_obs.dim, robot.num_joints), robot,
                                tmp_path / 'robot.onnx')
    with pytest.raises(SpecMismatchError, match=f'exported for robot {robot.name!r}, not for '
                                                'the Gymnasium env .Toy-v0.'):
        OnnxPolicy(robot_model, task())


def test_bad_bounds_and_sizes_are_refused_before_writing(tmp_path):
    spec = task()
    with pytest.raises(ValueError, match=r'env .Toy-v0. takes 2 actions'):
        E.export_onnx(ppo_student(actions=3), spec, tmp_path / 'a.onnx')
    with pytest.raises(ValueError, match='low <= high'):
        E.export_onnx(ppo_student(), spec, tmp_path / 'a.onnx',
                      action_clip=(np.array([1.0, 0.0]), np.array([-1.0, 1.0])))
    with pytest.raises(ValueError, match=r'shapes \(3,\) and \(2,\)'):
        E.export_onnx(ppo_student(), spec, tmp_path / 'a.onnx',
                      action_clip=(np.zeros(3), np.ones(2)))
    assert list(tmp_path.iterdir()) == []


TINY = ['--set', 'runner.max_iterations=2', '--set', 'runner.num_steps_per_env=60',
        '--set', 'runner.eval_episodes=2', '--set', 'runner.torch_threads=1',
        '--set', 'env.num_envs=2', '--set', 'policy.actor_hidden_dims=[16]',
        '--set', 'policy.critic_hidden_dims=[16]', '--set', 'sac.learning_starts=60',
        '--set', 'sac.batch_size=32', '--set', 'sac.buffer_size=1000',
        '--set', 'ppo.num_mini_batches=2']


@pytest.mark.parametrize('algorithm', ['sac', 'ppo'])
def test_train_export_and_eval_a_gymnasium_onnx_from_the_command_line(algorithm, tmp_path,
                                                                      capsys):
    run = tmp_path / 'run'
    assert main(['train', '--env', 'gym:Pendulum-v1', '--algorithm', algorithm,
                 '--run-dir', str(run), *TINY]) == 0
    summary = json.loads((run / 'summary.json').read_text())
    assert summary['student_onnx'] == str(run / 'student.onnx')
    assert OnnxPolicy(run / 'student.onnx').spec['env_id'] == 'Pendulum-v1'
    out = tmp_path / 'exported.onnx'
    assert main(['export', '--run-dir', str(run), '--out', str(out)]) == 0
    text = capsys.readouterr().out
    assert f"Gymnasium env 'Pendulum-v1', algorithm {algorithm}" in text
    assert 'policy card' not in text and not list(tmp_path.glob('*.card.md'))  # robots only
    assert json.loads(props(out)['checkpoint']) == 'model_2.pt'
    # The ONNX model, evaluated on its env, scores what the checkpoint scores.
    onnx_report, torch_report = tmp_path / 'onnx.json', tmp_path / 'torch.json'
    assert main(['eval', '--model', str(out), '--episodes', '3', '--seed', '5',
                 '--json', str(onnx_report)]) == 0
    assert main(['eval', '--run-dir', str(run), '--episodes', '3', '--seed', '5',
                 '--json', str(torch_report)]) == 0
    onnx_result = json.loads(onnx_report.read_text())
    torch_result = json.loads(torch_report.read_text())
    assert onnx_result['env'] == 'Pendulum-v1' and onnx_result['algorithm'] == algorithm
    assert onnx_result['mean_return'] < 0
    assert onnx_result['mean_return'] == pytest.approx(torch_result['mean_return'], rel=1e-3)
    capsys.readouterr()
    assert main(['eval', '--model', str(out), '--robot', 'claw_quadruped']) == 2
    err = capsys.readouterr().err
    assert "Gymnasium env 'Pendulum-v1'" in err and '--robot only apply' in err
