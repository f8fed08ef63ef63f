"""Export maths: the graph computes the clipped normalised mean, verify_onnx measures a real
difference, the metadata carries the spec, action_clip and run details exactly."""

import copy
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from claw_rl_ros.core.config import ConfigError, from_dict, to_dict
from claw_rl_ros.core.export import onnx_export as E
from claw_rl_ros.core.learning.checkpoint import save_checkpoint
from claw_rl_ros.core.learning.networks import ActorCritic
from claw_rl_ros.core.learning.learner import build_policy
from claw_rl_ros.core.learning.train_config import TrainConfig
from claw_rl_ros.core.sim.robot_spec import METADATA_KEY


def student(robot, seed=0):
    """A small student whose normaliser is far from the identity."""
    torch.manual_seed(seed)
    d = robot.policy_obs.dim
    policy = ActorCritic(d, d + robot.privileged_obs.dim, robot.num_joints,
                         actor_hidden_dims=[16], critic_hidden_dims=[8])
    policy.actor_normalizer.update(torch.randn(512, d) * torch.linspace(0.5, 4.0, d) + 2.0)
    return policy


def run(model_bytes, obs):
    session = ort.InferenceSession(model_bytes, providers=['CPUExecutionProvider'])
    return session.run(['actions'], {'obs': obs})[0]


def test_deployed_action_is_the_clipped_normalised_mean(robot):
    policy = student(robot)
    obs = torch.from_numpy(E.random_observations(robot.policy_obs.dim, 64, seed=1))
    with torch.no_grad():
        raw = policy.act_inference({'policy': obs})
    clip = float(raw.abs().quantile(0.5))
    out = E.deployed_action(policy, obs, clip)
    torch.testing.assert_close(out.detach(), raw.clamp(-clip, clip))
    assert (out == clip).any() and (out == -clip).any() and (out.abs() < clip).any()


def test_graph_computes_the_deployed_action_at_any_batch_size(robot):
    policy = student(robot).double()
    d = robot.policy_obs.dim
    model = E._graph_bytes(policy, d, 17, 0.3)
    obs = E.random_observations(d, 200, seed=4)
    expected = E.deployed_action(policy, torch.from_numpy(obs).double(), 0.3).detach().numpy()
    np.testing.assert_allclose(run(model, obs), expected, atol=1e-5)
    np.testing.assert_allclose(run(model, obs[:3]), expected[:3], atol=1e-5)
    assert np.abs(run(model, obs)).max() == pytest.approx(0.3)
    parsed = onnx.load_from_string(model)
    assert [o.version for o in parsed.opset_import if o.domain in ('', 'ai.onnx')] == [17]
    (inp,), (out,) = parsed.graph.input, parsed.graph.output
    assert [[x.dim_param or x.dim_value for x in v.type.tensor_type.shape.dim]
            for v in (inp, out)] == [['batch', d], ['batch', robot.num_joints]]
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    # A float32 CPU copy is exported: the policy itself is left as it was.
    assert all(p.dtype == torch.float64 for p in policy.parameters())
    assert policy.training and policy.actor.training


def test_verify_onnx_measures_the_largest_difference(robot):
    policy, other = student(robot, 0), student(robot, 1)
    d = robot.policy_obs.dim
    model = E._graph_bytes(policy, d, 17, 1e9)
    assert E.verify_onnx(policy, model) < 1e-5
    obs = E.random_observations(d, 1000, seed=0)
    with torch.no_grad():
        gap = np.abs(policy.act_inference({'policy': torch.from_numpy(obs)}).numpy()
                     - other.act_inference({'policy': torch.from_numpy(obs)}).numpy()).max()
    assert E.verify_onnx(other, model) == pytest.approx(gap, rel=1e-4)
    # A clip the model does not have is a difference too.
    assert E.verify_onnx(policy, model, action_clip=0.01) > 0.05
    # Fewer samples see a smaller (or equal) worst case; the seed picks them.
    assert E.verify_onnx(other, model, num_samples=5, seed=3) < gap


def test_activation_scale_is_the_largest_value_into_or_out_of_a_linear_layer(robot):
    policy = student(robot)
    obs = torch.from_numpy(E.random_observations(robot.policy_obs.dim, 50, seed=5))
    with torch.no_grad():
        x = policy.actor_normalizer(obs)
        h = policy.actor[0](x)
        a = policy.actor[1](h)
        out = policy.actor[2](a)
    by_hand = torch.stack([v.abs().amax(-1) for v in (x, h, a, out)]).amax(0).clamp(min=1.0)
    scale = E.activation_scale(policy, obs)
    torch.testing.assert_close(scale, by_hand.double())
    assert scale.max() > 3.0
    # Values within +-1 everywhere (inputs at the normaliser's mean, small weights): scale 1,
    # where the gate is the absolute 1e-5.
    with torch.no_grad():
        for layer in policy.actor:
            if isinstance(layer, torch.nn.Linear):
                layer.weight.mul_(0.01)
    centred = policy.actor_normalizer.mean.expand(50, -1).float()
    assert torch.equal(E.activation_scale(policy, centred), torch.ones(50, dtype=torch.float64))


