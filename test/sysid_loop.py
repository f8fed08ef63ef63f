"""The system-identification loop on a simulated robot with hidden parameters, over real topics.

A sim_node in lockstep plays the robot with a hidden overlay (its gains, joint friction,
damping, rotor inertia and delay: what sysid must find), on a stand or on the ground; a
policy_node as the deploy graph runs it (operator-driven, no model, the nominal robot: it
knows nothing hidden) stands up and runs the excitation (``~/excite``); recorder_node writes
the MCAP; then ``claw-rl sysid`` fits it. :func:`run_loop` does it all; :func:`compare` scores
the fit against the hidden overlay. Used by test/test_sysid_loop.py and
bench/sysid_hidden_robot.py (any overlay in the issue's format).
"""

from __future__ import annotations

from dataclasses import dataclass
import os
from pathlib import Path
import subprocess
import sys
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import SetBool, Trigger

from claw_rl_ros.core.sim.robot import load_robot
from claw_rl_ros.core.sim.robot_overlay import GROUP_FIELDS, load_overlay, RobotOverlay
from claw_rl_ros.nodes.ros_io import COMMAND_QOS, LATCHED_QOS
from ros_helpers import NodeProcess, Probe, ROOT, stop_all

# Stand-up in 1 s of sim time; generous staleness, by sim time and by wall time (a lockstep
# loop on a loaded machine may stall for seconds, and a stale fault would cut the run short):
# wiring, not thresholds, is what this loop exercises (test_excitation.py has those).
POLICY = {'use_sim_time': True, 'autostart': False, 'stand_up_s': 1.0,
          'stale_after_periods': 10.0, 'wall_stale_after_s': 60.0}
RECORDED = ('joint_states', 'joint_commands', 'safety/state', 'joint_gains',
            'policy/excitation')


@dataclass
class LoopResult:
    """What one loop left: the recording, the fitted overlay, sysid's exit code and output."""

    recording: Path
    overlay: Path
    returncode: int
    output: str


def _recorder_hears(probe: Probe, topic: str, timeout: float) -> None:
    """Wait until the recorder's diagnostics count a publisher of ``topic``."""
    probe.wait_for('/diagnostics', lambda m: any(
        s.hardware_id == '/recorder_node' and any(
            kv.key == f'publishers /{topic}' and int(kv.value) >= 1 for kv in s.values)
        for s in m.status), timeout=timeout)


def _recorder_drained(probe: Probe, timeout: float) -> None:
    """Wait until two of the recorder's diagnostics in a row count the same joint_states."""
    last = None
    for _ in range(int(timeout)):
        start = probe.count('/diagnostics')
        msg = probe.wait_for('/diagnostics', lambda m: any(
            s.hardware_id == '/recorder_node' for s in m.status), timeout=30, start=start)
        status = next(s for s in msg.status if s.hardware_id == '/recorder_node')
        written = {kv.key: kv.value for kv in status.values}.get('messages /joint_states')
        if written is not None and written == last:
            return
        last = written


def _until_ok(probe: Probe, name: str, tries: int = 120) -> tuple[bool, str]:
    """Call ``/policy_node/<name>`` until it succeeds; refusals for timing (the stand-up under
    way, a feed not yet fresh) are retried after a few more commands."""
    ok, message = False, ''
    for _ in range(tries):
        reply = probe.call(Trigger, f'/policy_node/{name}', Trigger.Request(), 30)
        ok, message = reply.success, reply.message
        if ok or not any(w in message for w in ('not reached', 'no fresh', 'rate', 'usable')):
            return ok, message
        probe.wait_count('joint_commands', probe.count('joint_commands') + 5, timeout=30)
    return ok, message


