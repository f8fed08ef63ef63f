"""The control loop as an actor: policy-node records + env transitions -> rollout chunks.

sim_node in training mode runs a :class:`~..sim.training_session.TrainingSession`. For every
control step it gives :meth:`ControlLoopActor.step` the stamp of the state the applied command
answered and the joint targets (spec order); the actor pairs them with the policy node's
:class:`~..control.loop_record.PolicyRecord` of that state, makes the env adopt the policy's
memory (last action, gait clock), takes the env's noise-free and privileged observation of the
state, steps the env (reward, terminated, truncated with its final observation, episode logs:
the env's own code) and appends the step to a :class:`ChunkBuilder`. A chunk of ``num_steps``
x 1 world is emitted, with the same layout as the batched actors' (``actor_id`` names the
loop), when the step after its last one is paired: that step's observation is the chunk's
bootstrap ``last_obs``, and the step starts the next chunk.

A step is used only if its pairing is exact; otherwise the chunk in progress is discarded and
counted by cause (:data:`CAUSES`), and collection starts again at the next paired step:

- ``missing_record``: no record for the state (dropped or late message, or a tick the safety
  state machine held instead of the policy acting);
- ``command_mismatch``: the applied targets are not the command the record says was sent;
- ``obs_mismatch``: the policy's observation disagrees with the env's noise-free one in the
  elements the sim adds no sensor noise to (the command, last action and gait clock; every
  element when the sim's noise is off), e.g. a velocity command that reached the policy late;
- ``reset``: the world was reset by the sim node's ~/reset service since the last step;
- ``model_changed``: the step was acted by another model than the chunk so far (the step
  itself starts the next chunk).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from ..control.control_stats import Counters
from ..control.loop_record import PolicyRecord
from ..learning.rollout_summary import episode_arrays, rollout_stats
from .rollout_chunk import RolloutChunk, stack_rows
from ..sim.observations import POLICY, POLICY_NOISE_FREE

CAUSES = ('missing_record', 'command_mismatch', 'obs_mismatch', 'reset', 'model_changed')
# A record belongs to a state when their stamps agree to this [s] (both are the same ROS time).
STAMP_TOLERANCE_S = 1e-6
# Observation elements the sim does not add noise to must agree to this (float32 rounding).
OBS_TOLERANCE = 1e-4


class ChunkBuilder:
    """Paired steps of one world, acted by one model, into chunks of ``num_steps``."""

    def __init__(self, num_steps: int, obs_dims: dict[str, int], actor_id: str):
        self.num_steps = num_steps
        self.obs_dims = dict(obs_dims)
        self.actor_id = actor_id
        self.steps: list[tuple[PolicyRecord, dict[str, np.ndarray], Any]] = []
        self.seq = 0

    @property
    def full(self) -> bool:
        return len(self.steps) == self.num_steps

    @property
    def model(self) -> tuple[int, str] | None:
        """(policy version, sha) that acted the steps so far (None: no step yet)."""
        return (self.steps[0][0].policy_version, self.steps[0][0].model_sha) \
            if self.steps else None

    def append(self, record: PolicyRecord, obs: dict[str, np.ndarray], transition: Any) -> None:
        """One paired step: the policy's record, {group: [dim]} obs it acted on, the env's
        :class:`~..sim.training_session.Transition`."""
        if self.full:
            raise RuntimeError('chunk is full: finish() it first')
        self.steps.append((record, obs, transition))

    def discard(self) -> int:
        """Drop the steps so far; returns how many. ``seq`` moves on, so chunks with
        consecutive ``seq`` are consecutive in time (a gap: something was discarded)."""
        count, self.steps = len(self.steps), []
        self.seq += 1
        return count

    def finish(self, last_obs: dict[str, np.ndarray]) -> RolloutChunk:
        """The chunk of the ``num_steps`` steps, bootstrapped by {group: [dim]} ``last_obs``
        (the observation after the last step); the builder starts empty again."""
        if not self.full:
            raise RuntimeError(f'{len(self.steps)} of {self.num_steps} steps: not a chunk yet')
        records = [s[0] for s in self.steps]
        transitions = [s[2] for s in self.steps]
        dims = self.obs_dims
        col = _one_world
        version, sha = self.model
        truncated = col([t.truncated for t in transitions]) > 0.5
        self.seq += 1
        chunk = RolloutChunk(
            model_sha=sha, policy_version=version, actor_id=self.actor_id, seq=self.seq,
            obs={g: col([s[1][g] for s in self.steps]) for g in dims},
            actions=col([r.action for r in records]), mu=col([r.mu for r in records]),
            sigma=col([r.sigma for r in records]), log_probs=col([r.log_prob for r in records]),
            rewards=col([t.reward for t in transitions]),
            terminated=col([t.terminated for t in transitions]) > 0.5, truncated=truncated,
            final_obs={g: stack_rows([t.final_obs[g][None] for t in transitions
                                      if t.truncated], d) for g, d in dims.items()},
            last_obs={g: np.asarray(last_obs[g], np.float32)[None] for g in dims},
            episodes=episode_arrays([t.episode for t in transitions if t.episode is not None]),
            stats=rollout_stats([t.tracking_error for t in transitions],
                                sum(t.diverged for t in transitions)))
        self.steps = []
        return chunk


def _one_world(values: list) -> np.ndarray:
    """T per-step values ([...] each) as a float32 [T, 1, ...] array: one world."""
    return np.asarray(values, np.float32)[:, None]


def exact_elements(session: Any) -> np.ndarray:
    """[D] bool: policy observation elements the session's readings carry without noise."""
    layout = session.robot.policy_obs
    if not session.noise:
        return np.ones(layout.dim, bool)
    noise = session.cfg.noise
    return layout.term_vector(noise.levels) * noise.scale == 0.0


