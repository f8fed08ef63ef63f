"""``claw-rl up <graph>``: run a graph of nodes without ROS launch (same description).

``claw-rl up control --model student.onnx`` starts what
``ros2 launch claw_rl_ros control.launch.py model:=student.onnx`` starts: the same executables'
modules, node names, namespace, parameter files, parameters and remappings
(claw_rl_ros.launch_graph). ``--print`` shows the command lines without starting anything.
"""

from __future__ import annotations

import argparse
import shlex

# Graph arguments whose option may be given several times; the values join with spaces
# (``--set a=1 --set b=2`` is ``set:='a=1 b=2'``), so a second one cannot silently replace
# the first.
REPEATABLE = ('set',)


def _cmd_up(args: argparse.Namespace) -> int:
    from ..launch_graph import GRAPHS, resolve
    from ..launch_graph.description import inline_params_yaml
    from ..launch_graph.graph_runner import command_line, GraphRunner
    graph = GRAPHS[args.graph]
    values = {arg.name: getattr(args, arg.name) for arg in graph.arguments}
    for arg in graph.arguments:
        if arg.name in REPEATABLE:
            values[arg.name] = ' '.join(values[arg.name] or [arg.default])
    nodes = resolve(graph, values)
    if args.print:
        for node in nodes:
            print(f'# {node.fqn}')
            print(shlex.join(command_line(node, None, log_level=args.log_level)))
            if node.parameters:
                print(inline_params_yaml(node), end='')
        return 0
    return GraphRunner(nodes, grace_s=args.grace_s, log_level=args.log_level).run()


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``up`` with one sub-command per graph, one option per graph argument."""
    from ..launch_graph import GRAPHS
    up = subparsers.add_parser('up', help='run a graph of ROS nodes (what the launch files '
                               'start), Ctrl-C stops it', description=__doc__)
    graphs = up.add_subparsers(dest='graph', required=True, metavar='GRAPH')
    for graph in GRAPHS.values():
        sub = graphs.add_parser(graph.name, help=graph.description,
                                description=graph.description)
        for arg in graph.arguments:
            if arg.name in REPEATABLE:
                sub.add_argument(f'--{arg.name}', dest=arg.name, action='append',
                                 default=None, help=f'{arg.description}; may be given several '
                                 'times (the values are joined)')
                continue
            sub.add_argument(f'--{arg.name.replace("_", "-")}', dest=arg.name,
                             default=arg.default, choices=arg.choices or None,
                             help=f'{arg.description} (default: {arg.default!r})')
        sub.add_argument('--grace-s', type=float, default=5.0,
                         help='seconds between SIGINT, SIGTERM and SIGKILL on shutdown')
        sub.add_argument('--log-level', choices=['debug', 'info', 'warn', 'error'],
                         help="the nodes' log level (default: their own, info); debug also "
                         'shows the per-push lines (models received, swapped, acknowledged) '
                         'and one line per training iteration')
        sub.add_argument('--print', action='store_true',
                         help='print the command lines and parameters, start nothing')
        sub.set_defaults(func=_cmd_up)
