"""The terrain job's measured goals, side by side in one run (issue 22; not a timed test).

1. Every model given (``--model NAME=PATH``, e.g. the terrain student, the flat main job's
   student; a ``.pt`` checkpoint, e.g. the privileged teacher, is evaluated in torch) on
   the evaluation terrain set: every type of the terrain config at its top level
   (rough ground ~15 % of standing height, slopes 20 deg up and down, stairs ~20 % up and
   down, obstacles, flat), on a map of its own seed (never the training map), 20 episodes per
   type at 0.5 m/s forward with randomisation and noise on; one table, falls and vx error per
   type and model, and the criterion (falls <= 5 %, vx error <= 0.15 m/s on every type).
2. Training runs given (``--run NAME=RUN_DIR``, live or offline run directories, e.g. the
   OPD student and blind PPO at the same wall clock): their curves (vx tracking error and the
   mean terrain level against training wall time) in one PNG, and with ``--grid-s`` the
   pushed students (``models/student_v<version>.onnx``) on a wall-clock grid evaluated on the
   same terrain set: the first wall time each run meets the criterion (or its best).
3. With ``--seeds``: every model on the set once per env seed (the same ground, other
   randomised friction, masses and pushes), each type's vx error per seed side by side:
   on 20 deg slopes a blind student's result swings with how slippery the seed's worlds are.

The evaluation worlds use MuJoCo's default soft contacts (``--noslip-iterations 0``) whatever
the config trains with (``config/train_rough.yaml`` trains with 3): the harder contacts for a
standing claw, and the ones every earlier table was measured on.

    .venv/bin/python bench/terrain_job.py --model student=runs/r/student/student.onnx \\
        --model flat=runs/f/student.onnx --run opd=runs/r/student --run blind=runs/b \\
        [--teacher-run opd=runs/r/teacher] [--config config/train_rough.yaml] \\
        [--episodes 20] [--grid-s 120] [--seeds 0 1 2 3] [--png out.png]
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
import re
import sys

from claw_rl_ros.core.config import ConfigError, from_dict, merge, to_dict
from claw_rl_ros.core.evaluation.evaluator import evaluate_terrains, side_by_side, torch_policy_fn
from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
from claw_rl_ros.core.learning.learner import load_policy
from claw_rl_ros.core.learning.train_config import load_train_config, TrainConfig
from claw_rl_ros.core.sim.robot import load_robot


def named(items: list[str], flag: str) -> dict[str, Path]:
    """``NAME=PATH`` items -> {name: path}; a missing path is an error naming it."""
    out = {}
    for item in items:
        name, sep, path = item.partition('=')
        if not sep or not name:
            sys.exit(f'{flag} {item!r}: give NAME=PATH')
        if not Path(path).exists():
            sys.exit(f'{flag} {item!r}: {path} does not exist')
        out[name] = Path(path)
    return out


def evaluate_model(path: Path, cfg, robot, episodes: int, seed: int | None = None):
    """An exported student (.onnx; a student with memory gets its own window) or a checkpoint
    (.pt: e.g. the privileged teacher, in torch) on the evaluation terrain set, with env seed
    ``seed`` (default the config's runner seed + 1, as the training run's own evaluation)."""
    if path.suffix == '.pt':
        policy = torch_policy_fn(load_policy(path)[0])
    else:
        policy = OnnxPolicy(path, robot)
    return evaluate_terrains(policy, cfg.env, robot, ('all',), episodes=episodes,
                             seed=cfg.runner.seed + 1 if seed is None else seed)


def over_seeds(models: dict[str, Path], cfg, robot, episodes: int, seeds: list[int]) -> str:
    """Each model on the evaluation set once per env seed (other randomised friction, mass
    and pushes on the same ground): per type and model the vx error of every seed, their mean,
    and the falls of all of them."""
    evals = {name: [evaluate_model(path, cfg, robot, episodes, seed) for seed in seeds]
             for name, path in models.items()}
    lines = [f'over env seeds {" ".join(map(str, seeds))} ({episodes} episodes per type and '
             'seed): vx error per seed (mean), falls of all']
    for i, terrain in enumerate(r['terrain'] for r in next(iter(evals.values()))[0].rows()):
        cells = []
        for name, runs in evals.items():
            rows_ = [ev.rows()[i] for ev in runs]
            vx = [r['vx_error'] if r['vx_error'] is not None else float('nan') for r in rows_]
            falls = sum(r['falls'] for r in rows_)
            cells.append(f'{name}: {" ".join(f"{v:.3f}" for v in vx)} ({sum(vx) / len(vx):.3f})'
                         f', falls {falls}/{sum(r["episodes"] for r in rows_)}')
        lines.append(f'  {terrain:<14} ' + ' | '.join(cells))
    return '\n'.join(lines)


def rows(run: Path) -> list[dict[str, str]]:
    with open(run / 'metrics.csv', newline='') as f:
        return list(csv.DictReader(f))


def pushed_on_grid(run: Path, grid_s: float) -> list[tuple[float, Path]]:
    """(training wall time, model) of the pushed students, the first one past each multiple
    of ``grid_s`` (a version is pushed after its iteration: that row's wall time)."""
    wall = {int(r['iteration']): float(r['wall_time_s']) for r in rows(run)}
    models = sorted((int(m.group(1)), p) for p in (run / 'models').glob('student_v*.onnx')
                    if (m := re.match(r'student_v(\d+)\.onnx$', p.name)))
    out, mark = [], grid_s
    for version, path in models:
        if version in wall and wall[version] >= mark:
            out.append((wall[version], path))
            mark = (wall[version] // grid_s + 1) * grid_s
    return out


def training_wall_s(run: Path) -> float:
    """A finished run's training wall time [s] (summary.json; else its last metrics row)."""
    summary = run / 'summary.json'
    if summary.is_file():
        return float(json.loads(summary.read_text())['wall_time_s'])
    return float(rows(run)[-1]['wall_time_s'])


def plot(runs: dict[str, Path], png: Path, offsets: dict[str, float]) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for name, run in runs.items():
        table = rows(run)
        wall = [float(r['wall_time_s']) + offsets.get(name, 0.0) for r in table]
        for ax, key in zip(axes, ('tracking_error/lin_vel_x', 'terrain_level/mean')):
            ax.plot(wall, [float(r[key]) if r.get(key) else float('nan') for r in table],
                    label=name)
    for ax, title in zip(axes, ('vx tracking error [m/s]', 'mean terrain level')):
        ax.set_title(title)
        ax.set_xlabel('training wall time [s] (a distilled run: after its teacher\'s)')
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--model', action='append', default=[], metavar='NAME=ONNX')
    parser.add_argument('--run', action='append', default=[], metavar='NAME=RUN_DIR')
    parser.add_argument('--config', default='config/train_rough.yaml',
                        help='train YAML whose env (terrain sizes, randomisation) is evaluated')
    parser.add_argument('--episodes', type=int, default=20)
    parser.add_argument('--grid-s', type=float, default=0.0,
                        help='evaluate the runs\' pushed students every this many seconds')
    parser.add_argument('--teacher-run', action='append', default=[], metavar='NAME=RUN_DIR',
                        help='the teacher run the run NAME was distilled from: its training '
                        'wall time is added to NAME\'s (the whole job on one clock)')
    parser.add_argument('--seeds', type=int, nargs='+', default=[],
                        help='also evaluate the models once per env seed and print each '
                        'type\'s vx error per seed (what slippery slopes swing with)')
    parser.add_argument('--noslip-iterations', type=int, default=0,
                        help='MuJoCo noslip iterations of the evaluation worlds (default 0: '
                        'the default soft contacts, whatever the config trains with, so every '
                        'table compares)')
    parser.add_argument('--png', default='terrain_job.png')
    args = parser.parse_args()
    models, runs = named(args.model, '--model'), named(args.run, '--run')
    teachers = named(args.teacher_run, '--teacher-run')
    unknown = sorted(set(teachers) - set(runs))
    if unknown:
        sys.exit(f'--teacher-run {unknown[0]}=...: no --run {unknown[0]}=RUN_DIR to add it to')
    offsets = {name: training_wall_s(path) for name, path in teachers.items()}
    cfg = load_train_config(args.config)
    # The evaluation set's contacts are the bench's, not the training config's.
    try:
        cfg = from_dict(TrainConfig, merge(to_dict(cfg), {'env': {
            'noslip_iterations': args.noslip_iterations}}), source='--noslip-iterations')
    except ConfigError as exc:
        sys.exit(str(exc))
    robot = load_robot(cfg.env.robot)
    if models:
        print(f'evaluation terrain set ({args.episodes} episodes per type, 0.5 m/s, '
              'randomisation and noise on, a map of its own seed):')
        print(side_by_side({name: evaluate_model(path, cfg, robot, args.episodes)
                            for name, path in models.items()}))
    if models and args.seeds:
        print(over_seeds(models, cfg, robot, args.episodes, args.seeds))
    if runs:
        plot(runs, Path(args.png), offsets)
        print(f'curves of {", ".join(runs)}: {args.png}')
    for name, run in runs.items() if args.grid_s else ():
        met = None
        for wall, path in pushed_on_grid(run, args.grid_s):
            wall += offsets.get(name, 0.0)
            ev = evaluate_model(path, cfg, robot, args.episodes)
            worst = max(r['vx_error'] or float('inf') for r in ev.rows())
            falls = max(r['fall_rate'] for r in ev.rows())
            print(f'{name} at {wall:6.0f} s ({path.name}): worst vx error {worst:.3f} m/s, '
                  f'worst fall rate {falls:.0%}{"  MEETS" if ev.passed else ""}')
            if ev.passed and met is None:
                met = wall
        note = f' (its teacher\'s {offsets[name]:.0f} s included)' if name in offsets else ''
        print(f'{name}: criterion first met at {met:.0f} s of training{note}' if met is not None
              else f'{name}: criterion not met on the grid')
    return 0


if __name__ == '__main__':
    sys.exit(main())
