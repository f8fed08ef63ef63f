"""Start-up self-check before RL: model spec vs robot config vs the live robot, by name.

:func:`self_check` returns one line per mismatch, each starting with its kind (joint order,
missing joint, unknown joint, control dt, action scale, gains, observation scales, rates,
command interface), so the operator sees every problem at once, not the first.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..sim.robot_spec import INFORMATIONAL_KEYS, metadata_match, RobotSpec

# A measured message rate may differ from the control rate by this fraction.
RATE_TOLERANCE = 0.1
# At least this fraction of the last joint states must have been usable (accepted into a tick).
USABLE_FRACTION = 0.9


def _joint_lines(where: str, have: Sequence[str], want: Sequence[str], of: str) -> list[str]:
    """Missing / unknown / order problems of ``have`` against ``want`` (names)."""
    have, want = list(have), list(want)
    out = []
    missing = [n for n in want if n not in have]
    unknown = [n for n in have if n not in want]
    if missing:
        out.append(f'missing joint: {where} lacks {missing} (of {of})')
    if unknown:
        out.append(f'unknown joint: {where} has {unknown}, not joints of {of}')
    repeated = sorted({n for n in have if have.count(n) > 1})
    if repeated:
        out.append(f'joint order: {where} repeats {repeated}')
    if not (missing or unknown or repeated) and have != want:
        i = next(k for k, (a, b) in enumerate(zip(have, want)) if a != b)
        out.append(f'joint order: {where} has {have[i]} at index {i} where {of} has {want[i]} '
                   f'({where}: {have}; {of}: {want})')
    return out


def model_lines(robot: RobotSpec, spec: dict[str, Any]) -> list[str]:
    """Every difference between a model's embedded spec and the robot config, by kind."""
    mine = robot.to_metadata()
    out = _joint_lines('the model', spec.get('joint_names', []), mine['joint_names'],
                       f'robot {robot.name!r}')
    kinds = {'control_dt': 'control dt', 'action_scale': 'action scale', 'kp': 'gains',
             'kd': 'gains', 'observation': 'observation scales', 'obs_dim': 'observation size'}
    for key, expected in mine.items():
        if key == 'joint_names' or key in INFORMATIONAL_KEYS:
            continue  # (facts about training, shown by the card, never compared)
        have = spec.get(key)
        if key == 'observation' and isinstance(have, list):
            out += _observation_lines(have, expected)
        elif not metadata_match(expected, have, 1e-6):
            out.append(f'{kinds.get(key, key)}: model has {key} = {have!r}, robot '
                       f'{robot.name!r} has {expected!r}')
    return out


def _observation_lines(have: list, want: list) -> list[str]:
    names = [t.get('name') for t in have if isinstance(t, dict)]
    if names != [t['name'] for t in want]:
        return [f'observation scales: model terms {names}, robot terms '
                f'{[t["name"] for t in want]}']
    return [f'observation scales: {w["name"]} model {h.get("scale")} (size {h.get("size")}), '
            f'robot {w["scale"]} (size {w["size"]})'
            for h, w in zip(have, want) if not metadata_match(w, h, 1e-6)]


def _rate_line(topic: str, period: float | None, control_dt: float, at_least: bool) -> list[str]:
    want = 1.0 / control_dt
    if period is None or not period > 0:
        return [f'{topic} rate: no timing yet (need a few stamped messages); is it published?']
    rate = 1.0 / period
    low = rate < want * (1 - RATE_TOLERANCE)
    high = not at_least and rate > want * (1 + RATE_TOLERANCE)
    if low or high:
        return [f'{topic} rate: {rate:.1f} Hz, the model was trained at {want:g} Hz (control dt '
                f'{control_dt:g} s); set the broadcaster\'s update_rate to {want:g}'
                + (' or more' if at_least else '')]
    return []


def self_check(robot: RobotSpec, model_spec: dict[str, Any] | None, *,
               output_joints: Sequence[str], joint_state_names: Sequence[str] | None,
               joint_state_period: float | None, imu_period: float | None,
               command_joints: Sequence[str] | None,
               usable: tuple[int, int] | None = None, last_drop: str = '') -> list[str]:
    """Every mismatch between model, robot config and live robot (empty: all agree).

    ``joint_state_names``: the last ``/joint_states`` names; periods [s] from the stamps of
    usable messages; ``command_joints``: the command controller's ``joints`` (None: not
    configured, skipped); ``output_joints``: the order this node publishes commands in;
    ``usable``: (usable, received) of the last joint states, judged, not just received
    (``last_drop``: why the last one was dropped).
    """
    out = ['model: none loaded'] if model_spec is None else model_lines(robot, model_spec)
    if joint_state_names is None:
        out.append('missing joint: no /joint_states received yet')
    else:
        out += _joint_lines('/joint_states', sorted(joint_state_names),
                            sorted(robot.joint_names), f'robot {robot.name!r}')
    if usable is not None and usable[1] and usable[0] < USABLE_FRACTION * usable[1]:
        out.append(f'usable states: {usable[0]} of the last {usable[1]} /joint_states were '
                   f'usable (last drop: {last_drop or "none"})')
    out += _rate_line('/joint_states', joint_state_period, robot.control_dt, at_least=False)
    out += _rate_line('imu', imu_period, robot.control_dt, at_least=True)
    if command_joints is not None:
        out += [f'command interface {line}' for line in _joint_lines(
            'the command controller', command_joints, output_joints,
            'the policy node\'s joints parameter')]
    return out


def controller_joints(path: str, controller: str) -> list[str]:
    """The ``joints`` parameter of ``controller`` in a ros2_control controllers YAML.

    Raises ValueError naming the file, the controller and the fix.
    """
    import yaml
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f'controllers_file {path!r}: cannot read it ({exc}); give the '
                         'controllers YAML the controller_manager loads') from None
    for key, section in data.items():
        if str(key).rsplit('/', 1)[-1] == controller and isinstance(section, dict):
            joints = (section.get('ros__parameters') or {}).get('joints')
            if isinstance(joints, list) and all(isinstance(j, str) for j in joints):
                return joints
    raise ValueError(f'controllers_file {path!r}: no {controller}: ros__parameters: joints: '
                     '[...] list; set command_controller to the name of the '
                     'forward_command_controller in that file')
