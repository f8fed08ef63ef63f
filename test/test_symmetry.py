"""Left/right mirror symmetry: derived from the URDF and checked, exact on observations of
mirrored physics states, refused when the robot is not symmetric, and PPO with augmentation or
a mirror loss learns a symmetric policy from one half of a symmetric task."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from claw_rl_ros.core import paths
from claw_rl_ros.core.config import ConfigError, from_dict
from claw_rl_ros.core.learning.learner import Learner
from claw_rl_ros.core.learning.networks import ActorCritic
from claw_rl_ros.core.learning.ppo import PPO
from claw_rl_ros.core.learning.mirror_augmentation import build_obs_mirror, ObsMirror
from claw_rl_ros.core.learning.train_config import (DistillationConfig, PPOConfig,
                                                    SymmetryConfig, TrainConfig)
from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.sim.observations import HEIGHT_SCAN, POLICY, POLICY_NOISE_FREE, PRIVILEGED
from claw_rl_ros.core.sim.env_config import observation_dims
from claw_rl_ros.core.sim.robot import load_robot
from claw_rl_ros.core.sim.symmetry import env_group_mirrors, mirror_physics_state
from claw_rl_ros.core.sim.mirror import SignedPermutation
from claw_rl_ros.core.sim.terrain import base_yaw, generate_terrain

STRIDER = Path(__file__).parent / 'robots' / 'strider' / 'strider.yaml'
TERRAIN_SCAN = {'terrain': {'enabled': True, 'height_scan': {'enabled': True}}}


def test_claw_mirror_is_derived_from_the_urdf(robot):
    m = robot.mirror
    assert m.joint_index.tolist() == [3, 4, 5, 0, 1, 2, 9, 10, 11, 6, 7, 8]
    # Hip (roll, axis x) joints change sign, thigh and calf (pitch, axis y) keep it.
    assert m.joint_sign.tolist() == [-1, 1, 1] * 4
    assert m.foot_index.tolist() == [1, 0, 3, 2]
    assert m.gait_shift == 0.5  # a trot: the mirrored clock is half a cycle on
    assert load_robot(STRIDER).mirror is None  # no mirror.swap: symmetry is off for it


def test_mirroring_twice_is_the_identity(robot):
    cfg = from_dict(EnvConfig, TERRAIN_SCAN, source='t')
    groups = env_group_mirrors(robot, cfg)
    dims = observation_dims(robot, cfg)
    assert set(groups) == set(dims) == {POLICY, POLICY_NOISE_FREE, PRIVILEGED, HEIGHT_SCAN}
    rng = np.random.default_rng(0)
    for name, perm in [*groups.items(), ('actions', robot.mirror.actions)]:
        x = rng.normal(size=(5, perm.dim)).astype(np.float32)
        assert perm.dim == dims.get(name, robot.num_joints)
        assert not np.allclose(perm(x), x), name  # a real map, not the identity
        np.testing.assert_array_equal(perm(perm(x)), x, err_msg=name)


def _mirror_worlds(env, n):
    """Worlds n..2n-1 become the mirror of worlds 0..n-1 (physics, clock, command, buffers)."""
    m, p = env.robot.mirror, env.physics
    qpos, qvel = mirror_physics_state(p.qpos[:n], p.qvel[:n], p.qadr, p.vadr, m)
    p.qpos[n:], p.qvel[n:] = qpos, qvel
    env.commands[n:] = env.commands[:n] * np.array([1.0, -1.0, -1.0])
    env.actions[n:] = m.actions(env.actions[:n])
    env.gait_phase[n:] = (env.gait_phase[:n] + m.gait_shift) % 1.0
    env.foot_contact[n:] = env.foot_contact[:n][:, m.foot_index]
    for key in ('friction', 'added_mass', 'motor_strength'):
        getattr(env, key)[n:] = getattr(env, key)[:n]
    env.com_offset[n:] = env.com_offset[:n] * np.array([1.0, -1.0, 1.0])
    targets = env.robot.action_to_target(env.actions)
    p.forward(np.arange(2 * n), targets)


def test_mirrored_observation_of_mirrored_physics_state_equals_observation(make_env):
    n = 6
    env = make_env(num_envs=2 * n)
    env.reset(seed=3)
    rng = np.random.default_rng(1)
    for _ in range(15):  # moving, tilted, with contacts and non-zero velocities
        env.step(rng.uniform(-1, 1, size=(2 * n, env.num_actions)).astype(np.float32))
    assert np.abs(env.physics.qvel[:n, 3:6]).max() > 0.1
    _mirror_worlds(env, n)
    obs = env._observe(env.robot_state())
    groups = env_group_mirrors(env.robot, env.cfg)
    for group in (POLICY_NOISE_FREE, PRIVILEGED):
        np.testing.assert_allclose(obs[group][n:], groups[group](obs[group][:n]), atol=2e-5,
                                   err_msg=group)


def test_height_scan_of_the_flipped_terrain_is_the_mirrored_scan(robot):
    cfg = from_dict(EnvConfig, TERRAIN_SCAN, source='t')
    terrain = generate_terrain(cfg.terrain, robot)
    # The world reflected about its grid's middle line y = yc.
    flipped = dataclasses.replace(terrain, heights=terrain.heights[:, ::-1].copy())
    lo, hi = terrain.extent
    yc = 0.5 * (lo[1] + hi[1])
    rng = np.random.default_rng(0)
    k = 200
    pos = np.stack([rng.uniform(lo[0] + 2, hi[0] - 2, k), rng.uniform(lo[1] + 2, hi[1] - 2, k),
                    rng.uniform(0.1, 0.4, k)], axis=1)
    yaw = rng.uniform(-np.pi, np.pi, k)
    scan = terrain.height_scan(pos, yaw)
    mirrored_pos = pos * np.array([1.0, -1.0, 1.0]) + np.array([0.0, 2 * yc, 0.0])
    mirrored = flipped.height_scan(mirrored_pos, -yaw)
    assert np.ptp(scan) > 0.05  # the scan sees terrain, not a plane
    np.testing.assert_allclose(mirrored, env_group_mirrors(robot, cfg)[HEIGHT_SCAN](scan),
                               atol=1e-5)
    assert base_yaw(np.array([[1.0, 0, 0, 0]]))[0] == 0.0


# ------------------------------------------------------------------------------- refusals
def _claw_variant(tmp_path, yaml_edit=None, urdf_edit=None):
    """A copy of the claw robot with its YAML dict and/or URDF text edited; loaded."""
    raw = yaml.safe_load(paths.config_path('robots/claw_quadruped.yaml').read_text())
    urdf = (paths.share_dir() / raw['robot']['model_file']).read_text()
    if urdf_edit is not None:
        old, new = urdf_edit
        assert old in urdf
        urdf = urdf.replace(old, new, 1)
    (tmp_path / 'robot.urdf').write_text(urdf)
    raw['robot']['model_file'] = 'robot.urdf'
    if yaml_edit is not None:
        yaml_edit(raw['robot'])
    path = tmp_path / 'robot.yaml'
    path.write_text(yaml.safe_dump(raw))
    return load_robot(path)


FR_HIP = '<origin xyz="0.17 -0.06 0" rpy="0 0 0"/>\n    <axis xyz="1 0 0"/>'
REFUSALS = {
    'partner': (lambda r: r['mirror'].update(swap={'FL_': 'XX_', 'RL_': 'RR_'}), None,
                ('mirror.swap', "'FL_hip_joint' mirrors to 'XX_hip_joint'")),
    'no_match': (lambda r: r['mirror'].update(swap={'LEFT': 'RIGHT'}), None,
                 ('mirror.swap', 'matches no joint name')),
    'default_pose': (lambda r: r['default_joint_pos'].__setitem__(3, 0.05), None,
                     ('mirror.swap', 'default_joint_pos', 'FL_hip_joint')),
    'stiffness': (lambda r: r.update(stiffness={'FL_hip_joint': 25.0, 'hip': 30.0, 'thigh': 30.0,
                                                'calf': 30.0}), None,
                  ('mirror.swap', 'stiffness', 'FL_hip_joint')),
    'gait': (lambda r: r['gait'].update(offsets=[0.0, 0.25, 0.5, 0.75]), None,
             ('gait.offsets', 'not mirror-symmetric')),
    'termination_list': (lambda r: r['termination_contact_bodies'].remove('FR_hip'), None,
                         ('termination_contact_bodies', "'FL_hip'")),
    'axis': (None, (FR_HIP, FR_HIP.replace('1 0 0', '0 0 1')), ('mirror.swap', 'axis')),
    'anchor': (None, (FR_HIP, FR_HIP.replace('-0.06', '-0.065')), ('mirror.swap', 'anchor')),
    'limits': (None, ('lower="-2.6" upper="-0.6" effort="28"',
                      'lower="-2.5" upper="-0.6" effort="28"'), ('mirror.swap', 'joint limits')),
    'mass': (None, ('<mass value="0.15"/>', '<mass value="0.17"/>'), ('mirror.swap', 'mass')),
    'imu': (None, ('<child link="imu_link"/>\n    <origin xyz="0 0 0" rpy="0 0 0"/>',
                   '<child link="imu_link"/>\n    <origin xyz="0 0 0" rpy="0 0 1.5708"/>'),
            ('imu_body', 'not symmetric')),
}


@pytest.mark.parametrize('case', sorted(REFUSALS))
def test_an_asymmetric_robot_is_refused_by_name(tmp_path, case):
    yaml_edit, urdf_edit, expected = REFUSALS[case]
    with pytest.raises(ConfigError) as info:
        _claw_variant(tmp_path, yaml_edit, urdf_edit)
    message = str(info.value)
    for part in expected:
        assert part in message, message


def test_the_unedited_variant_loads_with_its_mirror(tmp_path):
    assert _claw_variant(tmp_path).mirror is not None  # the refusals come from their edits


def test_symmetry_is_refused_without_a_mirror_and_for_sac():
    cfg = from_dict(TrainConfig, {'env': {'robot': str(STRIDER)},
                                  'ppo': {'symmetry': {'data_augmentation': True}}}, source='t')
    dims = observation_dims(load_robot(STRIDER), cfg.env)
    with pytest.raises(ConfigError, match=r'ppo\.symmetry.*strider.*declares no mirror'):
        build_obs_mirror(cfg, dims, 8)
    with pytest.raises(ConfigError, match=r'ppo\.symmetry.*PPO option'):
        from_dict(TrainConfig, {'algorithm': 'sac',
                                'ppo': {'symmetry': {'mirror_loss_coef': 0.1}}}, source='t')
    for coef in (-1.0, float('inf')):  # an infinite weight would turn every loss into inf
        with pytest.raises(ConfigError, match='mirror_loss_coef'):
            from_dict(TrainConfig, {'ppo': {'symmetry': {'mirror_loss_coef': coef}}}, source='t')


def test_learner_mirrors_every_terrain_group_and_refuses_wrong_sizes(robot):
    cfg = from_dict(TrainConfig, {'env': TERRAIN_SCAN, 'policy': {
        'critic_obs_groups': ['policy_noise_free', 'privileged', 'height_scan']},
        'ppo': {'symmetry': {'data_augmentation': True}}}, source='t')
    dims = observation_dims(robot, cfg.env)
    learner = Learner(cfg, dims, robot.num_joints)
    assert set(learner.alg.mirror.groups) == set(dims)
    plain = from_dict(TrainConfig, {}, source='t')
    assert Learner(plain, observation_dims(robot, plain.env), robot.num_joints).alg.mirror is None
    with pytest.raises(ConfigError, match=r"ppo\.symmetry.*'height_scan' has 10 values"):
        build_obs_mirror(cfg, {**dims, HEIGHT_SCAN: 10}, robot.num_joints)


# ------------------------------------------------------------------- PPO on a symmetric toy
def _best_action(obs):
    """A mirror-equivariant target: a*(x, -y) = mirror(a*(x, y)) with mirror (a0, a1) ->
    (a0, -a1)."""
    x, y = obs[:, 0], obs[:, 1]
    return torch.stack([0.5 * x + y.abs(), -2.0 * y], dim=1)


def _train_toy(symmetry, iterations=60, n=256):
    """One-step episodes on observations with y > 0 only; reward -|a - a*(o)|^2.

    Returns the mean absolute error of the policy mean on y < 0 (the half never seen) and on
    y > 0 (the half trained on)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    policy = ActorCritic(2, 2, 2, actor_hidden_dims=[32, 32], critic_hidden_dims=[32],
                         init_noise_std=0.5, normalize_obs=False,
                         actor_obs_groups=['policy'], critic_obs_groups=['policy'])
    cfg = from_dict(PPOConfig, {'symmetry': dataclasses.asdict(symmetry), 'entropy_coef': 0.0,
                                'learning_rate': 3e-3, 'schedule': 'fixed',
                                'num_mini_batches': 2}, source='t')
    ppo = PPO(policy, cfg, DistillationConfig(), generator=g)
    if symmetry.enabled:
        groups = {'policy': SignedPermutation(np.arange(2), np.array([1, -1], np.float32))}
        ppo.mirror = ObsMirror(groups, groups['policy'])
    steps = 4
    ppo.init_storage(steps, n, {'policy': 2}, 2)
    for _ in range(iterations):
        for _ in range(steps):
            obs = {'policy': torch.stack([torch.rand(n, generator=g) * 2 - 1,
                                          torch.rand(n, generator=g) + 0.05], dim=1)}
            actions = ppo.act(obs)
            reward = -(actions - _best_action(obs['policy'])).square().sum(-1)
            ppo.process_env_step(reward, torch.ones(n), torch.zeros(n), None)
        ppo.compute_returns(obs)
        losses = ppo.update()
    assert ('mirror_loss' in losses) == (symmetry.mirror_loss_coef > 0)
    test = torch.stack([torch.rand(2000, generator=g) * 2 - 1,
                        torch.rand(2000, generator=g) + 0.05], dim=1)
    with torch.no_grad():
        seen = (policy.act_inference({'policy': test}) - _best_action(test)).abs().mean()
        test[:, 1] *= -1
        unseen = (policy.act_inference({'policy': test}) - _best_action(test)).abs().mean()
    return float(unseen), float(seen)


def test_ppo_with_symmetry_learns_the_half_it_never_sees():
    plain_unseen, plain_seen = _train_toy(SymmetryConfig())
    aug_unseen, aug_seen = _train_toy(SymmetryConfig(data_augmentation=True))
    loss_unseen, loss_seen = _train_toy(SymmetryConfig(mirror_loss_coef=1.0))
    # Every variant fits the half it trains on; only the symmetric ones generalise to the other.
    assert max(plain_seen, aug_seen, loss_seen) < 0.25
    assert plain_unseen > 0.3
    assert aug_unseen < 0.2 * plain_unseen
    assert loss_unseen < 0.2 * plain_unseen
