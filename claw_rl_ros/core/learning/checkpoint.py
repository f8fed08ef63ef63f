"""Atomic checkpoint files (:func:`~claw_rl_ros.core.io.atomic_write_bytes`), loaded with
``weights_only=True``."""

from __future__ import annotations

import io
from pathlib import Path
import re
from typing import Any

import numpy as np
import torch

from ..config import ConfigError
from ..io import atomic_write_bytes

CHECKPOINT_FORMAT = 1
# The learner's checkpoints, and the student snapshots that compete at the end of a run.
CHECKPOINTS = 'checkpoints'
CANDIDATES = 'candidates'
_NAME = re.compile(r'^model_(\d+)\.pt$')


def to_torch(tree: Any) -> Any:
    """numpy arrays -> tensors (recursively), so ``weights_only`` loading accepts them."""
    if isinstance(tree, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(tree))
    if isinstance(tree, dict):
        return {k: to_torch(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_torch(v) for v in tree)
    return tree


def to_numpy(tree: Any) -> Any:
    """Inverse of :func:`to_torch`."""
    if isinstance(tree, torch.Tensor):
        return tree.numpy()
    if isinstance(tree, dict):
        return {k: to_numpy(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_numpy(v) for v in tree)
    return tree


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    """Serialise ``payload`` (tensors, numbers, strings, dicts, lists) atomically."""
    buffer = io.BytesIO()
    torch.save({'format': CHECKPOINT_FORMAT, **payload}, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint safely (``weights_only=True``); a clear error if it is not one."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), '', 'checkpoint not found; give an existing .pt file')
    try:
        payload = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means "not a checkpoint"
        raise ConfigError(str(path), '', f'not a readable checkpoint ({type(exc).__name__}: '
                          f'{exc})') from None
    if not isinstance(payload, dict) or payload.get('format') != CHECKPOINT_FORMAT:
        raise ConfigError(str(path), '', 'not a claw_rl_ros checkpoint (format mismatch)')
    return payload


def checkpoint_entry(path: str | Path, key: str, default: Any = None) -> Any:
    """One entry of a readable checkpoint, its tensors memory-mapped rather than read (a
    checkpoint with a replay buffer is large)."""
    payload = torch.load(path, map_location='cpu', weights_only=True, mmap=True)
    return payload.get(key, default)


def checkpoint_path(run_dir: str | Path, iteration: int, folder: str = CHECKPOINTS) -> Path:
    return Path(run_dir) / folder / f'model_{iteration}.pt'


def checkpoints_by_iteration(run_dir: str | Path,
                             folder: str = CHECKPOINTS) -> list[tuple[int, Path]]:
    """(iteration, path) of every ``run_dir/<folder>/model_<iteration>.pt``, oldest first."""
    folder_path = Path(run_dir) / folder
    return sorted((int(m.group(1)), p) for p in folder_path.glob('model_*.pt')
                  if (m := _NAME.match(p.name))) if folder_path.is_dir() else []


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint with the highest iteration in ``run_dir/checkpoints`` (None if none)."""
    found = checkpoints_by_iteration(run_dir)
    return found[-1][1] if found else None


def prune_checkpoints(run_dir: str | Path, keep: int, folder: str = CHECKPOINTS) -> None:
    """Delete all but the ``keep`` newest checkpoints of ``run_dir/<folder>``."""
    for _, path in checkpoints_by_iteration(run_dir, folder)[:-keep]:
        path.unlink()
