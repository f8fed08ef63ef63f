"""LiveTrainer without ROS: when a batch is due (full, or the oldest chunk waited too long),
drops counted by cause, the offline trainer's outputs (metrics.csv, TensorBoard, checkpoints,
learning_curve.png, summary.json, student.onnx + evaluation), the budget, and resume."""

import copy
import csv
import hashlib
import json

import numpy as np
import pytest
import torch

from claw_rl_ros.core.config import ConfigError
from claw_rl_ros.core.learning import checkpoint as ckpt
from claw_rl_ros.core.live.batched_actor import BatchedActor
from claw_rl_ros.core.live.live_trainer import LiveTrainer
from claw_rl_ros.core.live.rollout_chunk import encode_chunk
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from test_training import tiny_config


class Clock:
    """A hand-moved monotonic clock."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def make_trainer(tmp_path, robot, clock, **kwargs):
    cfg = tiny_config(env={'episode_length_s': 0.2}, **kwargs.pop('cfg', {}))
    return LiveTrainer(cfg, robot, tmp_path / 'run', clock=clock, tensorboard=True,
                       **kwargs)


class Actor:
    """A batched actor acting with the trainer's current weights, tagged with its export."""

    def __init__(self, trainer, seed=0):
        cfg = copy.deepcopy(trainer.cfg.env)
        cfg.seed = seed
        self.env = VecLocomotionEnv(cfg)
        self.actor = BatchedActor(self.env, copy.deepcopy(trainer.learner.policy),
                                  trainer.cfg.runner.num_steps_per_env, f'/a{seed}', seed=seed)

    def chunk(self, trainer, sha: str) -> bytes:
        learner = trainer.learner
        self.actor.load_policy(learner.policy.state_dict(), learner.policy_version, sha[:12])
        return bytes(encode_chunk(self.actor.collect()))


def push(trainer) -> str:
    return hashlib.sha256(trainer.export()).hexdigest()


def iterate_with_one_actor(trainer, clock, iterations: int, step_s: float = 1.0) -> None:
    """``iterations`` iterations, each on one chunk acted by the pushed student, the clock
    moved ``step_s`` before each."""
    actor = Actor(trainer)
    for _ in range(iterations):
        trainer.offer(actor.chunk(trainer, push(trainer)))
        clock.now += step_s
        trainer.iterate()
    actor.env.close()


def rows(run_dir):
    with open(run_dir / 'metrics.csv', newline='') as f:
        return list(csv.DictReader(f))


def test_a_batch_is_due_when_full_or_when_its_oldest_chunk_waited(tmp_path, robot):
    clock = Clock()
    trainer = make_trainer(tmp_path, robot, clock, chunks_per_iteration=2, batch_timeout_s=5.0)
    sha = push(trainer)
    actor = Actor(trainer)
    assert not trainer.ready()
    assert trainer.offer(actor.chunk(trainer, sha)) is None
    clock.now += 4.9
    assert not trainer.ready()
    clock.now += 0.2  # the other actor died: learn from the one chunk at hand
    assert trainer.ready()
    metrics = trainer.iterate()
    assert metrics['chunks'] == 1 and metrics['actors'] == 1
    assert metrics['steps_per_s'] == pytest.approx(16 * 8 / 5.1)
    assert trainer.learner.iteration == 1 and not trainer.pending
    sha = push(trainer)
    trainer.offer(actor.chunk(trainer, sha))
    assert not trainer.ready()
    trainer.offer(actor.chunk(trainer, sha))
    assert trainer.ready()  # full batch, no waiting
    trainer.iterate()
    actor.env.close()
    table = rows(trainer.run_dir)
    assert [int(r['iteration']) for r in table] == [1, 2]
    assert {'steps_per_s', 'wall_time_s', 'dropped_fraction', 'accepted',
            'dropped/stale_version', 'importance_weight', 'value_loss'} <= set(table[0])
    assert float(table[1]['wall_time_s']) == pytest.approx(5.1)
    assert sorted(p.name for p in (trainer.run_dir / 'checkpoints').iterdir()) == \
        ['model_1.pt', 'model_2.pt']
    assert list(trainer.run_dir.glob('events.out.tfevents.*'))
    trainer.finish(stopped=True)


