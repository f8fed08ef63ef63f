"""The recorded commands of a recorder_node MCAP replayed in MuJoCo (:func:`compare_sim`,
``claw-rl replay --compare-sim``). From the first recorded state (joints from ``joint_states``,
trunk from ``odom`` when recorded, else the IMU orientation at the standing height), the
recorded commands drive a nominal MuJoCo world one control period each; the simulated and
recorded joint trajectories are plotted side by side (PNG) with their RMS difference.
"""

from __future__ import annotations

from dataclasses import dataclass
import io
from pathlib import Path
from typing import Optional

import numpy as np

from ..control.state_input import imu_arrays, JointOrder
from ..io import atomic_write_bytes
from .recording_events import CommandEvent, ImuEvent, Recording, recording_events, StateEvent
from ..sim.env_config import EnvConfig
from ..sim.robot_spec import RobotSpec
from ..sim.sim_session import SimSession


@dataclass
class SimComparison:
    """Recorded vs simulated joint positions [T, J] (spec order) at times ``t`` [T] s."""

    t: np.ndarray
    recorded: np.ndarray
    simulated: np.ndarray
    joints: list[str]

    def rms(self) -> np.ndarray:
        """[J] root-mean-square difference per joint [rad]."""
        return np.sqrt(np.mean((self.simulated - self.recorded) ** 2, axis=0))

    def format(self) -> str:
        rms = self.rms()
        worst = int(np.argmax(rms))
        return (f'sim vs recorded over {len(self.t)} ticks ({self.t[-1] - self.t[0]:.2f} s): '
                f'RMS joint error mean {rms.mean():.4f} rad, worst {rms[worst]:.4f} rad '
                f'({self.joints[worst]})')


def _initial_state(sim: SimSession, rec: Recording, order: JointOrder, first: StateEvent
                   ) -> None:
    """Write the recorded state ``first`` (and the odom/IMU trunk state) into the sim world."""
    p = sim.physics
    pos, vel = order.joint_arrays(first.names, first.position, first.velocity)
    qpos = p.standing_qpos.copy()
    qvel = np.zeros(p.qvel.shape[1])
    odom = [o for o in rec.odom if o[1] == first.stamp]
    imu = [ImuEvent(*i) for i in rec.imus if i[1] == first.stamp]
    if odom:
        _, _, position, quat, linear, angular = odom[0]
        qpos[0:3], qpos[3:7] = position, quat
        # Free joint: world-frame linear velocity (rotate the body-frame one), body angular.
        w, x, y, z = quat
        rot = np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])
        qvel[0:3], qvel[3:6] = rot @ linear, angular
    elif imu:
        qpos[3:7] = imu_arrays(imu[0].orientation, imu[0].angular_velocity)[0]
    qpos[p.qadr], qvel[p.vadr] = pos, vel
    sim.set_state(qpos, qvel)


def compare_sim(rec: Recording, robot: RobotSpec, seconds: Optional[float] = None
                ) -> SimComparison:
    """Drive a nominal MuJoCo world with the recorded commands from the first recorded state."""
    order = JointOrder(robot, rec.joints or None)
    events = recording_events(rec)
    first_cmd = next(i for i, e in enumerate(events) if isinstance(e, CommandEvent))
    first = [e for e in events[:first_cmd] if isinstance(e, StateEvent)]
    if not first:
        raise ValueError('no joint_states recorded before the first command: nothing to start '
                         'the simulation from')
    start = first[-1]
    sim = SimSession(robot, EnvConfig(num_envs=1))
    try:
        _initial_state(sim, rec, order, start)
        t, recorded, simulated = [start.stamp], [_joint_pos(order, start)], \
            [sim.readings().joint_pos]
        sent: list[np.ndarray] = []
        last = order.from_output(events[first_cmd].targets)
        for e in events[first_cmd:]:
            if isinstance(e, CommandEvent):
                sent.append(order.from_output(e.targets))
            elif isinstance(e, StateEvent) and e.stamp > t[-1] + 0.5 * robot.control_dt:
                # The next recorded state, n control periods later: n steps, each with the
                # next command sent meanwhile (the last one again if commands were lost).
                for k in range(max(1, round((e.stamp - t[-1]) / robot.control_dt))):
                    last = sent[k] if k < len(sent) else last
                    sim.step(np.clip(last, robot.joint_lower, robot.joint_upper))
                sent = []
                t.append(e.stamp)
                recorded.append(_joint_pos(order, e))
                simulated.append(sim.readings().joint_pos)
                if seconds is not None and t[-1] - t[0] >= seconds:
                    break
    finally:
        sim.close()
    return SimComparison(np.asarray(t), np.asarray(recorded), np.asarray(simulated),
                         list(robot.joint_names))


def _joint_pos(order: JointOrder, state: StateEvent) -> np.ndarray:
    """[J] joint positions (spec order) of a recorded state."""
    return order.joint_arrays(state.names, state.position, state.velocity)[0]


def plot_comparison(cmp: SimComparison, path: str | Path, title: str = '') -> Path:
    """A PNG: one panel per joint, recorded (solid) vs simulated (dashed) position [rad]."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    n = len(cmp.joints)
    cols = 3
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.2 * rows), sharex=True,
                             squeeze=False)
    t = cmp.t - cmp.t[0]
    rms = cmp.rms()
    for j, ax in enumerate(axes.flat):
        if j >= n:
            ax.axis('off')
            continue
        ax.plot(t, cmp.recorded[:, j], 'k-', lw=1.2, label='recorded')
        ax.plot(t, cmp.simulated[:, j], 'C1--', lw=1.2, label='MuJoCo replay')
        ax.set_title(f'{cmp.joints[j]} (RMS {rms[j]:.3f} rad)', fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel('time [s]', fontsize=8)
    fig.suptitle(title or 'joint position: recorded vs recorded commands replayed in MuJoCo',
                 fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format='png', dpi=90)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return Path(path)
