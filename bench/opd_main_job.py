"""PPO + OPD against plain PPO for the main job, side by side in one run on equal wall-clock.

Each variant trains the claw quadruped with ``config/train_ppo.yaml`` (same seed, same worlds,
same time budget, one torch thread each, all variants at once so they share the machine's
load equally) and keeps a checkpoint every ``--save-interval`` iterations. Every checkpoint is
then evaluated twice, with the walking criterion of the main job (0.5 m/s, randomisation and
noise on, ``--episodes`` worlds):

* nominal: the training ranges;
* sim2sim: friction 0.4-1.25, link masses +-10 %, motor strength +-10 %, a fixed 15 ms action
  latency (3 of the 4 physics steps of a control period: the env's latency stays within one
  period; `claw-rl verify` adds the full 0-20 ms through ROS), pushes every 4 s.

Printed per variant: wall-clock time to the first checkpoint that walks (vx tracking error
<= 0.1 m/s, falls < 5 %) in each condition, and the last checkpoint's numbers; ratios to
plain PPO. Not a test: a measurement to run on an otherwise idle machine.

    .venv/bin/python bench/opd_main_job.py [--budget-s 600] [--variants ppo ema:1.0]

Variant syntax: ``ppo`` (alpha 0), ``ema:<alpha>`` (teacher = EMA of the student),
``frozen:<alpha>:<checkpoint>`` (a loaded teacher, e.g. a privileged one).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
import subprocess
import sys
import time

ROOT = Path(__file__).resolve().parents[1]
WALK_VX_ERROR, WALK_FALLS = 0.1, 0.05


def variant_overrides(spec: str) -> list[str]:
    """``--set`` overrides of one variant."""
    kind, *rest = spec.split(':')
    if kind == 'ppo':
        return ['distillation.alpha=0', 'distillation.teacher_mode=none']
    if kind == 'ema':
        return [f'distillation.alpha={rest[0]}', 'distillation.teacher_mode=ema']
    if kind == 'frozen':
        return [f'distillation.alpha={rest[0]}', 'distillation.teacher_mode=frozen',
                f'distillation.teacher_checkpoint={rest[1]}']
    raise SystemExit(f'variant {spec!r}: use ppo, ema:<alpha> or frozen:<alpha>:<checkpoint>')


def train_all(variants: list[str], out: Path, budget_s: float, save_interval: int,
              seed: int) -> None:
    """Start every variant at once (one torch thread each) and wait for all of them."""
    procs = []
    for spec in variants:
        overrides = [f'runner.time_budget_s={budget_s}', 'runner.max_iterations=100000',
                     f'runner.save_interval={save_interval}', 'runner.keep_checkpoints=1000',
                     'runner.torch_threads=1', f'runner.seed={seed}', 'runner.eval_episodes=0',
                     *variant_overrides(spec)]
        cmd = [sys.executable, '-m', 'claw_rl_ros.cli', 'train', '--config',
               str(ROOT / 'config' / 'train_ppo.yaml'), '--run-dir', str(out / name(spec)),
               '--no-export', *[a for o in overrides for a in ('--set', o)]]
        log = open(out / f'{name(spec)}.log', 'w')
        procs.append((spec, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                             cwd=ROOT)))
    for spec, proc in procs:
        if proc.wait() != 0:
            raise SystemExit(f'{spec}: training failed, see {out / (name(spec) + ".log")}')


def name(spec: str) -> str:
    return spec.split(':')[0] + ('_' + spec.split(':')[1] if ':' in spec else '')


def conditions() -> dict[str, dict]:
    """Env overrides of the two evaluation conditions."""
    sim2sim = {'randomization': {'enabled': True, 'friction': [0.4, 1.25],
                                 'link_mass_scale': [0.9, 1.1], 'motor_strength': [0.9, 1.1],
                                 'action_latency_substeps': [3, 3], 'push_interval_s': 4.0},
               'noise': {'enabled': True}}
    return {'nominal': {}, 'sim2sim': sim2sim}


def on_grid(checkpoints: list[Path], wall: dict[int, float], grid_s: float) -> list[Path]:
    """The first checkpoint at or after every multiple of ``grid_s`` seconds of training (all
    of them when grid_s is 0), and the last one."""
    if not grid_s:
        return checkpoints
    chosen, next_mark = [], 0.0
    for path in checkpoints:
        t = wall.get(int(path.stem.split('_')[1]), float('nan'))
        if t >= next_mark:
            chosen.append(path)
            next_mark = (t // grid_s + 1) * grid_s
    return chosen + [p for p in checkpoints[-1:] if p not in chosen]


def evaluate_run(run: Path, episodes: int, grid_s: float = 0.0,
                 env_overrides: dict | None = None) -> list[dict]:
    """The checkpoints of a run (every ``grid_s`` seconds of training, or all), evaluated at
    0.5 m/s in both conditions (``env_overrides``: env keys set for the evaluation, e.g. the
    CPU engine for a run trained on MuJoCo Warp)."""
    from claw_rl_ros.core.config import from_dict, merge, to_dict
    from claw_rl_ros.core.evaluation.evaluator import evaluate, torch_policy_fn
    from claw_rl_ros.core.learning.learner import load_policy
    from claw_rl_ros.core.sim.robot import load_robot
    with open(run / 'metrics.csv', newline='') as f:
        wall = {int(r['iteration']): float(r['wall_time_s']) for r in csv.DictReader(f)}
    rows = []
    checkpoints = on_grid(sorted(run.glob('checkpoints/model_*.pt'),
                                 key=lambda p: int(p.stem.split('_')[1])), wall, grid_s)
    for path in checkpoints:
        policy, cfg, _ = load_policy(path)
        robot = load_robot(cfg.env.robot)
        iteration = int(path.stem.split('_')[1])
        row = {'iteration': iteration, 'wall_time_s': wall.get(iteration, float('nan'))}
        for label, extra in conditions().items():
            env_cfg = from_dict(type(cfg.env), merge(to_dict(cfg.env), {
                'episode_length_s': 10.0, **(env_overrides or {}), **extra}), source=label)
            report = evaluate(torch_policy_fn(policy), env_cfg, robot, episodes=episodes,
                              command=(0.5, 0.0, 0.0), seed=12345)
            row[f'{label}_vx_error'] = float(report.tracking_error_vx)
            row[f'{label}_falls'] = report.falls / episodes
            row[f'{label}_walks'] = bool(report.tracking_error_vx <= WALK_VX_ERROR and
                                         report.falls / episodes < WALK_FALLS)
        rows.append(row)
    return rows


def time_to_walk(rows: list[dict], label: str) -> float:
    return next((r['wall_time_s'] for r in rows if r[f'{label}_walks']), float('nan'))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--variants', nargs='+', default=['ppo', 'ema:1.0'])
    parser.add_argument('--budget-s', type=float, default=600.0)
    parser.add_argument('--save-interval', type=int, default=25)
    parser.add_argument('--episodes', type=int, default=20)
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--out', type=Path, default=ROOT / 'runs' / 'opd_main_job')
    parser.add_argument('--skip-training', action='store_true', help='evaluate --out again')
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.skip_training:
        start = time.monotonic()
        train_all(args.variants, args.out, args.budget_s, args.save_interval, args.seed)
        print(f'trained {len(args.variants)} variants at once in '
              f'{time.monotonic() - start:.0f} s', flush=True)
    results = {}
    for spec in args.variants:
        rows = evaluate_run(args.out / name(spec), args.episodes)
        results[spec] = rows
        last = rows[-1]
        print(f'{spec:>14}: time to walk nominal {time_to_walk(rows, "nominal"):6.0f} s, '
              f'sim2sim {time_to_walk(rows, "sim2sim"):6.0f} s | last checkpoint (it '
              f'{last["iteration"]}, {last["wall_time_s"]:.0f} s): nominal vx err '
              f'{last["nominal_vx_error"]:.3f} falls {last["nominal_falls"]:.0%}, sim2sim vx '
              f'err {last["sim2sim_vx_error"]:.3f} falls {last["sim2sim_falls"]:.0%}',
              flush=True)
    base = results.get('ppo')
    if base:
        for spec, rows in results.items():
            if spec != 'ppo':
                for label in ('nominal', 'sim2sim'):
                    print(f'{spec} / ppo time to walk ({label}): '
                          f'{time_to_walk(rows, label) / time_to_walk(base, label):.2f}')
    (args.out / 'results.json').write_text(json.dumps(results, indent=1))


if __name__ == '__main__':
    main()
