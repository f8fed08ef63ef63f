"""The control loop as an actor, without ROS: the policy node's controller in training mode and
the sim node's TrainingSession + ControlLoopActor wired in-process exactly as the nodes wire
them (records through their message codec). Chunks have the batched actors' layout and pass
the trainer's gate; rewards, time-outs and episode logs are the env's; a missing or mismatched
step discards the chunk in progress (counted by cause) and no chunk spans it."""

import copy

import numpy as np
import pytest
import torch

from claw_rl_ros.core.control.loop_record import pack_record, PolicyRecord, unpack_record
from claw_rl_ros.core.control.policy_controller import PolicyController
from claw_rl_ros.core.learning.networks import gaussian_log_prob
from claw_rl_ros.core.live.batched_actor import BatchedActor
from claw_rl_ros.core.live.live_trainer import LiveTrainer
from claw_rl_ros.core.live.loop_actor import CAUSES, ControlLoopActor
from claw_rl_ros.core.live.rollout_chunk import encode_chunk
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from claw_rl_ros.core.sim.training_session import TrainingSession
from test_training import tiny_config

T = 8  # tiny_config's num_steps_per_env


def make_trainer(tmp_path, robot, episode_length_s=2.0, **kwargs):
    cfg = tiny_config(env={'episode_length_s': episode_length_s})
    return LiveTrainer(cfg, robot, tmp_path / 'run', tensorboard=False, **kwargs)


def obs_slice(robot, name):
    s = next(s for s in robot.policy_obs.slices if s.name == name)
    return slice(s.start, s.start + s.size), s.scale


class Loop:
    """policy side (PolicyController, training mode) + sim side (TrainingSession +
    ControlLoopActor), one control step per tick() as in lockstep."""

    def __init__(self, robot, cfg, model: bytes, noise=False, seed=1):
        self.robot = robot
        self.session = TrainingSession(robot, cfg.env, randomization=True, pushes=True,
                                       noise=noise, seed=seed)
        self.ctrl = PolicyController(robot, training=True, seed=seed)
        sha, reason = self.ctrl.offer(model)
        assert reason is None, reason
        self.ctrl.activate(sha)
        self.actor = ControlLoopActor(self.session, cfg.runner.num_steps_per_env)
        self.records: list[PolicyRecord] = []  # every record the policy made, in tick order
        self.held: PolicyRecord | None = None

    def deliver(self, record):
        layout, data = pack_record(record)
        self.actor.add_record(unpack_record(layout, data, len(record.obs), len(record.action)))

    def tick(self, drop=False, edit=None, hold=False):
        """One control step; the record is dropped, edited, or held back (delivered late, at
        the next tick, before that tick's own)."""
        s, r = self.session, self.session.readings()
        self.ctrl.on_command(*s.commands)
        xyzw = (r.imu_quat[1], r.imu_quat[2], r.imu_quat[3], r.imu_quat[0])
        self.ctrl.on_imu(r.time, xyzw, r.imu_gyro, r.time)
        targets = self.ctrl.on_joint_state(r.time, self.robot.joint_names, r.joint_pos,
                                           r.joint_vel, r.time)
        record = self.ctrl.take_record()
        assert record is not None  # autostart: every tick is an RL tick
        self.records.append(record)
        if self.held is not None:
            self.deliver(self.held)
            self.held = None
        if hold:
            self.held = record
        elif not drop:
            self.deliver(edit(copy.deepcopy(record)) if edit else record)
        s.set_targets(targets, r.time)
        return self.actor.step(r.time, s.active_targets(r.time))

    def run(self, ticks, per_tick=None):
        """Chunks of ``ticks`` ticks; per_tick: {tick index: tick() kwargs}."""
        chunks = []
        for i in range(ticks):
            chunk = self.tick(**(per_tick or {}).get(i, {}))
            if chunk is not None:
                chunks.append(chunk)
        return chunks

    def ticks_of(self, chunk):
        """The tick index of each step of a chunk (its policy observation is the record's)."""
        out = []
        for row in chunk.obs['policy'][:, 0]:
            hits = [i for i, r in enumerate(self.records)
                    if np.array_equal(np.float32(r.obs), row)]
            assert len(hits) == 1, hits
            out.append(hits[0])
        return out


