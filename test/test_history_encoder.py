"""The student's memory through a 1D convolution (policy.history_encoder): what it reads, what
the config refuses by name, and that such a student trains, checkpoints, exports and evaluates
with its window like any other."""

import numpy as np
import pytest
import torch
from torch import nn

from claw_rl_ros.core.config import ConfigError, merge
from claw_rl_ros.core.evaluation.final_student import export_and_evaluate
from claw_rl_ros.core.export.onnx_export import activation_scale, export_checkpoint, export_onnx
from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
from claw_rl_ros.core.learning import checkpoint as ckpt
from claw_rl_ros.core.learning.learner import load_policy
from claw_rl_ros.core.learning.networks import ActorCritic, HistoryActor
from claw_rl_ros.core.learning.runner import OnPolicyRunner
from claw_rl_ros.core.learning.train_config import HistoryEncoderConfig
from test_training import tiny_config

D = 47
ENCODER = {'channels': [8, 8], 'kernel_sizes': [4, 3], 'strides': [2, 1]}
ENCODER_LATENT = HistoryEncoderConfig().latent_dim
# A 50-frame window and the default kernels (8, 5, 5 at strides 4, 1, 1), which need 40:
# 40 -> (40 - 8) / 4 + 1 = 9 -> 5 -> 1.
WINDOW_50 = {'env': {'policy_history': 50},
             'policy': {'history_encoder': {'channels': [32, 32, 32]}}}


def encoder_student(history=12, seed=0, **encoder):
    torch.manual_seed(seed)
    cfg = HistoryEncoderConfig(**{**ENCODER, **encoder})
    return ActorCritic(history * D, D, 12, actor_hidden_dims=[32, 32], critic_hidden_dims=[16],
                       history_encoder=cfg, history=history)


def test_the_window_is_read_frame_by_frame_and_the_newest_frame_directly():
    policy = encoder_student()
    actor = policy.actor
    assert isinstance(actor, HistoryActor)
    # 12 frames -> floor((12 - 4) / 2) + 1 = 5 -> 5 - 3 + 1 = 3 frames of 8 channels.
    assert actor.encoder[-2].in_features == 3 * 8
    assert actor.head[0].in_features == D + ENCODER_LATENT
    obs = torch.randn(6, 12 * D)
    with torch.no_grad():
        base = actor(obs)
        # Every frame of the window moves the action, the oldest included.
        for frame in (0, 5, 11):
            moved = obs.clone()
            moved[:, frame * D:(frame + 1) * D] += 1.0
            assert (actor(moved) - base).abs().amax() > 1e-4, frame
        # The newest frame also reaches the head without the encoder.
        latent = actor.encoder(obs.reshape(6, 12, D).transpose(1, 2))
        head = actor.head(torch.cat([obs[:, -D:], latent], dim=-1))
        np.testing.assert_allclose(base, head, atol=1e-6)
        # Leading dimensions (a rollout [T, N, H * D]) are rows like any other.
        stacked = actor(obs.reshape(2, 3, 12 * D))
    assert stacked.shape == (2, 3, 12)
    np.testing.assert_allclose(stacked.reshape(6, 12), base, atol=1e-6)


def test_an_embedding_reads_each_frame_alone_before_the_convolutions():
    actor = encoder_student(embed_dim=16).actor
    first = actor.encoder[0]
    assert isinstance(first, nn.Conv1d) and first.kernel_size == (1,)
    assert (first.in_channels, first.out_channels) == (D, 16)
    assert encoder_student().actor.encoder[0].in_channels == D


def test_orthogonal_init_reaches_the_head_of_an_encoder_actor():
    torch.manual_seed(0)
    policy = ActorCritic(12 * D, D, 12, actor_hidden_dims=[32, 32], critic_hidden_dims=[16],
                         init='orthogonal', history=12,
                         history_encoder=HistoryEncoderConfig(**ENCODER))
    last = policy.actor.head[-1]
    assert torch.equal(last.bias, torch.zeros_like(last.bias))
    # Orthogonal rows at gain 0.01: W W^T = 0.01^2 I.
    np.testing.assert_allclose((last.weight @ last.weight.T).detach(),
                               1e-4 * np.eye(12), atol=1e-9)


