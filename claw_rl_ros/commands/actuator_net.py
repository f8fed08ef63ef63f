"""``claw-rl actuator-net RECORDING.mcap``: a learned actuator model (Hwangbo et al. 2019) from a
recording with effort.

Trains a small MLP from each joint's history of position error and velocity at the physics rate
to its measured effort (core/sysid/actuator_net.py: the rate rule, the split, the PD fit it is
scored against), writes it as ONNX (``--out``) for the robot YAML's ``actuator: {model: network,
network_file: NET.onnx}``, and prints the held-out RMS effort error of the net and of the fitted
PD law per joint group and overall. A recording without effort, with NaN efforts, of other
joints or too short is refused by name (exit 2).
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

from ..core.config import ConfigError, MAX_THREADS

PROG = 'claw-rl actuator-net'


def _cmd_actuator_net(args: argparse.Namespace) -> int:
    import torch
    from ..core.config import from_dict
    from ..core.sim.robot import load_robot
    from ..core.sysid import actuator_net as an
    from ..core.sysid.trace import check_trace, load_trace
    try:
        cfg = from_dict(an.ActuatorNetConfig, {
            'history': args.history, 'epochs': args.epochs, 'seed': args.seed,
            'effort_lag': args.effort_lag}, source=PROG)
    except ConfigError as exc:
        raise ConfigError(PROG, f'--{exc.key.replace("_", "-")}', exc.detail) from None
    if not 0 <= args.threads <= MAX_THREADS:
        raise ConfigError(PROG, '--threads', f'{args.threads}; give 1 to {MAX_THREADS} (0: '
                          'torch\'s default)')
    if args.threads:
        torch.set_num_threads(args.threads)
    robot = load_robot(args.robot)
    trace = load_trace(args.recording, robot)
    check_trace(trace, robot)
    an.check_effort(trace.effort, trace.source)
    windows = an.trace_windows(trace, robot, cfg)
    net, report = an.fit_actuator_net(windows, robot, cfg, trace.source)
    path = an.write_actuator_net(args.out, net, report, windows)
    rate = (len(trace.t) - 1) / max(trace.t[-1] - trace.t[0], 1e-9)
    print(f'{PROG}: {trace.source}: {len(windows.t)} samples with effort at {rate:.0f} Hz over '
          f'{trace.excitation_s():.1f} s; history {cfg.history} x {robot.sim_dt * 1000:g} ms, '
          f'effort {cfg.effort_lag} physics step(s) after the state')
    n = report.samples
    print(f'trained {cfg.layers} x {cfg.hidden} softsign on {n["train"]} samples x '
          f'{robot.num_joints} joints in {report.train_s:.1f} s ({report.epochs} epochs, best '
          f'{report.best_epoch}; early stopping on {n["stop"]})')
    print(f'held-out RMS effort error [N m], the last {cfg.held_out:.0%} ({n["held_out"]} '
          'samples):')
    print(f'  {"group":<8} {"net":>7} {"PD fit":>7}   PD fit: Kp, Kd, delay')
    for group, joints in report.groups.items():
        f = report.pd_fit[group]
        print(f'  {group:<8} {report.net_rms[group]:7.3f} {report.pd_rms[group]:7.3f}   '
              f'{f.kp:.2f} N m/rad, {f.kd:.3f} N m s/rad, {f.delay_steps * robot.sim_dt * 1000:g}'
              f' ms ({len(joints)} joints)')
    print(f'  {"all":<8} {report.net_rms["all"]:7.3f} {report.pd_rms["all"]:7.3f}')
    sha = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    print(f'wrote {path} (sha256 {sha[:16]}; onnxruntime vs torch {report.parity:.1e} N m)')
    print(f'use it: robot YAML actuator: {{model: network, network_file: {path}, '
          'delay_steps: [0, 0]} (its history holds the drive\'s delay)')
    if not report.net_rms['all'] < report.pd_rms['all']:
        print('note: the net is no better than the PD fit on the held-out part; the drive '
              'looks linear: prefer claw-rl sysid\'s overlay, or record a wider excitation')
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``actuator-net`` on the claw-rl parser."""
    p = subparsers.add_parser('actuator-net', help='train a learned actuator (MLP, ONNX) from a '
                              'recording with effort; report its held-out error beside the PD '
                              'fit\'s', description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('recording', help='MCAP file written by recorder_node (joint states with '
                   'effort, the commands)')
    p.add_argument('--robot', default='claw_quadruped', help='robot name or YAML path')
    p.add_argument('--out', default='actuator_net.onnx', help='ONNX file to write')
    p.add_argument('--history', type=int, default=8, help='physics steps of history the '
                   'network reads [default 8]')
    p.add_argument('--epochs', type=int, default=300, help='most training epochs (early '
                   'stopping ends sooner) [default 300]')
    p.add_argument('--seed', type=int, default=0, help='seed of the weights and batch order')
    p.add_argument('--effort-lag', type=int, default=1, help='physics steps the recorded '
                   'effort trails the state: 1 for the sim node, 0 for a driver sampling both '
                   'together [default 1]')
    p.add_argument('--threads', type=int, default=0, help='torch threads (0: torch\'s '
                   'default)')
    p.set_defaults(func=_cmd_actuator_net)
