"""On-policy training loop: ``train_one_epoch`` = collect_experience -> compute_gae ->
combined_loss updates -> update_teacher_with_ema, with checkpoints and logs (rsl_rl runner).

The runner is a :class:`~.learner.Learner` fed by its own env through the one rollout loop
(:func:`~.rollout.collect_rollout`); the live trainer is the same learner fed by actors'
chunks, so checkpoints of either resume in the other.
"""

from __future__ import annotations

from pathlib import Path
import time
from typing import Any, Callable

import torch

from . import checkpoint as ckpt
from ..config import ConfigError
from .learner import Learner
from .rollout import collect_rollout, obs_to_torch
from ..sim.env import VecLocomotionEnv
from ..sim.gym_vec import GymVecEnv
from .train_config import TrainConfig


def make_vec_env(cfg: TrainConfig) -> Any:
    """The batched env of a run: ``cfg.gym_env`` through GymVecEnv, else the robot env."""
    if cfg.gym_env:
        return GymVecEnv(cfg.gym_env, cfg.env.num_envs, seed=cfg.runner.seed)
    cfg.env.seed = cfg.runner.seed
    return VecLocomotionEnv(cfg.env)


def reward_terms(env: Any) -> list[str]:
    """``reward/<term>`` of every term of the env's reward manager (none for Gymnasium envs)."""
    manager = getattr(env, 'reward_manager', None)
    return [f'reward/{name}' for name in sorted(manager.scales)] if manager is not None else []


class OnPolicyRunner:
    """Trains a student with PPO or SAC (``cfg.algorithm``, + OPD) on a vec env that follows
    VecLocomotionEnv's contract. The loop is the same for both: SAC's storage is its replay
    buffer and its ``update`` takes ``utd_ratio`` gradient steps per collected transition."""

    def __init__(self, cfg: TrainConfig, run_dir: str | Path, env: Any | None = None):
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.env = env if env is not None else make_vec_env(cfg)
        self.learner = Learner(cfg, self.env.obs_dims, self.env.num_actions,
                               reward_terms(self.env), self.env)
        self.alg.init_storage(cfg.runner.num_steps_per_env, self.env.num_envs,
                              self.learner.obs_dims, self.env.num_actions)
        self.env_resumed = True  # False after resuming a checkpoint without env state
        self._stop = False
        obs, _ = self.env.reset()
        self.obs = obs_to_torch(obs)

    # The learner's state, read where the runner's own used to be.
    policy = property(lambda self: self.learner.policy)
    alg = property(lambda self: self.learner.alg)
    obs_dims = property(lambda self: self.learner.obs_dims)
    iteration = property(lambda self: self.learner.iteration)
    total_steps = property(lambda self: self.learner.total_steps)
    elapsed_s = property(lambda self: self.learner.elapsed_s)

    # ------------------------------------------------------------------------- the loop
    def collect_experience(self) -> dict[str, float]:
        """The student acts for num_steps_per_env steps in every world; rollout stats."""
        alg = self.alg

        def record(t, obs, actions, reward, terminated, truncated, extras, next_obs):
            final = obs_to_torch(extras['final_obs']) if 'final_obs' in extras else None
            alg.process_env_step(torch.as_tensor(reward),
                                 torch.as_tensor(terminated | truncated, dtype=torch.float32),
                                 torch.as_tensor(truncated, dtype=torch.float32), final,
                                 next_obs=next_obs)

        self.obs, summary = collect_rollout(self.env, self.obs, self.cfg.runner.num_steps_per_env,
                                            alg.act, record)
        for episode in summary.episodes:
            self.learner.episodes.record(episode)
        return summary.stats()

    def train_one_epoch(self) -> dict[str, float]:
        """collect_experience -> compute_gae -> combined_loss updates -> teacher EMA."""
        start = time.perf_counter()
        rollout = self.collect_experience()
        collect_s = time.perf_counter() - start
        losses = self.learner.update(self.obs)
        elapsed = time.perf_counter() - start
        steps = self.cfg.runner.num_steps_per_env * self.env.num_envs
        self.learner.elapsed_s += elapsed
        return self.learner.end_iteration(steps, {
            'steps_per_s': steps / elapsed,
            'collect_s': collect_s, 'learn_s': elapsed - collect_s,
            'wall_time_s': self.learner.elapsed_s, **rollout, **losses})

    def request_stop(self) -> None:
        """Finish the current iteration, save, and return from learn() (Ctrl-C)."""
        self._stop = True

    @property
    def stop_requested(self) -> bool:
        return self._stop

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
            self.learner.save_candidate(self.run_dir, lambda: {'robot': self._robot_metadata()})
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
        """The learner's state plus this loop's: env snapshot, current obs, robot."""
        return {**self.learner.state_dict(), **self._extras()}

    def _extras(self) -> dict[str, Any]:
        return {'env': self._env_state(), 'obs': {k: v.clone() for k, v in self.obs.items()},
                'robot': self._robot_metadata()}

    def _robot_metadata(self) -> dict[str, Any] | None:
        robot = getattr(self.env, 'robot', None)
        return robot.to_metadata() if robot is not None else None

    def _env_state(self) -> Any:
        # Envs that cannot snapshot themselves (some Gymnasium envs) still get checkpoints;
        # only the exact resume is unavailable for them.
        try:
            return ckpt.to_torch(self.env.get_state())
        except NotImplementedError:
            return None

    def save(self) -> Path:
        return self.learner.save(self.run_dir, self.cfg.runner.keep_checkpoints, self._extras())

    def load(self, path: str | Path) -> None:
        """Continue where the checkpoint left off: the learner exactly (model, teacher,
        optimiser, RNG, counters); the env too when the checkpoint holds its state. A
        checkpoint without one (the live trainer's, or an env that cannot snapshot itself)
        continues with the env's worlds just reset: ``env_resumed`` is then False."""
        payload = self.learner.load(path)
        self.env_resumed = payload.get('env') is not None
        if self.env_resumed:
            try:
                self.env.set_state(ckpt.to_numpy(payload['env']))
            except ValueError as exc:  # the env config differs from the run's (named in exc)
                raise ConfigError(str(path), 'env', str(exc)) from None
            self.obs = {k: v.clone() for k, v in payload['obs'].items()}

    def close(self) -> None:
        self.env.close()
