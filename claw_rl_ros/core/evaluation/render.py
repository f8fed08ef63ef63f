"""Offscreen pictures of a policy walking: an animated GIF or a PNG strip of frames.

MuJoCo picks its OpenGL backend from ``MUJOCO_GL`` when it is first imported: ``egl`` (GPU, or
Mesa's EGL), ``osmesa`` (software, Debian package ``libosmesa6``) or ``glfw`` (needs a display).
One world without randomisation or noise is simulated by VecLocomotionEnv; each frame copies
its physics state into an MjData and renders it from a camera that tracks the trunk. On a
terrain tile (``terrain``) the world is that tile's map, and the heightfield is in the picture.
"""

from __future__ import annotations

from dataclasses import replace
import math
import os
from pathlib import Path
from typing import Callable

import mujoco
import numpy as np
from PIL import Image

from ..config import from_dict
from .evaluator import fixed_command_overrides, on_tile
from ..sim.env import VecLocomotionEnv
from ..sim.env_config import EnvConfig
from ..sim.physics import STATE_SPEC
from ..sim.robot_spec import RobotSpec
from ..sim.sim_session import TerrainTile

STRIP_FRAMES = 6
INSTALL_HINT = ('install an offscreen OpenGL backend and select it before Python starts: '
                '`apt-get install libosmesa6` and `export MUJOCO_GL=osmesa` (CPU), or '
                '`export MUJOCO_GL=egl` on a machine with a GPU')


class RenderUnavailable(RuntimeError):
    """No working OpenGL backend; the message says what to install and set."""


def render_env(robot: RobotSpec, seconds: float, command: tuple[float, float, float],
               seed: int, terrain: TerrainTile | None = None) -> VecLocomotionEnv:
    """One world, no randomisation or noise, a fixed command, no time-out while recording;
    on ``terrain``'s tile if given."""
    cfg = from_dict(EnvConfig, {
        'robot': robot.name, 'num_envs': 1, 'seed': seed, 'episode_length_s': seconds + 1.0,
        'randomization': {'enabled': False}, 'noise': {'enabled': False},
        **fixed_command_overrides(command, seconds + 1.0)}, source='render')
    if terrain is None:
        return VecLocomotionEnv(cfg, robot, visuals=True)
    env = VecLocomotionEnv(replace(cfg, terrain=on_tile(cfg, terrain)), robot, visuals=True)
    if env.terrain is not None:
        # The scene's light shines down on the origin: move it over the tile (pictures only).
        env.physics.model.light_pos[:, 0:2] += env.terrain.tile_origins[0, 0, 0:2]
    return env


def open_renderer(model: mujoco.MjModel, width: int, height: int) -> mujoco.Renderer:
    """An offscreen renderer, or :class:`RenderUnavailable` saying how to get one."""
    model.vis.global_.offwidth = max(model.vis.global_.offwidth, width)
    model.vis.global_.offheight = max(model.vis.global_.offheight, height)
    try:
        return mujoco.Renderer(model, height=height, width=width)
    except Exception as exc:  # noqa: BLE001 - each backend fails with its own exception type
        backend = os.environ.get('MUJOCO_GL', 'unset')
        reason = ' '.join(str(exc).split())[:160]
        raise RenderUnavailable(f'cannot render offscreen (MUJOCO_GL={backend}; '
                                f'{type(exc).__name__}: {reason}); {INSTALL_HINT}') from None


def tracking_camera(model: mujoco.MjModel, robot: RobotSpec, heading: float) -> mujoco.MjvCamera:
    """A camera that follows the trunk, from the robot's front-right at its initial heading."""
    camera = mujoco.MjvCamera()
    camera.type = mujoco.mjtCamera.mjCAMERA_TRACKING
    camera.trackbodyid = model.body(robot.base_body).id
    camera.distance = 1.2
    camera.elevation = -20.0
    camera.azimuth = math.degrees(heading) + 135.0
    return camera


def _heading(quat: np.ndarray) -> float:
    # Yaw of a (w, x, y, z) quaternion.
    w, x, y, z = quat
    return math.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


def frame_steps(seconds: float, fps: float, control_dt: float) -> np.ndarray:
    """[F] control step at which each frame is taken: frame k shows time k / fps."""
    count = max(1, int(round(seconds * fps)))
    return np.round(np.arange(count) / fps / control_dt).astype(np.int64)


def record(policy_fn: Callable[[np.ndarray], np.ndarray], env: VecLocomotionEnv,
           renderer: mujoco.Renderer, steps: np.ndarray, keep: np.ndarray) -> list[np.ndarray]:
    """Step the policy and render the frames whose index is in ``keep``: [H, W, 3] uint8 each."""
    model = env.physics.model
    data = mujoco.MjData(model)
    obs, _ = env.reset()
    camera = tracking_camera(model, env.robot, _heading(env.physics.qpos[0, 3:7]))
    frames, step = [], 0
    for k, target in enumerate(steps):
        while step < target:
            obs, *_ = env.step(policy_fn(obs['policy']))
            step += 1
        if k in keep:
            # The world's full physics state -> a fresh MjData -> derived quantities -> pixels.
            mujoco.mj_setState(model, data, env.physics.state[0], STATE_SPEC)
            mujoco.mj_forward(model, data)
            renderer.update_scene(data, camera)
            frames.append(renderer.render().copy())
    return frames


def save_gif(frames: list[np.ndarray], path: Path, fps: float) -> None:
    images = [Image.fromarray(f) for f in frames]
    images[0].save(path, save_all=True, append_images=images[1:], duration=1000.0 / fps,
                   loop=0)


def save_strip(frames: list[np.ndarray], path: Path) -> None:
    """The frames side by side, left to right in time."""
    strip = np.concatenate(frames, axis=1)
    Image.fromarray(strip).save(path)


def render_gait(policy_fn: Callable[[np.ndarray], np.ndarray], robot: RobotSpec,
                out_path: str | Path, *, seconds: float = 4.0,
                command: tuple[float, float, float] = (0.5, 0.0, 0.0), width: int = 320,
                height: int = 240, fps: float = 25, seed: int = 0,
                terrain: TerrainTile | None = None) -> Path:
    """Render ``seconds`` of ``policy_fn`` walking to a GIF (every frame) or a PNG strip.

    ``policy_fn`` maps ``[1, obs_dim] -> [1, A]``. A ``.gif`` gets ``round(seconds * fps)``
    frames at ``fps``; a ``.png`` gets ~6 evenly spaced frames side by side. ``terrain``: walk
    on that tile (:func:`~..sim.sim_session.terrain_tile`; its sizes are the tile's own).
    """
    out_path = Path(out_path)
    suffix = out_path.suffix.lower()
    if suffix not in ('.gif', '.png'):
        raise ValueError(f'{out_path}: write a .gif (animation) or a .png (strip of frames)')
    if seconds <= 0 or fps <= 0 or width < 1 or height < 1:
        raise ValueError('seconds, fps, width and height must be positive')
    env = render_env(robot, seconds, command, seed, terrain)
    renderer = None
    try:
        renderer = open_renderer(env.physics.model, width, height)
        steps = frame_steps(seconds, fps, env.control_dt)
        keep = np.arange(len(steps)) if suffix == '.gif' else \
            np.unique(np.linspace(0, len(steps) - 1, STRIP_FRAMES).round().astype(np.int64))
        frames = record(policy_fn, env, renderer, steps, set(keep.tolist()))
    finally:
        if renderer is not None:
            renderer.close()
        env.close()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == '.gif':
        save_gif(frames, out_path, fps)
    else:
        save_strip(frames, out_path)
    return out_path