class ControlLoopActor:
    """Pairs policy records with the sim's control steps into chunks (module docstring).

    ``session`` is a :class:`~..sim.training_session.TrainingSession`; records' ``target``
    must already be in spec joint order.
    """

    def __init__(self, session: Any, num_steps: int, actor_id: str = 'control_loop',
                 max_records: int = 8):
        self.session = session
        self.builder = ChunkBuilder(num_steps, session.env.obs_dims, actor_id)
        self.records: deque[PolicyRecord] = deque(maxlen=max_records)
        self.exact = exact_elements(session)
        self.discarded = Counters(CAUSES)
        self.discarded_steps = 0
        self.chunks = 0
        self._resets = session.resets

    def add_record(self, record: PolicyRecord) -> None:
        """A record from the policy node (kept until its state is stepped, or displaced)."""
        self.records.append(record)

    def _take(self, stamp: float) -> PolicyRecord | None:
        """The record of the state stamped ``stamp``; records of older states are dropped."""
        found = None
        while self.records and self.records[0].stamp < stamp + STAMP_TOLERANCE_S:
            record = self.records.popleft()
            if abs(record.stamp - stamp) <= STAMP_TOLERANCE_S:
                found = record
        return found

    def _pair(self, record: PolicyRecord | None,
              targets: np.ndarray) -> tuple[str | None, dict[str, np.ndarray] | None]:
        """(cause or None, {group: [dim]} observation the policy acted on)."""
        if self.session.resets != self._resets:
            self._resets = self.session.resets
            return 'reset', None
        if record is None:
            return 'missing_record', None
        if not np.allclose(record.target, targets, rtol=0.0, atol=1e-9):
            return 'command_mismatch', None
        obs = self.session.observe(record.last_action, record.gait_phase)
        error = np.abs(record.obs - obs[POLICY_NOISE_FREE])[self.exact]
        if error.size and error.max() > OBS_TOLERANCE:
            return 'obs_mismatch', None
        obs[POLICY] = record.obs
        return None, obs

    def step(self, stamp: float, targets: np.ndarray) -> RolloutChunk | None:
        """Apply [J] ``targets`` (spec order), the command answering the state stamped
        ``stamp``, for one control step; returns a chunk when one is complete."""
        record = self._take(stamp)
        cause, obs = self._pair(record, targets)
        chunk = None
        if cause is None and self.builder.full:
            chunk = self.builder.finish(obs)
            self.chunks += 1
        elif cause is None and self.builder.steps and \
                self.builder.model != (record.policy_version, record.model_sha):
            self._discard('model_changed')
        transition = self.session.transition(targets, None if record is None else record.action)
        if cause is not None:
            self._discard(cause)
        else:
            self.builder.append(record, obs, transition)
        return chunk

    def _discard(self, cause: str) -> None:
        self.discarded.add(cause)
        self.discarded_steps += self.builder.discard()

    def diagnostics(self) -> dict[str, object]:
        """Flat fields: chunks emitted, steps in progress, discards by cause."""
        out: dict[str, object] = {'chunks': self.chunks,
                                  'chunk_steps': len(self.builder.steps),
                                  'discarded_steps': self.discarded_steps}
        out.update({f'discarded_{k}': v for k, v in self.discarded.to_dict().items()})
        return out
