"""The live trainer's core: rollout chunks in, PPO or SAC (+ OPD) iterations out, logged like
offline (``algorithm`` picks :class:`~.chunk_learner.ChunkLearner` or
:class:`~.sac_chunk_learner.SACChunkLearner`; nothing else changes).

:class:`LiveTrainer` is what trainer_node does between messages, without ROS:

- :meth:`offer`: decode, validate and lag-filter a payload (:class:`~.chunk_filter.ChunkGate`,
  drops counted by cause) and keep the accepted chunk;
- :meth:`ready`: a batch is due when ``chunks_per_iteration`` chunks are pending, or when the
  oldest pending chunk has waited ``batch_timeout_s`` (an actor died or is slow: the others'
  chunks are learnt from rather than held until they go stale). Only chunks of at least
  ``min_chunk_envs`` worlds count towards both: smaller ones (the 1-world control-loop actor's)
  never start an iteration ahead of the batched actors, but are learnt from with them;
- :attr:`roster` (:class:`~.actor_roster.ActorRoster`): an actor joining, going silent (a
  batch timed out without it) and coming back, as events for the node to log;
- :meth:`iterate`: :meth:`ChunkLearner.learn <.chunk_learner.ChunkLearner.learn>` on the
  pending chunks, one row in ``metrics.csv`` and TensorBoard (the offline
  :class:`~..learning.run_artifacts.RunArtifacts`), the learner's atomic checkpoint (the
  layout ``claw-rl train`` writes, plus the chunk counters);
- :meth:`export`: the student as ONNX bytes for the push; the lag filter learns (version, sha);
- :meth:`done`: ``runner.max_iterations`` or ``runner.time_budget_s`` reached;
- :meth:`finish`: ``learning_curve.png``, ``summary.json`` and, when training ran to its end,
  ``student.onnx`` with its evaluation at 0.5 m/s (as ``claw-rl train`` ends).

Wall time counts from the first accepted chunk (start-up of actors is not training time) and
continues across a resume, like the offline runner's ``elapsed_s``; so do the chunk counters
(accepted, dropped by cause: stored in each checkpoint as ``chunk_counters``).
"""

from __future__ import annotations

from pathlib import Path
import sys
import time
from typing import Any, Callable, TextIO

from .actor_roster import ActorRoster, ChunkTiming
from .chunk_filter import ChunkGate, PolicyLagFilter
from .chunk_learner import ChunkLearner
from ..config import ConfigError
from ..evaluation.final_student import export_and_evaluate
from ..learning import checkpoint as ckpt
from ..learning.run_artifacts import run_ended, RunArtifacts, write_config
from ..learning.train_config import TrainConfig
from .rollout_chunk import ChunkError
from .sac_chunk_learner import SACChunkLearner
from ..sim.env_config import observation_dims

# The checkpoint entry holding the chunk counters (LiveTrainer's addition to the learner's).
COUNTERS = 'chunk_counters'