def test_bad_and_stale_chunks_are_counted_by_cause_and_never_pending(tmp_path, robot):
    clock = Clock()
    trainer = make_trainer(tmp_path, robot, clock, chunks_per_iteration=1)
    sha = push(trainer)
    actor = Actor(trainer)
    good = actor.chunk(trainer, sha)
    assert trainer.offer(good[:len(good) // 2]).cause == 'truncated'
    assert trainer.offer(b'nonsense').cause == 'truncated'
    assert trainer.offer(actor.chunk(trainer, 'f' * 64)).cause == 'unknown_version'
    assert not trainer.pending
    assert trainer.offer(good) is None
    trainer.iterate()
    push(trainer)
    assert trainer.offer(good).cause == 'stale_version'  # lag 1 > max_policy_lag 0
    counters = trainer.gate.counters.as_dict()
    assert counters['accepted'] == 1 and counters['dropped/truncated'] == 2
    assert counters['dropped/unknown_version'] == 1 and counters['dropped/stale_version'] == 1
    assert counters['dropped_fraction'] == pytest.approx(4 / 5)
    actor.env.close()
    trainer.finish(stopped=True)


def test_budget_end_writes_the_offline_trainers_outputs(tmp_path, robot):
    clock = Clock()
    trainer = make_trainer(tmp_path, robot, clock, cfg={'runner': {
        'max_iterations': 2, 'eval_episodes': 2}})
    actor = Actor(trainer)
    for _ in range(2):
        assert not trainer.done()
        trainer.offer(actor.chunk(trainer, push(trainer)))
        clock.now += 1.0
        trainer.iterate()
    actor.env.close()
    assert trainer.done()
    summary = trainer.finish(stopped=False)
    run_dir = trainer.run_dir
    on_disk = json.loads((run_dir / 'summary.json').read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert on_disk['iterations'] == 2 and on_disk['total_steps'] == 2 * 16 * 8
    assert on_disk['stopped_by_user'] is False and on_disk['peak_rss_mib'] > 0
    assert on_disk['chunks']['accepted'] == 2
    assert on_disk['eval_forward_0.5']['episodes'] == 2
    assert (run_dir / 'student.onnx').is_file() and (run_dir / 'learning_curve.png').is_file()
    assert (run_dir / 'config.yaml').is_file()
    assert trainer.finish(stopped=True) is summary  # idempotent


def test_time_budget_counts_from_the_first_chunk(tmp_path, robot):
    clock = Clock()
    trainer = make_trainer(tmp_path, robot, clock, cfg={'runner': {'time_budget_s': 10.0}})
    sha = push(trainer)
    clock.now += 1000.0  # actors starting up: not training time
    assert not trainer.done()
    actor = Actor(trainer)
    trainer.offer(actor.chunk(trainer, sha))
    clock.now += 9.9
    assert not trainer.done()
    clock.now += 0.2
    assert trainer.done()
    actor.env.close()
    summary = trainer.finish(stopped=True)
    assert 'student_onnx' not in summary and not (trainer.run_dir / 'student.onnx').exists()


def test_resume_continues_iteration_weights_and_wall_time(tmp_path, robot):
    clock = Clock()
    first = make_trainer(tmp_path, robot, clock)
    actor = Actor(first)
    first.offer(actor.chunk(first, push(first)))
    clock.now += 3.0
    first.iterate()
    first.finish(stopped=True)
    weights = [p.detach().clone() for p in first.learner.policy.parameters()]
    with pytest.raises(ConfigError, match='resume'):
        make_trainer(tmp_path, robot, clock)
    second = make_trainer(tmp_path, robot, clock, resume=True)
    assert second.resumed_from == ckpt.checkpoint_path(first.run_dir, 1)
    assert (second.learner.iteration, second.learner.policy_version) == (1, 1)
    for a, b in zip(weights, second.learner.policy.parameters()):
        assert torch.equal(a, b)
    second.offer(actor.chunk(second, push(second)))
    clock.now += 2.0
    second.iterate()
    actor.env.close()
    table = rows(second.run_dir)
    assert [int(r['iteration']) for r in table] == [1, 2]
    assert float(table[1]['wall_time_s']) == pytest.approx(5.0)
    assert np.isfinite(float(table[1]['mean_reward']))
    second.finish(stopped=True)


def test_resume_counts_chunks_on_from_the_checkpoint(tmp_path, robot):
    """summary.json after a resume had the cumulative iterations but the chunk counters of
    the resumed part only: the counters now travel in the checkpoint."""
    clock = Clock()
    first = make_trainer(tmp_path, robot, clock)
    actor = Actor(first)
    good = actor.chunk(first, push(first))
    assert first.offer(good[:100]).cause == 'truncated'
    assert first.offer(good) is None
    clock.now += 1.0
    first.iterate()
    first.finish(stopped=True)
    second = make_trainer(tmp_path, robot, clock, resume=True)
    assert second.gate.counters.as_dict() == first.gate.counters.as_dict()
    sha = push(second)
    assert second.offer(actor.chunk(second, 'f' * 64)).cause == 'unknown_version'
    assert second.offer(actor.chunk(second, sha)) is None
    clock.now += 1.0
    second.iterate()
    actor.env.close()
    summary = second.finish(stopped=True)
    chunks = json.loads((second.run_dir / 'summary.json').read_text())['chunks']
    assert summary['iterations'] == 2
    assert chunks['accepted'] == 2 and chunks['dropped/truncated'] == 1
    assert chunks['dropped/unknown_version'] == 1
    assert chunks['dropped_fraction'] == pytest.approx(0.5)
    assert [int(r['accepted']) for r in rows(second.run_dir)] == [1, 2]


@pytest.mark.parametrize('kwargs, match', [({'chunks_per_iteration': 0}, 'chunks_per_iteration'),
                                           ({'batch_timeout_s': 0.0}, 'batch_timeout_s')])
def test_bad_batch_settings_are_refused_by_name(tmp_path, robot, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_trainer(tmp_path, robot, Clock(), **kwargs)


def test_a_per_step_normaliser_is_refused_for_live_training(tmp_path, robot):
    """Live actors act with a frozen model version, so SB3's per-step statistics cannot be
    reproduced: refused by field name with the value that works."""
    with pytest.raises(ConfigError, match="policy.obs_normalizer.*'sb3'.*rsl_rl"):
        make_trainer(tmp_path, robot, Clock(), cfg={'policy': {'obs_normalizer': 'sb3'}})


def test_roster_reports_an_actor_joining_going_silent_and_coming_back_once_each():
    from claw_rl_ros.core.live.actor_roster import ActorRoster
    clock = Clock()
    roster = ActorRoster(batch_timeout_s=2.0, clock=clock)
    roster.accepted('/b/actor')
    roster.accepted('/c/actor')
    assert [e[1] for e in roster.drain()] == ['/b/actor joined: first chunk accepted',
                                              '/c/actor joined: first chunk accepted']
    roster.batch({'/b/actor', '/c/actor'}, timed_out=False, counted=2, expected=2)
    clock.now += 1.5
    roster.accepted('/c/actor')
    clock.now += 1.0  # b quiet for 2.5 s, over the timeout; c for 1.0 s
    roster.batch({'/c/actor'}, timed_out=True, counted=1, expected=2)
    events = roster.drain()
    assert [level for level, _ in events] == ['warn'], events
    assert events[0][1].startswith('/b/actor silent: no chunk for 2.5 s (a batch timed out '
                                   'after 2 s with 1 of 2 chunks)'), events
    assert roster.silent() == ['/b/actor']
    clock.now += 5.0  # later timed-out batches say nothing new; c is still heard
    roster.accepted('/c/actor')
    roster.batch({'/c/actor'}, timed_out=True, counted=1, expected=2)
    assert roster.drain() == []
    roster.accepted('/b/actor')
    assert roster.drain() == [('info', '/b/actor is back: chunk accepted after 7.5 s '
                               'without one')]
    assert roster.silent() == []
    # A full batch never reports silence (nobody held it up).
    clock.now += 10.0
    roster.batch(set(), timed_out=False, counted=2, expected=2)
    assert roster.drain() == []
    # Absent from a timed-out batch but heard under batch_timeout_s ago (its chunk came after
    # the batch was cut): not silent.
    roster.accepted('/b/actor')
    clock.now += 0.5
    roster.batch({'/c/actor'}, timed_out=True, counted=1, expected=2)
    assert roster.drain() == [] and roster.silent() == []
    assert roster.summary() == {'/b/actor': {'chunks': 3, 'silences': 1},
                                '/c/actor': {'chunks': 3, 'silences': 0}}


def test_a_chunk_carries_where_its_actor_spent_the_time_and_the_trainer_reports_it(
        tmp_path, robot):
    """Whether an actor waited for a model, stalled in a collection or its chunk was long on
    the way: each chunk carries the actor's timings, the trainer logs the slowest per iteration
    and says them when a chunk ends an actor's silence."""
    from claw_rl_ros.core.live.actor_roster import ActorRoster, ChunkTiming
    mono, wall = Clock(), Clock()
    wall.now = 1.8e9
    trainer = make_trainer(tmp_path, robot, mono, wall_clock=wall)
    actor = Actor(trainer)
    actor.actor = BatchedActor(actor.env, copy.deepcopy(trainer.learner.policy),
                               trainer.cfg.runner.num_steps_per_env, '/a0', clock=mono,
                               wall_clock=wall)
    first = actor.chunk(trainer, push(trainer))
    mono.now += 3.0  # the actor idles 3 s before its next collection
    wall.now += 4.25
    second = actor.actor.collect()
    assert second.stats['timing/idle_s'] == pytest.approx(3.0)
    assert second.stats['timing/collect_s'] == 0.0  # the hand-moved clock stood still
    assert second.stats['timing/collected_unix'] == wall.now
    wall.now += 0.25  # both accepted now: the first 4.5 s, the second 0.25 s after collection
    assert ChunkTiming.of(second.stats, wall.now) == ChunkTiming(
        idle_s=3.0, previous_collect_s=0.0, collect_s=0.0, age_s=0.25)
    assert ChunkTiming.of({'diverged': 0.0}, wall.now) is None  # a chunk without timings
    # An actor's hostile or broken timings are reported as they are, never raised on.
    hostile = {'timing/idle_s': float('nan'), 'timing/previous_collect_s': float('inf'),
               'timing/collect_s': -1e308, 'timing/collected_unix': 1e308}
    assert 'accepted -1' in ChunkTiming.of(hostile, wall.now).describe()
    assert trainer.offer(first) is None and trainer.offer(bytes(encode_chunk(second))) is None
    metrics = trainer.iterate()
    assert metrics['chunk_age_s'] == pytest.approx(4.5)  # the slowest of the batch
    assert metrics['chunk_collect_s'] == 0.0
    assert metrics['chunk_idle_s'] == pytest.approx(3.0)  # the second's; the first's was 0
    # The roster's message when a timed chunk ends a silence.
    roster = ActorRoster(batch_timeout_s=2.0, clock=mono)
    roster.accepted('/a0')
    mono.now += 30.0
    roster.batch(set(), timed_out=True, counted=0, expected=1)
    roster.drain()
    roster.accepted('/a0', ChunkTiming(idle_s=0.1, previous_collect_s=17.3, collect_s=1.9,
                                       age_s=0.4))
    assert roster.drain() == [('info', '/a0 is back: chunk accepted after 30.0 s without one '
                               '(before it the actor idled 0.1 s (waiting for a model, '
                               'publishing), collected it in 1.9 s (the one before in 17.3 s), '
                               'and it was accepted 0.4 s after its collection ended)')]
    actor.env.close()


def test_a_timed_out_batch_names_the_actor_it_waited_for(tmp_path, robot):
    clock = Clock()
    trainer = make_trainer(tmp_path, robot, clock, chunks_per_iteration=2, batch_timeout_s=5.0)
    sha = push(trainer)
    actors = [Actor(trainer, seed) for seed in (0, 1)]
    for actor in actors:
        trainer.offer(actor.chunk(trainer, sha))
    trainer.iterate()
    assert [level for level, _ in trainer.roster.drain()] == ['info', 'info']  # joined
    sha = push(trainer)
    trainer.offer(actors[0].chunk(trainer, sha))
    clock.now += 5.1
    assert trainer.ready()
    metrics = trainer.iterate()
    events = trainer.roster.drain()
    assert len(events) == 1 and events[0][0] == 'warn' and \
        events[0][1].startswith('/a1 silent'), events
    assert metrics['actors_silent'] == 1
    sha = push(trainer)
    trainer.offer(actors[1].chunk(trainer, sha))
    assert trainer.roster.drain()[0][1].startswith('/a1 is back')
    for actor in actors:
        actor.env.close()
    summary = trainer.finish(stopped=True)
    assert summary['actors'] == {'/a0': {'chunks': 2, 'silences': 0},
                                 '/a1': {'chunks': 2, 'silences': 1}}
