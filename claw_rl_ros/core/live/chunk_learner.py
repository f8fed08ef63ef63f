"""The learning half of ``train_one_epoch`` fed by rollout chunks (the trainer's core).

``learn(chunks)`` stacks the chunks' worlds side by side into a :class:`RolloutStorage`
``[T, sum of N, ...]`` (time-outs bootstrapped with ``gamma * V(final_obs)``, values recomputed
by the learner's critic for actors without one), then runs the very same
:meth:`PPO.learn <..learning.ppo.PPO.learn>` as :class:`~..learning.runner.OnPolicyRunner`:
GAE, mini-batch epochs of combined_loss = PPO + alpha * KL(teacher || student) with gradient
clipping, the normaliser update and the EMA teacher. Built from the same seed, it starts from
the runner's exact weights.

Chunks acted by an older model (``max_policy_lag`` > 0, actors collecting while the trainer
learns) are corrected as in decoupled PPO (Hilton et al. 2021, "Batch size-invariance for
policy optimization"): the clipped ratio and the adaptive-KL schedule are taken against the
*proximal* policy (the learner's current one, which the update starts from), and each advantage
is weighted by the truncated importance weight min(1, pi_prox(a|s) / pi_behaviour(a|s))
(IMPALA's rho-bar = 1). Chunks of the current version are used exactly as the runner uses its
own rollout (weights 1, behaviour = proximal policy).
"""

from __future__ import annotations

from collections import deque
import hashlib
from pathlib import Path
import time
from typing import Any

import numpy as np
import torch

from ..learning import checkpoint as ckpt
from ..config import to_dict
from ..deploy.export import export_onnx
from ..learning.networks import ActorCritic, gaussian_log_prob
from ..learning.opd import alpha_at
from ..learning.ppo import PPO
from .rollout_chunk import ChunkSpec, RolloutChunk
from ..learning.runner import build_policy, load_teacher, mean_or_nan, record_episodes
from ..learning.storage import RolloutStorage
from ..learning.train_config import TrainConfig


def state_sha(policy: ActorCritic) -> str:
    """sha256 (hex) of the policy's state: a version name for in-process actors."""
    digest = hashlib.sha256()
    for name, value in policy.state_dict().items():
        digest.update(name.encode())
        digest.update(value.detach().cpu().numpy().tobytes())
    return digest.hexdigest()


