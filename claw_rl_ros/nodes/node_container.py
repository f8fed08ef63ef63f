"""node_container: several of the package's nodes in one process, spun by one EventsExecutor.

Composition is ROS 2's answer to what a process boundary costs (rclcpp_components); rclpy has
no component container, so this is the package's own for its Python nodes. The nodes' code is
the same and they still talk over DDS, where Fast DDS delivers within a process without its
shared-memory transport. What goes is the hop between processes: the lockstep loop (sim_node +
policy_node) runs ~1.35x the control steps/s of two processes on 2 cores
(``bench/ros_control.py``). It is for simulation (the ``control`` graph's ``composed``
argument; ``claw-rl verify``'s default, ``--processes`` for two); on a robot the policy node
runs in its own process.

Usage::

    python -m claw_rl_ros.nodes.node_container --node sim_node '{"mode": "lockstep"}' \\
        --node policy_node '{"model_path": "/abs/student.onnx"}' \\
        --ros-args -r __ns:=/robot1 --params-file config/sim_node.yaml ...

Each ``--node EXECUTABLE PARAMETERS`` hosts one node under its own name, ``PARAMETERS`` a JSON
object that overrides the parameter files (launch's inline parameters; an empty list is read as
rcl reads ``[]`` from a parameter file). The ``--ros-args`` apply to every hosted node: parameter
files key their sections by node (``/**/sim_node:``), so each reaches its own. A node that
refuses its configuration stops the container with exit status 1; Ctrl-C or SIGTERM stops it
cleanly (0).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from rclpy.parameter import Parameter
from rclpy.utilities import remove_ros_args

from .ros_io import exit_without_teardown, spin_nodes

# The nodes a container can host: executable -> (module, class). Not recorder_node: the
# container runs the EventsExecutor, which fails on the recorder's subscriptions (their
# callbacks take the message info; core/params/node_config.py, RECORDER_EXECUTORS).
HOSTABLE = {'sim_node': ('claw_rl_ros.nodes.sim.sim_node', 'SimNode'),
            'policy_node': ('claw_rl_ros.nodes.policy.policy_node', 'PolicyNode')}


def parameter(key: str, value) -> Parameter:
    """The override ``key`` = ``value``. An empty list is NOT_SET, as rcl reads ``[]`` from a
    parameter file: a typed list parameter then reads back empty (node_params.declare), where
    rclpy's own typing of ``[]`` (BYTE_ARRAY) would be refused as the wrong type."""
    if isinstance(value, list) and not value:
        return Parameter(key, Parameter.Type.NOT_SET)
    return Parameter(key, value=value)


def hosted_nodes(argv: list[str]) -> list[tuple[str, list[Parameter]]]:
    """[(executable, its parameter overrides)] from the arguments before ``--ros-args``;
    SystemExit(2) with the option, the value and the fix on a bad one."""
    parser = argparse.ArgumentParser(prog='node_container', description=__doc__.splitlines()[0])
    parser.add_argument('--node', nargs=2, action='append', required=True,
                        metavar=('EXECUTABLE', 'PARAMETERS'),
                        help=f'a node to host ({", ".join(HOSTABLE)}) and its parameters as a '
                        'JSON object')
    args = parser.parse_args(argv)
    hosted, seen = [], set()
    for executable, text in args.node:
        if executable not in HOSTABLE:
            parser.error(f'--node {executable!r}: not a hostable node; use one of '
                         f'{", ".join(HOSTABLE)}')
        if executable in seen:
            parser.error(f'--node {executable!r} given twice: a container hosts each node once '
                         '(both would take the same name)')
        seen.add(executable)
        try:
            params = json.loads(text)
        except ValueError as exc:
            parser.error(f'--node {executable} {text!r}: not JSON ({exc}); give an object, '
                         'e.g. \'{"mode": "lockstep"}\'')
        if not isinstance(params, dict):
            parser.error(f'--node {executable} {text!r}: not a JSON object of parameter names; '
                         'give e.g. \'{"mode": "lockstep"}\'')
        overrides = []
        for key, value in params.items():
            try:
                overrides.append(parameter(key, value))
            except (TypeError, ValueError) as exc:  # e.g. an object or a mixed list
                parser.error(f'--node {executable}: parameter {key} = {value!r} is not a ROS '
                             f'parameter value ({exc}); use a bool, number, string or a list '
                             'of one of them')
        hosted.append((executable, overrides))
    return hosted


def factory(executable: str, overrides: list[Parameter]):
    """A callable that makes the hosted node with ``overrides`` over its parameter files; a
    name the node does not declare is refused (ValueError), not ignored as rcl ignores it."""
    module, name = HOSTABLE[executable]
    node_class = getattr(importlib.import_module(module), name)

    def make():
        node = node_class(parameter_overrides=overrides)
        unknown = sorted(p.name for p in overrides if not node.has_parameter(p.name))
        if unknown:
            names = sorted(node.list_parameters([], 0).names)
            node.destroy_node()
            raise ValueError(f'--node {executable}: {executable} has no parameter '
                             f'{unknown[0]!r}; its parameters are {", ".join(names)}')
        return node
    return make


def main(args=None) -> None:
    argv = remove_ros_args(sys.argv if args is None else args)[1:]
    factories = [factory(executable, overrides)
                 for executable, overrides in hosted_nodes(argv)]
    # The EventsExecutor always, whatever the hosted nodes' executor parameter says: the
    # composed loop's speed is its (rclpy's default executor runs the lockstep loop at about
    # half its rate in one process: 1,240 against 2,160-2,410 steps/s, 2026-12-06).
    exit_without_teardown(spin_nodes(factories, args, kind='events'))


if __name__ == '__main__':
    main()
