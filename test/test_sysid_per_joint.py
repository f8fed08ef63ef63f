"""``--per-joint`` system identification: a hidden robot whose front-left calf is not like the
others (1.5 times the friction and the rotor inertia, 3/4 of the Kp) is fitted joint by
joint on a stand, and that calf's numbers come back within 15 % beside its siblings'."""

from __future__ import annotations

from dataclasses import replace

from claw_rl_ros.core.sim.robot import load_robot
from claw_rl_ros.core.sysid import fit
from test_sysid import DELAY_STEPS, HIDDEN, simulate_hidden

ODD = replace(HIDDEN, kp=18.0, frictionloss=0.45, armature=0.045)


def test_per_joint_fit_finds_the_odd_calf(tmp_path):
    groups = {'hip': HIDDEN, 'thigh': HIDDEN, 'calf': HIDDEN, 'FL_calf_joint': ODD}
    trace = simulate_hidden(tmp_path, groups, DELAY_STEPS, stand=True, chirp_s=1.0,
                            step_hold_s=0.3)
    result = fit.identify(trace, load_robot('claw_quadruped'), fit.SysidConfig(per_joint=True),
                          log=lambda *_: None)
    assert list(result.values) == list(load_robot('claw_quadruped').joint_names)
    assert abs(result.delay_steps - DELAY_STEPS) <= 1
    for joint, values in result.values.items():
        truth = ODD if joint == 'FL_calf_joint' else HIDDEN
        for name in fit.PARAMS:
            got, want = values[name], getattr(truth, name)
            assert abs(got / want - 1) <= 0.15, (joint, name, got, want, result.format())
    # The overlay keys every joint by its name.
    assert set(result.overlay().joint_groups) == set(result.values)
