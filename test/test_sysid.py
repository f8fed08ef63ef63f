"""System identification on a stand (core/sysid, no ROS): a hidden robot, the sim with actuator
numbers the fit is not told (Kp x0.8, Kd x1.6, frictionloss 0.3 N m, damping x6, armature x3,
10 ms delay), runs the excitation with its trunk on a stand and is recorded at the control rate;
the fit recovers every parameter within 15 % and the delay within one physics step and writes an
overlay the robot loader takes. Recordings that cannot identify a parameter are refused by name;
the stand holds. (Without efforts: test_sysid_effortless.py; on the ground: test_sysid_ground.py,
test_sysid_own.py.)"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from claw_rl_ros.core.config import ConfigError, from_dict
from claw_rl_ros.core.control.excitation import from_params
from claw_rl_ros.core.params.node_config import SimParams
from claw_rl_ros.core.sim.env_config import EnvConfig
from claw_rl_ros.core.sim.robot import load_robot
from claw_rl_ros.core.sim.robot_overlay import (GroupParams, load_overlay, RobotOverlay,
                                                write_overlay)
from claw_rl_ros.core.sim.scene import STAND_LIFT
from claw_rl_ros.core.sim.sim_session import SimSession
from claw_rl_ros.core.sysid import fit, hidden_robot
from claw_rl_ros.core.sysid.sim_replay import PARAMS, Replayer
from claw_rl_ros.core.sysid.trace import check_trace

# The hidden robot: the claw's Kp 30 x0.8, Kd 0.75 x1.6, frictionloss 0.3 N m (URDF
# 0.02), damping 0.3 (URDF 0.05), armature 0.01 x3, a delay of 10 ms = 2 physics steps.
HIDDEN = GroupParams(kp=24.0, kd=1.2, frictionloss=0.3, damping=0.3, armature=0.03)
DELAY_STEPS = 2


def hidden_overlay(path, groups, delay_steps, sim_dt=0.005):
    """Write the hidden robot's overlay; returns its path."""
    return write_overlay(path, RobotOverlay(groups, delay_steps * sim_dt, {}))


def assert_recovered(result, truth: dict[str, GroupParams], delay_steps: int, fields=None):
    """Every fitted parameter within 15 % of the truth, the delay within one physics step."""
    assert abs(result.delay_steps - delay_steps) <= 1, result.format()
    for group, want in truth.items():
        for name in fields or fit.PARAMS:
            got, true = result.values[group][name], getattr(want, name)
            assert abs(got / true - 1) <= 0.15, f'{group}.{name}: {got} vs {true}\n' + \
                result.format()


def simulate_hidden(tmp_path, groups: dict[str, GroupParams], delay_steps: int, stand: bool,
                    **excitation):
    """The hidden robot of ``groups`` and ``delay_steps`` running the excitation (the
    variant's, with the fields ``excitation``), recorded."""
    path = hidden_overlay(tmp_path / 'hidden.yaml', groups, delay_steps)
    robot = load_robot('claw_quadruped', overlay=path)
    cfg = from_params({'variant': 'stand' if stand else 'ground', 'amplitude': 0,
                       **excitation}, robot)
    return hidden_robot.simulate(robot, delay_steps, stand=stand, excitation=cfg)


@pytest.fixture(scope='module')
def nominal():
    return load_robot('claw_quadruped')


@pytest.fixture(scope='module')
def trace(tmp_path_factory):
    """The hidden robot's excitation on a stand (24 s, per_group), recorded at 50 Hz."""
    return simulate_hidden(tmp_path_factory.mktemp('hidden'),
                           {g: HIDDEN for g in ('hip', 'thigh', 'calf')}, DELAY_STEPS, True)


def test_stand_fit_recovers_the_hidden_robot_and_writes_its_overlay(trace, nominal, tmp_path):
    result = fit.identify(trace, nominal, log=lambda *_: None)
    assert_recovered(result, {g: HIDDEN for g in ('hip', 'thigh', 'calf')}, DELAY_STEPS)
    # Tracking, the recorded commands replayed open loop: the fit follows the recording
    # several times closer than the robot as configured (stick-slip leaves some drift).
    assert np.all(result.rms_after < 0.25 * result.rms_before), result.format()
    assert np.all(result.effort_rms_after < 0.25 * result.effort_rms_before)
    text = result.format()
    for word in ('q RMS before', 'frictionloss', '+-', 'FL_calf_joint', '10.0 ms'):
        assert word in text
    # The overlay: the fit's numbers, the delay, the report; the robot loader merges it.
    path = write_overlay(tmp_path / 'fit.yaml', result.overlay())
    back = load_overlay(path)
    assert back.action_delay_s == pytest.approx(result.delay_steps * nominal.sim_dt)
    assert back.extra['fit']['groups']['hip'] == ['FL_hip_joint', 'FR_hip_joint',
                                                  'RL_hip_joint', 'RR_hip_joint']
    merged = load_robot('claw_quadruped', overlay=path)
    hips = [i for i, j in enumerate(merged.joint_names) if 'hip' in j]
    assert np.allclose(merged.kp[hips], result.values['hip']['kp'])
    assert np.allclose(merged.joint_frictionloss[hips], result.values['hip']['frictionloss'])
    assert merged.actuator.nominal_delay_steps == result.delay_steps


