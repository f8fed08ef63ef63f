"""Which tile each world stands on: placement at reset and legged_gym's terrain curriculum.

Every world keeps one column (terrain type, shared out by the configured proportions) for the
whole run and a level (row) that the curriculum moves when the world resets after an episode:
up if it walked farther than half a tile from its spawn point, down if it walked less than half
the distance its commands asked for over a full episode, to a random level if it clears the top
one (so worlds stay spread over the levels; ``cleared_min_level`` keeps them on the upper
ones). A world spawns at its tile's centre plus a small random offset, on the highest ground
under its footprint.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .robot_spec import RobotSpec
from .terrain import generate_terrain, Terrain, TerrainConfig


def assign_columns(shares: np.ndarray, num_envs: int) -> np.ndarray:
    """[C] shares summing to 1 -> [N] column of each world: contiguous blocks whose sizes are
    the shares x N, rounded by largest remainder (so they add up to N)."""
    exact = np.asarray(shares, dtype=np.float64) * num_envs
    counts = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - counts), kind='stable')
    counts[order[:num_envs - counts.sum()]] += 1
    return np.repeat(np.arange(len(counts)), counts)


def curriculum_levels(levels: np.ndarray, walked: np.ndarray, commanded: np.ndarray,
                      tile_size: float, num_levels: int, rng: np.random.Generator,
                      cleared_min_level: int = 0) -> np.ndarray:
    """legged_gym's rule: [K] levels, distance walked [K] and commanded [K] [m] -> new levels.

    Up one level past half a tile; else down one below half the commanded distance; a world
    moved above the top level goes to a random level (from ``cleared_min_level`` up); none
    goes below 0.
    """
    up = walked > 0.5 * tile_size
    down = (walked < 0.5 * commanded) & ~up
    moved = levels + up.astype(np.int64) - down.astype(np.int64)
    wrapped = rng.integers(cleared_min_level, num_levels, len(moved))
    return np.where(moved >= num_levels, wrapped, np.maximum(moved, 0))


class TerrainPlacement:
    """The terrain and every world's tile, spawn point and commanded distance.

    columns / levels [N] int: each world's tile; spawn_xy [N, 2]: where its episode started;
    command_distance [N]: the planar distance [m] its commands asked for so far.
    """

    def __init__(self, cfg: TerrainConfig, robot: RobotSpec, num_envs: int, control_dt: float,
                 episode_length_s: float, rng: np.random.Generator):
        self.cfg = cfg
        self.terrain: Terrain = generate_terrain(cfg, robot)
        self.control_dt, self.episode_length_s = control_dt, episode_length_s
        # A world leaving the map's edge ends its episode as a time-out (IsaacLab's
        # terrain_out_of_bounds), while its feet are still on the border.
        self.edge_margin = robot.standing_height
        self.columns = assign_columns(cfg.column_shares, num_envs)
        top = cfg.max_init_level if cfg.curriculum else cfg.num_levels - 1
        self.levels = rng.integers(0, top + 1, num_envs)
        self.spawn_xy = np.zeros((num_envs, 2))
        self.command_distance = np.zeros(num_envs)

    _STATE = ('columns', 'levels', 'spawn_xy', 'command_distance')

    def spawn(self, ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """[K] worlds -> [K, 3] their new spawn point (ground height in z); restarts their
        commanded distance."""
        t = self.terrain
        xy = t.tile_origins[self.levels[ids], self.columns[ids], 0:2]
        xy = xy + rng.uniform(-t.spawn_jitter, t.spawn_jitter, xy.shape)
        self.spawn_xy[ids] = xy
        self.command_distance[ids] = 0.0
        return np.concatenate([xy, t.ground_under(xy)[:, None]], axis=1)

    def accumulate(self, commands: np.ndarray) -> None:
        """Add one control step of the [N, 3] commands' planar speed to each world's distance."""
        self.command_distance += np.linalg.norm(commands[:, :2], axis=1) * self.control_dt

    def finish(self, ids: np.ndarray, xy: np.ndarray, episode_steps: np.ndarray,
               failed: np.ndarray, rng: np.random.Generator) -> None:
        """Episodes of [K] worlds ended at [K, 2] xy after [K] steps: apply the curriculum.

        A ``failed`` [K] world (a diverged simulation, whose position is a placeholder) counts
        as having walked nowhere.
        """
        if not self.cfg.curriculum or len(ids) == 0:
            return
        walked = np.where(failed, 0.0, np.linalg.norm(xy - self.spawn_xy[ids], axis=1))
        # The commands' mean speed over the steps lived, for a full episode (a fall is short).
        speed = self.command_distance[ids] / (np.maximum(episode_steps, 1) * self.control_dt)
        self.levels[ids] = curriculum_levels(self.levels[ids], walked,
                                             speed * self.episode_length_s,
                                             self.terrain.tile_size, self.terrain.num_levels,
                                             rng, self.cfg.cleared_min_level)

    def out_of_bounds(self, xy: np.ndarray) -> np.ndarray:
        """[N, 2] base xy -> [N] bool: the world reached the edge of the height map."""
        return ~self.terrain.inside(xy, self.edge_margin)

    def level_stats(self) -> dict[str, float]:
        """{terrain type: mean level of its worlds} (types without worlds are left out)."""
        out = {}
        for c, name in enumerate(self.terrain.columns):
            mine = self.columns == c
            if mine.any():
                out[name] = float(self.levels[mine].mean())
        return out

    def get_state(self) -> dict[str, np.ndarray]:
        return {k: getattr(self, k).copy() for k in self._STATE}

    def set_state(self, state: dict[str, Any]) -> None:
        for k in self._STATE:
            getattr(self, k)[...] = state[k]
