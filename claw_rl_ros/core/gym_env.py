"""Compatibility path: ``claw_rl_ros.core.gym_env.register()`` as documented before the core was
grouped into sim/learning/deploy. The module lives in :mod:`claw_rl_ros.core.sim.gym_env`."""

from .sim.gym_env import ClawLocomotionGymEnv, ENV_ID, register

__all__ = ['ClawLocomotionGymEnv', 'ENV_ID', 'register']
