"""The graph description: what each graph and argument resolves to, and the errors it raises.

``claw-rl up`` and the launch files both start exactly these resolved nodes, so these are the
facts both share. The parameter-file rule is checked against rcl itself (a real rclpy process).
"""

import json
import re
from pathlib import Path
import subprocess
import sys

import pytest
import yaml

from claw_rl_ros.core import paths
from claw_rl_ros.core.config import ConfigError
from claw_rl_ros.core.learning.train_config import load_train_config, split_overrides
from claw_rl_ros.core.sim.sim_session import env_section
from claw_rl_ros.launch_graph import EXECUTABLES, Graph, GRAPHS, NodeEntry, resolve, ros_command
from claw_rl_ros.launch_graph.description import (Argument, composed, inline_params_yaml,
                                                  node_pattern_matches, normalize_namespace)

CONFIG = paths.share_dir() / 'config'


def by_name(nodes):
    return {node.name: node for node in nodes}


@pytest.fixture
def placeholder_model(tmp_path):
    """A ``student.onnx`` that is no model: the graph description does not read it."""
    path = tmp_path / 'student.onnx'
    path.write_bytes(b'not checked here: the policy node validates models')
    return path


def test_the_graphs_and_their_arguments():
    assert set(GRAPHS) == {'stand', 'sim', 'policy', 'control', 'train', 'deploy'}
    args = {name: [a.name for a in g.arguments] for name, g in GRAPHS.items()}
    assert args['control'] == ['robot', 'robot_overlay', 'model', 'mode', 'namespace',
                               'use_sim_time', 'record', 'composed']
    assert args['sim'] == ['robot', 'robot_overlay', 'mode', 'namespace', 'use_sim_time']
    assert args['policy'] == ['robot', 'robot_overlay', 'model', 'namespace', 'use_sim_time']
    assert args['stand'] == ['robot', 'seconds']
    # A robot overlay (claw-rl sysid) reaches every graph with a robot node but stand.
    assert [n for n, a in args.items() if 'robot_overlay' in a] == [
        'sim', 'policy', 'control', 'deploy', 'train']
    defaults = GRAPHS['control'].defaults()
    assert defaults == {'robot': 'claw_quadruped', 'robot_overlay': '', 'model': '',
                        'mode': 'realtime', 'namespace': '', 'use_sim_time': 'true',
                        'record': '', 'composed': 'false'}
    # A policy alone usually drives hardware: wall time unless told otherwise.
    assert GRAPHS['policy'].defaults()['use_sim_time'] == 'false'


def test_record_adds_a_recorder_writing_an_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nodes = resolve(GRAPHS['control'], {'record': 'run.mcap', 'namespace': 'r1'})
    assert [n.fqn for n in nodes] == ['/r1/recorder_node', '/r1/sim_node', '/r1/policy_node']
    assert nodes[0].module == 'claw_rl_ros.nodes.recorder_node'
    assert nodes[0].parameters == {'path': str(tmp_path / 'run.mcap'),
                                   'robot': 'claw_quadruped'}


def test_control_defaults_resolve_to_sim_and_policy_nodes():
    nodes = resolve(GRAPHS['control'])
    assert [(n.executable, n.name, n.namespace, n.fqn) for n in nodes] == [
        ('sim_node', 'sim_node', '/', '/sim_node'),
        ('policy_node', 'policy_node', '/', '/policy_node')]
    sim, policy = nodes
    assert sim.param_files == (str((CONFIG / 'sim_node.yaml').resolve()),)
    assert policy.param_files == (str((CONFIG / 'policy_node.yaml').resolve()),)
    assert dict(sim.parameters) == {'robot': 'claw_quadruped', 'mode': 'realtime',
                                    'publish_clock': True}
    assert dict(policy.parameters) == {'robot': 'claw_quadruped', 'model_path': '',
                                       'use_sim_time': True}
    assert sim.remappings == () and sim.arguments == () and not sim.exits
    assert sim.module == 'claw_rl_ros.nodes.sim.sim_node'
    assert policy.module == 'claw_rl_ros.nodes.policy.policy_node'


