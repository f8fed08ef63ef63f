"""The batched actor: N worlds of a vec env plus a local copy of the student -> rollout chunks.

It runs the runner's own rollout loop (:func:`~..learning.rollout.collect_rollout`) with the
same sampler (:func:`~..learning.ppo.sample_transition`) and time-out bootstrap inputs, but
writes what it saw into a :class:`~.rollout_chunk.RolloutChunk` tagged with the model version
that acted, instead of into the learner's storage. With the learner's generator and policy it
reproduces the offline runner (test_chunk_learning.py)."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch

from .actor_roster import ChunkTiming
from ..control.loop_record import behaviour_metadata, behaviour_squash
from ..learning.networks import ActorCritic, sample_gaussian
from ..learning.ppo import sample_transition
from ..learning.rollout import collect_rollout, obs_to_torch
from ..learning.rollout_summary import episode_arrays, rollout_stats
from ..learning.sac_networks import squashed_log_prob
from .rollout_chunk import RolloutChunk, stack_rows


class OnnxBehaviour:
    """An exported student as a behaviour policy: mean from onnxruntime (the deployed graph),
    std from the model's ``action_std`` metadata, no critic (the trainer computes values).

    ``policy`` is a validated :class:`~claw_rl_ros.core.export.onnx_policy.OnnxPolicy` whose
    metadata holds ``action_std`` [A] and ``policy_version`` (written by the trainer's export).
    A SAC student's export also holds ``behaviour`` (squashed Gaussian and its range): actions
    are then ``bias + scale * tanh(u)``, ``u ~ N(atanh((mean - bias) / scale), std)``, within
    the range, with SAC's squashed log-prob.
    """

    def __init__(self, policy: Any):
        std, self.policy_version = behaviour_metadata(policy.metadata, policy.num_actions,
                                                      policy.sha256)
        self.std = torch.tensor(std, dtype=torch.float32)
        self.model_sha = policy.sha256[:12]
        self.onnx = policy
        squash = behaviour_squash(policy.metadata, policy.num_actions)
        self.squash = None if squash is None else (
            torch.from_numpy((squash[1] - squash[0]) / 2), torch.from_numpy(
                (squash[1] + squash[0]) / 2))

    def sample(self, obs: dict[str, torch.Tensor],
               generator: torch.Generator | None) -> dict[str, torch.Tensor]:
        """Like :func:`~..learning.ppo.sample_transition` without ``values``."""
        mean = torch.from_numpy(np.asarray(self.onnx(obs['policy'].numpy()), np.float32))
        std = self.std.expand_as(mean)
        if self.squash is None:
            actions, log_probs = sample_gaussian(mean, std, generator)
            return {'actions': actions, 'log_probs': log_probs, 'mu': mean, 'sigma': std}
        # The deterministic action bias + scale * tanh(m) back to m, then SAC's sampler.
        scale, bias = self.squash
        m = torch.atanh(((mean - bias) / scale).clamp(-1.0 + 1e-6, 1.0 - 1e-6))
        u = torch.normal(m, std, generator=generator)
        return {'actions': bias + scale * torch.tanh(u),
                'log_probs': squashed_log_prob(u, m, std), 'mu': mean, 'sigma': std}


class BatchedActor:
    """Acts in every world of ``env`` with ``policy``: an ActorCritic (mean, std and values) or
    an :class:`OnnxBehaviour` (no values).

    Pacing (``chunks_in_flight``, a credit scheme): an actor may be that many chunks ahead of
    the trainer. Every chunk spends one credit; every newer model version gives one back (a
    model of the same or an older version with another sha, i.e. a restarted trainer, refills
    the credit). 1 is synchronous PPO: one chunk per model version. 2 collects the next chunk
    while the trainer learns from the last one, and still only one per version on average, so
    no backlog (and no stale chunk) builds up when learning is slower than collecting.

    A lost chunk would leave the actor without credit forever (the trainer waits for chunks,
    the actor for a model): after ``credit_timeout_s`` without a new model since the credit ran
    out, one credit is given back (``regrants`` counts them). A chunk collected that way when
    the trainer was only slow arrives one version late; the trainer's lag filter takes it or
    drops it as stale.
    """

    def __init__(self, env: Any, policy: Any, num_steps: int, actor_id: str = 'actor',
                 generator: torch.Generator | None = None, seed: int = 0,
                 chunks_in_flight: int = 1, credit_timeout_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time):
        if chunks_in_flight < 1:
            raise ValueError(f'chunks_in_flight {chunks_in_flight} must be >= 1 (1: wait for '
                             'a new model after every chunk, 2: overlap with learning)')
        if not credit_timeout_s > 0:
            raise ValueError(f'credit_timeout_s {credit_timeout_s!r} must be > 0 (seconds '
                             'without a new model before one more chunk is collected)')
        self.env = env
        self.policy = policy
        self.num_steps = num_steps
        self.actor_id = actor_id
        self.generator = generator if generator is not None else \
            torch.Generator().manual_seed(seed)
        self.model_sha = ''
        self.policy_version = -1
        self.seq = 0
        self.chunks_in_flight = chunks_in_flight
        self.credit = 0
        self.credit_timeout_s = credit_timeout_s
        self.clock = clock
        self.waiting_since = clock()  # last chunk or model; the credit timeout counts from it
        self.regrants = 0
        self.wall_clock = wall_clock
        self._last_end: float | None = None  # when the last collection ended (clock)
        self._last_collect_s = 0.0
        obs, _ = env.reset()
        self.obs = obs_to_torch(obs)

    def load_policy(self, state_dict: dict[str, torch.Tensor], version: int, sha: str) -> None:
        """Act from now on with these weights, tagging chunks with (version, sha)."""
        self.policy.load_state_dict(state_dict)
        self._new_model(int(version), sha)

    def use_behaviour(self, behaviour: OnnxBehaviour) -> None:
        """Act from now on with an exported model (its version and sha tag the chunks)."""
        self.policy = behaviour
        self._new_model(behaviour.policy_version, behaviour.model_sha)

    def _new_model(self, version: int, sha: str) -> None:
        """Tag chunks with (version, sha) from now on and update the credit."""
        if self.model_sha and version > self.policy_version:
            self.credit = min(self.chunks_in_flight,
                              self.credit + version - self.policy_version)
        elif sha != self.model_sha:
            self.credit = self.chunks_in_flight  # first model, or a restarted trainer's
        self.policy_version, self.model_sha = version, sha
        self.waiting_since = self.clock()

    def may_collect(self) -> bool:
        """A model is active and the actor is fewer than chunks_in_flight chunks ahead (or has
        waited ``credit_timeout_s`` for a new model since its last chunk: one is given back)."""
        if self.policy is None or not self.model_sha:
            return False
        if self.credit <= 0 and self.clock() - self.waiting_since >= self.credit_timeout_s:
            self.credit, self.regrants = 1, self.regrants + 1
        return self.credit > 0

    def _sample(self, obs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if isinstance(self.policy, ActorCritic):
            return sample_transition(self.policy, obs, self.generator)
        return self.policy.sample(obs, self.generator)

    def collect(self) -> RolloutChunk:
        """``num_steps`` steps in every world -> one chunk (float32 arrays, [T, N, ...]), through
        the runner's own rollout loop."""
        t_max, n, a = self.num_steps, self.env.num_envs, self.env.num_actions
        dims = self.env.obs_dims
        obs_buf = {g: np.empty((t_max, n, d), np.float32) for g, d in dims.items()}
        buf = {k: np.empty((t_max, n, a), np.float32) for k in ('actions', 'mu', 'sigma')}
        buf.update({k: np.empty((t_max, n), np.float32)
                    for k in ('log_probs', 'values', 'rewards')})
        flags = {k: np.empty((t_max, n), bool) for k in ('terminated', 'truncated')}
        final_obs: dict[str, list] = {g: [] for g in dims}
        final_values = []
        critic = isinstance(self.policy, ActorCritic)
        keys = ('actions', 'mu', 'sigma', 'log_probs', 'values')[:5 if critic else 4]
        sampled: dict[str, torch.Tensor] = {}

        def act(obs):
            sampled.update(self._sample(obs))
            return sampled['actions']

        def record(t, obs, actions, reward, terminated, truncated, extras, next_obs):
            for g in dims:
                obs_buf[g][t] = obs[g].numpy()
            for k in keys:
                buf[k][t] = sampled[k].numpy()
            buf['rewards'][t] = reward
            flags['terminated'][t], flags['truncated'][t] = terminated, truncated
            if truncated.any() and critic:
                # Time-out worlds: their final observation and its value (all worlds in one
                # batch, as the runner evaluates them), kept for the truncated rows only.
                values = self.policy.evaluate(obs_to_torch(extras['final_obs'])).squeeze(-1)
                final_values.append(values.numpy()[truncated])
            if truncated.any():
                for g in dims:
                    final_obs[g].append(extras['final_obs'][g][truncated])

        start = self.clock()
        self.obs, summary = collect_rollout(self.env, self.obs, t_max, act, record)
        timing = self._timing(start)
        self.seq += 1
        self.credit -= 1
        self.waiting_since = self.clock()
        return RolloutChunk(
            model_sha=self.model_sha, policy_version=self.policy_version,
            actor_id=self.actor_id, seq=self.seq, obs=obs_buf, log_probs=buf['log_probs'],
            actions=buf['actions'], mu=buf['mu'], sigma=buf['sigma'],
            values=buf['values'] if critic else None,
            rewards=buf['rewards'], terminated=flags['terminated'],
            truncated=flags['truncated'],
            final_obs={g: stack_rows(final_obs[g], dims[g]) for g in dims},
            final_values=None if not critic else np.concatenate(final_values)
            if final_values else np.zeros(0, np.float32),
            last_obs={g: self.obs[g].numpy().copy() for g in dims},
            episodes=episode_arrays(summary.episodes),
            stats={**rollout_stats(summary.errors, summary.diverged, summary.terrain_level),
                   **timing},
            windows=dict(getattr(self.env, 'obs_windows', {})))

    def _timing(self, start: float) -> dict[str, float]:
        """Where this actor's time between chunks went, for the trainer to tell a slow actor
        from a slow link (:class:`~.actor_roster.ChunkTiming`): how long the collection that
        began at ``start`` took, how long the one before took, the idle time between them
        (waiting for a model, publishing the last chunk) and the wall clock at its end."""
        end = self.clock()
        timing = ChunkTiming.stats(
            idle_s=start - self._last_end if self._last_end is not None else 0.0,
            previous_collect_s=self._last_collect_s, collect_s=end - start,
            collected_unix=self.wall_clock())
        self._last_end, self._last_collect_s = end, end - start
        return timing
