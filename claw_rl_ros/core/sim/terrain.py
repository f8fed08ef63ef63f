"""Heightfield terrain made of tiles by type and difficulty (legged_gym's layout).

The map is a grid of square tiles: rows are difficulty levels (row ``r`` has difficulty
``(r + 1) / num_levels``, so the top row reaches the configured maxima), columns are terrain
types. A flat border surrounds the tiles. Every tile's height is 0 at its edges except random
rough ground, so tiles join without cliffs; the sloped, stepped and obstacle tiles keep a flat
platform at their centre, where worlds spawn. Feature sizes are fractions of the robot's
standing height H (``RobotSpec.standing_height``, computed by ``scene.standing_height``), so
another robot gets terrain of its own size without new settings.

World frame: tile ``(r, c)`` covers ``x in [r L, (r + 1) L]``, ``y in [c L, (c + 1) L]`` (L the
tile size); ``heights[i, j]`` is the ground at ``origin + (i, j) * cell``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
import math
from typing import Callable, Optional, TYPE_CHECKING

import numpy as np

from ..config import ConfigError, param

if TYPE_CHECKING:  # robot.py builds on the scene, which builds on this module
    from .robot_spec import RobotSpec

# Seed of the terrain a policy is evaluated on: the training configs use 0, so an evaluation
# map is never the one a policy learnt.
EVAL_TERRAIN_SEED = 1000
TERRAIN_TYPES = ('flat', 'rough', 'slope_up', 'slope_down', 'stairs_up', 'stairs_down',
                 'obstacles')
# Tiles whose ground is flat between vertical steps. With env.terrain.collision 'boxes' their
# collision geometry is boxes, one per rectangle of equal heights, instead of the heightfield:
# a claw tip on a box is one analytic sphere-box contact, on the heightfield a CCD test per
# triangular prism under it and about twice the contacts (bench/env_throughput.py --collision).
STEPPED_TYPES = ('flat', 'stairs_up', 'stairs_down', 'obstacles')
COLLISIONS = ('heightfield', 'boxes')
# The longest tile_walk [m]: a 200 m tile is ~14 M grid cells (and each world's model holds
# its own copy); more would exhaust memory before the first step.
MAX_TILE_WALK = 100.0


@dataclass
class HeightScanConfig:
    """Privileged heights of the ground on a grid around the base (critic and teacher only)."""

    enabled: bool = param(False, 'add the height_scan observation group (needs the terrain)')
    length: Optional[float] = param(None, 'grid extent along the base x axis [m] (None: 4 H)',
                                    gt=0)
    width: Optional[float] = param(None, 'grid extent along the base y axis [m] (None: 2.4 H)',
                                   gt=0)
    spacing: Optional[float] = param(None, 'distance between grid points [m] (None: 0.4 H)',
                                     gt=0)


@dataclass
class TerrainConfig:
    """Heightfield terrain instead of the flat plane; H is the robot's standing height."""

    enabled: bool = param(False, 'use the terrain (false: every world stands on a flat plane)')
    types: list[str] = param(list(TERRAIN_TYPES), 'terrain types, one column of tiles each')
    proportions: list[float] = param([0.1, 0.2, 0.1, 0.1, 0.2, 0.2, 0.1],
                                     'share of the worlds on each type (types order)', ge=0)
    num_levels: int = param(10, 'difficulty levels (rows of tiles)', ge=1, le=100)
    curriculum: bool = param(True, 'move worlds up and down levels by how far they walk')
    max_init_level: int = param(0, 'worlds start on a random level up to this one '
                                '(curriculum off: any level)', ge=0)
    cleared_min_level: int = param(0, 'a world that clears the top level goes to a random level '
                                   'from this one up (legged_gym: 0, any level)', ge=0)
    seed: int = param(0, 'seed of the terrain heights (the same seed, the same map)', ge=0)
    tile_size: Optional[float] = param(None, 'side of a square tile [m] (None: 12 H)', gt=0)
    tile_walk: float = param(0.0, 'tiles grow past tile_size until a world walks at least this '
                             'far [m] from its spawn before its tile ends (claw-rl eval and '
                             'verify set it for their one-tile maps: one episode at the '
                             'command)', ge=0, le=MAX_TILE_WALK)
    border: Optional[float] = param(None, 'flat margin around the tiles [m] (None: 4 H)', ge=0)
    horizontal_scale: Optional[float] = param(None, 'heightfield grid spacing [m] (None: 0.2 H)',
                                              gt=0)
    platform_size: Optional[float] = param(None, 'flat spawn square at a tile centre [m] (None: '
                                           '4 H)', ge=0)
    spawn_jitter: Optional[float] = param(None, 'spawn xy offset from the tile centre, up to '
                                          '+-this [m] (None: 0.5 H)', ge=0)
    rough_height: float = param(0.15, 'rough ground: peak-to-peak height at the top level [H]',
                                ge=0)
    rough_spacing: float = param(0.4, 'rough ground: distance between random heights [H]', gt=0)
    slope_deg: float = param(20.0, 'slopes: inclination at the top level [deg]', ge=0, lt=80)
    step_height: float = param(0.2, 'stairs: rise of one step at the top level [H]', ge=0)
    step_width: float = param(1.0, 'stairs: run of one step [H]', gt=0)
    obstacle_height: float = param(0.25, 'obstacles: block height at the top level [H]', ge=0)
    obstacle_size: tuple[float, float] = param((1.0, 3.0), 'obstacles: block side range [H]',
                                               gt=0, ordered=True)
    obstacle_count: int = param(20, 'obstacles: blocks per tile', ge=0, le=1000)
    height_scan: HeightScanConfig = param(HeightScanConfig(), 'privileged height scan')
    collision: str = param('heightfield', 'collision geometry of the flat, stairs and obstacle '
                           "tiles: 'heightfield' (the map's triangles, a one-cell ramp at each "
                           "step) or 'boxes' (vertical steps; each world's model holds the boxes "
                           'around its robot, so worlds_per_model must be 1; core/sim/ground.py)')

    def __post_init__(self):
        unknown = [t for t in self.types if t not in TERRAIN_TYPES]
        if unknown:
            raise ConfigError('', 'types', f'unknown terrain type {unknown[0]!r}; available: '
                              f'{", ".join(TERRAIN_TYPES)}')
        if len(set(self.types)) != len(self.types) or not self.types:
            raise ConfigError('', 'types', f'{self.types} must list each type once')
        if len(self.proportions) != len(self.types):
            raise ConfigError('', 'proportions', f'has {len(self.proportions)} values for '
                              f'{len(self.types)} types; give one per type')
        if not sum(self.proportions) > 0:
            raise ConfigError('', 'proportions', f'{self.proportions} are all 0; give at least '
                              'one type a share')
        if self.cleared_min_level >= self.num_levels:
            raise ConfigError('', 'cleared_min_level', f'{self.cleared_min_level} is not a level '
                              f'of 0..{self.num_levels - 1}; lower it or raise num_levels')
        if self.max_init_level >= self.num_levels:
            raise ConfigError('', 'max_init_level', f'{self.max_init_level} is not a level of '
                              f'0..{self.num_levels - 1}; lower it or raise num_levels')
        if not 0 <= self.tile_walk <= MAX_TILE_WALK:  # also when set in code (replace)
            raise ConfigError('env.terrain', 'tile_walk', f'{self.tile_walk:g} m: give 0 to '
                              f'{MAX_TILE_WALK:g} m (evaluation and verify set it to the '
                              'command speed x the episode length: slow the command or shorten '
                              'the episode)')
        if self.collision not in COLLISIONS:
            raise ConfigError('', 'collision', f'{self.collision!r} is not one of '
                              f'{", ".join(COLLISIONS)}; give heightfield or boxes')
        if self.height_scan.enabled and not self.enabled:
            raise ConfigError('', 'height_scan.enabled', 'a height scan needs the terrain; set '
                              'terrain.enabled: true or switch the scan off')

    @property
    def columns(self) -> list[str]:
        """The types that get worlds (proportion > 0): one column of tiles each."""
        return [t for t, p in zip(self.types, self.proportions) if p > 0]

    @property
    def column_shares(self) -> np.ndarray:
        """[C] share of the worlds on each column, summing to 1."""
        p = np.asarray([p for p in self.proportions if p > 0], dtype=np.float64)
        return p / p.sum()


