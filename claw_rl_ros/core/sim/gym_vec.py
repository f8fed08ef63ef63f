"""Any continuous-action Gymnasium env as a batched env with :class:`VecLocomotionEnv`'s contract.

``GymVecEnv('InvertedPendulum-v5', num_envs=8)`` runs 8 copies in this process and exposes
``reset(seed) -> (obs, extras)`` and ``step(actions [N, A]) -> obs, reward [N] float32,
terminated [N] bool, truncated [N] bool, extras`` with ``obs = {'policy': float32 [N, obs_dim],
'policy_noise_free': the same array, 'privileged': float32 [N, 0]}``, so
:class:`~claw_rl_ros.core.learning.runner.OnPolicyRunner` trains on it unchanged.
Worlds that finish are reset inside ``step``; ``extras['final_obs']`` holds the observation they
ended in and ``extras['episode']`` their return and length.

The copies are stepped in a plain loop (what ``SyncVectorEnv`` with same-step autoreset does,
without building per-step info dicts): the cost per step is the env's own cost.
"""

from __future__ import annotations

from typing import Any, Callable

import gymnasium as gym
import mujoco
import numpy as np

from .observations import POLICY, POLICY_NOISE_FREE, PRIVILEGED

EnvSource = str | Callable[..., gym.Env]
# What a MuJoCo world needs to continue exactly: time, qpos, qvel, act, warm start, controls...
_MJ_STATE = mujoco.mjtState.mjSTATE_INTEGRATION


def make_env(source: EnvSource, env_kwargs: dict[str, Any] | None = None) -> gym.Env:
    """One env from a registered id (``gymnasium.make``) or a factory called with the kwargs."""
    kwargs = env_kwargs or {}
    if isinstance(source, str):
        return gym.make(source, **kwargs)
    if callable(source):
        return source(**kwargs)
    raise TypeError(f'env must be a Gymnasium id or a factory, got {type(source).__name__}')


def check_spaces(env: gym.Env, name: str) -> tuple[int, int]:
    """(obs_dim, num_actions) of a Box-observation, Box-action env; a clear error otherwise."""
    obs_space, act_space = env.observation_space, env.action_space
    if not isinstance(obs_space, gym.spaces.Box):
        raise TypeError(f'{name}: observation space {obs_space} is not a Box; GymVecEnv takes '
                        'flat Box observations only (flatten Dict/Tuple spaces with '
                        'gymnasium.wrappers.FlattenObservation first)')
    if not isinstance(act_space, gym.spaces.Box):
        raise TypeError(f'{name}: action space {act_space} is not a Box; GymVecEnv takes '
                        'continuous (Box) actions only')
    if not np.all(np.isfinite(act_space.low) & np.isfinite(act_space.high)):
        raise ValueError(f'{name}: action space {act_space} is unbounded; GymVecEnv clips the '
                         'policy\'s actions to the space, so it needs finite bounds')
    return int(np.prod(obs_space.shape)), int(np.prod(act_space.shape))


def find_wrapper(env: gym.Env, kind: type) -> gym.Wrapper | None:
    """The outermost wrapper of type ``kind`` around ``env`` (None if there is none)."""
    while isinstance(env, gym.Wrapper):
        if isinstance(env, kind):
            return env
        env = env.env
    return None


def _mujoco_parts(env: gym.Env) -> tuple[mujoco.MjModel, mujoco.MjData] | None:
    """(model, data) of a Gymnasium MuJoCo env, None for any other env."""
    u = env.unwrapped
    data = getattr(u, 'data', None)
    return (u.model, data) if isinstance(data, mujoco.MjData) else None


def get_world_state(env: gym.Env, name: str) -> dict[str, Any]:
    """One copy's resumable state: physics (MuJoCo integration state, or a classic-control
    env's ``state`` array), its random stream and the TimeLimit step count."""
    parts = _mujoco_parts(env)
    if parts is not None:
        model, data = parts
        physics = np.empty(mujoco.mj_stateSize(model, _MJ_STATE))
        mujoco.mj_getState(model, data, physics, _MJ_STATE)
    elif isinstance(getattr(env.unwrapped, 'state', None), (np.ndarray, tuple, list)):
        physics = np.array(env.unwrapped.state)
    else:
        raise NotImplementedError(
            f'{name}: cannot save the state of {type(env.unwrapped).__name__} for a checkpoint; '
            'GymVecEnv saves Gymnasium MuJoCo envs and envs whose unwrapped env keeps a numeric '
            '`state` (classic control). Train this env without checkpoints (call '
            'OnPolicyRunner.train_one_epoch instead of learn) or wrap it to expose `state`')
    limit = find_wrapper(env, gym.wrappers.TimeLimit)
    return {'physics': physics, 'rng': env.unwrapped.np_random.bit_generator.state,
            'elapsed_steps': -1 if limit is None else int(limit._elapsed_steps or 0)}