class LiveTrainer:
    """See the module docstring; ``clock`` is ``time.monotonic`` unless a test gives one."""

    def __init__(self, cfg: TrainConfig, robot: Any, run_dir: str | Path, *,
                 max_policy_lag: int = 0, chunks_per_iteration: int = 1,
                 batch_timeout_s: float = 10.0, min_chunk_envs: int = 1, resume: bool = False,
                 tensorboard: bool = True, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time):
        if cfg.policy.normalize_obs and cfg.policy.obs_normalizer != 'rsl_rl':
            raise ConfigError('train config', 'policy.obs_normalizer',
                              f'{cfg.policy.obs_normalizer!r}: its statistics follow every '
                              'step before acting, but live actors act with a frozen model '
                              'version; set policy.obs_normalizer: rsl_rl (merged once per '
                              'rollout) for live training')
        if chunks_per_iteration < 1:
            raise ValueError(f'chunks_per_iteration {chunks_per_iteration} must be >= 1')
        if min_chunk_envs < 1:
            raise ValueError(f'min_chunk_envs {min_chunk_envs} must be >= 1 (worlds a chunk '
                             'needs to count towards chunks_per_iteration)')
        if not batch_timeout_s > 0:
            raise ValueError(f'batch_timeout_s {batch_timeout_s} must be > 0 (seconds the '
                             'oldest pending chunk waits for the others)')
        self.cfg = cfg
        self.robot = robot
        self.run_dir = Path(run_dir)
        self.per_iteration = chunks_per_iteration
        self.batch_timeout_s = batch_timeout_s
        self.min_chunk_envs = min_chunk_envs
        self.clock = clock
        self.wall_clock = wall_clock
        self.stream = stream if stream is not None else sys.stdout
        dims = observation_dims(robot, cfg.env)  # what the actors' envs deliver
        # The algorithm switch: the learner, nothing else (gate, logs, pushes are the same).
        learner = SACChunkLearner if cfg.algorithm == 'sac' else ChunkLearner
        self.learner = learner(cfg, dims, robot.num_joints,
                               [f'reward/{k}' for k in sorted(cfg.env.rewards.scales)])
        self.gate = ChunkGate(self.learner.spec, PolicyLagFilter(max_policy_lag))
        self.resumed_from = self._start_or_resume(resume)
        self.artifacts = RunArtifacts(self.run_dir, cfg, self.learner.iteration, self.stream,
                                      tensorboard)
        self.roster = ActorRoster(batch_timeout_s, clock)  # who is heard from, who went quiet
        self.pending: list = []
        self._timings: list[ChunkTiming] = []  # of the pending chunks that carry one
        self._counted = 0  # pending chunks of at least min_chunk_envs worlds
        self._first_pending = 0.0
        self._start: float | None = None
        self._elapsed0 = self.learner.elapsed_s
        self._last_iteration_end: float | None = None
        self._finished = False
        self.summary: dict[str, Any] = {}

    def _start_or_resume(self, resume: bool) -> Path | None:
        """None for a new run (config.yaml written); else the checkpoint resumed, which may
        be one of ``claw-rl train`` (no chunk counters: they start at 0)."""
        latest = ckpt.latest_checkpoint(self.run_dir)
        if latest is None:
            write_config(self.run_dir, self.cfg)
            return None
        if not resume:
            raise ConfigError(str(self.run_dir), 'resume', 'run directory already has '
                              'checkpoints; set resume to true to continue it, or choose '
                              'another run_dir')
        counts = self.learner.load(latest).get(COUNTERS)
        if counts is not None:
            self.gate.counters.load_state_dict(counts)
        return latest

    # ---------------------------------------------------------------------------- chunks
    def offer(self, payload: Any) -> ChunkError | None:
        """Admit one encoded chunk into the pending batch; the ChunkError if it was dropped."""
        chunk, error = self.gate.admit_or_none(payload)
        if chunk is not None:
            now = self.clock()
            if self._start is None:
                self._start = now
            timing = ChunkTiming.of(chunk.stats, self.wall_clock())
            if timing is not None:
                self._timings.append(timing)
            if chunk.num_envs >= self.min_chunk_envs:
                if not self._counted:
                    self._first_pending = now
                self._counted += 1
                self.roster.accepted(chunk.actor_id, timing)
            self.pending.append(chunk)
        return error

    def ready(self) -> bool:
        """A full batch is pending, or the oldest pending chunk waited batch_timeout_s (counting
        chunks of at least min_chunk_envs worlds only)."""
        return self._counted >= self.per_iteration or bool(self._counted) and \
            self.clock() - self._first_pending >= self.batch_timeout_s

    @property
    def elapsed_s(self) -> float:
        """Training wall time, including that of the run this one resumed."""
        return self._elapsed0 + (self.clock() - self._start if self._start is not None else 0.0)

    # ----------------------------------------------------------------------------- learn
    def iterate(self) -> dict[str, float]:
        """Learn from the pending chunks; log, checkpoint; returns the iteration's metrics."""
        chunks, counted, timings = self.pending, self._counted, self._timings
        self.pending, self._counted, self._timings = [], 0, []
        self.roster.batch({c.actor_id for c in chunks if c.num_envs >= self.min_chunk_envs},
                          counted < self.per_iteration, counted, self.per_iteration)
        metrics = self.learner.learn(chunks)
        now = self.clock()
        steps = sum(c.num_steps * c.num_envs for c in chunks)
        since = self._last_iteration_end if self._last_iteration_end is not None \
            else self._start
        self._last_iteration_end = now
        self.learner.elapsed_s = self.elapsed_s
        metrics.update(steps_per_s=steps / max(now - since, 1e-9),
                       wall_time_s=self.learner.elapsed_s, **self.gate.counters.as_dict())
        metrics['actors'] = len({c.actor_id for c in chunks})
        metrics['actors_silent'] = len(self.roster.silent())
        # The slowest chunk's collection, the longest idle before one (it holds the publish of
        # the actor's chunk before) and the oldest on acceptance (NaN: no chunk timed).
        metrics['chunk_collect_s'] = max((t.collect_s for t in timings), default=float('nan'))
        metrics['chunk_idle_s'] = max((t.idle_s for t in timings), default=float('nan'))
        metrics['chunk_age_s'] = max((t.age_s for t in timings), default=float('nan'))
        self.artifacts.log(self.learner.iteration, metrics, self.elapsed_s)
        self._save()
        self.learner.save_candidate(self.run_dir, lambda: {'robot': self.robot.to_metadata()})
        return metrics

    def _save(self) -> None:
        """The learner's checkpoint of this iteration, with the chunk counters."""
        self.learner.save(self.run_dir, self.cfg.runner.keep_checkpoints, {
            COUNTERS: self.gate.counters.state_dict(), 'robot': self.robot.to_metadata()})

    def export(self) -> bytes:
        """The current student as ONNX bytes (also ``models/student_v<version>.onnx``); the
        lag filter now accepts chunks acted by it."""
        import hashlib
        version = self.learner.policy_version
        data = self.learner.export_student(self.robot, self.run_dir / 'models' /
                                           f'student_v{version}.onnx')
        self.gate.lag_filter.publish(version, hashlib.sha256(data).hexdigest())
        return data

    def done(self) -> bool:
        """max_iterations or the time budget reached."""
        return run_ended(self.cfg.runner, self.learner.iteration, self.elapsed_s)

    # ---------------------------------------------------------------------------- finish
    def finish(self, stopped: bool) -> dict[str, Any]:
        """Close the logs; curve PNG, summary.json (+ student.onnx and its evaluation unless
        ``stopped`` early). Idempotent: a second call returns the first summary."""
        if self._finished:
            return self.summary
        self._finished = True
        learner = self.learner
        if learner.iteration and ckpt.latest_checkpoint(self.run_dir) != \
                ckpt.checkpoint_path(self.run_dir, learner.iteration):
            self._save()

        steps_per_s = round(learner.total_steps / self.elapsed_s, 1) if self.elapsed_s else 0.0
        self.summary = self.artifacts.finish(
            learner, stopped, lambda: export_and_evaluate(learner, self.robot, self.run_dir),
            {'wall_time_s': round(self.elapsed_s, 1), 'steps_per_s': steps_per_s,
             'chunks': self.gate.counters.as_dict(), 'actors': self.roster.summary()})
        return self.summary