def run_loop(env: dict, workdir: Path, hidden: Path, *, variant: str = 'stand',
             robot: str = 'claw_quadruped', excite: dict[str, Any] | None = None,
             sysid_args: tuple[str, ...] = (), timeout: float = 600.0) -> LoopResult:
    """Excite the hidden robot ``hidden`` (an overlay file) on ``variant`` (stand | ground),
    record it and fit it with ``claw-rl sysid``. ``env``: the ROS environment of the graph
    (its own domain id, localhost discovery, temporary ROS_HOME), also this process's."""
    workdir.mkdir(parents=True, exist_ok=True)
    mcap, fitted = workdir / 'excitation.mcap', workdir / 'fitted_overlay.yaml'
    probe = Probe('sysid_loop')
    for topic, msg_type, qos in (('joint_commands', Float64MultiArray, COMMAND_QOS),
                                 ('safety/state', String, LATCHED_QOS),
                                 ('/diagnostics', DiagnosticArray, 50)):
        probe.subscribe(topic, msg_type, qos)
    rec = NodeProcess('recorder_node', env, workdir, {'path': str(mcap), 'robot': robot})
    sim = NodeProcess('sim_node', env, workdir, {
        'robot': robot, 'robot_overlay': str(hidden), 'mode': 'lockstep',
        'publish_clock': True, 'on_stand': variant == 'stand'})
    policy = NodeProcess('policy_node', env, workdir, {
        'robot': robot, **POLICY, 'excite_variant': variant, **(excite or {})})
    try:
        for topic in RECORDED:
            _recorder_hears(probe, topic, timeout=120)
        for request in ('stand_up', 'excite'):
            ok, message = _until_ok(probe, request)
            if not ok:
                raise RuntimeError(f'{request} refused: {message}\n{policy.log}')
        start = max(0, probe.count('safety/state') - 1)
        probe.wait_for('safety/state', lambda m: m.data == 'EXCITE', 60, start=start)
        start = probe.count('safety/state')
        end = probe.wait_for('safety/state', lambda m: m.data != 'EXCITE', timeout, start=start)
        if end.data != 'STAND_UP':
            raise RuntimeError(f'the excitation ended in {end.data}, not STAND_UP (a fault cut '
                               f'it short):\n{policy.log}')
        # Pause the sim, then let the recorder drain its queues: on a loaded machine it lags
        # the lockstep loop by seconds, and stopping it at once would lose the run's end.
        probe.call(SetBool, '/sim_node/pause', SetBool.Request(data=True), 30)
        _recorder_drained(probe, timeout)
    finally:
        # The recorder first: its file is complete once it exits.
        codes = stop_all(rec, policy, sim)
        probe.close()
    if codes['recorder_node'] != 0 or not mcap.is_file():
        raise RuntimeError(f'recorder exit {codes}: {rec.log}')
    run = subprocess.run([sys.executable, '-m', 'claw_rl_ros.cli', 'sysid', str(mcap),
                          '--robot', robot, '--out', str(fitted), *sysid_args],
                         cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=timeout)
    return LoopResult(mcap, fitted, run.returncode, run.stdout + run.stderr)


def compare(hidden: Path | RobotOverlay, fitted: Path | RobotOverlay,
            robot: str = 'claw_quadruped') -> list[dict[str, Any]]:
    """One entry per group and field, then ``action_delay_s``: ``{name, hidden, recovered,
    relative_error}`` (the delay's error in physics steps as ``error_steps`` too).

    Groups are matched as the robot matches them: each of the hidden overlay's groups is
    scored on the fitted value of its first joint (a per-joint fit scores each of its
    joints' mean over the group)."""
    hid = hidden if isinstance(hidden, RobotOverlay) else load_overlay(hidden)
    fit = fitted if isinstance(fitted, RobotOverlay) else load_overlay(fitted)
    spec = load_robot(robot)
    out = []
    for group, params in hid.joint_groups.items():
        joints = [j for j in spec.joint_names if j == group or group in j]
        for field in GROUP_FIELDS:
            values = [_fitted_value(fit, j, field) for j in joints]
            recovered = sum(values) / len(values)
            true = float(getattr(params, field))
            out.append({'name': f'{group}.{field}', 'hidden': true, 'recovered': recovered,
                        'relative_error': (recovered - true) / true if true else
                        float(recovered != 0.0)})
    steps = (fit.action_delay_s - hid.action_delay_s) / spec.sim_dt
    out.append({'name': 'action_delay_s', 'hidden': hid.action_delay_s,
                'recovered': fit.action_delay_s,
                'relative_error': (fit.action_delay_s - hid.action_delay_s) / hid.action_delay_s
                if hid.action_delay_s else float(fit.action_delay_s != 0.0),
                'error_steps': steps})
    return out


def _fitted_value(fit: RobotOverlay, joint: str, field: str) -> float:
    """The fitted ``field`` of ``joint``: its exact key, else the one group naming it."""
    if joint in fit.joint_groups:
        return float(getattr(fit.joint_groups[joint], field))
    keys = [k for k in fit.joint_groups if k in joint]
    if len(keys) != 1:
        raise ValueError(f'the fitted overlay matches joint {joint!r} by {keys}')
    return float(getattr(fit.joint_groups[keys[0]], field))


def table(rows: list[dict[str, Any]]) -> str:
    """The comparison as aligned text."""
    lines = [f'{"parameter":<22} {"hidden":>10} {"recovered":>10} {"error":>8}']
    for row in rows:
        err = f'{row["error_steps"]:+.1f} st' if 'error_steps' in row \
            else f'{100 * row["relative_error"]:+.1f} %'
        lines.append(f'{row["name"]:<22} {row["hidden"]:>10.4g} {row["recovered"]:>10.4g} '
                     f'{err:>8}')
    return '\n'.join(lines)
