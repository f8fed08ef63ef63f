"""System identification on the ground (core/sysid, no ROS): the hidden robots stand on their
feet and run the ground excitation (0.08 rad; every hip, then every thigh, then every calf).
Without the trunk's odometry (a robot without a state estimator) the fit replays the recorded
commands from the robot put on its feet, the trunk as simulated; with it (the sim node's odom)
every short window starts from the recorded trunk. Either way every parameter comes back within
15 % and the delay within one physics step."""

from __future__ import annotations

from claw_rl_ros.core.sim.robot import load_robot
from claw_rl_ros.core.sysid import fit
from test_sysid import assert_recovered, DELAY_STEPS, HIDDEN, simulate_hidden
from test_sysid_own import OWN, OWN_DELAY


def test_ground_fit_recovers_the_issues_hidden_robot_without_odometry(tmp_path):
    truth = {g: HIDDEN for g in ('hip', 'thigh', 'calf')}
    trace = simulate_hidden(tmp_path, truth, DELAY_STEPS, stand=False, chirp_s=3.0)
    assert trace.variant == 'ground' and trace.base is not None
    # A robot without a state estimator: the trunk starts on its feet, then goes as simulated.
    trace.base = None
    result = fit.identify(trace, load_robot('claw_quadruped'), log=lambda *_: None)
    assert_recovered(result, truth, DELAY_STEPS)
    assert result.variant == 'ground'


def test_ground_fit_from_odometry_recovers_our_own_robot(tmp_path):
    trace = simulate_hidden(tmp_path, OWN, OWN_DELAY, stand=False, chirp_s=3.0)
    assert trace.base is not None  # the trunk's state, as the sim node's odometry gives it
    result = fit.identify(trace, load_robot('claw_quadruped'), log=lambda *_: None)
    assert_recovered(result, OWN, OWN_DELAY)