def exact_student(robot):
    """A student in the hundreds whose float32 maths is exact in any summation order, so
    torch and onnxruntime agree to the bit whatever kernel either picks on whatever CPU: no
    normaliser; hidden unit j = ELU(16 obs_j + 256) (one power-of-two weight per row, the
    other products exact zeros; the pre-activation stays positive, where ELU is the
    identity); action j = 2 hidden_j."""
    d, joints = robot.policy_obs.dim, robot.num_joints
    policy = ActorCritic(d, d, joints, actor_hidden_dims=[joints], critic_hidden_dims=[8],
                         normalize_obs=False)
    first, _, last = policy.actor
    with torch.no_grad():
        for layer, weight, bias in ((first, 16.0, 256.0), (last, 2.0, 0.0)):
            layer.weight.zero_()
            layer.weight[torch.arange(joints), torch.arange(joints)] = weight
            layer.bias.fill_(bias)
    return policy


# The deterministic error injected into the exported graph: this much per unit of activation
# scale on every action (a tenth of the tolerance).
PER_UNIT = E.PARITY_TOLERANCE / 10


class OffPerUnit(E._DeployedActor):
    """The deployed graph, every action off by ``PER_UNIT`` x its sample's activation scale
    (computed inside the graph as :func:`export.activation_scale` does)."""

    def forward(self, obs):
        x, scale = self.policy.actor_normalizer(obs), torch.ones_like(obs[:, :1])
        for layer in self.policy.actor:
            y = layer(x)
            if isinstance(layer, torch.nn.Linear):
                for v in (x, y):
                    scale = torch.maximum(scale, v.abs().amax(-1, keepdim=True))
            x = y
        return super().forward(obs) + PER_UNIT * scale


def test_export_gate_scales_with_activations_and_still_refuses_a_real_mismatch(
        robot, tmp_path, monkeypatch):
    """Values in the hundreds: a graph off by a tenth of the tolerance per unit of activation
    scale, so by far more than 1e-5 absolute, exports; a graph 1e-4 off in one layer does not.
    The premise is constructed, not measured: the model's own arithmetic is exact (torch and
    onnxruntime agree to the bit on any CPU), the error is injected into the graph."""
    policy = exact_student(robot)
    d = robot.policy_obs.dim
    obs = E.random_observations(d, 1000, seed=0)  # the gate's samples
    assert 16 * np.abs(obs).max() < 256  # every pre-activation positive: ELU exact
    assert E.verify_onnx(policy, E._graph_bytes(policy, d, 17, 1e6)) == 0.0
    scale = E.activation_scale(policy, torch.from_numpy(obs)).numpy()
    assert scale.min() > 200  # every sample: PER_UNIT x its scale > 20 x the tolerance
    monkeypatch.setattr(E, '_DeployedActor', OffPerUnit)
    path = E.export_onnx(policy, robot, tmp_path / 'big.onnx', action_clip=1e6)
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    # The injected error, within the float32 rounding of actions below 2048 (1.2e-4).
    worst = PER_UNIT * scale.max()
    assert abs(json.loads(props['parity_max_abs_diff']) - worst) <= 1.2e-4
    assert json.loads(props['parity_max_abs_diff']) > 20 * E.PARITY_TOLERANCE  # absolute
    assert json.loads(props['parity_max_scaled_diff']) == pytest.approx(PER_UNIT, rel=0.15)
    # The graph of a slightly different network (last layer x (1 + 1e-4)) is refused.
    monkeypatch.undo()
    real_graph_bytes = E._graph_bytes

    def off_by_1e4(policy, *args):
        other = copy.deepcopy(policy)
        with torch.no_grad():
            other.actor[-1].weight.mul_(1 + 1e-4)
        return real_graph_bytes(other, *args)

    monkeypatch.setattr(E, '_graph_bytes', off_by_1e4)
    with pytest.raises(E.ExportError, match=r'disagree by .* at activation scale .* per unit, '
                                            r'tolerance 1e-05\); the model was not written'):
        E.export_onnx(policy, robot, tmp_path / 'off.onnx', action_clip=1e6)
    assert not (tmp_path / 'off.onnx').exists()


