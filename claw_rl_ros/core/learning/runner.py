"""On-policy training loop: ``train_one_epoch`` = collect_experience -> compute_gae ->
combined_loss updates -> update_teacher_with_ema, with checkpoints and logs (rsl_rl runner)."""

from __future__ import annotations

from collections import deque
from pathlib import Path
import time
from typing import Any, Callable

import numpy as np
import torch

from . import checkpoint as ckpt
from ..config import ConfigError, to_dict
from ..sim.env import VecLocomotionEnv
from .networks import ActorCritic
from .opd import alpha_at
from .ppo import PPO
from .sac import SAC
from .sac_networks import SACPolicy
from .train_config import TrainConfig

# The trainer of each ``algorithm`` value: the only place the algorithm is chosen.
ALGORITHMS = {'ppo': PPO, 'sac': SAC}


def mean_or_nan(values) -> float:
    """The mean of ``values``; NaN when there are none (an iteration with no finished episode)."""
    return float(np.mean(values)) if len(values) else float('nan')


def obs_to_torch(obs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(v, dtype=torch.float32) for k, v in obs.items()}


def build_policy(cfg: TrainConfig, obs_dims: dict[str, int], num_actions: int,
                 env: Any | None = None) -> ActorCritic | SACPolicy:
    """The student of ``cfg.algorithm`` for the given observation group sizes.

    A SAC student squashes its actions into the env's action range (``action_low`` /
    ``action_high`` of a Gymnasium env, else +-``sac.action_bound``); the range is a buffer of
    the module, so a checkpoint restores it.
    """
    p = cfg.policy
    if cfg.algorithm == 'sac':
        bound = cfg.sac.action_bound
        return SACPolicy(
            sum(obs_dims[g] for g in p.actor_obs_groups),
            sum(obs_dims[g] for g in p.critic_obs_groups), num_actions,
            actor_hidden_dims=p.actor_hidden_dims, critic_hidden_dims=p.critic_hidden_dims,
            activation=p.activation, normalize_obs=p.normalize_obs,
            actor_obs_groups=p.actor_obs_groups, critic_obs_groups=p.critic_obs_groups,
            action_low=torch.as_tensor(getattr(env, 'action_low', -bound), dtype=torch.float32),
            action_high=torch.as_tensor(getattr(env, 'action_high', bound), dtype=torch.float32))
    policy = ActorCritic(
        sum(obs_dims[g] for g in p.actor_obs_groups),
        sum(obs_dims[g] for g in p.critic_obs_groups), num_actions,
        actor_hidden_dims=p.actor_hidden_dims, critic_hidden_dims=p.critic_hidden_dims,
        activation=p.activation, init_noise_std=p.init_noise_std, normalize_obs=p.normalize_obs,
        actor_obs_groups=p.actor_obs_groups, critic_obs_groups=p.critic_obs_groups,
        min_std=p.min_noise_std, obs_normalizer=p.obs_normalizer, init=p.init)
    return policy


def make_vec_env(cfg: TrainConfig) -> Any:
    """The batched env of a run: ``cfg.gym_env`` through GymVecEnv, else the robot env."""
    if cfg.gym_env:
        from ..sim.gym_vec import GymVecEnv
        return GymVecEnv(cfg.gym_env, cfg.env.num_envs, seed=cfg.runner.seed)
    cfg.env.seed = cfg.runner.seed
    return VecLocomotionEnv(cfg.env)


def load_policy(path: str | Path) -> tuple[ActorCritic, TrainConfig, dict[str, Any]]:
    """An actor-critic (with its config and the checkpoint payload) from a checkpoint file."""
    from ..config import from_dict
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


def record_episodes(returns: deque, lengths: deque, sums: dict[str, deque],
                    episode: dict[str, np.ndarray]) -> None:
    """Append finished episodes (``return``, ``length_s``, ``reward/<term>`` [E]) to the logs."""
    returns.extend(episode['return'].tolist())
    lengths.extend(episode['length_s'].tolist())
    for key, values in episode.items():
        if key.startswith('reward/'):
            # Per-term episode sums per second of episode, as legged_gym logs them.
            per_s = values / np.maximum(episode['length_s'], 1e-6)
            sums.setdefault(key, deque(maxlen=200)).extend(per_s.tolist())


