"""Observation windows travel as frames: a chunk of a student with memory carries each step's
newest frame, not its whole window.

A student that reads H frames (``env.policy_history``) acts on windows [T, N, H * D] in which
all frames but the newest were sent the step before: H times the data (2,350 floats a step for
a 50-frame window of the claw quadruped instead of 47). Its chunk carries instead

- ``head/<group>`` [N, (H - 1) * D]: the older frames of each world's window at step 0;
- ``frames/<group>`` [T + 1, N, D]: the newest frame of each step's window, and of the window
  after the last step (the chunk's ``last_obs``);
- ``final_obs/<group>`` [K, D]: the newest frame of each time-out's final window;

and the receiver rebuilds the windows with the episode ends of the chunk: a world whose episode
ended at step t - 1 starts its window at step t on that frame repeated, as
:class:`~..sim.observations.ObservationHistory` does. The actor rebuilds the windows itself
before it sends and sends whole windows when any differs (an env that does not keep its windows
that way), so a compact chunk always decodes to the observations the actor acted on, bit for
bit.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np


def restarts(terminated: np.ndarray, truncated: np.ndarray) -> np.ndarray:
    """[T + 1, N] bool: the worlds whose window starts anew at each step (an episode ended
    the step before); step 0 continues the head."""
    out = np.zeros((terminated.shape[0] + 1, terminated.shape[1]), bool)
    out[1:] = terminated | truncated
    return out


def window_sources(restart: np.ndarray, history: int) -> np.ndarray:
    """[S, N, H] int: which frame fills each slot of each window, as an index into a world's
    frame sequence ``[H - 1 head frames, S step frames]``; ``restart`` [S, N] bool."""
    steps = np.arange(restart.shape[0])[:, None]
    # The step each world's window last started on; -(H - 1): before the chunk (the head).
    start = np.maximum.accumulate(np.where(restart, steps, -(history - 1)), axis=0)
    # Slot k of the window at step t holds step t - H + 1 + k, or the start frame before it.
    source = np.maximum(steps[:, :, None] - (history - 1) + np.arange(history),
                        start[:, :, None])
    return source + history - 1


def rebuild_windows(head: np.ndarray, frames: np.ndarray, restart: np.ndarray,
                    history: int) -> np.ndarray:
    """Windows [S, N, H * D] from ``head`` [N, (H - 1) * D], ``frames`` [S, N, D] and
    ``restart`` [S, N] bool (:func:`restarts`)."""
    num_steps, num_envs, dim = frames.shape
    # Per world: the head's H - 1 frames, then one frame per step: [N, H - 1 + S, D].
    sequence = np.concatenate([np.asarray(head).reshape(num_envs, history - 1, dim),
                               np.asarray(frames).transpose(1, 0, 2)], axis=1)
    source = window_sources(restart, history)
    windows = sequence[np.arange(num_envs)[None, :, None], source]
    return windows.reshape(num_steps, num_envs, history * dim).astype(np.float32, copy=False)


def final_windows(windows: np.ndarray, truncated: np.ndarray,
                  final_frames: np.ndarray) -> np.ndarray:
    """[K, H * D]: each time-out's window moved on by its final frame [K, D] (rows in the
    row-major order of ``np.nonzero(truncated)``)."""
    dim = final_frames.shape[-1]
    rows = windows[:-1][np.nonzero(truncated)]
    return np.concatenate([rows[:, dim:], final_frames], axis=1).astype(np.float32, copy=False)


def compact_group(obs: np.ndarray, last_obs: np.ndarray, final_obs: np.ndarray,
                  restart: np.ndarray, truncated: np.ndarray,
                  history: int) -> dict[str, np.ndarray] | None:
    """``{'head', 'frames', 'final'}`` of one group's windows ``obs`` [T, N, H * D],
    ``last_obs`` [N, H * D] and ``final_obs`` [K, H * D], or None when the windows rebuilt from
    them are not exactly these (then the whole windows travel)."""
    dim = obs.shape[-1] // history
    head = obs[0, :, :-dim]
    frames = np.concatenate([obs[:, :, -dim:], last_obs[None, :, -dim:]])
    final = final_obs[:, -dim:]
    windows = rebuild_windows(head, frames, restart, history)
    if not (np.array_equal(windows[:-1], obs) and np.array_equal(windows[-1], last_obs)
            and np.array_equal(final_windows(windows, truncated, final), final_obs)):
        return None
    return {'head': head, 'frames': frames, 'final': final}


def expand_group(head: np.ndarray, frames: np.ndarray, final: np.ndarray,
                 restart: np.ndarray, truncated: np.ndarray,
                 history: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(obs [T, N, H * D], last_obs [N, H * D], final_obs [K, H * D]) of one compact group."""
    windows = rebuild_windows(head, frames, restart, history)
    return windows[:-1], windows[-1], final_windows(windows, truncated, final)


def window_dims(obs_dims: Mapping[str, int], windows: Mapping[str, int]) -> dict[str, int]:
    """Frame width D of every windowed group (its dim / H)."""
    return {g: obs_dims[g] // h for g, h in windows.items()}
