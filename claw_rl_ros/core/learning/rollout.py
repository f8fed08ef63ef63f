"""The one rollout loop: a policy acts in every world of a vec env for ``num_steps`` steps.

Both collectors run it: the offline runner records each step into the algorithm's storage
(``alg.process_env_step``), the live batched actor into a rollout chunk. What differs is only
the two callables, so the two paths cannot drift apart (test_chunk_learning.py checks them bit
for bit).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from .rollout_summary import RolloutSummary

Obs = dict[str, torch.Tensor]


def obs_to_torch(obs: dict[str, np.ndarray]) -> Obs:
    """{group: [N, d]} arrays as float32 tensors (no copy when already float32)."""
    return {k: torch.as_tensor(v, dtype=torch.float32) for k, v in obs.items()}


# act(obs [N, d] per group) -> env actions [N, A]
Act = Callable[[Obs], torch.Tensor]
# record(t, obs, actions, reward [N], terminated [N], truncated [N], extras, next_obs)
Record = Callable[[int, Obs, torch.Tensor, np.ndarray, np.ndarray, np.ndarray, dict, Obs],
                  None]


@torch.no_grad()
def collect_rollout(env: Any, obs: Obs, num_steps: int, act: Act,
                    record: Record) -> tuple[Obs, RolloutSummary]:
    """``num_steps`` steps of ``act`` in every world of ``env`` from ``obs``; each step goes to
    ``record``. Returns the observation after the last step and the summary."""
    summary = RolloutSummary()
    for t in range(num_steps):
        actions = act(obs)
        raw, reward, terminated, truncated, extras = env.step(actions.numpy())
        next_obs = obs_to_torch(raw)
        record(t, obs, actions, reward, terminated, truncated, extras, next_obs)
        summary.add(reward, extras)
        obs = next_obs
    return obs, summary
