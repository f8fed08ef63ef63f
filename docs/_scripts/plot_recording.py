"""Plot one leg's joints and the trunk's speed from an MCAP recording of the control loop.

Reads the file recorder_node writes (``claw-rl up control --record run.mcap``) with the
``mcap-ros2-support`` reader, no ROS install needed: the measured positions of the front-left
leg's joints (``/joint_states``) against the targets the policy sent (``/joint_commands``,
spec joint order), and the commanded forward speed (``/cmd_vel``) against the simulator's
(``/odom``). docs/inspecting.md says how docs/recording_joints.png was made with it::

    .venv/bin/python docs/_scripts/plot_recording.py run.mcap --png docs/recording_joints.png
"""

import argparse

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen
from mcap_ros2.reader import read_ros2_messages  # noqa: E402

LEG = ('FL_hip_joint', 'FL_thigh_joint', 'FL_calf_joint')
# The spec joint order of config/robots/claw_quadruped.yaml: joint_commands element i.
SPEC_ORDER = ('FL_hip_joint', 'FL_thigh_joint', 'FL_calf_joint',
              'FR_hip_joint', 'FR_thigh_joint', 'FR_calf_joint',
              'RL_hip_joint', 'RL_thigh_joint', 'RL_calf_joint',
              'RR_hip_joint', 'RR_thigh_joint', 'RR_calf_joint')


def read(path: str) -> dict[str, list]:
    """Per topic, (publish time [s], message) pairs in file order."""
    out: dict[str, list] = {}
    for item in read_ros2_messages(path):
        topic = item.channel.topic.lstrip('/')
        out.setdefault(topic, []).append((item.publish_time_ns * 1e-9, item.ros_msg))
    return out


def main() -> None:
    """Read the recording and write the PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('mcap', help='recording made by recorder_node')
    parser.add_argument('--png', required=True, help='picture to write')
    args = parser.parse_args()
    topics = read(args.mcap)
    states, commands = topics['joint_states'], topics['joint_commands']
    t0 = states[0][0]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True,
                                      gridspec_kw={'height_ratios': [2, 1]})
    for colour, joint in zip(('tab:blue', 'tab:orange', 'tab:green'), LEG):
        measured = [(t - t0, m.position[list(m.name).index(joint)]) for t, m in states]
        target = [(t - t0, m.data[SPEC_ORDER.index(joint)]) for t, m in commands]
        top.plot(*zip(*measured), color=colour, label=f'{joint} measured')
        top.plot(*zip(*target), color=colour, linestyle=':', label=f'{joint} target')
    top.set_ylabel('joint position [rad]')
    top.margins(y=0.3)
    top.legend(loc='upper right', fontsize=7, ncol=3)
    top.set_title(f'{args.mcap.rsplit("/", 1)[-1]}: /joint_states and /joint_commands')
    cmd = [(t - t0, m.linear.x) for t, m in topics.get('cmd_vel', [])]
    odom = [(t - t0, m.twist.twist.linear.x) for t, m in topics.get('odom', [])]
    if odom:
        bottom.plot(*zip(*odom), color='tab:gray', label='/odom twist.linear.x')
    if cmd:
        bottom.plot(*zip(*cmd), color='black', drawstyle='steps-post',
                    label='/cmd_vel linear.x')
    bottom.set_ylabel('forward speed [m/s]')
    bottom.set_xlabel('publish time since the first joint state [s]')
    bottom.legend(loc='lower right', fontsize=7)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)


if __name__ == '__main__':
    main()
