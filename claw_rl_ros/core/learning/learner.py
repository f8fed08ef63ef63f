"""The learning state of a run, shared by the offline runner and the live trainer.

:class:`Learner` is rsl_rl's runner without the env: the student, its teacher and algorithm
(PPO or SAC, chosen by ``cfg.algorithm`` in :data:`ALGORITHMS`), the seeded generator, the
counters (iteration, policy version, env steps, wall time) and the episode statistics. The
offline :class:`~.runner.OnPolicyRunner` feeds it from its own env; the live
:class:`~..live.chunk_learner.ChunkLearner` is a Learner fed by rollout chunks. Both write one
checkpoint layout (:meth:`Learner.state_dict`), so a checkpoint of ``claw-rl train`` resumes in
the live train graph and the other way round. The algorithm owns its own state
(``alg.state_dict()``: optimiser(s), learning rate, temperature, target critics, replay).

Checkpoint entries (``checkpoint.save_checkpoint`` adds ``format``):

- ``config``, ``obs_dims``, ``num_actions``, ``model``, ``teacher``: what a student, teacher or
  export needs;
- ``algorithm_state``: the algorithm's :meth:`state_dict`;
- ``iteration``, ``policy_version``, ``total_steps``, ``elapsed_s``, ``episodes``, ``rng``
  (global torch RNG and the learner's generator): the run's bookkeeping;
- whatever the loop adds: the offline runner ``env``, ``obs`` and ``robot``, the live trainer
  ``chunk_counters`` and ``robot``.
"""

from __future__ import annotations

from collections import deque
import math
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch

from . import checkpoint as ckpt
from ..config import ConfigError, from_dict, to_dict
from .mirror_augmentation import build_obs_mirror
from .networks import ActorCritic
from .opd import alpha_at
from .ppo import PPO
from .run_artifacts import run_ended
from .sac import SAC
from .sac_networks import SACPolicy
from .train_config import TrainConfig

# The trainer of each ``algorithm`` value: the only place the algorithm is chosen.
ALGORITHMS = {'ppo': PPO, 'sac': SAC}
# Finished episodes the running means are taken over (rsl_rl keeps 100, legged_gym 200).
EPISODE_WINDOW = 200


def mean_or_nan(values) -> float:
    """The mean of ``values``; NaN when there are none (an iteration with no finished episode)."""
    return float(np.mean(values)) if len(values) else float('nan')


