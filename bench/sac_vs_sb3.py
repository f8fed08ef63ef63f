"""Our SAC vs stable-baselines3 SAC side by side in one run; and SAC vs PPO on the claw robot.

``gym`` sections (``pendulum``, ``mujoco``): both SACs train on the same Gymnasium env (ours
through :class:`GymVecEnv` and :class:`OnPolicyRunner` with ``algorithm: sac``, SB3 through its
``DummyVecEnv``) for the same env-step budget with the same hyper-parameters (SB3's SAC
defaults, one env, one gradient step per env step, ``learning_starts`` on both), the same
networks and torch threads, for every seed; then each final policy is evaluated
deterministically on the same episode seeds. Prints per seed and as mean +- std over seeds:
return, wall-clock, env steps/s, milliseconds per gradient step (time inside our
``SAC.update`` / SB3's ``SAC.train`` over the gradient steps taken), and the ratios return
ours/sb3, env steps/s ours/sb3 and gradient-step time sb3/ours (the issue's goal: ours >= 2x
faster at >= equal return).

``claw`` section: SAC (``config/train_sac.yaml``) vs PPO (``config/train_ppo.yaml``) on the claw
quadruped at equal wall-clock: each trains for ``--claw-seconds`` of training time (the runner's
``time_budget_s``), then walks 0.5 m/s forward in ``core/evaluation/evaluator.py`` (vx tracking
error, falls); both learning curves (mean episode return and vx tracking error against
training seconds) go into one PNG.

    .venv/bin/python -m pip install -r requirements-bench.txt   # stable-baselines3
    .venv/bin/python bench/sac_vs_sb3.py                        # every section, default budgets
    .venv/bin/python bench/sac_vs_sb3.py --quick                # smoke run
    .venv/bin/python bench/sac_vs_sb3.py --sections mujoco --mujoco-env HalfCheetah-v5 \\
        --mujoco-steps 300000 --seeds 1 2 3                     # the issue's 300k x 3 seeds
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, replace
import os
from pathlib import Path
import tempfile
import time
from typing import Callable

import gymnasium as gym
import numpy as np
import torch

from claw_rl_ros.core.config import from_dict
from claw_rl_ros.core.evaluation.evaluator import evaluate as evaluate_claw, torch_policy_fn
from claw_rl_ros.core.learning.runner import OnPolicyRunner
from claw_rl_ros.core.learning.train_config import load_train_config, TrainConfig
from claw_rl_ros.core.sim.robot import load_robot

Policy = Callable[[np.ndarray], np.ndarray]      # batched: obs [B, obs_dim] -> actions [B, A]
GYM_SECTIONS = ('pendulum', 'mujoco')
SECTIONS = (*GYM_SECTIONS, 'claw', 'grad_step')


@dataclass
class SACSettings:
    """One Gymnasium section; both sides share every field (SB3 names in brackets)."""

    env: str
    steps: int                    # env steps per run [total_timesteps]
    learning_starts: int = 1000   # random actions, no updates [learning_starts]
    batch_size: int = 256
    buffer_size: int = 1_000_000
    lr: float = 3e-4              # actor, critics and temperature [learning_rate]
    tau: float = 0.005
    gamma: float = 0.99
    hidden: tuple[int, ...] = (256, 256)   # actor and each critic, relu [net_arch]
    eval_episodes: int = 10
    eval_seed: int = 10_000
    threads: int = 1              # torch.set_num_threads on both sides
    # Ours only (SB3 has no such option): the hidden layers' matmul dtype in our gradient steps.
    ours_matmul_dtype: str = 'float32'


DEFAULTS = {
    'pendulum': SACSettings(env='Pendulum-v1', steps=10_000),
    'mujoco': SACSettings(env='Hopper-v5', steps=20_000, eval_episodes=5),
}
QUICK = {'pendulum': {'steps': 600, 'learning_starts': 200, 'eval_episodes': 2},
         'mujoco': {'steps': 600, 'learning_starts': 200, 'eval_episodes': 2}}
CHUNK = 1000  # our runner's iteration: env steps (and gradient steps) between log points


# ------------------------------------------------------------------------------ gym sections
def ours_config(s: SACSettings, seed: int) -> TrainConfig:
    """config/train_gym_sac.yaml's trainer (SB3's SAC defaults) with the section's values."""
    steps = min(CHUNK, s.steps)
    return from_dict(TrainConfig, {
        'algorithm': 'sac', 'gym_env': s.env, 'env': {'num_envs': 1},
        'policy': {'actor_hidden_dims': list(s.hidden), 'critic_hidden_dims': list(s.hidden),
                   'activation': 'relu', 'normalize_obs': False},
        'sac': {'buffer_size': s.buffer_size, 'learning_starts': s.learning_starts,
                'batch_size': s.batch_size, 'utd_ratio': 1.0, 'gamma': s.gamma, 'tau': s.tau,
                'actor_lr': s.lr, 'critic_lr': s.lr, 'ent_coef_lr': s.lr,
                'checkpoint_replay': False, 'matmul_dtype': s.ours_matmul_dtype},
        'runner': {'num_steps_per_env': steps, 'max_iterations': max(1, s.steps // steps),
                   'seed': seed, 'torch_threads': s.threads}}, source='bench')


class GradTimer:
    """Wraps an update function: seconds spent in it and the gradient steps it took."""

    def __init__(self, fn: Callable, count: Callable[[tuple, dict, object], int]):
        self.fn, self.count = fn, count
        self.seconds, self.steps = 0.0, 0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        out = self.fn(*args, **kwargs)
        self.seconds += time.perf_counter() - start
        self.steps += self.count(args, kwargs, out)
        return out

    @property
    def ms_per_step(self) -> float:
        return 1e3 * self.seconds / max(self.steps, 1)


def train_ours(s: SACSettings, seed: int) -> tuple[Policy, float, float]:
    """Our SAC for ``s.steps`` env steps; (deterministic policy, training seconds, ms per
    gradient step)."""
    torch.set_num_threads(s.threads)
    cfg = ours_config(s, seed)
    runner = OnPolicyRunner(cfg, tempfile.mkdtemp(prefix='bench_sac_'))
    timer = runner.alg.update = GradTimer(runner.alg.update,
                                          lambda _a, _k, out: int(out['updates']))
    start = time.perf_counter()
    for _ in range(cfg.runner.max_iterations):
        runner.train_one_epoch()
    wall = time.perf_counter() - start
    runner.close()
    return torch_policy_fn(runner.policy.eval()), wall, timer.ms_per_step


def train_sb3(s: SACSettings, seed: int) -> tuple[Policy, float, float]:
    """SB3 SAC (its defaults plus the section's values); (deterministic policy, seconds, ms per
    gradient step)."""
    from stable_baselines3 import SAC
    from stable_baselines3.common.env_util import make_vec_env
    torch.set_num_threads(s.threads)
    venv = make_vec_env(s.env, n_envs=1, seed=seed)
    model = SAC('MlpPolicy', venv, learning_rate=s.lr, buffer_size=s.buffer_size,
                learning_starts=s.learning_starts, batch_size=s.batch_size, tau=s.tau,
                gamma=s.gamma, train_freq=1, gradient_steps=1, seed=seed, device='cpu',
                verbose=0, policy_kwargs={'net_arch': list(s.hidden)})
    timer = model.train = GradTimer(model.train,
                                    lambda a, k, _out: k.get('gradient_steps', a[0] if a else 0))
    start = time.perf_counter()
    model.learn(total_timesteps=s.steps)
    wall = time.perf_counter() - start
    venv.close()
    return (lambda obs: model.predict(obs, deterministic=True)[0]), wall, timer.ms_per_step


def evaluate_gym(s: SACSettings, act: Policy) -> float:
    """Mean undiscounted return of ``eval_episodes`` deterministic episodes, episode k from
    ``reset(seed=eval_seed + k)``."""
    env = gym.make(s.env)
    returns = []
    for k in range(s.eval_episodes):
        obs, _ = env.reset(seed=s.eval_seed + k)
        total, done = 0.0, False
        while not done:
            action = act(obs[None].astype(np.float32))[0]
            obs, reward, terminated, truncated, _ = env.step(
                np.clip(action, env.action_space.low, env.action_space.high))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def run_gym_section(section: str, s: SACSettings, seeds: list[int]) -> dict[str, np.ndarray]:
    """Both sides for every seed (ours first, then SB3, per seed); returns and wall seconds."""
    print(f'\n== {section}: {s.env}, {s.steps} env steps per run, seeds {seeds} ==  '
          f'{load_line()}', flush=True)
    print('  shared settings: ' + ', '.join(f'{k}={v}' for k, v in asdict(s).items()
                                            if k not in ('env', 'steps')))
    table = {f'{side}_{what}': [] for side in ('ours', 'sb3')
             for what in ('return', 'wall', 'grad_ms')}
    for seed in seeds:
        for side, train in (('ours', train_ours), ('sb3', train_sb3)):
            act, wall, grad_ms = train(s, seed)
            ret = evaluate_gym(s, act)
            table[f'{side}_return'].append(ret)
            table[f'{side}_wall'].append(wall)
            table[f'{side}_grad_ms'].append(grad_ms)
            print(f'  seed {seed} {side:4}: return {ret:9.1f}  wall {wall:7.1f} s  '
                  f'{s.steps / wall:6.0f} steps/s  {grad_ms:6.2f} ms/gradient step   '
                  f'{load_line()}', flush=True)
    out = {k: np.asarray(v) for k, v in table.items()}
    gym_report(section, s, out)
    return out


def gym_report(section: str, s: SACSettings, r: dict[str, np.ndarray]) -> None:
    ret_ratio = r['ours_return'].mean() / r['sb3_return'].mean()
    speed = r['sb3_wall'].mean() / r['ours_wall'].mean()
    grad = r['sb3_grad_ms'].mean() / r['ours_grad_ms'].mean()
    for side in ('ours', 'sb3'):
        print(f'  {side:4} mean over {len(r[side + "_return"])} seeds: return '
              f'{r[side + "_return"].mean():9.1f} +- {r[side + "_return"].std():7.1f}  '
              f'steps/s {s.steps / r[side + "_wall"].mean():6.0f}  '
              f'ms/gradient step {r[side + "_grad_ms"].mean():6.2f}')
    # Negative returns (Pendulum): a ratio above 1 is a worse return there; say which is better.
    better = 'ours' if r['ours_return'].mean() >= r['sb3_return'].mean() else 'sb3'
    goal = 'met' if speed >= 2.0 and better == 'ours' else 'not met'
    print(f'[{section}] return ratio ours/sb3 {ret_ratio:.2f} (higher return: {better})   '
          f'steps/s ratio ours/sb3 {speed:.2f}x   gradient-step time ratio sb3/ours '
          f'{grad:.2f}x   goal >= 2x at >= equal return: {goal}')
    print('  remaining differences: SB3 clamps the log std to [-20, 2], ours squashes it into '
          '[-5, 2] with a tanh (CleanRL); SB3 Adam eps 1e-8 single-tensor vs ours fused; SB3 '
          'initialises with PyTorch defaults as ours does; ours does a 1000-step chunk of env '
          'steps, then its 1000 gradient steps, SB3 alternates them one by one')


# ------------------------------------------------------------------------------ claw section
def claw_run(algorithm: str, seconds: float, seed: int) -> dict:
    """Train ``config/train_<algorithm>.yaml`` for ``seconds`` of training time; the curve
    (per iteration: training seconds, env steps, mean episode return, vx tracking error) and a
    0.5 m/s forward evaluation of the deterministic policy."""
    cfg = load_train_config(f'train_{algorithm}.yaml', {'runner': {
        'time_budget_s': seconds, 'max_iterations': 100_000, 'seed': seed,
        'save_interval': 100_000, 'eval_episodes': 0}})
    runner = OnPolicyRunner(cfg, tempfile.mkdtemp(prefix=f'bench_claw_{algorithm}_'))
    curve = []

    def log(_it, m):
        curve.append((m['wall_time_s'], m['total_steps'], m['mean_episode_return'],
                      m.get('tracking_error/lin_vel_x', float('nan'))))
    runner.learn(log)
    runner.close()
    report = evaluate_claw(torch_policy_fn(runner.policy.eval()), cfg.env,
                           load_robot(cfg.env.robot), episodes=20, command=(0.5, 0.0, 0.0),
                           seed=seed + 1)
    return {'curve': np.asarray(curve), 'iterations': runner.iteration,
            'steps': runner.total_steps, 'seconds': runner.elapsed_s, 'eval': report}


def run_claw_section(seconds: float, seed: int, png: Path) -> dict[str, dict]:
    print(f'\n== claw: SAC vs PPO, {seconds:.0f} s of training each, seed {seed} ==  '
          f'{load_line()}', flush=True)
    runs = {}
    for algorithm in ('ppo', 'sac'):
        runs[algorithm] = claw_run(algorithm, seconds, seed)
        r = runs[algorithm]
        print(f'  {algorithm}: {r["iterations"]} iterations, {r["steps"]} env steps in '
              f'{r["seconds"]:.0f} s; {load_line()}', flush=True)
    print(f'{"":6}{"iters":>7}{"env steps":>11}{"steps/s":>9}{"final return":>14}'
          f'{"vx err m/s":>12}{"speed m/s":>11}{"falls":>7}')
    for name, r in runs.items():
        ev, curve = r['eval'], r['curve']
        print(f'{name:6}{r["iterations"]:7d}{r["steps"]:11d}{r["steps"] / r["seconds"]:9.0f}'
              f'{curve[-1, 2]:14.2f}{ev.tracking_error_vx:12.3f}{ev.mean_forward_speed:11.3f}'
              f'{ev.falls:5d}/{ev.episodes}')
    walks = runs['sac']['eval']
    verdict = 'walks' if walks.fall_rate == 0 and walks.tracking_error_vx < 0.1 else \
        'does not walk yet'
    print(f'[claw] SAC {verdict} at 0.5 m/s after {seconds:.0f} s (criterion: no falls, '
          'vx error < 0.1 m/s)')
    plot_curves(runs, png)
    print(f'  learning curves: {png}')
    return runs


def plot_curves(runs: dict[str, dict], png: Path) -> None:
    """Mean episode return and vx tracking error against training seconds, both algorithms."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, r in runs.items():
        c = r['curve']
        axes[0].plot(c[:, 0], c[:, 2], label=f'{name} ({r["steps"]:,} env steps)')
        axes[1].plot(c[:, 0], c[:, 3], label=name)
    axes[0].set(xlabel='training time [s]', ylabel='mean episode return')
    axes[1].set(xlabel='training time [s]', ylabel='vx tracking error [m/s]')
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle('claw quadruped: SAC (train_sac.yaml) vs PPO (train_ppo.yaml), equal time')
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=90)
    plt.close(fig)


# ------------------------------------------------------------------------- grad_step section
def grad_step_section(s: SACSettings, blocks: int, block: int = 10) -> dict[str, float]:
    """CPU time of one gradient step on ``s.env``'s shapes, in this process: ours in float32,
    ours with bfloat16 hidden matmuls, and SB3, in interleaved blocks of ``block`` steps (the
    median block over ``blocks``; thread CPU time, so other processes' load matters little).

    Next to them, the floor of an fp32 step: ours needs 16 [256 x 256] x [256 x 256] products
    per gradient step (SB3 18: it also forms the critics' weight gradients in the actor loss),
    timed here one by one, so no fp32 implementation of these hyper-parameters on one thread
    can beat ``SB3 time / (16 x product time)``.
    """
    from stable_baselines3 import SAC as SB3SAC
    from claw_rl_ros.core.learning.sac import SAC
    from claw_rl_ros.core.learning.sac_networks import SACPolicy
    from claw_rl_ros.core.learning.train_config import DistillationConfig, SACConfig
    torch.set_num_threads(s.threads)
    env = gym.make(s.env)
    obs_dim, num_actions = env.observation_space.shape[0], env.action_space.shape[0]
    print(f'\n== grad_step: {s.env} shapes (obs {obs_dim}, actions {num_actions}), batch '
          f'{s.batch_size}, {list(s.hidden)} relu, {s.threads} thread(s) ==  {load_line()}',
          flush=True)
    gen = torch.Generator().manual_seed(0)
    steps: dict[str, Callable[[], None]] = {}
    for dtype in ('float32', 'bfloat16'):
        policy = SACPolicy(obs_dim, obs_dim, num_actions, actor_hidden_dims=list(s.hidden),
                           critic_hidden_dims=list(s.hidden), activation='relu',
                           normalize_obs=False, critic_obs_groups=['policy'])
        alg = SAC(policy, SACConfig(batch_size=s.batch_size, buffer_size=100_000,
                                    matmul_dtype=dtype), DistillationConfig(), generator=gen)
        alg.init_storage(1, 1, {'policy': obs_dim}, num_actions)
        # A replay of 5000 random transitions (the step's cost does not depend on the data).
        for _ in range(5000):
            alg.act({'policy': torch.randn(1, obs_dim, generator=gen)})
            alg.process_env_step(torch.randn(1, generator=gen), torch.zeros(1), torch.zeros(1),
                                 None, {'policy': torch.randn(1, obs_dim, generator=gen)})

        def ours(alg=alg) -> None:
            for _ in range(block):
                alg._update_batch(0.0)
        steps[f'ours {dtype}'] = ours
    model = SB3SAC('MlpPolicy', env, learning_starts=1000, batch_size=s.batch_size,
                   seed=0, device='cpu', verbose=0, policy_kwargs={'net_arch': list(s.hidden)})
    model.learn(1100)
    steps['sb3'] = lambda: model.train(gradient_steps=block, batch_size=s.batch_size)
    a, b = torch.randn(s.hidden[0], s.hidden[1]), torch.randn(s.hidden[1], s.hidden[1])
    steps['fp32 product'] = lambda: [a @ b for _ in range(block)]
    times: dict[str, list[float]] = {k: [] for k in steps}
    for name, fn in steps.items():
        fn()  # warm-up: allocator, first-step optimiser state, kernels
    for _ in range(blocks):
        for name, fn in steps.items():
            start = time.thread_time()
            fn()
            times[name].append((time.thread_time() - start) * 1e3 / block)
    ms = {k: float(np.median(v)) for k, v in times.items()}
    floor = 16 * ms['fp32 product']
    for name in ('ours float32', 'ours bfloat16', 'sb3'):
        print(f'  {name:14} {ms[name]:6.2f} ms per gradient step  (sb3 / this '
              f'{ms["sb3"] / ms[name]:.2f}x)')
    print(f'  fp32 floor of ours: 16 products x {ms["fp32 product"]:.3f} ms = {floor:.2f} ms, '
          f'so sb3 / any fp32 step <= {ms["sb3"] / floor:.2f}x here')
    print(f'[grad_step] sb3/ours: float32 {ms["sb3"] / ms["ours float32"]:.2f}x, bfloat16 '
          f'{ms["sb3"] / ms["ours bfloat16"]:.2f}x; fp32 ceiling {ms["sb3"] / floor:.2f}x   '
          f'{load_line()}')
    return ms


# ---------------------------------------------------------------------------------------- CLI
def load_line() -> str:
    one, five, _ = os.getloadavg()
    return f'load {one:.2f} (5 min {five:.2f}) on {os.cpu_count()} cores'


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--sections', nargs='+', choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument('--quick', action='store_true', help='tiny budgets: a smoke run')
    parser.add_argument('--seeds', type=int, nargs='+', default=[1, 2],
                        help='seeds of the Gymnasium sections (the issue asks for 3)')
    parser.add_argument('--claw-seconds', type=float, default=240.0,
                        help='training seconds of each claw run (make train: 570)')
    parser.add_argument('--claw-seed', type=int, default=1)
    parser.add_argument('--claw-png', type=Path, default=Path('docs/sac_vs_ppo_claw.png'))
    parser.add_argument('--ours-matmul-dtype', choices=('float32', 'bfloat16', 'auto'),
                        default=None,
                        help="our gradient steps' hidden matmuls (default: "
                             "config/train_gym_sac.yaml's sac.matmul_dtype)")
    parser.add_argument('--grad-step-env', default='Hopper-v5')
    parser.add_argument('--grad-step-blocks', type=int, default=30)
    for section, default in DEFAULTS.items():
        parser.add_argument(f'--{section}-env', default=None)
        parser.add_argument(f'--{section}-steps', type=int, default=None)
        parser.add_argument(f'--{section}-learning-starts', type=int, default=None)
        parser.add_argument(f'--{section}-threads', type=int, default=None)
    return parser.parse_args()


def section_settings(args: argparse.Namespace, section: str) -> SACSettings:
    s = replace(DEFAULTS[section], **QUICK[section]) if args.quick else DEFAULTS[section]
    given = {k: getattr(args, f'{section}_{k}') for k in ('env', 'steps', 'learning_starts',
                                                          'threads')}
    dtype = args.ours_matmul_dtype or load_train_config('train_gym_sac.yaml').sac.matmul_dtype
    return replace(s, ours_matmul_dtype=dtype,
                   **{k: v for k, v in given.items() if v is not None})


def main() -> None:
    args = parse_args()
    try:  # every section but the claw's (SAC vs PPO, both ours) runs SB3
        if set(args.sections) - {'claw'}:
            import stable_baselines3  # noqa: F401
    except ModuleNotFoundError:
        raise SystemExit('stable_baselines3 is missing: .venv/bin/python -m pip install -r '
                         'requirements-bench.txt') from None
    for section in args.sections:
        if section == 'claw':
            seconds = 20.0 if args.quick else args.claw_seconds
            run_claw_section(seconds, args.claw_seed, args.claw_png)
        elif section == 'grad_step':
            grad_step_section(replace(DEFAULTS['mujoco'], env=args.grad_step_env),
                              3 if args.quick else args.grad_step_blocks)
        else:
            run_gym_section(section, section_settings(args, section), args.seeds)


if __name__ == '__main__':
    main()
