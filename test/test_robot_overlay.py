"""The robot overlay (core/sim/robot_overlay.py): identified actuator numbers merged onto the
robot YAML reach the physics, re-centre the delay ranges, and bad overlays refuse by name."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from claw_rl_ros.core.config import ConfigError
from claw_rl_ros.core.sim.env import VecLocomotionEnv
from claw_rl_ros.core.sim.env_config import EnvConfig, RandomizationConfig
from claw_rl_ros.core.sim.physics import BatchedPhysics
from claw_rl_ros.core.sim.robot import load_robot
from claw_rl_ros.core.sim.robot_overlay import (GROUP_FIELDS, load_overlay,
                                                recentred_randomization, write_overlay)

HIDDEN = {'hip': {'kp': 24.0, 'kd': 1.2, 'frictionloss': 0.3, 'damping': 0.08,
                  'armature': 0.03},
          'thigh': {'kp': 27.0, 'kd': 0.9, 'frictionloss': 0.2, 'damping': 0.06,
                    'armature': 0.02},
          'calf': {'kp': 33.0, 'kd': 0.6, 'frictionloss': 0.1, 'damping': 0.04,
                   'armature': 0.015}}


def write(tmp_path, data, name='overlay.yaml'):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def overlay(delay=0.01, **extra):
    return {'joint_groups': {k: dict(v) for k, v in HIDDEN.items()}, 'action_delay_s': delay,
            **extra}


def group_of(joint: str) -> str:
    return next(g for g in HIDDEN if g in joint)


def test_overlay_numbers_reach_the_spec_and_the_physics(tmp_path):
    path = write(tmp_path, overlay())
    nominal, robot = load_robot(), load_robot(overlay=path)
    assert robot.source['overlay'] == str(path)
    for i, joint in enumerate(robot.joint_names):
        g = HIDDEN[group_of(joint)]
        assert (robot.kp[i], robot.kd[i]) == (g['kp'], g['kd'])
        assert robot.armature[i] == g['armature']
        assert robot.joint_frictionloss[i] == g['frictionloss']
        assert robot.joint_damping[i] == g['damping']
    # The compiled model carries them: PD gains on the actuators, the joint's own terms.
    model = BatchedPhysics(robot, 1).model
    vadr = np.array([model.jnt_dofadr[model.joint(j).id] for j in robot.joint_names])
    for name, column in (('frictionloss', model.dof_frictionloss),
                         ('damping', model.dof_damping), ('armature', model.dof_armature)):
        want = [HIDDEN[group_of(j)][name] for j in robot.joint_names]
        assert np.allclose(column[vadr], want), name
    assert np.allclose(model.actuator_gainprm[:12, 0], robot.kp)
    assert np.allclose(-model.actuator_biasprm[:12, 1], robot.kp)
    assert np.allclose(-model.actuator_biasprm[:12, 2], robot.kd)
    # The robot's delay range [0, 2] keeps its width, re-centred on the fitted 2 steps.
    assert nominal.actuator.delay_steps == (0, 2) and robot.actuator.delay_steps == (1, 3)
    # Without an overlay: the URDF's joint terms, as before.
    assert nominal.joint_frictionloss is None and nominal.joint_damping is None
    plain = BatchedPhysics(nominal, 1).model
    assert np.allclose(plain.dof_frictionloss[vadr], 0.02)
    assert np.allclose(plain.dof_damping[vadr], 0.05)


def test_zero_delay_keeps_the_range_at_zero(tmp_path):
    robot = load_robot(overlay=write(tmp_path, overlay(delay=0.0)))
    assert robot.actuator.delay_steps == (0, 2)


def test_env_delay_range_recentres_on_the_fit(tmp_path):
    path = write(tmp_path, overlay(delay=0.02))
    base = RandomizationConfig(action_latency_substeps=(0, 8))
    out = recentred_randomization(base, str(path), 0.005)
    assert tuple(out.action_latency_substeps) == (0, 8)  # 4 steps is already the middle
    out = recentred_randomization(base, str(write(tmp_path, overlay(delay=0.05), 'b.yaml')),
                                  0.005)
    assert tuple(out.action_latency_substeps) == (6, 14)
    # The overlay's own ranges win over the env's.
    own = write(tmp_path, overlay(randomization={'kp_scale': [0.9, 1.1]}), 'c.yaml')
    out = recentred_randomization(RandomizationConfig(), str(own), 0.005)
    assert tuple(out.kp_scale) == (0.9, 1.1)
    assert recentred_randomization(base, '', 0.005) is base


def test_env_built_with_an_overlay_uses_it(tmp_path):
    path = write(tmp_path, overlay(delay=0.05))
    cfg = EnvConfig(num_envs=2, num_threads=1, robot_overlay=str(path))
    cfg.randomization.action_latency_substeps = (0, 4)
    env = VecLocomotionEnv(cfg)
    try:
        assert env.robot.kp[0] == HIDDEN['hip']['kp']
        assert tuple(env.cfg.randomization.action_latency_substeps) == (8, 12)
    finally:
        env.close()


def test_write_then_load_round_trips(tmp_path):
    src = load_overlay(write(tmp_path, overlay(fit={'rms_before': 0.1})))
    out = write_overlay(tmp_path / 'out.yaml', src, header='fitted by a test\n\nline two')
    text = out.read_text()
    assert text.startswith('# fitted by a test\n#\n# line two\n')
    again = load_overlay(out)
    assert again.to_dict() == src.to_dict()
    assert list(again.to_dict())[:2] == ['joint_groups', 'action_delay_s']
    assert again.extra == {'fit': {'rms_before': 0.1}}


@pytest.mark.parametrize('mutate, words', [
    (lambda d: d.pop('action_delay_s'), ['action_delay_s', 'missing']),
    (lambda d: d.pop('joint_groups'), ['joint_groups', 'missing']),
    (lambda d: d.update(joint_groups={}), ['joint_groups']),
    (lambda d: d.update(joint_groups=[1, 2]), ['joint_groups']),
    (lambda d: d['joint_groups']['hip'].pop('armature'), ['joint_groups.hip.armature']),
    (lambda d: d['joint_groups']['hip'].update(kp=-1.0), ['joint_groups.hip.kp']),
    (lambda d: d['joint_groups']['hip'].update(kp=math.nan), ['joint_groups.hip.kp', 'NaN']),
    (lambda d: d['joint_groups']['thigh'].update(kd='abc'), ['joint_groups.thigh.kd']),
    (lambda d: d['joint_groups']['calf'].update(armature=50.0),
     ['joint_groups.calf.armature']),
    (lambda d: d['joint_groups']['calf'].update(speed=1.0), ['speed']),
    (lambda d: d.update(action_delay_s=-1), ['action_delay_s']),
    (lambda d: d.update(action_delay_s='abc'), ['action_delay_s']),
    (lambda d: d.update(action_delay_s=math.inf), ['action_delay_s']),
    (lambda d: d.update(randomization=3), ['randomization']),
])
def test_bad_overlays_refuse_by_name(tmp_path, mutate, words):
    data = overlay()
    mutate(data)
    with pytest.raises(ConfigError) as exc:
        load_robot(overlay=write(tmp_path, data))
    text = str(exc.value)
    assert '\n' not in text
    for word in words:
        assert word in text, (word, text)


def test_groups_must_cover_every_joint_once(tmp_path):
    data = overlay()
    data['joint_groups'].pop('calf')
    with pytest.raises(ConfigError, match='FL_calf_joint'):
        load_robot(overlay=write(tmp_path, data))
    # Two keys matching one joint alike are refused, naming both.
    data = overlay()
    data['joint_groups']['FL'] = dict(HIDDEN['hip'])
    with pytest.raises(ConfigError, match="'FL', 'hip'"):
        load_robot(overlay=write(tmp_path, data))
    # An exact joint name wins over its group (the per-joint fit writes those).
    data = overlay()
    data['joint_groups']['FL_hip_joint'] = dict(HIDDEN['hip'], kp=40.0)
    robot = load_robot(overlay=write(tmp_path, data))
    assert robot.kp[0] == 40.0 and robot.kp[3] == HIDDEN['hip']['kp']


@pytest.mark.parametrize('what', ['file', 'dir', 'not_mapping', 'empty'])
def test_unreadable_overlays_refuse_by_name(tmp_path, what):
    path = {'file': tmp_path / 'missing.yaml', 'dir': tmp_path,
            'not_mapping': write(tmp_path, '- 1\n- 2\n'),
            'empty': write(tmp_path, '')}[what]
    with pytest.raises(ConfigError) as exc:
        load_robot(overlay=path)
    assert '\n' not in str(exc.value)


def test_delay_beyond_the_delay_line_is_refused(tmp_path):
    with pytest.raises(ConfigError, match='action_delay_s'):
        load_robot(overlay=write(tmp_path, overlay(delay=0.9)))


def test_group_fields_are_the_issue_format():
    assert GROUP_FIELDS == ('kp', 'kd', 'frictionloss', 'damping', 'armature')


def test_every_consumer_takes_the_overlaid_robot(tmp_path):
    """The sim node's session re-centres its delay range, the PyBullet gate takes the joint
    friction and damping, and the deploy self-check does not compare the informational keys
    (the overlay's hash, the actuator) that a model trained with an equal overlay may differ
    in."""
    from claw_rl_ros.core.control.self_check import model_lines
    from claw_rl_ros.core.sim.sim_session import SimSession
    from claw_rl_ros.core.verify.second_engine import BulletWorld
    robot = load_robot(overlay=write(tmp_path, overlay(delay=0.05)))
    cfg = EnvConfig(num_envs=1)
    cfg.randomization.action_latency_substeps = (0, 4)
    session = SimSession(robot, cfg, randomization=True)
    try:
        assert tuple(session.cfg.randomization.action_latency_substeps) == (8, 12)
    finally:
        session.close()
    with BulletWorld(robot, fixed_base=True) as world:
        want = [HIDDEN[group_of(j)] for j in robot.joint_names]
        assert np.allclose(world.joint_friction, [g['frictionloss'] for g in want])
        assert np.allclose(world.joint_damping, [g['damping'] for g in want])
    meta = robot.to_metadata()
    meta['actuator'] = dict(meta['actuator'], delay_steps=[0, 9])
    meta['robot_overlay'] = {'sha256': 'another edit of the same numbers'}
    assert model_lines(robot, meta) == []
    meta['kp'] = [1.0] * robot.num_joints
    assert any('kp' in line for line in model_lines(robot, meta))


def test_the_fitted_delay_is_the_robots_delay_without_randomisation(tmp_path):
    """A hidden robot in the sim node (randomisation off) runs the overlay's delay: commands
    reach the motors 2 physics steps late, not at once."""
    from claw_rl_ros.core.sim.sim_session import SimSession
    robot = load_robot(overlay=write(tmp_path, overlay(delay=0.01)))
    assert robot.actuator.nominal_delay_steps == 2
    assert robot.to_metadata()['actuator']['nominal_delay_steps'] == 2
    assert 'nominal_delay_steps' not in load_robot().to_metadata()['actuator']
    session = SimSession(robot, EnvConfig(num_envs=1))
    try:
        assert session.latency_substeps == 2
    finally:
        session.close()
    cfg = EnvConfig(num_envs=2, num_threads=1, robot_overlay=str(tmp_path / 'overlay.yaml'))
    cfg.randomization.enabled = False
    env = VecLocomotionEnv(cfg)
    try:
        assert np.all(env.latency == 2)
        assert env.physics.max_delay_steps >= 2
    finally:
        env.close()
