"""ONNX export and OnnxPolicy: parity, metadata, spec refusal, input checks, atomic writes."""

import dataclasses
import hashlib
import json
import os

import numpy as np
import onnx
import pytest
import torch

from claw_rl_ros import cli
from claw_rl_ros.core.export import onnx_export as export_module
from claw_rl_ros.core.learning.checkpoint import save_checkpoint
from claw_rl_ros.core.config import ConfigError, from_dict, to_dict
from claw_rl_ros.core.export.onnx_export import (export_checkpoint, export_onnx, ExportError,
                                                 verify_onnx)
from claw_rl_ros.core.learning.networks import ActorCritic
from claw_rl_ros.core.sim.observations import ObservationLayout
from claw_rl_ros.core.export.onnx_policy import ModelError, OnnxPolicy, SpecMismatchError
from claw_rl_ros.core.sim.robot_spec import METADATA_KEY
from claw_rl_ros.core.learning.learner import build_policy
from claw_rl_ros.core.learning.train_config import TrainConfig


def make_policy(robot, obs_dim=None, seed=0, groups=('policy',)):
    """Random weights and a normaliser fitted to shifted, scaled data (mean ~3, std ~5)."""
    torch.manual_seed(seed)
    obs_dim = obs_dim or robot.policy_obs.dim
    priv = robot.privileged_obs.dim
    actor_dim = obs_dim + (priv if 'privileged' in groups else 0)
    policy = ActorCritic(actor_dim, obs_dim + priv, robot.num_joints,
                         actor_hidden_dims=[64, 64], critic_hidden_dims=[32],
                         actor_obs_groups=list(groups))
    shift = torch.linspace(-3.0, 6.0, actor_dim)
    scale = torch.linspace(0.2, 8.0, actor_dim)
    policy.actor_normalizer.update(torch.randn(4096, actor_dim) * scale + shift)
    return policy


@pytest.fixture(scope='module')
def policy(robot):
    return make_policy(robot)


@pytest.fixture(scope='module')
def model_path(policy, robot, tmp_path_factory):
    path = tmp_path_factory.mktemp('export') / 'student.onnx'
    return export_onnx(policy, robot, path, extra_metadata={'run': 'unit-test', 'iteration': 7})


def torch_actions(policy, obs):
    with torch.no_grad():
        return policy.act_inference({'policy': torch.from_numpy(obs)}).numpy()


def test_parity_over_1000_random_observations(policy, model_path):
    assert policy.actor_normalizer.mean.abs().max() > 1.0  # the normaliser is not identity
    assert verify_onnx(policy, model_path, num_samples=1000) < 1e-5
    obs = (np.random.default_rng(1).standard_normal((1000, 47)) * 3.0).astype(np.float32)
    onnx_out = OnnxPolicy(model_path)(obs)
    assert np.abs(onnx_out - torch_actions(policy, obs)).max() < 1e-5
    assert np.abs(onnx_out).max() > 1e-2  # a non-trivial function


def test_action_clipping_is_in_the_graph_and_the_metadata(policy, robot, tmp_path):
    """The trained action range travels with the model: clipped inside, recorded in the spec."""
    path = export_onnx(policy, robot, tmp_path / 'clipped.onnx', action_clip=0.05)
    model = OnnxPolicy(path, robot)
    assert model.action_clip == 0.05
    obs = (np.random.default_rng(2).standard_normal((500, 47)) * 3.0).astype(np.float32)
    raw = torch_actions(policy, obs)
    assert np.abs(raw).max() > 0.05                       # the clip is active on this data
    np.testing.assert_allclose(model(obs), np.clip(raw, -0.05, 0.05), atol=1e-6)
    with pytest.raises(ValueError, match='action_clip'):
        export_onnx(policy, robot, tmp_path / 'bad.onnx', action_clip=0.0)


