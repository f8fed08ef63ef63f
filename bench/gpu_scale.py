"""MuJoCo Warp on a device against the CPU engine on the same machine's cores, side by side in
one run, with the machine named in every figure (docs/gpu.md).

1. env steps/s: the main job's env (flat, its randomisation, random actions) with
   ``env.physics: mujoco_warp`` on ``--device`` at each of ``--sizes`` worlds, and the CPU engine
   (``mujoco``, one thread per core) at 256 worlds and at the smallest size, alternating rounds;
   ratios over the CPU engine's median at 256 worlds, and the cost per env step of each.
2. end-to-end training (``--train-s`` > 0): ``claw-rl train`` with the main job's config on
   ``mujoco_warp`` at ``--train-worlds`` worlds for ``--train-s`` seconds, and the CPU engine at
   the config's worlds for as long: env steps/s from each run's metrics.csv (after the first
   two iterations), and time to walk (the walking criterion at 0.5 m/s, checkpoints every
   ``--grid-s`` seconds, bench/opd_main_job.py) of each.
3. the terrain job (``--terrain-s`` > 0): the terrain teacher's config on ``mujoco_warp``
   for ``--terrain-s`` seconds against the CPU engine: env steps/s.

On a machine with an NVIDIA GPU (one script, under 10 minutes with the defaults):

    .venv/bin/python bench/gpu_scale.py --device cuda [--json runs/gpu_scale.json]

On CPU (Warp's CPU kernels: the cost per env step beside the CPU engine's; minutes):

    .venv/bin/python bench/gpu_scale.py --device cpu --sizes 16 64 --train-s 0 --terrain-s 0
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from pathlib import Path
import platform
import subprocess
import sys
import tempfile

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'bench'))

from claw_rl_ros.core.config import from_dict, merge, to_dict  # noqa: E402
from claw_rl_ros.core.learning.train_config import load_train_config  # noqa: E402
from claw_rl_ros.core.sim.env import VecLocomotionEnv  # noqa: E402
from claw_rl_ros.core.sim.env_config import EnvConfig  # noqa: E402
from env_throughput import stepped_rate  # noqa: E402


def machine(device: str) -> str:
    """The CPU model and cores, and the Warp device's name."""
    cpu = platform.processor() or 'unknown CPU'
    try:
        with open('/proc/cpuinfo') as f:
            cpu = next(line.split(':', 1)[1].strip() for line in f if 'model name' in line)
    except (OSError, StopIteration):
        pass
    name = f'{cpu}, {os.cpu_count()} cores'
    if device == 'cuda':
        import warp as wp
        wp.init()
        name += f'; {wp.get_device("cuda:0").name}'
    return name


def env_config(physics: str, device: str, worlds: int) -> EnvConfig:
    """The main job's env (its randomisation and model sharing) on an engine."""
    base = load_train_config('train_ppo.yaml').env
    return from_dict(EnvConfig, merge(to_dict(base), {
        'num_envs': worlds, 'seed': 0, 'physics': physics,
        'device': device if physics == 'mujoco_warp' else 'cpu'}), source='gpu_scale')


def env_rates(args) -> dict[str, list[float]]:
    """{label: rates over rounds}, each env built once and stepped in alternating rounds."""
    envs = {f'mujoco_warp {args.device} {n}': VecLocomotionEnv(
        env_config('mujoco_warp', args.device, n)) for n in args.sizes}
    for n in sorted({256, min(args.sizes)}):
        envs[f'mujoco cpu {n}'] = VecLocomotionEnv(env_config('mujoco', 'cpu', n))
    rates = {label: [] for label in envs}
    try:
        for env in envs.values():
            env.reset()
        for _ in range(args.rounds):
            for label, env in envs.items():
                rates[label].append(stepped_rate(env, args.seconds))
    finally:
        for env in envs.values():
            env.close()
    return rates


