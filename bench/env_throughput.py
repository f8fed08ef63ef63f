"""Batched env throughput vs the physical limit, measured side by side in one run.

physical limit [env steps/s] = raw mj_step rate (one core, same model, states from the env's own
random-action rollouts) x cores / decimation. Also reports the peak RSS of a 256-world batch.

    .venv/bin/python bench/env_throughput.py [--sizes 1 16 64 256] [--seconds 3]
"""

import argparse
import os
import resource
import subprocess
import sys
import time

import mujoco
import numpy as np

from claw_rl_ros.core.config import from_dict
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.sim.physics import STATE_SPEC


def make_env(num_envs: int) -> VecLocomotionEnv:
    return VecLocomotionEnv(from_dict(EnvConfig, {'num_envs': num_envs, 'seed': 0}))


def raw_mj_step_rate(seconds: float) -> float:
    """mj_step/s on one thread from states the env visits under random actions."""
    env = make_env(16)
    rng = np.random.default_rng(0)
    states, ctrls = [], []
    for _ in range(100):
        env.step(rng.normal(0, 1.0, (16, env.num_actions)))
        states.append(env.physics.state.copy())
        ctrls.append(env.targets.copy())
    model = env.physics.model
    env.close()
    data = mujoco.MjData(model)
    states = np.concatenate(states)
    ctrls = np.concatenate(ctrls)
    steps, busy, i = 0, 0.0, 0
    while busy < seconds:
        k = i % len(states)
        mujoco.mj_setState(model, data, states[k], STATE_SPEC)
        data.ctrl[:] = ctrls[k]
        start = time.perf_counter()
        mujoco.mj_step(model, data, nstep=4)
        busy += time.perf_counter() - start
        steps += 4
        i += 1
    return steps / busy


def env_rate(num_envs: int, seconds: float) -> float:
    env = make_env(num_envs)
    rng = np.random.default_rng(1)
    actions = [rng.normal(0, 1.0, (num_envs, env.num_actions)) for _ in range(64)]
    for a in actions[:10]:
        env.step(a)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(actions[steps % 64])
        steps += 1
    rate = steps * num_envs / (time.perf_counter() - start)
    env.close()
    return rate


def peak_rss_mib(num_envs: int) -> float:
    """Peak RSS of a fresh process that builds and steps a num_envs batch."""
    code = ('import resource, numpy as np, sys; sys.path.insert(0, "bench"); '
            'from env_throughput import make_env; '
            f'env = make_env({num_envs}); '
            '[env.step(np.zeros((env.num_envs, env.num_actions))) for _ in range(200)]; '
            'print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(__file__)) or '.')
    return int(out.stdout.strip().splitlines()[-1]) / 1024.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--sizes', type=int, nargs='+', default=[1, 16, 64, 256])
    parser.add_argument('--seconds', type=float, default=3.0)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    raw = raw_mj_step_rate(args.seconds)
    limit = raw * cores / 4
    print(f'raw mj_step: {raw:,.0f} steps/s on one core; {cores} cores, decimation 4 '
          f'-> physical limit {limit:,.0f} env steps/s')
    print(f'{"worlds":>7} {"env steps/s":>12} {"of limit":>9}')
    for n in args.sizes:
        rate = env_rate(n, args.seconds)
        print(f'{n:>7} {rate:>12,.0f} {rate / limit:>9.1%}')
    rss = peak_rss_mib(256)
    print(f'peak RSS of a 256-world batch: {rss:,.0f} MiB (goal < 1024 MiB)')
    print(f'(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB)')


if __name__ == '__main__':
    main()