def test_graph_names_opset_checker_and_metadata(model_path, robot):
    model = onnx.load(str(model_path))
    onnx.checker.check_model(model)
    assert max(o.version for o in model.opset_import if o.domain in ('', 'ai.onnx')) >= 17
    (inp,), (out,) = model.graph.input, model.graph.output
    assert (inp.name, out.name) == ('obs', 'actions')
    dims = [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in (inp, out)]
    assert dims == [['batch', 47], ['batch', 12]]
    props = {p.key: p.value for p in model.metadata_props}
    spec = json.loads(props[METADATA_KEY])
    assert spec == json.loads(json.dumps({**robot.to_metadata(), 'action_clip': 10.0,
                                          'obs_history': 1}))
    assert robot.mismatches(spec) == []
    assert [t['name'] for t in spec['observation']] == robot.policy_obs.names
    assert spec['joint_names'] == robot.joint_names and spec['obs_dim'] == 47
    assert json.loads(props['run']) == 'unit-test' and json.loads(props['iteration']) == 7
    assert props['claw_rl_format'] == '1' and float(props['parity_max_abs_diff']) < 1e-5


def test_dynamic_batch_and_single_observation(model_path):
    model = OnnxPolicy(model_path)
    obs = np.random.default_rng(2).normal(0.0, 2.0, (256, 47)).astype(np.float32)
    batch = model(obs)
    assert batch.shape == (256, 12) and batch.dtype == np.float32
    assert model(obs[:7]).shape == (7, 12)
    single = model(obs[3])
    assert single.shape == (12,)
    np.testing.assert_allclose(single, batch[3], atol=1e-6)
    assert model(obs[3].astype(np.float64)).dtype == np.float32


def test_from_path_and_from_bytes_are_identical(model_path, robot):
    data = model_path.read_bytes()
    from_path, from_bytes = OnnxPolicy(model_path, robot), OnnxPolicy(data, robot)
    obs = np.random.default_rng(3).normal(0.0, 3.0, (64, 47)).astype(np.float32)
    np.testing.assert_array_equal(from_path(obs), from_bytes(obs))
    assert from_path.sha256 == from_bytes.sha256 == hashlib.sha256(data).hexdigest()
    assert from_bytes.spec == from_path.spec and from_bytes.metadata == from_path.metadata
    assert (from_path.obs_dim, from_path.num_actions) == (47, 12)


def test_changed_gain_is_refused_naming_it(model_path, robot):
    other = dataclasses.replace(robot, kp=robot.kp * 1.5)
    with pytest.raises(SpecMismatchError, match=r'kp: model has .*robot has'):
        OnnxPolicy(model_path, other)


def test_swapped_joint_order_is_refused_naming_it(model_path, robot):
    order = [3, 4, 5, 0, 1, 2, 6, 7, 8, 9, 10, 11]
    other = dataclasses.replace(robot, joint_names=[robot.joint_names[i] for i in order])
    with pytest.raises(SpecMismatchError) as err:
        OnnxPolicy(model_path, other)
    assert 'joint_names' in str(err.value) and 'FR_hip_joint' in str(err.value)
    assert isinstance(err.value, ValueError)


def layout_without_last_action(robot):
    terms = [(s.name, s.scale.tolist()) for s in robot.policy_obs.slices
             if s.name != 'last_action']
    return ObservationLayout(terms, robot.num_joints, len(robot.foot_bodies), 'policy')


def test_model_for_another_observation_layout_is_refused(robot, tmp_path):
    short = dataclasses.replace(robot, policy_obs=layout_without_last_action(robot))
    path = export_onnx(make_policy(short), short, tmp_path / 'short.onnx')
    assert OnnxPolicy(path, short).obs_dim == 35
    with pytest.raises(SpecMismatchError) as err:
        OnnxPolicy(path, robot)
    assert 'obs_dim: model has 35, robot has 47' in str(err.value)
    assert 'observation:' in str(err.value)


def test_observation_scale_change_is_refused(model_path, robot):
    terms = [(s.name, s.scale.tolist()) for s in robot.policy_obs.slices]
    terms[4] = ('joint_vel', 0.1)
    layout = ObservationLayout(terms, robot.num_joints, len(robot.foot_bodies), 'policy')
    with pytest.raises(SpecMismatchError, match='observation: model has'):
        OnnxPolicy(model_path, dataclasses.replace(robot, policy_obs=layout))


def rewrite(model_path, tmp_path, edit):
    model = onnx.load(str(model_path))
    edit(model)
    path = tmp_path / 'edited.onnx'
    onnx.save(model, str(path))
    return path


def test_model_without_spec_metadata_is_refused(model_path, tmp_path, robot):
    path = rewrite(model_path, tmp_path, lambda m: m.ClearField('metadata_props'))
    with pytest.raises(ModelError, match="no 'claw_rl_spec' metadata"):
        OnnxPolicy(path)
    with pytest.raises(ModelError, match='claw_rl_spec'):
        OnnxPolicy(path.read_bytes(), robot)


