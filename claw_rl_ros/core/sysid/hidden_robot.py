"""A "hidden robot" for system identification: the sim with actuator numbers the fit is not
told (a robot overlay merged onto the robot YAML, and a command delay) runs the excitation and
is recorded, as the policy node in EXCITE and a recorder on the robot would.

:func:`simulate` steps one world of :class:`~..sim.physics.BatchedPhysics` (the sim node's
physics: its solver options, its delay line) on a stand or on the ground: it settles holding
the default pose, then each control period the target is the default pose plus the
excitation's offset (clamped to the joint limits, as the policy node shapes it) and the
readings are the sim node's (positions and velocities after the period, the drive torque
sensors of its last physics step). :func:`write_recording` writes the trace as a recorder_node
MCAP (joint_states, joint_commands, safety/state and the first imu, as CDR bytes; no ROS
needed).
"""

from __future__ import annotations

import json
from pathlib import Path
import struct

import numpy as np

from ..control.excitation import Excitation, ExcitationConfig, from_params
from ..replay.recording import Recorder
from ..sim.env_config import EnvConfig, solver_options
from ..sim.physics import BatchedPhysics
from ..sim.robot_spec import RobotSpec
from ..wire_format import Float64ArrayWriter, ImuWriter, JointStateWriter
from .trace import EXCITE, Trace

# Seconds the robot holds the default pose before the excitation; the last LEAD_S of it are
# recorded (outside the excitation window).
SETTLE_S = 1.0
LEAD_S = 0.2
# Nanoseconds between a state's publication and the command that answers it.
ANSWER_NS = 1_000_000


def simulate(robot: RobotSpec, delay_steps: int, stand: bool,
             excitation: ExcitationConfig | None = None, settle_s: float = SETTLE_S,
             lead_s: float = LEAD_S) -> Trace:
    """The excitation run by ``robot`` (its gains, joint friction, damping and rotor inertia
    are the hidden truth) with a command delay of ``delay_steps`` physics steps, on a stand
    (``stand``) or standing on the ground (``excitation``: default the variant's, 0.15 or
    0.08 rad); returns its :class:`Trace` (window: the excitation; ``lead_s`` of the settled
    hold before it; ``base``: the trunk's state, as the sim node's odometry gives it)."""
    variant = 'stand' if stand else 'ground'
    ex = Excitation(robot, excitation or from_params({'variant': variant, 'amplitude': 0},
                                                     robot))
    dt, j = robot.control_dt, robot.num_joints
    p = BatchedPhysics(robot, 1, **solver_options(EnvConfig(num_envs=1)), stand=stand,
                       max_delay_steps=delay_steps)
    try:
        q0 = robot.default_joint_pos
        p.state[:] = 0.0
        p.qpos[0] = p.standing_qpos
        p.hold(np.zeros(1, dtype=np.int64), q0[None])
        latency = np.array([delay_steps])
        lead = int(round(lead_s / dt))
        for _ in range(max(0, int(round(settle_s / dt)) - lead)):
            p.step(q0[None], latency)
        periods = lead + int(round(ex.duration / dt))
        t = np.arange(periods + 1) * dt
        q, qd, effort = (np.zeros((periods + 1, j)) for _ in range(3))
        base = np.zeros((periods + 1, 13))
        target = np.tile(q0, (periods + 1, 1))
        torque = slice(*p.sensors.joint_torque)
        base_quat = p.sensordata[0, -1, slice(*p.sensors.framequat)].copy()
        for k in range(periods + 1):
            q[k], qd[k] = p.qpos[0, p.qadr], p.qvel[0, p.vadr]
            base[k] = np.concatenate([p.qpos[0, :7], p.qvel[0, :6]])
            effort[k] = p.sensordata[0, -1, torque]
            if k == periods:
                break
            offset = ex.offset((k - lead) * dt) if k >= lead else np.zeros(j)
            target[k] = np.clip(q0 + offset, robot.joint_lower, robot.joint_upper)
            p.step(target[k][None], latency)
    finally:
        p.close()
    return Trace(list(robot.joint_names), t, q, qd, effort, target, (lead, periods + 1),
                 base_quat, base, 'stand' if stand else 'ground', '<hidden robot>')


def _string_cdr(text: str) -> bytes:
    """std_msgs/String as CDR bytes (little endian): header, length with NUL, text, NUL."""
    data = text.encode() + b'\x00'
    return b'\x00\x01\x00\x00' + struct.pack('<I', len(data)) + data


def write_recording(trace: Trace, path: str | Path, robot: RobotSpec,
                    start_ns: int = 1_700_000_000_000_000_000) -> Path:
    """``trace`` as a recorder_node MCAP: each state published at ``start_ns`` + its stamp, the
    command that answers it ``ANSWER_NS`` later, ``safety/state`` EXCITE over the window
    (STAND_UP before it, PASSIVE after), the IMU's first orientation; metadata as recorder_node
    writes it, plus ``variant``."""
    if trace.effort is None:
        raise ValueError('write_recording writes joint_states with efforts; give a trace '
                         'that has them')
    roles = {f'/{r}': r for r in ('joint_states', 'joint_commands', 'safety/state', 'imu')}
    rec = Recorder(path, {'robot': robot.name, 'joints': ','.join(trace.joints),
                          'control_dt': robot.control_dt, 'roles': json.dumps(roles),
                          'variant': trace.variant}, library='claw_rl_ros hidden_robot')
    try:
        js_ch = rec.add_topic('/joint_states', 'sensor_msgs/msg/JointState')
        cmd_ch = rec.add_topic('/joint_commands', 'std_msgs/msg/Float64MultiArray')
        safety_ch = rec.add_topic('/safety/state', 'std_msgs/msg/String')
        imu_ch = rec.add_topic('/imu', 'sensor_msgs/msg/Imu')
        js, cmd, imu = JointStateWriter(trace.joints), Float64ArrayWriter(len(trace.joints)), \
            ImuWriter()
        i0, i1 = trace.window
        for k in range(trace.num_samples):
            pub = start_ns + int(round(trace.t[k] * 1e9))
            state = {i0: EXCITE, i1: 'PASSIVE'}.get(k)
            if k == 0 and i0 > 0:
                rec.write(safety_ch, '/safety/state', _string_cdr('STAND_UP'), pub - 2,
                          pub - 2)
            if state:
                rec.write(safety_ch, '/safety/state', _string_cdr(state), pub - 1, pub - 1)
            if k == 0 and trace.base_quat is not None:
                imu.set_stamp(trace.t[k])
                imu.fill(trace.base_quat, np.zeros(3), np.zeros(3))
                rec.write(imu_ch, '/imu', imu.payload(), pub, pub)
            js.set_stamp(trace.t[k])
            js.fill(trace.q[k], trace.qd[k], trace.effort[k])
            rec.write(js_ch, '/joint_states', js.payload(), pub, pub)
            if k < trace.num_samples - 1:
                cmd.data[:] = trace.target[k]
                rec.write(cmd_ch, '/joint_commands', cmd.payload(), pub + ANSWER_NS,
                          pub + ANSWER_NS)
    finally:
        rec.close()
    return Path(path)
