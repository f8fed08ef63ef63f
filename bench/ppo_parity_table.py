"""PPO parity table: ours vs stable-baselines3 on Gymnasium MuJoCo tasks x seeds (issue 11).

Every (task, seed) trains both sides with the same settings as ``bench/ppo_vs_sb3.py``'s
``pendulum`` section given the issue's values: 1 env x 2048-step rollouts, 10 epochs x 32
mini-batches, lr 3e-4, 64x64 tanh, observation normalisation, no entropy bonus, gamma 0.99,
lambda 0.95, clip 0.2, grad norm 0.5 (CleanRL / rl-zoo MuJoCo defaults). Ours runs the core
options of ``config/train_gym_ppo.yaml`` unless ``--ours-*`` says otherwise (an ablation).

Each run is its own process with 1 torch thread; ``--jobs`` run at once, and the two sides of a
(task, seed) are scheduled next to each other so they share the machine alike. Each final
policy is evaluated deterministically on ``--eval-episodes`` episodes (seeds 10000 + k, the same
for both sides). Results are appended to ``<out>/results.jsonl`` as they finish; a re-run skips
what is there (so a long table can be resumed), and ``--report`` prints the table only.

    .venv/bin/python -m pip install -r requirements-bench.txt
    .venv/bin/python bench/ppo_parity_table.py --out runs/ppo_parity \\
        --tasks Hopper-v5 Walker2d-v5 HalfCheetah-v5 Swimmer-v5 --seeds 1 2 3 --steps 300000
    .venv/bin/python bench/ppo_parity_table.py --out runs/ppo_parity --report
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
import json
import multiprocessing
import os
from pathlib import Path
import statistics
import sys
import time
from typing import Any

BENCH = Path(__file__).resolve().parent


def settings(task: str, seed: int, args: dict[str, Any]):
    """The pendulum section's Settings with the issue's PPO values for ``task``."""
    import ppo_vs_sb3 as bench
    return replace(bench.DEFAULTS['pendulum'], env=task, seed=seed, steps=args['steps'],
                   num_envs=1, rollout=2048, epochs=10, mini_batches=32, lr=3e-4,
                   normalize_obs=True, threads=1, eval_episodes=args['eval_episodes'],
                   ours_init=args['ours_init'], ours_normalizer=args['ours_normalizer'],
                   ours_adam_eps=args['ours_adam_eps'])


def run_one(task: str, seed: int, side: str, args: dict[str, Any]) -> dict[str, Any]:
    """Child process: train one side on one (task, seed), evaluate it; a result row."""
    sys.path.insert(0, str(BENCH))
    import torch
    import ppo_vs_sb3 as bench
    torch.set_num_threads(1)
    s = settings(task, seed, args)
    act, result = bench.train_ours(s, 'pendulum') if side == 'ours' else \
        bench.train_sb3(s, 'pendulum', 'dummy')
    result.update(bench.evaluate_gym(s, act))
    return {'task': task, 'seed': seed, 'side': side, 'variant': variant(args),
            'steps': s.budget, 'return': result['return'], 'return_std': result['return_std'],
            'wall_s': result['wall_s'], 'finished': time.strftime('%H:%M:%S')}


def variant(args: dict[str, Any]) -> str:
    """Label of ours' core options (SB3's side ignores it): init/normaliser/adam eps/steps."""
    return (f'{args["ours_init"]}/{args["ours_normalizer"]}/{args["ours_adam_eps"]:g}'
            f'/{args["steps"]}')


def load_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def done_keys(rows: list[dict[str, Any]], args: dict[str, Any]) -> set[tuple[str, int, str]]:
    """(task, seed, side) already finished for this run's settings (SB3 rows match on steps)."""
    keys = set()
    for r in rows:
        if r['side'] == 'ours' and r['variant'] == variant(args):
            keys.add((r['task'], r['seed'], 'ours'))
        if r['side'] == 'sb3' and r['steps'] // 2048 == args['steps'] // 2048:
            keys.add((r['task'], r['seed'], 'sb3'))
    return keys


def mean_std(values: list[float]) -> str:
    if not values:
        return '-'
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f'{statistics.mean(values):8.1f} +- {spread:6.1f}'


