"""``claw-rl sysid RECORDING.mcap --robot ROBOT --out OVERLAY.yaml``: system identification.

Fits, per joint group (the robot YAML's stiffness keys: hip, thigh, calf; per joint with
``--per-joint``), the drive's effective Kp and Kd, the joints' Coulomb friction (MuJoCo
frictionloss), viscous damping and rotor inertia (armature), and the command -> motion delay,
by replaying the recorded commands in MuJoCo with candidate parameters and minimising the
tracking error with scipy's least squares (core/sysid/fit.py: the stages). The recording is a
recorder_node MCAP of the excitation (the policy node in EXCITE; the whole recording when no
EXCITE state was recorded), on a stand (trunk fixed, the default) or on the ground
(``--variant ground``; the trunk's odometry is used when recorded).

It prints per joint the RMS tracking error before (the robot as configured) and after, per group
each parameter with its uncertainty, the delay, and what the data cannot tell apart (without
efforts the drive's Kd and the joint's damping act alike: their sum is fitted and split by the
stated rule). It writes the robot overlay (core/sim/robot_overlay.py) that ``claw-rl train
--robot-overlay`` (the train graph, sim node, eval, verify) merge onto the robot YAML; merging
re-centres the randomisation ranges on the fit. A recording that cannot identify a parameter
(empty, too short, a joint without excitation or saturated, NaN readings, other joints, clock
jumps) is refused by name (exit 2).
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
import hashlib
from pathlib import Path

from ..core.config import ConfigError, MAX_THREADS

PROG = 'claw-rl sysid'
VARIANTS = ('stand', 'ground')


def _cmd_sysid(args: argparse.Namespace) -> int:
    from ..core.config import from_dict
    from ..core.replay.recording import read_metadata
    from ..core.sim.robot import load_robot
    from ..core.sim.robot_overlay import write_overlay
    from ..core.sysid.fit import identify, SysidConfig
    from ..core.sysid.trace import load_trace
    if not 0 <= args.threads <= MAX_THREADS:
        raise ConfigError(PROG, '--threads', f'{args.threads}; give 1 to {MAX_THREADS} (0: one '
                          'per core)')
    try:
        cfg = from_dict(SysidConfig, {'per_joint': args.per_joint,
                                      'max_delay_s': args.max_delay_ms / 1000.0,
                                      'num_threads': args.threads,
                                      'limits': {'min_excitation_s': args.min_excitation_s}},
                        source=PROG)
    except ConfigError as exc:
        flags = {'max_delay_s': '--max-delay-ms', 'limits.min_excitation_s':
                 '--min-excitation-s', 'num_threads': '--threads'}
        raise ConfigError(PROG, flags.get(exc.key, exc.key), exc.detail) from None
    name = args.robot
    if not name and Path(args.recording).is_file():
        try:
            name = read_metadata(args.recording).get('robot', '')
        except Exception:  # noqa: BLE001 - load_trace names a damaged file below
            name = ''
    robot = load_robot(name or 'claw_quadruped')
    trace = load_trace(args.recording, robot)
    trace.variant = args.variant or trace.variant or 'stand'
    print(f'{PROG}: {trace.source}: {trace.num_samples} samples, {trace.excitation_s():.1f} s '
          f'of excitation on a {trace.variant if trace.variant == "stand" else "ground"}, '
          f'efforts {"recorded" if trace.effort is not None else "not recorded"}, trunk '
          f'odometry {"recorded" if trace.base is not None else "not recorded"}')
    result = identify(trace, robot, cfg)
    print(result.format())
    stamp = datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')
    overlay = result.overlay()
    overlay.extra['fit']['recording'] = {
        'file': Path(args.recording).name,
        'sha256': hashlib.sha256(Path(args.recording).read_bytes()).hexdigest()}
    out = write_overlay(args.out, overlay, header=(
        f'Robot overlay of {robot.name}, written by claw-rl sysid from {trace.source} on '
        f'{stamp}.\nMerge it onto the robot YAML: claw-rl train --robot-overlay {args.out}'))
    # What train, eval, verify and the sim node do with it (refused by name if it does not fit).
    load_robot(robot.source.get('config', robot.name), overlay=out)
    print(f'wrote {out}; train on it with claw-rl train --robot-overlay {out}')
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser('sysid', help='identify the drives (Kp, Kd, friction, damping, '
                              'rotor inertia, delay) from a recording and write a robot overlay',
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('recording', help='MCAP file written by recorder_node during the excitation')
    p.add_argument('--robot', default='', help="robot name or YAML (default: the recording's)")
    p.add_argument('--out', required=True, metavar='OVERLAY.yaml',
                   help='the robot overlay to write')
    p.add_argument('--variant', choices=VARIANTS, default='',
                   help='where the robot was: on a stand, trunk fixed, or standing on the '
                   "ground (default: the recording's metadata, else stand)")
    p.add_argument('--per-joint', action='store_true',
                   help='fit every joint on its own instead of per joint group')
    p.add_argument('--max-delay-ms', type=float, default=40.0,
                   help='longest command -> motion delay tried [ms] (default 40)')
    p.add_argument('--min-excitation-s', type=float, default=5.0,
                   help='refuse a recording with less excitation than this [s] (default 5)')
    p.add_argument('--threads', type=int, default=0, help='physics threads (0: one per core)')
    p.set_defaults(func=_cmd_sysid)
