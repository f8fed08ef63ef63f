"""System identification without efforts (a driver that reports none): the drive's Kd and the
joint's viscous damping act alike, so the fit identifies their sum, says so, and splits it by
its stated rule (the damping keeps its prior); Kp, rotor inertia and the delay are still
recovered from the motion alone (the issue's hidden robot on a stand, test_sysid.py)."""

from __future__ import annotations

import pytest

from claw_rl_ros.core.sim.robot import load_robot
from claw_rl_ros.core.sysid import fit
from test_sysid import assert_recovered, DELAY_STEPS, HIDDEN, simulate_hidden


@pytest.fixture(scope='module')
def trace(tmp_path_factory):
    return simulate_hidden(tmp_path_factory.mktemp('hidden'),
                           {g: HIDDEN for g in ('hip', 'thigh', 'calf')}, DELAY_STEPS, True)


@pytest.fixture(scope='module')
def nominal():
    return load_robot('claw_quadruped')


def test_without_efforts_kd_and_damping_are_one_sum_split_by_the_stated_rule(trace, nominal):
    result = fit.identify(trace.without_effort(), nominal, log=lambda *_: None)
    assert_recovered(result, {g: HIDDEN for g in ('hip', 'thigh', 'calf')}, DELAY_STEPS,
                     fields=('kp', 'armature'))
    prior = 0.05  # the URDF's joint damping
    for group, values in result.values.items():
        # What the motion can tell: the drive's and the joint's viscous terms together.
        total = values['kd'] + values['damping']
        assert abs(total / (HIDDEN.kd + HIDDEN.damping) - 1) <= 0.15, result.format()
        assert values['damping'] == pytest.approx(prior)  # the rule: damping keeps its prior
        # Friction is fitted too, less sharply without the drive's torque.
        assert abs(values['frictionloss'] / HIDDEN.frictionloss - 1) <= 0.3, result.format()
    text = result.format()
    assert 'act alike' in text and 'keeps its prior' in text and '(prior)' in text
    assert 'Kd + damping' in text
    assert 'damping' not in result.overlay().extra['fit']['fitted']