@pytest.fixture
def trainer(tmp_path, robot):
    t = make_trainer(tmp_path, robot)
    yield t
    t.finish(stopped=True)


def test_record_round_trips_its_labelled_layout_and_refuses_what_does_not_fit():
    rng = np.random.default_rng(0)
    record = PolicyRecord(stamp=12.34, policy_version=7, model_sha='00ab12cd34ef',
                          gait_phase=0.25, log_prob=-3.5, obs=rng.normal(size=5),
                          action=rng.normal(size=3), mu=rng.normal(size=3),
                          sigma=np.full(3, 0.5), last_action=rng.normal(size=3),
                          target=rng.normal(size=3))
    layout, data = pack_record(record)
    assert [name for name, _ in layout] == ['stamp', 'policy_version', 'model_sha',
                                            'gait_phase', 'log_prob', 'obs', 'action', 'mu',
                                            'sigma', 'last_action', 'target']
    back = unpack_record(layout, data, 5, 3)
    assert (back.policy_version, back.model_sha, back.stamp) == (7, '00ab12cd34ef', 12.34)
    for name in ('obs', 'action', 'mu', 'sigma', 'last_action', 'target'):
        np.testing.assert_array_equal(getattr(back, name), getattr(record, name))
    with pytest.raises(ValueError, match='record layout'):
        unpack_record(layout, data, 6, 3)  # another robot's observation size
    with pytest.raises(ValueError, match='has 24 values, its layout 25'):
        unpack_record(layout, data[:-1], 5, 3)
    bad = data.copy()
    bad[3] = np.nan
    with pytest.raises(ValueError, match='NaN'):
        unpack_record(layout, bad, 5, 3)


def test_training_mode_refuses_a_model_without_the_trainers_metadata(trainer, robot, tmp_path):
    from claw_rl_ros.core.export.onnx_export import export_onnx
    from claw_rl_ros.core.control.model_swap import ModelRejected
    path = tmp_path / 'plain.onnx'
    export_onnx(trainer.learner.policy, robot, path)  # a deployable model, no action_std
    ctrl = PolicyController(robot, training=True)
    with pytest.raises(ModelRejected, match='training mode: .*no action_std, policy_version'):
        ctrl.load_path(path)
    assert ctrl.policy is None
    deploy = PolicyController(robot)
    deploy.load_path(path)  # served as usual outside training mode
    assert deploy.policy is not None


def test_loop_chunks_have_the_batched_layout_pass_the_gate_and_are_learnt_with_batched_ones(
        trainer, robot):
    data = trainer.export()
    cfg = trainer.cfg
    loop = Loop(robot, cfg, data)
    chunks = loop.run(4 * T + 1)
    assert len(chunks) == 4 and not loop.actor.discarded_steps
    batched = BatchedActor(VecLocomotionEnv(copy.deepcopy(cfg.env)),
                           copy.deepcopy(trainer.learner.policy), T, '/a0')
    batched.load_policy(trainer.learner.policy.state_dict(), 0, loop.ctrl.sampler.model_sha)
    reference = batched.collect()
    batched.env.close()
    std = trainer.learner.policy.log_std.detach().exp()
    for i, chunk in enumerate(chunks):
        assert trainer.offer(bytes(encode_chunk(chunk))) is None  # the trainer's own gate
        got = trainer.pending[-1]
        assert (got.actor_id, got.seq) == ('control_loop', i + 1)
        assert (got.num_steps, got.num_envs) == (T, 1)
        assert got.obs_dims == reference.obs_dims and got.num_actions == reference.num_actions
        assert (got.policy_version, got.model_sha) == (0, loop.ctrl.sampler.model_sha)
        # Noise off: the policy acted on exactly the env's noise-free observation.
        np.testing.assert_allclose(got.obs['policy'], got.obs['policy_noise_free'], atol=1e-5)
        # Sampled around the mean with the model's std; log-probs as the learner computes them.
        torch.testing.assert_close(torch.from_numpy(np.array(got.sigma[:, 0])),
                                   std.expand(T, -1))
        assert np.abs(got.actions - got.mu).min() > 0
        expected = gaussian_log_prob(*(torch.from_numpy(np.array(x[:, 0])) for x in (
            got.actions, got.mu, got.sigma)))
        np.testing.assert_allclose(got.log_probs[:, 0], expected.numpy(), rtol=1e-5)
        # Consecutive steps; the bootstrap is the next chunk's first observation.
        assert loop.ticks_of(got) == list(range(i * T, (i + 1) * T))
        np.testing.assert_array_equal(got.last_obs['policy'][0],
                                      np.float32(loop.records[(i + 1) * T].obs))
    # A 1-world chunk is learnt side by side with a batched actor's.
    assert trainer.offer(bytes(encode_chunk(reference))) is None
    metrics = trainer.iterate()
    assert metrics['chunks'] == 5 and metrics['actors'] == 2
    assert trainer.learner.alg.storage.num_envs == 4 + cfg.env.num_envs
    assert np.isfinite(metrics['value_loss'])
    loop.session.close()


