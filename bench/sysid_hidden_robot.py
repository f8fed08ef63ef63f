"""System identification's whole loop on a simulated robot with hidden parameters (not a test).

1. The loop (test/sysid_loop.py): a lockstep sim_node whose true parameters are ``--hidden``
   (an overlay in the format ``claw-rl sysid`` writes: any such file works), on a stand
   (``--variant ground``: standing), the policy node's excitation over real topics, the
   recorder's MCAP, then ``claw-rl sysid``. Prints hidden against recovered per group and
   field, and the delay; ``--json OUT`` writes ``{"parameters": [{"name": "hip.kp", "hidden":
   ..., "recovered": ..., "relative_error": ...}, ...]}`` (plus ``action_delay_s``, with its
   error in physics steps as ``error_steps``).
2. With ``--students``: a student trained on the nominal robot and one trained with the fitted
   overlay (the main job's config, the same seed and ``--iterations``), both evaluated on the
   hidden robot side by side, in one run: the verify config's env (its randomisation re-centred
   on the hidden delay), ``--episodes`` episodes at 0.5 m/s, tracking error and falls against
   the verify gate's limits.

Usage: .venv/bin/python bench/sysid_hidden_robot.py --hidden hidden.yaml [--json OUT]
       [--variant stand|ground] [--students --iterations 250 --episodes 20]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
import random
import subprocess
import sys
import tempfile
import time

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'test'))


def ros_environment(home: Path) -> dict:
    """An isolated graph, as the tests make one: own domain id, localhost discovery, temp
    ROS_HOME; set in this process too (the loop's probe node joins it)."""
    env = {'ROS_DOMAIN_ID': str(random.SystemRandom().randint(101, 200)),
           'ROS_AUTOMATIC_DISCOVERY_RANGE': 'LOCALHOST', 'ROS_HOME': str(home),
           'ROS_LOG_DIR': str(home / 'log'), 'RMW_IMPLEMENTATION': 'rmw_fastrtps_cpp',
           'PYTHONUNBUFFERED': '1'}
    os.environ.update(env)
    return dict(os.environ)


def train_student(run_dir: Path, iterations: int, seed: int, overlay: Path | None) -> Path:
    """``claw-rl train`` of the main job's config for ``iterations``; its student.onnx."""
    cmd = [sys.executable, '-m', 'claw_rl_ros.cli', 'train', '--run-dir', str(run_dir),
           '--set', f'runner.max_iterations={iterations}', '--set', f'runner.seed={seed}',
           '--set', 'runner.time_budget_s=0']
    if overlay is not None:
        cmd += ['--robot-overlay', str(overlay)]
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    print(f'  trained {run_dir.name} in {time.perf_counter() - start:.0f} s')
    return run_dir / 'student.onnx'


def students(hidden: Path, fitted: Path, iterations: int, episodes: int, seed: int,
             workdir: Path) -> list[dict]:
    """Both students on the hidden robot: [{student, vx_error, falls, passed}, ...]."""
    from claw_rl_ros.core.config import from_dict, load_yaml
    from claw_rl_ros.core.evaluation.evaluator import evaluate
    from claw_rl_ros.core.export.onnx_policy import OnnxPolicy
    from claw_rl_ros.core.sim.env_config import EnvConfig
    from claw_rl_ros.core.sim.robot import load_robot
    from claw_rl_ros.core.verify.gate_scoring import VerifyConfig
    raw = load_yaml(ROOT / 'config' / 'verify.yaml')
    env_cfg = from_dict(EnvConfig, raw['env'], source='config/verify.yaml', prefix='env')
    limits = from_dict(VerifyConfig, raw['verify'], source='config/verify.yaml',
                       prefix='verify')
    truth = load_robot(overlay=hidden)
    models = {'nominal': train_student(workdir / 'nominal', iterations, seed, None),
              'overlay': train_student(workdir / 'overlay', iterations, seed, fitted)}
    rows = []
    for name, model in models.items():
        # The hidden robot is the truth; no spec check: the point is the mismatch.
        report = evaluate(OnnxPolicy(model), env_cfg, truth, episodes=episodes,
                          command=(limits.command_vx, 0.0, 0.0), seed=seed,
                          settle_s=limits.settle_s)
        rows.append({'student': name, 'vx_error': float(report.tracking_error_vx),
                     'mean_vx': float(report.mean_forward_speed), 'falls': int(report.falls),
                     'episodes': episodes,
                     'passed': bool(report.tracking_error_vx <= limits.max_vx_error and
                                    report.fall_rate <= limits.max_fall_rate)})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--hidden', required=True, help='overlay YAML: the true parameters')
    parser.add_argument('--json', default='', help='write the comparison here')
    parser.add_argument('--variant', default='stand', choices=('stand', 'ground'))
    parser.add_argument('--robot', default='claw_quadruped')
    parser.add_argument('--per-joint', action='store_true', help='claw-rl sysid --per-joint')
    parser.add_argument('--students', action='store_true', help='also train and compare a '
                        'nominal and an overlay student on the hidden robot')
    parser.add_argument('--iterations', type=int, default=250)
    parser.add_argument('--episodes', type=int, default=20)
    parser.add_argument('--seed', type=int, default=1)
    parser.add_argument('--keep', default='', help='keep the loop\'s files in this folder')
    args = parser.parse_args()
    from claw_rl_ros.core.config import ConfigError
    from claw_rl_ros.core.sim.robot import load_robot
    from sysid_loop import compare, run_loop, table
    hidden = Path(args.hidden).resolve()
    try:
        load_robot(args.robot, overlay=hidden)
    except ConfigError as exc:
        print(f'sysid_hidden_robot: error: {exc}', file=sys.stderr)
        return 2
    workdir = Path(args.keep).resolve() if args.keep else Path(tempfile.mkdtemp('sysid'))
    env = ros_environment(workdir / 'ros_home')
    start = time.perf_counter()
    result = run_loop(env, workdir / 'loop', hidden, variant=args.variant, robot=args.robot,
                      sysid_args=('--per-joint',) if args.per_joint else ())
    print(result.output)
    if result.returncode != 0:
        print(f'claw-rl sysid exited {result.returncode}', file=sys.stderr)
        return 1
    rows = compare(hidden, result.overlay, args.robot)
    print(f'hidden robot ({args.variant}), loop + fit in {time.perf_counter() - start:.0f} s:')
    print(table(rows))
    out = {'variant': args.variant, 'hidden': str(hidden), 'parameters': rows}
    if args.students:
        out['students'] = students(hidden, result.overlay, args.iterations, args.episodes,
                                   args.seed, workdir)
        print(f'\non the hidden robot ({args.episodes} episodes at 0.5 m/s, verify limits):')
        for row in out['students']:
            print(f'  {row["student"]:<8} vx error {row["vx_error"]:.3f} (mean vx '
                  f'{row["mean_vx"]:.3f}), falls {row["falls"]}/{row["episodes"]}, '
                  f'{"PASS" if row["passed"] else "FAIL"}')
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
