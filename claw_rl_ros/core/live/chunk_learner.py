"""The learning half of ``train_one_epoch`` fed by rollout chunks (the trainer's core).

``learn(chunks)`` stacks the chunks' worlds side by side into a :class:`RolloutStorage` ``[T,
sum of N, ...]`` (time-outs bootstrapped with ``gamma * V(final_obs)``, values recomputed by
the learner's critic for actors without one), then runs the very same :meth:`Learner.update
<..learning.learner.Learner.update>` as the offline :class:`~..learning.runner.OnPolicyRunner`
(it *is* a :class:`~..learning.learner.Learner`, so the two write one checkpoint layout and
resume each other's): GAE, mini-batch epochs of combined_loss = PPO + alpha * KL(teacher ||
student) with gradient clipping, the normaliser update and the EMA teacher. Built from the same
seed, it starts from the runner's exact weights.

Chunks acted by an older model (``max_policy_lag`` > 0, actors collecting while the trainer
learns) are corrected as in decoupled PPO (Hilton et al. 2021, "Batch size-invariance for
policy optimization"): the clipped ratio and the adaptive-KL schedule are taken against the
*proximal* policy (the learner's current one, which the update starts from), and each advantage
is weighted by the truncated importance weight min(1, pi_prox(a|s) / pi_behaviour(a|s))
(IMPALA's rho-bar = 1). Chunks of the current version are used exactly as the runner uses its
own rollout (weights 1, behaviour = proximal policy).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
import time
from typing import Any

import numpy as np
import torch

from ..config import to_dict
from ..export.onnx_export import export_onnx
from ..learning.learner import Learner
from ..learning.networks import ActorCritic, gaussian_log_prob
from ..learning.storage import RolloutStorage
from ..learning.train_config import TrainConfig
from .rollout_chunk import ChunkSpec, RolloutChunk
from ..sim.env_config import observation_windows


def state_sha(policy: ActorCritic) -> str:
    """sha256 (hex) of the policy's state: a version name for in-process actors."""
    digest = hashlib.sha256()
    for name, value in policy.state_dict().items():
        digest.update(name.encode())
        digest.update(value.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


class ChunkLearner(Learner):
    """PPO (+ OPD) student updated from rollout chunks; ``policy_version`` counts updates."""

    def __init__(self, cfg: TrainConfig, obs_dims: dict[str, int], num_actions: int,
                 reward_terms: list[str] | None = None):
        super().__init__(cfg, obs_dims, num_actions, reward_terms or ())
        self.spec = ChunkSpec(cfg.runner.num_steps_per_env, self.obs_dims, num_actions,
                              windows=observation_windows(cfg.env))
        self.init_storage()

    def init_storage(self) -> None:
        """PPO's storage is sized per batch (:meth:`_storage`): nothing up front."""

    # -------------------------------------------------------------------------- storage
    def _storage(self, num_envs: int) -> RolloutStorage:
        storage = self.alg.storage
        if storage is None or storage.num_envs != num_envs:
            storage = RolloutStorage(self.spec.num_steps, num_envs, self.obs_dims,
                                     self.num_actions)
            self.alg.storage = storage
        return storage

    @torch.no_grad()
    def _values(self, obs: dict[str, np.ndarray]) -> torch.Tensor:
        """The learner's critic on [..., dim] observations -> [...]."""
        flat = {g: torch.from_numpy(np.array(v, np.float32)).reshape(-1, v.shape[-1])
                for g, v in obs.items()}
        values = self.policy.evaluate(flat).squeeze(-1)
        return values.reshape(next(iter(obs.values())).shape[:-1])

    @torch.no_grad()
    def fill(self, chunks: list[RolloutChunk]) -> dict[str, torch.Tensor]:
        """Copy ``chunks`` into the storage (worlds side by side); returns the last obs [N, d]."""
        storage = self._storage(sum(c.num_envs for c in chunks))
        storage.weights = None
        gamma = self.cfg.ppo.gamma
        n0 = 0
        for c in chunks:
            cols = slice(n0, n0 + c.num_envs)
            n0 += c.num_envs
            for g in self.obs_dims:
                storage.obs[g].numpy()[:, cols] = c.obs[g]
            for name in ('actions', 'mu', 'sigma', 'log_probs'):
                getattr(storage, name).numpy()[:, cols] = getattr(c, name)
            values = torch.from_numpy(np.array(c.values)) if c.values is not None \
                else self._values(c.obs)
            storage.values[:, cols] = values
            rewards = torch.from_numpy(np.array(c.rewards))
            if c.truncated.any():
                final = torch.from_numpy(np.array(c.final_values)) \
                    if c.final_values is not None else self._values(c.final_obs)
                # Time-outs: r += gamma * V(s_final), the runner's float32 arithmetic.
                mask = torch.from_numpy(np.array(c.truncated))
                rewards[mask] = rewards[mask] + gamma * final
            storage.rewards[:, cols] = rewards
            storage.dones.numpy()[:, cols] = c.terminated | c.truncated
            if c.policy_version != self.policy_version:
                self._proximal(storage, cols)
        storage.step = storage.num_steps
        return {g: torch.from_numpy(np.concatenate([np.asarray(c.last_obs[g]) for c in chunks]))
                for g in self.obs_dims}

    @torch.no_grad()
    def _proximal(self, storage: RolloutStorage, cols: slice) -> None:
        """Decoupled PPO for the worlds ``cols`` acted by an older model: behaviour (mu, sigma,
        log_probs) [T, n, ...] replaced by the current policy's, advantages weighted by
        min(1, pi_prox / pi_behaviour) [T, n]."""
        t, n = storage.num_steps, cols.stop - cols.start
        obs = {g: storage.obs[g][:, cols].reshape(t * n, d) for g, d in self.obs_dims.items()}
        actions = storage.actions[:, cols].reshape(t * n, self.num_actions)
        mu, sigma = self.policy.action_mean_std(obs)
        log_probs = gaussian_log_prob(actions, mu, sigma).reshape(t, n)
        # Truncated importance weight of the behaviour sample under the proximal policy.
        weights = torch.exp(log_probs - storage.log_probs[:, cols]).clamp(max=1.0)
        if storage.weights is None:
            storage.weights = torch.ones(storage.num_steps, storage.num_envs)
        storage.weights[:, cols] = weights
        storage.mu[:, cols] = mu.reshape(t, n, -1)
        storage.sigma[:, cols] = sigma.reshape(t, n, -1)
        storage.log_probs[:, cols] = log_probs

    # ----------------------------------------------------------------------------- learn
    def learn(self, chunks: list[RolloutChunk]) -> dict[str, float]:
        """One iteration from ``chunks`` (same num_steps); metrics like the runner's."""
        if not chunks:
            raise ValueError('learn() needs at least one chunk')
        start = time.perf_counter()
        last_obs = self.fill(chunks)
        rollout = self._rollout_stats(chunks)
        weights = getattr(self.alg.storage, 'weights', None)  # decoupled PPO's only
        rollout['importance_weight'] = float(weights.mean()) if weights is not None else 1.0
        losses = self.update(last_obs)
        elapsed = time.perf_counter() - start
        for c in chunks:
            if c.episodes:
                self.episodes.record(c.episodes)
        lag = float(np.mean([self.policy_version - c.policy_version for c in chunks]))
        return self.end_iteration(sum(c.num_steps * c.num_envs for c in chunks), {
            'learn_s': elapsed, 'chunks': len(chunks), 'policy_lag': lag, **rollout, **losses})

    @staticmethod
    def _rollout_stats(chunks: list[RolloutChunk]) -> dict[str, float]:
        """The runner's rollout stats over all chunks (tracking errors and terrain levels
        world-weighted)."""
        rewards = np.concatenate([c.rewards for c in chunks], axis=1)
        stats = {'mean_reward': float(np.mean([float(r.mean()) for r in rewards])),
                 'diverged': int(sum(c.stats.get('diverged', 0.0) for c in chunks))}
        weights = np.array([c.num_envs for c in chunks], float)
        for key in chunks[0].stats:
            if key.startswith(('tracking_error/', 'terrain_level/')):
                values = [c.stats.get(key, float('nan')) for c in chunks]
                stats[key] = float(np.average(values, weights=weights)) if len(chunks) > 1 \
                    else float(values[0])
        return stats

    # ------------------------------------------------------------------------------ export
    def export_student(self, robot: Any, path: str | Path) -> bytes:
        """The student as ONNX (written atomically to ``path``) with ``policy_version`` and
        ``action_std`` [A] in its metadata (what actors sample with); returns its bytes."""
        std = [float(x) for x in self.policy.log_std.detach().exp()]
        export_onnx(self.policy, robot, path, action_clip=self.cfg.env.clip_actions,
                    obs_history=self.cfg.env.policy_history,
                    extra_metadata={'policy_version': self.policy_version, 'action_std': std,
                                    'iteration': self.iteration, 'total_steps': self.total_steps,
                                    'algorithm': self.cfg.algorithm,
                                    'terrain': to_dict(self.cfg.env.terrain)})
        return Path(path).read_bytes()
