"""Every declared parameter of every node has a value: ``ros2 param dump`` and ``ros2 param get``
work on each of them.

rclpy answers a whole ``get_parameters`` request with an empty list when one name in it has no
value (a parameter declared by type only), so ``ros2 param dump`` printed ``ros__parameters:
{}`` for sim_node and policy_node (their empty ``joints`` list). Each node here is asked, as
ros2cli asks it, for every name its ``list_parameters`` gives: as many values come back, each of
a type. An empty list parameter reads back as an empty list of its own type, whether it was left
out or given as ``[]`` (rcl's NOT_SET); the node still reads it as 'not given'.
"""

from __future__ import annotations

import subprocess
import sys

from rcl_interfaces.msg import ParameterType
from rcl_interfaces.srv import GetParameters, ListParameters
from rclpy.parameter import parameter_value_to_python
import pytest

from claw_rl_ros.core.sim.robot import load_robot
from control_models import good_model
from ros_helpers import NodeProcess, ROOT
from test_nodes_trainer import TINY_YAML


def dump(probe, node: str) -> dict:
    """{name: (ParameterType, python value)} of every parameter ``node`` lists, asked in one
    ``get_parameters`` request as ``ros2 param dump`` asks; fails unless each has a value."""
    names = sorted(probe.call(ListParameters, f'{node}/list_parameters',
                              ListParameters.Request(), timeout=90).result.names)
    values = probe.call(GetParameters, f'{node}/get_parameters',
                        GetParameters.Request(names=names), timeout=30).values
    assert len(names) > 1, (node, names)
    assert len(values) == len(names), f'{node}: {len(names)} names, {len(values)} values'
    unset = [n for n, v in zip(names, values) if v.type == ParameterType.PARAMETER_NOT_SET]
    assert not unset, f'{node}: no value for {unset}'
    return {n: (v.type, parameter_value_to_python(v)) for n, v in zip(names, values)}


def container(env, log_path, model) -> subprocess.Popen:
    """sim_node and policy_node (``joints`` given as ``[]``: NOT_SET) hosted by one
    node_container in namespace /composed (the recorder is not hostable: the container's
    EventsExecutor fails on its subscriptions)."""
    return subprocess.Popen(
        [sys.executable, '-m', 'claw_rl_ros.nodes.node_container',
         '--node', 'sim_node', '{"mode": "lockstep"}',
         '--node', 'policy_node', f'{{"model_path": "{model}", "joints": []}}',
         '--ros-args', '-r', '__ns:=/composed',
         '--params-file', str(ROOT / 'config' / 'sim_node.yaml')],
        cwd=ROOT, env=env, stdout=open(log_path, 'w'), stderr=subprocess.STDOUT)


@pytest.mark.parametrize('executable, name, params', [
    ('sim_node', 'sim_node', {'mode': 'lockstep'}),
    # joints:=[] on the command line is NOT_SET as rcl reads it: still a typed empty list.
    ('policy_node', 'policy_node', {'joints': []}),
    ('recorder_node', 'recorder_node', {'path': 'REC'}),
    ('trainer_node', 'trainer', {'config': 'TINY', 'run_dir': 'RUN'}),
    ('actor_node', 'actor', {'config': 'TINY', 'num_envs': 1}),
])
def test_a_node_process_gives_every_parameter_it_lists_a_value(
        ros_env, probe, tmp_path, executable, name, params):
    config = tmp_path / 'tiny.yaml'
    config.write_text(TINY_YAML)
    paths = {'REC': str(tmp_path / 'run.mcap'), 'TINY': str(config),
             'RUN': str(tmp_path / 'run')}
    params = {k: paths.get(v, v) if isinstance(v, str) else v for k, v in params.items()}
    node = NodeProcess(executable, ros_env, tmp_path, params)
    try:
        got = dump(probe, f'/{name}')
    finally:
        code = node.stop()
    assert code == 0, node.log
    assert got['use_sim_time'][0] == ParameterType.PARAMETER_BOOL
    lists = {'sim_node': 'joints', 'policy_node': 'joints', 'recorder_node': 'topics'}
    if executable in lists:  # an empty list: typed, and still 'not given'
        assert got[lists[executable]] == (ParameterType.PARAMETER_STRING_ARRAY, []), got


def test_every_node_a_container_hosts_gives_every_parameter_a_value(ros_env, probe, tmp_path):
    model = good_model(load_robot('claw_quadruped'), tmp_path / 'm.onnx')
    log = tmp_path / 'container.log'
    proc = container(ros_env, log, model)
    try:
        got = {node: dump(probe, f'/composed/{node}')
               for node in ('sim_node', 'policy_node')}
    finally:
        proc.send_signal(2)  # SIGINT
        code = proc.wait(timeout=30)
    assert code == 0, log.read_text()
    assert got['policy_node']['joints'] == (ParameterType.PARAMETER_STRING_ARRAY, [])
    assert got['policy_node']['model_path'][1] == str(model)
    assert got['sim_node']['mode'][1] == 'lockstep'


def test_the_verify_driver_gives_every_parameter_a_value(ros_env, probe):
    from claw_rl_ros.nodes.verify_driver import VerifyDriver
    driver = VerifyDriver(load_robot('claw_quadruped'), lambda: True, name='verify_driver_1')
    try:
        got = dump(probe, '/verify_driver_1')
    finally:
        driver.close()
    assert got['use_sim_time'] == (ParameterType.PARAMETER_BOOL, False)
