"""Actor + chunk learner in one process reproduce the offline runner bit for bit (through the
encoded chunk), and the learner accepts several actors' chunks and critic-less actors."""

import copy
import hashlib

import numpy as np
import pytest
import torch

from claw_rl_ros.core.learning.runner import OnPolicyRunner
from claw_rl_ros.core.live.batched_actor import BatchedActor
from claw_rl_ros.core.live.chunk_filter import ChunkGate, PolicyLagFilter
from claw_rl_ros.core.live.chunk_learner import ChunkLearner, state_sha
from claw_rl_ros.core.live.rollout_chunk import decode_chunk, encode_chunk
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from test_training import params_of, tiny_config

# Short episodes so that time-outs (bootstrapped from final observations) happen within three
# iterations of 8 steps.
SHORT = {'env': {'episode_length_s': 0.2}}
EXACT = ('value_loss', 'surrogate_loss', 'entropy', 'approx_kl', 'distillation_loss',
         'learning_rate', 'action_std', 'mean_reward', 'diverged', 'tracking_error/lin_vel_x',
         'tracking_error/ang_vel_yaw')


class LocalActorLearner:
    """One batched actor and a chunk learner wired in-process, chunks through the codec."""

    def __init__(self, cfg, actors=1, generator_shared=True):
        cfg.env.seed = cfg.runner.seed
        self.envs = [VecLocomotionEnv(copy.deepcopy(cfg.env)) for _ in range(actors)]
        env = self.envs[0]
        self.learner = ChunkLearner(cfg, env.obs_dims, env.num_actions)
        self.lag = PolicyLagFilter()
        self.gate = ChunkGate(self.learner.spec, self.lag)
        gen = self.learner.generator if generator_shared else None
        self.actors = [BatchedActor(e, copy.deepcopy(self.learner.policy),
                                    cfg.runner.num_steps_per_env, f'actor_{i}', generator=gen,
                                    seed=i) for i, e in enumerate(self.envs)]

    def publish(self):
        learner = self.learner
        sha = state_sha(learner.policy)[:12]
        self.lag.publish(learner.policy_version, sha)
        for actor in self.actors:
            actor.load_policy(learner.policy.state_dict(), learner.policy_version, sha)

    def iteration(self):
        self.publish()
        self.chunks = [self.gate.admit(encode_chunk(a.collect())) for a in self.actors]
        return self.learner.learn(self.chunks)

    def close(self):
        for env in self.envs:
            env.close()


# A trunk lower than 0.25 m ends the episode (standing height 0.27 m): with the tiny random
# policy about 25 terminations beside 17 time-outs in three iterations, so a path that handed a
# fall over as a time-out (bootstrapping through it) or the other way round differs.
FALLS = {'env': {'episode_length_s': 0.2, 'termination': {'min_base_height': 0.25}}}
# A student with memory: its windows travel as frames and are rebuilt by the learner.
MEMORY = {'env': {'episode_length_s': 0.2, 'termination': {'min_base_height': 0.25},
                  'policy_history': 4}}


@pytest.mark.parametrize('distillation, env', [({}, SHORT), ({'teacher_mode': 'ema',
                                                              'alpha': 1.0}, SHORT),
                                               ({}, FALLS), ({}, MEMORY)])
def test_actor_and_learner_reproduce_the_offline_runner(tmp_path, distillation, env):
    runner = OnPolicyRunner(tiny_config(**env, distillation=distillation), tmp_path)
    offline = [runner.train_one_epoch() for _ in range(3)]
    live = LocalActorLearner(tiny_config(**env, distillation=distillation))
    online = [live.iteration() for _ in range(3)]
    assert torch.equal(params_of(runner), torch.cat([p.detach().flatten() for p in
                                                     live.learner.policy.parameters()]))
    for a, b in zip(runner.policy.state_dict().values(),
                    live.learner.policy.state_dict().values()):
        assert torch.equal(a, b)  # normalisers too
    if distillation:
        assert torch.equal(torch.cat([p.flatten() for p in runner.alg.teacher.parameters()]),
                           torch.cat([p.flatten() for p in live.learner.alg.teacher.parameters()]))
        assert online[-1]['distillation_loss'] > 0
        assert online[-1]['kl_to_teacher'] == offline[-1]['kl_to_teacher']
    for i, (off, on) in enumerate(zip(offline, online)):
        for key in EXACT:
            assert off[key] == on[key], (i, key)
        # Episode logs travel as float32 (the runner keeps float64 sums).
        expected = pytest.approx(off['mean_episode_return'], rel=1e-5, nan_ok=True)
        assert on['mean_episode_return'] == expected
        assert on['total_steps'] == off['total_steps']
    # The rollouts did contain time-outs (so the bootstrap from final observations was used),
    # and with FALLS terminations too (episodes shorter than 0.2 s).
    lengths = np.asarray(live.learner.episodes.lengths)
    assert lengths.size and np.isclose(lengths, 0.2).any()
    assert (lengths < 0.2 - 1e-6).sum() >= (5 if env is not SHORT else 0)
    assert live.gate.counters.accepted == 3 and live.gate.counters.total_dropped == 0
    assert live.learner.policy_version == 3
    # The memory's windows came as frames (and were rebuilt), the others whole.
    assert live.chunks[0].windows == ({'policy': 4} if env is MEMORY else {})
    runner.close()
    live.close()


