"""Box ground (env.terrain.collision 'boxes'): the windows of boxes each world's model holds
match the height map the scan and rewards read, claws stay on box steps, the window covers the
whole robot, unused boxes collide with nothing, and a box-ground env stands and refuses shared
model copies (it resumes exactly: test_terrain.py)."""

import mujoco
import numpy as np
import pytest

from claw_rl_ros.core.config import from_dict
from claw_rl_ros.core.sim.ground import GroundPool, pool_geoms
from claw_rl_ros.core.sim.physics import BatchedPhysics
from claw_rl_ros.core.sim.scene import build_model, is_ground, joint_addresses, standing_qpos
from claw_rl_ros.core.sim.terrain import generate_terrain, STEPPED_TYPES, TERRAIN_TYPES
from claw_rl_ros.core.sim.terrain import TerrainConfig
from terrain_helpers import drop_standing

DOWN = np.array([0.0, 0.0, -1.0])


def boxes_cfg(**kw):
    return from_dict(TerrainConfig, {'enabled': True, 'collision': 'boxes', **kw}, source='test')


def ground_under(model, data, xy, top=5.0):
    """Height of the first ground geom straight below (x, y, top) (the robot is above)."""
    geomid = np.zeros(1, dtype=np.int32)
    dist = mujoco.mj_ray(model, data, np.array([xy[0], xy[1], top]), DOWN, None, 1, -1, geomid)
    assert is_ground(model.geom(int(geomid[0])).name)
    return top - dist


