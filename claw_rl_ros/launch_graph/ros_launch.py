"""The graph description as a ROS launch description (imported by launch/*.launch.py only).

One ``DeclareLaunchArgument`` per graph argument, then an ``OpaqueFunction`` that reads their
values, resolves the graph with the same :func:`.description.resolve` as ``claw-rl up``, and
returns one ``launch_ros.actions.Node`` per resolved node: parameter files as paths, inline
parameters as a dict (launch_ros writes it to a file keyed by the node's full name), remappings
and arguments as given. A node that exits ends the launch (``on_exit=Shutdown``), as in the
runner; a one-shot node finishing does the same, because it is then the whole graph. A
``respawn`` node has no ``on_exit`` (a Shutdown there would end the launch before the restart):
launch_ros starts it again ``respawn_delay`` s after any exit until the launch shuts down.

Needs the ``launch`` and ``launch_ros`` packages (a ROS install); they are not on PyPI.
"""

from __future__ import annotations

from pathlib import Path

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction, Shutdown
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from .description import PACKAGE, resolve, ResolvedNode
from .graphs import GRAPHS


def node_action(node: ResolvedNode) -> Node:
    """The launch_ros Node that starts ``node`` (same command line as the runner's)."""
    parameters = [Path(path) for path in node.param_files]
    if node.parameters:
        parameters.append(dict(node.parameters))
    ending = {'respawn': True, 'respawn_delay': node.respawn_delay} if node.respawn else \
        {'on_exit': Shutdown(reason=f'{node.fqn} exited')}
    # A node_container hosts nodes under their own names: launch_ros renames none without one.
    return Node(package=PACKAGE, executable=node.executable,
                name=None if node.hosts else node.name,
                namespace=node.namespace, parameters=parameters,
                remappings=list(node.remappings), arguments=list(node.arguments),
                output='screen', **ending)


def generate_launch_description(graph_name: str) -> LaunchDescription:
    """The launch description of ``GRAPHS[graph_name]``."""
    graph = GRAPHS[graph_name]

    def nodes(context, *args, **kwargs):
        values = {arg.name: LaunchConfiguration(arg.name).perform(context)
                  for arg in graph.arguments}
        return [node_action(node) for node in resolve(graph, values)]

    declared = [DeclareLaunchArgument(arg.name, default_value=arg.default,
                                      description=arg.description,
                                      choices=list(arg.choices) or None)
                for arg in graph.arguments]
    return LaunchDescription([*declared, OpaqueFunction(function=nodes)])
