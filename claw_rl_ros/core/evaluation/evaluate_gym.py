"""Evaluate a trained student's deterministic action on a Gymnasium env: the torch policy of a
checkpoint or the exported ONNX model (no robot)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from ..sim.gym_vec import GymVecEnv


def deterministic_actor(policy: Any) -> Callable[[np.ndarray], np.ndarray]:
    """``obs [N, obs_dim] float32 -> actions [N, A]`` of a torch student (its
    ``act_inference``) or of an :class:`~..export.onnx_policy.OnnxPolicy` (called as is)."""
    if not isinstance(policy, torch.nn.Module):
        return policy

    @torch.no_grad()
    def act(obs: np.ndarray) -> np.ndarray:
        return policy.act_inference({'policy': torch.as_tensor(obs)}).numpy()
    return act


def evaluate_policy(policy: Any, env_id: str, episodes: int,
                    seed: int = 1000, num_envs: int = 4) -> np.ndarray:
    """Returns [episodes] of ``policy``'s deterministic action on ``env_id``, episodes run in
    batches; ``policy`` is a torch student or an OnnxPolicy.

    Each copy's first episode counts; copies are seeded ``seed + i`` so runs are repeatable.
    """
    act = deterministic_actor(policy)
    returns: list[float] = []
    batch = 0
    while len(returns) < episodes:
        n = min(num_envs, episodes - len(returns))
        env = GymVecEnv(env_id, n, seed=seed + batch * num_envs)
        obs, _ = env.reset()
        total, done = np.zeros(n), np.zeros(n, dtype=bool)
        while not done.all():
            obs, reward, terminated, truncated, _ = env.step(act(obs['policy']))
            # Sum each copy's first episode only (finished copies are reset inside step).
            total += reward * ~done
            done |= terminated | truncated
        env.close()
        returns.extend(total.tolist())
        batch += 1
    return np.asarray(returns)
