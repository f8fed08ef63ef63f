"""Box ground that moves with each robot: the stepped tiles as boxes instead of heightfield.

With ``env.terrain.collision: boxes`` the flat, stairs and obstacle tiles are ground made of
boxes (vertical steps; :meth:`~.terrain.Terrain.ground_boxes`) and the heightfield is ground
only on the other tiles (rough, slopes; :meth:`~.terrain.Terrain.heightfield_strips`). Every
box of the whole map in one model would cost more than the heightfield (MuJoCo poses every
static geom each physics step), so each world's model holds a pool of boxes filled with the
window of the map around its robot: the window moves when the base enters another anchor square
(about H a side), and reaches 2.5 H past it, past every part of the robot, so the robot only
ever touches ground that is there.

Each pool box is its own static body: MuJoCo's broad phase sweeps bodies by their geoms'
current bounding boxes, so a box moved at run time (its body's position, its geom's size) is
found where it is, and a box switched off (body and geom contype 0) is left out of the sweep.
"""

from __future__ import annotations

import mujoco
import numpy as np

GROUND_BOX = 'ground_box_'
# Where an unused pool box waits: far below any ground, colliding with nothing (contype 0).
PARKED_DEPTH = 1000.0
PARKED_SIZE = 1e-3


def pool_geoms(model: mujoco.MjModel) -> np.ndarray:
    """[P] the ids of the model's ground boxes, in pool order."""
    ids, k = [], 0
    while True:
        try:
            ids.append(model.geom(f'{GROUND_BOX}{k}').id)
        except KeyError:
            return np.asarray(ids, dtype=np.int64)
        k += 1


class GroundPool:
    """Fills a model's pool of ground boxes with one window's boxes.

    Every copy of one compiled model shares the pool's ids, so one GroundPool serves them all.
    """

    def __init__(self, model: mujoco.MjModel, contype: int = 1):
        """``contype``: what a box in use collides as (the floor's)."""
        self.ids = pool_geoms(model)
        self.bodies = model.geom_bodyid[self.ids]
        if (model.body_geomnum[self.bodies] != 1).any():
            raise RuntimeError('a ground box body holds more than its box')
        self.contype = contype
        self.bvh = model.body_bvhadr[self.bodies]

    def fill(self, model: mujoco.MjModel, boxes: np.ndarray) -> None:
        """Make ``boxes`` [B, 6] (centre xyz, half sizes; B <= pool size) the model's ground
        boxes and switch the rest off."""
        b, n = len(boxes), len(self.ids)
        if b > n:
            raise ValueError(f'{b} ground boxes for a pool of {n}')
        pos = np.zeros((n, 3))
        size = np.full((n, 3), PARKED_SIZE)
        pos[:, 2] = -PARKED_DEPTH
        pos[:b], size[:b] = boxes[:, 0:3], boxes[:, 3:6]
        on = np.where(np.arange(n) < b, self.contype, 0)
        model.body_pos[self.bodies] = pos
        model.geom_size[self.ids] = size
        model.geom_rbound[self.ids] = np.linalg.norm(size, axis=1)
        # The box's bounds in its body frame (the geom sits at its body's origin).
        local = np.concatenate([np.zeros_like(size), size], axis=1)
        model.geom_aabb[self.ids] = local
        if (self.bvh >= 0).any():
            model.bvh_aabb[self.bvh[self.bvh >= 0]] = local[self.bvh >= 0]
        model.geom_contype[self.ids] = on
        model.body_contype[self.bodies] = on