def test_random_observations_are_seeded_float32_at_three_scales():
    a = E.random_observations(6, 30, seed=7)
    assert a.shape == (30, 6) and a.dtype == np.float32
    np.testing.assert_array_equal(a, E.random_observations(6, 30, seed=7))
    assert not np.array_equal(a, E.random_observations(6, 30, seed=8))
    # Wide rows estimate each row's scale well: every row is at 0.3, 1 or 3, each common.
    row_std = E.random_observations(2000, 90, seed=1).std(axis=1)
    nearest = np.array([0.3, 1.0, 3.0])[np.abs(np.log(row_std[:, None] /
                                                      [0.3, 1.0, 3.0])).argmin(axis=1)]
    np.testing.assert_allclose(row_std, nearest, rtol=0.08)
    assert min(np.sum(nearest == v) for v in (0.3, 1.0, 3.0)) > 15


def test_metadata_holds_spec_with_clip_format_time_and_json_extras(robot):
    props = E._metadata(robot, {'iteration': 7, 3: [1, 'a']}, 0.75, 4)
    assert set(props) == {METADATA_KEY, 'claw_rl_format', 'exported_at', 'iteration', '3'}
    assert json.loads(props[METADATA_KEY]) == json.loads(json.dumps(
        {**robot.to_metadata(), 'action_clip': 0.75, 'obs_history': 4}))
    assert props['claw_rl_format'] == '1' and props['iteration'] == '7'
    assert props['3'] == '[1, "a"]'
    assert props['exported_at'].endswith('+00:00') and 'T' in props['exported_at']
    assert E._metadata(robot, None, 1.0, 1)[METADATA_KEY]
    for key in E.RESERVED_KEYS:
        with pytest.raises(ValueError, match=rf"extra_metadata may not set \['{key}'\]: "
                                             'reserved for the exporter'):
            E._metadata(robot, {key: 1, 'fine': 2}, 1.0, 1)


def test_set_metadata_replaces_existing_keys_in_place():
    model = onnx.ModelProto()
    E._set_metadata(model, {'a': '1', 'b': '2'})
    E._set_metadata(model, {'b': '3', 'c': '4'})
    assert [(p.key, p.value) for p in model.metadata_props] == [('a', '1'), ('b', '3'),
                                                                ('c', '4')]


def test_export_onnx_writes_names_doc_parity_and_the_clip(robot, tmp_path):
    policy = student(robot)
    path = E.export_onnx(policy, robot, tmp_path / 'sub' / 's.onnx', action_clip=0.2,
                         extra_metadata={'run': 'x'})
    assert path == tmp_path / 'sub' / 's.onnx' and path.is_file()
    model = onnx.load(str(path))
    assert model.producer_name == 'claw_rl_ros'
    assert model.doc_string.startswith(f'{robot.name} student policy')
    props = {p.key: p.value for p in model.metadata_props}
    assert json.loads(props[METADATA_KEY])['action_clip'] == 0.2
    assert json.loads(props['run']) == 'x'
    assert 0.0 <= json.loads(props['parity_max_abs_diff']) < E.PARITY_TOLERANCE
    obs = E.random_observations(robot.policy_obs.dim, 300, seed=2)
    out = run(path.read_bytes(), obs)
    assert np.abs(out).max() == pytest.approx(0.2)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match=rf'action_clip {bad!r} must be > 0 '
                                             r'\(env.clip_actions\)'):
            E.export_onnx(policy, robot, tmp_path / 'bad.onnx', action_clip=bad)
    assert not (tmp_path / 'bad.onnx').exists()
    assert E.DEFAULT_ACTION_CLIP == 10.0
    with pytest.raises(ValueError, match='opset 16 is too old; use 17 or newer'):
        E.export_onnx(policy, robot, tmp_path / 'old.onnx', opset=16)
    newer = onnx.load(str(E.export_onnx(policy, robot, tmp_path / 'new.onnx', opset=18)))
    assert [o.version for o in newer.opset_import if o.domain in ('', 'ai.onnx')] == [18]
    assert [o.version for o in model.opset_import if o.domain in ('', 'ai.onnx')] == [17]


def test_a_parity_gap_at_the_tolerance_is_refused(robot, tmp_path, monkeypatch):
    monkeypatch.setattr(E, 'parity_errors', lambda *a, **k: (np.array([0.0, 1e-3, 2e-6]),
                                                             np.array([1.0, 100.0, 1.0])))
    with pytest.raises(E.ExportError, match=r'onnxruntime and torch disagree by 0.001 at '
                                            r'activation scale 100 \(1e-05 per unit, '
                                            r'tolerance 1e-05\); the model was not written'):
        E.export_onnx(student(robot), robot, tmp_path / 's.onnx')
    assert not (tmp_path / 's.onnx').exists()


