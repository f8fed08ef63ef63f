"""Terrain: the generated map (types, levels, robot-sized features, seeds), its lookup and height
scan, the heightfield in MuJoCo (surface, contacts on stairs), placement and curriculum in the
env, the height_scan group, and a flat config that behaves exactly as without terrain."""

import math
from types import SimpleNamespace

import mujoco
import numpy as np
import pytest
import torch

from claw_rl_ros.core.config import ConfigError, from_dict
from claw_rl_ros.core.export.onnx_export import export_onnx
from claw_rl_ros.core.learning.networks import ActorCritic
from claw_rl_ros.core.math_utils import quat_rotate, yaw_quat
from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.sim.observations import HEIGHT_SCAN
from claw_rl_ros.core.sim.scene import build_model, FLOOR
from claw_rl_ros.core.sim.terrain import (base_yaw, generate_terrain, resolve_sizes,
                                          TERRAIN_TYPES, TerrainConfig)
from claw_rl_ros.core.sim.terrain_curriculum import assign_columns, curriculum_levels
from terrain_helpers import drop_standing

FLAT_DIMS = {'policy': 47, 'policy_noise_free': 47, 'privileged': 14}


def terrain_cfg(**kw):
    return from_dict(TerrainConfig, {'enabled': True, **kw}, source='test')


def only(kind, **kw):
    """A terrain of one type."""
    return terrain_cfg(types=[kind], proportions=[1.0], **kw)


def tile(terrain, sz, r, c):
    """[px, px] heights of tile (r, c)."""
    px, b = sz.tile_px, sz.border_px
    return terrain.heights[b + r * px:b + (r + 1) * px, b + c * px:b + (c + 1) * px]


# ---------------------------------------------------------------------------- the generator
def test_the_map_has_one_column_per_type_and_one_row_per_level(robot):
    cfg = terrain_cfg(num_levels=3)
    t, sz = generate_terrain(cfg, robot), resolve_sizes(cfg, robot.standing_height)
    px, b = sz.tile_px, sz.border_px
    assert t.heights.shape == (3 * px + 2 * b + 1, 7 * px + 2 * b + 1)
    assert t.heights.dtype == np.float32
    assert t.columns == TERRAIN_TYPES
    assert t.tile_type.tolist() == [list(range(7))] * 3
    assert t.tile_level.tolist() == [[r] * 7 for r in range(3)]
    # The flat border, and the tile centres as spawn points.
    assert not t.heights[:b].any() and not t.heights[-b:].any()
    assert not t.heights[:, :b].any() and not t.heights[:, -b:].any()
    np.testing.assert_allclose(t.tile_origins[2, 4, :2], [2.5 * t.tile_size, 4.5 * t.tile_size])
    # A type without a share gets no column.
    t2 = generate_terrain(terrain_cfg(types=['rough', 'stairs_up'], proportions=[0.0, 1.0]),
                          robot)
    assert t2.columns == ('stairs_up',) and t2.tile_type.shape == (10, 1)