def test_the_box_ground_is_the_height_map_the_scan_reads(robot):
    t = generate_terrain(boxes_cfg(num_levels=2), robot)
    assert t.heightfield_stride == 2
    physics = BatchedPhysics(robot, 1, terrain=t)
    model, data = physics.models[0], mujoco.MjData(physics.models[0])
    rng = np.random.default_rng(0)
    lo, hi = t.extent
    xy = rng.uniform(lo, hi, (600, 2))
    got = []
    for p in xy:
        # The robot far above the point: its window is the point's.
        physics.qpos[0, 0:2], physics.qpos[0, 2] = p, 10.0
        physics.update_ground()
        mujoco.mj_setState(model, data, physics.state[0], mujoco.mjtState.mjSTATE_FULLPHYSICS)
        mujoco.mj_kinematics(model, data)
        got.append(ground_under(model, data, p))
    err = np.abs(np.array(got) - t.height_at(xy[:, 0], xy[:, 1]))
    u = np.rint((xy - t.origin) / t.cell).astype(int)
    col = (u[:, 1] - t.border_px) // t.tile_px
    on_hfield = (col >= 0) & (col < len(t.columns)) & (u[:, 0] >= t.border_px) & \
        (u[:, 0] < t.border_px + 2 * t.tile_px) & \
        ~t.stepped_columns[np.clip(col, 0, len(t.columns) - 1)]
    # Box ground is exact: every box top is its cells' height (vertical steps between them).
    boxes = ~on_hfield
    seam = np.zeros(len(xy), dtype=bool)
    s = t.heightfield_stride
    for i0, i1, j0, j1 in t.heightfield_strips():
        # Within a stride of a heightfield part the two grounds meet.
        seam |= (u[:, 0] >= i0 - s) & (u[:, 0] <= i1 + s) & (u[:, 1] >= j0 - s) & \
            (u[:, 1] <= j1 + s) & boxes
    assert boxes.sum() > 300 and err[boxes & ~seam].max() < 1e-6
    # The heightfield samples every second point: MuJoCo's triangles against the bilinear
    # lookup on those points.
    assert on_hfield.sum() > 100
    assert np.median(err[on_hfield]) < 2e-3 and err[on_hfield].max() < 0.03
    assert err[seam].max() < 0.03
    # No heightfield under the boxes: its parts span only the heightfield columns (a stride
    # more at their edges), never a stepped tile's inside.
    s = t.heightfield_stride
    for i0, i1, j0, j1 in t.heightfield_strips():
        cols = {(j - t.border_px) // t.tile_px for j in range(j0 + s, j1 - s)}
        assert cols
        assert all(not t.stepped_columns[c] for c in cols if 0 <= c < len(t.columns))


def test_the_window_of_boxes_moves_with_its_robot(robot):
    t = generate_terrain(boxes_cfg(num_levels=2, types=['stairs_up'], proportions=[1.0]), robot)
    physics = BatchedPhysics(robot, 2, terrain=t)
    physics.qpos[:, 0:2] = t.tile_origins[0, 0, :2]
    physics.update_ground()
    before = [physics.models[i].body_pos.copy() for i in range(2)]
    # World 1 walks a tile up: its boxes are those of its new window; world 0's stay.
    physics.qpos[1, 0:2] = t.tile_origins[1, 0, :2] + [0.4, 0.0]
    physics.update_ground()
    np.testing.assert_array_equal(physics.models[0].body_pos, before[0])
    ids = pool_geoms(physics.models[1])
    boxes = t.ground_boxes(t.window_anchor(physics.qpos[1:2, 0:2])[0])
    np.testing.assert_allclose(physics.models[1].body_pos[physics.models[1].geom_bodyid[ids]]
                               [:len(boxes)], boxes[:, 0:3])
    assert not np.array_equal(physics.models[1].body_pos, before[1])


def test_every_part_of_the_robot_stays_inside_its_window(robot):
    # The window reaches window_margin grid points past the anchor square the base is in: past
    # every geom of the robot, in any joint configuration within the limits and tilted 45 deg.
    t = generate_terrain(boxes_cfg(num_levels=1, types=['stairs_up'], proportions=[1.0]), robot)
    model = build_model(robot, visuals=False)
    data = mujoco.MjData(model)
    qadr, _ = joint_addresses(model, robot)
    rng = np.random.default_rng(0)
    reach = 0.0
    for _ in range(3000):
        data.qpos[:] = standing_qpos(model, robot)
        data.qpos[qadr] = rng.uniform(robot.joint_lower, robot.joint_upper)
        axis = rng.normal(size=3)
        angle = rng.uniform(0, np.pi / 4)
        data.qpos[3:7] = [np.cos(angle / 2), *(np.sin(angle / 2) * axis / np.linalg.norm(axis))]
        mujoco.mj_kinematics(model, data)
        robot_geoms = model.geom_bodyid > 0
        far = np.linalg.norm(data.geom_xpos[robot_geoms, :2] - data.qpos[None, 0:2], axis=1)
        reach = max(reach, (far + model.geom_rbound[robot_geoms]).max())
    # A base anywhere in its anchor's cells (+-half a cell) is margin - 1/2 cells from the edge.
    assert reach < (t.window_margin - 0.5) * t.cell


def test_pool_boxes_that_are_off_collide_with_nothing_and_too_many_are_refused(robot):
    t = generate_terrain(boxes_cfg(num_levels=2, types=['obstacles'], proportions=[1.0]), robot)
    model = build_model(robot, terrain=t, visuals=False)
    pool = GroundPool(model)
    assert len(pool.ids) == t.max_ground_boxes() > 0
    boxes = t.ground_boxes((4, 4))
    pool.fill(model, boxes)
    on = np.arange(len(pool.ids)) < len(boxes)
    assert (model.geom_contype[pool.ids] == on).all()
    assert (model.body_contype[pool.bodies] == on).all()
    pool.fill(model, boxes[:0])
    assert not model.geom_contype[pool.ids].any() and not model.body_contype[pool.bodies].any()
    with pytest.raises(ValueError, match='ground boxes for a pool of'):
        pool.fill(model, np.zeros((len(pool.ids) + 1, 6)))


def claw_tips(model, robot):
    feet = {model.body(f).id for f in robot.foot_bodies}
    return [g for g in range(model.ngeom)
            if model.geom_bodyid[g] in feet and model.geom_conaffinity[g]]


def depth_in_ground(t, p, radius):
    """How far a point is inside box ground: 0 above it, else the shorter way out, up through
    the top or sideways out through a riser (to a point where the ground is below it)."""
    up = t.height_at(p[0:1], p[1:2])[0] - p[2]
    if up <= 0:
        return 0.0
    angle = np.linspace(0, 2 * np.pi, 16, endpoint=False)
    ring = np.linspace(0.05, 2.0, 40) * radius
    dx = (ring[:, None] * np.cos(angle)).ravel()
    dy = (ring[:, None] * np.sin(angle)).ravel()
    below = t.height_at(p[0] + dx, p[1] + dy) <= p[2]
    side = np.hypot(dx, dy)[below].min() if below.any() else np.inf
    return min(up, side)


@pytest.mark.parametrize('kind, x, push, push_steps', [
    ('stairs_down', 0.85, 0.0, 0), ('stairs_up', 0.6, 0.0, 0),
    ('stairs_down', 0.6, 60.0, 60), ('stairs_up', 0.85, 100.0, 40)])
def test_claw_tips_stay_on_box_steps(robot, kind, x, push, push_steps):
    # As test_terrain's heightfield case: standing dropped onto top-level stairs, held or
    # shoved across the edges; the window follows the base every physics step.
    t = generate_terrain(boxes_cfg(num_levels=1, types=[kind], proportions=[1.0]), robot)
    model = build_model(robot, terrain=t)
    pool = GroundPool(model)
    data = drop_standing(model, robot, t, x)
    claws = claw_tips(model, robot)
    radius = model.geom_size[claws[0], 0]
    trunk = model.body(robot.base_body).id
    anchor, deepest, inside, feet_down = None, 0.0, 0.0, []
    for step in range(400):
        a = tuple(t.window_anchor(data.qpos[None, 0:2])[0])
        if a != anchor:
            pool.fill(model, t.ground_boxes(a))
            anchor = a
        data.xfrc_applied[trunk, 0] = push if step < push_steps else 0.0
        mujoco.mj_step(model, data)
        touching = set()
        for c in data.contact[:data.ncon]:
            if c.geom2 in claws or c.geom1 in claws:
                deepest = min(deepest, c.dist)
                touching.add(model.geom_bodyid[c.geom2 if c.geom2 in claws else c.geom1])
        feet_down.append(len(touching))
        inside = max(inside, max(depth_in_ground(t, p, radius) for p in data.geom_xpos[claws]))
    # No tip centre gets a radius into a step (through its top or its riser).
    assert inside < radius
    assert deepest > -2.0 * radius
    assert max(feet_down) == 4
    if not push:
        assert np.mean(feet_down) >= 3.5


def box_env(make_env, num_envs=8, **kw):
    terrain = {'enabled': True, 'collision': 'boxes', 'num_levels': 3,
               'types': ['rough', 'stairs_down', 'stairs_up', 'obstacles'],
               'proportions': [0.25, 0.25, 0.25, 0.25]}
    return make_env(num_envs=num_envs, terrain=terrain, **kw)


def test_a_box_ground_env_stands_on_every_type(make_env):
    env = box_env(make_env, randomization={'enabled': False},
                  commands={'standing_probability': 1.0})
    assert env.physics.ground is not None
    feet = []
    for _ in range(100):
        _, _, terminated, truncated, _ = env.step(np.zeros((8, 12)))
        assert not terminated.any() and not truncated.any()
        feet.append(env.foot_contact.sum(axis=1))
    # Standing on the ground of its tile (boxes or heightfield), all four claws down.
    assert (env.robot_state().base_height > 0.8 * env.robot.standing_height).all()
    assert (np.array(feet[-20:]) == 4).all()


def test_box_ground_refuses_shared_model_copies(make_env):
    with pytest.raises(ValueError, match='worlds_per_model 1'):
        box_env(make_env, randomization={'worlds_per_model': 4})


def test_only_the_stepped_types_are_boxes_and_the_heightfield_mode_has_none(robot):
    t = generate_terrain(boxes_cfg(num_levels=1), robot)
    assert [c for c, s in zip(t.columns, t.stepped_columns) if s] == list(STEPPED_TYPES)
    assert len(t.columns) == len(TERRAIN_TYPES)
    plain = generate_terrain(from_dict(TerrainConfig, {'enabled': True, 'num_levels': 1},
                                       source='test'), robot)
    assert not plain.stepped_columns.any() and plain.heightfield_stride == 1
    assert len(pool_geoms(build_model(robot, terrain=plain))) == 0
