"""``claw-rl train``: headless training with live progress, logs, checkpoints and artifacts.

Run directory: config.yaml (resolved), checkpoints/model_<it>.pt, metrics.csv, TensorBoard
events, learning_curve.png, student.onnx and eval.json. Ctrl-C saves a checkpoint and exits;
``--resume RUN_DIR`` continues from the newest checkpoint.

``--env gym:<EnvId>`` trains on any Box-action Gymnasium env instead of the robot (through
GymVecEnv, with ``config/train_gym_<algorithm>.yaml``, CleanRL / SB3 defaults, unless
``--config`` is given); ``--algorithm ppo|sac`` picks the trainer. A Gymnasium run ends with
student.onnx (the task's spec in its metadata) and an evaluation of it on the env.

``--robot-overlay OVERLAY.yaml`` (or the config's ``env.robot_overlay``) trains on the robot
with an overlay merged (``claw-rl sysid --out``: identified gains, joint friction, damping,
rotor inertia, delay). It is checked before anything is built, copied into the run directory
as ``robot_overlay.yaml``, and the run's config.yaml names that copy (a resume uses the run's
own copy); the exported students record it in their metadata.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import signal
import time
from typing import Any

from ..core.config import ConfigError, from_dict, load_yaml
from ..core.io import atomic_write_bytes
from ..core.learning.train_config import (load_train_config, parse_overrides, TrainConfig,
                                          with_teacher)
from ..launch_graph.description import overlay_argument

# The run directory's copy of the robot overlay the run trains with.
OVERLAY_COPY = 'robot_overlay.yaml'


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``train`` on the claw-rl parser."""
    p = subparsers.add_parser('train', help='train a locomotion policy (PPO / PPO + OPD)')
    p.add_argument('--config', default=None,
                   help='train YAML (a path, or a name in the package config/ folder; default '
                        'train_ppo.yaml, or train_gym_<algorithm>.yaml with --env gym:...)')
    p.add_argument('--env', metavar='gym:ENV_ID', default=None,
                   help='train on a Gymnasium env (Box actions), e.g. gym:HalfCheetah-v5')
    p.add_argument('--algorithm', choices=('ppo', 'sac'), default=None,
                   help='trainer (overrides the config\'s algorithm)')
    p.add_argument('--teacher', help='checkpoint of a frozen teacher (enables OPD, frozen mode)')
    p.add_argument('--robot-overlay', metavar='OVERLAY.yaml', default='',
                   help='robot overlay merged onto the robot (claw-rl sysid --out: identified '
                        'gains, joint friction, damping, rotor inertia, delay); copied into the '
                        f'run directory as {OVERLAY_COPY} (default: the config\'s '
                        'env.robot_overlay, none)')
    p.add_argument('--resume', metavar='RUN_DIR', help='continue a run from its last checkpoint')
    p.add_argument('--run-dir', help='run directory (default: runner.run_dir/<run_name>)')
    p.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                   help='override a config value, e.g. --set runner.max_iterations=10 '
                        '(VALUE is YAML)')
    p.add_argument('--no-export', action='store_true', help='skip the ONNX export at the end')
    p.set_defaults(func=run_train)


