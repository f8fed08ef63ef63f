"""Each launch file builds its graph from the same description as ``claw-rl up``.

``launch`` and ``launch_ros`` are not on PyPI, so this test gives the launch files recording
stand-ins for the handful of launch classes they use (same constructor keywords as the real
ones): it checks our translation (arguments declared with their defaults and choices; one Node
per resolved node with the same executable, name, namespace, parameter files, inline
parameters, remappings and arguments), not launch itself. ``ros2 launch`` with the real packages
was checked by hand (docs/control_loop.md).
"""

from pathlib import Path
import runpy
import sys
import types

import pytest

from claw_rl_ros.launch_graph import GRAPHS, resolve

ROOT = Path(__file__).resolve().parents[1]


class Recorded:
    """Base of the stand-ins: keeps the keyword arguments it was built with."""

    KEYWORDS: tuple[str, ...] = ()

    def __init__(self, *args, **kwargs):
        unknown = set(kwargs) - set(self.KEYWORDS)
        assert not unknown, f'{type(self).__name__} has no keyword {unknown}'
        self.args, self.kwargs = args, kwargs


class LaunchDescription(Recorded):
    pass


class DeclareLaunchArgument(Recorded):
    KEYWORDS = ('default_value', 'description', 'choices')


class OpaqueFunction(Recorded):
    KEYWORDS = ('function', 'args', 'kwargs')


class Shutdown(Recorded):
    KEYWORDS = ('reason',)


class Node(Recorded):
    KEYWORDS = ('executable', 'package', 'name', 'namespace', 'exec_name', 'parameters',
                'remappings', 'ros_arguments', 'arguments', 'output', 'on_exit', 'respawn',
                'respawn_delay')


class LaunchConfiguration:
    def __init__(self, name, default=None):
        self.name = name

    def perform(self, context):
        return context.launch_configurations[self.name]


@pytest.fixture
def fake_launch(monkeypatch):
    modules = {
        'launch': {'LaunchDescription': LaunchDescription},
        'launch.actions': {'DeclareLaunchArgument': DeclareLaunchArgument,
                           'OpaqueFunction': OpaqueFunction, 'Shutdown': Shutdown},
        'launch.substitutions': {'LaunchConfiguration': LaunchConfiguration},
        'launch_ros': {}, 'launch_ros.actions': {'Node': Node}}
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, 'claw_rl_ros.launch_graph.ros_launch', raising=False)


def launch(graph_name: str, overrides: dict[str, str]):
    """(declared arguments, Node actions) of launch/<graph>.launch.py for these values."""
    path = ROOT / 'launch' / f'{graph_name}.launch.py'
    description = runpy.run_path(str(path))['generate_launch_description']()
    entities = description.args[0]
    declared = [e for e in entities if isinstance(e, DeclareLaunchArgument)]
    opaque, = [e for e in entities if isinstance(e, OpaqueFunction)]
    # What launch does: declared defaults, overridden by name:=value from the command line.
    configs = {d.args[0]: d.kwargs['default_value'] for d in declared}
    context = types.SimpleNamespace(launch_configurations={**configs, **overrides})
    return declared, opaque.kwargs['function'](context)


def as_resolved(node: Node) -> tuple:
    kw = node.kwargs
    files = tuple(str(p) for p in kw['parameters'] if not isinstance(p, dict))
    inline = [p for p in kw['parameters'] if isinstance(p, dict)]
    return (kw['executable'], kw['name'], kw['namespace'], files, inline[0] if inline else {},
            tuple(kw['remappings']), tuple(kw['arguments']))


def expected(graph_name: str, overrides: dict[str, str]) -> list[tuple]:
    return [(n.executable, n.name, n.namespace, n.param_files, dict(n.parameters),
             n.remappings, n.arguments) for n in resolve(GRAPHS[graph_name], overrides)]


def test_there_is_one_launch_file_per_graph():
    assert sorted(p.name for p in (ROOT / 'launch').glob('*.launch.py')) == sorted(
        f'{name}.launch.py' for name in GRAPHS)


