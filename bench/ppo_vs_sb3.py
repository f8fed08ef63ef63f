"""Our PPO vs stable-baselines3 PPO, side by side in one run, in two sections.

``claw`` (the main section): the claw quadruped. SB3 trains N copies of the single-world
Gymnasium adapter ``ClawQuadruped-v0`` (:class:`ClawLocomotionGymEnv`, what another RL library
sees) in its ``DummyVecEnv`` (or ``SubprocVecEnv``); ours trains the same env config through
our native batched :class:`VecLocomotionEnv` with ``num_envs = N`` (one ``mujoco.rollout`` call
steps every world, on all cores) via :class:`OnPolicyRunner`. This is where our speed comes from.

``pendulum`` (interop parity): InvertedPendulum-v5 with both sides stepping the same Gymnasium
envs (ours through :class:`GymVecEnv`, SB3 through ``DummyVecEnv``): the env cost is identical,
so this shows the two PPO implementations match on a public env (speed ~1x, equal return).

In each section both sides train for the same env-step budget with the same PPO
hyper-parameters, networks and torch threads; then both final policies are evaluated
deterministically on the same env config and episode seeds. Prints wall-clock seconds, env
steps/s, where the training time went (env stepping / acting+storage / updates), the final
evaluation and the ratios against the goal: ours >= 3x faster at >= equal final return.

    .venv/bin/python -m pip install -r requirements-bench.txt   # stable-baselines3, imageio
    .venv/bin/python bench/ppo_vs_sb3.py                     # both sections, default budgets
    .venv/bin/python bench/ppo_vs_sb3.py --quick             # smoke run (well under a minute)
    .venv/bin/python bench/ppo_vs_sb3.py --sections claw --claw-steps 294912 --claw-num-envs 128

Every field of :class:`Settings` is a flag per section: ``--claw-<field>`` / ``--pendulum-<field>``
(``--claw-lr 3e-4``, ``--pendulum-env Hopper-v5``, ...).
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, fields, replace
import os
import tempfile
import time
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch

from claw_rl_ros.core.config import from_dict, to_dict
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.evaluation.evaluator import evaluate as evaluate_claw, torch_policy_fn
from claw_rl_ros.core.sim.gym_env import ENV_ID as CLAW_ENV_ID, register as register_claw
from claw_rl_ros.core.sim.gym_vec import GymVecEnv
from claw_rl_ros.core.sim.robot import load_robot
from claw_rl_ros.core.learning.runner import OnPolicyRunner
from claw_rl_ros.core.learning.train_config import TrainConfig

Policy = Callable[[np.ndarray], np.ndarray]      # batched: obs [B, obs_dim] -> actions [B, A]
ACTIVATIONS = {'tanh': torch.nn.Tanh, 'elu': torch.nn.ELU, 'relu': torch.nn.ReLU}
SECTIONS = ('pendulum', 'claw')
VEC_CLASSES = ('dummy', 'subproc', 'auto')


@dataclass
class Settings:
    """One section's settings; both sides share every one (SB3 names in brackets)."""

    env: str
    steps: int                    # env-step budget, rounded down to whole rollouts
    num_envs: int                 # worlds / env copies [n_envs]
    rollout: int                  # steps per env per iteration [n_steps]
    lr: float                     # fixed learning rate [learning_rate]
    entropy: float                # [ent_coef]
    value_coef: float             # [vf_coef]
    max_grad_norm: float
    actor_hidden: tuple[int, ...]   # [net_arch pi]
    critic_hidden: tuple[int, ...]  # [net_arch vf]
    activation: str               # [activation_fn]
    eval_episodes: int
    eval_seed: int
    epochs: int = 5               # [n_epochs]
    mini_batches: int = 4         # [rollout * num_envs / batch_size]
    gamma: float = 0.99
    lam: float = 0.95             # [gae_lambda]
    clip: float = 0.2             # [clip_range]
    init_std: float = 1.0         # [log_std_init = log(init_std)]
    normalize_obs: bool = False   # ours: running normaliser; SB3: VecNormalize(norm_obs)
    threads: int = 1              # torch.set_num_threads on both sides
    seed: int = 1
    sb3_vec: str = 'dummy'        # SB3's vec env: dummy, subproc (one process per env) or auto
    # ours: 'same' = SB3's PPO variant exactly; 'rsl' = our default training setup (adaptive-KL
    # lr, clipped value loss, rollout-wide advantage normalisation, critic also reading the
    # privileged observations), i.e. each side as its users would run it.
    ours_setup: str = 'same'
    # ours: core options that decide parity with SB3 (policy.init, policy.obs_normalizer,
    # ppo.adam_eps; config/train_gym_ppo.yaml sets the SB3 values). The pendulum section runs
    # them as SB3 does; the claw section keeps the claw defaults (config/train_ppo.yaml).
    ours_init: str = 'orthogonal'
    ours_normalizer: str = 'sb3'
    ours_adam_eps: float = 1e-5

    @property
    def iterations(self) -> int:
        return max(1, self.steps // (self.num_envs * self.rollout))

    @property
    def budget(self) -> int:
        return self.iterations * self.num_envs * self.rollout


DEFAULTS = {
    # The public-env parity check (unchanged from the first version of this bench).
    'pendulum': Settings(
        env='InvertedPendulum-v5', steps=102_400, num_envs=8, rollout=64, lr=1e-3, entropy=0.0,
        value_coef=0.5, max_grad_norm=0.5, actor_hidden=(64, 64), critic_hidden=(64, 64),
        activation='tanh', eval_episodes=10, eval_seed=10_000),
    # The claw quadruped with config/train_ppo.yaml's networks and PPO settings (fixed lr).
    # Each side as its users run it: ours with config/train_ppo.yaml's PPO (ours_setup 'rsl',
    # observation normaliser), SB3 with VecNormalize; same budget, networks, rollout, epochs.
    'claw': Settings(
        env=CLAW_ENV_ID, steps=393_216, num_envs=128, rollout=24, lr=1e-3, entropy=0.01,
        value_coef=1.0, max_grad_norm=1.0, actor_hidden=(128, 128, 128),
        critic_hidden=(256, 256, 128), activation='elu', eval_episodes=64, eval_seed=10_000,
        normalize_obs=True, threads=2, ours_setup='rsl', ours_init='torch',
        ours_normalizer='rsl_rl', ours_adam_eps=1e-8),
}
QUICK = {  # --quick: a few iterations per side, to check that everything runs
    'pendulum': {'steps': 8 * 64 * 4, 'eval_episodes': 3},
    'claw': {'steps': 16 * 24 * 4, 'num_envs': 16, 'eval_episodes': 8},
}


class TimedEnv:
    """Forwards to a vec env (our contract) and adds up the seconds spent in its ``step``."""

    def __init__(self, env):
        self.env = env
        self.step_s = 0.0

    def __getattr__(self, name):
        return getattr(self.env, name)

    def step(self, actions):
        start = time.perf_counter()
        out = self.env.step(actions)
        self.step_s += time.perf_counter() - start
        return out


# ----------------------------------------------------------------------------------- the envs
def claw_env_config(s: Settings) -> EnvConfig:
    """The claw env both sides train on: the typed defaults (robot claw_quadruped, domain
    randomisation and observation noise on, 20 s episodes, sampled velocity commands; the same
    env as config/train_ppo.yaml) with N worlds and the run's seed."""
    return from_dict(EnvConfig, {'num_envs': s.num_envs, 'seed': s.seed}, source='bench')


def make_claw_gym_env(env_cfg: dict[str, Any]) -> gym.Env:
    """One ``ClawQuadruped-v0`` through ``gymnasium.make`` (module level: SubprocVecEnv workers
    build their env from it)."""
    register_claw()
    return gym.make(CLAW_ENV_ID, env_cfg=env_cfg)


def make_ours_env(s: Settings, section: str):
    """Our side's vec env: the native batched claw env, or GymVecEnv copies of a Gymnasium env."""
    if section == 'claw':
        return VecLocomotionEnv(claw_env_config(s))
    return GymVecEnv(s.env, s.num_envs, seed=s.seed)


def make_sb3_env(s: Settings, section: str, vec: str):
    """SB3's vec env: ``make_vec_env`` of the Gymnasium env, DummyVecEnv or SubprocVecEnv."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    cls = SubprocVecEnv if vec == 'subproc' else DummyVecEnv
    # fork: workers start from this process (everything imported) instead of re-importing
    # torch and SB3 in a fresh interpreter each; the fastest start SB3 offers on Linux.
    vec_kwargs = {'start_method': 'fork'} if vec == 'subproc' else None
    if section == 'claw':
        cfg = to_dict(claw_env_config(s))
        return make_vec_env(make_claw_gym_env, n_envs=s.num_envs, seed=s.seed,
                            env_kwargs={'env_cfg': cfg}, vec_env_cls=cls,
                            vec_env_kwargs=vec_kwargs)
    return make_vec_env(s.env, n_envs=s.num_envs, seed=s.seed, vec_env_cls=cls,
                        vec_env_kwargs=vec_kwargs)


def probe_sb3_vec(s: Settings, section: str, rollouts: int = 3) -> tuple[str, dict[str, float]]:
    """Env steps/s of SB3's DummyVecEnv and SubprocVecEnv under random actions; the faster."""
    rates = {}
    for vec in ('dummy', 'subproc'):
        venv = make_sb3_env(s, section, vec)
        venv.reset()
        rng = np.random.default_rng(0)
        low, high = venv.action_space.low, venv.action_space.high
        actions = [np.clip(rng.normal(0.0, 1.0, (s.num_envs, *low.shape)), low, high)
                   for _ in range(8)]
        start = time.perf_counter()
        for k in range(rollouts * s.rollout):
            venv.step(actions[k % len(actions)])
        rates[vec] = rollouts * s.rollout * s.num_envs / (time.perf_counter() - start)
        venv.close()
    return max(rates, key=rates.get), rates


# --------------------------------------------------------------------------------------- ours
def ours_config(s: Settings) -> TrainConfig:
    """'same': SB3's PPO: fixed lr, per-mini-batch advantage normalisation, plain value loss,
    no std floor, a critic that reads the policy observation only (as SB3's does). 'rsl': our
    defaults for those (see Settings.ours_setup)."""
    cfg = {
        'policy': {'actor_hidden_dims': list(s.actor_hidden),
                   'critic_hidden_dims': list(s.critic_hidden),
                   'activation': s.activation, 'init_noise_std': s.init_std,
                   'min_noise_std': 0.0, 'normalize_obs': s.normalize_obs,
                   'critic_obs_groups': ['policy'], 'init': s.ours_init,
                   'obs_normalizer': s.ours_normalizer},
        'ppo': {'num_learning_epochs': s.epochs, 'num_mini_batches': s.mini_batches,
                'clip_param': s.clip, 'gamma': s.gamma, 'lam': s.lam,
                'value_loss_coef': s.value_coef, 'entropy_coef': s.entropy,
                'learning_rate': s.lr, 'max_grad_norm': s.max_grad_norm,
                'use_clipped_value_loss': False, 'schedule': 'fixed',
                'normalize_advantage_per_mini_batch': True, 'adam_eps': s.ours_adam_eps},
        'runner': {'num_steps_per_env': s.rollout, 'max_iterations': s.iterations,
                   'seed': s.seed, 'torch_threads': s.threads}}
    if s.ours_setup == 'rsl':
        del cfg['policy']['critic_obs_groups']
        cfg['ppo'].update({'use_clipped_value_loss': True, 'schedule': 'adaptive',
                           'normalize_advantage_per_mini_batch': False})
    return from_dict(TrainConfig, cfg, source='bench')


def train_ours(s: Settings, section: str) -> tuple[Policy, dict[str, float]]:
    """Train with OnPolicyRunner on our vec env; the deterministic batched policy, timings."""
    start = time.perf_counter()
    env = TimedEnv(make_ours_env(s, section))
    runner = OnPolicyRunner(ours_config(s), tempfile.mkdtemp(prefix='bench_ours_'), env=env)
    setup = time.perf_counter() - start
    collect_s = 0.0
    start = time.perf_counter()
    for _ in range(s.iterations):
        collect_s += runner.train_one_epoch()['collect_s']
    wall = time.perf_counter() - start
    env.close()
    return torch_policy_fn(runner.policy.eval()), timings(wall, env.step_s, collect_s, setup)


# ---------------------------------------------------------------------------------------- SB3
def train_sb3(s: Settings, section: str, vec: str) -> tuple[Policy, dict[str, float]]:
    """Train SB3 PPO on ``vec`` copies of the Gymnasium env; the deterministic batched policy
    (with VecNormalize's frozen statistics when on) and timings."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecNormalize

    class RolloutClock(BaseCallback):
        """Adds up the seconds of SB3's rollout phases."""

        def __init__(self):
            super().__init__()
            self.collect_s, self._start = 0.0, 0.0

        def _on_rollout_start(self) -> None:
            self._start = time.perf_counter()

        def _on_rollout_end(self) -> None:
            self.collect_s += time.perf_counter() - self._start

        def _on_step(self) -> bool:
            return True

    torch.set_num_threads(s.threads)
    start = time.perf_counter()
    venv = make_sb3_env(s, section, vec)
    timed = timed_vec_env(venv)
    # Normalisation outside the timer: it counts as acting, as our policy-side normaliser does.
    train_env = VecNormalize(timed, norm_obs=True, norm_reward=False, gamma=s.gamma) \
        if s.normalize_obs else timed
    model = PPO('MlpPolicy', train_env, learning_rate=s.lr, n_steps=s.rollout,
                batch_size=s.rollout * s.num_envs // s.mini_batches, n_epochs=s.epochs,
                gamma=s.gamma, gae_lambda=s.lam, clip_range=s.clip, ent_coef=s.entropy,
                vf_coef=s.value_coef, max_grad_norm=s.max_grad_norm, seed=s.seed,
                device='cpu', verbose=0,
                policy_kwargs={'net_arch': {'pi': list(s.actor_hidden),
                                            'vf': list(s.critic_hidden)},
                               'activation_fn': ACTIVATIONS[s.activation],
                               'log_std_init': float(np.log(s.init_std))})
    setup = time.perf_counter() - start
    clock = RolloutClock()
    start = time.perf_counter()
    model.learn(total_timesteps=s.budget, callback=clock)
    wall = time.perf_counter() - start
    train_env.close()

    def act(obs: np.ndarray) -> np.ndarray:
        if s.normalize_obs:
            obs = train_env.normalize_obs(obs)   # frozen statistics: no update
        return model.predict(obs, deterministic=True)[0]

    return act, timings(wall, timed.step_s, clock.collect_s, setup)


def timed_vec_env(venv):
    """An SB3 VecEnvWrapper that adds up the seconds of ``step_wait`` (the env stepping)."""
    from stable_baselines3.common.vec_env import VecEnvWrapper

    class _Timed(VecEnvWrapper):
        step_s = 0.0

        def reset(self):
            return self.venv.reset()

        def step_wait(self):
            start = time.perf_counter()
            out = self.venv.step_wait()
            self.step_s += time.perf_counter() - start
            return out

    return _Timed(venv)


# --------------------------------------------------------------------------------- evaluation
def timings(wall: float, env_s: float, collect_s: float, setup_s: float) -> dict[str, float]:
    """Wall-clock split: env stepping, acting + storage (rest of the rollout), updates."""
    return {'wall_s': wall, 'env_s': env_s, 'act_s': collect_s - env_s,
            'update_s': wall - collect_s, 'setup_s': setup_s}


def evaluate_gym(s: Settings, act: Policy) -> dict[str, float]:
    """Undiscounted return of ``eval_episodes`` deterministic episodes of the Gymnasium env,
    episode k from ``reset(seed=eval_seed + k)``."""
    env = gym.make(s.env)
    low, high = env.action_space.low, env.action_space.high
    returns = []
    for k in range(s.eval_episodes):
        obs, _ = env.reset(seed=s.eval_seed + k)
        total, done = 0.0, False
        while not done:
            action = np.clip(act(obs[None].astype(np.float32))[0], low, high)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return {'return': float(np.mean(returns)), 'return_std': float(np.std(returns))}


def evaluate_on_claw(s: Settings, act: Policy) -> dict[str, float]:
    """core/evaluate.py: ``eval_episodes`` worlds, one full episode each, same env config
    (randomisation and noise as in training, sampled commands), env seed ``eval_seed``."""
    cfg = claw_env_config(s)
    r = evaluate_claw(act, cfg, load_robot(cfg.robot), episodes=s.eval_episodes,
                      seed=s.eval_seed)
    return {'return': r.mean_return, 'vx_error': r.tracking_error_vx,
            'fall_rate': r.fall_rate, 'length_s': r.mean_length_s}


# ------------------------------------------------------------------------------------- report
def load_line() -> str:
    one, five, _ = os.getloadavg()
    return f'load average {one:.2f} (5 min {five:.2f}) on {os.cpu_count()} cores'


def report(section: str, s: Settings, vec: str, results: dict[str, dict[str, float]]) -> None:
    ours_side = ('VecLocomotionEnv (native batched env, %d worlds, physics on %d threads)'
                 % (s.num_envs, os.cpu_count() or 1)) if section == 'claw' else \
        f'GymVecEnv ({s.num_envs} Gymnasium envs in a loop)'
    sb3_side = f'{vec} vec env of {s.num_envs} Gymnasium envs' + \
        (' (one process each)' if vec == 'subproc' else '')
    print(f'[{section}] env {s.env}: {s.budget} env steps ({s.iterations} iterations x '
          f'{s.num_envs} envs x {s.rollout} steps) per side, torch threads {s.threads}, cpu')
    print(f'  ours: {ours_side}\n  sb3:  {sb3_side}')
    shared = {k: v for k, v in asdict(s).items() if k not in ('env', 'steps', 'sb3_vec')}
    print('  shared settings: ' + ', '.join(f'{k}={v}' for k, v in shared.items()))
    print(f'{"":6}{"wall s":>8}{"steps/s":>9}{"env s":>7}{"act s":>7}{"upd s":>7}'
          f'{"setup s":>8}  final eval')
    for name, r in results.items():
        if section == 'claw':
            ev = (f'return {r["return"]:7.2f}  vx err {r["vx_error"]:.3f} m/s  fall rate '
                  f'{r["fall_rate"]:.2f}  length {r["length_s"]:4.1f} s')
        else:
            ev = f'return {r["return"]:7.1f} +-{r["return_std"]:5.1f}'
        print(f'{name:6}{r["wall_s"]:8.1f}{s.budget / r["wall_s"]:9.0f}{r["env_s"]:7.1f}'
              f'{r["act_s"]:7.1f}{r["update_s"]:7.1f}{r["setup_s"]:8.1f}  {ev}')
    ours, sb3 = results['ours'], results['sb3']
    speed = sb3['wall_s'] / ours['wall_s']
    ratio = ours['return'] / sb3['return'] if sb3['return'] > 0 else float('nan')
    met = 'met' if speed >= 3.0 and ratio >= 1.0 else 'not met'
    print(f'[{section}] speed ours/sb3 {speed:.2f}x   return ours/sb3 {ratio:.2f}   '
          f'goal >= 3x at >= 1.0: {met}')


def notes(section: str, s: Settings) -> None:
    obs_norm = ('on (ours: running mean/std in the policy; SB3: VecNormalize(norm_obs, '
                'norm_reward=False))' if s.normalize_obs else 'off on both sides')
    if s.ours_setup == 'rsl':
        print('  ours runs its default PPO (adaptive-KL lr from the same initial lr, clipped '
              'value loss, rollout-wide advantage normalisation, critic reading policy + '
              'privileged observations); SB3 runs its PPO with the shared settings; obs '
              f'normalisation {obs_norm}')
    else:
        print('  same algorithm: fixed lr, advantages normalised per mini-batch, unclipped value '
              'loss, time-outs bootstrapped with V(final obs), separate actor and critic MLPs, '
              f'state-independent log std (init std {s.init_std:g}, no floor); obs '
              f'normalisation {obs_norm}')
    sb3_like = (s.ours_init, s.ours_normalizer, s.ours_adam_eps) == ('orthogonal', 'sb3', 1e-5)
    print(f'  ours: policy.init {s.ours_init}, policy.obs_normalizer {s.ours_normalizer}, '
          f'ppo.adam_eps {s.ours_adam_eps:g}'
          + (' (SB3\'s init, normaliser and Adam eps)' if sb3_like else
             ' (SB3: orthogonal, sb3, 1e-5; --*-ours-init/-normalizer/-adam-eps)'))
    if section == 'claw':
        print('  SB3 resets a finished world a second time (the adapter already did: same '
              'distribution, one extra re-randomisation)')
        print('  SB3 vec env: stock SubprocVecEnv runs one process per env (SB3 has no '
              'several-envs-per-worker mode); at 64 envs on 2 cores it stepped ~1000 env '
              'steps/s vs ~2300 for DummyVecEnv (env only), so dummy is the default; '
              '--claw-sb3-vec auto re-measures both and uses the faster')
    print('  env s: inside the vec env\'s step; act s: rest of the rollouts (inference, '
          'sampling, storage; SB3\'s GAE); upd s: PPO epochs (and our GAE); setup s: building '
          'env + model (not in wall s)')


# ---------------------------------------------------------------------------------------- CLI
def parse_args() -> tuple[list[str], dict[str, Settings], bool]:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--sections', nargs='+', choices=SECTIONS, default=list(SECTIONS),
                        help='which comparisons to run, in this order (default: both)')
    parser.add_argument('--quick', action='store_true',
                        help='tiny budgets and few eval episodes: a smoke run')
    parser.add_argument('--no-warm-up', action='store_true',
                        help='skip the untimed one-iteration warm-up of each side')
    for section, default in DEFAULTS.items():
        for f in fields(default):
            value = getattr(default, f.name)
            flag = f'--{section}-{f.name.replace("_", "-")}'
            if isinstance(value, tuple):
                parser.add_argument(flag, type=int, nargs='+', default=None)
            elif isinstance(value, bool):
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
            elif f.name == 'activation':
                parser.add_argument(flag, choices=sorted(ACTIVATIONS), default=None)
            elif f.name == 'ours_setup':
                parser.add_argument(flag, choices=('same', 'rsl'), default=None)
            elif f.name == 'ours_init':
                parser.add_argument(flag, choices=('torch', 'orthogonal'), default=None)
            elif f.name == 'ours_normalizer':
                parser.add_argument(flag, choices=('rsl_rl', 'sb3'), default=None)
            elif f.name == 'sb3_vec':
                parser.add_argument(flag, choices=VEC_CLASSES, default=None,
                                    help='auto: probe both, use the faster')
            else:
                parser.add_argument(flag, type=type(value), default=None)
    args = vars(parser.parse_args())
    settings = {}
    for section, default in DEFAULTS.items():
        s = replace(default, **QUICK[section]) if args['quick'] else default
        given = {f.name: args[f'{section}_{f.name}'] for f in fields(s)
                 if args[f'{section}_{f.name}'] is not None}
        settings[section] = replace(s, **{k: tuple(v) if isinstance(v, list) else v
                                          for k, v in given.items()})
    return args['sections'], settings, not args['no_warm_up']


