"""Live training over ROS 2 vs the offline ``claw-rl train``, side by side in one run.

Same worlds, network and PPO settings (config/train_ppo.yaml, env.num_envs = --num-envs):

1. offline: ``claw-rl train`` (one process, collect then learn) as configured (physics and
   torch threads = cores) and with 1 physics + 1 torch thread (the live nodes' setting), each
   before and after the live runs (the machine is shared: the two bracket the drift);
2. live: ``claw-rl up train`` (trainer_node + --actors actor_nodes with --num-envs / --actors
   worlds each), once per --modes value (sync: actors wait for each new model, max_policy_lag 0;
   overlap: actors collect the next chunk while the trainer learns);
3. ingest: one trainer_node alone, fed by this process replaying recorded chunks (256 x 24,
   real rollouts) as fast as it can publish them. The chunks carry a model version the trainer
   never published, so each is received, decoded and fully validated (sizes, NaN/inf scan,
   flags) and then counted as ``unknown_version`` without being learnt from: this measures the
   accept-and-decode capacity on its own.

Throughput counts env steps the trainer used per second of wall time, from its metrics.csv,
after ``--warmup`` iterations (start-up and the first push are not steady state). Peak RSS of
the trainer comes from its summary.json (getrusage of the trainer process).

    nice -n 19 .venv/bin/python bench/live_training.py [--iterations 8] [--warmup 2]
        [--num-envs 256] [--actors 2] [--modes sync overlap] [--ingest-s 10]

4. time to walk (``--time-to-walk``, on its own: ~30 minutes): the main job offline
   (``claw-rl train``) and live (``claw-rl up train``: actors, trainer and the realtime control
   loop), live with alpha 0 when the main job distils, and a ``--walk-set`` variant (e.g.
   symmetry) offline and live, each for ``--walk-budget-s`` per ``--walk-seeds`` seed; the
   checkpoints every ``--walk-grid-s`` seconds of training are evaluated at 0.5 m/s with and
   without the sim2sim perturbations (friction 0.4-1.25, mass and motor strength +-10 %, 15 ms
   latency, pushes) as bench/opd_main_job.py does. Prints each run's time to the walking
   criterion and the ratios live / offline and OPD / alpha 0.
"""

from __future__ import annotations

import argparse
import array
import csv
import json
import os
from pathlib import Path
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = Path(__file__).resolve().parents[1]


def ros_env(home: Path) -> dict:
    """An isolated ROS graph: random domain, loopback discovery, temp ROS_HOME."""
    env = dict(os.environ, ROS_DOMAIN_ID=str(random.SystemRandom().randint(1, 100)),
               ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST', ROS_HOME=str(home),
               ROS_LOG_DIR=str(home / 'log'), PYTHONUNBUFFERED='1')
    os.environ.update(env)
    return env


def bench_config(tmp: Path, num_envs: int, iterations: int) -> Path:
    """train_ppo.yaml with env.num_envs = num_envs, a fixed iteration count and no evaluation."""
    from claw_rl_ros.core import paths
    data = yaml.safe_load(paths.config_path('train_ppo.yaml').read_text())
    data['env']['num_envs'] = num_envs
    data['runner'].update(max_iterations=iterations, time_budget_s=0, eval_episodes=0,
                          save_interval=1000)
    path = tmp / 'bench.yaml'
    path.write_text(yaml.safe_dump(data))
    return path


def steady_rate(run_dir: Path, warmup: int) -> tuple[float, dict]:
    """(env steps/s after ``warmup`` iterations, last metrics row) from metrics.csv."""
    with open(run_dir / 'metrics.csv', newline='') as f:
        rows = list(csv.DictReader(f))
    first, last = rows[warmup - 1], rows[-1]
    steps = float(last['total_steps']) - float(first['total_steps'])
    seconds = float(last['wall_time_s']) - float(first['wall_time_s'])
    return steps / seconds, last


def run(cmd: list[str], env: dict, log: Path, timeout: float) -> int:
    with open(log, 'w') as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            return proc.wait(timeout=60)


def offline(cfg: Path, tmp: Path, name: str, env: dict, warmup: int, threads: int) -> float:
    run_dir = tmp / name
    code = run([sys.executable, '-m', 'claw_rl_ros.cli', 'train', '--config', str(cfg),
                '--run-dir', str(run_dir), '--no-export', '--set',
                f'env.num_threads={threads}', '--set', f'runner.torch_threads={threads}'],
               env, tmp / f'{name}.log', 1800)
    if code != 0:
        raise SystemExit(f'offline run failed ({code}): see {tmp / name}.log')
    return steady_rate(run_dir, warmup)[0]


