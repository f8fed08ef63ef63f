"""SimSession: the sim node's single world (standing, IMU sensors, timeout hold, reset, DR),
and on one terrain tile (the spec, the tile, heights above the ground, the map's edge)."""

import numpy as np
import pytest

from claw_rl_ros.core.config import ConfigError, from_dict
from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.sim.sim_session import SimSession, terrain_tile, terrain_tiles
from claw_rl_ros.core.sim.terrain import (generate_terrain, resolve_sizes, TERRAIN_TYPES,
                                          TerrainConfig)


@pytest.fixture
def session(robot):
    sessions = []

    def make(**kwargs):
        s = SimSession(robot, EnvConfig(num_envs=1), **kwargs)
        sessions.append(s)
        return s
    yield make
    for s in sessions:
        s.close()


def test_default_pose_stands_and_imu_sensors_agree_with_the_base(session, robot):
    sim = session()
    start = sim.readings()
    np.testing.assert_allclose(start.imu_quat, [1, 0, 0, 0], atol=1e-9)
    for _ in range(100):  # 2 s holding q0
        assert not sim.step(sim.active_targets(0.0))
    r = sim.readings()
    assert r.base_pos[2] > 0.18 and sim.falls == 0
    np.testing.assert_allclose(r.joint_pos, robot.default_joint_pos, atol=0.1)
    # The IMU site sits on the trunk frame: its sensors equal the base's own orientation/rate.
    np.testing.assert_allclose(r.imu_quat, r.base_quat, atol=1e-3)
    np.testing.assert_allclose(r.imu_gyro, r.base_ang_vel, atol=1e-3)
    assert r.imu_acc[2] == pytest.approx(9.81, abs=0.3)  # standing still: specific force = g
    assert r.time == pytest.approx(100 * robot.control_dt)


def test_targets_move_joints_and_time_out_to_the_default_pose(session, robot):
    sim = session(command_timeout_s=0.1)
    q0 = robot.default_joint_pos
    target = q0.copy()
    target[1] += 0.3
    sim.set_targets(target, now=0.0)
    np.testing.assert_array_equal(sim.active_targets(0.05), target)
    assert not sim.timed_out
    for _ in range(25):
        sim.step(sim.active_targets(0.05))
    assert sim.readings().joint_pos[1] == pytest.approx(target[1], abs=0.1)
    np.testing.assert_array_equal(sim.active_targets(0.2), q0)
    assert sim.timed_out
    way_out = q0 + 100.0
    sim.set_targets(way_out, now=1.0)
    np.testing.assert_array_equal(sim.active_targets(1.0), robot.joint_upper)  # clamped


def test_reset_fall_detection_and_switchable_randomisation(session, robot):
    sim = session()
    sim.physics.qpos[0, 3:7] = [np.sqrt(0.5), np.sqrt(0.5), 0, 0]  # rolled 90 deg: a fall
    assert sim.step(sim.active_targets(0.0)) and sim.falls == 1
    sim.reset()
    assert sim.readings().base_pos[2] == pytest.approx(robot.init_base_height)
    plain = session(seed=1)
    rand = session(seed=1, randomization=True, pushes=True, noise=True)
    assert rand.physics.models[0].geom_friction[rand.physics.floor_geom, 0] != \
        plain.physics.models[0].geom_friction[plain.physics.floor_geom, 0]
    a, b = plain.readings(), rand.readings()
    assert np.abs(a.joint_pos - b.joint_pos).max() > 1e-4  # reset noise + sensor noise
    for _ in range(round(8.0 / robot.control_dt)):
        rand.step(rand.active_targets(0.0))
    assert rand.pushes_done == 1 and plain.pushes_done == 0


