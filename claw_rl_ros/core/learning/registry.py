"""Policy registry: the only interface distillation uses to reach teacher and student.

A policy registers a function returning its Gaussian action parameters (mean, std) for a batch
of observation groups; for a Gaussian policy these are its "action logits". Distillation asks
``registry.get_action_logits('teacher', obs)`` and never sees a concrete network class, so the
student (or the teacher) can be any implementation that registers such a function.
"""

from __future__ import annotations

from typing import Callable

import torch

Obs = dict[str, torch.Tensor]
ParamsFn = Callable[[Obs], tuple[torch.Tensor, torch.Tensor]]


class PolicyRegistry:
    """Named action-distribution providers (``teacher``, ``student``, ...)."""

    def __init__(self):
        self._entries: dict[str, ParamsFn] = {}

    def register(self, name: str, params_fn: ParamsFn) -> None:
        """Add or replace ``name``: ``params_fn(obs) -> (mean [B, A], std [B, A])``."""
        if not callable(params_fn):
            raise TypeError(f'policy {name!r}: params_fn must be callable')
        self._entries[name] = params_fn

    def register_module(self, name: str, module: torch.nn.Module) -> None:
        """Register a module that has ``action_mean_std(obs)`` (e.g. ActorCritic)."""
        if not hasattr(module, 'action_mean_std'):
            raise TypeError(f'policy {name!r}: {type(module).__name__} has no action_mean_std')
        self.register(name, module.action_mean_std)

    def get_action_logits(self, name: str, obs: Obs) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean [B, A], std [B, A]) of policy ``name`` on ``obs``."""
        if name not in self._entries:
            raise KeyError(f'no policy {name!r} registered (have {sorted(self._entries)})')
        mean, std = self._entries[name](obs)
        return mean, std.expand_as(mean)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    @property
    def names(self) -> list[str]:
        return sorted(self._entries)