def test_rewards_time_outs_and_episode_logs_are_the_envs(tmp_path, robot):
    trainer = make_trainer(tmp_path, robot, episode_length_s=0.1)  # 5-step episodes
    loop = Loop(robot, trainer.cfg, trainer.export())
    chunks = loop.run(5 * T + 1)
    assert len(chunks) == 5 and not loop.actor.discarded_steps
    rewards = np.concatenate([c.rewards[:, 0] for c in chunks])
    done = np.concatenate([(c.terminated | c.truncated)[:, 0] for c in chunks])
    returns = np.concatenate([c.episodes['return'] for c in chunks if c.episodes])
    lengths = np.concatenate([c.episodes['length_s'] for c in chunks if c.episodes])
    ends = np.flatnonzero(done)
    assert len(ends) == len(returns) >= 7
    # Every episode that started inside the run sums to the return the env logged.
    for k in range(1, len(ends)):
        np.testing.assert_allclose(rewards[ends[k - 1] + 1:ends[k] + 1].sum(), returns[k],
                                   rtol=1e-5, atol=1e-6)
        assert lengths[k] == pytest.approx((ends[k] - ends[k - 1]) * robot.control_dt)
    keys = set(next(c for c in chunks if c.episodes).episodes)
    assert {'return', 'length_s'} < keys and all(k.startswith('reward/') for k in
                                                 keys - {'return', 'length_s'})
    last, last_scale = obs_slice(robot, 'last_action')
    pos, _ = obs_slice(robot, 'joint_pos')
    for c in chunks:
        steps = np.flatnonzero(c.truncated[:, 0])
        assert len(c.final_obs['policy_noise_free']) == len(steps)
        for row, t in zip(c.final_obs['policy_noise_free'], steps):
            # The state the episode ended in: after the step's action, before the reset.
            np.testing.assert_allclose(row[last], np.clip(c.actions[t, 0], -10, 10) *
                                       last_scale, atol=1e-5)
            after = c.obs['policy_noise_free'][t + 1, 0] if t + 1 < T else c.last_obs[
                'policy_noise_free'][0]
            assert np.abs(row[pos] - after[pos]).max() > 1e-3
    loop.session.close()
    trainer.finish(stopped=True)


def test_a_dropped_record_discards_the_chunk_in_progress_and_no_chunk_spans_it(trainer, robot):
    loop = Loop(robot, trainer.cfg, trainer.export())
    chunks = loop.run(4 * T, {T + 5: {'drop': True}})
    actor = loop.actor
    assert actor.discarded.to_dict() == {**{c: 0 for c in CAUSES}, 'missing_record': 1}
    assert actor.discarded_steps == 5  # ticks T .. T + 4 were in progress
    assert [c.seq for c in chunks] == [1, 3, 4]  # the gap in seq: a discard
    spans = [loop.ticks_of(c) for c in chunks]
    assert spans == [list(range(0, T)), list(range(T + 6, 2 * T + 6)),
                     list(range(2 * T + 6, 3 * T + 6))]
    for chunk in chunks:
        assert trainer.offer(bytes(encode_chunk(chunk))) is None
    loop.session.close()