def resolve_config(args: argparse.Namespace) -> tuple[TrainConfig, Path, Path | None]:
    """(config, run_dir, checkpoint to resume or None) from the command line."""
    overrides = parse_overrides(args.set)
    if args.algorithm:
        overrides['algorithm'] = args.algorithm
    if args.env:
        prefix, _, env_id = args.env.partition(':')
        if prefix != 'gym' or not env_id:
            raise ConfigError('--env', args.env, 'expected gym:<EnvId>, e.g. '
                              'gym:HalfCheetah-v5 (the robot env is the default)')
        overrides['gym_env'] = env_id
    if args.teacher:
        if not Path(args.teacher).is_file():
            raise ConfigError(args.teacher, '', 'teacher checkpoint not found; pass an existing '
                              '.pt file to --teacher')
        overrides = with_teacher(overrides, args.teacher)
    from ..core.learning import checkpoint as ckpt  # torch: only for the commands that train
    if args.resume:
        run_dir = Path(args.resume)
        resume_from = ckpt.latest_checkpoint(run_dir)
        if resume_from is None:
            raise ConfigError(str(run_dir), '', 'no checkpoint to resume from in '
                              f'{run_dir / "checkpoints"}')
        if args.robot_overlay:
            raise ConfigError('--robot-overlay', '', f'a resumed run trains on the robot it '
                              f'started with ({run_dir / OVERLAY_COPY} if it had an overlay); '
                              'start a new run for another overlay')
        from ..core.config import merge
        data = merge(load_yaml(run_dir / 'config.yaml'), overrides)
        cfg = from_dict(TrainConfig, data, source=str(run_dir / 'config.yaml'))
        copy = run_dir / OVERLAY_COPY
        if cfg.env.robot_overlay and copy.is_file():  # (the run's own, wherever it moved)
            cfg.env.robot_overlay = str(copy.resolve())
        _check_overlay(cfg, '', str(run_dir / 'config.yaml'))
        return cfg, run_dir, resume_from
    config = args.config or (f'train_gym_{args.algorithm or "ppo"}.yaml' if args.env
                             else 'train_ppo.yaml')
    cfg = load_train_config(config, overrides)
    _check_overlay(cfg, args.robot_overlay, str(config))
    if cfg.distillation.teacher_mode == 'frozen':
        ckpt.load_checkpoint(cfg.distillation.teacher_checkpoint)  # fail before building
    name = cfg.runner.run_name or time.strftime('%Y%m%d-%H%M%S')
    run_dir = Path(args.run_dir) if args.run_dir else Path(cfg.runner.run_dir) / name
    if ckpt.latest_checkpoint(run_dir) is not None:
        raise ConfigError(str(run_dir), '', 'run directory already has checkpoints; use '
                          '--resume to continue it or choose another --run-dir')
    return cfg, run_dir, None


def _check_overlay(cfg: TrainConfig, given: str, config: str) -> None:
    """Put the checked robot overlay (``given``, else the config's) into ``cfg`` as an absolute
    path; a missing or bad file, or one for a Gymnasium env, is a ConfigError naming it."""
    where, key = ('--robot-overlay', '') if given else (config, 'env.robot_overlay')
    value = given or cfg.env.robot_overlay
    if value and cfg.gym_env:
        raise ConfigError(where, key, f'{value}: a robot overlay applies to the robot env, not '
                          f'to the Gymnasium env {cfg.gym_env!r}; drop it')
    cfg.env.robot_overlay = overlay_argument(value, cfg.env.robot, where, key)


def keep_overlay(cfg: TrainConfig, run_dir: Path) -> None:
    """Copy the run's robot overlay (if any) into ``run_dir`` as OVERLAY_COPY and point the
    config at the copy: the run stays reproducible when the original moves."""
    if not cfg.env.robot_overlay:
        return
    copy = (run_dir / OVERLAY_COPY).resolve()
    if Path(cfg.env.robot_overlay) != copy:
        atomic_write_bytes(copy, Path(cfg.env.robot_overlay).read_bytes())
    cfg.env.robot_overlay = str(copy)