def test_every_argument_reaches_the_nodes(placeholder_model, tmp_path, monkeypatch):
    robot_yaml = tmp_path / 'my_robot.yaml'
    robot_yaml.write_text('robot: {}\n')
    monkeypatch.chdir(tmp_path)
    nodes = by_name(resolve(GRAPHS['control'], {
        'model': 'student.onnx', 'mode': 'lockstep', 'namespace': 'robot1/front',
        'use_sim_time': 'false', 'robot': 'my_robot.yaml'}))
    sim, policy = nodes['sim_node'], nodes['policy_node']
    # A relative model or robot path is made absolute: every process finds the same file.
    assert policy.parameters['model_path'] == str(placeholder_model)
    assert sim.parameters['robot'] == policy.parameters['robot'] == str(robot_yaml)
    assert sim.parameters['mode'] == 'lockstep'
    assert sim.parameters['publish_clock'] is False
    assert policy.parameters['use_sim_time'] is False
    assert sim.namespace == policy.namespace == '/robot1/front'
    assert sim.fqn == '/robot1/front/sim_node'
    # A robot name stays a name (the nodes look it up in config/robots/).
    policy = by_name(resolve(GRAPHS['policy'], {'robot': 'other_dog'}))['policy_node']
    assert policy.parameters['robot'] == 'other_dog'
    assert policy.parameters['use_sim_time'] is False


def test_sim_and_policy_graphs_hold_one_node_each(placeholder_model):
    sim, = resolve(GRAPHS['sim'], {'mode': 'lockstep'})
    assert (sim.name, sim.parameters['mode'], sim.parameters['publish_clock']) == (
        'sim_node', 'lockstep', True)
    policy, = resolve(GRAPHS['policy'], {'model': str(placeholder_model)})
    assert (policy.name, policy.parameters['model_path']) == ('policy_node',
                                                              str(placeholder_model))


def test_stand_is_a_one_shot_claw_rl_command():
    stand, = resolve(GRAPHS['stand'], {'seconds': '0.5'})
    assert (stand.executable, stand.name, stand.exits, stand.module) == (
        'claw_rl', 'stand', True, 'claw_rl_ros.cli')
    assert stand.arguments == ('stand', '--robot', 'claw_quadruped', '--seconds', '0.5')
    assert stand.parameters == {} and stand.param_files == ()