class EpisodeStats:
    """Running means over the last :data:`EPISODE_WINDOW` finished episodes: return, length
    and every reward term per second of episode."""

    def __init__(self, reward_terms: Iterable[str] = ()):
        self.reward_terms = list(reward_terms)
        self.returns: deque[float] = deque(maxlen=EPISODE_WINDOW)
        self.lengths: deque[float] = deque(maxlen=EPISODE_WINDOW)
        self.sums: dict[str, deque] = {}

    def record(self, episode: dict[str, np.ndarray]) -> None:
        """Finished episodes (``return``, ``length_s``, ``reward/<term>`` [E] each)."""
        self.returns.extend(np.asarray(episode['return']).tolist())
        self.lengths.extend(np.asarray(episode['length_s']).tolist())
        for key, values in episode.items():
            if key.startswith('reward/'):
                # Per-term episode sums per second of episode, as legged_gym logs them.
                per_s = values / np.maximum(episode['length_s'], 1e-6)
                self.sums.setdefault(key, deque(maxlen=EPISODE_WINDOW)).extend(per_s.tolist())

    def metrics(self) -> dict[str, float]:
        """The same columns every iteration (NaN until the first episodes end), so metrics.csv
        keeps them all."""
        out = {'mean_episode_return': mean_or_nan(self.returns),
               'mean_episode_length_s': mean_or_nan(self.lengths)}
        for key in sorted(set(self.reward_terms) | set(self.sums)):
            out[key] = mean_or_nan(self.sums.get(key, ()))
        return out

    def state_dict(self) -> dict[str, Any]:
        return {'returns': list(self.returns), 'lengths': list(self.lengths),
                'sums': {k: list(v) for k, v in self.sums.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.returns.extend(state['returns'])
        self.lengths.extend(state['lengths'])
        for k, v in state['sums'].items():
            self.sums.setdefault(k, deque(maxlen=EPISODE_WINDOW)).extend(v)


def build_policy(cfg: TrainConfig, obs_dims: dict[str, int], num_actions: int,
                 env: Any | None = None) -> ActorCritic | SACPolicy:
    """The student of ``cfg.algorithm`` for the given observation group sizes.

    A SAC student squashes its actions into the env's action range (``action_low`` /
    ``action_high`` of a Gymnasium env, else +-``sac.action_bound``); the range is a buffer of
    the module, so a checkpoint restores it.
    """
    p = cfg.policy
    sizes = (sum(obs_dims[g] for g in p.actor_obs_groups),
             sum(obs_dims[g] for g in p.critic_obs_groups), num_actions)
    common = {'actor_hidden_dims': p.actor_hidden_dims, 'critic_hidden_dims': p.critic_hidden_dims,
              'activation': p.activation, 'normalize_obs': p.normalize_obs,
              'actor_obs_groups': p.actor_obs_groups, 'critic_obs_groups': p.critic_obs_groups}
    if cfg.algorithm == 'sac':
        bound = cfg.sac.action_bound
        return SACPolicy(
            *sizes, **common,
            action_low=torch.as_tensor(getattr(env, 'action_low', -bound), dtype=torch.float32),
            action_high=torch.as_tensor(getattr(env, 'action_high', bound), dtype=torch.float32))
    return ActorCritic(*sizes, **common, init_noise_std=p.init_noise_std, min_std=p.min_noise_std,
                       obs_normalizer=p.obs_normalizer, init=p.init,
                       history_encoder=p.history_encoder, history=cfg.env.policy_history)


def load_policy(path: str | Path) -> tuple[ActorCritic | SACPolicy, TrainConfig, dict[str, Any]]:
    """A student (with its config and the checkpoint payload) from a checkpoint file."""
    payload = ckpt.load_checkpoint(path)
    cfg = from_dict(TrainConfig, payload['config'], source=f'{path}:config')
    policy = build_policy(cfg, payload['obs_dims'], payload['num_actions'])
    policy.load_state_dict(payload['model'])
    return policy, cfg, payload


def load_teacher(cfg: TrainConfig, obs_dims: dict[str, int],
                 num_actions: int) -> ActorCritic | SACPolicy:
    """The frozen teacher of ``cfg.distillation``, checked against the algorithm and sizes."""
    path = cfg.distillation.teacher_checkpoint
    teacher, teacher_cfg, payload = load_policy(path)
    if teacher_cfg.algorithm != cfg.algorithm:
        raise ConfigError(str(path), 'algorithm', f'teacher was trained with '
                          f'{teacher_cfg.algorithm}, the student uses {cfg.algorithm}: their '
                          "action distributions live in different spaces (SAC's are pre-tanh); "
                          'use a teacher trained with the same algorithm')
    if payload['num_actions'] != num_actions:
        raise ConfigError(str(path), 'num_actions', f'teacher has {payload["num_actions"]} '
                          f'actions, the robot {num_actions}')
    for group in teacher.actor_obs_groups:
        if payload['obs_dims'].get(group) != obs_dims.get(group):
            raise ConfigError(str(path), 'obs_dims', f'teacher observation group {group!r} '
                              f'has {payload["obs_dims"].get(group)} values, the env '
                              f'{obs_dims.get(group)}')
    return teacher


class Learner:
    """Student + teacher + algorithm + the run's counters; see the module docstring.

    Seeded from ``cfg.runner.seed`` (global torch RNG and the learner's generator), so every
    loop built from the same config starts from the same weights. ``env`` only gives a SAC
    student its action range (a Gymnasium env's bounds).
    """

    def __init__(self, cfg: TrainConfig, obs_dims: dict[str, int], num_actions: int,
                 reward_terms: Iterable[str] = (), env: Any | None = None):
        self.cfg = cfg
        r = cfg.runner
        torch.manual_seed(r.seed)
        if r.torch_threads:
            torch.set_num_threads(r.torch_threads)
        self.generator = torch.Generator().manual_seed(r.seed)
        self.obs_dims = dict(obs_dims)
        self.num_actions = num_actions
        self.policy = build_policy(cfg, self.obs_dims, num_actions, env)
        teacher = load_teacher(cfg, self.obs_dims, num_actions) \
            if cfg.distillation.teacher_mode == 'frozen' else None
        self.alg = ALGORITHMS[cfg.algorithm](self.policy, getattr(cfg, cfg.algorithm),
                                             cfg.distillation, teacher, self.generator)
        if cfg.algorithm == 'ppo' and cfg.ppo.symmetry.enabled:
            self.alg.mirror = build_obs_mirror(cfg, self.obs_dims, num_actions)
        self.iteration = 0
        self.policy_version = 0  # updates of the student (the live trainer's model version)
        self.total_steps = 0
        self.elapsed_s = 0.0
        self.episodes = EpisodeStats(reward_terms)
        self._snapshot_slot = 0  # whole runner.selection.every_s periods snapshotted so far

    # ----------------------------------------------------------------------------- learn
    def update(self, last_obs: dict[str, torch.Tensor]) -> dict[str, float]:
        """The algorithm's learning step on the collected data (returns from [N, d]
        ``last_obs``, combined_loss updates, normaliser, teacher EMA) at this iteration's
        alpha and schedule; mean losses (``kl_to_teacher`` last, with a teacher)."""
        self.alg.progress = self.iteration / self.cfg.runner.max_iterations
        losses = self.alg.learn(last_obs, alpha_at(self.cfg.distillation, self.iteration))
        kl_teacher = losses.pop('kl_to_teacher', None)
        if kl_teacher is not None:
            losses['kl_to_teacher'] = kl_teacher
        return losses

    def end_iteration(self, steps: int, metrics: dict[str, float]) -> dict[str, float]:
        """Count the iteration and its ``steps`` env steps; the loop's ``metrics`` between
        ``total_steps`` and the episode means (the columns both loops log)."""
        self.iteration += 1
        self.policy_version += 1
        self.total_steps += steps
        return {'total_steps': self.total_steps, **metrics, **self.episodes.metrics()}

    # ----------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything to resume in one layout (module docstring), without the loop's extras."""
        return {
            'config': to_dict(self.cfg), 'obs_dims': self.obs_dims,
            'num_actions': self.num_actions, 'model': self.policy.state_dict(),
            'teacher': self.alg.teacher.state_dict() if self.alg.teacher is not None else None,
            'algorithm_state': self.alg.state_dict(),
            'iteration': self.iteration, 'policy_version': self.policy_version,
            'total_steps': self.total_steps, 'elapsed_s': self.elapsed_s,
            'episodes': self.episodes.state_dict(),
            'rng': {'torch': torch.get_rng_state(), 'generator': self.generator.get_state()}}

    def load_state_dict(self, payload: dict[str, Any], source: str) -> None:
        """Continue from a :meth:`state_dict` (of either loop); ConfigError naming ``source``
        when its algorithm or sizes differ, or when it predates this layout."""
        algorithm = payload.get('config', {}).get('algorithm', 'ppo')
        if algorithm != self.cfg.algorithm:
            raise ConfigError(source, 'algorithm', f'checkpoint was trained with {algorithm}, '
                              f'this run uses {self.cfg.algorithm}; resume with the same '
                              'algorithm')
        if payload['obs_dims'] != self.obs_dims or payload['num_actions'] != self.num_actions:
            raise ConfigError(source, 'obs_dims', f'checkpoint was trained with '
                              f'{payload["obs_dims"]} and {payload["num_actions"]} actions, '
                              f'this run has {self.obs_dims} and {self.num_actions}')
        if 'algorithm_state' not in payload:
            raise ConfigError(source, 'algorithm_state', 'checkpoint predates the shared '
                              'learner layout (no algorithm_state): export it, or use it as '
                              'distillation.teacher_checkpoint of a new run')
        self.policy.load_state_dict(payload['model'])
        if payload['teacher'] is not None and self.alg.teacher is not None:
            self.alg.teacher.load_state_dict(payload['teacher'])
        self.alg.load_state_dict(payload['algorithm_state'])
        if 'torch' in payload['rng']:
            torch.set_rng_state(payload['rng']['torch'])
        self.generator.set_state(payload['rng']['generator'])
        self.iteration = payload['iteration']
        self.policy_version = payload.get('policy_version', self.iteration)
        self.total_steps = payload['total_steps']
        self.elapsed_s = payload['elapsed_s']
        self.episodes.load_state_dict(payload['episodes'])
        self._snapshot_slot = self._slot()

    def save(self, run_dir: str | Path, keep: int, extra: dict[str, Any] | None = None) -> Path:
        """An atomic checkpoint ``run_dir/checkpoints/model_<iteration>.pt`` (with the loop's
        ``extra`` entries) keeping the ``keep`` newest; loadable by ``claw-rl export``, as a
        frozen teacher and by either loop."""
        path = ckpt.checkpoint_path(run_dir, self.iteration)
        ckpt.save_checkpoint(path, {**self.state_dict(), **(extra or {})})
        ckpt.prune_checkpoints(run_dir, keep)
        return path

    def save_candidate(self, run_dir: str | Path,
                       extra: Callable[[], dict[str, Any]] | None = None) -> Path | None:
        """Once per ``runner.selection.every_s`` of training (when selection is on): the
        student alone as ``run_dir/candidates/model_<iteration>.pt`` (config, sizes, weights,
        counters and the loop's ``extra()`` entries, asked for only when a snapshot is due:
        loadable by :func:`load_policy` and ``claw-rl export``), keeping the
        ``selection.candidates`` newest; None when none is due or the run has ended (its
        student competes as the final one)."""
        sel = self.cfg.runner.selection
        slot = self._slot()
        # The last iteration's student competes as the final one, not as a snapshot.
        if not sel.candidates or slot <= self._snapshot_slot or \
                run_ended(self.cfg.runner, self.iteration, self.elapsed_s):
            return None
        self._snapshot_slot = slot
        path = ckpt.checkpoint_path(run_dir, self.iteration, ckpt.CANDIDATES)
        ckpt.save_checkpoint(path, {
            'config': to_dict(self.cfg), 'obs_dims': self.obs_dims,
            'num_actions': self.num_actions, 'model': self.policy.state_dict(),
            'iteration': self.iteration, 'policy_version': self.policy_version,
            'total_steps': self.total_steps, 'elapsed_s': self.elapsed_s,
            **(extra() if extra is not None else {})})
        ckpt.prune_checkpoints(run_dir, sel.candidates, ckpt.CANDIDATES)
        return path

    def _slot(self) -> int:
        # Whole selection periods in the training time so far (0 for a non-finite time).
        slot = self.elapsed_s // self.cfg.runner.selection.every_s
        return int(slot) if math.isfinite(slot) else 0

    def load(self, path: str | Path) -> dict[str, Any]:
        """:meth:`load_state_dict` from a checkpoint file; returns the payload (its extras)."""
        payload = ckpt.load_checkpoint(path)
        self.load_state_dict(payload, str(path))
        return payload
