"""``claw-rl eval``: an ONNX student evaluated (and optionally rendered) in simulation.

A model exported from a Gymnasium run (its spec says ``kind: gymnasium``) is evaluated on the
Gymnasium env it names: mean return of its deterministic action.

``--terrain TYPE[:LEVEL] ...`` (or ``all``) evaluates on terrain tiles instead
(:func:`~claw_rl_ros.core.evaluation.evaluator.evaluate_terrains`): every world of a tile's
evaluation on that type and level (default the top one), curriculum off, on the evaluation
terrain seed (``--terrain-seed``, default 1000; never the config's training seed), at 0.5 m/s
forward unless ``--command`` says otherwise; a table of falls and vx error per tile follows.

``--robot-overlay OVERLAY.yaml`` (default: the ``--config`` env's ``robot_overlay``) merges a
robot overlay onto the robot (``claw-rl sysid --out``); a model trained with one is checked
against, and evaluated on, the robot with the same overlay (without it the gains differ).

User mistakes (missing file, corrupt model, a model for another robot spec) become a
ConfigError: one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import ctypes.util
import json
import os
from pathlib import Path
import sys

from ..core.config import ConfigError


def _default_gl_backend() -> None:
    """Headless and MUJOCO_GL unset: choose an offscreen backend before MuJoCo is imported."""
    if os.environ.get('MUJOCO_GL') or os.environ.get('DISPLAY') or 'mujoco' in sys.modules:
        return
    if ctypes.util.find_library('OSMesa'):
        os.environ['MUJOCO_GL'] = 'osmesa'
    elif ctypes.util.find_library('EGL'):
        os.environ['MUJOCO_GL'] = 'egl'


def _env_config(args: argparse.Namespace, base, robot_name: str, overlay: str):
    """``base`` (the --config env or the defaults) for ``robot_name`` with ``overlay``, with
    the eval switches."""
    from ..core.config import from_dict, merge, to_dict
    from ..core.sim.env_config import EnvConfig
    overrides: dict = {'robot': robot_name, 'robot_overlay': overlay}
    if args.no_randomization:
        overrides.update({'randomization': {'enabled': False}, 'noise': {'enabled': False}})
    return from_dict(EnvConfig, merge(to_dict(base), overrides), source='claw-rl eval')


def _open_model(path: str):
    """The OnnxPolicy at ``path``; an unusable file is a ConfigError naming --model."""
    from ..core.export.onnx_policy import ModelError, OnnxPolicy
    try:
        return OnnxPolicy(path)
    except ModelError as exc:
        raise ConfigError('--model', '', str(exc)) from None


def _load_model(args: argparse.Namespace, config_robot: str | None, policy,
                overlay: str = ''):
    """(OnnxPolicy, RobotSpec): the model checked against the robot it will drive.

    The robot is --robot, else the --config env's robot, else the one the model names; with
    ``overlay`` (a checked robot overlay) merged.
    """
    from ..core.export.onnx_policy import ModelError
    from ..core.sim.robot import load_robot
    try:
        robot = load_robot(args.robot or config_robot or policy.spec.get('robot', ''),
                           overlay=overlay)
        policy.check_robot(robot)
    except ModelError as exc:
        raise ConfigError('--model', '', str(exc)) from None
    return policy, robot


def _write_report(path: str | None, report: dict) -> None:
    if path:
        from ..core.io import atomic_write_bytes
        atomic_write_bytes(path, (json.dumps(report, indent=2) + '\n').encode())
        print(f'wrote {path}')


def _cmd_eval_gym_model(args: argparse.Namespace, policy) -> int:
    """An ONNX model exported from a Gymnasium run, on the env its spec names."""
    from ..core.evaluation.evaluate_gym import evaluate_policy
    from ..core.export.onnx_policy import ModelError
    from ..core.sim.gym_spec import gym_task_spec
    robot_only = [flag for flag, value in (('--robot', args.robot), ('--config', args.config),
                                           ('--robot-overlay', args.robot_overlay),
                                           ('--command', args.command), ('--gif', args.gif),
                                           ('--terrain', args.terrain))
                  if value]
    if robot_only:
        raise ConfigError(robot_only[0], '', f'{args.model} is a policy for the Gymnasium env '
                          f'{policy.spec.get("env_id")!r}; {", ".join(robot_only)} only apply '
                          'to robot models: drop them')
    env_id = policy.spec.get('env_id', '')
    try:
        policy.check_robot(gym_task_spec(env_id))
    except ModelError as exc:
        raise ConfigError('--model', '', str(exc)) from None
    returns = evaluate_policy(policy, env_id, args.episodes, seed=args.seed)
    algorithm = json.loads(policy.metadata.get('algorithm', 'null'))
    report = {'model': str(args.model), 'sha256': policy.sha256, 'env': env_id,
              'algorithm': algorithm, 'episodes': args.episodes,
              'mean_return': float(returns.mean()), 'std_return': float(returns.std())}
    print(f'model {args.model} (sha256 {policy.sha256[:12]}), {env_id} ({algorithm}): mean '
          f'return {report["mean_return"]:.1f} +- {report["std_return"]:.1f} over '
          f'{args.episodes} episodes')
    _write_report(args.json, report)
    return 0


def _cmd_eval_run(args: argparse.Namespace) -> int:
    """A Gymnasium run's newest checkpoint on its env: mean return of the deterministic policy."""
    from ..core.evaluation.evaluate_gym import evaluate_policy
    from ..core.learning import checkpoint as ckpt
    from ..core.learning.learner import load_policy
    path = ckpt.latest_checkpoint(args.run_dir)
    if path is None:
        raise ConfigError('--run-dir', str(args.run_dir), 'no checkpoints/model_<it>.pt in it; '
                          'give the directory of a claw-rl train --env gym:... run')
    policy, cfg, payload = load_policy(path)
    if not cfg.gym_env:
        raise ConfigError('--run-dir', str(args.run_dir), 'this run trained the robot; export '
                          'it (claw-rl export) and evaluate the .onnx with --model')
    returns = evaluate_policy(policy, cfg.gym_env, args.episodes, seed=args.seed)
    report = {'run_dir': str(args.run_dir), 'checkpoint': path.name, 'env': cfg.gym_env,
              'algorithm': cfg.algorithm, 'episodes': args.episodes,
              'mean_return': float(returns.mean()), 'std_return': float(returns.std())}
    print(f'{cfg.gym_env} ({cfg.algorithm}, {path.name}): mean return '
          f'{report["mean_return"]:.1f} +- {report["std_return"]:.1f} over {args.episodes} '
          'episodes')
    _write_report(args.json, report)
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    if args.episodes < 1:
        raise ConfigError('--episodes', '', f'{args.episodes} is out of range; give 1 or more')
    if args.run_dir:
        return _cmd_eval_run(args)
    if not args.model:
        raise ConfigError('--model', '', 'give an exported .onnx student with --model, or a '
                          'Gymnasium training run with --run-dir')
    model = _open_model(args.model)
    if model.kind == 'gymnasium':
        return _cmd_eval_gym_model(args, model)
    if args.gif:
        _default_gl_backend()
    from ..core.sim.env_config import EnvConfig
    from ..core.evaluation.evaluator import evaluate
    from ..core.learning.train_config import load_train_config
    if args.gif and Path(args.gif).suffix.lower() not in ('.gif', '.png'):
        raise ConfigError('--gif', '', f'{args.gif}: name a .gif (animation) or .png (strip)')
    from ..launch_graph.description import overlay_argument
    base = load_train_config(args.config).env if args.config else EnvConfig()
    name = args.robot or (base.robot if args.config else None) or model.spec.get('robot', '')
    overlay = overlay_argument(args.robot_overlay, name, '--robot-overlay', '') \
        if args.robot_overlay else overlay_argument(base.robot_overlay, name, args.config,
                                                    'env.robot_overlay')
    policy, robot = _load_model(args, base.robot if args.config else None, model, overlay)
    env_cfg = _env_config(args, base, robot.name, overlay)
    command = tuple(args.command) if args.command else None
    tiles = _tiles(args, env_cfg, command)
    print(f'model {args.model} (sha256 {policy.sha256[:12]}), robot {robot.name}'
          + (f', robot overlay {overlay}' if overlay else ''))
    head = {'model': str(args.model), 'sha256': policy.sha256, 'robot': robot.name,
            **({'robot_overlay': overlay} if overlay else {})}
    if tiles:
        result = _eval_terrains(args, policy, env_cfg, robot, tiles, command)
        _write_report(args.json, {**head, **result.to_dict()})
    else:
        report = evaluate(policy, env_cfg, robot, episodes=args.episodes, command=command,
                          seed=args.seed)
        print(report.format())
        _write_report(args.json, {**head, **report.to_dict()})
    if args.gif:
        _render(policy, robot, args, command, tiles[0] if tiles else None)
    return 0