def test_a_replay_world_is_the_model_its_numbers_compile_to(trace, nominal, tmp_path):
    # The fit writes candidate numbers into copies of the nominal model; the constants MuJoCo
    # derives from them at compile time (the constraints' softness scales with the inverse
    # inertias) must follow, or the ground contacts of a candidate are not its robot's.
    groups = {g: HIDDEN for g in ('hip', 'thigh', 'calf')}
    path = hidden_overlay(tmp_path / 'h.yaml', groups, DELAY_STEPS)
    hidden = load_robot('claw_quadruped', overlay=path)
    for stand in (True, False):
        replay = Replayer(nominal, trace, 1, stand=stand)
        compiled = Replayer(hidden, trace, 1, stand=stand)
        try:
            replay.set_params({f: np.full((1, 12), getattr(HIDDEN, f)) for f in PARAMS})
            for name in ('dof_armature', 'dof_damping', 'dof_frictionloss', 'actuator_gainprm',
                         'actuator_biasprm', 'dof_invweight0', 'body_invweight0', 'dof_M0'):
                assert np.allclose(getattr(replay.models[0], name),
                                   getattr(compiled.model, name)), name
        finally:
            replay.close()
            compiled.close()


def bad(trace, **changes):
    """A copy of ``trace`` with fields replaced (arrays copied first)."""
    copy = replace(trace, **{k: np.array(v, copy=True) for k, v in vars(trace).items()
                             if isinstance(v, np.ndarray)})
    for name, change in changes.items():
        change(getattr(copy, name)) if callable(change) else setattr(copy, name, change)
    return copy


def test_recordings_that_cannot_identify_are_refused_by_name(trace, nominal):
    j = nominal.joint_names.index('RL_thigh_joint')
    i0, i1 = trace.window
    cases = [
        (bad(trace, effort=lambda e: e.__setitem__((500, j), np.nan)), 'joint_states.effort',
         'RL_thigh_joint is nan at t = '),
        (bad(trace, q=lambda q: q.__setitem__((40, 0), np.inf)), 'joint_states.position',
         'FL_hip_joint is inf'),
        (bad(trace, target=lambda t: t.__setitem__((slice(None), j), t[0, j])), 'RL_thigh_joint',
         'no excitation'),
        (bad(trace, t=lambda t: t.__setitem__(slice(300, None), t[300:] - 0.5)),
         'joint_states.header.stamp', 'goes back'),
        (bad(trace, t=lambda t: t.__setitem__(slice(300, None), t[300:] + 0.5)),
         'joint_states.header.stamp', 'jumps 0.520 s'),
        (bad(trace, window=(i0, i0 + 200)), 'recording', 'too short: 3.98 s'),
        (bad(trace, effort=lambda e: e.__setitem__((slice(i0, i1, 2), j), 18.0)),
         'RL_thigh_joint', 'saturated'),
    ]
    for broken, key, words in cases:
        with pytest.raises(ConfigError) as err:
            check_trace(broken, nominal)
        assert err.value.key == key and words in err.value.detail, (key, str(err.value))
        assert '\n' not in str(err.value)
    check_trace(trace, nominal)  # the recording itself passes
    with pytest.raises(ConfigError, match='stand or on the ground'):
        fit.identify(bad(trace, variant=''), nominal)


def test_a_stand_holds_the_trunk_and_never_falls(nominal):
    # Even where the env's failure conditions would call the trunk fallen (its height below
    # 5 m), a robot on a stand is not.
    cfg = from_dict(EnvConfig, {'num_envs': 1, 'termination': {'min_base_height': 5.0}})
    sim = SimSession(nominal, cfg, stand=True)
    try:
        start = sim.physics.qpos[0, :7].copy()
        assert start[2] == pytest.approx(STAND_LIFT * nominal.init_base_height)
        rng = np.random.default_rng(0)
        moved = []
        for _ in range(100):
            # Flailing legs (targets anywhere in the joint range) neither fall nor reset.
            assert not sim.step(rng.uniform(nominal.joint_lower, nominal.joint_upper))
            moved.append(sim.readings().joint_pos)
        assert sim.falls == 0 and sim.resets == 1
        assert np.abs(sim.physics.qpos[0, :7] - start).max() < 1e-4
        assert np.ptp(moved, axis=0).min() > 0.3
    finally:
        sim.close()
    # The sim node's parameter: a stand neither trains nor stands on terrain.
    assert from_dict(SimParams, {'on_stand': True}).on_stand
    for other in ({'training': True}, {'terrain': 'rough'}):
        with pytest.raises(ValueError, match='on_stand'):
            SimParams(on_stand=True, **other)