def train(tmp: Path, name: str, physics: str, device: str, worlds: int, seconds: float,
          config: str) -> Path:
    """``claw-rl train`` of ``config`` on an engine for ``seconds``; the run directory."""
    data = yaml.safe_load((ROOT / 'config' / config).read_text())
    data['env'].update(num_envs=worlds, physics=physics, device=device)
    data['runner'].update(max_iterations=100000, time_budget_s=seconds, eval_episodes=0,
                          save_interval=5, keep_checkpoints=100000)
    path = tmp / f'{name}.yaml'
    path.write_text(yaml.safe_dump(data))
    run_dir = tmp / name
    with open(tmp / f'{name}.log', 'w') as log:
        code = subprocess.run([sys.executable, '-m', 'claw_rl_ros.cli', 'train', '--config',
                               str(path), '--run-dir', str(run_dir), '--no-export'], cwd=ROOT,
                              stdout=log, stderr=subprocess.STDOUT,
                              timeout=seconds + 900).returncode
    if code != 0:
        raise SystemExit(f'{name} failed: see {tmp}/{name}.log')
    return run_dir


def training_rate(run_dir: Path) -> float:
    """env steps/s of a run after its first two iterations (start-up, first compile)."""
    with open(run_dir / 'metrics.csv', newline='') as f:
        rows = list(csv.DictReader(f))
    if len(rows) < 4:
        return float('nan')
    first, last = rows[1], rows[-1]
    return (float(last['total_steps']) - float(first['total_steps'])) / (
        float(last['wall_time_s']) - float(first['wall_time_s']))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', choices=('cuda', 'cpu'), default='cuda')
    parser.add_argument('--sizes', type=int, nargs='+', default=[1024, 4096, 8192, 16384])
    parser.add_argument('--seconds', type=float, default=5.0)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--train-s', type=float, default=120.0)
    parser.add_argument('--train-worlds', type=int, default=4096)
    parser.add_argument('--grid-s', type=float, default=10.0)
    parser.add_argument('--terrain-s', type=float, default=60.0)
    parser.add_argument('--json', type=Path)
    args = parser.parse_args()
    where = machine(args.device)
    print(f'machine: {where}')
    report: dict = {'machine': where, 'device': args.device}

    rates = env_rates(args)
    cpu256 = float(np.median(rates['mujoco cpu 256']))
    print('\nenv steps/s (the main job\'s env, flat; median of alternating rounds):')
    for label, values in rates.items():
        median = float(np.median(values))
        worlds = int(label.split()[-1])
        print(f'{label:>26}: {median:12,.0f} /s  {median / cpu256:7.2f}x the CPU engine at '
              f'256  ({1e6 / median * 1:8.2f} us per env step; rounds '
              f'{[round(v) for v in values]})')
        report.setdefault('env', {})[label] = {'worlds': worlds, 'median': median,
                                               'rounds': values}

    with tempfile.TemporaryDirectory(prefix='gpu_scale_') as d:
        tmp = Path(d)
        if args.train_s > 0:
            from opd_main_job import evaluate_run, time_to_walk
            print(f'\ntraining, {args.train_s:.0f} s each (the main job\'s config):')
            for name, physics, worlds in (('warp', 'mujoco_warp', args.train_worlds),
                                          ('cpu', 'mujoco', 256)):
                run = train(tmp, name, physics, args.device if physics == 'mujoco_warp'
                            else 'cpu', worlds, args.train_s, 'train_ppo.yaml')
                # Scored on the CPU engine, where the walking criterion was defined.
                rows = evaluate_run(run, 20, args.grid_s, {'physics': 'mujoco', 'device': 'cpu'})
                figures = {'worlds': worlds, 'env_steps_per_s': training_rate(run),
                           'time_to_walk_s': time_to_walk(rows, 'sim2sim')}
                report.setdefault('training', {})[name] = figures
                print(f'{physics:>12} at {worlds} worlds: {figures["env_steps_per_s"]:10,.0f} '
                      f'env steps/s, walks at {figures["time_to_walk_s"]:.0f} s')
        if args.terrain_s > 0:
            print(f'\nthe terrain teacher, {args.terrain_s:.0f} s each:')
            for name, physics, worlds in (('warp', 'mujoco_warp', args.train_worlds),
                                          ('cpu', 'mujoco', 256)):
                run = train(tmp, f'terrain_{name}', physics, args.device if physics ==
                            'mujoco_warp' else 'cpu', worlds, args.terrain_s,
                            'train_rough_teacher.yaml')
                rate = training_rate(run)
                report.setdefault('terrain', {})[name] = {'worlds': worlds,
                                                          'env_steps_per_s': rate}
                print(f'{physics:>12} at {worlds} worlds: {rate:10,.0f} env steps/s')
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
