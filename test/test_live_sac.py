"""Live SAC without ROS: ``algorithm: sac`` swaps the live trainer's learner and nothing else;
chunks become replay transitions exactly (time-outs bootstrap from their final state, a chunk's
end only cuts n-step windows), actors explore with SAC's squashed Gaussian around the exported
student, lagged chunks are ordinary replay data, and resume with the buffer is exact."""

import copy
import json

import numpy as np
import onnx
import pytest
import torch

from claw_rl_ros.core.control.loop_record import GaussianSampler
from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
from claw_rl_ros.core.learning.ppo import PPO
from claw_rl_ros.core.learning.sac import SAC
from claw_rl_ros.core.live.batched_actor import BatchedActor, OnnxBehaviour
from claw_rl_ros.core.live.chunk_learner import ChunkLearner
from claw_rl_ros.core.live.live_trainer import LiveTrainer
from claw_rl_ros.core.live.rollout_chunk import decode_chunk, encode_chunk
from claw_rl_ros.core.live.sac_chunk_learner import SACChunkLearner
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from test_training import tiny_config

SAC_LIVE = {'learning_starts': 100, 'batch_size': 32, 'utd_ratio': 0.125,
            'buffer_size': 4000, 'action_bound': 2.0, 'checkpoint_replay': True}


def sac_trainer(tmp_path, robot, name='run', sac=None, **kwargs):
    cfg = tiny_config(algorithm='sac', env={'episode_length_s': 0.2, 'num_envs': 4},
                      sac={**SAC_LIVE, **(sac or {})})
    return LiveTrainer(cfg, robot, tmp_path / name, tensorboard=False, **kwargs)


def onnx_actor(trainer, seed=0):
    cfg = copy.deepcopy(trainer.cfg.env)
    cfg.seed = seed
    return BatchedActor(VecLocomotionEnv(cfg), None, trainer.cfg.runner.num_steps_per_env,
                        f'/a{seed}', seed=seed, chunks_in_flight=2)


def act_with_export(trainer, actor, robot):
    """Export (the trainer's push) and let the actor act with it, as actor_node does."""
    data = trainer.export()
    actor.use_behaviour(OnnxBehaviour(OnnxPolicy(data, robot)))
    return data


def test_switching_algorithm_changes_the_live_learner_and_nothing_else(tmp_path, robot):
    ppo = LiveTrainer(tiny_config(), robot, tmp_path / 'ppo', tensorboard=False)
    sac = sac_trainer(tmp_path, robot)
    assert type(ppo.learner) is ChunkLearner and isinstance(ppo.learner.alg, PPO)
    assert type(sac.learner) is SACChunkLearner and isinstance(sac.learner.alg, SAC)
    for name in ('gate', 'artifacts'):
        assert type(getattr(ppo, name)) is type(getattr(sac, name))
    assert ppo.learner.spec == sac.learner.spec  # the same chunks are accepted by both
    assert type(ppo.gate.lag_filter) is type(sac.gate.lag_filter)


def test_sac_export_carries_the_squashed_behaviour_and_actors_sample_it(tmp_path, robot):
    trainer = sac_trainer(tmp_path, robot)
    with torch.no_grad():  # means well into tanh's bend (pre-tanh 1.5: 1.81 of 2)
        trainer.learner.policy.actor[-1].bias[:robot.num_joints] += 1.5
    data = trainer.export()
    meta = {p.key: p.value for p in onnx.load_from_string(data).metadata_props}
    behaviour = json.loads(meta['behaviour'])
    assert behaviour == {'kind': 'squashed_gaussian', 'low': [-2.0] * robot.num_joints,
                         'high': [2.0] * robot.num_joints}
    std = np.array(json.loads(meta['action_std']))
    assert std.shape == (robot.num_joints,) and (std > 0).all()
    model = OnnxPolicy(data, robot)
    behave = OnnxBehaviour(model)
    obs = torch.from_numpy(np.random.default_rng(0).standard_normal(
        (20000, robot.policy_obs.dim)).astype(np.float32) * 0.3)
    out = behave.sample({'policy': obs}, torch.Generator().manual_seed(1))
    deterministic = torch.from_numpy(np.asarray(model(obs.numpy()), np.float32))
    torch.testing.assert_close(out['mu'], deterministic)
    # Every action in the squashed range; pre-tanh, N(atanh(mean / 2), std).
    assert out['actions'].abs().max() < 2.0 and deterministic.mean() > 1.5
    z = torch.atanh(out['actions'] / 2.0) - torch.atanh(deterministic / 2.0)
    assert z.mean(0).abs().max() < 0.05
    np.testing.assert_allclose(z.std(0).numpy(), std, rtol=0.05)
    assert torch.isfinite(out['log_probs']).all()
    # The control-loop actor samples PPO's Gaussian: it refuses a SAC student by reason.
    with pytest.raises(ValueError, match='SAC student .* control-loop actor samples PPO'):
        GaussianSampler(model, np.random.default_rng(0))


