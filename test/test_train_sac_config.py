"""config/train_sac.yaml: SAC on the claw quadruped loads, keeps PPO's task, and learns."""

import math

import pytest

from claw_rl_ros.core.learning.runner import OnPolicyRunner
from claw_rl_ros.core.learning.sac import SAC
from claw_rl_ros.core.learning.train_config import load_train_config
from claw_rl_ros.core.sim.robot import load_robot


def test_sac_config_trains_the_same_task_as_ppo_with_a_low_update_ratio():
    sac = load_train_config('train_sac.yaml')
    ppo = load_train_config('train_ppo.yaml')
    assert sac.algorithm == 'sac' and sac.gym_env == ''
    # The task is the PPO run's: robot, commands, episodes, rewards, time budget.
    assert sac.env.robot == ppo.env.robot
    assert sac.env.commands == ppo.env.commands and sac.env.rewards == ppo.env.rewards
    assert sac.env.episode_length_s == ppo.env.episode_length_s
    assert sac.runner.time_budget_s == ppo.runner.time_budget_s
    # Few gradient steps per transition (2 cores), the deployed actor as small as PPO's.
    transitions = sac.env.num_envs * sac.runner.num_steps_per_env
    assert sac.sac.utd_ratio * transitions == 64 and sac.sac.utd_ratio < 1.0
    assert sac.policy.actor_hidden_dims == ppo.policy.actor_hidden_dims
    assert sac.sac.buffer_size >= 100 * transitions and not sac.sac.checkpoint_replay


def test_sac_config_runs_updates_on_the_claw_env(tmp_path):
    cfg = load_train_config('train_sac.yaml', {
        'env': {'num_envs': 8, 'num_threads': 1},
        'sac': {'learning_starts': 200, 'batch_size': 32},
        'runner': {'num_steps_per_env': 16, 'max_iterations': 3, 'torch_threads': 1,
                   'time_budget_s': 0}})
    runner = OnPolicyRunner(cfg, tmp_path)
    assert isinstance(runner.alg, SAC)
    assert float(runner.policy.action_scale.max()) == pytest.approx(2.0)
    history = []
    runner.learn(lambda it, m: history.append(m))
    runner.close()
    # Iteration 1 fills learning_starts with random actions; then 0.0625 x 128 = 8 steps each.
    assert [m['updates'] for m in history] == [0.0, 8.0, 8.0]
    for key in ('critic_loss', 'actor_loss', 'q_mean', 'entropy'):
        assert math.isfinite(history[-1][key]), key
    # The temperature moved from its initial value.
    assert history[-1]['ent_coef'] != pytest.approx(cfg.sac.init_ent_coef, rel=1e-6)
    assert (tmp_path / 'checkpoints' / 'model_3.pt').is_file()


def test_sac_config_starts_with_an_entropy_bonus_below_the_task_reward():
    """The initial temperature times the entropy target (-|A| nats per step) stays below the
    most the task's positive terms pay per control step: at SB3's 1.0 it was two orders of
    magnitude above the task and SAC stood for a third of the budget (docs/sac_results.md)."""
    cfg = load_train_config('train_sac.yaml')
    robot = load_robot(cfg.env.robot)
    scales = cfg.env.rewards.scales
    task_per_step = sum(v for v in scales.values() if v > 0) * robot.control_dt
    bonus_per_step = cfg.sac.init_ent_coef * len(robot.joint_names)
    assert bonus_per_step < task_per_step, (bonus_per_step, task_per_step)