@dataclass(frozen=True)
class TerrainSizes:
    """The config's robot-sized lengths resolved for one robot: metres and grid cells."""

    standing_height: float
    cell: float
    tile_px: int
    border_px: int
    nominal_tile_px: int
    platform_px: int
    spawn_jitter: float
    footprint: float

    @property
    def tile_size(self) -> float:
        return self.tile_px * self.cell

    @property
    def area_scale(self) -> float:
        """A tile's area over tile_size's (above 1 when tile_walk made it bigger)."""
        return (self.tile_px / self.nominal_tile_px) ** 2


def resolve_sizes(cfg: TerrainConfig, standing_height: float) -> TerrainSizes:
    """Metres and cell counts of a config for a robot of standing height H [m]."""
    h = standing_height

    def size(value, default):
        return default * h if value is None else value

    cell = size(cfg.horizontal_scale, 0.2)
    jitter = size(cfg.spawn_jitter, 0.5)
    # An even number of cells per tile puts a grid point at the tile centre.
    nominal_px = max(2, 2 * round(size(cfg.tile_size, 12.0) / (2 * cell)))
    # Half a tile from the spawn's farthest jitter on: tile_walk metres to walk in any heading.
    walk_px = 2 * math.ceil((cfg.tile_walk + jitter) / cell) if cfg.tile_walk > 0 else 0
    tile_px = max(nominal_px, walk_px)
    platform_px = min(tile_px // 2, round(size(cfg.platform_size, 4.0) / (2 * cell)))
    return TerrainSizes(standing_height=h, cell=cell, tile_px=tile_px,
                        border_px=round(size(cfg.border, 4.0) / cell), platform_px=platform_px,
                        spawn_jitter=jitter, footprint=h, nominal_tile_px=nominal_px)


def scan_offsets(cfg: HeightScanConfig, standing_height: float) -> np.ndarray:
    """[K, 2] scan points (x, y) in the base's yaw frame: a grid centred on the base, x-major."""
    h = standing_height
    length = cfg.length or 4.0 * h
    width = cfg.width or 2.4 * h
    spacing = cfg.spacing or 0.4 * h
    xs = np.linspace(-0.5 * length, 0.5 * length, round(length / spacing) + 1)
    ys = np.linspace(-0.5 * width, 0.5 * width, round(width / spacing) + 1)
    return np.stack(np.meshgrid(xs, ys, indexing='ij'), axis=-1).reshape(-1, 2)


def base_yaw(quat: np.ndarray) -> np.ndarray:
    """[N, 4] (w, x, y, z) -> [N] heading (yaw) [rad] of the body's x axis in the world."""
    w, x, y, z = quat[:, 0], quat[:, 1], quat[:, 2], quat[:, 3]
    return np.arctan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


@dataclass(frozen=True)
class Terrain:
    """A generated height map and its tiles.

    heights [X, Y] float32 ground height [m] on the grid (X = rows * tile_px + 2 border_px + 1,
    Y = cols * tile_px + 2 border_px + 1); tile_type [rows, cols] index into TERRAIN_TYPES;
    tile_level [rows, cols] difficulty level (the row); tile_origins [rows, cols, 3] each
    tile's spawn point (centre xy, the highest ground under a standing robot there);
    scan_offsets [K, 2] the height scan's points in the base's yaw frame. ``collision``
    'boxes': the stepped tiles' ground is a box per grid point's square cell (vertical steps
    half-way between grid points), which :meth:`height_at` reads there as the nearest grid
    point's height; tile_px / border_px: grid points per tile side and in the border.
    """

    heights: np.ndarray
    cell: float
    origin: np.ndarray
    tile_size: float
    columns: tuple[str, ...]
    tile_type: np.ndarray
    tile_level: np.ndarray
    tile_origins: np.ndarray
    scan_offsets: np.ndarray
    footprint: float
    spawn_jitter: float
    collision: str = 'heightfield'
    tile_px: int = 0
    border_px: int = 0
    heightfield_stride: int = 1
    # window anchor (a, b) -> its ground boxes, computed on first use.
    _boxes: dict = field(default_factory=dict, repr=False, compare=False)
    # a window's cells -> their boxes from its first grid point (shared by equal windows).
    _shapes: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_levels(self) -> int:
        return self.tile_level.shape[0]

    @cached_property
    def stepped_columns(self) -> np.ndarray:
        """[C] bool: the column's ground is boxes (collision 'boxes' and a stepped type)."""
        return np.array([self.collision == 'boxes' and name in STEPPED_TYPES
                         for name in self.columns])

    @property
    def extent(self) -> np.ndarray:
        """[2, 2] world (min, max) x and y of the height map."""
        size = (np.asarray(self.heights.shape) - 1) * self.cell
        return np.stack([self.origin, self.origin + size])

    def height_at(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Ground height [m] at world points x, y (any equal shapes): bilinear on the grid
        (the heightfield's surface), the nearest grid point's on boxes (:meth:`ground_boxes`),
        the edge value outside the map."""
        nx, ny = self.heights.shape
        u = np.clip((np.asarray(x) - self.origin[0]) / self.cell, 0, nx - 1)
        v = np.clip((np.asarray(y) - self.origin[1]) / self.cell, 0, ny - 1)
        if not self.stepped_columns.any():
            return _bilinear(self.heights, u, v)
        # The heightfield under box ground samples every stride-th grid point.
        s = self.heightfield_stride
        smooth = _bilinear(self._heightfield_grid, u / s, v / s)
        # On boxes: the height of the grid point whose square cell holds the point.
        near_i, near_j = np.rint(u).astype(np.int64), np.rint(v).astype(np.int64)
        near = self.heights.ravel().take(near_i * ny + near_j)
        return np.where(self._on_boxes(near_i, near_j), near, smooth)

    @cached_property
    def _heightfield_grid(self) -> np.ndarray:
        """The heights the heightfield samples (every stride-th grid point), contiguous."""
        s = self.heightfield_stride
        return np.ascontiguousarray(self.heights[::s, ::s])

    def _on_boxes(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        """Grid points i, j (equal shapes) -> bool: in a stepped tile, or in the border of a
        map with one (flat ground either way)."""
        rows, cols = self.tile_type.shape
        r = (i - self.border_px) // self.tile_px
        c = (j - self.border_px) // self.tile_px
        inside = (r >= 0) & (r < rows) & (c >= 0) & (c < cols)
        stepped = self.stepped_columns
        return np.where(inside, stepped[np.clip(c, 0, cols - 1)], stepped.any())

    def window_anchor(self, xy: np.ndarray) -> np.ndarray:
        """[N, 2] world xy -> [N, 2] int the anchor square (of window_step grid points a
        side) each point is in; the map's edge squares outside it."""
        nx, ny = self.heights.shape
        k = np.floor((np.asarray(xy) - self.origin) / self.cell + 0.5).astype(np.int64)
        k = np.clip(k, 0, [nx - 1, ny - 1])
        return k // self.window_step

    def ground_boxes(self, anchor: tuple[int, int]) -> np.ndarray:
        """[B, 6] boxes (centre xyz, half sizes) of the stepped ground in the window around
        anchor square (a, b): its grid points and window_margin more on each side.

        Each grid point stands for the square cell around it (vertical steps half-way between
        grid points). Per height h, rectangles (greedy, row-major) cover the cells of height h
        and reach over higher cells where that saves a box; each is a box of top h whose bottom
        is a footprint below the map's lowest point. Where boxes overlap the highest top is
        the ground, the cell's own height.
        """
        key = (int(anchor[0]), int(anchor[1]))
        if key not in self._boxes:
            self._boxes[key] = self._decompose(*key)
        return self._boxes[key]

    def max_ground_boxes(self) -> int:
        """The most boxes any window takes (the model's pool size; 0 without boxes)."""
        if not self.stepped_columns.any():
            return 0
        na, nb = -(-np.asarray(self.heights.shape) // self.window_step)
        return max(len(self.ground_boxes((a, b))) for a in range(na) for b in range(nb))

    @property
    def window_step(self) -> int:
        """Grid points per side of an anchor square: about H (a window moves with its robot
        in steps of this)."""
        return max(1, round(self.footprint / self.cell))

    @property
    def window_margin(self) -> int:
        """Grid points a window reaches past its anchor square: 2.5 H, past every part of a
        robot whose base is in the square (claw_quadruped: 1.3 H standing, 2.04 H with any
        joint angles tilted 45 deg; test_ground.py)."""
        return math.ceil(2.5 * self.footprint / self.cell)

    def heightfield_strips(self) -> list[tuple[int, int, int, int]]:
        """Grid points (i0, i1, j0, j1), i1 and j1 included, of the heightfield's parts: the
        whole map without boxes; with boxes, each run of adjacent heightfield columns over
        every level and one stride into the boxes' side at each edge, so the two grounds meet
        (and no heightfield under the boxes, where a claw would test its prisms for nothing).
        Each part samples every ``heightfield_stride``-th point from (i0, j0)."""
        nx, ny = self.heights.shape
        stepped = self.stepped_columns
        if not stepped.any():
            return [(0, nx - 1, 0, ny - 1)]
        rows, px, b = self.tile_type.shape[0], self.tile_px, self.border_px
        s = self.heightfield_stride
        strips, c = [], 0
        while c < len(stepped):
            if stepped[c]:
                c += 1
                continue
            c1 = c
            while c1 < len(stepped) and not stepped[c1]:
                c1 += 1
            strips.append((max(b - s, 0), min(b + rows * px + s, nx - 1),
                           max(b + c * px - s, 0), min(b + c1 * px + s, ny - 1)))
            c = c1
        return strips

    def _decompose(self, a: int, b: int) -> np.ndarray:
        nx, ny = self.heights.shape
        step, m = self.window_step, self.window_margin
        i0, j0 = max(a * step - m, 0), max(b * step - m, 0)
        i1, j1 = min((a + 1) * step + m, nx), min((b + 1) * step + m, ny)
        gi, gj = np.meshgrid(np.arange(i0, i1), np.arange(j0, j1), indexing='ij')
        on = self._on_boxes(gi, gj)
        if not on.any():
            return np.zeros((0, 6))
        region = self.heights[i0:i1, j0:j1]
        # Windows with the same cells (flat ground, the straight runs of a staircase) share
        # one decomposition, shifted to where each is: start-up stays linear in the map.
        key = (region.shape, region.tobytes(), on.tobytes())
        if key not in self._shapes:
            self._shapes[key] = self._rectangle_boxes(region, on)
        return self._shapes[key] + [self.origin[0] + i0 * self.cell,
                                    self.origin[1] + j0 * self.cell, 0, 0, 0, 0]

    def _rectangle_boxes(self, region: np.ndarray, on: np.ndarray) -> np.ndarray:
        """[B, 6] boxes of a window's box cells, x and y from its first grid point."""
        bottom = float(self.heights.min()) - self.footprint
        boxes = []
        for height in np.unique(region[on]):
            # Boxes may overlap: one of top h may also cover higher cells (a higher box hides
            # it there), so a step's rectangles reach under the steps above it.
            for a0, a1, b0, b1 in _rectangles(on & (region == height), on & (region >= height)):
                # Cells span +-cell / 2 around their grid points.
                x0, x1 = (a0 - 0.5) * self.cell, (a1 - 0.5) * self.cell
                y0, y1 = (b0 - 0.5) * self.cell, (b1 - 0.5) * self.cell
                top = float(height)
                boxes.append([(x0 + x1) / 2, (y0 + y1) / 2, (top + bottom) / 2,
                              (x1 - x0) / 2, (y1 - y0) / 2, (top - bottom) / 2])
        return np.asarray(boxes)

    def scan_points(self, base_pos: np.ndarray, base_yaw: np.ndarray) -> np.ndarray:
        """[N, 3] base positions, [N] yaw -> [N, K, 2] world xy of the scan points."""
        c, s = np.cos(base_yaw)[:, None], np.sin(base_yaw)[:, None]
        dx, dy = self.scan_offsets[:, 0], self.scan_offsets[:, 1]
        # The grid turns with the heading only (legged_gym's yaw-only rotation).
        return np.stack([base_pos[:, 0:1] + c * dx - s * dy,
                         base_pos[:, 1:2] + s * dx + c * dy], axis=-1)

    def height_scan(self, base_pos: np.ndarray, base_yaw: np.ndarray) -> np.ndarray:
        """[N, 3] base positions, [N] yaw -> [N, K] float32 ground height at each scan point
        minus the base height (about -H standing on flat ground)."""
        points = self.scan_points(base_pos, base_yaw)
        ground = self.height_at(points[..., 0], points[..., 1])
        return (ground - base_pos[:, 2:3]).astype(np.float32)

    def ground_under(self, xy: np.ndarray) -> np.ndarray:
        """[N, 2] -> [N] the highest ground in a square of +-footprint around each point (what
        a robot standing there rests on), sampled every grid cell."""
        k = np.arange(-math.ceil(self.footprint / self.cell), math.ceil(self.footprint / self.cell)
                      + 1) * self.cell
        dx, dy = (a.ravel() for a in np.meshgrid(k, k, indexing='ij'))
        return self.height_at(xy[:, 0:1] + dx, xy[:, 1:2] + dy).max(axis=1)

    def inside(self, xy: np.ndarray, margin: float) -> np.ndarray:
        """[N, 2] -> [N] bool: at least ``margin`` [m] inside the height map's edges."""
        lo, hi = self.extent
        return ((xy >= lo + margin) & (xy <= hi - margin)).all(axis=1)


def _bilinear(grid: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """[X, Y] grid, fractional indices u, v (equal shapes, within the grid) -> bilinear values."""
    nx, ny = grid.shape
    i = np.minimum(u.astype(np.int64), nx - 2)
    j = np.minimum(v.astype(np.int64), ny - 2)
    fu, fv = u - i, v - j
    # Along x on the grid lines j and j + 1, then along y (flat-index gathers).
    flat, k = grid.ravel(), i * ny + j
    h00, h10 = flat.take(k), flat.take(k + ny)
    h01, h11 = flat.take(k + 1), flat.take(k + ny + 1)
    low = h00 + (h10 - h00) * fu
    high = h01 + (h11 - h01) * fu
    return low + (high - low) * fv


def _rectangles(need: np.ndarray, may: np.ndarray) -> list[tuple[int, int, int, int]]:
    """[X, Y] bool cells that must be covered and [X, Y] cells that may be (a superset) ->
    rectangles (a0, a1, b0, b1), half-open, within ``may`` that cover every ``need`` cell:
    from the first uncovered one (row-major) as far along y, then along x, as ``may`` goes."""
    left, out = need.copy(), []
    while True:
        found = np.flatnonzero(left)
        if not found.size:
            return out
        a, b = divmod(int(found[0]), left.shape[1])
        row = may[a, b:]
        b1 = b + (int(np.argmin(row)) if not row.all() else len(row))
        a1 = a + 1
        while a1 < may.shape[0] and may[a1, b:b1].all():
            a1 += 1
        left[a:a1, b:b1] = False
        out.append((a, a1, b, b1))


# ------------------------------------------------------------------------------ tile shapes
TileFn = Callable[[float, TerrainConfig, TerrainSizes, np.random.Generator], np.ndarray]


def _rings(sz: TerrainSizes) -> np.ndarray:
    """[px, px] cells from each grid point in to the platform edge (Chebyshev rings; 0 on the
    tile edge, largest on the platform)."""
    k = np.abs(np.arange(sz.tile_px) - sz.tile_px // 2)
    chebyshev = np.maximum(k[:, None], k[None, :])
    return np.maximum(sz.tile_px // 2 - np.maximum(chebyshev, sz.platform_px), 0)


def _flat(d, cfg, sz, rng):
    return np.zeros((sz.tile_px, sz.tile_px))


def _rough(d, cfg, sz, rng):
    # Uniform random heights on a coarse grid, bilinear in between (legged_gym's random ground).
    amp = d * cfg.rough_height * sz.standing_height
    step = max(1, round(cfg.rough_spacing * sz.standing_height / sz.cell))
    n = sz.tile_px // step + 2
    coarse = rng.uniform(-0.5 * amp, 0.5 * amp, (n, n))
    t = np.arange(sz.tile_px) / step
    i, f = t.astype(np.int64), t - t.astype(np.int64)
    rows = coarse[i] * (1 - f)[:, None] + coarse[i + 1] * f[:, None]
    return rows[:, i] * (1 - f) + rows[:, i + 1] * f


def _slope_down(d, cfg, sz, rng):
    # A pyramid: edges at 0 rising at the slope to the platform (spawn on top, walk down).
    return math.tan(math.radians(d * cfg.slope_deg)) * sz.cell * _rings(sz)


def _slope_up(d, cfg, sz, rng):
    return -_slope_down(d, cfg, sz, rng)


def _stairs_down(d, cfg, sz, rng):
    # Square rings of whole steps rising to the platform (spawn on top, walk down).
    run = max(1, round(cfg.step_width * sz.standing_height / sz.cell))
    return d * cfg.step_height * sz.standing_height * (_rings(sz) // run)


def _stairs_up(d, cfg, sz, rng):
    return -_stairs_down(d, cfg, sz, rng)


def _obstacles(d, cfg, sz, rng):
    # Raised rectangular blocks of random size and height, the spawn platform kept clear;
    # obstacle_count per tile_size tile, so a bigger tile has as many per square metre.
    px, h = sz.tile_px, d * cfg.obstacle_height * sz.standing_height
    lo, hi = (min(px, max(1, round(s * sz.standing_height / sz.cell)))
              for s in cfg.obstacle_size)
    out = np.zeros((px, px))
    for _ in range(round(cfg.obstacle_count * sz.area_scale)):
        sx, sy = rng.integers(lo, hi + 1, 2)
        x, y = rng.integers(0, px - sx + 1), rng.integers(0, px - sy + 1)
        out[x:x + sx, y:y + sy] = rng.uniform(0.5 * h, h)
    out[_rings(sz) == _rings(sz).max()] = 0.0
    return out


TILES: dict[str, TileFn] = {'flat': _flat, 'rough': _rough, 'slope_up': _slope_up,
                            'slope_down': _slope_down, 'stairs_up': _stairs_up,
                            'stairs_down': _stairs_down, 'obstacles': _obstacles}


def heightfield_stride(cfg: TerrainConfig, sz: TerrainSizes) -> int:
    """Grid points between the heightfield's samples: 1, or with box ground the rough
    ground's spacing (its random heights lie on every such point, bilinear in between; slopes
    are planes), which halves the prisms under a claw at the defaults (0.4 H for 0.2 H cells;
    bench/env_throughput.py --collision). 1 where the border or tiles do not align to it."""
    step = max(1, round(cfg.rough_spacing * sz.standing_height / sz.cell))
    stepped = any(t in STEPPED_TYPES for t in cfg.columns)
    if cfg.collision != 'boxes' or not stepped or sz.border_px % step or sz.tile_px % step:
        return 1
    return step


def difficulty(level: int, num_levels: int) -> float:
    """Difficulty in (0, 1] of a level: (level + 1) / num_levels (the top level is 1)."""
    return (level + 1) / num_levels


def generate_terrain(cfg: TerrainConfig, robot: RobotSpec) -> Terrain:
    """The height map of ``cfg`` sized for ``robot``; the same seed gives the same map.

    Each tile draws from its own generator seeded by (seed, level, type), so a tile does not
    change when other types or levels are added.
    """
    sz = resolve_sizes(cfg, robot.standing_height)
    columns, rows, px, b = cfg.columns, cfg.num_levels, sz.tile_px, sz.border_px
    heights = np.zeros((rows * px + 2 * b + 1, len(columns) * px + 2 * b + 1))
    for r in range(rows):
        for c, name in enumerate(columns):
            rng = np.random.default_rng([cfg.seed, r, TERRAIN_TYPES.index(name)])
            heights[b + r * px:b + (r + 1) * px, b + c * px:b + (c + 1) * px] = \
                TILES[name](difficulty(r, rows), cfg, sz, rng)
    tile_type = np.tile([TERRAIN_TYPES.index(t) for t in columns], (rows, 1))
    tile_level = np.repeat(np.arange(rows)[:, None], len(columns), axis=1)
    centre = (np.arange(max(rows, len(columns))) * px + px // 2) * sz.cell
    xy = np.stack(np.meshgrid(centre[:rows], centre[:len(columns)], indexing='ij'), axis=-1)
    terrain = Terrain(
        heights=heights.astype(np.float32), cell=sz.cell, origin=np.full(2, -b * sz.cell),
        tile_size=sz.tile_size, columns=tuple(columns), tile_type=tile_type,
        tile_level=tile_level, tile_origins=np.zeros((rows, len(columns), 3)),
        scan_offsets=scan_offsets(cfg.height_scan, sz.standing_height),
        footprint=sz.footprint, spawn_jitter=sz.spawn_jitter, collision=cfg.collision,
        tile_px=px, border_px=b, heightfield_stride=heightfield_stride(cfg, sz))
    # Spawn points: the tile centre, on the highest ground under the robot's footprint.
    terrain.tile_origins[..., 0:2] = xy
    terrain.tile_origins[..., 2] = terrain.ground_under(xy.reshape(-1, 2)).reshape(xy.shape[:2])
    return terrain