@pytest.mark.parametrize('values, key, words', [
    ({'modle': 'x.onnx'}, 'modle', 'unknown argument'),
    ({'mode': 'fast'}, 'mode', 'realtime, lockstep'),
    ({'model': 'missing.onnx'}, 'model', 'no such file'),
    ({'namespace': 'robot-1'}, 'namespace', 'not a valid ROS namespace'),
    ({'namespace': '1robot'}, 'namespace', 'not a valid ROS namespace'),
    ({'use_sim_time': 'yes'}, 'use_sim_time', 'true, false'),
])
def test_bad_arguments_are_named_with_the_fix(values, key, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        resolve(GRAPHS['control'], values)
    assert info.value.key == key and "graph 'control'" in info.value.source
    assert words in str(info.value)


def test_namespace_normalisation():
    assert normalize_namespace('') == '/'
    assert normalize_namespace('/') == '/'
    assert normalize_namespace('robot1') == '/robot1'
    assert normalize_namespace('/robot1/front/') == '/robot1/front'


def test_ros_command_is_launch_ros_order(placeholder_model):
    sim, policy = resolve(GRAPHS['control'], {'model': str(placeholder_model), 'namespace': 'r1'})
    cmd = ros_command(policy, '/tmp/inline.yaml')
    assert cmd == ['--ros-args', '-r', '__node:=policy_node', '-r', '__ns:=/r1',
                   '--params-file', policy.param_files[0], '--params-file', '/tmp/inline.yaml']
    # Inline parameters go into a file keyed by the node's full name, as launch_ros writes it.
    assert yaml.safe_load(inline_params_yaml(policy)) == {
        '/r1/policy_node': {'ros__parameters': dict(policy.parameters)}}
    stand, = resolve(GRAPHS['stand'])
    assert ros_command(stand, None) == [*stand.arguments, '--ros-args', '-r', '__node:=stand',
                                        '-r', '__ns:=/']
    with pytest.raises(ValueError):
        ros_command(sim, None)  # inline parameters need their file


def test_a_composed_control_loop_is_one_container_hosting_both_nodes_unrenamed(placeholder_model):
    sim, policy = resolve(GRAPHS['control'], {'model': str(placeholder_model), 'namespace': 'r1',
                                              'mode': 'lockstep'})
    container, = resolve(GRAPHS['control'], {'model': str(placeholder_model), 'namespace': 'r1',
                                             'mode': 'lockstep', 'composed': 'true'})
    assert (container.executable, container.name) == ('node_container', 'control_container')
    assert container.hosts == ('/r1/sim_node', '/r1/policy_node')
    assert container.param_files == sim.param_files + policy.param_files
    assert container.parameters == {}
    # Each node's inline parameters travel as its --node argument: nothing is lost or mixed.
    args = list(container.arguments)
    assert args[0::3] == ['--node', '--node'] and args[1::3] == ['sim_node', 'policy_node']
    assert [json.loads(a) for a in args[2::3]] == [dict(sim.parameters), dict(policy.parameters)]
    # Its --ros-args reach every node of the process: a __node remap would rename both.
    cmd = ros_command(container, None)
    assert cmd == [*args, '--ros-args', '-r', '__ns:=/r1', '--params-file',
                   container.param_files[0], '--params-file', container.param_files[1]]
    assert not any(a.startswith('__node:=') for a in cmd)


@pytest.mark.parametrize('entry, words', [
    (NodeEntry('sim_node', 'sim_node', remappings=(('imu', 'imu/data'),)), 'remappings would'),
    (NodeEntry('sim_node', 'sim_a'), 'a renamed node would'),
    (NodeEntry('claw_rl', 'claw_rl', arguments=('stand',), exits=True), 'arguments would'),
])
def test_a_node_whose_settings_would_reach_the_others_is_not_hosted(entry, words):
    graph = Graph('c', 'test', (), lambda v: [composed('box', [entry])])
    with pytest.raises(ConfigError, match=words) as info:
        resolve(graph)
    assert info.value.key == 'hosts' and "node 'box'" in info.value.source
    sim = NodeEntry('sim_node', 'sim_node')
    twice = Graph('c', 'test', (), lambda v: [composed('box', [sim, sim])])
    with pytest.raises(ConfigError, match='hosts each node once'):
        resolve(twice)


def test_remappings_follow_the_parameters():
    graph = Graph('remapped', 'test', (), lambda v: [NodeEntry(
        'policy_node', 'policy_node', parameters={'robot': 'claw_quadruped'},
        remappings=(('joint_commands', '/fwd/commands'), ('imu', 'imu/data')))])
    node, = resolve(graph)
    assert node.remappings == (('joint_commands', '/fwd/commands'), ('imu', 'imu/data'))
    assert ros_command(node, 'p.yaml')[-4:] == ['-r', 'joint_commands:=/fwd/commands',
                                                '-r', 'imu:=imu/data']


def test_a_graph_of_n_actors_is_one_entry():
    """The shape the training graph will have: N from an argument, unique names, namespace."""
    graph = Graph('train', 'trainer + N actors', (
        Argument('actors', '2', 'actor processes'), Argument('namespace', '', 'ns')),
        lambda v: [NodeEntry('claw_rl', 'trainer')] + [
            NodeEntry('sim_node', f'actor_{i}', parameters={'seed': i})
            for i in range(int(v['actors']))])
    nodes = resolve(graph, {'actors': '3', 'namespace': 'train'})
    assert [n.fqn for n in nodes] == ['/train/trainer', '/train/actor_0', '/train/actor_1',
                                      '/train/actor_2']
    assert [n.parameters.get('seed') for n in nodes] == [None, 0, 1, 2]


def test_entry_mistakes_are_caught():
    same = Graph('dup', 'test', (), lambda v: [NodeEntry('sim_node', 'a'),
                                               NodeEntry('policy_node', 'a')])
    with pytest.raises(ConfigError, match='/a is used twice'):
        resolve(same)
    unknown = Graph('unknown', 'test', (), lambda v: [NodeEntry('learner_node', 't')])
    with pytest.raises(ConfigError, match='learner_node.*not installed'):
        resolve(unknown)
    bad_name = Graph('bad', 'test', (), lambda v: [NodeEntry('sim_node', 'sim-node')])
    with pytest.raises(ConfigError, match='a node name is'):
        resolve(bad_name)
    missing = Graph('missing', 'test', (), lambda v: [NodeEntry(
        'sim_node', 'sim_node', param_files=('no_such_file.yaml',))])
    with pytest.raises(ConfigError, match='no_such_file.yaml does not exist'):
        resolve(missing)


def test_a_parameter_file_that_would_not_apply_is_an_error(tmp_path):
    """rcl ignores a section keyed ``sim_node`` for ``/robot1/sim_node``: say so, don't run."""
    plain = tmp_path / 'plain.yaml'
    plain.write_text('sim_node:\n  ros__parameters:\n    seed: 3\n')
    wild = tmp_path / 'wild.yaml'
    wild.write_text('/**/sim_node:\n  ros__parameters:\n    seed: 3\n')

    def graph(path):
        return Graph('g', 'test', (Argument('namespace', '', 'ns'),), lambda v: [
            NodeEntry('sim_node', 'sim_node', param_files=(str(path),))])
    assert resolve(graph(plain))[0].param_files == (str(plain),)
    assert resolve(graph(wild), {'namespace': 'robot1'})[0].param_files == (str(wild),)
    with pytest.raises(ConfigError, match=r'no section applies to /robot1/sim_node.*"/\*\*/'):
        resolve(graph(plain), {'namespace': 'robot1'})


def test_package_parameter_files_apply_to_their_nodes_in_any_namespace():
    for graph in GRAPHS.values():
        resolve(graph, {'namespace': 'robot1/front'} if any(
            a.name == 'namespace' for a in graph.arguments) else {})


CASES = [('sim_node', '/sim_node'), ('sim_node', '/r1/sim_node'),
         ('/**/sim_node', '/sim_node'), ('/**/sim_node', '/r1/a/sim_node'),
         ('/**', '/r1/sim_node'), ('/r1/sim_node', '/r1/sim_node'),
         ('/*/sim_node', '/r1/sim_node'), ('/*/sim_node', '/sim_node'),
         ('/r1/*', '/r1/policy_node'), ('/r1/*', '/r2/policy_node'),
         ('/**/policy_node', '/r1/sim_node')]


def test_node_pattern_rule_agrees_with_rcl(tmp_path, ros_env):
    """Each (key, node) pair: does rcl apply the section? Asked of a real rclpy process."""
    script = tmp_path / 'probe_params.py'
    script.write_text(
        'import json, sys\n'
        'import rclpy\n'
        'from rclpy.context import Context\n'
        'out = []\n'
        'for i, (key, fqn) in enumerate(json.loads(sys.argv[1])):\n'
        '    path = f"{sys.argv[2]}/p{i}.yaml"\n'
        '    open(path, "w").write(f"{key}:\\n  ros__parameters:\\n    probe: 7\\n")\n'
        '    ns, name = fqn.rsplit("/", 1)\n'
        '    ctx = Context()\n'
        '    rclpy.init(args=["x", "--ros-args", "--params-file", path], context=ctx)\n'
        '    node = rclpy.create_node(name, namespace=ns or "/", context=ctx)\n'
        '    out.append(node.declare_parameter("probe", 0).value == 7)\n'
        '    node.destroy_node()\n'
        '    rclpy.shutdown(context=ctx)\n'
        'print(json.dumps(out))\n')
    result = subprocess.run([sys.executable, str(script), json.dumps(CASES), str(tmp_path)],
                            capture_output=True, text=True, timeout=60, env=ros_env)
    assert result.returncode == 0, result.stderr
    applied = json.loads(result.stdout.strip().splitlines()[-1])
    assert applied == [node_pattern_matches(key, fqn) for key, fqn in CASES]
    assert applied.count(True) >= 5 and applied.count(False) >= 4  # both outcomes covered


def test_every_executable_is_a_module_with_main():
    import importlib
    for exe, module in EXECUTABLES.items():
        assert callable(importlib.import_module(module).main), exe
        assert (Path(__file__).resolve().parents[1] / 'scripts' / exe).is_file(), exe


def test_train_graph_is_a_trainer_pushing_to_n_actors_and_the_control_loop():
    trainer, *actors, sim, policy = resolve(GRAPHS['train'], {'actors': '3', 'num_envs': '64',
                                                              'namespace': 'lab'})
    assert (trainer.executable, trainer.fqn) == ('trainer_node', '/lab/trainer')
    assert [a.fqn for a in actors] == ['/lab/actor_0', '/lab/actor_1', '/lab/actor_2']
    # Relative push targets: the trainer resolves them in its own namespace.
    assert trainer.parameters['push_targets'] == ['actor_0', 'actor_1', 'actor_2',
                                                  'policy_node']
    assert trainer.parameters['chunks_per_iteration'] == 3
    # Actor seeds follow the config's runner.seed (train_ppo.yaml: 1), distinct per actor.
    assert [a.parameters['seed'] for a in actors] == [1000, 1001, 1002]
    assert {a.parameters['num_envs'] for a in actors} == {64}
    # The control loop: realtime sim on the training env, the policy node on its clock; the
    # robot is the config's unless the robot argument names another.
    assert (sim.fqn, policy.fqn) == ('/lab/sim_node', '/lab/policy_node')
    assert sim.parameters['mode'] == 'realtime' and policy.parameters['use_sim_time'] is True
    # The loop runs at half real time by default, leaving the cores to learning.
    assert sim.parameters['real_time_factor'] == 0.5
    assert sim.parameters['env_config'] == str((CONFIG / 'train_ppo.yaml').resolve())
    assert {n.parameters['robot'] for n in (trainer, *actors, sim, policy)} == \
        {'claw_quadruped'}
    robot_yaml = str((CONFIG / 'robots' / 'claw_quadruped.yaml').resolve())
    nodes = resolve(GRAPHS['train'], {'control_loop': 'false', 'robot': robot_yaml})
    assert [n.executable for n in nodes] == ['trainer_node', 'actor_node', 'actor_node']
    assert nodes[0].parameters['push_targets'] == ['actor_0', 'actor_1']
    assert {n.parameters['robot'] for n in nodes} == {robot_yaml}
    for bad in ({'actors': '0'}, {'actors': 'two'}, {'num_envs': '-1'}):
        with pytest.raises(ConfigError, match='not a whole number'):
            resolve(GRAPHS['train'], bad)
    with pytest.raises(ConfigError, match='control_loop'):
        resolve(GRAPHS['train'], {'control_loop': 'maybe'})
    for bad in ('0', '-1', 'fast'):
        with pytest.raises(ConfigError, match='real_time_factor'):
            resolve(GRAPHS['train'], {'real_time_factor': bad})
    for bad in ('-1', 'soon', 'nan'):
        with pytest.raises(ConfigError, match='time_budget.*not a number of seconds >= 0'):
            resolve(GRAPHS['train'], {'time_budget': bad})


def test_ppo_trains_synchronously_on_every_core_and_sac_overlapped_by_default():
    """overlap auto: synchronous for PPO (lag 0, the trainer on every core while the actors
    wait), overlapped for SAC (lag 2, the trainer on 1 thread while the actors collect)."""
    def trainer(**values):
        node, actor, _ = resolve(GRAPHS['train'], {'control_loop': 'false', **values})
        return (node.parameters['max_policy_lag'], actor.parameters['chunks_in_flight'],
                node.parameters['torch_threads'])
    assert trainer() == (0, 1, 0)
    assert trainer(config='train_sac.yaml') == (2, 2, 1)
    assert trainer(overlap='true') == (2, 2, 1)
    assert trainer(config='train_sac.yaml', overlap='false') == (0, 1, 0)
    # trainer_threads: a number is passed as given; anything else is refused by name.
    assert trainer(trainer_threads='1') == (0, 1, 1)
    assert trainer(overlap='true', trainer_threads='3') == (2, 2, 3)
    assert trainer(overlap='true', trainer_threads='0') == (2, 2, 0)
    for bad in ('-1', 'two', '1.5', '', '\u00b2', 'nan', '257', '100000'):
        with pytest.raises(ConfigError, match='trainer_threads.*neither a whole number'):
            trainer(trainer_threads=bad)
    with pytest.raises(ConfigError, match='overlap'):
        trainer(overlap='maybe')


def test_train_graph_actor_seeds_follow_the_configs_runner_seed(tmp_path):
    """Three seeds of the live job must not share their actors' env randomness."""
    seeds = {}
    for run_seed in (1, 2, 3):
        config = tmp_path / f'seed{run_seed}.yaml'
        config.write_text(f'runner:\n  seed: {run_seed}\n')
        _, *actors, _, _ = resolve(GRAPHS['train'], {'actors': '2', 'config': str(config)})
        seeds[run_seed] = [a.parameters['seed'] for a in actors]
    flat = [s for v in seeds.values() for s in v]
    assert len(set(flat)) == len(flat), seeds


def test_train_graph_set_is_checked_once_and_reaches_every_node(tmp_path):
    """`set` (claw-rl train --set) is parsed once, refused by key, and given to the trainer,
    the actors and the control loop, so all of them train and act on the same config."""
    text = "runner.seed=7 env.num_envs=32 'env.commands.lin_vel_x=[0.5, 0.5]'"
    trainer, *actors, sim, policy = resolve(GRAPHS['train'], {'actors': '2', 'set': text})
    assert trainer.parameters['overrides'] == text and sim.parameters['overrides'] == text
    assert [a.parameters['overrides'] for a in actors] == [text, text]
    assert [a.parameters['seed'] for a in actors] == [7000, 7001]  # the graph read them too
    assert split_overrides(text) == {'runner': {'seed': 7}, 'env': {
        'num_envs': 32, 'commands': {'lin_vel_x': [0.5, 0.5]}}}
    for bad, words in (('runner.no_such_key=1', 'no_such_key'), ('runner.seed', 'KEY=VALUE'),
                       ("'unclosed", 'KEY=VALUE'),
                       ('env.terrain.proportions=[0.5, 0.5]', r'not valid YAML.*\[1,2\]')):
        with pytest.raises(ConfigError, match=words):
            resolve(GRAPHS['train'], {'set': bad})
    # The nodes apply it with the same function the graph used.
    assert load_train_config('train_ppo.yaml', split_overrides(text)).env.num_envs == 32
    assert env_section(str(paths.config_path('train_ppo.yaml')),
                       split_overrides(text)).commands.lin_vel_x == (0.5, 0.5)


def test_repeated_set_options_of_claw_rl_up_add_up(capsys):
    """`claw-rl up train --set a --set b` applies both (a second --set replaced the first)."""
    from claw_rl_ros import cli
    assert cli.main(['up', 'train', '--print', '--set', 'runner.seed=7',
                     '--set', 'env.num_envs=32 runner.max_iterations=3']) == 0
    out = capsys.readouterr().out
    assert out.count('overrides: runner.seed=7 env.num_envs=32 runner.max_iterations=3') >= 3
    assert '7000' in out  # the actors' seeds follow runner.seed: the graph read it too
    assert cli.main(['up', 'train', '--print']) == 0
    assert 'runner.seed' not in capsys.readouterr().out


def test_train_graph_control_actor_makes_the_loop_an_actor():
    trainer, actor, sim, policy = resolve(GRAPHS['train'], {'actors': '1', 'num_envs': '16',
                                                            'control_actor': 'true'})
    # Training mode on both sides; the sim steps the training env as the actors do.
    assert sim.parameters['training'] is True and policy.parameters['training'] is True
    assert sim.parameters['mode'] == 'realtime'  # lockstep on request (tests)
    assert {k: sim.parameters[k] for k in ('randomization', 'pushes', 'noise')} == \
        {'randomization': True, 'pushes': True, 'noise': True}
    assert sim.parameters['env_config'] == str((CONFIG / 'train_ppo.yaml').resolve())
    assert 'policy_node' in trainer.parameters['push_targets']
    # Only the batched actors' chunks start iterations.
    assert trainer.parameters['min_chunk_envs'] == 2
    assert trainer.parameters['chunks_per_iteration'] == 1
    # The loop's chunks on a topic of their own (they must not crowd the actors' queue).
    assert trainer.parameters['loop_chunk_topic'] == sim.parameters['chunk_topic'] == \
        '/control_loop/rollout_chunks'
    assert 'chunk_topic' not in actor.parameters  # the actors keep /rollout_chunks
    # Off by default: the loop serves the mean, every chunk counts.
    trainer, _, _, sim, policy = resolve(GRAPHS['train'], {'mode': 'lockstep'})
    assert sim.parameters['training'] is False and policy.parameters['training'] is False
    assert sim.parameters['mode'] == 'lockstep'
    assert trainer.parameters['min_chunk_envs'] == 1
    assert trainer.parameters['loop_chunk_topic'] == ''
    with pytest.raises(ConfigError, match='control_actor.*needs control_loop true'):
        resolve(GRAPHS['train'], {'control_actor': 'true', 'control_loop': 'false'})
    with pytest.raises(ConfigError, match='control_actor.*>= 2 worlds'):
        resolve(GRAPHS['train'], {'control_actor': 'true', 'num_envs': '1'})
    # SAC trains live with batched actors; the loop (PPO's Gaussian sampler) may not act.
    assert resolve(GRAPHS['train'], {'config': 'train_sac.yaml'})[0].parameters['config'] == \
        'train_sac.yaml'
    with pytest.raises(ConfigError, match="control_actor.*needs algorithm ppo .*'sac'"):
        resolve(GRAPHS['train'], {'config': 'train_sac.yaml', 'control_actor': 'true'})
    # Never on a robot: the deploy graph's policy node does not sample.
    for node in resolve(GRAPHS['deploy'], {}):
        assert not node.parameters.get('training', False)


def test_deploy_graph_is_the_policy_node_on_the_robots_controllers(placeholder_model, tmp_path):
    policy, = resolve(GRAPHS['deploy'], {'model': str(placeholder_model)})
    assert (policy.executable, policy.fqn) == ('policy_node', '/policy_node')
    assert policy.param_files == (str((CONFIG / 'policy_node.yaml').resolve()),
                                  str((CONFIG / 'deploy.yaml').resolve()))
    example = str((CONFIG / 'ros2_control_claw_quadruped.yaml').resolve())
    assert dict(policy.parameters) == {
        'robot': 'claw_quadruped', 'model_path': str(placeholder_model), 'use_sim_time': False,
        'autostart': False, 'require_verification': True, 'gains_source': 'sent',
        'state_qos': 'sensor_data', 'controllers_file': example,
        'command_controller': 'forward_position_controller'}
    assert policy.remappings == (
        ('joint_states', '/joint_states'), ('imu', '/imu_sensor_broadcaster/imu'),
        ('joint_commands', '/forward_position_controller/commands'), ('cmd_vel', '/cmd_vel'))
    # The deploy file turns the hardware defaults on over policy_node.yaml's simulation ones.
    deploy = yaml.safe_load((CONFIG / 'deploy.yaml').read_text())['/**/policy_node']
    assert deploy['ros__parameters']['use_sim_time'] is False
    assert deploy['ros__parameters']['autostart'] is False
    own = tmp_path / 'controllers.yaml'
    own.write_text('fwd:\n  ros__parameters:\n    joints: [a]\n')
    policy, = resolve(GRAPHS['deploy'], {
        'namespace': 'dog', 'imu_topic': 'imu/data', 'command_topic': '/fwd/commands',
        'gains_topic': '/fwd/gains', 'state_qos': 'reliable', 'controllers_file': str(own),
        'command_controller': 'fwd', 'require_verification': 'false'})
    assert policy.fqn == '/dog/policy_node'
    assert policy.remappings[1:3] == (('imu', 'imu/data'), ('joint_commands', '/fwd/commands'))
    assert policy.remappings[-1] == ('joint_gains', '/fwd/gains')
    assert policy.parameters['gains_source'] == 'sent'
    assert policy.parameters['require_verification'] is False
    assert policy.parameters['controllers_file'] == str(own)
    assert policy.parameters['state_qos'] == 'reliable'
    assert resolve(GRAPHS['deploy'], {'controllers_file': ''})[0].parameters[
        'controllers_file'] == ''
    # A driver that takes no gains declares its drives' (one number, or one per joint).
    policy, = resolve(GRAPHS['deploy'], {'gains_source': 'declared', 'drive_kp': '30',
                                         'drive_kd': '0.75, ' * 11 + '0.8'})
    assert policy.parameters['gains_source'] == 'declared'
    assert policy.parameters['drive_kp'] == [30.0]
    assert policy.parameters['drive_kd'] == [0.75] * 11 + [0.8]
    assert all(r[0] != 'joint_gains' for r in policy.remappings)
    for values, words in (({'drive_kp': 'thirty'}, "drive_kp: 'thirty': give numbers"),
                          ({'gains_source': 'declared', 'drive_kp': '-30', 'drive_kd': '1'},
                           'parameter drive_kp = [-30.0]: -30.0 is no gain'),
                          ({'drive_kp': '30', 'drive_kd': '1'},
                           'drive_kp / drive_kd given with gains_source sent'),
                          ({'gains_source': 'declared', 'gains_topic': '/fwd/gains'},
                           'gains_topic: \'/fwd/gains\' with gains_source declared'),
                          ({'gains_source': 'both'}, 'gains_source')):
        with pytest.raises(ConfigError, match=re.escape(words)):
            resolve(GRAPHS['deploy'], values)


def test_only_the_deploy_policy_node_and_the_train_actors_respawn(tmp_path):
    """If the policy node dies on the robot anyway, the deploy graph starts it again; so does
    the train graph an actor (no learning state lives there); every other node's death still
    ends its graph (the trainer's, the control loop's)."""
    policy, = resolve(GRAPHS['deploy'], {})
    assert policy.respawn and 0 < policy.respawn_delay <= 2.0
    recorder, policy = resolve(GRAPHS['deploy'], {'record': str(tmp_path / 'run.mcap')})
    assert policy.respawn and not recorder.respawn
    train = resolve(GRAPHS['train'], {'actors': '3'})
    assert [n.executable for n in train if n.respawn] == ['actor_node'] * 3
    assert all(0 < n.respawn_delay <= 2.0 for n in train if n.respawn)
    for name, graph in GRAPHS.items():
        if name not in ('deploy', 'train'):
            assert not any(node.respawn for node in resolve(graph, {})), name


@pytest.mark.parametrize('entry, key', [
    (NodeEntry('policy_node', 'p', respawn=True, exits=True), 'respawn'),
    (NodeEntry('policy_node', 'p', respawn=True, respawn_delay=-1.0), 'respawn_delay'),
    (NodeEntry('policy_node', 'p', respawn=True, respawn_delay=float('nan')), 'respawn_delay'),
])
def test_bad_respawn_settings_are_named(entry, key):
    with pytest.raises(ConfigError) as info:
        resolve(Graph('g', 'test', (), lambda v: [entry]))
    assert info.value.key == key


@pytest.mark.parametrize('values, key, words', [
    ({'command_topic': ' '}, 'command_topic', 'empty; give the topic name'),
    ({'controllers_file': 'nope.yaml'}, 'controllers_file', 'no such file'),
    ({'state_qos': 'fast'}, 'state_qos', 'sensor_data, reliable'),
    ({'require_verification': 'maybe'}, 'require_verification', 'true, false'),
])
def test_bad_deploy_arguments_are_named(values, key, words):
    with pytest.raises(ConfigError) as info:
        resolve(GRAPHS['deploy'], values)
    assert info.value.key == key and words in str(info.value)