def test_tiles_have_their_shape_at_the_robots_size(robot):
    cfg = terrain_cfg(num_levels=4)
    t, sz = generate_terrain(cfg, robot), resolve_sizes(cfg, robot.standing_height)
    h = robot.standing_height
    col = {name: c for c, name in enumerate(t.columns)}
    for r in range(4):
        d = (r + 1) / 4
        assert not tile(t, sz, r, col['flat']).any()
        rough = tile(t, sz, r, col['rough'])
        assert 0.7 * d * 0.15 * h < np.ptp(rough) <= d * 0.15 * h + 1e-6
        # Slopes: the steepest grid step is the level's inclination; the spawn platform is
        # above the tile edge going down and below it going up.
        for kind, sign in (('slope_down', 1), ('slope_up', -1)):
            s = tile(t, sz, r, col[kind]).astype(np.float64)
            steepest = np.abs(np.diff(s, axis=0)).max() / sz.cell
            assert steepest == pytest.approx(math.tan(math.radians(20 * d)), rel=1e-4)
            assert sign * t.tile_origins[r, col[kind], 2] == pytest.approx(s.max() - s.min())
        # Stairs: whole steps of 20 % of the standing height x difficulty, run ~ H.
        for kind, sign in (('stairs_down', 1), ('stairs_up', -1)):
            s = sign * tile(t, sz, r, col[kind]).astype(np.float64)
            steps = s / (0.2 * d * h)
            assert np.allclose(steps, np.round(steps), atol=1e-4)
            assert np.unique(np.round(steps)).tolist() == list(range(int(steps.max()) + 1))
            assert steps.max() >= 3
            edges = np.flatnonzero(np.diff(s[sz.tile_px // 2, :sz.tile_px // 2]))
            assert abs(np.diff(edges).mean() * sz.cell - h) <= sz.cell
        obstacles = tile(t, sz, r, col['obstacles'])
        raised = obstacles[obstacles != 0]
        block = 0.25 * d * h
        assert raised.size > 0.05 * obstacles.size
        assert raised.min() >= 0.5 * block - 1e-6 and raised.max() <= block + 1e-6
        assert t.tile_origins[r, col['obstacles'], 2] == 0.0  # the spawn platform is clear
    for kind in ('slope_down', 'stairs_down', 'obstacles'):
        tops = [tile(t, sz, r, col[kind]).max() for r in range(4)]
        assert np.all(np.diff(tops) > 0), kind


def test_feature_sizes_follow_the_robots_standing_height(robot):
    cfg = only('stairs_down', num_levels=1)
    small = generate_terrain(cfg, robot)
    big = generate_terrain(cfg, SimpleNamespace(standing_height=0.5))
    # The same grid in cells, every length scaled by the standing height.
    assert small.heights.shape == big.heights.shape
    ratio = 0.5 / robot.standing_height
    assert big.cell == pytest.approx(small.cell * ratio)
    assert big.tile_size == pytest.approx(small.tile_size * ratio)
    np.testing.assert_allclose(big.heights, small.heights * ratio, rtol=1e-5, atol=1e-6)
    # Explicit metres override the robot-sized defaults.
    fixed = generate_terrain(only('flat', horizontal_scale=0.1, tile_size=2.0, border=0.5),
                             robot)
    assert fixed.cell == 0.1 and fixed.tile_size == 2.0
    assert fixed.heights.shape == (10 * 20 + 2 * 5 + 1, 20 + 2 * 5 + 1)


def test_the_same_seed_gives_the_same_map(robot):
    a = generate_terrain(terrain_cfg(num_levels=2, seed=3), robot)
    b = generate_terrain(terrain_cfg(num_levels=2, seed=3), robot)
    c = generate_terrain(terrain_cfg(num_levels=2, seed=4), robot)
    np.testing.assert_array_equal(a.heights, b.heights)
    np.testing.assert_array_equal(a.tile_origins, b.tile_origins)
    sz = resolve_sizes(terrain_cfg(), robot.standing_height)
    for c_, kind in enumerate(a.columns):
        same = np.array_equal(tile(a, sz, 1, c_), tile(c, sz, 1, c_))
        assert same == (kind not in ('rough', 'obstacles')), kind
    # A tile does not depend on the other columns of the map.
    alone = generate_terrain(only('rough', num_levels=2, seed=3), robot)
    np.testing.assert_array_equal(tile(alone, sz, 1, 0), tile(a, sz, 1, 1))


@pytest.mark.parametrize('overrides, key', [
    ({'types': ['rough', 'lava']}, 'types'),
    ({'types': ['rough', 'rough']}, 'types'),
    ({'types': ['rough'], 'proportions': [0.5, 0.5]}, 'proportions'),
    ({'types': ['rough'], 'proportions': [0.0]}, 'proportions'),
    ({'num_levels': 3, 'max_init_level': 3}, 'max_init_level'),
    ({'num_levels': 3, 'cleared_min_level': 3}, 'cleared_min_level'),
    ({'enabled': False, 'height_scan': {'enabled': True}}, 'height_scan.enabled'),
])
def test_bad_terrain_config_names_the_key(overrides, key):
    with pytest.raises(ConfigError) as err:
        from_dict(EnvConfig, {'terrain': {'enabled': True, **overrides}}, source='t.yaml')
    assert err.value.key == f'terrain.{key}' and err.value.source == 't.yaml'


def test_tile_walk_grows_a_tile_until_a_walk_in_any_heading_stays_on_it(robot):
    # One stairs tile sized for a 10 m walk: from the spawn's farthest jitter, 10 m in any
    # heading is still on the tile, and the stairs go on all the way (not the flat border).
    h = robot.standing_height
    cfg = only('stairs_up', num_levels=1, tile_walk=10.0)
    t, sz = generate_terrain(cfg, robot), resolve_sizes(cfg, h)
    nominal = resolve_sizes(only('stairs_up', num_levels=1), h)
    assert sz.tile_px > nominal.tile_px and sz.nominal_tile_px == nominal.tile_px
    assert sz.tile_size >= 2 * (10.0 + sz.spawn_jitter)
    start = t.tile_origins[0, 0, :2] + sz.spawn_jitter
    heading = np.linspace(0, 2 * np.pi, 16, endpoint=False)
    end = start + 10.0 * np.stack([np.cos(heading), np.sin(heading)], axis=1)
    assert ((end >= 0) & (end <= t.tile_size)).all()
    # Up the stairs along +x from the platform to 10 m: as many steps as that run holds.
    run = max(1, round(1.0 * h / sz.cell)) * sz.cell
    platform = sz.platform_px * sz.cell
    x = t.tile_origins[0, 0, 0] + np.linspace(platform, 10.0, 400)
    ground = t.height_at(x, np.full_like(x, t.tile_origins[0, 0, 1]))
    climbed = (ground[-1] - ground[0]) / (0.2 * h)
    assert climbed >= math.floor((10.0 - platform) / run) - 1
    # A walk shorter than half the nominal tile leaves the map as it was.
    same = generate_terrain(only('stairs_up', num_levels=1, tile_walk=0.5), robot)
    np.testing.assert_array_equal(same.heights,
                                  generate_terrain(only('stairs_up', num_levels=1), robot).heights)


def test_a_walk_longer_than_the_cap_is_refused_by_name():
    # A command of 9 m/s for a 20 s episode would ask for a 360 m tile (~46 M cells per world):
    # refused before any map is made, from a YAML and from code (evaluation) alike.
    from claw_rl_ros.core.evaluation.evaluator import evaluation_tiles
    with pytest.raises(ConfigError, match='tile_walk: -1.0 is out of range'):
        terrain_cfg(tile_walk=-1.0)
    with pytest.raises(ConfigError, match='env.terrain: tile_walk: 180 m: give 0 to 100 m'):
        evaluation_tiles(from_dict(EnvConfig, {'terrain': {'enabled': True}}), ['stairs_up'],
                         command=(9.0, 0.0, 0.0))
    assert terrain_cfg(tile_walk=100.0).tile_walk == 100.0


def test_a_bigger_obstacle_tile_keeps_its_blocks_per_square_metre(robot):
    def raised_share(walk, seed):
        cfg = only('obstacles', num_levels=1, tile_walk=walk, seed=seed)
        t, sz = generate_terrain(cfg, robot), resolve_sizes(cfg, robot.standing_height)
        return float((tile(t, sz, 0, 0) > 0).mean()), sz.area_scale

    nominal = np.mean([raised_share(0.0, s)[0] for s in range(6)])
    big, scale = raised_share(8.0, 0)
    assert scale > 15
    # The same covered share (blocks overlap as often), not 1/scale of it.
    assert 0.75 * nominal < big < 1.25 * nominal


# ----------------------------------------------------------------------- lookup and scan
def test_height_at_is_bilinear_on_the_grid(robot):
    t = generate_terrain(only('rough', num_levels=1), robot)
    h, (x0, y0), c = t.heights, t.origin, t.cell
    i, j = np.array([25, 31, 40]), np.array([27, 30, 44])
    np.testing.assert_allclose(t.height_at(x0 + i * c, y0 + j * c), h[i, j], atol=1e-6)
    edge = t.height_at(x0 + (i + 0.5) * c, y0 + j * c)
    np.testing.assert_allclose(edge, 0.5 * (h[i, j] + h[i + 1, j]), atol=1e-6)
    centre = t.height_at(x0 + (i + 0.5) * c, y0 + (j + 0.5) * c)
    mean4 = 0.25 * (h[i, j] + h[i + 1, j] + h[i, j + 1] + h[i + 1, j + 1])
    np.testing.assert_allclose(centre, mean4, atol=1e-6)
    # Shapes are kept; outside the map the edge value holds.
    assert t.height_at(np.zeros((2, 3)), np.zeros((2, 3))).shape == (2, 3)
    assert t.height_at(np.array([-50.0]), np.array([y0 + 30 * c]))[0] == pytest.approx(h[0, 30])


def test_the_heightfield_surface_is_the_height_map(robot):
    t = generate_terrain(terrain_cfg(num_levels=2), robot)
    model, flat = build_model(robot, terrain=t), build_model(robot)
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    floor = model.geom(FLOOR).id
    assert model.geom_type[floor] == mujoco.mjtGeom.mjGEOM_HFIELD
    plane = flat.geom(FLOOR).id
    for field in ('geom_friction', 'geom_contype', 'geom_conaffinity', 'geom_priority',
                  'geom_solref', 'geom_solimp', 'geom_margin', 'geom_condim'):
        np.testing.assert_array_equal(getattr(model, field)[floor], getattr(flat, field)[plane])
    rng = np.random.default_rng(0)
    lo, hi = t.extent
    xy = rng.uniform(lo, hi, (500, 2))
    down = np.array([0.0, 0.0, -1.0])
    surface = [5.0 - mujoco.mj_rayHfield(model, data, floor, np.array([x, y, 5.0]), down)
               for x, y in xy]
    # MuJoCo's triangles vs the bilinear lookup differ only inside step-edge cells.
    err = np.abs(np.array(surface) - t.height_at(xy[:, 0], xy[:, 1]))
    assert err.max() < 0.01 and np.median(err) < 1e-4


def test_the_scan_is_the_height_lookup_at_points_that_turn_with_the_base(robot):
    cfg = terrain_cfg(num_levels=2, height_scan={'enabled': True})
    t = generate_terrain(cfg, robot)
    h = robot.standing_height
    # 11 x 7 points, 0.4 H apart, centred on the base.
    assert t.scan_offsets.shape == (77, 2)
    np.testing.assert_allclose(t.scan_offsets.min(axis=0), [-2 * h, -1.2 * h])
    np.testing.assert_allclose(np.diff(np.unique(t.scan_offsets[:, 0])), 0.4 * h)
    rng = np.random.default_rng(1)
    n = 5
    base = np.concatenate([rng.uniform(0.5, 2 * t.tile_size, (n, 2)),
                           rng.uniform(0.2, 0.5, (n, 1))], axis=1)
    yaw = rng.uniform(-np.pi, np.pi, n)
    scan = t.height_scan(base, yaw)
    assert scan.shape == (n, 77) and scan.dtype == np.float32
    for w in range(n):
        for k, (dx, dy) in enumerate(t.scan_offsets):
            x = base[w, 0] + math.cos(yaw[w]) * dx - math.sin(yaw[w]) * dy
            y = base[w, 1] + math.sin(yaw[w]) * dx + math.cos(yaw[w]) * dy
            assert scan[w, k] == pytest.approx(t.height_at(x, y) - base[w, 2], abs=1e-6)
    # A quarter turn: the point ahead (dx, 0) is now to the left (-0, dx); a half turn mirrors
    # the symmetric grid.
    quarter = t.height_scan(base, np.full(n, np.pi / 2))
    dx, dy = t.scan_offsets[:, 0], t.scan_offsets[:, 1]
    ahead = t.height_at(base[:, :1] - dy, base[:, 1:2] + dx) - base[:, 2:3]
    np.testing.assert_allclose(quarter, ahead, atol=1e-6)
    np.testing.assert_allclose(t.height_scan(base, np.full(n, np.pi)),
                               t.height_scan(base, np.zeros(n))[:, ::-1], atol=1e-6)
    assert not np.allclose(quarter, t.height_scan(base, np.zeros(n)))


def test_base_yaw_reads_the_heading_of_a_quaternion():
    yaw = np.array([0.0, 0.7, -2.5, 3.0])
    np.testing.assert_allclose(base_yaw(yaw_quat(yaw)), yaw, atol=1e-12)
    # Tilted bodies: the heading of the body x axis projected on the ground.
    quat = np.random.default_rng(0).normal(0.0, 1.0, (50, 4)) + [3.0, 0.0, 0.0, 0.0]
    quat /= np.linalg.norm(quat, axis=1, keepdims=True)
    x_axis = quat_rotate(quat, np.tile([1.0, 0.0, 0.0], (50, 1)))
    np.testing.assert_allclose(base_yaw(quat), np.arctan2(x_axis[:, 1], x_axis[:, 0]),
                               atol=1e-12)


# ----------------------------------------------------------------------------- curriculum
def test_curriculum_promotes_demotes_and_wraps_on_hand_made_distances():
    rng = np.random.default_rng(0)
    levels = np.array([0, 2, 2, 0, 3, 1, 2])
    walked = np.array([2.5, 2.5, 0.5, 0.1, 1.5, 2.0, 1.0])
    commanded = np.array([10.0, 2.0, 5.0, 5.0, 2.0, 3.0, 0.0])
    out = curriculum_levels(levels, walked, commanded, tile_size=4.0, num_levels=5, rng=rng)
    # Past half a tile: up (even if short of half the command); short of half the command:
    # down, not below 0; in between (or at exactly half a tile): stay.
    assert out.tolist() == [1, 3, 1, 0, 3, 1, 2]
    top = curriculum_levels(np.full(500, 4), np.full(500, 3.0), np.zeros(500), 4.0, 5, rng)
    # Clearing the top level sends a world to a random level.
    assert set(top.tolist()) == set(range(5))
    # ... from cleared_min_level up, when given (the others move as before).
    top = curriculum_levels(np.full(500, 4), np.full(500, 3.0), np.zeros(500), 4.0, 5, rng,
                            cleared_min_level=3)
    assert set(top.tolist()) == {3, 4}
    assert curriculum_levels(levels, walked, commanded, 4.0, 5, rng, 3).tolist() == \
        [1, 3, 1, 0, 3, 1, 2]


def test_worlds_are_shared_out_by_the_proportions():
    assert np.bincount(assign_columns(np.array([0.5, 0.3, 0.2]), 10)).tolist() == [5, 3, 2]
    cols = assign_columns(np.array([0.5, 0.3, 0.2]), 7)
    assert np.bincount(cols).tolist() == [4, 2, 1] and np.all(np.diff(cols) >= 0)
    assert len(assign_columns(np.full(7, 1 / 7), 3)) == 3


# ------------------------------------------------------------------------- env placement
def terrain_env(make_env, num_envs=8, terrain=None, **kw):
    base = {'enabled': True, 'num_levels': 3, 'types': ['rough', 'stairs_down', 'stairs_up'],
            'proportions': [0.25, 0.5, 0.25]}
    return make_env(num_envs=num_envs, terrain={**base, **(terrain or {})}, **kw)


def test_worlds_spawn_on_their_tile_and_heights_are_from_the_ground(make_env):
    env = terrain_env(make_env, terrain={'curriculum': False},
                      randomization={'enabled': False})
    t, pl = env.terrain, env.placement
    assert np.bincount(pl.columns).tolist() == [2, 4, 2]
    origin = t.tile_origins[pl.levels, pl.columns]
    qpos = env.physics.qpos
    assert np.abs(qpos[:, :2] - origin[:, :2]).max() <= t.spawn_jitter
    ground = t.ground_under(qpos[:, :2])
    np.testing.assert_allclose(qpos[:, 2], ground + env.robot.init_base_height)
    # Base heights (reward, termination, privileged obs) are above the ground, not above z=0.
    state = env.robot_state()
    np.testing.assert_allclose(state.base_height,
                               qpos[:, 2] - t.height_at(qpos[:, 0], qpos[:, 1]))
    term = env.robot.privileged_obs.slices[env.robot.privileged_obs.names.index('base_height')]
    np.testing.assert_allclose(env.observe()['privileged'][:, term.start],
                               state.base_height * term.scale[0], rtol=1e-6)


def test_standing_on_a_platform_above_or_below_zero_does_not_end_the_episode(make_env):
    # Top-level stairs: the spawn platforms sit most of a standing height above and below 0.
    env = terrain_env(make_env, num_envs=4, terrain={'num_levels': 1, 'types': ['stairs_down',
                      'stairs_up'], 'proportions': [0.5, 0.5]},
                      randomization={'enabled': False}, commands={'standing_probability': 1.0})
    z = env.terrain.tile_origins[0, :, 2]
    assert z[0] > 0.75 * env.robot.standing_height and z[1] < -0.75 * env.robot.standing_height
    for _ in range(50):
        _, _, terminated, truncated, _ = env.step(np.zeros((4, 12)))
        assert not terminated.any() and not truncated.any()
    assert (env.robot_state().base_height > 0.8 * env.robot.standing_height).all()


def test_a_world_keeps_its_tile_through_reset_and_time_out(make_env):
    env = terrain_env(make_env, num_envs=6, episode_length_s=0.2,
                      randomization={'enabled': False}, commands={'standing_probability': 1.0})
    pl = env.placement
    pl.levels[:] = [0, 1, 2, 0, 1, 2]
    env.reset(seed=5)
    columns, levels = pl.columns.copy(), pl.levels.copy()
    origin = env.terrain.tile_origins[levels, columns]
    assert np.abs(env.physics.qpos[:, :2] - origin[:, :2]).max() <= env.terrain.spawn_jitter
    for _ in range(9):
        env.step(np.zeros((6, 12)))
    # Standing still on zero commands: short of half a tile, not short of the command.
    _, _, terminated, truncated, extras = env.step(np.zeros((6, 12)))
    assert truncated.all() and not terminated.any()
    assert pl.columns.tolist() == columns.tolist() and pl.levels.tolist() == levels.tolist()
    assert np.abs(env.physics.qpos[:, :2] - origin[:, :2]).max() <= env.terrain.spawn_jitter
    # The curriculum moves world 0 up (it walked a tile) and world 1 down (short of a long
    # command) at their next time-out; the others stay.
    for _ in range(9):
        env.step(np.zeros((6, 12)))
    pl.spawn_xy[0] -= [env.terrain.tile_size, 0.0]
    pl.command_distance[1] = 100.0
    _, _, _, truncated, _ = env.step(np.zeros((6, 12)))
    assert truncated.all()
    assert pl.levels.tolist() == [1, 0, 2, 0, 1, 2]
    assert pl.columns.tolist() == columns.tolist()


def test_a_world_that_clears_the_top_level_goes_no_lower_than_cleared_min_level(make_env):
    env = terrain_env(make_env, num_envs=6, episode_length_s=0.2, terrain={
        'cleared_min_level': 2}, randomization={'enabled': False},
        commands={'standing_probability': 1.0})
    pl = env.placement
    pl.levels[:] = 2  # the top of 3 levels
    env.reset(seed=5)
    for _ in range(9):
        env.step(np.zeros((6, 12)))
    pl.spawn_xy -= [env.terrain.tile_size, 0.0]  # every world walked a tile: cleared the top
    _, _, _, truncated, _ = env.step(np.zeros((6, 12)))
    assert truncated.all() and pl.levels.tolist() == [2] * 6


def test_extras_report_the_mean_level_per_type(make_env):
    env = terrain_env(make_env, terrain={'curriculum': False})
    _, _, _, _, extras = env.step(np.zeros((8, 12)))
    pl = env.placement
    expected = {name: float(pl.levels[pl.columns == c].mean())
                for c, name in enumerate(env.terrain.columns)}
    assert extras['terrain_level'] == pytest.approx(expected)
    assert set(expected) == {'rough', 'stairs_down', 'stairs_up'}


def test_leaving_the_map_is_a_time_out(make_env):
    env = terrain_env(make_env, num_envs=2, randomization={'enabled': False})
    env.physics.qpos[0, 0] = env.terrain.extent[1, 0] - 0.05
    _, _, terminated, truncated, extras = env.step(np.zeros((2, 12)))
    assert truncated.tolist() == [True, False] and not terminated.any()
    assert extras['episode']['env_ids'].tolist() == [0]


@pytest.mark.parametrize('collision', ['heightfield', 'boxes'])
def test_the_env_state_round_trip_keeps_the_tiles(make_env, collision):
    # Box ground: b's boxes are those around its own robots until its next step moves them.
    a = terrain_env(make_env, seed=2, terrain={'collision': collision})
    b = terrain_env(make_env, seed=9, terrain={'collision': collision})
    rng = np.random.default_rng(0)
    for _ in range(30):
        a.step(rng.normal(0, 0.5, (8, 12)))
    a.placement.levels[:] = np.arange(8) % 3
    b.set_state(a.get_state())
    for key in ('columns', 'levels', 'spawn_xy', 'command_distance'):
        np.testing.assert_array_equal(getattr(b.placement, key), getattr(a.placement, key))
    for _ in range(5):
        actions = rng.normal(0, 0.5, (8, 12))
        np.testing.assert_array_equal(a.step(actions)[0]['policy'], b.step(actions)[0]['policy'])


def test_heading_commands_steer_the_yaw_rate_to_the_sampled_heading(make_env):
    env = make_env(num_envs=64, commands={'heading_command': True, 'ang_vel_yaw': [-1.0, 1.0],
                                          'standing_probability': 0.25})
    target = env.heading_target.copy()
    standing = ~np.isfinite(target)
    assert 0 < standing.sum() < 48 and (np.abs(target[~standing]) <= math.pi).all()
    np.testing.assert_array_equal(env.commands[standing], 0.0)
    rng = np.random.default_rng(0)
    for _ in range(3):
        env.step(rng.normal(0, 0.3, (64, 12)))
        yaw = base_yaw(env.physics.qpos[:, 3:7])
        # Wrapped error (a heading just across +-pi is a small turn), gain 0.5, clipped to 1.
        error = np.angle(np.exp(1j * (env.heading_target - yaw)))
        moving = np.isfinite(env.heading_target)
        np.testing.assert_allclose(env.commands[moving, 2],
                                   np.clip(0.5 * error[moving], -1.0, 1.0), atol=1e-12)
        np.testing.assert_array_equal(env.commands[~moving, 2], 0.0)
    assert (np.abs(env.commands[:, 2]) == 1.0).any() and (np.abs(env.commands[:, 2]) < 1).any()


@pytest.mark.parametrize('commands, key', [
    ({'heading_stiffness': math.inf}, 'heading_stiffness'),
    ({'heading_stiffness': 0.0}, 'heading_stiffness'),
    ({'heading': [-math.inf, math.inf]}, 'heading'),
    ({'heading': [-4.0, 0.0]}, 'heading'),
    ({'heading': [1.0, 0.0]}, 'heading')])
def test_bad_heading_settings_are_refused_by_name(commands, key):
    # An infinite gain times a zero error is NaN: it would reach the yaw-rate command.
    with pytest.raises(ConfigError, match=f'commands.{key}'):
        from_dict(EnvConfig, {'commands': {'heading_command': True, **commands}}, source='t')


def test_heading_mode_is_saved_with_the_env_state_and_off_by_default(make_env):
    a = make_env(num_envs=8, seed=1, commands={'heading_command': True})
    b = make_env(num_envs=8, seed=7, commands={'heading_command': True})
    flat = make_env(num_envs=8)
    assert not np.isfinite(flat.heading_target).any()
    b.set_state(a.get_state())
    np.testing.assert_array_equal(b.heading_target, a.heading_target)
    actions = np.random.default_rng(3).normal(0, 0.3, (8, 12))
    np.testing.assert_array_equal(a.step(actions)[0]['policy'], b.step(actions)[0]['policy'])
    # A state saved before heading mode existed restores with no heading targets.
    old = a.get_state()
    del old['buffers']['heading_target']
    b.set_state(old)
    assert not np.isfinite(b.heading_target).any()


def test_a_fixed_evaluation_command_is_not_steered(make_env):
    from claw_rl_ros.core.evaluation.evaluator import eval_env_config
    cfg = make_env(num_envs=1, commands={'heading_command': True}).cfg
    env = make_env(num_envs=4, **{'commands': vars(eval_env_config(
        cfg, 4, (0.5, 0.0, 0.0), seed=0).commands)})
    for _ in range(5):
        env.step(np.zeros((4, 12)))
    np.testing.assert_array_equal(env.commands, [[0.5, 0.0, 0.0]] * 4)


# -------------------------------------------------------------------------- observations
def test_the_height_scan_group_exists_only_with_the_scan_on(make_env):
    assert make_env().obs_dims == FLAT_DIMS
    assert terrain_env(make_env).obs_dims == FLAT_DIMS
    env = terrain_env(make_env, terrain={'height_scan': {'enabled': True}})
    assert env.obs_dims == {**FLAT_DIMS, HEIGHT_SCAN: 77}
    obs, _ = env.reset()
    qpos = env.physics.qpos
    expected = env.terrain.height_scan(qpos[:, :3], base_yaw(qpos[:, 3:7]))
    np.testing.assert_array_equal(obs[HEIGHT_SCAN], expected)
    # Standing on its tile, the ground is about a standing height below the base.
    assert np.median(obs[HEIGHT_SCAN]) == pytest.approx(-env.robot.init_base_height, abs=0.03)
    env.physics.qpos[0, 3:7] = [0.0, 1.0, 0.0, 0.0]
    _, _, terminated, _, extras = env.step(np.zeros((8, 12)))
    assert terminated[0] and extras['final_obs'][HEIGHT_SCAN].shape == (8, 77)


def test_a_flat_config_behaves_exactly_as_without_the_terrain_key(make_env, robot):
    plain = make_env(num_envs=4, seed=3)
    keyed = make_env(num_envs=4, seed=3, terrain={'enabled': False, 'types': ['rough'],
                                                  'proportions': [1.0], 'num_levels': 2,
                                                  'seed': 5, 'max_init_level': 1})
    for env in (plain, keyed):
        assert env.obs_dims == FLAT_DIMS and env.terrain is None
        assert env.physics.model.nhfield == 0
        assert env.physics.model.geom_type[env.physics.model.geom(FLOOR).id] == \
            mujoco.mjtGeom.mjGEOM_PLANE
        assert 'terrain' not in env.get_state()
    a, _ = plain.reset()
    b, _ = keyed.reset()
    actions = np.random.default_rng(0).normal(0, 0.5, (4, 12))
    (a2, ra, *_, ea), (b2, rb, *_, eb) = plain.step(actions), keyed.step(actions)
    for x, y in ((a, b), (a2, b2)):
        assert x.keys() == y.keys() == FLAT_DIMS.keys()
        for g in x:
            np.testing.assert_array_equal(x[g], y[g])
    np.testing.assert_array_equal(ra, rb)
    assert 'terrain_level' not in ea and 'terrain_level' not in eb


def test_export_refuses_a_student_that_reads_the_height_scan(robot, tmp_path):
    torch.manual_seed(0)
    obs = robot.policy_obs.dim
    student = ActorCritic(obs + 77, obs, robot.num_joints, actor_hidden_dims=[16],
                          critic_hidden_dims=[16], actor_obs_groups=['policy', HEIGHT_SCAN])
    with pytest.raises(ValueError, match="reads observation group 'height_scan'.*blind "
                                         'student.*--teacher'):
        export_onnx(student, robot, tmp_path / 'student.onnx')
    assert not (tmp_path / 'student.onnx').exists()


# -------------------------------------------------------------------------------- contacts
def claw_geoms(model, robot):
    feet = {model.body(f).id for f in robot.foot_bodies}
    return [g for g in range(model.ngeom)
            if model.geom_bodyid[g] in feet and model.geom_conaffinity[g]]


def surface_under(model, data, floor, point):
    return 5.0 - mujoco.mj_rayHfield(model, data, floor, np.array([point[0], point[1], 5.0]),
                                     np.array([0.0, 0.0, -1.0]))


@pytest.mark.parametrize('kind, x, push, push_steps', [
    ('stairs_down', 0.85, 0.0, 0), ('stairs_up', 0.6, 0.0, 0),
    ('stairs_down', 0.6, 60.0, 60), ('stairs_up', 0.85, 60.0, 60), ('stairs_up', 0.85, 100.0, 40)])
def test_claw_tips_do_not_sink_through_step_edges(robot, kind, x, push, push_steps):
    # The standing pose dropped onto top-level stairs off the platform (feet on several steps),
    # then either held or shoved forward across the step edges (it stumbles or falls); every
    # physics step is checked.
    t = generate_terrain(only(kind, num_levels=1), robot)
    model = build_model(robot, terrain=t)
    data = drop_standing(model, robot, t, x)
    floor, claws = model.geom(FLOOR).id, claw_geoms(model, robot)
    radius = model.geom_size[claws[0], 0]
    trunk = model.body(robot.base_body).id
    deepest, lowest, feet_down = 0.0, np.inf, []
    for step in range(400):
        data.xfrc_applied[trunk, 0] = push if step < push_steps else 0.0
        mujoco.mj_step(model, data)
        touching = set()
        for c in data.contact[:data.ncon]:
            if c.geom2 in claws:
                deepest = min(deepest, c.dist)
                touching.add(model.geom_bodyid[c.geom2])
        feet_down.append(len(touching))
        tips = data.geom_xpos[claws]
        lowest = min(lowest, min(p[2] - surface_under(model, data, floor, p) for p in tips))
    # No tip centre gets a radius below the ground under it (a tip through an edge keeps
    # falling: 2-3 radii with MuJoCo's native CCD), contacts stay shallow, and the feet land
    # (a held robot stands on them).
    assert lowest > -radius
    assert deepest > -2.0 * radius
    assert max(feet_down) == 4
    if not push:
        assert np.mean(feet_down) >= 3.5