def test_two_actors_fill_one_batch_side_by_side():
    live = LocalActorLearner(tiny_config(**SHORT), actors=2, generator_shared=False)
    metrics = live.iteration()
    assert metrics['chunks'] == 2 and metrics['total_steps'] == 2 * 16 * 8
    assert live.learner.alg.storage.num_envs == 32
    # The second actor's worlds occupy columns 16..31 of the storage.
    live.publish()
    chunk = live.actors[1].collect()
    live.learner.fill([live.actors[0].collect(), chunk])
    np.testing.assert_array_equal(live.learner.alg.storage.obs['policy'][:, 16:].numpy(),
                                  chunk.obs['policy'])
    live.close()


def test_actor_without_critic_gets_values_from_the_learner():
    live = LocalActorLearner(tiny_config(**SHORT))
    live.publish()
    live.actors[0].collect()  # reach the first time-outs (step 10) in the next chunk
    chunk = decode_chunk(encode_chunk(live.actors[0].collect()), live.learner.spec)
    assert chunk.truncated.any()
    live.learner.fill([chunk])
    with_values = (live.learner.alg.storage.values.clone(),
                   live.learner.alg.storage.rewards.clone())
    chunk.values, chunk.final_values = None, None
    live.learner.fill([decode_chunk(encode_chunk(chunk), live.learner.spec)])
    for expected, got in zip(with_values, (live.learner.alg.storage.values,
                                           live.learner.alg.storage.rewards)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # ...and the bootstrap really changed the time-out rewards.
    mask = torch.from_numpy(chunk.truncated)
    assert not torch.equal(with_values[1][mask], torch.from_numpy(chunk.rewards)[mask])
    live.close()


def test_onnx_actor_acts_with_the_exported_student(tmp_path):
    from claw_rl_ros.core.control.model_swap import validate_model
    from claw_rl_ros.core.live.batched_actor import OnnxBehaviour
    live = LocalActorLearner(tiny_config(**SHORT))
    live.iteration()
    learner, actor = live.learner, live.actors[0]
    data = learner.export_student(actor.env.robot, tmp_path / 'student.onnx')
    behaviour = OnnxBehaviour(validate_model(data, actor.env.robot))
    assert behaviour.policy_version == 1
    torch.testing.assert_close(behaviour.std, learner.policy.log_std.detach().exp())
    live.lag.publish(1, hashlib.sha256(data).hexdigest())
    actor.use_behaviour(behaviour)
    chunk = live.gate.admit(encode_chunk(actor.collect()))
    assert chunk.values is None and chunk.final_values is None
    assert (chunk.model_sha, chunk.policy_version) == (behaviour.model_sha, 1)
    # The behaviour mean is the learner's student mean on the same observations.
    obs = {g: torch.from_numpy(np.array(v[0])) for g, v in chunk.obs.items()}
    mean, _ = learner.policy.action_mean_std(obs)
    np.testing.assert_allclose(chunk.mu[0], mean.detach().numpy(), atol=1e-5)
    metrics = learner.learn([chunk])
    assert np.isfinite(metrics['value_loss']) and learner.policy_version == 2
    live.close()


def test_learner_checkpoint_resumes_the_next_update_exactly(tmp_path):
    # The actor samples with its own generator: the learner's RNG state is all that is saved.
    live = LocalActorLearner(tiny_config(**SHORT), generator_shared=False)
    live.iteration()
    path = live.learner.save(tmp_path, keep=2)
    live.publish()
    chunk = decode_chunk(encode_chunk(live.actors[0].collect()), live.learner.spec)
    resumed = ChunkLearner(tiny_config(**SHORT), live.learner.obs_dims,
                           live.learner.num_actions)
    resumed.load(path)
    assert resumed.policy_version == 1 and resumed.total_steps == live.learner.total_steps
    expected = live.learner.learn([chunk])
    got = resumed.learn([chunk])
    for key in ('value_loss', 'surrogate_loss', 'learning_rate'):
        assert got[key] == expected[key], key
    assert torch.equal(params_of(live.learner), params_of(resumed))
    live.close()


def test_lagged_chunk_is_corrected_against_the_proximal_policy():
    """A chunk acted by the previous model: behaviour replaced by the learner's current policy,
    advantages weighted by min(1, pi_prox / pi_behaviour); a current chunk beside it is kept
    as it came (weights 1)."""
    from claw_rl_ros.core.learning.networks import gaussian_log_prob
    live = LocalActorLearner(tiny_config(**SHORT), actors=2, generator_shared=False)
    learner = live.learner
    live.iteration()  # version 0 -> 1
    old, current = live.actors
    learner_sha = state_sha(learner.policy)[:12]
    current.load_policy(learner.policy.state_dict(), learner.policy_version, learner_sha)
    spec = learner.spec
    lagged = decode_chunk(encode_chunk(old.collect()), spec)  # acted by version 0
    fresh = decode_chunk(encode_chunk(current.collect()), spec)  # acted by version 1
    assert (lagged.policy_version, fresh.policy_version) == (0, 1)
    learner.fill([lagged, fresh])
    storage = learner.alg.storage
    n = lagged.num_envs
    with torch.no_grad():
        obs = {g: torch.from_numpy(np.array(v)).flatten(0, 1) for g, v in lagged.obs.items()}
        mu, sigma = learner.policy.action_mean_std(obs)
        actions = torch.from_numpy(np.array(lagged.actions)).flatten(0, 1)
        prox = gaussian_log_prob(actions, mu, sigma).reshape(lagged.log_probs.shape)
    assert torch.allclose(storage.mu[:, :n].flatten(0, 1), mu, atol=1e-6)
    assert torch.allclose(storage.sigma[:, :n].flatten(0, 1), sigma)
    assert torch.allclose(storage.log_probs[:, :n], prox, atol=1e-5)
    expected = torch.exp(prox - torch.from_numpy(np.array(lagged.log_probs))).clamp(max=1.0)
    assert torch.allclose(storage.weights[:, :n], expected, atol=1e-5)
    assert (storage.weights[:, :n] < 0.999).any() and (storage.weights[:, :n] == 1.0).any()
    # The current chunk is used exactly as acted.
    assert torch.equal(storage.weights[:, n:], torch.ones_like(storage.weights[:, n:]))
    assert torch.equal(storage.mu[:, n:], torch.from_numpy(np.array(fresh.mu)))
    assert torch.equal(storage.log_probs[:, n:], torch.from_numpy(np.array(fresh.log_probs)))
    metrics = learner.learn([lagged, fresh])
    assert 0.0 < metrics['importance_weight'] < 1.0
    assert metrics['policy_lag'] == 0.5
    assert learner.alg.storage.weights is None  # cleared with the storage
    live.close()


@pytest.mark.parametrize('in_flight', [1, 2])
def test_actor_credit_keeps_it_at_most_in_flight_chunks_ahead(in_flight):
    """A chunk spends a credit, a newer model version gives one back (capped), a restarted
    trainer's model (same version, other sha) refills; so an actor collects one chunk per
    version on average however slow the trainer is."""
    cfg = tiny_config(env={'num_envs': 2})
    env = VecLocomotionEnv(cfg.env)
    learner = ChunkLearner(cfg, env.obs_dims, env.num_actions)
    actor = BatchedActor(env, copy.deepcopy(learner.policy), 2, chunks_in_flight=in_flight)
    weights = learner.policy.state_dict()
    assert not actor.may_collect()  # no model yet
    actor.load_policy(weights, 0, 'sha0')

    def burst():
        n = 0
        while actor.may_collect() and n < 10:
            actor.collect()
            n += 1
        return n

    assert burst() == in_flight
    actor.load_policy(weights, 0, 'sha0')  # the same model again: no credit
    assert burst() == 0
    for version in range(1, 4):  # a slow trainer: one new version at a time
        actor.load_policy(weights, version, f'sha{version}')
        assert burst() == 1
    actor.load_policy(weights, 9, 'sha9')  # versions skipped: credit capped
    assert burst() == in_flight
    actor.load_policy(weights, 9, 'other')  # restarted trainer re-exported version 9
    assert burst() == in_flight
    env.close()
    with pytest.raises(ValueError, match='chunks_in_flight'):
        BatchedActor(env, None, 2, chunks_in_flight=0)


def test_actor_without_a_new_model_for_the_credit_timeout_collects_one_more_chunk():
    """A lost chunk must not leave trainer and actor waiting for each other: after
    credit_timeout_s without a new model since the last chunk, one credit comes back."""
    cfg = tiny_config(env={'num_envs': 2})
    env = VecLocomotionEnv(cfg.env)
    learner = ChunkLearner(cfg, env.obs_dims, env.num_actions)
    now = [100.0]
    actor = BatchedActor(env, copy.deepcopy(learner.policy), 2, chunks_in_flight=2,
                         credit_timeout_s=5.0, clock=lambda: now[0])
    now[0] += 60.0
    assert not actor.may_collect() and actor.regrants == 0  # no model: no timeout either
    actor.load_policy(learner.policy.state_dict(), 0, 'sha0')
    actor.collect(), actor.collect()
    now[0] += 4.9
    assert not actor.may_collect()
    now[0] += 0.1  # 5 s after the last chunk: one credit, not chunks_in_flight
    assert actor.may_collect() and actor.regrants == 1
    actor.collect()
    assert not actor.may_collect()
    now[0] += 3.0
    actor.load_policy(learner.policy.state_dict(), 1, 'sha1')  # a model restarts the wait
    actor.collect()
    now[0] += 4.0
    assert not actor.may_collect() and actor.regrants == 1
    now[0] += 1.0
    assert actor.may_collect() and actor.regrants == 2
    env.close()
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match=rf'credit_timeout_s {bad!r} must be > 0'):
            BatchedActor(env, None, 2, credit_timeout_s=bad)