def _tiles(args: argparse.Namespace, env_cfg, command) -> list:
    """The --terrain tiles (none without --terrain), each one episode at the command long; a
    bad spec or seed is a ConfigError."""
    if not args.terrain:
        return []
    from ..core.evaluation.evaluator import evaluation_tiles
    return evaluation_tiles(env_cfg, args.terrain, args.terrain_seed, '--terrain',
                            '--terrain-seed', command=command)


def _eval_terrains(args: argparse.Namespace, policy, env_cfg, robot, tiles, command):
    """Each tile's report as it finishes, then the table."""
    from ..core.evaluation.evaluator import evaluate, TERRAIN_COMMAND, TerrainEvaluation
    result = TerrainEvaluation([])
    for tile in tiles:
        report = evaluate(policy, env_cfg, robot, episodes=args.episodes,
                          command=command or TERRAIN_COMMAND, seed=args.seed, terrain=tile)
        print(report.format(), flush=True)
        result.reports.append(report)
    print(result.format())
    return result


def _render(policy, robot, args: argparse.Namespace, command, tile) -> None:
    from ..core.evaluation.render import render_gait, RenderUnavailable
    try:
        path = render_gait(policy, robot, args.gif, command=command or (0.5, 0.0, 0.0),
                           seed=args.seed, terrain=tile)
    except RenderUnavailable as exc:
        raise ConfigError('--gif', '', str(exc)) from None
    print(f'wrote {path}')


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``eval`` on the claw-rl parser."""
    ev = subparsers.add_parser('eval', help='evaluate an ONNX student in simulation, or a '
                               'Gymnasium training run')
    source = ev.add_mutually_exclusive_group()
    source.add_argument('--model', help='exported .onnx student')
    source.add_argument('--run-dir', help='a claw-rl train --env gym:... run: its newest '
                        'checkpoint on its Gymnasium env')
    ev.add_argument('--episodes', type=int, default=20, help='episodes (parallel worlds)')
    ev.add_argument('--command', type=float, nargs=3, metavar=('VX', 'VY', 'WZ'),
                    help='fixed command for every episode [m/s, m/s, rad/s] (default: sample)')
    ev.add_argument('--robot', help='robot name or YAML (default: --config\'s, else the '
                    'model\'s); the model must match its spec')
    ev.add_argument('--config', help='train YAML whose env: section configures the env')
    ev.add_argument('--robot-overlay', metavar='OVERLAY.yaml', default='',
                    help='robot overlay merged onto the robot (claw-rl sysid --out; a model '
                    "trained with one needs the same); default: --config's env.robot_overlay, "
                    'none')
    ev.add_argument('--no-randomization', action='store_true',
                    help='turn off domain randomisation and observation noise')
    ev.add_argument('--terrain', nargs='+', metavar='TYPE[:LEVEL]',
                    help='evaluate on terrain tiles: TYPE one of flat, rough, slope_up, '
                    'slope_down, stairs_up, stairs_down, obstacles, LEVEL 0..num_levels - 1 of '
                    "--config's env.terrain (default the top level); all: every type. Command "
                    '0.5 m/s forward unless --command')
    ev.add_argument('--terrain-seed', type=int, default=1000,
                    help='seed of the evaluation terrain (default 1000; the training seed of '
                    '--config is refused)')
    ev.add_argument('--gif', help='also render the gait to this .gif (or .png strip); with '
                    '--terrain on its first tile')
    ev.add_argument('--json', help='write the report to this JSON file')
    ev.add_argument('--seed', type=int, default=0, help='env seed')
    ev.set_defaults(func=_cmd_eval)