@pytest.mark.parametrize('graph_name', sorted(GRAPHS))
def test_launch_file_declares_the_graph_arguments(fake_launch, graph_name):
    declared, _ = launch(graph_name, {})
    graph = GRAPHS[graph_name]
    assert [(d.args[0], d.kwargs['default_value'], d.kwargs['choices'])
            for d in declared] == [(a.name, a.default, list(a.choices) or None)
                                   for a in graph.arguments]
    assert all(d.kwargs['description'] for d in declared)


@pytest.mark.parametrize('graph_name', sorted(GRAPHS))
def test_launch_file_starts_the_resolved_nodes_with_defaults(fake_launch, graph_name):
    _, nodes = launch(graph_name, {})
    assert [as_resolved(n) for n in nodes] == expected(graph_name, {})
    for node, resolved in zip(nodes, resolve(GRAPHS[graph_name], {})):
        assert node.kwargs['package'] == 'claw_rl_ros'
        if resolved.respawn:  # restarted by launch_ros; a Shutdown would end the launch first
            assert 'on_exit' not in node.kwargs
            assert (node.kwargs['respawn'], node.kwargs['respawn_delay']) == (
                True, resolved.respawn_delay)
        else:
            assert isinstance(node.kwargs['on_exit'], Shutdown)  # a node ending ends the launch
            assert 'respawn' not in node.kwargs


def test_deploy_launch_respawns_the_policy_node(fake_launch):
    _, (policy,) = launch('deploy', {})
    assert policy.kwargs['name'] == 'policy_node'
    assert policy.kwargs['respawn'] is True and policy.kwargs['respawn_delay'] > 0
    assert 'on_exit' not in policy.kwargs


def test_control_launch_arguments_reach_the_nodes(fake_launch, tmp_path, monkeypatch):
    model = tmp_path / 'student.onnx'
    model.write_bytes(b'onnx bytes')
    monkeypatch.chdir(tmp_path)
    overrides = {'model': 'student.onnx', 'mode': 'lockstep', 'namespace': 'robot1',
                 'use_sim_time': 'false'}
    _, nodes = launch('control', overrides)
    assert [as_resolved(n) for n in nodes] == expected('control', overrides)
    policy = nodes[1].kwargs
    assert policy['parameters'][-1]['model_path'] == str(model)
    assert policy['namespace'] == '/robot1'
    assert nodes[0].kwargs['parameters'][-1]['mode'] == 'lockstep'


def test_stand_launch_passes_its_arguments_on_the_command_line(fake_launch):
    _, (stand,) = launch('stand', {'seconds': '2.5', 'robot': 'claw_quadruped'})
    assert stand.kwargs['executable'] == 'claw_rl'
    assert stand.kwargs['arguments'] == ['stand', '--robot', 'claw_quadruped', '--seconds',
                                         '2.5']


def test_node_action_carries_remappings_and_arguments(fake_launch):
    from claw_rl_ros.launch_graph import Graph, NodeEntry
    from claw_rl_ros.launch_graph.ros_launch import node_action
    graph = Graph('g', 'test', (), lambda v: [NodeEntry(
        'policy_node', 'policy_node', parameters={'robot': 'claw_quadruped'},
        remappings=(('joint_commands', '/fwd/commands'),), arguments=('--flag',))])
    node, = resolve(graph)
    action = node_action(node)
    assert as_resolved(action) == (node.executable, node.name, node.namespace, (),
                                   {'robot': 'claw_quadruped'},
                                   (('joint_commands', '/fwd/commands'),), ('--flag',))


def test_a_composed_control_launch_is_one_unnamed_container(fake_launch, tmp_path, monkeypatch):
    """launch_ros adds ``-r __node:=<name>`` for a named Node, which in a container would
    rename every hosted node: the container goes unnamed, its nodes' parameters in its
    arguments, their parameter files as paths."""
    model = tmp_path / 'student.onnx'
    model.write_bytes(b'onnx bytes')
    monkeypatch.chdir(tmp_path)
    overrides = {'model': 'student.onnx', 'mode': 'lockstep', 'composed': 'true'}
    _, (box,) = launch('control', overrides)
    resolved, = resolve(GRAPHS['control'], overrides)
    assert box.kwargs['executable'] == 'node_container' and box.kwargs['name'] is None
    assert box.kwargs['arguments'] == list(resolved.arguments)
    assert [str(p) for p in box.kwargs['parameters']] == list(resolved.param_files)
    assert isinstance(box.kwargs['on_exit'], Shutdown)