def test_chunks_become_replay_transitions_exactly(tmp_path, robot):
    trainer = sac_trainer(tmp_path, robot, sac={'learning_starts': 10 ** 6})
    actor = onnx_actor(trainer)
    act_with_export(trainer, actor, robot)
    # 0.2 s episodes (10 steps) and 8-step chunks: the second chunk has time-outs.
    chunks = [actor.collect(), actor.collect()]
    assert not chunks[0].truncated.any() and chunks[1].truncated.any()
    for c in chunks:
        assert trainer.offer(bytes(encode_chunk(c))) is None
    metrics = trainer.iterate()
    assert metrics['updates'] == 0.0  # before learning_starts
    buf = trainer.learner.alg.storage
    t, n = chunks[0].num_steps, chunks[0].num_envs
    assert len(buf) == 2 * t * n and buf.num_envs == 1
    assert trainer.learner.alg.num_transitions == 2 * t * n
    row = 0
    for c in chunks:
        final = iter(range(int(c.truncated.sum())))
        finals = {}
        for step in range(t):
            for w in range(n):
                if c.truncated[step, w]:
                    finals[step, w] = next(final)
        for w in range(n):  # world-major rows
            for step in range(t):
                obs = c.obs['policy'][step, w]
                if c.truncated[step, w]:
                    nxt = c.final_obs['policy'][finals[step, w]]
                elif step + 1 < t:
                    nxt = c.obs['policy'][step + 1, w]
                else:
                    nxt = c.last_obs['policy'][w]
                np.testing.assert_array_equal(buf.obs['policy'][row, 0].numpy(), obs)
                np.testing.assert_array_equal(buf.next_obs['policy'][row, 0].numpy(), nxt)
                np.testing.assert_allclose(buf.actions[row, 0].numpy(),
                                           c.actions[step, w] / 2.0, atol=1e-6)
                assert buf.rewards[row, 0] == c.rewards[step, w]
                assert buf.terminated[row, 0] == float(c.terminated[step, w])
                # Episode ends and the chunk's end stop an n-step window.
                assert buf.dones[row, 0] == float(c.terminated[step, w] or c.truncated[step, w]
                                                  or step == t - 1)
                row += 1
    assert buf.actions.abs().max() <= 1.0


def test_live_sac_updates_after_learning_starts_and_learns_from_lagged_chunks(tmp_path, robot):
    """utd_ratio gradient steps per new transition once learning_starts are stored; a chunk
    two versions old is learnt from as it is (off-policy: no importance weights)."""
    trainer = sac_trainer(tmp_path, robot, max_policy_lag=2)
    actor = onnx_actor(trainer)
    act_with_export(trainer, actor, robot)
    per_chunk = trainer.cfg.runner.num_steps_per_env * 4
    updates = []
    for _ in range(5):
        trainer.offer(bytes(encode_chunk(actor.collect())))
        updates.append(trainer.iterate()['updates'])
        act_with_export(trainer, actor, robot)
    # 32 transitions per chunk, learning_starts 100: updates from the 4th chunk, 4 per chunk.
    assert updates == [0.0, 0.0, 0.0, per_chunk * 0.125, per_chunk * 0.125]
    before = copy.deepcopy(trainer.learner.policy.state_dict())
    lagged = actor.collect()  # acted by the current version, arrives two versions later
    for _ in range(2):
        trainer.offer(bytes(encode_chunk(actor.collect())))
        trainer.iterate()
        act_with_export(trainer, actor, robot)
    assert trainer.offer(bytes(encode_chunk(lagged))) is None  # within max_policy_lag 2
    metrics = trainer.iterate()
    assert metrics['policy_lag'] == 2.0 and metrics['importance_weight'] == 1.0
    assert metrics['updates'] == per_chunk * 0.125 and np.isfinite(metrics['critic_loss'])
    after = trainer.learner.policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    actor.env.close()


def test_live_sac_resume_with_the_replay_buffer_is_exact(tmp_path, robot):
    """Two trainers fed the same chunks: one uninterrupted, one resumed (resume=True) from a
    copy of its run directory half way; weights, temperature, replay and counters end equal."""
    import shutil
    trainer = sac_trainer(tmp_path, robot, name='a')
    actor = onnx_actor(trainer)
    act_with_export(trainer, actor, robot)
    chunks = []
    for i in range(6):
        chunks.append(decode_chunk(bytes(encode_chunk(actor.collect())), trainer.learner.spec))
        if i < 4:
            trainer.offer(bytes(encode_chunk(chunks[-1])))
            trainer.iterate()  # checkpoints every iteration
            act_with_export(trainer, actor, robot)
    actor.env.close()
    shutil.copytree(tmp_path / 'a', tmp_path / 'b')
    resumed = sac_trainer(tmp_path, robot, name='b', resume=True)
    assert resumed.resumed_from is not None and resumed.learner.iteration == 4
    for t in (trainer, resumed):
        for chunk in chunks[4:]:
            t.learner.learn([chunk])
    a, b = trainer.learner, resumed.learner
    assert b.iteration == a.iteration == 6 and b.alg.num_updates == a.alg.num_updates > 0
    for k, v in a.policy.state_dict().items():
        assert torch.equal(v, b.policy.state_dict()[k]), k
    for k, v in a.alg.target_critic.state_dict().items():
        assert torch.equal(v, b.alg.target_critic.state_dict()[k]), k
    assert torch.equal(a.alg.log_ent_coef, b.alg.log_ent_coef)
    assert len(a.alg.storage) == len(b.alg.storage) == 6 * 32
    assert torch.equal(a.alg.storage.next_obs['policy'], b.alg.storage.next_obs['policy'])
    for t in (trainer, resumed):
        t.finish(stopped=True)