@pytest.mark.parametrize('overrides, match', [
    ({'env': {'policy_history': 10}},
     r'policy.history_encoder.*kernels \[8, 5, 5\] and strides \[4, 1, 1\] need a window of '
     r'40 frames or more, env.policy_history is 10; raise env.policy_history'),
    ({'algorithm': 'sac'}, r'policy.history_encoder.*with PPO; set channels: \[\] for SAC'),
    ({'policy': {'actor_obs_groups': ['policy', 'privileged']}},
     r"policy.history_encoder.*reads the window of 'policy' alone, but the actor reads"),
    ({'policy': {'history_encoder': {'channels': [8, 8, 8], 'kernel_sizes': [3, 3]}}},
     r'policy.history_encoder.kernel_sizes.*\[3, 3\] gives fewer layers than channels'),
    ({'policy': {'history_encoder': {'channels': [0]}}}, r'policy.history_encoder.channels'),
])
def test_an_encoder_the_window_cannot_feed_is_refused_by_name(overrides, match):
    with pytest.raises(ConfigError, match=match):
        tiny_config(**merge(WINDOW_50, overrides))
    # The window of exactly the frames the kernels need is accepted, one frame less is not.
    assert tiny_config(**merge(WINDOW_50, {'env': {'policy_history': 40}}))
    with pytest.raises(ConfigError, match='window of 40 frames or more, env.policy_history is 39'):
        tiny_config(**merge(WINDOW_50, {'env': {'policy_history': 39}}))


def test_activation_scale_sees_inside_the_convolutions():
    """The export's parity tolerance scales with the largest value inside the network: a first
    convolution whose outputs are large counts even when the next one shrinks them again."""
    policy = encoder_student()
    obs = torch.randn(4, 12 * D)
    before = activation_scale(policy, obs)
    convs = [m for m in policy.actor.encoder if isinstance(m, nn.Conv1d)]
    with torch.no_grad():
        convs[0].weight.mul_(1e4)
        convs[1].weight.mul_(1e-4)
    assert (activation_scale(policy, obs) > 100 * before).all()


def test_an_encoder_student_trains_exports_and_evaluates_with_its_window(robot, tmp_path):
    history = 12
    cfg = tiny_config(env={'policy_history': history},
                      policy={'actor_hidden_dims': [32, 32], 'critic_hidden_dims': [32, 32],
                              'history_encoder': ENCODER},
                      runner={'max_iterations': 2, 'eval_episodes': 2})
    cfg.env.episode_length_s = 1.0
    runner = OnPolicyRunner(cfg, tmp_path)
    try:
        before = [p.detach().clone() for p in runner.policy.actor.encoder.parameters()]
        runner.learn()
        summary = export_and_evaluate(runner, robot, tmp_path)
    finally:
        runner.close()
    # The encoder learns (its weights moved) and the graph carries it.
    after = list(runner.policy.actor.encoder.parameters())
    assert all(not torch.equal(a, b) for a, b in zip(before, after))
    model = OnnxPolicy(summary['student_onnx'], robot)
    assert (model.obs_history, model.obs_dim) == (history, history * D)
    assert summary['eval_forward_0.5']['episodes'] == 2
    obs = np.random.default_rng(1).normal(size=(5, history * D)).astype(np.float32)
    with torch.no_grad():
        expected = runner.policy.act_inference({'policy': torch.from_numpy(obs)}).numpy()
    np.testing.assert_allclose(model(obs), np.clip(expected, -10, 10), atol=1e-5)
    # The checkpoint rebuilds the encoder from its config, and exports the same graph.
    path = ckpt.latest_checkpoint(tmp_path)
    loaded, loaded_cfg, _ = load_policy(path)
    assert isinstance(loaded.actor, HistoryActor)
    assert loaded_cfg.policy.history_encoder.channels == [8, 8]
    again = OnnxPolicy(export_checkpoint(path, tmp_path / 'c.onnx'), robot)
    np.testing.assert_allclose(again(obs), model(obs), atol=1e-6)


def test_an_encoder_student_is_refused_a_window_it_was_not_built_for(robot, tmp_path):
    policy = encoder_student(history=12)
    with pytest.raises(ValueError, match='does not accept'):
        export_onnx(policy, robot, tmp_path / 'm.onnx', obs_history=10)
    assert not (tmp_path / 'm.onnx').exists()


def test_a_history_actor_built_for_too_short_a_window_is_refused():
    # Kernels 4, 3 at strides 2, 1: 8 -> (8 - 4) / 2 + 1 = 3 -> 1 frame; 7 -> 2 -> none.
    with pytest.raises(ValueError, match=r'a window of 7 frames is shorter than its '
                                         r'convolutions need \(8\)'):
        HistoryActor(D, 7, 12, [32], 'elu', HistoryEncoderConfig(**ENCODER))
    assert HistoryActor(D, 8, 12, [32], 'elu', HistoryEncoderConfig(**ENCODER))
