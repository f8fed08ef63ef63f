"""Evaluate a policy: one full episode in each of N parallel worlds, then summary numbers.

Works with anything mapping ``obs_policy [N, obs_dim] -> actions [N, A]``: an
:class:`~claw_rl_ros.core.export.onnx_policy.OnnxPolicy` or :func:`torch_policy_fn` of an
ActorCritic.
A world counts only its first episode; what the env's auto-reset starts afterwards is ignored.

On terrain (:func:`evaluate_terrains`, ``claw-rl eval --terrain``) every world of an evaluation
stands on one tile of the generator, one type at one level (a map of that tile and its flat
border, curriculum off, seed :data:`~..sim.terrain.EVAL_TERRAIN_SEED` unless given; the
tile sizes and top-level maxima are the env config's ``terrain`` section even when it is off);
the tile is big enough for a whole episode at the command (``tile_walk``), so an episode ends
at a fall or at the time-out (reaching the map's edge would end it as a time-out). ``flat`` is
the plane.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
import math
import time
from typing import Any, Callable, Iterable, Optional

import numpy as np
import torch

from ..config import ConfigError, from_dict, merge, to_dict
from ..learning.networks import ActorCritic
from ..learning.rollout import obs_to_torch
from ..sim.env import VecLocomotionEnv
from ..sim.env_config import EnvConfig
from ..sim.robot_spec import RobotSpec
from ..sim.sim_session import terrain_tiles, TerrainTile, tile_config
from ..sim.terrain import EVAL_TERRAIN_SEED

PolicyFn = Callable[[np.ndarray], np.ndarray]
Command = tuple[float, float, float]
# The terrain evaluation's command (the bench's criterion is at it): 0.5 m/s forward.
TERRAIN_COMMAND: Command = (0.5, 0.0, 0.0)


@dataclass
class EvalReport:
    """Summary of ``episodes`` episodes; tracking errors are mean |command - velocity|."""

    episodes: int
    episode_length_s: float
    command: Optional[list[float]]
    randomization: bool
    noise: bool
    tracking_error_vx: float
    tracking_error_vy: float
    tracking_error_yaw: float
    mean_forward_speed: float
    falls: int
    fall_rate: float
    mean_return: float
    mean_length_s: float
    settle_s: float
    wall_s: float
    terrain: Optional[str] = None
    terrain_seed: Optional[int] = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: non-finite numbers (no samples) become None."""
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in asdict(self).items()}

    def format(self) -> str:
        """A few aligned lines for the terminal."""
        cmd = 'sampled from the configured ranges' if self.command is None else \
            'fixed vx=%.2f m/s, vy=%.2f m/s, wz=%.2f rad/s' % tuple(self.command)
        ground = '' if self.terrain is None else f', terrain {self.terrain}' + (
            '' if self.terrain_seed is None else f' (seed {self.terrain_seed})')
        return '\n'.join([
            f'evaluation: {self.episodes} episodes of {self.episode_length_s:g} s, command '
            f'{cmd}, randomisation {"on" if self.randomization else "off"}, noise '
            f'{"on" if self.noise else "off"}{ground}',
            f'  tracking error (after {self.settle_s:g} s): vx {self.tracking_error_vx:.3f} m/s, '
            f'vy {self.tracking_error_vy:.3f} m/s, yaw {self.tracking_error_yaw:.3f} rad/s',
            f'  mean forward speed {self.mean_forward_speed:.3f} m/s',
            f'  falls {self.falls}/{self.episodes} (fall rate {self.fall_rate:.2f})',
            f'  mean return {self.mean_return:.3f}, mean length {self.mean_length_s:.2f} s '
            f'({self.wall_s:.1f} s wall)'])