COMMANDS = slice(6, 9)  # velocity_commands in claw_quadruped's policy observation


def test_a_late_record_is_never_paired_with_a_later_state(trainer, robot):
    loop = Loop(robot, trainer.cfg, trainer.export())
    # Tick T + 2's record arrives only at tick T + 3, whose own record is lost.
    chunks = loop.run(3 * T, {T + 2: {'hold': True}, T + 3: {'drop': True}})
    assert loop.actor.discarded.to_dict() == {**{c: 0 for c in CAUSES}, 'missing_record': 2}
    assert [loop.ticks_of(c) for c in chunks] == [list(range(0, T)),
                                                  list(range(T + 4, 2 * T + 4))]
    loop.session.close()


def shift_target(record):
    record.target = record.target + 0.01
    return record


def shift_command(record):
    record.obs[COMMANDS] += 0.5
    return record


def new_model(record):
    record.policy_version, record.model_sha = 1, 'f' * 12
    return record


@pytest.mark.parametrize('cause, edit, noise, events, lost', [
    ('command_mismatch', shift_target, False, 1, 4),
    ('obs_mismatch', shift_command, True, 1, 4),  # noise on: the command is still exact
    # The odd step starts a chunk of its own, discarded at the next step (the old model).
    ('model_changed', new_model, False, 2, 4),
])
def test_a_mismatched_step_discards_the_chunk_in_progress_by_cause(trainer, robot, cause, edit,
                                                                   noise, events, lost):
    assert obs_slice(robot, 'velocity_commands')[0] == COMMANDS
    loop = Loop(robot, trainer.cfg, trainer.export(), noise=noise)
    chunks = loop.run(3 * T, {T + 3: {'edit': edit}})
    actor = loop.actor
    assert actor.discarded.to_dict() == {**{c: 0 for c in CAUSES}, cause: events}
    assert actor.discarded_steps == lost - (cause != 'model_changed')
    assert [loop.ticks_of(c) for c in chunks] == [list(range(0, T)),
                                                  list(range(T + 4, 2 * T + 4))]
    for chunk in chunks:
        assert trainer.offer(bytes(encode_chunk(chunk))) is None
    loop.session.close()


def test_a_reset_service_call_discards_the_chunk_in_progress(trainer, robot):
    loop = Loop(robot, trainer.cfg, trainer.export())
    loop.run(T + 3)
    loop.session.reset()
    chunks = loop.run(2 * T)
    assert loop.actor.discarded['reset'] == 1 and loop.actor.discarded_steps == 3
    assert len(chunks) == 1
    loop.session.close()


def test_control_loop_chunks_start_no_iteration_ahead_of_the_batched_actors(tmp_path, robot):
    now = [100.0]
    trainer = make_trainer(tmp_path, robot, chunks_per_iteration=1, batch_timeout_s=5.0,
                           min_chunk_envs=2, clock=lambda: now[0])
    loop = Loop(robot, trainer.cfg, trainer.export())
    small = [bytes(encode_chunk(c)) for c in loop.run(2 * T + 1)]
    for payload in small:
        assert trainer.offer(payload) is None
    now[0] += 60.0
    assert not trainer.ready()  # neither by count nor by timeout
    batched = BatchedActor(VecLocomotionEnv(copy.deepcopy(trainer.cfg.env)),
                           copy.deepcopy(trainer.learner.policy), T, '/a0')
    batched.load_policy(trainer.learner.policy.state_dict(), 0, loop.ctrl.sampler.model_sha)
    assert trainer.offer(bytes(encode_chunk(batched.collect()))) is None
    assert trainer.ready()
    assert trainer.iterate()['chunks'] == 3  # the small ones are learnt from too
    batched.env.close()
    loop.session.close()
    trainer.finish(stopped=True)
    with pytest.raises(ValueError, match='min_chunk_envs'):
        make_trainer(tmp_path / 'x', robot, min_chunk_envs=0)
