"""A robot ported without a gait: the derived trot vs no gait clock, side by side in one run.

The porting checklist's robot (``--robot``, default test/robots/strider/strider.yaml, whose YAML
gives no gait) is trained with the main job's settings (config/train_ppo.yaml, ``env.robot``
set to it) for ``--budget-s`` seconds twice: as its YAML is (the gait clock derived from the
robot: a trot with a period from its standing height) and with ``gait: {period_s: 0}`` (no gait
clock, the gait rewards off). Checkpoints every ``--grid-s`` seconds of training are evaluated
at 0.5 m/s, nominal and with the sim2sim perturbations and noise (bench/opd_main_job.py), and
the table prints both variants' vx error, falls and time to the walking criterion (vx error
<= 0.1 m/s, falls < 5 %).

    nice -n 19 .venv/bin/python bench/porting.py [--budget-s 300] [--episodes 20]
        [--grid-s 60] [--robot test/robots/strider/strider.yaml] [--seed 1]
"""

from __future__ import annotations

import argparse
from pathlib import Path
import shutil
import subprocess
import sys
import tempfile

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'bench'))


def no_gait_copy(robot_yaml: Path, folder: Path) -> Path:
    """A copy of the robot's folder whose YAML says ``gait: {period_s: 0}``."""
    shutil.copytree(robot_yaml.parent, folder)
    path = folder / robot_yaml.name
    raw = yaml.safe_load(path.read_text())
    body = raw.get('robot', raw)
    body['gait'] = {'period_s': 0}
    path.write_text(yaml.safe_dump(raw))
    return path


def train(robot_yaml: Path, run_dir: Path, budget_s: float, seed: int, log: Path) -> None:
    cmd = [sys.executable, '-m', 'claw_rl_ros.cli', 'train', '--config', 'train_ppo.yaml',
           '--run-dir', str(run_dir), '--no-export', '--set', f'env.robot={robot_yaml}',
           '--set', f'runner.time_budget_s={budget_s}', '--set', 'runner.max_iterations=100000',
           '--set', 'runner.save_interval=5', '--set', 'runner.keep_checkpoints=100000',
           '--set', 'runner.eval_episodes=0', '--set', f'runner.seed={seed}']
    with open(log, 'w') as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                              timeout=budget_s + 900)
    if done.returncode != 0:
        raise SystemExit(f'training failed ({done.returncode}): see {log}')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--robot', type=Path,
                        default=ROOT / 'test' / 'robots' / 'strider' / 'strider.yaml')
    parser.add_argument('--budget-s', type=float, default=300.0)
    parser.add_argument('--episodes', type=int, default=20)
    parser.add_argument('--grid-s', type=float, default=60.0)
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--keep', metavar='DIR', help='keep the run directories here')
    args = parser.parse_args()
    from opd_main_job import evaluate_run, time_to_walk
    from claw_rl_ros.core.sim.robot import load_robot
    tmp = Path(tempfile.mkdtemp(prefix='porting_bench_', dir=args.keep))
    robot_yaml = args.robot.resolve()
    variants = {'derived trot': robot_yaml,
                'no gait clock': no_gait_copy(robot_yaml, tmp / 'no_gait')}
    spec = load_robot(robot_yaml)
    results = {}
    try:
        for label, path in variants.items():
            run_dir = tmp / label.replace(' ', '_')
            train(path, run_dir, args.budget_s, args.seed, tmp / f'{run_dir.name}.log')
            results[label] = evaluate_run(run_dir, args.episodes, args.grid_s)
    finally:
        if args.keep:
            print(f'run directories kept in {tmp}')
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f'\n{spec.name}: {spec.num_joints} joints, standing height '
          f'{spec.standing_height:.3f} m, derived gait: period {spec.gait_period} s, offsets '
          f'{spec.gait_offsets.tolist()}; {args.budget_s:.0f} s of training each, seed '
          f'{args.seed}, 0.5 m/s, {args.episodes} episodes\n')
    print(f'{"":>14} {"s":>5} | {"nominal vx err":>14} {"falls":>6} | {"sim2sim vx err":>14} '
          f'{"falls":>6}')
    for label, rows in results.items():
        for row in rows:
            print(f'{label:>14} {row["wall_time_s"]:5.0f} | {row["nominal_vx_error"]:14.3f} '
                  f'{row["nominal_falls"]:6.0%} | {row["sim2sim_vx_error"]:14.3f} '
                  f'{row["sim2sim_falls"]:6.0%}')
    print()
    for label, rows in results.items():
        last = rows[-1]
        print(f'{label:>14}: time to walk nominal {time_to_walk(rows, "nominal"):.0f} s, '
              f'sim2sim {time_to_walk(rows, "sim2sim"):.0f} s; last vx err nominal '
              f'{last["nominal_vx_error"]:.3f}, sim2sim {last["sim2sim_vx_error"]:.3f} '
              f'({last["sim2sim_falls"]:.0%} falls)')
    a, b = (results[k][-1]['sim2sim_vx_error'] for k in variants)
    print(f'no gait / derived trot, last sim2sim vx error: {b / a:.2f}')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