def test_metadata_that_disagrees_with_the_graph_is_refused(model_path, tmp_path):
    def lie_about_obs_dim(model):
        prop = next(p for p in model.metadata_props if p.key == METADATA_KEY)
        prop.value = json.dumps({**json.loads(prop.value), 'obs_dim': 48})
    path = rewrite(model_path, tmp_path, lie_about_obs_dim)
    with pytest.raises(ModelError, match=r"'obs' is tensor\(float\) \['batch', 47\].*48"):
        OnnxPolicy(path)


def test_wrong_output_name_is_refused(model_path, tmp_path):
    def rename_output(model):
        for node in model.graph.node:
            node.output[:] = ['act' if o == 'actions' else o for o in node.output]
        model.graph.output[0].name = 'act'
    path = rewrite(model_path, tmp_path, rename_output)
    with pytest.raises(ModelError, match="expected input 'obs' and output 'actions'.*'act'"):
        OnnxPolicy(path)


def test_missing_and_corrupt_files_are_refused(tmp_path):
    with pytest.raises(ModelError, match='not found'):
        OnnxPolicy(tmp_path / 'nope.onnx')
    (tmp_path / 'junk.onnx').write_bytes(b'this is not a protobuf')
    with pytest.raises(ModelError, match='not a loadable ONNX model'):
        OnnxPolicy(tmp_path / 'junk.onnx')


@pytest.mark.parametrize('obs, message', [
    (np.zeros(46), r'shape \(46,\): expected \[47\] or \[N, 47\]'),
    (np.zeros((2, 48)), r'shape \(2, 48\): expected'),
    (np.zeros((2, 3, 47)), r'shape \(2, 3, 47\)'),
])
def test_bad_observation_shapes_are_rejected(model_path, obs, message):
    with pytest.raises(ValueError, match=message):
        OnnxPolicy(model_path)(obs)


def test_non_finite_observations_are_rejected(model_path):
    model = OnnxPolicy(model_path)
    obs = np.zeros((3, 47), np.float32)
    obs[1, 7] = np.nan
    with pytest.raises(ValueError, match=r'non-finite value \(first at index \(1, 7\)\)'):
        model(obs)
    with pytest.raises(ValueError, match='non-finite'):
        model(np.full(47, np.inf))


