"""Online policy distillation vs PPO from scratch, measured side by side in one run.

1. PPO from scratch with the main training config, evaluated every ``--eval-every`` iterations.
2. The final PPO policy becomes a frozen teacher; R_T is its evaluated return.
3. S_PPO: env steps PPO from scratch needed to first reach 0.95 R_T.
4. A fresh student trained with PPO + OPD (alpha * KL(teacher || student), frozen teacher) until
   it reaches 0.95 R_T: S_OPD. Goal: S_OPD <= 0.2 S_PPO.

Evaluation: deterministic actions, ``--eval-episodes`` worlds with commands sampled from the
training ranges, domain randomisation and noise on, 10 s episodes, the same seed every time.
Writes curve.csv and curve.png into ``--out``.

    .venv/bin/python bench/opd_vs_ppo.py [--out runs/opd_bench] [--ppo-dir DIR]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
import time

from claw_rl_ros.core.learning import checkpoint as ckpt
from claw_rl_ros.core.config import from_dict, merge, to_dict
from claw_rl_ros.core.evaluation.evaluator import evaluate, torch_policy_fn
from claw_rl_ros.core.learning.learner import load_policy
from claw_rl_ros.core.learning.runner import OnPolicyRunner
from claw_rl_ros.core.learning.train_config import load_train_config, TrainConfig

EVAL_SEED = 12345


def eval_return(runner: OnPolicyRunner, episodes: int) -> float:
    """Mean 10 s episode return of the runner's deterministic policy."""
    env_cfg = from_dict(type(runner.cfg.env), merge(to_dict(runner.cfg.env),
                                                    {'episode_length_s': 10.0}))
    report = evaluate(torch_policy_fn(runner.policy), env_cfg, runner.env.robot,
                      episodes=episodes, seed=EVAL_SEED)
    return report.mean_return


def train_with_evals(cfg: TrainConfig, run_dir: Path, every: int, episodes: int,
                     stop_at: float | None, max_steps: int | None, label: str) -> list[dict]:
    """Train, evaluating every ``every`` iterations; stop early once ``stop_at`` is reached."""
    runner = OnPolicyRunner(cfg, run_dir)
    curve = [{'run': label, 'iteration': 0, 'env_steps': 0, 'wall_s': 0.0,
              'eval_return': eval_return(runner, episodes)}]
    start = time.perf_counter()
    while runner.iteration < cfg.runner.max_iterations:
        runner.train_one_epoch()
        if runner.iteration % every and runner.iteration != cfg.runner.max_iterations:
            continue
        ret = eval_return(runner, episodes)
        curve.append({'run': label, 'iteration': runner.iteration,
                      'env_steps': runner.total_steps,
                      'wall_s': round(time.perf_counter() - start, 1), 'eval_return': ret})
        print(f'{label:>7} it {runner.iteration:>4}  {runner.total_steps / 1e6:5.2f} M steps  '
              f'eval return {ret:7.3f}', flush=True)
        if stop_at is not None and ret >= stop_at:
            break
        if max_steps is not None and runner.total_steps >= max_steps:
            break
    runner.save()
    runner.close()
    return curve


def first_reaching(curve: list[dict], target: float) -> int | None:
    for row in curve:
        if row['eval_return'] >= target:
            return row['env_steps']
    return None


def write_outputs(out: Path, curves: list[dict], target: float) -> None:
    with open(out / 'curve.csv', 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=list(curves[0]))
        writer.writeheader()
        writer.writerows(curves)
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for label in ('ppo', 'opd'):
        rows = [r for r in curves if r['run'] == label]
        ax.plot([r['env_steps'] / 1e6 for r in rows], [r['eval_return'] for r in rows],
                marker='.', label=label)
    ax.axhline(target, color='grey', linestyle='--', label='0.95 x teacher')
    ax.set_xlabel('env steps [M]')
    ax.set_ylabel('eval return (10 s)')
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / 'curve.png', dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--config', default='train_ppo.yaml')
    parser.add_argument('--out', default='runs/opd_bench')
    parser.add_argument('--ppo-dir', help='reuse the PPO part of an earlier run of this bench')
    parser.add_argument('--eval-every', type=int, default=10)
    parser.add_argument('--eval-episodes', type=int, default=32)
    parser.add_argument('--alpha', type=float, default=20.0)
    parser.add_argument('--opd-lr', type=float, default=1e-3)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = load_train_config(args.config, {'runner': {'time_budget_s': 0.0}})

    ppo_dir = Path(args.ppo_dir) if args.ppo_dir else out / 'ppo'
    curve_file = ppo_dir / 'ppo_curve.csv'
    if args.ppo_dir and curve_file.exists():
        with open(curve_file, newline='') as f:
            ppo_curve = [{**r, 'iteration': int(r['iteration']), 'env_steps': int(r['env_steps']),
                          'wall_s': float(r['wall_s']), 'eval_return': float(r['eval_return'])}
                         for r in csv.DictReader(f)]
    else:
        ppo_curve = train_with_evals(base, ppo_dir, args.eval_every, args.eval_episodes,
                                     None, None, 'ppo')
        with open(curve_file, 'w', newline='') as f:
            writer = csv.DictWriter(f, fieldnames=list(ppo_curve[0]))
            writer.writeheader()
            writer.writerows(ppo_curve)
    teacher_path = ckpt.latest_checkpoint(ppo_dir)
    teacher_return = ppo_curve[-1]['eval_return']
    target = 0.95 * teacher_return
    s_ppo = first_reaching(ppo_curve, target)
    print(f'teacher {teacher_path}: eval return {teacher_return:.3f}; PPO from scratch reached '
          f'0.95 x of it after {s_ppo / 1e6:.2f} M env steps', flush=True)
    load_policy(teacher_path)  # fail early if the teacher cannot be loaded

    opd_cfg = from_dict(TrainConfig, merge(to_dict(base), {
        'distillation': {'teacher_mode': 'frozen', 'teacher_checkpoint': str(teacher_path),
                         'alpha': args.alpha},
        'ppo': {'schedule': 'fixed', 'learning_rate': args.opd_lr},
        'runner': {'seed': base.runner.seed + 100}}))
    opd_curve = train_with_evals(opd_cfg, out / 'opd', max(1, args.eval_every // 2),
                                 args.eval_episodes, target, s_ppo, 'opd')
    s_opd = first_reaching(opd_curve, target)
    write_outputs(out, ppo_curve + opd_curve, target)
    print(f'\n{"run":>5} {"steps to 0.95 R_T":>18} {"final eval return":>18}')
    print(f'{"ppo":>5} {s_ppo / 1e6:>16.2f} M {ppo_curve[-1]["eval_return"]:>18.3f}')
    reached = f'{s_opd / 1e6:>16.2f} M' if s_opd is not None else f'{"not reached":>18}'
    print(f'{"opd":>5} {reached} {opd_curve[-1]["eval_return"]:>18.3f}')
    if s_opd is not None:
        ratio = s_opd / s_ppo
        print(f'OPD needed {ratio:.1%} of the PPO env steps (goal <= 20 %): '
              f'{"met" if ratio <= 0.2 else "not met"}')
    else:
        print('OPD did not reach 0.95 x the teacher return within the PPO budget: not met')
    print(f'curve: {out / "curve.csv"}, {out / "curve.png"}')


if __name__ == '__main__':
    main()