def require_bench_packages() -> None:
    """Exit with the install line when stable-baselines3 or imageio (MuJoCo envs) is missing."""
    for module in ('stable_baselines3', 'imageio'):
        try:
            __import__(module)
        except ModuleNotFoundError:
            raise SystemExit(f'{module} is missing: .venv/bin/python -m pip install -r '
                             'requirements-bench.txt') from None


def run_section(section: str, s: Settings, warm_up: bool) -> dict[str, dict[str, float]]:
    print(f'\n== {section} ==  {load_line()}', flush=True)
    vec = s.sb3_vec
    if vec == 'auto':
        vec, rates = probe_sb3_vec(s, section)
        print('  SB3 vec env probe (random actions, env only): ' + ', '.join(
            f'{k} {v:.0f} steps/s' for k, v in rates.items()) + f' -> {vec}', flush=True)
    if warm_up:
        # One untimed iteration each first, so lazy imports and allocator warm-up hit neither.
        w = replace(s, steps=s.num_envs * s.rollout, eval_episodes=1)
        train_ours(w, section)
        train_sb3(w, section, 'dummy')
    evaluate = evaluate_on_claw if section == 'claw' else evaluate_gym
    results = {}
    for name in ('ours', 'sb3'):
        act, result = train_ours(s, section) if name == 'ours' else train_sb3(s, section, vec)
        start = time.perf_counter()
        result.update(evaluate(s, act))
        print(f'  {name}: trained in {result["wall_s"]:.1f} s, evaluated in '
              f'{time.perf_counter() - start:.1f} s; {load_line()}', flush=True)
        results[name] = result
    report(section, s, vec, results)
    notes(section, s)
    return results


def main() -> None:
    sections, settings, warm_up = parse_args()
    require_bench_packages()
    register_claw()
    for section in sections:
        run_section(section, settings[section], warm_up)


if __name__ == '__main__':
    main()
