"""SAC fed by rollout chunks: the live trainer's learner for ``algorithm: sac``.

The same interface as :class:`~.chunk_learner.ChunkLearner` (``learn(chunks)``, export, the
shared learner's checkpoints), so :class:`~.live_trainer.LiveTrainer`, trainer_node and the
actors are unchanged.
``learn`` writes every transition of the chunks into SAC's replay buffer and then runs the very
same :meth:`SAC.learn <..learning.algorithm.Algorithm.learn>` as the offline runner: ``utd_ratio``
gradient steps per new transition once ``learning_starts`` transitions are stored, combined_loss
= SAC actor loss + alpha * KL(teacher || student) through the registry, the normaliser update
and the EMA teacher.

Lag. SAC is off-policy: its targets and actor loss use the current policy's own samples, never
the behaviour policy's probabilities, so a chunk acted by an older student is ordinary replay
data and needs no correction (no importance weights, unlike decoupled PPO). The trainer's
``max_policy_lag`` still bounds how old it may be; the credit scheme keeps actors within two
versions anyway.

Behaviour. Actors act with the exported student as SAC's squashed Gaussian: the deterministic
action ``a = bias + scale * tanh(mean)`` from onnxruntime, inverted to ``mean``, then
``bias + scale * tanh(mean + std * eps)`` with the per-dimension ``std`` in the model's metadata
(the student's mean pre-tanh std over the newest replay observations; its state dependence is
the one thing the actors do not reproduce). Actions therefore stay in the squashed range and
are stored as ``(a - bias) / scale`` in [-1, 1], the critics' input.

Layout. Chunks come from actors of different world counts, so the buffer is one column of
``buffer_size`` rows filled world by world; the last step of each world in a chunk is marked
``done`` (not ``terminated``), which only cuts an n-step window there: it still bootstraps from
that step's real next observation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from .chunk_learner import ChunkLearner
from ..config import to_dict
from ..control.loop_record import BEHAVIOUR_KIND
from ..export.onnx_export import export_onnx
from ..learning.sac import SAC
from .rollout_chunk import RolloutChunk


class SACChunkLearner(ChunkLearner):
    """SAC (+ OPD) student updated from rollout chunks; see the module docstring."""

    alg: SAC

    def init_storage(self) -> None:
        """One replay column: chunks of any world count are stored world by world."""
        self.alg.init_storage(self.cfg.runner.num_steps_per_env, 1, self.obs_dims,
                              self.num_actions)

    # -------------------------------------------------------------------------- storage
    @torch.no_grad()
    def fill(self, chunks: list[RolloutChunk]) -> dict[str, torch.Tensor]:
        """Every transition of ``chunks`` into the replay buffer, world by world; returns the
        last observations [sum N, d] (unused by SAC, kept for the interface)."""
        blocks = [self._transitions(c) for c in chunks]
        rows = {k: torch.cat([b[k] for b in blocks]) for k in blocks[0] if k not in
                ('obs', 'next_obs')}
        obs = {g: torch.cat([b['obs'][g] for b in blocks]) for g in self.obs_dims}
        next_obs = {g: torch.cat([b['next_obs'][g] for b in blocks]) for g in self.obs_dims}
        self.alg.extend_replay(obs, rows['actions'], rows['rewards'], rows['terminated'],
                               rows['dones'], next_obs)
        return {g: torch.from_numpy(np.concatenate([np.asarray(c.last_obs[g]) for c in chunks]))
                for g in self.obs_dims}

    def _transitions(self, c: RolloutChunk) -> dict[str, Any]:
        """One chunk [T, N, ...] as T * N rows [T * N, 1, ...], world-major."""
        t, n = c.num_steps, c.num_envs

        def rows(x: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(x.swapaxes(0, 1)).reshape(
                t * n, 1, *x.shape[2:]).astype(np.float32))

        trunc = np.asarray(c.truncated)
        term = np.asarray(c.terminated)
        obs, next_obs = {}, {}
        for g in self.obs_dims:
            o = np.asarray(c.obs[g], np.float32)
            # s_{t+1}: the next row, the chunk's last_obs after its last step, and for a
            # time-out the state it ended in (final_obs rows in (t, world) order).
            nxt = np.concatenate([o[1:], np.asarray(c.last_obs[g], np.float32)[None]])
            if trunc.any():
                nxt[trunc] = np.asarray(c.final_obs[g], np.float32)
            obs[g], next_obs[g] = rows(o), rows(nxt)
        # Env actions -> the critics' [-1, 1] (the behaviour keeps them in range; rounding).
        scale, bias = self.policy.action_scale.numpy(), self.policy.action_bias.numpy()
        squashed = np.clip((np.asarray(c.actions, np.float32) - bias) / scale, -1.0, 1.0)
        cut = term | trunc
        cut[-1] = True  # the chunk ends: an n-step window stops (and still bootstraps) here
        return {'obs': obs, 'next_obs': next_obs, 'actions': rows(squashed),
                'rewards': rows(np.asarray(c.rewards)), 'terminated': rows(term),
                'dones': rows(cut)}

    # ------------------------------------------------------------------------------ export
    @torch.no_grad()
    def behaviour_std(self, max_samples: int = 4096) -> list[float]:
        """[A] the student's pre-tanh std averaged over the newest replay observations (over
        an all-zero observation before any data): what the actors sample with."""
        storage = self.alg.storage
        if len(storage):
            obs = storage.recent_obs(max(self.alg.num_steps, 1), max_samples)
        else:
            obs = {g: torch.zeros(1, d) for g, d in self.obs_dims.items()}
        _, log_std = self.policy.action_mean_log_std(obs)
        return [float(x) for x in log_std.exp().mean(0)]

    def export_student(self, robot: Any, path: str | Path) -> bytes:
        """The student as ONNX (written atomically to ``path``) with ``policy_version``,
        ``action_std`` [A] (pre-tanh) and ``behaviour`` (squashed Gaussian, its range) in its
        metadata; returns its bytes."""
        low = (self.policy.action_bias - self.policy.action_scale).tolist()
        high = (self.policy.action_bias + self.policy.action_scale).tolist()
        export_onnx(self.policy, robot, path, action_clip=self.cfg.env.clip_actions,
                    obs_history=self.cfg.env.policy_history,
                    extra_metadata={'policy_version': self.policy_version,
                                    'action_std': self.behaviour_std(),
                                    'behaviour': {'kind': BEHAVIOUR_KIND, 'low': low,
                                                  'high': high},
                                    'iteration': self.iteration, 'total_steps': self.total_steps,
                                    'algorithm': self.cfg.algorithm,
                                    'terrain': to_dict(self.cfg.env.terrain)})
        return Path(path).read_bytes()