def test_a_termination_body_contact_is_a_fall_only_with_enough_force(session):
    sim = session()
    sim.step(sim.active_targets(0.0))
    assert not sim.fallen()  # standing: no tilt, high enough, no trunk contact
    lo, hi = sim.physics.sensors.termination_contact
    force = sim.cfg.termination.contact_force = 5.0  # [N]: |f| and |f|^2 differ around it
    # [found, fx, fy, fz] of the second termination body in the first physics substep.
    cell = sim.physics.sensordata[0, 0, lo:hi].reshape(-1, 4)[1]
    cell[:] = [1.0, 0.0, 0.6 * force, 0.7 * force]  # |f| = 0.92 force: a light touch
    assert not sim.fallen()
    cell[:] = [1.0, 0.0, 0.6 * force, 0.9 * force]  # |f| = 1.08 force
    assert sim.fallen()
    cell[0] = 0.0  # a force without a contact found is not one
    assert not sim.fallen()


# --------------------------------------------------------------------------------- terrain
def tile_of(spec, seed=1000, **terrain):
    base = from_dict(TerrainConfig, terrain, source='test')
    return terrain_tile(spec, base, seed)


def test_a_tile_spec_names_type_level_and_seed_and_flat_is_the_plane():
    tile = tile_of('stairs_up')
    assert (tile.kind, tile.level, tile.num_levels, tile.seed) == ('stairs_up', 9, 10, 1000)
    assert tile.label == 'stairs_up:9'
    assert tile.config.types == ['stairs_up'] and tile.config.num_levels == 1
    assert not tile.config.curriculum and not tile.config.height_scan.enabled
    assert tile_of('rough:3', seed=7, num_levels=5).label == 'rough:3'
    assert tile_of('rough:3', seed=7, num_levels=5).config.seed == 7
    # A training config's curriculum settings do not carry into the one-level tile (the end-of-
    # run evaluation of a config with cleared_min_level 5 once died on that).
    tile = tile_of('stairs_up', max_init_level=3, cleared_min_level=5)
    assert (tile.config.max_init_level, tile.config.cleared_min_level) == (0, 0)
    assert tile_of('flat').config is None and tile_of('flat').label == 'flat'
    assert tile_of('') is None and tile_of('  ') is None
    base = TerrainConfig()
    tiles = terrain_tiles(['all'], base, 1000, include_flat=False)
    assert [t.label for t in tiles] == [f'{k}:9' for k in TERRAIN_TYPES if k != 'flat']
    assert [t.label for t in terrain_tiles(['flat', 'rough:1'], base, 3)] == ['flat', 'rough:1']


@pytest.mark.parametrize('specs, seed, words', [
    (['stairs'], 1000, ["--terrain: 'stairs': unknown terrain type 'stairs'; use one of flat, "
                        'rough, slope_up, slope_down, stairs_up, stairs_down, obstacles',
                        'LEVEL 0..9']),
    (['rough:x'], 1000, ["--terrain: 'rough:x': level 'x' is not an integer", 'LEVEL 0..9']),
    (['rough:10'], 1000, ["'rough:10': level 10 is out of range", 'rough:LEVEL with LEVEL 0..9']),
    (['rough:-1'], 1000, ["'rough:-1': level -1 is out of range"]),
    (['rough'], -2, ['--terrain-seed: -2 is negative; give a seed >= 0']),
    (['rough', 'rough:9'], 1000, ["'rough:9' is given 2 times"]),
    (['flat', 'rough'], 1000, ["'flat' is the main table already"]),
])
def test_a_bad_tile_spec_names_the_option_the_value_and_the_choices(specs, seed, words):
    with pytest.raises(ConfigError) as err:
        terrain_tiles(specs, TerrainConfig(), seed, '--terrain', '--terrain-seed',
                      include_flat=False)
    for w in words:
        assert w in str(err.value), str(err.value)