def report(rows: list[dict[str, Any]], args: dict[str, Any]) -> None:
    """Per task: mean +- std over seeds of each side, ours/SB3, the per-seed returns."""
    want = variant(args)
    steps = args['steps'] // 2048 * 2048
    ours = [r for r in rows if r['side'] == 'ours' and r['variant'] == want]
    sb3 = [r for r in rows if r['side'] == 'sb3' and r['steps'] == steps]
    tasks = list(dict.fromkeys(r['task'] for r in ours + sb3))
    print(f'\nPPO parity, {steps} env steps per run; ours = {want.rsplit("/", 1)[0]} '
          '(policy.init / policy.obs_normalizer / ppo.adam_eps)')
    print(f'{"task":16}{"ours mean +- std":>20}{"SB3 mean +- std":>20}{"ours/SB3":>10}'
          f'{"wall ours/SB3":>15}  per seed (ours | SB3)')
    met = 0
    for task in tasks:
        o = {r['seed']: r for r in ours if r['task'] == task}
        b = {r['seed']: r for r in sb3 if r['task'] == task}
        seeds = sorted(set(o) & set(b))
        ov, bv = [o[k]['return'] for k in seeds], [b[k]['return'] for k in seeds]
        if not seeds:
            print(f'{task:16}  (incomplete: ours seeds {sorted(o)}, SB3 seeds {sorted(b)})')
            continue
        om, bm = statistics.mean(ov), statistics.mean(bv)
        # A ratio means nothing for returns <= 0 (Reacher, Pusher): the means say which is higher.
        ratio = f'{om / bm:10.2f}' if om > 0 and bm > 0 else f'{"n/a":>10}'
        wall = sum(o[k]['wall_s'] for k in seeds) / sum(b[k]['wall_s'] for k in seeds)
        met += om >= bm
        digits = 1 if max(abs(v) for v in ov + bv) < 100 else 0
        per_seed = ' '.join(f'{v:.{digits}f}' for v in ov) + ' | ' + \
            ' '.join(f'{v:.{digits}f}' for v in bv)
        print(f'{task:16}{mean_std(ov):>20}{mean_std(bv):>20}{ratio}{wall:15.2f}  '
              f'{per_seed}  (seeds {seeds})')
    print(f'tasks where ours mean >= SB3 mean: {met} of {len(tasks)} (goal: >= 4 tasks, '
          '>= 3 seeds each)')


def parse_args(argv: list[str] | None = None) -> dict[str, Any]:
    """The command line (``argv``, default ``sys.argv[1:]``) as a dict of settings."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out', default='runs/ppo_parity', help='folder of results.jsonl')
    parser.add_argument('--tasks', nargs='+',
                        default=['Hopper-v5', 'Walker2d-v5', 'HalfCheetah-v5', 'Swimmer-v5'])
    parser.add_argument('--seeds', nargs='+', type=int, default=[1, 2, 3])
    parser.add_argument('--steps', type=int, default=300_000,
                        help='env steps per run, rounded down to whole 2048-step rollouts')
    parser.add_argument('--eval-episodes', type=int, default=10)
    parser.add_argument('--jobs', type=int, default=os.cpu_count() or 1)
    parser.add_argument('--sides', nargs='+', choices=('ours', 'sb3'), default=['ours', 'sb3'])
    parser.add_argument('--ours-init', choices=('torch', 'orthogonal'), default='orthogonal')
    parser.add_argument('--ours-normalizer', choices=('rsl_rl', 'sb3'), default='sb3')
    parser.add_argument('--ours-adam-eps', type=float, default=1e-5)
    parser.add_argument('--report', action='store_true', help='print the table only')
    return vars(parser.parse_args(argv))


def main() -> None:
    args = parse_args()
    out = Path(args['out'])
    out.mkdir(parents=True, exist_ok=True)
    results = out / 'results.jsonl'
    if args['report']:
        report(load_rows(results), args)
        return
    sys.path.insert(0, str(BENCH))
    import ppo_vs_sb3 as bench
    bench.require_bench_packages()
    done = done_keys(load_rows(results), args)
    jobs = [(t, k, side) for t in args['tasks'] for k in args['seeds'] for side in args['sides']
            if (t, k, side) not in done]
    print(f'{len(jobs)} runs to do ({len(done)} already in {results}), {args["jobs"]} at a '
          f'time; {bench.load_line()}', flush=True)
    context = multiprocessing.get_context('spawn')
    with ProcessPoolExecutor(args['jobs'], mp_context=context, max_tasks_per_child=1) as pool:
        futures = {pool.submit(run_one, *job, args): job for job in jobs}
        for future in as_completed(futures):
            row = future.result()
            with results.open('a') as f:
                f.write(json.dumps(row) + '\n')
            print(f'{row["finished"]} {row["task"]} seed {row["seed"]} {row["side"]}: return '
                  f'{row["return"]:.1f} in {row["wall_s"]:.0f} s; {bench.load_line()}',
                  flush=True)
    report(load_rows(results), args)


if __name__ == '__main__':
    main()