def test_export_refuses_an_actor_with_the_wrong_number_of_actions(robot, tmp_path):
    d = robot.policy_obs.dim
    policy = ActorCritic(d, d, robot.num_joints - 1, actor_hidden_dims=[4],
                         critic_hidden_dims=[4])
    message = (rf'the actor outputs \({robot.num_joints - 1},\) actions, robot '
               rf'{robot.name!r} has {robot.num_joints} joints')
    with pytest.raises(ValueError, match=message):
        E.export_onnx(policy, robot, tmp_path / 'a.onnx')
    teacher = ActorCritic(d + robot.privileged_obs.dim, d, robot.num_joints,
                          actor_hidden_dims=[4], critic_hidden_dims=[4],
                          actor_obs_groups=['policy_noise_free', 'privileged'])
    with pytest.raises(ValueError, match=r'the actor reads observation groups '
                                         r"\['policy_noise_free', 'privileged'\]; only an "
                                         r"actor on \['policy'\] can be deployed \(privileged "
                                         r'observations do not exist on the robot\): export '
                                         r'the student, not the teacher'):
        E.export_onnx(teacher, robot, tmp_path / 't.onnx')


def checkpoint(robot, path, robot_spec):
    cfg = from_dict(TrainConfig, {'policy': {'actor_hidden_dims': [8],
                                             'critic_hidden_dims': [8]}})
    dims = {'policy': robot.policy_obs.dim, 'policy_noise_free': robot.policy_obs.dim,
            'privileged': robot.privileged_obs.dim}
    payload = {'config': to_dict(cfg), 'obs_dims': dims, 'num_actions': robot.num_joints,
               'model': build_policy(cfg, dims, robot.num_joints).state_dict()}
    if robot_spec is not None:
        payload['robot'] = robot_spec
    save_checkpoint(path, payload)


def test_export_checkpoint_without_a_recorded_robot_exports_and_a_changed_one_is_named(
        robot, tmp_path):
    checkpoint(robot, tmp_path / 'old.pt', None)
    path = E.export_checkpoint(tmp_path / 'old.pt', tmp_path / 'old.onnx')
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert json.loads(props['iteration']) is None and json.loads(props['checkpoint']) == 'old.pt'
    changed = {**robot.to_metadata(), 'action_scale': 0.5, 'control_dt': 0.01}
    checkpoint(robot, tmp_path / 'bad.pt', changed)
    with pytest.raises(ConfigError) as info:
        E.export_checkpoint(tmp_path / 'bad.pt', tmp_path / 'bad.onnx')
    assert str(info.value) == (
        f"{tmp_path / 'bad.pt'}: robot: robot 'claw_quadruped' changed since this checkpoint "
        f'was trained: action_scale: model has 0.5, robot has {robot.action_scale!r}; '
        f'control_dt: model has 0.01, robot has {robot.control_dt!r}')
    assert (info.value.source, info.value.key) == (str(tmp_path / 'bad.pt'), 'robot')
    assert not (tmp_path / 'bad.onnx').exists()


def test_export_checkpoint_uses_the_trained_clip_and_records_the_run(robot, tmp_path):
    cfg = from_dict(TrainConfig, {'policy': {'actor_hidden_dims': [8],
                                             'critic_hidden_dims': [8]},
                                  'env': {'clip_actions': 0.4}})
    dims = {'policy': robot.policy_obs.dim, 'policy_noise_free': robot.policy_obs.dim,
            'privileged': robot.privileged_obs.dim}
    policy = build_policy(cfg, dims, robot.num_joints)
    with torch.no_grad():
        policy.actor[-1].bias.fill_(100.0)     # far beyond the clip
    save_checkpoint(tmp_path / 'model_5.pt', {
        'config': to_dict(cfg), 'obs_dims': dims, 'num_actions': robot.num_joints,
        'model': policy.state_dict(), 'iteration': 5, 'total_steps': 120,
        'robot': robot.to_metadata()})
    path = E.export_checkpoint(tmp_path / 'model_5.pt', tmp_path / 'student.onnx')
    props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert json.loads(props[METADATA_KEY])['action_clip'] == 0.4
    assert {k: json.loads(props[k]) for k in ('checkpoint', 'iteration', 'total_steps',
                                              'algorithm')} == \
        {'checkpoint': 'model_5.pt', 'iteration': 5, 'total_steps': 120, 'algorithm': 'ppo'}
    out = run(path.read_bytes(), E.random_observations(robot.policy_obs.dim, 50, seed=0))
    np.testing.assert_array_equal(out, np.float32(0.4))