class OnPolicyRunner:
    """Trains a student with PPO or SAC (``cfg.algorithm``, + OPD) on a vec env that follows
    VecLocomotionEnv's contract. The loop is the same for both: SAC's storage is its replay
    buffer and its ``update`` takes ``utd_ratio`` gradient steps per collected transition."""

    def __init__(self, cfg: TrainConfig, run_dir: str | Path, env: Any | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        r = cfg.runner
        torch.manual_seed(r.seed)
        if r.torch_threads:
            torch.set_num_threads(r.torch_threads)
        self.generator = torch.Generator().manual_seed(r.seed)
        if env is None:
            env = make_vec_env(cfg)
        self.env = env
        self.obs_dims = dict(env.obs_dims)
        self.policy = build_policy(cfg, self.obs_dims, env.num_actions, env)
        teacher = self._load_teacher() if cfg.distillation.teacher_mode == 'frozen' else None
        self.alg = ALGORITHMS[cfg.algorithm](self.policy, getattr(cfg, cfg.algorithm),
                                             cfg.distillation, teacher, self.generator)
        self.alg.init_storage(r.num_steps_per_env, env.num_envs, self.obs_dims, env.num_actions)
        self.iteration = 0
        self.total_steps = 0
        self.elapsed_s = 0.0
        self.returns: deque[float] = deque(maxlen=200)
        self.lengths: deque[float] = deque(maxlen=200)
        self._episode_sums: dict[str, deque] = {}
        self._stop = False
        obs, _ = env.reset()
        self.obs = obs_to_torch(obs)

    # ------------------------------------------------------------------------- the loop
    def collect_experience(self) -> dict[str, float]:
        """The student acts for num_steps_per_env steps in every world; rollout stats."""
        rewards, errors = [], []
        diverged = 0
        for _ in range(self.cfg.runner.num_steps_per_env):
            actions = self.alg.act(self.obs)
            obs, reward, terminated, truncated, extras = self.env.step(actions.numpy())
            final = obs_to_torch(extras['final_obs']) if 'final_obs' in extras else None
            done = torch.as_tensor(terminated | truncated, dtype=torch.float32)
            self.obs = obs_to_torch(obs)
            self.alg.process_env_step(torch.as_tensor(reward), done,
                                      torch.as_tensor(truncated, dtype=torch.float32), final,
                                      next_obs=self.obs)
            rewards.append(float(reward.mean()))
            errors.append(extras.get('tracking_error', {}))
            diverged += extras.get('diverged', 0)
            if 'episode' in extras:
                self._record_episodes(extras['episode'])
        stats = {'mean_reward': float(np.mean(rewards)), 'diverged': diverged}
        for key in errors[0]:
            stats[f'tracking_error/{key}'] = float(np.mean([e[key] for e in errors]))
        return stats

    def _record_episodes(self, episode: dict[str, np.ndarray]) -> None:
        record_episodes(self.returns, self.lengths, self._episode_sums, episode)

    def train_one_epoch(self) -> dict[str, float]:
        """collect_experience -> compute_gae -> combined_loss updates -> teacher EMA."""
        start = time.perf_counter()
        rollout = self.collect_experience()
        collect_s = time.perf_counter() - start
        self.alg.progress = self.iteration / self.cfg.runner.max_iterations
        losses = self.alg.learn(self.obs, alpha_at(self.cfg.distillation, self.iteration))
        kl_teacher = losses.pop('kl_to_teacher', None)
        elapsed = time.perf_counter() - start
        steps = self.cfg.runner.num_steps_per_env * self.env.num_envs
        self.iteration += 1
        self.total_steps += steps
        self.elapsed_s += elapsed
        metrics = {'total_steps': self.total_steps, 'steps_per_s': steps / elapsed,
                   'collect_s': collect_s, 'learn_s': elapsed - collect_s,
                   'wall_time_s': self.elapsed_s, **rollout, **losses}
        if kl_teacher is not None:
            metrics['kl_to_teacher'] = kl_teacher
        # The same columns every iteration (NaN until the first episodes end), so metrics.csv
        # keeps them all.
        metrics['mean_episode_return'] = mean_or_nan(self.returns)
        metrics['mean_episode_length_s'] = mean_or_nan(self.lengths)
        for key in self._reward_terms():
            metrics[key] = mean_or_nan(self._episode_sums.get(key, ()))
        return metrics

    def _reward_terms(self) -> list[str]:
        manager = getattr(self.env, 'reward_manager', None)
        names = sorted(manager.scales) if manager is not None else []
        return [f'reward/{name}' for name in names]

    def request_stop(self) -> None:
        """Finish the current iteration, save, and return from learn() (Ctrl-C)."""
        self._stop = True

    def learn(self, on_iteration: Callable[[int, dict], None] | None = None) -> dict[str, Any]:
        """Iterate until max_iterations, the time budget, or request_stop(); returns a summary."""
        r = self.cfg.runner
        metrics: dict[str, float] = {}
        start_iteration, start_elapsed = self.iteration, self.elapsed_s
        while self.iteration < r.max_iterations and not self._stop:
            if r.time_budget_s and self.elapsed_s >= r.time_budget_s:
                break
            metrics = self.train_one_epoch()
            if on_iteration is not None:
                on_iteration(self.iteration, metrics)
            if self.iteration % r.save_interval == 0:
                self.save()
        if self.iteration != self._last_saved():
            self.save()
        return {'iterations': self.iteration - start_iteration,
                'seconds': self.elapsed_s - start_elapsed, 'stopped': self._stop,
                'final_metrics': metrics}

    # ----------------------------------------------------------------------- checkpoints
    def _last_saved(self) -> int | None:
        latest = ckpt.latest_checkpoint(self.run_dir)
        return int(latest.stem.split('_')[1]) if latest else None

    def state_dict(self) -> dict[str, Any]:
        return {
            'iteration': self.iteration, 'total_steps': self.total_steps,
            'elapsed_s': self.elapsed_s, 'config': to_dict(self.cfg),
            'obs_dims': self.obs_dims, 'num_actions': self.env.num_actions,
            'model': self.policy.state_dict(),
            'teacher': self.alg.teacher.state_dict() if self.alg.teacher is not None else None,
            'algorithm_state': self.alg.state_dict(),
            'rng': {'torch': torch.get_rng_state(), 'generator': self.generator.get_state()},
            'env': self._env_state(),
            'obs': {k: v.clone() for k, v in self.obs.items()},
            'episodes': {'returns': list(self.returns), 'lengths': list(self.lengths),
                         'sums': {k: list(v) for k, v in self._episode_sums.items()}},
            'robot': getattr(self.env, 'robot', None).to_metadata()
            if hasattr(self.env, 'robot') else None,
        }

    def _env_state(self) -> Any:
        # Envs that cannot snapshot themselves (some Gymnasium envs) still get checkpoints;
        # only the exact resume is unavailable for them.
        try:
            return ckpt.to_torch(self.env.get_state())
        except NotImplementedError:
            return None

    def save(self) -> Path:
        path = ckpt.checkpoint_path(self.run_dir, self.iteration)
        ckpt.save_checkpoint(path, self.state_dict())
        ckpt.prune_checkpoints(self.run_dir, self.cfg.runner.keep_checkpoints)
        return path

    def load(self, path: str | Path) -> None:
        """Continue exactly where the checkpoint left off (model, optimizer, env, RNG)."""
        payload = ckpt.load_checkpoint(path)
        if payload.get('config', {}).get('algorithm', 'ppo') != self.cfg.algorithm:
            raise ConfigError(str(path), 'algorithm', f'checkpoint was trained with '
                              f'{payload["config"].get("algorithm", "ppo")}, this run uses '
                              f'{self.cfg.algorithm}; resume with the same algorithm')
        if payload['obs_dims'] != self.obs_dims or payload['num_actions'] != self.env.num_actions:
            raise ConfigError(str(path), 'obs_dims', f'checkpoint was trained with '
                              f'{payload["obs_dims"]}, this env has {self.obs_dims}')
        self.policy.load_state_dict(payload['model'])
        if payload['teacher'] is not None and self.alg.teacher is not None:
            self.alg.teacher.load_state_dict(payload['teacher'])
        # Checkpoints from before algorithm_state kept PPO's optimizer at the top level.
        self.alg.load_state_dict(payload.get('algorithm_state') or {
            'optimizer': payload['optimizer'], 'learning_rate': payload['learning_rate']})
        torch.set_rng_state(payload['rng']['torch'])
        self.generator.set_state(payload['rng']['generator'])
        if payload['env'] is None:
            raise ConfigError(str(path), 'env', 'this checkpoint has no env state (the env '
                              'cannot save it), so training cannot resume exactly; start a new '
                              'run with distillation.teacher_checkpoint or export it instead')
        self.env.set_state(ckpt.to_numpy(payload['env']))
        self.obs = {k: v.clone() for k, v in payload['obs'].items()}
        self.iteration = payload['iteration']
        self.total_steps = payload['total_steps']
        self.elapsed_s = payload['elapsed_s']
        episodes = payload['episodes']
        self.returns.extend(episodes['returns'])
        self.lengths.extend(episodes['lengths'])
        for k, v in episodes['sums'].items():
            self._episode_sums.setdefault(k, deque(maxlen=200)).extend(v)

    def _load_teacher(self) -> ActorCritic | SACPolicy:
        return load_teacher(self.cfg, self.obs_dims, self.env.num_actions)

    def close(self) -> None:
        self.env.close()