class ChunkLearner:
    """PPO (+ OPD) student updated from rollout chunks; ``policy_version`` counts updates."""

    def __init__(self, cfg: TrainConfig, obs_dims: dict[str, int], num_actions: int,
                 reward_terms: list[str] | None = None):
        self.cfg = cfg
        r = cfg.runner
        # Seeded exactly as OnPolicyRunner, so both start from the same weights.
        torch.manual_seed(r.seed)
        if r.torch_threads:
            torch.set_num_threads(r.torch_threads)
        self.generator = torch.Generator().manual_seed(r.seed)
        self.obs_dims = dict(obs_dims)
        self.num_actions = num_actions
        self.policy = build_policy(cfg, self.obs_dims, num_actions)
        teacher = load_teacher(cfg, self.obs_dims, num_actions) \
            if cfg.distillation.teacher_mode == 'frozen' else None
        self.alg = self._make_algorithm(teacher)
        self.spec = ChunkSpec(r.num_steps_per_env, self.obs_dims, num_actions)
        self.reward_terms = list(reward_terms or [])
        self.iteration = 0
        self.policy_version = 0
        self.total_steps = 0
        self.elapsed_s = 0.0
        self.returns: deque[float] = deque(maxlen=200)
        self.lengths: deque[float] = deque(maxlen=200)
        self._episode_sums: dict[str, deque] = {}

    def _make_algorithm(self, teacher: Any) -> Any:
        """The update rule (PPO here; :class:`~.sac_chunk_learner.SACChunkLearner` makes SAC)."""
        return PPO(self.policy, self.cfg.ppo, self.cfg.distillation, teacher, self.generator)

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
        self.alg.progress = self.iteration / self.cfg.runner.max_iterations
        losses = self.alg.learn(last_obs, alpha_at(self.cfg.distillation, self.iteration))
        kl_teacher = losses.pop('kl_to_teacher', None)
        elapsed = time.perf_counter() - start
        steps = sum(c.num_steps * c.num_envs for c in chunks)
        self.iteration += 1
        self.policy_version += 1
        self.total_steps += steps
        for c in chunks:
            if c.episodes:
                record_episodes(self.returns, self.lengths, self._episode_sums, c.episodes)
        metrics = {'total_steps': self.total_steps, 'learn_s': elapsed, 'chunks': len(chunks),
                   'policy_lag': float(np.mean([self.policy_version - 1 - c.policy_version
                                                for c in chunks])),
                   **rollout, **losses}
        if kl_teacher is not None:
            metrics['kl_to_teacher'] = kl_teacher
        metrics['mean_episode_return'] = mean_or_nan(self.returns)
        metrics['mean_episode_length_s'] = mean_or_nan(self.lengths)
        for key in sorted(set(self.reward_terms) | set(self._episode_sums)):
            metrics[key] = mean_or_nan(self._episode_sums.get(key, ()))
        return metrics

    @staticmethod
    def _rollout_stats(chunks: list[RolloutChunk]) -> dict[str, float]:
        """The runner's rollout stats over all chunks (world-weighted)."""
        rewards = np.concatenate([c.rewards for c in chunks], axis=1)
        stats = {'mean_reward': float(np.mean([float(r.mean()) for r in rewards])),
                 'diverged': int(sum(c.stats.get('diverged', 0.0) for c in chunks))}
        weights = np.array([c.num_envs for c in chunks], float)
        for key in chunks[0].stats:
            if key.startswith('tracking_error/'):
                values = [c.stats.get(key, float('nan')) for c in chunks]
                stats[key] = float(np.average(values, weights=weights)) if len(chunks) > 1 \
                    else float(values[0])
        return stats

    # ------------------------------------------------------------------ export, checkpoints
    def export_student(self, robot: Any, path: str | Path) -> bytes:
        """The student as ONNX (written atomically to ``path``) with ``policy_version`` and
        ``action_std`` [A] in its metadata (what actors sample with); returns its bytes."""
        std = [float(x) for x in self.policy.log_std.detach().exp()]
        export_onnx(self.policy, robot, path, action_clip=self.cfg.env.clip_actions,
                    extra_metadata={'policy_version': self.policy_version, 'action_std': std,
                                    'iteration': self.iteration, 'total_steps': self.total_steps,
                                    'algorithm': self.cfg.algorithm})
        return Path(path).read_bytes()

    def state_dict(self) -> dict[str, Any]:
        """Everything to resume: weights, teacher, optimizer, counters, RNG, episode logs."""
        return {'iteration': self.iteration, 'policy_version': self.policy_version,
                'total_steps': self.total_steps, 'elapsed_s': self.elapsed_s,
                'config': to_dict(self.cfg),
                'obs_dims': self.obs_dims, 'num_actions': self.num_actions,
                'model': self.policy.state_dict(),
                'teacher': self.alg.teacher.state_dict() if self.alg.teacher is not None
                else None,
                **self._algorithm_state(),
                'rng': {'generator': self.generator.get_state()},
                'episodes': {'returns': list(self.returns), 'lengths': list(self.lengths),
                             'sums': {k: list(v) for k, v in self._episode_sums.items()}}}

    def _algorithm_state(self) -> dict[str, Any]:
        """The update rule's own state for :meth:`state_dict` (PPO: optimiser, adaptive lr)."""
        return {'optimizer': self.alg.optimizer.state_dict(),
                'learning_rate': self.alg.learning_rate}

    def _load_algorithm_state(self, payload: dict[str, Any]) -> None:
        self.alg.optimizer.load_state_dict(payload['optimizer'])
        self.alg.learning_rate = payload['learning_rate']

    def save(self, run_dir: str | Path, keep: int) -> Path:
        """An atomic checkpoint ``run_dir/checkpoints/model_<iteration>.pt`` (loadable by
        ``claw-rl export`` and as a frozen teacher)."""
        path = ckpt.checkpoint_path(run_dir, self.iteration)
        ckpt.save_checkpoint(path, self.state_dict())
        ckpt.prune_checkpoints(run_dir, keep)
        return path

    def load(self, path: str | Path) -> None:
        """Continue from a :meth:`save` checkpoint (same sizes)."""
        payload = ckpt.load_checkpoint(path)
        if payload['obs_dims'] != self.obs_dims or payload['num_actions'] != self.num_actions:
            raise ValueError(f'{path}: checkpoint has obs_dims {payload["obs_dims"]} and '
                             f'{payload["num_actions"]} actions, the trainer {self.obs_dims} '
                             f'and {self.num_actions}')
        self.policy.load_state_dict(payload['model'])
        if payload['teacher'] is not None and self.alg.teacher is not None:
            self.alg.teacher.load_state_dict(payload['teacher'])
        self._load_algorithm_state(payload)
        self.generator.set_state(payload['rng']['generator'])
        self.iteration = payload['iteration']
        self.policy_version = payload.get('policy_version', self.iteration)
        self.total_steps = payload['total_steps']
        self.elapsed_s = payload.get('elapsed_s', 0.0)
        episodes = payload['episodes']
        self.returns.extend(episodes['returns'])
        self.lengths.extend(episodes['lengths'])
        for k, v in episodes['sums'].items():
            self._episode_sums.setdefault(k, deque(maxlen=200)).extend(v)