def torch_policy_fn(policy: ActorCritic) -> PolicyFn:
    """Deterministic ``act_inference`` of a torch policy as a numpy policy function.

    A student (actor groups ``['policy']``) maps ``obs_policy [N, obs_dim] -> [N, A]``; an
    actor that reads other groups (a privileged teacher) maps the env's observation dict and
    carries them in ``obs_groups``, so :func:`evaluate` hands it the groups (and switches the
    height scan on when it reads it).
    """
    groups = list(policy.actor_obs_groups)
    if groups == ['policy']:
        def act(obs: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                obs_t = torch.as_tensor(obs, dtype=torch.float32)
                return policy.act_inference({'policy': obs_t}).numpy()
        return act

    def act_on_groups(obs: dict[str, np.ndarray]) -> np.ndarray:
        with torch.no_grad():
            return policy.act_inference(obs_to_torch(obs)).numpy()
    act_on_groups.obs_groups = groups  # type: ignore[attr-defined]
    return act_on_groups


def obs_groups_of(policy_fn: PolicyFn) -> list[str] | None:
    """The observation groups a policy function reads (None: just ``obs['policy']``)."""
    return getattr(policy_fn, 'obs_groups', None)


def fixed_command_overrides(command: Command, episode_length_s: float) -> dict[str, Any]:
    """``commands:`` overrides that give every world ``command`` for a whole episode."""
    vx, vy, wz = (float(c) for c in command)
    return {'commands': {'lin_vel_x': [vx, vx], 'lin_vel_y': [vy, vy], 'ang_vel_yaw': [wz, wz],
                         'resample_time_s': episode_length_s, 'standing_probability': 0.0,
                         'min_speed': 0.0, 'heading_command': False}}


def eval_env_config(env_cfg: EnvConfig, episodes: int, command: Command | None,
                    seed: int, terrain: TerrainTile | None = None,
                    height_scan: bool = False) -> EnvConfig:
    """``env_cfg`` with one world per episode (each its own randomised model copy), the seed
    and (optionally) a fixed command and a terrain tile for every world (flat: the plane;
    with ``height_scan``, for a policy that reads it, the tile keeps the scan on and flat is a
    flat heightfield)."""
    # Every episode its own draw of the randomisation (training may share model copies), from
    # the full ranges (a training's transfer ramp is not an evaluation's).
    overrides: dict[str, Any] = {'num_envs': episodes, 'seed': seed,
                                 'randomization': {'worlds_per_model': 1,
                                                   'transfer_ramp_steps': 0}}
    if command is not None:
        overrides.update(fixed_command_overrides(command, env_cfg.episode_length_s))
    cfg = from_dict(EnvConfig, merge(to_dict(env_cfg), overrides), source='evaluate')
    if terrain is None:
        return cfg
    if not height_scan:
        return replace(cfg, terrain=on_tile(cfg, terrain))
    config = terrain.config or tile_config(replace(cfg.terrain, tile_walk=terrain.walk), 'flat',
                                           terrain.level, terrain.seed)
    return replace(cfg, terrain=replace(config, height_scan=replace(
        cfg.terrain.height_scan, enabled=True)))


def on_tile(cfg: EnvConfig, tile: TerrainTile):
    """The env's terrain section for ``tile``: its one-tile map, or off for flat."""
    if tile.config is not None:
        return tile.config
    return replace(cfg.terrain, enabled=False,
                   height_scan=replace(cfg.terrain.height_scan, enabled=False))


class _Tally:
    """Running sums over (world, step) samples and finished first episodes."""

    def __init__(self, num_envs: int):
        self.active = np.ones(num_envs, dtype=bool)
        self.abs_error = np.zeros(3)
        self.forward = 0.0
        self.samples = 0
        self.fell = np.zeros(num_envs, dtype=bool)
        self.returns = np.zeros(num_envs)
        self.lengths = np.zeros(num_envs)

    def track(self, mask: np.ndarray, commands: np.ndarray, velocity: np.ndarray) -> None:
        # |command - measured| per axis, and body-frame forward speed, over the masked worlds.
        self.abs_error += np.abs(commands[mask] - velocity[mask]).sum(axis=0)
        self.forward += float(velocity[mask, 0].sum())
        self.samples += int(mask.sum())

    def finish(self, episode: dict[str, np.ndarray], terminated: np.ndarray) -> None:
        """Record the first episode of each world in ``episode['env_ids']``."""
        for k, i in enumerate(episode['env_ids']):
            if self.active[i]:
                self.active[i] = False
                self.fell[i] = terminated[i]
                self.returns[i] = episode['return'][k]
                self.lengths[i] = episode['length_s'][k]

    def mean(self, total: float) -> float:
        return total / self.samples if self.samples else float('nan')


def run_episodes(env: VecLocomotionEnv, policy_fn: PolicyFn, settle_s: float) -> _Tally:
    """Step every world until its first episode has ended (at most max_episode_length steps)."""
    tally = _Tally(env.num_envs)
    settle_steps = int(round(settle_s / env.control_dt))
    groups = obs_groups_of(policy_fn)
    obs, _ = env.reset()
    for step in range(env.max_episode_length):
        commands = env.commands.copy()
        obs, _, terminated, truncated, extras = env.step(
            policy_fn(obs if groups else obs['policy']))
        done = terminated | truncated
        # Worlds that just finished were reset inside step(): their velocity is gone.
        if step + 1 > settle_steps:
            tally.track(tally.active & ~done, commands, env.body_velocity())
        if 'episode' in extras:
            tally.finish(extras['episode'], terminated)
        if not tally.active.any():
            break
    return tally


def evaluate(policy_fn: PolicyFn, env_cfg: EnvConfig, robot: RobotSpec, *, episodes: int = 20,
             command: Command | None = None, seed: int = 0, settle_s: float = 1.0,
             terrain: TerrainTile | None = None) -> EvalReport:
    """Run ``episodes`` worlds in parallel for one episode each and summarise them.

    Args:
        policy_fn: ``obs_policy [N, obs_dim] -> actions [N, A]`` (or, with ``obs_groups``,
            the observation dict: :func:`torch_policy_fn` of a privileged actor); with an
            ``obs_history`` attribute (an OnnxPolicy) the env gives it that many frames.
        env_cfg: the env (its DR and noise settings are used as given).
        robot: the robot spec the env simulates.
        episodes: number of worlds = number of episodes.
        command: fixed (vx, vy, yaw rate) for every world, or None to sample as configured.
        seed: env seed.
        settle_s: tracking errors and speed are measured from this time into an episode.
        terrain: every world on this tile (:func:`~..sim.sim_session.terrain_tile`), or None
            for ``env_cfg``'s own ground.
    """
    if episodes < 1:
        raise ValueError(f'episodes must be >= 1, got {episodes}')
    cfg = eval_env_config(env_cfg, episodes, command, seed, terrain,
                          height_scan='height_scan' in (obs_groups_of(policy_fn) or []))
    # An exported student says how many observation frames it reads (its obs_history).
    cfg = replace(cfg, policy_history=getattr(policy_fn, 'obs_history', cfg.policy_history))
    start = time.perf_counter()
    env = VecLocomotionEnv(cfg, robot)
    try:
        tally = run_episodes(env, policy_fn, settle_s)
    finally:
        env.close()
    errors = [tally.mean(e) for e in tally.abs_error]
    return EvalReport(
        episodes=episodes, episode_length_s=cfg.episode_length_s,
        command=None if command is None else [float(c) for c in command],
        randomization=cfg.randomization.enabled, noise=cfg.noise.enabled,
        tracking_error_vx=errors[0], tracking_error_vy=errors[1], tracking_error_yaw=errors[2],
        mean_forward_speed=tally.mean(tally.forward), falls=int(tally.fell.sum()),
        fall_rate=float(tally.fell.mean()), mean_return=float(tally.returns.mean()),
        mean_length_s=float(tally.lengths.mean()), settle_s=settle_s,
        wall_s=time.perf_counter() - start, terrain=None if terrain is None else terrain.label,
        terrain_seed=None if terrain is None or terrain.config is None else terrain.seed)


@dataclass
class TerrainEvaluation:
    """One :class:`EvalReport` per terrain tile and the criterion each must meet: fall rate
    <= ``max_fall_rate`` and vx tracking error <= ``max_vx_error`` (nothing measured, every
    world fell before settling: not met)."""

    reports: list[EvalReport]
    max_fall_rate: float = 0.05
    max_vx_error: float = 0.15

    def meets(self, report: EvalReport) -> bool:
        vx = report.tracking_error_vx
        return bool(report.fall_rate <= self.max_fall_rate and math.isfinite(vx) and
                    vx <= self.max_vx_error)

    @property
    def passed(self) -> bool:
        """The criterion holds on every tile."""
        return all(self.meets(r) for r in self.reports)

    def rows(self) -> list[dict[str, Any]]:
        """Per tile: terrain, falls, episodes, fall_rate, vx_error (None: not measured),
        mean_length_s, passed."""
        return [{'terrain': r.terrain, 'falls': r.falls, 'episodes': r.episodes,
                 'fall_rate': r.fall_rate, 'vx_error': r.to_dict()['tracking_error_vx'],
                 'mean_length_s': r.mean_length_s, 'passed': self.meets(r)}
                for r in self.reports]

    def to_dict(self) -> dict[str, Any]:
        return {'max_fall_rate': self.max_fall_rate, 'max_vx_error': self.max_vx_error,
                'passed': self.passed, 'rows': self.rows(),
                'reports': [r.to_dict() for r in self.reports]}

    def format(self) -> str:
        """The table, one line per tile, and whether the criterion holds on every one."""
        return side_by_side({'': self})


def side_by_side(evaluations: dict[str, TerrainEvaluation]) -> str:
    """{policy name: its evaluation on the same tiles} -> one line per tile with falls, vx
    error and PASS/FAIL per policy; the last line says which meet the criterion everywhere."""
    names = list(evaluations)
    tiles = [r.terrain for r in evaluations[names[0]].reports]
    for name, ev in evaluations.items():
        if [r.terrain for r in ev.reports] != tiles:
            raise ValueError(f'{name!r} was evaluated on {[r.terrain for r in ev.reports]}, '
                             f'{names[0]!r} on {tiles}: evaluate both on the same tiles')
    width = max(len('terrain'), *(len(t) for t in tiles))
    group = max(22, *(len(n) for n in names))
    lines = [(f'{"":<{width}}  ' + '  '.join(f'{n:<{group}}' for n in names)).rstrip()] \
        if any(names) else []
    lines.append(f'{"terrain":<{width}}  ' + '  '.join(
        f'{"falls":<7}  {"vx err":>7}  {"":<{group - 18}}' for _ in names).rstrip())
    for k, tile in enumerate(tiles):
        cells = []
        for ev in evaluations.values():
            row = ev.rows()[k]
            vx = 'n/a' if row['vx_error'] is None else f'{row["vx_error"]:.3f}'
            falls, verdict = f'{row["falls"]}/{row["episodes"]}', \
                'PASS' if row['passed'] else 'FAIL'
            cells.append(f'{falls:<7}  {vx:>7}  {verdict:<{group - 18}}')
        lines.append((f'{tile:<{width}}  ' + '  '.join(cells)).rstrip())
    first = evaluations[names[0]]
    lines.append(f'criterion: falls <= {first.max_fall_rate:.0%} and vx error <= '
                 f'{first.max_vx_error:g} m/s on every tile: ' + ', '.join(
                     f'{n + " " if n else ""}{"PASS" if ev.passed else "FAIL"}'
                     for n, ev in evaluations.items()))
    return '\n'.join(lines)


def evaluation_tiles(env_cfg: EnvConfig, terrains: Iterable[str],
                     terrain_seed: int = EVAL_TERRAIN_SEED, name: str = 'terrains',
                     seed_name: str = 'terrain_seed',
                     command: Command | None = None) -> list[TerrainTile]:
    """``TYPE[:LEVEL]`` specs (``all``: every type at its top level) -> tiles of ``env_cfg``'s
    terrain sizes with the evaluation seed, each big enough for a whole episode at ``command``
    (None: :data:`TERRAIN_COMMAND`; ``tile_walk`` = planar speed x episode_length_s: no walk
    ends at the tile's edge); a seed equal to the env config's own ``terrain.seed`` (its
    training map) is refused, naming ``seed_name``."""
    if terrain_seed == env_cfg.terrain.seed:
        raise ConfigError(seed_name, '', f'{terrain_seed} is env.terrain.seed of the env '
                          'config: the evaluation map would be the training map; give '
                          f'another seed (default {EVAL_TERRAIN_SEED})')
    vx, vy, _ = TERRAIN_COMMAND if command is None else command
    walk = math.hypot(vx, vy) * env_cfg.episode_length_s
    return terrain_tiles(terrains, env_cfg.terrain, terrain_seed, name, seed_name, walk=walk)


def evaluate_terrains(policy_fn: PolicyFn, env_cfg: EnvConfig, robot: RobotSpec,
                      terrains: Iterable[str] = ('all',), *, episodes: int = 20,
                      command: Command | None = TERRAIN_COMMAND, seed: int = 0,
                      terrain_seed: int = EVAL_TERRAIN_SEED, settle_s: float = 1.0,
                      max_fall_rate: float = 0.05,
                      max_vx_error: float = 0.15) -> TerrainEvaluation:
    """:func:`evaluate` on each terrain tile: ``episodes`` worlds each, at ``command``.

    ``terrains``: ``TYPE[:LEVEL]`` specs (``all``: every type at its top level);
    ``env_cfg``'s randomisation and noise apply as configured
    (the default EnvConfig has both on) and its ``terrain`` section sizes the tiles, so two
    policies evaluated with the same ``env_cfg`` and ``terrain_seed`` walk the same ground.
    For the bench: ``side_by_side({'terrain student': a, 'flat student': b})``.
    """
    tiles = evaluation_tiles(env_cfg, terrains, terrain_seed, command=command)
    return TerrainEvaluation([evaluate(policy_fn, env_cfg, robot, episodes=episodes,
                                       command=command, seed=seed, settle_s=settle_s,
                                       terrain=tile) for tile in tiles],
                             max_fall_rate, max_vx_error)
