"""``claw-rl replay run.mcap``: check a recording (recorder_node, ``record:=run.mcap``) offline.

``--model student.onnx`` recomputes every tick's action from what the policy saw (the policy node's
own observation code) and reports where the targets differ from the recorded commands: exit 0 when
every compared tick matches within ``--tolerance``, 1 when some differ (or none was compared).
States the node skipped for a newer one queued behind (a backlog worked off at its newest,
``superseded_states`` in its diagnostics) are counted and move no gait clock, as on the node; how
they are told from lost commands and lost states is in ``core/replay/action_replay.py``. As on the
node, actions are clipped to the model's ``action_clip``, a state is paired with the IMU reading of
its tick (one without it is the node's fault hold: ``no_imu``, not compared), and the velocity
command goes zero ``--cmd-vel-timeout`` seconds after the last ``cmd_vel``: give the policy node's
``cmd_vel_timeout_s`` (default 0.5, 0: off). recorder_node records no parameters, so a recording
cannot tell it; the report counts ticks that show a longer or no timeout (they are compared under
the command held).
``--compare-sim`` replays the recorded commands in MuJoCo from the recorded initial state and
writes a PNG of simulated vs recorded joint trajectories (``--png``, default
``<recording>.sim.png``). Both can be given together. ``--robot-overlay OVERLAY.yaml`` merges a
robot overlay (``claw-rl sysid --out``) onto the robot of both: the simulated robot of
``--compare-sim`` has the identified gains, joint friction, damping, rotor inertia and delay,
and a model trained with that overlay matches it. Usage errors exit 2.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from ..core.config import ConfigError


def _cmd_replay(args: argparse.Namespace) -> int:
    from ..core.replay import action_replay as replay, recording_events as events, sim_comparison
    from ..core.control.model_swap import ModelRejected
    from ..core.export.onnx_policy import ModelError, OnnxPolicy
    from ..core.replay.recording import DefinitionNotFound
    from ..core.sim.robot import load_robot
    from ..launch_graph.description import overlay_argument
    if not (args.model or args.compare_sim):
        raise ConfigError('claw-rl replay', '--model', 'nothing to do: give --model '
                          'student.onnx (recompute actions) and/or --compare-sim')
    if not (math.isfinite(args.cmd_vel_timeout) and args.cmd_vel_timeout >= 0):
        raise ConfigError('claw-rl replay', '--cmd-vel-timeout', f'{args.cmd_vel_timeout!r}; '
                          'give the policy node\'s cmd_vel_timeout_s, a finite number >= 0 [s] '
                          '(0: off)')
    if not Path(args.recording).is_file():
        raise ConfigError('claw-rl replay', 'recording', f'{args.recording}: no such file; '
                          'give an MCAP file written by recorder_node')
    try:
        rec = events.load_recording(args.recording)
    except (ValueError, DefinitionNotFound) as exc:
        raise ConfigError('claw-rl replay', 'recording', str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - mcap raises its own errors on a damaged file
        raise ConfigError('claw-rl replay', 'recording', f'{args.recording}: not a readable '
                          f'MCAP recording ({type(exc).__name__}: {exc})') from None
    name = args.robot or rec.robot or 'claw_quadruped'
    robot = load_robot(name, overlay=overlay_argument(args.robot_overlay, name,
                                                      '--robot-overlay', ''))
    code = 0
    if args.model:
        try:
            policy = OnnxPolicy(args.model, robot)
        except ModelError as exc:
            raise ConfigError('--model', '', str(exc)) from None
        try:
            result = replay.replay_actions(rec, robot, policy, policy.sha256[:12],
                                           args.tolerance, args.cmd_vel_timeout)
        except ModelRejected as exc:  # no valid action_clip: the policy node refuses it too
            raise ConfigError('--model', '', str(exc)) from None
        print(result.format())
        code = 1 if result.differing.any() or not result.compared.any() else 0
    if args.compare_sim:
        cmp = sim_comparison.compare_sim(rec, robot, args.seconds)
        png = args.png or str(Path(args.recording).with_suffix('')) + '.sim.png'
        title = (f'{Path(args.recording).name}: recorded joint positions vs the recorded '
                 'commands replayed in MuJoCo')
        sim_comparison.plot_comparison(cmp, png, title)
        print(cmp.format())
        print(f'wrote {png}')
    return code


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser('replay', help='recompute a recording\'s actions offline '
                              '(--model) or replay its commands in MuJoCo (--compare-sim)',
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('recording', help='MCAP file written by recorder_node')
    p.add_argument('--model', default='', help='ONNX student whose actions to recompute')
    p.add_argument('--tolerance', type=float, default=1e-6,
                   help='largest |recomputed - recorded| target that still matches [rad]')
    p.add_argument('--cmd-vel-timeout', type=float, default=0.5, metavar='SECONDS',
                   help='the policy node\'s cmd_vel_timeout_s (not recorded; 0: off) '
                   '[default 0.5]')
    p.add_argument('--compare-sim', action='store_true',
                   help='replay the recorded commands in MuJoCo and plot sim vs recorded')
    p.add_argument('--png', default='', help='picture of --compare-sim '
                   '(default: <recording>.sim.png)')
    p.add_argument('--seconds', type=float, default=None,
                   help='--compare-sim only the first SECONDS of the recording')
    p.add_argument('--robot', default='', help='robot name or YAML (default: the recording\'s)')
    p.add_argument('--robot-overlay', metavar='OVERLAY.yaml', default='',
                   help='robot overlay merged onto the robot (claw-rl sysid --out): --compare-sim '
                   'simulates the identified robot, --model checks against it (default: none)')
    p.set_defaults(func=_cmd_replay)
