"""Which randomised copy of the robot's model each world steps with.

Domain randomisation writes a world's friction, masses and gains into an ``MjModel``, so every
world has held its own copy: 256 copies of ~50 KB each, read once per control step, spill out of
the CPU's caches and the physics waits on memory (bench/env_throughput.py --shared-models).
With ``worlds_per_model`` S > 1, consecutive resets share one freshly drawn copy, S worlds each,
out of a pool of ``pool_size(N, S)`` copies: a copy is drawn anew only when no world uses it, so
no world's physics changes during its episode, and each world's parameters are still one draw
of the randomisation's distribution (a copy's draw does not depend on who adopts it). legged_gym
shares friction across worlds too (64 buckets drawn once at start); here every randomised
parameter is shared, and the draws keep coming for the whole run (one per S resets).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def pool_size(num_envs: int, worlds_per_model: int) -> int:
    """Copies a batch of ``num_envs`` needs: twice the copies in use when every copy holds
    ``worlds_per_model`` worlds, so worlds that reset find a free one while earlier copies
    still wait for their last world (at most one per world)."""
    return min(num_envs, 2 * math.ceil(num_envs / worlds_per_model))


class ModelVariants:
    """World -> copy assignment of N worlds over a pool of copies, S worlds per copy.

    ``assign(ids)`` is called with the worlds that reset: they let go of their copies first,
    then join the copy being filled, in order; when it holds S worlds (or none of its worlds
    is left on it) the next free copy (one no world uses) is drawn anew and filled next. With
    no free copy the current one takes more than S worlds (only when most worlds reset at once
    onto a full pool).
    """

    def __init__(self, num_envs: int, worlds_per_model: int):
        if worlds_per_model < 1:
            raise ValueError(f'worlds_per_model = {worlds_per_model}: expected >= 1')
        self.share = worlds_per_model
        self.size = pool_size(num_envs, worlds_per_model)
        self.of_world = np.full(num_envs, -1, dtype=np.int64)
        self.users = np.zeros(self.size, dtype=np.int64)
        self.filling, self.places_left = -1, 0

    def assign(self, ids: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """Move worlds ``ids`` [k] onto copies: (their copies [k], the copies to draw anew
        before use, in the order they were opened)."""
        ids = np.asarray(ids, dtype=np.int64)
        held = self.of_world[ids]
        np.subtract.at(self.users, held[held >= 0], 1)
        self.of_world[ids] = -1
        fresh: list[int] = []
        for i in ids:
            # The copy being filled takes worlds while it has places and a world on it (one
            # whose worlds all left is drawn anew like any free copy).
            if self.places_left <= 0 or self.filling < 0 or self.users[self.filling] == 0:
                free = np.flatnonzero(self.users == 0)
                if free.size:
                    # A copy no world steps with: drawn anew, then filled.
                    self.filling, self.places_left = int(free[0]), self.share
                    fresh.append(self.filling)
            self.of_world[i] = self.filling
            self.users[self.filling] += 1
            self.places_left -= 1
        return self.of_world[ids].copy(), fresh

    def get_state(self) -> dict[str, Any]:
        return {'of_world': self.of_world.copy(), 'users': self.users.copy(),
                'filling': self.filling, 'places_left': self.places_left}

    def check_state(self, state: dict[str, Any] | None) -> None:
        """ValueError unless ``state`` is a :meth:`get_state` of a pool like this one."""
        if state is None:
            raise ValueError('saved env state holds no model copies: it was saved with '
                             'env.randomization.worlds_per_model 1; resume with that')
        keys = ('of_world', 'users', 'filling', 'places_left')
        missing = [k for k in keys if k not in state] if isinstance(state, dict) else keys
        if missing:
            raise ValueError(f'saved model copies lack {", ".join(missing)}: the checkpoint is '
                             'damaged; resume from another one')
        if np.shape(state['of_world']) != self.of_world.shape or \
                np.shape(state['users']) != self.users.shape:
            raise ValueError('saved model copies do not fit this env: it was saved with another '
                             'num_envs or env.randomization.worlds_per_model')

    def set_state(self, state: dict[str, Any]) -> None:
        self.check_state(state)
        self.of_world[:] = state['of_world']
        self.users[:] = state['users']
        self.filling, self.places_left = int(state['filling']), int(state['places_left'])