def run_train(args: argparse.Namespace) -> int:
    from ..core.learning import checkpoint as ckpt
    from ..core.learning.run_artifacts import RunArtifacts, write_config
    from ..core.learning.runner import OnPolicyRunner
    cfg, run_dir, resume_from = resolve_config(args)
    keep_overlay(cfg, run_dir)
    write_config(run_dir, cfg)
    runner = _make_runner(OnPolicyRunner, cfg, run_dir)
    if resume_from is not None:
        runner.load(resume_from)
        print(f'resumed {run_dir} at iteration {runner.iteration} ({resume_from.name})'
              + ('' if runner.env_resumed else '; the checkpoint holds no env state (the live '
                 "trainer's, or an env that cannot save it): the worlds start from a reset"))
    artifacts = RunArtifacts(run_dir, cfg, resume_iteration=runner.iteration)
    print(f'training {cfg.gym_env or cfg.env.robot} with {cfg.algorithm}: '
          f'{cfg.env.num_envs} worlds x '
          f'{cfg.runner.num_steps_per_env} steps per iteration, up to '
          f'{cfg.runner.max_iterations} iterations'
          + (f' or {cfg.runner.time_budget_s:.0f} s' if cfg.runner.time_budget_s else '')
          + (f', robot overlay {cfg.env.robot_overlay}' if cfg.env.robot_overlay else '')
          + f'; run directory {run_dir}', flush=True)
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum, frame):
        if runner.stop_requested:
            raise KeyboardInterrupt
        print('\nCtrl-C: finishing this iteration, then saving (Ctrl-C again to abort)',
              flush=True)
        runner.request_stop()

    signal.signal(signal.SIGINT, on_sigint)
    try:
        summary = runner.learn(lambda it, m: artifacts.log(it, m, runner.elapsed_s))
    finally:
        signal.signal(signal.SIGINT, previous)
        artifacts.close()
    print(f'saved checkpoint {ckpt.latest_checkpoint(run_dir)}')
    evaluate = None if args.no_export else (lambda: _export_and_evaluate(runner, run_dir))
    result = artifacts.finish(runner.learner, summary['stopped'], evaluate)
    runner.close()
    print(json.dumps(result, indent=2))
    return 0


def _make_runner(runner_cls, cfg: TrainConfig, run_dir: Path):
    """The runner; a Gymnasium env that cannot be made or used is a one-line ConfigError."""
    if not cfg.gym_env:
        return runner_cls(cfg, run_dir)
    import gymnasium as gym
    try:
        return runner_cls(cfg, run_dir)
    except (gym.error.Error, TypeError, ValueError) as exc:
        raise ConfigError('--env', f'gym:{cfg.gym_env}', f'{exc} (give a registered '
                          'Gymnasium id with a Box action space)') from None


def _export_and_evaluate(runner, run_dir: Path) -> dict[str, Any]:
    """student.onnx (if the actor is deployable) and an evaluation of it."""
    if runner.cfg.gym_env:
        return _evaluate_gym(runner, run_dir)
    from ..core.evaluation.final_student import export_and_evaluate
    return export_and_evaluate(runner.learner, runner.env.robot, run_dir)


def _evaluate_gym(runner, run_dir: Path) -> dict[str, Any]:
    """student.onnx for the Gymnasium task, and its mean return over ``eval_episodes``."""
    from ..core.evaluation.evaluate_gym import evaluate_policy
    from ..core.export.onnx_export import export_onnx
    from ..core.export.onnx_policy import OnnxPolicy
    from ..core.sim.gym_spec import gym_task_spec
    task = gym_task_spec(runner.cfg.gym_env)
    onnx_path = export_onnx(runner.policy, task, run_dir / 'student.onnx',
                            extra_metadata={'iteration': runner.iteration,
                                            'total_steps': runner.total_steps,
                                            'algorithm': runner.cfg.algorithm})
    out: dict[str, Any] = {'student_onnx': str(onnx_path)}
    episodes = runner.cfg.runner.eval_episodes
    if not episodes:
        return out
    policy = OnnxPolicy(onnx_path, task)
    returns = evaluate_policy(policy, runner.cfg.gym_env, episodes,
                              seed=runner.cfg.runner.seed + 1000)
    report = {'episodes': episodes, 'mean_return': float(returns.mean()),
              'std_return': float(returns.std())}
    print(f'evaluation of student.onnx: mean return {report["mean_return"]:.1f} '
          f'+- {report["std_return"]:.1f} over {episodes} episodes')
    out['eval'] = report
    return out
