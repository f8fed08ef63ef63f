"""``claw-rl``: the user commands (stand, stand-pose, train, eval, export, check-urdf, spec,
up, verify, replay, sysid, actuator-net, gateway).

Every command returns an exit status; a configuration error prints one line naming the file,
key, value and fix, and exits with status 2 (no traceback). A ``--ros-args ...`` tail (launch_ros
and ``ros2 run`` add one) is removed before parsing, so the CLI runs as a ROS executable.
"""

from __future__ import annotations

import argparse
import json
import sys

from .core.config import ConfigError
from .core.io import exit_without_teardown


def _cmd_stand(args: argparse.Namespace) -> int:
    from .core.sim.demo import run_stand
    return run_stand(robot=args.robot, seconds=args.seconds, num_envs=args.num_envs)


def _cmd_stand_pose(args: argparse.Namespace) -> int:
    from .core.sim.robot import load_robot
    from .core.sim.stand_pose import stand_pose
    print(stand_pose(load_robot(args.robot, sizes=False), args.height).to_yaml())
    return 0


def _cmd_check_urdf(args: argparse.Namespace) -> int:
    from .core.sim.urdf import check_urdf
    model, problems = check_urdf(args.urdf)
    if problems:
        print(f'{args.urdf}: {len(problems)} problem(s)')
        for problem in problems:
            print(f'  - {problem}')
        return 1
    actuated = [j for j in model.joints.values() if j.type != 'fixed']
    print(f'robot name is: {model.name}')
    print(f'root link: {model.root}; {len(model.links)} links, {len(model.joints)} joints '
          f'({len(actuated)} actuated); total mass {model.total_mass:.3f} kg')
    return 0


def _cmd_spec(args: argparse.Namespace) -> int:
    from .core.sim.robot import load_robot
    robot = load_robot(args.robot)
    print(json.dumps({**robot.to_metadata(), 'training': robot.training_sizes()}, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='claw-rl', description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest='command', required=True, metavar='COMMAND')

    stand = sub.add_parser('stand', help='hold the default pose under PD control and report')
    stand.add_argument('--robot', default='claw_quadruped', help='robot name or YAML path')
    stand.add_argument('--seconds', type=float, default=5.0, help='simulated seconds')
    stand.add_argument('--num-envs', type=int, default=16, help='worlds to simulate')
    stand.set_defaults(func=_cmd_stand)

    pose = sub.add_parser('stand-pose', help='print a default_joint_pos (YAML) that stands the '
                          'trunk at --height with each foot under its hip (the anchor of its '
                          "leg's first pitch joint)")
    pose.add_argument('--robot', default='claw_quadruped', help='robot name or YAML path (its '
                      'default_joint_pos is the starting guess: the way the knees bend)')
    pose.add_argument('--height', type=float, required=True,
                      help="trunk origin's height above the ground [m]")
    pose.set_defaults(func=_cmd_stand_pose)

    check = sub.add_parser('check-urdf', help='validate a URDF like check_urdf')
    check.add_argument('urdf', help='path to the URDF file')
    check.set_defaults(func=_cmd_check_urdf)

    spec = sub.add_parser(
        'spec', help='print the robot spec written into exported models (JSON), then under '
        '"training" what training sizes to the robot: total mass, standing height, the '
        'robot-sized constants (those the YAML leaves out listed as derived) and the contact '
        'links')
    spec.add_argument('--robot', default='claw_quadruped', help='robot name or YAML path')
    spec.set_defaults(func=_cmd_spec)

    from .commands import actuator_net, evaluate, export, replay, sysid, train, up, verify
    from .gateway import check_command as gateway
    for module in (train, export, evaluate, up, verify, replay, sysid, actuator_net, gateway):
        module.add_parser(sub)
    return parser


def strip_ros_args(argv: list[str]) -> list[str]:
    """argv without its ROS arguments (``--ros-args ... [--]``), as rcl parses them.

    rclpy is imported only when ROS arguments are present; a malformed ROS argument (e.g.
    ``-r`` without a rule) is a ConfigError naming it.
    """
    if '--ros-args' not in argv:
        return list(argv)
    from rclpy.utilities import remove_ros_args
    try:
        return remove_ros_args(['claw-rl', *argv])[1:]
    except Exception as exc:  # noqa: BLE001 - rcl raises RCLInvalidROSArgsError & co.
        raise ConfigError('command line', '--ros-args', f'{exc}; a ROS argument tail looks '
                          'like --ros-args -r __node:=name -p key:=value') from None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    called_as_program = argv is None
    try:
        argv = strip_ros_args(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f'claw-rl: error: {exc}', file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args) or 0)
    except ConfigError as exc:
        print(f'claw-rl: error: {exc}', file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print('claw-rl: interrupted', file=sys.stderr)
        return 130
    if called_as_program and getattr(args, 'exit_without_teardown', False):
        # The command has written and said everything. Never when called in a process that
        # goes on (argv given, as tests do).
        exit_without_teardown(code)
    return code


if __name__ == '__main__':
    sys.exit(main())
