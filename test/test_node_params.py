"""Node parameters are declared once (claw_rl_ros/core/params/node_config.py, declared on a node
by claw_rl_ros/nodes/node_params.py): every key a parameter
file under config/ or a graph gives a node is a declared field of that node's dataclass, with a
value of its type (rcl refuses a YAML ``3`` for a double parameter at start-up); the files
state only what differs from the defaults; every field has a description; and a running node
describes each parameter with it and its read-only flag, which rclpy then enforces."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
import shutil

from rcl_interfaces.msg import ParameterType
from rcl_interfaces.srv import DescribeParameters, GetParameters
from rclpy.parameter import Parameter, parameter_value_to_python
import pytest
import yaml

from claw_rl_ros.core.params.node_config import (ActorParams, default_of, PARAMETERS,
                                                 PolicyParams, SafetyParams, SimParams)
from claw_rl_ros.core.control.safety import SafetyConfig
from claw_rl_ros.launch_graph.description import resolve
from claw_rl_ros.launch_graph.graphs import GRAPHS
from claw_rl_ros.nodes.sim import sim_node
from claw_rl_ros.nodes.node_params import ros_type
from claw_rl_ros.nodes.policy.safety_io import QOS
from control_models import good_model
from ros_helpers import NodeProcess, ROOT

CONFIG = ROOT / 'config'
# config/*.yaml whose ros__parameters sections belong to other programs (ros2_control's).
FOREIGN = {'ros2_control_claw_quadruped.yaml'}
# A parameter-file key's last name (``/**/<name>``) -> the executable of that node of ours.
NODE_NAMES = {'sim_node': 'sim_node', 'policy_node': 'policy_node', 'trainer': 'trainer_node',
              'recorder_node': 'recorder_node'}
# Parameters rclpy itself declares on every node.
BUILTIN = {'use_sim_time': Parameter.Type.BOOL}


def fields_of(executable: str) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(PARAMETERS[executable])}


def problem(executable: str, name: str, value, defaults_too: bool) -> str | None:
    """Why ``value`` may not be given for parameter ``name`` of ``executable`` (None: fine).
    ``defaults_too``: a value equal to the field's default is a problem as well."""
    fields = fields_of(executable)
    if name not in fields and name not in BUILTIN:
        return f'{name} is no parameter of {executable} ({PARAMETERS[executable].__name__})'
    kind = BUILTIN[name] if name in BUILTIN else ros_type(PARAMETERS[executable], name)
    # The type rcl gives the value (an empty list fits any array parameter).
    got = Parameter.Type.from_parameter_value(value)
    if got != kind and not (value == [] and kind.name.endswith('_ARRAY')):
        return f'{name} = {value!r} is {got.name}; {executable} declares it {kind.name}'
    if defaults_too and name in fields and value == default_of(fields[name]):
        return f'{name} = {value!r} is the default: leave it out'
    return None


def yaml_problems(config: Path) -> tuple[list[str], list[str]]:
    """(problems, files checked) of every node parameter file in ``config``."""
    problems, checked = [], []
    for path in sorted(config.glob('*.yaml')):
        data = yaml.safe_load(path.read_text()) or {}
        sections = {key: value for key, value in data.items()
                    if isinstance(value, dict) and 'ros__parameters' in value}
        if not sections or path.name in FOREIGN:
            continue  # a training config, or ros2_control's nodes
        checked.append(path.name)
        for key, section in sections.items():
            name = key.rsplit('/', 1)[-1]
            if name not in NODE_NAMES:
                problems.append(f'{path.name}: section {key!r} is no node of ours; map it in '
                                'NODE_NAMES or list the file in FOREIGN')
                continue
            for param, value in (section['ros__parameters'] or {}).items():
                why = problem(NODE_NAMES[name], param, value, defaults_too=True)
                if why:
                    problems.append(f'{path.name} {key}: {why}')
    return problems, checked


def test_every_yaml_key_is_a_declared_parameter_of_its_type_and_not_its_default():
    problems, checked = yaml_problems(CONFIG)
    assert checked == ['deploy.yaml', 'policy_node.yaml', 'sim_node.yaml']
    assert not problems, problems


@pytest.mark.parametrize('mutation, words', [
    ({'no_such_key': 1}, 'no_such_key is no parameter of policy_node'),
    ({'tilt_limit': 1}, 'tilt_limit = 1 is INTEGER; policy_node declares it DOUBLE'),
    ({'joints': 'FL_hip_joint'}, 'joints = '),
    ({'stale_after_periods': 3.0}, 'stale_after_periods = 3.0 is the default'),
])
def test_the_yaml_check_names_a_bad_key(tmp_path, mutation, words):
    config = tmp_path / 'config'
    shutil.copytree(CONFIG, config)
    path = config / 'deploy.yaml'
    data = yaml.safe_load(path.read_text())
    data['/**/policy_node']['ros__parameters'].update(mutation)
    path.write_text(yaml.safe_dump(data))
    problems, _ = yaml_problems(config)
    assert len(problems) == 1 and words in problems[0], problems


