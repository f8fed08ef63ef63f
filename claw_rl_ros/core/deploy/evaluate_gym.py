"""Evaluate a trained student's deterministic action on a Gymnasium env (no robot, no ONNX)."""

from __future__ import annotations

import numpy as np
import torch

from ..sim.gym_vec import GymVecEnv


@torch.no_grad()
def evaluate_policy(policy: torch.nn.Module, env_id: str, episodes: int,
                    seed: int = 1000, num_envs: int = 4) -> np.ndarray:
    """Returns [episodes] of ``policy.act_inference`` on ``env_id``, episodes run in batches.

    Each copy's first episode counts; copies are seeded ``seed + i`` so runs are repeatable.
    """
    returns: list[float] = []
    batch = 0
    while len(returns) < episodes:
        n = min(num_envs, episodes - len(returns))
        env = GymVecEnv(env_id, n, seed=seed + batch * num_envs)
        obs, _ = env.reset()
        total, done = np.zeros(n), np.zeros(n, dtype=bool)
        while not done.all():
            tensors = {k: torch.as_tensor(v) for k, v in obs.items()}
            obs, reward, terminated, truncated, _ = env.step(policy.act_inference(tensors)
                                                             .numpy())
            # Sum each copy's first episode only (finished copies are reset inside step).
            total += reward * ~done
            done |= terminated | truncated
        env.close()
        returns.extend(total.tolist())
        batch += 1
    return np.asarray(returns)
