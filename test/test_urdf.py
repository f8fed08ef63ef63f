"""URDF validity (check_urdf-style) on the shipped robot and on broken files."""

import re

import pytest

from claw_rl_ros.cli import main
from claw_rl_ros.core import paths
from claw_rl_ros.core.sim.urdf import check_urdf, load_urdf, UrdfError

URDF = paths.share_dir() / 'urdf' / 'claw_quadruped.urdf'

GOOD = '''<robot name="r">
  <link name="base"><inertial><mass value="1"/>
    <inertia ixx="0.1" ixy="0" ixz="0" iyy="0.1" iyz="0" izz="0.1"/></inertial></link>
  <link name="leg"><inertial><mass value="0.5"/>
    <inertia ixx="0.01" ixy="0" ixz="0" iyy="0.01" iyz="0" izz="0.01"/></inertial></link>
  <joint name="j" type="revolute"><parent link="base"/><child link="leg"/>
    <axis xyz="0 1 0"/><limit lower="-1" upper="1" effort="5" velocity="10"/></joint>
</robot>'''


def problems_of(tmp_path, text):
    path = tmp_path / 'r.urdf'
    path.write_text(text)
    return check_urdf(path)[1]


def test_shipped_urdf_is_valid_claw_quadruped():
    model, problems = check_urdf(URDF)
    assert problems == []
    assert model.root == 'trunk'
    actuated = [j for j in model.joints.values() if j.type == 'revolute']
    assert len(actuated) == 12
    # 5-12 kg, every actuated joint with position, effort and velocity limits.
    assert 5.0 <= model.total_mass <= 12.0
    for joint in actuated:
        assert joint.lower < joint.upper and joint.effort > 0 and joint.velocity > 0


def test_each_foot_ends_in_three_claw_tips():
    text = URDF.read_text()
    for leg in ('FL', 'FR', 'RL', 'RR'):
        link = re.search(rf'<link name="{leg}_foot">(.*?)</link>', text, re.S).group(1)
        assert link.count('<collision>') == 3
        assert link.count('<sphere') >= 3


def test_minimal_good_urdf(tmp_path):
    assert problems_of(tmp_path, GOOD) == []


@pytest.mark.parametrize('broken, expected', [
    (GOOD.replace('<parent link="base"/>', '<parent link="nowhere"/>'),
     "parent link 'nowhere' does not exist"),
    (GOOD.replace('lower="-1" upper="1"', 'lower="1" upper="-1"'), 'must be < upper'),
    (GOOD.replace(' effort="5"', ''), 'effort must be > 0'),
    (GOOD.replace('<limit lower="-1" upper="1" effort="5" velocity="10"/>', ''),
     'revolute joints need a <limit>'),
    (GOOD.replace('<mass value="0.5"/>', '<mass value="-0.5"/>'), 'mass must be > 0'),
    (GOOD.replace('ixx="0.01"', 'ixx="0.05"'), 'triangle rule'),
    (GOOD.replace('ixx="0.01"', 'ixx="-0.01"'), 'not positive definite'),
    (GOOD.replace('<link name="leg">', '<link name="base">'), 'defined twice'),
    (GOOD.replace('type="revolute"', 'type="hinge"'), "unknown type 'hinge'"),
    (GOOD.replace('<axis xyz="0 1 0"/>', '<axis xyz="0 0 0"/>'), 'axis must be non-zero'),
    (GOOD.replace('</robot>', '<link name="orphan"/></robot>'), 'exactly one root'),
    (GOOD.replace('<robot name="r">', '<robot>'), 'root element'),
    ('<robot name="r"><link name="a"></robot>', 'cannot parse'),
])
def test_broken_urdf_is_reported(tmp_path, broken, expected):
    problems = problems_of(tmp_path, broken)
    assert any(expected in p for p in problems), problems


def test_load_urdf_raises_with_every_problem(tmp_path):
    path = tmp_path / 'bad.urdf'
    path.write_text(GOOD.replace(' effort="5"', '').replace(' velocity="10"', ''))
    with pytest.raises(UrdfError) as err:
        load_urdf(path)
    assert 'effort' in str(err.value) and 'velocity' in str(err.value)


def test_check_urdf_cli(tmp_path, capsys):
    assert main(['check-urdf', str(URDF)]) == 0
    assert 'robot name is: claw_quadruped' in capsys.readouterr().out
    bad = tmp_path / 'bad.urdf'
    bad.write_text(GOOD.replace('<parent link="base"/>', '<parent link="x"/>'))
    assert main(['check-urdf', str(bad)]) == 1
    assert "parent link 'x' does not exist" in capsys.readouterr().out
