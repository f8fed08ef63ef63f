"""Batched env throughput vs the physical limit, measured side by side in one run.

physical limit [env steps/s] = raw mj_step rate (one core, same model, states from the env's own
random-action rollouts) x cores / decimation. Also reports the peak RSS of a 256-world batch,
and flat vs terrain vs terrain + height scan at 256 worlds (config/train_rough.yaml's terrain,
every world on level 0 as training starts), measured in alternating rounds so machine load
hits all three alike; the ratio is each one's median rate over flat's.

    .venv/bin/python bench/env_throughput.py [--sizes 1 16 64 256] [--seconds 3] [--rounds 3]
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
from claw_rl_ros.core.sim.robot import load_robot


# The terrain settings of the side-by-side rows (train_rough.yaml's types and levels); the
# last two trade the heightfield's resolution (default cell 0.2 H, H the standing height) for
# speed: MuJoCo tests a claw against every triangular prism under it, and a finer grid puts
# more prism edges under each claw (more narrow-phase calls and contacts).
SCAN = {'enabled': True, 'height_scan': {'enabled': True}}
TERRAIN = {'flat': {}, 'terrain': {'enabled': True}, 'terrain + scan': SCAN,
           'scan, cell 0.3 H': {**SCAN, 'horizontal_scale': 0.3},
           'scan, cell 0.4 H': {**SCAN, 'horizontal_scale': 0.4}}


def make_env(num_envs: int, terrain: str = 'flat') -> VecLocomotionEnv:
    cfg = {'num_envs': num_envs, 'seed': 0}
    if TERRAIN[terrain]:
        cfg['terrain'] = dict(TERRAIN[terrain])
        if 'horizontal_scale' in cfg['terrain']:
            # Given in standing heights here; the config takes metres.
            cfg['terrain']['horizontal_scale'] *= load_robot('claw_quadruped').standing_height
    return VecLocomotionEnv(from_dict(EnvConfig, cfg))


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


def stepped_rate(env: VecLocomotionEnv, seconds: float, seed: int = 1) -> float:
    """env steps/s of random actions on an env that is already built (after 10 warm-up steps)."""
    rng = np.random.default_rng(seed)
    actions = [rng.normal(0, 1.0, (env.num_envs, env.num_actions)) for _ in range(64)]
    for a in actions[:10]:
        env.step(a)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(actions[steps % 64])
        steps += 1
    return steps * env.num_envs / (time.perf_counter() - start)


def env_rate(num_envs: int, seconds: float) -> float:
    env = make_env(num_envs)
    rate = stepped_rate(env, seconds)
    env.close()
    return rate


def terrain_rates(num_envs: int, seconds: float, rounds: int) -> dict[str, float]:
    """{setting: median env steps/s over alternating rounds} for each TERRAIN setting."""
    envs = {name: make_env(num_envs, name) for name in TERRAIN}
    rates: dict[str, list[float]] = {name: [] for name in TERRAIN}
    for r in range(rounds):
        for name, env in envs.items():
            rates[name].append(stepped_rate(env, seconds, seed=r))
    for env in envs.values():
        env.close()
    return {name: float(np.median(v)) for name, v in rates.items()}


def peak_rss_mib(num_envs: int, terrain: str = 'flat') -> float:
    """Peak RSS of a fresh process that builds and steps a num_envs batch.

    Read from the child's own VmHWM: Linux carries ru_maxrss over fork and exec, so a child's
    getrusage would report this (bigger) process's peak instead.
    """
    code = ('import numpy as np, sys; sys.path.insert(0, "bench"); '
            'from env_throughput import make_env; '
            f'env = make_env({num_envs}, {terrain!r}); '
            '[env.step(np.zeros((env.num_envs, env.num_actions))) for _ in range(200)]; '
            'print([line.split()[1] for line in open("/proc/self/status") '
            'if line.startswith("VmHWM:")][0])')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         check=True, cwd=os.path.dirname(os.path.dirname(__file__)) or '.')
    return int(out.stdout.strip().splitlines()[-1]) / 1024.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--sizes', type=int, nargs='+', default=[1, 16, 64, 256])
    parser.add_argument('--seconds', type=float, default=3.0)
    parser.add_argument('--rounds', type=int, default=3, help='alternating rounds of the '
                        'flat / terrain / terrain + scan rows')
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
    print(f'\nterrain at 256 worlds ({args.rounds} alternating rounds of {args.seconds:g} s, '
          'median):')
    print(f'{"floor":>17} {"env steps/s":>12} {"of flat":>8} {"peak RSS":>9}')
    rates = terrain_rates(256, args.seconds, args.rounds)
    for name, rate in rates.items():
        print(f'{name:>17} {rate:>12,.0f} {rate / rates["flat"]:>8.1%} '
              f'{peak_rss_mib(256, name):>6,.0f} MiB')
    print('(goal: terrain + scan >= 70 % of flat; the default is cell 0.2 H)')
    print(f'(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB)')


if __name__ == '__main__':
    main()