@pytest.mark.parametrize('crash_in', ['replace', 'fsync'])
def test_crash_mid_write_keeps_the_previous_model(policy, robot, tmp_path, monkeypatch,
                                                  crash_in):
    path = export_onnx(policy, robot, tmp_path / 'student.onnx')
    before = path.read_bytes()

    def crash(*args, **kwargs):
        raise OSError('simulated crash')
    monkeypatch.setattr(os, crash_in, crash)
    with pytest.raises(OSError, match='simulated crash'):
        export_onnx(make_policy(robot, seed=5), robot, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ['student.onnx']
    OnnxPolicy(path, robot)


def test_failed_parity_check_writes_nothing(policy, robot, tmp_path, monkeypatch):
    # 3e-5 where values stay within +-1 (scale 1): three times the tolerance.
    monkeypatch.setattr(export_module, 'parity_errors',
                        lambda *a, **k: (np.array([1e-6, 3e-5]), np.array([1.0, 1.0])))
    with pytest.raises(ExportError, match=r'disagree by 3e-05 at activation scale 1 \(3e-05 '
                                          r'per unit, tolerance 1e-05\)'):
        export_onnx(policy, robot, tmp_path / 'student.onnx')
    assert list(tmp_path.iterdir()) == []


def test_privileged_actor_is_refused(robot, tmp_path):
    teacher = make_policy(robot, groups=('policy', 'privileged'))
    with pytest.raises(ValueError, match="only an actor on \\['policy'\\] can be deployed"):
        export_onnx(teacher, robot, tmp_path / 'teacher.onnx')
    assert not (tmp_path / 'teacher.onnx').exists()


def test_actor_of_the_wrong_size_and_old_opset_are_refused(robot, tmp_path):
    with pytest.raises(ValueError, match='does not accept .* 1 frame\\(s\\) of 47 = \\[47\\]'):
        export_onnx(make_policy(robot, obs_dim=40), robot, tmp_path / 'a.onnx')
    with pytest.raises(ValueError, match='opset 13 is too old'):
        export_onnx(make_policy(robot), robot, tmp_path / 'a.onnx', opset=13)
    with pytest.raises(ValueError, match='reserved'):
        export_onnx(make_policy(robot), robot, tmp_path / 'a.onnx',
                    extra_metadata={METADATA_KEY: 'forged'})


def fake_checkpoint(robot, path, spec=None):
    """A checkpoint with the fields export reads (the runner's own save is tested in eval)."""
    cfg = from_dict(TrainConfig, {'policy': {'actor_hidden_dims': [32],
                                             'critic_hidden_dims': [32]}})
    dims = {'policy': robot.policy_obs.dim, 'policy_noise_free': robot.policy_obs.dim,
            'privileged': robot.privileged_obs.dim}
    policy = build_policy(cfg, dims, robot.num_joints)
    policy.actor_normalizer.update(torch.randn(256, dims['policy']) * 2.0 + 1.0)
    save_checkpoint(path, {'config': to_dict(cfg), 'obs_dims': dims,
                           'num_actions': robot.num_joints, 'model': policy.state_dict(),
                           'iteration': 3, 'total_steps': 96,
                           'robot': spec or robot.to_metadata()})
    return policy


def test_export_checkpoint_embeds_run_details(robot, tmp_path):
    policy = fake_checkpoint(robot, tmp_path / 'model_3.pt')
    path = export_checkpoint(tmp_path / 'model_3.pt', tmp_path / 'out' / 'student.onnx')
    model = OnnxPolicy(path, robot)
    assert json.loads(model.metadata['iteration']) == 3
    assert json.loads(model.metadata['checkpoint']) == 'model_3.pt'
    assert verify_onnx(policy, path) < 1e-5


def test_export_checkpoint_refuses_a_robot_changed_since_training(robot, tmp_path):
    spec = {**robot.to_metadata(), 'action_scale': 0.5}
    fake_checkpoint(robot, tmp_path / 'model_3.pt', spec)
    with pytest.raises(ConfigError, match='changed since this checkpoint was trained: '
                       'action_scale'):
        export_checkpoint(tmp_path / 'model_3.pt', tmp_path / 'student.onnx')


def test_cli_export_prints_path_hash_and_parity(robot, tmp_path, capsys):
    fake_checkpoint(robot, tmp_path / 'run' / 'checkpoints' / 'model_3.pt')
    out = tmp_path / 'student.onnx'
    assert cli.main(['export', '--run-dir', str(tmp_path / 'run'), '--out', str(out)]) == 0
    text = capsys.readouterr().out
    assert str(out) in text and hashlib.sha256(out.read_bytes()).hexdigest() in text
    diff = float(text.split('max abs diff onnxruntime vs torch:')[1].split()[0])
    assert diff < 1e-5


@pytest.mark.parametrize('argv, message', [
    (['--checkpoint', 'missing.pt'], 'missing.pt: checkpoint not found'),
    (['--run-dir', '.'], 'no checkpoints/model_*.pt'),
])
def test_cli_export_errors_are_one_line_exit_2(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert cli.main(['export', *argv]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.err.count('\n') == 1
    assert 'Traceback' not in captured.err and not (tmp_path / 'student.onnx').exists()


def test_cli_export_refuses_a_privileged_checkpoint(robot, tmp_path, capsys):
    cfg = from_dict(TrainConfig, {'policy': {'actor_obs_groups': ['policy', 'privileged'],
                                             'actor_hidden_dims': [16]}})
    dims = {'policy': robot.policy_obs.dim, 'policy_noise_free': robot.policy_obs.dim,
            'privileged': robot.privileged_obs.dim}
    policy = build_policy(cfg, dims, robot.num_joints)
    save_checkpoint(tmp_path / 'teacher.pt', {
        'config': to_dict(cfg), 'obs_dims': dims, 'num_actions': robot.num_joints,
        'model': policy.state_dict(), 'robot': robot.to_metadata()})
    assert cli.main(['export', '--checkpoint', str(tmp_path / 'teacher.pt'),
                     '--out', str(tmp_path / 't.onnx')]) == 2
    assert 'can be deployed' in capsys.readouterr().err
