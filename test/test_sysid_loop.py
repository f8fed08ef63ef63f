"""The whole system-identification loop on hidden robots over real topics (test/sysid_loop.py):
a lockstep sim_node with parameters nobody tells sysid, the policy node's excitation on a stand
and on the ground, the recorder's MCAP, ``claw-rl sysid``: every parameter within +-15 % and
the delay within one physics step; the fitted overlay loads as a robot."""

from __future__ import annotations

import pytest
import yaml

from claw_rl_ros.core.sim.robot import load_robot
from sysid_loop import compare, run_loop, table


def hidden_overlay(path, groups, delay_s):
    path.write_text(yaml.safe_dump({'joint_groups': groups, 'action_delay_s': delay_s}))
    return path


def issue_robot():
    """The issue's example (Kp x0.8, Kd x1.6, frictionloss 0.3 N m, armature x3, 10 ms) with
    the joints' damping x2: at the URDF's 0.05 it is 4 % of Kd + damping and comes back 3-14 %
    off from run to run (docs/sysid.md), too close to the limit for a test."""
    one = {'kp': 24.0, 'kd': 1.2, 'frictionloss': 0.3, 'damping': 0.1, 'armature': 0.03}
    return {g: dict(one) for g in ('hip', 'thigh', 'calf')}, 0.010


def own_robot():
    """Groups that differ from each other, a stiffer hip, a heavier calf rotor, 15 ms."""
    return {'hip': {'kp': 36.0, 'kd': 0.6, 'frictionloss': 0.1, 'damping': 0.1,
                    'armature': 0.02},
            'thigh': {'kp': 27.0, 'kd': 0.9, 'frictionloss': 0.2, 'damping': 0.08,
                      'armature': 0.015},
            'calf': {'kp': 25.0, 'kd': 1.0, 'frictionloss': 0.25, 'damping': 0.06,
                     'armature': 0.04}}, 0.015


@pytest.mark.parametrize('variant, robot_of', [('stand', issue_robot), ('ground', own_robot)])
def test_sysid_recovers_a_hidden_robot_over_real_topics(ros_env, tmp_path, variant, robot_of):
    groups, delay = robot_of()
    hidden = hidden_overlay(tmp_path / 'hidden.yaml', groups, delay)
    result = run_loop(ros_env, tmp_path / 'loop', hidden, variant=variant)
    assert result.returncode == 0, result.output
    rows = compare(hidden, result.overlay)
    print(table(rows))
    for row in rows:
        if row['name'] == 'action_delay_s':
            assert abs(row['error_steps']) <= 1.0, table(rows)
        else:
            assert abs(row['relative_error']) <= 0.15, (row['name'], table(rows))
    # The fit is an overlay every consumer loads.
    assert load_robot(overlay=result.overlay).source['overlay'] == str(result.overlay)