def live(cfg: Path, tmp: Path, mode: str, actors: int, num_envs: int, env: dict,
         warmup: int) -> dict:
    run_dir = tmp / f'live_{mode}'
    code = run([sys.executable, '-m', 'claw_rl_ros.cli', 'up', 'train', '--config', str(cfg),
                '--actors', str(actors), '--num-envs', str(num_envs // actors), '--run-dir',
                str(run_dir), '--overlap', str(mode == 'overlap').lower()], env,
               tmp / f'live_{mode}.log', 1800)
    if code != 0:
        raise SystemExit(f'live run failed ({code}): see {tmp}/live_{mode}.log')
    rate, last = steady_rate(run_dir, warmup)
    summary = json.loads((run_dir / 'summary.json').read_text())
    return {'rate': rate, 'dropped': float(last['dropped_fraction']),
            'rss_mib': summary['peak_rss_mib'],
            'importance_weight': float(last.get('importance_weight', 'nan'))}


def record_chunks(cfg: Path, count: int) -> list:
    """``count`` real 256 x 24 chunks acted by a fresh student (version 10**6: never
    published by the trainer)."""
    from claw_rl_ros.core.learning.learner import build_policy
    from claw_rl_ros.core.learning.train_config import load_train_config
    from claw_rl_ros.core.live.batched_actor import BatchedActor
    from claw_rl_ros.core.live.rollout_chunk import encode_chunk
    from claw_rl_ros.core.sim.env import VecLocomotionEnv
    train_cfg = load_train_config(cfg, {'env': {'num_envs': 256, 'num_threads': 1}})
    env = VecLocomotionEnv(train_cfg.env)
    policy = build_policy(train_cfg, env.obs_dims, env.num_actions)
    actor = BatchedActor(env, policy, train_cfg.runner.num_steps_per_env, '/bench/replay')
    actor.policy_version, actor.model_sha = 10 ** 6, 'feedfeedfeed'
    payloads = [encode_chunk(actor.collect()) for _ in range(count)]
    env.close()
    return payloads


def ingest(cfg: Path, tmp: Path, env: dict, seconds: float) -> dict:
    """Env steps/s one trainer receives, decodes and validates from a flat-out publisher."""
    import rclpy
    from rclpy._rclpy_pybind11 import RCLError
    from std_msgs.msg import Float32, UInt8MultiArray
    from claw_rl_ros.nodes.ros_io import COMMAND_QOS
    payloads = record_chunks(cfg, 4)
    steps_per_chunk = 256 * 24
    log = open(tmp / 'ingest_trainer.log', 'w')
    trainer = subprocess.Popen(
        [sys.executable, '-m', 'claw_rl_ros.nodes.trainer_node', '--ros-args', '-p',
         f'config:={cfg}', '-p', f'run_dir:={tmp / "ingest"}', '-p', "push_targets:=['/nobody']"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    rclpy.init()
    node = rclpy.create_node('bench_replay')
    received: list[tuple[float, float]] = []
    node.create_subscription(Float32, '/trainer/metrics/received',
                             lambda m: received.append((time.monotonic(), m.data)), 10)
    pub = node.create_publisher(UInt8MultiArray, '/rollout_chunks', COMMAND_QOS)
    messages = [UInt8MultiArray(data=array.array('B', p)) for p in payloads]
    try:
        deadline = time.monotonic() + 120
        while (pub.get_subscription_count() == 0 or not received) and \
                time.monotonic() < deadline:
            rclpy.spin_once(node, timeout_sec=0.1)
        if not received:
            raise SystemExit(f'the ingest trainer did not come up: see {log.name}')
        sent, refused, start = 0, 0, time.monotonic()
        mark = len(received)
        while time.monotonic() - start < seconds:
            try:
                pub.publish(messages[sent % len(messages)])
                sent += 1
            except RCLError:  # the writer's history is full: back-pressure, go on
                refused += 1
            rclpy.spin_once(node, timeout_sec=0.0)
        sent_rate = sent * steps_per_chunk / (time.monotonic() - start)
        end = time.monotonic() + 3.0  # the trainer drains its queue, reports twice more
        while time.monotonic() < end:
            rclpy.spin_once(node, timeout_sec=0.1)
    finally:
        trainer.send_signal(signal.SIGINT)
        trainer.wait(timeout=60)
        node.destroy_node()
        rclpy.shutdown()
    window = [r for r in received[mark - 1:] if r[1] > received[mark - 1][1]] or received[-1:]
    (t0, n0), (t1, n1) = received[mark - 1], max(window, key=lambda r: r[1])
    summary = json.loads((tmp / 'ingest' / 'summary.json').read_text())
    return {'rate': (n1 - n0) * steps_per_chunk / max(t1 - t0, 1e-9), 'sent_rate': sent_rate,
            'refused': refused,
            'chunks': n1 - n0, 'unknown': summary['chunks']['dropped/unknown_version'],
            'rss_mib': summary['peak_rss_mib']}


def distils(cfg) -> float:
    """The largest alpha of a DistillationConfig's schedule (0: plain PPO)."""
    return 0.0 if cfg.teacher_mode == 'none' else max(cfg.alpha, cfg.alpha_final or 0.0)


def walk_config(tmp: Path, name: str, num_envs: int, budget_s: float, alpha: float | None,
                seed: int = 1, overrides: list[str] = ()) -> Path:
    """train_ppo.yaml for a time-to-walk run: a time budget, every checkpoint kept (offline:
    every 5 iterations; live: every iteration), no final evaluation; ``alpha`` 0 = plain PPO;
    ``overrides`` are ``--set`` items (KEY=VALUE) applied last."""
    from claw_rl_ros.core import paths
    from claw_rl_ros.core.config import merge
    from claw_rl_ros.core.learning.train_config import parse_overrides
    data = yaml.safe_load(paths.config_path('train_ppo.yaml').read_text())
    data['env']['num_envs'] = num_envs
    data['runner'].update(max_iterations=100000, time_budget_s=budget_s, eval_episodes=0,
                          save_interval=5, keep_checkpoints=100000, seed=seed)
    if alpha == 0:
        data['distillation'] = {'alpha': 0.0, 'teacher_mode': 'none'}
    data = merge(data, parse_overrides(list(overrides)))
    path = tmp / f'{name}.yaml'
    path.write_text(yaml.safe_dump(data))
    return path


def walk_runs(tmp: Path, args, main_alpha: float) -> list[tuple[str, str, Path, list[str]]]:
    """(label, offline | live, config, extra ``claw-rl up train`` arguments) of every
    time-to-walk run, seed by seed (the variants of one seed run back to back, so machine drift
    hits them alike). A variant of launch arguments only (``--walk-up``) runs live only."""
    runs = []
    up_args = [f'--{name.replace("_", "-")}={value}' for name, value in args.walk_up]
    for seed in args.walk_seeds:
        def cfg(name, alpha=None, overrides=()):
            return walk_config(tmp, f'{name}_s{seed}', args.num_envs, args.walk_budget_s, alpha,
                               seed, overrides)
        variants = [('offline', 'offline', cfg('walk_main'), []),
                    ('live', 'live', cfg('walk_main'), [])]
        if main_alpha and not args.walk_no_alpha0:
            variants.append(('live, alpha 0', 'live', cfg('walk_ppo', 0.0), []))
        if args.walk_set or args.walk_up:
            for mode in ('offline', 'live') if args.walk_set else ('live',):
                variants.append((f'{mode}, {args.walk_label}', mode,
                                 cfg(f'walk_{args.walk_label}', None, args.walk_set),
                                 up_args if mode == 'live' else []))
        runs += [(f'{label} [seed {seed}]', mode, path, extra)
                 for label, mode, path, extra in variants]
    return runs


def time_to_walk(tmp: Path, env: dict, args) -> dict[str, list[dict]]:
    """The main job offline, live (the train graph with its control loop), live with alpha 0
    when the main job distils, and with ``--walk-set`` overrides offline and live: each for
    --walk-budget-s per seed, checkpoints evaluated every --walk-grid-s seconds of training at
    0.5 m/s, nominal and sim2sim (bench/opd_main_job.py)."""
    sys.path.insert(0, str(ROOT / 'bench'))
    from opd_main_job import evaluate_run
    from claw_rl_ros.core.learning.train_config import load_train_config
    main_alpha = distils(load_train_config('train_ppo.yaml').distillation)
    results = {}
    for label, mode, cfg, extra in walk_runs(tmp, args, main_alpha):
        name = ''.join(c if c.isalnum() else '_' for c in label)
        run_dir = tmp / name
        cmd = ['train', '--config', str(cfg), '--run-dir', str(run_dir), '--no-export'] \
            if mode == 'offline' else \
            ['up', 'train', '--config', str(cfg), '--actors', str(args.actors), '--num-envs',
             str(args.num_envs // args.actors), '--run-dir', str(run_dir), *extra]
        if run([sys.executable, '-m', 'claw_rl_ros.cli', *cmd], env, tmp / f'{name}.log',
               args.walk_budget_s + 600) != 0:
            raise SystemExit(f'{label} run failed: see {tmp}/{name}.log')
        results[label] = evaluate_run(run_dir, args.walk_episodes, args.walk_grid_s)
    return results


def print_walk(results: dict[str, list[dict]], alpha: float) -> None:
    def first(rows: list[dict], label: str) -> float:
        return next((r['wall_time_s'] for r in rows if r[f'{label}_walks']), float('nan'))

    def first_below(rows: list[dict], error: float) -> float:
        return next((r['wall_time_s'] for r in rows if r['sim2sim_vx_error'] <= error and
                     r['sim2sim_falls'] < 0.05), float('nan'))
    print(f'\ntime to walk (vx error <= 0.1 m/s at 0.5 m/s, falls < 5 %; main job alpha up '
          f'to {alpha:g}):')
    for name, rows in results.items():
        last = rows[-1]
        print(f'{name:>28}: nominal {first(rows, "nominal"):6.0f} s, sim2sim '
              f'{first(rows, "sim2sim"):6.0f} s, sim2sim <= 0.05 {first_below(rows, 0.05):6.0f} '
              f's | last checkpoint ({last["wall_time_s"]:.0f} s): nominal vx err '
              f'{last["nominal_vx_error"]:.3f} falls {last["nominal_falls"]:.0%}, sim2sim vx '
              f'err {last["sim2sim_vx_error"]:.3f} falls {last["sim2sim_falls"]:.0%}')
    # Medians over seeds per variant (NaN: not reached within the budget, counted as last).
    by_variant: dict[str, list[list[dict]]] = {}
    for name, rows in results.items():
        by_variant.setdefault(name.split(' [seed')[0], []).append(rows)
    medians = {}
    print('\nmedian over seeds (inf: not within the budget):')
    for variant, runs in by_variant.items():
        times = {label: sorted(t if t == t else float('inf') for t in (fn(r) for r in runs))
                 for label, fn in (('nominal', lambda r: first(r, 'nominal')),
                                   ('sim2sim', lambda r: first(r, 'sim2sim')),
                                   ('sim2sim <= 0.05', lambda r: first_below(r, 0.05)))}
        medians[variant] = {k: v[len(v) // 2] for k, v in times.items()}
        print(f'{variant:>22} ({len(runs)} seeds): ' + ', '.join(
            f'{k} {v[len(v) // 2]:.0f} s {[round(t) if t < 1e9 else "-" for t in v]}'
            for k, v in times.items()))
    for label in ('nominal', 'sim2sim'):
        base = medians['offline'][label]
        for name, m in medians.items():
            if name != 'offline':
                print(f'{name} / offline median time to walk ({label}): {m[label] / base:.2f}')
        if 'live, alpha 0' in medians:
            print(f'live OPD / live alpha 0 median time to walk ({label}): '
                  f'{medians["live"][label] / medians["live, alpha 0"][label]:.2f}')
        for name, m in medians.items():
            base_name = name.split(',')[0]
            # offline variants are printed against offline above.
            if ',' in name and base_name in medians and base_name != 'offline' \
                    and 'alpha 0' not in name:
                print(f'{name} / {base_name} median time to walk ({label}): '
                      f'{m[label] / medians[base_name][label]:.2f}')


def launch_argument(text: str) -> tuple[str, str]:
    """argparse type: NAME=VALUE of a train-graph argument -> (NAME, VALUE)."""
    name, sep, value = text.partition('=')
    if not sep or not name:
        raise argparse.ArgumentTypeError(f'{text!r} is not NAME=VALUE (e.g. overlap=false)')
    return name, value


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0 (the message names the value)."""
    try:
        value = float(text)
    except ValueError:
        value = float('nan')
    if not 0 < value < float('inf'):
        raise argparse.ArgumentTypeError(f'{text!r} is not a finite number of seconds > 0')
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--iterations', type=int, default=8, help='measured iterations')
    parser.add_argument('--warmup', type=int, default=2, help='iterations not measured')
    parser.add_argument('--num-envs', type=int, default=256, help='worlds in total')
    parser.add_argument('--actors', type=int, default=2, help='live actor processes')
    parser.add_argument('--modes', nargs='+', default=['sync', 'overlap'],
                        choices=('sync', 'overlap'))
    parser.add_argument('--keep', metavar='DIR', help='keep the run directories here')
    parser.add_argument('--ingest-only', action='store_true', help='only the ingest part')
    parser.add_argument('--ingest-s', type=float, default=10.0, help='seconds of replay')
    parser.add_argument('--time-to-walk', action='store_true', help='only the time-to-walk '
                        'part: offline vs live (and live with alpha 0) on equal wall-clock')
    parser.add_argument('--walk-budget-s', type=positive_seconds, default=480.0)
    # 10 s: a 30 s grid can only say 30, 60 or 90 s where the goal is 45 s (seed 1 of the main
    # job walked at 43 s, then missed at 60 s: 90 s on a 30 s grid).
    parser.add_argument('--walk-grid-s', type=positive_seconds, default=10.0,
                        help='evaluate a checkpoint every this many seconds of training')
    parser.add_argument('--walk-episodes', type=int, default=20)
    parser.add_argument('--walk-seeds', type=int, nargs='+', default=[1],
                        help='runner.seed of each run (the goal is a median of 3 seeds)')
    parser.add_argument('--walk-set', action='append', default=[], metavar='KEY=VALUE',
                        help='a variant run offline and live beside the main job, e.g. '
                        '--walk-set ppo.symmetry.data_augmentation=true (repeatable)')
    parser.add_argument('--walk-up', action='append', default=[], metavar='NAME=VALUE',
                        type=launch_argument,
                        help='a launch argument of the variant\'s live run, e.g. --walk-up '
                        'overlap=false (repeatable; alone: the variant runs live only)')
    parser.add_argument('--walk-label', default='variant', help='name of the --walk-set runs')
    parser.add_argument('--walk-no-alpha0', action='store_true',
                        help='skip the live alpha-0 run')
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix='live_bench_', dir=args.keep))
    if args.time_to_walk:
        try:
            results = time_to_walk(tmp, ros_env(tmp / 'ros'), args)
            (tmp / 'time_to_walk.json').write_text(json.dumps(results, indent=1))
        finally:
            if not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)
        from claw_rl_ros.core.learning.train_config import load_train_config
        print_walk(results, distils(load_train_config('train_ppo.yaml').distillation))
        return 0
    try:
        env = ros_env(tmp / 'ros')
        cfg = bench_config(tmp, args.num_envs, args.warmup + args.iterations)
        threads = {} if args.ingest_only else {'cores': 0, '1 thread': 1}
        before = {k: offline(cfg, tmp, f'offline_{n}_before', env, args.warmup, n)
                  for k, n in threads.items()}
        lives = {mode: live(cfg, tmp, mode, args.actors, args.num_envs, env, args.warmup)
                 for mode in args.modes if threads}
        after = {k: offline(cfg, tmp, f'offline_{n}_after', env, args.warmup, n)
                 for k, n in threads.items()}
        feed = ingest(cfg, tmp, env, args.ingest_s)
    finally:
        if args.keep:
            print(f'run directories kept in {tmp}')
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    base = {k: (before[k] + after[k]) / 2 for k in threads}
    print(f'\n{args.num_envs} worlds x 24 steps per iteration, {args.iterations} iterations '
          f'measured after {args.warmup}; live: {args.actors} actors x '
          f'{args.num_envs // args.actors} worlds, 1 physics / torch thread per process\n')
    for k in threads:
        print(f'offline claw-rl train, {k:8} {before[k]:8,.0f} steps/s before, '
              f'{after[k]:,.0f} after (mean {base[k]:,.0f})')
    for mode, r in lives.items():
        print(f'live, {mode:7}  {r["rate"]:8,.0f} steps/s used = '
              f'{r["rate"] / base["cores"]:.2f}x offline (cores), '
              f'{r["rate"] / base["1 thread"]:.2f}x offline (1 thread) | dropped '
              f'{r["dropped"]:.1%} | importance weight {r["importance_weight"]:.3f} | '
              f'trainer peak RSS {r["rss_mib"]} MiB')
    print(f'trainer ingest capacity     {feed["rate"]:8,.0f} steps/s decoded and validated '
          f'({feed["chunks"]:.0f} chunks; publisher sent {feed["sent_rate"]:,.0f} steps/s, '
          f'{feed["refused"]} publishes refused by a full writer history; '
          f'trainer peak RSS {feed["rss_mib"]} MiB)')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