def test_the_yaml_check_refuses_a_section_of_no_known_node(tmp_path):
    config = tmp_path / 'config'
    shutil.copytree(CONFIG, config)
    (config / 'other.yaml').write_text('/**/mystery_node:\n  ros__parameters:\n    a: 1\n')
    problems, checked = yaml_problems(config)
    assert 'other.yaml' in checked
    assert problems == ["other.yaml: section '/**/mystery_node' is no node of ours; map it in "
                        'NODE_NAMES or list the file in FOREIGN']


# Arguments that reach every branch of the graphs' parameter dicts.
VARIANTS = {'control': [{}, {'record': 'run.mcap', 'mode': 'lockstep'}],
            'deploy': [{}, {'gains_topic': '/fwd/gains', 'record': 'run.mcap'},
                       {'gains_source': 'declared', 'drive_kp': '30', 'drive_kd': '0.75'}],
            'train': [{}, {'actors': '1', 'num_envs': '16', 'control_actor': 'true'},
                      {'control_loop': 'false', 'overlap': 'true', 'trainer_threads': '2'}]}


def test_every_parameter_a_graph_gives_is_declared_with_its_type(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    problems, given = [], set()
    for name, graph in GRAPHS.items():
        for values in VARIANTS.get(name, [{}]):
            for node in resolve(graph, values):
                if not node.parameters:
                    continue
                assert node.executable in PARAMETERS, f'{node.executable}: no dataclass'
                for param, value in node.parameters.items():
                    given.add((node.executable, param))
                    why = problem(node.executable, param, value, defaults_too=False)
                    if why:
                        problems.append(f'graph {name} {node.fqn}: {why}')
    assert not problems, problems
    assert {exe for exe, _ in given} == set(PARAMETERS)
    assert ('sim_node', 'real_time_factor') in given


def test_the_graph_check_names_an_undeclared_parameter():
    assert problem('sim_node', 'publish_clok', True, False) == \
        'publish_clok is no parameter of sim_node (SimParams)'
    assert 'is STRING' in problem('trainer_node', 'time_budget_s', '60', False)


def test_the_train_graph_states_its_loop_speed_and_only_what_differs():
    *_, sim, _ = resolve(GRAPHS['train'], {})
    default = default_of(fields_of('sim_node')['real_time_factor'])
    assert sim.parameters['real_time_factor'] != default
    words = next(a.description for a in GRAPHS['train'].arguments
                 if a.name == 'real_time_factor')
    assert f'default ({default!r} = realtime)' in words and 'on purpose' in words
    assert 'publish_clock' not in sim.parameters  # on by default


def test_every_field_has_a_description_a_ros_type_and_a_default_of_it():
    for executable, cls in PARAMETERS.items():
        for f in dataclasses.fields(cls):
            where = f'{cls.__name__}.{f.name}'
            assert f.metadata['doc'].strip(), where
            assert isinstance(f.metadata['read_only'], bool), where
            default, kind = default_of(f), ros_type(cls, f.name)
            assert default == [] or Parameter.Type.from_parameter_value(default) == kind, where
            choices = f.metadata['choices']
            assert not choices or default in choices, where
        # Writable: only what the hot swap sets, and the sim's seed of the next episode.
        writable = {f.name for f in dataclasses.fields(cls) if not f.metadata['read_only']}
        allowed = {'model_path', 'model_sha256', 'episode_seed'}
        assert writable <= allowed, (executable, writable)
    assert {f.name for f in dataclasses.fields(SimParams)
            if not f.metadata['read_only']} == {'episode_seed'}
    assert {f.name for f in dataclasses.fields(PolicyParams)
            if not f.metadata['read_only']} == {'model_path', 'model_sha256'}


def test_the_safety_parameters_are_safety_configs_fields_with_its_defaults():
    fields = {f.name: f for f in dataclasses.fields(SafetyParams)}
    for f in dataclasses.fields(SafetyConfig):
        assert f.name in fields, f.name
        assert default_of(fields[f.name]) == (list(f.default) if f.name == 'sit_pose'
                                              else f.default)
        # One description, SafetyConfig's, shown by the node's parameter.
        assert fields[f.name].metadata['doc'] == f.metadata['doc'] and f.metadata['doc']
    assert ros_type(SafetyParams, 'sit_pose') == Parameter.Type.DOUBLE_ARRAY
    assert ros_type(SafetyParams, 'saturation_ticks') == Parameter.Type.INTEGER


def test_the_qos_choices_are_the_ones_the_nodes_map():
    choices = {f.name: f.metadata['choices'] for f in dataclasses.fields(SimParams)}
    assert set(choices['state_qos']) == set(sim_node.STATE_PUBLISH_QOS)
    policy = {f.name: f.metadata['choices'] for f in dataclasses.fields(PolicyParams)}
    assert set(policy['state_qos']) == set(QOS)


def describe(probe, node: str, names: list[str]):
    reply = probe.call(DescribeParameters, f'{node}/describe_parameters',
                       DescribeParameters.Request(names=names), timeout=60)
    return dict(zip(names, reply.descriptors))


def get(probe, node: str, name: str):
    reply = probe.call(GetParameters, f'{node}/get_parameters',
                       GetParameters.Request(names=[name]))
    return parameter_value_to_python(reply.values[0])


def test_a_running_node_describes_its_parameters_and_refuses_read_only_ones(
        ros_env, probe, robot, tmp_path):
    model = good_model(robot, tmp_path / 'a.onnx')
    policy = NodeProcess('policy_node', ros_env, tmp_path, {'use_sim_time': False})
    sim = NodeProcess('sim_node', ros_env, tmp_path, {'mode': 'lockstep'})
    try:
        fields = fields_of('policy_node')
        names = ['tilt_limit', 'model_sha256', 'model_path', 'joints', 'executor']
        for name, d in describe(probe, '/policy_node', names).items():
            assert d.description == fields[name].metadata['doc'], name
            assert d.read_only is fields[name].metadata['read_only'], name
        described = describe(probe, '/policy_node', ['joints', 'executor'])
        assert described['joints'].type == ParameterType.PARAMETER_STRING_ARRAY
        assert described['executor'].additional_constraints == \
            "one of ('events', 'single_threaded')"
        # Read-only: refused by rclpy, the value stays.
        reply = probe.set_parameter('/policy_node', 'tilt_limit', 0.5)
        assert not reply.successful
        assert reply.reason == 'Trying to set a read-only parameter: tilt_limit.'
        assert get(probe, '/policy_node', 'tilt_limit') == SafetyConfig.tilt_limit
        # Writable: the hot swap's parameters reach the node's own callback.
        reply = probe.set_parameter('/policy_node', 'model_path', str(model))
        assert reply.successful, reply.reason
        reply = probe.set_parameter('/policy_node', 'model_sha256', 'abc123')
        assert not reply.successful and 'read-only' not in reply.reason, reply.reason
        # sim_node has no callback of its own: the descriptor alone refuses.
        d = describe(probe, '/sim_node', ['mode'])['mode']
        assert d.read_only and d.description == fields_of('sim_node')['mode'].metadata['doc']
        reply = probe.set_parameter('/sim_node', 'mode', 'realtime')
        assert reply.reason == 'Trying to set a read-only parameter: mode.'
        assert get(probe, '/sim_node', 'mode') == 'lockstep'
    finally:
        codes = {p.name: p.stop() for p in (policy, sim)}
    assert codes == {'policy_node': 0, 'sim_node': 0}, policy.log + sim.log


def test_a_parameter_of_the_wrong_type_is_refused_by_name_without_a_traceback(
        ros_env, tmp_path):
    trainer = NodeProcess('trainer_node', ros_env, tmp_path, {'time_budget_s': 120})
    assert trainer.wait_exit(60) == 1
    trainer.stop()
    assert 'refusing to start: parameter time_budget_s' in trainer.log, trainer.log
    assert "expecting type 'DOUBLE'" in trainer.log and 'Traceback' not in trainer.log


@pytest.mark.parametrize('make, words', [
    (lambda: SimParams(pause_after_s=600.5), 'parameter pause_after_s = 600.5; use 0 (never)'),
    (lambda: SimParams(pause_after_s=float('nan')), 'parameter pause_after_s = nan'),
    (lambda: SimParams(episode_seed=-2), 'parameter episode_seed = -2; use -1 (one stream)'),
    (lambda: SimParams(seed=-3), 'parameter seed = -3; use an integer >= 0'),
    (lambda: SimParams(diagnostics_period_s=0.0), 'parameter diagnostics_period_s = 0.0; use'),
    (lambda: PolicyParams(diagnostics_period_s=float('inf')),
     'parameter diagnostics_period_s = inf; use 0.05 to 60 s'),
    (lambda: SimParams(command_timeout_s=float('nan')), 'parameter command_timeout_s = nan; use'),
    (lambda: SimParams(command_timeout_s=0.0), 'parameter command_timeout_s = 0.0; use seconds'),
    (lambda: SimParams(command_timeout_s=61.0), 'parameter command_timeout_s = 61.0; use'),
    (lambda: SimParams(real_time_factor=float('inf')), 'parameter real_time_factor = inf; use'),
    (lambda: SimParams(real_time_factor=float('nan')), 'parameter real_time_factor = nan; use'),
    (lambda: PolicyParams(max_model_bytes=0), 'parameter max_model_bytes = 0; use a size cap'),
    (lambda: ActorParams(max_model_bytes=-1), 'parameter max_model_bytes = -1; use a size cap'),
])
def test_the_episode_and_status_parameters_refuse_a_bad_value_by_name(make, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        make()
    assert SimParams(pause_after_s=600.0, episode_seed=0).pause_after_s == 600.0
    assert SimParams(command_timeout_s=60.0, real_time_factor=100.0).command_timeout_s == 60.0
    assert PolicyParams(max_model_bytes=1).max_model_bytes == 1