def test_a_tile_is_that_row_of_the_full_map(robot):
    # One tile at level l of 10 is the generator's tile at row l: the same heights for the
    # deterministic shapes at every level, and for every shape at level 0 (same stream).
    full = generate_terrain(TerrainConfig(enabled=True, seed=5), robot)
    sz = resolve_sizes(TerrainConfig(), robot.standing_height)
    px, b = sz.tile_px, sz.border_px
    for c, kind in enumerate(full.columns[1:], start=1):  # flat (column 0) is the plane
        for level in ((0, 4, 9) if kind not in ('rough', 'obstacles') else (0,)):
            one = generate_terrain(tile_of(f'{kind}:{level}', seed=5).config, robot)
            row = full.heights[b + level * px:b + (level + 1) * px, b + c * px:b + (c + 1) * px]
            np.testing.assert_allclose(one.heights[b:b + px, b:b + px], row, atol=1e-6,
                                       err_msg=f'{kind}:{level}')
            assert one.heights.shape == (px + 2 * b + 1,) * 2
            assert not one.heights[:b].any() and not one.heights[-b:].any()  # a flat border


def test_the_session_stands_on_its_tile_and_judges_height_above_the_ground(session, robot):
    # The stairs_up platform is a pit ~0.2 m below 0: an absolute trunk height would read as
    # a fall, and the heightfield holds the robot up there.
    pit = session(terrain=tile_of('stairs_up'))
    t = pit.terrain
    assert pit.physics.model.nhfield == 1
    start = pit.readings().base_pos
    np.testing.assert_allclose(start[:2], t.tile_origins[0, 0, :2])
    assert start[2] == pytest.approx(t.tile_origins[0, 0, 2] + robot.init_base_height)
    assert t.tile_origins[0, 0, 2] < -0.7 * robot.standing_height
    for _ in range(100):
        assert not pit.step(pit.active_targets(0.0))
    assert pit.falls == 0 and pit.base_height() > 0.8 * robot.standing_height
    assert pit.status()['terrain'] == 'stairs_up:9 seed 1000'
    # Rough ground: the spawn height is the ground of that seed's tile.
    a, b = session(terrain=tile_of('rough', seed=1)), session(terrain=tile_of('rough', seed=2))
    assert a.readings().base_pos[2] != b.readings().base_pos[2]
    # Flat: the plane, exactly as without a terrain.
    flat, plain = session(terrain=tile_of('flat')), session()
    assert flat.physics.model.nhfield == 0 and flat.status()['terrain'] == 'flat'
    for _ in range(20):
        flat.step(flat.active_targets(0.0))
        plain.step(plain.active_targets(0.0))
    np.testing.assert_array_equal(flat.physics.state, plain.physics.state)


def test_reaching_the_maps_edge_puts_the_world_back_on_its_tile(session, robot):
    sim = session(terrain=tile_of('stairs_down'))
    centre = sim.readings().base_pos.copy()
    sim.physics.qpos[0, 0] = sim.terrain.extent[1, 0] - 0.5 * robot.standing_height
    assert not sim.step(sim.active_targets(0.0))
    assert (sim.left_map, sim.falls, sim.resets) == (1, 0, 2)
    np.testing.assert_allclose(sim.readings().base_pos, centre)
    assert sim.status()['left_map'] == 1


def test_the_session_stands_on_box_ground_and_keeps_the_heightfield_for_rough(session, robot):
    # env.terrain.collision boxes: the stairs pit is boxes around the robot (no heightfield),
    # rough ground stays a heightfield; the robot stands on either.
    pit = session(terrain=tile_of('stairs_up', collision='boxes'))
    assert pit.physics.model.nhfield == 0 and pit.physics.ground is not None
    for _ in range(100):
        assert not pit.step(pit.active_targets(0.0))
    assert pit.falls == 0 and pit.base_height() > 0.8 * robot.standing_height
    rough = session(terrain=tile_of('rough', collision='boxes'))
    assert rough.physics.model.nhfield == 1 and rough.physics.ground is None
    for _ in range(50):
        assert not rough.step(rough.active_targets(0.0))