def set_world_state(env: gym.Env, state: dict[str, Any]) -> None:
    """Restore :func:`get_world_state` output into a copy made the same way."""
    parts = _mujoco_parts(env)
    physics = np.asarray(state['physics'])
    if parts is not None:
        model, data = parts
        mujoco.mj_setState(model, data, physics.astype(np.float64), _MJ_STATE)
        mujoco.mj_forward(model, data)
    else:
        env.unwrapped.state = physics.copy()
    env.unwrapped.np_random.bit_generator.state = state['rng']
    limit = find_wrapper(env, gym.wrappers.TimeLimit)
    if limit is not None:
        limit._elapsed_steps = int(state['elapsed_steps'])


class GymVecEnv:
    """``num_envs`` copies of a Gymnasium env behind the runner's vec-env contract.

    Args:
        env: a registered id (made with ``gymnasium.make(env, **env_kwargs)``) or a factory
            returning a fresh ``gymnasium.Env`` (called with ``**env_kwargs``).
        num_envs: copies stepped per call of :meth:`step`.
        seed: copy ``i`` is seeded with ``seed + i`` on the first :meth:`reset` without a seed.
        env_kwargs: keyword arguments of every copy.

    Observations are flattened Box observations ``[N, obs_dim]``; there are no privileged
    observations (``privileged_dim`` is 0). Actions ``[N, A]`` are clipped to the action space.
    """

    def __init__(self, env: EnvSource, num_envs: int, seed: int = 0,
                 env_kwargs: dict[str, Any] | None = None):
        if int(num_envs) < 1:
            raise ValueError(f'num_envs must be at least 1, got {num_envs}')
        self.num_envs = int(num_envs)
        self.base_seed = int(seed)
        self.name = env if isinstance(env, str) else getattr(env, '__name__', repr(env))
        first = make_env(env, env_kwargs)
        try:
            self.obs_dim, self.num_actions = check_spaces(first, self.name)
        except (TypeError, ValueError):
            first.close()
            raise
        self.envs = [first] + [make_env(env, env_kwargs) for _ in range(self.num_envs - 1)]
        self.privileged_dim = 0
        self.obs_dims = {POLICY: self.obs_dim, POLICY_NOISE_FREE: self.obs_dim, PRIVILEGED: 0}
        space = self.envs[0].action_space
        self.action_shape = space.shape
        self.action_low = np.broadcast_to(space.low, space.shape).reshape(-1).astype(np.float64)
        self.action_high = np.broadcast_to(space.high, space.shape).reshape(-1).astype(np.float64)
        self.action_dtype = space.dtype
        self.control_dt = float(getattr(self.envs[0].unwrapped, 'dt', 1.0))
        self.episode_step = np.zeros(self.num_envs, dtype=np.int64)
        self.episode_return = np.zeros(self.num_envs)
        self._obs = np.zeros((self.num_envs, self.obs_dim), dtype=np.float32)
        self._privileged = np.zeros((self.num_envs, 0), dtype=np.float32)
        self._seeded = False

    # ------------------------------------------------------------------------------ contract
    def reset(self, seed: int | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Start a new episode in every world; copy ``i`` is seeded with ``seed + i``.

        Without a seed, the first call uses the constructor's (or :meth:`seed`'s) seed; later ones
        continue each copy's random stream.
        """
        if seed is None and not self._seeded:
            seed = self.base_seed
        for i, env in enumerate(self.envs):
            obs, _ = env.reset(seed=None if seed is None else seed + i)
            self._obs[i] = np.ravel(obs)
        self._seeded = True
        self.episode_step[:] = 0
        self.episode_return[:] = 0.0
        return self._observation(self._obs), {}

    def seed(self, seed: int) -> None:
        """Seed copy ``i`` with ``seed + i`` at the next :meth:`reset` without a seed."""
        self.base_seed = int(seed)
        self._seeded = False

    def step(self, actions: np.ndarray):
        """Apply actions ``[N, A]`` (clipped to the action space) for one step in every world.

        Returns ``obs`` (dict of ``[N, dim]`` float32), ``reward [N]`` float32, ``terminated
        [N]`` bool, ``truncated [N]`` bool (time-outs that did not also terminate) and
        ``extras`` with ``time_outs``, ``diverged`` (always 0) and, when a world finished,
        ``final_obs`` (the obs it ended in; other rows hold their current obs) and ``episode``
        (``return``, ``length_s``, ``env_ids``, each ``[k]``).
        """
        actions = self._clip(actions)
        n = self.num_envs
        reward = np.zeros(n, dtype=np.float32)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        final: dict[int, np.ndarray] = {}
        for i, env in enumerate(self.envs):
            obs, r, term, trunc, _ = env.step(actions[i].reshape(self.action_shape))
            reward[i], terminated[i], truncated[i] = r, term, trunc and not term
            if term or trunc:
                final[i] = np.ravel(obs)
                obs, _ = env.reset()
            self._obs[i] = np.ravel(obs)
        self.episode_step += 1
        self.episode_return += reward
        extras: dict[str, Any] = {'time_outs': truncated, 'diverged': 0}
        if final:
            extras.update(self._finish(final))
        return self._observation(self._obs), reward, terminated, truncated, extras

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def get_state(self) -> dict[str, Any]:
        """Episode counters and every copy's physics, random stream and step limit count.

        Supported for Gymnasium MuJoCo envs and classic-control envs (a numeric ``state``);
        other envs raise NotImplementedError. Wrappers other than TimeLimit keep no state here.
        """
        return {'episode_step': self.episode_step.copy(),
                'episode_return': self.episode_return.copy(),
                'worlds': [get_world_state(env, self.name) for env in self.envs]}

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`get_state` output (from an adapter over the same env and num_envs)."""
        worlds = state['worlds']
        if len(worlds) != self.num_envs:
            raise ValueError(f'saved state has {len(worlds)} worlds, this env {self.num_envs}')
        if not self._seeded:
            self.reset()
        for env, world in zip(self.envs, worlds):
            set_world_state(env, world)
        self.episode_step[:] = np.asarray(state['episode_step'])
        self.episode_return[:] = np.asarray(state['episode_return'])

    # ----------------------------------------------------------------------------- internals
    def _observation(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        # A Gymnasium env adds no noise of ours: the noise-free group is the same observation.
        policy = obs.copy()
        return {POLICY: policy, POLICY_NOISE_FREE: policy, PRIVILEGED: self._privileged}

    def _clip(self, actions: np.ndarray) -> np.ndarray:
        """Actions ``[N, A]`` within the action space, in its dtype; non-finite ones refused."""
        actions = np.asarray(actions, dtype=np.float64)
        if actions.shape != (self.num_envs, self.num_actions):
            raise ValueError(f'actions have shape {actions.shape}, expected '
                             f'{(self.num_envs, self.num_actions)} (num_envs, num_actions)')
        if not np.isfinite(actions).all():
            rows = np.flatnonzero(~np.isfinite(actions).all(axis=1))
            raise ValueError(f'actions of worlds {rows.tolist()} are not finite (NaN/inf): the '
                             'policy has diverged')
        return np.clip(actions, self.action_low, self.action_high).astype(self.action_dtype)

    def _finish(self, final: dict[int, np.ndarray]) -> dict[str, Any]:
        """``final_obs`` and ``episode`` logs of the worlds in ``final``; resets their sums."""
        ids = np.fromiter(final, dtype=np.int64, count=len(final))
        final_obs = self._obs.copy()
        for i, obs in final.items():
            final_obs[i] = obs
        episode = {'return': self.episode_return[ids].copy(),
                   'length_s': self.episode_step[ids] * self.control_dt, 'env_ids': ids}
        self.episode_step[ids] = 0
        self.episode_return[ids] = 0.0
        return {'final_obs': self._observation(final_obs), 'episode': episode}
