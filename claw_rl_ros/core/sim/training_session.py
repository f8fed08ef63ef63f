"""The sim node's world in training mode: a 1-world VecLocomotionEnv behind SimSession's API.

The control-loop actor (sim_node + policy_node producing rollout chunks) takes rewards,
terminations, time-outs, noise-free and privileged observations and episode logs from the env's
own code, not from a second implementation. This session steps a 1-world
:class:`~.env.VecLocomotionEnv` whose physics is the one SimSession reads its sensors from, so
what the sim node publishes (readings with the sim's sensor noise, command time-outs) works as
with SimSession, while every control step is an env step:

- the env applies the joint targets the sim node received (the policy node's shaped command);
  the policy's sampled action feeds the env's last-action observation and action reward terms;
- :meth:`observe` first adopts the policy node's own memory (its last action and gait clock,
  which the env otherwise keeps itself), so the env's observation groups describe exactly the
  state and memory the policy acted on;
- :attr:`commands` are the env's velocity commands (resampled as in training), which the sim
  node publishes on cmd_vel for the policy node;
- randomisation, pushes (they need randomisation on, as in the env; not counted in
  ``pushes_done``) and resets at termination and time-out are the env's; the env's own
  observation noise is off (the sim adds sensor noise to the readings it publishes).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from .env import VecLocomotionEnv
from .env_config import EnvConfig
from .robot_spec import RobotSpec
from .sim_session import SimSession


@dataclass
class Transition:
    """One env step of the world: what a rollout chunk takes from the sim side.

    ``final_obs`` ({group: [dim]}) only when the episode timed out (truncated);
    ``episode`` ({key: [1]}: ``return``, ``length_s``, ``reward/<term>``) when it ended.
    """

    reward: float
    terminated: bool
    truncated: bool
    final_obs: dict[str, np.ndarray] | None
    episode: dict[str, np.ndarray] | None
    tracking_error: dict[str, float]
    diverged: int


class TrainingSession(SimSession):
    """A SimSession whose control steps are steps of a 1-world env (module docstring)."""

    def __init__(self, robot: RobotSpec, cfg: EnvConfig, *, randomization: bool = False,
                 pushes: bool = False, noise: bool = False, seed: int = 0,
                 command_timeout_s: float = 0.5):
        if cfg.policy_history != 1:
            raise ValueError(f'env.policy_history = {cfg.policy_history}: the control loop '
                             'pairs its steps with the env one observation at a time, so it '
                             'trains only students of env.policy_history 1 (train a student '
                             'with memory on the batched actors)')
        env_cfg = copy.deepcopy(cfg)
        env_cfg.num_envs, env_cfg.seed, env_cfg.noise.enabled = 1, seed, False
        env_cfg.randomization.enabled = randomization and cfg.randomization.enabled
        if not pushes:
            env_cfg.randomization.push_interval_s = 0.0
        self.env = VecLocomotionEnv(env_cfg, robot)
        self.episodes = 0
        super().__init__(robot, env_cfg, randomization=randomization, pushes=pushes,
                         noise=noise, seed=seed, command_timeout_s=command_timeout_s,
                         physics=self.env.physics)

    @property
    def commands(self) -> np.ndarray:
        """[3] the env's velocity command (vx, vy, yaw rate) of the current state."""
        return self.env.commands[0]

    @commands.setter
    def commands(self, value: np.ndarray) -> None:
        # A command set from outside holds as given (no heading steering) until a resample.
        self.env.commands[0] = value
        self.env.heading_target[0] = np.nan

    def observe(self, last_action: np.ndarray, gait_phase: float) -> dict[str, np.ndarray]:
        """{group: [dim]} of the current state with the policy node's memory: its [J] last
        action (clipped, as it observes it) and gait phase in [0, 1)."""
        env = self.env
        env.actions[0] = env.last_actions[0] = last_action
        if self.robot.gait_period > 0:
            env.gait_phase[0] = gait_phase
        return {g: v[0] for g, v in env.observe().items()}

    def transition(self, targets: np.ndarray, action: np.ndarray | None) -> Transition:
        """One env step applying [J] ``targets`` (spec order); [J] ``action`` is what the
        policy sampled (None: unknown, the targets' own action stands in)."""
        r = self.robot
        if action is None:
            action = (targets - r.default_joint_pos) / r.action_scale
        _, reward, terminated, truncated, extras = self.env.step(action[None], targets[None])
        self.time += self.control_dt
        self.steps += 1
        ended, timed_out = bool(terminated[0] or truncated[0]), bool(truncated[0])
        self.falls += int(terminated[0])
        if ended:
            self.episodes += 1
            self._note_params()
        return Transition(
            reward=float(reward[0]), terminated=bool(terminated[0]), truncated=timed_out,
            final_obs={g: v[0] for g, v in extras['final_obs'].items()} if timed_out else None,
            episode={k: v for k, v in extras['episode'].items() if k != 'env_ids'}
            if ended else None,
            tracking_error=extras['tracking_error'], diverged=int(extras['diverged']))

    def step(self, targets: np.ndarray) -> bool:
        """An env step without a known action; False: the env resets ended episodes itself."""
        self.transition(targets, None)
        return False

    def reset(self) -> None:
        """A fresh episode (the env's reset, randomisation and command); q0 held until the next
        command."""
        self.env.reset()
        self.targets = self.robot.default_joint_pos.copy()
        self._command_time = None
        self.resets += 1
        self._note_params()

    def _note_params(self) -> None:
        e = self.env
        self.latency_substeps = int(e.latency[0])
        self.episode_params = {'friction': float(e.friction[0]),
                               'added_mass': float(e.added_mass[0]),
                               'mass_scale': float(e.mass_scale[0]),
                               'motor_strength': float(e.motor_strength[0]),
                               'latency_ms': self.latency_substeps * self.robot.sim_dt * 1e3}

    def close(self) -> None:
        self.env.close()
